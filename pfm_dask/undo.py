"""The undo log of a load's in-place overwrites (no Dask here; :mod:`pfm_dask.journal` runs it).

Between two checkpoints the PFM store overwrites bytes in place in two places: the bin
records of the bins a group of pieces touches and the tail records of chains that grow.
Before each overwrite is issued, its pre-image is kept here (one per record and checkpoint
interval) and made durable with one fsync per call; a resume puts them back, newest first,
to the state of the last checkpoint. Entries carry their checkpoint's epoch and a CRC, so a
torn tail or an older interval's entries are ignored. Pre-images are stored compactly: all
zero (a length), sparse (the non-zero runs), runs of fixed-size records (zero ones as runs,
the others with their bytes), or tail records restored by clearing the bits past their
soundings (16 bytes each). docs/reliability.md has the format and the failure cases.
"""

from __future__ import annotations

import os
import struct
import time
import zlib
from pathlib import Path

import numpy as np

from ._fileio import pwrite_all
from .errors import LoadError
from .pfm._runs import gather_rows, mark_records, records_needed, rows_nonzero

__all__ = ["UndoLog", "UNDO_ALT_SUFFIX"]

UNDO_ALT_SUFFIX = ".b"           # the undo log's second file (intervals alternate between the two)

_PARTS = {"bin": 0, "ndx": 1, "cvg": 2, "ctl": 3, "lin": 4}
_PART_NAMES = {v: k for k, v in _PARTS.items()}
_HEAD = struct.Struct("<4sQBQQ")     # magic, epoch, part, offset, length
_CRC = struct.Struct("<I")
_MAGIC = b"UNDO"
_ZERO = 0x80                         # part flag: the pre-image is all zero (no body stored)
_SPARSE = 0x40                       # part flag: body = run table + the non-zero runs only
_RECORDS = 0xC0                      # part flag: body = runs of fixed-size records (zero/data)
_CLEARED = 0x20                      # part flag: body = records restored by clearing their tail bits
_BLOCK = 32                          # granularity of the non-zero runs, bytes
_MERGE = 4                           # zero gaps of at most this many blocks stay in a run


