"""GsfWriter: files we write are read back by libgsf (gsfpy) and by our reader, field by field.

The reference is gsfpy 2.0.0 (libgsf 3.08). Pitfalls honoured: P1 (gsfpy swaps latitude and
longitude of ping records), P2 (at most 4 open files; every file is closed), P4 (gsfOpen eats
the header record; reading ends with error -23). Byte-level checks walk the records by hand.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pfm_dask.errors import GsfError
from pfm_dask.gsf import GsfWriter
from pfm_dask.gsf._encode import ScaleFactor

gsfpy = pytest.importorskip("gsfpy")
from gsfpy import open_gsf  # noqa: E402
from gsfpy3_08 import GsfException  # noqa: E402

BEAM_ARRAYS = ("depth", "across_track", "along_track", "travel_time", "beam_angle",
               "nominal_depth", "vertical_error", "horizontal_error")
ARRAY_ID = {"depth": 1, "across_track": 2, "along_track": 3, "travel_time": 4, "beam_angle": 5,
            "nominal_depth": 14, "vertical_error": 19, "horizontal_error": 20}


# ---------------------------------------------------------------------------- references
def gsfpy_records(path):
    """Every record after the header, via libgsf: a list of (record id, dict of plain values)."""
    out = []
    with open_gsf(str(path)) as f:
        while True:
            try:
                rid, rec = f.read()
            except GsfException as err:
                assert err.error_code == -23, err  # GSF_READ_TO_END_OF_FILE
                break
            kind = rid.recordID
            if kind == 2:
                m = rec.mb_ping
                n = m.number_beams
                d = {
                    "time_sec": m.ping_time.tv_sec, "time_nsec": m.ping_time.tv_nsec,
                    # P1: gsfpy's struct has the two fields swapped
                    "latitude": m.longitude, "longitude": m.latitude,
                    "number_beams": n, "center_beam": m.center_beam, "ping_flags": m.ping_flags,
                    "heading": m.heading, "course": m.course, "pitch": m.pitch, "roll": m.roll,
                    "heave": m.heave, "speed": m.speed, "depth_corrector": m.depth_corrector,
                    "tide_corrector": m.tide_corrector, "height": m.height, "separation": m.sep,
                    "gps_tide_corrector": m.gps_tide_corrector,
                    "beam_flags": (np.array([m.beam_flags[i] for i in range(n)], np.uint8)
                                   if m.beam_flags else None),
                    "scale": {i + 1: (m.scaleFactors.scaleTable[i].multiplier,
                                      m.scaleFactors.scaleTable[i].offset,
                                      m.scaleFactors.scaleTable[i].compressionFlag)
                              for i in range(27) if m.scaleFactors.scaleTable[i].multiplier},
                }
                for name in BEAM_ARRAYS:
                    ptr = getattr(m, name)
                    d[name] = np.array([ptr[i] for i in range(n)]) if ptr else None
                out.append((kind, d))
            elif kind == 6:
                c = rec.comment
                out.append((kind, {"time": (c.comment_time.tv_sec, c.comment_time.tv_nsec),
                                   "text": c.comment[:c.comment_length].decode()}))
            elif kind == 7:
                h = rec.history
                out.append((kind, {"time": (h.history_time.tv_sec, h.history_time.tv_nsec),
                                   "host_name": h.host_name.decode(),
                                   "operator_name": h.operator_name.decode(),
                                   "command_line": _cstr(h.command_line),
                                   "comment": _cstr(h.comment)}))
            elif kind == 4:
                p = rec.process_parameters
                out.append((kind, {"time": (p.param_time.tv_sec, p.param_time.tv_nsec),
                                   "params": [_cstr(p.param[i]) for i in range(p.number_parameters)]}))
            elif kind == 9:
                s = rec.summary
                out.append((kind, {"start": (s.start_time.tv_sec, s.start_time.tv_nsec),
                                   "end": (s.end_time.tv_sec, s.end_time.tv_nsec),
                                   "box": (s.min_latitude, s.min_longitude, s.max_latitude,
                                           s.max_longitude),
                                   "depths": (s.min_depth, s.max_depth)}))
            else:
                out.append((kind, {}))
    return out


def _cstr(ptr) -> str:
    if not ptr:
        return ""
    chars = []
    i = 0
    while ptr[i] != b"\0":
        chars.append(ptr[i])
        i += 1
    return b"".join(chars).decode()


def gsfpy_pings(path):
    return [d for kind, d in gsfpy_records(path) if kind == 2]


def walk_records(path):
    """Hand-walk the framing: list of (offset, record id, data bytes)."""
    blob = open(path, "rb").read()
    pos, out = 0, []
    while pos < len(blob):
        size, rid = struct.unpack_from(">II", blob, pos)
        out.append((pos, rid & 0x3FFFFF, blob[pos + 8: pos + 8 + size]))
        pos += 8 + size
    assert pos == len(blob)
    return out


def ping_subrecords(data, header_size=56):
    """(id, declared size, payload) of each subrecord of a ping record, by hand."""
    pos, out = header_size, []
    while len(data) - pos > 4:
        word, = struct.unpack_from(">I", data, pos)
        sid, size = word >> 24, word & 0xFFFFFF
        out.append((sid, size, data[pos + 4: pos + 4 + size]))
        pos += 4 + size
    return out


# ---------------------------------------------------------------------------- data
def survey_like(P=6, B=9, seed=1, **over):
    rng = np.random.default_rng(seed)
    d = dict(
        time_sec=1_773_489_600 + np.arange(P) * 3, time_nsec=rng.integers(0, 10**9, P),
        latitude=rng.uniform(-89.9, 89.9, P), longitude=rng.uniform(-179.9, 179.9, P),
        heading=rng.uniform(0, 360, P), ping_flags=rng.integers(0, 2**16, P),
        pitch=rng.uniform(-5, 5, P), roll=rng.uniform(-10, 10, P), heave=rng.uniform(-2, 2, P),
        speed=rng.uniform(0, 12, P), course=rng.uniform(0, 360, P),
        depth_corrector=rng.uniform(-1, 7, P), tide_corrector=rng.uniform(-3, 3, P),
        depth=rng.uniform(800, 2500, (P, B)), across_track=rng.uniform(-5000, 5000, (P, B)),
        along_track=rng.uniform(-8, 8, (P, B)), beam_flags=rng.integers(0, 256, (P, B)).astype(np.uint8),
        travel_time=rng.uniform(1, 7.9, (P, B)), beam_angle=rng.uniform(-65, 65, (P, B)),
        nominal_depth=rng.uniform(800, 2500, (P, B)),
        horizontal_error=rng.uniform(0.5, 60, (P, B)), vertical_error=rng.uniform(0.1, 25, (P, B)),
    )
    d.update(over)
    return d


def _tol(mult):
    return 0.5 / mult + 1e-9


def assert_pings_match(got, sent, table, first_ping=0, number_beams=None):
    """Compare gsfpy's pings with what was sent, within each field's quantisation step."""
    P = len(sent["time_sec"])
    assert len(got) >= first_ping + P
    for i in range(P):
        g = got[first_ping + i]
        n = int(number_beams[i]) if number_beams is not None else sent["depth"].shape[1]
        assert g["number_beams"] == n
        assert g["center_beam"] == n // 2
        assert g["time_sec"] == sent["time_sec"][i]
        assert g["time_nsec"] == sent["time_nsec"][i]
        assert abs(g["latitude"] - sent["latitude"][i]) <= 0.5e-7 + 1e-12
        assert abs(g["longitude"] - sent["longitude"][i]) <= 0.5e-7 + 1e-12
        for name, mult, wrap in (("heading", 100, 360), ("course", 100, 360), ("pitch", 100, 0),
                                 ("roll", 100, 0), ("heave", 100, 0), ("speed", 100, 0),
                                 ("depth_corrector", 100, 0), ("tide_corrector", 100, 0)):
            if name not in sent:
                continue
            diff = abs(g[name] - sent[name][i])
            if wrap:
                diff = min(diff, wrap - diff)
            assert diff <= _tol(mult), (name, i, g[name], sent[name][i])
        assert g["ping_flags"] == sent.get("ping_flags", np.zeros(P, int))[i]
        np.testing.assert_array_equal(g["beam_flags"], sent["beam_flags"][i, :n])
        for name in BEAM_ARRAYS:
            if name not in sent or sent[name] is None:
                assert g[name] is None, name
                continue
            mult, offset, flag = g["scale"][ARRAY_ID[name]]
            assert (mult, offset) == (table[name].multiplier, table[name].offset), name
            assert flag == {1: 0x10, 2: 0x20, 4: 0x40}[table[name].width], name
            err = np.abs(g[name] - sent[name][i, :n])
            assert err.max() <= _tol(mult) * (1 + 1e-9 * abs(sent[name][i, :n]).max()), \
                (name, i, err.max(), mult)


# ---------------------------------------------------------------------------- tests
def test_round_trip_all_fields_via_gsfpy(tmp_path):
    path = tmp_path / "all.gsf"
    sent = survey_like()
    with GsfWriter(path) as w:
        w.write_pings(**sent)
        table = {name: w.scale_factors[ARRAY_ID[name]] for name in BEAM_ARRAYS}
    got = gsfpy_pings(path)
    assert len(got) == 6
    assert_pings_match(got, sent, table)
    # depth 800–2500 m does not fit 2 bytes at ×100: 4 bytes ×1000; across ±5 km likewise
    assert table["depth"] == ScaleFactor(1000, 0, 4)
    assert table["across_track"].width == 4
    assert table["along_track"] == ScaleFactor(100, 0, 2)
    assert table["horizontal_error"].width == 2


def test_small_records_via_gsfpy(tmp_path):
    path = tmp_path / "meta.gsf"
    with GsfWriter(path, version="GSF-v03.08") as w:
        w.write_comment("synthetic EM302 – line 1", time=(1_773_489_600, 250))
        w.write_history(time=1_773_489_601.5, host_name="node1", operator_name="pfm-dask",
                        command_line="pfm-dask synth out --seed 3", comment="made by tests")
        w.write_processing_parameters({"REFERENCE TIME": "2026/073 12:00:00",
                                       "ROLL_COMPENSATED": "YES"}, time=(5, 0))
        w.write_summary(start_time=(10, 1), end_time=(20, 2), min_latitude=-1.5,
                        min_longitude=-2.25, max_latitude=1.5, max_longitude=2.25,
                        min_depth=-3.21, max_depth=2500.5)
    recs = gsfpy_records(path)
    assert [k for k, _ in recs] == [6, 7, 4, 9]
    assert recs[0][1] == {"time": (1_773_489_600, 250), "text": "synthetic EM302 – line 1"}
    assert recs[1][1] == {"time": (1_773_489_601, 500_000_000), "host_name": "node1",
                          "operator_name": "pfm-dask", "command_line": "pfm-dask synth out --seed 3",
                          "comment": "made by tests"}
    assert recs[2][1] == {"time": (5, 0), "params": ["REFERENCE TIME=2026/073 12:00:00",
                                                     "ROLL_COMPENSATED=YES"]}
    s = recs[3][1]
    assert s["start"] == (10, 1) and s["end"] == (20, 2)
    assert s["box"] == pytest.approx((-1.5, -2.25, 1.5, 2.25), abs=1e-9)
    assert s["depths"] == pytest.approx((-3.21, 2500.5), abs=1e-9)
    # header record: 12 bytes of version string, NUL padded
    first = walk_records(path)[0]
    assert first[1] == 1 and first[2] == b"GSF-v03.08\0\0"


def test_framing_padding_and_size_nibbles(tmp_path):
    path = tmp_path / "frame.gsf"
    sent = survey_like(P=3, B=5)
    with GsfWriter(path) as w:
        w.write_comment("odd length")
        w.write_pings(**sent)
    recs = walk_records(path)
    assert all(len(data) % 4 == 0 for _, _, data in recs)
    pings = [data for _, rid, data in recs if rid == 2]
    subs = ping_subrecords(pings[0])
    ids = [s[0] for s in subs]
    assert ids == [100, 1, 2, 3, 4, 5, 14, 16, 19, 20, 0]   # table, arrays by id, sensor "unknown"
    table_payload = subs[0][2]
    count, = struct.unpack_from(">I", table_payload, 0)
    entries = {}
    for k in range(count):
        aid, flag, _, mult, off = struct.unpack_from(">BBHIi", table_payload, 4 + 12 * k)
        entries[aid] = (flag, mult, off)
    for sid, size, _ in subs[1:-1]:
        if sid == 16:
            assert size == 5
            continue
        width = size // 5
        assert size == 5 * width and entries[sid][0] == {1: 0x10, 2: 0x20, 4: 0x40}[width]
    assert subs[-1][:2] == (0, 0)
    # later pings carry no table (factors unchanged)
    assert [s[0] for s in ping_subrecords(pings[1])][0] == 1


def test_one_beam_pings(tmp_path):
    path = tmp_path / "one.gsf"
    sent = survey_like(P=4, B=1, seed=5)
    with GsfWriter(path) as w:
        w.write_pings(**sent)
        table = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    assert_pings_match(gsfpy_pings(path), sent, table)


def test_pings_with_different_beam_counts(tmp_path):
    path = tmp_path / "ragged.gsf"
    nb = np.array([9, 9, 3, 1, 7, 9, 2])
    sent = survey_like(P=7, B=9, seed=7)
    for name in BEAM_ARRAYS:            # junk beyond each ping's width must be ignored
        sent[name][np.arange(9)[None, :] >= nb[:, None]] = np.nan
    sent2 = survey_like(P=3, B=4, seed=8)  # a second call with another array width
    with GsfWriter(path) as w:
        w.write_pings(number_beams=nb, **sent)
        t1 = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
        w.write_pings(**sent2)
        t2 = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    got = gsfpy_pings(path)
    assert [g["number_beams"] for g in got] == [9, 9, 3, 1, 7, 9, 2, 4, 4, 4]
    assert_pings_match(got, sent, t1, number_beams=nb)
    assert_pings_match(got, sent2, t2, first_ping=7)


def test_scale_factor_change_mid_file_lists_only_changes(tmp_path):
    path = tmp_path / "change.gsf"
    a = survey_like(P=3, B=6, seed=11)
    b = survey_like(P=3, B=6, seed=12)
    common = {n: ScaleFactor(*v) for n, v in {
        "across_track": (1000, 0, 4), "along_track": (100, 0, 2), "travel_time": (1_000_000, 0, 4),
        "beam_angle": (100, 0, 2), "nominal_depth": (1000, 0, 4), "vertical_error": (100, 0, 2),
        "horizontal_error": (100, 0, 2)}.items()}
    with GsfWriter(path) as w:
        w.write_pings(scale_factors={**common, "depth": ScaleFactor(1000, 0, 4)}, **a)
        t1 = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
        w.write_pings(scale_factors={**common, "depth": (100, -700, 4)}, **b)
        t2 = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    assert t2["depth"] == ScaleFactor(100, -700, 4) and t2["across_track"] == t1["across_track"]
    pings = [data for _, rid, data in walk_records(path) if rid == 2]
    tables = []
    for data in pings:
        subs = ping_subrecords(data)
        if subs[0][0] == 100:
            payload = subs[0][2]
            count, = struct.unpack_from(">I", payload, 0)
            tables.append([struct.unpack_from(">B", payload, 4 + 12 * k)[0] for k in range(count)])
        else:
            tables.append(None)
    assert tables == [[1, 2, 3, 4, 5, 14, 19, 20], None, None, [1], None, None]
    got = gsfpy_pings(path)   # libgsf merges the partial table into the previous one
    assert_pings_match(got, a, t1)
    assert_pings_match(got, b, t2, first_ping=3)


def test_negative_depths_use_an_offset(tmp_path):
    path = tmp_path / "drying.gsf"
    sent = survey_like(P=4, B=8, seed=3)
    sent["depth"] = np.linspace(-3.37, 18.2, 32).reshape(4, 8)     # drying heights
    sent["nominal_depth"] = sent["depth"] + 0.1
    with GsfWriter(path) as w:
        w.write_pings(**sent)
        table = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    assert table["depth"].offset >= 4 and table["depth"].width == 2
    got = gsfpy_pings(path)
    assert_pings_match(got, sent, table)
    assert got[0]["depth"][0] == pytest.approx(-3.37, abs=0.005)


def test_explicit_two_byte_depth_with_offset(tmp_path):
    path = tmp_path / "two.gsf"
    sent = survey_like(P=2, B=5, seed=4, depth=np.full((2, 5), 1460.0) + np.arange(10).reshape(2, 5))
    with GsfWriter(path) as w:
        w.write_pings(scale_factors={"depth": (100, -1400, 2)}, **sent)
        table = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    assert_pings_match(gsfpy_pings(path), sent, table)


def test_auto_choice_prefers_two_bytes_when_range_allows(tmp_path):
    path = tmp_path / "shallow.gsf"
    sent = survey_like(P=2, B=5, seed=2, depth=np.linspace(1000, 1600, 10).reshape(2, 5))
    with GsfWriter(path) as w:
        w.write_pings(**sent)
        assert w.scale_factors[1] == ScaleFactor(100, -1000, 2)
        table = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    assert_pings_match(gsfpy_pings(path), sent, table)


def test_optional_arrays_absent(tmp_path):
    path = tmp_path / "min.gsf"
    full = survey_like(P=3, B=4)
    sent = {k: full[k] for k in ("time_sec", "time_nsec", "latitude", "longitude", "heading",
                                 "depth", "across_track", "along_track", "beam_flags")}
    with GsfWriter(path) as w:
        w.write_pings(**sent)
        table = {n: w.scale_factors[ARRAY_ID[n]] for n in ("depth", "across_track", "along_track")}
    got = gsfpy_pings(path)
    assert_pings_match(got, sent, table)
    assert got[0]["pitch"] == 0 and got[0]["course"] == pytest.approx(sent["heading"][0], abs=0.005)
    assert got[0]["height"] == pytest.approx(9999.99)


@pytest.mark.parametrize("change, match", [
    (dict(depth="nan"), "non-finite"),
    (dict(depth="huge"), "cannot be stored"),
    (dict(latitude=95.0), "latitude"),
    (dict(time_nsec=10**9), "time_nsec"),
    (dict(time_sec=-1), "time_sec"),
    (dict(beam_angle="wide"), "beam_angle"),
])
def test_unrepresentable_values_raise_gsf_error_and_write_nothing(tmp_path, change, match):
    path = tmp_path / "bad.gsf"
    sent = survey_like(P=3, B=4)
    for k, v in change.items():
        if v == "nan":
            sent[k] = sent[k].copy()
            sent[k][1, 2] = np.nan
        elif v == "huge":
            sent[k] = np.linspace(0.0, 5e6, 12).reshape(3, 4)
        elif v == "wide":
            sent[k] = np.linspace(-4000.0, 4000.0, 12).reshape(3, 4)
        else:
            sent[k] = np.full(3, v)
    with GsfWriter(path) as w:
        size = w.bytes_written
        with pytest.raises(GsfError, match=match) as info:
            w.write_pings(**sent)
        assert info.value.path == str(path) and info.value.offset == size
        assert w.bytes_written == size
    assert path.stat().st_size == size


def test_explicit_factor_too_small_raises(tmp_path):
    sent = survey_like(P=2, B=3)
    with GsfWriter(tmp_path / "x.gsf") as w, pytest.raises(GsfError, match="do not fit"):
        w.write_pings(scale_factors={"depth": (1000, 0, 2)}, **sent)


def test_bad_arguments_raise_gsf_error_with_path(tmp_path):
    path = tmp_path / "args.gsf"
    with pytest.raises(GsfError, match="version") as info:
        GsfWriter(path, version="v3")
    assert info.value.path == str(path)
    with GsfWriter(path) as w:
        for call in (lambda: w.write_comment("x", time=(-1, 0)),
                     lambda: w.write_pings(scale_factors={"bogus": (1, 0, 2)}, **survey_like()),
                     lambda: w.write_pings(scale_factors={"depth": (0, 0, 4)}, **survey_like()),
                     lambda: w.write_pings(scale_factors={"beam_angle": (100, 0, 4)}, **survey_like()),
                     lambda: w.write_pings(**survey_like(heading=np.zeros(2))),
                     lambda: w.write_history(host_name="h" * 80)):
            with pytest.raises(GsfError) as info:
                call()
            assert info.value.path == str(path)


def test_writer_is_deterministic(tmp_path):
    for name in ("a.gsf", "b.gsf"):
        with GsfWriter(tmp_path / name) as w:
            w.write_comment("x")
            w.write_pings(**survey_like(P=5, B=7, seed=9))
    assert (tmp_path / "a.gsf").read_bytes() == (tmp_path / "b.gsf").read_bytes()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(P=st.integers(1, 5), B=st.integers(1, 40), seed=st.integers(0, 2**31),
       dscale=st.sampled_from([0.5, 30.0, 3000.0, 11000.0]),
       dshift=st.sampled_from([-20.0, 0.0, 1000.0]),
       version=st.sampled_from(["GSF-v03.08", "GSF-v03.06", "GSF-v02.09"]))
def test_property_round_trip_via_gsfpy(tmp_path, P, B, seed, dscale, dshift, version):
    rng = np.random.default_rng(seed)
    sent = survey_like(P=P, B=B, seed=seed,
                       depth=dshift + rng.uniform(0, dscale, (P, B)),
                       across_track=rng.uniform(-dscale, dscale, (P, B)))
    path = tmp_path / f"prop_{seed}_{P}_{B}.gsf"
    with GsfWriter(path, version=version) as w:
        w.write_pings(**sent)
        table = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    assert_pings_match(gsfpy_pings(path), sent, table)
    path.unlink()


# ---------------------------------------------------------------------------- our reader
def test_round_trip_via_our_reader(tmp_path):
    """Our reader (``pfm_dask.gsf.read_pings``) gives back what we wrote (fails until it lands)."""
    from pfm_dask.gsf import read_pings

    path = tmp_path / "ours.gsf"
    nb = np.array([6, 2, 6, 1])
    sent = survey_like(P=4, B=6, seed=21)
    sent2 = survey_like(P=2, B=3, seed=22)
    with GsfWriter(path) as w:
        w.write_comment("ours")
        w.write_pings(number_beams=nb, **sent)
        t1 = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
        w.write_pings(scale_factors={"depth": (100, -700, 4)}, **sent2)
        t2 = {n: w.scale_factors[ARRAY_ID[n]] for n in BEAM_ARRAYS}
    table = read_pings(path)
    assert table.num_rows == int(nb.sum()) + 6
    cols = {c: table.column(c).to_numpy(zero_copy_only=False) for c in table.column_names}
    rows = []   # expected rows, in file order: (ping index, beam index, dict, table)
    for i in range(4):
        rows += [(i, j, sent, t1) for j in range(nb[i])]
    for i in range(2):
        rows += [(i, j, sent2, t2) for j in range(3)]
    pings_in_order = list(dict.fromkeys(cols["ping"].tolist()))
    assert len(pings_in_order) == 6
    beam0 = cols["beam"].min()
    for r, (i, j, src, tab) in enumerate(rows):
        assert cols["beam"][r] - beam0 == j
        assert cols["time_sec"][r] == src["time_sec"][i]
        assert cols["time_nsec"][r] == src["time_nsec"][i]
        assert abs(cols["latitude"][r] - src["latitude"][i]) <= 0.5e-7 + 1e-12
        assert abs(cols["longitude"][r] - src["longitude"][i]) <= 0.5e-7 + 1e-12
        dh = abs(cols["heading"][r] - src["heading"][i])
        assert min(dh, 360 - dh) <= 0.005 + 1e-6
        assert cols["beam_flags"][r] == src["beam_flags"][i, j]
        assert cols["ping_flags"][r] == src["ping_flags"][i]
        for name in ("depth", "across_track", "along_track", "nominal_depth",
                     "horizontal_error", "vertical_error"):
            tol = _tol(tab[name].multiplier) + 1e-6   # float32 columns allowed
            assert abs(float(cols[name][r]) - src[name][i, j]) <= tol + 1e-7 * abs(src[name][i, j]), \
                (name, r)
