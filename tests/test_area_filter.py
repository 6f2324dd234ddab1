"""The area filter against a slow, per-bin raster-order reference written here, plus its bug fixes.

The reference follows docs/filters.md §3 bin by bin in pfmLoader's raster order (one Python loop
per bin and per sounding), with the fixes this project makes: edge rows filtered with the
3 x 3 block clipped at the grid, no cut when the threshold is 0, double-precision two-pass
statistics. It shares no code with ``pfm_dask.filters._area``.
"""

from __future__ import annotations

import gc
import math
import weakref

import numpy as np
import pytest

from pfm_dask.errors import ConfigError
from pfm_dask.filters import AreaFilter, RowSoundings
from pfm_dask.pfm import validity as V

CUT = V.FILTER_INVAL | V.MODIFIED


# ----------------------------------------------------------------------------- reference
def _stats(soundings, skip_mask, null_depth=None):
    """(data, avg, std) of the soundings not carrying any bit of skip_mask, in order."""
    zs = [z for z, v in soundings if not (v & skip_mask)
          and (null_depth is None or z < null_depth)]
    n = len(zs)
    if n == 0:
        return (False, 0.0, 0.0)
    s = 0.0
    for z in zs:
        s += z
    avg = s / n
    ss = 0.0
    for z in zs:
        d = z - avg
        ss += d * d
    return (True, avg, math.sqrt(ss / (n - 1)) if n > 1 else 0.0)


def reference(bins, width, height, *, bin_size_xy, bin_diagonal, cellstd=2.4, deep_only=True,
              exact_raster=True, min_cells=5, active=None, cut_reference=True,
              null_depth=None):
    """bins[(x, y)] = list of [z, v]; modified in place. Returns the set of cut (x, y, i)."""
    pre_skip = V.INVAL | V.DELETED
    post_skip = V.INVAL | V.DELETED | V.REFERENCE
    seen = {(x, y): _stats(bins.get((x, y), []), pre_skip)
            for y in range(height) for x in range(width)}
    cuts = set()
    for y in range(height):
        row_pre = {x: seen[(x, y)] for x in range(width)}
        for x in range(width):
            if active is not None and not active[y][x]:
                continue
            centre = seen[(x, y)]
            if not centre[0]:
                continue
            cells = []
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    i, j = y + dy, x + dx
                    if 0 <= i < height and 0 <= j < width:
                        st = row_pre[j] if (dy == 0 and dx == -1 and not exact_raster) \
                            else seen[(j, i)]
                        if st[0]:
                            cells.append((dx, dy, st))
            if len(cells) < min_cells:
                continue
            flat = True
            for dx, dy, st in cells:
                if (dx, dy) == (0, 0):
                    continue
                d = bin_diagonal if (dx and dy) else (bin_size_xy or bin_diagonal)
                if abs(centre[1] - st[1]) / d > 1.0:
                    flat = False
            n = len(cells)
            avgsum = 0.0
            stdsum = 0.0
            for _, _, st in cells:
                avgsum += st[1]
                stdsum += st[2]
            avg = avgsum / n
            ss = 0.0
            for _, _, st in cells:
                d = st[1] - avg
                ss += d * d
            spread = 2.0 * (stdsum / n if flat else math.sqrt(ss / (n - 1)))
            thr = cellstd * spread
            if thr > 0:
                for k, s in enumerate(bins[(x, y)]):
                    z, v = s
                    if v & (V.INVAL | V.DELETED):
                        continue
                    if not cut_reference and v & V.REFERENCE:
                        continue
                    dev = z - avg
                    if (dev >= thr) if deep_only else (abs(dev) >= thr):
                        s[1] = v | CUT
                        cuts.add((x, y, k))
            seen[(x, y)] = _stats(bins[(x, y)], post_skip, null_depth)
    return cuts


# ----------------------------------------------------------------------------- helpers
def make_grid(seed, width=11, height=8, max_per_bin=7, p_empty=0.15, spike_p=0.06,
              slope=0.3, noise=0.2, flags=True, spike=(1.0, 6.0)):
    rng = np.random.default_rng(seed)
    bins = {}
    for y in range(height):
        for x in range(width):
            if rng.random() < p_empty:
                continue
            n = int(rng.integers(1, max_per_bin + 1))
            base = 100.0 + slope * 2.0 * x + 0.1 * y * y
            lst = []
            for _ in range(n):
                z = base + rng.normal() * noise
                if rng.random() < spike_p:
                    z += rng.choice([-1, 1]) * rng.uniform(*spike)
                v = 64
                if flags:
                    r = rng.random()
                    if r < 0.05:
                        v |= V.FILTER_INVAL
                    elif r < 0.07:
                        v |= V.MANUALLY_INVAL
                    elif r < 0.09:
                        v |= V.REFERENCE
                    elif r < 0.10:
                        v |= V.DELETED
                lst.append([round(z, 2), v])
            bins[(x, y)] = lst
    return bins


