"""PFM v7 on disk: create, open, append soundings, read bins and soundings, rewrite flags.

A PFM ``X.pfm`` is a handle file plus ``X.pfm.data/`` holding ``X.pfm.ctl``
(input files), ``X.pfm.lin`` (line names), ``X.pfm.bin`` (header and
bit-packed bin records), ``X.pfm.ndx`` (bit-packed physical depth records
chained per bin) and ``X.pfm.cvg`` (coverage map). Layout and numeric rules
are those of PFM library V7.00 (PFM_NOTES 2.x, ``lib-pfm_lib : pfm_io.c``);
everything here is numpy over many records at once.

API (stable; the recompute, check, dump and filter code rely on it)
--------------------------------------------------------------------
``create(path, grid, *, min_depth=-10000.0, max_depth=12000.0, precision=0.01,
max_files=0, max_lines=0, max_pings=0, max_beams=0, max_bin_soundings=0,
record_length=6, horizontal_error_max=None, vertical_error_max=None,
horizontal_error_scale=100.0, vertical_error_scale=100.0, bin_size_m=None,
max_record_pointer=0, classification="UNCLASSIFIED", creation_software=None,
wkt=WGS84_WKT, mosaic_path="NONE", feature_path="NONE", dynamic_reload=1,
user_flag_names=None) -> PfmFile``
    New PFM from a :class:`pfm_dask.bins.BinGrid`; opened ``"r+"``. A maximum
    of 0 keeps the library default width (``pfm.h``). Error maxima default to
    pfmLoader's: vertical 15 m if ``max_depth < 150`` else 10 % of it;
    horizontal 10 x ``bin_size_m`` (10 x the geodesic y-bin length for degree
    grids or when ``bin_size_m`` is not given).
``open_pfm(path, mode="r" | "r+") -> PfmFile``
    Open an existing PFM (v7; v6.x read-only; older refused).

``PfmFile`` attributes: ``path`` (handle), ``data_dir``, ``ctl_path``,
``lin_path``, ``bin_path``, ``ndx_path``, ``cvg_path``, ``header``
(:class:`PfmHeader`), ``grid`` (:class:`BinGrid`, built from the header),
``width``, ``height``, ``record_length``, ``null_depth``,
``bin_header_size``, ``bin_record_size``, ``ndx_record_size``, ``ndx_size``
(bytes), ``mode``, ``version`` (x10: 70 for V7.00), ``max_file_number`` /
``max_line_number`` / ``max_ping_number`` / ``max_beam_number`` (the
``2**bits - 1`` limits) and ``timings`` (seconds per ``add_sorted`` phase).

Methods:

* ``files() -> list[PfmInputFile]`` (number, path, data_type, deleted);
  ``add_files(paths, data_type=2) -> list[int]``.
* ``lines() -> list[str]``; ``add_lines(names) -> list[int]``.
* ``add_sorted(bin_index, file, line, ping, beam, depth, x_off, y_off,
  validity, horizontal_error, vertical_error, *, attributes=None)``: append
  soundings sorted by ``bin_index`` (see the method).
* ``read_bin_records(row0, row1, col0=0, col1=None, *, codes=False) -> dict``:
  arrays (row-major over the rectangle) ``bin_index, row, col,
  num_soundings, num_valid, std, avg_filtered, min_filtered, max_filtered,
  avg, min, max, validity, head, tail`` (+ ``attr_<i>``). Depths and std are
  decoded with the library's float32 arithmetic and returned as float64;
  ``codes=True`` adds the raw integer codes as ``<field>_code``.
* ``read_soundings(row0, row1, col0=0, col1=None) -> dict``: one entry per
  sounding of every bin in the rectangle, bins row-major and each bin's
  soundings in chain order (= the order they were added): ``bin_index,
  row, col, file, line, ping, beam, x_off, y_off, validity`` (int64),
  ``depth`` (float64, ``code / scale - offset`` in double as the library),
  ``horizontal_error, vertical_error`` (float32 ``code / scale``; -999 for
  null), ``record_offset`` (int64 byte offset of the physical record in
  .ndx), ``slot`` (int64), ``address`` (uint64, ``record_offset *
  record_length + slot``) (+ ``attr_<i>`` for NDX attributes).
* ``read_bin(col, row) -> (dict of scalars, dict of arrays)``.
* ``set_validity(record_offset, slot, validity)``: rewrite sounding flags.
* ``write_bin_records(bin_index, *, coverage=True, **fields)``: write bin
  statistics (``num_valid, std, avg_filtered, min_filtered, max_filtered,
  avg, min, max, validity``); with ``validity`` also updates the ``.cvg``.
* ``update_coverage(bin_index, validity)``; ``read_coverage(bin_index)``.
* ``compute_extrema() -> dict`` (pfmLoader's header extrema from bin
  records); ``write_header(**values)``: set header keys (PfmHeader field
  names) and rewrite the header; with no values the extrema are computed.
* ``decode_positions(col, row, x_off, y_off) -> (lat, lon)``.
* ``flush()``, ``close(durable=False)`` (fsync all parts if durable), context
  manager.

Notes: new depth records are coded and packed by numba kernels on a small
thread pool, each thread writing its records past the end of the ``.ndx``
as it goes (``pwrite`` of about 1 MiB while it is in cache); rewrites of
bin and tail records are written by a background thread, and every read
or in-place rewrite first waits for the queued writes that could overlap
it, and ``flush``/``close`` wait for all. Error fields store ``NINT(e * scale)``
clamped to ``2**bits - 1``, which this reader returns as -999; the library
itself would read that code as ``(2**bits - 1) / scale`` (its null test
compares the unscaled value with the scaled null and never fires).
"""

from __future__ import annotations

import mmap
import os
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from .. import __version__ as _PKG_VERSION
from .._numeric import nint, scaled_code_f32, scaled_code_f64
from ..errors import ConfigError, PfmFormatError
from . import validity as V
from ._names import TEXT_CODING, decode_names, encode_names
from ._bitpack import (CHECK_SIZE, BitLayout, SoundingCoding, bin_runs, bits_all_set, check_failures,
                       clear_bits, fill_slots, pack_soundings, unpack_records)
from ._chains import chain_plan, chain_records, item_positions
from ._sparse import gather_runs, nonzero_records, positions_to_items, record_runs
from ._coverage import (COV_HEADER_SIZE, create_coverage_file, read_coverage,
                        update_coverage)
from ._header import (BIN_HEADER_SIZE, LIBRARY_VERSION, NUM_ATTR, WGS84_WKT, PfmHeader,
                      bits_for, version_number)

__all__ = [
    "PfmFile",
    "PfmInputFile",
    "PfmHeader",
    "create",
    "open_pfm",
    "bits_for",
    "LIBRARY_VERSION",
    "WGS84_WKT",
    "PFM_GSF_DATA",
    "SOUNDING_FIELDS",
    "BIN_FIELDS",
]

#: Data type number of GSF input in the ``.ctl`` (``PFM_GSF_DATA``).
PFM_GSF_DATA = 2

# pfm.h defaults
PFM_FILE_BITS = 14
PFM_LINE_BITS = 15
PFM_PING_BITS = 32
PFM_BEAM_BITS = 16
PFM_RECORD_LENGTH = 6
PFM_COUNT_BITS = 24
PFM_STD_BITS = 32
PFM_STD_SCALE = 1000000.0
PFM_RECORD_POINTER_BITS = 38
PFM_OFFSET_BITS = 12
PFM_VALIDITY_BITS = 23

#: Per-sounding fields of a physical record, in bit order (attributes sit before validity).
SOUNDING_FIELDS = ("file", "line", "ping", "beam", "depth", "x_off", "y_off",
                   "validity", "horizontal_error", "vertical_error")
#: Bin record fields that carry statistics (written by the recompute).
BIN_FIELDS = ("num_soundings", "std", "avg_filtered", "min_filtered", "max_filtered",
              "avg", "min", "max", "num_valid", "validity", "head", "tail")
_DEPTH_FIELDS = ("avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max")

_WRITE_CHUNK = 4 << 20           # bytes per os.pwrite of new records
_RMW_GAP = 4096                  # merge read-modify-write spans whose gap is at most this
_MAX_SPAN = 32 << 20             # longest single read/write
#: threads that pack records in parallel (the numba kernels release the GIL)
PACK_THREADS = min(2, os.cpu_count() or 1)


@dataclass(frozen=True)
class PfmInputFile:
    """One line of the ``.ctl`` file list."""

    number: int
    path: str
    data_type: int
    deleted: bool


def _f32(x) -> float:
    return float(np.float32(x))


# ---------------------------------------------------------------------------
# span I/O: many fixed-size records at sorted offsets, read and written in
# few large system calls


class _Spans:
    """Records of ``size`` bytes at sorted unique ``offsets``, read as merged spans.

    The spans (records closer than ``max_gap`` bytes merged, none longer than
    ``_MAX_SPAN``) lie end to end in one buffer, so that every record is a
    position in it and each operation is one vectorised call whatever the
    number of spans. ``records()`` gives an (n, size) copy; ``store(records)``
    puts modified records back; ``unpack``/``pack`` read and change fields in
    place; ``write()`` writes every span with one ``pwrite`` each, in offset
    order. Gap bytes between records are written back unchanged (the file is
    not shared while we hold it).
    """

    def __init__(self, fd: int, offsets: np.ndarray, size: int, *, max_gap: int,
                 path=None, what: str = "record", read: bool = True, zero: bool = True):
        self.fd = fd
        self.size = int(size)
        off = np.asarray(offsets, dtype=np.int64)
        self.offsets = off
        self.path = path
        n = off.size
        if n and np.any(np.diff(off) < self.size):
            raise PfmFormatError(f"overlapping {what}s requested (two bins share a record?)",
                                 path=path, offset=int(off[np.flatnonzero(np.diff(off) < self.size)[0]]))
        brk = np.flatnonzero((np.diff(off) - self.size > max_gap)) + 1 if n else np.zeros(0, np.int64)
        starts = np.r_[0, brk].astype(np.int64) if n else np.zeros(0, np.int64)
        ends = np.r_[brk, n].astype(np.int64) if n else np.zeros(0, np.int64)
        # split the (rare) spans longer than _MAX_SPAN; the others stay as they are
        too_long = np.flatnonzero(off[ends - 1] + self.size - off[starts] > _MAX_SPAN) if n else starts
        if too_long.size:
            runs_a, runs_b = [], []
            for a, b in zip(starts.tolist(), ends.tolist()):
                while a < b:
                    lim = int(off[a]) + _MAX_SPAN
                    c = min(b, a + max(1, int(np.searchsorted(off[a:b] + self.size, lim, side="right"))))
                    runs_a.append(a)
                    runs_b.append(c)
                    a = c
            starts, ends = np.array(runs_a, dtype=np.int64), np.array(runs_b, dtype=np.int64)
        # span k covers file bytes span_lo[k] .. span_lo[k] + span_len[k], at buf[span_at[k]:]
        self.span_lo = off[starts]
        self.span_len = off[ends - 1] + self.size - self.span_lo if n else np.zeros(0, np.int64)
        self.span_at = np.cumsum(self.span_len) - self.span_len
        total = int(self.span_len.sum())
        # position in buf of every record
        run_of = np.repeat(np.arange(starts.size, dtype=np.int64), ends - starts)
        self.pos = off - self.span_lo[run_of] + self.span_at[run_of]
        self.dense = total == n * self.size     # no gap bytes: buf is the records end to end
        if not read:   # records never written: zeros, or (zero=False) left for the caller to write whole
            self.buf = np.zeros(total, dtype=np.uint8) if zero else np.empty(total, dtype=np.uint8)
            return
        self.buf = np.empty(total, dtype=np.uint8)
        mv = memoryview(self.buf)
        for lo, ln, at in zip(self.span_lo.tolist(), self.span_len.tolist(), self.span_at.tolist()):
            got = os.preadv(fd, [mv[at:at + ln]], lo)
            if got != ln:
                raise PfmFormatError(f"{what} at byte {lo + got:,} is past the end of the file",
                                     path=path, offset=lo + got)

    def _view(self) -> np.ndarray:
        """A writeable (len - size + 1, size) window view: row ``p`` is the record at byte ``p``."""
        return np.lib.stride_tricks.as_strided(self.buf, shape=(self.buf.size - self.size + 1, self.size),
                                               strides=(1, 1), writeable=True)

    def records(self) -> np.ndarray:
        if self.dense:
            return self.buf.reshape(-1, self.size).copy()
        return self._view()[self.pos]

    def store(self, records: np.ndarray) -> None:
        if self.dense:
            self.buf.reshape(-1, self.size)[...] = records
        else:
            self._view()[self.pos] = records

    def write(self, writer: "_BackgroundWriter | None" = None) -> None:
        parts = [(self.buf[at:at + ln], lo) for lo, ln, at in
                 zip(self.span_lo.tolist(), self.span_len.tolist(), self.span_at.tolist())]
        if writer is not None:
            writer.submit_many(self.fd, parts)
            return
        for part, lo in parts:
            _pwrite_all(self.fd, part, lo)

    def extent(self) -> tuple[int, int]:
        """Byte range covered by the spans."""
        if not self.offsets.size:
            return (0, 0)
        return int(self.offsets[0]), int(self.offsets[-1]) + self.size

    def unpack(self, layout: BitLayout, keys) -> dict:
        """Fields (uint64) of every record, read in place from the span buffer."""
        if not self.offsets.size:
            return {k: np.empty(0, dtype=np.uint64) for k in keys}
        return layout.unpack_at(self.buf, self.pos, keys)

    def pack(self, layout: BitLayout, values: dict, executor=None) -> None:
        """Overwrite fields of every record in place in the span buffer (other bits kept)."""
        if self.offsets.size:
            layout.pack_at(self.buf, self.pos, values, executor=executor)

    def pack_new(self, layout: BitLayout, values: dict) -> None:
        """Write every record anew in the span buffer: the given fields, all other bits 0."""
        if self.offsets.size:
            layout.pack_new_at(self.buf, self.pos, values)


