"""GSF record framing: walk the size words from byte 0 and list every record.

A GSF file has no index and no sync marker, so record boundaries are found by
reading each 8-byte record header (size, id word) and jumping over the data;
12 bytes when bit 31 of the id word says a checksum follows. A numba kernel
(``_kernels._k_frame``) steps from record to record, or with ``fast=False`` a Python
loop with the same rules (:func:`_frame_plain`: no numba import, for ``gsf-info``);
records with a checksum word and every kind of damage are handled here in Python.
Damage (truncation, absurd sizes, bad checksums, a missing header record)
stops the walk; what was found before it is kept and the damage is returned.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import GsfError
from ._kernels import kernel
from ._records import (MAX_RECORD_SIZE, MIN_RECORD_SIZE, RECORD_NAMES, REC_HEADER,
                       REC_SWATH_PING)

__all__ = ["Framing", "scan_records", "record_name"]

_CHECKSUM_FLAG = 0x8000_0000
_ID_MASK = 0x003F_FFFF
_VERSION_RE = re.compile(rb"GSF-v(\d+)\.(\d+)")
_HEADER = struct.Struct(">II")     # a record header: data size, id word


def record_name(record_id: int) -> str:
    """Name of a record id, ``UNKNOWN_<id>`` for ids libgsf does not know."""
    return RECORD_NAMES.get(int(record_id), f"UNKNOWN_{int(record_id)}")


@dataclass
class Framing:
    """Every sound record of a file, in file order, plus what stopped the walk.

    ``offsets`` are the byte offsets of the record headers, ``data_offsets`` of
    the data parts (after the 8 or 12 framing bytes), ``sizes`` the data sizes
    (padding included), ``ids`` the record ids. ``end`` is the byte offset where
    the walk stopped: the file size when the framing is sound.
    """

    offsets: np.ndarray
    data_offsets: np.ndarray
    sizes: np.ndarray
    ids: np.ndarray
    version: str | None
    major: int | None
    minor: int | None
    end: int
    damage: list = field(default_factory=list)

    @property
    def ping_index(self) -> np.ndarray:
        """Positions (in the record lists) of the swath bathymetry ping records."""
        return np.flatnonzero(self.ids == REC_SWATH_PING)

    def record_counts(self) -> dict:
        """Record name -> count, in order of record id."""
        uniq, counts = np.unique(self.ids, return_counts=True)
        return {record_name(i): int(c) for i, c in zip(uniq, counts)}


def _parse_header(buf, data_off: int, size: int, path) -> tuple[str, int, int]:
    """Version string and (major, minor) from the HEADER record's data."""
    raw = bytes(buf[data_off:data_off + min(size, 64)])
    text = raw.split(b"\0", 1)[0]
    m = _VERSION_RE.match(text)
    if m is None:
        raise GsfError(f"not a GSF file: header record holds {text[:16]!r}, "
                       "expected 'GSF-vNN.NN'", path=path, offset=data_off)
    return text.decode("ascii", "replace"), int(m.group(1)), int(m.group(2))


#: records listed by one step of a walk that reports its progress (``scan_records(walked=)``)
_WALKED_EVERY = 512