class UndoLog:
    """Pre-images of in-place overwrites since the last checkpoint; see the module docstring.

    The PFM store calls :meth:`save` with the bytes a write is about to replace
    and :meth:`commit` before issuing the writes; one commit (one fsync) covers
    every pre-image saved since the previous one, so a piece costs one fsync.
    Only bytes below the checkpoint size of their part are kept: anything past
    it is cut off by the resume's truncation. Each entry carries the epoch of
    its checkpoint and a CRC, so a torn tail or entries of an older epoch are
    ignored.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        # the interval's file and the other one (``path`` + UNDO_ALT_SUFFIX): a checkpoint made
        # durable behind the writer (``begin(..., keep_previous=True)``) leaves the previous
        # interval's entries where they are and starts the new one in the other file
        self.paths = [self.path, Path(str(self.path) + UNDO_ALT_SUFFIX)]
        self._fds: list[int | None] = [os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644), None]
        if self.paths[1].exists():
            self._fds[1] = os.open(self.paths[1], os.O_RDWR)
        self._cur = 0
        self.fd = self._fds[0]
        self.epoch = 0
        self.limits: dict[str, int] = {}
        # (part, record size) -> one bit per record of the part (offset // size): its pre-image
        # is already in this interval's log. The rollback restores the oldest entry of a record
        # last, so a second one would never be what is left: it is not written.
        self._saved: dict[tuple[str, int], np.ndarray] = {}
        self._dirty = False
        self._end = os.fstat(self.fd).st_size
        self.bytes_saved = 0
        self.seconds = 0.0      # time spent saving and committing (the journal's cost)
        self.fsync_seconds_behind = 0.0   # commits run on the store's write-behind thread

    @staticmethod
    def _truncate(fd: int) -> None:
        if os.fstat(fd).st_size:    # an empty log needs no truncation
            os.ftruncate(fd, 0)
            os.fsync(fd)

    def begin(self, epoch: int, limits: dict[str, int], *, keep_previous: bool = False) -> None:
        """Start a new checkpoint interval: forget every entry (truncate) and set the limits.

        ``keep_previous``: the checkpoint that starts this interval is not durable yet (it is
        being fsynced and published behind the writer), so the previous interval's entries
        must survive until it is: the new interval goes to the other file, whose entries (two
        intervals old, before the last published checkpoint) are dropped. The caller publishes
        at most one checkpoint at a time. A rollback puts back the entries of its epoch and of
        any later one (:meth:`rollback`)."""
        t0 = time.perf_counter()
        if keep_previous:
            self._cur = 1 - self._cur
            if self._fds[self._cur] is None:
                self._fds[self._cur] = os.open(self.paths[self._cur], os.O_RDWR | os.O_CREAT, 0o644)
            self.fd = self._fds[self._cur]
            self._truncate(self.fd)
        else:
            for fd in self._fds:
                if fd is not None:
                    self._truncate(fd)
        self._end = 0
        self._dirty = False
        self.epoch = int(epoch)
        self.limits = {k: int(v) for k, v in limits.items()}
        self._saved = {}
        self.seconds += time.perf_counter() - t0

    def needed(self, part: str, offsets, size: int) -> np.ndarray:
        """Which of the ``size``-byte records at ``offsets`` of ``part`` still need a pre-image in
        this interval: those below the checkpoint size of their part (anything past it is cut off
        by the resume's truncation) whose pre-image is not in the log yet (the first one of an
        interval is the one a rollback leaves). A boolean mask; nothing is marked."""
        return records_needed(np.asarray(offsets, dtype=np.int64), int(size),
                              self.limits.get(part, 0), self._saved.get((part, int(size))))

    def _mark(self, part: str, offsets: np.ndarray, size: int) -> None:
        """Remember that the records at ``offsets`` have their pre-image in this interval's log."""
        key = (part, int(size))
        bits = self._saved.get(key)
        if bits is None:
            bits = self._saved[key] = np.zeros(self.limits.get(part, 0) // int(size) // 8 + 2,
                                               dtype=np.uint8)
        mark_records(bits, offsets, size)

    def save(self, part: str, offset: int, data) -> None:
        """Keep the bytes at ``offset`` of ``part`` that a write is about to replace."""
        offset = int(offset)
        if offset >= self.limits.get(part, 0):
            return
        t0 = time.perf_counter()
        arr = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        flag, body = _encode(arr)
        head = _HEAD.pack(_MAGIC, self.epoch, _PARTS[part] | flag, offset, arr.size)
        crc = zlib.crc32(body, zlib.crc32(head))
        pwrite_all(self.fd, head + _CRC.pack(crc) + body, self._end)
        self._end += _HEAD.size + _CRC.size + len(body)
        self.bytes_saved += len(body)
        self._dirty = True
        self.seconds += time.perf_counter() - t0

    def _to_keep(self, part: str, off: np.ndarray, size: int, need, t0: float):
        """(mask, count) of the records at ``off`` still needing a pre-image (``need``, when
        the caller has :meth:`needed`'s mask); with none, the call's seconds are counted."""
        keep = self.needed(part, off, size) if need is None else need
        nk = int(np.count_nonzero(keep))
        if not nk:
            self.seconds += time.perf_counter() - t0
        return keep, nk

    def save_records(self, part: str, offsets, size: int, records, *, at=None,
                     need: np.ndarray | None = None) -> None:
        """Keep the pre-images of fixed-size records at sorted ``offsets`` (``records``: an
        (n, size) uint8 array, or None when all are zero; with ``at``, a flat uint8 buffer
        holding record ``j`` at byte ``at[j]``, as a read span's, read in place). One entry:
        runs of consecutive all-zero records as (offset, count), runs of the others with their
        bytes. Records past the checkpoint size, or saved before in this interval, are left
        out (``need``: :meth:`needed`'s mask for these offsets, when the caller has it)."""
        t0 = time.perf_counter()
        off = np.asarray(offsets, dtype=np.int64)
        size = int(size)
        keep, nk = self._to_keep(part, off, size, need, t0)
        if not nk:
            return
        every = nk == off.size
        if not every:
            off = off[keep]
        if records is None:
            nz = np.zeros(off.size, dtype=bool)
        else:
            if at is None:
                buf = np.ascontiguousarray(records, dtype=np.uint8).reshape(-1)
                pos = np.arange(buf.size // size, dtype=np.int64) * size
            else:
                buf, pos = records, np.asarray(at, dtype=np.int64)
            if not every:
                pos = pos[keep]
            nz = rows_nonzero(buf, pos, size)
        tables = []
        for sel in (~nz, nz):
            o = off[sel]
            brk = np.flatnonzero(np.diff(o) != size) + 1
            starts = np.r_[0, brk] if o.size else np.zeros(0, np.int64)
            counts = np.diff(np.r_[starts, o.size])
            table = np.empty((starts.size, 2), dtype="<i8")
            table[:, 0] = o[starts] if o.size else 0
            table[:, 1] = counts
            tables.append(table)
        # the entry in one buffer: header, body length, CRC, body (size, both tables, the
        # records holding data gathered straight from where they are)
        k = int(np.count_nonzero(nz)) if records is not None else 0
        lead = _HEAD.size + 4 + _CRC.size
        blen = 4 + sum(4 + t.nbytes for t in tables) + k * size
        entry = np.empty(lead + blen, dtype=np.uint8)
        p = lead
        struct.pack_into("<I", entry, p, size)
        p += 4
        for t in tables:
            struct.pack_into("<I", entry, p, t.shape[0])
            entry[p + 4: p + 4 + t.nbytes] = t.reshape(-1).view(np.uint8)
            p += 4 + t.nbytes
        if k:
            gather_rows(buf, pos[nz], size, entry[p:])
        n = int(off[-1]) + size - int(off[0])
        head = _HEAD.pack(_MAGIC, self.epoch, _PARTS[part] | _RECORDS, int(off[0]), n)
        crc = zlib.crc32(entry[lead:], zlib.crc32(head))
        entry[:lead] = np.frombuffer(head + struct.pack("<I", blen) + _CRC.pack(crc), np.uint8)
        pwrite_all(self.fd, entry, self._end)
        self._end += entry.size
        self._mark(part, off, size)
        self.bytes_saved += blen
        self._dirty = True
        self.seconds += time.perf_counter() - t0

    def save_cleared(self, part: str, offsets, size: int, keep_bits, *,
                     need: np.ndarray | None = None) -> None:
        """Keep the pre-images of ``size``-byte records at ``offsets`` that were their present
        bytes with every bit from ``keep_bits[j]`` on (MSB first) cleared: a chain's tail
        record before soundings fill its free slots and its continuation pointer is set. One
        entry of 16 bytes per record; the rollback reads each record and clears those bits.
        Records past the checkpoint size, or saved before in this interval, are left out
        (``need``: :meth:`needed`'s mask for these offsets, when the caller has it)."""
        t0 = time.perf_counter()
        off = np.asarray(offsets, dtype=np.int64)
        keep, nk = self._to_keep(part, off, size, need, t0)
        if not nk:
            return
        every = nk == off.size
        table = np.empty((nk, 2), dtype="<i8")
        table[:, 0] = off if every else off[keep]
        kb = np.asarray(keep_bits, dtype=np.int64)
        table[:, 1] = kb if every else kb[keep]
        body = struct.pack("<I", int(size)) + table.tobytes()
        n = int(table[:, 0].max()) + int(size) - int(table[:, 0].min())
        head = _HEAD.pack(_MAGIC, self.epoch, _PARTS[part] | _CLEARED, int(table[0, 0]), n)
        crc = zlib.crc32(body, zlib.crc32(head))
        pwrite_all(self.fd, head + struct.pack("<I", len(body)) + _CRC.pack(crc) + body, self._end)
        self._end += _HEAD.size + 4 + _CRC.size + len(body)
        self._mark(part, table[:, 0], size)
        self.bytes_saved += len(body)
        self._dirty = True
        self.seconds += time.perf_counter() - t0

    def commit(self) -> None:
        """Make the saved pre-images durable; call before the overwrites are issued."""
        if self._dirty:
            t0 = time.perf_counter()
            os.fsync(self.fd)
            self._dirty = False
            self.seconds += time.perf_counter() - t0

    def commit_in(self, queue) -> None:
        """:meth:`commit` as a job for ``queue`` (a callable taking a callable: the store's
        write-behind thread, which runs its jobs in order): queued ahead of the overwrites, the
        fsync still comes before them, while the caller goes on packing. The log counts as
        committed from now on; the job's seconds go to :attr:`fsync_seconds_behind`."""
        if not self._dirty:
            return
        self._dirty = False
        fd = self.fd

        def fsync() -> None:
            t0 = time.perf_counter()
            os.fsync(fd)
            self.fsync_seconds_behind += time.perf_counter() - t0
        queue(fsync)

    def entries(self, epoch: int) -> list[tuple[int, int, int, str, int, int]]:
        """Valid entries of ``epoch`` in the interval's file in write order: (kind flag,
        position of the body, body length, part, offset, length of the pre-image)."""
        return [e[1:] for e in self._scan(self.fd) if e[0] == epoch]

    def _scan(self, fd: int) -> list[tuple[int, int, int, int, str, int, int]]:
        """Every valid entry of the file ``fd`` in write order, with its epoch first."""
        out = []
        size = os.fstat(fd).st_size
        pos = 0
        hs = _HEAD.size + _CRC.size
        while pos + hs <= size:
            raw = os.pread(fd, hs, pos)
            magic, ep, part, off, n = _HEAD.unpack_from(raw)
            (crc,) = _CRC.unpack_from(raw, _HEAD.size)
            flag = part & (_ZERO | _SPARSE | _CLEARED)
            part &= ~(_ZERO | _SPARSE | _CLEARED)
            if magic != _MAGIC or part not in _PART_NAMES:
                break  # a torn or foreign tail: its overwrite was never issued
            stored = 0
            if flag in (_RECORDS, _CLEARED):  # its body length follows the header, then the CRC
                raw = os.pread(fd, hs + 4, pos)
                if len(raw) < hs + 4:
                    break
                (stored,) = struct.unpack_from("<I", raw, _HEAD.size)
                (crc,) = _CRC.unpack_from(raw, _HEAD.size + 4)
                if pos + hs + 4 + stored > size:
                    break
                body = os.pread(fd, stored, pos + hs + 4)
                if zlib.crc32(body, zlib.crc32(raw[:_HEAD.size])) != crc:
                    break
                out.append((ep, flag, pos + hs + 4, stored, _PART_NAMES[part], off, n))
                pos += hs + 4 + stored
                continue
            if flag == _SPARSE:
                if pos + hs + 4 > size:
                    break
                (k,) = struct.unpack("<I", os.pread(fd, 4, pos + hs))
                table = np.frombuffer(os.pread(fd, 8 * k, pos + hs + 4), dtype="<u4")
                if table.size != 2 * k:
                    break
                stored = 4 + 8 * k + int(table[1::2].astype(np.int64).sum())
            elif flag != _ZERO:
                stored = n
            if pos + hs + stored > size:
                break
            body = os.pread(fd, stored, pos + hs)
            if zlib.crc32(body, zlib.crc32(raw[:_HEAD.size])) != crc:
                break
            out.append((ep, flag, pos + hs, stored, _PART_NAMES[part], off, n))
            pos += hs + stored
        return out

    def rollback(self, epoch: int, paths: dict[str, str]) -> int:
        """Put back every pre-image of ``epoch`` and of later epochs, newest first (later
        entries exist when the checkpoint after ``epoch`` was still being made durable: they
        bring their records back to that checkpoint, ``epoch``'s then to this one); fsync the
        parts. Returns bytes."""
        ents = []
        for k, fd in enumerate(self._fds):
            if fd is not None:
                ents += [(e[0], k, i, e) for i, e in enumerate(self._scan(fd)) if e[0] >= epoch]
        ents.sort(key=lambda x: x[:3])     # by epoch (each file holds one interval), write order
        fds: dict[str, int] = {}
        total = 0
        try:
            for _, k, _, (_, flag, pos, stored, part, off, n) in reversed(ents):
                if part not in fds:
                    fds[part] = os.open(paths[part], os.O_RDWR)
                body = os.pread(self._fds[k], stored, pos)
                if flag == _RECORDS:
                    total += _restore_records(fds[part], body)
                    continue
                if flag == _CLEARED:
                    total += _restore_cleared(fds[part], body)
                    continue
                pwrite_all(fds[part], _decode(flag, body, n), off)
                total += n
            for fd in fds.values():
                os.fsync(fd)
        finally:
            for fd in fds.values():
                os.close(fd)
        return total

    def close(self) -> None:
        for k, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[k] = None
        self.fd = None


def _encode(arr: np.ndarray) -> tuple[int, bytes]:
    """A pre-image as stored: all zero (length only), sparse (non-zero runs), or plain.

    Most bytes a load rewrites were zero at the checkpoint (bin records of bins that get
    their first soundings): only the runs that held data are kept, in ``_BLOCK``-byte
    granules, with short zero gaps folded into the runs.
    """
    n = arr.size
    full = n // _BLOCK * _BLOCK
    mask = arr[:full].reshape(-1, _BLOCK).any(axis=1)
    if full < n:
        mask = np.r_[mask, arr[full:].any()]
    if not mask.any():
        return _ZERO, b""
    d = np.diff(np.r_[False, mask, False].astype(np.int8))
    starts, ends = np.flatnonzero(d == 1), np.flatnonzero(d == -1)
    keep = np.r_[True, starts[1:] - ends[:-1] > _MERGE]
    starts = starts[keep]
    ends = ends[np.r_[keep[1:], True]]
    lo = starts * _BLOCK
    hi = np.minimum(ends * _BLOCK, n)
    kept = int((hi - lo).sum())
    if kept * 10 >= n * 9:
        return 0, arr.tobytes()
    sel = np.zeros(n + 1, dtype=np.int8)
    np.add.at(sel, lo, 1)
    np.add.at(sel, hi, -1)
    table = np.empty(2 * lo.size, dtype="<u4")
    table[0::2] = lo
    table[1::2] = hi - lo
    return _SPARSE, (struct.pack("<I", lo.size) + table.tobytes()
                     + arr[np.cumsum(sel[:n]) > 0].tobytes())


def _restore_records(fd: int, body: bytes) -> int:
    """Write back the records of a ``_RECORDS`` entry; returns the bytes written."""
    (size,) = struct.unpack_from("<I", body)
    pos = 4
    tables = []
    for _ in range(2):
        (k,) = struct.unpack_from("<I", body, pos)
        pos += 4
        tables.append(np.frombuffer(body, dtype="<i8", count=2 * k, offset=pos).reshape(k, 2))
        pos += 16 * k
    total = 0
    for start, count in tables[0].tolist():          # records that were all zero
        pwrite_all(fd, bytes(count * size), start)
        total += count * size
    for start, count in tables[1].tolist():          # records that held data
        pwrite_all(fd, body[pos: pos + count * size], start)
        pos += count * size
        total += count * size
    return total


def _restore_cleared(fd: int, body: bytes) -> int:
    """Clear, in each record of a ``_CLEARED`` entry, every bit from its kept count on;
    returns the bytes written."""
    (size,) = struct.unpack_from("<I", body)
    table = np.frombuffer(body, dtype="<i8", offset=4).reshape(-1, 2)
    total = 0
    for off, keep in table.tolist():
        rec = bytearray(os.pread(fd, size, off))
        if len(rec) != size:
            raise LoadError("the undo log names a record past the end of its file")
        b0 = keep >> 3
        if b0 < size:
            rec[b0] &= (0xFF << (8 - (keep & 7))) & 0xFF
            rec[b0 + 1:] = bytes(size - b0 - 1)
        pwrite_all(fd, rec, off)
        total += size
    return total


def _decode(flag: int, body: bytes, n: int) -> bytes:
    """The pre-image bytes of an entry (see :func:`_encode`)."""
    if flag == _ZERO:
        return bytes(n)
    if flag != _SPARSE:
        return body
    (k,) = struct.unpack_from("<I", body)
    table = np.frombuffer(body, dtype="<u4", count=2 * k, offset=4).astype(np.int64)
    data = np.frombuffer(body, dtype=np.uint8, offset=4 + 8 * k)
    out = np.zeros(n, dtype=np.uint8)
    pos = 0
    for lo, ln in zip(table[0::2].tolist(), table[1::2].tolist()):
        out[lo: lo + ln] = data[pos: pos + ln]
        pos += ln
    return out.tobytes()


# ---------------------------------------------------------------- touched bins
