"""The single writer of a load: prepared pieces in, PFM depth records out, in input order.

A plain class with no Dask in it, so it runs the same inside the pinned Dask
actor, in ``--serial`` mode, and in a test. Pieces may arrive in any order and
more than once (a retried task delivers again); the writer keeps them in a
reorder buffer keyed by ``seq`` and writes strictly in ``seq`` order, each
exactly once, so the output does not depend on which worker finished first.
The buffer is bounded by the caller (the driver's window), not here.

With :meth:`start` the writing happens on a background thread, so that
``put`` returns at once and ``status`` answers while a large piece is being
written; without it, :meth:`write_ready` writes synchronously.

:meth:`finish` runs the final serial step: the area filter, the recompute of
every bin with data, the header extrema, the full check, and the load report.
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from . import pfm
from .bins import BinGrid
from .config import LoadConfig
from .errors import LoadError, PfmDaskError
from .pfm import validity as V
from .soundings import COUNT_KEYS, LineTracker, Piece, PreparedPiece

__all__ = ["PfmWriter"]


class PfmWriter:
    """Owns the open PFM during a load; see the module docstring."""

    def __init__(self, pfm_path: str | os.PathLike, grid: BinGrid, cfg: LoadConfig,
                 files: list[str], n_pieces: int, *, append: bool = False):
        self.path = Path(pfm_path)
        self.cfg = cfg
        self.grid = grid
        self.n_pieces = int(n_pieces)
        self._lock = threading.Condition()
        self._buffer: dict[int, PreparedPiece | None] = {}
        self._buffer_bytes = 0
        self.peak_backlog_bytes = 0
        self.peak_backlog_batches = 0
        self._next = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = False
        self.phase = "loading"
        self.t_start = time.time()
        self.timings = defaultdict(float)
        self.soundings_written = 0
        self.bytes_written = 0
        self.pieces_written = 0
        self.files_done = 0
        self._rate_window: list[tuple[float, int]] = []
        self.per_file: dict[int, dict] = {}
        self._trackers: dict[int, LineTracker] = {}
        self._file_lines: dict[int, list[int]] = {}
        self.touched = None  # boolean map of bins that received soundings

        self.append = append
        if append:
            self.pfm = pfm.open_pfm(self.path, "r+")
            base = len(self.pfm.files())
        else:
            self.pfm = pfm.create(self.path, grid, min_depth=cfg.min_depth,
                                  max_depth=cfg.max_depth, precision=cfg.precision,
                                  bin_size_m=cfg.bin_size_m if cfg.bin_size_deg is None else None)
            base = 0
        numbers = self.pfm.add_files([str(f) for f in files])
        self.file_numbers = list(numbers)
        self.files = [str(f) for f in files]
        for i, f in enumerate(self.files):
            self.per_file[self.file_numbers[i]] = {
                "path": f, **{k: 0 for k in COUNT_KEYS}, "damage": [], "lines": 0,
                "pieces": 0}
        self._base = base
        self.touched = np.zeros(self.pfm.grid.width * self.pfm.grid.height, dtype=bool)

    # ------------------------------------------------------------------ intake
    def put(self, prepared: PreparedPiece) -> bool:
        """Take a prepared piece; False if this ``seq`` was already taken or written."""
        seq = prepared.piece.seq
        with self._lock:
            if seq < self._next or seq in self._buffer:
                return False
            self._buffer[seq] = prepared
            self._buffer_bytes += prepared.nbytes
            self.peak_backlog_bytes = max(self.peak_backlog_bytes, self._buffer_bytes)
            self.peak_backlog_batches = max(self.peak_backlog_batches, len(self._buffer))
            self._lock.notify_all()
        return True

    def skip(self, piece: Piece, error: dict) -> bool:
        """Record that ``piece`` failed for good; the writer moves past its ``seq``."""
        with self._lock:
            if piece.seq < self._next or piece.seq in self._buffer:
                return False
            self._buffer[piece.seq] = None
            rec = self.per_file[piece.file_number]
            if error not in rec["damage"]:
                rec["damage"].append(error)
            self._lock.notify_all()
        return True

    # ----------------------------------------------------------------- writing
    def write_ready(self) -> int:
        """Write every piece whose turn has come; returns how many were written."""
        n = 0
        while True:
            with self._lock:
                if self._next not in self._buffer:
                    return n
                prepared = self._buffer.pop(self._next)
            try:
                if prepared is not None:
                    self._write(prepared)
            finally:
                with self._lock:
                    if prepared is not None:
                        self._buffer_bytes -= prepared.nbytes
                    self._next += 1
                    self._lock.notify_all()
            n += 1

    def _write(self, prepared: PreparedPiece) -> None:
        t0 = time.perf_counter()
        piece = prepared.piece
        fnum = piece.file_number
        rec = self.per_file[fnum]
        for k, v in prepared.counts.items():
            rec[k] = rec.get(k, 0) + int(v)
        for d in prepared.damage:
            if d not in rec["damage"]:
                rec["damage"].append(d)
        rec["pieces"] += 1
        for k, v in prepared.timings.items():
            self.timings["task_" + k] += v

        batch = prepared.batch
        if batch.num_rows:
            tracker = self._trackers.setdefault(fnum, LineTracker(piece.path))
            p, local, new_names = tracker.assign(prepared.pings)
            lines = self._file_lines.setdefault(fnum, [])
            if new_names:
                lines.extend(self.pfm.add_lines(new_names))
                rec["lines"] += len(new_names)
            global_lines = np.asarray(lines, dtype=np.int64)[local]
            ping = batch.column("ping").to_numpy()
            line = global_lines[np.searchsorted(p, ping)]
            bin_index = batch.column("bin_index").to_numpy()
            self.pfm.add_sorted(
                bin_index,
                np.full(batch.num_rows, fnum, dtype=np.int64),
                line,
                ping,
                batch.column("beam").to_numpy(),
                batch.column("depth").to_numpy(),
                batch.column("x_off").to_numpy(),
                batch.column("y_off").to_numpy(),
                batch.column("validity").to_numpy(),
                batch.column("horizontal_error").to_numpy(),
                batch.column("vertical_error").to_numpy(),
            )
            self.touched[bin_index] = True
            self.soundings_written += batch.num_rows
            self.bytes_written += batch.nbytes
        self.pieces_written += 1
        if piece.last:
            self.files_done += 1
        self.timings["write"] += time.perf_counter() - t0
        now = time.time()
        self._rate_window.append((now, self.soundings_written))
        self._rate_window = [(t, s) for t, s in self._rate_window if now - t <= 10.0]

    # --------------------------------------------------------- background mode
    def start(self) -> None:
        """Write on a background thread from now on."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="pfm-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stop and self._next not in self._buffer:
                        self._lock.wait(0.5)
                    if self._stop and self._next not in self._buffer:
                        return
                self.write_ready()
        except BaseException as err:  # surfaced through status() and finish()
            with self._lock:
                self._error = err
                self._lock.notify_all()

    def wait_written(self, timeout: float | None = None) -> bool:
        """Block until every piece has been written or skipped (background mode)."""
        deadline = None if timeout is None else time.time() + timeout
        with self._lock:
            while self._next < self.n_pieces and self._error is None:
                remaining = None if deadline is None else deadline - time.time()
                if remaining is not None and remaining <= 0:
                    return False
                self._lock.wait(0.5 if remaining is None else min(0.5, remaining))
        self._raise_if_failed()
        return True

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            err = self._error
            if isinstance(err, PfmDaskError):
                raise err
            raise LoadError(f"writer failed: {type(err).__name__}: {err}",
                            path=self.path) from err

    # ------------------------------------------------------------------ status
    @property
    def watermark(self) -> int:
        """Number of pieces written or skipped (the next ``seq`` to write)."""
        return self._next

    def status(self) -> dict:
        """Backlog, throughput and progress, for the driver, the CLI and the dashboard."""
        with self._lock:
            backlog_batches = len(self._buffer)
            backlog_bytes = self._buffer_bytes
            watermark = self._next
            err = None if self._error is None else f"{type(self._error).__name__}: {self._error}"
        rate = 0.0
        if len(self._rate_window) >= 2:
            (t0, s0), (t1, s1) = self._rate_window[0], self._rate_window[-1]
            if t1 > t0:
                rate = (s1 - s0) / (t1 - t0)
        return {
            "phase": self.phase, "watermark": watermark, "pieces_total": self.n_pieces,
            "backlog_batches": backlog_batches, "backlog_bytes": backlog_bytes,
            "peak_backlog_bytes": self.peak_backlog_bytes,
            "peak_backlog_batches": self.peak_backlog_batches,
            "soundings_written": self.soundings_written, "bytes_written": self.bytes_written,
            "soundings_per_second": rate, "files_done": self.files_done,
            "files_total": len(self.files), "elapsed": time.time() - self.t_start,
            "error": err,
        }

    # ------------------------------------------------------------ final step
    def finish(self) -> dict:
        """Area filter, recompute, header, check; returns the load report's writer part."""
        if self._thread is not None:
            self.wait_written()
            with self._lock:
                self._stop = True
                self._lock.notify_all()
            self._thread.join()
            self._thread = None
        else:
            self.write_ready()
        self._raise_if_failed()
        if self._next < self.n_pieces:
            raise LoadError(f"finish() called with {self.n_pieces - self._next} pieces "
                            "not yet written", path=self.path)
        self.pfm.flush()
        filter_stats = None
        if self.cfg.area_filter:
            self.phase = "area filter"
            t0 = time.perf_counter()
            filter_stats = self._area_filter()
            self.timings["area_filter"] = time.perf_counter() - t0
        self.phase = "recompute"
        t0 = time.perf_counter()
        touched = np.flatnonzero(self.touched)
        if self.append:
            # pfmLoader clears CHECKED/VERIFIED on bins an append touched; the
            # header extrema then cover old and new bins alike.
            pfm.recompute(self.pfm, touched, clear_mask=V.CHECKED | V.VERIFIED)
            extrema = self.pfm.compute_extrema()
        else:
            extrema = pfm.recompute(self.pfm, touched)
        self.pfm.write_header(**(extrema or {}))
        self.timings["recompute"] = time.perf_counter() - t0
        self.pfm.close()
        self.phase = "check"
        t0 = time.perf_counter()
        problems = pfm.check(self.path)
        self.timings["check"] = time.perf_counter() - t0
        self.phase = "done"
        return {
            "pfm": str(self.path),
            "files": [self.per_file[n] for n in self.file_numbers],
            "soundings_written": self.soundings_written,
            "area_filter": filter_stats,
            "check": {"sound": not problems, "problems": [str(p) for p in problems]},
            "writer_timings": dict(self.timings),
            "peak_backlog_bytes": self.peak_backlog_bytes,
            "peak_backlog_batches": self.peak_backlog_batches,
        }

    def _area_filter(self) -> dict:
        """pfmLoader's area filter over the bins this load touched, row by row from the PFM."""
        from .filters import AreaFilter, RowSoundings

        g = self.pfm.grid
        w, h = g.width, g.height
        touched = self.touched.reshape(h, w)
        rows_touched = touched.any(axis=1)
        # A row is read if it, or a neighbour row, has bins to filter.
        needed = rows_touched.copy()
        needed[1:] |= rows_touched[:-1]
        needed[:-1] |= rows_touched[1:]
        # Metre bins: the true diagonal (pfmLoader's 2*sqrt(size) is right only for 2 m);
        # degree bins: the geodesic diagonal, as pfmLoader computes it.
        diag = g.bin_diagonal_m() if self.cfg.bin_size_deg is not None else None
        filt = AreaFilter(w, h, bin_size_xy=g.bin_size_xy if self.cfg.bin_size_deg is None else 0.0,
                          bin_diagonal=diag, cellstd=self.cfg.cellstd,
                          deep_only=self.cfg.deep_only, null_depth=self.cfg.null_depth)

        def read_row(y: int):
            if not needed[y]:
                return None
            s = self.pfm.read_soundings(y, y + 1)
            return RowSoundings(col=s["col"].astype(np.int64), depth=s["depth"],
                                validity=s["validity"].astype(np.uint32),
                                address=np.stack([s["record_offset"], s["slot"]], axis=1),
                                active=touched[y])

        def write_row(y: int, res) -> None:
            if res.index.size:
                self.pfm.set_validity(res.address[:, 0], res.address[:, 1], res.validity)

        summary = filt.run(read_row, write_row)
        out = summary.as_dict()
        out["flagged"] = out.get("cut", 0)
        return out

    def abort(self) -> None:
        """Stop the background thread and close the file without the final step."""
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self.pfm.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
