"""numba bit-packing kernels against the numpy implementations and a slow bit-string reference.

Three implementations meet here: the numba kernels behind ``pack_records``,
``pack_soundings``, ``unpack_records`` and ``BitLayout`` (the code under test),
the numpy versions they replaced (``tests/pfm/bitpack_reference.py``), and the
obviously-correct reference below that writes and reads every field through a
'0'/'1' string. Sounding coding is checked against a scalar reimplementation of
the PFM library's rules in plain Python floats (float32 rounding via struct).
"""

import math
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

import numba  # noqa: F401  (_bitpack reads records with its numpy references until numba is imported)
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfm_dask.pfm import _bitpack as B
from pfm_dask.pfm._bitpack import BitLayout, pack_records, unpack_records
from pfm_dask.pfm._bitpack_soundings import SoundingCoding, pack_soundings
from pfm_dask.pfm._runs import bin_runs, bits_all_set, clear_bits
from pfm_dask.pfm import _bitpack_kernels as K, _runs, _runs_kernels as RK

from . import bitpack_reference as R

MAXU64 = 2**64 - 1


def ref_record(fields, values, nbytes):
    """Bytes of one record, MSB first, written field by field as text."""
    bits = ["0"] * (nbytes * 8)
    for (off, nb), v in zip(fields, values):
        if nb:
            bits[off:off + nb] = format(int(v), f"0{nb}b")
    s = "".join(bits)
    return bytes(int(s[i:i + 8], 2) for i in range(0, len(s), 8))


def ref_field(record: bytes, off: int, nb: int) -> int:
    if nb == 0:
        return 0
    return int("".join(format(x, "08b") for x in record)[off:off + nb], 2)


