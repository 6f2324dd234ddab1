"""Decoded soundings equal libgsf's (through gsfpy 2.0.0), field by field, on every real sample.

The reference is the C GSF library. gsfpy opens at most 4 files per process and
is not thread-safe (P2): each file is opened once, read to the end, closed, and
the result cached for the session. gsfpy's ping struct swaps latitude and
longitude (P1), which the reference reader undoes.
"""

from __future__ import annotations

import numpy as np
import pytest

from pfm_dask import gsf

gsfpy = pytest.importorskip("gsfpy")

# array name in the sounding schema -> gsfpy ping struct member
_ARRAYS = {
    "depth": "depth",
    "across_track": "across_track",
    "along_track": "along_track",
    "nominal_depth": "nominal_depth",
    "horizontal_error": "horizontal_error",
    "vertical_error": "vertical_error",
}

_CACHE: dict = {}


def gsfpy_pings(path) -> list[dict]:
    """Every ping of ``path`` as libgsf decodes it (arrays absent -> None)."""
    key = str(path)
    if key in _CACHE:
        return _CACHE[key]
    from gsfpy import open_gsf
    from gsfpy.enums import RecordType
    from gsfpy3_08 import GsfException

    pings = []
    with open_gsf(key) as f:          # closed before anything else is opened (P2)
        while True:
            try:
                _rid, rec = f.read(RecordType.GSF_RECORD_SWATH_BATHYMETRY_PING)
            except GsfException as err:
                assert err.error_code == -23, err   # GSF_READ_TO_END_OF_FILE (P4)
                break
            p = rec.mb_ping
            n = int(p.number_beams)
            ping = {
                "n": n,
                "time_sec": int(p.ping_time.tv_sec),
                "time_nsec": int(p.ping_time.tv_nsec),
                # P1: gsfpy's struct has longitude where libgsf has latitude.
                "latitude": float(p.longitude),
                "longitude": float(p.latitude),
                "heading": float(p.heading),
                "ping_flags": int(p.ping_flags),
                "beam_flags": (np.ctypeslib.as_array(p.beam_flags, shape=(n,)).copy()
                               if bool(p.beam_flags) else None),
            }
            for name, member in _ARRAYS.items():
                ptr = getattr(p, member)
                ping[name] = (np.ctypeslib.as_array(ptr, shape=(n,)).copy()
                              if bool(ptr) else None)
            pings.append(ping)
    _CACHE[key] = pings
    return pings


def test_same_pings_and_beams(gsf_sample):
    """Number of pings and beams per ping equal libgsf's."""
    ref = gsfpy_pings(gsf_sample)
    table = gsf.read_pings(gsf_sample)
    assert table.schema.equals(gsf.SOUNDING_SCHEMA)
    ping = table.column("ping").to_numpy()
    assert table.num_rows == sum(p["n"] for p in ref)
    assert len(np.unique(ping)) == len(ref)
    counts = np.bincount(ping, minlength=len(ref) + 1)[1:] if len(ping) else []
    assert list(counts) == [p["n"] for p in ref]
    beam = table.column("beam").to_numpy()
    expected_beam = np.concatenate([np.arange(1, p["n"] + 1) for p in ref]) if ref else []
    np.testing.assert_array_equal(beam, expected_beam)
    with gsf.GsfFile(gsf_sample) as f:
        assert f.n_pings == len(ref)


def test_values_equal_libgsf(gsf_sample):
    """Time, position (P1 undone), heading, flags and every scaled array equal libgsf's.

    Equality is exact: both compute ``raw / multiplier - offset`` in IEEE doubles, so the
    decoded values are the same bits (far inside the 1/multiplier quantisation).
    """
    ref = gsfpy_pings(gsf_sample)
    if not ref:
        pytest.skip("sample has no pings")
    table = gsf.read_pings(gsf_sample)
    nb = [p["n"] for p in ref]

    def per_beam(key):
        return np.repeat([p[key] for p in ref], nb)

    for key in ("time_sec", "time_nsec", "latitude", "longitude", "heading", "ping_flags"):
        np.testing.assert_array_equal(table.column(key).to_numpy(), per_beam(key), err_msg=key)
    t = table.column("time").to_numpy()
    np.testing.assert_allclose(t, per_beam("time_sec") + per_beam("time_nsec") * 1e-9,
                               rtol=0, atol=1e-6)

    for name in list(_ARRAYS) + ["beam_flags"]:
        col = table.column(name)
        present = [p[name] is not None for p in ref]
        valid = np.asarray(col.is_valid())
        np.testing.assert_array_equal(valid, np.repeat(present, nb), err_msg=name)
        if any(present):
            ours = col.drop_null().to_numpy()
            theirs = np.concatenate([p[name] for p in ref if p[name] is not None])
            np.testing.assert_array_equal(ours, theirs, err_msg=name)


def test_arrays_present_match_samples(sample_by_name):
    """Sample #4 carries error arrays; sample #1 does not (libgsf: NULL pointers)."""
    em302 = gsf.read_pings(sample_by_name("EM302"))
    assert em302.column("vertical_error").null_count == 0
    assert em302.column("horizontal_error").null_count == 0
    ex1502 = gsf.read_pings(sample_by_name("EX1502L2"))
    assert ex1502.column("vertical_error").null_count == ex1502.num_rows
    assert ex1502.column("nominal_depth").null_count == ex1502.num_rows