def to_rows(bins, width, height, shuffle_seed=None):
    """Per row: (col, depth, validity, address) grouped by bin column, as the writer reads a
    row, or in a random order with ``shuffle_seed`` (the kernel's counting-sort path)."""
    rows = []
    for y in range(height):
        col, z, v, addr = [], [], [], []
        for x in range(width):
            for k, (zz, vv) in enumerate(bins.get((x, y), [])):
                col.append(x)
                z.append(zz)
                v.append(vv)
                addr.append((x, y, k))
        row = (np.array(col, np.int64), np.array(z, float), np.array(v, np.uint32),
               np.array(addr, np.int64).reshape(-1, 3))
        if shuffle_seed is not None:
            # bins interleaved at random, each bin's soundings still in their order (the
            # sums run in sounding order: a stable sort by column gives the grouped row back)
            c = row[0]
            perm = c[np.random.default_rng(shuffle_seed * 1000 + y).permutation(c.size)]
            order = np.empty(c.size, np.int64)
            for x in np.unique(c):
                order[np.flatnonzero(perm == x)] = np.flatnonzero(c == x)
            row = tuple(a[order] for a in row)
        rows.append(row)
    return rows


def run_kernel(bins, width, height, shuffle_seed=None, **kw):
    rows = to_rows(bins, width, height, shuffle_seed)
    active = kw.pop("active", None)
    filt = AreaFilter(width, height, **kw)
    cuts = set()
    results = []

    def read_row(y):
        col, z, v, addr = rows[y]
        act = None if active is None else np.array(active[y], bool)
        return RowSoundings(col, z, v, address=addr, active=act)

    def write_row(y, res):
        results.append(res)
        col, z, v, addr = rows[y]
        assert np.all(res.validity == (v[res.index] | CUT))
        assert np.all(res.address == addr[res.index])
        assert res.changed_cols.tolist() == sorted(set(col[res.index].tolist()))
        for a in res.address:
            cuts.add(tuple(int(t) for t in a))

    summary = filt.run(read_row, write_row)
    assert [r.row for r in results] == list(range(height))
    return cuts, summary, results


PARAMS = dict(bin_size_xy=2.0, bin_diagonal=2.0 * math.sqrt(2.0))


