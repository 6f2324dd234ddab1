"""Records a few bins apart written in one span with the zeros between them (pfm._io.zero_gaps):
only gaps whose every bin is known to be zero are joined, the bytes are those of one write per
record, and a sparse file gets no block it would not have had."""

import os

import numpy as np

from pfm_dask.pfm._io import ZERO_GAP, Spans, zero_gaps


def _bits(n: int, cleared) -> np.ndarray:
    """A map of ``n`` items all known zero but ``cleared`` (MSB first, as the store's)."""
    z = np.full((n + 7) // 8, 0xFF, dtype=np.uint8)
    for p in cleared:
        z[p >> 3] &= ~np.uint8(1 << (7 - (p & 7)))
    return z


def _joinable_by_hand(items, size, cleared) -> list[bool]:
    out = []
    for a, b in zip(items[:-1], items[1:]):
        gap = b - a - 1
        out.append(gap == 0 or (gap * size <= ZERO_GAP
                                and not any(a < p < b for p in cleared)))
    return out


def test_zero_gaps_matches_a_plain_loop():
    rng = np.random.default_rng(5)
    for size in (7, 39, 512):
        items = np.unique(rng.integers(0, 20_000, 600))
        cleared = set(rng.choice(20_000, 300, replace=False).tolist()) | set(items.tolist())
        got = zero_gaps(items, size, _bits(20_000, cleared))
        assert got.tolist() == _joinable_by_hand(items.tolist(), size, cleared)
    assert zero_gaps(items, 39, None) is None


def test_joined_spans_keep_every_other_byte_and_allocate_no_new_block(tmp_path):
    size, n = 39, 4000
    rng = np.random.default_rng(1)
    items = np.unique(rng.integers(0, n, 300))
    other = np.setdiff1d(np.arange(n), items)[::17]          # written before: not zero
    recs = rng.integers(1, 255, (items.size, size), dtype=np.uint8)
    old = rng.integers(1, 255, (other.size, size), dtype=np.uint8)
    paths = {}
    for how in ("one write per record", "joined"):
        p = paths[how] = tmp_path / how
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, n * size)
            for i, rec in zip(other.tolist(), old):
                os.pwrite(fd, rec.tobytes(), i * size)
            join = None if how.startswith("one") else zero_gaps(items, size, _bits(n, other))
            spans = Spans(fd, items * size, size, max_gap=0 if join is None else ZERO_GAP,
                          read=False, zero=True, joinable=join)
            if join is not None:
                assert spans.span_lo.size < items.size            # some gaps were joined
            spans.store(recs)
            spans.write()
        finally:
            os.close(fd)
    a, b = (paths[k].read_bytes() for k in ("one write per record", "joined"))
    assert a == b
    assert os.stat(paths["joined"]).st_blocks == os.stat(paths["one write per record"]).st_blocks


def test_spans_leave_records_known_zero_unread_and_the_rest_as_read(tmp_path):
    """Spans(known_zero=...) fills its buffer as a plain read of the same spans does when the
    map is true (the records it marks are zero in the file), and does not read the runs it
    marks: records marked zero but holding bytes come back as zeros only there."""
    size, n, base = 39, 3000, 64
    rng = np.random.default_rng(9)
    data = rng.integers(1, 256, (n, size), dtype=np.uint8)
    zero = np.zeros(n, dtype=bool)
    zero[100:400] = True                     # a long run inside a span
    zero[1000:1010] = True                   # a short one inside (read: cheaper than a call)
    zero[2000:2200] = True                   # a span's start
    data[zero] = 0
    path = tmp_path / "f"
    path.write_bytes(bytes(base) + data.tobytes())
    items = np.r_[np.arange(50, 1500), np.arange(2000, 2600)]
    off = base + items * size
    fd = os.open(path, os.O_RDONLY)
    try:
        plain = Spans(fd, off, size, max_gap=0)
        known = Spans(fd, off, size, max_gap=0, known_zero=(np.packbits(zero), base))
        assert np.array_equal(known.buf, plain.buf) and np.array_equal(known.pos, plain.pos)
        # the same map over a file whose "zero" records hold bytes: the runs skipped read as 0
        data2 = rng.integers(1, 256, (n, size), dtype=np.uint8)
        os.pwrite(fd2 := os.open(path, os.O_RDWR), bytes(base) + data2.tobytes(), 0)
        os.close(fd2)
        lied = Spans(fd, off, size, max_gap=0, known_zero=(np.packbits(zero), base))
        rows = lied.records()
        skipped = zero[items].copy()
        skipped[(items >= 1000) & (items < 1010)] = False
        assert not rows[skipped].any()
        assert np.array_equal(rows[~skipped], data2[items][~skipped])
    finally:
        os.close(fd)


