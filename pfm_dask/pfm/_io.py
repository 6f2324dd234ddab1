"""Span I/O of the PFM store: many fixed-size records read and written in few system calls.

:class:`Spans` reads records at sorted offsets as merged spans and writes them back;
:class:`BackgroundWriter` writes queued buffers on one thread so that packing overlaps the
disk; :func:`start_writeback` asks Linux to start writing fresh pages out; :class:`NdxMap`
maps the ``.ndx`` read-only for the chain walks. Nothing here knows the record layouts.
"""

from __future__ import annotations

import mmap
import os
import sys

import numpy as np

from .._fileio import pwrite_all
from ..errors import PfmFormatError
from ._bitpack import BitLayout
from ._runs import read_parts

__all__ = ["Spans", "BufferPool", "BackgroundWriter", "NdxMap", "start_writeback", "RMW_GAP",
           "MAX_SPAN", "ZERO_GAP", "ZERO_SKIP", "zero_gaps", "write_runs", "MERGE_RUNS"]

RMW_GAP = 4096                   # merge read-modify-write spans whose gap is at most this
#: a run of records known to be zero inside a span is not read when longer than this (bytes):
#: about where a system call more costs less than copying the run from the page cache (runs
#: at a span's ends are never read: trimming them costs no call)
ZERO_SKIP = 4096
MAX_SPAN = 32 << 20              # longest single read/write


