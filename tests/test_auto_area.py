"""The automatic area (issue 20): one bad ping position is damage, not the area's size; a
survey across the 180th meridian loads; inputs over several oceans load (or are refused in
one line naming the files and a bin size that fits, which then loads).

References: positions planted by hand at ping records found by a plain walk of the size words
(tests/test_bad_inputs.ping_records), the synthetic surveys' own truth (survey.json), the GSF
reader's ping-header extents (gsf-info), and a brute-force shortest arc.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pfm_dask import auto_area, gsf, pfm, pipeline, synth
from pfm_dask.config import LoadConfig

from .conftest import SAMPLE_FILES, missing_sample
from .test_bad_inputs import ping_records
from .test_resume import pfm_cli


# ----------------------------------------------------------------- one bad position
@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto")
    synth.generate(root / "s", files=2, pings=60, beams=32, seed=11, latitude=17.8,
                   longitude=-64.6)
    return root, sorted((root / "s").glob("*.gsf"))


def _plant(src: Path, dst: Path, ping: int, lat: float, lon: float) -> int:
    """Copy ``src`` with ping ``ping`` (0-based) moved to (lat, lon); its record's offset."""
    b = bytearray(src.read_bytes())
    p, h, _ = ping_records(bytes(b))[ping]
    struct.pack_into(">ii", b, p + h + 8, int(round(lon * 1e7)), int(round(lat * 1e7)))
    dst.write_bytes(bytes(b))
    return p


def _bins(res) -> int:
    return res.grid["width"] * res.grid["height"]


def test_a_jog_between_the_sampled_pings_stays_inside_the_automatic_area(tmp_path):
    """The pre-scan decodes every 10th of 480 pings; pings 3-7 jog 2 km east of the line (a
    legal track, within the far-ping slack): their soundings load like the straight line's,
    none outside the area, and every beam position lies inside the grid."""
    synth.generate(tmp_path / "s", files=1, pings=480, beams=16, seed=5, latitude=17.8,
                   longitude=-64.6)
    src = next((tmp_path / "s").glob("*.gsf"))
    moved = tmp_path / "jog.gsf"
    b = bytearray(src.read_bytes())
    east = 2000.0 / (111_320.0 * np.cos(np.radians(17.8)))
    for p, h, _ in ping_records(bytes(b))[3:8]:
        lon, lat = struct.unpack_from(">ii", b, p + h + 8)
        struct.pack_into(">i", b, p + h + 8, lon + int(round(east * 1e7)))
    moved.write_bytes(bytes(b))
    cfg = LoadConfig(bin_size_m=25.0)
    clean = pipeline.run_load([str(src)], tmp_path / "clean.pfm", cfg, mode="serial")
    res = pipeline.run_load([str(moved)], tmp_path / "jog.pfm", cfg, mode="serial")
    assert res.files[0]["outside_area"] == 0, res.summary()
    assert res.totals["loaded"] == clean.totals["loaded"] > 0
    # every beam, by two NGS geodesics each, inside the grid's corners
    with gsf.GsfFile(moved) as f:
        c = f.read_columns_at(list(range(f.n_pings)))
    lat, lon = gsf.beam_positions_reference(c["latitude"], c["longitude"], c["heading"],
                                            c["across_track"], c["along_track"])
    g = res.grid
    assert (g["min_y"] <= lat.min() and lat.max() <= g["max_y"]
            and g["min_x"] <= lon.min() and lon.max() <= g["max_x"]), (g, lat.min(), lon.max())


