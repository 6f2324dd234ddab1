"""Public GSF reading API: :class:`GsfFile`, :func:`read_pings`, :func:`iter_batches`
(:func:`~pfm_dask.gsf.info`, the summary, is in ``_summary``).

Soundings come out as Arrow tables with :data:`SOUNDING_SCHEMA`: one row per beam of
every ping, in file order. ``ping`` is the 1-based number of the ping record among
the file's ping records and ``beam`` the beam index + 1: exactly the ping and beam
numbers NAVO's pfmLoader stores in a PFM (it reads pings by GSF record number
through the libgsf index, ``load_file.cpp``), so a sounding can be traced back to
its GSF record.

Bad bytes never raise anything but :class:`~pfm_dask.errors.GsfError`. With
``strict=True`` (default) the first damage raises; with ``strict=False`` every ping
before the damage is returned and the damage is listed in :attr:`GsfFile.damage`.
"""

from __future__ import annotations

import bisect
import threading
import zlib
from collections import OrderedDict
from dataclasses import fields
import mmap
import os
import struct
from typing import Iterator

import numpy as np
import pyarrow as pa

from .._fileio import close_map
from ..errors import GsfError
from . import _decode
from ._decode import (HeadersAlong, NeedHistory, PingDirectory, ScaleState, decode_pings,
                      ping_headers_at, walk_ping, walk_pings, walk_pings_in_runs)
from ._framing import scan_records
from ._records import ping_header_dtype
from ._summary import (PagesBehind, add_damage, check_mapped_size, map_file, summarize,
                       unmap_pages)

__all__ = ["SOUNDING_SCHEMA", "GsfFile", "read_pings", "iter_batches"]


def _f(name, typ, units, doc, nullable=False):
    return pa.field(name, typ, nullable=nullable,
                    metadata={"units": units, "description": doc})


#: One row per beam. Units in each field's metadata (``units``, ``description``).
SOUNDING_SCHEMA = pa.schema([
    _f("ping", pa.uint32(), "1",
       "1-based number of the ping record among the file's ping records (PFM ping number)"),
    _f("beam", pa.uint16(), "1", "beam index + 1; 1 = outermost port beam (PFM beam number)"),
    _f("time", pa.float64(), "s", "ping time, POSIX seconds UTC (float: sub-microsecond loss, P12)"),
    _f("time_sec", pa.int64(), "s", "ping time, whole POSIX seconds UTC (exact)"),
    _f("time_nsec", pa.int32(), "ns", "ping time, nanoseconds of the second (exact)"),
    _f("latitude", pa.float64(), "degree", "ping latitude, WGS-84, + north"),
    _f("longitude", pa.float64(), "degree", "ping longitude, WGS-84, + east"),
    _f("heading", pa.float64(), "degree", "ship heading, true, 0-360"),
    _f("depth", pa.float64(), "m",
       "depth, positive down, tide and draft correctors applied; null if the ping has none",
       True),
    _f("across_track", pa.float64(), "m", "across-track distance, + starboard", True),
    _f("along_track", pa.float64(), "m", "along-track distance, + forward", True),
    _f("nominal_depth", pa.float64(), "m", "depth at 1500 m/s, positive down", True),
    _f("beam_flags", pa.uint8(), "1",
       "GSF beam flags, raw (bit 0 = ignore); null when the ping has no beam-flags array", True),
    _f("ping_flags", pa.uint16(), "1", "GSF ping flags, raw (bit 0 = ignore ping)"),
    _f("horizontal_error", pa.float64(), "m", "horizontal error, 95 %", True),
    _f("vertical_error", pa.float64(), "m", "vertical error, 95 %", True),
], metadata={"source": "GSF swath bathymetry ping records (pfm_dask.gsf)"})

_CHECKPOINT_EVERY = 256     # keep the scale-factor state every so many pings walked


