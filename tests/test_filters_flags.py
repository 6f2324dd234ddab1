"""GSF beam flags -> PFM validity, beam skip rules and depth limits, against the NAVO definitions.

The reference below is written from ``navo_gsf_flags.h`` / ``check_flag.c`` (lib-utility) and
pfmLoader's ``gsf_to_pfm_flags`` as read, one flag byte at a time, independently of the table
the module builds.
"""

from __future__ import annotations

import numpy as np
import pytest

from pfm_dask.filters import (GSF_FLAG_TABLE, apply_depth_limits, beam_usable,
                              gsf_flags_to_validity)
from pfm_dask.pfm import validity as V


def _check_flag(field: int, flag: int) -> bool:
    """check_flag.c: exact match for the null beam, any bit for 0x10, else all bits."""
    if flag == 0x01:
        return field == flag
    if flag == 0x10:
        return bool(field & flag)
    return (field & flag) == flag


def _reference(field: int) -> int:
    v = 0
    if _check_flag(field, 0x05):
        v |= 1                      # MANUALLY_INVAL
    if _check_flag(field, 0x09):
        v |= 2                      # FILTER_INVAL
    if _check_flag(field, 0x41):
        v |= 2 | 4096               # FILTER_INVAL | USER_04
    if _check_flag(field, 0x21):
        v |= 2 | 256                # FILTER_INVAL | USER_03
    if _check_flag(field, 0x10):
        v |= 128                    # USER_02
    elif not v & 3:
        v |= 64                     # USER_01
    if _check_flag(field, 0x06):
        v |= 4                      # SELECTED_SOUNDING
    if _check_flag(field, 0x22):
        v |= 16                     # SELECTED_FEATURE
    if _check_flag(field, 0x42):
        v |= 8                      # SUSPECT
    if _check_flag(field, 0x82):
        v |= 131072                 # DESIGNATED_SOUNDING
    return v


def test_every_flag_byte_matches_reference():
    got = gsf_flags_to_validity(np.arange(256, dtype=np.uint8))
    assert got.dtype == np.uint32
    want = [_reference(b) for b in range(256)]
    assert got.tolist() == want


@pytest.mark.parametrize("flag, expected", [
    (0x00, V.USER_01),
    (0x01, V.USER_01),                       # null beam: skipped by beam_usable, not mapped
    (0x05, V.MANUALLY_INVAL),
    (0x09, V.FILTER_INVAL),
    (0x0D, V.MANUALLY_INVAL | V.FILTER_INVAL),
    (0x41, V.FILTER_INVAL | V.USER_04),
    (0x21, V.FILTER_INVAL | V.USER_03),
    (0x10, V.USER_02),
    (0x15, V.MANUALLY_INVAL | V.USER_02),
    (0x06, V.SELECTED_SOUNDING | V.USER_01),
    (0x07, V.MANUALLY_INVAL | V.SELECTED_SOUNDING),
    (0x22, V.SELECTED_FEATURE | V.USER_01),
    (0x42, V.SUSPECT | V.USER_01),
    (0x82, V.DESIGNATED_SOUNDING | V.USER_01),
    (0x81, V.USER_01),                       # TPE exceeds IHO: not mapped, loads valid
    (0x03, V.USER_01),                       # unused category, loads valid
])
def test_hand_worked_flags(flag, expected):
    assert int(gsf_flags_to_validity(np.array([flag], np.uint8))[0]) == expected


def test_any_integer_dtype_and_shape():
    f = np.array([[5, 9], [0x41, 0x10]], dtype=np.int64)
    got = gsf_flags_to_validity(f)
    assert got.shape == (2, 2)
    assert got.tolist() == [[_reference(5), _reference(9)], [_reference(0x41), _reference(0x10)]]
    with pytest.raises(ValueError):
        gsf_flags_to_validity(np.array([256]))
    assert not GSF_FLAG_TABLE.flags.writeable


def test_beam_usable_rules():
    depth = np.array([10.0, 0.0, 12.0, 13.0, 1e-50, -0.0, 14.0])
    flags = np.array([0x00, 0x00, 0x01, 0x05, 0x00, 0x00, 0x11], np.uint8)
    assert beam_usable(depth, flags, True).tolist() == [True, False, False, True, False, False,
                                                          True]
    # No beam-flag array in the ping: nothing from it is loaded.
    assert not beam_usable(depth, flags, False).any()
    # Per-beam has_flags (several pings flattened together).
    has = np.array([True, True, True, False, True, True, True])
    assert beam_usable(depth, flags, has).tolist() == [True, False, False, False, False, False,
                                                         True]
    # A one-beam ping is loaded unconditionally.
    single = np.array([False, True, True, False, False, False, False])
    assert beam_usable(depth, flags, True, single_beam=single).tolist() == [
        True, True, True, True, False, False, True]


def test_depth_limits():
    z = np.array([-10000.0, -9999.99, 0.0, 11999.0, 12000.0, 12000.01, np.nan])
    v = np.array([64, 64, 1, 64, 64, 64, 64], np.uint32)
    z2, v2 = apply_depth_limits(z, v, min_depth=-10000.0, max_depth=12000.0, null_depth=12001.0)
    cut = V.FILTER_INVAL | V.MODIFIED
    assert z2.tolist() == [12001.0, -9999.99, 0.0, 11999.0, 12000.0, 12001.0, 12001.0]
    assert v2.tolist() == [64 | cut, 64, 1, 64, 64, 64 | cut, 64 | cut]
    assert v.tolist() == [64, 64, 1, 64, 64, 64, 64]      # inputs untouched
    assert z2.dtype == np.float64 and v2.dtype == np.uint32
