"""Crash safety of a load: the journal, the undo log, atomic publishing (no Dask here).

A load builds straight into its final names and is marked incomplete until its
final check passes. Beside the PFM parts, ``X.pfm.data/`` holds:

``load.json``
    written once at the start: the command line and the resume command, the
    inputs with size and mtime, the settings, the piece plan.
``journal.json``
    the last checkpoint: epoch, phase, the durable watermark (the next piece
    ``seq`` to write), the sizes of the parts, and the writer's state (per-file
    counts, line trackers). Published atomically (:func:`atomic_write`).
``undo.log``, ``undo.log.b``
    pre-images of the in-place overwrites made since the last checkpoint
    (bin records and chain tail records), each entry fsynced before its
    overwrite is issued (:class:`UndoLog`); while a checkpoint is being made
    durable behind the writer, the next interval's entries go to the other file.
``touched.log``
    the bins that received soundings, each once, appended as int64; the
    checkpoint records its length (:class:`TouchedLog`).
``filter-redo.bin``
    the area filter's result, (record offset, slot, validity) per changed
    sounding: applying it is idempotent.
``lock``
    an ``flock`` held by the process that writes the PFM.

Resume = apply the undo log in reverse, truncate ``.ndx``/``.ctl``/``.lin``
and ``touched.log`` to the checkpoint sizes, restore the writer's state, and
go on from the watermark. docs/reliability.md has the whole story.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import struct
import time
import zlib
from pathlib import Path

import numpy as np

from ._faults import crash_point  # noqa: F401  (re-exported: the journal's crash points)
from ._fileio import pwrite_all
from .errors import ConfigError, LoadError
from .pfm._runs import gather_rows, mark_records, records_needed, rows_nonzero

__all__ = [
    "PHASES",
    "JOURNAL_NAME",
    "atomic_write",
    "fsync_path",
    "fsync_dir",
    "read_journal",
    "read_static",
    "journal_paths",
    "UndoLog",
    "TouchedLog",
    "PfmLock",
    "lock_holder",
    "resume_command",
    "mark_append",
    "config_to_dict",
    "config_from_dict",
    "content_differences",
    "is_disk_full",
    "disk_full_error",
    "crash_point",
]

#: The phases of a load, in order. Only ``complete`` means the PFM is valid.
#: ``append-pending``: an append has marked itself but not yet changed a byte of the PFM.
PHASES = ("append-pending", "loading", "loaded", "area-filter", "filtered", "recompute", "check",
          "complete")

JOURNAL_NAME = "journal.json"
STATIC_NAME = "load.json"
UNDO_NAME = "undo.log"
UNDO_ALT_SUFFIX = ".b"           # the undo log's second file (intervals alternate between the two)
TOUCHED_NAME = "touched.log"
REDO_NAME = "filter-redo.bin"
LOCK_NAME = "lock"
FORMAT = 1

_DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


# ---------------------------------------------------------------- publishing
def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file by name (fsync reaches the file's dirty pages through any descriptor)."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so that a rename or a new name inside it is durable."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data, name=None) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        try:
            n = os.write(fd, mv[done:])
        except OSError as exc:
            if exc.filename is None and name is not None:
                exc.filename = os.fspath(name)
            raise
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        done += n


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: tmp in the same dir, fsync, rename, fsync dir."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            _write_all(fd, data, tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def journal_paths(pfm_path: str | os.PathLike) -> dict:
    """The journal's files for the PFM whose handle is ``pfm_path``."""
    data = Path(os.fspath(pfm_path) + ".data")
    return {"data": data, "journal": data / JOURNAL_NAME, "static": data / STATIC_NAME,
            "undo": data / UNDO_NAME, "undo_alt": data / (UNDO_NAME + UNDO_ALT_SUFFIX),
            "touched": data / TOUCHED_NAME,
            "redo": data / REDO_NAME, "lock": data / LOCK_NAME}


