"""The swath filter: a slow per-sounding reference, planted-spike scores, split/chunk invariance.

The reference re-derives each decision one sounding at a time from a dictionary of
(ping rank, beam) -> depth with ``np.median`` and ``np.linalg.solve``, sharing no code with
``pfm_dask.filters._swath``. The synthetic surveys are ping x beam grids over a sloping, curved
seafloor with noise of 0.3 % of depth (more at the outer beams) and planted spikes of 3-30 %
of depth, single and in clusters of 2-3 adjacent beams.
"""

from __future__ import annotations

import numpy as np
import pytest

from pfm_dask.errors import ConfigError
from pfm_dask.filters import score_against_truth, swath_filter, swath_halo
from pfm_dask.pfm import validity as V

CUT = V.FILTER_INVAL | V.MODIFIED


# ----------------------------------------------------------------------------- survey
def survey(n_pings=120, n_beams=96, depth0=800.0, slope_deg=5.0, along_slope_deg=2.0,
           noise_rel=0.003, spike_frac=0.01, seed=0, swath_deg=60.0):
    """Flat per-sounding arrays (ping, beam 1-based, depth) and the spike truth mask."""
    rng = np.random.default_rng(seed)
    theta = np.deg2rad(np.linspace(-swath_deg, swath_deg, n_beams))
    y = np.arange(n_pings)[:, None] * depth0 * 0.01
    t_across = np.tan(np.deg2rad(slope_deg))
    t_along = np.tan(np.deg2rad(along_slope_deg))

    def floor(x):
        return (depth0 + t_across * x + t_along * y + 0.02 * depth0 * np.sin(y / depth0 * 4)
                + 0.015 * depth0 * np.cos(x / depth0 * 2.5))

    x = depth0 * np.tan(theta)[None, :] + 0 * y
    for _ in range(30):                      # beam lands where its ray meets the seafloor
        x = floor(x) * np.tan(theta)[None, :]
    z = floor(x)
    sigma = noise_rel * z * (1.0 + (theta[None, :] / np.deg2rad(swath_deg)) ** 2)
    z = z + rng.normal(size=z.shape) * sigma
    spike = np.zeros(z.shape, bool)
    starts = rng.choice(z.size, int(spike_frac * z.size), replace=False)
    for k, s in enumerate(starts):
        p, b = divmod(int(s), n_beams)
        length = 1 + (k % 3 == 0) + (k % 6 == 0)          # some clusters of 2-3 beams
        spike[p, b:b + length] = True
    mag = rng.uniform(0.03, 0.30, z.shape) * rng.choice([-1.0, 1.0], z.shape)
    z = np.where(spike, z * (1.0 + mag), z)
    P, B = np.meshgrid(np.arange(1, n_pings + 1), np.arange(1, n_beams + 1), indexing="ij")
    return P.ravel(), B.ravel(), z.ravel(), spike.ravel()


# ----------------------------------------------------------------------------- reference
def reference(ping, beam, depth, validity, *, window_pings=5, window_beams=9, threshold=5.0,
              min_neighbours=8, min_scale=0.01, rel_min_scale=5e-4, model="plane",
              iterations=2):
    ok = ((validity & (V.INVAL | V.DELETED)) == 0) & np.isfinite(depth)
    cell = {(int(p), int(b)): float(z) for p, b, z, g in zip(ping, beam, depth, ok) if g}
    hp, hb = window_pings // 2, window_beams // 2
    flagged = np.zeros(len(ping), bool)

    def floor(s, a):
        return max(s, min_scale, rel_min_scale * abs(a))

    for i in range(len(ping)):
        if not ok[i]:
            continue
        r, b = int(ping[i]), int(beam[i])
        nb = [(dp, db, cell[(r + dp, b + db)]) for dp in range(-hp, hp + 1)
              for db in range(-hb, hb + 1)
              if (dp, db) != (0, 0) and (r + dp, b + db) in cell]
        if len(nb) < min_neighbours:
            continue
        zs = np.array([t[2] for t in nb])
        a = float(np.median(zs))
        scale = floor(1.4826 * float(np.median(np.abs(zs - a))), a)
        if model == "plane":
            X = np.array([[1.0, t[1], t[0]] for t in nb])
            pred = np.full(len(nb), a)
            for _ in range(iterations):
                u = (zs - pred) / (4.685 * scale)
                w = np.where(np.abs(u) < 1, (1 - u * u) ** 2, 0.0)
                if w.sum() > 0:
                    M = X.T @ (w[:, None] * X) + np.diag([0.0, 1e-6, 1e-6])
                    coef = np.linalg.solve(M, X.T @ (w * zs))
                else:
                    coef = np.array([a, 0.0, 0.0])
                a = coef[0]
                pred = X @ coef
                scale = floor(1.4826 * float(np.median(np.abs(zs - pred))), a)
        flagged[i] = abs(depth[i] - a) / scale > threshold
    return flagged


