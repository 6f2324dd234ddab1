"""numba kernels of a load's task (:mod:`pfm_dask.soundings`): screening, output, the gather.

A chunk of decoded pings is screened in one pass (:func:`_k_screen`: pfmLoader's ping and beam
skips, GSF beam flags to PFM validity, depth limits, the counts); after the swath filter (which
needs the whole window, halo pings included), the kept soundings of the chunk's own pings are
placed, binned and written out ping by ping in a second (:func:`_k_place_emit`), which calls
the package's compiled placement and bin assignment (``geodesy._place_run``,
``pfm._grid._assign_points``) rather than copies of them. A piece's soundings are put in bin
order by a stable counting sort over the box of rows and columns their bins fall in
(:func:`_k_bin_count`, :func:`_k_bin_scatter`, straight into the output columns), or, when
that box is too large, by numpy's stable sort and a gather (:func:`_k_gather`). The per-row
loops index with unsigned integers: numba fixes up a negative signed index on every access.

Every rule is the one of the numpy path these kernels replaced (kept in
``tests/prepare_reference.py``, which the tests compare with column for column). No Dask.
"""

from __future__ import annotations

import math

import numpy as np

from . import validity as V
from ._numeric import CompiledKernels

__all__ = ["kernel"]

# counts[] slots of the kernels, named as in pieces.COUNT_KEYS
PINGS_READ, SOUNDINGS_READ, PING_SKIPPED, BEAM_REJECTED = 0, 1, 2, 3
OUTSIDE_AREA, LOADED, DEPTH_OUT_OF_RANGE, INVALID_BY_GSF_FLAGS = 4, 5, 6, 7
N_COUNTS = 8

# the placement's and the bin assignment's compiled helpers, bound by _linked before the first
# kernel compiles (they live in geodesy and pfm._grid, compiled by those modules' registries)
_place_run = _place_scratch = _assign_points = None

_INVAL = np.uint32(V.INVAL)
_LIMIT_FLAGS = np.uint32(V.FILTER_INVAL | V.MODIFIED)
_NULL_BEAM = 0x01


def _ping_end(ping, i):
    """The row after the last of the ping that starts at row ``i`` (rows of a ping are adjacent)."""
    p = ping[i]
    j = i + 1
    while j < ping.size and ping[j] == p:
        j += 1
    return j


def _k_screen(ping, lat, lon, pflags, depth, depth_ok, bflags, flags_ok, start, stop, table,
              min_depth, max_depth, null_depth, keep, validity, zlim, depth32,
              counts):  # pragma: no cover - compiled
    """pfmLoader's screening of each row of a chunk (pings ``(start, stop]`` are its own, the
    others the swath filter's context; ``lat``, ``lon``, ``pflags`` one value per ping): ``keep`` (ping usable and beam usable), ``validity``
    (the GSF flags' PFM validity, with FILTER_INVAL | MODIFIED where the depth is out of range),
    ``zlim`` (the depth, or ``null_depth`` out of range), ``depth32`` (the depth as a C float,
    written only when it has a row per row); counts of the own pings' rows added to ``counts``.

    A ping is skipped for a bad position (above 90 or 180, or not finite) or its ignore flag;
    a beam for a zero depth (as a float), no beam-flags array, or the null-beam flag 0x01,
    except the only beam of a one-beam ping. Null depths and flags count as 0 here."""
    n = ping.size
    want32 = depth32.size == n
    n_pings = n_read = n_skipped = n_rejected = 0   # local: the compiler keeps them in registers
    pi = -1   # the ping's index in the per-ping columns
    i = 0
    while i < n:
        pi += 1
        p = ping[i]
        j = _ping_end(ping, i)
        single = j - i == 1
        own = p > start and p <= stop
        if own:
            n_pings += 1
            n_read += j - i
        la = lat[pi]
        lo = lon[pi]
        ping_ok = (la <= 90.0 and lo <= 180.0 and (pflags[pi] & 1) == 0
                   and math.isfinite(la) and math.isfinite(lo))
        for ri in range(i, j):
            r = np.uint64(ri)     # unsigned indices: no negative-index fix-up per access
            d = depth[r] if depth_ok[r] else 0.0
            f = bflags[r] if flags_ok[r] else np.uint8(0)
            d32 = np.float32(d)
            usable = single or (d32 != np.float32(0.0) and flags_ok[r] and f != _NULL_BEAM)
            v = table[f]
            z = np.float64(d32)
            if z > max_depth or z <= min_depth or math.isnan(z):
                z = null_depth
                v = v | _LIMIT_FLAGS
            keep[r] = ping_ok and usable
            validity[r] = v
            zlim[r] = z
            if want32:
                depth32[r] = d32
            if own:
                if not ping_ok:
                    n_skipped += 1
                elif not usable:
                    n_rejected += 1
        i = j
    counts[PINGS_READ] += n_pings
    counts[SOUNDINGS_READ] += n_read
    counts[PING_SKIPPED] += n_skipped
    counts[BEAM_REJECTED] += n_rejected


