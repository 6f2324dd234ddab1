"""Appending: repeated add_sorted into the same bins (tail filling), reopen and append."""

import os
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pfm_dask.errors import PfmFormatError
from pfm_dask.pfm import validity as V
from pfm_dask.pfm._store import create, open_pfm

from .test_store import RefPfm, as_rows, make_soundings, small_grid


def concat(*ds):
    """Soundings of several batches, merged and stably sorted by bin (= chain order)."""
    out = {k: np.concatenate([np.asarray(d[k]) for d in ds]) for k in ds[0]}
    order = np.argsort(out["bin_index"], kind="stable")
    return {k: v[order] for k, v in out.items()}


def by_bin(s):
    res = {}
    for row in as_rows(s):
        res.setdefault(row[0], []).append(row)
    return res


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.lists(st.integers(0, 9), min_size=12, max_size=12), min_size=2, max_size=4),
       st.integers(0, 2**32 - 1))
def test_repeated_adds_fill_tails(tmp_path_factory, batches, seed):
    g = small_grid(4, 3)
    rng = np.random.default_rng(seed)
    path = str(tmp_path_factory.mktemp("ap") / "a.pfm")
    done = []
    with create(path, g) as f:
        for counts in batches:
            d = make_soundings(rng, np.arange(12), counts)
            f.add_sorted(**d)
            done.append(d)
            s = f.read_soundings(0, g.height)
            # every batch so far, in chain order: old soundings first, then the new ones
            assert as_rows(s) == as_rows(concat(*done))
    ref = RefPfm(path)
    per_bin = ref.check_chains()
    total = concat(*done)
    assert sum(len(v) for v in per_bin.values()) == total["bin_index"].size
    # no wasted records: a bin with c soundings uses at most ceil(c/6) + (adds - 1) records
    nrec = len(ref.ndx) // ref.rec_size
    assert nrec <= sum(-(-c // 6) for c in np.bincount(total["bin_index"])) + len(batches) * 12


def test_tail_filling_layout(tmp_path):
    """4 soundings, then 3 more: slots 4-5 of the old tail are filled, the 7th starts a new record."""
    g = small_grid()
    rng = np.random.default_rng(2)
    path = str(tmp_path / "t.pfm")
    with create(path, g) as f:
        a = make_soundings(rng, [5], [4])
        f.add_sorted(**a)
        assert f.ndx_size == f.ndx_record_size
        b = make_soundings(rng, [5], [3])
        f.add_sorted(**b)
        assert f.ndx_size == 2 * f.ndx_record_size
        s = f.read_soundings(0, 1)
        assert s["record_offset"].tolist() == [0] * 6 + [f.ndx_record_size]
        assert s["slot"].tolist() == [0, 1, 2, 3, 4, 5, 0]
        rec = f.read_bin_records(0, 1)
        assert rec["head"][5] == 0 and rec["tail"][5] == f.ndx_record_size
        # exactly full (6): the next add only links the full tail to a new record
        c = make_soundings(rng, [6], [6])
        f.add_sorted(**c)
        d = make_soundings(rng, [6], [1])
        f.add_sorted(**d)
        s = f.read_soundings(0, 1, 6, 7)
        assert s["slot"].tolist() == [0, 1, 2, 3, 4, 5, 0]
        assert len(set(s["record_offset"].tolist())) == 2
    RefPfm(path).check_chains()


def test_append_after_reopen_keeps_old_content(tmp_path):
    g = small_grid(9, 6)
    rng = np.random.default_rng(11)
    nb = g.width * g.height
    path = str(tmp_path / "r.pfm")
    first = make_soundings(rng, np.arange(nb), rng.integers(0, 14, nb))
    with create(path, g) as f:
        f.add_files(["a.gsf"])
        f.add_lines(["a-1"])
        f.add_sorted(**first)
        # recomputed-looking statistics and flags on some bins must survive the append
        f.write_bin_records([0, 1, 2], num_valid=[1, 2, 3], std=[0.5, 0.25, 0.0], avg=[1.0, 2.0, 3.0],
                            validity=[V.DATA | V.CHECKED | V.VERIFIED, V.DATA, 0])
    with open_pfm(path) as f:
        before = f.read_soundings(0, g.height)
        bins_before = f.read_bin_records(0, g.height)
    # second load into half of the bins
    touched = np.sort(rng.choice(nb, nb // 2, replace=False))
    second = make_soundings(rng, touched, rng.integers(1, 10, touched.size))
    with open_pfm(path, "r+") as f:
        assert f.add_files(["b.gsf"]) == [1]
        assert f.add_lines(["b-1", "b-2"]) == [1, 2]
        f.add_sorted(**second)
        after = f.read_soundings(0, g.height)
        bins_after = f.read_bin_records(0, g.height)
    old = by_bin(before)
    new = by_bin(after)
    add = by_bin(second)
    for b in range(nb):
        assert new.get(b, [])[: len(old.get(b, []))] == old.get(b, [])        # old content unchanged
        assert new.get(b, [])[len(old.get(b, [])):] == add.get(b, [])        # then the new soundings
    assert Counter(as_rows(after)) == Counter(as_rows(before)) + Counter(as_rows(second))
    # untouched bins: identical records; touched bins keep statistics, count grows, CHECKED cleared
    untouched = np.setdiff1d(np.arange(nb), touched)
    for k in ("num_soundings", "num_valid", "std", "avg", "validity", "head", "tail"):
        assert np.array_equal(bins_after[k][untouched], bins_before[k][untouched])
    for k in ("num_valid", "std", "avg"):
        assert np.array_equal(bins_after[k][touched], bins_before[k][touched])
    cnt2 = np.bincount(second["bin_index"], minlength=nb)
    assert np.array_equal(bins_after["num_soundings"], bins_before["num_soundings"] + cnt2)
    assert not (bins_after["validity"][touched] & V.CHECKED).any()
    keep_head = touched[bins_before["num_soundings"][touched] > 0]
    assert np.array_equal(bins_after["head"][keep_head], bins_before["head"][keep_head])
    RefPfm(path).check_chains()


@pytest.mark.parametrize("where", ["old tail", "new record", "old tail only"])
@pytest.mark.parametrize("field,value", [("ping", -1), ("beam", 1 << 20), ("depth", 1.0e9),
                                         ("depth", float("nan")), ("validity", 1 << 40)])
def test_a_bad_value_changes_nothing(tmp_path, field, value, where):
    """A value out of range anywhere in a call (in the last bin: a sounding that fills a free
    slot of its old tail record, or one that goes to a new record) raises and leaves every
    file byte as it was; the next good call then appends as if the bad one had not been made."""
    g = small_grid(9, 6)
    rng = np.random.default_rng(4)
    nb = g.width * g.height
    path = str(tmp_path / "s.pfm")
    data = os.path.join(path + ".data", "s.pfm")
    with create(path, g) as f:
        counts = rng.integers(1, 30, nb)
        counts[nb - 1 - (nb - 1) % 3] = 7          # the last bin written below: 5 free slots
        first = make_soundings(rng, np.arange(nb), counts)
        f.add_sorted(**first)
        f.flush()
        before = {p: open(data + p, "rb").read() for p in (".ndx", ".bin")}
        last = nb - 1 - (nb - 1) % 3
        if where == "old tail only":       # no new record at all: the tail's free slots take all
            bad = make_soundings(rng, [last], [3])
        else:
            bad = make_soundings(rng, np.arange(0, nb, 3), np.full(len(range(0, nb, 3)), 9))
        if field == "depth":
            bad[field] = bad[field].astype(np.float64)
        else:
            bad[field] = bad[field].astype(np.int64)
        bad[field][{"old tail": -9, "new record": -1, "old tail only": 0}[where]] = value
        with pytest.raises(PfmFormatError, match=field):
            f.add_sorted(**bad)
        f.flush()
        assert {p: open(data + p, "rb").read() for p in (".ndx", ".bin")} == before
        good = make_soundings(rng, np.arange(0, nb, 3), np.full(len(range(0, nb, 3)), 5))
        f.add_sorted(**good)
        s = f.read_soundings(0, g.height)
    assert len(s["bin_index"]) == len(first["bin_index"]) + len(good["bin_index"])
    RefPfm(path).check_chains()


def test_count_limit(tmp_path):
    g = small_grid()
    rng = np.random.default_rng(8)
    path = str(tmp_path / "c.pfm")
    with create(path, g, max_bin_soundings=10) as f:          # 4 count bits: at most 15 soundings
        assert f.header.count_bits == 4
        f.add_sorted(**make_soundings(rng, [2], [10]))
        with pytest.raises(PfmFormatError, match="COUNT BITS"):
            f.add_sorted(**make_soundings(rng, [2], [6]))
        f.add_sorted(**make_soundings(rng, [2], [5]))
        assert f.read_bin_records(0, 1)["num_soundings"][2] == 15
    RefPfm(path).check_chains()


def test_sparse_adds_keep_neighbour_bins(tmp_path):
    """Bins written earlier between the bins of a later add must not be touched by it."""
    g = small_grid(9, 6)
    rng = np.random.default_rng(21)
    path = str(tmp_path / "n.pfm")
    with create(path, g) as f:
        f.add_sorted(**make_soundings(rng, [3, 5, 20], [2, 7, 1]))
        f.write_bin_records([4], validity=[V.DATA | V.CHECKED], avg=[12.5])   # a bin with no soundings
        before = f.read_bin_records(0, g.height)
        f.add_sorted(**make_soundings(rng, [2, 6, 8, 21], [1, 1, 13, 2]))
        after = f.read_bin_records(0, g.height)
    for b in (3, 4, 5, 20):
        for k in ("num_soundings", "validity", "avg", "head", "tail"):
            assert after[k][b] == before[k][b]
    assert after["num_soundings"][[2, 6, 8, 21]].tolist() == [1, 1, 13, 2]
    RefPfm(path).check_chains()