class _BackResolver:
    """Finds the scale-factor state in force before ping ``start`` by walking back.

    Tables are merged entry by entry, so an entry's value is the one in the latest
    table before ``start`` that lists it; walking backwards, the first table found
    listing an id gives it. Usually that is the previous ping or the one before;
    after ``BUDGET`` pings it gives up (:class:`NeedHistory`).
    """

    #: Pings walked back (in Python) before giving up: then the reader walks forward from
    #: the nearest known state with its kernel, about 1.6 us a ping, where 8 pings walked
    #: back cost about as much as 400 walked forward.
    BUDGET = 8

    def __init__(self, f: "GsfFile", start: int):
        self.f = f
        self.start = start
        self.j = start             # next ping to examine is j - 1
        self.tables: dict = {}     # id -> (mult, offset, low nibble)
        self.highs: dict = {}      # id -> high nibble (last width event)

    def _step(self) -> bool:
        if self.j <= 0:
            return False
        if self.start - self.j >= self.BUDGET:
            raise NeedHistory(self.j)
        self.j -= 1
        f = self.f
        scratch = ScaleState(fill=None, resolver=None)
        try:
            walk_ping(f._buf, int(f._pdata[self.j]), int(f._psize[self.j]), f._hdr_len,
                      scratch, False, f.path, int(f.ping_offsets[self.j]), set())
        except (GsfError, struct.error, IndexError, ValueError, OverflowError):
            raise NeedHistory(self.j)
        for sid in range(len(scratch.mult)):
            if scratch.mult[sid] is not None and sid not in self.tables:
                self.tables[sid] = (scratch.mult[sid], scratch.offset[sid], scratch.low[sid])
            if scratch.high[sid] is not None and sid not in self.highs:
                self.highs[sid] = scratch.high[sid]
        return True

    def table(self, sid):
        while sid not in self.tables:
            if not self._step():
                return (0, 0, 0)    # never defined before: libgsf's zeroed table
        return self.tables[sid]

    def high(self, sid):
        while sid not in self.highs:
            if not self._step():
                return 0
        return self.highs[sid]


