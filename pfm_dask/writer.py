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
recompute and the check are idempotent and simply run again. The journal
handling is :mod:`pfm_dask._writer_journal`'s, the area filter step
:mod:`pfm_dask._writer_area`'s.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import journal as J
from . import pfm
from . import _faults
from ._faults import crash_planned, crash_point
from ._writer_area import apply_redo, run_area_filter, run_area_filter_sums
from .filters._area import _POST_SKIP as AREA_POST_SKIP, _SKIP as AREA_SKIP
from .pfm._area_sums import AreaSums
from .pfm._chains import ChainWalk
from ._writer_journal import Beside, WriterJournal
from .heap import release_code_pages, release_free_heap
from .bins import BinGrid
from .config import LoadConfig
from .errors import ConfigError, LoadError, PfmDaskError, PfmFormatError
from . import validity as V
from .lines import LineTracker
from .pfm._runs import touch_new
from ._writer_merge import PLAIN_COLUMNS, bin_chunks, merge_sorted, sounding_columns
from .pfm._recompute import THREADS, scattered
from .pfm import _tiles
from .pieces import COUNT_KEYS, Piece, PreparedPiece

__all__ = ["PfmWriter"]


@dataclass
class _Skipped:
    """A piece that failed for good: its error is recorded when its turn comes."""

    piece: Piece
    error: dict


