"""The swath filter's compiled kernel: robust local-plane scores for 8 neighbouring beams at once.

One call scores a whole file (or ping range) laid out by :func:`pfm_dask.filters._swath.swath_filter`.
The ping x beam grid is kept as a ring of ``window_pings`` rows (NaN = no valid sounding), each
ping's row filled once. For each ping with soundings to test the kernel walks its beams 8 at a
time, one beam per float32 lane of an AVX register (``pfm_dask.filters._simd``). Every median is
two middle order statistics of a sorting network run on the lanes in registers. Where none of
the 8 windows misses a neighbour the first network sorts the rows where they lie in the ring;
elsewhere a missing neighbour is padded with -inf or +inf, half and half, so that the middle of
the padded window is the median of the valid neighbours whatever their number. The last median
of absolute residuals only decides the flags, so it is computed only for groups where counting
the residuals below a bound does not already prove every sounding unflagged. The arithmetic is
the filter's (float32 neighbours and residuals, float64 scale and 3 x 3 solve); only the order
of the float32 weighted sums differs from a plain loop. See ``docs/filters.md``.
"""

from __future__ import annotations

import numpy as np

from .._numeric import njit_cached, njit_helper
from ._simd import (LANES, vabs, vadd, vdiv, vgt0_select, vlt_select, vload, vmul, vnan_is,
                    vnanmax, vnarrow, vpos, vsort_pair, vsort_rows, vsplat, vstore, vsub,
                    vwiden)

__all__ = ["score_file", "has_duplicate"]

_TUKEY_C = 4.685
_MAD_TO_SIGMA = 1.4826
_RIDGE = 1e-6
#: relative margin of the bound that settles a sounding before its last median (_bounds)
_MARGIN = 1e-5


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


