"""The swath filter's compiled kernel: robust local-plane scores for 8 neighbouring beams at once.

One call scores a whole file (or ping range) laid out by :func:`pfm_dask.filters._swath.swath_filter`.
For each ping with soundings to test it fills a ``window_pings``-row strip of the ping x beam
grid (NaN = no valid sounding) and walks the ping's beams 8 at a time, one beam per float32
lane of an AVX register (``pfm_dask.filters._simd``). Every median is two middle order statistics of
a sorting network run on the lanes in registers; a missing neighbour is padded with -inf or
+inf, half and half, so that the middle of the padded window is the median of the valid
neighbours whatever their number. The arithmetic is the filter's, operation for operation
(float32 neighbours and residuals, float64 scale and 3 x 3 solve); only the order of the
float32 weighted sums differs from a plain loop. See ``docs/filters.md``.
"""

from __future__ import annotations

import numpy as np

from .._numeric import njit_cached, njit_helper
from ._simd import (LANES, vabs, vadd, vdiv, vgt0_select, vlt_select, vload, vmul, vnan_is,
                    vnanmax, vnarrow, vpos, vsort_pair, vsplat, vstore, vsub, vwiden)

__all__ = ["score_file", "has_duplicate"]

_TUKEY_C = 4.685
_MAD_TO_SIGMA = 1.4826
_RIDGE = 1e-6


@njit_helper
def _scale4(mad, level, min_scale, rel_min_scale):
    """1.4826 x MAD floored at max(min_scale, rel_min_scale x |level|), numpy's NaN rules."""
    return vnanmax(vmul(vsplat(_MAD_TO_SIGMA), mad),
                   vnanmax(min_scale, vmul(rel_min_scale, vabs(level))))


@njit_helper
def _solve4(m0, m1, m2, m3, m4, m5, q0, q1, q2, c0, c1, c2):
    """Four lanes' weighted least-squares step: the new plane from the normal equations.

    [[m0, m1, m2], [m1, m3 + ridge, m4], [m2, m4, m5 + ridge]] x = [q0, q1, q2] is solved in
    float64 by the adjugate; in a lane with no weight left (m0 not > 0) the system becomes
    the identity with the previous plane ``c0, c1, c2`` as right-hand side, which keeps it.
    """
    zero = vsplat(0.0)
    one = vsplat(1.0)
    ridge = vsplat(_RIDGE)
    mb = vgt0_select(m0, m1, zero)
    mc = vgt0_select(m0, m2, zero)
    md = vgt0_select(m0, vadd(m3, ridge), one)
    me = vgt0_select(m0, m4, zero)
    mf = vgt0_select(m0, vadd(m5, ridge), one)
    r0 = vgt0_select(m0, q0, c0)
    r1 = vgt0_select(m0, q1, c1)
    r2 = vgt0_select(m0, q2, c2)
    ma = vgt0_select(m0, m0, one)
    A11 = vsub(vmul(md, mf), vmul(me, me))
    A12 = vsub(vmul(mc, me), vmul(mb, mf))
    A13 = vsub(vmul(mb, me), vmul(mc, md))
    A22 = vsub(vmul(ma, mf), vmul(mc, mc))
    A23 = vsub(vmul(mb, mc), vmul(ma, me))
    A33 = vsub(vmul(ma, md), vmul(mb, mb))
    det = vadd(vadd(vmul(ma, A11), vmul(mb, A12)), vmul(mc, A13))
    x0 = vdiv(vadd(vadd(vmul(A11, r0), vmul(A12, r1)), vmul(A13, r2)), det)
    x1 = vdiv(vadd(vadd(vmul(A12, r0), vmul(A22, r1)), vmul(A23, r2)), det)
    x2 = vdiv(vadd(vadd(vmul(A13, r0), vmul(A23, r1)), vmul(A33, r2)), det)
    return x0, x1, x2