def f32(x: float) -> float:
    """Round a Python float to IEEE single (as a C assignment to float)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def ref_depth_code(z: float, offset: float, scale: float) -> int:
    """NINT((z + offset) * scale) in double with the float32 header values (z checked, >= 0)."""
    return math.trunc((z + f32(offset)) * f32(scale) + 0.5)


def ref_error_code(e: float, scale: float, bits: int) -> int:
    """NINT(float(e) * float(scale)) with a float32 product; NaN/negative/too large -> null."""
    null = (1 << bits) - 1
    try:
        e32 = f32(e)
    except OverflowError:
        e32 = math.copysign(math.inf, e)
    if not e32 >= 0:
        return null
    p = e32 * f32(scale)                      # exact in double ...
    p = f32(p) if math.isfinite(p) and abs(p) < 3.4e38 else math.inf   # ... rounded once to float
    p = min(p, float(null + 1))
    return min(math.trunc(p + 0.5), null)


def random_u64(rng, n, nb):
    """n random nb-bit values, the first one the maximum."""
    if nb == 0:
        return np.zeros(n, np.uint64)
    v = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)
    if nb < 64:
        v &= np.uint64((1 << nb) - 1)
    if n:
        v[0] = (1 << nb) - 1
    return v


widths = st.lists(st.integers(0, 64), min_size=1, max_size=12)


# ---------------------------------------------------------------------------
# BitLayout: bytes <-> words, unpack_words

@settings(max_examples=60, deadline=None)
@given(widths, st.lists(st.integers(0, 9), min_size=12, max_size=12), st.integers(1, 9),
       st.integers(0, 2**32 - 1), st.booleans())
def test_layout_words_and_fields(ws, gaps, n, seed, transposed):
    rng = np.random.default_rng(seed)
    fields, pos = [], 0
    for i, w in enumerate(ws):
        pos += gaps[i]
        fields.append((i, pos, w))
        pos += w
    lay = BitLayout(fields, record_bytes=(pos + 7) // 8 + int(rng.integers(0, 3)))
    recs = rng.integers(0, 256, (n, lay.record_bytes), dtype=np.uint8)   # garbage between fields too
    recs[0] = 255
    words = lay._to_words(recs)
    assert np.array_equal(words, lay._to_words_numpy(recs))
    assert np.array_equal(lay._from_words(words), recs)
    assert np.array_equal(R.from_words(lay, words), recs)
    w_in = np.ascontiguousarray(words.T) if transposed else words
    got = lay.unpack_words(w_in, transposed=transposed)
    ref = lay._unpack_words_numpy(w_in, transposed=transposed)
    rows = rng.integers(-n, n, 5)
    got_rows = lay.unpack_words(words, rows=rows)
    for key, off, w in fields:
        expect = [ref_field(bytes(r), off, w) for r in recs]
        assert got[key].tolist() == expect
        assert ref[key].tolist() == expect
        assert got_rows[key].tolist() == [expect[r] for r in rows]
    # read-only input (as np.frombuffer gives)
    ro = np.frombuffer(recs.tobytes(), dtype=np.uint8).reshape(recs.shape)
    assert np.array_equal(lay._to_words(ro), words)
    assert lay.unpack(ro)[fields[-1][0]].tolist() == [ref_field(bytes(r), *fields[-1][1:]) for r in recs]


def test_unpack_words_rejects_bad_input():
    lay = BitLayout([("a", 0, 70 - 64), ("b", 6, 64)])
    with pytest.raises(IndexError):
        lay.unpack_words(np.zeros((3, lay.n_words), np.uint64), rows=np.array([3]))
    with pytest.raises(ValueError):
        lay.unpack_words(np.zeros((3, lay.n_words - 1), np.uint64))


@settings(max_examples=40, deadline=None)
@given(widths, st.integers(0, 2**32 - 1), st.integers(0, 6))
def test_pack_at_and_unpack_at_in_place(ws, seed, n):
    """Records inside a dirty buffer (odd offsets, one at the very end): given fields replaced, all
    other bits kept; compared bit by bit with the reference."""
    rng = np.random.default_rng(seed)
    fields, pos = [], 0
    for i, w in enumerate(ws):
        fields.append((i, pos, w))
        pos += w + int(rng.integers(0, 3))
    lay = BitLayout(fields)
    size = lay.record_bytes
    gaps = rng.integers(0, 5, n)
    offs = np.cumsum(gaps + size) - size
    buf = rng.integers(0, 256, int(offs[-1] + size) if n else 3, dtype=np.uint8)
    before = buf.copy()
    change = [k for k, _, w in fields if w and rng.random() < 0.7]
    new = {k: random_u64(rng, n, fields[k][2]) for k in change}
    lay.pack_at(buf, offs, new)
    expect = list("".join(format(x, "08b") for x in before.tobytes()))
    for j, o in enumerate(offs.tolist()):
        for k in change:
            _, off, w = fields[k]
            expect[8 * o + off: 8 * o + off + w] = format(int(new[k][j]), f"0{w}b")
    assert "".join(format(x, "08b") for x in buf.tobytes()) == "".join(expect)
    got = lay.unpack_at(buf, offs)
    for key, off, w in fields:
        assert got[key].tolist() == [ref_field(buf[o:o + size].tobytes(), off, w) for o in offs.tolist()]
    with pytest.raises(ValueError):
        lay.unpack_at(buf, np.array([buf.size - size + 1]))


@settings(max_examples=40, deadline=None)
@given(widths, st.integers(0, 2**32 - 1), st.integers(0, 6), st.booleans())
def test_pack_new_at_writes_whole_records(ws, seed, n, wide_values):
    """Records written anew inside a dirty buffer (odd offsets, one at the very end): each is
    exactly the reference record of the given fields (every other bit 0, values taken modulo
    their widths); the bytes between records are kept."""
    rng = np.random.default_rng(seed)
    fields, pos = [], 0
    for i, w in enumerate(ws):
        fields.append((i, pos, w))
        pos += w + int(rng.integers(0, 3))
    lay = BitLayout(fields, record_bytes=(pos + 7) // 8 + int(rng.integers(0, 3)))
    size = lay.record_bytes
    gaps = rng.integers(0, 5, n)
    offs = np.cumsum(gaps + size) - size
    buf = rng.integers(0, 256, int(offs[-1] + size) if n else 3, dtype=np.uint8)
    before = buf.copy()
    given_ = [k for k, _, w in fields if rng.random() < 0.7]
    new = {k: random_u64(rng, n, 64 if wide_values else fields[k][2]) for k in reversed(given_)}
    lay.pack_new_at(buf, offs, new)
    kept = np.ones(buf.size, bool)
    for j, o in enumerate(offs.tolist()):
        vals = [(int(new[k][j]) & ((1 << w) - 1)) if k in new else 0 for k, _, w in fields]
        assert buf[o:o + size].tobytes() == ref_record([(off, w) for _, off, w in fields], vals, size)
        kept[o:o + size] = False
    assert np.array_equal(buf[kept], before[kept])
    # the same records as pack_at into zeroed ones
    if n:
        z = buf.copy()
        for o in offs.tolist():
            z[o:o + size] = 0
        lay.pack_at(z, offs, new)
        assert np.array_equal(z, buf)


def test_bits_helpers_and_bin_runs():
    rng = np.random.default_rng(2)
    bits = rng.integers(0, 256, 40, dtype=np.uint8)
    ref = [int(c) for c in "".join(format(x, "08b") for x in bits.tobytes())]
    pos = np.sort(rng.choice(320, 50, replace=False))
    assert bits_all_set(bits, pos) == all(ref[p] for p in pos)
    ones = np.flatnonzero(ref)
    assert bits_all_set(bits, ones) and bits_all_set(bits, np.zeros(0, np.int64))
    clear_bits(bits, pos)
    for p in pos:
        ref[p] = 0
    assert "".join(format(x, "08b") for x in bits.tobytes()) == "".join(map(str, ref))
    with pytest.raises(ValueError):
        clear_bits(bits, np.array([320]))
    b = np.repeat(np.array([0, 3, 4, 9]), [2, 1, 5, 3])
    assert bin_runs(b, 10).tolist() == [0, 2, 3, 8]
    assert bin_runs(b, 9) is None                    # 9 outside the grid
    assert bin_runs(b[::-1], 10) is None             # not sorted
    assert bin_runs(np.array([-1, -1, 0]), 10) is None
    assert bin_runs(np.zeros(0, np.int64), 10).tolist() == []



@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=9)),
                max_size=12),
       st.sampled_from([np.uint8, np.uint16, np.uint32, np.int32, np.int64, np.uint64]))
def test_bin_runs_or_of_matches_a_per_run_or(runs, dtype):
    """Each run's OR of values (the writer's bin validity) equals a plain per-run OR,
    whatever the integer type; the starts and bins are those found without it."""
    gaps = [g for g, _ in runs]
    bins = np.cumsum(np.array([1 + g for g in gaps], dtype=np.int64)) if runs else np.zeros(0, np.int64)
    b = np.repeat(bins, [len(v) for _, v in runs]).astype(np.int64)
    mask = np.iinfo(dtype).max
    v = np.array([x & mask for _, vals in runs for x in vals], dtype=dtype)
    got = bin_runs(b, int(bins.max(initial=0)) + 1, values=True, or_of=v)
    starts, ub, ors = got
    assert starts.tolist() == bin_runs(b, int(bins.max(initial=0)) + 1).tolist()
    assert ub.tolist() == bins.tolist()
    want = [0] * len(runs)
    for j, (_, vals) in enumerate(runs):
        for x in vals:
            want[j] |= x & mask
    assert ors.dtype == np.uint64 and ors.tolist() == want
    if b.size:
        assert bin_runs(b[::-1].copy(), 100, or_of=v) is None or len(runs) == 1
    with pytest.raises(ValueError):
        bin_runs(b, 100, or_of=v.astype(np.float64))


# ---------------------------------------------------------------------------
# pack_records / unpack_records: numba vs numpy vs bit strings

@settings(max_examples=40, deadline=None)
@given(widths, st.lists(st.integers(0, 14), min_size=1, max_size=25), st.integers(1, 7),
       st.integers(0, 2**32 - 1), st.integers(1, 9), st.booleans())
def test_pack_records_three_ways(ws, counts, slots, seed, block, threads):
    rng = np.random.default_rng(seed)
    item, pos = [], 0
    for w in ws:
        item.append((pos, w))
        pos += w
    slot_bits = pos + int(rng.integers(0, 5))
    counts = np.array(counts)
    n = int(counts.sum())
    vals = [random_u64(rng, n, w) for _, w in item]
    m = (counts + slots - 1) // slots
    cum = np.cumsum(m) - m
    M = int(m.sum())
    start = np.cumsum(counts) - counts
    flat = np.repeat(cum * slots - start, counts) + np.arange(n)
    cf = (slots * slot_bits + int(rng.integers(0, 4)), 38)
    cont = random_u64(rng, M, 38)
    rbytes = (cf[0] + 38 + 7) // 8 + int(rng.integers(0, 2))
    out = rng.integers(0, 256, M * rbytes + 5, dtype=np.uint8)           # a recycled, dirty buffer
    ex = ThreadPoolExecutor(2) if threads else None
    try:
        lazy = [(lambda i0, i1, v=v: v[i0:i1]) if j % 2 else v for j, v in enumerate(vals)]
        got = pack_records(item, lazy, flat, M, slots, slot_bits, [cf], [cont], rbytes, block=block,
                           executor=ex, out=out)
    finally:
        if ex:
            ex.shutdown()
    ref = R.pack_records(item, vals, flat, M, slots, slot_bits, [cf], [cont], rbytes, block=block)
    assert got.shape == (M, rbytes)
    assert np.array_equal(got, ref)
    assert M == 0 or np.shares_memory(got, out)
    for r in range(M):
        fl, vl = [], []
        for i in np.flatnonzero(flat // slots == r):
            s = int(flat[i] % slots)
            for (o, w), v in zip(item, vals):
                fl.append((s * slot_bits + o, w))
                vl.append(v[i])
        fl.append(cf)
        vl.append(cont[r])
        assert bytes(got[r]) == ref_record(fl, vl, rbytes)
    # and back
    fields = dict(enumerate(item))
    sel = np.sort(rng.choice(M * slots, min(M * slots, 40), replace=False)) if M else np.zeros(0, np.int64)
    u = unpack_records(got, slots, slot_bits, fields, sel)
    u_np = R.unpack_records(got, slots, slot_bits, fields, sel, block=max(block, 1))
    u_all = unpack_records(got, slots, slot_bits, fields, flat)
    for j, (o, w) in fields.items():
        assert np.array_equal(u_all[j], vals[j])
        assert np.array_equal(u[j], u_np[j])
        for q, p in enumerate(sel.tolist()):
            rec, sl = divmod(p, slots)
            assert int(u[j][q]) == ref_field(bytes(got[rec]), sl * slot_bits + o, w)


def test_pack_records_values_taken_modulo_width():
    """Too wide values are cut to their width (as the C packer does), never spilling over."""
    item = [(0, 3), (3, 64), (67, 5)]
    vals = [np.array([MAXU64], np.uint64)] * 3
    got = pack_records(item, vals, np.array([0]), 1, 1, 72, [], [], 9)
    assert bytes(got[0]) == ref_record(item, [7, MAXU64, 31], 9)


def test_unpack_records_any_order_and_bounds():
    rng = np.random.default_rng(5)
    recs = rng.integers(0, 256, (7, 31), dtype=np.uint8)
    fields = {"a": (0, 64), "b": (64, 17), "z": (81, 0)}
    sel = np.array([20, 3, 3, 0, 13])                 # 3 slots of 81 bits per 31-byte record
    u = unpack_records(recs, 3, 81, fields, sel)
    for q, p in enumerate(sel.tolist()):
        r, s = divmod(p, 3)
        assert int(u["a"][q]) == ref_field(bytes(recs[r]), s * 81, 64)
        assert int(u["b"][q]) == ref_field(bytes(recs[r]), s * 81 + 64, 17)
        assert int(u["z"][q]) == 0
    with pytest.raises(ValueError):
        unpack_records(recs, 3, 81, fields, np.array([21]))
    with pytest.raises(ValueError):
        unpack_records(recs, 3, 81, {"a": (0, 90)}, np.array([0]))


# ---------------------------------------------------------------------------
# pack_soundings: coding + packing in one pass

ORDER = ("file", "line", "ping", "beam", "depth", "x_off", "y_off", "validity",
         "horizontal_error", "vertical_error")


def _sounding_layout(rng, n_attr):
    """PFM-like per-sounding layout: fields back to back, attributes before validity."""
    w = {"file": int(rng.integers(0, 15)), "line": int(rng.integers(1, 16)), "ping": int(rng.integers(1, 33)),
         "beam": int(rng.integers(1, 17)), "depth": int(rng.integers(18, 33)),
         "x_off": int(rng.integers(1, 17)), "y_off": int(rng.integers(1, 17)),
         "validity": int(rng.integers(1, 24)), "horizontal_error": int(rng.integers(0, 20)),
         "vertical_error": int(rng.integers(0, 20))}
    keys = list(ORDER[:7]) + [("attr", i) for i in range(n_attr)] + list(ORDER[7:])
    for i in range(n_attr):
        w[("attr", i)] = int(rng.integers(1, 20))
    fields, pos = {}, 0
    for k in keys:
        fields[k] = (pos, w[k])
        pos += w[k]
    return fields, pos


def _errors(rng, n, bits, scale):
    e = rng.uniform(-0.5, (2**bits) / scale * 1.2, n).round(2)
    special = [np.nan, -1.0, 0.0, -0.0, 1e300, np.inf, -np.inf, (2**bits - 1) / scale, 0.005, 0.015]
    k = min(n, len(special))
    e[:k] = special[:k]
    return e


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 20), min_size=1, max_size=30), st.integers(1, 8), st.integers(0, 2),
       st.integers(0, 2**32 - 1), st.booleans(), st.booleans())
def test_pack_soundings_matches_reference(counts, slots, n_attr, seed, f32_errors, threads):
    rng = np.random.default_rng(seed)
    fields, single = _sounding_layout(rng, n_attr)
    counts = np.array(counts)
    n = int(counts.sum())
    start = np.cumsum(counts) - counts
    # some soundings of each bin went to old tails: the new records hold the rest
    fill = np.minimum(rng.integers(0, 3, counts.size), counts)
    rem = counts - fill
    m = (rem + slots - 1) // slots
    rec0 = np.cumsum(m) - m
    M = int(m.sum())
    offset, scale = float(rng.choice([10000.0, 1000.0, 123.4])), float(rng.choice([100.0, 1000.0, 33.3]))
    hs, vs = float(rng.choice([100.0, 1000.0, 3.3])), float(rng.choice([100.0, 10.0]))
    hb, vb = fields["horizontal_error"][1], fields["vertical_error"][1]
    dbits = fields["depth"][1]
    zmax = min((2**dbits - 1) / f32(scale) - f32(offset), 11000.0)
    z = rng.uniform(-f32(offset), zmax, n)
    z[: min(n, 2)] = [-f32(offset), zmax][: min(n, 2)]
    z[2:6] = np.round(z[2:6], 2) + 0.005            # halfway cases of the code rounding
    z = np.clip(z, -f32(offset), zmax)
    values = {k: random_u64(rng, n, w) for k, (_, w) in fields.items()
              if k not in ("depth", "horizontal_error", "vertical_error")}
    for k, v in values.items():                     # integer fields come in any integer type
        w = fields[k][1]
        choice = [np.uint64, np.int64] + ([np.uint32, np.int32, ">u4"] if w <= 31 else []) \
            + ([np.uint16, np.int16] if w <= 15 else [])
        values[k] = v.astype(choice[int(rng.integers(0, len(choice)))])
    if rng.random() < 0.3:                          # float32 depths are widened to double
        z = np.clip(z, -f32(offset) + 1.0, zmax - 1.0).astype(np.float32).astype(np.float64)
        values["depth"] = z.astype(np.float32)
    else:
        values["depth"] = z
    values["horizontal_error"] = _errors(rng, n, hb, hs)
    values["vertical_error"] = _errors(rng, n, vb, vs)
    if f32_errors:
        with np.errstate(over="ignore"):
            values["horizontal_error"] = values["horizontal_error"].astype(np.float32)
    coding = SoundingCoding(f32(offset), f32(scale), f32(hs), (1 << hb) - 1, f32(vs), (1 << vb) - 1)
    cpos = slots * single + int(rng.integers(0, 3))
    cbase = int(rng.integers(0, 10**9))
    rbytes = (cpos + 38 + 7) // 8
    out = rng.integers(0, 256, M * rbytes + 3, dtype=np.uint8)
    ex = ThreadPoolExecutor(2) if threads else None
    try:
        got = pack_soundings(fields, values, coding, start + fill, rem, rec0, M, slots, single,
                             (cpos, 38), cbase, rbytes, executor=ex, out=out, block=2)
    finally:
        if ex:
            ex.shutdown()
    assert got.shape == (M, rbytes)
    for g in range(counts.size):
        for j in range(m[g]):
            r = rec0[g] + j
            fl, vl = [], []
            for s in range(min(slots, rem[g] - j * slots)):
                i = start[g] + fill[g] + j * slots + s
                for k, (o, w) in fields.items():
                    if k == "depth":
                        v = ref_depth_code(float(z[i]), offset, scale)
                    elif k == "horizontal_error":
                        v = ref_error_code(float(values[k][i]), hs, hb) if hb else 0
                    elif k == "vertical_error":
                        v = ref_error_code(float(values[k][i]), vs, vb) if vb else 0
                    else:
                        v = int(values[k][i])
                    fl.append((s * single + o, w))
                    vl.append(v)
            fl.append((cpos, 38))
            vl.append(0 if j == m[g] - 1 else cbase + (r + 1) * rbytes)
            assert bytes(got[r]) == ref_record(fl, vl, rbytes), (g, j)
    # and the numpy path the store used before: codes made by numpy, packed by the numpy reference
    from pfm_dask._numeric import scaled_code_f64

    sel = np.concatenate([np.arange(a, a + c) for a, c in zip(start + fill, rem)]).astype(np.int64)
    flat = np.repeat(rec0 * slots, rem) + (np.arange(sel.size) - np.repeat(np.cumsum(rem) - rem, rem))
    codes = []
    for k, (o, w) in fields.items():
        if k == "depth":
            v = scaled_code_f64(z[sel], offset, scale).astype(np.uint64)
        elif k in ("horizontal_error", "vertical_error"):
            sc, b = (hs, hb) if k == "horizontal_error" else (vs, vb)
            with np.errstate(over="ignore"):
                v = (R.error_codes(values[k][sel], b, sc) if b
                     else np.zeros(sel.size, np.uint64))
        else:
            v = values[k][sel].astype(np.uint64)
        codes.append(v)
    last = np.zeros(M, bool)
    last[(rec0 + m - 1)[m > 0]] = True
    cont = np.where(last, 0, cbase + (np.arange(M) + 1) * rbytes).astype(np.uint64)
    ref = R.pack_records(list(fields.values()), codes, flat, M, slots, single, [(cpos, 38)], [cont],
                                rbytes, block=7)
    assert np.array_equal(got, ref)


def test_pack_soundings_sink_gives_the_same_bytes():
    """Chunks handed to a sink (from several threads, any order) assemble to the returned matrix."""
    rng = np.random.default_rng(4)
    fields, single = _sounding_layout(rng, 1)
    counts = rng.integers(0, 40, 700)
    n = int(counts.sum())
    values = {k: random_u64(rng, n, w) for k, (_, w) in fields.items()}
    values["depth"] = rng.uniform(0.0, 100.0, n)
    values["horizontal_error"] = rng.uniform(0.0, 1.0, n)
    values["vertical_error"] = rng.uniform(0.0, 1.0, n)
    m = (counts + 5) // 6
    rec0 = np.cumsum(m) - m
    M = int(m.sum())
    rbytes = (6 * single + 38 + 7) // 8
    coding = SoundingCoding(10.0, 100.0, 100.0, (1 << fields["horizontal_error"][1]) - 1, 100.0,
                            (1 << fields["vertical_error"][1]) - 1)
    args = (fields, values, coding, np.cumsum(counts) - counts, counts, rec0, M, 6, single, (6 * single, 38),
            777, rbytes)
    ref = pack_soundings(*args)
    got = np.zeros(M * rbytes, np.uint8)
    seen = []

    def sink(off, data):
        got[off:off + len(data)] = data
        seen.append((off, len(data)))

    with ThreadPoolExecutor(2) as ex:
        assert pack_soundings(*args, executor=ex, sink=sink, chunk_bytes=3 * rbytes + 1, block=16) is None
    assert np.array_equal(got, ref.reshape(-1))
    seen.sort()
    assert sum(length for _, length in seen) == M * rbytes
    assert all(a + la == b for (a, la), (b, _) in zip(seen, seen[1:]))      # no overlaps, no holes

    # with a pool of buffers the sink keeps each chunk (as the store's write-behind thread
    # does) and gives its buffer back only later: no chunk is packed over one still held
    from pfm_dask.pfm._io import BufferPool

    pool = BufferPool(3 * rbytes + 1, 3)
    held = []
    got2 = np.zeros(M * rbytes, np.uint8)

    def keeping_sink(off, data):
        held.append((off, data))
        if len(held) == 2:                   # write and give back the oldest of two held
            o, d = held.pop(0)
            got2[o:o + len(d)] = d
            pool.put(d.base)

    assert pack_soundings(*args, sink=keeping_sink, chunk_bytes=3 * rbytes + 1, block=16,
                          buffers=pool) is None
    for o, d in held:
        got2[o:o + len(d)] = d
    assert np.array_equal(got2, ref.reshape(-1))


def test_pack_soundings_codes_like_the_store():
    """Depth and error codes equal the numpy coding rules (scaled_code_f64,
    bitpack_reference.error_codes)."""

    rng = np.random.default_rng(11)
    n = 200_000
    z = np.round(rng.uniform(-100.0, 9000.0, n), 3)
    z[::7] = np.round(z[::7], 2) + 0.005
    herr = rng.uniform(-1, 45, n)
    herr[::11] = np.nan
    herr[::13] = np.round(herr[::13], 2) + 0.005
    fields = {"depth": (0, 32), "horizontal_error": (32, 12), "validity": (44, 1)}
    coding = SoundingCoding(f32(10000.0), f32(100.0), f32(100.0), 4095, 1.0, 0)
    got = pack_soundings(fields, {"depth": z, "horizontal_error": herr, "validity": np.zeros(n, np.uint64)},
                         coding, np.array([0]), np.array([n]), np.array([0]), n, 1, 45, (45, 35), 0, 10)
    u = unpack_records(got, 1, 45, {"depth": (0, 32), "herr": (32, 12)}, np.arange(n))
    from pfm_dask._numeric import scaled_code_f64
    assert np.array_equal(u["depth"], scaled_code_f64(z, 10000.0, 100.0).astype(np.uint64))
    assert np.array_equal(u["herr"], R.error_codes(herr, 12, 100.0))


def test_pack_soundings_rejects_bad_layouts():
    one = {"file": np.zeros(2, np.uint64)}
    kw = dict(coding=SoundingCoding(0.0, 1.0, 1.0, 0, 1.0, 0), first=np.array([0]), count=np.array([2]),
              rec0=np.array([0]), n_records=1, slots=2, slot_bits=8, cont_base=0, record_bytes=4)
    with pytest.raises(ValueError):                    # continuation inside the slots
        pack_soundings({"file": (0, 8)}, one, cont_field=(8, 8), **kw)
    with pytest.raises(ValueError):                    # item wider than its slot
        pack_soundings({"file": (0, 9)}, one, cont_field=(18, 8), **kw)
    with pytest.raises(ValueError):                    # records not covering 0..n_records-1
        pack_soundings({"file": (0, 8)}, one, cont_field=(16, 8), **{**kw, "n_records": 2})
    with pytest.raises(ValueError):                    # no field at all
        pack_soundings({"file": (0, 0)}, one, cont_field=(16, 8), **kw)
    two = dict(kw, first=np.array([0, 1]), count=np.array([1, 1]), n_records=2)
    for rec0 in ([1, 2], [0, 2], [0, 0]):              # runs not from 0, with a gap, overlapping
        with pytest.raises(ValueError):
            pack_soundings({"file": (0, 8)}, one, cont_field=(16, 8), **{**two, "rec0": np.array(rec0)})
    with pytest.raises(ValueError):                    # a negative count
        pack_soundings({"file": (0, 8)}, one, cont_field=(16, 8),
                       **{**two, "count": np.array([3, -1]), "rec0": np.array([0, 2])})
    got = pack_soundings({"file": (0, 8)}, one, cont_field=(16, 8), **{**two, "rec0": np.array([0, 1])})
    assert bytes(got[0]) == b"\x00\x00\x00\x00" and got.shape == (2, 4)
    got = pack_soundings({"file": (0, 8)}, {"file": np.array([1, 2])}, cont_field=(16, 16), **kw)
    assert bytes(got[0]) == b"\x01\x02\x00\x00"


# ---------------------------------------------------------------------------
# compile cache: a read-only package directory must not break (or warn)

def test_kernels_work_without_a_writable_cache(tmp_path):
    """With no writable cache directory anywhere numba would raise at decoration; we fall back."""
    pkg = tmp_path / "ro_pkg"
    src = Path(B.__file__).resolve().parents[1]
    shutil.copytree(src, pkg / "pfm_dask", ignore=shutil.ignore_patterns("__pycache__"))
    for d in [p for p in (pkg / "pfm_dask").rglob("*") if p.is_dir()] + [pkg / "pfm_dask"]:
        (d / "__pycache__").write_text("not a directory")      # in-tree cache impossible
    blocker = tmp_path / "cache_is_a_file"
    blocker.write_text("")
    code = textwrap.dedent("""
        import warnings
        import numpy as np
        from pfm_dask.pfm import _bitpack as B, _bitpack_kernels as K
        warnings.simplefilter("error")       # numba is imported, the kernels compiled, from here
        import numba  # noqa: F401  (records are then packed and read by the kernels)
        B.load_kernels(["to_words", "from_words", "unpack_words"])
        assert {type(k._cache).__name__ for k in K._kernel.compiled.values()} == {"NullCache"}
        lay = B.BitLayout([("a", 3, 20), ("b", 23, 41)])
        recs = lay.pack({"a": np.array([5, 2**20 - 1]), "b": np.array([7, 2**41 - 1])})
        u = lay.unpack(recs)
        assert u["a"].tolist() == [5, 2**20 - 1] and u["b"].tolist() == [7, 2**41 - 1]
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(pkg), XDG_CACHE_HOME=str(blocker / "x"), HOME=str(blocker / "y"),
               PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "ok"
    assert "Warning" not in r.stderr


