"""The swath filter's compiled kernel: robust local-plane scores for 8 neighbouring beams at once.

One call scores a whole file (or ping range) laid out by :func:`pfm_dask._swath.swath_filter`.
For each ping with soundings to test it fills a ``window_pings``-row strip of the ping x beam
grid (NaN = no valid sounding) and walks the ping's beams 8 at a time, one beam per float32
lane of an AVX register (``pfm_dask._simd``). Every median is two middle order statistics of
a sorting network run on the lanes in registers; a missing neighbour is padded with -inf or
+inf, half and half, so that the middle of the padded window is the median of the valid
neighbours whatever their number. The arithmetic is the filter's, operation for operation
(float32 neighbours and residuals, float64 scale and 3 x 3 solve); only the order of the
float32 weighted sums differs from a plain loop. See ``docs/filters.md``.
"""

from __future__ import annotations

import numba
import numpy as np

from ._simd import (LANES, vabs, vadd, vlt_select, vload, vmul, vnan_is, vpos, vsort_pair,
                    vsplat, vstore, vsub)

__all__ = ["score_file", "has_duplicate"]

_TUKEY_C = 4.685
_MAD_TO_SIGMA = 1.4826
_RIDGE = 1e-6
_JIT = dict(nogil=True, error_model="numpy")     # numpy's division by zero; no fast-math


@numba.njit(**_JIT)
def _nanmax(a, b):
    """numpy's maximum: NaN if either is NaN."""
    if a != a:
        return a
    if b != b:
        return b
    return a if a >= b else b


@numba.njit(**_JIT)
def _floor(s, level, min_scale, rel_min_scale):
    return _nanmax(s, _nanmax(min_scale, rel_min_scale * abs(level)))