# ----------------------------------------------------------------------------- tests
@pytest.mark.parametrize("exact_raster", [True, False])
@pytest.mark.parametrize("deep_only", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_matches_reference(seed, deep_only, exact_raster):
    bins = make_grid(seed)
    w, h = 11, 8
    cuts, summary, _ = run_kernel(bins, w, h, deep_only=deep_only, exact_raster=exact_raster,
                                  **PARAMS)
    ref_bins = {k: [list(s) for s in v] for k, v in bins.items()}
    ref = reference(ref_bins, w, h, deep_only=deep_only, exact_raster=exact_raster, **PARAMS)
    assert cuts == ref
    assert summary.cut == len(ref)
    assert len(ref) > 0


@pytest.mark.parametrize("exact_raster", [True, False])
@pytest.mark.parametrize("deep_only", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_shuffled_rows_match_reference_and_grouped(seed, deep_only, exact_raster):
    """Rows with their bins interleaved (the kernels' counting sort) give the reference's
    cuts, and the same cuts, counts and post-filter statistics, bit for bit, as the rows
    grouped by bin (the kernels' path without the sort)."""
    bins = make_grid(seed)
    w, h = 11, 8
    kw = dict(deep_only=deep_only, exact_raster=exact_raster, **PARAMS)
    cuts, summary, res = run_kernel(bins, w, h, shuffle_seed=seed + 1, **kw)
    ref_bins = {k: [list(s) for s in v] for k, v in bins.items()}
    assert cuts == reference(ref_bins, w, h, **kw)
    g_cuts, g_summary, g_res = run_kernel(bins, w, h, **kw)
    assert g_cuts == cuts and g_summary == summary
    assert [(r.examined, r.good, r.bad, r.changed_cols.tolist()) for r in res] == \
        [(r.examined, r.good, r.bad, r.changed_cols.tolist()) for r in g_res]
    # the statistics a row hands the next, bit for bit, either way
    rows_s, rows_g = to_rows(bins, w, h, seed + 1), to_rows(bins, w, h)
    for y in range(h):
        fs, fg = AreaFilter(w, h, **kw), AreaFilter(w, h, **kw)
        out_s = fs.band(lambda r: RowSoundings(*rows_s[r][:3]), 0, y + 1)
        out_g = fg.band(lambda r: RowSoundings(*rows_g[r][:3]), 0, y + 1)
        assert out_s["post"].same(out_g["post"])
        assert fs.pre_stats(RowSoundings(*rows_s[y][:3]), y).same(
            fg.pre_stats(RowSoundings(*rows_g[y][:3]), y))


@pytest.mark.parametrize("seed", [0, 2, 3, 5])     # seeds whose grids get cuts
def test_matches_reference_steep_sparse_and_options(seed):
    # Steep ground (exercises the not-flat branch), sparse bins, an active mask, REFERENCE
    # soundings protected, a null depth, minute bins (bin_size_xy = 0).
    w, h = 9, 7
    bins = make_grid(100 + seed, width=w, height=h, slope=3.0, p_empty=0.3, max_per_bin=5,
                     spike=(15.0, 40.0), spike_p=0.1)
    rng = np.random.default_rng(seed)
    active = (rng.random((h, w)) < 0.8).tolist()
    kw = dict(bin_size_xy=0.0, bin_diagonal=3.0, cellstd=2.0, deep_only=False,
              cut_reference=False, null_depth=110.0)
    cuts, summary, _ = run_kernel(bins, w, h, active=active, **kw)
    ref_bins = {k: [list(s) for s in v] for k, v in bins.items()}
    assert cuts == reference(ref_bins, w, h, active=active, **kw)
    assert summary.cut > 0


def test_raster_order_difference_is_the_left_neighbour():
    # Bin (1, 1) sees bin (0, 1) after filtering in raster order; its spike pulls bin (0, 1)'s
    # mean down only before filtering. Built so that bin (1, 1)'s own decision flips.
    w, h = 3, 3
    bins = {(x, y): [[100.0, 64], [100.2, 64], [99.8, 64]] for x in range(w) for y in range(h)}
    bins[(0, 1)] = [[100.0, 64], [100.2, 64], [99.8, 64], [160.0, 64]]   # a spike, will be cut
    bins[(1, 1)] = [[100.0, 64], [100.2, 64], [99.8, 64], [101.6, 64]]
    kw = dict(bin_size_xy=100.0, bin_diagonal=141.0, cellstd=2.4, deep_only=True)
    out = {}
    for exact in (True, False):
        cuts, _, _ = run_kernel(bins, w, h, exact_raster=exact, **kw)
        ref_bins = {k: [list(s) for s in v] for k, v in bins.items()}
        assert cuts == reference(ref_bins, w, h, exact_raster=exact, **kw)
        out[exact] = cuts
    assert (0, 1, 3) in out[True] and (0, 1, 3) in out[False]
    assert out[True] != out[False]
    assert out[True] ^ out[False] <= {(1, 1, k) for k in range(4)}


def test_edge_rows_are_filtered():
    # pfmLoader never filters rows 0 and H-1 (docs/filters.md §3); we do, with a clipped block.
    w, h = 6, 4
    rng = np.random.default_rng(3)
    bins = {(x, y): [[100.0 + rng.normal() * 0.1, 64] for _ in range(6)]
            for x in range(w) for y in range(h)}
    bins[(2, 0)][0][0] = 120.0
    bins[(3, h - 1)][1][0] = 120.0
    bins[(0, 1)][2][0] = 120.0          # left edge column, block of 6 cells
    cuts, summary, _ = run_kernel(bins, w, h, **PARAMS)
    assert cuts == {(2, 0, 0), (3, h - 1, 1), (0, 1, 2)}
    # Every bin with data goes through the test except the four corners (block of 4 < 5 cells).
    assert summary.bins_filtered == w * h - 4


def test_zero_spread_cuts_nothing():
    # One sounding per bin: every bin std is 0, the flat branch gives T = 0, and pfmLoader cuts
    # every examined sounding (204 of 204 two-sided, docs/filters.md §3). We cut none.
    w, h = 7, 6
    rng = np.random.default_rng(5)
    bins = {(x, y): [[100.0 + rng.normal() * 0.05, 64]] for x in range(w) for y in range(h)}
    for deep_only in (True, False):
        cuts, summary, _ = run_kernel(bins, w, h, deep_only=deep_only, **PARAMS)
        assert cuts == set()
        assert summary.bins_no_spread == summary.bins_filtered > 0
        assert summary.total == summary.good == summary.bins_filtered


def test_sparse_areas():
    # A single track of bins: no block reaches 5 cells with data, so nothing is filtered, the
    # bins are reported as sparse, and every row still gets a result for the caller.
    w, h = 8, 5
    good = [[100.0 + 0.05 * (k % 3), 64] for k in range(10)]
    bins = {(x, 2): [list(s) for s in good] + [[105.0, 64]] for x in range(w)}
    bins[(4, 3)] = [[100.0, 64]]
    cuts, summary, results = run_kernel(bins, w, h, **PARAMS)
    assert cuts == set()
    assert summary.bins_filtered == 0
    assert summary.bins_sparse == w + 1
    assert [r.index.size for r in results] == [0] * h
    # With enough neighbours the same spike is cut.
    for x in range(w):
        bins[(x, 1)] = [[100.0, 64], [100.1, 64], [99.9, 64]]
    cuts, _, _ = run_kernel(bins, w, h, **PARAMS)
    assert cuts == {(x, 2, 10) for x in range(1, w - 1)}   # end bins: block of 4 cells


def test_deep_only_vs_two_sided():
    w, h = 5, 5
    bins = {(x, y): [[100.0, 64], [100.2, 64], [99.8, 64], [100.1, 64]]
            for x in range(w) for y in range(h)}
    bins[(2, 2)] += [[110.0, 64], [90.0, 64]]          # one deep, one shoal
    deep, _, _ = run_kernel(bins, w, h, deep_only=True, **PARAMS)
    both, _, _ = run_kernel(bins, w, h, deep_only=False, **PARAMS)
    assert deep == {(2, 2, 4)}
    assert both == {(2, 2, 4), (2, 2, 5)}


def test_never_restores_and_skips_invalid_and_deleted():
    w, h = 4, 4
    bins = {(x, y): [[100.0, 64], [100.2, 64], [99.8, 64], [100.1, 64]]
            for x in range(w) for y in range(h)}
    bins[(1, 1)] += [[130.0, 64 | V.MANUALLY_INVAL], [130.0, 64 | V.DELETED], [130.0, 64]]
    cuts, summary, _ = run_kernel(bins, w, h, **PARAMS)
    assert cuts == {(1, 1, 6)}
    # Examined: every sounding of the 12 non-corner bins; bad = the two skipped + the cut.
    assert (summary.total, summary.good, summary.bad) == (11 * 4 + 7, 11 * 4 + 4, 3)


class _Tracked(np.ndarray):
    """An ndarray subclass so the test can hold weak references to row arrays."""


def test_rows_read_once_in_order_and_at_most_three_held():
    w, h = 6, 9
    bins = make_grid(11, width=w, height=h)
    rows = to_rows(bins, w, h)
    calls = []
    refs = {}

    def read_row(y):
        gc.collect()
        alive = [r for r, ref in refs.items() if ref() is not None]
        # When row y is read, only rows y-2 and y-1 may still be referenced by the filter.
        assert all(r >= y - 2 for r in alive), (y, alive)
        calls.append(y)
        col, z, v, addr = rows[y]
        zt = z.view(_Tracked)
        refs[y] = weakref.ref(zt)
        return RowSoundings(col, zt, v, address=addr)

    filt = AreaFilter(w, h, **PARAMS)
    written = []
    for res in filt.iter_rows(read_row):
        written.append(res.row)
        assert calls[-1] == min(res.row + 1, h - 1)
    assert calls == list(range(h))
    assert written == list(range(h))


def test_empty_rows_and_none():
    filt = AreaFilter(3, 3, **PARAMS)
    out = list(filt.iter_rows(lambda y: None))
    assert [r.row for r in out] == [0, 1, 2]
    assert all(r.index.size == 0 for r in out)


def test_bad_parameters():
    with pytest.raises(ConfigError):
        AreaFilter(3, 3, bin_size_xy=2.0, cellstd=0.0)
    with pytest.raises(ConfigError):
        AreaFilter(3, 3, bin_size_xy=0.0)
    with pytest.raises(ConfigError):
        AreaFilter(0, 3, bin_size_xy=2.0)
    filt = AreaFilter(3, 2, bin_size_xy=2.0)
    with pytest.raises(ValueError):
        list(filt.iter_rows(lambda y: RowSoundings(np.array([5]), np.array([1.0]),
                                                   np.array([0], np.uint32))))