@pytest.mark.parametrize("where", [(25.8, -64.6), (0.0, 0.0)], ids=["8-degrees-north", "null-island"])
def test_one_far_ping_is_damage_and_does_not_size_the_area(survey, tmp_path, where):
    root, files = survey
    bad = tmp_path / "bad.gsf"
    offset = _plant(files[0], bad, 30, *where)
    cfg = LoadConfig(bin_size_m=25.0)
    clean = pipeline.run_load([str(f) for f in files], tmp_path / "clean.pfm", cfg, mode="serial")
    res = pipeline.run_load([str(bad), str(files[1])], tmp_path / "bad.pfm", cfg, mode="serial")
    # the area is the survey's: the same grid within the 1 % pad, not millions of bins more
    assert abs(_bins(res) - _bins(clean)) <= 0.05 * _bins(clean), (res.grid, clean.grid)
    # the damage names the file, the ping and its record's byte offset
    named = [p for p in res.problems if str(bad) in p and "ping 31" in p]
    assert len(named) == 1 and f"at byte {offset:,}" in named[0], res.problems
    assert "track" in named[0]
    assert res.exit_code == 3, res.summary()
    rec = [f for f in res.files if f["path"] == str(bad)][0]
    assert 0 < rec["outside_area"] <= 32            # only the far ping's beams
    assert res.totals["loaded"] == clean.totals["loaded"] - rec["outside_area"]


def test_a_far_ping_in_a_tiny_file_still_never_fails_without_the_files_name(survey, tmp_path,
                                                                            monkeypatch):
    """Two pings (no majority to judge by) and one of them at (0, 0): the null fix is damage."""
    root, files = survey
    blob = files[0].read_bytes()
    recs = ping_records(blob)
    two = tmp_path / "two.gsf"
    two.write_bytes(blob[:recs[2][0]])   # the header records and the first two pings
    b = bytearray(two.read_bytes())
    struct.pack_into(">ii", b, recs[1][0] + recs[1][1] + 8, 0, 0)
    two.write_bytes(bytes(b))
    res = pipeline.run_load([str(two)], tmp_path / "two.pfm", LoadConfig(bin_size_m=25.0),
                            mode="serial")
    assert [p for p in res.problems if str(two) in p and "ping 2" in p], res.problems
    assert _bins(res) < 10_000


# ----------------------------------------------------------------- the 180th meridian
def test_a_survey_across_the_dateline_loads_with_the_automatic_area(tmp_path):
    synth.generate(tmp_path / "dl", files=2, pings=40, beams=32, seed=4, latitude=-16.0,
                   longitude=179.97)
    truth = json.loads((tmp_path / "dl" / "survey.json").read_text())["area"]
    assert truth["west"] < 180.0 < truth["east"]    # the beams cross it (east as lon + 360)
    files = sorted((tmp_path / "dl").glob("*.gsf"))
    out = tmp_path / "dl.pfm"
    res = pipeline.run_load([str(f) for f in files], out, LoadConfig(bin_size_m=10.0),
                            mode="serial")
    assert res.exit_code == 0, res.summary()
    g = res.grid
    assert g["min_x"] < truth["west"] and g["max_x"] > truth["east"] > 180.0, g
    assert g["max_x"] - g["min_x"] < 0.2 and res.totals["outside_area"] == 0
    pfm.dump(out, soundings=tmp_path / "s.parquet")
    x = pq.read_table(tmp_path / "s.parquet").column("x").to_numpy()
    assert x.size == res.totals["loaded"] and (x > 180.0).any() and (x < 180.0).any()
    assert x.min() >= truth["west"] - 1e-3 and x.max() <= truth["east"] + 1e-3


