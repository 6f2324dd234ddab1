"""The final step's memory is bounded by its band budgets, not by the size of the PFM.

The recompute and the check work in bands of a soundings budget; the check drops the
``.ndx`` pages each band read and keeps its visited map (one bit per ``.ndx`` record) in
a temporary file when it is large. These tests force many bands, a file-backed visited
map and page dropping, and compare with the hand-computed references of
``test_recompute`` and with the problems the damage must produce.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from pfm_dask import pfm as P
from pfm_dask.pfm import _check, _check_parts, _check_walk, _problems

from .test_check import BinFile, copy_pfm, has_problem, ndx_record, part
from .test_final_step_speed import damage
from .test_recompute import (F_OFF, F_SCALE, build_pfm, expected_bins, ref_depth_code,
                             reference_extrema)


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    d = tmp_path_factory.mktemp("bounded")
    path, _, _ = build_pfm(d, seed=71, n=1500, batches=3, heavy=45)
    return path


# --- recompute: a tiny budget against the reference -------------------------------------------

@pytest.mark.parametrize("budget,threads", [(1, 1), (1, 3), (6, 2)])
def test_tiny_recompute_bands_match_the_reference(tmp_path, budget, threads):
    """Bands of a bin (or a few soundings) each: records and extrema as computed by hand."""
    path, grid, inputs = build_pfm(tmp_path, seed=72, n=900, batches=3, heavy=40,
                                   do_recompute=False)
    want = expected_bins(inputs)
    with P.open_pfm(path, "r+") as f:
        ext = P.recompute(f, band_soundings=budget, threads=threads)
        got = f.read_bin_records(0, f.height, codes=True)
    assert ext == reference_extrema(want, grid.width)
    seen = 0
    for i, b in enumerate(got["bin_index"]):
        w = want.get(int(b))
        if w is None:
            assert got["num_soundings"][i] == 0
            continue
        seen += 1
        assert got["num_valid"][i] == w["num_valid"]
        assert got["validity"][i] == w["validity"]
        for fld in ("avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max"):
            assert got[fld + "_code"][i] == ref_depth_code(w[fld], F_OFF, F_SCALE), (b, fld)
    assert seen == len(want)


def test_default_recompute_budget_bounds_the_bands(sound):
    """No band of the default plan holds more soundings than the budget (bar a single heavy bin)."""
    from pfm_dask.pfm._recompute import BAND_SOUNDINGS, _plan_bands

    budget = 50
    with P.open_pfm(sound) as f:
        cnt = f.read_bin_records(0, f.height, fields=("num_soundings",))["num_soundings"]
        cnt = cnt.reshape(f.height, f.width).astype(np.int64)
        covered = np.zeros_like(cnt)
        for r0, r1, c0, c1 in _plan_bands(f, None, None, budget):
            n = int(cnt[r0:r1, c0:c1].sum())
            assert n <= budget or (r1 - r0 == 1 and c1 - c0 == 1), (r0, r1, c0, c1, n)
            covered[r0:r1, c0:c1] += 1
    assert (covered[cnt > 0] == 1).all()
    assert BAND_SOUNDINGS <= 1_000_000  # the default stays a memory bound, not a whole-file band


# --- check: band budget, file-backed visited map, dropped pages ------------------------------

@pytest.mark.parametrize("seed", range(4))
def test_check_band_budget_does_not_change_the_problems(sound, tmp_path, seed):
    """The same findings with one band as with bands of a bin each (listed band by band, so
    in another order: a band lists its chain problems step by step, then its data problems)."""
    p = copy_pfm(sound, tmp_path / "c")
    damage(p, seed)
    want = P.check(p, threads=1, band_soundings=10**9)   # one band
    assert want
    for budget, threads in ((1, 1), (1, 2), (7, 3), (40, 2)):
        got = P.check(p, threads=threads, band_soundings=budget)
        assert sorted(map(str, got)) == sorted(map(str, want)), (budget, threads)


@pytest.mark.parametrize("threads", [1, 2])
def test_visited_map_in_a_file_finds_shared_records_and_orphans(sound, tmp_path, monkeypatch,
                                                                threads):
    p = copy_pfm(sound, tmp_path / "c")
    bf = BinFile(p)
    L = bf.h.record_length
    a = bf.bins_with()
    (c1, r1), (c2, r2) = a[0], a[-1]          # far apart: in different bands
    own = -(-bf.get(c2, r2, "count") // L)    # records of (c2, r2)'s own chain
    for k in ("count", "head", "tail"):
        bf.set(c2, r2, k, bf.get(c1, r1, k))
    # bin (c2, r2)'s own records now belong to no chain; add two more orphans at the end
    with open(part(p, "ndx"), "ab") as fh:
        fh.write(bytes(2 * ndx_record(bf.h)[2]))
    in_memory = P.check(p, threads=threads, band_soundings=9)

    made = []
    orig = _check_walk._Bitmap.__init__

    def spy(self, n, directory=None):
        orig(self, n, directory)
        made.append(self.in_file)

    monkeypatch.setattr(_check_walk, "_BITMAP_IN_MEMORY", 0)
    monkeypatch.setattr(_check_walk._Bitmap, "__init__", spy)
    before = sorted(os.listdir(p + ".data"))
    in_file = P.check(p, threads=threads, band_soundings=9)
    assert made and all(made), "the visited map must have gone to a file"
    assert sorted(os.listdir(p + ".data")) == before, "the temporary file must not stay"
    assert in_file == in_memory
    assert has_problem(in_file, ".ndx", "shared", f"({c2}, {r2})")
    orphans = [x for x in in_file if "belong to no bin" in x.what]
    assert orphans and f"{own + 2} physical record(s)" in orphans[0].what


def test_visited_map_falls_back_to_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(_check_walk, "_BITMAP_IN_MEMORY", 0)
    bm = _check_walk._Bitmap(1000, os.fspath(tmp_path / "does-not-exist"))
    assert not bm.in_file
    bm.set(np.array([3, 999]))
    assert bm.test(np.array([3, 4, 999])).tolist() == [True, False, True]
    bm.drop_pages()
    bm.close()


@pytest.mark.parametrize("in_file", [False, True])
@pytest.mark.parametrize("n", [1, 8, 13, 4099, 70001])
def test_bitmap_against_a_boolean_array(tmp_path, monkeypatch, in_file, n):
    """set/test/unset (in chunks, pages dropped between them) against a plain bool array."""
    monkeypatch.setattr(_check_walk, "_BITMAP_IN_MEMORY", 0 if in_file else 1 << 40)
    rng = np.random.default_rng(n)
    ref = np.zeros(n, dtype=bool)
    bm = _check_walk._Bitmap(n, os.fspath(tmp_path))
    try:
        assert bm.in_file == in_file
        for _ in range(4):
            idx = rng.integers(0, n, size=max(1, n // 5))
            assert (bm.test(idx) == ref[idx]).all()
            bm.set(idx)
            ref[idx] = True
            bm.drop_pages()               # bits survive: they live in the file
        assert (bm.test(np.arange(n)) == ref).all()
        zero = np.flatnonzero(~ref)
        for chunk in (1, 3, 1 << 20):
            total, firsts = bm.unset(first=5, chunk=chunk)
            assert total == zero.size and firsts == zero[:5].tolist()
    finally:
        bm.close()


def _mapping_rss_kib(path: str) -> int:
    """Resident KiB of this process's mappings of ``path`` (from /proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            parts = line.split()
            if parts and "-" in parts[0] and ":" not in parts[0] and len(parts) >= 5:
                inside = len(parts) > 5 and parts[5] == path
            elif inside and parts[0] == "Rss:":
                total += int(parts[1])
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux /proc smaps")
def test_walker_drops_the_ndx_pages_it_read(sound):
    parts = _check_parts._parts(sound)
    ndx = os.path.realpath(parts[".ndx"])
    h = _check_parts._read_header(parts[".bin"])
    lay = _check_parts._Layout(h, True)
    raw = open(parts[".bin"], "rb").read()[h.bin_header_size:]
    recs = np.frombuffer(raw, np.uint8).reshape(-1, lay.bin_bytes)
    u = lay.bin.unpack(recs)
    w = _check_walk._Walker(parts[".ndx"], os.path.getsize(parts[".ndx"]), lay, h.bin_width,
                       _problems._Problems())
    try:
        bidx = np.arange(recs.shape[0])
        ok, reached = w.walk(bidx, u["count"].astype(np.int64), u["head"].astype(np.int64),
                             u["tail"].astype(np.int64))
        assert ok.all()
        first = w.soundings(reached)
        assert _mapping_rss_kib(ndx) > 0
        w.drop_pages()
        assert _mapping_rss_kib(ndx) == 0
        # the map still reads the same bytes after the drop
        again = w.soundings(reached)
        for k in first:
            assert np.array_equal(first[k], again[k])
    finally:
        w.close()
    assert _mapping_rss_kib(ndx) == 0


def test_check_drops_pages_after_every_band(sound, monkeypatch):
    bands, drops = [], []
    split = _check._split_by_soundings

    def count_bands(cnt, budget):
        for ab in split(cnt, budget):
            bands.append(ab)
            yield ab

    orig_drop = _check_walk._Walker.drop_pages

    def count_drops(self):
        drops.append(1)
        orig_drop(self)

    monkeypatch.setattr(_check, "_split_by_soundings", count_bands)
    monkeypatch.setattr(_check_walk._Walker, "drop_pages", count_drops)
    for threads in (1, 2):
        bands.clear()
        drops.clear()
        assert P.check(sound, threads=threads, band_soundings=25) == []
        assert len(bands) > 5 and len(drops) >= len(bands)