def scan_records(buf, path=None, *, fast: bool = True, walked=None) -> Framing:
    """Walk the record framing of a whole GSF file held in ``buf`` (bytes or mmap).

    Never raises on bad bytes: the first problem found ends the walk and is returned
    in ``Framing.damage`` (a list of one :class:`GsfError`, or empty). A file whose
    first record is not a GSF header is reported the same way, with no records.
    ``fast=False`` steps with :func:`_frame_plain` instead of the numba kernel (the same
    records: a few hundred thousand at most in a file, about 0.4 us each).
    ``walked(pos)``, when given, is told every few hundred records that the walk is past byte
    ``pos``: a caller holding ``buf`` mapped may then drop the pages behind it, so that the walk
    does not hold all of a large file at once.
    """
    n = len(buf)
    offs: list[int] = []
    sizes: list[int] = []
    ids: list[int] = []
    damage: list[GsfError] = []
    checksummed: list[int] = []   # positions (in offs) of records with a checksum word
    version = major = minor = None

    unpack = struct.Struct(">II").unpack_from

    # The first record must be the HEADER, and it must say GSF-vNN.NN.
    if n < 8:
        damage.append(GsfError(
            f"not a GSF file: {n} byte(s), shorter than one record header",
            path=path, offset=0))
        return _framing(offs, sizes, ids, version, major, minor, 0, damage, [])
    size0, word0 = unpack(buf, 0)
    hdr0 = 12 if word0 & _CHECKSUM_FLAG else 8
    if (word0 & _ID_MASK) != REC_HEADER or not (MIN_RECORD_SIZE <= size0 <= 4096) \
            or hdr0 + size0 > n:
        damage.append(GsfError(
            "not a GSF file: does not start with a GSF header record "
            f"(size word {size0:#010x}, id word {word0:#010x})", path=path, offset=0))
        return _framing(offs, sizes, ids, version, major, minor, 0, damage, [])
    try:
        version, major, minor = _parse_header(buf, hdr0, size0, path)
    except GsfError as err:
        damage.append(err)
        return _framing(offs, sizes, ids, None, None, None, 0, damage, [])

    # The walk: a kernel lists the plain records; a record with a checksum word is
    # checked here, and damage is described here, after which the kernel resumes.
    u8 = np.frombuffer(buf, dtype=np.uint8)
    k_frame = kernel("frame") if fast else _frame_plain
    chunks: list = []       # (offsets, sizes, ids) arrays, in file order
    listed = 0              # records in chunks
    cap = min(n // (8 + MIN_RECORD_SIZE) + 1, 1 << 16 if walked is None else _WALKED_EVERY)
    state = np.zeros(2, dtype=np.int64)
    pos = 0
    while True:
        offs = np.empty(cap, np.int64)
        sizes = np.empty(cap, np.int64)
        ids = np.empty(cap, np.int32)
        code = k_frame(u8, pos, offs, sizes, ids, state)
        k, pos = int(state[0]), int(state[1])
        if k:
            chunks.append((offs[:k], sizes[:k], ids[:k]))
            listed += k
        if code == 1:
            if walked is None:
                cap = min(cap * 4, 1 << 22)
            else:
                walked(pos)
            continue
        if code == 0:
            if pos < n:
                damage.append(GsfError(
                    f"file ends inside a record header: {n - pos} byte(s) left, "
                    "a record header needs 8 (truncated file?)", path=path, offset=pos))
            break
        size, word = unpack(buf, pos)
        if not word & _CHECKSUM_FLAG:
            damage.append(_size_error(pos, size, word, 8, n, path))
            break
        err = _check_checksummed(buf, pos, size, word, n, path)
        if err is not None:
            damage.append(err)
            break
        checksummed.append(listed)
        chunks.append((np.array([pos], np.int64), np.array([size], np.int64),
                       np.array([word & _ID_MASK], np.int32)))
        listed += 1
        pos += 12 + size
    del u8
    offs = np.concatenate([c[0] for c in chunks]) if chunks else np.zeros(0, np.int64)
    sizes = np.concatenate([c[1] for c in chunks]) if chunks else np.zeros(0, np.int64)
    ids = np.concatenate([c[2] for c in chunks]) if chunks else np.zeros(0, np.int32)
    return _framing(offs, sizes, ids, version, major, minor, pos, damage, checksummed)


def _frame_plain(u8, pos, offs, sizes, ids, state):
    """``_kernels._k_frame`` in Python, with the same arguments, rules and return codes: list
    the plain records from byte ``pos`` on into ``offs``, ``sizes``, ``ids``."""
    buf = u8.data
    n, cap = len(buf), len(offs)
    unpack = _HEADER.unpack_from
    o, s, i = [], [], []
    code = 0
    while pos + 8 <= n:
        if len(o) == cap:
            code = 1
            break
        size, word = unpack(buf, pos)
        if word & _CHECKSUM_FLAG or size > MAX_RECORD_SIZE or size < MIN_RECORD_SIZE \
                or pos + 8 + size > n:
            code = 2
            break
        o.append(pos)
        s.append(size)
        i.append(word & _ID_MASK)
        pos += 8 + size
    k = len(o)
    offs[:k], sizes[:k], ids[:k] = o, s, i
    state[0], state[1] = k, pos
    return code


def _size_error(pos, size, word, hdr, n, path) -> GsfError:
    rid = word & _ID_MASK
    what = f"record id {rid} ({record_name(rid)})"
    if size > MAX_RECORD_SIZE:
        msg = (f"{what} declares {size:,} data bytes, more than the "
               f"{MAX_RECORD_SIZE:,} a GSF record may hold (corrupt size word?)")
    elif size < MIN_RECORD_SIZE:
        msg = (f"{what} declares {size} data bytes; a GSF record holds more than "
               f"{MIN_RECORD_SIZE - 1} (corrupt size word?)")
    else:
        msg = (f"{what} declares {size:,} data bytes but only "
               f"{max(n - pos - hdr, 0):,} remain (truncated file?)")
    return GsfError(msg, path=path, offset=pos)


def _check_checksummed(buf, pos, size, word, n, path) -> GsfError | None:
    """Validate a record whose id word has the checksum flag (bit 31) set."""
    if size > MAX_RECORD_SIZE or size < MIN_RECORD_SIZE or pos + 12 + size > n:
        return _size_error(pos, size, word, 12, n, path)
    (stored,) = struct.unpack_from(">I", buf, pos + 8)
    data = np.frombuffer(buf, dtype=np.uint8, count=size, offset=pos + 12)
    actual = int(data.sum(dtype=np.uint64)) & 0xFFFF_FFFF
    del data
    if actual != stored:
        rid = word & _ID_MASK
        return GsfError(
            f"record id {rid} ({record_name(rid)}) fails its checksum: stored "
            f"{stored:#010x}, sum of its {size:,} data bytes is {actual:#010x}",
            path=path, offset=pos)
    return None


def _framing(offs, sizes, ids, version, major, minor, end, damage, checksummed) -> Framing:
    offsets = np.asarray(offs, dtype=np.int64)
    size_arr = np.asarray(sizes, dtype=np.int64)
    id_arr = np.asarray(ids, dtype=np.int32)
    data_offsets = offsets + 8
    if checksummed:
        data_offsets[np.asarray(checksummed, dtype=np.int64)] += 4
    return Framing(offsets=offsets, data_offsets=data_offsets,
                   sizes=size_arr, ids=id_arr, version=version, major=major,
                   minor=minor, end=end, damage=damage)
