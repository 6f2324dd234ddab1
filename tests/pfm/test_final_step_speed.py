"""The fast final step (recompute and check) gives exactly what the plain implementations give.

The sums, the chain walk and the band pipeline were rewritten for speed; the
implementations they replaced are kept here, verbatim in their logic, as
references: the running sums (``_old_sequential_group_sums``,
``_old_compute_bin_stats``) and the step-by-step chain walk that unpacked
whole records (``OldWalker``). The new code must agree with them bit for bit,
and the threaded recompute and check must agree with their one-thread runs
(same bytes on disk, same problems in the same order) on sound and damaged
PFMs. No timings are asserted.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pfm_dask import pfm as P
from pfm_dask.errors import PfmDaskError
from pfm_dask.pfm import _recompute, _check, _check_band, _check_parts, _check_walk, _problems
from pfm_dask.pfm import validity as V
from pfm_dask.pfm._recompute import (PRIOR_KEEP, _group_pass, compute_bin_stats,
                                     grouped_bin_stats)

from .test_check import (BinFile, get_continuation, header, ndx_record, part,
                         set_continuation)
from .test_recompute import build_pfm

FIELDS = ("num_soundings", "num_valid", "std", "avg_filtered", "min_filtered", "max_filtered",
          "avg", "min", "max", "validity")
NULL = 12001.0


# --- references: the implementations the fast code replaced ------------------------------

def _old_sequential_group_sums(values, start, counts):
    """The previous running sums: a loop over chain depth, gathering one member per group."""
    n_groups = len(start)
    out = np.zeros((n_groups,) + values.shape[1:], dtype=np.float64)
    if n_groups == 0:
        return out
    by_size = np.argsort(-counts, kind="stable")
    sizes = counts[by_size]
    starts = start[by_size]
    acc = np.zeros_like(out)
    neg = -sizes
    for j in range(int(sizes[0])):
        m = int(np.searchsorted(neg, -j, side="left"))
        if m == 0:
            break
        acc[:m] += values[starts[:m] + j]
    out[by_size] = acc
    return out


_USER = (V.USER_01, V.USER_02, V.USER_03, V.USER_04, V.USER_05,
         V.USER_06, V.USER_07, V.USER_08, V.USER_09, V.USER_10)


def _old_compute_bin_stats(bin_index, depth, validity, *, null_depth, class_type=0,
                           prior_validity=None, keep_mask=0, prior_std=None):
    """The previous compute_bin_stats (sort, reduceat, the sums above)."""
    b0 = np.asarray(bin_index)
    z0 = np.asarray(depth, dtype=np.float64)
    v0 = np.asarray(validity).astype(np.int64)
    null32 = np.float32(null_depth)
    null64 = float(null32)
    order = np.argsort(b0, kind="stable")
    b, z, v = b0[order], z0[order], v0[order]
    first = np.ones(len(b), dtype=bool)
    first[1:] = b[1:] != b[:-1]
    start = np.flatnonzero(first)
    uniq = b[start]
    n_bins = len(start)
    counts = np.diff(np.append(start, len(b)))
    prior = (np.zeros(n_bins, np.int64) if prior_validity is None
             else np.broadcast_to(np.asarray(prior_validity), (n_bins,)).astype(np.int64))
    std_prior = (np.zeros(n_bins, np.float32) if prior_std is None
                 else np.broadcast_to(np.asarray(prior_std), (n_bins,)).astype(np.float32))
    out = {"bin_index": uniq, "num_soundings": counts.astype(np.uint32)}
    is_ref = (v & V.REFERENCE) != 0
    used = ((v & (V.DELETED | V.REFERENCE)) == 0) & (z < null64)
    filt = used & ((v & V.INVAL) == 0)
    if class_type:
        filt &= (v & _USER[class_type - 1]) != 0
    n_valid = np.add.reduceat(filt.astype(np.int64), start)
    n_used = np.add.reduceat(used.astype(np.int64), start)
    zf = np.where(filt, z, 0.0)
    zu = np.where(used, z, 0.0)
    sums = _old_sequential_group_sums(np.stack([zf, zf * zf, zu], axis=1), start, counts)
    sum_f, sum2_f, sum_u = sums[:, 0], sums[:, 1], sums[:, 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        min_f = np.minimum.reduceat(np.where(filt, z, np.inf), start)
        max_f = np.maximum.reduceat(np.where(filt, z, -np.inf), start)
        min_u = np.minimum.reduceat(np.where(used, z, np.inf), start)
        max_u = np.maximum.reduceat(np.where(used, z, -np.inf), start)
        mean_f = sum_f / n_valid
        mean_u = sum_u / n_used
        nf = n_valid.astype(np.float64)
        var = (sum2_f - nf * (mean_f * mean_f)) / (nf - 1.0)
        std = np.where((n_valid > 1) & (var >= 0), np.sqrt(np.where(var >= 0, var, 0.0)), 0.0)
    has_valid, has_used = n_valid > 0, n_used > 0
    out["num_valid"] = n_valid.astype(np.uint32)
    out["std"] = np.where(has_valid, std.astype(np.float32), std_prior).astype(np.float32)
    out["avg_filtered"] = np.where(has_valid, mean_f.astype(np.float32), null32)
    out["min_filtered"] = np.where(has_valid, min_f.astype(np.float32), null32)
    out["max_filtered"] = np.where(has_valid, max_f.astype(np.float32), null32)
    out["avg"] = np.where(has_used, mean_u.astype(np.float32), null32)
    out["min"] = np.where(has_used, min_u.astype(np.float32), null32)
    out["max"] = np.where(has_used, max_u.astype(np.float32), null32)
    from_snd = np.bitwise_or.reduceat(np.where(used, v & (V.VAL_MASK ^ keep_mask), 0), start)
    any_ref = np.logical_or.reduceat(is_ref, start)
    word = (prior & PRIOR_KEEP) | (prior & keep_mask) | from_snd
    word |= np.where(any_ref, V.REFERENCE, 0)
    word = np.where(has_valid, word | V.DATA, word & ~V.DATA)
    out["validity"] = (word & V.VAL_MASK).astype(np.uint32)
    return out


def _plain_sums(z, filt, used, start, counts):
    """Obviously correct: a Python loop per group, left to right from 0.0."""
    out = []
    for s, c in zip(start.tolist(), counts.tolist()):
        a = b = u = 0.0
        for i in range(s, s + c):
            zf = float(z[i]) if filt[i] else 0.0
            a += zf
            b += zf * zf
            u += float(z[i]) if used[i] else 0.0
        out.append((a, b, u))
    return np.array(out, dtype=np.float64).reshape(-1, 3)


def _same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _random_groups(rng, n_groups, heavy_tail=False):
    if heavy_tail:
        counts = np.minimum(rng.pareto(1.1, n_groups) * 5 + 1, 3000).astype(np.int64)
    else:
        counts = rng.integers(1, 40, n_groups)
    start = np.cumsum(counts) - counts
    n = int(counts.sum())
    z = rng.normal(2500.0, 300.0, n) * rng.choice([1.0, 1e-4, 1e4, -1.0], n)
    z[rng.random(n) < 0.01] = -0.0
    z[rng.random(n) < 0.005] = 0.0
    filt = rng.random(n) < 0.9
    used = filt | (rng.random(n) < 0.5)
    return z, filt, used, start, counts


# --- sums and statistics ----------------------------------------------------------------------

def _masks_as_flags(filt, used):
    """Validity words giving these masks: used and filtered 0, used only INVAL, else DELETED."""
    return np.where(filt, 0, np.where(used, V.FILTER_INVAL, V.DELETED)).astype(np.int64)


def _chain_sums(z, filt, used, start, counts):
    r = _group_pass(z, _masks_as_flags(filt, used), start, counts, np.inf, 0, 0)
    return r["sum_f"], r["sum2_f"], r["sum_u"]


@pytest.mark.parametrize("seed", range(4))
def test_chain_sums_equal_a_plain_loop(seed):
    rng = np.random.default_rng(seed)
    z, filt, used, start, counts = _random_groups(rng, 300, heavy_tail=seed % 2 == 1)
    got = np.stack(_chain_sums(z, filt, used, start, counts), axis=1)
    assert _same_bits(got, _plain_sums(z, filt, used, start, counts))


@pytest.mark.parametrize("seed,heavy", [(10, False), (11, True), (12, False)])
def test_chain_sums_equal_the_previous_implementation(seed, heavy):
    rng = np.random.default_rng(seed)
    z, filt, used, start, counts = _random_groups(rng, 60_000 if not heavy else 4_000, heavy)
    got = np.stack(_chain_sums(z, filt, used, start, counts), axis=1)
    zf = np.where(filt, z, 0.0)
    want = _old_sequential_group_sums(np.stack([zf, zf * zf, np.where(used, z, 0.0)], axis=1),
                                      start, counts)
    assert _same_bits(got, want)


@pytest.mark.parametrize("seed", range(3))
def test_group_extrema_counts_and_flags_equal_numpy(seed):
    """Extrema as numpy's minimum/maximum reductions, zeros of both signs included."""
    rng = np.random.default_rng(50 + seed)
    z, filt, used, start, counts = _random_groups(rng, 20_000)
    z[rng.random(z.size) < 0.05] = rng.choice([0.0, -0.0, -np.inf])
    v = _masks_as_flags(filt, used) | np.where(rng.random(z.size) < 0.02, V.REFERENCE, 0)
    v |= rng.choice(FLAGS, z.size) & ~(V.DELETED | V.REFERENCE | V.INVAL)
    used = ((v & (V.DELETED | V.REFERENCE)) == 0)
    filt = used & ((v & V.INVAL) == 0)
    r = _group_pass(z, v, start, counts, np.inf, 0, V.CHECKED)
    with np.errstate(invalid="ignore"):
        for key, mask, fill, red in (("min_f", filt, np.inf, np.minimum), ("max_f", filt, -np.inf, np.maximum),
                                     ("min_u", used, np.inf, np.minimum), ("max_u", used, -np.inf, np.maximum)):
            assert _same_bits(r[key], red.reduceat(np.where(mask, z, fill), start)), key
    assert np.array_equal(r["n_valid"], np.add.reduceat(filt.astype(np.int64), start))
    assert np.array_equal(r["n_used"], np.add.reduceat(used.astype(np.int64), start))
    assert np.array_equal(r["bits"], np.bitwise_or.reduceat(np.where(used, v & (V.VAL_MASK ^ V.CHECKED), 0),
                                                            start))
    assert np.array_equal(r["any_ref"], np.logical_or.reduceat((v & V.REFERENCE) != 0, start))