def _read_json(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise LoadError(f"cannot read the load journal: {err.strerror}", path=path) from err
    try:
        out = json.loads(raw)
    except ValueError as err:
        raise LoadError(f"the load journal is not valid JSON ({err})", path=path) from err
    if not isinstance(out, dict) or out.get("format") != FORMAT:
        raise LoadError("the load journal has an unknown format", path=path)
    return out


def read_journal(pfm_path: str | os.PathLike) -> dict | None:
    """The last checkpoint of the load that writes ``pfm_path``, or None if it has no journal."""
    return _read_json(journal_paths(pfm_path)["journal"])


def read_static(pfm_path: str | os.PathLike) -> dict | None:
    """The load's ``load.json`` (command, inputs, settings, plan), or None."""
    return _read_json(journal_paths(pfm_path)["static"])


def mark_append(pfm_path: str | os.PathLike, given: list[str], cfg: dict,
                resume_cmd: str) -> None:
    """Record, before an append changes anything, that it is under way (phase
    ``append-pending``): a resume then finishes it instead of finding a complete PFM.

    The previous checkpoint's epoch and result are kept; the PFM's own parts are untouched
    until the writer's first checkpoint replaces this state.
    """
    paths = journal_paths(pfm_path)
    try:
        old = read_journal(pfm_path) or {}
    except LoadError:
        old = {}
    state = {**old, "format": FORMAT, "phase": "append-pending",
             "pending_append": {"given": list(given), "cfg": cfg},
             "resume_command": resume_cmd, "time": time.time()}
    state.setdefault("epoch", 0)
    atomic_write(paths["journal"], json.dumps(state).encode())


# ---------------------------------------------------------------- undo log
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
        keep = self.needed(part, off, size) if need is None else need
        nk = int(np.count_nonzero(keep))
        if not nk:
            self.seconds += time.perf_counter() - t0
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
        keep = self.needed(part, off, size) if need is None else need
        nk = int(np.count_nonzero(keep))
        if not nk:
            self.seconds += time.perf_counter() - t0
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
class TouchedLog:
    """The bins that received soundings, each appended once (int64), durable at checkpoints."""

    def __init__(self, path: str | os.PathLike, *, size: int | None = None):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if size is not None:
            os.ftruncate(self.fd, int(size))
        self.size = os.fstat(self.fd).st_size
        self.seconds = 0.0

    def read(self) -> np.ndarray:
        n = self.size // 8
        raw = os.pread(self.fd, n * 8, 0)
        return np.frombuffer(raw, dtype="<i8").astype(np.int64)

    def append(self, bins: np.ndarray) -> None:
        if bins.size == 0:
            return
        t0 = time.perf_counter()
        data = np.ascontiguousarray(bins, dtype="<i8").tobytes()
        pwrite_all(self.fd, data, self.size)
        self.size += len(data)
        self.seconds += time.perf_counter() - t0

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---------------------------------------------------------------- lock
def _try_flock(fd: int, op: int) -> bool:
    """``flock(fd, op | LOCK_NB)``: True when taken, False when another process holds it."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it (``pid N on HOST``), or ``unknown``."""
    return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"


class PfmLock:
    """An exclusive ``flock`` on ``X.pfm.data/lock``: one writer per PFM at a time.

    A writer whose process died releases it at once (the kernel drops the lock);
    a writer still running (an orphaned worker finishing a write) is waited for
    up to ``wait`` seconds, then the resume is refused.
    """

    def __init__(self, path: str | os.PathLike, *, wait: float = 60.0):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.time() + wait
        while not _try_flock(self.fd, fcntl.LOCK_EX):
            if time.time() >= deadline:
                holder = _holder(self.fd)
                os.close(self.fd)
                raise LoadError(f"another process is writing this PFM ({holder}); "
                                "wait for it to end, or stop it, then try again", path=self.path)
            time.sleep(0.2)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


def lock_holder(pfm_path: str | os.PathLike) -> str | None:
    """Who holds the PFM's lock now (``pid N on HOST``, or ``unknown``): a load is writing it;
    None when no one does. Looks only: never creates the lock file, never keeps the lock."""
    try:
        fd = os.open(journal_paths(pfm_path)["lock"], os.O_RDONLY)
    except OSError:
        return None
    try:
        if not _try_flock(fd, fcntl.LOCK_SH):
            return _holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def remove_scratch(pfm_path: str | os.PathLike) -> bool:
    """Delete a finished load's scratch files (undo, touched, redo, lock) if no one holds the
    lock; a load killed right after it was marked complete leaves them. True if removed."""
    paths = journal_paths(pfm_path)
    if not paths["lock"].exists():
        return False
    try:
        lock = PfmLock(paths["lock"], wait=0.0)
    except LoadError:
        return False
    try:
        for key in ("undo", "undo_alt", "touched", "redo"):
            try:
                os.unlink(paths[key])
            except OSError:
                pass
        os.unlink(paths["lock"])
    finally:
        lock.release()
    return True


# ---------------------------------------------------------------- helpers
def resume_command(output: str | os.PathLike, options: list[str] | None = None) -> str:
    """The command that continues the load writing ``output``, valid from any directory.

    Inputs and content settings are left out: a resume takes them from the journal.
    ``options`` are the run options to keep (``--workers 4``, ``--scheduler ADDR``), with
    any path in them already absolute.
    """
    return shlex.join(["pfm-dask", "load", "-o", os.path.abspath(os.fspath(output)),
                       *(options or []), "--resume"])


def config_to_dict(cfg) -> dict:
    """A :class:`~pfm_dask.config.LoadConfig` as plain JSON values."""
    return json.loads(json.dumps(cfg.to_dict()))


def config_from_dict(d: dict):
    """The inverse of :func:`config_to_dict` (:meth:`~pfm_dask.config.LoadConfig.from_dict`)."""
    from .config import LoadConfig

    return LoadConfig.from_dict(d)


def content_differences(a: dict, b: dict) -> list[str]:
    """Names of the settings that decide the content and differ between two config dicts
    (the fields whose metadata says ``content``: pfm_dask.config)."""
    from .config import LoadConfig

    return LoadConfig.content_differences(a, b)


def is_disk_full(err: BaseException) -> bool:
    """True for the out-of-space errors: ENOSPC, EFBIG (file size limit), EDQUOT."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            return True
        err = err.__cause__ or err.__context__
    return False


def disk_full_error(err: BaseException, where: str | os.PathLike, resume: str) -> LoadError:
    """The user's message for a full disk: which file, why, and how to continue."""
    e = err
    while e is not None and not (isinstance(e, OSError) and e.errno in _DISK_FULL):
        e = e.__cause__ or e.__context__
    name = getattr(e, "filename", None) or os.fspath(where)
    why = {errno.EFBIG: "the file size limit was reached (disk full for this process)",
           errno.EDQUOT: "the disk quota is exhausted"}.get(getattr(e, "errno", None),
                                                            "the disk is full")
    return LoadError(f"writing failed: {why} ({getattr(e, 'strerror', None) or e}). The PFM is "
                     f"incomplete and marked so; make room, then continue with: {resume}",
                     path=name)


def check_inputs(static: dict) -> list[str]:
    """Inputs of a journaled load that changed since it started (vanished files are allowed)."""
    changed = []
    for rec in static.get("inputs", []):
        try:
            st = os.stat(rec["path"])
        except OSError:
            continue
        if rec.get("size") is None:
            continue
        if st.st_size != rec["size"] or st.st_mtime_ns != rec["mtime_ns"]:
            changed.append(rec["path"])
    return changed


def input_record(path: str) -> dict:
    """Size and mtime of an input, to notice on resume that it changed."""
    try:
        st = os.stat(path)
        return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    except OSError:
        return {"path": str(path), "size": None, "mtime_ns": None}


def no_journal_error(output) -> ConfigError:
    return ConfigError("this PFM has no load journal to resume (it was not written by pfm-dask, "
                       "or its load died before its first checkpoint); nothing was changed. To "
                       "add files to it use --append; to start again, remove it yourself",
                       path=output)
