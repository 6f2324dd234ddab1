"""The compiled swath kernel against a plain per-sounding recomputation of the rule.

``tests/swath_reference.py`` scores one sounding at a time with ``np.sort`` medians and
``np.linalg.solve``; the kernel scores 8 beams at once with sorting networks in SIMD lanes.
Flags must agree exactly, except where the reference's score lies within 1e-4 of the
threshold (the two sum the weights in different orders); every test also asserts that no
such near-tie occurred, so the agreement below is exact. Covered: synthetic surveys with
missing beams and pings, invalid, NaN and infinite depths, gaps in the ping numbering, swath
edges and the first and last pings; quantised depths (ties in every median); a score exactly
at the threshold; a zero scale; other window sizes, models and iteration counts; the real
GSF samples and a ``pfm_dask.synth`` survey. The sorting networks are checked on their own.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pfm_dask.filters import swath_filter
from pfm_dask.pfm import validity as V

from .swath_reference import reference_scores
from .test_swath_filter import _load_like_pfmloader, survey


def check_against_reference(p, b, z, v, *, threshold=5.0, min_neighbours=8, only=None,
                            exact_tie=False, **kw):
    """Run the filter and the reference; assert identical flags and counts where scored.

    Scores within 1e-4 of the threshold are refused (the data should be changed) unless
    ``exact_tie`` says the test built one on purpose."""
    new, stats = swath_filter(p, b, z, v, threshold=threshold, min_neighbours=min_neighbours,
                              **kw)
    n, score = reference_scores(p, b, z, v, only=only, **kw)
    got = new != v
    assert np.all(new[got] == (v[got] | V.FILTER_INVAL | V.MODIFIED))
    with np.errstate(invalid="ignore"):
        want = (n >= min_neighbours) & (np.abs(score) > threshold)
        near = np.abs(np.abs(score) - threshold) <= 1e-4 * threshold
    sel = np.ones(len(p), bool) if only is None else np.asarray(only, bool)
    if not exact_tie:
        assert not np.any(near[sel]), "a score within 1e-4 of the threshold: pick other data"
    assert np.flatnonzero(got[sel] != want[sel]).tolist() == []
    if only is None:
        ok = ((v & (V.INVAL | V.DELETED)) == 0) & np.isfinite(z)
        assert stats.tested == int(np.count_nonzero(ok & (n >= min_neighbours)))
        assert stats.sparse == int(np.count_nonzero(ok & (n < min_neighbours)))
        assert stats.flagged == int(want.sum())
    return got, want


def holey_survey(seed, n_pings=24, n_beams=40):
    """A survey with every kind of hole: invalid, deleted, NaN and inf depths, missing beams,
    two missing pings, shorter pings, and a jump in the ping numbering."""
    rng = np.random.default_rng(seed)
    p, b, z, _ = survey(n_pings=n_pings, n_beams=n_beams, seed=seed, spike_frac=0.05,
                        slope_deg=8)
    v = np.full(len(z), V.USER_01, np.uint32)
    v[rng.random(len(z)) < 0.06] |= V.MANUALLY_INVAL
    v[rng.random(len(z)) < 0.02] |= V.FILTER_INVAL
    v[rng.random(len(z)) < 0.02] |= V.DELETED
    z = z.copy()
    z[rng.random(len(z)) < 0.02] = np.nan                     # valid bits, but no depth
    z[rng.random(len(z)) < 0.005] = np.inf
    keep = rng.random(len(z)) > 0.08                          # missing beams
    keep &= ~np.isin(p, [7, 8])                               # two missing pings
    keep &= ~((p % 5 == 0) & (b > n_beams - 6))               # shorter pings
    p = np.where(p > 15, p + 1000, p)                         # a gap in the numbering
    return p[keep], b[keep], z[keep], v[keep]


# ------------------------------------------------------------------------------ networks
@pytest.mark.parametrize("n", range(2, 15))
def test_networks_sort_every_zero_one_input(n):
    from pfm_dask.filters._simd import odd_even_merge_sort, select_network

    x = np.array(list(itertools.product((0, 1), repeat=n)), dtype=np.int8)   # 0-1 principle
    want = np.sort(x, axis=1)
    y = x.copy()
    for i, j in odd_even_merge_sort(n):
        y[:, i], y[:, j] = np.minimum(y[:, i], y[:, j]), np.maximum(y[:, i], y[:, j])
    assert np.array_equal(y, want)
    ranks = (n // 2 - 1, n // 2)
    y = x.copy()
    for i, j in select_network(n, ranks):
        y[:, i], y[:, j] = np.minimum(y[:, i], y[:, j]), np.maximum(y[:, i], y[:, j])
    assert np.array_equal(y[:, ranks], want[:, ranks])


@pytest.mark.parametrize("n", [15, 18, 20])
def test_pairwise_network_sorts_every_zero_one_input(n):
    # Bit-parallel 0-1 principle: wire i holds bit i of every input 0 .. 2^n - 1.
    from pfm_dask.filters._simd import pairwise_sort, select_network

    idx = np.arange(1 << n, dtype=np.uint32)
    ones = sum(((idx >> i) & 1).astype(np.int64) for i in range(n))
    for net, ranks in ((pairwise_sort(n), range(n)),
                       (select_network(n, (n // 2 - 1, n // 2)), (n // 2 - 1, n // 2))):
        w = [((idx >> i) & 1).astype(bool) for i in range(n)]
        for i, j in net:
            w[i], w[j] = w[i] & w[j], w[i] | w[j]
        for r in ranks:                  # ascending: output r is 1 iff more than n - 1 - r ones
            assert np.array_equal(w[r], ones >= n - r)


def test_pairwise_network_is_the_power_of_two_one_cut():
    # An n-input network is the 64-input one without the comparators past n, so it sorts
    # because that one does (inputs past n as +inf never move).
    from pfm_dask.filters._simd import pairwise_sort, select_network

    for n in (20, 33, 44, 63):
        assert pairwise_sort(n) == [(i, j) for i, j in pairwise_sort(64) if j < n]
    assert len(select_network(44, (21, 22))) == 239


@pytest.mark.parametrize("k", [2, 14, 44, 76])
def test_vsort_rows_gives_the_middle_of_scattered_rows(k):
    import numba

    from pfm_dask.filters import _simd

    @numba.njit
    def middle(flat, offs, base, tok, out):
        lo, hi = _simd.vsort_rows(flat, offs, base, tok)
        _simd.vstore(out, 0, lo)
        _simd.vstore(out, 8, hi)

    rng = np.random.default_rng(k)
    flat = np.round(rng.normal(size=40 * k + 16), 1).astype(np.float32)
    flat[rng.random(flat.size) < 0.1] = -np.inf
    flat[rng.random(flat.size) < 0.1] = np.inf
    offs = rng.choice(40 * k, k, replace=False).astype(np.int64)
    for base in (0, 3, 8):
        out = np.empty(16, np.float32)
        middle(flat, offs, base, _simd.token(k), out)
        s = np.sort(np.stack([flat[o + base:o + base + 8] for o in offs]), axis=0)
        assert np.array_equal(out[:8], s[k // 2 - 1]) and np.array_equal(out[8:], s[k // 2])


@pytest.mark.parametrize("k", [2, 14, 44, 76])
def test_vsort_pair_gives_the_middle_of_each_lane(k):
    import numba

    from pfm_dask.filters import _simd

    @numba.njit
    def middle(a, tok, out):
        lo, hi = _simd.vsort_pair(a, tok)
        _simd.vstore(out, 0, lo)
        _simd.vstore(out, 8, hi)

    rng = np.random.default_rng(k)
    for trial in range(50):
        a = rng.normal(size=(k, 8)).astype(np.float32)
        if trial % 2:
            a = np.round(a, 1)                                # many ties
        a[rng.random(a.shape) < 0.1] = -np.inf
        a[rng.random(a.shape) < 0.1] = np.inf
        out = np.empty(16, np.float32)
        middle(a, _simd.token(k), out)
        s = np.sort(a, axis=0)
        assert np.array_equal(out[:8], s[k // 2 - 1]) and np.array_equal(out[8:], s[k // 2])


# ------------------------------------------------------------------------------ synthetic
@pytest.mark.parametrize("seed", range(3))
def test_holey_survey_matches_reference(seed):
    p, b, z, v = holey_survey(seed)
    got, _ = check_against_reference(p, b, z, v)
    assert got.sum() > 10


@pytest.mark.parametrize("window,model,iterations", [
    ((3, 5), "plane", 2), ((7, 11), "plane", 2), ((1, 9), "plane", 2), ((5, 1), "plane", 2),
    ((5, 9), "median", 2), ((5, 9), "plane", 1), ((5, 9), "plane", 3)])
def test_other_windows_and_models_match_reference(window, model, iterations):
    p, b, z, v = holey_survey(5, n_pings=18, n_beams=30)
    check_against_reference(p, b, z, v, window_pings=window[0], window_beams=window[1],
                            model=model, iterations=iterations,
                            min_neighbours=min(8, window[0] * window[1] - 1))


def test_full_windows_match_reference():
    # No hole anywhere: every window in the middle of the swath takes the kernel's path for
    # full windows (the network run where the rows lie, no pads).
    p, b, z, _ = survey(n_pings=20, n_beams=64, seed=13, spike_frac=0.03, slope_deg=8)
    got, _ = check_against_reference(p, b, z, np.zeros(len(z), np.uint32))
    assert got.sum() > 10


@pytest.mark.parametrize("threshold", [2.5, 3.5, 7.0])
def test_other_thresholds_match_reference(threshold):
    # The last median is skipped where a count proves the sounding unflagged; near the
    # threshold (many soundings at 2.5) it must still be taken.
    p, b, z, v = holey_survey(11, n_pings=20, n_beams=40)
    check_against_reference(p, b, z, v, threshold=threshold)


def test_swath_edges_first_and_last_pings():
    p, b, z, _ = survey(n_pings=12, n_beams=48, seed=21, spike_frac=0.08, slope_deg=12)
    v = np.zeros(len(z), np.uint32)
    got, want = check_against_reference(p, b, z, v, min_neighbours=1)
    edge = (p <= 2) | (p >= 11) | (b <= 4) | (b >= 45)
    assert got[edge].sum() > 5                                # edges are tested and flagged


def test_unsorted_input_and_odd_numbering_match_reference():
    p, b, z, v = holey_survey(8, n_pings=14, n_beams=25)
    perm = np.random.default_rng(0).permutation(len(p))
    check_against_reference(p[perm] * 3 - 7, b[perm] + 100, z[perm], v[perm])


def test_quantised_depths_ties_match_reference():
    # Depths to 0.5 m over ~800 m of noise-free-ish ground: most medians are ties.
    p, b, z, _ = survey(n_pings=16, n_beams=36, seed=3, noise_rel=0.001, spike_frac=0.04)
    z = np.round(z * 2) / 2
    v = np.zeros(len(z), np.uint32)
    check_against_reference(p, b, z, v)


def test_score_exactly_at_threshold():
    # Flat 100 m, scale floored at 0.25: a sounding 1.0 m off scores exactly 4.0, which is
    # not > 4; one a hair further is flagged.
    P, B = np.meshgrid(np.arange(1, 11), np.arange(1, 21), indexing="ij")
    p, b = P.ravel(), B.ravel()
    v = np.zeros(p.size, np.uint32)
    i = np.flatnonzero((p == 5) & (b == 10))[0]
    for off, flagged in ((1.0, False), (1.0 + 2e-14 * 100, True)):
        z = np.full(p.size, 100.0)
        z[i] += off
        got, _ = check_against_reference(p, b, z, v, threshold=4.0, min_scale=0.25,
                                         rel_min_scale=0.0, exact_tie=True)
        assert bool(got[i]) is flagged and got.sum() == int(flagged)


def test_zero_scale_matches_reference():
    P, B = np.meshgrid(np.arange(30), np.arange(1, 41), indexing="ij")
    z = np.full(P.size, 100.0)
    z[5 * 40 + 7] = 100.01
    z[20 * 40 + 39] = 99.99                                    # at the swath edge
    v = np.zeros(z.size, np.uint32)
    got, _ = check_against_reference(P.ravel(), B.ravel(), z, v, min_scale=0.0,
                                     rel_min_scale=0.0)
    assert np.flatnonzero(got).tolist() == [5 * 40 + 7, 20 * 40 + 39]


def test_tiny_inputs_match_reference():
    for p, b in (([1], [1]), ([1, 1, 1], [1, 2, 3]), ([1, 2, 3, 4], [5, 5, 5, 5])):
        p, b = np.array(p), np.array(b)
        z = 100.0 + np.arange(len(p)) * 0.1
        z[-1] = 150.0
        check_against_reference(p, b, z, np.zeros(len(p), np.uint32), min_neighbours=1)


# ------------------------------------------------------------------------------ real data
def _sample(n, p, b, rng, count=2500):
    """Soundings to recompute: the first and last 3 pings, the 6 outer beams each side, and
    ``count`` others at random."""
    b = b.astype(np.int64)
    pings = np.unique(p)
    only = np.isin(p, np.concatenate([pings[:3], pings[-3:]]))
    only |= (b <= b.min() + 5) | (b >= b.max() - 5)
    only[rng.choice(n, min(count, n), replace=False)] = True
    return only


def test_real_gsf_pings_match_reference(gsf_sample):
    ping, beam, depth, validity = _load_like_pfmloader(gsf_sample)
    if ping.size == 0:
        pytest.skip("no soundings in this sample")
    only = _sample(ping.size, ping, beam, np.random.default_rng(0))
    check_against_reference(ping, beam, depth, validity, only=only)


def test_synth_survey_matches_reference(tmp_path):
    from pfm_dask import synth

    synth.generate(tmp_path, files=1, pings=40, seed=4, spike_rate=2e-3, cluster_rate=0.1)
    path = sorted(tmp_path.glob("*.gsf"))[0]
    ping, beam, depth, validity = _load_like_pfmloader(path)
    only = _sample(ping.size, ping, beam, np.random.default_rng(1))
    got, _ = check_against_reference(ping, beam, depth, validity, only=only)
    assert got[only].sum() > 5
