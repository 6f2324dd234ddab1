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

Crash safety (with ``journal=``, or ``resume=True``; :mod:`pfm_dask.journal`,
docs/reliability.md): the writer checkpoints every ``checkpoint_seconds``
between pieces and at each phase boundary (flush and fsync the parts, publish
``journal.json``, start a new undo interval); the store saves the pre-images
of its in-place writes to the undo log in between. ``resume=True`` rolls the
PFM back to the last checkpoint and restores the writer's state, so the caller
only has to feed the pieces from :attr:`watermark` on. The area filter writes
its result to a redo file first and applies it after (idempotent); the
recompute and the check are idempotent and simply run again.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import journal as J
from . import pfm
from .bins import BinGrid
from .config import LoadConfig
from .errors import LoadError, PfmDaskError
from . import validity as V
from .lines import LineTracker
from .pieces import COUNT_KEYS, Piece, PreparedPiece

__all__ = ["PfmWriter"]

_REDO_DTYPE = np.dtype("<i8")    # redo entries: (record offset, slot, validity) as int64
_REDO_CHUNK = 1 << 20            # redo entries applied per set_validity call
_AREA_BAND_SOUNDINGS = 500_000   # soundings the area filter reads ahead at a time


@dataclass
class _Skipped:
    """A piece that failed for good: its error is recorded when its turn comes."""

    piece: Piece
    error: dict