# ----------------------------------------------------------------- several oceans
def test_inputs_over_several_oceans_load_with_a_bin_size_that_fits(tmp_path):
    if not SAMPLE_FILES:
        missing_sample()
    out = tmp_path / "oceans.pfm"
    r = pfm_cli("load", *SAMPLE_FILES, "-o", out, "--serial", "-q")
    # the default 2 m grid over ~130 degrees of longitude cannot be made: one line naming
    # the files at the area's sides and a bin size that fits
    assert r.returncode == 2, r.stdout + r.stderr
    line = r.stderr.strip()
    assert len(line.splitlines()) == 1 and "sides come from" in line, line
    ex = {p: gsf.GsfFile(p, strict=False).info() for p in SAMPLE_FILES}
    with_pings = [p for p in SAMPLE_FILES if ex[p]["n_pings"]]
    assert sum(str(p) in line for p in with_pings) >= 2
    size = line.split("--bin-size ")[1].split()[0]
    r = pfm_cli("load", *SAMPLE_FILES, "-o", out, "--serial", "-q", "--bin-size", size, "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert rep["totals"]["outside_area"] == 0
    loaded = {f["path"]: f["loaded"] for f in rep["files"]}
    assert all(loaded[str(p)] > 0 for p in with_pings)
    # each file's soundings lie at its own pings (the reader's extents), east of 180 as + 360
    pfm.dump(out, soundings=tmp_path / "s.parquet")
    t = pq.read_table(tmp_path / "s.parquet")
    fnum, xs = t.column("file").to_numpy(), t.column("x").to_numpy()
    with pfm.open_pfm(out, "r") as f:
        number = {x.path: x.number for x in f.files()}
    for p in with_pings:
        x = xs[fnum == number[str(p)]]
        lo, hi = ex[p]["longitude"]["min"], ex[p]["longitude"]["max"]
        lo, hi = (lo + 360, hi + 360) if hi < 0 else (lo, hi)
        assert x.size == loaded[str(p)] and x.min() > lo - 0.1 and x.max() < hi + 0.1, p


# ----------------------------------------------------------------- the pieces, alone
def _brute_arc(w, e):
    """The shortest covering arc by trying every interval's west as the start (slow, plain)."""
    best = None
    for start in w:
        need = max(((wi - start) % 360.0) + (ei - wi) for wi, ei in zip(w, e))
        if best is None or need < best[1] - 1e-9:
            best = (start, need)
    return best


@pytest.mark.parametrize("seed", range(40))
def test_covering_arc_is_the_shortest(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 8))
    centre = rng.uniform(-180, 180)
    w = (centre + rng.uniform(-100, 100, n) + 180) % 360 - 180
    e = w + rng.uniform(0, 30, n)
    west, east = auto_area.covering_arc(w, e)
    start, need = _brute_arc(w, e)
    assert -180.0 <= west < 180.0 and east > west
    assert east - west == pytest.approx(need, abs=1e-9)
    for wi, ei in zip(w, e):   # every interval inside [west, east] once unrolled
        off = (wi - west) % 360.0
        assert off + (ei - wi) <= east - west + 1e-9


def _track(n=2000, knots=10.0):
    t = 1.7e9 + np.arange(n, dtype=float)
    north = np.arange(n) * knots * 0.5144 / 111_320.0
    return {"time": t, "latitude": 10.0 + north, "longitude": np.full(n, -30.0)}


def test_far_pings_finds_the_one_bad_fix_and_nothing_on_a_good_track():
    h = _track()
    offs = np.arange(h["time"].size) * 1000
    assert auto_area.far_pings(h, offs, "x.gsf").pings.size == 0
    h["latitude"][700] += 0.5     # 55 km off in a 2000 s file: no ship gets there and back
    far = auto_area.far_pings(h, offs, "x.gsf")
    assert far.pings.tolist() == [700] and far.damage[0]["offset"] == 700_000
    assert np.flatnonzero(~far.usable).tolist() == [700]     # what may size the area
    assert "ping 701" in far.damage[0]["reason"]
    h = _track()
    h["time"][:] = 0.0            # no usable clock: only what lies far beyond the spread
    h["longitude"][5] = 20.0
    assert auto_area.far_pings(h, offs, "x.gsf").pings.tolist() == [5]
    fast = _track(knots=40.0)     # a fast but real track is never damage
    assert auto_area.far_pings(fast, offs, "x.gsf").pings.size == 0