def flags_of(new, old):
    changed = new != old
    assert np.all(new[changed] == (old[changed] | CUT))
    return changed


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("model", ["plane", "median"])
@pytest.mark.parametrize("seed", range(3))
def test_matches_reference(seed, model):
    rng = np.random.default_rng(seed)
    p, b, z, _ = survey(n_pings=14, n_beams=24, seed=seed, spike_frac=0.05, slope_deg=8)
    v = np.full(len(z), 64, np.uint32)
    v[rng.random(len(z)) < 0.08] |= V.MANUALLY_INVAL          # invalid: neither tested nor used
    v[rng.random(len(z)) < 0.02] |= V.DELETED
    keep = rng.random(len(z)) > 0.1                            # missing beams
    keep &= ~np.isin(p, [5, 6])                                # two missing pings
    keep &= ~((p % 4 == 0) & (b > 20))                         # shorter pings
    p, b, z, v = p[keep], b[keep], z[keep], v[keep]
    new, stats = swath_filter(p, b, z, v, model=model)
    got = flags_of(new, v)
    want = reference(p, b, z, v, model=model)
    assert got.tolist() == want.tolist()
    assert stats.flagged == int(want.sum()) > 0


@pytest.mark.parametrize("slope", [0.0, 10.0, 15.0])
def test_planted_spikes(slope):
    p, b, z, spike = survey(slope_deg=slope, seed=7)
    v = np.full(len(z), 64, np.uint32)
    new, stats = swath_filter(p, b, z, v)
    r = score_against_truth(flags_of(new, v), spike)
    assert r["detection"] >= 0.95, r
    assert r["false_positive"] <= 0.005, r
    assert stats.tested == len(z)


def test_plane_beats_median_on_slopes():
    p, b, z, spike = survey(slope_deg=15.0, seed=8)
    v = np.zeros(len(z), np.uint32)
    plane = score_against_truth(flags_of(swath_filter(p, b, z, v)[0], v), spike)
    median = score_against_truth(flags_of(swath_filter(p, b, z, v, model="median")[0], v), spike)
    assert plane["detection"] > median["detection"] + 0.05


def test_swath_edges():
    p, b, z, spike = survey(slope_deg=10.0, seed=9, spike_frac=0.02)
    v = np.zeros(len(z), np.uint32)
    f = flags_of(swath_filter(p, b, z, v)[0], v)
    edge = (b <= 4) | (b >= b.max() - 3)
    r = score_against_truth(f[edge], spike[edge])
    assert r["detection"] >= 0.9 and r["false_positive"] <= 0.01, r