class GsfFile:
    """An open GSF file: framing scanned on open, pings decoded on demand.

    Attributes: ``path``, ``size`` (bytes), ``version`` (e.g. ``"GSF-v03.07"``),
    ``major``, ``minor``, ``record_counts`` (record name -> count), ``n_pings``,
    ``ping_offsets`` (int64 byte offsets of the ping records), ``damage`` (list of
    :class:`GsfError`, empty when the file is sound).

    Reading may start at any ping: the scale-factor state in force there is
    rebuilt by walking back only as far as the latest tables that define it.
    ``remember=True``: take the framing and the scale-factor states from the last
    ``GsfFile(remember=True)`` of the same unchanged file in this process, and leave
    them for the next (a load's task opens a file once per piece).
    """

    def __init__(self, path, *, strict: bool = True, remember: bool = False):
        self.path = os.fspath(path)
        self.strict = bool(strict)
        self._identity = None
        self._closed = False
        self._mm = None
        self._buf = b""
        self._u8 = np.zeros(0, dtype=np.uint8)
        self.size, self._mm, st = map_file(self.path)
        self._behind = PagesBehind(self._mm)   # what long passes have gone by, unmapped
        if self._mm is not None:
            self._buf = self._mm
            self._u8 = np.frombuffer(self._mm, dtype=np.uint8)
            if remember:
                self._identity = _identity(st, self._u8)
        self._check_size()
        known = _recall(self._identity)
        fr = (known.framing if known is not None
              else scan_records(self._buf, self.path, walked=self._behind.walked))
        if fr.damage and self.strict:
            self.close()
            raise fr.damage[0]
        self.damage: list = list(fr.damage)
        self.version = fr.version
        self.major = fr.major
        self.minor = fr.minor
        self.record_counts = fr.record_counts()
        pidx = fr.ping_index
        self.ping_offsets = fr.offsets[pidx]
        self._pdata = fr.data_offsets[pidx]
        self._psize = fr.sizes[pidx]
        self.n_pings = int(len(pidx))
        self._hdr_dtype = ping_header_dtype(self.major or 3)
        self._hdr_len = self._hdr_dtype.itemsize
        self._framing = fr
        # Known scale-factor states: ping index -> state before that ping.
        self._states: dict = {0: ScaleState(fill=0)}
        self._state_keys: list = [0]       # sorted keys of _states
        self._complete_keys: list = [0]    # ... of those that need no resolver
        self._bad_ping: int | None = None   # first ping found damaged (lenient)
        self._seen: set = set()             # subrecord ids met while walking
        # Start pings at most this far past a known state are reached by walking
        # forward; further ones by walking back (tests set 0 to force the latter).
        self._forward_limit = _CHECKPOINT_EVERY
        for k, st in (known.states.items() if known is not None else ()):
            self._remember(k, st)

    # --- context manager / lifetime ---------------------------------------------------

    def close(self) -> None:
        """Release the memory map. Tables already returned stay valid."""
        if self._identity is not None and not self._closed and hasattr(self, "_states"):
            _keep(self._identity, self._framing,
                  {k: st for k, st in self._states.items() if st.resolver is None})
        self._closed = True
        self._u8 = np.zeros(0, dtype=np.uint8)
        self._buf = b""
        close_map(self._mm)
        self._mm = None

    def _drop_pages(self, lo: int, hi: int) -> bool:
        """Unmap this process's pages of bytes ``[lo, hi)`` of the file (both on page bounds;
        the page cache keeps them, a later read maps them again); False where nothing was."""
        return unmap_pages(self._mm, lo, hi)

    def forget(self, start: int, stop: int) -> None:
        """Unmap this process's pages of pings ``[start, stop)`` (0-based; ``stop`` = ``n_pings``:
        to the end of the file): a reader going through a large file in chunks then holds the
        chunk's pages, not all it has read, nor all the framing's scan read (they stay in the
        page cache; a later read maps them again). Pages partly outside the range are kept."""
        start, stop = max(0, int(start)), min(int(stop), self.n_pings)
        if start >= stop:
            return
        page = mmap.PAGESIZE
        lo = -(-(int(self.ping_offsets[start]) if start else 0) // page) * page
        hi = self.size if stop == self.n_pings else int(self.ping_offsets[stop]) // page * page
        self._drop_pages(lo, hi)

    def __enter__(self) -> "GsfFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GsfFile({self.path!r}, version={self.version!r}, "
                f"n_pings={self.n_pings}, damage={len(self.damage)})")

    # --- scale-factor state -----------------------------------------------------------

    def _remember(self, k: int, st: ScaleState) -> None:
        if k not in self._states or (st.resolver is None
                                     and self._states[k].resolver is not None):
            if k not in self._states:
                bisect.insort(self._state_keys, k)
            self._states[k] = st.copy()
            if st.resolver is None:
                bisect.insort(self._complete_keys, k)

    def _note_damage(self, err: GsfError, ping: int) -> None:
        if self._bad_ping is None or ping < self._bad_ping:
            self._bad_ping = ping
        add_damage(self.damage, err)

    def _state_at(self, start: int) -> ScaleState | None:
        """The scale-factor state before ping ``start``; None if damage lies before it."""
        if start in self._states:
            return self._states[start].copy()
        k = self._state_keys[bisect.bisect_right(self._state_keys, start) - 1]
        if start - k <= self._forward_limit:
            # A known state is close: walk forward from it (exact in every case).
            return self._walk_forward(k, start)
        # Otherwise resolve lazily, walking back from start only as far as needed.
        return ScaleState(fill=None, resolver=_BackResolver(self, start))

    def _walk_forward_to(self, start: int) -> ScaleState | None:
        """Exact state before ``start`` from the nearest state that needs no resolver."""
        k = self._complete_keys[bisect.bisect_right(self._complete_keys, start) - 1]
        return self._walk_forward(k, start)

    def _walk_forward(self, k: int, start: int) -> ScaleState | None:
        self._check_size()
        st = self._states[k].copy()
        mapped = int(self.ping_offsets[k]) if k < self.n_pings else self.size
        while k < start:
            stop = min(start, k + _CHECKPOINT_EVERY)
            dirn, dmg = walk_pings(self._buf, self._pdata[k:stop], self._psize[k:stop],
                                   self.ping_offsets[k:stop], self._hdr_len, st,
                                   self.path, strict=self.strict, seen=self._seen,
                                   u8=self._u8)
            if dmg is not None:
                self._note_damage(dmg, k + len(dirn))
                return None
            k = stop
            self._remember(k, st)
            at = int(self.ping_offsets[k]) if k < self.n_pings else self.size
            if at - mapped > _decode.PASS_WINDOW:   # a long way to ``start``: pages not needed
                self._behind.passed(mapped, at)
                mapped = at
        return st

    # --- reading ----------------------------------------------------------------------

    def _range(self, start_ping, stop_ping) -> tuple[int, int]:
        start = 0 if start_ping is None else int(start_ping)
        stop = self.n_pings if stop_ping is None else int(stop_ping)
        if start < 0:
            start = max(self.n_pings + start, 0)
        if stop < 0:
            stop = max(self.n_pings + stop, 0)
        stop = min(stop, self.n_pings)
        start = min(start, stop)
        return start, stop

    def _check_size(self) -> None:
        """Raise a truncation :class:`GsfError` if the file shrank since it was mapped
        (:func:`~pfm_dask.gsf._summary.check_mapped_size`: a SIGBUS otherwise). A shrink
        within a walk or decode itself is not caught."""
        check_mapped_size(self._mm, self.size, self.path)

    def _walk(self, start: int, stop: int, passed=None) -> tuple[PingDirectory, int]:
        """Directory of pings [start, stop) (shortened by damage in lenient mode); ``passed``
        as in :func:`~pfm_dask.gsf._decode.walk_pings_in_runs` (default: unmap the pages)."""
        if self._closed:
            raise ValueError(f"GsfFile {self.path!r} is closed")
        self._check_size()
        if self._bad_ping is not None:
            stop = min(stop, self._bad_ping)
            start = min(start, stop)
        empty = walk_pings(self._buf, self._pdata[:0], self._psize[:0],
                           self.ping_offsets[:0], self._hdr_len, ScaleState(), self.path,
                           u8=self._u8)[0]
        if start >= stop:
            return empty, start
        try:
            st = self._state_at(start)
        except NeedHistory:
            st = self._walk_forward_to(start)
        if st is None:
            return empty, start
        try:
            dirn, dmg = self._walk_runs(start, stop, st, passed)
        except NeedHistory:
            st = self._walk_forward_to(start)
            if st is None:
                return empty, start
            dirn, dmg = self._walk_runs(start, stop, st, passed)
        if dmg is not None:
            self._note_damage(dmg, start + len(dirn))
        else:
            # Entries still None were not touched in [start, stop): the resolver for
            # ``start`` answers for them at ``stop`` too, so the state can be kept.
            self._remember(stop, st)
        return dirn, start

    def _walk_runs(self, start: int, stop: int, st: ScaleState, passed=None):
        """:func:`walk_pings` over pings [start, stop) from state ``st``, unmapping the pages
        it has gone by on a long walk (:func:`~pfm_dask.gsf._decode.walk_pings_in_runs`)."""
        return walk_pings_in_runs(self._buf, self._pdata[start:stop], self._psize[start:stop],
                                  self.ping_offsets[start:stop], self._hdr_len, st, self.path,
                                  passed=passed or self._behind.passed, strict=self.strict,
                                  seen=self._seen, u8=self._u8)

    def _columns(self, start: int, stop: int, select: np.ndarray | None = None,
                 per_ping: bool = False, passed=None) -> dict:
        """The numpy columns of pings [start, stop) (or of the ``select`` ones among them)."""
        dirn, start = self._walk(start, stop, passed)
        numbers = np.arange(start + 1, start + 1 + len(dirn), dtype=np.uint32)
        if select is not None:          # only these pings (0-based indices) of the walked run
            rows = np.asarray(select, dtype=np.int64) - start
            rows = rows[(rows >= 0) & (rows < len(dirn))]
            dirn = PingDirectory(*(getattr(dirn, f.name)[rows] for f in fields(PingDirectory)))
            numbers = numbers[rows]
        self._check_size()
        try:
            cols = decode_pings(self._u8, dirn, per_ping)
        except (ValueError, IndexError, TypeError) as err:  # pragma: no cover - guarded above
            raise GsfError(f"cannot decode pings {start + 1}..{start + len(dirn)}: {err}",
                           path=self.path) from err
        cols["ping"] = np.repeat(numbers, dirn.n_beams)
        if per_ping:
            cols["n_beams"] = np.asarray(dirn.n_beams, dtype=np.int64)
        return cols

    def _batch(self, start: int, stop: int, select: np.ndarray | None = None) -> pa.RecordBatch:
        cols = self._columns(start, stop, select)
        valid = cols.pop("_valid")
        arrays = []
        for field in SOUNDING_SCHEMA:
            v = cols[field.name]
            if field.name in valid:
                arrays.append(pa.array(v, type=field.type, mask=~valid[field.name]))
            else:
                arrays.append(pa.array(v, type=field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=SOUNDING_SCHEMA)

    def read(self, start_ping: int = 0, stop_ping: int | None = None) -> pa.Table:
        """Soundings of pings [start_ping, stop_ping) (0-based ping indices) as a table."""
        start, stop = self._range(start_ping, stop_ping)
        batch = self._batch(start, stop)
        return pa.Table.from_batches([batch], schema=SOUNDING_SCHEMA)

    def read_columns(self, start_ping: int = 0, stop_ping: int | None = None, *,
                     per_ping: bool = False) -> dict:
        """The soundings of :meth:`read` as numpy arrays, without Arrow (a load's task).

        One array per :data:`SOUNDING_SCHEMA` field, of that field's type, and ``"_valid"``:
        for each nullable column that some ping lacks, a boolean mask of the rows that hold a
        value (a column not listed there has a value in every row). The values in null rows
        are unspecified. ``per_ping``: the ping-header columns (``time``, ``time_sec``,
        ``time_nsec``, ``latitude``, ``longitude``, ``heading``, ``ping_flags``) hold one value
        per ping, and ``"n_beams"`` each ping's beam count. The arrays may share one recycled
        allocation: they stay valid as long as they are referenced."""
        start, stop = self._range(start_ping, stop_ping)
        return self._columns(start, stop, per_ping=per_ping)

    def read_at(self, pings) -> pa.Table:
        """Soundings of the given pings (0-based indices, sorted, unique) as one table.

        The pings between them are walked for their scale factors but not decoded: a
        sample of pings spread over a file costs one pass over its ping headers.
        Pings past damage (lenient mode) or past the end are left out.
        """
        idx = self._picks(pings)
        if not idx.size:
            return pa.Table.from_batches([], schema=SOUNDING_SCHEMA)
        batch = self._batch(int(idx[0]), int(idx[-1]) + 1, select=idx)
        return pa.Table.from_batches([batch], schema=SOUNDING_SCHEMA)

    def read_columns_at(self, pings) -> dict:
        """The soundings of :meth:`read_at` as numpy arrays, as :meth:`read_columns` gives them."""
        idx = self._picks(pings)
        if not idx.size:
            return self._columns(0, 0)
        return self._columns(int(idx[0]), int(idx[-1]) + 1, select=idx)

    def _picks(self, pings) -> np.ndarray:
        """The ping indices of :meth:`read_at` (checked) that the file has."""
        idx = np.asarray(pings, dtype=np.int64).ravel()
        if idx.size and (np.any(np.diff(idx) <= 0) or idx[0] < 0):
            raise ValueError("pings must be sorted, unique and >= 0")
        return idx[idx < self.n_pings]

    def iter_batches(self, max_pings: int = 1000, start_ping: int = 0,
                     stop_ping: int | None = None) -> Iterator[pa.RecordBatch]:
        """Soundings in record batches of at most ``max_pings`` pings each, in file order."""
        if int(max_pings) < 1:
            raise ValueError(f"max_pings must be >= 1, got {max_pings}")
        start, stop = self._range(start_ping, stop_ping)
        k = start
        while k < stop:
            if self._bad_ping is not None and k >= self._bad_ping:
                return
            nxt = min(stop, k + int(max_pings))
            batch = self._batch(k, nxt)
            if batch.num_rows:
                yield batch
            k = nxt

    # --- summary ------------------------------------------------------------------------

    def beams_per_ping(self) -> np.ndarray:
        """The beam count of every readable ping, from the ping headers alone (no decode)."""
        dirn, _ = self._walk(0, self.n_pings)
        return np.asarray(dirn.n_beams, dtype=np.int64).copy()

    def ping_headers(self) -> dict:
        """``time`` (POSIX s), ``latitude``, ``longitude`` and ``heading`` (degrees) and
        ``number_beams`` of every ping record, read from the fixed ping headers alone (no walk,
        no decode): cheap enough to look at every ping's position. Null positions (91, 181)
        come back as stored; a ping record too short for its header gives NaN (0 beams)."""
        self._check_size()
        whole = self._psize >= self._hdr_len
        return self._header_columns(
            ping_headers_at(self._u8, self._pdata[whole], self._hdr_dtype, self._behind.passed),
            whole)

    def sample_at(self, pings) -> tuple[dict, dict]:
        """:meth:`ping_headers` and :meth:`read_columns_at` of ``pings`` in one pass over the
        file (the pre-scan's): the headers of each window of pings are read while the walk for
        the scale factors has its pages mapped, so a large file is mapped once, not twice."""
        self._check_size()
        whole = self._psize >= self._hdr_len
        along = HeadersAlong(self._u8, self._pdata[whole], self._hdr_dtype, self._behind.passed)
        idx = self._picks(pings)
        cols = (self._columns(int(idx[0]), int(idx[-1]) + 1, select=idx, passed=along.passed)
                if idx.size else self._columns(0, 0))
        return self._header_columns(along.finish(), whole), cols

    def _header_columns(self, hdr: np.ndarray, whole: np.ndarray) -> dict:
        """:meth:`ping_headers`'s columns from the headers of the ``whole`` ping records."""
        n = self.n_pings
        out = {k: np.full(n, np.nan) for k in ("time", "latitude", "longitude", "heading")}
        out["time"][whole] = hdr["time_sec"].astype(np.float64) + hdr["time_nsec"] / 1e9
        out["latitude"][whole] = hdr["latitude"].astype(np.float64) / 1.0e7
        out["longitude"][whole] = hdr["longitude"].astype(np.float64) / 1.0e7
        out["heading"][whole] = hdr["heading"].astype(np.float64) / 100.0
        out["number_beams"] = np.zeros(n, dtype=np.int64)
        out["number_beams"][whole] = hdr["number_beams"]
        return out

    def info(self) -> dict:
        """Version, record counts, ping/beam counts, arrays, time and position extents,
        damage: :func:`~pfm_dask.gsf._summary.summarize` after the kernels' walk of every
        ping (:func:`info` gives the same without numba). JSON-serialisable.
        """
        along = HeadersAlong(self._u8, self._pdata, self._hdr_dtype, self._behind.passed)
        dirn, _ = self._walk(0, self.n_pings, along.passed)   # the walked pings' headers too
        return summarize(self.path, self.size, self.version, self.major, self.minor,
                         self.record_counts, self.n_pings, dirn.n_beams,
                         along.finish(len(dirn.n_beams)), self._seen, self.damage)


# --- what earlier GsfFile objects of a file learnt (opt-in: ``remember=True``) ----------------
#
# A load's task opens a file once per piece, and the pieces of a file follow each other in a
# worker: its framing (a walk over every record header) and the scale-factor states found
# while walking are the same each time. A file is known by its inode, size, times and the
# checksums of its first and last 64 KiB; the last few files are kept.

_KNOWN: OrderedDict = OrderedDict()
_KNOWN_LOCK = threading.Lock()
_KNOWN_FILES = 4
_ENDS = 1 << 16


class _Known:
    __slots__ = ("framing", "states")

    def __init__(self, framing, states: dict):
        self.framing, self.states = framing, states


def _identity(st: os.stat_result, u8: np.ndarray) -> tuple:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns,
            zlib.crc32(u8[:_ENDS]), zlib.crc32(u8[-_ENDS:]))


