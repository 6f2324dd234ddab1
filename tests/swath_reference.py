"""A slow, plain recomputation of the swath filter's rule, one sounding at a time.

Written from the rule in ``docs/filters.md`` (section 2), sharing no code with
``pfm_dask.filters._swath`` or its kernel: neighbours are looked up in a dictionary keyed by
(ping number, beam number), medians come from ``np.sort``, the plane from
``np.linalg.solve``. The precision follows the rule: neighbour depths and residuals are
float32 (so medians and residuals are the float32 values the filter sees), the weighted
sums are taken in float64 from the float32 products (exact for these magnitudes), and the
surface, scale and score are float64. A kernel that sums in float32 differs from this only
by rounding in those sums, so scores agree to about 1e-6 and flags agree except where a
score lies that close to the threshold.
"""

from __future__ import annotations

import numpy as np

F32 = np.float32


def _median32(values: np.ndarray) -> np.float32:
    """Median of float32 values as the filter defines it: mean of the two middle ones, float32."""
    s = np.sort(values)
    n = s.shape[0]
    return F32(0.5) * (s[(n - 1) // 2] + s[n // 2])


def _floor(s: float, level: float, min_scale: float, rel_min_scale: float) -> float:
    """numpy's maximum (NaN wins) of the scale and max(min_scale, rel_min_scale * |level|)."""
    return float(np.maximum(s, np.maximum(min_scale, rel_min_scale * abs(level))))


def reference_scores(ping, beam, depth, validity, *, window_pings=5, window_beams=9,
                     min_scale=0.01, rel_min_scale=5e-4, model="plane", iterations=2,
                     invalid_bits=None, only=None):
    """``(n_neighbours, score)`` for every sounding (score NaN where it is not valid).

    ``only``: a boolean mask of the soundings to score (default all); the others are still
    neighbours, and get n_neighbours 0 and a NaN score.

    A sounding is valid when none of ``invalid_bits`` (PFM INVAL | DELETED) is set and its
    depth is finite; only valid soundings are scored or used as neighbours. Neighbours are
    the valid soundings at ping numbers within ``window_pings // 2`` and beam numbers within
    ``window_beams // 2``, the sounding itself left out.
    """
    from pfm_dask.pfm import validity as V

    bits = (V.INVAL | V.DELETED) if invalid_bits is None else invalid_bits
    ping = np.asarray(ping, dtype=np.int64)
    beam = np.asarray(beam, dtype=np.int64)
    depth = np.asarray(depth, dtype=np.float64)
    ok = ((np.asarray(validity, dtype=np.uint32) & np.uint32(bits)) == 0) & np.isfinite(depth)
    cell = {(int(p), int(b)): float(z) for p, b, z, g in zip(ping, beam, depth, ok) if g}
    hp, hb = window_pings // 2, window_beams // 2
    offsets = [(dp, db) for dp in range(-hp, hp + 1) for db in range(-hb, hb + 1)
               if (dp, db) != (0, 0)]
    n_out = np.zeros(len(ping), dtype=np.int64)
    score = np.full(len(ping), np.nan)
    todo = ok if only is None else ok & np.asarray(only, dtype=bool)
    for i in np.flatnonzero(todo):
        p, b = int(ping[i]), int(beam[i])
        nb = [(dp, db, cell[(p + dp, b + db)]) for dp, db in offsets if (p + dp, b + db) in cell]
        n_out[i] = len(nb)
        if not nb:
            continue
        z = np.array([t[2] for t in nb]).astype(F32)
        dbv = np.array([t[1] for t in nb], dtype=F32)
        dpv = np.array([t[0] for t in nb], dtype=F32)
        X = np.stack([np.ones(len(nb)), dbv.astype(float), dpv.astype(float)], axis=1)
        a0 = _median32(z)
        r = z - a0                                          # float32 residuals
        a = float(a0)
        scale = _floor(1.4826 * float(_median32(np.abs(r))), a, min_scale, rel_min_scale)
        if model == "plane":
            coef = np.zeros(3)
            u = r
            for _ in range(iterations):
                # Tukey biweight. A zero scale makes 0 / 0 of a zero residual: weight 0 (fmax).
                with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                    t = u * F32(np.divide(1.0, 4.685 * scale))
                    w = np.fmax(F32(1) - t * t, F32(0))
                w = w * w
                wd = w.astype(float)
                M = X.T @ (wd[:, None] * X) + np.diag([0.0, 1e-6, 1e-6])
                rhs = X.T @ (wd * r.astype(float))
                if wd.sum() > 0:
                    coef = np.linalg.solve(M, rhs)
                a = float(a0) + coef[0]
                c = coef.astype(F32)
                u = r - ((c[1] * dbv + c[2] * dpv) + c[0])  # float32 residuals from the plane
                scale = _floor(1.4826 * float(_median32(np.abs(u))), a, min_scale,
                               rel_min_scale)
        with np.errstate(divide="ignore", invalid="ignore"):
            score[i] = (depth[i] - a) / scale
    return n_out, score
