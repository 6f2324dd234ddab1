"""Swath bathymetry ping decoding: subrecord walk per ping, then vectorised gathers.

Two stages:

1. :func:`walk_pings` steps through the subrecords of each ping (one short Python
   loop per ping, over ~10-20 subrecords), applies the scale-factor state exactly as
   libgsf does (tables carried from ping to ping, merged entry by entry), infers each
   array's byte width, and records where the wanted arrays sit and which multiplier
   and offset apply to them. It is where every rule and every damage check lives.
2. :func:`decode_pings` groups the pings that share one layout (same number of
   beams, same array positions and widths) and decodes each group with one gather
   of bytes and one ``view`` as big-endian integers, then applies the per-ping scale
   factors as vectors. No Python loop runs per beam.
"""

from __future__ import annotations

import struct
import sys
import threading
from dataclasses import dataclass

import numpy as np

from ..errors import GsfError
from ._records import (ARRAY_SPECS, MAX_ARRAY_ID, MAX_BEAMS, OUTPUT_ARRAYS,
                       SUB_QUALITY_FLAGS, SUB_SCALE_FACTORS)

__all__ = ["ScaleState", "PingDirectory", "walk_pings", "decode_pings", "NeedHistory"]

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


class _Trace:
    """What one ping's walk read and where its scale factors came from.

    Another ping holding the same bytes at every position read here, and whose
    record size satisfies the same comparisons, is walked identically (same
    subrecords at the same places, same widths): only its scale-factor values may
    differ, and those are gathered with numpy.

    * ``reads``: (relative offset, byte count) that must hold the same bytes;
    * ``probes``: look-ahead words that need only give the same answer to "is this an
      array subrecord header?";
    * ``lo``/``hi``: bounds on the record size within which every size comparison of
      the walk comes out the same;
    * ``tail``: relative offset of a last subrecord skipped by its declared size (such
      as a variable-length intensity series); its size may differ, it only has to end
      the walk as it did here;
    * ``tables``: (relative offset of the first entry, entry count);
    * ``src``: array id -> (table index, entry index) that defined it in this ping;
    * ``reusable``: False when the walk depended on state the bytes do not capture (a
      width from the nibble, a scale-factor table after an array).
    """

    __slots__ = ("reads", "probes", "tables", "src", "reusable", "array_seen", "lo", "hi",
                 "tail", "pending", "ridx")

    def __init__(self):
        self.reads = []
        self.probes = []
        self.tables = []
        self.src = {}
        self.reusable = True
        self.array_seen = False
        self.lo = 0
        self.hi = 1 << 62
        self.tail = None
        self.pending = None    # (lo, hi) of the last skip, kept apart in case it is the tail
        self.ridx = None       # byte offsets of ``reads``, built on first use


