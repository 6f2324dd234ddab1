"""Synthetic surveys: determinism, the truth file against the bytes (via gsfpy), realism, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pfm_dask import synth
from pfm_dask.cli import app
from pfm_dask.errors import ConfigError

gsfpy = pytest.importorskip("gsfpy")
from gsfpy import open_gsf  # noqa: E402
from gsfpy3_08 import GsfException  # noqa: E402


def read_with_gsfpy(path):
    """Per ping via libgsf: dict of header values and beam arrays (P1: lat/lon swapped back)."""
    pings = []
    with open_gsf(str(path)) as f:
        while True:
            try:
                rid, rec = f.read()
            except GsfException as err:
                assert err.error_code == -23
                break
            if rid.recordID != 2:
                continue
            m = rec.mb_ping
            n = m.number_beams
            pings.append({
                "t": m.ping_time.tv_sec + m.ping_time.tv_nsec * 1e-9,
                "lat": m.longitude, "lon": m.latitude, "heading": m.heading,
                "ping_flags": m.ping_flags, "n": n,
                "depth": np.ctypeslib.as_array(m.depth, (n,)).copy(),
                "across": np.ctypeslib.as_array(m.across_track, (n,)).copy(),
                "along": np.ctypeslib.as_array(m.along_track, (n,)).copy(),
                "flags": np.ctypeslib.as_array(m.beam_flags, (n,)).copy(),
                "herr": np.ctypeslib.as_array(m.horizontal_error, (n,)).copy(),
                "verr": np.ctypeslib.as_array(m.vertical_error, (n,)).copy(),
                "tt": np.ctypeslib.as_array(m.travel_time, (n,)).copy(),
                "angle": np.ctypeslib.as_array(m.beam_angle, (n,)).copy(),
            })
    return pings


KW = dict(spike_rate=2e-3, cluster_rate=0.2)


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    out = tmp_path_factory.mktemp("survey")
    summary = synth.generate(out, files=3, pings=60, beams=432, seed=7, **KW)
    return out, summary


def test_summary_is_json_and_consistent(survey):
    out, s = survey
    json.dumps(s)                       # JSON-serialisable
    assert [f["name"] for f in s["files"]] == sorted(p.name for p in out.glob("*.gsf"))
    assert s["files"][0]["name"] == "0001_20260314_120000_SYNTH_EM302.gsf"
    assert s["pings"] == 180 and s["beams"] == 432 and s["soundings"] == 180 * 432
    assert s["bytes"] == sum(p.stat().st_size for p in out.glob("*.gsf"))
    assert sum(s["flags"].values()) == s["soundings"]
    assert s["flags"]["0x00"] > 0.9 * s["soundings"]
    assert {"0x01", "0x09"} <= set(s["flags"])
    truth = pq.read_table(out / "truth.parquet")
    assert s["spikes"]["total"] == truth.num_rows > 0
    assert s["area"]["south"] < s["area"]["north"] and s["area"]["west"] < s["area"]["east"]
    assert 800 * 0.6 <= s["depth_range"][0] < s["depth_range"][1] <= 2500 * 1.4  # spikes ±35 %
    assert s["elapsed_s"] > 0 and s["mb_per_s"] > 0
    meta = json.loads((out / "survey.json").read_text())
    assert meta["parameters"]["seed"] == 7 and "elapsed_s" not in meta


def test_truth_matches_the_bytes_via_gsfpy(survey):
    out, s = survey
    truth = pq.read_table(out / "truth.parquet").to_pydict()
    flag_counts = {}
    for f in s["files"]:
        pings = read_with_gsfpy(out / f["name"])
        assert len(pings) == 60 and all(p["n"] == 432 for p in pings)
        for p in pings:
            for v, c in zip(*np.unique(p["flags"], return_counts=True)):
                flag_counts[f"0x{v:02X}"] = flag_counts.get(f"0x{v:02X}", 0) + int(c)
        rows = [i for i, name in enumerate(truth["file"]) if name == f["name"]]
        for i in rows:
            p = pings[truth["ping"][i] - 1]
            b = truth["beam"][i] - 1
            assert p["ping_flags"] == 0
            assert p["flags"][b] == 0                        # spikes sit in valid beams
            assert p["depth"][b] == pytest.approx(truth["planted_depth"][i], abs=6e-4)
            mag = abs(truth["planted_depth"][i] - truth["clean_depth"][i]) / truth["true_depth"][i]
            assert 0.03 * 0.85 - 1e-6 <= mag <= 0.30 * 1.15 + 1e-6
            assert truth["kind"][i].split("_")[1] == (
                "deep" if truth["planted_depth"][i] > truth["clean_depth"][i] else "shallow")
            assert truth["file_index"][i] == int(f["name"][:4]) - 1
            # the spike's footprint is where the ship and the across/along distances put it
            dn = (-p["across"][b] * math.sin(math.radians(p["heading"]))
                  + p["along"][b] * math.cos(math.radians(p["heading"])))
            assert truth["latitude"][i] == pytest.approx(p["lat"] + dn / 111_000, abs=1e-4)
    assert flag_counts == s["flags"]
    kinds = set(truth["kind"])
    assert {"single_deep", "single_shallow"} <= kinds
    assert any(k.startswith("cluster") for k in kinds)


def test_realistic_geometry(survey):
    out, s = survey
    files = [out / f["name"] for f in s["files"]]
    lines = [read_with_gsfpy(p) for p in files]
    for k, pings in enumerate(lines):
        t = np.array([p["t"] for p in pings])
        lat = np.array([p["lat"] for p in pings])
        lon = np.array([p["lon"] for p in pings])
        hdg = np.array([p["heading"] for p in pings])
        dt = np.diff(t)
        assert np.all((dt > 1.0) & (dt < 12.0))            # a few seconds in deep water
        dist = np.hypot(np.diff(lat) * 111_000, np.diff(lon) * 111_000 * math.cos(math.radians(36)))
        speed_kn = np.median(dist / dt) / (1852 / 3600)
        assert 7.0 < speed_kn < 9.0
        want = 0.0 if k % 2 == 0 else 180.0
        dev = (hdg - want + 180) % 360 - 180
        assert np.abs(dev).max() < 3.0                     # lawnmower, small yaw
        p = pings[10]
        ok = p["flags"] == 0
        assert np.all(np.diff(p["angle"]) > 0) and p["angle"][0] == pytest.approx(-65, abs=0.01)
        assert p["across"][ok][0] < 0 < p["across"][ok][-1]   # port first
        # across-track ≈ depth × tan(angle) for valid beams (slopes bend it a little)
        ratio = p["across"][ok] / (p["depth"][ok] * np.tan(np.radians(p["angle"][ok])) + 1e-9)
        outer = np.abs(p["angle"][ok]) > 20
        assert np.median(np.abs(ratio[outer] - 1)) < 0.1
        assert np.abs(p["along"][ok]).max() < 60
        # 95 % errors: vertical about 1.96 × 0.2–0.5 % of depth, horizontal grows outward
        assert np.all(p["verr"][ok] > 0.003 * p["depth"][ok])
        assert np.all(p["verr"][ok] < 0.015 * p["depth"][ok] + 1)
        assert p["herr"][ok][0] > p["herr"][ok][len(p["herr"][ok]) // 2]
        assert np.all(p["tt"][ok] > 2 * p["depth"][ok] / 1500 * 0.8)
    # adjacent lines overlap: the starboard edge of line 1 passes the port edge of line 2
    def edges(pings, side):
        vals = []
        for p in pings:
            ok = (p["flags"] == 0) & (p["depth"] > 0)
            h = math.radians(p["heading"])
            e = p["lon"] * 111_000 * math.cos(math.radians(36)) + p["across"][ok] * math.cos(h)
            vals.append(e.max() if side == "max" else e.min())
        return np.median(vals)
    assert edges(lines[0], "max") > edges(lines[1], "min")


def test_noise_level_and_null_beams(survey):
    out, s = survey
    pings = read_with_gsfpy(out / s["files"][0]["name"])
    d = np.array([p["depth"] for p in pings])
    fl = np.array([p["flags"] for p in pings])
    # null beams: most carry depth 0, some a junk value (P7)
    null = fl == 1
    assert null.sum() > 0 and (d[null] == 0).mean() > 0.4
    # beam-to-beam noise of valid nadir beams: second differences ≈ 0.2 % of depth (× √6)
    mid = d[:, 200:232]
    okm = (fl[:, 200:232] == 0)
    dd = np.diff(mid, 2, axis=1)[okm[:, 2:] & okm[:, 1:-1] & okm[:, :-2]]
    rel = np.median(np.abs(dd)) / np.median(mid) / 0.6745 / math.sqrt(6)
    assert 0.001 < rel < 0.004


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    synth.generate(a, files=2, pings=30, beams=64, seed=11, **KW)
    synth.generate(b, files=2, pings=30, beams=64, seed=11, **KW)
    synth.generate(c, files=2, pings=30, beams=64, seed=12, **KW)
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    gsf = [n for n in names if n.endswith(".gsf")]
    assert all((a / n).read_bytes() != (c / n).read_bytes() for n in gsf if (c / n).exists())


def test_workers_do_not_change_the_bytes(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    synth.generate(one, files=3, pings=8, beams=32, seed=5, **KW)
    synth.generate(two, files=3, pings=8, beams=32, seed=5, workers=2, **KW)
    for p in sorted(one.iterdir()):
        assert p.read_bytes() == (two / p.name).read_bytes(), p.name


def test_rerun_replaces_an_earlier_survey(tmp_path):
    synth.generate(tmp_path, files=3, pings=5, beams=16, seed=1)
    synth.generate(tmp_path, files=1, pings=5, beams=16, seed=1)
    assert len(list(tmp_path.glob("*.gsf"))) == 1


def test_small_and_odd_shapes(tmp_path):
    s = synth.generate(tmp_path / "one", files=1, pings=3, beams=1, seed=2, depth_range=(5.0, 40.0))
    pings = read_with_gsfpy(tmp_path / "one" / s["files"][0]["name"])
    assert [p["n"] for p in pings] == [1, 1, 1]
    assert 5.0 * 0.9 <= s["depth_range"][0] <= s["depth_range"][1] <= 40 * 1.1


@pytest.mark.parametrize("kw", [dict(files=0), dict(pings=0), dict(beams=40000),
                                dict(depth_range=(100.0, 50.0)), dict(overlap=1.0)])
def test_bad_parameters_raise_config_error(tmp_path, kw):
    with pytest.raises(ConfigError):
        synth.generate(tmp_path, **kw)


def test_our_reader_agrees_with_gsfpy(survey):
    """Our reader sees the same soundings as libgsf (fails until pfm_dask.gsf.read_pings exists)."""
    from pfm_dask.gsf import read_pings

    out, s = survey
    path = out / s["files"][1]["name"]
    ref = read_with_gsfpy(path)
    t = read_pings(path)
    assert t.num_rows == sum(p["n"] for p in ref)
    np.testing.assert_allclose(t.column("depth").to_numpy(), np.concatenate([p["depth"] for p in ref]),
                               atol=1e-9)
    np.testing.assert_array_equal(t.column("beam_flags").to_numpy(),
                                  np.concatenate([p["flags"] for p in ref]))
    np.testing.assert_allclose(t.column("across_track").to_numpy(),
                               np.concatenate([p["across"] for p in ref]), atol=1e-9)


# ------------------------------------------------------------------------------------ CLI
def test_cli_synth_json(tmp_path):
    out = tmp_path / "cli"
    res = CliRunner().invoke(app, ["synth", str(out), "--files", "2", "--pings", "10",
                                   "--beams", "32", "--seed", "4", "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["pings"] == 20 and summary["beams"] == 32
    assert len(list(out.glob("*.gsf"))) == 2 and (out / "truth.parquet").exists()


def test_cli_synth_human_and_errors(tmp_path):
    res = CliRunner().invoke(app, ["synth", str(tmp_path / "h"), "--files", "1", "--pings", "4",
                                   "--beams", "8"])
    assert res.exit_code == 0, res.output
    assert "soundings: 32" in res.output
    bad = CliRunner().invoke(app, ["synth", str(tmp_path / "x"), "--files", "0"])
    assert bad.exit_code == 2
    assert "files must be" in bad.output
