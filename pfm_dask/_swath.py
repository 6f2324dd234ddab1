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

__all__ = ["swath_filter", "swath_halo", "SwathStats", "score_against_truth"]

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
    """Distinct pings of context a ping range needs on each side to score exactly as in the whole file."""
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


def _score_block(zp: np.ndarray, keep: np.ndarray, x: np.ndarray, window, *,
                 min_scale, rel_min_scale, iterations, model):
    """Robust residual scores for every centre cell of a NaN-padded block.

    ``zp`` is the block padded by the half windows (NaN = no valid sounding). Returns
    ``(score, n_neighbours)`` for the ``(rows, beams)`` centre cells; the score is the
    centre depth minus the local surface, divided by the robust scale.
    """
    wp, wb = window
    hp, hb = wp // 2, wb // 2
    rows, beams = zp.shape[0] - 2 * hp, zp.shape[1] - 2 * hb
    centre = zp[hp:hp + rows, hb:hb + beams].reshape(-1)
    # (cells, K) neighbour depths, NaN where there is no valid neighbour.
    nb = sliding_window_view(zp, (wp, wb)).reshape(rows * beams, wp * wb)[:, keep]
    n = np.count_nonzero(~np.isnan(nb), axis=1)

    # Start: median and MAD of the neighbours' depths (NaN sorts last).
    a = _sorted_median(np.sort(nb, axis=1), n)
    res = np.abs(nb - a[:, None])
    res.sort(axis=1)
    scale = _MAD_TO_SIGMA * _sorted_median(res, n)
    del res

    def floor(s, level):
        return np.maximum(s, np.maximum(min_scale, rel_min_scale * np.abs(level)))

    scale = floor(scale, a)
    if model != "median":
        p = x.shape[1]
        nb0 = np.where(np.isnan(nb), 0.0, nb)
        xx = np.einsum("ki,kj->kij", x, x).reshape(x.shape[0], p * p)   # (K, P*P)
        ridge = np.diag([0.0] + [_RIDGE] * (p - 1))
        pred = a[:, None]
        for _ in range(iterations):
            # Tukey biweight weights; fmax turns the NaN of missing neighbours into 0.
            u = nb - pred
            u *= (1.0 / (_TUKEY_C * scale))[:, None]
            np.square(u, out=u)
            np.subtract(1.0, u, out=u)
            w = np.fmax(u, 0.0, out=u)
            np.square(w, out=w)
            sw = w.sum(axis=1)
            m = (w @ xx).reshape(-1, p, p) + ridge
            rhs = (w * nb0) @ x
            del w, u
            bad = ~(sw > 0)
            if bad.any():       # no neighbour keeps a weight: keep the current estimate
                m[bad] = np.eye(p)
                rhs[bad] = 0.0
                rhs[bad, 0] = np.where(np.isnan(a[bad]), 0.0, a[bad])
            coef = np.linalg.solve(m, rhs[..., None])[..., 0]
            a = coef[:, 0]
            pred = coef @ x.T
            res = np.abs(nb - pred)
            res.sort(axis=1)
            scale = floor(_MAD_TO_SIGMA * _sorted_median(res, n), a)
            del res
    with np.errstate(invalid="ignore"):
        score = (centre - a) / scale
    return score.reshape(rows, beams), n.reshape(rows, beams)


def swath_filter(ping, beam, depth, validity, *, window_pings: int = 5, window_beams: int = 9,
                 threshold: float = 5.0, min_neighbours: int = 8, min_scale: float = 0.01,
                 rel_min_scale: float = 5e-4, model: str = "plane", iterations: int = 2,
                 score_mask=None, chunk_cells: int = 16_384):
    """Flag isolated depth outliers in one file (or one ping range of it).

    Inputs are per-sounding arrays: ``ping`` (any integer, one distinct value per ping;
    pings are ordered by value and adjacent distinct values are adjacent rows), ``beam``
    (integer beam number, one sounding per (ping, beam)), ``depth`` (metres, positive
    down) and ``validity`` (PFM words). Only soundings that are valid (no INVAL, no
    DELETED bit, finite depth) are tested or used as neighbours.

    For each tested sounding a local surface is fitted to its valid neighbours in the
    ``window_pings x window_beams`` window (the sounding itself left out): ``model`` is
    ``"plane"`` (depth = a + b*beam + c*ping; default) or ``"median"`` (a constant). The fit starts from the neighbours' median and MAD and takes
    ``iterations`` Tukey-biweight reweighting steps; the robust scale is 1.4826 x the
    median absolute residual, floored at ``max(min_scale, rel_min_scale * |surface|)``.
    A sounding with fewer than ``min_neighbours`` valid neighbours is not tested. One is
    flagged FILTER_INVAL | MODIFIED when ``|depth - surface| > threshold * scale``. Depth is
    never changed and no flag is ever cleared.

    Split files: pass the soundings of the ping range plus the :func:`swath_halo` nearest
    distinct pings on each side, and ``score_mask`` True only for the range's own
    soundings. Context soundings are used as neighbours but never flagged, and the
    result on the range equals the whole-file result. ``chunk_cells`` bounds the working
    memory (about ``chunk_cells * window * 8 * 6`` bytes) and never changes the result.

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
    keep, x = _design(window_pings, window_beams, model)
    rows_per_chunk = max(1, chunk_cells // width)

    flag_sorted = np.zeros(n_all, dtype=bool)
    tested = sparse = 0
    for r0 in range(0, n_rows, rows_per_chunk):
        r1 = min(r0 + rows_per_chunk, n_rows)
        s0, s1 = starts[r0], ends[r1 - 1]
        if not np.any(good[s0:s1] & scored_s[s0:s1]):
            continue
        g0, g1 = max(r0 - hp, 0), min(r1 + hp, n_rows)
        lo, hi = starts[g0], ends[g1 - 1]
        # Block rows: hp rows before r0 (NaN where the data starts), then r0..r1, then hp after.
        row_id = np.repeat(np.arange(g0, g1), ends[g0:g1] - starts[g0:g1]) - (r0 - hp)
        col = beam[lo:hi].astype(np.int64) - bmin + hb
        flat = row_id * (width + 2 * hb) + col
        if np.bincount(flat).max() > 1:
            raise ValueError("swath_filter: more than one sounding for the same (ping, beam)")
        zp = np.full((r1 - r0 + 2 * hp, width + 2 * hb), np.nan)
        g = good[lo:hi]
        zp.reshape(-1)[flat[g]] = depth[lo:hi][g]
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