def test_load_kernels():
    assert B.load_kernels() >= 0.0
    assert set(K._kernel.compiled) == set(K._KERNEL_NAMES)
    assert _runs.load_kernels() >= 0.0
    assert set(RK._kernel.compiled) == set(RK._signatures(__import__("numba").types))


@settings(max_examples=40, deadline=None)
@given(widths, st.integers(0, 2**32 - 1), st.integers(0, 8))
def test_pack_items_at_bits_in_place(ws, seed, n):
    """Items starting at any bit of a dirty buffer (as soundings filling the free slots of tail
    records): the given fields replaced, zero-width ones ignored, all other bits kept."""
    rng = np.random.default_rng(seed)
    fields, pos = [], 0
    for i, w in enumerate(ws):
        fields.append((i, pos, w))
        pos += w + int(rng.integers(0, 3))
    lay = BitLayout(fields)
    item_bits = max(pos, 1)
    bases = np.sort(rng.choice(np.arange(0, 8 * item_bits + 1, item_bits), n, replace=False)) + \
        int(rng.integers(0, 8)) if n else np.zeros(0, np.int64)
    buf = rng.integers(0, 256, (int(bases.max()) + item_bits + 7) // 8 + int(rng.integers(0, 3))
                       if n else 2, dtype=np.uint8)
    before = buf.copy()
    keys = [k for k, _, w in fields if rng.random() < 0.7]
    vals = np.stack([random_u64(rng, n, max(fields[k][2], 1)) for k in keys]) if keys else \
        np.zeros((0, n), np.uint64)
    lay.pack_items_at_bits(buf, bases, keys, vals)
    expect = list("".join(format(x, "08b") for x in before.tobytes()))
    for j, b in enumerate(bases.tolist()):
        for i, k in enumerate(keys):
            _, off, w = fields[k]
            if w:
                expect[b + off: b + off + w] = format(int(vals[i, j]) & ((1 << w) - 1), f"0{w}b")
    assert "".join(format(x, "08b") for x in buf.tobytes()) == "".join(expect)
    if n and keys and any(fields[k][2] for k in keys):
        with pytest.raises(ValueError):
            lay.pack_items_at_bits(buf, np.array([buf.size * 8]), keys, vals[:, :1])