@pytest.mark.parametrize("window", [(5, 9), (3, 5)])
def test_split_equals_whole(window):
    wp, wb = window
    p, b, z, _ = survey(n_pings=60, n_beams=48, seed=3, spike_frac=0.03)
    rng = np.random.default_rng(1)
    v = np.where(rng.random(len(z)) < 0.05, 64 | V.FILTER_INVAL, 64).astype(np.uint32)
    keep = ~np.isin(p, [17, 21, 40, 41, 42, 43])   # dropped pings at and near the split points
    p, b, z, v = p[keep], b[keep], z[keep], v[keep]
    whole, _ = swath_filter(p, b, z, v, window_pings=wp, window_beams=wb)
    halo = swath_halo(wp)
    out = v.copy()
    for lo, hi in [(1, 17), (18, 19), (20, 39), (40, 60)]:        # ping-number ranges
        m = (p >= lo - halo) & (p <= hi + halo)
        score = (p >= lo) & (p <= hi)
        part, st = swath_filter(p[m], b[m], z[m], v[m], window_pings=wp, window_beams=wb,
                                score_mask=score[m])
        assert np.array_equal(part[~score[m]], v[m][~score[m]])    # context never flagged
        out[score] = part[score[m]]
    assert np.array_equal(out, whole)


def test_missing_pings_are_empty_rows():
    # Ping numbers, not ranks, define the window: with ping 11 missing, ping 10's window
    # (pings 8..12) has one empty row.
    p, b, z, _ = survey(n_pings=30, n_beams=40, seed=12, spike_frac=0.05)
    v = np.zeros(len(z), np.uint32)
    keep = p != 11
    p, b, z, v = p[keep], b[keep], z[keep], v[keep]
    got = flags_of(swath_filter(p, b, z, v, min_neighbours=1)[0], v)
    assert got.tolist() == reference(p, b, z, v, min_neighbours=1).tolist()
    # A huge gap in the numbering splits the file in two and costs nothing.
    far = np.where(p > 15, p + 10**12, p)
    got = flags_of(swath_filter(far, b, z, v, min_neighbours=1)[0], v)
    assert got.tolist() == reference(far, b, z, v, min_neighbours=1).tolist()


def test_chunking_and_order_do_not_matter():
    p, b, z, _ = survey(n_pings=40, n_beams=40, seed=4, spike_frac=0.03)
    v = np.zeros(len(z), np.uint32)
    base, _ = swath_filter(p, b, z, v)
    for cells in (1, 50, 333, 10_000):
        assert np.array_equal(swath_filter(p, b, z, v, chunk_cells=cells)[0], base)
    perm = np.random.default_rng(0).permutation(len(z))
    shuffled, _ = swath_filter(p[perm], b[perm], z[perm], v[perm])
    assert np.array_equal(shuffled, base[perm])


def test_only_valid_soundings_are_tested_and_used():
    p, b, z, _ = survey(n_pings=20, n_beams=30, seed=5, spike_frac=0.0)
    v = np.zeros(len(z), np.uint32)
    i = np.flatnonzero((p == 10) & (b == 15))[0]
    z2 = z.copy()
    z2[i] *= 1.2
    # A valid spike is flagged; an already-invalid one is left exactly as it was.
    before, _ = swath_filter(p, b, z, v)
    new, _ = swath_filter(p, b, z2, v)
    assert new[i] == CUT and np.flatnonzero(new != before).tolist() == [i]
    v2 = v.copy()
    v2[i] = V.MANUALLY_INVAL | V.USER_01
    new, stats = swath_filter(p, b, z2, v2)
    expect = before.copy()
    expect[i] = v2[i]
    assert np.array_equal(new, expect)
    assert stats.tested == len(z) - 1
    # Invalid neighbours carry no weight: a block of invalid wild values changes nothing.
    z3 = z.copy()
    bad = (p >= 9) & (p <= 11) & (b >= 13) & (b <= 17) & (np.arange(len(z)) != i)
    z3[bad] = 5000.0
    v3 = np.where(bad, V.FILTER_INVAL, 0).astype(np.uint32)
    a, _ = swath_filter(p, b, z3, v3)
    c, _ = swath_filter(p[~bad], b[~bad], z[~bad], v[~bad])
    assert np.array_equal(a[~bad], c) and np.array_equal(a[bad], v3[bad])


def test_sparse_soundings_untested():
    p = np.array([1, 1, 2, 2, 3])
    b = np.array([1, 2, 1, 2, 1])
    z = np.array([100.0, 100.0, 100.0, 100.0, 500.0])
    v = np.zeros(5, np.uint32)
    new, stats = swath_filter(p, b, z, v)
    assert np.array_equal(new, v)
    assert (stats.tested, stats.sparse) == (0, 5)
    new, stats = swath_filter(p, b, z, v, min_neighbours=3)
    assert new.tolist() == [0, 0, 0, 0, CUT]


