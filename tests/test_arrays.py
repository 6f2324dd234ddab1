"""The sort-based unique helpers equal numpy's own answers."""

import numpy as np
from hypothesis import given, strategies as st
from hypothesis.extra import numpy as hnp

from pfm_dask._arrays import runs, unique_sorted

ints = hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(-5, 40))


@given(ints, st.booleans())
def test_unique_sorted_equals_numpy(a, presort):
    if presort:
        a = np.sort(a)
    assert np.array_equal(unique_sorted(a), np.unique(a))


@given(ints, st.booleans())
def test_runs_equal_numpy(a, presort):
    if presort:
        a = np.sort(a)
    got = runs(a)
    want = np.unique(a, return_index=True, return_counts=True)
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


def test_unique_sorted_does_not_alias_its_input():
    a = np.array([1, 2, 3])
    u = unique_sorted(a)
    u[0] = 99
    assert a[0] == 1
