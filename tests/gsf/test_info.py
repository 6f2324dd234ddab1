"""``gsf.info`` and the ``pfm-dask gsf-info`` command.

Reference values: libgsf through gsfpy (ping times and positions, P1 undone),
SOURCES.md (record counts, versions), and hand-built files for damage reports.
"""

from __future__ import annotations

import datetime as dt
import json

from typer.testing import CliRunner

from pfm_dask import gsf
from pfm_dask.cli import app

from .test_framing import EXPECTED_COUNTS, VERSIONS
from .test_pitfalls import depth_ping, header_record, ping_record, sf_table, write
from .test_reader_vs_gsfpy import gsfpy_pings

KEYS = {"path", "size", "version", "major", "minor", "record_counts", "n_pings",
        "n_ping_records", "n_beams", "beams_per_ping", "arrays", "sensor_subrecords", "time",
        "latitude", "longitude", "damage"}


def test_info_matches_libgsf(gsf_sample):
    d = gsf.info(gsf_sample)
    assert set(d) == KEYS
    assert json.loads(json.dumps(d)) == d                     # JSON-serialisable as is
    key = next(k for k in EXPECTED_COUNTS if k in gsf_sample.name)
    assert d["version"] == VERSIONS[key]
    assert d["record_counts"] == EXPECTED_COUNTS[key]
    assert d["size"] == gsf_sample.stat().st_size
    assert d["damage"] == []
    ref = gsfpy_pings(gsf_sample)
    assert d["n_pings"] == len(ref)
    assert d["n_beams"] == sum(p["n"] for p in ref)
    if not ref:
        assert d["beams_per_ping"] == {"min": None, "max": None}
        assert d["time"]["start"] is None and d["latitude"]["min"] is None
        return
    assert d["beams_per_ping"] == {"min": min(p["n"] for p in ref),
                                   "max": max(p["n"] for p in ref)}
    t = sorted((p["time_sec"], p["time_nsec"]) for p in ref)
    assert d["time"]["start"] == t[0][0] + t[0][1] / 1e9
    assert d["time"]["end"] == t[-1][0] + t[-1][1] / 1e9
    start = dt.datetime.fromtimestamp(t[0][0], dt.timezone.utc)
    assert d["time"]["start_iso"] == start.strftime("%Y-%m-%dT%H:%M:%S") + f".{t[0][1]:09d}Z"
    assert d["latitude"] == {"min": min(p["latitude"] for p in ref),
                             "max": max(p["latitude"] for p in ref)}
    assert d["longitude"] == {"min": min(p["longitude"] for p in ref),
                              "max": max(p["longitude"] for p in ref)}
    assert "depth" in d["arrays"] and "beam_flags" in d["arrays"]


def test_info_sample_arrays(sample_by_name):
    d = gsf.info(sample_by_name("EM302"))
    assert d["arrays"] == ["depth", "across_track", "along_track", "travel_time", "beam_angle",
                           "mc_amplitude", "quality_factor", "beam_flags", "beam_angle_forward",
                           "vertical_error", "horizontal_error", "intensity_series",
                           "sector_number"]
    assert d["sensor_subrecords"] == [134]


def test_info_reports_damage(tmp_path):
    bad = ping_record(sf_table([(1, 0, 0, 0)]), n=2)
    blob = header_record() + depth_ping([1, 2], lat=10.0) + bad + depth_ping([3, 4], lat=20.0)
    path = write(tmp_path, "d.gsf", blob)
    d = gsf.info(path)
    assert d["n_ping_records"] == 3 and d["n_pings"] == 1 and d["n_beams"] == 2
    assert d["latitude"] == {"min": 10.0, "max": 10.0}
    (dmg,) = d["damage"]
    assert dmg["error"] == "GsfError" and dmg["path"] == str(path)
    assert dmg["offset"] == 20 + len(depth_ping([1, 2], lat=10.0))
    assert "multiplier 0" in dmg["reason"]


def test_info_null_positions_excluded(tmp_path):
    """Pings at libgsf's null position (lat 91, lon 181) do not widen the extents."""
    blob = (header_record() + depth_ping([1], lat=91.0, lon=181.0)
            + depth_ping([1], lat=-33.5, lon=151.25))
    d = gsf.info(write(tmp_path, "n.gsf", blob))
    assert d["latitude"] == {"min": -33.5, "max": -33.5}
    assert d["longitude"] == {"min": 151.25, "max": 151.25}


# --- CLI ----------------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_gsf_info_json(sample_by_name):
    path = sample_by_name("EX1604")
    res = runner.invoke(app, ["gsf-info", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == gsf.info(path)


def test_cli_gsf_info_several_files_and_text(sample_by_name):
    a, b = sample_by_name("EX1502L2"), sample_by_name("6_184_1440")
    res = runner.invoke(app, ["gsf-info", str(a), str(b), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert [o["n_pings"] for o in out] == [4, 132]
    res = runner.invoke(app, ["gsf-info", str(a)])
    assert res.exit_code == 0
    assert "GSF-v03.06" in res.output and "n_pings: 4" in res.output


def test_cli_gsf_info_bad_file(tmp_path, sample_by_name):
    bad = write(tmp_path, "bad.gsf", b"not gsf at all")
    res = runner.invoke(app, ["gsf-info", str(bad), str(sample_by_name("EX1604")), "--json"])
    assert res.exit_code == 1
    out = json.loads(res.stdout if hasattr(res, "stdout") else res.output)
    assert "not a GSF file" in out[0]["error"] and out[1]["n_pings"] == 8


def test_cli_gsf_info_missing(tmp_path):
    res = runner.invoke(app, ["gsf-info", str(tmp_path / "none.gsf")])
    assert res.exit_code == 1
