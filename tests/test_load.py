"""End-to-end loads checked against independent references (libgsf, geographiclib, plain stats)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pfm_dask import pfm, pipeline
from pfm_dask.cli import app
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

from . import reference as ref

NULL_DEPTH = 12001.0


def _dump(pfm_path: Path, tmp: Path) -> tuple[dict, dict]:
    s_path, b_path = tmp / "s.parquet", tmp / "b.parquet"
    pfm.dump(pfm_path, soundings=s_path, bins=b_path)
    s = pq.read_table(s_path).to_pydict()
    b = pq.read_table(b_path).to_pydict()
    return ({k: np.asarray(v) for k, v in s.items()}, {k: np.asarray(v) for k, v in b.items()})


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("survey")
    synth.generate(out, files=3, pings=40, beams=96, seed=7)
    return out


def _check_against_reference(paths, pfm_path, res, tmp, herr_default=1.5, verr_default=0.25):
    """Every beam libgsf decodes is either in the dump once or counted with its reason."""
    soundings, bins = _dump(pfm_path, tmp)
    with pfm.open_pfm(pfm_path) as f:
        grid = f.grid
        lines = f.lines()
        h = f.header
        hbits, hscale = h.horizontal_error_bits, h.horizontal_error_scale
        vbits, vscale = h.vertical_error_bits, h.vertical_error_scale
    by_file = {r["path"]: r for r in res.files}
    for fnum, path in enumerate(paths):
        exp = ref.expected_soundings(path, herr_default=herr_default, verr_default=verr_default)
        rep = by_file[str(path)]
        assert rep["soundings_read"] == exp["n_read"]
        assert rep["ping_skipped"] == exp["ping_skipped"]
        assert rep["beam_rejected"] == exp["beam_rejected"]
        assert (rep["loaded"] + rep["outside_area"] + rep["ping_skipped"] + rep["beam_rejected"]
                == rep["soundings_read"])
        mine = soundings["file"] == fnum
        assert int(mine.sum()) == rep["loaded"]
        keep = exp["keep"]
        # Positions by geographiclib, bins from the PFM's own header geometry.
        fx = (exp["lon"][keep] - grid.min_x) / grid.x_bin
        fy = (exp["lat"][keep] - grid.min_y) / grid.y_bin
        inside = (fx >= 0) & (fy >= 0) & (fx < grid.width) & (fy < grid.height)
        assert int(inside.sum()) == rep["loaded"]
        assert (~inside).sum() == rep["outside_area"]
        key_exp = exp["ping"][keep][inside] * 100000 + exp["beam"][keep][inside]
        key_got = soundings["ping"][mine].astype(np.int64) * 100000 + soundings["beam"][mine]
        assert np.unique(key_got).size == key_got.size, "a sounding was written twice"
        order_e = np.argsort(key_exp)
        order_g = np.argsort(key_got)
        np.testing.assert_array_equal(key_exp[order_e], key_got[order_g])
        g = {k: v[mine][order_g] for k, v in soundings.items()}
        e_x = np.floor(fx[inside][order_e]).astype(int)
        e_y = np.floor(fy[inside][order_e]).astype(int)
        # geographiclib and the NGS routine differ by ~1 mm: allow a bin change right at an edge.
        near_x = np.abs(fx[inside][order_e] - np.round(fx[inside][order_e])) < 1e-3
        near_y = np.abs(fy[inside][order_e] - np.round(fy[inside][order_e])) < 1e-3
        assert np.all((g["bin_x"] == e_x) | near_x)
        assert np.all((g["bin_y"] == e_y) | near_y)
        np.testing.assert_allclose(g["x"], exp["lon"][keep][inside][order_e],
                                   atol=grid.x_bin / 4095 + 1e-7)
        np.testing.assert_allclose(g["y"], exp["lat"][keep][inside][order_e],
                                   atol=grid.y_bin / 4095 + 1e-7)
        np.testing.assert_allclose(g["depth"], exp["depth"][keep][inside][order_e], atol=0.0051)
        exp_val = exp["validity"][keep][inside][order_e]
        assert (exp_val >= 0).all(), "unexpected GSF flag value in the input"
        np.testing.assert_array_equal(g["validity"], exp_val)
        # Errors beyond the header's bit width are stored as null (-999), as the library does.
        for col, key, bits, scale in (("horizontal_error", "herr", hbits, hscale),
                                      ("vertical_error", "verr", vbits, vscale)):
            e = exp[key][keep][inside][order_e]
            e = np.where(np.floor(e * scale + 0.5) >= (1 << bits) - 1, -999.0, e)
            np.testing.assert_allclose(g[col], e, atol=0.0051, err_msg=col)
        # Lines: pfmLoader's names and breaks over the pings that contributed, in order.
        contrib_pings = np.unique(exp["ping"][keep][inside])
        first = {}
        for i, p in enumerate(exp["ping"]):
            first.setdefault(int(p), i)
        idx = [first[int(p)] for p in contrib_pings]
        names = ref.expected_line_names(path, contrib_pings, exp["heading"][idx],
                                        exp["tsec"][idx], exp["tnsec"][idx])
        file_lines = sorted(set(g["line"].tolist()))
        assert [lines[i] for i in file_lines] == names
    # Bins: statistics recomputed plainly from the dumped soundings.
    want = ref.bin_stats(soundings["bin_x"], soundings["bin_y"], soundings["depth"],
                         soundings["validity"].astype(np.int64), NULL_DEPTH)
    assert len(want) == len(bins["bin_x"])
    for i in range(len(bins["bin_x"])):
        w = want[(int(bins["bin_x"][i]), int(bins["bin_y"][i]))]
        assert bins["num_soundings"][i] == w["num_soundings"]
        assert bins["num_valid"][i] == w["num_valid"]
        for k in ("avg_filtered", "min_filtered", "max_filtered"):
            # half the 0.01 m quantum, plus float32 decoding near 1e4 (docs/pfm-format.md §7)
            assert abs(bins[k][i] - w[k]) <= 0.0051 + 0.001, k
        assert abs(bins["std"][i] - w["std"]) <= 1e-5 + 1e-6 * w["std"]
    return soundings, bins


@pytest.mark.parametrize("mode", ["serial"])
def test_synthetic_survey_matches_independent_computation(survey, tmp_path, mode):
    paths = expand_inputs([survey])
    out = tmp_path / "s.pfm"
    res = pipeline.run_load(paths, out, LoadConfig(bin_size_m=25.0), mode=mode)
    assert res.exit_code == 0, res.summary()
    assert res.check["sound"]
    _check_against_reference(paths, out, res, tmp_path)


def test_real_gsf_samples_each_load_and_match_libgsf(gsf_sample, tmp_path):
    """Each real sample alone (their areas are oceans apart), against libgsf + geographiclib.

    The header-only sample has no ping to take an area from: the load must say so and
    name the way out (--mbr), not crash.
    """
    from pfm_dask.errors import ConfigError

    size = 20.0 if "6_184" in gsf_sample.name else 2.0
    out = tmp_path / "r.pfm"
    if "TN136" in gsf_sample.name:
        with pytest.raises(ConfigError, match="--mbr"):
            pipeline.run_load([gsf_sample], out, LoadConfig(bin_size_m=size), mode="serial")
        res = pipeline.run_load([gsf_sample], out, LoadConfig(mbr=(10, 10, 10.001, 10.001)),
                                mode="serial")
        assert res.check["sound"] and res.totals["soundings_read"] == 0
        return
    res = pipeline.run_load([gsf_sample], out, LoadConfig(bin_size_m=size), mode="serial")
    assert res.check["sound"], res.summary()
    _check_against_reference([gsf_sample], out, res, tmp_path)


def test_damaged_file_is_reported_and_the_rest_loads(survey, tmp_path):
    paths = expand_inputs([survey])
    bad = tmp_path / "broken.gsf"
    data = paths[1].read_bytes()
    cut = len(data) * 2 // 3
    bad.write_bytes(data[:cut])
    res = pipeline.run_load([paths[0], bad, paths[2]], tmp_path / "d.pfm",
                            LoadConfig(bin_size_m=25.0), mode="serial")
    assert res.exit_code == 3, res.summary()
    assert res.check["sound"]
    assert len(res.problems) == 1 and str(bad) in res.problems[0]
    assert "byte" in res.problems[0]
    rep = {r["path"]: r for r in res.files}
    assert rep[str(bad)]["loaded"] > 0  # the good pings before the damage are in
    good = pipeline.run_load([paths[1]], tmp_path / "g.pfm", LoadConfig(bin_size_m=25.0),
                             mode="serial")
    assert rep[str(bad)]["soundings_read"] < good.files[0]["soundings_read"]


def test_existing_output_is_refused(survey, tmp_path):
    from pfm_dask.errors import ConfigError

    out = tmp_path / "x.pfm"
    out.write_text("")
    with pytest.raises(ConfigError, match="not a PFM handle file"):
        pipeline.run_load(expand_inputs([survey]), out, LoadConfig(), mode="serial")


def test_append_gives_the_same_content_as_one_load(survey, tmp_path):
    paths = expand_inputs([survey])
    area = json.loads((survey / "survey.json").read_text())["area"]
    pad = 0.001
    cfg = LoadConfig(bin_size_m=25.0, mbr=(area["south"] - pad, area["west"] - pad,
                                           area["north"] + pad, area["east"] + pad))
    whole, part = tmp_path / "whole.pfm", tmp_path / "part.pfm"
    pipeline.run_load(paths, whole, cfg, mode="serial")
    res1 = pipeline.run_load(paths[:2], part, cfg, mode="serial")
    assert res1.check["sound"]
    res2 = pipeline.run_load(paths, part, cfg, mode="serial", append=True)
    assert res2.skipped_files == [str(p) for p in paths[:2]]
    assert res2.check["sound"], res2.summary()
    with pfm.open_pfm(part) as f:
        assert [x.path for x in f.files()] == [str(p) for p in paths]
    s1, b1 = _dump(whole, tmp_path)
    s2, b2 = _dump(part, tmp_path)
    for k in s1:
        np.testing.assert_array_equal(s1[k], s2[k], err_msg=k)
    for k in b1:
        np.testing.assert_array_equal(b1[k], b2[k], err_msg=k)


def test_cli_load_serial_prints_report_and_exit_code(survey, tmp_path):
    out = tmp_path / "c.pfm"
    r = CliRunner().invoke(app, ["load", str(survey), "-o", str(out), "--serial",
                                 "--bin-size", "25", "--json", "-q"])
    assert r.exit_code == 0, r.output
    rep = json.loads(r.output)
    assert rep["check"]["sound"] and rep["totals"]["files"] == 3
    assert (Path(str(out) + ".data") / "load-report.json").exists()
    r = CliRunner().invoke(app, ["check", str(out)])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("final_threads", [1, None])
def test_serial_load_runs_on_one_thread(survey, tmp_path, monkeypatch, final_threads):
    """``--serial`` is the speedup baseline: no pack threads, the load on one thread (only the
    store's write-behind thread may run beside it); the pre-scan before it two files at a time
    (``pfm-head-start``: two reads in flight); the final step (recompute and check) on
    ``--final-threads`` threads, by default the machine's (``pfm.THREADS``), the same bytes."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from pfm_dask.pfm import _check, _recompute

    pools = []
    real_init = ThreadPoolExecutor.__init__

    def spy_init(self, *a, **k):
        pools.append(k.get("thread_name_prefix") or threading.current_thread().name)
        real_init(self, *a, **k)

    monkeypatch.setattr(ThreadPoolExecutor, "__init__", spy_init)
    asked = []
    real_check = _check.check
    monkeypatch.setattr(pfm, "check", lambda *a, **k: asked.append(("check", k.get("threads")))
                        or real_check(*a, **k))
    real_recompute = _recompute.recompute
    monkeypatch.setattr(pfm, "recompute", lambda *a, **k: asked.append(("recompute", k.get("threads")))
                        or real_recompute(*a, **k))
    res = pipeline.run_load(expand_inputs([survey]), tmp_path / "one.pfm",
                            LoadConfig(bin_size_m=25.0, max_backlog_bytes=1 << 20), mode="serial",
                            final_threads=final_threads)
    assert res.exit_code == 0, res.summary()
    n = final_threads or pfm.THREADS
    assert pools == ["pfm-head-start"] + ([] if n == 1 else ["pfm-band", "pfm-check"])
    assert asked == [("recompute", n), ("check", n)]


def test_cli_reports_a_file_named_twice_and_loads_it_once(survey, tmp_path):
    """A directory and one of its files on the command line: the file is loaded once, and the
    report says it was listed twice (the input expansion no longer drops it silently)."""
    one = sorted(survey.glob("*.gsf"))[0]
    out = tmp_path / "d.pfm"
    r = CliRunner().invoke(app, ["load", str(survey), str(one), "-o", str(out), "--serial",
                                 "--bin-size", "25", "--json", "-q"])
    assert r.exit_code == 3, r.output
    rep = json.loads(r.output)
    assert rep["totals"]["files"] == 3 and rep["check"]["sound"]
    assert [p for p in rep["problems"] if "listed more than once" in p and one.name in p]


def test_load_area_filter_equals_the_filter_over_rows_read_one_by_one(survey, tmp_path,
                                                                      monkeypatch):
    """The writer reads the area filter's rows a band at a time (here bands of a few rows,
    cut at every size); the result must be the filter run over rows read singly from the
    unfiltered PFM."""
    from pfm_dask import _writer_area as A
    from pfm_dask.filters import AreaFilter, RowSoundings

    monkeypatch.setattr(A, "AREA_BAND_SOUNDINGS", 700)
    paths = expand_inputs([survey])
    plain, filtered = tmp_path / "plain.pfm", tmp_path / "area.pfm"
    base = dict(bin_size_m=25.0, cellstd=1.2)   # a tight filter, so that it cuts
    assert pipeline.run_load(paths, plain, LoadConfig(**base), mode="serial").exit_code == 0
    res = pipeline.run_load(paths, filtered, LoadConfig(**base, area_filter=True), mode="serial")
    assert res.exit_code == 0 and res.area_filter["cut"] > 0
    with pfm.open_pfm(plain) as f:
        g = f.grid
        filt = AreaFilter(g.width, g.height, bin_size_xy=g.bin_size_xy, cellstd=1.2,
                          deep_only=True, null_depth=LoadConfig().null_depth)
        expect = {}

        def read_row(y):
            s = f.read_soundings(y, y + 1)
            return RowSoundings(col=s["col"], depth=s["depth"], validity=s["validity"].astype(np.uint32),
                                address=np.stack([s["record_offset"], s["slot"]], axis=1))

        def write_row(y, r):
            for (off, slot), v in zip(r.address.tolist(), r.validity.tolist()):
                expect[(off, slot)] = v

        filt.run(read_row, write_row)
    assert len(expect) == res.area_filter["cut"]
    with pfm.open_pfm(filtered) as f:
        s = f.read_soundings(0, f.height)
    got = {(o, sl): v for o, sl, v, w in zip(s["record_offset"].tolist(), s["slot"].tolist(),
                                             s["validity"].tolist(), s["validity"].tolist())
           if (o, sl) in expect}
    assert got == expect


def _plan(pings, **cfg):
    scans = [{"path": f"f{i}.gsf", "n_pings": n, "max_beams": 10} for i, n in enumerate(pings)]
    return pipeline.plan_pieces(scans, LoadConfig(bin_size_m=2.0, **cfg))


def test_plan_cuts_the_last_pieces_in_two_and_covers_every_ping():
    pieces = _plan([500, 50, 1000, 300, 250], split_pings=400)
    # the last four ranges (f2 400-800, f2 800-1000, f3, f4) are halved
    got = [(p.file_number, p.start_ping, p.stop_ping) for p in pieces]
    assert got == [(0, 0, 400), (0, 400, None), (1, 0, None),
                   (2, 0, 400), (2, 400, 600), (2, 600, 800), (2, 800, 900), (2, 900, None),
                   (3, 0, 150), (3, 150, None), (4, 0, 125), (4, 125, None)]
    assert [p.seq for p in pieces] == list(range(len(pieces)))
    for f in range(5):
        mine = [p for p in pieces if p.file_number == f]
        assert [p.piece_index for p in mine] == list(range(len(mine)))
        assert all(p.n_pieces == len(mine) for p in mine) and mine[-1].last
    assert sum(p.est_soundings for p in pieces) == 10 * (500 + 50 + 1000 + 300 + 250)


def test_plan_leaves_short_pieces_whole_and_can_be_turned_off():
    assert [p.stop_ping for p in _plan([150, 199, 120])] == [None, None, None]
    assert [(p.start_ping, p.stop_ping) for p in _plan([400], tail_pieces=0)] == [(0, None)]
    assert [(p.start_ping, p.stop_ping) for p in _plan([400])] == [(0, 200), (200, None)]