@njit_helper
def _median(lo, hi, veven):
    """The median from the network's two middle rows (see the padding in the kernel)."""
    return vmul(vsplat(np.float32(0.5)), vadd(hi, vnan_is(veven, hi, lo)))


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
    missing = np.empty(L, np.float32)
    a = np.empty(L, np.float64)             # the surface at the centre, per lane
    scale = np.empty(L, np.float64)
    zero = vsplat(np.float32(0.0))
    one = vsplat(np.float32(1.0))
    nan = vsplat(np.float32(np.nan))
    ninf = vsplat(np.float32(-np.inf))
    pinf = vsplat(np.float32(np.inf))
    vhalf = vsplat(np.float32(0.5))
    dzero = vsplat(0.0)
    tukey = vsplat(_TUKEY_C)
    dmin = vsplat(np.float64(min_scale))
    drel = vsplat(np.float64(rel_min_scale))
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
            for lane in range(L):
                if cidx[c0 + lane] >= 0:
                    todo = True
            if not todo:
                continue
            # Neighbours of the 8 beams (Z), and pads (P) for the missing ones: -inf, +inf,
            # -inf, ... in turn, lane by lane. With m of the K missing, ceil(m / 2) pads sort
            # below every valid neighbour and floor(m / 2) above, so the network's rows K/2 - 1
            # and K/2 are the valid neighbours' two middle values (m even), or row K/2 their
            # middle value (m odd).
            miss = zero
            par = zero                  # lane: 1 after an odd number of missing neighbours
            for k in range(K):
                z = vload(W, off[k] + c0)
                vstore(Z, k * L, z)
                pad = vnan_is(z, vlt_select(par, vhalf, ninf, pinf), nan)
                vstore(P, k * L, pad)
                vstore(S, k * L, vnan_is(pad, z, pad))
                par = vnan_is(z, vsub(one, par), par)
                miss = vadd(miss, vnan_is(z, one, zero))
            vstore(missing, 0, miss)
            veven = vlt_select(par, vhalf, zero, nan)   # NaN in the lanes with m odd
            lo, hi = vsort_pair(S, tok)
            a0 = _median(lo, hi, veven)                 # the neighbours' median, float32
            for k in range(K):
                r = vsub(vload(Z, k * L), a0)
                vstore(R, k * L, r)
                vstore(R0, k * L, vnan_is(r, zero, r))
                pad = vload(P, k * L)
                vstore(S, k * L, vnan_is(pad, vabs(r), pad))
            lo, hi = vsort_pair(S, tok)
            mad = _median(lo, hi, veven)
            # Surface, scale and plane in float64, lanes 0-3 and 4-7.
            a_lo = vwiden(a0, 0)
            a_hi = vwiden(a0, 1)
            sc_lo = _scale4(vwiden(mad, 0), a_lo, dmin, drel)
            sc_hi = _scale4(vwiden(mad, 1), a_hi, dmin, drel)
            c0_lo = dzero
            c1_lo = dzero
            c2_lo = dzero
            c0_hi = dzero
            c1_hi = dzero
            c2_hi = dzero
            if plane:
                for it in range(iterations):
                    # Tukey-biweight weights of the residuals from the last fit (U; R at first)
                    # and the weighted sums of the normal equations, summed row by row of the
                    # window (a row is one ping offset dp, so dp factors out of its sums).
                    inv = vnarrow(vdiv(vsplat(1.0), vmul(tukey, sc_lo)),
                                  vdiv(vsplat(1.0), vmul(tukey, sc_hi)))
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
                    c0_lo, c1_lo, c2_lo = _solve4(
                        vwiden(m0, 0), vwiden(m1, 0), vwiden(m2, 0), vwiden(m3, 0),
                        vwiden(m4, 0), vwiden(m5, 0), vwiden(q0, 0), vwiden(q1, 0),
                        vwiden(q2, 0), c0_lo, c1_lo, c2_lo)
                    c0_hi, c1_hi, c2_hi = _solve4(
                        vwiden(m0, 1), vwiden(m1, 1), vwiden(m2, 1), vwiden(m3, 1),
                        vwiden(m4, 1), vwiden(m5, 1), vwiden(q0, 1), vwiden(q1, 1),
                        vwiden(q2, 1), c0_hi, c1_hi, c2_hi)
                    a_lo = vadd(vwiden(a0, 0), c0_lo)
                    a_hi = vadd(vwiden(a0, 1), c0_hi)
                    # Residuals from the new plane (float32), and their median absolute value.
                    c0v = vnarrow(c0_lo, c0_hi)
                    c1v = vnarrow(c1_lo, c1_hi)
                    c2v = vnarrow(c2_lo, c2_hi)
                    for k in range(K):
                        fit = vadd(vadd(vmul(c1v, vsplat(dbf[k])), vmul(c2v, vsplat(dpf[k]))),
                                   c0v)
                        u = vsub(vload(R, k * L), fit)
                        vstore(U, k * L, u)
                        pad = vload(P, k * L)
                        vstore(S, k * L, vnan_is(pad, vabs(u), pad))
                    lo, hi = vsort_pair(S, tok)
                    mad = _median(lo, hi, veven)
                    sc_lo = _scale4(vwiden(mad, 0), a_lo, dmin, drel)
                    sc_hi = _scale4(vwiden(mad, 1), a_hi, dmin, drel)
            vstore(a, 0, a_lo)
            vstore(a, 4, a_hi)
            vstore(scale, 0, sc_lo)
            vstore(scale, 4, sc_hi)
            for lane in range(L):
                s = cidx[c0 + lane]
                if s < 0:
                    continue
                if K - np.int64(missing[lane]) >= min_nb:
                    tested += 1
                    flags[s] = abs((depth[s] - a[lane]) / scale[lane]) > threshold
                else:
                    sparse += 1
    counts[0] = tested
    counts[1] = sparse


#: :func:`_k_score_file`, compiled on first call for each window size.
score_file = njit_cached(_k_score_file)


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
has_duplicate = njit_cached(_k_duplicate)
