"""Vectorised bit packing against a slow reference that builds '0'/'1' strings per field."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfm_dask.pfm._bitpack import BitLayout, pack_records, unpack_records

from .bitpack_reference import pack_lanes, place_lanes


def ref_record(fields, values, nbytes):
    """Bits of one record, MSB first, written field by field as text (the obvious way)."""
    bits = ["0"] * (nbytes * 8)
    for (off, nb), v in zip(fields, values):
        if nb:
            bits[off:off + nb] = format(int(v), f"0{nb}b")
    s = "".join(bits)
    return bytes(int(s[i:i + 8], 2) for i in range(0, len(s), 8))


def ref_field(record: bytes, off: int, nb: int) -> int:
    if nb == 0:
        return 0
    s = "".join(format(x, "08b") for x in record)
    return int(s[off:off + nb], 2)


layouts = st.lists(st.integers(0, 64), min_size=1, max_size=12).flatmap(
    lambda widths: st.tuples(st.just(widths), st.lists(st.integers(0, 9), min_size=len(widths),
                                                        max_size=len(widths))))


def _layout(widths, gaps):
    fields, pos = [], 0
    for i, (w, g) in enumerate(zip(widths, gaps)):
        pos += g
        fields.append((i, pos, w))
        pos += w
    return fields


@settings(max_examples=60, deadline=None)
@given(layouts, st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_pack_unpack_matches_reference(spec, n, seed):
    widths, gaps = spec
    fields = _layout(widths, gaps)
    lay = BitLayout(fields)
    rng = np.random.default_rng(seed)
    vals = {}
    for key, _, w in fields:
        v = rng.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, n, dtype=np.uint64)
        vals[key] = v & np.uint64((1 << w) - 1) if w < 64 else v
        vals[key][0] = (1 << w) - 1 if w else 0          # maximum value of every field
    recs = lay.pack(vals)
    assert recs.shape == (n, lay.record_bytes)
    for r in range(n):
        expect = ref_record([(o, w) for _, o, w in fields], [vals[k][r] for k, _, _ in fields],
                            lay.record_bytes)
        assert bytes(recs[r]) == expect
    got = lay.unpack(recs)
    for key, off, w in fields:
        for r in range(n):
            assert int(got[key][r]) == ref_field(bytes(recs[r]), off, w)


@settings(max_examples=40, deadline=None)
@given(layouts, st.integers(0, 2**32 - 1))
def test_repack_overwrites_only_given_fields(spec, seed):
    widths, gaps = spec
    fields = _layout(widths, gaps)
    lay = BitLayout(fields)
    rng = np.random.default_rng(seed)
    n = 4
    # start from random garbage bytes: gaps between fields must survive too
    recs = rng.integers(0, 256, (n, lay.record_bytes), dtype=np.uint8)
    before = [bytes(r) for r in recs]
    change = [k for k, _, w in fields if w and k % 2 == 0]
    new = {k: rng.integers(0, 2**62, n, dtype=np.uint64) % np.uint64(1 << min(62, fields[k][2]))
           for k in change}
    lay.pack(new, out=recs)
    for r in range(n):
        bits_before = "".join(format(x, "08b") for x in before[r])
        bits_after = "".join(format(x, "08b") for x in bytes(recs[r]))
        expect = list(bits_before)
        for k in change:
            _, off, w = fields[k]
            expect[off:off + w] = format(int(new[k][r]), f"0{w}b")
        assert bits_after == "".join(expect)


def test_rows_and_transposed_words():
    lay = BitLayout([("a", 3, 20), ("b", 23, 38), ("c", 61, 7)])
    words = np.zeros((5, lay.n_words), dtype=np.uint64)
    lay.pack_words(words, {"a": np.array([7, 9]), "b": np.array([2**38 - 1, 5])}, rows=np.array([1, 3]))
    wt = np.zeros((lay.n_words, 5), dtype=np.uint64)
    lay.pack_words(wt, {"a": np.array([0, 7, 0, 9, 0]), "b": np.array([0, 2**38 - 1, 0, 5, 0])},
                   transposed=True)
    assert np.array_equal(words, wt.T)
    got = lay.unpack_words(wt, transposed=True)
    assert got["b"].tolist() == [0, 2**38 - 1, 0, 5, 0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 14), min_size=1, max_size=30), st.integers(1, 7),
       st.integers(0, 2**32 - 1))
def test_pack_records_matches_reference(counts, slots, seed):
    """Items of several groups, each group in its own run of records (the .ndx layout)."""
    rng = np.random.default_rng(seed)
    item = [(0, 14), (14, 15), (29, 32), (61, 16), (77, 22), (99, 12), (111, 12), (123, 23),
            (146, 0), (146, 12), (158, 17)]
    item_bits = 175
    counts = np.array(counts)
    n = int(counts.sum())
    vals = [rng.integers(0, 1 << b, n, dtype=np.uint64) if b else np.zeros(n, np.uint64)
            for _, b in item]
    if n:
        for v, (_, b) in zip(vals, item):
            v[0] = (1 << b) - 1 if b else 0
    m = (counts + slots - 1) // slots
    cum = np.cumsum(m) - m
    M = int(m.sum())
    start = np.cumsum(counts) - counts
    flat = np.repeat(cum * slots - start, counts) + np.arange(n)
    cont = rng.integers(0, 2**38, M, dtype=np.uint64)
    rbits = slots * item_bits + 38
    rbytes = (rbits + 7) // 8
    got = pack_records(item, vals, flat, M, slots, item_bits, [(slots * item_bits, 38)], [cont],
                       rbytes, block=3)
    assert got.shape == (M, rbytes)
    for r in range(M):
        fields, values = [], []
        for i in np.flatnonzero(flat // slots == r):
            s = int(flat[i] % slots)
            for (o, b), v in zip(item, vals):
                fields.append((s * item_bits + o, b))
                values.append(v[i])
        fields.append((slots * item_bits, 38))
        values.append(cont[r])
        assert bytes(got[r]) == ref_record(fields, values, rbytes)


def test_lanes_roundtrip_simple():
    fields = [(0, 64), (64, 1), (65, 63), (128, 5)]
    vals = [np.array([2**64 - 1, 1], dtype=np.uint64), np.array([1, 0], dtype=np.uint64),
            np.array([3, 2**63 - 1], dtype=np.uint64), np.array([31, 0], dtype=np.uint64)]
    lanes = pack_lanes(fields, vals, 2)
    assert lanes.shape == (3, 2)
    words = np.zeros((5, 1), dtype=np.uint64)                      # 2 slots x 133 bits fit in 5 words
    place_lanes(lanes[:, :1], np.array([1]), 1, 2, 133, words)   # item 0 into slot 1
    rec = words[:, 0].astype(">u8").tobytes()
    expect = ref_record([(133 + o, b) for o, b in fields], [v[0] for v in vals], 40)
    assert rec == expect


def test_bad_layout_rejected():
    with pytest.raises(ValueError):
        BitLayout([("a", 0, 65)])


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 64), min_size=1, max_size=8), st.integers(1, 7), st.integers(1, 40),
       st.integers(0, 2**32 - 1))
def test_unpack_records_matches_reference(widths, slots, n_rec, seed):
    rng = np.random.default_rng(seed)
    item = []
    pos = 0
    for w in widths:
        item.append((pos, w))
        pos += w
    item_bits = max(pos, 1)
    rbytes = (slots * item_bits + 38 + 7) // 8
    recs = rng.integers(0, 256, (n_rec, rbytes), dtype=np.uint8)
    select = np.sort(rng.choice(n_rec * slots, rng.integers(0, n_rec * slots + 1), replace=False))
    got = unpack_records(recs, slots, item_bits, dict(enumerate(item)), select)
    for j, p in enumerate(select.tolist()):
        r, sl = divmod(p, slots)
        for i, (o, w) in enumerate(item):
            assert int(got[i][j]) == ref_field(bytes(recs[r]), sl * item_bits + o, w)


def test_pack_records_threads_and_callables_same_bytes():
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(3)
    counts = rng.integers(1, 30, 500)
    n = int(counts.sum())
    m = (counts + 5) // 6
    cum = np.cumsum(m) - m
    start = np.cumsum(counts) - counts
    flat = np.repeat(cum * 6 - start, counts) + np.arange(n)
    item = [(0, 20), (20, 44), (64, 3)]
    vals = [rng.integers(0, 1 << b, n, dtype=np.uint64) for _, b in item]
    cont = rng.integers(0, 2**38, int(m.sum()), dtype=np.uint64)
    args = (item, vals, flat, int(m.sum()), 6, 67, [(402, 38)], [cont], 55)
    one = pack_records(*args, block=7)
    lazy = [lambda i0, i1, v=v: v[i0:i1] for v in vals]
    with ThreadPoolExecutor(2) as ex:
        two = pack_records(item, lazy, *args[2:], block=7, executor=ex)
    assert np.array_equal(one, two)
    got = unpack_records(one, 6, 67, dict(enumerate(item)), flat)
    assert all(np.array_equal(got[i], vals[i]) for i in range(3))