def test_prescan_extent_from_corners_equals_extent_of():
    """The pre-scan takes a sample's extent from its corner longitudes when they lie within
    half a turn in [-180, 180): the same as extent_of over every position, anywhere on the
    circle, near and across the meridian, with NaN positions."""
    from pfm_dask.planning import _extent

    rng = np.random.default_rng(1)
    for _ in range(3000):
        n = int(rng.integers(1, 50))
        width = rng.choice([0.001, 1.0, 90.0, 179.9, 180.0, 200.0, 359.0])
        lon = rng.uniform(-180, 180) + rng.uniform(-width / 2, width / 2, n)
        lon = np.where(rng.random(n) < 0.5, (lon + 180.0) % 360.0 - 180.0, lon)
        if rng.random() < 0.1:
            lon[0] = np.nan
        lat = rng.uniform(-80, 80, n)
        assert _extent(lat, lon) == auto_area.extent_of(lat, lon)


def test_swath_outline_gives_each_unsampled_ping_the_wider_swath_around_it():
    """Five pings heading north on the equator, pings 0 and 4 decoded (100 m to port and 50 m
    to starboard; 30 m and 200 m): pings 1-3 get 100 m and 200 m, ping 2 where its own
    header puts it (1 km east); a one-beam ping is its own position; the sampled pings are
    left to their own beams. Reference: the NGS geodesic, two per corner (the outline's
    tangent-plane moves agree to a centimetre over these distances)."""
    m = 1.0 / 111_319.49   # degrees of longitude per metre on the equator (WGS 84)
    h = {"latitude": np.array([0.0, 0.001, 0.002, 0.003, 0.004]),
         "longitude": np.array([0.0, 0.0, 1000 * m, 0.0, 0.0]),
         "heading": np.zeros(5), "number_beams": np.array([9, 9, 9, 1, 9])}
    ping, across = np.array([0, 0, 4, 4]), np.array([-100.0, 50.0, -30.0, 200.0])
    lat, lon = auto_area.swath_outline(h, np.ones(5, dtype=bool), np.array([0, 4]), ping,
                                       across, np.zeros(4))
    assert lat.size == 1 + 2 * 4          # ping 3 alone, pings 1 and 2 four corners each
    assert lon[0] == 0.0 and lat[0] == 0.003
    ref_lat, ref_lon = gsf.beam_positions_reference(
        np.repeat([0.001, 0.002], 4), np.repeat([0.0, 1000 * m], 4), 0.0,
        np.tile([-100.0, -100.0, 200.0, 200.0], 2))
    np.testing.assert_allclose(np.sort(lon[1:]), np.sort(ref_lon), atol=1e-7)
    np.testing.assert_allclose(np.sort(lat[1:]), np.sort(ref_lat), atol=1e-7)
    assert lon.max() == pytest.approx(1200 * m, abs=1e-7)
    assert lon.min() == pytest.approx(-100 * m, abs=1e-7)
    every = auto_area.swath_outline(h, np.ones(5, dtype=bool), np.arange(5), ping, across,
                                    np.zeros(4))
    assert every[0].size == 0             # all sampled: nothing to add


def test_the_outlines_moves_keep_to_their_bound_against_the_geodesic():
    """``_moved`` (tangent plane) against two NGS geodesics per point, moves of up to 3 km
    from 85 S to 85 N: off by at most d² tan|lat| / 6,300 km (its docstring's bound)."""
    rng = np.random.default_rng(7)
    n = 20_000
    lat, lon = rng.uniform(-85, 85, n), rng.uniform(-180, 180, n)
    hdg, across, along = rng.uniform(0, 360, n), rng.uniform(-3000, 3000, n), rng.uniform(-100, 100, n)
    got = auto_area._moved(lat, lon, hdg, across, along)
    ref = gsf.beam_positions_reference(lat, lon, hdg, across, along)
    off = auto_area._distance_m(*got, *ref)
    bound = (across ** 2 + along ** 2) * np.abs(np.tan(np.radians(lat))) / 6.3e6
    assert np.all(off <= bound + 0.01), (off - bound).max()