class Spans:
    """Records of ``size`` bytes at sorted unique ``offsets``, read as merged spans.

    The spans (records closer than ``max_gap`` bytes merged, none longer than
    ``MAX_SPAN``) lie end to end in one buffer, so that every record is a
    position in it and each operation is one vectorised call whatever the
    number of spans. ``records()`` gives an (n, size) copy; ``store(records)``
    puts modified records back; ``unpack`` reads fields and ``pack_new`` writes records anew in
    place; ``write()`` writes every span with one ``pwrite`` each, in offset
    order. Gap bytes between records are written back unchanged (the file is
    not shared while we hold it).
    """

    def __init__(self, fd: int, offsets: np.ndarray, size: int, *, max_gap: int,
                 path=None, what: str = "record", read: bool = True, zero: bool = True,
                 joinable: np.ndarray | None = None,
                 known_zero: tuple[np.ndarray, int] | None = None):
        """``joinable`` (one per pair of consecutive offsets): whether their gap may be in a
        span at all (with ``read=False`` the gap is written as zeros: only gaps known to be
        zero in the file may be joined). ``known_zero`` = (bits, base): the file's records of
        ``size`` bytes from byte ``base`` on, bit ``i`` set (MSB first) where record ``i`` is
        known to be all zero; runs of those at either end of a span, or longer than
        :data:`ZERO_SKIP` bytes inside one, are not read but left zero in the buffer (bin
        records never written yet, mixed with the others in a load that comes back to its
        bins)."""
        self.fd = fd
        self.size = int(size)
        off = np.asarray(offsets, dtype=np.int64)
        self.offsets = off
        self.path = path
        n = off.size
        if n and np.any(np.diff(off) < self.size):
            raise PfmFormatError(f"overlapping {what}s requested (two bins share a record?)",
                                 path=path, offset=int(off[np.flatnonzero(np.diff(off) < self.size)[0]]))
        if n:
            apart = np.diff(off) - self.size > max_gap
            if joinable is not None:
                apart |= ~joinable
            brk = np.flatnonzero(apart) + 1
        else:
            brk = np.zeros(0, np.int64)
        starts = np.r_[0, brk].astype(np.int64) if n else np.zeros(0, np.int64)
        ends = np.r_[brk, n].astype(np.int64) if n else np.zeros(0, np.int64)
        # split the (rare) spans longer than MAX_SPAN; the others stay as they are
        too_long = np.flatnonzero(off[ends - 1] + self.size - off[starts] > MAX_SPAN) if n else starts
        if too_long.size:
            runs_a, runs_b = [], []
            for a, b in zip(starts.tolist(), ends.tolist()):
                while a < b:
                    lim = int(off[a]) + MAX_SPAN
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
        if known_zero is not None and n:
            parts = read_parts(self.span_lo, self.span_len, self.span_at, known_zero[1],
                               self.size, known_zero[0], ZERO_SKIP // self.size + 1)
            self.buf = np.zeros(total, dtype=np.uint8)
        else:
            parts = (self.span_lo, self.span_len, self.span_at)
            self.buf = np.empty(total, dtype=np.uint8)
        mv = memoryview(self.buf)
        for lo, ln, at in zip(*(p.tolist() for p in parts)):
            got = os.preadv(fd, [mv[at:at + ln]], lo)
            if got != ln:
                raise PfmFormatError(f"{what} at byte {lo + got:,} is past the end of the file",
                                     path=path, offset=lo + got)

    def _view(self) -> np.ndarray:
        """A writeable (len - size + 1, size) window view: row ``p`` is the record at byte ``p``."""
        return np.lib.stride_tricks.as_strided(self.buf, shape=(self.buf.size - self.size + 1, self.size),
                                               strides=(1, 1), writeable=True)

    def records(self, rows=None) -> np.ndarray:
        """An (n, size) copy of the records, or of the ``rows`` (a mask or indices) only."""
        if self.dense:
            recs = self.buf.reshape(-1, self.size)
            return recs.copy() if rows is None else recs[rows]
        return self._view()[self.pos if rows is None else self.pos[rows]]

    def store(self, records: np.ndarray) -> None:
        if self.dense:
            self.buf.reshape(-1, self.size)[...] = records
        else:
            self._view()[self.pos] = records

    def write(self, writer: "BackgroundWriter | None" = None) -> None:
        parts = [(self.buf[at:at + ln], lo) for lo, ln, at in
                 zip(self.span_lo.tolist(), self.span_len.tolist(), self.span_at.tolist())]
        if writer is not None:
            writer.submit_many(self.fd, parts)
            return
        for part, lo in parts:
            pwrite_all(self.fd, part, lo)

    def unpack(self, layout: BitLayout, keys) -> dict:
        """Fields (uint64) of every record, read in place from the span buffer."""
        if not self.offsets.size:
            return {k: np.empty(0, dtype=np.uint64) for k in keys}
        return layout.unpack_at(self.buf, self.pos, keys)

    def pack_new(self, layout: BitLayout, values: dict) -> None:
        """Write every record anew in the span buffer: the given fields, all other bits 0."""
        if self.offsets.size:
            layout.pack_new_at(self.buf, self.pos, values)


#: the longest gap of zeros written between two records: shorter than a file system block, so
#: it holds no whole block, and writing it allocates no block of a sparse file that its records'
#: writes would not (the file's holes stay where they were)
ZERO_GAP = 4095


def zero_gaps(items: np.ndarray, size: int, zero_bits: np.ndarray | None) -> np.ndarray | None:
    """For sorted unique item numbers (records of ``size`` bytes), whether each pair of
    consecutive items is no more than :data:`ZERO_GAP` bytes apart and every item between
    them is marked in ``zero_bits`` (bit ``i`` = byte ``i // 8``, MSB first: item ``i`` is known
    to be all zero in the file), so that the gap may be written as zeros in the same span.
    None when nothing is known (``zero_bits`` None)."""
    if zero_bits is None or items.size < 2:
        return None
    items = items.astype(np.int64, copy=False)
    gap = np.diff(items) - 1
    cand = np.flatnonzero((gap > 0) & (gap * size <= ZERO_GAP))
    ok = gap == 0
    # the gaps' items tested a block of about _GAP_BLOCK at a time (bounded memory)
    ends = np.cumsum(gap[cand])
    a = 0
    while a < cand.size:
        b = max(a + 1, int(np.searchsorted(ends, (ends[a - 1] if a else 0) + _GAP_BLOCK)))
        c = cand[a:b]
        g = gap[c]
        first = np.cumsum(g) - g
        pos = np.repeat(items[c] + 1 - first, g) + np.arange(int(g.sum()), dtype=np.int64)
        bit = (zero_bits[pos >> 3] >> (7 - (pos & 7)).astype(np.uint8)) & 1
        ok[c] = np.add.reduceat(bit.astype(np.int64), first) == g
        a = b
    return ok


_GAP_BLOCK = 1 << 20


#: :func:`write_runs` reads and writes spans of bins instead of writing their runs when
#: that would take this many writes at least and the spans are half as many at most
MERGE_RUNS = 64


def write_runs(fd: int, bidx: np.ndarray, recs: np.ndarray, base: int, path,
                zero_bits: np.ndarray | None = None) -> None:
    """Write records ``recs`` of bins ``bidx`` (increasing) back, one write per run of
    consecutive bins (the holes between them are not written), or, with the store's map of
    bins still all zero (``zero_bits``), one write per span that also holds the short gaps
    of such bins (:func:`zero_gaps`: written as the zeros they are, no new blocks).

    When that takes many writes and the bins are less than a block apart (an area filter's
    changed bins where it cut much, the bins between holding data: on a real-derived survey
    64,000 runs), one write per span of them instead, the records between read and written
    back as they are (a read-modify-write by :class:`Spans`, which reads no run of bins
    ``zero_bits`` knows to be zero; gaps under a block: no new block of a sparse ``.bin``).
    The caller holds the store's write lock and has no write to these bytes queued."""
    bs = recs.shape[1]
    b64 = bidx.astype(np.int64, copy=False)
    join = zero_gaps(b64, bs, zero_bits)
    gaps = np.diff(b64) - 1
    # the writes the plain ways take: a run each, or a span of runs with zeros between
    writes = int(np.count_nonzero(gaps if join is None else ~join)) + 1
    spans = None
    if writes >= MERGE_RUNS and 2 * (int(np.count_nonzero(gaps * bs > ZERO_GAP)) + 1) <= writes:
        spans = Spans(fd, base + b64 * bs, bs, max_gap=ZERO_GAP, path=path, what="bin record",
                      known_zero=None if zero_bits is None else (zero_bits, base))
    elif join is not None:
        spans = Spans(fd, base + b64 * bs, bs, max_gap=ZERO_GAP, path=path, what="bin record",
                      read=False, zero=True, joinable=join)
    if spans is not None:
        spans.store(recs)
        spans.write()
        return
    brk = np.flatnonzero(gaps) + 1
    starts = np.r_[0, brk].tolist()
    ends = np.r_[brk, bidx.size].tolist()
    for a, b in zip(starts, ends):
        pwrite_all(fd, recs[a:b], base + int(bidx[a]) * bs)


_SYNC_FILE_RANGE_WRITE = 2       # linux/fs.h: start write-out of dirty pages, do not wait
_sync_file_range = None          # libc's sync_file_range, looked up on first use (False: none)


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
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

                # libc from the process's own symbols (find_library forks to run ldconfig)
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _sync_file_range = fn
            except (OSError, AttributeError):
                pass
    if _sync_file_range and nbytes > 0:
        _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)   # advisory: errors ignored