def test_many_short_runs_are_written_by_spans_to_the_same_bytes_and_blocks(tmp_path,
                                                                            monkeypatch):
    """``_io.write_runs`` with bins in many short runs a few bins apart (an area
    filter's changed bins where it cut much): read-modify-write spans, whose bytes and blocks
    are those of one write per run; bins written before keep theirs, holes stay holes."""
    from pfm_dask.pfm import _io

    size, n, base = 39, 60_000, 16384
    rng = np.random.default_rng(3)
    # three clusters of changed bins a few apart, far from each other (holes between)
    items = np.unique(np.concatenate([rng.integers(a, a + 3000, 900)
                                      for a in (1000, 25_000, 52_000)]))
    gaps = np.diff(items) - 1
    assert (np.count_nonzero(gaps) + 1) >= _io.MERGE_RUNS
    other = np.setdiff1d(np.arange(n), items)
    other = other[(other % 5 == 0) & (((other > 900) & (other < 4100)) | (other > 51_000))]
    recs = rng.integers(1, 255, (items.size, size), dtype=np.uint8)
    old = rng.integers(1, 255, (other.size, size), dtype=np.uint8)
    zero = np.ones(n, dtype=bool)
    zero[other] = False
    zero[items] = False
    made = []
    monkeypatch.setattr(_io, "Spans",
                        lambda *a, **k: made.append(k.get("read", True)) or Spans(*a, **k))
    paths = {}
    for how in ("by runs", "by spans"):
        p = paths[how] = tmp_path / how.replace(" ", "-")
        fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            os.ftruncate(fd, base + n * size)
            for i, rec in zip(other.tolist(), old):
                os.pwrite(fd, rec.tobytes(), base + i * size)
            if how == "by runs":
                for i, rec in zip(items.tolist(), recs):
                    os.pwrite(fd, rec.tobytes(), base + i * size)
            else:
                _io.write_runs(fd, items, recs, base, p, np.packbits(zero))
        finally:
            os.close(fd)
    assert made == [True]          # one reading Spans: the spans path was taken
    a, b = (paths[k].read_bytes() for k in ("by runs", "by spans"))
    assert a == b
    assert os.stat(paths["by spans"]).st_blocks == os.stat(paths["by runs"]).st_blocks


def test_short_runs_with_only_zeros_between_keep_the_zero_joins(tmp_path, monkeypatch):
    """Bins a few apart with nothing written between them (a sparse grid's): the zero-gap
    joins already make few writes, so nothing is read (no page of a hole taken)."""
    from pfm_dask.pfm import _io

    size, n, base = 39, 20_000, 16384
    rng = np.random.default_rng(4)
    items = np.unique(rng.integers(1000, 9000, 2500))
    recs = rng.integers(1, 255, (items.size, size), dtype=np.uint8)
    zero = np.ones(n, dtype=bool)
    zero[items] = False
    made = []
    monkeypatch.setattr(_io, "Spans",
                        lambda *a, **k: made.append(k.get("read", True)) or Spans(*a, **k))
    p = tmp_path / "f"
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, base + n * size)
        _io.write_runs(fd, items, recs, base, p, np.packbits(zero))
    finally:
        os.close(fd)
    assert made == [False]
    data = np.frombuffer(p.read_bytes()[base:], dtype=np.uint8).reshape(n, size)
    assert np.array_equal(data[items], recs) and not data[zero].any()