def walk_ping(buf, doff: int, size: int, hdr_len: int, st: ScaleState, validate: bool,
              path, roff: int, seen: set, trace: _Trace | None = None):
    """Walk one ping record's subrecords, updating ``st`` as libgsf would.

    Returns ``(n_beams, found)`` where ``found`` maps output slot -> (payload offset,
    width, multiplier, offset, source table entry or None). Raises :class:`GsfError`
    (offset = the ping record's header) on anything libgsf would refuse or that would
    read outside the record. ``validate=False`` walks with an incomplete state (only
    to collect tables). ``trace`` (optional) records what the walk depended on.
    """
    if size < hdr_len:
        raise GsfError(f"ping record holds {size} data bytes, fewer than its "
                       f"{hdr_len}-byte ping header", path=path, offset=roff)
    (n,) = _U16(buf, doff + 16)
    tr = trace is not None
    if tr:
        reads = trace.reads
        reads.append((16, 2))
        trace.lo = hdr_len
    if n == 0 or n > MAX_BEAMS:
        raise GsfError(f"ping declares {n} beams; valid is 1..{MAX_BEAMS}",
                       path=path, offset=roff)
    end = doff + size
    p = doff + hdr_len
    found = {}
    mult, soff, low, high = st.mult, st.offset, st.low, st.high
    skipped_last = False
    while end - p > 4:
        (word,) = _U32(buf, p)
        sid = word >> 24
        ssize = word & 0xFFFFFF
        q = p + 4
        if tr:
            rp = p - doff
            if trace.pending is not None:      # the previous skip was not the last one
                trace.lo = max(trace.lo, trace.pending[0])
                trace.hi = min(trace.hi, trace.pending[1])
                trace.pending = None
            trace.lo = max(trace.lo, rp + 5)
            reads.append((rp, 4))
        skipped_last = False
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
                if tr:
                    trace.reusable = False
            sr = ssize
            count = 0
            while True:
                more = end - p - sr > 4
                if tr:
                    if more:
                        trace.lo = max(trace.lo, p - doff + sr + 5)
                    else:
                        trace.hi = min(trace.hi, p - doff + sr + 4)
                if not (more and count <= 3):
                    break
                nq = q + sr
                inside = nq + 4 <= end
                if tr:
                    if inside:
                        trace.lo = max(trace.lo, nq - doff + 4)
                    else:
                        trace.hi = min(trace.hi, nq - doff + 3)
                if inside:
                    (nw,) = _U32(buf, nq)
                    nid = nw >> 24
                    nsz = nw & 0xFFFFFF
                    hit = 0 < nid <= MAX_ARRAY_ID and (nsz == n or nsz == 2 * n or nsz == 4 * n)
                    if tr:
                        trace.probes.append((nq - doff, hit))
                    if hit:
                        fs2 = _FIELD_SIZE.get(sr // n)
                        if fs2 is None:
                            h = high[sid]
                            if h is None:
                                st.resolve_high(sid)
                                h = high[sid]
                            fs2 = h & 0xF0
                            if tr:
                                trace.reusable = False
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
                if tr:
                    trace.array_seen = True
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
            if tr:
                trace.lo = max(trace.lo, q - doff + nbytes)
            slot = _SLOT[sid]
            if slot >= 0:
                found[slot] = (q, width, m, o,
                               trace.src.get(sid) if tr and spec.scaled else None)
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
            if tr:
                reads.append((q - doff, 4))
                trace.lo = max(trace.lo, q - doff + 4 + 12 * count_m)
                if trace.array_seen:
                    trace.reusable = False
                t_index = len(trace.tables)
                trace.tables.append((q + 4 - doff, count_m))
                for e in range(count_m):
                    reads.append((q + 4 + 12 * e - doff, 4))
            e = 0
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
                    if tr:
                        trace.src[aid] = (t_index, e)
                e += 1
            p = q + 4 + 12 * count_m
        elif sid == SUB_QUALITY_FLAGS:
            # 2 bits per beam, packed 4 to a byte; not output, only stepped over.
            nbytes = (n + 3) // 4
            if q + nbytes > end:
                raise GsfError(
                    f"quality-flags subrecord needs {nbytes:,} bytes but the ping "
                    f"record has {end - q:,} left", path=path, offset=roff)
            if tr:
                trace.lo = max(trace.lo, q - doff + nbytes)
            p = q + nbytes
        else:
            # Sensor-specific (102-157), unknown sensor (0), intensity series (21),
            # anything else: skip by the declared size, clamped to the record (P9).
            if ssize <= end - q:
                if tr:
                    trace.pending = (q - doff + ssize, 1 << 62)
                p = q + ssize
            else:
                if tr:
                    trace.pending = (0, q - doff + ssize - 1)
                p = end
            skipped_last = True
    if tr:
        if skipped_last:
            # The last subrecord was skipped by its size: let that size vary, as long
            # as it still ends the walk (checked per ping); its id must be the same.
            rp = reads.pop()[0]
            reads.append((rp, 1))
            trace.tail = rp
            trace.pending = None
        else:
            if trace.pending is not None:
                trace.lo = max(trace.lo, trace.pending[0])
                trace.hi = min(trace.hi, trace.pending[1])
                trace.pending = None
            trace.hi = min(trace.hi, p - doff + 4)
    return n, found


_PY_ERRORS = (struct.error, IndexError, ValueError, OverflowError, TypeError)


def walk_pings(buf, data_offsets, sizes, record_offsets, hdr_len: int, st: ScaleState,
               path, *, strict: bool = True, seen: set | None = None, u8=None,
               fast: bool = True):
    """Walk a run of consecutive ping records with scale-factor state ``st``.

    Returns ``(directory, damage)``: the directory of the pings before the first
    damaged one, and that damage (a :class:`GsfError`) or None. With ``strict`` the
    damage is raised instead.

    After each ping walked in Python, the following pings that repeat its structure
    byte for byte at every position the walk read (see :class:`_Trace`) are taken
    in one numpy step; a typical file is then walked in a handful of Python steps.
    ``fast=False`` walks every ping in Python (the reference the fast path is tested
    against).
    """
    n_pings = len(data_offsets)
    nb = np.zeros(n_pings, dtype=np.int64)
    pos = np.full((n_pings, _N_OUT), -1, dtype=np.int64)
    width = np.zeros((n_pings, _N_OUT), dtype=np.int8)
    mult = np.ones((n_pings, _N_OUT), dtype=np.float64)
    off = np.zeros((n_pings, _N_OUT), dtype=np.float64)
    damage = None
    doffs = np.asarray(data_offsets, dtype=np.int64)
    sizes = np.asarray(sizes, dtype=np.int64)
    dlist = doffs.tolist()
    slist = sizes.tolist()
    rlist = np.asarray(record_offsets).tolist()
    if seen is None:
        seen = set()
    if u8 is None and n_pings > 2:
        u8 = np.frombuffer(buf, dtype=np.uint8) if len(buf) else np.zeros(0, np.uint8)
    window = 8
    i = 0
    done = n_pings
    while i < n_pings:
        trace = _Trace() if (fast and u8 is not None and i + 1 < n_pings) else None
        try:
            n, found = walk_ping(buf, dlist[i], slist[i], hdr_len, st, True, path, rlist[i],
                                 seen, trace)
        except GsfError as err:
            if strict:
                raise
            damage = err
            done = i
            break
        except _PY_ERRORS as err:
            gerr = GsfError(f"malformed ping record ({type(err).__name__}: {err})",
                            path=path, offset=rlist[i])
            if strict:
                raise gerr from err
            damage = gerr
            done = i
            break
        nb[i] = n
        for slot, (q, w, m, o, _src) in found.items():
            pos[i, slot] = q
            width[i, slot] = w
            mult[i, slot] = m
            off[i, slot] = o
        t = i
        i += 1
        if trace is None or not trace.reusable:
            continue
        # --- take the following pings that repeat ping t's structure ---
        while i < n_pings:
            k = _run_length(u8, doffs, sizes, t, i, min(n_pings, i + window), trace)
            if k == 0:
                window = max(8, window // 2)
                break
            _fill_run(u8, doffs, t, i, i + k, n, found, trace, nb, pos, width, mult, off)
            _apply_last_tables(u8, doffs[i + k - 1], trace, st)
            i += k
            if k < window:
                window = max(8, window // 2)
                break
            window = min(window * 4, 4096)
    dirn = PingDirectory(data_offsets=doffs[:done], n_beams=nb[:done], pos=pos[:done],
                         width=width[:done], mult=mult[:done], off=off[:done])
    return dirn, damage


def _trace_index(trace: _Trace) -> np.ndarray:
    if trace.ridx is None:
        rel = np.array([r for r, _ in trace.reads], dtype=np.int64)
        cnt = np.array([k for _, k in trace.reads], dtype=np.int64)
        trace.ridx = np.repeat(rel, cnt) + (np.arange(int(cnt.sum())) - np.repeat(
            np.cumsum(cnt) - cnt, cnt))
    return trace.ridx


def _run_length(u8, doffs, sizes, t: int, i: int, j: int, trace: _Trace) -> int:
    """How many pings from i (at most j - i) repeat ping t's walk exactly."""
    size_ok = (sizes[i:j] >= trace.lo) & (sizes[i:j] <= trace.hi)
    m = len(size_ok) if size_ok.all() else int(np.argmin(size_ok))
    if m == 0:
        return 0
    ridx = _trace_index(trace)
    tmpl = u8[doffs[t] + ridx]
    cand = u8[doffs[i:i + m, None] + ridx]
    ok = (cand == tmpl).all(axis=1)
    if trace.tail is not None:
        # The last subrecord, skipped by its own (clamped) size, must end the walk.
        rq = trace.tail + 4
        ssize = (_u32_at(u8, doffs[i:i + m] + trace.tail) & 0xFFFFFF).astype(np.int64)
        room = sizes[i:i + m] - rq
        ok &= room - np.minimum(ssize, room) <= 4
    if trace.probes and ok.any():
        n = int(trace_n(u8, doffs[t]))
        rel = np.array([r for r, _ in trace.probes], dtype=np.int64)
        want = np.array([h for _, h in trace.probes], dtype=bool)
        w = _u32_at(u8, doffs[i:i + m, None] + rel[None, :])
        nid = w >> 24
        nsz = w & 0xFFFFFF
        hit = (nid > 0) & (nid <= MAX_ARRAY_ID) & ((nsz == n) | (nsz == 2 * n) | (nsz == 4 * n))
        ok &= (hit == want).all(axis=1)
    k = m if ok.all() else int(np.argmin(ok))
    if k and trace.tables:
        # Every multiplier of every table must be >= 1 (libgsf refuses the ping
        # otherwise): stop the run before the first ping that breaks this.
        good = np.ones(k, dtype=bool)
        for rel, count in trace.tables:
            at = doffs[i:i + k, None] + (rel + 4 + 12 * np.arange(count))[None, :]
            mu = _u32_at(u8, at)
            good &= (mu >= 1).all(axis=1)
        if not good.all():
            k = int(np.argmin(good))
    return k


def trace_n(u8, doff) -> int:
    """number_beams of the ping whose data part starts at ``doff``."""
    return (int(u8[doff + 16]) << 8) | int(u8[doff + 17])


def _u32_at(u8, at: np.ndarray) -> np.ndarray:
    b = u8[at[..., None] + np.arange(4)]
    return b.view(">u4")[..., 0]


def _fill_run(u8, doffs, t, i, j, n, found, trace, nb, pos, width, mult, off) -> None:
    """Directory entries of pings [i, j), which repeat ping t's structure."""
    nb[i:j] = n
    base = doffs[i:j]
    for slot, (q, w, m, o, src) in found.items():
        pos[i:j, slot] = base + (q - doffs[t])
        width[i:j, slot] = w
        if src is None:
            mult[i:j, slot] = m
            off[i:j, slot] = o
        else:
            rel, _count = trace.tables[src[0]]
            at = base + rel + 12 * src[1]
            mult[i:j, slot] = _u32_at(u8, at + 4)
            off[i:j, slot] = _u32_at(u8, at + 8).view(">i4")


def _apply_last_tables(u8, doff, trace: _Trace, st: ScaleState) -> None:
    """Bring the state to where it is after the run's last ping (its table values)."""
    for rel, count in trace.tables:
        raw = u8[doff + rel: doff + rel + 12 * count].tobytes()
        for aid, _cflag, _res, m, o in _SCALE_ENTRY.iter_unpack(raw):
            if 1 <= aid <= MAX_ARRAY_ID:
                st.mult[aid] = m
                st.offset[aid] = o


# --- stage 2: vectorised decoding -------------------------------------------------------

_INT_DTYPES = {
    (1, False): np.dtype("u1"), (1, True): np.dtype("i1"),
    (2, False): np.dtype(">u2"), (2, True): np.dtype(">i2"),
    (4, False): np.dtype(">u4"), (4, True): np.dtype(">i4"),
}
_OUT_SPECS = [ARRAY_SPECS[sid] for sid in OUT_IDS]


def _evenly_spaced(starts: np.ndarray) -> int:
    """The common step of sorted start offsets, or 0 if they are not evenly spaced."""
    if len(starts) < 2:
        return 1
    step = int(starts[1] - starts[0])
    if step > 0 and (np.diff(starts) == step).all():
        return step
    return 0


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


def _rows(u8, starts: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
    """A (len(starts), n) array of big-endian values starting at each offset.

    Evenly spaced starts give a zero-copy strided (possibly unaligned) view into the
    file; it must only be read from, never returned. Otherwise the bytes are gathered.
    """
    w = dtype.itemsize
    step = _evenly_spaced(starts)
    if step and len(starts):
        return np.ndarray(shape=(len(starts), n), dtype=dtype, buffer=u8,
                          offset=int(starts[0]), strides=(step, w))
    return _gather(u8, starts, n * w).view(dtype)


def _per_ping(v: np.ndarray, m):
    """A per-ping vector as a scalar when all its values are equal (cheaper broadcasting)."""
    return v[0] if len(v) and (v == v[0]).all() else v[:, None]


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
            _POOL[free[0]] = buf
        return buf[:size]


#: Every per-beam column decode_pings makes, with its dtype (the array columns last).
_COLUMN_DTYPES = [
    ("time", np.dtype(np.float64)), ("time_sec", np.dtype(np.int64)),
    ("time_nsec", np.dtype(np.int32)), ("latitude", np.dtype(np.float64)),
    ("longitude", np.dtype(np.float64)), ("heading", np.dtype(np.float64)),
    ("ping_flags", np.dtype(np.uint16)), ("beam", np.dtype(np.uint16)),
] + [(OUTPUT_ARRAYS[sid], np.dtype(np.float64 if ARRAY_SPECS[sid].scaled else np.uint8))
     for sid in OUT_IDS]


def decode_pings(u8: np.ndarray, dirn: PingDirectory, header_dtype: np.dtype) -> dict:
    """Decode the pings of a directory into per-beam numpy columns (file order).

    Returns a dict of column name -> ndarray, plus ``"_valid"``: column name ->
    boolean per-beam validity mask for the array columns that some ping lacks.
    Scaled values are ``raw / multiplier - offset`` in float64, the same operations
    (hence the same bits) as libgsf.
    """
    n_pings = len(dirn)
    nb = dirn.n_beams
    total = int(nb.sum())
    uniform = n_pings > 0 and bool((nb == nb[0]).all())
    n_uni = int(nb[0]) if uniform else 0

    # All output columns live in one allocation: fresh memory is paid for page by
    # page, and one large block costs about half as much as many separate ones.
    arena_cols = _COLUMN_DTYPES
    offs, size = {}, 0
    for name, dt in arena_cols:
        offs[name] = size
        size += -(-total * dt.itemsize // 64) * 64
    arena = _arena(size)
    cols: dict = {name: arena[offs[name]:offs[name] + total * dt.itemsize].view(dt)
                  for name, dt in arena_cols}
    ping_of_row = None if uniform else np.repeat(np.arange(n_pings), nb)

    def expand(v, out):   # per-ping values -> per-beam, written into ``out``
        if uniform:
            out.reshape(n_pings, n_uni)[...] = v[:, None]
        else:
            np.take(v, ping_of_row, out=out)
        return out

    # Ping headers: one gather, one structured view.
    hl = header_dtype.itemsize
    if n_pings:
        hdr = _gather(u8, dirn.data_offsets, hl).view(header_dtype).reshape(n_pings)
    else:
        hdr = np.zeros(0, dtype=header_dtype)
    sec = hdr["time_sec"].astype(np.int64)
    nsec = hdr["time_nsec"].astype(np.int64)
    ping_cols = {
        "time_sec": sec,
        "time_nsec": nsec.astype(np.int32),
        "time": sec + nsec / 1e9,
        "latitude": hdr["latitude"].astype(np.float64) / 1.0e7,
        "longitude": hdr["longitude"].astype(np.float64) / 1.0e7,
        "heading": hdr["heading"].astype(np.float64) / 100.0,
        "ping_flags": hdr["ping_flags"].astype(np.uint16),
    }
    for name, v in ping_cols.items():
        expand(v, cols[name])
    if uniform:
        cols["beam"].reshape(n_pings, n_uni)[...] = np.arange(1, n_uni + 1, dtype=np.uint16)
    else:
        row_start = np.zeros(n_pings, dtype=np.int64)
        if n_pings:
            np.cumsum(nb[:-1], out=row_start[1:])
        beam = np.arange(total, dtype=np.int64)
        beam -= np.take(row_start, ping_of_row)
        beam += 1
        cols["beam"][...] = beam

    # Array columns: group pings by layout (N, and per array: width, 0 = absent). The
    # array positions may differ from ping to ping: each gather takes its own starts.
    key = np.concatenate([nb[:, None], dirn.width.astype(np.int64)], axis=1)
    if n_pings and (key == key[0]).all():
        uniq, inverse = key[:1], None
    elif n_pings:
        uniq, inverse = np.unique(key, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        uniq, inverse = np.zeros((0, key.shape[1]), dtype=np.int64), None
    single = len(uniq) == 1
    if not single and n_pings:
        row_start = np.zeros(n_pings, dtype=np.int64)
        np.cumsum(nb[:-1], out=row_start[1:])

    valid: dict = {}
    for k, sid in enumerate(OUT_IDS):
        name = OUTPUT_ARRAYS[sid]
        present = dirn.pos[:, k] >= 0
        if not present.all():
            valid[name] = expand(present, np.empty(total, dtype=bool))
        if not (single and present.all()):
            cols[name][...] = 0

    for g in range(len(uniq)):
        members = np.arange(n_pings) if single else np.flatnonzero(inverse == g)
        n = int(uniq[g, 0])
        rows = None
        for k, sid in enumerate(OUT_IDS):
            w = int(uniq[g, 1 + k])
            if w == 0:
                continue
            spec = _OUT_SPECS[k]
            col = cols[OUTPUT_ARRAYS[sid]]
            raw = _rows(u8, dirn.pos[members, k], n, _INT_DTYPES[(w, spec.signed)])
            dst = col.reshape(n_pings, n) if single else np.empty(
                (len(members), n), dtype=col.dtype)
            if spec.scaled:
                np.divide(raw, _per_ping(dirn.mult[members, k], n), out=dst)
                o = dirn.off[members, k]
                if o.any():
                    np.subtract(dst, _per_ping(o, n), out=dst)
            else:
                np.copyto(dst, raw)
            if not single:
                if rows is None:
                    rows = (row_start[members][:, None] + np.arange(n)).reshape(-1)
                col[rows] = dst.reshape(-1)
    cols["_valid"] = valid
    return cols
