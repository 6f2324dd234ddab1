"""A load's progress for people: two live lines on a terminal, plain log lines elsewhere.

The writer's status (:meth:`pfm_dask.writer.PfmWriter.status`) is rendered as

* on a terminal, two lines redrawn in place (no wider than 80 columns, cut to a narrower
  terminal): the phase, a bar of the pieces written, files; then soundings, their rate, the
  backlog and the times; in the final step (area filter, recompute, check) the second line
  names the step under way;
* otherwise, and with ``--json`` (whose report is all of standard output), one plain line on
  standard error every five seconds, at each phase change, and at the end.

A rate appears only once one is measured (never ``(0/s)``), and the display ends on the final
status: 100 % and ``done``. :func:`follow` and :func:`relay` keep statuses coming while the
final step runs (the driver's own loop waits for it then).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, TextIO

__all__ = ["WIDTH", "Progress", "follow", "live_lines", "plain_line", "relay"]

WIDTH = 80
PLAIN_EVERY = 5.0        # seconds between two plain log lines in one phase
_BAR = 20
_FINAL = ("area filter", "recompute", "check")


def _count(n: float, exact_below: float = 10_000_000) -> str:
    """A count, exact below ``exact_below`` (``1,234,567``), else in 3 digits and a unit
    (``12.3 M``, ``988 k``): at most 9 characters with the default, 6 with 100,000."""
    n = float(n)
    if n < exact_below:
        return f"{n:,.0f}"
    for div, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            v = n / div
            return f"{v:.3g} {unit}" if v < 1000 else f"{v:,.0f} {unit}"
    return f"{n:,.0f}"  # pragma: no cover


def _short(n: int) -> str:
    """A count of pieces, files or batches in at most 6 characters."""
    return _count(n, 100_000)


def _mib(nbytes: float) -> str:
    mib = float(nbytes) / 2**20
    return f"{mib:.1f} MiB" if mib < 1000 else f"{mib / 1024:.1f} GiB"


def _clock(seconds: float) -> str:
    """``m:ss`` or ``h:mm:ss``."""
    s = int(max(0.0, seconds))
    h, rem = divmod(s, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _rate(st: dict) -> str:
    """``12,345/s``, or empty before a rate is measured."""
    rate = st.get("soundings_per_second") or 0
    return f"{_count(rate)}/s" if rate > 0 else ""


def _fraction(st: dict) -> float:
    if st.get("phase") == "done":
        return 1.0
    total = st.get("pieces_total") or 0
    return min(1.0, (st.get("watermark") or 0) / total) if total else 0.0


def _left(st: dict) -> str:
    """Time left in the loading phase from its pace so far (empty until a piece is written)."""
    done, total = st.get("watermark") or 0, st.get("pieces_total") or 0
    if st.get("phase") != "loading" or not done or not total:
        return ""
    return _clock((st.get("elapsed") or 0.0) / done * (total - done))


def _steps(phase: str, seen: set) -> str:
    """The final step's parts, the one under way in brackets: ``recompute > [check]``."""
    steps = [s for s in _FINAL if s != "area filter" or "area filter" in seen]
    return " > ".join(f"[{s}]" if s == phase else s for s in steps)


def live_lines(st: dict, seen: set | None = None, width: int = WIDTH) -> list[str]:
    """The two terminal lines for status ``st`` (``seen``: the phases shown so far)."""
    phase = st.get("phase") or "loading"
    frac = _fraction(st)
    fill = int(round(frac * _BAR))
    pieces = f"pieces {_short(st.get('watermark') or 0)}/{_short(st.get('pieces_total') or 0)}"
    files = f"files {_short(st.get('files_done') or 0)}/{_short(st.get('files_total') or 0)}"
    first = (f"{phase[:11]:<11} {'#' * fill}{'.' * (_BAR - fill)} {frac * 100:3.0f}%  "
             f"{pieces}  {files}")
    elapsed = f"{_clock(st.get('elapsed') or 0.0)} elapsed"
    if phase in _FINAL:
        second = f"  final step: {_steps(phase, (seen or set()) | {phase})}  {elapsed}"
    else:
        backlog = (f"backlog {_short(st.get('backlog_batches') or 0)} / "
                   f"{_mib(st.get('backlog_bytes') or 0)}") if phase == "loading" else ""
        left = f"{_left(st)} left" if _left(st) else ""
        parts = [f"{_count(st.get('soundings_written') or 0)} soundings", _rate(st), backlog,
                 elapsed, left]
        second = "  " + "  ".join(p for p in parts if p)
        if len(second) > width:          # huge figures: the backlog gives way (the dashboard
            second = "  " + "  ".join(p for p in parts if p and p != backlog)  # has it)
    return [line[:width] for line in (first, second)]