def _k_place_emit(ping, keep, start, stop, lat, lon, heading, across, across_ok, along,
                  along_ok, ta, ma, ta2, ma2, tb, mb, dateline, min_x, min_y, max_x, max_y, x_bin,
                  y_bin, width, height, scale, poly_lat, poly_lon, rect, rect_box, beam, zlim,
                  validity, herr, herr_ok, verr, verr_ok, default_h, default_v, bflags, flags_ok,
                  table, null_depth, time_sec, time_nsec, o_bin, o_ping, o_beam, o_depth, o_x, o_y,
                  o_val, o_h, o_v, g_ping, g_head, g_sec, g_nsec,
                  counts, box):  # pragma: no cover - compiled
    """The kept soundings of the own pings ``(start, stop]`` placed, binned and written out,
    ping by ping: a multibeam ping's kept beams placed by the package's placement
    (:func:`pfm_dask.geodesy._place_run`, across- and along-track nulls as 0 m, the along-track
    move only where that array is present), a one-beam ping's beam at the ping position;
    bins by the package's assignment (:func:`pfm_dask.pfm._grid._assign_points`, with the
    grid's ``kernel_args``); the soundings inside the area as output rows, the pings they come
    from (heading and time), and the counts. ``lat``, ``lon``, ``heading``, ``time_sec``,
    ``time_nsec``: one value per ping. ``box`` (first row, last row, first column, last
    column) is widened to hold the bins written. Returns ``(rows, pings)`` written."""
    n = ping.size
    fa, g, coef = _place_scratch(ta, ta2, tb)
    widest = 0
    i = 0
    while i < n:
        j = _ping_end(ping, i)
        widest = max(widest, j - i)
        i = j
    # one ping's kept beams at a time
    p_across = np.empty(widest)
    p_along = np.empty(widest)
    p_present = np.empty(widest, dtype=np.bool_)
    p_lat = np.empty(widest)
    p_lon = np.empty(widest)
    p_col = np.empty(widest, dtype=np.int32)
    p_row = np.empty(widest, dtype=np.int32)
    p_in = np.empty(widest, dtype=np.bool_)
    p_bin = np.empty(widest, dtype=np.int64)
    p_x = np.empty(widest, dtype=np.uint16)
    p_y = np.empty(widest, dtype=np.uint16)
    p_bad = np.empty(widest, dtype=np.int64)
    p_limit = np.empty(widest, dtype=np.int64)
    k = 0
    gp = 0
    n_outside = n_bad = n_limit = 0   # local: the compiler keeps them in registers
    r0, r1, c0, c1 = box[0], box[1], box[2], box[3]
    pi = -1   # the ping's index in the per-ping columns
    i = 0
    while i < n:
        pi += 1
        p = ping[i]
        j = _ping_end(ping, i)
        if not (p > start and p <= stop):
            i = j
            continue
        # the kept beams: placement inputs, and the output columns that do not depend on the
        # position written at once (rows k..k+m; moved down below if some fall outside)
        m = 0
        for ri in range(i, j):
            r = np.uint64(ri)     # unsigned indices: no negative-index fix-up per access
            if keep[r]:
                p_across[m] = across[r] if across_ok[r] else 0.0
                p_along[m] = along[r] if along_ok[r] else 0.0
                p_present[m] = along_ok[r]
                q = np.uint64(k + m)
                o_ping[q] = p
                o_beam[q] = beam[r]
                z = zlim[r]
                o_depth[q] = z
                o_val[q] = validity[r]
                o_h[q] = np.float32(herr[r] if herr_ok[r] else default_h)
                o_v[q] = np.float32(verr[r] if verr_ok[r] else default_v)
                f = bflags[r] if flags_ok[r] else np.uint8(0)
                p_bad[m] = (table[f] & _INVAL) != 0
                p_limit[m] = z == null_depth
                m += 1
        if m == 0:
            i = j
            continue
        if j - i == 1:   # a one-beam ping: its beam is at the ping position
            p_lat[0] = lat[pi]
            p_lon[0] = lon[pi]
        else:
            _place_run(lat[pi], lon[pi], heading[pi], p_across, p_along, p_present, 0, m, ta, ma,
                       ta2, ma2, tb, mb, fa, g, coef, p_lat, p_lon)
        _assign_points(p_lat, p_lon, 0, m, dateline, min_x, min_y, max_x, max_y, x_bin, y_bin,
                       width, height, scale, poly_lat, poly_lon, rect, rect_box, p_col, p_row,
                       p_in, p_bin, p_x, p_y)
        kept = 0
        for q in range(m):
            kept += p_in[q]
            if p_in[q]:   # the box of rows and columns the ping's soundings fall in
                r0 = min(r0, p_row[q])
                r1 = max(r1, p_row[q])
                c0 = min(c0, p_col[q])
                c1 = max(c1, p_col[q])
        if kept == m:    # all inside the area: the position columns as they are
            for q in range(m):
                w = np.uint64(k + q)
                o_bin[w] = p_bin[q]
                o_x[w] = p_x[q]
                o_y[w] = p_y[q]
                n_bad += p_bad[q]
                n_limit += p_limit[q]
        else:            # drop the soundings outside, keeping the order
            w = k
            for q in range(m):
                if not p_in[q]:
                    n_outside += 1
                    continue
                o_bin[w] = p_bin[q]
                o_x[w] = p_x[q]
                o_y[w] = p_y[q]
                o_ping[w] = o_ping[k + q]
                o_beam[w] = o_beam[k + q]
                o_depth[w] = o_depth[k + q]
                o_val[w] = o_val[k + q]
                o_h[w] = o_h[k + q]
                o_v[w] = o_v[k + q]
                n_bad += p_bad[q]
                n_limit += p_limit[q]
                w += 1
        if kept:
            g_ping[gp] = p
            g_head[gp] = heading[pi]
            g_sec[gp] = time_sec[pi]
            g_nsec[gp] = time_nsec[pi]
            gp += 1
            k += kept
        i = j
    box[0], box[1], box[2], box[3] = r0, r1, c0, c1
    counts[OUTSIDE_AREA] += n_outside
    counts[LOADED] += k
    counts[INVALID_BY_GSF_FLAGS] += n_bad
    counts[DEPTH_OUT_OF_RANGE] += n_limit
    return k, gp


