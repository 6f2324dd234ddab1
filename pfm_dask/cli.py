"""The ``pfm-dask`` command line: the console script's entry point.

The commands are typer's (:mod:`pfm_dask._cli_app`, imported on first use). The quick
commands a survey office runs after each line, ``info PFM [--json] [--force]`` and ``gsf-info
FILE... [--json]`` with no other option, and ``--version``, are answered here without typer
and click: their start-up is then Python, numpy and the reader (docs/performance.md,
start-up). Anything else (``--help``, a global option, an unknown word) goes to typer, which
gives the same answer for those commands and the usage errors.

Exit codes (all commands):

* 0 — success;
* 1 — failure (nothing usable was produced, or ``check`` found problems);
* 2 — bad usage (unknown option, missing argument) or a refused request;
* 3 — ``load`` completed with problems: some input was damaged; the report names it;
* 130 — ``load`` interrupted by Ctrl-C (one line: what the PFM holds, the resume command).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ._cli_quick import (EXIT_FAILURE, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE,  # noqa: F401
                         _echo, run_gsf_info, run_info)


def _quick(argv: list[str]) -> int | None:
    """The exit code of a quick command answered here, or None when typer should parse
    ``argv`` (anything but ``--version`` alone and ``info``/``gsf-info`` with their own flags
    and plain paths)."""
    if argv == ["--version"]:
        from . import __version__

        _echo(f"pfm-dask {__version__}")
        return EXIT_OK
    if not argv or argv[0] not in ("info", "gsf-info"):
        return None
    flags = {"--json"} | ({"--force"} if argv[0] == "info" else set())
    words = argv[1:]
    paths = [w for w in words if w not in flags]
    if any(not w or w.startswith("-") for w in paths):
        return None  # an option of typer's (--help), "--", "-x", or an empty word
    if argv[0] == "info":
        if len(paths) != 1:
            return None
        return run_info(Path(paths[0]), "--json" in words, "--force" in words)
    if not paths:
        return None
    return run_gsf_info([Path(p) for p in paths], "--json" in words)


def main() -> None:  # console-script entry point
    code = _quick(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from ._cli_app import app

    if sys.argv[1:2] not in (["load"], ["check"]):
        app()
        return
    _collect_later()
    try:
        app()
    except SystemExit as done:
        _exit_now(done.code)
    _exit_now(0)


#: seconds of a load's process before its garbage collector runs (:func:`_collect_later`)
GC_AFTER_S = 1.0


def _collect_later() -> None:
    """No garbage collection in a load's (or check's) first second: the imports and numba's
    kernel loads make hundreds of thousands of long-lived objects, and collecting while they
    are made cost 0.05 CPU-s of a small load (190 collections). A load still running after
    :data:`GC_AFTER_S` collects once, freezes what survives (numba's and the modules'
    objects, never garbage) and collects as usual from then on."""
    import gc
    import threading

    def start():
        gc.collect()
        gc.freeze()
        gc.enable()

    gc.disable()
    if hasattr(os, "register_at_fork"):   # a process forked meanwhile has no timer: it collects
        os.register_at_fork(after_in_child=gc.enable)
    timer = threading.Timer(GC_AFTER_S, start)
    timer.daemon = True
    timer.start()


def _exit_now(code) -> None:
    """End a finished load's (or check's) process without the interpreter's teardown: its
    garbage collection and module clean-up over numba's and numpy's objects cost about 0.1 s
    of a 0.7 s small load, and a load has closed and synced its files by now (a check only
    reads). The exit handlers still run and the standard streams are flushed; while a
    non-daemon thread is alive, or when a stream cannot be flushed, the process ends the
    ordinary way instead."""
    import atexit
    import threading

    others = [t for t in threading.enumerate()
              if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if others:
        sys.exit(code)
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        sys.stderr.flush()
        code = 1
    os._exit(code)


def __getattr__(name: str):
    """The typer application and its commands (``pfm_dask.cli.app``), imported on first use."""
    if name.startswith("__"):
        raise AttributeError(name)
    from . import _cli_app

    try:
        return getattr(_cli_app, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
