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


# --- synthetic files, byte-built here, also checked against libgsf --------------------------


def _compare_with_libgsf(path):
    ref = gsfpy_pings(path)
    table = gsf.read_pings(path)
    assert table.num_rows == sum(p["n"] for p in ref)
    nb = [p["n"] for p in ref]
    for key in ("time_sec", "time_nsec", "latitude", "longitude", "heading", "ping_flags"):
        np.testing.assert_array_equal(table.column(key).to_numpy(),
                                      np.repeat([p[key] for p in ref], nb), err_msg=key)
    for name in list(_ARRAYS) + ["beam_flags"]:
        col = table.column(name)
        present = [p[name] is not None for p in ref]
        np.testing.assert_array_equal(np.asarray(col.is_valid()), np.repeat(present, nb))
        if any(present):
            np.testing.assert_array_equal(
                col.drop_null().to_numpy(),
                np.concatenate([p[name] for p in ref if p[name] is not None]), err_msg=name)


def test_byte_built_file_equals_libgsf(tmp_path):
    """Partial tables, 2/4-byte fields, stale nibbles, errors and nominal depth arrays,
    pings without beam flags, beam counts changing: libgsf agrees on every value.

    (Sensor-specific and intensity subrecords are left out: libgsf decodes those with
    its own byte counts and would read past a made-up payload.)"""
    from .test_pitfalls import array, header_record, ping_record, sf_table, sub

    rng = np.random.default_rng(7)
    blob = header_record("GSF-v03.07")
    for k in range(60):
        n = 8 if k % 5 else 12
        body = b""
        if k == 0:
            body += sf_table([(1, 0x40, 1000, -1460), (2, 0x00, 100, 0), (3, 0x20, 100, 0),
                              (14, 0x20, 100, 0), (19, 0, 100, 0), (20, 0, 100, 0)])
        elif k % 7 == 0:
            body += sf_table([(2, 0x40, 200, 10)])              # stale nibble, partial
        body += array(1, rng.integers(0, 2_000_000, n), "I")
        body += array(2, rng.integers(-30000, 30000, n), "h")
        if k % 3:
            body += array(3, rng.integers(-300, 300, n), "h")
        if k % 4 == 0:
            body += array(14, rng.integers(0, 60000, n), "H")
        body += array(19, rng.integers(0, 900, n), "H") + array(20, rng.integers(0, 900, n), "H")
        if k % 6:
            body += array(16, rng.choice([0, 1, 5, 9], n), "B")
        body += sub(0, b"")                                      # "unknown sensor"
        blob += ping_record(body, n=n, sec=1_600_000_000 + k, nsec=k * 1000,
                            lat=10 + k / 1000, lon=-20 - k / 1000, heading=k * 5.5,
                            ping_flags=k % 2)
    path = tmp_path / "built.gsf"
    path.write_bytes(blob)
    _compare_with_libgsf(path)


def test_synthetic_survey_equals_libgsf(tmp_path):
    """A pfm_dask.synth line (300 pings x 432 beams) read here and by libgsf."""
    synth = pytest.importorskip("pfm_dask.synth")
    summary = synth.generate(tmp_path / "s", files=1, pings=300, beams=432, seed=11)
    _compare_with_libgsf(tmp_path / "s" / summary["files"][0]["name"])


# --- a multi-ping file of real EM302 records (EX1811), layouts changing from ping to ping ---

#: Subrecords removed from some of the sample's 50 pings (in every repetition), so that the
#: file also has optional arrays absent: ping 1 loses its scale-factor table (its factors
#: differ from ping 0's, which libgsf then carries over), others along-track, beam flags,
#: the error arrays, or depth and across-track.
_DROP = {1: {100}, 5: {3}, 12: {16}, 20: {19, 20}, 27: {1, 2}, 49: {16, 100}}