def _k_in_order(ping, beam):  # pragma: no cover - compiled
    """True when the rows come in (ping, beam) order (non-decreasing), as decoded pings do."""
    for i in range(1, ping.size):
        if ping[i] < ping[i - 1] or (ping[i] == ping[i - 1] and beam[i] < beam[i - 1]):
            return False
    return True


def _k_gather(order, bins, ping, beam, depth, x_off, y_off, validity, herr, verr, o_bin, o_ping,
              o_beam, o_depth, o_x, o_y, o_val, o_h, o_v):  # pragma: no cover - compiled
    """The output columns in ``order``, all in one pass."""
    for k in range(order.size):
        i = np.uint64(order[k])     # unsigned: no negative-index fix-up
        o_bin[k] = bins[i]
        o_ping[k] = ping[i]
        o_beam[k] = beam[i]
        o_depth[k] = depth[i]
        o_x[k] = x_off[i]
        o_y[k] = y_off[i]
        o_val[k] = validity[i]
        o_h[k] = herr[i]
        o_v[k] = verr[i]


_k_in_order64 = _k_in_order   # the same test for int64 columns (callers other than the task)


def _row_col(b, width, inv_w):
    """Row and column of bin index ``b`` (``row * width + col``, below 2**31) without an
    integer division: the float quotient is off by one at most, which the remainder corrects."""
    r = np.int64(np.float64(b) * inv_w)
    c = b - r * width
    if c < 0:
        r -= 1
        c += width
    elif c >= width:
        r += 1
        c -= width
    return r, c


def _k_bin_count(bins, width, inv_w, r0, c0, span_c, counts):  # pragma: no cover - compiled
    """``counts[key + 1] += 1`` for each bin's key in the box (row-major, as the bin index)."""
    for k in range(bins.size):
        r, c = _row_col(bins[k], width, inv_w)
        counts[np.uint64((r - r0) * span_c + (c - c0) + 1)] += 1


