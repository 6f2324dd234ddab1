"""Swath bathymetry ping decoding: the subrecord walk of each ping, then the beam decode.

Two stages:

1. :func:`walk_pings` steps through the subrecords of each ping, applies the
   scale-factor state exactly as libgsf does (tables carried from ping to ping,
   merged entry by entry), infers each array's byte width, and records where the
   wanted arrays sit and which multiplier and offset apply to them. A numba kernel
   walks the pings (``_kernels._k_walk``); :func:`walk_ping`, the same rules in
   Python, takes over for any ping the kernel stops at (damage, which it raises
   with file and byte offset, or state from before the range, which it resolves).
2. :func:`decode_pings` turns every ping's arrays into the output columns with one
   kernel pass (``_kernels._k_decode``). No Python loop runs per ping or per beam.
"""

from __future__ import annotations

import struct
import sys
import threading
from dataclasses import dataclass, fields

import numpy as np

from ..errors import GsfError
from ._kernels import FLAGS_SLOT, OUT_SIGNED, SPEC_TABLE, kernel
from ._records import (ARRAY_SPECS, MAX_ARRAY_ID, MAX_BEAMS, OUTPUT_ARRAYS,
                       SUB_QUALITY_FLAGS, SUB_SCALE_FACTORS)

__all__ = ["ScaleState", "PingDirectory", "walk_pings", "decode_pings", "NeedHistory",
           "keep_buffers"]

_U32 = struct.Struct(">I").unpack_from
_U16 = struct.Struct(">H").unpack_from
_SCALE_ENTRY = struct.Struct(">BBHIi")
_FIELD_SIZE = {1: 0x10, 2: 0x20, 4: 0x40}
_WIDTH_OF = {0x10: 1, 0x20: 2, 0x40: 4}
_TEST_WIDTHS = (1, 2, 4)

OUT_IDS = tuple(OUTPUT_ARRAYS)                  # array ids that become columns
_OUT_SLOT = {sid: k for k, sid in enumerate(OUT_IDS)}
_N_OUT = len(OUT_IDS)

# Per array id (0..255): the spec, or None. A list is faster than a dict lookup.
_SPEC = [ARRAY_SPECS.get(i) for i in range(256)]
_SLOT = [_OUT_SLOT.get(i, -1) for i in range(256)]


class NeedHistory(Exception):
    """Internal: a ping cannot be walked without state from before the range."""


class ScaleState:
    """The per-file scale-factor table (libgsf keeps one per open file).

    ``mult``, ``offset``, ``low`` (compression nibble) come from scale-factor
    subrecords; ``high`` (field-size nibble) from those and from every array decoded,
    because libgsf writes the width it inferred back into the table. Entries are
    indexed by array id (0..31). ``None`` means "not known yet": the ``resolver`` is
    asked for it (used when reading starts in the middle of a file).
    """

    __slots__ = ("mult", "offset", "low", "high", "resolver")

    def __init__(self, fill=0, resolver=None):
        n = MAX_ARRAY_ID + 1
        self.mult = [fill] * n
        self.offset = [fill] * n
        self.low = [fill] * n
        self.high = [fill] * n
        self.resolver = resolver

    def copy(self) -> "ScaleState":
        st = ScaleState.__new__(ScaleState)
        st.mult, st.offset = self.mult[:], self.offset[:]
        st.low, st.high = self.low[:], self.high[:]
        st.resolver = self.resolver
        return st

    def resolve_table(self, sid: int) -> None:
        if self.resolver is None:
            raise NeedHistory(sid)
        self.mult[sid], self.offset[sid], self.low[sid] = self.resolver.table(sid)

    def resolve_high(self, sid: int) -> None:
        if self.resolver is None:
            raise NeedHistory(sid)
        self.high[sid] = self.resolver.high(sid)


@dataclass
class PingDirectory:
    """Where the wanted arrays of a run of pings sit, and how to scale them.

    Per ping: ``n_beams``; per ping and output array (columns in ``OUT_IDS`` order):
    ``pos`` (absolute byte offset of the array payload, -1 when the array is absent),
    ``width`` (bytes per value), ``mult`` and ``off`` (scale factors in force).
    """

    data_offsets: np.ndarray   # (n,) int64, ping record data part
    n_beams: np.ndarray        # (n,) int64
    pos: np.ndarray            # (n, n_out) int64
    width: np.ndarray          # (n, n_out) int8
    mult: np.ndarray           # (n, n_out) float64
    off: np.ndarray            # (n, n_out) float64

    def __len__(self) -> int:
        return len(self.n_beams)