def _ping_subrecord_ids(path) -> list[set]:
    """Subrecord ids of each ping record, by a plain walk of the bytes (test premise)."""
    import struct

    blob = path.read_bytes()
    out, pos = [], 0
    while pos + 8 <= len(blob):
        size, word = struct.unpack_from(">II", blob, pos)
        if word & 0x3FFFFF == 2:
            ids, p, end = set(), pos + 8 + 56, pos + 8 + size
            while end - p > 4:
                (w,) = struct.unpack_from(">I", blob, p)
                ids.add(w >> 24)
                p += 4 + (w & 0xFFFFFF)
            out.append(ids)
        pos += 8 + size
    return out


@pytest.fixture(scope="module")
def real_derived(tmp_path_factory):
    """The EX1811 sample's 50 ping records repeated 3 times (150 pings), times and positions
    shifted, with the subrecords of ``_DROP`` removed."""
    from benchmarks import real_gsf
    from tests.conftest import SAMPLE_FILES, missing_sample

    hits = [p for p in SAMPLE_FILES if p.name == real_gsf.SAMPLE_NAME]
    if not hits:
        missing_sample(real_gsf.SAMPLE_NAME)
    path = tmp_path_factory.mktemp("real") / "ex1811_x3.gsf"
    real_gsf.build(path, sample=hits[0], repeats=3, drop=_DROP)
    return path


def test_real_derived_file_has_varying_layouts(real_derived):
    """The premise: pings without a scale-factor table, pings without some arrays, and
    intensity series of different sizes, all in one file."""
    ids = _ping_subrecord_ids(real_derived)
    assert len(ids) == 150
    no_table = [k for k, s in enumerate(ids) if 100 not in s]
    assert {1, 9, 28, 37, 42, 49} <= {k % 50 for k in no_table} and 0 not in no_table
    assert any(16 not in s for s in ids) and any(3 not in s for s in ids)
    assert any(1 not in s for s in ids) and any(19 not in s for s in ids)
    assert all(21 in s and 134 in s for s in ids)
    with gsf.GsfFile(real_derived) as f:
        assert len(set(f._psize.tolist())) > 40     # record sizes differ from ping to ping


def test_real_derived_file_equals_libgsf(real_derived):
    """Every column of every ping equals libgsf's, field by field (nulls where libgsf has
    NULL arrays), and the repetitions differ only in time and latitude."""
    _compare_with_libgsf(real_derived)
    table = gsf.read_pings(real_derived)
    per = table.num_rows // 3
    a, b = table.slice(0, per), table.slice(per, per)
    np.testing.assert_array_equal(b.column("time_sec").to_numpy() - a.column("time_sec").to_numpy(),
                                  360)
    for name in ("depth", "across_track", "along_track", "beam_flags", "vertical_error"):
        assert a.column(name).equals(b.column(name)), name


def test_real_derived_file_in_batches_equals_whole(real_derived):
    """Reading from any ping (state carried from the pings before, or rebuilt by walking
    back) gives the rows of the whole read."""
    import pyarrow as pa

    whole = gsf.read_pings(real_derived)
    for max_pings in (1, 7, 64):
        joined = pa.Table.from_batches(list(gsf.iter_batches(real_derived, max_pings)))
        assert joined.equals(whole), max_pings
    ping = whole.column("ping").to_numpy()
    with gsf.GsfFile(real_derived) as f:
        f._forward_limit = 0                 # rebuild the state by walking back
        # pings 9, 28, 37, 42 carry no table in the sample, 1 and 49 lost theirs here
        for start in (1, 2, 9, 28, 37, 42, 49, 51, 78, 99, 149):
            part = f.read(start, start + 5)
            keep = (ping > start) & (ping <= start + 5)
            assert part.equals(whole.filter(pa.array(keep))), start


def test_real_derived_kernel_walk_equals_python_walk(real_derived, tmp_path):
    """The numba walk and the per-ping Python walk give the same directory (positions,
    widths, scale factors carried over) on every ping."""
    from .test_damage import _assert_same_directory, _directories

    _assert_same_directory(_directories(real_derived.read_bytes(), tmp_path))
