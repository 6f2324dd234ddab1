"""Where a sparse part of a PFM holds data: its extents, from ``lseek`` SEEK_DATA / SEEK_HOLE.

The ``.bin`` and the ``.cvg`` are created at full size with ``ftruncate``:
the records of bins no load ever wrote are holes, which read as zero bytes,
and an all-zero bin record (or coverage byte) is a valid empty bin. A load
over a small part of a big grid writes a small part of these files, so the
final step (recompute, check) asks the file system where its data is and
reads only that, instead of reading (and the kernel zero-filling) every
record of the grid. A hole is zero by definition: skipping it loses nothing.

Where the system or the file system cannot tell (no SEEK_DATA, or EINVAL),
the whole range counts as data: the answer is then only slower, never
different.
"""

from __future__ import annotations

import errno
import os

import numpy as np

from .._numeric import CompiledKernels

__all__ = ["SKIP_HOLES", "data_extents", "record_runs", "merge_runs", "nonzero_records",
           "gather_runs", "subtract_runs"]

#: False: every byte counts as data (what the final step did before it skipped holes; the
#: benchmark ``bench_final_step`` sets it to measure that path in the same run).
SKIP_HOLES = True
#: Data extents closer than this many bytes are read as one (fewer, larger reads).
MERGE_BYTES = 64 << 10


def data_extents(fd: int, lo: int, hi: int, *, merge: int = MERGE_BYTES) -> np.ndarray:
    """Byte ranges ``[a, b)`` within ``[lo, hi)`` of open file ``fd`` that may hold non-zero
    bytes, as an (n, 2) int64 array in file order: the file's data extents, those closer than
    ``merge`` bytes joined. Only ``fd``'s offset changes (use ``pread`` on it, not ``read``).
    The caller makes sure no write to the range is still queued in user space."""
    lo, hi = int(lo), int(hi)
    if hi <= lo:
        return np.zeros((0, 2), dtype=np.int64)
    if not SKIP_HOLES or not hasattr(os, "SEEK_DATA"):
        return np.array([[lo, hi]], dtype=np.int64)
    out: list[list[int]] = []
    pos = lo
    while pos < hi:
        try:
            d = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:      # nothing but hole from pos to the end of the file
                break
            out.append([pos, hi])             # the file system cannot tell: all of it is data
            break
        if d >= hi:
            break
        try:
            h = min(hi, os.lseek(fd, d, os.SEEK_HOLE))
        except OSError:
            h = hi
        if h <= d:                            # never loop on a file system that answers oddly
            h = hi
        if out and d - out[-1][1] <= merge:
            out[-1][1] = h
        else:
            out.append([d, h])
        pos = h
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def merge_runs(runs: np.ndarray) -> np.ndarray:
    """Overlapping or touching ``[a, b)`` runs joined, in increasing order ((n, 2) int64)."""
    runs = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    runs = runs[runs[:, 1] > runs[:, 0]]
    if runs.shape[0] <= 1:
        return runs
    runs = runs[np.argsort(runs[:, 0], kind="stable")]
    ends = np.maximum.accumulate(runs[:, 1])
    new = np.r_[True, runs[1:, 0] > ends[:-1]]
    first = np.flatnonzero(new)
    last = np.r_[first[1:], runs.shape[0]] - 1
    return np.stack([runs[first, 0], ends[last]], axis=1)


