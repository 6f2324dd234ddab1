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