def _k_bin_scatter(bins, ping, beam, depth, x_off, y_off, validity, herr, verr, width, inv_w, r0,
                   c0, span_c, nxt, o_bin, o_ping, o_beam, o_depth, o_x, o_y, o_val, o_h,
                   o_v):  # pragma: no cover - compiled
    """Each row to the next free place of its bin (``nxt``: the first place of each key, moved
    on as rows arrive): a stable counting sort, written straight into the output columns."""
    for i in range(bins.size):
        b = bins[i]
        r, c = _row_col(b, width, inv_w)
        key = np.uint64((r - r0) * span_c + (c - c0))   # unsigned: no negative-index fix-up
        k = np.uint64(nxt[key])
        nxt[key] = k + 1
        o_bin[k] = b
        o_ping[k] = ping[i]
        o_beam[k] = beam[i]
        o_depth[k] = depth[i]
        o_x[k] = x_off[i]
        o_y[k] = y_off[i]
        o_val[k] = validity[i]
        o_h[k] = herr[i]
        o_v[k] = verr[i]


def _signatures(T) -> dict:
    def a(t, readonly=False):
        return T.Array(t, 1, "C", readonly=readonly)

    f8, f4, u1, u2, u4, i4, i8, b1 = (T.float64, T.float32, T.uint8, T.uint16, T.uint32, T.int32,
                                      T.int64, T.boolean)
    u4t = a(u4, True)
    f8r = a(f8, True)
    m8r = T.Array(f8, 2, "C", readonly=True)
    return {
        "screen": T.void(a(u4), a(f8), a(f8), a(u2), a(f8), a(b1), a(u1), a(b1), i8, i8, u4t,
                         f8, f8, f8, a(b1), a(u4), a(f8), a(f4), a(i8)),
        "place_emit": T.UniTuple(i8, 2)(
            a(u4), a(b1), i8, i8, a(f8), a(f8), a(f8), a(f8), a(b1), a(f8), a(b1),
            f8r, m8r, f8r, m8r, f8r, m8r, b1, f8, f8, f8, f8, f8, f8, i8, i8, f8, f8r, f8r, b1,
            f8r, a(u2), a(f8), a(u4), a(f8), a(b1), a(f8), a(b1), f8, f8, a(u1), a(b1), u4t, f8,
            a(i8), a(i4), a(u4), a(u4), a(u2), a(f8), a(u2), a(u2), a(u4), a(f4), a(f4), a(u4),
            a(f8), a(i8), a(i4), a(i8), a(i8)),
        "in_order": b1(a(u4), a(u2)),
        "in_order64": b1(a(i8), a(i8)),
        "gather": T.void(a(i8), a(u4), a(u4), a(u2), a(f8), a(u2), a(u2), a(u4), a(f4), a(f4),
                         a(u4), a(u4), a(u2), a(f8), a(u2), a(u2), a(u4), a(f4), a(f4)),
        "bin_count": T.void(a(u4), i8, f8, i8, i8, i8, a(u4)),
        "bin_scatter": T.void(a(u4), a(u4), a(u2), a(f8), a(u2), a(u2), a(u4), a(f4), a(f4), i8,
                              f8, i8, i8, i8, a(u4), a(u4), a(u4), a(u2), a(f8), a(u2), a(u2),
                              a(u4), a(f4), a(f4)),
    }


#: the compiled ``_k_<name>`` (compiled, or loaded from numba's on-disk cache, on first use)
def _linked(numba) -> dict:
    """The placement's and the bin assignment's compiled helpers, called per ping: made ready
    by their own modules' registries (numba's cache of the kernel that calls them is keyed by
    this file only: ``tests/test_prepare_kernels.py`` compares the result with the numpy path,
    which calls those modules' own kernels, so a stale cache fails the tests)."""
    from . import geodesy
    from .pfm import _grid

    geodesy._kernel.load(["place"])
    _grid._kernel.load(["assign16"])
    return {"_place_run": geodesy._place_run, "_place_scratch": geodesy._place_scratch,
            "_assign_points": _grid._assign_points}


kernel = CompiledKernels(globals(), _signatures, helpers=("_ping_end", "_row_col"), prepare=_linked)