def _recall(identity) -> _Known | None:
    if identity is None:
        return None
    with _KNOWN_LOCK:
        known = _KNOWN.get(identity)
        if known is not None:
            _KNOWN.move_to_end(identity)
            return _Known(known.framing, dict(known.states))
    return None


def _keep(identity, framing, states: dict) -> None:
    with _KNOWN_LOCK:
        known = _KNOWN.get(identity)
        if known is None:
            _KNOWN[identity] = _Known(framing, states)
            while len(_KNOWN) > _KNOWN_FILES:
                _KNOWN.popitem(last=False)
        else:
            known.states = {**known.states, **states}


# --- module-level conveniences -------------------------------------------------------------

def read_pings(path, *, strict: bool = True) -> pa.Table:
    """All soundings of a GSF file as one Arrow table (:data:`SOUNDING_SCHEMA`).

    With ``strict=False`` the pings before any damage are returned and the damage
    is described in the table's schema metadata key ``gsf_damage`` (JSON).
    """
    with GsfFile(path, strict=strict) as f:
        table = f.read()
        if f.damage:
            import json
            meta = dict(table.schema.metadata or {})
            meta[b"gsf_damage"] = json.dumps([d.to_dict() for d in f.damage]).encode()
            table = table.replace_schema_metadata(meta)
        return table


def iter_batches(path, max_pings: int = 1000, *, start_ping: int = 0,
                 stop_ping: int | None = None, strict: bool = True
                 ) -> Iterator[pa.RecordBatch]:
    """Soundings of a GSF file in record batches of at most ``max_pings`` pings."""
    with GsfFile(path, strict=strict) as f:
        yield from f.iter_batches(max_pings, start_ping=start_ping, stop_ping=stop_ping)