@njit_helper
def _bounds(cand, depth, a, cf, missing, K, min_nb, xfac, xs, forced):
    """For each lane about to be scored: ``xs``, a float32 that the last median of absolute
    residuals must reach to leave the sounding unflagged, with a relative margin of
    ``_MARGIN`` over every rounding between that median and the score; ``forced`` where
    the bound is not safe (a median or plane coefficient beyond 1e30, whose residuals could
    be NaN). Lanes not scored get -inf (nothing to decide).

    A median >= xs gives scale >= 1.4826 * xs > |depth - a| / threshold, so a score below
    the threshold, whatever the floor. ``cf``: the lanes' median and plane (4 x 8).
    """
    for lane in range(cand.shape[0]):
        s = cand[lane]
        forced[lane] = False
        xs[lane] = -np.inf
        if s < 0 or K - np.int64(missing[lane]) < min_nb:
            continue
        for j in range(4):
            if not abs(cf[j * cand.shape[0] + lane]) < 1e30:
                forced[lane] = True
        if not forced[lane]:
            xs[lane] = np.float32(abs(depth[s] - a[lane]) * xfac)


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
    n_wrows = 2 * hp + 1
    wpad = width + 2 * hb + L
    # The strip: one slot per grid row of the window, grid row r in slot r % n_wrows, so a
    # ping's row is filled once and serves the 2 * hp + 1 pings whose windows hold it.
    W = np.empty(n_wrows * wpad, np.float32)
    slot_row = np.full(n_wrows, -hp - 1, np.int64)     # the grid row each slot holds
    cidx = np.full(width + L, -1, np.int64)
    Z = np.empty((K, L), np.float32)        # neighbour depths, NaN = missing
    P = np.empty((K, L), np.float32)        # NaN = valid, else the pad (-inf / +inf)
    R = np.empty((K, L), np.float32)        # residuals from the median, NaN = missing
    R0 = np.empty((K, L), np.float32)       # the same, 0 = missing
    # The network's input: |residual| (from the median, then from each plane), or the pad.
    # The Tukey weights are read from it too, the sign not mattering to them (a pad gives 0).
    S = np.empty((K, L), np.float32)
    off = np.empty(K, np.int64)             # neighbour k's place in W, this ping
    n_wcols = 2 * hb + 1
    CB = np.empty((n_wcols, L), np.float32)  # the plane's c1 * db, column by column
    CP = np.empty((n_wrows, L), np.float32)  # and its c2 * dp, row by row
    cbk = np.empty(K, np.int64)             # neighbour k's row of CB, times L
    kidx = np.full(n_wrows * n_wcols, -1, np.int64)     # the window's cells: k, or -1
    cpk = np.empty(K, np.int64)             # and of CP
    dbf = np.empty(K, np.float32)
    for k in range(K):
        dbf[k] = np.float32(dbk[k])
        cbk[k] = (dbk[k] + hb) * L
        kidx[(dpk[k] + hp) * n_wcols + dbk[k] + hb] = k
        cpk[k] = (dpk[k] + hp) * L
    # Rows of the window: neighbours rstart[r]..rstart[r + 1] - 1 have ping offset rdp[r].
    rstart = np.zeros(n_wrows + 1, np.int64)
    rdp = np.empty(n_wrows, np.float32)
    for r in range(n_wrows):
        rdp[r] = np.float32(r - hp)
        rstart[r + 1] = rstart[r]
        for k in range(K):
            if dpk[k] == r - hp:
                rstart[r + 1] += 1
    missing = np.empty(L, np.float32)
    xs = np.full(L, -np.inf, np.float32)    # per lane: a median >= this leaves it unflagged
    below = np.empty(L, np.float32)         # per lane: residuals below xs
    forced = np.zeros(L, np.bool_)          # per lane: needs the last median all the same
    cf = np.empty(4 * L, np.float32)        # the median and the plane, lane by lane
    xfac = (1.0 + _MARGIN) / (_MAD_TO_SIGMA * threshold)
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
        # The grid rows within the half window, each in its slot (NaN where nothing valid).
        j0 = i
        while j0 > 0 and rowpos[i] - rowpos[j0 - 1] <= hp:
            j0 -= 1
        j = j0
        for r in range(rowpos[i] - hp, rowpos[i] + hp + 1):
            at_ping = j < n_rows and rowpos[j] == r
            slot = r % n_wrows
            if slot_row[slot] != r:
                slot_row[slot] = r
                base = slot * wpad
                W[base:base + wpad] = np.float32(np.nan)
                if at_ping:
                    base += hb
                    for s in range(starts[j], ends[j]):
                        if good[s]:
                            W[base + col[s]] = np.float32(depth[s])
            if at_ping:
                j += 1
        for k in range(K):
            off[k] = ((rowpos[i] + dpk[k]) % n_wrows) * wpad + hb + dbk[k]
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
            # Is any neighbour of the 8 beams missing? (a NaN makes its lane's sum NaN)
            t0 = zero
            t1 = zero
            for k in range(0, K - 1, 2):
                t0 = vadd(t0, vload(W, off[k] + c0))
                t1 = vadd(t1, vload(W, off[k + 1] + c0))
            if K % 2:
                t0 = vadd(t0, vload(W, off[K - 1] + c0))
            vstore(missing, 0, vadd(t0, t1))
            full = True
            for lane in range(L):
                if np.isnan(missing[lane]):
                    full = False
            if full:
                # No neighbour missing: no pads, and the network sorts the rows where they lie.
                # The same operations as below with nothing missing, so the same numbers.
                veven = zero
                lo, hi = vsort_rows(W, off, c0, tok)
                a0 = _median(lo, hi, veven)
                for k in range(K):
                    r = vsub(vload(W, off[k] + c0), a0)
                    vstore(R, k * L, r)
                    vstore(S, k * L, vabs(r))
                RW = R
                missing[:] = 0.0
            else:
                # Neighbours of the 8 beams (Z), and pads (P) for the missing ones: -inf, +inf,
                # -inf, ... in turn, lane by lane. With m of the K missing, ceil(m / 2) pads
                # sort below every valid neighbour and floor(m / 2) above, so the network's
                # rows K/2 - 1 and K/2 are the valid neighbours' two middle values (m even), or
                # row K/2 their middle value (m odd).
                miss = zero
                par = zero              # lane: 1 after an odd number of missing neighbours
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
                RW = R0
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
            settled = False
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
                    for row in range(n_wrows):
                        # The row's columns in pairs db = -j, +j: their sum and difference
                        # give the sums weighted by db and db^2 with fewer products.
                        base = row * n_wcols + hb
                        sw = zero
                        sq = zero
                        swb = zero
                        swbb = zero
                        sqb = zero
                        kc = kidx[base]
                        if kc >= 0:
                            u = vmul(vload(S, kc * L), inv)
                            w = vpos(vsub(one, vmul(u, u)))     # 0 where missing (a pad)
                            sw = vmul(w, w)
                            sq = vmul(sw, vload(RW, kc * L))
                        for j in range(1, hb + 1):
                            kp = kidx[base + j]
                            km = kidx[base - j]
                            u = vmul(vload(S, kp * L), inv)
                            wp = vpos(vsub(one, vmul(u, u)))
                            wp = vmul(wp, wp)
                            u = vmul(vload(S, km * L), inv)
                            wm = vpos(vsub(one, vmul(u, u)))
                            wm = vmul(wm, wm)
                            wrp = vmul(wp, vload(RW, kp * L))
                            wrm = vmul(wm, vload(RW, km * L))
                            ws = vadd(wp, wm)
                            wd = vsub(wp, wm)
                            wrs = vadd(wrp, wrm)
                            wrd = vsub(wrp, wrm)
                            sw = vadd(sw, ws)
                            sq = vadd(sq, wrs)
                            if j == 1:
                                swb = vadd(swb, wd)
                                swbb = vadd(swbb, ws)
                                sqb = vadd(sqb, wrd)
                            else:
                                jv = vsplat(np.float32(j))
                                swb = vadd(swb, vmul(jv, wd))
                                swbb = vadd(swbb, vmul(vsplat(np.float32(j * j)), ws))
                                sqb = vadd(sqb, vmul(jv, wrd))
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
                    last = it == iterations - 1
                    if last:
                        # The last median only decides the flags: first count, lane by lane,
                        # the residuals below the smallest median that would leave the
                        # sounding unflagged (see _bounds); most lanes are settled by that.
                        vstore(a, 0, a_lo)
                        vstore(a, 4, a_hi)
                        vstore(cf, 0, a0)
                        vstore(cf, L, c0v)
                        vstore(cf, 2 * L, c1v)
                        vstore(cf, 3 * L, c2v)
                        _bounds(cidx[c0:c0 + L], depth, a, cf, missing, K, min_nb, xfac, xs,
                                forced)
                    # The plane's terms c1 * db and c2 * dp, once per column and per row.
                    for j in range(n_wcols):
                        vstore(CB, j * L, vmul(c1v, vsplat(np.float32(j - hb))))
                    for j in range(n_wrows):
                        vstore(CP, j * L, vmul(c2v, vsplat(np.float32(j - hp))))
                    xv = vload(xs, 0)
                    cnt = zero
                    if full and last:
                        for k in range(K):
                            fit = vadd(vadd(vload(CB, cbk[k]), vload(CP, cpk[k])), c0v)
                            au = vabs(vsub(vload(R, k * L), fit))
                            vstore(S, k * L, au)
                            cnt = vadd(cnt, vlt_select(au, xv, one, zero))
                    elif full:
                        for k in range(K):
                            fit = vadd(vadd(vload(CB, cbk[k]), vload(CP, cpk[k])), c0v)
                            vstore(S, k * L, vabs(vsub(vload(R, k * L), fit)))
                    else:
                        for k in range(K):
                            fit = vadd(vadd(vload(CB, cbk[k]), vload(CP, cpk[k])), c0v)
                            pad = vload(P, k * L)
                            su = vnan_is(pad, vabs(vsub(vload(R, k * L), fit)), pad)
                            vstore(S, k * L, su)
                            cnt = vadd(cnt, vlt_select(su, xv, one, zero))
                    if last:
                        vstore(below, 0, cnt)
                        settled = True
                        for lane in range(L):
                            if forced[lane] or below[lane] > K // 2 - 1:
                                settled = False
                        if settled:
                            break
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
                    flags[s] = (not settled
                                and abs((depth[s] - a[lane]) / scale[lane]) > threshold)
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