def record_runs(fd: int, base: int, rsize: int, first: int, last: int) -> np.ndarray:
    """Runs ``[a, b)`` of record numbers within ``[first, last)`` of the ``rsize``-byte records
    that start at byte ``base`` of ``fd``, covering every record with a byte in a data extent;
    the records outside them lie wholly in holes (all zero)."""
    first, last = int(first), int(last)
    ext = data_extents(fd, base + first * rsize, base + last * rsize)
    if ext.shape[0] == 0:
        return ext
    a = (ext[:, 0] - base) // rsize
    b = -((base - ext[:, 1]) // rsize)        # ceil((end - base) / rsize)
    return merge_runs(np.stack([np.clip(a, first, last), np.clip(b, first, last)], axis=1))


def _k_nonzero_records(words, buf, rsize, mark):
    """numba kernel: ``mark[r] = 1`` for every ``rsize``-byte record ``r`` of ``buf`` with a
    non-zero byte. ``words``: the same bytes as 64-bit words (all but the last ``buf.size % 8``
    bytes): zeros are skipped eight bytes at a time, and a record is left at its first
    non-zero byte."""
    i = 0
    n = buf.size
    nw8 = 8 * words.size
    while i < n:
        if i & 7 == 0 and i < nw8 and words[i >> 3] == 0:
            i += 8
        elif buf[i] != 0:
            r = i // rsize
            mark[r] = 1
            i = (r + 1) * rsize
        else:
            i += 1


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    return {"nonzero_records": T.void(T.Array(T.uint64, 1, "C", **ro), T.Array(T.uint8, 1, "C", **ro),
                                      T.int64, T.Array(T.uint8, 1, "C"))}


_kernel = CompiledKernels(globals(), _signatures)


def nonzero_records(recs: np.ndarray) -> np.ndarray:
    """Row numbers of the (n, size) uint8 ``recs`` that are not all zero (int64, increasing):
    an all-zero bin record is an empty bin, and only the others need decoding. Memory speed
    (a 64-bit word at a time): the cost of skipping an empty record is that of reading it."""
    n, size = recs.shape
    if n == 0 or size == 0:
        return np.zeros(0, dtype=np.int64)
    buf = np.ascontiguousarray(recs).reshape(-1)
    if buf.ctypes.data % 8:            # words must be aligned: copy (rare; np.empty aligns)
        buf = buf.copy()
    nw = buf.size // 8
    words = buf[: nw * 8].view(np.uint64)
    mark = np.zeros(n, dtype=np.uint8)
    _kernel("nonzero_records")(words, buf, int(size), mark)
    return np.flatnonzero(mark)


def gather_runs(runs: np.ndarray, limit: int):
    """Cut runs ``[a, b)`` (increasing) into groups of pieces of at most ``limit`` items in all.

    Yields ``(lo, hi, at)`` arrays per group: the pieces ``[lo[k], hi[k])`` and where each
    starts in the group's buffer (``at``, pieces end to end). Many short runs (a survey line
    crossing every row of a wide grid leaves one per row) then make a few large groups,
    read into one buffer each, instead of as many small ones.
    """
    limit = max(1, int(limit))
    los, his, used = [], [], 0
    for a, b in np.asarray(runs, dtype=np.int64).reshape(-1, 2).tolist():
        while a < b:
            take = min(b - a, limit - used)
            los.append(a)
            his.append(a + take)
            used += take
            a += take
            if used == limit:
                lo, hi = np.array(los, np.int64), np.array(his, np.int64)
                yield lo, hi, np.cumsum(hi - lo) - (hi - lo)
                los, his, used = [], [], 0
    if los:
        lo, hi = np.array(los, np.int64), np.array(his, np.int64)
        yield lo, hi, np.cumsum(hi - lo) - (hi - lo)


def positions_to_items(pos: np.ndarray, lo: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Item numbers of buffer positions ``pos`` of a group of :func:`gather_runs`."""
    k = np.searchsorted(at, pos, side="right") - 1
    return lo[k] + (pos - at[k])


def subtract_runs(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The parts of the increasing, disjoint runs ``a`` outside the runs ``b`` ((n, 2) int64)."""
    a = merge_runs(a).tolist()
    b = merge_runs(b).tolist()
    out, j = [], 0
    for lo, hi in a:
        while j < len(b) and b[j][1] <= lo:
            j += 1
        k = j
        while lo < hi:
            if k >= len(b) or b[k][0] >= hi:
                out.append([lo, hi])
                break
            if b[k][0] > lo:
                out.append([lo, b[k][0]])
            lo = max(lo, b[k][1])
            k += 1
    return np.array(out, dtype=np.int64).reshape(-1, 2)
