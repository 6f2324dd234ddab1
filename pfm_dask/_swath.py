"""The per-file swath filter: robust local-surface outlier test on the ping x beam grid.

Project-defined (pfmLoader's old swath filter has no public source, PFM_NOTES 3.7). Each
valid sounding is compared with a robust local surface fitted to its valid neighbours in
a ``window_pings x window_beams`` window (itself left out), and flagged
FILTER_INVAL | MODIFIED when its residual exceeds ``threshold`` robust standard deviations.
Every decision uses the input validity only, so the result does not depend on the
order of processing, on chunking, or on how a file is split across workers.
See ``docs/filters.md`` for the design and measured scores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .errors import ConfigError
from .pfm import validity as V

__all__ = ["swath_filter", "swath_halo", "SwathStats", "score_against_truth", "spike_mask"]

_TUKEY_C = 4.685      # biweight tuning constant: 95 % efficiency at the normal
_MAD_TO_SIGMA = 1.4826
_RIDGE = 1e-6         # keeps slope terms solvable when neighbours lie on one line
_MODELS = ("plane", "median")


@dataclass(frozen=True)
class SwathStats:
    """Counts from one :func:`swath_filter` call.

    ``scored``: soundings in the score range (``score_mask``); ``tested``: valid scored
    soundings with at least ``min_neighbours`` valid neighbours; ``sparse``: valid scored
    soundings left untested for want of neighbours; ``flagged``: newly flagged.
    """

    soundings: int
    scored: int
    tested: int
    sparse: int
    flagged: int

    def as_dict(self) -> dict:
        return asdict(self)


def swath_halo(window_pings: int = 5) -> int:
    """Ping numbers of context a ping range needs on each side to score as in the whole file."""
    return int(window_pings) // 2


def _check_params(window_pings, window_beams, threshold, min_neighbours, min_scale,
                  rel_min_scale, model, iterations, chunk_cells):
    for name, w in (("window_pings", window_pings), ("window_beams", window_beams)):
        if int(w) != w or w < 1 or w % 2 == 0:
            raise ConfigError(f"{name} must be a positive odd integer, got {w!r}")
    if window_pings * window_beams < 2:
        raise ConfigError("the swath filter window must hold at least one neighbour")
    if not threshold > 0:
        raise ConfigError(f"threshold must be > 0 robust standard deviations, got {threshold!r}")
    if min_neighbours < 1 or min_neighbours > window_pings * window_beams - 1:
        raise ConfigError(f"min_neighbours must be in 1..{window_pings * window_beams - 1}, "
                          f"got {min_neighbours!r}")
    if min_scale < 0 or rel_min_scale < 0:
        raise ConfigError("min_scale and rel_min_scale must be >= 0")
    if model not in _MODELS:
        raise ConfigError(f"model must be one of {_MODELS}, got {model!r}")
    if iterations < 1:
        raise ConfigError(f"iterations must be >= 1, got {iterations!r}")
    if chunk_cells < 1:
        raise ConfigError(f"chunk_cells must be >= 1, got {chunk_cells!r}")


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


def swath_filter(ping, beam, depth, validity, *, window_pings: int = 5, window_beams: int = 9,
                 threshold: float = 5.0, min_neighbours: int = 8, min_scale: float = 0.01,
                 rel_min_scale: float = 5e-4, model: str = "plane", iterations: int = 2,
                 score_mask=None, chunk_cells: int = 4096):
    """Flag isolated depth outliers in one file (or one ping range of it).

    Inputs are per-sounding arrays: ``ping`` (integer ping number; the grid rows are ping
    numbers, so a ping missing from the input is an empty row), ``beam`` (integer beam
    number, one sounding per (ping, beam)), ``depth`` (metres, positive down) and
    ``validity`` (PFM words). Only soundings that are valid (no INVAL, no
    DELETED bit, finite depth) are tested or used as neighbours.

    For each tested sounding a local surface is fitted to its valid neighbours in the
    ``window_pings x window_beams`` window (the sounding itself left out): ``model`` is
    ``"plane"`` (depth = a + b*beam + c*ping; default) or ``"median"`` (a constant). The
    fit starts from the neighbours' median and MAD and takes ``iterations`` Tukey-biweight reweighting steps; the robust scale is 1.4826 x the
    median absolute residual, floored at ``max(min_scale, rel_min_scale * |surface|)``.
    A sounding with fewer than ``min_neighbours`` valid neighbours is not tested. One is
    flagged FILTER_INVAL | MODIFIED when ``|depth - surface| > threshold * scale``. Depth is
    never changed and no flag is ever cleared.

    Split files: to score pings ``lo..hi`` pass the soundings of pings
    ``lo - swath_halo() .. hi + swath_halo()`` (by ping number, whatever was dropped from
    them), and ``score_mask`` True only for the range's own soundings. Context soundings are used as neighbours but never flagged, and the
    result on the range equals the whole-file result.

    Memory: the file is processed in blocks of about ``chunk_cells`` (ping, beam) cells
    (whole pings, plus the halo rows); the working arrays take about
    ``chunk_cells x window x 4 x 6`` bytes (4 MB at the defaults) on top of the inputs, the
    output and two bytes per sounding. Input not sorted by ping is sorted first (a copy).
    ``chunk_cells`` never changes the result.

    Returns ``(new_validity uint32, SwathStats)``; the input arrays are not modified.
    """
    _check_params(window_pings, window_beams, threshold, min_neighbours, min_scale,
                  rel_min_scale, model, iterations, chunk_cells)
    ping = np.asarray(ping)
    beam = np.asarray(beam)
    depth = np.asarray(depth, dtype=np.float64)
    val_in = np.asarray(validity, dtype=np.uint32)
    n_all = ping.shape[0]
    for name, arr in (("beam", beam), ("depth", depth), ("validity", val_in)):
        if arr.shape != (n_all,):
            raise ValueError(f"{name} has shape {arr.shape}, expected ({n_all},) like ping")
    if score_mask is None:
        scored = np.ones(n_all, dtype=bool)
    else:
        scored = np.asarray(score_mask, dtype=bool)
        if scored.shape != (n_all,):
            raise ValueError(f"score_mask has shape {scored.shape}, expected ({n_all},)")
    new_val = val_in.copy()
    if n_all == 0:
        return new_val, SwathStats(0, 0, 0, 0, 0)

    # Work in ping order; input read from a file is already sorted, so usually no copy.
    order = None
    if np.any(ping[1:] < ping[:-1]):
        order = np.argsort(ping, kind="stable")
        ping, beam, depth, val_s, scored_s = (ping[order], beam[order], depth[order],
                                              val_in[order], scored[order])
    else:
        val_s, scored_s = val_in, scored
    good = ((val_s & np.uint32(V.INVAL | V.DELETED)) == 0) & np.isfinite(depth)

    starts = np.concatenate([[0], np.flatnonzero(ping[1:] != ping[:-1]) + 1])
    ends = np.append(starts[1:], n_all)
    n_rows = starts.shape[0]
    bmin = int(beam.min())
    width = int(beam.max()) - bmin + 1
    hp, hb = window_pings // 2, window_beams // 2
    # Grid row of each distinct ping: its ping number, with gaps longer than the half window
    # shortened to hp + 1 rows (pings that far apart never share a window either way), so a
    # missing ping is an empty row and the grid stays small whatever the numbering.
    pvals = ping[starts].astype(np.int64)
    rowpos = np.concatenate([[0], np.cumsum(np.minimum(np.diff(pvals), hp + 1))])
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

    if order is not None:
        flagged = np.zeros(n_all, dtype=bool)
        flagged[order] = flag_sorted
    else:
        flagged = flag_sorted
    new_val[flagged] |= np.uint32(V.FILTER_INVAL | V.MODIFIED)
    return new_val, SwathStats(soundings=n_all, scored=int(scored.sum()), tested=tested,
                               sparse=sparse, flagged=int(flagged.sum()))


def score_against_truth(flagged, is_spike, eligible=None) -> dict:
    """Detection and false-positive rates of a filter against planted spikes.

    ``flagged``: soundings the filter newly flagged; ``is_spike``: planted outliers;
    ``eligible``: soundings that were valid before the filter (default: all). Returns
    counts and the rates ``detection`` (flagged spikes / eligible spikes) and
    ``false_positive`` (flagged good soundings / eligible good soundings).
    """
    f = np.asarray(flagged, dtype=bool)
    s = np.asarray(is_spike, dtype=bool)
    e = np.ones_like(f) if eligible is None else np.asarray(eligible, dtype=bool)
    spikes = int((s & e).sum())
    goods = int((~s & e).sum())
    hit = int((f & s & e).sum())
    fp = int((f & ~s & e).sum())
    return {
        "spikes": spikes, "detected": hit, "good": goods, "false_positives": fp,
        "detection": hit / spikes if spikes else float("nan"),
        "false_positive": fp / goods if goods else float("nan"),
    }


def spike_mask(ping, beam, truth_ping, truth_beam) -> np.ndarray:
    """True for the soundings whose (ping, beam) is listed in a truth table (one file's rows).

    For ``pfm_dask.synth`` surveys: pass the ``ping`` and ``beam`` columns of the rows of
    ``truth.parquet`` whose ``file`` is the file being scored.
    """
    p = np.asarray(ping, dtype=np.int64)
    b = np.asarray(beam, dtype=np.int64)
    tp = np.asarray(truth_ping, dtype=np.int64)
    tb = np.asarray(truth_beam, dtype=np.int64)
    span = int(max(b.max(initial=0), tb.max(initial=0))) + 1
    return np.isin(p * span + b, tp * span + tb)