def test_chain_sums_empty():
    e = np.zeros(0)
    got = _chain_sums(e, e.astype(bool), e.astype(bool), np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert all(x.size == 0 for x in got)


FLAGS = np.array([0, 0, 0, 0, V.USER_01, V.USER_03, V.FILTER_INVAL, V.MANUALLY_INVAL, V.DELETED,
                  V.REFERENCE, V.SUSPECT | V.USER_01, V.MODIFIED, V.USER_07 | V.FILTER_INVAL,
                  V.CHECKED | V.DATA, V.SELECTED_SOUNDING])


@pytest.mark.parametrize("seed", range(6))
def test_stats_equal_the_previous_implementation(seed):
    rng = np.random.default_rng(100 + seed)
    n = 20_000
    bins = rng.integers(0, 1500, n)
    codes = rng.integers(0, 2_200_000, n)
    z = codes / np.float64(np.float32(100.0)) - np.float64(np.float32(10000.0))
    z[rng.random(n) < 0.03] = NULL
    z[rng.random(n) < 0.01] = NULL + 1.5
    if seed % 2:
        z[rng.random(n) < 0.05] = rng.choice([0.0, -0.0])   # both zeros: numpy picks by lane
    v = rng.choice(FLAGS, n) | rng.choice(FLAGS, n)
    n_bins = np.unique(bins).size
    kw = dict(null_depth=NULL, class_type=int(rng.choice([0, 0, 1, 3])),
              keep_mask=int(rng.choice([0, V.CHECKED, V.SUSPECT | V.MODIFIED])),
              prior_validity=rng.integers(0, V.VAL_MASK + 1, n_bins),
              prior_std=rng.choice([0.0, 0.25, 3.5], n_bins).astype(np.float32))
    want = _old_compute_bin_stats(bins, z, v, **kw)
    got = compute_bin_stats(bins, z, v, **kw)       # unsorted input
    for f in FIELDS + ("bin_index",):
        assert _same_bits(got[f], want[f]), f
    order = np.argsort(bins, kind="stable")         # grouped input, as the store gives it
    ub, counts = np.unique(bins, return_counts=True)
    grp = grouped_bin_stats(ub, counts, z[order], v[order], **kw)
    for f in FIELDS + ("bin_index",):
        assert _same_bits(grp[f], want[f]), f


def test_grouped_stats_refuses_inconsistent_groups():
    with pytest.raises(ValueError):
        grouped_bin_stats([1, 2], [2, 2], np.zeros(3), np.zeros(3, np.int64), null_depth=NULL)
    with pytest.raises(ValueError):
        grouped_bin_stats([1, 2], [3, 0], np.zeros(3), np.zeros(3, np.int64), null_depth=NULL)


# --- the store's read path ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def three_batches(tmp_path_factory):
    """A PFM whose chains run through three batches (records of a chain not contiguous)."""
    d = tmp_path_factory.mktemp("three")
    path, grid, inputs = build_pfm(d, seed=21, n=900, batches=3, heavy=60)
    return path


def test_read_soundings_fields_are_a_subset(three_batches):
    with P.open_pfm(three_batches) as f:
        full = f.read_soundings(0, f.height)
        for fields in (("depth", "validity"), ("bin_index", "file"), ("record_offset",),
                       ("row", "depth", "slot")):
            part_ = f.read_soundings(0, f.height, fields=fields)
            assert set(fields) <= set(part_)
            for k, v in part_.items():
                assert _same_bits(v, full[k]), k
        cut = f.read_soundings(1, 3, 2, 5, fields=("depth",))
        want = f.read_soundings(1, 3, 2, 5)
        assert _same_bits(cut["depth"], want["depth"])


def test_read_bin_records_fields_are_a_subset(three_batches):
    with P.open_pfm(three_batches) as f:
        full = f.read_bin_records(0, f.height, codes=True)
        for fields in (("num_soundings",), ("std", "validity", "head"), ("avg", "tail", "num_valid")):
            got = f.read_bin_records(0, f.height, fields=fields)
            assert set(got) == {"bin_index", "row", "col", *fields}
            for k, v in got.items():
                assert _same_bits(v, full[k]), k
        got = f.read_bin_records(2, 5, 1, 4, codes=True, fields=("min",))
        want = f.read_bin_records(2, 5, 1, 4, codes=True)
        for k in ("min", "min_code", "std_code"):
            assert _same_bits(got[k], want[k]), k


def test_read_soundings_agree_with_the_checks_own_reader(three_batches):
    """Two independent readers of the same chains: the store's and the check's walker."""
    parts = _check_parts._parts(three_batches)
    h = _check_parts._read_header(parts[".bin"])
    lay = _check_parts._Layout(h, True)
    raw = open(parts[".bin"], "rb").read()[h.bin_header_size:]
    recs = np.frombuffer(raw, np.uint8).reshape(-1, lay.bin_bytes)
    u = lay.bin.unpack(recs)
    walker = _check_walk._Walker(parts[".ndx"], os.path.getsize(parts[".ndx"]), lay, h.bin_width,
                            _problems._Problems())
    try:
        bidx = np.arange(recs.shape[0])
        ok, reached = walker.walk(bidx, u["count"].astype(np.int64), u["head"].astype(np.int64),
                                  u["tail"].astype(np.int64))
        assert ok.all()
        snd = walker.soundings(reached)
    finally:
        walker.close()
    with P.open_pfm(three_batches) as f:
        s = f.read_soundings(0, f.height)
        code = np.round((s["depth"] + float(np.float32(h.depth_offset))) * float(np.float32(h.depth_scale)))
    assert np.array_equal(bidx[snd["b"]], s["bin_index"])
    for k in ("file", "line", "validity"):
        assert np.array_equal(snd[k].astype(np.int64), s[k]), k
    assert np.array_equal(snd["depth"].astype(np.float64), code)


def test_compiled_chain_reader_equals_the_step_by_step_walk(three_batches, monkeypatch):
    from pfm_dask.pfm import _reader

    with P.open_pfm(three_batches) as f:
        fast = f.read_soundings(0, f.height)
        fast_cut = f.read_soundings(1, 4, 2, 6, fields=("row", "slot", "depth"))
    monkeypatch.setattr(_reader, "chain_records", lambda *a, **k: None)
    with P.open_pfm(three_batches) as f:
        slow = f.read_soundings(0, f.height)
        slow_cut = f.read_soundings(1, 4, 2, 6, fields=("row", "slot", "depth"))
    for a, b in ((fast, slow), (fast_cut, slow_cut)):
        assert list(a) == list(b)
        for k in a:
            assert _same_bits(a[k], b[k]), k


@pytest.mark.parametrize("where", ["odd", "past_end", "zero"])
def test_a_broken_chain_is_named_by_the_reader(three_batches, tmp_path, where):
    p = _copy(three_batches, os.fspath(tmp_path / "t.pfm"))
    bf = BinFile(p)
    h = bf.h
    rsize = ndx_record(h)[2]
    c, r = bf.bins_with(min_count=2 * h.record_length + 1)[0]
    head = bf.get(c, r, "head")
    bad = {"odd": head + 1, "past_end": os.path.getsize(part(p, "ndx")) + rsize, "zero": 0}[where]
    set_continuation(p, h, head, bad)
    with P.open_pfm(p) as f:
        with pytest.raises(PfmDaskError, match="breaks after 1 record") as e:
            f.read_soundings(r, r + 1, c, c + 1)
    assert e.value.offset == head


# --- recompute: threads change nothing -----------------------------------------------------------

def _copy(src, dst):
    shutil.copy(src, dst)
    shutil.copytree(src + ".data", dst + ".data")
    return dst


def _parts_bytes(path):
    name = os.path.basename(path)
    return {e: open(f"{path}.data/{name}.{e}", "rb").read() for e in ("bin", "cvg", "ndx")}


@pytest.mark.parametrize("subset", [False, True])
def test_recompute_threads_give_the_same_bytes(tmp_path, subset):
    src, _, inputs = build_pfm(tmp_path, seed=31, n=1200, batches=2, heavy=80, do_recompute=False)
    bins = np.unique(inputs["bin_index"])
    wanted = bins[::3] if subset else None
    results = []
    for threads, band in ((1, None), (1, 17), (2, 17), (3, 5), (4, 40)):
        d = tmp_path / f"t{threads}_{band}"
        d.mkdir()
        p = _copy(src, os.fspath(d / "t.pfm"))
        with P.open_pfm(p, "r+") as f:
            kw = {"band_soundings": band} if band else {}
            ext = P.recompute(f, wanted, threads=threads, **kw)
            f.write_header(**ext)
        results.append((ext, _parts_bytes(p)))
    for ext, data in results[1:]:
        assert ext == results[0][0]
        assert data == results[0][1]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_ordered_imap_keeps_order_and_stops_at_the_first_error(threads):
    assert list(_recompute.ordered_imap(lambda x: x * x, range(20), threads)) == \
        [x * x for x in range(20)]
    seen = []

    def fn(x):
        if x == 3:
            raise ValueError("three")
        return x

    with pytest.raises(ValueError, match="three"):
        for r in _recompute.ordered_imap(fn, range(10), threads):
            seen.append(r)
    assert seen == [0, 1, 2]


# --- check: the walk, the pipeline and the problem list ------------------------------------------

class OldWalker(_check_walk._Walker):
    """The previous walk: reads whole records at every step and scatters every field."""

    def _classify(self, b, head, target, steps):
        if self.classified >= 2 * _problems._MAX_PER_KIND:
            return "reached twice (a cycle, or shared with another bin)"
        self.classified += 1
        cur = head
        L = self.lay
        for _ in range(steps):
            if cur == target:
                return "reached twice by this bin's own chain (a cycle)"
            if cur % L.phys or cur < 0 or cur + L.phys > self.size:
                break
            cur = int(L.ndx.unpack(np.asarray(self.recs[cur // L.phys])[None, :], ["cont"])["cont"][0])
        return "already part of another bin's chain (a record shared by two bins)"

    def walk(self, bidx, count, head, tail, *, collect=True, mark=True):
        L = self.lay
        n = bidx.size
        nrec = (count + L.L - 1) // L.L
        ok = np.ones(n, dtype=bool)
        total = int(count.sum()) if collect else 0
        pos0 = np.cumsum(count) - count
        out = {k: np.zeros(total, dtype=np.uint64) for k in L.sounding_keys}
        filled = np.zeros(total, dtype=bool)
        active = np.flatnonzero(count > 0)
        cur = head.astype(np.int64).copy()
        step = 0
        W = self.W
        pr = self.pr
        while active.size:
            a = cur[active]
            bad = (a < 0) | (a % L.phys != 0) | (a + L.phys > self.size)
            for j in pr.each("chain pointer", ".ndx", bad):
                bi = active[j]
                what = ("head pointer" if step == 0 else f"continuation pointer (record {step + 1} "
                        "of the chain)")
                pr.add("chain pointer", ".bin" if step == 0 else ".ndx", _problems._bin_where(bidx[bi], W),
                       f"{what} {int(a[j]):,} is not a physical record of the .ndx "
                       f"({self.size:,} bytes of {L.phys}-byte records)")
            ok[active[bad]] = False
            active, a = active[~bad], a[~bad]
            if not active.size:
                break
            idx = a // L.phys
            if mark:
                order = np.argsort(idx, kind="stable")
                dup_in_step = np.zeros(idx.size, dtype=bool)
                same = idx[order][1:] == idx[order][:-1]
                dup_in_step[order[1:][same]] = True
                again = self.visited.test(idx) | dup_in_step
            else:
                again = np.zeros(idx.size, dtype=bool)
            for j in pr.each("chain revisit", ".ndx", again):
                bi = active[j]
                kind = self._classify(int(bidx[bi]), int(head[bi]), int(a[j]), step)
                pr.add("chain revisit", ".ndx", _problems._bin_where(bidx[bi], W),
                       f"physical record at byte {int(a[j]):,} (step {step + 1} of the chain) {kind}")
            ok[active[again]] = False
            keep = ~again
            active, a, idx = active[keep], a[keep], idx[keep]
            if not active.size:
                break
            if mark:
                self.visited.set(idx)
            u = L.ndx.unpack(np.asarray(self.recs[idx]), None if collect else ["cont"])
            cont = u["cont"].astype(np.int64)
            n_here = np.minimum(L.L, count[active] - step * L.L)
            rows, slot = np.nonzero(np.arange(L.L)[None, :] < n_here[:, None])
            if not collect:
                rows = slot = np.zeros(0, dtype=np.int64)
            dest = pos0[active[rows]] + step * L.L + slot
            for s_ in range(L.L):
                sel = slot == s_
                for key in L.sounding_keys:
                    out[key][dest[sel]] = u[(key, s_)][rows[sel]]
            filled[dest] = True
            last = nrec[active] == step + 1
            for j in pr.each("chain long", ".ndx", last & (cont != 0)):
                bi = active[j]
                pr.add("chain long", ".ndx", _problems._bin_where(bidx[bi], W),
                       f"the chain continues (to byte {int(cont[j]):,}) after the "
                       f"{int(nrec[bi])} record(s) that {int(count[bi])} soundings need: "
                       "the count is smaller than the chain")
            ok[active[last & (cont != 0)]] = False
            for j in pr.each("chain tail", ".bin", last & (a != tail[active])):
                bi = active[j]
                pr.add("chain tail", ".bin", _problems._bin_where(bidx[bi], W),
                       f"tail pointer {int(tail[bi]):,} but the chain ends at byte {int(a[j]):,}")
            ok[active[last & (a != tail[active])]] = False
            short = ~last & (cont == 0)
            for j in pr.each("chain short", ".ndx", short):
                bi = active[j]
                pr.add("chain short", ".ndx", _problems._bin_where(bidx[bi], W),
                       f"the chain ends after {step + 1} record(s) but the count {int(count[bi])} "
                       f"needs {int(nrec[bi])}")
            ok[active[short]] = False
            go = ~last & ~short
            active = active[go]
            cur[active] = cont[go]
            step += 1
        snd = {k: v[filled] for k, v in out.items()}
        snd["b"] = np.repeat(np.arange(n, dtype=np.int64), count)[filled]
        return ok, snd

    def soundings(self, reached):
        return reached


def damage(path, seed: int, many: bool = False) -> None:
    """Several kinds of damage at once, at places chosen by ``seed`` (bytes edited by hand)."""
    rng = np.random.default_rng(seed)
    bf = BinFile(path)
    h = bf.h
    L = h.record_length
    rsize = ndx_record(h)[2]
    nonempty = bf.bins_with()
    long_ = bf.bins_with(min_count=3 * L + 1)
    pick = lambda seq: seq[int(rng.integers(len(seq)))]  # noqa: E731
    kinds = rng.permutation(["cycle", "shared", "count+", "count-", "tail", "head_end", "head_odd",
                             "stale", "cvg", "huge", "orphan"])[: int(rng.integers(3, 9))]
    for kind in kinds:
        c, r = pick(nonempty)
        if kind == "cycle" and long_:
            c, r = pick(long_)
            head = bf.get(c, r, "head")
            set_continuation(path, h, get_continuation(path, h, head), head)
        elif kind == "shared":
            c2, r2 = pick(nonempty)
            if (c2, r2) != (c, r):
                for k in ("count", "head", "tail"):
                    bf.set(c2, r2, k, bf.get(c, r, k))
        elif kind == "count+":
            bf.set(c, r, "count", bf.get(c, r, "count") + L)
        elif kind == "count-" and bf.get(c, r, "count") > L:
            bf.set(c, r, "count", bf.get(c, r, "count") - L)
        elif kind == "tail":
            bf.set(c, r, "tail", bf.get(c, r, "tail") + rsize)
        elif kind == "head_end":
            bf.set(c, r, "head", os.path.getsize(part(path, "ndx")) + 3 * rsize)
        elif kind == "head_odd":
            bf.set(c, r, "head", bf.get(c, r, "head") + 1)
        elif kind == "stale":
            bf.set(c, r, "avg_filtered", bf.get(c, r, "avg_filtered") + 50)
            bf.set(c, r, "num_valid", bf.get(c, r, "num_valid") + 1)
        elif kind == "cvg":
            with open(part(path, "cvg"), "r+b") as fh:
                fh.seek(65536 + r * h.bin_width + c)
                fh.write(bytes([0]))
        elif kind == "huge":
            bf.set(c, r, "count", (1 << h.count_bits) - 1)
        elif kind == "orphan":
            with open(part(path, "ndx"), "ab") as fh:
                fh.write(bytes(rsize))
    if many:  # more problems of a kind than the list describes, spread over many bands
        with open(part(path, "cvg"), "r+b") as fh:
            fh.seek(65536)
            fh.write(bytes(h.bin_width * h.bin_height))
        for c, r in nonempty[::2]:
            bf.set(c, r, "min", bf.get(c, r, "min") + 7)


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    d = tmp_path_factory.mktemp("sound")
    path, _, _ = build_pfm(d, seed=41, n=1500, batches=3, heavy=45)
    return path


def _damaged_copy(sound, d, seed, many=False):
    d.mkdir(parents=True, exist_ok=True)
    p = _copy(sound, os.fspath(d / "t.pfm"))
    damage(p, seed, many)
    return p


@pytest.mark.parametrize("seed", range(6))
def test_walker_equals_the_previous_walk(sound, tmp_path, seed):
    p = _damaged_copy(sound, tmp_path / "w", seed)
    parts = _check_parts._parts(p)
    h = _check_parts._read_header(parts[".bin"])
    lay = _check_parts._Layout(h, True)
    raw = open(parts[".bin"], "rb").read()[h.bin_header_size:]
    recs = np.frombuffer(raw, np.uint8).reshape(-1, lay.bin_bytes)
    u = lay.bin.unpack(recs)
    cnt = u["count"].astype(np.int64)
    size = os.path.getsize(parts[".ndx"])
    cnt = np.where(cnt > (size // lay.phys) * lay.L, 0, cnt)
    head, tail = u["head"].astype(np.int64), u["tail"].astype(np.int64)
    answers = []
    for cls in (_check_walk._Walker, OldWalker):
        pr = _problems._Problems()
        w = cls(parts[".ndx"], size, lay, h.bin_width, pr)
        try:
            oks, snds = [], []
            for a in range(0, cnt.size, 7):       # bands of 7 bins: the visited map spans bands
                bidx = np.arange(a, min(cnt.size, a + 7))
                ok, reached = w.walk(bidx, cnt[bidx], head[bidx], tail[bidx])
                s = w.soundings(reached)
                s["b"] = bidx[s["b"]]
                oks.append(ok)
                snds.append(s)
            orphans = w.visited.unset()
        finally:
            w.close()
        answers.append((np.concatenate(oks), snds, pr.finish(), orphans))
    (ok1, s1, p1, o1), (ok2, s2, p2, o2) = answers
    assert np.array_equal(ok1, ok2)
    assert p1 == p2 and o1 == o2
    for a, b in zip(s1, s2):
        for k in ("b", "file", "line", "depth", "validity"):
            assert _same_bits(a[k], b[k]), k


@pytest.mark.parametrize("seed,many", [(0, False), (1, False), (2, True), (3, False), (4, True),
                                       (5, False), (6, False), (7, True)])
def test_check_threads_and_bands_give_the_same_problems(sound, tmp_path, monkeypatch, seed, many):
    p = _damaged_copy(sound, tmp_path / "c", seed, many)
    want = P.check(p, threads=1)
    assert want, "the damage must be found"
    assert P.check(p, threads=2) == want
    monkeypatch.setattr(_check, "_BAND_BINS", 11)
    monkeypatch.setattr(_check, "_BAND_SOUNDINGS", 23)
    small = P.check(p, threads=1)
    for threads in (2, 3):
        assert P.check(p, threads=threads) == small


@pytest.mark.parametrize("seed,many", [(0, False), (2, True), (5, False), (6, False), (8, False),
                                       (9, True)])
def test_fast_walk_gives_the_exact_walks_problems(sound, tmp_path, monkeypatch, seed, many):
    """Bands walked off the main thread without the visited map, then marked in order, report
    exactly what the exact walk alone reports, on any damage, threads and band sizes."""
    p = _damaged_copy(sound, tmp_path / "f", seed, many)
    for bands in ((1 << 18, 500_000), (11, 23), (3, 7)):
        monkeypatch.setattr(_check, "_BAND_BINS", bands[0])
        monkeypatch.setattr(_check, "_BAND_SOUNDINGS", bands[1])
        monkeypatch.setattr(_check_band, "_FAST_WALK", False)
        want = P.check(p, threads=1)
        assert want
        monkeypatch.setattr(_check_band, "_FAST_WALK", True)
        for threads in (1, 2, 3):
            assert P.check(p, threads=threads) == want, (bands, threads)


def _count_exact_walks(monkeypatch) -> list:
    calls = []
    exact = _check._walk_band

    def counted(*args):
        calls.append(args[0][0])
        return exact(*args)

    monkeypatch.setattr(_check, "_walk_band", counted)
    return calls


def test_fast_walk_takes_every_band_of_a_sound_file(sound, monkeypatch):
    monkeypatch.setattr(_check, "_BAND_BINS", 64)
    calls = _count_exact_walks(monkeypatch)
    for threads in (1, 2):
        assert P.check(sound, threads=threads) == []
    assert calls == []


def test_fast_walk_leaves_a_shared_record_to_the_exact_walk(sound, tmp_path, monkeypatch):
    """Two bins of one band sharing a chain: each chain is sound on its own, so only the
    visited map can tell; the band is walked again exactly and the sharing named."""
    p = _copy(sound, os.fspath(tmp_path / "t.pfm"))
    bf = BinFile(p)
    (c1, r1), (c2, r2) = bf.bins_with()[:2]      # one band: the grid is small
    for k in ("count", "head", "tail"):
        bf.set(c2, r2, k, bf.get(c1, r1, k))
    calls = _count_exact_walks(monkeypatch)
    problems = P.check(p, threads=2)
    assert any("shared" in x.what and f"({c2}, {r2})" in x.where for x in problems)
    assert len(calls) == 1


def test_visit_marks_in_order_and_undoes_a_conflict():
    from pfm_dask.pfm._chains import visit

    bits = np.zeros(4, dtype=np.uint8)
    assert visit(bits, np.array([0, 9, 31]))
    assert bits.tolist() == [1, 2, 0, 128]
    before = bits.copy()
    assert not visit(bits, np.array([3, 17, 9, 20]))      # 9 was reached before
    assert np.array_equal(bits, before)
    assert not visit(bits, np.array([4, 5, 4]))           # twice in one call
    assert np.array_equal(bits, before)
    assert visit(bits, np.zeros(0, dtype=np.int64))
    # a record outside the map (or outside n records) is refused, the map unchanged
    for idx, n in (([1, 32], None), ([2, -1], None), ([2, 30], 30)):
        assert not visit(bits, np.array(idx), n)
        assert np.array_equal(bits, before)
    assert visit(bits, np.array([2, 29]), 30)


def test_check_threads_on_a_sound_file(sound, monkeypatch):
    monkeypatch.setattr(_check, "_BAND_BINS", 5)
    monkeypatch.setattr(_check, "_BAND_SOUNDINGS", 13)
    for threads in (1, 2, 4):
        assert P.check(sound, threads=threads) == []


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ext=st.sampled_from(["bin", "ndx", "cvg"]), where=st.floats(0.0, 1.0),
       length=st.integers(1, 200), seed=st.integers(0, 2**32 - 1), truncate=st.booleans())
def test_check_threads_on_random_damage(sound, tmp_path_factory, monkeypatch, ext, where, length,
                                        seed, truncate):
    d = tmp_path_factory.mktemp("fuzz")
    p = _copy(sound, os.fspath(d / "t.pfm"))
    f = part(p, ext)
    size = os.path.getsize(f)
    lo = 131072 if ext == "bin" else 0
    off = lo + int(where * max(0, size - lo - 1))
    rng = np.random.default_rng(seed)
    with open(f, "r+b") as fh:
        if truncate:
            fh.truncate(off)
        else:
            fh.seek(off)
            fh.write(rng.integers(0, 256, length, dtype=np.uint8).tobytes())
    monkeypatch.setattr(_check, "_BAND_BINS", 9)
    monkeypatch.setattr(_check, "_BAND_SOUNDINGS", 17)

    def run(threads, fast=True):
        monkeypatch.setattr(_check_band, "_FAST_WALK", fast)
        try:
            return P.check(p, threads=threads)
        except PfmDaskError as exc:
            return str(exc)

    want = run(1, fast=False)
    assert run(2) == want
    assert run(1) == want


# --- the problem list: per-band collectors merged in order == one collector ----------------------

@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 30)),
                         max_size=6), min_size=1, max_size=8))
def test_problem_merge_equals_sequential_collection(bands):
    """Each band: a walk part (kinds a, b) then a data part (kind c, via ``each``)."""
    def walk_part(pr, band, k):
        for kind, n in bands[band]:
            if kind != "c":
                for j in pr.each(kind, "x", np.arange(n)):
                    pr.add(kind, "x", f"{band}.{k}", f"{kind}{j}")

    def data_part(pr, band):
        for kind, n in bands[band]:
            if kind == "c":
                for j in pr.each("c", "y", np.arange(n)):
                    pr.add("c", "y", f"{band}", f"c{j}")

    seq = _problems._Problems()
    for i in range(len(bands)):
        walk_part(seq, i, 0)
        data_part(seq, i)
    piped = _problems._Problems()
    locals_ = []
    for i in range(len(bands)):
        piped.slot = 2 * i
        walk_part(piped, i, 0)
        loc = _problems._Problems()
        data_part(loc, i)
        locals_.append(loc)
    for i, loc in enumerate(locals_):      # merged after every walk part ran
        piped.merge(loc, 2 * i + 1)
    assert piped.finish() == seq.finish()


@pytest.mark.parametrize("record_length,max_pointer", [(1, 0), (3, 2**40), (5, 2**50), (7, 2**62),
                                                       (6, 2**63 + 5), (2, 2**63 + 5)])
def test_pointer_layouts_read_and_check(tmp_path, record_length, max_pointer):
    """Continuation pointers at every bit alignment and width (up to 64 bits over 9 bytes)."""
    from pfm_dask.bins import BinGrid

    grid = BinGrid.from_mbr(30.0, -80.0, 30.0006, -79.9993, bin_size_m=10.0)
    path = os.fspath(tmp_path / "t.pfm")
    rng = np.random.default_rng(record_length)
    n = 700
    with P.create(path, grid, min_depth=-10.0, max_depth=1000.0, record_length=record_length,
                  max_record_pointer=max_pointer) as f:
        f.add_files(["a.gsf"])
        f.add_lines(["a-1"])
        for _ in range(3):
            b = np.sort(rng.integers(0, grid.width * grid.height, n))
            f.add_sorted(b, np.zeros(n, np.int64), np.zeros(n, np.int64), rng.integers(1, 99, n),
                         rng.integers(1, 99, n), np.round(rng.normal(100, 5, n), 2),
                         rng.integers(0, 4095, n), rng.integers(0, 4095, n), np.zeros(n, np.int64),
                         np.full(n, 1.0), np.full(n, 0.5))
        f.write_header(**P.recompute(f))
    h = header(path)
    assert h.record_pointer_bits == (38 if not max_pointer else int(max_pointer).bit_length())
    with P.open_pfm(path) as f:
        s = f.read_soundings(0, f.height)
        assert s["depth"].size == 3 * n
        sub = f.read_soundings(0, f.height, fields=("depth", "record_offset"))
        assert _same_bits(sub["depth"], s["depth"])
        assert _same_bits(sub["record_offset"], s["record_offset"])
    assert P.check(path, threads=1) == [] and P.check(path, threads=2) == []
    bf = BinFile(path)
    c, r = bf.bins_with(min_count=2 * record_length + 1)[0]
    second = get_continuation(path, h, bf.get(c, r, "head"))
    set_continuation(path, h, second, second)     # a cycle
    problems = P.check(path, threads=1)
    assert any("cycle" in p.what for p in problems)
    assert P.check(path, threads=2) == problems