def _pwrite_all(fd: int, data, offset: int) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        try:
            n = os.pwrite(fd, mv[done: done + _WRITE_CHUNK], offset + done)
        except OSError as exc:  # name the file (a full disk must say which)
            if exc.filename is None:
                try:
                    exc.filename = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    pass
            raise
        if n <= 0:
            raise OSError(f"short write at byte {offset + done}")
        done += n


_SYNC_FILE_RANGE_WRITE = 2       # linux/fs.h: start write-out of dirty pages, do not wait
_sync_file_range = None          # libc's sync_file_range, looked up on first use (False: none)


def _start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing ``nbytes`` at ``offset`` to disk now, without waiting.

    Linux otherwise keeps freshly written pages dirty until memory pressure or an
    fsync, so a large write ends with the whole file still to flush; started
    early, the disk works while the next records are packed. A no-op where
    ``sync_file_range`` is missing (not Linux) or refused.
    """
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                import ctypes.util

                fn = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _sync_file_range = fn
            except (OSError, AttributeError):
                pass
    if _sync_file_range and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)   # advisory: errors ignored


class _BackgroundWriter:
    """Writes queued buffers in order on one thread, so packing overlaps disk I/O.

    ``os.pwrite`` releases the GIL. Every queued write is remembered with its
    byte range until it is done; :meth:`wait_for` blocks until no pending
    write overlaps a range about to be read, :meth:`drain` until all are
    done. An error in the thread is re-raised by the next call.
    """

    def __init__(self, depth: int = 3):
        import queue
        import threading

        self._q: "queue.Queue" = queue.Queue(maxsize=depth)
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[int, int, int]] = {}
        self._seq = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="pfm-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                self._q.task_done()
                return
            seq, action, done = job
            try:
                if self._error is None:
                    action()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self._error = exc
            finally:
                if seq is not None:
                    with self._lock:
                        self._pending.pop(seq, None)
                if done is not None:
                    done()
                self._q.task_done()

    def _queue(self, action, fd: int | None = None, lo: int = 0, hi: int = 0, done=None) -> None:
        """Queue ``action()``; with ``fd``, remember bytes ``lo..hi`` of it as pending until done."""
        self._check()
        seq = None
        if fd is not None:
            with self._lock:
                self._seq += 1
                seq = self._seq
                self._pending[seq] = (fd, int(lo), int(hi))
        self._q.put((seq, action, done))

    def submit(self, fd: int, data, offset: int, done=None) -> None:
        """Queue ``data`` for writing at ``offset``; ``done()`` runs in the thread afterwards."""
        self._queue(lambda: _pwrite_all(fd, data, offset), fd, offset,
                    int(offset) + memoryview(data).nbytes, done)

    def submit_many(self, fd: int, parts: list) -> None:
        """Queue several ``(data, offset)`` writes as one job (one hand-over to the thread)."""
        if not parts:
            return
        parts = list(parts)
        lo = min(int(at) for _, at in parts)
        hi = max(int(at) + memoryview(d).nbytes for d, at in parts)

        def write_all() -> None:
            for part, at in parts:
                _pwrite_all(fd, part, at)
        self._queue(write_all, fd, lo, hi)

    def start_writeback(self, fd: int, offset: int, nbytes: int) -> None:
        """Queue :func:`_start_writeback` (it can block while the disk's queue is full)."""
        self._queue(lambda: _start_writeback(fd, offset, nbytes))

    def wait_for(self, fd: int, lo: int, hi: int) -> None:
        with self._lock:
            clash = any(f == fd and a < hi and lo < b for f, a, b in self._pending.values())
        if clash:
            self.drain()

    def drain(self) -> None:
        self._q.join()
        self._check()

    def _check(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self._q.put(None)
            self._thread.join()


class _NdxMap:
    """The ``.ndx`` mapped read-only: byte ranges of records gathered by byte address.

    Reads go through the page cache with no copy but the gather itself, and
    any number of threads may read at once. Records at unaligned addresses
    (damaged pointers) are served like the others.
    """

    def __init__(self, fd: int, size: int, file_size: int, path=None):
        self.size, self.file_size, self.path = int(size), int(file_size), path
        self._mm = mmap.mmap(fd, self.file_size, access=mmap.ACCESS_READ) if self.file_size else None
        self.buf = (np.frombuffer(self._mm, dtype=np.uint8) if self._mm is not None
                    else np.zeros(0, dtype=np.uint8))

    def _check(self, addr: np.ndarray) -> None:
        bad = (addr < 0) | (addr + self.size > self.file_size)
        if np.any(bad):
            a = int(addr[np.flatnonzero(bad)[0]])
            raise PfmFormatError(f"chain pointer {a:,} is outside the .ndx file "
                                 f"({self.file_size:,} bytes)", path=self.path, offset=a)

    def words(self, at: np.ndarray, addr: np.ndarray) -> np.ndarray:
        """Big-endian 64-bit words at byte offsets ``at``, which lie within the records at ``addr``."""
        self._check(np.asarray(addr, dtype=np.int64))
        if at.size == 0:
            return np.zeros(0, dtype=">u8")
        view = np.ndarray((self.file_size - 7,), dtype=">u8", buffer=self.buf, strides=(1,))
        return view[at]

    def get(self, addr: np.ndarray, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """(n, hi - lo) bytes ``lo:hi`` of the records at ``addr``."""
        addr = np.asarray(addr, dtype=np.int64)
        self._check(addr)
        hi = self.size if hi is None else hi
        if addr.size == 0:
            return np.zeros((0, hi - lo), dtype=np.uint8)
        if not np.any(addr % self.size):
            recs = self.records()
            i = addr // self.size
            return recs[i] if (lo, hi) == (0, self.size) else recs[i, lo:hi]
        view = np.lib.stride_tricks.as_strided(self.buf[lo:], shape=(self.file_size - hi + 1, hi - lo),
                                               strides=(1, 1), writeable=False)
        return view[addr]

    def records(self) -> np.ndarray:
        """The whole physical records of the file as an (n, size) view."""
        n = self.file_size // self.size
        return self.buf[: n * self.size].reshape(n, self.size)

    def close(self) -> None:
        """Drop the map (it is unmapped once no array refers to it)."""
        self.buf = np.zeros(0, dtype=np.uint8)
        self._mm = None


# ---------------------------------------------------------------------------


def _bin_layout(h: PfmHeader, has_num_valid: bool) -> BitLayout:
    """The bin record layout of ``set_offsets`` (count, std, 6 depths, num_valid, attrs, validity, head, tail)."""
    f = []
    pos = 0

    def add(key, nb):
        nonlocal pos
        f.append((key, pos, nb))
        pos += nb

    add("num_soundings", h.count_bits)
    add("std", h.std_bits)
    for k in _DEPTH_FIELDS:
        add(k, h.depth_bits)
    if has_num_valid:
        add("num_valid", h.count_bits)
    for i in range(NUM_ATTR):
        add(("attr", i), int(h.bin_attribute_bits[i]))
    add("validity", h.validity_bits)
    add("head", h.record_pointer_bits)
    add("tail", h.record_pointer_bits)
    return BitLayout(f)


def _ndx_layout(h: PfmHeader) -> tuple[BitLayout, int]:
    """Physical record layout: ``RECORD LENGTH`` soundings, then the continuation pointer."""
    per = [("file", h.file_number_bits), ("line", h.line_number_bits),
           ("ping", h.ping_number_bits), ("beam", h.beam_number_bits),
           ("depth", h.depth_bits), ("x_off", h.offset_bits), ("y_off", h.offset_bits)]
    per += [(("attr", i), int(h.ndx_attribute_bits[i])) for i in range(NUM_ATTR)]
    per += [("validity", h.validity_bits), ("horizontal_error", h.horizontal_error_bits),
            ("vertical_error", h.vertical_error_bits)]
    single = sum(nb for _, nb in per)
    f = []
    for s in range(h.record_length):
        pos = s * single
        for key, nb in per:
            f.append(((key, s), pos, nb))
            pos += nb
    f.append(("continuation", single * h.record_length, h.record_pointer_bits))
    return BitLayout(f), single


def _as_array(name: str, a, n: int | None = None) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ConfigError(f"{name} must be a 1-d array, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ConfigError(f"{name} has {arr.shape[0]} values, bin_index has {n}")
    return arr


class PfmFile:
    """An open PFM v7 structure; see the module docstring for the API."""

    # ------------------------------------------------------------------ opening
    def __init__(self, path, mode: str = "r"):
        if mode not in ("r", "r+"):
            raise ConfigError(f"mode must be 'r' or 'r+', not {mode!r}")
        self.mode = mode
        self.path = os.fspath(path)
        self._closed = True
        self._fds: dict[str, int] = {}
        self._writer_obj: _BackgroundWriter | None = None
        self._pool_obj = None
        #: threads that pack new records (1: all on the calling thread); set before the first add
        self.pack_threads = PACK_THREADS
        # bit per bin: 1 = record known to be all zero (set for a file created by this object)
        self._zero_bins: np.ndarray | None = None
        self._touch_lock = threading.Lock()
        #: crash safety (pfm_dask.journal.UndoLog) or None: add_sorted hands it the records its
        #: in-place writes replace (save_records) and calls commit() before issuing them
        self.undo = None
        #: seconds spent per phase of add_sorted (for benchmarks and profiling)
        self.timings: dict[str, float] = defaultdict(float)
        try:
            with open(self.path, "rb") as fh:
                first = fh.readline(4096)
        except OSError as exc:
            raise PfmFormatError(f"cannot open PFM handle file: {exc.strerror}", path=self.path) from exc
        if b"PFM Handle File" not in first:
            raise PfmFormatError("not a PFM handle file (first line lacks 'PFM Handle File')",
                                 path=self.path, offset=0)
        base = os.path.basename(self.path)
        self.data_dir = self.path + ".data"
        stem = os.path.join(self.data_dir, base)
        self.ctl_path = stem + ".ctl"
        self.lin_path = stem + ".lin"
        self.bin_path = stem + ".bin"
        self.ndx_path = stem + ".ndx"
        self.cvg_path = stem + ".cvg"

        # .ctl first line: the version that selects the layout
        try:
            with open(self.ctl_path, "rb") as fh:
                vline = fh.readline(4096).decode("latin-1")
        except OSError as exc:
            raise PfmFormatError(f"cannot open the control file: {exc.strerror}",
                                 path=self.ctl_path) from exc
        if "Software - PFM I/O library V" not in vline:
            raise PfmFormatError("version string missing from the control file (corrupted?)",
                                 path=self.ctl_path, offset=0)
        self.version = version_number(vline)
        if self.version > 70:
            raise PfmFormatError(f"PFM version {self.version / 10:.1f} is newer than the V7.00 "
                                 "layout this reader knows", path=self.ctl_path, offset=0)
        if self.version < 60:
            raise PfmFormatError(f"PFM version {self.version / 10:.1f} is not supported "
                                 "(versions before 6.0 are refused, as by PFM library V7.00)",
                                 path=self.ctl_path, offset=0)
        if self.version < 70 and mode != "r":
            raise PfmFormatError(f"PFM version {self.version / 10:.1f} (pre-v7: coverage map inside "
                                 ".bin, no num_valid) can only be opened read-only",
                                 path=self.ctl_path)

        flags = os.O_RDWR if mode == "r+" else os.O_RDONLY
        try:
            self._fds["bin"] = os.open(self.bin_path, flags)
            self._fds["ndx"] = os.open(self.ndx_path, flags)
            if self.version >= 70:
                self._fds["cvg"] = os.open(self.cvg_path, flags)
        except OSError as exc:
            self._close_fds()
            raise PfmFormatError(f"cannot open {exc.filename}: {exc.strerror}",
                                 path=exc.filename) from exc
        self._closed = False
        try:
            self._load_header()
        except BaseException:
            self._close_fds()
            self._closed = True
            raise

    def _load_header(self) -> None:
        raw = os.pread(self._fds["bin"], BIN_HEADER_SIZE, 0)
        if not raw or b"=" not in raw[:4096]:
            raise PfmFormatError("bin file has no header", path=self.bin_path, offset=0)
        h = PfmHeader.parse(raw, path=self.bin_path)
        if "Software - PFM I/O library" not in h.version:
            raise PfmFormatError("bin file header corrupt ([VERSION] missing)", path=self.bin_path, offset=0)
        self._set_header(h)

    def _set_header(self, h: PfmHeader) -> None:
        p = self.bin_path
        checks = [
            ("[RECORD LENGTH]", h.record_length, 1, 255),
            ("[COUNT BITS]", h.count_bits, 1, 32),
            ("[STD BITS]", h.std_bits, 1, 32),
            ("[DEPTH BITS]", h.depth_bits, 1, 32),
            ("[RECORD POINTER BITS]", h.record_pointer_bits, 33, 64),
            ("[FILE NUMBER BITS]", h.file_number_bits, 1, 32),
            ("[LINE NUMBER BITS]", h.line_number_bits, 1, 32),
            ("[PING NUMBER BITS]", h.ping_number_bits, 1, 32),
            ("[BEAM NUMBER BITS]", h.beam_number_bits, 1, 32),
            ("[OFFSET BITS]", h.offset_bits, 1, 32),
            ("[VALIDITY BITS]", h.validity_bits, 1, 32),
            ("[HORIZONTAL ERROR BITS]", h.horizontal_error_bits, 0, 32),
            ("[VERTICAL ERROR BITS]", h.vertical_error_bits, 0, 32),
            ("[BIN WIDTH]", h.bin_width, 1, 2**31 - 1),
            ("[BIN HEIGHT]", h.bin_height, 1, 2**31 - 1),
        ]
        for key, v, lo, hi in checks:
            if not lo <= int(v) <= hi:
                raise PfmFormatError(f"header {key} = {v} is outside {lo}..{hi}", path=p)
        for i in range(NUM_ATTR):
            for key, arr in (("BIN", h.bin_attribute_bits), ("NDX", h.ndx_attribute_bits)):
                if not 0 <= int(arr[i]) <= 32:
                    raise PfmFormatError(f"header [{key} ATTRIBUTE BITS {i}] = {arr[i]} is outside 0..32",
                                         path=p)
        if h.depth_scale <= 0:
            raise PfmFormatError(f"header [DEPTH SCALE] = {h.depth_scale} must be positive", path=p)
        self.header = h
        self.width = int(h.bin_width)
        self.height = int(h.bin_height)
        self.record_length = int(h.record_length)
        self.null_depth = float(h.null_depth)
        self.bin_header_size = int(h.bin_header_size)
        self._bin_layout = _bin_layout(h, self.version >= 70)
        self._ndx_layout, self._single_bits = _ndx_layout(h)
        self.bin_record_size = self._bin_layout.record_bytes
        self.ndx_record_size = self._ndx_layout.record_bytes
        self._n_bin_attr = int(h.num_bin_attributes)
        self._n_ndx_attr = int(h.num_ndx_attributes)
        need = self.bin_header_size + self.width * self.height * self.bin_record_size
        size = os.fstat(self._fds["bin"]).st_size
        if size < need:
            raise PfmFormatError(f"bin file is {size:,} bytes; the header's {self.width} x {self.height} "
                                 f"grid of {self.bin_record_size}-byte records needs {need:,} (truncated?)",
                                 path=p, offset=size)
        self.ndx_size = os.fstat(self._fds["ndx"]).st_size
        if self.mode == "r+" and self.ndx_size % self.ndx_record_size:
            raise PfmFormatError(f".ndx size {self.ndx_size:,} is not a multiple of the "
                                 f"{self.ndx_record_size}-byte record (torn append?); refusing to append",
                                 path=self.ndx_path, offset=self.ndx_size)
        if self.version >= 70:
            csize = os.fstat(self._fds["cvg"]).st_size
            if csize < COV_HEADER_SIZE + self.width * self.height:
                raise PfmFormatError(f"coverage file is {csize:,} bytes, needs "
                                     f"{COV_HEADER_SIZE + self.width * self.height:,}",
                                     path=self.cvg_path, offset=csize)
        self._grid = None
        # limits the library checks on add (read_bin_header: 2**bits - 1)
        self.max_file_number = (1 << h.file_number_bits) - 1
        self.max_line_number = (1 << h.line_number_bits) - 1
        self.max_ping_number = (1 << h.ping_number_bits) - 1
        self.max_beam_number = (1 << h.beam_number_bits) - 1

    @property
    def grid(self):
        """The :class:`pfm_dask.bins.BinGrid` of this file (built from the header on first use)."""
        if self._grid is None:
            from ..bins import BinGrid

            h = self.header
            if h.projection:
                raise PfmFormatError(f"projected PFM ([PROJECTION] = {h.projection}) has no geographic "
                                     "bin grid", path=self.bin_path)
            try:
                self._grid = BinGrid.from_header_values(
                    min_x=h.min_x, min_y=h.min_y, max_x=h.max_x, max_y=h.max_y,
                    x_bin=h.x_bin_size, y_bin=h.y_bin_size, width=h.bin_width,
                    height=h.bin_height, polygon=h.points, offset_bits=h.offset_bits,
                    bin_size_xy=h.bin_size_xy)
            except ConfigError as exc:
                raise PfmFormatError(f"header grid is inconsistent: {exc.reason}",
                                     path=self.bin_path) from exc
        return self._grid

    # ------------------------------------------------------------------ creating
    @classmethod
    def create(cls, path, grid, *, min_depth: float = -10000.0, max_depth: float = 12000.0,
               precision: float = 0.01, max_files: int = 0, max_lines: int = 0,
               max_pings: int = 0, max_beams: int = 0, max_bin_soundings: int = 0,
               record_length: int = PFM_RECORD_LENGTH,
               horizontal_error_max: float | None = None,
               vertical_error_max: float | None = None,
               horizontal_error_scale: float = 100.0, vertical_error_scale: float = 100.0,
               bin_size_m: float | None = None, max_record_pointer: int = 0,
               classification: str = "UNCLASSIFIED", creation_software: str | None = None,
               wkt: str = WGS84_WKT, mosaic_path: str = "NONE", feature_path: str = "NONE",
               dynamic_reload: int = 1, user_flag_names: Sequence[str] | None = None) -> "PfmFile":
        """Create a new PFM v7 structure from a bin grid; returns it opened ``"r+"``."""
        path = os.fspath(path)
        h = cls.new_header(grid, min_depth=min_depth, max_depth=max_depth, precision=precision,
                           max_files=max_files, max_lines=max_lines, max_pings=max_pings,
                           max_beams=max_beams, max_bin_soundings=max_bin_soundings,
                           record_length=record_length, horizontal_error_max=horizontal_error_max,
                           vertical_error_max=vertical_error_max,
                           horizontal_error_scale=horizontal_error_scale,
                           vertical_error_scale=vertical_error_scale, bin_size_m=bin_size_m,
                           max_record_pointer=max_record_pointer, classification=classification,
                           creation_software=creation_software, wkt=wkt,
                           dynamic_reload=dynamic_reload, user_flag_names=user_flag_names)
        data_dir = path + ".data"
        if os.path.exists(path) or os.path.exists(data_dir):
            raise PfmFormatError("refusing to create a PFM over an existing one "
                                 "(the handle file or data directory exists)", path=path)
        base = os.path.basename(path)
        stem_rel = f"{path}.data{os.sep}{base}"
        os.mkdir(data_dir)
        with open(path, "w", **TEXT_CODING, newline="\n") as fh:
            fh.write(f"PFM Handle File - {LIBRARY_VERSION}\n")
            fh.write("#\n" + "#" * 80 + "\n#\n")
            fh.write("# This is a PFM handle file.  If you were expecting to see the PFM list file\n")
            fh.write(f"# you need to look for a directory called:\n#\n#\t{data_dir}\n#\n")
            fh.write(f"# In that directory should be a file called:\n#\n#\t{stem_rel}.ctl\n#\n")
            fh.write("# That is the PFM list (or control) file.\n")
            fh.write("#\n" + "#" * 80 + "\n#\n")
        stem = os.path.join(data_dir, base)
        with open(stem + ".ctl", "w", **TEXT_CODING, newline="\n") as fh:
            fh.write(f"{LIBRARY_VERSION}\n{stem_rel}.bin\n{stem_rel}.ndx\n{mosaic_path}\n{feature_path}\n")
        open(stem + ".lin", "w").close()
        layout = _bin_layout(h, True)
        fd = os.open(stem + ".bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            os.write(fd, h.to_bytes())
            # zero bin records (sparse): the library writes zero rows, the bytes are the same
            os.ftruncate(fd, h.bin_header_size + h.bin_width * h.bin_height * layout.record_bytes)
        finally:
            os.close(fd)
        os.close(os.open(stem + ".ndx", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        create_coverage_file(stem + ".cvg", h.bin_width, h.bin_height, LIBRARY_VERSION)
        f = cls(path, "r+")
        f._grid = grid
        f._zero_bins = np.full((h.bin_width * h.bin_height + 7) // 8, 0xFF, dtype=np.uint8)
        return f

    @staticmethod
    def new_header(grid, *, min_depth=-10000.0, max_depth=12000.0, precision=0.01, max_files=0,
                   max_lines=0, max_pings=0, max_beams=0, max_bin_soundings=0,
                   record_length=PFM_RECORD_LENGTH, horizontal_error_max=None,
                   vertical_error_max=None, horizontal_error_scale=100.0,
                   vertical_error_scale=100.0, bin_size_m=None, max_record_pointer=0,
                   classification="UNCLASSIFIED", creation_software=None, wkt=WGS84_WKT,
                   dynamic_reload=1, user_flag_names=None) -> PfmHeader:
        """The header ``open_pfm_file`` + pfmLoader would write for a new PFM (no I/O)."""
        if not precision > 0:
            raise ConfigError(f"precision must be positive, got {precision}")
        if not max_depth > min_depth:
            raise ConfigError(f"max_depth ({max_depth}) must be greater than min_depth ({min_depth})")
        if not 1 <= int(record_length) <= 255:
            raise ConfigError(f"record_length must be 1..255, got {record_length}")
        for name, v in (("max_files", max_files), ("max_lines", max_lines), ("max_pings", max_pings),
                        ("max_beams", max_beams), ("max_bin_soundings", max_bin_soundings)):
            if v is not None and (int(v) < 0 or int(v) > 2**32 - 1):
                raise ConfigError(f"{name} must be 0 (library default) .. 2**32-1, got {v}")
        md = np.float32(max_depth)                       # PFM_OPEN_ARGS.max_depth is float
        off = np.float32(-float(min_depth))              # open_args.offset = -min_depth
        scale = np.float32(1.0 / float(precision))       # open_args.scale = 1 / precision
        # temp = max_depth + offset + 1.0 (float + float, then + double, stored in float)
        temp = np.float32(float(np.float32(md + off)) + 1.0)
        depth_bits = bits_for(float(np.float32(temp * scale)))
        null_depth = _f32(float(md) + 1.0)

        if vertical_error_max is None:
            vertical_error_max = 15.0 if float(md) < 150.0 else float(md) * 0.10
        if horizontal_error_max is None:
            if bin_size_m:
                horizontal_error_max = float(bin_size_m) * 10.0
            else:
                from ..geodesy import inverse

                d, _, _ = inverse(grid.min_y, grid.min_x, grid.min_y + grid.y_bin, grid.min_x)
                horizontal_error_max = float(d) * 10.0

        def err_bits(mx, sc):
            if not sc > 0.00001:
                return 0
            t = np.float32(np.float32(mx) + 1.0)
            return bits_for(float(np.float32(t * np.float32(sc))))

        h = PfmHeader()
        h.version = LIBRARY_VERSION
        h.record_length = int(record_length)
        h.date = PfmHeader.now()
        h.classification = classification
        h.creation_software = creation_software or f"PFM Software - pfm-dask V{_PKG_VERSION}"
        h.min_y, h.min_x, h.max_y, h.max_x = (float(grid.min_y), float(grid.min_x),
                                              float(grid.max_y), float(grid.max_x))
        h.bin_size_xy = float(grid.bin_size_xy)
        h.x_bin_size, h.y_bin_size = float(grid.x_bin), float(grid.y_bin)
        h.bin_width, h.bin_height = int(grid.width), int(grid.height)
        # pfmLoader's initial extrema (replaced by write_header at the end of a load)
        h.min_filtered_depth = h.min_depth = 9999999.0
        h.max_filtered_depth = h.max_depth = -9999999.0
        h.min_bin_count, h.max_bin_count = 9999999, 0
        h.min_standard_deviation, h.max_standard_deviation = 9999999.0, -9999999.0
        h.bin_header_size = BIN_HEADER_SIZE
        h.count_bits = bits_for(max_bin_soundings) if max_bin_soundings else PFM_COUNT_BITS
        h.std_bits = PFM_STD_BITS
        h.std_scale = PFM_STD_SCALE
        h.depth_bits = depth_bits
        h.depth_scale = float(scale)
        h.depth_offset = float(off)
        h.record_pointer_bits = (bits_for(max_record_pointer) if max_record_pointer
                                 else PFM_RECORD_POINTER_BITS)
        h.file_number_bits = bits_for(max_files) if max_files else PFM_FILE_BITS
        h.line_number_bits = bits_for(max_lines) if max_lines else PFM_LINE_BITS
        h.ping_number_bits = bits_for(max_pings) if max_pings else PFM_PING_BITS
        h.beam_number_bits = bits_for(max_beams) if max_beams else PFM_BEAM_BITS
        h.offset_bits = int(getattr(grid, "offset_bits", PFM_OFFSET_BITS) or PFM_OFFSET_BITS)
        h.validity_bits = PFM_VALIDITY_BITS
        h.points = [(float(a), float(b)) for a, b in np.asarray(grid.polygon, dtype=np.float64)]
        h.well_known_text = wkt
        h.dynamic_reload = int(dynamic_reload)
        if user_flag_names is not None:
            names = list(user_flag_names)[:10]
            h.user_flag_names = names + h.user_flag_names[len(names):]
        h.coverage_map_address = 0
        h.horizontal_error_scale = _f32(horizontal_error_scale)
        h.max_horizontal_error = _f32(horizontal_error_max)
        h.horizontal_error_bits = err_bits(horizontal_error_max, horizontal_error_scale)
        h.vertical_error_scale = _f32(vertical_error_scale)
        h.max_vertical_error = _f32(vertical_error_max)
        h.vertical_error_bits = err_bits(vertical_error_max, vertical_error_scale)
        h.null_depth = null_depth
        if h.record_pointer_bits < 33:
            raise ConfigError("max_record_pointer gives fewer than 33 pointer bits; the library's "
                              "64-bit pointer packing needs at least 33")
        return h

    # ------------------------------------------------------------------ basics
    @property
    def _writer(self) -> _BackgroundWriter:
        if self._writer_obj is None:
            self._writer_obj = _BackgroundWriter()
        return self._writer_obj

    @property
    def _pool(self):
        if self.pack_threads <= 1:
            return None
        if self._pool_obj is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool_obj = ThreadPoolExecutor(max_workers=self.pack_threads,
                                                thread_name_prefix="pfm-pack")
        return self._pool_obj

    def _all_zero(self, bins: np.ndarray) -> bool:
        """True if every bin record in ``bins`` is known to be still all zero (no read needed)."""
        z = self._zero_bins
        if z is None:
            return False
        return bits_all_set(z, bins)

    def _touch(self, bins: np.ndarray) -> None:
        """Forget that these bin records are zero (under a lock: the recompute's band threads
        write disjoint bins, but eight bins share a byte of the map)."""
        z = self._zero_bins
        if z is not None and bins.size:
            with self._touch_lock:
                clear_bits(z, bins)

    def _sync(self) -> None:
        """Wait for queued writes (before reading back or rewriting in place)."""
        if self._writer_obj is not None:
            self._writer_obj.drain()

    def _fd(self, name: str) -> int:
        if self._closed:
            raise PfmFormatError("PFM is closed", path=self.path)
        return self._fds[name]

    def _writable(self) -> None:
        if self.mode != "r+":
            raise PfmFormatError("PFM is open read-only (open with mode 'r+' to change it)", path=self.path)
        self._fd("bin")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._writer_obj is not None:
                self._writer_obj.close()
            if self._pool_obj is not None:
                self._pool_obj.shutdown(wait=False)
            self._close_fds()
        except Exception:  # noqa: BLE001
            pass

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}

    def flush(self) -> None:
        """Finish queued writes, so that every change is in the files (not fsynced)."""
        self._fd("bin")
        self._sync()

    def close(self, durable: bool = False) -> None:
        """Close the parts; with ``durable=True`` fsync them (and the text files) first."""
        if self._closed:
            return
        if self._pool_obj is not None:
            self._pool_obj.shutdown()
            self._pool_obj = None
        if self._writer_obj is not None:
            w, self._writer_obj = self._writer_obj, None
            try:
                w.close()
            except BaseException:
                self._close_fds()
                self._closed = True
                raise
        if durable and self.mode == "r+":
            for fd in self._fds.values():
                os.fsync(fd)
            for p in (self.ctl_path, self.lin_path, self.path):
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self._close_fds()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ .ctl / .lin
    def files(self) -> list[PfmInputFile]:
        """The input files of the ``.ctl`` in order; sequence numbers are checked."""
        with open(self.ctl_path, "rb") as fh:
            raw = decode_names(fh.read())
        lines = raw.split("\n")
        out = []
        offset = sum(len(x) + 1 for x in lines[:5])
        for ln in lines[5:]:
            s = ln.rstrip("\r")
            if not s:
                offset += len(ln) + 1
                continue
            parts = s.split(None, 3)
            if len(parts) < 4 or s[1] != " ":
                raise PfmFormatError(f"bad file list line {s!r}", path=self.ctl_path, offset=offset)
            flag, seq, typ, p = parts
            try:
                seq_i, typ_i = int(seq), int(typ)
            except ValueError as exc:
                raise PfmFormatError(f"bad file list line {s!r}", path=self.ctl_path, offset=offset) from exc
            if seq_i != len(out):
                raise PfmFormatError(f"file sequence number {seq_i} on line {len(out) + 6} should be "
                                     f"{len(out)}: the list file has been corrupted",
                                     path=self.ctl_path, offset=offset)
            out.append(PfmInputFile(seq_i, p, typ_i, flag == "-"))
            offset += len(ln) + 1
        return out

    def add_files(self, paths: Iterable[str], data_type: int = PFM_GSF_DATA) -> list[int]:
        """Append input files to the ``.ctl``; returns their file numbers."""
        self._writable()
        paths = [os.fspath(p) for p in paths]
        n0 = len(self.files())
        nums = list(range(n0, n0 + len(paths)))
        if nums and nums[-1] > self.max_file_number:
            raise PfmFormatError(f"file number {nums[-1]} exceeds the {self.header.file_number_bits}-bit "
                                 f"limit {self.max_file_number} ([FILE NUMBER BITS])", path=self.ctl_path)
        for p in paths:
            if "\n" in p:
                raise ConfigError(f"file name contains a newline: {p!r}")
        with open(self.ctl_path, "ab") as fh:
            fh.write(encode_names("".join("+ %05d %02d %s\n" % (n, int(data_type), p)
                                          for n, p in zip(nums, paths))))
        return nums

    def lines(self) -> list[str]:
        """The line names of the ``.lin`` in order."""
        with open(self.lin_path, "rb") as fh:
            raw = decode_names(fh.read())
        out = raw.split("\n")
        if out and out[-1] == "":
            out.pop()
        return [x.rstrip("\r") for x in out]

    def add_lines(self, names: Iterable[str]) -> list[int]:
        """Append line names to the ``.lin``; returns their line numbers."""
        self._writable()
        names = [str(x) for x in names]
        n0 = len(self.lines())
        nums = list(range(n0, n0 + len(names)))
        if nums and nums[-1] > self.max_line_number:
            raise PfmFormatError(f"line number {nums[-1]} exceeds the {self.header.line_number_bits}-bit "
                                 f"limit {self.max_line_number} ([LINE NUMBER BITS])", path=self.lin_path)
        for x in names:
            if "\n" in x:
                raise ConfigError(f"line name contains a newline: {x!r}")
        with open(self.lin_path, "ab") as fh:
            fh.write(encode_names("".join(x + "\n" for x in names)))
        return nums

    # ------------------------------------------------------------------ coding
    def _depth_codes(self, depth: np.ndarray) -> np.ndarray:
        """Sounding depth codes, ``NINT((z + offset) * scale)`` in double."""
        return scaled_code_f64(depth, self.header.depth_offset, self.header.depth_scale)

    def _depth_decode(self, code: np.ndarray) -> np.ndarray:
        h = self.header
        return (code.astype(np.float64) / np.float64(np.float32(h.depth_scale))
                - np.float64(np.float32(h.depth_offset)))

    def _bin_depth_decode(self, code: np.ndarray) -> np.ndarray:
        """Bin depths as ``unpack_bin_record``: ``(float)code / scale - offset`` in float."""
        h = self.header
        v = code.astype(np.float32) / np.float32(h.depth_scale) - np.float32(h.depth_offset)
        return v.astype(np.float64)

    def _error_codes(self, err, bits: int, scale: float, name: str) -> np.ndarray:
        """``NINT(float(err) * float(scale))`` (float product); NaN, negative or too large -> null (2**bits - 1)."""
        null = (1 << bits) - 1
        e32 = np.asarray(err).astype(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            bad = ~(e32 >= 0)                       # NaN or negative
            e32 *= np.float32(scale)                # float * float, as the library
            np.minimum(e32, np.float32(null + 1), out=e32)
            e32[bad] = np.float32(null)
        t = e32.astype(np.float64)
        t += 0.5                                    # NINT widens to double, then adds 0.5
        np.trunc(t, out=t)
        code = t.astype(np.uint64)
        np.minimum(code, np.uint64(null), out=code)
        return code

    def _error_decode(self, code: np.ndarray, bits: int, scale: float) -> np.ndarray:
        if bits == 0:
            return np.zeros(code.shape, dtype=np.float32)
        null = (1 << bits) - 1
        v = code.astype(np.float32) / np.float32(scale)
        return np.where((code == null) | (v >= np.float32(null)), np.float32(-999.0), v).astype(np.float32)

    def _check_range(self, name: str, arr: np.ndarray, limit: int, key: str) -> None:
        """Raise naming ``name`` and the header ``key`` if any value is outside 0..limit (one pass)."""
        arr = np.asarray(arr)
        if arr.size == 0:
            return
        if np.issubdtype(arr.dtype, np.signedinteger):
            # negative values become huge unsigned ones: a single max() finds both kinds
            hi = int(np.max(arr.view(arr.dtype.str.replace("i", "u"))))
            ok = hi <= limit
        elif np.issubdtype(arr.dtype, np.unsignedinteger):
            ok = int(arr.max()) <= limit
        else:
            ok = arr.min() >= 0 and arr.max() <= limit
        if not ok:
            bad = int(np.flatnonzero((arr < 0) | (arr > limit))[0])
            raise PfmFormatError(f"{name} {arr[bad]} (sounding {bad}) is outside 0..{limit} "
                                 f"({key} = {limit.bit_length()} bits)", path=self.path)

    # ------------------------------------------------------------------ appending
    def add_sorted(self, bin_index, file, line, ping, beam, depth, x_off, y_off, validity,
                   horizontal_error, vertical_error, *, attributes: Sequence | None = None) -> None:
        """Append soundings already sorted by ``bin_index`` (``row * width + col``).

        For each bin: free slots of its existing tail record are filled first
        (batched read-modify-write of the tail records); the rest go into new
        physical records written contiguously at the end of ``.ndx``, chained
        by continuation pointers (0 ends a chain) and linked from the old tail.
        Bin records get the new count, head/tail and ``validity |=`` the
        soundings' flags (CHECKED cleared, as the library's cached loader
        does); statistics are left to the recompute. Out-of-grid bins, file,
        line, ping, beam, offset or validity values above the header limits,
        and depths outside ``min_depth .. NULL DEPTH`` raise
        :class:`PfmFormatError`. Errors above their bit range, negative or
        NaN are stored as null. ``attributes``: one array per NDX attribute
        of the header (coded ``NINT((v - min) * scale)``), else zeros.

        All or nothing: everything is prepared first (new records packed past
        the end of the ``.ndx``, where nothing refers to them; old tail and bin
        records changed in memory), the values being checked by the packing
        kernels as they code them; only then are the changes written. A value
        out of range raises before anything is written, and the ``.ndx`` is
        cut back to where it was.
        """
        self._writable()
        t_start = time.perf_counter()
        b = _as_array("bin_index", bin_index).astype(np.int64, copy=False)
        n = b.shape[0]
        if n == 0:
            return
        h = self.header
        cols = {
            "file": _as_array("file", file, n), "line": _as_array("line", line, n),
            "ping": _as_array("ping", ping, n), "beam": _as_array("beam", beam, n),
            "x_off": _as_array("x_off", x_off, n), "y_off": _as_array("y_off", y_off, n),
            "validity": _as_array("validity", validity, n),
        }
        depth = _as_array("depth", depth, n)
        herr = _as_array("horizontal_error", horizontal_error, n)
        verr = _as_array("vertical_error", vertical_error, n)
        nbins = self.width * self.height
        # where each bin's soundings start, the bin, and the OR of its soundings' validity
        # (of whole-number floats too: validity is checked to be integers below, before use)
        v_ = cols["validity"]
        runs = bin_runs(b, nbins, values=True,
                        or_of=v_ if np.issubdtype(v_.dtype, np.integer) else v_.astype(np.int64))
        starts, ub, vor = runs if runs is not None else (None, None, None)
        if starts is None and (b.min() < 0 or b.max() >= nbins):
            bad = int(np.flatnonzero((b < 0) | (b >= nbins))[0])
            raise PfmFormatError(f"bin_index {b[bad]} (sounding {bad}) is outside the "
                                 f"{self.width} x {self.height} grid (0..{nbins - 1})", path=self.path)
        if starts is None:
            bad = int(np.flatnonzero(b[1:] < b[:-1])[0]) + 1
            raise PfmFormatError(f"soundings are not sorted by bin_index (sounding {bad})", path=self.path)
        # integer fields: whole-number floats are taken as integers. The kernels check a field as
        # they code it when a value out of range shows in bits above its width (unsigned types,
        # or signed ones wider than the field); the others are checked here, in field order.
        NL = self._ndx_layout
        for i, (k, arr) in enumerate(list(cols.items())):
            if not np.issubdtype(arr.dtype, np.integer):
                if np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
                    cols[k] = arr = arr.astype(np.int64)
                else:
                    for k_before in list(cols)[:i]:        # an earlier field's error comes first
                        self._check_field(k_before, cols[k_before])
                    raise PfmFormatError(f"{k} must be integers (got {arr.dtype})", path=self.path)
            nb = NL.fields[(k, 0)].nbits
            if not (nb and (arr.dtype.kind == "u" or 8 * arr.dtype.itemsize > nb)):
                self._check_field(k, arr)
        attrs = {}
        for i in range(NUM_ATTR):
            nb = int(h.ndx_attribute_bits[i])
            if nb and attributes is not None and i < len(attributes) and attributes[i] is not None:
                a_ = _as_array(f"attributes[{i}]", attributes[i], n).astype(np.float64)
                c = nint((a_ - np.float64(np.float32(h.min_ndx_attribute[i])))
                         * np.float64(np.float32(h.ndx_attribute_scale[i])))
                self._check_range(f"attribute {i}", c, (1 << nb) - 1, f"[NDX ATTRIBUTE BITS {i}]")
                attrs[("attr", i)] = c.astype(np.uint64)
            elif nb:
                attrs[("attr", i)] = np.zeros(n, np.uint64)
        self.timings["add_validate"] += time.perf_counter() - t_start
        self.timings["add_soundings"] += n

        # integer fields as they come (the kernels read any integer type), floats as values
        codes = dict(cols, depth=depth, horizontal_error=herr, vertical_error=verr, **attrs)
        check = np.zeros(CHECK_SIZE, dtype=np.uint64)
        base = self.ndx_size
        try:
            step = self._prepare(ub, n, codes, starts, vor, check)
            bad = check_failures(check, step["item_fields"])
            if bad:      # the message names the first bad sounding, found again with numpy
                k = bad[0]
                if k == "depth":
                    self._check_depths(depth)
                else:
                    self._check_field(k, cols[k])
                raise PfmFormatError(f"{k} out of range (found while packing)", path=self.path)
        except BaseException:
            # nothing points to the records packed past the old end: cut them off again
            os.ftruncate(self._fds["ndx"], base)
            raise
        self._commit(step)

    def _check_field(self, key: str, arr: np.ndarray) -> None:
        """Raise naming the first value of integer field ``key`` outside its header limit."""
        limits = {"file": (self.max_file_number, "[FILE NUMBER BITS]"),
                  "line": (self.max_line_number, "[LINE NUMBER BITS]"),
                  "ping": (self.max_ping_number, "[PING NUMBER BITS]"),
                  "beam": (self.max_beam_number, "[BEAM NUMBER BITS]"),
                  "x_off": ((1 << self.header.offset_bits) - 1, "[OFFSET BITS]"),
                  "y_off": ((1 << self.header.offset_bits) - 1, "[OFFSET BITS]"),
                  "validity": ((1 << self.header.validity_bits) - 1, "[VALIDITY BITS]")}
        lim, key_name = limits[key]
        self._check_range(key, arr, lim, key_name)

    def _check_depths(self, depth: np.ndarray) -> None:
        """Raise naming the first depth whose code is outside ``0 ..`` the NULL DEPTH's code."""
        h = self.header
        null_code = int(scaled_code_f64(self.null_depth, h.depth_offset, h.depth_scale))
        dmax = min(null_code, (1 << h.depth_bits) - 1)
        d = np.asarray(depth, dtype=np.float64)
        c = scaled_code_f64(d, h.depth_offset, h.depth_scale)
        bad = np.flatnonzero(~np.isfinite(d) | (c < 0) | (c > dmax))
        if bad.size:
            j = int(bad[0])
            raise PfmFormatError(
                f"depth {d[j]} (sounding {j}) is outside {-h.depth_offset:g} .. "
                f"{self.null_depth:g} (DEPTH OFFSET / NULL DEPTH, {h.depth_bits} depth bits)",
                path=self.path)

    def _prepare(self, ub: np.ndarray, n: int, codes: dict, start: np.ndarray, vor: np.ndarray,
                 check: np.ndarray) -> dict:
        """Everything of :meth:`add_sorted` but the writes to existing data: the new records packed
        past the end of the ``.ndx`` (values checked into ``check``), the old tail and bin records
        read (their pre-images given to the undo log) and changed in memory. The ``n`` soundings
        go to bins ``ub``, bin ``ub[j]``'s from ``start[j]`` on, the OR of their validity ``vor[j]``."""
        h = self.header
        L = self.record_length
        rsize = self.ndx_record_size
        bsize = self.bin_record_size
        BL, NL = self._bin_layout, self._ndx_layout
        tm = self.timings
        t = time.perf_counter()
        nb = ub.size
        writer = self._writer
        coding = SoundingCoding.from_header(h)

        # 1. the touched bin records (wait only if a queued write covers them)
        boff = self.bin_header_size + ub * bsize
        def zero_spans(zero: bool = True) -> _Spans:
            # records never written since creation: no need to read them back
            # no gap bytes: they belong to other bins whose bytes we have not read
            return _Spans(self._fds["bin"], boff, bsize, max_gap=0, path=self.bin_path,
                          what="bin record", read=False, zero=zero)

        fresh = self._all_zero(ub)
        if fresh:
            # made with the new bin records (step 4, on a pack thread) unless the undo log needs them
            bspans = zero_spans() if self.undo is not None else None
            z = np.zeros(nb, dtype=np.uint64)
            cur = {"num_soundings": z, "validity": z, "head": z, "tail": z}
        else:
            writer.wait_for(self._fds["bin"], int(boff[0]), int(boff[-1]) + bsize)
            bspans = _Spans(self._fds["bin"], boff, bsize, max_gap=_RMW_GAP, path=self.bin_path,
                            what="bin record")
            cur = bspans.unpack(BL, ["num_soundings", "validity", "head", "tail"])
        if self.undo is not None:
            self.undo.save_records("bin", boff, bsize, bspans.records())
        self._touch(ub)
        # where every bin's soundings go: old tail slots, new records (one compiled pass)
        base = self.ndx_size
        plan = chain_plan(start, n, cur["num_soundings"], L, base, rsize)
        cmax = (1 << h.count_bits) - 1
        if plan["max_total"] > cmax:
            total = plan["total"]
            j = int(np.argmax(total > cmax))
            raise PfmFormatError(f"bin {int(ub[j])} would hold {int(total[j])} soundings, more than the "
                                 f"{cmax} of [COUNT BITS] = {h.count_bits}", path=self.path)
        fill, used, rem, m, cum_m = (plan[k] for k in ("fill", "used", "rem", "m", "cum_m"))
        first_new, last_new, total, M = plan["first_new"], plan["last_new"], plan["total"], plan["M"]
        item_fields = {k_: (NL.fields[(k_, 0)].offset, NL.fields[(k_, 0)].nbits) for k_ in codes}
        tm["add_bins_read"] += time.perf_counter() - t

        # 4. (first, on a pack thread while the soundings pack: it needs nothing of steps 2
        # and 3) the new bin records, in memory
        made = [bspans]

        def bin_records() -> float:
            t_ = time.perf_counter()
            val_mask = np.uint64(((1 << h.validity_bits) - 1) & ~V.CHECKED)
            if fresh:
                # records still all zero, each bin's first soundings (so its first new record
                # is its head, its last its tail): written whole, nothing to keep or merge
                if made[0] is None:
                    made[0] = zero_spans(zero=False)
                made[0].pack_new(BL, {"num_soundings": total, "validity": vor & val_mask,
                                      "head": first_new, "tail": last_new})
                return time.perf_counter() - t_
            new_val = (cur["validity"] | vor) & val_mask
            c0 = cur["num_soundings"]
            new_head = np.where(c0 == 0, first_new, cur["head"].astype(np.int64))
            new_tail = np.where(m > 0, last_new, cur["tail"].astype(np.int64))
            made[0].pack(BL, {"num_soundings": total.astype(np.uint64), "validity": new_val,
                              "head": new_head.astype(np.uint64), "tail": new_tail.astype(np.uint64)})
            return time.perf_counter() - t_

        pool = self._pool
        bins_done = pool.submit(bin_records) if pool is not None and M else None
        try:
            tspans = self._new_records_and_tails(
                n, codes, coding, item_fields, start, fill, used, rem, m, cum_m, M, cur,
                plan["n_tail"], first_new, ub, check)
        finally:
            if bins_done is not None:     # never leave a pack thread on bspans behind an error
                t = time.perf_counter()
                tm["add_bins_overlapped"] += bins_done.result()
                tm["add_bins_write"] += time.perf_counter() - t     # the wait for it only
        if bins_done is None:
            tm["add_bins_write"] += bin_records()
        return {"item_fields": item_fields, "tspans": tspans, "bspans": made[0],
                "ndx_size": base + M * rsize}

    def _new_records_and_tails(self, n, codes, coding, item_fields, start, fill, used, rem,
                               m, cum_m, M, cur, n_tail, first_new, ub, check):
        """Steps 2 and 3 of :meth:`_prepare`: the new physical records packed and written past
        the end of the ``.ndx``; the old tail records read, filled and linked in memory (their
        spans returned, or None)."""
        L = self.record_length
        rsize = self.ndx_record_size
        NL = self._ndx_layout
        tm = self.timings
        writer = self._writer
        base = self.ndx_size

        # 2. new physical records, contiguous past the end of .ndx
        t = time.perf_counter()
        if M:
            # one numba pass codes the soundings and packs the chained records (bin by bin:
            # the soundings not filling old tails, from start + fill on, in records cum_m ..).
            # The pack threads write each ~1 MiB of records themselves as soon as it is packed,
            # past the end of the .ndx (nothing reads there yet): pwrite then copies from cache.
            cf = NL.fields["continuation"]
            fd = self._fds["ndx"]
            lock = threading.Lock()

            def sink(off, data) -> None:
                # one writer at a time: the kernel serialises writes to one file on its inode
                # lock anyway, and a thread waiting there spins on a core; this one sleeps
                with lock:
                    _pwrite_all(fd, data, base + off)

            pack_soundings(item_fields, codes, coding, start + fill, rem, cum_m, M, L,
                           self._single_bits, (cf.offset, cf.nbits), base, rsize,
                           executor=self._pool, sink=sink, check=check)
            writer.start_writeback(fd, base, M * rsize)
            tm["add_pack"] += time.perf_counter() - t

        # 3. old tails: fill free slots and/or link to the new run (in memory)
        t = time.perf_counter()
        tspans = None
        if n_tail:
            c0 = cur["num_soundings"]
            t0 = cur["tail"].astype(np.int64)
            tb = np.flatnonzero((c0 > 0) & ((fill > 0) | (m > 0)))
            tb = tb[np.argsort(t0[tb], kind="stable")]
            writer.wait_for(self._fds["ndx"], int(t0[tb[0]]), int(t0[tb[-1]]) + rsize)
            tspans = _Spans(self._fds["ndx"], t0[tb], rsize, max_gap=_RMW_GAP,
                            path=self.ndx_path, what="tail record")
            trecs = tspans.records()                 # (len(tb), rsize) copy, changed in place
            if self.undo is not None:
                self.undo.save_records("ndx", t0[tb], rsize, trecs)
            flat = trecs.reshape(-1)
            row_at = np.arange(tb.size, dtype=np.int64) * rsize
            cont_old = NL.unpack_at(flat, row_at, ["continuation"])["continuation"]
            if np.any(cont_old != 0):
                j = int(np.flatnonzero(cont_old != 0)[0])
                raise PfmFormatError(f"tail record of bin {int(ub[tb[j]])} has a non-zero continuation "
                                     "pointer (chain corrupted)", path=self.ndx_path, offset=int(t0[tb[j]]))
            if fill.any():
                # the first fill[b] soundings of bin b go to the free slots of its tail record
                # (row j of trecs for tb[j]), coded, checked and packed in one kernel pass
                fill_slots(flat, rsize, L, self._single_bits, item_fields, codes, coding,
                           np.arange(tb.size, dtype=np.int64), used[tb], start[tb], fill[tb],
                           check=check)
            link = m[tb] > 0
            if link.any():
                NL.pack_at(flat, row_at[link], {"continuation": first_new[tb[link]].astype(np.uint64)})
            tspans.store(trecs)
        tm["add_tails"] += time.perf_counter() - t
        return tspans

    def _commit(self, step: dict) -> None:
        """Write what :meth:`_prepare` changed: the undo log made durable first, then the old tail
        records (now pointing to the new ones) and the bin records, on the write-behind thread."""
        t = time.perf_counter()
        if self.undo is not None:
            self.undo.commit()
        if step["tspans"] is not None:
            step["tspans"].write(self._writer)
        step["bspans"].write(self._writer)
        self.ndx_size = step["ndx_size"]
        self.timings["add_bins_write"] += time.perf_counter() - t

    # ------------------------------------------------------------------ reading bins
    def _rect(self, row0, row1, col0, col1):
        col1 = self.width if col1 is None else int(col1)
        row0, row1, col0 = int(row0), int(row1), int(col0)
        if not (0 <= row0 <= row1 <= self.height and 0 <= col0 <= col1 <= self.width):
            raise ConfigError(f"rectangle rows {row0}..{row1}, cols {col0}..{col1} is outside the "
                              f"{self.width} x {self.height} grid")
        return row0, row1, col0, col1

    def _read_bin_raw(self, row0, row1, col0, col1):
        """(bin_index, raw records) of a rectangle, read with one pread."""
        W, bs = self.width, self.bin_record_size
        nr, nc = row1 - row0, col1 - col0
        if nr == 0 or nc == 0:
            return np.zeros(0, np.int64), np.zeros((0, bs), np.uint8)
        first = row0 * W + col0
        last = (row1 - 1) * W + col1
        lo = self.bin_header_size + first * bs
        want = (last - first) * bs
        raw = os.pread(self._fd("bin"), want, lo)
        if len(raw) != want:
            raise PfmFormatError("bin file ends early", path=self.bin_path, offset=lo + len(raw))
        allrec = np.frombuffer(raw, dtype=np.uint8).reshape(last - first, bs)
        rows = np.arange(row0, row1, dtype=np.int64)
        cols = np.arange(col0, col1, dtype=np.int64)
        bidx = (rows[:, None] * W + cols[None, :]).ravel()
        if nc == W:
            return bidx, allrec
        return bidx, allrec[bidx - first]

    def read_bin_records(self, row0: int, row1: int, col0: int = 0, col1: int | None = None,
                         *, codes: bool = False, fields: Sequence[str] | None = None) -> dict:
        """Bin records of rows ``row0..row1-1``, columns ``col0..col1-1`` (one read); see module doc.

        ``fields`` limits the result to ``bin_index``, ``row``, ``col`` and the
        fields named: the others are not decoded.
        """
        self._sync()
        row0, row1, col0, col1 = self._rect(row0, row1, col0, col1)
        bidx, recs = self._read_bin_raw(row0, row1, col0, col1)
        return self._decode_bins(bidx, recs, codes=codes, fields=fields)

    def bin_records_with_data(self, first: int = 0, last: int | None = None, *,
                              fields: Sequence[str] | None = None, chunk: int = 1 << 20,
                              only: np.ndarray | None = None, ranges=None):
        """Yield the decoded records (as :meth:`read_bin_records`, ``bin_index`` increasing) of
        the bins in ``first..last-1`` (or in the ``[a, b)`` bin ``ranges``) whose record is not
        all zero (of those in the sorted ``only``, when given), at most ``chunk`` bins' bytes
        read at a time (many short runs of data are read into one buffer).

        Holes of the sparse ``.bin`` (bins never written) are not read
        (:func:`._sparse.record_runs`) and all-zero records (empty bins) not decoded, so the
        work follows the bins that hold data, not the size of the grid.
        """
        self._sync()
        n = self.width * self.height
        last = n if last is None else int(last)
        first = int(first)
        if not 0 <= first <= last <= n:
            raise ConfigError(f"bins {first}..{last} are outside the grid of {n} bins")
        bs, hs = self.bin_record_size, self.bin_header_size
        chunk = max(1, int(chunk))
        fd = self._fd("bin")
        buf = None    # one buffer for every read: fresh memory costs page faults on each
        if ranges is None:
            ranges = [(first, last)]
        runs = [record_runs(fd, hs, bs, a, b) for a, b in ranges]
        runs = np.concatenate(runs) if runs else np.zeros((0, 2), np.int64)
        for lo, hi, at in gather_runs(runs, chunk):
            n = int(hi[-1] - lo[-1] + at[-1])
            if buf is None or buf.size < n * bs:
                buf = np.empty(n * bs, dtype=np.uint8)
            mv = memoryview(buf)
            for a, b, p in zip(lo.tolist(), hi.tolist(), at.tolist()):
                got = os.preadv(fd, [mv[p * bs: (p + b - a) * bs]], hs + a * bs)
                if got != (b - a) * bs:
                    raise PfmFormatError("bin file ends early", path=self.bin_path,
                                         offset=hs + a * bs + got)
            recs = buf[: n * bs].reshape(n, bs)
            nz = nonzero_records(recs)
            bidx = positions_to_items(nz, lo, at)
            if only is not None and nz.size:
                w = np.minimum(np.searchsorted(only, bidx), only.size - 1)
                keep = only[w] == bidx
                nz, bidx = nz[keep], bidx[keep]
            if nz.size:
                yield self._decode_bins(bidx, recs[nz], fields=fields)

    def _decode_bins(self, bidx, recs, *, codes=False, fields=None) -> dict:
        h = self.header
        want = None if fields is None else set(fields)
        if codes and want is not None:
            want |= {"std", *_DEPTH_FIELDS}

        def wanted(k) -> bool:
            return want is None or k in want

        layout = self._bin_layout.fields
        keys = [k for k in layout if wanted(f"attr_{k[1]}" if isinstance(k, tuple) else k)]
        u = self._bin_layout.unpack(recs, keys)
        out = {"bin_index": bidx, "row": bidx // self.width, "col": bidx % self.width}
        if wanted("num_soundings"):
            out["num_soundings"] = u["num_soundings"].astype(np.int64)
        if wanted("num_valid"):
            out["num_valid"] = (u["num_valid"].astype(np.int64) if "num_valid" in u
                                else np.zeros(bidx.size, np.int64))
        if wanted("std"):
            out["std"] = (u["std"].astype(np.float32) / np.float32(h.std_scale)).astype(np.float64)
        for k in _DEPTH_FIELDS:
            if wanted(k):
                out[k] = self._bin_depth_decode(u[k])
        for i in range(self._n_bin_attr):
            if wanted(f"attr_{i}"):
                c = u[("attr", i)]
                out[f"attr_{i}"] = (c.astype(np.float64) / np.float64(np.float32(h.bin_attribute_scale[i]))
                                    - np.float64(np.float32(h.bin_attribute_offsets[i]))).astype(np.float32)
        for k in ("validity", "head", "tail"):
            if wanted(k):
                out[k] = u[k].astype(np.int64)
        if codes:
            for k in ("std",) + _DEPTH_FIELDS:
                out[k + "_code"] = u[k].astype(np.int64)
        return out

    # ------------------------------------------------------------------ reading soundings
    def read_soundings(self, row0: int, row1: int, col0: int = 0, col1: int | None = None,
                       *, fields: Sequence[str] | None = None) -> dict:
        """Every sounding of every bin in the rectangle (see module doc), in chain order.

        Bin rows come from one read; physical records are gathered from a
        read-only map of the ``.ndx``, chains walked vectorised over chain
        depth. ``fields`` limits the result to the keys named (e.g.
        ``("depth", "validity")``): the others are not decoded.
        Safe to call from several threads at once (no writes meanwhile).
        """
        self._sync()
        row0, row1, col0, col1 = self._rect(row0, row1, col0, col1)
        bidx, recs = self._read_bin_raw(row0, row1, col0, col1)
        u = self._bin_layout.unpack(recs, ["num_soundings", "head"])
        return self._read_chains(bidx, u["num_soundings"].astype(np.int64), u["head"].astype(np.int64),
                                 fields=fields)

    def _read_chains(self, bidx, cnt, head, *, fields: Sequence[str] | None = None) -> dict:
        """Soundings of bins ``bidx`` (count ``cnt``, first record ``head``); see read_soundings."""
        L = self.record_length
        rsize = self.ndx_record_size
        NL = self._ndx_layout
        nz = np.flatnonzero(cnt > 0)
        bidx, cnt, head = bidx[nz], cnt[nz], head[nz]
        nrec = (cnt + L - 1) // L
        R = int(nrec.sum())
        rstart = np.cumsum(nrec) - nrec
        ndx_size = os.fstat(self._fd("ndx")).st_size
        self.ndx_size = ndx_size
        ndx = _NdxMap(self._fds["ndx"], rsize, ndx_size, path=self.ndx_path)
        try:
            word = self._continuation_word()
            recaddr = None
            if word is not None:
                recaddr = chain_records(ndx.buf, rsize, *word, self._ndx_layout.fields["continuation"].nbits,
                                        nrec, head)
            if recaddr is None:   # something out of place (or a pointer over 9 bytes): step by step
                recaddr = self._walk_chains(ndx, bidx, cnt, nrec, rstart, head)
            # where each sounding is: a chain's records are consecutive in recaddr, filled slot
            # by slot; record r (step s of bin b) holds min(L, cnt[b] - s * L) soundings
            want = set(fields) if fields is not None else None
            keys = list(SOUNDING_FIELDS) + [("attr", i) for i in range(self._n_ndx_attr)]
            if fields is not None:
                keys = [k for k in keys if (f"attr_{k[1]}" if isinstance(k, tuple) else k) in want]
            layout = {k: (NL.fields[(k, 0)].offset, NL.fields[(k, 0)].nbits) for k in keys}
            aligned = not np.any(recaddr % rsize)
            # aligned records are unpacked straight from the map (item positions in the file)
            base = recaddr // rsize if aligned else np.arange(R, dtype=np.int64)
            loc = item_positions(base, recaddr, nrec, cnt, bidx, L, self.width,
                                 bins=want is None or bool(want & {"bin_index", "row", "col"}),
                                 rows=want is None or bool(want & {"row", "col"}),
                                 addresses=want is None or bool(want & {"record_offset", "slot",
                                                                        "address"}))
            pos = loc.pop("pos")
            u = {k: np.zeros(0, dtype=np.uint64) for k in keys}
            if R and keys:
                raw = ndx.records() if aligned else ndx.get(recaddr)
                u = unpack_records(raw, L, self._single_bits, layout, pos)
                del raw
            del pos
        finally:
            ndx.close()
        h = self.header
        out = {k: loc[k] for k in ("bin_index", "row", "col") if k in loc}
        for key in keys:
            vals = u[key]
            if key == "depth":
                out["depth"] = self._depth_decode(vals)
            elif key == "horizontal_error":
                out[key] = self._error_decode(vals, h.horizontal_error_bits, h.horizontal_error_scale)
            elif key == "vertical_error":
                out[key] = self._error_decode(vals, h.vertical_error_bits, h.vertical_error_scale)
            elif isinstance(key, tuple):
                i = key[1]
                out[f"attr_{i}"] = (vals.astype(np.float64) / np.float64(np.float32(h.ndx_attribute_scale[i]))
                                    + np.float64(np.float32(h.min_ndx_attribute[i]))).astype(np.float32)
            else:
                out[key] = vals.view(np.int64)          # < 2**32: same bits as int64
        if "record_offset" in loc:
            out["record_offset"], out["slot"] = loc["record_offset"], loc["slot"]
            out["address"] = (out["record_offset"] * L + out["slot"]).astype(np.uint64)
        return out

    def _walk_chains(self, ndx: "_NdxMap", bidx, cnt, nrec, rstart, head) -> np.ndarray:
        """Byte addresses of the chains' records in (bin, step) order, one step of chain depth
        at a time for all bins; raises :class:`PfmFormatError` where a chain breaks."""
        rsize = self.ndx_record_size
        recaddr = np.zeros(int(nrec.sum()), dtype=np.int64)
        active = np.arange(bidx.size)
        cur = head.copy()
        step = 0
        while active.size:
            recaddr[rstart[active] + step] = cur
            go = nrec[active] > step + 1
            active = active[go]
            if not active.size:
                break
            prev = cur[go]
            nxt = self._continuations(ndx, prev)
            bad = (nxt <= 0) | (nxt % rsize != 0) | (nxt + rsize > ndx.file_size)
            if np.any(bad):
                j = int(np.flatnonzero(bad)[0])
                raise PfmFormatError(
                    f"chain of bin {int(bidx[active[j]])} breaks after {step + 1} record(s): continuation "
                    f"pointer {int(nxt[j])} but {int(cnt[active[j]])} soundings need "
                    f"{int(nrec[active[j]])} records", path=self.ndx_path, offset=int(prev[j]))
            cur = nxt
            step += 1
        return recaddr

    def _continuation_word(self) -> tuple[int, int] | None:
        """``(start, shift)``: the continuation pointer is the big-endian 64-bit word at byte
        ``start`` of its record shifted right by ``shift`` (and cut to its width); ``None``
        when the pointer does not fit one such word of the record."""
        f = self._ndx_layout.fields["continuation"]
        b0 = f.offset // 8
        b1 = (f.offset + f.nbits + 7) // 8
        s = max(0, b1 - 8)        # an 8-byte window ending with the pointer's last byte
        if s <= b0 and s + 8 <= self.ndx_record_size:
            return s, 64 - ((f.offset - 8 * s) + f.nbits)
        return None

    def _continuations(self, cache: "_NdxMap", addr: np.ndarray) -> np.ndarray:
        """Continuation pointers of the records at ``addr`` (reads only the pointer's bytes)."""
        f = self._ndx_layout.fields["continuation"]
        word = self._continuation_word()
        if word is not None:
            s, shift = word
            v = cache.words(addr + s, addr).astype(np.uint64)
            v >>= np.uint64(shift)
            v &= np.uint64((1 << f.nbits) - 1)
            return v.astype(np.int64)
        b0 = f.offset // 8
        b1 = (f.offset + f.nbits + 7) // 8
        # short records, or a 64-bit pointer over 9 bytes
        part = cache.get(addr, b0, b1)
        one = BitLayout([("p", f.offset - 8 * b0, f.nbits)], record_bytes=b1 - b0)
        return one.unpack(np.ascontiguousarray(part), ["p"])["p"].astype(np.int64)

    def read_bin(self, col: int, row: int) -> tuple[dict, dict]:
        """One bin: its record (scalars) and its soundings (arrays)."""
        rec = self.read_bin_records(row, row + 1, col, col + 1)
        snd = self.read_soundings(row, row + 1, col, col + 1)
        return {k: v[0] for k, v in rec.items()}, snd

    def decode_positions(self, col, row, x_off, y_off):
        """(lat, lon) of soundings from their bin and offset codes, as the library decodes them."""
        return self.grid.decode_position(col, row, x_off, y_off)

    # ------------------------------------------------------------------ rewriting
    def set_validity(self, record_offset, slot, validity) -> None:
        """Rewrite the validity of soundings at (record_offset, slot), in place.

        Batched read-modify-write of the physical records concerned (sorted,
        merged spans). Bin records are not touched: recompute the bins after.
        """
        self._writable()
        ro = np.asarray(record_offset, dtype=np.int64).ravel()
        sl = np.asarray(slot, dtype=np.int64).ravel()
        va = np.broadcast_to(np.asarray(validity, dtype=np.int64), ro.shape).ravel()
        if not (ro.size == sl.size):
            raise ConfigError("record_offset and slot must have the same length")
        if ro.size == 0:
            return
        L, rsize = self.record_length, self.ndx_record_size
        self._check_range("slot", sl, L - 1, "[RECORD LENGTH]")
        self._check_range("validity", va, (1 << self.header.validity_bits) - 1, "[VALIDITY BITS]")
        bad = (ro < 0) | (ro % rsize != 0) | (ro + rsize > self.ndx_size)
        if np.any(bad):
            j = int(np.flatnonzero(bad)[0])
            raise PfmFormatError(f"record offset {int(ro[j])} is not a physical record of the .ndx",
                                 path=self.ndx_path, offset=int(ro[j]))
        self._sync()
        urec, inv = np.unique(ro, return_inverse=True)
        spans = _Spans(self._fds["ndx"], urec, rsize, max_gap=_RMW_GAP, path=self.ndx_path)
        NL = self._ndx_layout
        words = NL._to_words(spans.records())
        for s in range(L):
            w = np.flatnonzero(sl == s)
            if w.size == 0:
                continue
            rows = inv[w]
            # duplicates of (record, slot): the last one wins
            _, last = np.unique(rows[::-1], return_index=True)
            keep = w[::-1][last]
            NL.pack_words(words, {("validity", s): va[keep].astype(np.uint64)}, clear=True, rows=inv[keep])
        spans.store(NL._from_words(words))
        spans.write()

    def write_bin_records(self, bin_index, *, coverage: bool = True, **fields) -> None:
        """Write bin statistics for bins ``bin_index`` (batched read-modify-write).

        ``fields``: any of ``num_valid, std, avg_filtered, min_filtered,
        max_filtered, avg, min, max, validity`` (arrays parallel to
        ``bin_index`` or scalars). Depths and std are coded with the
        library's float32 rule ``NINT((float(v) + float(offset)) *
        float(scale))``. Count, head and tail are never touched. With
        ``validity`` and ``coverage=True`` the ``.cvg`` is updated too.
        """
        self._writable()
        allowed = {"num_valid", "std", "validity"} | set(_DEPTH_FIELDS)
        unknown = set(fields) - allowed
        if unknown:
            raise ConfigError(f"write_bin_records: unknown field(s) {sorted(unknown)}; "
                              f"allowed: {sorted(allowed)}")
        bi = np.asarray(bin_index, dtype=np.int64).ravel()
        n = bi.size
        if n == 0:
            return
        nbins = self.width * self.height
        if bi.min() < 0 or bi.max() >= nbins:
            raise PfmFormatError(f"bin_index outside 0..{nbins - 1}", path=self.path)
        h = self.header
        order = np.argsort(bi, kind="stable")
        bs = bi[order]
        if np.any(bs[1:] == bs[:-1]):
            raise ConfigError("write_bin_records: a bin is given twice")
        codes = {}
        for k, v in fields.items():
            arr = np.broadcast_to(np.asarray(v), (n,))[order]
            if k in _DEPTH_FIELDS:
                c = scaled_code_f32(arr, h.depth_offset, h.depth_scale)
                lim, key = (1 << h.depth_bits) - 1, "[DEPTH BITS]"
            elif k == "std":
                c = nint(np.asarray(arr, np.float64).astype(np.float32) * np.float32(h.std_scale))
                lim, key = (1 << h.std_bits) - 1, "[STD BITS]"
                # A spread too large for the field (garbage depths thousands of metres apart
                # in one bin) is stored as the largest value; the library's int cast would
                # wrap it. (docs/pfm-format.md, quirks we fix)
                c = np.minimum(c, lim)
            elif k == "num_valid":
                if self.version < 70:
                    raise PfmFormatError("num_valid does not exist before v7", path=self.path)
                c = np.asarray(arr, dtype=np.int64)
                lim, key = (1 << h.count_bits) - 1, "[COUNT BITS]"
            else:
                c = np.asarray(arr, dtype=np.int64)
                lim, key = (1 << h.validity_bits) - 1, "[VALIDITY BITS]"
            self._check_range(k, np.asarray(c), lim, key)
            codes[k] = np.asarray(c).astype(np.uint64)
        self._sync()
        spans = _Spans(self._fds["bin"], self.bin_header_size + bs * self.bin_record_size,
                       self.bin_record_size, max_gap=_RMW_GAP, path=self.bin_path, what="bin record")
        BL = self._bin_layout
        words = BL._to_words(spans.records())
        BL.pack_words(words, codes, clear=True)
        spans.store(BL._from_words(words))
        spans.write()
        self._touch(bs)
        if coverage and "validity" in codes:
            self.update_coverage(bs, codes["validity"].astype(np.int64))

    def update_coverage(self, bin_index, validity) -> None:
        """Coverage bytes of bins from their validity (``update_cov_map``); see :mod:`._coverage`."""
        self._writable()
        self._sync()
        update_coverage(self._fds["cvg"], bin_index, validity, path=self.cvg_path)

    def read_coverage(self, bin_index) -> np.ndarray:
        """Coverage bytes of the given bins."""
        if self.version < 70:
            base = int(self.header.coverage_map_address)
            return read_coverage(self._fd("bin"), bin_index, base=base, path=self.bin_path)
        return read_coverage(self._fd("cvg"), bin_index, path=self.cvg_path)

    # ------------------------------------------------------------------ header
    def compute_extrema(self, rows_per_read: int | None = None) -> dict:
        """pfmLoader's header extrema from every bin with soundings (float32 values, raster order).

        Counts: min/max ``num_soundings`` and their (col, row). For bins whose
        max depth is below NULL DEPTH: min/max depth with coords; and if the
        bin has DATA: min/max filtered depth with coords and min/max std.
        Start values are pfmLoader's (9999999 / -9999999, count 9999999 / 0).
        Only the bins that hold data are read (:meth:`bin_records_with_data`).
        """
        res = dict(min_filtered_depth=9999999.0, max_filtered_depth=-9999999.0,
                   min_filtered_coord=(0, 0), max_filtered_coord=(0, 0),
                   min_depth=9999999.0, max_depth=-9999999.0, min_coord=(0, 0), max_coord=(0, 0),
                   min_bin_count=9999999, max_bin_count=0, min_count_coord=(0, 0),
                   max_count_coord=(0, 0), min_standard_deviation=9999999.0,
                   max_standard_deviation=-9999999.0)
        step = rows_per_read or max(1, (16 << 20) // max(1, self.width * self.bin_record_size))
        null = np.float32(self.null_depth)

        def better(arr, bidx, key, coord_key, lower):
            if arr.size == 0:
                return
            j = int(np.argmin(arr) if lower else np.argmax(arr))
            v = float(arr[j])
            if (v < res[key]) if lower else (v > res[key]):
                res[key] = v
                if coord_key:
                    res[coord_key] = (int(bidx[j] % self.width), int(bidx[j] // self.width))

        fields = ("num_soundings", "validity", "std", "min_filtered", "max_filtered", "min", "max")
        for b in self.bin_records_with_data(fields=fields, chunk=step * self.width):
            has = b["num_soundings"] > 0
            if not has.any():
                continue
            bi = b["bin_index"][has]
            cnt = b["num_soundings"][has]
            j = int(np.argmin(cnt))
            if cnt[j] < res["min_bin_count"]:
                res["min_bin_count"] = int(cnt[j])
                res["min_count_coord"] = (int(bi[j] % self.width), int(bi[j] // self.width))
            j = int(np.argmax(cnt))
            if cnt[j] > res["max_bin_count"]:
                res["max_bin_count"] = int(cnt[j])
                res["max_count_coord"] = (int(bi[j] % self.width), int(bi[j] // self.width))
            mx = b["max"][has].astype(np.float32)
            ok = mx < null
            data = ok & ((b["validity"][has] & V.DATA) != 0)
            better(b["min_filtered"][has][data].astype(np.float32), bi[data], "min_filtered_depth",
                   "min_filtered_coord", True)
            better(b["max_filtered"][has][data].astype(np.float32), bi[data], "max_filtered_depth",
                   "max_filtered_coord", False)
            better(b["std"][has][data].astype(np.float32), bi[data], "min_standard_deviation", None, True)
            better(b["std"][has][data].astype(np.float32), bi[data], "max_standard_deviation", None, False)
            better(b["min"][has][ok].astype(np.float32), bi[ok], "min_depth", "min_coord", True)
            better(b["max"][has][ok].astype(np.float32), bi[ok], "max_depth", "max_coord", False)
        return res

    def write_header(self, **values) -> None:
        """Set header keys (``PfmHeader`` field names) and rewrite the header block.

        With no values, the extrema are computed from the bin records first
        (:meth:`compute_extrema`). Geometry and bit widths cannot be changed.
        """
        self._writable()
        frozen = {"record_length", "min_x", "min_y", "max_x", "max_y", "x_bin_size", "y_bin_size",
                  "bin_width", "bin_height", "bin_header_size", "count_bits", "std_bits", "std_scale",
                  "depth_bits", "depth_scale", "depth_offset", "record_pointer_bits",
                  "file_number_bits", "line_number_bits", "ping_number_bits", "beam_number_bits",
                  "offset_bits", "validity_bits", "bin_attribute_bits", "ndx_attribute_bits",
                  "horizontal_error_bits", "vertical_error_bits", "horizontal_error_scale",
                  "vertical_error_scale", "null_depth", "points"}
        if not values:
            values = self.compute_extrema()
        h = self.header.copy()
        for k, v in values.items():
            if k in frozen:
                raise ConfigError(f"write_header: {k} defines the layout and cannot be changed")
            if not hasattr(h, k) or k in ("unknown", "size_missing"):
                raise ConfigError(f"write_header: unknown header field {k!r}")
            setattr(h, k, tuple(v) if isinstance(v, list) and k.endswith("coord") else v)
        self._sync()
        data = h.to_bytes()
        if len(data) != self.bin_header_size:
            raise PfmFormatError("header block size changed", path=self.bin_path)
        os.pwrite(self._fds["bin"], data, 0)
        self.header = h


def create(path, grid, **kwargs) -> PfmFile:
    """Create a new PFM v7; see :meth:`PfmFile.create`."""
    return PfmFile.create(path, grid, **kwargs)


def open_pfm(path, mode: str = "r") -> PfmFile:
    """Open an existing PFM (``"r"`` or ``"r+"``)."""
    return PfmFile(path, mode)
