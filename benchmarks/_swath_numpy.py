"""The swath filter's numpy kernel as it was before the compiled one (commit fdc29c3), the
baseline of ``bench_swath``: kept here, not in the package, only to be timed and compared.

Sliding windows over NaN-padded blocks of ``chunk_cells`` cells, ``np.sort`` for every
median, ``einsum`` row products for the weighted sums, a closed-form 3 x 3 solve. Same
arguments and result as :func:`pfm_dask.filters.swath_filter`.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from pfm_dask.filters._swath import SwathStats, _check_params, _ping_rows, _result, _sorted_input

__all__ = ["swath_filter_numpy"]

_TUKEY_C = 4.685      # biweight tuning constant: 95 % efficiency at the normal
_MAD_TO_SIGMA = 1.4826
_RIDGE = 1e-6         # keeps slope terms solvable when neighbours lie on one line


def _sorted_median(s: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Median of the first ``n`` entries along the last axis of an ascending-sorted array."""
    lo = np.maximum((n - 1) // 2, 0)[..., None]
    hi = np.maximum(n // 2, 0)[..., None]
    m = 0.5 * (np.take_along_axis(s, lo, -1)[..., 0] + np.take_along_axis(s, hi, -1)[..., 0])
    return np.where(n > 0, m, np.nan)


def _design(window_pings: int, window_beams: int, model: str):
    """Offsets of the neighbours (centre left out) and the local model's design matrix."""
    hp, hb = window_pings // 2, window_beams // 2
    dp, db = np.meshgrid(np.arange(-hp, hp + 1), np.arange(-hb, hb + 1), indexing="ij")
    keep = ~((dp == 0) & (db == 0)).ravel()
    dp = dp.ravel()[keep].astype(np.float64)
    db = db.ravel()[keep].astype(np.float64)
    cols = [np.ones_like(db)]
    if model == "plane":
        cols += [db, dp]
    x = np.stack(cols, axis=1)                      # (K, P)
    return keep, x


def _solve3(m: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Solve many symmetric 3 x 3 systems ``m (n, 6) x = r (n, 3)``; m = (a, b, c, d, e, f).

    The matrix is [[a, b, c], [b, d, e], [c, e, f]]; closed form by the adjugate, which is
    several times faster than a batched LAPACK call for 3 x 3 and exact enough here (the
    systems are well conditioned: weighted sums over a fixed offset grid plus a ridge).
    """
    a, b, c, d, e, f = m.T
    r0, r1, r2 = r.T
    A11 = d * f - e * e
    A12 = c * e - b * f
    A13 = b * e - c * d
    A22 = a * f - c * c
    A23 = b * c - a * e
    A33 = a * d - b * b
    det = a * A11 + b * A12 + c * A13
    x0 = (A11 * r0 + A12 * r1 + A13 * r2) / det
    x1 = (A12 * r0 + A22 * r1 + A23 * r2) / det
    x2 = (A13 * r0 + A23 * r1 + A33 * r2) / det
    return np.stack([x0, x1, x2], axis=1)


def _plane(coef: np.ndarray, one, db, dp) -> np.ndarray:
    """The fitted plane (relative to the median) at every neighbour offset, float32 (cells, K)."""
    c = coef.astype(np.float32)
    out = c[:, 1:2] * db
    out += c[:, 2:3] * dp
    out += c[:, 0:1] * one
    return out


def _score_block(zp: np.ndarray, keep: np.ndarray, x: np.ndarray, window, *,
                 min_scale, rel_min_scale, iterations, model):
    """Robust residual scores for every centre cell of a NaN-padded block.

    ``zp`` is the block padded by the half windows (NaN = no valid sounding). Returns
    ``(score, n_neighbours)`` for the ``(rows, beams)`` centre cells; the score is the
    centre depth minus the local surface, divided by the robust scale.

    The neighbour arrays are float32 (depths to better than 1 mm below 16 km) and every
    fit is done on residuals from the neighbours' median, so the precision is that of the
    residuals; the conversion is per sounding, so results do not depend on the blocking.
    """
    wp, wb = window
    hp, hb = wp // 2, wb // 2
    rows, beams = zp.shape[0] - 2 * hp, zp.shape[1] - 2 * hb
    centre = zp[hp:hp + rows, hb:hb + beams].reshape(-1)
    z32 = zp.astype(np.float32)
    # (cells, K) neighbour depths, NaN where there is no valid neighbour.
    nb = sliding_window_view(z32, (wp, wb)).reshape(rows * beams, wp * wb)[:, keep]
    n = np.count_nonzero(~np.isnan(nb), axis=1)

    # Start: median and MAD of the neighbours' depths (NaN sorts last).
    a0 = _sorted_median(np.sort(nb, axis=1), n)
    nb -= a0[:, None]                           # residuals from the median, float32
    res = np.abs(nb)
    res.sort(axis=1)
    a0 = a0.astype(np.float64)
    a = a0

    def floor(s, level):
        return np.maximum(s, np.maximum(min_scale, rel_min_scale * np.abs(level)))

    scale = floor(_MAD_TO_SIGMA * _sorted_median(res, n).astype(np.float64), a0)
    del res
    if model != "median":
        nb0 = np.where(np.isnan(nb), np.float32(0), nb)
        # Weighted sums by per-row inner products (einsum's own loops: no BLAS, so the
        # result of a cell does not depend on the block size or on BLAS threading).
        one, db, dp = (x[:, j].astype(np.float32) for j in range(3))
        xx = [one, db, dp, db * db, db * dp, dp * dp]     # upper triangle of X'X
        ridge = np.array([0.0, 0.0, 0.0, _RIDGE, 0.0, _RIDGE])
        coef = np.zeros((rows * beams, 3))
        for it in range(iterations):
            # Tukey biweight weights; fmax turns the NaN of missing neighbours into 0.
            if it:
                u = _plane(coef, one, db, dp)
                np.subtract(nb, u, out=u)
            else:
                u = nb.copy()
            u *= (1.0 / (_TUKEY_C * scale)).astype(np.float32)[:, None]
            np.square(u, out=u)
            np.subtract(np.float32(1), u, out=u)
            w = np.fmax(u, np.float32(0), out=u)
            np.square(w, out=w)
            m = np.stack([np.einsum("ck,k->c", w, c) for c in xx], axis=1).astype(np.float64)
            m += ridge
            w *= nb0
            rhs = np.stack([np.einsum("ck,k->c", w, c) for c in (one, db, dp)],
                           axis=1).astype(np.float64)
            del w, u
            bad = ~(m[:, 0] > 0)            # no neighbour keeps a weight: keep the estimate
            m[bad] = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
            rhs[bad] = coef[bad]
            coef = _solve3(m, rhs)
            a = a0 + coef[:, 0]
            res = _plane(coef, one, db, dp)
            np.subtract(nb, res, out=res)
            np.abs(res, out=res)
            res.sort(axis=1)
            scale = floor(_MAD_TO_SIGMA * _sorted_median(res, n).astype(np.float64), a)
            del res
    score = (centre - a) / scale
    return score.reshape(rows, beams), n.reshape(rows, beams)


def swath_filter_numpy(ping, beam, depth, validity, *, window_pings: int = 5,
                       window_beams: int = 9, threshold: float = 5.0, min_neighbours: int = 8,
                       min_scale: float = 0.01, rel_min_scale: float = 5e-4,
                       model: str = "plane", iterations: int = 2, score_mask=None,
                       chunk_cells: int = 4096):
    """The numpy swath filter as it was: same arguments and result as ``swath_filter``."""
    _check_params(window_pings, window_beams, threshold, min_neighbours, min_scale,
                  rel_min_scale, model, iterations, chunk_cells)     # the package's checks
    inp = _sorted_input(ping, beam, depth, validity, score_mask)
    if inp.n == 0:
        return inp.validity.copy(), SwathStats(0, 0, 0, 0, 0)
    beam, depth, good, scored_s = inp.beam, inp.depth, inp.good, inp.scored_sorted
    n_all = inp.n
    hp, hb = window_pings // 2, window_beams // 2
    starts, ends, rowpos = _ping_rows(inp.ping, hp)
    n_rows = starts.shape[0]
    bmin = int(beam.min())
    width = int(beam.max()) - bmin + 1
    keep, x = _design(window_pings, window_beams, model)
    rows_per_chunk = max(1, chunk_cells // width)

    flag_sorted = np.zeros(n_all, dtype=bool)
    tested = sparse = 0
    for r0 in range(0, n_rows, rows_per_chunk):
        r1 = min(r0 + rows_per_chunk, n_rows)
        s0, s1 = starts[r0], ends[r1 - 1]
        if not np.any(good[s0:s1] & scored_s[s0:s1]):
            continue
        top = rowpos[r0] - hp                      # grid row of the block's first row
        height = rowpos[r1 - 1] - rowpos[r0] + 1 + 2 * hp
        g0 = int(np.searchsorted(rowpos, top, side="left"))
        g1 = int(np.searchsorted(rowpos, top + height, side="left"))
        lo, hi = starts[g0], ends[g1 - 1]
        row_id = np.repeat(rowpos[g0:g1] - top, ends[g0:g1] - starts[g0:g1])
        col = beam[lo:hi].astype(np.int64) - bmin + hb
        flat = row_id * (width + 2 * hb) + col
        if np.bincount(flat).max() > 1:
            raise ValueError("swath_filter: more than one sounding for the same (ping, beam)")
        zp = np.full((height, width + 2 * hb), np.nan)
        g = good[lo:hi]
        zp.reshape(-1)[flat[g]] = depth[lo:hi][g]
        # A zero scale (min_scale = rel_min_scale = 0 on noise-free data) or an empty window
        # gives inf/NaN scores by design; NaN scores are never flagged.
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            score, nnb = _score_block(zp, keep, x, (window_pings, window_beams),
                                      min_scale=min_scale, rel_min_scale=rel_min_scale,
                                      iterations=iterations, model=model)
        # Back to the soundings of rows r0..r1.
        sl = slice(s0 - lo, s1 - lo)
        rr = row_id[sl] - hp
        cc = col[sl] - hb
        cand = good[s0:s1] & scored_s[s0:s1]
        enough = nnb[rr, cc] >= min_neighbours
        test = cand & enough
        tested += int(test.sum())
        sparse += int((cand & ~enough).sum())
        flag_sorted[s0:s1] = test & (np.abs(score[rr, cc]) > threshold)

    return _result(inp, flag_sorted, tested, sparse)