class PfmWriter(WriterJournal):
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
        #: bytes of pieces written together in one ``add_sorted`` (:meth:`_group_end`); set
        #: from the backlog (a group waits in the buffer the driver's window bounds) and kept
        #: in the journal, so that a resumed load writes the same groups
        self.group_bytes = self.default_group_bytes(cfg) if cfg is not None else 0
        #: bytes of soundings merged and written by one ``add_sorted`` (a group is written as
        #: runs of consecutive bins of about this size: the writing's memory, about six times
        #: these bytes, follows this, not the group; the bytes written do not depend on it).
        #: A 64th of the backlog: 8 MiB runs write as fast as 32 MiB ones (docs/performance.md)
        self.chunk_bytes = max(1, int(cfg.max_backlog_bytes) // 64) if cfg is not None else 1 << 23
        self._lock = threading.Condition()
        self._buffer: dict[int, PreparedPiece | _Skipped] = {}
        self._buffer_bytes = 0
        # a chunk's merged columns, two sets reused in turn: the next chunk is merged on
        # :attr:`_merge_pool`'s thread while this one is written (its temporaries shared)
        self._merge_bufs: list[dict[str, np.ndarray]] = [{}, {}]
        self._merge_scratch: dict = {}      # the merges' temporaries (one merge at a time)
        self._merge_pool = None
        self.peak_backlog_bytes = 0
        self.peak_backlog_batches = 0
        self._next = 0
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._stop = False
        self.phase = "loading"
        self.t_start = time.time()
        self.timings = defaultdict(float)
        self.timings.update(merge=0.0, merge_cpu=0.0)   # also written by the merge thread
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
        self._writes_wait = False      # the first write waits for the first checkpoint
        self.checkpoints = 0
        self._flock: J.PfmLock | None = None
        self._undo: J.UndoLog | None = None
        self._touched_log: J.TouchedLog | None = None
        self._last_ckpt = time.monotonic()
        self._ckpt_thread: threading.Thread | None = None   # a checkpoint published behind
        self._ckpt_error: BaseException | None = None
        self._ckpt_at: tuple | None = None   # (phase, watermark) of the last checkpoint
        self._filter_stats = None
        self._redo: dict | None = None
        self._check: dict | None = None
        self._walk: ChainWalk | None = None   # the recompute's chain walk, for the check
        self._tiles: _tiles.TileRecompute | None = None   # bins recomputed while loading
        self._changed: np.ndarray | None = None   # bins the area filter changed (the tiles')
        self._running: tuple | None = None        # and their recompute's running values
        self._sums_gone: Beside | None = None     # the filter's sums being removed
        self._check_only = None   # the bins the final check reads, when the load wrote few
        self._result: dict | None = None
        self._finished: dict | None = None   # what finish() returned (a repeated call gets it)
        self._jp = J.journal_paths(self.path)
        self.resume_command = J.resume_command(self.path)
        self.resumed_from: dict | None = None
        self._static: dict | None = None
        self._claimed = False         # a new PFM's data folder made (PfmWriter._create)
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
                self.pfm = self._create(grid, cfg, journal if self._journal_on else None)
                created = True
            if self.threads is not None:
                self.pfm.pack_threads = self.threads
            self.touched = np.zeros(self.pfm.grid.width * self.pfm.grid.height, dtype=bool)
            if not append and _tiles.EARLY:
                # a new PFM: its finished tiles are recomputed beside the writer (not a
                # resumed load: its earlier tiles are not known; after the area filter the
                # final step recomputes the bins it changed again)
                self._tiles = _tiles.TileRecompute(self.pfm, self.touched, self.threads or THREADS)
                self._tiles.use_cores(self._own_threads())
                self._tiles.on_written = lambda: crash_point("tiles-write")
                if cfg.area_filter:
                    # the tiles take the filter's per-bin sums too: it walks few chains
                    self._tiles.sum_for_filter(
                        AreaSums(self._jp["sums"], self.touched.size), skip=AREA_SKIP,
                        post_skip=AREA_POST_SKIP,
                        null_depth=np.inf if cfg.null_depth is None else float(cfg.null_depth))
            if self._journal_on:
                # a new PFM: one checkpoint, after its inputs are listed (an append marks
                # the state before them: the .ctl it extends is cut back on a resume)
                self._start_journal(journal, checkpoint=append)
            self._add_files([str(f) for f in files])
            if self._journal_on:
                self._checkpoint(before_writes=True)   # made durable while pieces are made
        except BaseException as err:
            if self.pfm is not None:
                try:
                    self.pfm.close()
                except Exception:  # noqa: BLE001 - already failing
                    pass
            self._close_journal()
            if (created or self._claimed) and self._epoch == 0:
                # a new PFM that died before its first checkpoint holds nothing: remove what
                # it made (a folder holding anything else is left as it is)
                from .outputs import remove_load_files

                try:
                    remove_load_files(self.path, "the new PFM")
                except (PfmDaskError, OSError):
                    pass
            if isinstance(err, OSError) and J.is_disk_full(err):
                raise self._disk_full(err) from err
            raise

    def _create(self, grid: BinGrid, cfg: LoadConfig, static: dict | None):
        """The new PFM, its ``load.json`` (``static``, with the journal on) written first in its
        data directory; refused (:class:`ConfigError`, exit 2) when its path was taken after
        the load found it free: another load to the same output started at the same time."""
        def claimed(_data_dir: str) -> None:
            self._claimed = True
            if static is not None:
                self._write_static(static)
                crash_point("claimed")

        try:
            return pfm.create(self.path, grid, min_depth=cfg.min_depth, max_depth=cfg.max_depth,
                              precision=cfg.precision, on_claim=claimed,
                              bin_size_m=cfg.bin_size_m if cfg.bin_size_deg is None else None)
        except PfmFormatError as err:
            if not (os.path.lexists(self.path) or os.path.lexists(str(self.path) + ".data")):
                raise
            raise ConfigError("this output was created by another process (another load to the "
                              "same output?) after this load found it free; this load wrote "
                              "nothing and left it as it is: wait for that load and look at "
                              "its output, or name another output", path=self.path) from err

    @staticmethod
    def default_group_bytes(cfg: LoadConfig) -> int:
        """The group budget for a load with these settings: a quarter of its backlog (four of
        the largest pieces the planner makes). A group's pieces wait in the buffer the backlog
        bounds; they are written a run of bins of :attr:`chunk_bytes` at a time, so the
        writing's own memory (about six times the bytes it merges, docs/performance.md) follows
        :attr:`chunk_bytes` whatever the group. The larger the group, the fewer times a
        bin that adjacent lines share is rewritten."""
        return _faults.group_bytes() or max(1, int(cfg.max_backlog_bytes) // 4)

    def _add_files(self, files: list[str]) -> None:
        self._dirty = True
        numbers = self.pfm.add_files(files)
        self.file_numbers = [int(n) for n in numbers]
        self.files = list(files)
        for i, f in enumerate(self.files):
            self.per_file[self.file_numbers[i]] = {
                "path": f, **{k: 0 for k in COUNT_KEYS}, "damage": [], "lines": 0,
                "pieces": 0}

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
    def _group_end(self) -> int | None:
        """The ``seq`` past the group of pieces to write next, or None while it is incomplete
        (call under the lock). A group is the consecutive pieces from the watermark on until
        their bytes reach :attr:`group_bytes`, or up to the last piece: a rule of the data and
        the plan only, never of timing, so that every mode and run writes the same groups."""
        seq, acc = self._next, 0
        while True:
            item = self._buffer.get(seq)
            if item is None:
                return None
            if not isinstance(item, _Skipped):
                acc += item.nbytes
            if acc >= self.group_bytes or seq >= self.n_pieces - 1:
                return seq + 1
            seq += 1

    def write_ready(self) -> int:
        """Write every group of pieces whose turn has come; returns how many pieces were written."""
        n = 0
        while True:
            with self._lock:
                end = self._group_end()
                if end is None:
                    return n
                group = [self._buffer.pop(s) for s in range(self._next, end)]
            try:
                try:
                    self._write_group(group)
                finally:
                    with self._lock:
                        self._buffer_bytes -= sum(g.nbytes for g in group
                                                  if not isinstance(g, _Skipped))
                        self._next = end
                        self._lock.notify_all()
                n += len(group)
                if self._tiles is not None and end < self.n_pieces:
                    # the tiles no longer written in: recomputed beside, not in the final step
                    self._tiles.end_group()
                release_free_heap()   # the group's merge and packing memory, back to the system
                if end < self.n_pieces:
                    # its kernels are in: the code generator's pages, out of the next groups'
                    # peak (a load of one group has none to lower)
                    release_code_pages()
                for _ in group:
                    crash_point("piece")
                if self._journal_on and time.monotonic() - self._last_ckpt >= self.checkpoint_seconds:
                    self._checkpoint(behind=True)     # made durable on a thread of its own
            except OSError as err:
                if J.is_disk_full(err):
                    raise self._disk_full(err) from err
                raise

    def _write_group(self, group: list) -> None:
        """Write a group of consecutive pieces: each piece's counts and line numbers in turn,
        then all their soundings merged by bin (stably: within a bin, piece order), so that a
        bin the group's overlapping lines share is written once. The merge and ``add_sorted``
        go by runs of consecutive bins of about :attr:`chunk_bytes` (:func:`bin_chunks`):
        new records are appended in bin order either way, so the bytes are those of one call."""
        self._before_writing()
        t0 = time.perf_counter()
        c0 = time.thread_time()
        self._dirty = True
        parts = []
        for prepared in group:
            if isinstance(prepared, _Skipped):
                rec = self.per_file[prepared.piece.file_number]
                if prepared.error not in rec["damage"]:
                    rec["damage"].append(prepared.error)
                continue
            cols = self._columns(prepared)
            if cols is not None:
                parts.append(cols)
            self.pieces_written += 1
            if prepared.piece.last:
                self.files_done += 1
        if parts:
            nbytes = sum(p["nbytes"] for p in parts)
            n = sum(p["bin_index"].size for p in parts)
            per_chunk = max(1, int(n * self.chunk_bytes / max(1, nbytes)))
            chunks = list(bin_chunks([p["bin_index"] for p in parts], per_chunk))

            # --serial (one thread) is the speedup baseline: no merge thread there
            pool = self._merger() if len(chunks) > 1 and self.threads != 1 else None

            def merged(i: int) -> dict:
                t, c = time.perf_counter(), time.thread_time()
                out = merge_sorted([sounding_columns(p, a, b) for p, (a, b)
                                     in zip(parts, chunks[i]) if b > a],
                                    self._merge_bufs[i % 2 if pool is not None else 0],
                                    self._merge_scratch)
                self.timings["merge"] += time.perf_counter() - t
                self.timings["merge_cpu"] += time.thread_time() - c   # on whichever thread
                return out

            nxt = pool.submit(merged, 0) if pool is not None else None
            for i in range(len(chunks)):
                cols = nxt.result() if pool is not None else merged(i)
                if pool is not None and i + 1 < len(chunks):
                    # the next chunk merges into the other set of buffers meanwhile (numpy's
                    # copies and the merge kernel release the GIL)
                    nxt = pool.submit(merged, i + 1)
                if self._tiles is None:
                    self.pfm.add_sorted(**cols)
                else:
                    # the tiles' thread writes bin records too: not while this call does
                    tw = time.perf_counter()
                    with self._tiles.lock:
                        self.timings["tiles_wait"] += time.perf_counter() - tw
                        self.pfm.add_sorted(**cols)
                        self._tiles.after_write(self.pfm.last_bins)
                # each bin enters the touched log once (the call's bins, each once, in order)
                new = touch_new(self.pfm.last_bins, self.touched)
                if self._touched_log is not None:
                    self._touched_log.append(new)
        self.timings["write"] += time.perf_counter() - t0
        self.timings["write_cpu"] += time.thread_time() - c0   # this thread's own (not the pack threads')
        now = time.time()
        self._rate_window.append((now, self.soundings_written))
        self._rate_window = [(t, s) for t, s in self._rate_window if now - t <= 10.0]

    def _merger(self):
        """The one thread that merges a group's next chunk while the current one is written."""
        if self._merge_pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._merge_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pfm-merge")
        return self._merge_pool

    def _columns(self, prepared: PreparedPiece) -> dict | None:
        """A piece's counts into its file's record, its lines numbered (new names appended to
        the ``.lin``), and its soundings' columns as :func:`sounding_columns` slices them into
        those ``add_sorted`` takes (None if empty)."""
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
        if not batch.num_rows:
            return None
        tracker = self._trackers.setdefault(fnum, LineTracker(piece.path))
        p, local, new_names = tracker.assign(prepared.pings)
        lines = self._file_lines.setdefault(fnum, [])
        if new_names:
            lines.extend(self.pfm.add_lines(new_names))
            rec["lines"] += len(new_names)
        global_lines = np.asarray(lines, dtype=np.uint32)[local]
        self.soundings_written += batch.num_rows
        self.bytes_written += batch.nbytes
        nulls = None
        if self.cfg.null_depth != self.pfm.null_depth:
            # depths out of range carry the settings' null (max + 1, a double); the PFM's
            # is that value as a float, which may round below it (e.g. max 1364.475)
            nulls = (self.cfg.null_depth, self.pfm.null_depth)
        ping = batch.column("ping").to_numpy()
        # the line numbers by ping, looked up a run at a time (sounding_columns): a group's
        # line column whole would be 4 bytes a sounding more at the writer's peak
        return {"bin_index": batch.column("bin_index").to_numpy(), "file": fnum,
                "line": (p, global_lines), "ping": ping, "nulls": nulls,
                "nbytes": prepared.nbytes - prepared.pings.nbytes,   # as groups count it
                **{k: batch.column(k).to_numpy() for k in ("beam", "depth", *PLAIN_COLUMNS)}}

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
                    t_wait = time.perf_counter()   # the writer idle: its next group incomplete
                    while not self._stop and self._group_end() is None:
                        self._lock.wait(0.5)
                    if self._next < self.n_pieces:
                        self.timings["wait_pieces"] += time.perf_counter() - t_wait
                    if self._stop and self._group_end() is None:
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

    def _own_threads(self) -> int:
        """Threads this writer keeps computing: its own, and the merge thread unless it has
        one thread (``--serial``, where the pieces are also made on that thread)."""
        return 1 if self.threads == 1 else 2

    def compute_threads(self, n: int) -> None:
        """The load's tasks keep ``n`` threads computing on this machine (the driver says so
        before the first piece): tiles are recomputed beside the writer only with cores to
        spare beyond those and the writer's own
        (:meth:`pfm._tiles.TileRecompute.use_cores`)."""
        if self._tiles is not None:
            self._tiles.use_cores(self._own_threads() + int(n))

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
        passes. A repeated call returns the first call's result: Dask runs an actor's
        method again when the connection that carried the call broke.
        """
        if self._finished is not None:
            return self._finished
        try:
            self._finished = self._finish()
            return self._finished
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
        self._before_writing()       # (a load of no piece wrote nothing yet)
        if self._next < self.n_pieces:
            raise LoadError(f"finish() called with {self.n_pieces - self._next} pieces "
                            "not yet written", path=self.path)
        if self._tiles is not None:
            self._tiles.close(hurry=True)      # nothing writes beside; the final step does the rest
            self._tiles.threads = self.threads or THREADS      # the final step's, from here on
        self._merge_bufs = [{}, {}]    # the groups are written: their buffers are not needed
        self._merge_scratch = {}
        if self._merge_pool is not None:
            self._merge_pool.shutdown()
            self._merge_pool = None
        self.pfm.flush()
        self.pfm.drop_write_buffers()
        release_free_heap()
        # a new load without the area filter: a resume redoes its final step from the last
        # checkpoint of its loading phase (_final_step_redone), so the phases below are not
        # checkpoints of their own. A new load with the area filter makes "loaded" durable
        # while the filter runs (it writes only its redo file; "area-filter" waits for it)
        # and "filtered" while the recompute runs (a resume from "area-filter" applies the
        # redo file again and recomputes: both idempotent); an append takes each in turn.
        redone = self._final_step_redone()
        beside = not self.append      # (a new load with the area filter, when not redone)

        def phase_only(phase: str) -> None:
            self.jphase = phase

        checkpoint = phase_only if redone else self._checkpoint
        if self.jphase == "loading":
            if redone:
                phase_only("loaded")
            else:
                self._checkpoint("loaded", behind=beside)
        self.pfm.undo = None  # no more in-place writes that a rerun cannot repeat
        filter_stats = None
        if self.cfg.area_filter:
            self.phase = "area filter"
            t0 = time.perf_counter()
            if self.jphase == "loaded":
                got, tiles, running = None, self._tiles, None
                if tiles is not None and tiles.early and tiles.sums is not None:
                    # every tile recomputed and summed first: the filter from the sums
                    t1 = time.perf_counter()
                    tiles.finish_rest()
                    self.timings["tiles_rest"] = time.perf_counter() - t1
                    if tiles.sums_ok:
                        changed, running = [], []
                        got = run_area_filter_sums(self.pfm, self.touched, self.cfg,
                                                   self._jp["redo"], tiles.sums, changed=changed,
                                                   running=running, threads=self.threads)
                        if got is not None:
                            got, self.timings["area_walked"] = got[:2], got[2]
                self._drop_sums(beside=True)
                if got is None:
                    changed, running = ([] if tiles is not None else None), None
                    got = run_area_filter(self.pfm, self.touched, self.cfg, self._jp["redo"],
                                          self.threads, changed=changed)
                self._filter_stats, self._redo = got
                if changed is not None:
                    self._changed = (np.concatenate(changed) if changed
                                     else np.zeros(0, np.int64))
                if running:     # the changed bins' running values, for their recompute
                    self._running = (np.concatenate([r[0] for r in running]),
                                     np.concatenate([r[1] for r in running]))
                release_free_heap()    # the filter's bands, before the recompute's
                self._checkpoint("area-filter")
            if self.jphase == "area-filter":
                self._dirty = True
                apply_redo(self.pfm, self._jp["redo"], self._redo)
                self._checkpoint("filtered", behind=beside)
            filter_stats = self._filter_stats
            self.timings["area_filter"] = time.perf_counter() - t0
        self.phase = "recompute"
        (phase_only if beside else checkpoint)("recompute")     # the recompute runs whatever the phase
        t0 = time.perf_counter()
        if crash_planned("recompute-write"):
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
            # touched, and the band plan needs no bin list (faster than one), unless
            # they are a few bins scattered over a fine grid: those are read directly;
            # the same pass walks the chains for the check (one walk instead of two;
            # not for scattered bins, whose check walks them itself)
            # (the list only then: 8 bytes a bin with data, on a large grid the final
            # step's largest array)
            wanted = None
            if scattered(int(np.count_nonzero(self.touched)), self.touched.size):
                wanted = np.flatnonzero(self.touched)
            tiles = self._tiles
            if tiles is not None and tiles.error is not None:
                # the final step recomputes what the thread left: the load goes on, said once
                logging.getLogger("pfm_dask").warning(
                    "the recompute beside the writer stopped (%s: %s); the final step does it",
                    type(tiles.error).__name__, tiles.error)
            if (tiles is not None and tiles.early and not crash_planned("recompute-write")
                    and (self._changed is not None or not self.cfg.area_filter)):
                # most tiles were recomputed while loading: the rest, and their extrema
                extrema = tiles.finish(changed=self._changed, running=self._running)
                self._walk = tiles.walk
                self.timings.update(tiles=tiles.seconds, tiles_cpu=tiles.cpu,
                                    tiles_early=tiles.tiles_early,
                                    tiles_redone=tiles.tiles_redone,
                                    tiles_refreshed=tiles.tiles_refreshed)
            else:
                self._walk = ChainWalk()
                extrema = pfm.recompute(self.pfm, wanted, threads=self.threads, walk=self._walk,
                                        fresh=True)
            # the check reads these bins too, not the whole sparse .bin
            self._check_only = wanted
        self.pfm.write_header(**(extrema or {}))
        self.timings["recompute"] = time.perf_counter() - t0
        # the recompute's band buffers, freed in its threads' heaps: back to the system
        # before the check's bands take their own
        release_free_heap()
        # the parts are first needed durable by the "complete" checkpoint: their fsyncs (the
        # recompute rewrote the .bin) run beside the check. The journal says "recompute" (a
        # short load: "loading") until then, so a crash in the check reruns the recompute
        # too (the load, for a short one): both are idempotent.
        syncing = Beside(self._close_durable)
        self.phase = "check"
        t0 = time.perf_counter()
        try:
            crash_point("final-check")
            problems = pfm.check(self.path, journal=False, threads=self.threads,
                                 walked=self._walk, only=self._check_only)
        finally:
            syncing.join()
            if self._sums_gone is not None:
                self._sums_gone.join()
                self._sums_gone = None
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

    def _drop_sums(self, beside: bool = False) -> None:
        """Remove the area filter's sums (scratch: a resumed load does without them);
        ``beside``: on a thread of its own, joined at the end of the final step (freeing the
        74-file survey's 560 MB of cached sums took 0.4-0.5 s)."""
        if self._tiles is not None and self._tiles.sums is not None:
            sums, self._tiles.sums = self._tiles.sums, None
            if beside:
                self._sums_gone = Beside(lambda: sums.close(remove=True))
            else:
                sums.close(remove=True)

    def _crash_in_recompute(self) -> None:
        """Test hook: SIGKILL after the N-th batch of bin records the recompute writes."""
        orig = self.pfm.write_bin_records

        def wrapped(*args, **kwargs):
            orig(*args, **kwargs)
            self.pfm.flush()
            crash_point("recompute-write")

        self.pfm.write_bin_records = wrapped

    def abort(self) -> None:
        """Stop the background thread and close the file without the final step.

        The journal keeps the last checkpoint: a resume continues from there.
        """
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._tiles is not None:
            self._tiles.close()
            self._drop_sums()
        try:
            if self.pfm is not None:
                self.pfm.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
        self._close_journal()