def _k_score_file(rowpos, starts, ends, col, depth, good, cand, width, hp, hb, dpk, dbk, tok,
                  threshold, min_nb, min_scale, rel_min_scale, plane, iterations, flags, counts):
    """Flag the ``cand`` soundings whose robust score exceeds ``threshold`` (see module doc).

    ``rowpos``, ``starts``, ``ends``: grid row and sounding range of each distinct ping (input
    sorted by ping); ``col``: 0-based beam column; ``good``: usable as a neighbour; ``dpk``,
    ``dbk``: the K neighbour offsets; ``tok``: any K-tuple (selects the sorting network).
    Writes ``flags`` and ``counts = [tested, sparse]``.
    """
    n_rows = starts.shape[0]
    K = dpk.shape[0]
    L = LANES
    wpad = width + 2 * hb + L
    W = np.empty((2 * hp + 1) * wpad, np.float32)
    cidx = np.full(width + L, -1, np.int64)
    Z = np.empty((K, L), np.float32)        # neighbour depths, NaN = missing
    P = np.empty((K, L), np.float32)        # NaN = valid, else the pad (-inf / +inf)
    R = np.empty((K, L), np.float32)        # residuals from the median, NaN = missing
    R0 = np.empty((K, L), np.float32)       # the same, 0 = missing
    U = np.empty((K, L), np.float32)        # residuals from the last plane, NaN = missing
    S = np.empty((K, L), np.float32)        # the network's input
    off = np.empty(K, np.int64)
    dbf = np.empty(K, np.float32)
    dpf = np.empty(K, np.float32)
    for k in range(K):
        off[k] = (hp + dpk[k]) * wpad + hb + dbk[k]
        dbf[k] = np.float32(dbk[k])
        dpf[k] = np.float32(dpk[k])
    # Rows of the window: neighbours rstart[r]..rstart[r + 1] - 1 have ping offset rdp[r].
    n_wrows = 2 * hp + 1
    rstart = np.zeros(n_wrows + 1, np.int64)
    rdp = np.empty(n_wrows, np.float32)
    for r in range(n_wrows):
        rdp[r] = np.float32(r - hp)
        rstart[r + 1] = rstart[r]
        for k in range(K):
            if dpk[k] == r - hp:
                rstart[r + 1] += 1
    lane = np.empty(L, np.float32)
    half = np.empty(L, np.float32)
    even = np.empty(L, np.float32)
    nv = np.zeros(L, np.int64)
    a0 = np.zeros(L, np.float32)
    a = np.zeros(L, np.float64)
    scale = np.zeros(L, np.float64)
    coef = np.zeros((3, L), np.float64)
    cf = np.zeros((4, L), np.float32)       # c0, c1, c2 as float32, then 1 / (c * scale)
    acc = np.zeros((9, L), np.float32)
    zero = vsplat(np.float32(0.0))
    one = vsplat(np.float32(1.0))
    nan = vsplat(np.float32(np.nan))
    ninf = vsplat(np.float32(-np.inf))
    pinf = vsplat(np.float32(np.inf))
    vhalf = vsplat(np.float32(0.5))
    tested = 0
    sparse = 0
    for i in range(n_rows):
        s0 = starts[i]
        s1 = ends[i]
        todo = False
        for s in range(s0, s1):
            if cand[s]:
                todo = True
                break
        if not todo:
            continue
        # The strip of pings within the half window (by grid row), NaN where nothing valid.
        W[:] = np.float32(np.nan)
        j0 = i
        while j0 > 0 and rowpos[i] - rowpos[j0 - 1] <= hp:
            j0 -= 1
        j1 = i
        while j1 < n_rows - 1 and rowpos[j1 + 1] - rowpos[i] <= hp:
            j1 += 1
        for j in range(j0, j1 + 1):
            base = (rowpos[j] - rowpos[i] + hp) * wpad + hb
            for s in range(starts[j], ends[j]):
                if good[s]:
                    W[base + col[s]] = np.float32(depth[s])
        cidx[:] = -1
        for s in range(s0, s1):
            if cand[s]:
                cidx[col[s]] = s
        for c0 in range(0, width, L):
            todo = False
            for l in range(L):
                if cidx[c0 + l] >= 0:
                    todo = True
            if not todo:
                continue
            # Neighbours of the 8 beams, and how many are missing in each lane.
            miss = zero
            for k in range(K):
                z = vload(W, off[k] + c0)
                vstore(Z, k * L, z)
                miss = vadd(miss, vnan_is(z, one, zero))
            vstore(lane, 0, miss)
            for l in range(L):
                m = np.int64(lane[l])
                nv[l] = K - m
                half[l] = np.float32(m // 2)
                even[l] = np.float32(0.0) if m % 2 == 0 else np.float32(np.nan)
            vhalfm = vload(half, 0)
            veven = vload(even, 0)
            # Pads: the first half (rounded down) of a lane's missing neighbours -inf, the rest
            # +inf; the network's rows K/2 - 1 and K/2 are then the valid neighbours' middle.
            cnt = zero
            for k in range(K):
                z = vload(Z, k * L)
                pad = vnan_is(z, vlt_select(cnt, vhalfm, ninf, pinf), nan)
                vstore(P, k * L, pad)
                vstore(S, k * L, vnan_is(pad, z, pad))
                cnt = vadd(cnt, vnan_is(z, one, zero))
            lo, hi = vsort_pair(S, tok)
            va0 = vmul(vhalf, vadd(lo, vnan_is(veven, lo, hi)))   # the median, float32
            for k in range(K):
                r = vsub(vload(Z, k * L), va0)
                vstore(R, k * L, r)
                vstore(R0, k * L, vnan_is(r, zero, r))
                pad = vload(P, k * L)
                vstore(S, k * L, vnan_is(pad, vabs(r), pad))
            lo, hi = vsort_pair(S, tok)
            vstore(lane, 0, vmul(vhalf, vadd(lo, vnan_is(veven, lo, hi))))
            vstore(a0, 0, va0)
            for l in range(L):
                a[l] = np.float64(a0[l])
                scale[l] = _floor(_MAD_TO_SIGMA * np.float64(lane[l]), a[l], min_scale,
                                  rel_min_scale)
                coef[0, l] = 0.0
                coef[1, l] = 0.0
                coef[2, l] = 0.0
            if plane:
                for it in range(iterations):
                    # Tukey-biweight weights of the residuals from the last fit (U; R at first)
                    # and the weighted sums of the normal equations, summed row by row of the
                    # window (a row is one ping offset dp, so dp factors out of its sums).
                    for l in range(L):
                        cf[3, l] = np.float32(1.0 / (_TUKEY_C * scale[l]))
                    inv = vload(cf, 3 * L)
                    m0 = zero
                    m1 = zero
                    m2 = zero
                    m3 = zero
                    m4 = zero
                    m5 = zero
                    q0 = zero
                    q1 = zero
                    q2 = zero
                    src = R if it == 0 else U
                    for row in range(n_wrows):
                        sw = zero
                        swb = zero
                        swbb = zero
                        sq = zero
                        sqb = zero
                        for k in range(rstart[row], rstart[row + 1]):
                            db = vsplat(dbf[k])
                            u = vmul(vload(src, k * L), inv)
                            w = vpos(vsub(one, vmul(u, u)))     # 0 where missing (NaN)
                            w = vmul(w, w)
                            wr = vmul(w, vload(R0, k * L))
                            wb = vmul(w, db)
                            sw = vadd(sw, w)
                            swb = vadd(swb, wb)
                            swbb = vadd(swbb, vmul(wb, db))
                            sq = vadd(sq, wr)
                            sqb = vadd(sqb, vmul(wr, db))
                        dp = vsplat(rdp[row])
                        m0 = vadd(m0, sw)
                        m1 = vadd(m1, swb)
                        m2 = vadd(m2, vmul(sw, dp))
                        m3 = vadd(m3, swbb)
                        m4 = vadd(m4, vmul(swb, dp))
                        m5 = vadd(m5, vmul(vmul(sw, dp), dp))
                        q0 = vadd(q0, sq)
                        q1 = vadd(q1, sqb)
                        q2 = vadd(q2, vmul(sq, dp))
                    vstore(acc, 0, m0)
                    vstore(acc, L, m1)
                    vstore(acc, 2 * L, m2)
                    vstore(acc, 3 * L, m3)
                    vstore(acc, 4 * L, m4)
                    vstore(acc, 5 * L, m5)
                    vstore(acc, 6 * L, q0)
                    vstore(acc, 7 * L, q1)
                    vstore(acc, 8 * L, q2)
                    for l in range(L):
                        _solve_lane(acc, coef, l)
                        a[l] = np.float64(a0[l]) + coef[0, l]
                        cf[0, l] = np.float32(coef[0, l])
                        cf[1, l] = np.float32(coef[1, l])
                        cf[2, l] = np.float32(coef[2, l])
                    # Residuals from the new plane (float32), and their median absolute value.
                    c0v = vload(cf, 0)
                    c1v = vload(cf, L)
                    c2v = vload(cf, 2 * L)
                    for k in range(K):
                        fit = vadd(vadd(vmul(c1v, vsplat(dbf[k])), vmul(c2v, vsplat(dpf[k]))),
                                   c0v)
                        u = vsub(vload(R, k * L), fit)
                        vstore(U, k * L, u)
                        pad = vload(P, k * L)
                        vstore(S, k * L, vnan_is(pad, vabs(u), pad))
                    lo, hi = vsort_pair(S, tok)
                    vstore(lane, 0, vmul(vhalf, vadd(lo, vnan_is(veven, lo, hi))))
                    for l in range(L):
                        scale[l] = _floor(_MAD_TO_SIGMA * np.float64(lane[l]), a[l], min_scale,
                                          rel_min_scale)
            for l in range(L):
                s = cidx[c0 + l]
                if s < 0:
                    continue
                if nv[l] >= min_nb:
                    tested += 1
                    flags[s] = abs((depth[s] - a[l]) / scale[l]) > threshold
                else:
                    sparse += 1
    counts[0] = tested
    counts[1] = sparse


@numba.njit(**_JIT)
def _solve_lane(acc, coef, l):
    """One lane's weighted least-squares step: ``coef`` from the float32 sums in ``acc``.

    The normal matrix [[a, b, c], [b, d, e], [c, e, f]] (slopes ridged) is solved in float64
    by the adjugate; with no weight left (a not > 0) the previous estimate is kept.
    """
    ma = np.float64(acc[0, l])
    mb = np.float64(acc[1, l])
    mc = np.float64(acc[2, l])
    md = np.float64(acc[3, l]) + _RIDGE
    me = np.float64(acc[4, l])
    mf = np.float64(acc[5, l]) + _RIDGE
    r0 = np.float64(acc[6, l])
    r1 = np.float64(acc[7, l])
    r2 = np.float64(acc[8, l])
    if not ma > 0:
        ma, mb, mc, md, me, mf = 1.0, 0.0, 0.0, 1.0, 0.0, 1.0
        r0, r1, r2 = coef[0, l], coef[1, l], coef[2, l]
    A11 = md * mf - me * me
    A12 = mc * me - mb * mf
    A13 = mb * me - mc * md
    A22 = ma * mf - mc * mc
    A23 = mb * mc - ma * me
    A33 = ma * md - mb * mb
    det = ma * A11 + mb * A12 + mc * A13
    coef[0, l] = (A11 * r0 + A12 * r1 + A13 * r2) / det
    coef[1, l] = (A12 * r0 + A22 * r1 + A23 * r2) / det
    coef[2, l] = (A13 * r0 + A23 * r1 + A33 * r2) / det


def _jit_cached(fn):
    """``fn`` compiled lazily by numba, cached on disk when a cache directory is writable."""
    try:
        return numba.njit(cache=True, **_JIT)(fn)
    except RuntimeError as exc:     # no writable cache directory
        if "cannot cache" not in str(exc):
            raise
        return numba.njit(**_JIT)(fn)


#: :func:`_k_score_file`, compiled on first call for each window size.
score_file = _jit_cached(_k_score_file)


def _k_duplicate(starts, ends, col, width):
    """True when some ping has two soundings in the same beam column."""
    seen = np.full(width, -1, np.int64)
    for i in range(starts.shape[0]):
        for s in range(starts[i], ends[i]):
            if seen[col[s]] == i:
                return True
            seen[col[s]] = i
    return False


#: :func:`_k_duplicate`, compiled on first call.
has_duplicate = _jit_cached(_k_duplicate)