def plain_line(st: dict) -> str:
    """The plain log line for status ``st``."""
    phase = st.get("phase") or "loading"
    parts = [f"{phase}: {_fraction(st) * 100:.0f}%",
             f"files {st.get('files_done') or 0:,}/{st.get('files_total') or 0:,}",
             f"pieces {st.get('watermark') or 0:,}/{st.get('pieces_total') or 0:,}",
             f"soundings {st.get('soundings_written') or 0:,}"
             + (f" ({_rate(st)})" if _rate(st) else "")]
    if phase == "loading":
        parts.append(f"backlog {st.get('backlog_batches') or 0} / "
                     f"{_mib(st.get('backlog_bytes') or 0)}")
    parts.append(f"elapsed {_clock(st.get('elapsed') or 0.0)}")
    if _left(st):
        parts.append(f"left {_left(st)}")
    return "  ".join(parts)


class Progress:
    """The progress of one load; call it with each writer status, :meth:`close` at the end.

    ``enabled`` False (``--quiet``) shows nothing; ``live`` None decides by itself: a
    terminal on standard error and no ``--json`` (``as_json``).
    """

    def __init__(self, enabled: bool = True, as_json: bool = False, *,
                 stream: TextIO | None = None, live: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.enabled = enabled
        self._stream = stream
        out = stream if stream is not None else sys.stderr
        self.live = enabled and (live if live is not None else
                                 (not as_json and out.isatty()))
        self._clock = clock
        self._lock = threading.Lock()
        self._last_plain = None
        self._last_phase = None
        self._last: dict | None = None
        self._printed: dict | None = None
        self._seen: set = set()
        self._live = None

    def _write(self, line: str) -> None:
        out = self._stream if self._stream is not None else sys.stderr
        out.write(line + "\n")
        out.flush()

    def __call__(self, st: dict) -> None:
        if not self.enabled or not st:
            return
        with self._lock:
            self._last = st
            phase = st.get("phase")
            self._seen.add(phase)
            if self.live:
                self._show_live(st)
                return
            now = self._clock()
            if (self._last_plain is None or phase != self._last_phase
                    or now - self._last_plain >= PLAIN_EVERY):
                self._last_plain, self._last_phase = now, phase
                self._printed = st
                self._write(plain_line(st))

    def _show_live(self, st: dict) -> None:
        from rich.console import Console
        from rich.live import Live
        from rich.text import Text

        if self._live is None:
            console = Console(file=self._stream, stderr=self._stream is None)
            self._live = Live(console=console, auto_refresh=False, transient=False)
            self._live.start()
        width = min(WIDTH, self._live.console.width)
        text = Text("\n".join(live_lines(st, self._seen, width)), no_wrap=True, overflow="crop")
        self._live.update(text, refresh=True)

    def close(self, final: dict | None = None) -> None:
        """End the display on ``final`` (the last status: 100 % once the load is done)."""
        if final:
            self(final)
        with self._lock:
            if self._live is not None:
                self._live.stop()
                self._live = None
            elif (self.enabled and not self.live and self._last is not None
                  and self._last is not self._printed):
                self._write(plain_line(self._last))


@contextmanager
def follow(fetch: Callable[[], dict | None], progress: Callable[[dict], None] | None,
           every: float = 0.5):
    """While the body runs (the writer's final step), call ``progress(fetch())`` every
    ``every`` seconds from a thread of its own; ``fetch`` may return None (nothing new)."""
    if progress is None:
        yield
        return
    stop = threading.Event()

    def run():
        while not stop.wait(every):
            try:
                st = fetch()
            except Exception:  # noqa: BLE001 - progress must never break a load
                continue
            if st:
                progress(st)

    thread = threading.Thread(target=run, name="pfm-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


@contextmanager
def relay(client, topic: str, progress: Callable[[dict], None] | None, pfm: str):
    """While the body runs, pass each status published on the scheduler's event ``topic`` (the
    writer actor's, every half second) to ``progress``: the actor itself is busy finishing.
    Only the statuses of the writer of ``pfm``: the topic is the whole cluster's, and another
    load on the same scheduler publishes its own."""
    if progress is None:
        yield
        return

    def mine(event) -> None:
        status = event[1]
        if isinstance(status, dict) and status.get("pfm") == pfm:
            progress(status)

    client.subscribe_topic(topic, mine)
    try:
        yield
    finally:
        client.unsubscribe_topic(topic)
