"""Small pieces of the single writer, tested without a load."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pfm_dask.writer import _lookup


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300, unique=True),
       st.integers(0, 2**31), st.booleans())
def test_lookup_equals_binary_search(keys, seed, dense):
    """Line numbers by ping: the table gather equals the binary search it replaces, for dense
    ping numbers (a table) and sparse ones (the search itself)."""
    rng = np.random.default_rng(seed)
    k = np.array(sorted(keys), dtype=np.uint32)
    if dense:
        k = (np.arange(k.size) * int(rng.integers(1, 4)) + int(k[0]) // 2).astype(np.uint32)
    values = rng.integers(0, 5000, k.size)
    want = k[rng.integers(0, k.size, 1000)]
    assert np.array_equal(_lookup(k, values, want), values[np.searchsorted(k, want)])


class _CountsOnly:
    """Just what the area filter's band planner reads of a PFM: the grid and bin counts."""

    def __init__(self, counts: np.ndarray):
        self.counts = counts
        self.height, self.width = counts.shape

    def read_bin_records(self, r0, r1, fields=()):
        return {"num_soundings": self.counts[r0:r1].reshape(-1)}


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 30), st.integers(0, 2**31), st.integers(1, 400))
def test_area_bands_cover_the_needed_rows_within_the_budget(h, w, seed, budget):
    """Bands are runs of whole needed rows, in order, covering each needed row once; a band
    over the budget is a single row; a band stops only at a row not needed or at the budget."""
    import pfm_dask._writer_area as A

    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 12, (h, w)) * (rng.random((h, w)) < 0.7)
    needed = rng.random(h) < 0.7
    old = A.AREA_BAND_SOUNDINGS
    A.AREA_BAND_SOUNDINGS = budget
    try:
        bands = list(A.area_bands(_CountsOnly(counts), needed))
    finally:
        A.AREA_BAND_SOUNDINGS = old
    rows = [y for y0, y1 in bands for y in range(y0, y1)]
    assert rows == list(np.flatnonzero(needed))
    per_row = counts.sum(axis=1)
    for (y0, y1), nxt in zip(bands, bands[1:] + [None]):
        total = int(per_row[y0:y1].sum())
        assert total <= budget or y1 - y0 == 1
        if nxt is not None and nxt[0] == y1:       # adjacent: split for the budget only
            assert total + int(per_row[y1]) > budget
