"""compute_bin_stats against a slow per-bin port of the library's recompute loop.

The reference below walks one bin at a time, one sounding at a time, with
Python floats (C double) for depths and sums and ``np.float32`` for every
field the library keeps in a C ``float``; it follows ``recompute_bin_values``
(pfm_io.c, V7.00) statement by statement, so it shares no code or shortcut
with the vectorised implementation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pfm_dask.pfm import validity as V
from pfm_dask.pfm._recompute import PRIOR_KEEP, compute_bin_stats

# Library constants, typed in from pfm.h (not taken from our module).
PFM_USER = 7672256
USER_K = [64, 128, 256, 4096, 65536, 262144, 524288, 1048576, 2097152, 4194304]
VAL_MASK = (1 << 23) - 1


def ref_recompute_one(zs, vs, *, null_depth, class_type=0, prior=0, mask=0, prior_std=0.0):
    """One bin, exactly as the C loop does it (chain order = list order)."""
    null = np.float32(null_depth)
    val = prior & mask
    validity = prior & (65535 ^ (8 | 20 | PFM_USER | 16384 | 3))
    validity |= val
    min_f, min_d = np.float32(999999), np.float32(999999)
    max_f, max_d = np.float32(-999999), np.float32(-999999)
    sum_valid = 0.0
    sum2_valid = 0.0
    sum_depth = 0.0
    valid_count = 0
    non_count = 0
    std = np.float32(prior_std)
    for z, v in zip(zs, vs):
        z = float(z)
        if v & 16384:
            validity |= 16384
        if not (v & (2048 | 16384)) and z < float(null):
            if not (v & 3):
                if class_type == 0 or (v & USER_K[class_type - 1]):
                    if z < float(min_f):
                        min_f = np.float32(z)
                    if z > float(max_f):
                        max_f = np.float32(z)
                    sum_valid += z
                    sum2_valid += z * z
                    valid_count += 1
            if z < float(min_d):
                min_d = np.float32(z)
            if z > float(max_d):
                max_d = np.float32(z)
            sum_depth += z
            non_count += 1
            validity |= v & (VAL_MASK ^ mask)
    if not valid_count:
        min_f = max_f = avg_f = null
        validity &= ~1024
    else:
        std = np.float32(0.0)
        temp = sum_valid / valid_count
        avg_f = np.float32(temp)
        if valid_count > 1:
            variance = (sum2_valid - valid_count * (temp * temp)) / (valid_count - 1.0)
            std = np.float32(math.sqrt(variance)) if variance >= 0 else np.float32(0.0)
        validity |= 1024
    if not non_count:
        min_d = max_d = avg_d = null
    else:
        avg_d = np.float32(sum_depth / non_count)
    return {"num_soundings": len(zs), "num_valid": valid_count, "std": std,
            "avg_filtered": avg_f, "min_filtered": min_f, "max_filtered": max_f,
            "avg": avg_d, "min": min_d, "max": max_d, "validity": validity}


def ref_nint(x: float) -> int:
    """The C NINT macro: add or subtract a double 0.5, then truncate."""
    return int(x - 0.5) if x < 0.0 else int(x + 0.5)


def ref_depth_code(value, offset, scale) -> int:
    """Bin-record depth coding: (float + float) * float, NINT in double."""
    return ref_nint(float((np.float32(value) + np.float32(offset)) * np.float32(scale)))


FIELDS = ("num_soundings", "num_valid", "std", "avg_filtered", "min_filtered",
          "max_filtered", "avg", "min", "max", "validity")


def check_against_reference(bins, depth, validity, **kw):
    prior_map = kw.pop("prior_map", {})
    std_map = kw.pop("std_map", {})
    uniq = np.unique(bins)
    prior = np.array([prior_map.get(int(b), 0) for b in uniq], dtype=np.int64)
    pstd = np.array([std_map.get(int(b), 0.0) for b in uniq], dtype=np.float32)
    got = compute_bin_stats(bins, depth, validity, prior_validity=prior, prior_std=pstd, **kw)
    assert list(got["bin_index"]) == list(uniq)
    for i, b in enumerate(uniq):
        sel = np.flatnonzero(bins == b)
        want = ref_recompute_one([depth[j] for j in sel], [int(validity[j]) for j in sel],
                                 null_depth=kw["null_depth"], class_type=kw.get("class_type", 0),
                                 prior=prior_map.get(int(b), 0), mask=kw.get("keep_mask", 0),
                                 prior_std=std_map.get(int(b), 0.0))
        for f in FIELDS:
            g = got[f][i]
            w = want[f]
            if f in ("num_soundings", "num_valid", "validity"):
                assert int(g) == int(w), (f, b, g, w)
            else:
                assert np.float32(g).tobytes() == np.float32(w).tobytes(), (f, b, g, w)
    return got


# --- hand-worked cases -------------------------------------------------------------

NULL = 12001.0


def test_hand_worked_bin():
    # Bin 7: three valid depths 10, 11, 13; one filter-invalid 50; one deleted 99;
    # one reference 5; one null depth.
    z = np.array([10.0, 11.0, 50.0, 13.0, 99.0, 5.0, NULL])
    v = np.array([V.USER_01, 0, V.FILTER_INVAL, V.SUSPECT, V.DELETED, V.REFERENCE,
                  V.FILTER_INVAL | V.MODIFIED])
    got = compute_bin_stats(np.full(7, 7), z, v, null_depth=NULL)
    assert got["num_soundings"][0] == 7
    assert got["num_valid"][0] == 3
    assert got["min_filtered"][0] == 10 and got["max_filtered"][0] == 13
    assert got["avg_filtered"][0] == np.float32(34 / 3)
    # sample std of 10, 11, 13 = sqrt(7/3)
    assert got["std"][0] == np.float32(math.sqrt(7 / 3))
    assert got["min"][0] == 10 and got["max"][0] == 50
    assert got["avg"][0] == np.float32(84 / 4)
    # USER_01, SUSPECT, FILTER_INVAL from counted soundings; REFERENCE from the reference
    # one; DATA; not DELETED and not MODIFIED (those soundings are skipped, prior is 0).
    assert got["validity"][0] == V.USER_01 | V.SUSPECT | V.FILTER_INVAL | V.REFERENCE | V.DATA


def test_all_invalid_bin_keeps_prior_std_and_gets_null():
    z = np.array([100.0, 101.0])
    v = np.array([V.MANUALLY_INVAL, V.FILTER_INVAL])
    got = compute_bin_stats([3, 3], z, v, null_depth=NULL, prior_std=np.float32(0.25),
                            prior_validity=V.DATA | V.CHECKED)
    assert got["num_valid"][0] == 0
    assert got["min_filtered"][0] == np.float32(NULL) == got["avg_filtered"][0]
    assert got["std"][0] == np.float32(0.25)
    assert got["min"][0] == 100 and got["max"][0] == 101
    assert got["validity"][0] == V.CHECKED | V.INVAL  # DATA cleared, CHECKED kept


def test_only_skipped_soundings():
    z = np.array([5.0, NULL, 7.0])
    v = np.array([V.REFERENCE, 0, V.DELETED])
    got = compute_bin_stats([1, 1, 1], z, v, null_depth=NULL)
    assert got["num_soundings"][0] == 3 and got["num_valid"][0] == 0
    for f in ("avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max"):
        assert got[f][0] == np.float32(NULL)
    assert got["validity"][0] == V.REFERENCE


def test_prior_mask_is_the_librarys_not_bits_below_2_16():
    # The library's mask keeps USER_05/06/08/09/10 from the prior word (its PFM_USER has
    # those bits, so the XOR with 65535 sets them) and clears USER_07 and DESIGNATED.
    assert PRIOR_KEEP == 7712288
    prior = V.USER_05 | V.USER_06 | V.USER_07 | V.DESIGNATED_SOUNDING | V.USER_10 | V.SUSPECT | V.VERIFIED
    got = compute_bin_stats([0], [1.0], [0], null_depth=NULL, prior_validity=prior)
    assert got["validity"][0] == V.USER_05 | V.USER_06 | V.USER_10 | V.VERIFIED | V.DATA


def test_keep_mask_takes_bits_from_prior_not_soundings():
    got = compute_bin_stats([0, 0], [1.0, 2.0], [V.SUSPECT, V.MODIFIED], null_depth=NULL,
                            prior_validity=V.SELECTED_FEATURE, keep_mask=V.SUSPECT | V.SELECTED_FEATURE)
    assert got["validity"][0] == V.SELECTED_FEATURE | V.MODIFIED | V.DATA


def test_class_type_restricts_filtered_set():
    z = np.array([1.0, 2.0, 30.0])
    v = np.array([V.USER_03, V.USER_03, 0])
    got = compute_bin_stats([0, 0, 0], z, v, null_depth=NULL, class_type=3)
    assert got["num_valid"][0] == 2 and got["max_filtered"][0] == 2 and got["max"][0] == 30


def test_sums_are_sequential_not_pairwise():
    # np.add.reduceat sums pairwise; the library sums left to right. With a large bin
    # of spread-out magnitudes the two differ in the last bits: we must match the loop.
    rng = np.random.default_rng(5)
    z = np.concatenate([rng.normal(4000, 50, 300), rng.normal(1e-3, 1e-4, 300)])
    rng.shuffle(z)
    bins = np.zeros(len(z), dtype=np.int64)
    check_against_reference(bins, z, np.zeros(len(z), np.int64), null_depth=NULL)
    seq = 0.0
    for x in z:
        seq += x
    assert np.add.reduceat(z, [0])[0] != seq  # the pairwise sum does differ here


def test_input_order_across_bins_is_free_but_kept_within():
    rng = np.random.default_rng(2)
    bins = rng.integers(0, 20, 500)
    z = np.round(rng.normal(1000, 5, 500), 2)
    v = rng.choice([0, V.FILTER_INVAL, V.USER_01, V.REFERENCE], 500)
    a = compute_bin_stats(bins, z, v, null_depth=NULL)
    # Moving whole bins around (keeping each bin's internal order) changes nothing.
    perm = np.argsort(-bins, kind="stable")
    b = compute_bin_stats(bins[perm], z[perm], v[perm], null_depth=NULL)
    for f in FIELDS:
        assert np.array_equal(a[f], b[f])
    check_against_reference(bins, z, v, null_depth=NULL)


def test_empty_input():
    got = compute_bin_stats(np.zeros(0, np.int64), np.zeros(0), np.zeros(0, np.int64),
                            null_depth=NULL)
    assert all(len(got[f]) == 0 for f in FIELDS)


def test_packed_codes_match_reference_coding():
    # Once coded like the library (float32 arithmetic, NINT), the fields equal the
    # reference's coded fields: a float32 equality already implies it, this shows the
    # coding used by the writer (pfm_dask._numeric) agrees with a hand-written NINT.
    from pfm_dask._numeric import scaled_code_f32
    rng = np.random.default_rng(9)
    bins = rng.integers(0, 50, 2000)
    z = np.round(rng.normal(2500, 30, 2000), 2)
    got = compute_bin_stats(bins, z, np.zeros(2000, np.int64), null_depth=NULL)
    for f in ("avg_filtered", "min_filtered", "avg", "std"):
        off, scale = (0.0, 1e6) if f == "std" else (10000.0, 100.0)
        codes = scaled_code_f32(got[f], off, scale)
        want = [ref_depth_code(x, off, scale) for x in got[f]]
        assert list(codes) == want


# --- property test -------------------------------------------------------------------

FLAG_POOL = [0, 0, 0, V.USER_01, V.USER_02, V.USER_05, V.USER_07, V.FILTER_INVAL,
             V.MANUALLY_INVAL, V.DELETED, V.REFERENCE, V.MODIFIED, V.SUSPECT,
             V.SELECTED_SOUNDING, V.DESIGNATED_SOUNDING, V.USER_10 | V.FILTER_INVAL,
             V.USER_03 | V.USER_01, V.REFERENCE | V.USER_06, V.CHECKED | V.DATA]


@st.composite
def soundings(draw):
    n_bins = draw(st.integers(1, 6))
    bin_ids = draw(st.lists(st.integers(0, 10_000), min_size=n_bins, max_size=n_bins, unique=True))
    bins, depth, val = [], [], []
    for b in bin_ids:
        k = draw(st.integers(1, 14))
        for _ in range(k):
            bins.append(b)
            kind = draw(st.integers(0, 9))
            if kind == 0:
                depth.append(NULL)  # null depth
            elif kind == 1:
                depth.append(NULL + 0.5)  # above null: also skipped
            else:
                # decoded depths look like code/scale - offset
                code = draw(st.integers(0, 2_200_000))
                depth.append(code / np.float64(np.float32(100.0)) - np.float64(np.float32(10000.0)))
            val.append(draw(st.sampled_from(FLAG_POOL)) | draw(st.sampled_from(FLAG_POOL)))
    perm = draw(st.permutations(range(len(bins))))
    # interleave bins but keep each bin's own order (stable on bin rank)
    order = sorted(range(len(bins)), key=lambda i: perm[i])
    by_bin: dict[int, list[int]] = {}
    for i in range(len(bins)):
        by_bin.setdefault(bins[i], []).append(i)
    queues = {b: list(ix) for b, ix in by_bin.items()}
    seq = [queues[bins[i]].pop(0) for i in order]
    prior_map = {b: draw(st.integers(0, VAL_MASK)) for b in bin_ids}
    std_map = {b: draw(st.sampled_from([0.0, 0.5, 3.25])) for b in bin_ids}
    return (np.array([bins[i] for i in seq], dtype=np.int64),
            np.array([depth[i] for i in seq], dtype=np.float64),
            np.array([val[i] for i in seq], dtype=np.int64), prior_map, std_map)


@settings(max_examples=60, deadline=None)
@given(data=soundings(), class_type=st.sampled_from([0, 0, 1, 3, 5, 10]),
       keep_mask=st.sampled_from([0, 0, V.CHECKED, V.MODIFIED | V.CHECKED, V.SUSPECT, V.DATA]))
def test_matches_reference_loop(data, class_type, keep_mask):
    bins, depth, val, prior_map, std_map = data
    check_against_reference(bins, depth, val, null_depth=NULL, class_type=class_type,
                            keep_mask=keep_mask, prior_map=prior_map, std_map=std_map)


def test_bad_arguments():
    with pytest.raises(ValueError):
        compute_bin_stats([1, 2], [1.0], [0, 0], null_depth=NULL)
    with pytest.raises(ValueError):
        compute_bin_stats([1, 2], [1.0, 2.0], [0, 0], null_depth=NULL, prior_validity=[1, 2, 3])


# --- recompute() on a PFM written by the store ---------------------------------------
#
# The inputs are generated here and kept; the expected bin records are computed from
# them with the reference loop above and the hand-written codings, never read back.

import os  # noqa: E402
import shutil  # noqa: E402

from pfm_dask import pfm as P  # noqa: E402
from pfm_dask.bins import BinGrid  # noqa: E402
from pfm_dask.pfm import recompute  # noqa: E402

MIN_DEPTH, MAX_DEPTH = -10.0, 1000.0
F_OFF, F_SCALE = np.float32(-MIN_DEPTH), np.float32(100.0)
F_NULL = float(np.float32(MAX_DEPTH + 1.0))


def decoded_depth(z) -> float:
    """Depth as stored and read back by the library: code from double, decode in double."""
    code = ref_nint((float(z) + float(F_OFF)) * float(F_SCALE))
    return code / float(F_SCALE) - float(F_OFF)


def make_soundings(seed: int, grid: BinGrid, n: int, *, heavy_bin=None, heavy=0, lat_fraction=1.0):
    """Random soundings inside the grid; ``heavy`` extra ones in bin ``heavy_bin`` (col, row).

    ``lat_fraction`` < 1 keeps the northern part of the area empty.
    """
    rng = np.random.default_rng(seed)
    poly = np.asarray(grid.polygon)  # a rectangle: stay strictly inside it
    south, north = poly[:, 0].min(), poly[:, 0].max()
    lat = rng.uniform(south + 1e-9, south + (north - south) * lat_fraction - 1e-9, n)
    lon = rng.uniform(poly[:, 1].min() + 1e-9, poly[:, 1].max() - 1e-9, n)
    if heavy:
        c, r = heavy_bin
        lat = np.r_[lat, grid.min_y + (r + rng.uniform(0.1, 0.9, heavy)) * grid.y_bin]
        lon = np.r_[lon, grid.min_x + (c + rng.uniform(0.1, 0.9, heavy)) * grid.x_bin]
    m = lat.size
    depth = np.round(rng.normal(120.0, 4.0, m), 3)
    depth[rng.random(m) < 0.03] = F_NULL  # null depths, as pfmLoader stores out-of-range ones
    flags = np.array([0, 0, 0, 0, V.USER_01, V.FILTER_INVAL | V.MODIFIED, V.MANUALLY_INVAL,
                      V.REFERENCE, V.DELETED, V.SUSPECT | V.USER_01, V.USER_05, V.USER_07,
                      V.SELECTED_SOUNDING])
    val = rng.choice(flags, m)
    return {"lat": lat, "lon": lon, "depth": depth, "validity": val,
            "file": rng.integers(0, 3, m), "line": rng.integers(0, 4, m),
            "ping": rng.integers(1, 5000, m), "beam": rng.integers(1, 400, m),
            "herr": np.round(rng.uniform(0.5, 3.0, m), 2), "verr": np.round(rng.uniform(0.1, 1.0, m), 2)}


def build_pfm(tmp_path, *, seed=0, n=400, batches=2, heavy_bin=(2, 1), heavy=20, do_recompute=True,
              name="t.pfm", lat_fraction=1.0):
    """A small PFM written in ``batches`` add_sorted calls; returns (path, grid, inputs).

    ``inputs`` holds every sounding in chain order (bins ascending; within a bin, the
    order of the add calls then input order) with its bin (col, row).
    """
    grid = BinGrid.from_mbr(30.0, -80.0, 30.0006, -79.9993, bin_size_m=10.0)
    path = os.fspath(tmp_path / name)
    f = P.create(path, grid, min_depth=MIN_DEPTH, max_depth=MAX_DEPTH)
    f.add_files(["a.gsf", "b.gsf", "c.gsf"])
    f.add_lines(["a-1", "b-1", "b-2", "c-1"])
    snd = make_soundings(seed, grid, n, heavy_bin=heavy_bin, heavy=heavy, lat_fraction=lat_fraction)
    asg = grid.assign(snd["lat"], snd["lon"])
    assert asg.inside.all()
    m = snd["lat"].size
    batch = np.arange(m) % batches
    chain_rank = []
    for k in range(batches):
        sel = np.flatnonzero(batch == k)
        order = sel[np.argsort(asg.bin_index[sel], kind="stable")]
        f.add_sorted(asg.bin_index[order], snd["file"][order], snd["line"][order],
                     snd["ping"][order], snd["beam"][order], snd["depth"][order],
                     asg.x_off[order], asg.y_off[order], snd["validity"][order],
                     snd["herr"][order], snd["verr"][order])
        chain_rank.append(order)
    # chain order: by bin, then batch, then position within the batch
    allorder = np.concatenate(chain_rank)
    final = allorder[np.argsort(asg.bin_index[allorder], kind="stable")]
    inputs = {k: v[final] for k, v in snd.items()}
    inputs["bin_index"] = asg.bin_index[final]
    inputs["col"] = asg.col[final].astype(np.int64)
    inputs["row"] = asg.row[final].astype(np.int64)
    inputs["x_off"] = asg.x_off[final]
    inputs["y_off"] = asg.y_off[final]
    if do_recompute:
        ext = recompute(f)
        f.write_header(**ext)
    f.close()
    return path, grid, inputs


def expected_bins(inputs, *, class_type=0):
    """Reference bin records (library coding) from the known inputs."""
    out = {}
    for b in np.unique(inputs["bin_index"]):
        sel = np.flatnonzero(inputs["bin_index"] == b)
        vs = [int(x) for x in inputs["validity"][sel]]
        prior = 0
        for x in vs:
            prior |= x
        prior &= ~V.CHECKED  # the cached add: OR of the soundings' flags, CHECKED cleared
        r = ref_recompute_one([decoded_depth(z) for z in inputs["depth"][sel]], vs,
                              null_depth=F_NULL, class_type=class_type, prior=prior)
        out[int(b)] = r
    return out


def test_recompute_file_matches_reference(tmp_path):
    path, grid, inputs = build_pfm(tmp_path, seed=3)
    want = expected_bins(inputs)
    with P.open_pfm(path) as f:
        got = f.read_bin_records(0, f.height, codes=True)
        cov = f.read_coverage(got["bin_index"])
    seen = 0
    for i, b in enumerate(got["bin_index"]):
        w = want.get(int(b))
        if w is None:
            assert got["num_soundings"][i] == 0 and got["validity"][i] == 0 and cov[i] == 0
            continue
        seen += 1
        assert got["num_soundings"][i] == w["num_soundings"]
        assert got["num_valid"][i] == w["num_valid"]
        assert got["validity"][i] == w["validity"], (b, hex(got["validity"][i]), hex(w["validity"]))
        for fld in ("avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max"):
            assert got[fld + "_code"][i] == ref_depth_code(w[fld], F_OFF, F_SCALE), (b, fld)
        assert got["std_code"][i] == ref_nint(float(np.float32(w["std"]) * np.float32(1e6)))
        data = bool(w["validity"] & V.DATA)
        assert bool(cov[i] & V.COV_DATA) == data
        assert bool(cov[i] & V.COV_SURVEYED) == data
    assert seen == len(want)


def reference_extrema(want: dict, width: int):
    """pfmLoader's loop: raster order, strict comparisons, from its starting values."""
    e = {"min_filtered_depth": 9999999.0, "max_filtered_depth": -9999999.0,
         "min_filtered_coord": (0, 0), "max_filtered_coord": (0, 0), "min_depth": 9999999.0,
         "max_depth": -9999999.0, "min_coord": (0, 0), "max_coord": (0, 0),
         "min_bin_count": 9999999, "max_bin_count": 0, "min_count_coord": (0, 0),
         "max_count_coord": (0, 0), "min_standard_deviation": 9999999.0,
         "max_standard_deviation": -9999999.0}
    for b in sorted(want):
        r = want[b]
        c = (b % width, b // width)
        if r["num_soundings"] < e["min_bin_count"]:
            e["min_bin_count"], e["min_count_coord"] = r["num_soundings"], c
        if r["num_soundings"] > e["max_bin_count"]:
            e["max_bin_count"], e["max_count_coord"] = r["num_soundings"], c
        if float(r["max"]) < F_NULL:
            if r["validity"] & V.DATA:
                if r["min_filtered"] < e["min_filtered_depth"]:
                    e["min_filtered_depth"], e["min_filtered_coord"] = float(r["min_filtered"]), c
                if r["max_filtered"] > e["max_filtered_depth"]:
                    e["max_filtered_depth"], e["max_filtered_coord"] = float(r["max_filtered"]), c
                e["min_standard_deviation"] = min(e["min_standard_deviation"], float(r["std"]))
                e["max_standard_deviation"] = max(e["max_standard_deviation"], float(r["std"]))
            if r["min"] < e["min_depth"]:
                e["min_depth"], e["min_coord"] = float(r["min"]), c
            if r["max"] > e["max_depth"]:
                e["max_depth"], e["max_coord"] = float(r["max"]), c
    return e


def test_recompute_returns_pfmloader_extrema(tmp_path):
    grid = BinGrid.from_mbr(30.0, -80.0, 30.0006, -79.9993, bin_size_m=10.0)
    path, grid, inputs = build_pfm(tmp_path, seed=4, do_recompute=False)
    with P.open_pfm(path, "r+") as f:
        ext = recompute(f)
    assert ext == reference_extrema(expected_bins(inputs), grid.width)


def test_band_sizes_do_not_change_the_bytes(tmp_path):
    a, _, _ = build_pfm(tmp_path, seed=5, do_recompute=False, name="a.pfm")
    b = os.fspath(tmp_path / "b.pfm")
    shutil.copy(a, b)
    shutil.copytree(a + ".data", b + ".data")
    for p in (b + ".data/a.pfm." + e for e in ("ctl", "lin", "bin", "ndx", "cvg")):
        os.rename(p, p.replace("a.pfm.", "b.pfm."))
    with P.open_pfm(a, "r+") as f:
        ea = recompute(f)
    with P.open_pfm(b, "r+") as f:
        eb = recompute(f, band_soundings=7)  # tiny bands: heavy rows are cut into columns
    assert ea == eb
    for e in ("bin", "cvg"):
        with open(f"{a}.data/a.pfm.{e}", "rb") as x, open(f"{b}.data/b.pfm.{e}", "rb") as y:
            assert x.read() == y.read()


def test_recompute_subset_and_rows(tmp_path):
    path, grid, inputs = build_pfm(tmp_path, seed=6, do_recompute=False)
    want = expected_bins(inputs)
    chosen = sorted(want)[::3]
    with P.open_pfm(path, "r+") as f:
        recompute(f, chosen, rows=1)
        got = f.read_bin_records(0, f.height, codes=True)
    for i, b in enumerate(got["bin_index"]):
        b = int(b)
        if b in chosen:
            assert got["num_valid"][i] == want[b]["num_valid"]
            assert got["min_code"][i] == ref_depth_code(want[b]["min"], F_OFF, F_SCALE)
        elif b in want:  # not recomputed: the loader's zero statistics are still there
            assert got["num_valid"][i] == 0 and got["std_code"][i] == 0


def test_clear_mask_and_prior_flags(tmp_path):
    path, grid, inputs = build_pfm(tmp_path, seed=7)
    with P.open_pfm(path, "r+") as f:
        b = f.read_bin_records(0, f.height)
        has = np.flatnonzero(b["num_soundings"] > 0)
        bins = b["bin_index"][has]
        f.write_bin_records(bins, validity=b["validity"][has] | V.VERIFIED | V.CHECKED)
        recompute(f)  # CHECKED and VERIFIED are kept from the prior record (library mask)
        again = f.read_bin_records(0, f.height)
        assert np.all(again["validity"][has] & (V.VERIFIED | V.CHECKED) == (V.VERIFIED | V.CHECKED))
        assert np.all(f.read_coverage(bins) & V.COV_VERIFIED)
        recompute(f, clear_mask=V.VERIFIED | V.CHECKED)  # what an append does, coverage follows
        last = f.read_bin_records(0, f.height)
        assert not np.any(last["validity"][has] & (V.VERIFIED | V.CHECKED))
        assert not np.any(f.read_coverage(bins) & (V.COV_VERIFIED | V.COV_CHECKED))