class PfmWriter:
    """Owns the open PFM during a load; see the module docstring."""

    def __init__(self, pfm_path: str | os.PathLike, grid: BinGrid | None, cfg: LoadConfig | None,
                 files: list[str] | None, n_pieces: int | None, *, append: bool = False,
                 journal: dict | None = None, resume: bool = False,
                 checkpoint_seconds: float = 10.0, threads: int | None = None):
        self.path = Path(pfm_path)
        # threads for packing records and for the final step's recompute and check
        # (None: the library defaults, up to 2); ``--serial`` uses 1: it is the baseline
        self.threads = None if threads is None else max(1, int(threads))
        self.cfg = cfg
        self.grid = grid
        self.n_pieces = int(n_pieces or 0)
        self._lock = threading.Condition()
        self._buffer: dict[int, PreparedPiece | _Skipped] = {}
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
        self.file_numbers: list[int] | None = None
        self.files: list[str] = []

        # crash safety (pfm_dask.journal)
        self.checkpoint_seconds = float(checkpoint_seconds)
        self._journal_on = journal is not None or resume
        self.jphase = "loading"        # the journal's phase (journal.PHASES)
        self._epoch = 0
        self._dirty = True             # parts written since the last checkpoint
        self.checkpoints = 0
        self._flock: J.PfmLock | None = None
        self._undo: J.UndoLog | None = None
        self._touched_log: J.TouchedLog | None = None
        self._last_ckpt = time.monotonic()
        self._filter_stats = None
        self._redo: dict | None = None
        self._check: dict | None = None
        self._result: dict | None = None
        self._jp = J.journal_paths(self.path)
        self.resume_command = J.resume_command(self.path)
        self.resumed_from: dict | None = None
        self._static: dict | None = None
        self.pfm = None

        self.append = append
        if resume:
            try:
                self._resume()
            except BaseException:
                self._close_journal()
                raise
            return
        created = False
        try:
            if append:
                self.pfm = pfm.open_pfm(self.path, "r+")
            else:
                self.pfm = pfm.create(self.path, grid, min_depth=cfg.min_depth,
                                      max_depth=cfg.max_depth, precision=cfg.precision,
                                      bin_size_m=cfg.bin_size_m if cfg.bin_size_deg is None else None)
                created = True
            if self.threads is not None:
                self.pfm.pack_threads = self.threads
            self.touched = np.zeros(self.pfm.grid.width * self.pfm.grid.height, dtype=bool)
            if self._journal_on:
                self._start_journal(journal)
            self._add_files([str(f) for f in files])
            if self._journal_on:
                self._checkpoint()
        except BaseException as err:
            if self.pfm is not None:
                try:
                    self.pfm.close()
                except Exception:  # noqa: BLE001 - already failing
                    pass
            self._close_journal()
            if created and self._epoch == 0:
                # a new PFM that died before its first checkpoint holds nothing: remove it
                shutil.rmtree(str(self.path) + ".data", ignore_errors=True)
                try:
                    os.unlink(self.path)
                except OSError:
                    pass
            if isinstance(err, OSError) and J.is_disk_full(err):
                raise self._disk_full(err) from err
            raise

    def _add_files(self, files: list[str]) -> None:
        self._dirty = True
        numbers = self.pfm.add_files(files)
        self.file_numbers = [int(n) for n in numbers]
        self.files = list(files)
        for i, f in enumerate(self.files):
            self.per_file[self.file_numbers[i]] = {
                "path": f, **{k: 0 for k in COUNT_KEYS}, "damage": [], "lines": 0,
                "pieces": 0}

    # ------------------------------------------------------------------ journal
    def _start_journal(self, static: dict) -> None:
        """Lock the PFM, write ``load.json`` and the first checkpoint (before any input is added)."""
        self._flock = J.PfmLock(self._jp["lock"], wait=5.0)
        try:
            old = J.read_journal(self.path)  # an append onto a finished load: keep counting
        except LoadError:
            old = None
        self._epoch = int(old["epoch"]) if old else 0
        self._static = dict(static, format=J.FORMAT, pfm=str(self.path), n_pieces=self.n_pieces,
                            append=self.append)
        self.resume_command = static.get("resume_command") or self.resume_command
        J.atomic_write(self._jp["static"], json.dumps(self._static).encode())
        self._touched_log = J.TouchedLog(self._jp["touched"], size=0)
        self._undo = J.UndoLog(self._jp["undo"])
        # the new names (handle, data directory) must outlive a crash too
        J.fsync_path(self.path)
        J.fsync_dir(self.path.parent)
        self._checkpoint()
        self.pfm.undo = self._undo

    def _part_paths(self) -> dict:
        stem = os.path.join(str(self.path) + ".data", self.path.name)
        return {"bin": stem + ".bin", "ndx": stem + ".ndx", "ctl": stem + ".ctl",
                "lin": stem + ".lin", "cvg": stem + ".cvg"}

    def _state(self) -> dict:
        parts = self._part_paths()
        sizes = {"ndx": int(self.pfm.ndx_size), "ctl": os.path.getsize(parts["ctl"]),
                 "lin": os.path.getsize(parts["lin"]), "bin": os.path.getsize(parts["bin"])}
        nums = self.file_numbers
        return {
            "format": J.FORMAT, "epoch": self._epoch, "phase": self.jphase,
            "watermark": self._next, "n_pieces": self.n_pieces, "sizes": sizes,
            "touched_size": self._touched_log.size,
            "file_numbers": nums,
            "per_file": None if nums is None else [self.per_file[n] for n in nums],
            "lines": {str(f): {"prev_heading": t.prev_heading, "names": t.names,
                               "numbers": self._file_lines.get(f, [])}
                      for f, t in self._trackers.items()},
            "counters": {"soundings_written": self.soundings_written,
                         "bytes_written": self.bytes_written,
                         "pieces_written": self.pieces_written, "files_done": self.files_done},
            "area_filter": self._filter_stats, "redo": self._redo, "check": self._check,
            "result": self._result, "resume_command": self.resume_command,
            "pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
        }

    def _checkpoint(self, phase: str | None = None) -> None:
        """Make everything written so far durable and publish it as the new checkpoint."""
        if not self._journal_on:
            if phase:
                self.jphase = phase
            return
        t0 = time.perf_counter()
        if phase:
            self.jphase = phase
        if not self.pfm.closed:
            self.pfm.flush()
        if self._dirty:
            for p in self._part_paths().values():
                J.fsync_path(p)
            self._touched_log.sync()
            self._dirty = False
        self._epoch += 1
        J.atomic_write(self._jp["journal"], json.dumps(self._state()).encode())
        self._undo.begin(self._epoch, {"bin": os.path.getsize(self._part_paths()["bin"]),
                                       "ndx": int(self.pfm.ndx_size)})
        self._last_ckpt = time.monotonic()
        self.timings["journal_checkpoint"] += time.perf_counter() - t0
        self.checkpoints += 1
        J.crash_point("checkpoint")
        J.crash_point(f"checkpoint-{self.jphase}")

    def _resume(self) -> None:
        """Roll the PFM back to the last checkpoint and take up the writer's state from it."""
        static = J.read_static(self.path)
        if static is None or J.read_journal(self.path) is None:
            raise J.no_journal_error(self.path)
        self._flock = J.PfmLock(self._jp["lock"])
        state = J.read_journal(self.path)  # again, now that no one else writes
        self._static = static
        self.resume_command = static.get("resume_command") or self.resume_command
        if self.cfg is None:
            self.cfg = J.config_from_dict(static["cfg"])
        self.append = bool(static.get("append"))
        self.n_pieces = int(static["n_pieces"])
        parts = self._part_paths()
        self._undo = J.UndoLog(self._jp["undo"])
        rolled = self._undo.rollback(int(state["epoch"]), parts)
        sizes = state["sizes"]
        for part in ("ndx", "ctl", "lin"):
            if os.path.getsize(parts[part]) != sizes[part]:
                os.truncate(parts[part], sizes[part])
            J.fsync_path(parts[part])
        self._touched_log = J.TouchedLog(self._jp["touched"], size=int(state["touched_size"]))
        self.pfm = pfm.open_pfm(self.path, "r+")
        if self.threads is not None:
            self.pfm.pack_threads = self.threads
        self.grid = self.pfm.grid
        self.touched = np.zeros(self.pfm.grid.width * self.pfm.grid.height, dtype=bool)
        self.touched[self._touched_log.read()] = True
        self._epoch = int(state["epoch"])
        self.jphase = state["phase"]
        self._next = int(state["watermark"])
        for k, v in state["counters"].items():
            setattr(self, k, v)
        self._filter_stats = state.get("area_filter")
        self._redo = state.get("redo")
        inputs = [r["path"] for r in static["inputs"]]
        if state.get("file_numbers") is None:  # died before the inputs were listed
            self._add_files(inputs)
        else:
            self.file_numbers = [int(n) for n in state["file_numbers"]]
            self.files = inputs
            self.per_file = {n: rec for n, rec in zip(self.file_numbers, state["per_file"])}
        for f, t in state.get("lines", {}).items():
            fnum = int(f)
            tr = LineTracker(self.per_file[fnum]["path"])
            tr.prev_heading = t["prev_heading"]
            tr.names = list(t["names"])
            self._trackers[fnum] = tr
            self._file_lines[fnum] = [int(x) for x in t["numbers"]]
        self.resumed_from = {"phase": state["phase"], "watermark": self._next,
                             "epoch": self._epoch, "undo_bytes": rolled}
        self._checkpoint()  # the rolled-back state, now under this process's name
        if self.jphase == "loading":
            self.pfm.undo = self._undo

    def _close_journal(self, *, remove: bool = False) -> None:
        """Close the journal's files and release the lock; ``remove`` deletes the scratch files."""
        for obj in (self._undo, self._touched_log):
            if obj is not None:
                try:
                    obj.close()
                except OSError:
                    pass
        if remove:
            for key in ("undo", "touched", "redo"):
                try:
                    os.unlink(self._jp[key])
                except OSError:
                    pass
        if self._flock is not None:
            if remove:
                try:
                    os.unlink(self._jp["lock"])
                except OSError:
                    pass
            self._flock.release()
            self._flock = None

    def _disk_full(self, err: BaseException) -> LoadError:
        return J.disk_full_error(err, str(self.path) + ".data", self.resume_command)

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
            # recorded in turn (write_ready), so that a checkpoint never holds the error
            # of a piece past its watermark
            self._buffer[piece.seq] = _Skipped(piece, error)
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
                try:
                    if isinstance(prepared, _Skipped):
                        rec = self.per_file[prepared.piece.file_number]
                        if prepared.error not in rec["damage"]:
                            rec["damage"].append(prepared.error)
                    else:
                        self._write(prepared)
                finally:
                    with self._lock:
                        if not isinstance(prepared, _Skipped):
                            self._buffer_bytes -= prepared.nbytes
                        self._next += 1
                        self._lock.notify_all()
                n += 1
                J.crash_point("piece")
                if self._journal_on and time.monotonic() - self._last_ckpt >= self.checkpoint_seconds:
                    self._checkpoint()
            except OSError as err:
                if J.is_disk_full(err):
                    raise self._disk_full(err) from err
                raise

    def _write(self, prepared: PreparedPiece) -> None:
        t0 = time.perf_counter()
        c0 = time.thread_time()
        self._dirty = True
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
            line = _lookup(p, global_lines, ping)
            bin_index = batch.column("bin_index").to_numpy()
            depth = batch.column("depth").to_numpy()
            if self.cfg.null_depth != self.pfm.null_depth:
                # depths out of range carry the settings' null (max + 1, a double); the PFM's
                # is that value as a float, which may round below it (e.g. max 1364.475)
                depth = np.where(depth == self.cfg.null_depth, self.pfm.null_depth, depth)
            self.pfm.add_sorted(
                bin_index,
                np.full(batch.num_rows, fnum, dtype=np.int64),
                line,
                ping,
                batch.column("beam").to_numpy(),
                depth,
                batch.column("x_off").to_numpy(),
                batch.column("y_off").to_numpy(),
                batch.column("validity").to_numpy(),
                batch.column("horizontal_error").to_numpy(),
                batch.column("vertical_error").to_numpy(),
            )
            # each bin enters the touched log once (bin_index is sorted)
            first = np.r_[True, bin_index[1:] != bin_index[:-1]]
            ub = bin_index[first]
            new = ub[~self.touched[ub]]
            self.touched[new] = True
            if self._touched_log is not None:
                self._touched_log.append(new)
            self.soundings_written += batch.num_rows
            self.bytes_written += batch.nbytes
        self.pieces_written += 1
        if piece.last:
            self.files_done += 1
        self.timings["write"] += time.perf_counter() - t0
        self.timings["write_cpu"] += time.thread_time() - c0   # this thread's own (not the pack threads')
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
            err = self._error
            if err is not None:
                err = str(err) if isinstance(err, PfmDaskError) else f"{type(err).__name__}: {err}"
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
            "error": err, "journal_phase": self.jphase, "resume_command": self.resume_command,
        }

    # ------------------------------------------------------------ final step
    def finish(self) -> dict:
        """Area filter, recompute, header, check; returns the load report's writer part.

        Each step starts from the phase the journal is in, so a resumed load
        does only what is left. The PFM is marked complete only when the check
        passes.
        """
        try:
            return self._finish()
        except OSError as err:
            if J.is_disk_full(err):
                raise self._disk_full(err) from err
            raise

    def _finish(self) -> dict:
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
        if self.jphase == "loading":
            self._checkpoint("loaded")
        self.pfm.undo = None  # no more in-place writes that a rerun cannot repeat
        filter_stats = None
        if self.cfg.area_filter:
            self.phase = "area filter"
            t0 = time.perf_counter()
            if self.jphase == "loaded":
                self._filter_stats, self._redo = self._area_filter()
                self._checkpoint("area-filter")
            if self.jphase == "area-filter":
                self._apply_redo(self._redo)
                self._checkpoint("filtered")
            filter_stats = self._filter_stats
            self.timings["area_filter"] = time.perf_counter() - t0
        self.phase = "recompute"
        self._checkpoint("recompute")
        t0 = time.perf_counter()
        if os.environ.get("PFM_DASK_CRASH_AT", "").startswith("recompute-write"):
            self._crash_in_recompute()
        if self.append:
            touched = np.flatnonzero(self.touched)
            # pfmLoader clears CHECKED/VERIFIED on bins an append touched; the
            # header extrema then cover old and new bins alike.
            pfm.recompute(self.pfm, touched, clear_mask=V.CHECKED | V.VERIFIED,
                          threads=self.threads)
            extrema = self.pfm.compute_extrema()
        else:
            # a new PFM holds only what this load wrote: every bin with data was
            # touched, and the band plan needs no bin list (faster than one)
            extrema = pfm.recompute(self.pfm, None, threads=self.threads)
        self.pfm.write_header(**(extrema or {}))
        self.timings["recompute"] = time.perf_counter() - t0
        t_close = time.perf_counter()
        self.pfm.close(durable=self._journal_on)  # fsyncs every part
        if self._journal_on:
            self.timings["journal_checkpoint"] += time.perf_counter() - t_close
        self.phase = "check"
        self._checkpoint("check")
        t0 = time.perf_counter()
        problems = pfm.check(self.path, journal=False, threads=self.threads)
        self.timings["check"] = time.perf_counter() - t0
        self._check = {"sound": not problems, "problems": [str(p) for p in problems]}
        result = {
            "pfm": str(self.path),
            "files": [self.per_file[n] for n in self.file_numbers],
            "soundings_written": self.soundings_written,
            "area_filter": filter_stats,
            "check": self._check,
            "writer_timings": dict(self.timings),
            "peak_backlog_bytes": self.peak_backlog_bytes,
            "peak_backlog_batches": self.peak_backlog_batches,
            "resumed_from": self.resumed_from,
            "journal": self.journal_cost(),
        }
        if not problems:
            self._result = {k: v for k, v in result.items() if k != "writer_timings"}
            self._checkpoint("complete")
            self._close_journal(remove=True)
        else:
            self._checkpoint()
            self._close_journal()
        self.phase = "done"
        return result

    def journal_cost(self) -> dict:
        """Seconds the crash safety cost this writer: checkpoints, undo log, touched log."""
        undo = self._undo.seconds if self._undo is not None else 0.0
        tl = self._touched_log.seconds if self._touched_log is not None else 0.0
        ck = self.timings.get("journal_checkpoint", 0.0)
        return {"seconds": ck + undo + tl, "checkpoint_seconds": ck, "undo_seconds": undo,
                "touched_seconds": tl, "checkpoints": self.checkpoints,
                "undo_bytes": self._undo.bytes_saved if self._undo is not None else 0}

    def _crash_in_recompute(self) -> None:
        """Test hook: SIGKILL after the N-th batch of bin records the recompute writes."""
        orig = self.pfm.write_bin_records

        def wrapped(*args, **kwargs):
            orig(*args, **kwargs)
            self.pfm.flush()
            J.crash_point("recompute-write")

        self.pfm.write_bin_records = wrapped

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

        # Rows are read a band at a time (one chain walk and one map of the .ndx per band,
        # about _AREA_BAND_SOUNDINGS soundings; row by row cost 8x as much per sounding), up
        # to ``threads`` bands ahead on the writer's threads while the filter works (one
        # thread, as in --serial: in order, no pool), and handed to the filter row by row.
        fields = ("row", "col", "depth", "validity", "record_offset", "slot")

        def read_band(band):
            y0, y1 = band
            s = self.pfm.read_soundings(y0, y1, fields=fields)
            cut = np.searchsorted(s["row"], np.arange(y0, y1 + 1))
            return y0, y1, [{k: v[cut[r]:cut[r + 1]] for k, v in s.items()} for r in range(y1 - y0)]

        bands = pfm.ordered_imap(read_band, self._area_bands(needed), self.threads or pfm.THREADS)
        ahead: dict[int, dict] = {}

        def read_row(y: int):
            if not needed[y]:
                return None
            while y not in ahead:
                y0, y1, rows = next(bands)
                ahead.update(zip(range(y0, y1), rows))
            s = ahead.pop(y)
            return RowSoundings(col=s["col"].astype(np.int64), depth=s["depth"],
                                validity=s["validity"].astype(np.uint32),
                                address=np.stack([s["record_offset"], s["slot"]], axis=1),
                                active=touched[y])

        # The result goes to a redo file, applied afterwards (_apply_redo): applying it twice
        # is harmless, while filtering twice is not (the second pass sees the first's flags).
        # Deferring the writes is exact: a row is never read after its neighbour is written.
        redo_path = self._jp["redo"]
        fd = os.open(redo_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        acc = {"count": 0, "crc": 0, "size": 0}

        def write_row(y: int, res) -> None:
            if res.index.size:
                rec = np.empty((res.index.size, 3), dtype=_REDO_DTYPE)
                rec[:, 0] = res.address[:, 0]
                rec[:, 1] = res.address[:, 1]
                rec[:, 2] = res.validity
                raw = rec.tobytes()
                J._pwrite_all(fd, raw, acc["size"])
                acc["size"] += len(raw)
                acc["crc"] = zlib.crc32(raw, acc["crc"])
                acc["count"] += res.index.size
                J.crash_point("area-filter-row")

        try:
            summary = filt.run(read_row, write_row)
            os.fsync(fd)
        finally:
            bands.close()
            os.close(fd)
        out = summary.as_dict()
        out["flagged"] = out.get("cut", 0)
        out = json.loads(json.dumps(out, default=_plain))
        return out, {"file": J.REDO_NAME, **acc}

    def _area_bands(self, needed: np.ndarray):
        """Bands ``(row0, row1)`` of consecutive needed rows holding about
        ``_AREA_BAND_SOUNDINGS`` soundings (a heavier row is a band of its own), planned from
        the bin records' counts a block of rows at a time."""
        w, h = self.pfm.width, self.pfm.height
        step = max(1, (1 << 20) // w)
        start, tot = None, 0
        for r0 in range(0, h, step):
            r1 = min(h, r0 + step)
            if not needed[r0:r1].any():
                per_row = np.zeros(r1 - r0, np.int64)
            else:
                cnt = self.pfm.read_bin_records(r0, r1, fields=("num_soundings",))["num_soundings"]
                per_row = cnt.reshape(r1 - r0, w).sum(axis=1, dtype=np.int64)
            for y in range(r0, r1):
                if not needed[y]:
                    if start is not None:
                        yield start, y
                        start = None
                    continue
                n = int(per_row[y - r0])
                if start is not None and tot + n > _AREA_BAND_SOUNDINGS:
                    yield start, y
                    start = None
                if start is None:
                    start, tot = y, 0
                tot += n
        if start is not None:
            yield start, h

    def _apply_redo(self, redo: dict) -> None:
        """Write the area filter's result into the PFM (idempotent: fixed values at fixed places)."""
        path = self._jp["redo"]
        n = int(redo["count"])
        step = _REDO_CHUNK * 3 * np.dtype(_REDO_DTYPE).itemsize   # bytes of one chunk
        # verify the whole file first (nothing applied from a damaged one), then apply it;
        # both a chunk at a time: it holds 24 bytes per sounding the filter changed
        size, crc = 0, 0
        with open(path, "rb") as fh:
            while chunk := fh.read(step):
                size += len(chunk)
                crc = zlib.crc32(chunk, crc)
        if size != redo["size"] or size != n * step // _REDO_CHUNK or crc != redo["crc"]:
            raise LoadError("the area filter's redo file does not match its checksum; remove the "
                            "PFM and load again", path=path)
        self._dirty = True
        with open(path, "rb") as fh:
            while chunk := fh.read(step):
                r = np.frombuffer(chunk, dtype=_REDO_DTYPE).reshape(-1, 3)
                self.pfm.set_validity(r[:, 0], r[:, 1], r[:, 2])
                J.crash_point("area-filter-apply")
        self.pfm.flush()

    def abort(self) -> None:
        """Stop the background thread and close the file without the final step.

        The journal keeps the last checkpoint: a resume continues from there.
        """
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            if self.pfm is not None:
                self.pfm.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self._close_journal()


def _lookup(keys: np.ndarray, values: np.ndarray, want: np.ndarray) -> np.ndarray:
    """``values[searchsorted(keys, want)]`` for sorted unique integer ``keys`` that all of ``want``
    are among: through a table indexed by key when the keys are dense (ping numbers of a
    piece), an O(1) gather per sounding instead of a binary search into a table the
    soundings, sorted by bin, visit in no order."""
    if keys.size == 0:
        return values[np.searchsorted(keys, want)]
    lo, hi = int(keys[0]), int(keys[-1])
    if hi - lo + 1 > 4 * keys.size + 1024:
        return values[np.searchsorted(keys, want)]
    table = np.empty(hi - lo + 1, dtype=values.dtype)
    table[keys.astype(np.int64) - lo] = values
    return table[want.astype(np.int64) - lo]


def _plain(v):
    """JSON for numpy scalars in reports."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)