def test_kernels_and_helpers_compiled_without_refcounting():
    """The per-field helpers take arrays; with numba's reference counting on, every call
    adds two atomic operations (measured 4-5x the cost of unpacking a field). The kernels
    allocate nothing, so they are compiled without it where numba offers the switch."""
    import numba

    from pfm_dask._numeric import _refcount_switch

    if not _refcount_switch(numba):
        pytest.skip(f"numba {numba.__version__} has no _nrt option")
    for mod, names in ((K, K._KERNEL_NAMES), (RK, RK._signatures(numba.types))):
        for name in names:
            assert mod._kernel(name).targetoptions.get("_nrt") is False, name
        for h in mod._HELPERS:
            assert getattr(mod, h).targetoptions.get("_nrt") is False, h


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31), st.sampled_from([np.uint16, np.uint32, np.int64]), st.booleans(),
       st.integers(1, 3))
def test_fill_slots_matches_a_bit_by_bit_reference(seed, int_type, f32_floats, n_attr):
    """Soundings put into free slots of existing records (random bytes everywhere else, which
    must survive) equal a Python-integer reference, with the numpy coding rules for depth and
    errors; mixed integer types, float32 or float64 values, NaN and negative errors."""
    from pfm_dask._numeric import scaled_code_f64
    from pfm_dask.pfm._bitpack_soundings import fill_slots

    rng = np.random.default_rng(seed)
    widths = {"file": 9, "line": 13, "ping": 18, "beam": 9, "depth": 22, "x_off": 12, "y_off": 12,
              "validity": 23, "horizontal_error": 12, "vertical_error": 17}
    fields, at = {}, 0
    for k, w in widths.items():
        fields[k] = (at, w)
        at += w
    for a in range(n_attr):
        fields[("attr", a)] = (at, 7)
        at += 7
    slot_bits, slots = at + 3, 6
    rbytes = (slot_bits * slots + 38 + 7) // 8
    n_rec, n = 40, 500
    buf = rng.integers(0, 256, n_rec * rbytes, dtype=np.uint8)
    before = buf.copy()
    ft = np.float32 if f32_floats else np.float64
    vals = {k: rng.integers(0, 2**w, n).astype(int_type if w <= 16 or int_type != np.uint16 else np.uint32)
            for k, w in widths.items() if k not in ("depth", "horizontal_error", "vertical_error")}
    vals["depth"] = np.round(rng.uniform(-5.0, 3000.0, n), 2).astype(ft)
    herr = rng.uniform(-1.0, 50.0, n)
    herr[::9] = np.nan
    vals["horizontal_error"] = herr.astype(ft)
    vals["vertical_error"] = rng.uniform(0.0, 2000.0, n).astype(ft)
    for a in range(n_attr):
        vals[("attr", a)] = rng.integers(0, 128, n)
    coding = SoundingCoding(f32(10.0), f32(1000.0), f32(100.0), 4095, f32(100.0), 2**17 - 1)
    rows = rng.choice(n_rec, 25, replace=False)
    slot0 = rng.integers(0, slots, rows.size)
    count = np.minimum(rng.integers(0, 4, rows.size), slots - slot0)
    first = np.cumsum(count) - count + rng.integers(0, 5)
    fill_slots(buf, rbytes, slots, slot_bits, fields, vals, coding, rows, slot0, first, count)

    codes = dict(vals)
    codes["depth"] = scaled_code_f64(vals["depth"].astype(np.float64), 10.0, 1000.0)
    codes["horizontal_error"] = R.error_codes(vals["horizontal_error"], 12, 100.0)
    codes["vertical_error"] = R.error_codes(vals["vertical_error"], 17, 100.0)
    want = before.copy()
    nbits = rbytes * 8
    for r, s0, f0, c in zip(rows.tolist(), slot0.tolist(), first.tolist(), count.tolist()):
        rec = int.from_bytes(bytes(want[r * rbytes:(r + 1) * rbytes]), "big")
        for t in range(c):
            base = (s0 + t) * slot_bits
            rec &= ~(((1 << slot_bits) - 1) << (nbits - base - slot_bits))      # the slot emptied
            for k, (off, w) in fields.items():
                v = int(codes[k][f0 + t]) & ((1 << w) - 1)
                rec |= v << (nbits - base - off - w)
        want[r * rbytes:(r + 1) * rbytes] = np.frombuffer(rec.to_bytes(rbytes, "big"), np.uint8)
    assert np.array_equal(buf, want)
    # the same records at byte positions ``at`` of a buffer with gaps (a read span's), in place
    pos = 3 + np.arange(n_rec) * (rbytes + 5)
    span = rng.integers(0, 256, int(pos[-1]) + rbytes + 4, dtype=np.uint8)
    span_want = span.copy()
    for r in range(n_rec):
        span[pos[r]:pos[r] + rbytes] = before[r * rbytes:(r + 1) * rbytes]
        span_want[pos[r]:pos[r] + rbytes] = want[r * rbytes:(r + 1) * rbytes]
    fill_slots(span, rbytes, slots, slot_bits, fields, vals, coding, None, slot0, first, count,
               at=pos[rows])
    assert np.array_equal(span, span_want)


