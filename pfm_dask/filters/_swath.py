"""The per-file swath filter: robust local-surface outlier test on the ping x beam grid.

Project-defined (pfmLoader's old swath filter has no public source, docs/filters.md §2). Each
valid sounding is compared with a robust local surface fitted to its valid neighbours in
a ``window_pings x window_beams`` window (itself left out), and flagged
FILTER_INVAL | MODIFIED when its residual exceeds ``threshold`` robust standard deviations.
Every decision uses the input validity only, so the result does not depend on the
order of processing or on how a file is split across workers. This module checks and lays
out the input; the scores are computed by the compiled kernel in ``_swath_kernel``.
See ``docs/filters.md`` for the design and measured scores.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import ConfigError
from .. import validity as V

__all__ = ["swath_filter", "swath_halo", "SwathStats", "score_against_truth", "spike_mask"]

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


def _offsets(window_pings: int, window_beams: int):
    """Ping and beam offsets of the window's neighbours (centre left out), ping-major."""
    hp, hb = window_pings // 2, window_beams // 2
    dp, db = np.meshgrid(np.arange(-hp, hp + 1), np.arange(-hb, hb + 1), indexing="ij")
    keep = ~((dp == 0) & (db == 0)).ravel()
    return dp.ravel()[keep].astype(np.int64), db.ravel()[keep].astype(np.int64)


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
    fit starts from the neighbours' median and MAD and takes ``iterations`` Tukey-biweight
    (c = 4.685) reweighting steps, each a weighted least-squares plane with a 1e-6 ridge on
    the slopes; the robust scale is 1.4826 x the median absolute residual, floored at
    ``max(min_scale, rel_min_scale * |surface|)``. A sounding with fewer than
    ``min_neighbours`` valid neighbours is not tested. One is flagged
    FILTER_INVAL | MODIFIED when ``|depth - surface| > threshold * scale``. Depth is
    never changed and no flag is ever cleared.

    Split files: to score pings ``lo..hi`` pass the soundings of pings
    ``lo - swath_halo() .. hi + swath_halo()`` (by ping number, whatever was dropped from
    them), and ``score_mask`` True only for the range's own soundings. Context soundings are
    used as neighbours but never flagged, and the result on the range equals the whole-file
    result.

    Memory: the kernel works on one strip of ``window_pings`` pings at a time (a few
    kilobytes); on top of the inputs and the output it takes about 12 bytes per sounding.
    Input not sorted by ping is sorted first (a copy). ``chunk_cells`` is still accepted and
    checked for existing callers but no longer has any effect.

    Returns ``(new_validity uint32, SwathStats)``; the input arrays are not modified.
    """
    _check_params(window_pings, window_beams, threshold, min_neighbours, min_scale,
                  rel_min_scale, model, iterations, chunk_cells)
    x = _sorted_input(ping, beam, depth, validity, score_mask)
    if x.n == 0:
        return x.validity.copy(), SwathStats(0, 0, 0, 0, 0)
    hp, hb = window_pings // 2, window_beams // 2
    starts, ends, rowpos = _ping_rows(x.ping, hp)
    bmin = int(x.beam.min())
    width = int(x.beam.max()) - bmin + 1
    col = x.beam.astype(np.int64) - bmin
    dpk, dbk = _offsets(window_pings, window_beams)

    from . import _simd, _swath_kernel as K

    if K.has_duplicate(starts, ends, col, width):
        raise ValueError("swath_filter: more than one sounding for the same (ping, beam)")
    flag_sorted = np.zeros(x.n, dtype=bool)
    counts = np.zeros(2, dtype=np.int64)
    K.score_file(rowpos, starts, ends, col, x.depth, x.good, x.good & x.scored_sorted, width,
                 hp, hb, dpk, dbk, _simd.token(dpk.shape[0]), float(threshold),
                 int(min_neighbours), float(min_scale), float(rel_min_scale), model == "plane",
                 int(iterations), flag_sorted, counts)
    return _result(x, flag_sorted, int(counts[0]), int(counts[1]))


@dataclass(frozen=True)
class _SortedInput:
    """:func:`swath_filter`'s input checked and in ping order (``ping``, ``beam``, ``depth``,
    ``scored_sorted``, ``good``); ``validity`` and ``scored`` in the caller's order, and the
    sorting permutation ``order`` (None when the input was already sorted: no copy)."""

    n: int
    ping: np.ndarray
    beam: np.ndarray
    depth: np.ndarray
    validity: np.ndarray
    scored: np.ndarray
    scored_sorted: np.ndarray
    good: np.ndarray
    order: np.ndarray | None


def _sorted_input(ping, beam, depth, validity, score_mask) -> _SortedInput:
    """Check the per-sounding arrays and put them in ping order; ``good``: usable soundings
    (no INVAL or DELETED bit, finite depth)."""
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
    # Work in ping order; input read from a file is already sorted, so usually no copy.
    order = None
    val_s, scored_s = val_in, scored
    if np.any(ping[1:] < ping[:-1]):
        order = np.argsort(ping, kind="stable")
        ping, beam, depth, val_s, scored_s = (ping[order], beam[order], depth[order],
                                              val_in[order], scored[order])
    good = ((val_s & np.uint32(V.INVAL | V.DELETED)) == 0) & np.isfinite(depth)
    return _SortedInput(n_all, ping, beam, depth, val_in, scored, scored_s, good, order)


def _ping_rows(ping: np.ndarray, hp: int):
    """First and end sounding of each distinct ping of ping-sorted input, and its grid row.

    The grid row is the ping number with gaps longer than the half window ``hp`` shortened
    to hp + 1 rows (pings that far apart never share a window either way), so a missing ping
    is an empty row and the grid stays small whatever the numbering.
    """
    starts = np.concatenate([[0], np.flatnonzero(ping[1:] != ping[:-1]) + 1]).astype(np.int64)
    ends = np.append(starts[1:], ping.shape[0]).astype(np.int64)
    pvals = ping[starts].astype(np.int64)
    rowpos = np.concatenate([[0], np.cumsum(np.minimum(np.diff(pvals), hp + 1))]).astype(np.int64)
    return starts, ends, rowpos


def _result(x: _SortedInput, flag_sorted: np.ndarray, tested: int, sparse: int):
    """New validity words (FILTER_INVAL | MODIFIED added where flagged) and the stats."""
    if x.order is not None:
        flagged = np.zeros(x.n, dtype=bool)
        flagged[x.order] = flag_sorted
    else:
        flagged = flag_sorted
    new_val = x.validity.copy()
    new_val[flagged] |= np.uint32(V.FILTER_INVAL | V.MODIFIED)
    return new_val, SwathStats(soundings=x.n, scored=int(x.scored.sum()), tested=tested,
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
