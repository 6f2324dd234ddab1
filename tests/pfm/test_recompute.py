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