def test_packer_depth_check_equals_the_numpy_rule():
    """A depth passes the packer's own check exactly when NINT((z + offset) * scale), computed
    in double as the library does, lies in 0 .. depth_code_max: depths at both edges (a
    hair either side of half a code), NaN and infinities, float32 and float64."""
    from pfm_dask._numeric import scaled_code_f64
    from pfm_dask.pfm._bitpack_soundings import CHECK_SIZE, check_failures

    off, scale, cmax = f32(10.0), f32(100.0), 1_200_000
    coding = SoundingCoding(off, scale, 100.0, 4095, 100.0, 4095, cmax)
    lo_edge = -off - 0.5 / scale            # code -0.5 -> NINT -1: out
    hi_edge = (cmax + 0.5) / scale - off    # code cmax + 0.5 -> NINT cmax + 1: out
    zs = [lo_edge, hi_edge, float("nan"), float("inf"), float("-inf"), 0.0, -off]
    for e in (lo_edge, hi_edge):
        zs += list(np.nextafter(e, np.inf) + np.arange(-3, 4) * np.spacing(e))
        zs += list(e + np.linspace(-2e-6, 2e-6, 9))
    fields = {"depth": (0, 32), "validity": (32, 1)}
    for dtype in (np.float64, np.float32):
        for z in np.array(zs, dtype=dtype):
            z64 = np.float64(z)
            c = scaled_code_f64(z64, off, scale)
            want_ok = bool(np.isfinite(z64) and 0 <= c <= cmax)
            check = np.zeros(CHECK_SIZE, np.uint64)
            pack_soundings(fields, {"depth": np.array([z]), "validity": np.zeros(1, np.uint8)}, coding,
                           np.array([0]), np.array([1]), np.array([0]), 1, 1, 33, (33, 31), 0, 8,
                           check=check)
            assert (check_failures(check, fields) == []) == want_ok, (dtype, float(z), int(c))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tails_clean_matches_the_numpy_rule(seed):
    """A tail record is clean (restored by clearing its bits from ``keep`` on) exactly as the
    numpy rule the undo log used says: records with bits past ``keep``, all-zero records,
    ``keep`` on and off byte boundaries and past the last byte."""
    from pfm_dask.pfm._bitpack import tails_clean

    rng = np.random.default_rng(seed)
    n, size = 500, 27
    recs = rng.integers(0, 256, (n, size)).astype(np.uint8)
    keep = rng.integers(0, 8 * size + 9, n)
    for j in range(n):                       # most records clean past keep, as the store's
        if rng.random() < 0.6:
            b = keep[j] >> 3
            if b < size:
                recs[j, b] &= np.uint8((0xFF00 >> (keep[j] & 7)) & 0xFF)
                recs[j, b + 1:] = 0
    recs[::17] = 0
    byte0 = keep >> 3
    part = recs[np.arange(n), np.minimum(byte0, size - 1)] & ((1 << (8 - (keep & 7))) - 1)
    last = size - 1 - np.argmax(recs[:, ::-1] != 0, axis=1)
    want = (part == 0) & (last <= byte0)
    assert want.any() and not want.all()
    assert np.array_equal(tails_clean(recs, keep), want)
    # in place, at byte positions of a buffer with gaps (a read span's)
    pos = 7 + np.arange(n) * (size + 3)
    span = np.full(int(pos[-1]) + size + 2, 0xFF, dtype=np.uint8)
    for j in range(n):
        span[pos[j]:pos[j] + size] = recs[j]
    assert np.array_equal(tails_clean((span, size), keep, at=pos), want)