def test_flat_noise_free_data_is_left_alone():
    # Zero noise: the scale floor (min_scale, rel_min_scale) keeps tiny steps from being flagged.
    P, B = np.meshgrid(np.arange(30), np.arange(1, 41), indexing="ij")
    z = np.round(100.0 + 0.01 * (B > 20), 2).ravel()
    v = np.zeros(z.size, np.uint32)
    new, stats = swath_filter(P.ravel(), B.ravel(), z, v)
    assert stats.flagged == 0
    # Without a floor the scale is 0: any departure from the exact local plane is flagged,
    # and there is no warning (warnings are errors in this suite).
    z2 = np.full(z.size, 100.0)
    z2[5 * 40 + 7] = 100.01
    new, stats = swath_filter(P.ravel(), B.ravel(), z2, v, min_scale=0.0, rel_min_scale=0.0)
    assert np.flatnonzero(new).tolist() == [5 * 40 + 7]


def test_input_checks():
    with pytest.raises(ValueError, match="same"):
        swath_filter([1, 1], [3, 3], [1.0, 2.0], [0, 0])
    with pytest.raises(ValueError):
        swath_filter([1, 2], [1], [1.0, 2.0], [0, 0])
    with pytest.raises(ConfigError):
        swath_filter([1], [1], [1.0], [0], window_beams=4)
    with pytest.raises(ConfigError):
        swath_filter([1], [1], [1.0], [0], model="cubic")
    new, stats = swath_filter(np.zeros(0, int), np.zeros(0, int), np.zeros(0), np.zeros(0, np.uint32))
    assert new.size == 0 and stats.soundings == 0


# ----------------------------------------------------------------------------- synth survey
def _load_like_pfmloader(path):
    """A GSF file's soundings as the loader prepares them: skips, flag mapping, depth limits."""
    import pyarrow.compute as pc

    from pfm_dask.filters import apply_depth_limits, beam_usable, gsf_flags_to_validity
    from pfm_dask.gsf import read_pings

    t = read_pings(path)
    ping_ok = ((t["ping_flags"].to_numpy() & 1) == 0) & (t["latitude"].to_numpy() <= 90) \
        & (t["longitude"].to_numpy() <= 180)
    has = pc.is_valid(t["beam_flags"]).to_numpy(zero_copy_only=False)
    flags = pc.fill_null(t["beam_flags"], 0).to_numpy()
    depth = pc.fill_null(t["depth"], 0.0).to_numpy()
    use = ping_ok & beam_usable(depth, flags, has)
    validity = gsf_flags_to_validity(flags[use])
    depth, validity = apply_depth_limits(depth[use], validity, -10000.0, 12000.0, 12001.0)
    return t["ping"].to_numpy()[use], t["beam"].to_numpy()[use], depth, validity


def test_score_on_synth(tmp_path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pfm_dask import synth
    from pfm_dask.filters import spike_mask

    synth.generate(tmp_path, files=2, pings=200, seed=11, spike_rate=2e-3, cluster_rate=0.05)
    truth = pq.read_table(tmp_path / "truth.parquet")
    flagged, spikes, eligible = [], [], []
    for path in sorted(tmp_path.glob("*.gsf")):
        ping, beam, depth, validity = _load_like_pfmloader(path)
        new, stats = swath_filter(ping, beam, depth, validity)
        mine = truth.filter(pc.equal(truth["file"], path.name))
        flagged.append(flags_of(new, validity))
        spikes.append(spike_mask(ping, beam, mine["ping"].to_numpy(), mine["beam"].to_numpy()))
        eligible.append((validity & V.INVAL) == 0)
    r = score_against_truth(np.concatenate(flagged), np.concatenate(spikes),
                            np.concatenate(eligible))
    assert r["spikes"] > 300
    assert r["detection"] >= 0.95, r
    assert r["false_positive"] <= 0.005, r