def walk_ping(buf, doff: int, size: int, hdr_len: int, st: ScaleState, validate: bool,
              path, roff: int, seen: set):
    """Walk one ping record's subrecords, updating ``st`` as libgsf would.

    Returns ``(n_beams, found)`` where ``found`` maps output slot -> (payload offset,
    width, multiplier, offset). Raises :class:`GsfError` (offset = the ping record's
    header) on anything libgsf would refuse or that would read outside the record.
    ``validate=False`` walks with an incomplete state (only to collect tables).
    This is the reference the kernel ``_kernels._k_walk`` follows rule for rule.
    """
    if size < hdr_len:
        raise GsfError(f"ping record holds {size} data bytes, fewer than its "
                       f"{hdr_len}-byte ping header", path=path, offset=roff)
    (n,) = _U16(buf, doff + 16)
    if n == 0 or n > MAX_BEAMS:
        raise GsfError(f"ping declares {n} beams; valid is 1..{MAX_BEAMS}",
                       path=path, offset=roff)
    end = doff + size
    p = doff + hdr_len
    found = {}
    mult, soff, low, high = st.mult, st.offset, st.low, st.high
    while end - p > 4:
        (word,) = _U32(buf, p)
        sid = word >> 24
        ssize = word & 0xFFFFFF
        q = p + 4
        seen.add(sid)
        spec = _SPEC[sid]
        if spec is not None:
            # --- field width, as libgsf infers it (size / N, then a look-ahead) ---
            fs = _FIELD_SIZE.get(ssize // n)
            if fs is None:
                h = high[sid]
                if h is None:
                    st.resolve_high(sid)
                    h = high[sid]
                fs = h & 0xF0
            sr = ssize
            count = 0
            while True:
                more = end - p - sr > 4
                if not (more and count <= 3):
                    break
                nq = q + sr
                if nq + 4 <= end:
                    (nw,) = _U32(buf, nq)
                    nid = nw >> 24
                    nsz = nw & 0xFFFFFF
                    if 0 < nid <= MAX_ARRAY_ID and (nsz == n or nsz == 2 * n or nsz == 4 * n):
                        fs2 = _FIELD_SIZE.get(sr // n)
                        if fs2 is None:
                            h = high[sid]
                            if h is None:
                                st.resolve_high(sid)
                                h = high[sid]
                            fs2 = h & 0xF0
                        fs = fs2
                        break
                if count < 3:
                    sr = n * _TEST_WIDTHS[count]
                count += 1
            high[sid] = fs
            if spec.fixed:
                width = spec.default
            else:
                width = _WIDTH_OF.get(fs, 0)
                if width not in spec.widths:
                    width = spec.default
            nbytes = n * width
            if q + nbytes > end:
                raise GsfError(
                    f"array subrecord {sid} ({spec.name}) needs {nbytes:,} bytes "
                    f"({n} beams x {width}) but the ping record has {end - q:,} left",
                    path=path, offset=roff)
            m = 0
            o = 0
            if spec.scaled:
                m = mult[sid]
                if m is None:
                    if validate:
                        st.resolve_table(sid)
                        m = mult[sid]
                    else:
                        m = 1
                if m == 0:
                    raise GsfError(
                        f"array subrecord {sid} ({spec.name}) has no scale factor "
                        "(multiplier 0: no scale-factor table has defined it)",
                        path=path, offset=roff)
                lo = low[sid]
                if lo is not None and lo & 0x0F == 1:
                    raise GsfError(
                        f"array subrecord {sid} ({spec.name}) uses GSF array "
                        "compression (GSF 3.09+), which this reader does not support; "
                        "convert the file with libgsf >= 3.09 first",
                        path=path, offset=roff)
                o = soff[sid]
            slot = _SLOT[sid]
            if slot >= 0:
                found[slot] = (q, width, m, o)
            p = q + nbytes
        elif sid == SUB_SCALE_FACTORS:
            if end - q < 4:
                raise GsfError("scale-factor subrecord is cut off by the end of "
                               "the ping record", path=path, offset=roff)
            (count_m,) = _U32(buf, q)
            if count_m < 1 or count_m >= 0x8000_0000 or q + 4 + 12 * count_m > end:
                raise GsfError(
                    f"scale-factor subrecord declares {count_m:,} entries, which "
                    f"do not fit in the {end - q - 4:,} bytes left in the ping record"
                    if count_m >= 1 else
                    "scale-factor subrecord declares 0 entries",
                    path=path, offset=roff)
            for aid, cflag, _res, m, o in _SCALE_ENTRY.iter_unpack(
                    bytes(buf[q + 4:q + 4 + 12 * count_m])):
                if m < 1:
                    raise GsfError(
                        f"scale factor for array subrecord {aid} has multiplier 0",
                        path=path, offset=roff)
                if 1 <= aid <= MAX_ARRAY_ID:
                    mult[aid] = m
                    soff[aid] = o
                    low[aid] = cflag & 0x0F
                    high[aid] = cflag & 0xF0
            p = q + 4 + 12 * count_m
        elif sid == SUB_QUALITY_FLAGS:
            # 2 bits per beam, packed 4 to a byte; not output, only stepped over.
            nbytes = (n + 3) // 4
            if q + nbytes > end:
                raise GsfError(
                    f"quality-flags subrecord needs {nbytes:,} bytes but the ping "
                    f"record has {end - q:,} left", path=path, offset=roff)
            p = q + nbytes
        else:
            # Sensor-specific (102-157), unknown sensor (0), intensity series (21),
            # anything else: skip by the declared size, clamped to the record (P9).
            p = q + ssize if ssize <= end - q else end
    return n, found


_PY_ERRORS = (struct.error, IndexError, ValueError, OverflowError, TypeError)


def walk_pings(buf, data_offsets, sizes, record_offsets, hdr_len: int, st: ScaleState,
               path, *, strict: bool = True, seen: set | None = None, u8=None,
               fast: bool = True):
    """Walk a run of consecutive ping records with scale-factor state ``st``.

    Returns ``(directory, damage)``: the directory of the pings before the first
    damaged one, and that damage (a :class:`GsfError`) or None. With ``strict`` the
    damage is raised instead.

    The numba kernel walks the pings; each ping it stops at is walked by
    :func:`walk_ping`, and the kernel resumes after it. ``fast=False`` walks every
    ping in Python (the reference the kernel is tested against).
    """
    n_pings = len(data_offsets)
    nb = np.zeros(n_pings, dtype=np.int64)
    pos = np.full((n_pings, _N_OUT), -1, dtype=np.int64)
    width = np.zeros((n_pings, _N_OUT), dtype=np.int8)
    mult = np.ones((n_pings, _N_OUT), dtype=np.float64)
    off = np.zeros((n_pings, _N_OUT), dtype=np.float64)
    damage = None
    doffs = np.ascontiguousarray(data_offsets, dtype=np.int64)
    sizes = np.ascontiguousarray(sizes, dtype=np.int64)
    rlist = np.asarray(record_offsets)
    if seen is None:
        seen = set()
    use_kernel = fast and n_pings > 0
    if use_kernel:
        if u8 is None:
            u8 = np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.zeros(0, np.uint8)
        k_walk = kernel("walk")
        arrs = _state_arrays(st)
        seen_mask = np.zeros(256, dtype=np.uint8)
        saved = np.zeros((6, MAX_ARRAY_ID + 1), dtype=np.int64)
    i = 0
    done = n_pings
    while i < n_pings:
        if use_kernel:
            i = int(k_walk(u8, doffs, sizes, hdr_len, i, SPEC_TABLE, *arrs, nb, pos, width,
                           mult, off, seen_mask, saved))
            if i >= n_pings:
                break
            _state_from_arrays(arrs, st)
        try:
            n, found = walk_ping(buf, int(doffs[i]), int(sizes[i]), hdr_len, st, True, path,
                                 int(rlist[i]), seen)
        except GsfError as err:
            if strict:
                raise
            damage = err
            done = i
            break
        except _PY_ERRORS as err:
            gerr = GsfError(f"malformed ping record ({type(err).__name__}: {err})",
                            path=path, offset=int(rlist[i]))
            if strict:
                raise gerr from err
            damage = gerr
            done = i
            break
        nb[i] = n
        for slot, (q, w, m, o) in found.items():
            pos[i, slot] = q
            width[i, slot] = w
            mult[i, slot] = m
            off[i, slot] = o
        i += 1
        if use_kernel:
            arrs = _state_arrays(st)
    if use_kernel:
        if damage is None:
            _state_from_arrays(arrs, st)
        seen.update(np.flatnonzero(seen_mask).tolist())
    dirn = PingDirectory(data_offsets=doffs[:done], n_beams=nb[:done], pos=pos[:done],
                         width=width[:done], mult=mult[:done], off=off[:done])
    return dirn, damage


def _state_arrays(st: ScaleState) -> tuple:
    """The state as the kernel's arrays: mult, offset, low, high, table known, nibble known."""
    def arr(values):
        return np.array([0 if v is None else v for v in values], dtype=np.int64)

    tknown = np.array([m is not None for m in st.mult], dtype=np.int64)
    hknown = np.array([h is not None for h in st.high], dtype=np.int64)
    return (arr(st.mult), arr(st.offset), arr(st.low), arr(st.high), tknown, hknown)


def _state_from_arrays(arrs: tuple, st: ScaleState) -> None:
    """Write the kernel's state arrays back into ``st`` (None where still unknown)."""
    mult, soff, low, high, tknown, hknown = (a.tolist() for a in arrs)
    for sid in range(len(mult)):
        if tknown[sid]:
            st.mult[sid], st.offset[sid], st.low[sid] = mult[sid], soff[sid], low[sid]
        if hknown[sid]:
            st.high[sid] = high[sid]


# --- stage 2: decoding -----------------------------------------------------------------------


def _evenly_spaced(starts: np.ndarray) -> int:
    """The common step of sorted start offsets, or 0 if they are not evenly spaced."""
    if len(starts) < 2:
        return 1
    step = int(starts[1] - starts[0])
    if step > 0 and (np.diff(starts) == step).all():
        return step
    return 0


#: bytes of a file that a pass over many of its pings (their headers, a walk for the scale
#: factors) keeps mapped: past them the pass unmaps the pages it has gone by (``passed``), so
#: that the pre-scan or ``gsf-info`` of a 1 GB file holds about this much of it, not all of it
PASS_WINDOW = 64 << 20


def runs_of_bytes(offsets: np.ndarray) -> np.ndarray:
    """Where to cut the sorted byte ``offsets`` so that each run of them spans about
    :data:`PASS_WINDOW` bytes: the run bounds ``[0, ..., len(offsets)]`` (one run if less)."""
    n, window = len(offsets), PASS_WINDOW
    if n < 2 or int(offsets[-1]) - int(offsets[0]) <= window:
        return np.array([0, n], dtype=np.int64)
    marks = np.arange(int(offsets[0]) + window, int(offsets[-1]) + 1, window, dtype=np.int64)
    cuts = np.searchsorted(offsets, marks, side="right")
    return np.unique(np.concatenate(([0], cuts, [n]))).astype(np.int64)


def _runs(offsets: np.ndarray, passed):
    """The runs ``(a, b)`` of :func:`runs_of_bytes`; after each but the last, ``passed(lo, hi)``
    is told that the pass has gone from byte ``offsets[a]`` to ``offsets[b]``."""
    bounds = runs_of_bytes(offsets).tolist()
    for a, b in zip(bounds[:-1], bounds[1:]):
        yield a, b
        if b < len(offsets) and passed is not None:
            passed(int(offsets[a]), int(offsets[b]))


def walk_pings_in_runs(buf, data_offsets, sizes, record_offsets, hdr_len: int, st: ScaleState,
                       path, *, passed=None, **kw):
    """:func:`walk_pings` over a :data:`PASS_WINDOW` of the file at a time: the same directory
    and damage as one walk, and between the runs ``passed(lo, hi)`` (a caller holding the file
    mapped unmaps bytes ``[lo, hi)``; a decode afterwards maps them again)."""
    parts, dmg = [], None
    for a, b in _runs(record_offsets, passed):
        part, dmg = walk_pings(buf, data_offsets[a:b], sizes[a:b], record_offsets[a:b], hdr_len,
                               st, path, **kw)
        parts.append(part)
        if dmg is not None:
            break
    if len(parts) == 1:
        return parts[0], dmg
    return PingDirectory(*(np.concatenate([getattr(p, f.name) for p in parts])
                           for f in fields(PingDirectory))), dmg


def ping_headers_at(u8, data_offsets: np.ndarray, hdr_dtype: np.dtype, passed=None) -> np.ndarray:
    """The fixed ping headers starting at ``data_offsets`` as ``hdr_dtype`` records, a
    :data:`PASS_WINDOW` of the file at a time (``passed`` as in :func:`walk_pings_in_runs`)."""
    hdr = np.empty(len(data_offsets), dtype=hdr_dtype)
    for a, b in _runs(data_offsets, passed):
        hdr[a:b] = _gather(u8, data_offsets[a:b], hdr_dtype.itemsize).view(hdr_dtype) \
            .reshape(b - a)
    return hdr


class HeadersAlong:
    """The fixed ping headers at ``data_offsets``, read window by window as a walk over the same
    pings goes by (give it :meth:`passed`), then the rest (:meth:`finish`): a pass that needs
    both maps a large file once, not once for each. ``passed(lo, hi)`` is what unmaps."""

    def __init__(self, u8, data_offsets: np.ndarray, hdr_dtype: np.dtype, passed=None):
        self.u8, self.offsets, self.dtype, self._passed = u8, data_offsets, hdr_dtype, passed
        self.headers = np.empty(len(data_offsets), dtype=hdr_dtype)
        self.done = 0    # headers read: those of offsets[:done]

    def passed(self, lo: int, hi: int) -> None:
        """The walk is past byte ``hi``: read the headers before it, then unmap [lo, hi)."""
        k = int(np.searchsorted(self.offsets, hi))
        if k > self.done:
            self.headers[self.done:k] = ping_headers_at(self.u8, self.offsets[self.done:k],
                                                        self.dtype)
            self.done = k
        if self._passed is not None:
            self._passed(lo, hi)

    def finish(self, upto: int | None = None) -> np.ndarray:
        """The headers of ``offsets[:upto]`` (all by default), reading those the walk left;
        then it lets go of the file's bytes (an exception kept from the walk may keep this
        object, and the bytes' map could not be closed while it held them)."""
        upto = len(self.offsets) if upto is None else int(upto)
        if upto > self.done:
            self.headers[self.done:upto] = ping_headers_at(
                self.u8, self.offsets[self.done:upto], self.dtype, self._passed)
            self.done = upto
        self.u8 = None
        return self.headers[:upto]


def _gather(u8, starts: np.ndarray, nbytes: int) -> np.ndarray:
    """Copy ``nbytes`` bytes from each start offset: a (len(starts), nbytes) uint8 array."""
    step = _evenly_spaced(starts)
    if step and len(starts):
        view = np.lib.stride_tricks.as_strided(
            u8[int(starts[0]):], shape=(len(starts), nbytes), strides=(step, 1),
            writeable=False)
        return view.copy()
    windows = np.lib.stride_tricks.sliding_window_view(u8, nbytes)
    return windows[starts]


# --- output memory -----------------------------------------------------------------------
#
# Decoding is cheap next to the cost of fresh memory: the kernel zeroes every new page
# on first touch, which took about half of the decode time on large batches. Output
# buffers are therefore recycled: a few large buffers are kept, and one is handed out
# again once nothing refers to it any more (every column view holds a reference to its
# buffer, so CPython's reference count says exactly when the last table using it is
# gone). At most _POOL_SIZE buffers of at most _POOL_MAX_BYTES each are kept.

_POOL: list = []
_POOL_LOCK = threading.Lock()
_POOL_SIZE = 2
_POOL_MIN_BYTES = 1 << 22       # smaller blocks: plain allocation
_POOL_MAX_BYTES = 1 << 27       # 128 MiB: larger blocks are never kept


def keep_buffers(n: int) -> int:
    """Keep at most ``n`` recycled output buffers from now on, dropping the rest; returns the
    previous limit. One serves a process that decodes on one thread (``--serial``): each more
    is memory held while the writer works; none once nothing is left to decode."""
    global _POOL_SIZE
    with _POOL_LOCK:
        old, _POOL_SIZE = _POOL_SIZE, max(0, int(n))
        del _POOL[_POOL_SIZE:]
    return old


def _arena(size: int) -> np.ndarray:
    """A uint8 block of ``size`` bytes for output columns, recycled when possible."""
    if size < _POOL_MIN_BYTES or size > _POOL_MAX_BYTES:
        return np.empty(size, dtype=np.uint8)
    with _POOL_LOCK:
        for k in range(len(_POOL)):
            # 2 references = the pool's own and getrefcount's argument: no user left.
            if sys.getrefcount(_POOL[k]) == 2 and size <= len(_POOL[k]) <= 2 * size:
                return _POOL[k][:size]
        buf = np.empty(size, dtype=np.uint8)
        free = [k for k in range(len(_POOL)) if sys.getrefcount(_POOL[k]) == 2]
        if len(_POOL) < _POOL_SIZE:
            _POOL.append(buf)
        elif free:
            # the smallest free one makes way, unless it is larger (a piece's short last
            # chunk must not evict the buffer its full chunks reuse)
            k = min(free, key=lambda j: len(_POOL[j]))
            if len(_POOL[k]) < size:
                _POOL[k] = buf
        return buf[:size]


#: Every per-beam column decode_pings makes, with its dtype. The scaled array columns
#: come last, in slot order, so that they form one (n_arrays, total) block.
_SCALED = [sid for sid in OUT_IDS if ARRAY_SPECS[sid].scaled]
_COLUMN_DTYPES = [
    ("time", np.dtype(np.float64)), ("time_sec", np.dtype(np.int64)),
    ("time_nsec", np.dtype(np.int32)), ("latitude", np.dtype(np.float64)),
    ("longitude", np.dtype(np.float64)), ("heading", np.dtype(np.float64)),
    ("ping_flags", np.dtype(np.uint16)), ("beam", np.dtype(np.uint16)),
    (OUTPUT_ARRAYS[OUT_IDS[FLAGS_SLOT]], np.dtype(np.uint8)),
]


_HEADER_COLUMNS = ("time", "time_sec", "time_nsec", "latitude", "longitude", "heading",
                   "ping_flags")


def decode_pings(u8: np.ndarray, dirn: PingDirectory, per_ping: bool = False) -> dict:
    """Decode the pings of a directory into per-beam numpy columns (file order).

    ``per_ping``: the ping-header columns (time, position, heading, ping flags) hold one value
    per ping instead of one per beam.

    Returns a dict of column name -> ndarray, plus ``"_valid"``: column name ->
    boolean per-beam validity mask for the array columns that some ping lacks.
    Scaled values are ``raw / multiplier - offset`` in float64, the same operations
    (hence the same bits) as libgsf. The ping-header fields read (time, position,
    flags, heading) sit at the same offsets in both ping-header versions.
    """
    n_pings = len(dirn)
    nb = np.ascontiguousarray(dirn.n_beams, dtype=np.int64)
    total = int(nb.sum())

    # All output columns live in one allocation: fresh memory is paid for page by
    # page, and one large block costs about half as much as many separate ones.
    offs, size = {}, 0
    rows = {name: (n_pings if per_ping and name in _HEADER_COLUMNS else total)
            for name, _ in _COLUMN_DTYPES}
    for name, dt in _COLUMN_DTYPES:
        offs[name] = size
        size += -(-rows[name] * dt.itemsize // 64) * 64
    offs["_arrays"] = size
    size += len(_SCALED) * total * 8
    arena = _arena(size)
    cols: dict = {name: arena[offs[name]:offs[name] + rows[name] * dt.itemsize].view(dt)
                  for name, dt in _COLUMN_DTYPES}
    block = arena[offs["_arrays"]:offs["_arrays"] + len(_SCALED) * total * 8].view(
        np.float64).reshape(len(_SCALED), total)
    for k, sid in enumerate(_SCALED):
        cols[OUTPUT_ARRAYS[sid]] = block[k]

    present = dirn.pos >= 0
    missing = [k for k in range(_N_OUT) if not present[:, k].all()]
    valid_rows = np.empty((_N_OUT, total if missing else 0), dtype=bool)
    if n_pings:
        kernel("decode")(u8, np.ascontiguousarray(dirn.data_offsets, dtype=np.int64), nb,
                         np.ascontiguousarray(dirn.pos), np.ascontiguousarray(dirn.width),
                         np.ascontiguousarray(dirn.mult), np.ascontiguousarray(dirn.off),
                         OUT_SIGNED, bool(per_ping), cols["time"], cols["time_sec"], cols["time_nsec"],
                         cols["latitude"], cols["longitude"], cols["heading"],
                         cols["ping_flags"], cols["beam"], block,
                         cols[OUTPUT_ARRAYS[OUT_IDS[FLAGS_SLOT]]], valid_rows)
    cols["_valid"] = {OUTPUT_ARRAYS[OUT_IDS[k]]: valid_rows[k] for k in missing}
    return cols