class BufferPool:
    """At most ``count`` byte buffers of ``nbytes``, lent out and given back (by the write-behind
    thread once written): packing goes on into one buffer while another is written, and the
    memory in flight stays bounded (:meth:`get` waits while all are out)."""

    def __init__(self, nbytes: int, count: int):
        import threading

        self.nbytes = int(nbytes)
        self.count = int(count)
        self._free: list[np.ndarray] = []
        self._made = 0
        self._cv = threading.Condition()

    def get(self) -> np.ndarray:
        with self._cv:
            while not self._free and self._made >= self.count:
                self._cv.wait()
            if self._free:
                return self._free.pop()
            self._made += 1
        return np.empty(self.nbytes, dtype=np.uint8)

    def put(self, buf: np.ndarray) -> None:
        with self._cv:
            self._free.append(buf)
            self._cv.notify()


class BackgroundWriter:
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
        self._queue(lambda: pwrite_all(fd, data, offset), fd, offset,
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
                pwrite_all(fd, part, at)
        self._queue(write_all, fd, lo, hi)

    def run(self, action, done=None) -> None:
        """Queue ``action()`` after the writes queued before it (and before those after);
        ``done()`` runs afterwards in any case (also when an earlier error skips ``action``)."""
        self._queue(action, done=done)

    def start_writeback(self, fd: int, offset: int, nbytes: int) -> None:
        """Queue :func:`start_writeback` (it can block while the disk's queue is full)."""
        self._queue(lambda: start_writeback(fd, offset, nbytes))

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


class NdxMap:
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