def test_undo_bookkeeping_kernels_match_plain_loops():
    """The undo log's record helpers against loops over Python ints: which records still need a
    pre-image (below the limit, bit clear; no map: all below the limit), marking them, which
    records in a buffer hold a non-zero byte, and gathering them end to end."""
    from pfm_dask.pfm._runs import gather_rows, mark_records, records_needed, rows_nonzero

    rng = np.random.default_rng(7)
    size, limit = 13, 13 * 400
    bits = np.zeros(limit // size // 8 + 2, dtype=np.uint8)
    seen: set[int] = set()
    for _ in range(4):
        off = np.sort(rng.choice(460, 120, replace=False)) * size
        want = [o < limit and o // size not in seen for o in off.tolist()]
        assert records_needed(off, size, limit, bits).tolist() == want
        assert records_needed(off, size, limit, None).tolist() == [o < limit for o in off.tolist()]
        kept = off[np.array(want, dtype=bool)]
        mark_records(bits, kept, size)
        seen |= {o // size for o in kept.tolist()}
        ref = [int(c) for c in "".join(format(x, "08b") for x in bits.tobytes())]
        assert {i for i, v in enumerate(ref) if v} == seen
    buf = rng.integers(0, 256, 3000, dtype=np.uint8)
    pos = np.sort(rng.choice(3000 - size, 90, replace=False))
    for p in pos[::3].tolist():
        buf[p:p + size] = 0
    got = rows_nonzero(buf, pos, size)
    assert got.tolist() == [any(buf[p:p + size]) for p in pos.tolist()]
    assert not got.all() and got.any()
    out = np.empty(pos.size * size, dtype=np.uint8)
    gather_rows(buf, pos, size, out)
    assert out.tobytes() == b"".join(buf[p:p + size].tobytes() for p in pos.tolist())


def test_read_parts_leaves_out_zero_runs_at_span_ends_and_long_ones_inside():
    """read_parts against a loop over records: a span's parts to read are its records less the
    runs known zero at either end and those of at least min_skip records inside it."""
    from pfm_dask.pfm._runs import read_parts

    rng = np.random.default_rng(3)
    size, base, nrec = 5, 100, 3000
    zero = rng.random(nrec) < 0.5
    zero[200:260] = True                    # long runs inside spans
    zero[1000:1003] = True
    bits = np.packbits(zero)
    # spans: consecutive record ranges, laid end to end in a buffer
    cuts = np.sort(rng.choice(np.arange(1, nrec), 40, replace=False))
    a_, b_ = np.r_[0, cuts], np.r_[cuts, nrec]
    lo = base + a_ * size
    ln = (b_ - a_) * size
    at = np.cumsum(ln) - ln
    for min_skip in (1, 4, 50):
        want = []
        for a, b, p in zip(a_.tolist(), b_.tolist(), at.tolist()):
            i, start = a, a
            while i < b:
                if zero[i]:
                    j = i
                    while j < b and zero[j]:
                        j += 1
                    if j - i >= min_skip or i == a or j == b:
                        if i > start:
                            want.append((base + start * size, (i - start) * size, p + (start - a) * size))
                        start = j
                    i = j
                else:
                    i += 1
            if b > start:
                want.append((base + start * size, (b - start) * size, p + (start - a) * size))
        got = read_parts(lo, ln, at, base, size, bits, min_skip)
        assert list(zip(*(g.tolist() for g in got))) == want
    with pytest.raises(ValueError):
        read_parts(lo + 1, ln, at, base, size, bits, 4)


@pytest.mark.parametrize("seed", [0, 1])
def test_update_bin_records_matches_unpack_numpy_and_pack(seed):
    """The writer's one-pass bin record update against what it replaced, computed with Python
    integers: count, validity OR'd and masked, head set only for bins that were empty, tail
    only for bins given new records; every other bit of the records and the gaps between them
    (a read span's buffer) kept."""
    from pfm_dask.pfm._bitpack import update_bin_records

    rng = np.random.default_rng(seed)
    widths = [("num_soundings", 19), ("std", 11), ("validity", 23), ("head", 37), ("x", 5),
              ("tail", 37), ("avg", 25)]
    fields, pos = [], 3
    for k, w in widths:
        fields.append((k, pos, w))
        pos += w
    lay = BitLayout(fields)
    size, n = lay.record_bytes, 300
    at = 2 + np.arange(n) * (size + 4)
    buf = rng.integers(0, 256, int(at[-1]) + size + 5, dtype=np.uint8)
    cur = lay.unpack_at(buf, at, ["num_soundings", "validity", "head", "tail"])
    cur["num_soundings"][::3] = 0
    lay.pack_at(buf, at, {"num_soundings": cur["num_soundings"]})
    before = buf.copy()
    total = rng.integers(1, 1 << 19, n)
    vor = rng.integers(0, 1 << 23, n).astype(np.uint64)
    first_new = rng.integers(0, 1 << 37, n)
    last_new = rng.integers(0, 1 << 37, n)
    m = rng.integers(0, 3, n)
    mask = ((1 << 23) - 1) & ~0x40
    update_bin_records(lay, buf, at, cur, total, vor, mask, first_new, last_new, m)
    want = before.copy()
    for j in range(n):
        c0 = int(cur["num_soundings"][j])
        new = {"num_soundings": int(total[j]),
               "validity": (int(cur["validity"][j]) | int(vor[j])) & mask,
               "head": int(first_new[j]) if c0 == 0 else int(cur["head"][j]),
               "tail": int(last_new[j]) if m[j] > 0 else int(cur["tail"][j])}
        rec = int.from_bytes(bytes(want[at[j]:at[j] + size]), "big")
        for k, off, w in fields:
            if k in new:
                sh = size * 8 - off - w
                rec = (rec & ~(((1 << w) - 1) << sh)) | (new[k] << sh)
        want[at[j]:at[j] + size] = np.frombuffer(rec.to_bytes(size, "big"), np.uint8)
    assert np.array_equal(buf, want)
