"""The load report says when a result only looks fine (issue 20): a load that put no sounding
in the PFM exits 3 and names the area's order, and every file that contributed nothing is
named with the reason.

References: the synthetic surveys' own extents (survey.json) and the record layout walked
by hand (tests/test_bad_inputs.ping_records), not the load's output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pfm_dask import pipeline, planning, synth
from pfm_dask.config import LoadConfig

from .test_bad_inputs import ping_records
from .test_resume import pfm_cli


def _area(root: Path) -> dict:
    return json.loads((root / "survey.json").read_text())["area"]


@pytest.fixture(scope="module")
def two_places(tmp_path_factory):
    """Two small surveys 0.7 degrees apart, and a GSF file holding only its header record."""
    root = tmp_path_factory.mktemp("places")
    synth.generate(root / "a", files=2, pings=20, beams=32, seed=1, latitude=17.8,
                   longitude=-64.6)
    synth.generate(root / "b", files=1, pings=20, beams=32, seed=2, latitude=18.5,
                   longitude=-64.6)
    a, b = sorted((root / "a").glob("*.gsf")), sorted((root / "b").glob("*.gsf"))
    blob = a[0].read_bytes()
    header_only = root / "header_only.gsf"
    header_only.write_bytes(blob[:ping_records(blob)[0][0]])
    return root, a, b, header_only


def test_an_area_holding_no_sounding_exits_3_and_names_the_order(two_places, tmp_path):
    root, a, _, _ = two_places
    ar = _area(root / "a")
    # the area written longitude first (WEST SOUTH EAST NORTH): legal numbers, wrong place
    swapped = [ar["west"] - 0.01, ar["south"] - 0.01, ar["east"] + 0.01, ar["north"] + 0.01]
    out = tmp_path / "x.pfm"
    r = pfm_cli("load", *a, "-o", out, "--serial", "--bin-size", "25", "-q",
                "--mbr", *map(str, swapped))
    assert r.returncode == 3, r.stdout + r.stderr
    problems = [ln for ln in r.stdout.splitlines() if ln.startswith("problem:")]
    assert len(problems) == 1, r.stdout
    assert "no sounding" in problems[0] and "SOUTH WEST NORTH EAST" in problems[0]
    nothing = [ln for ln in r.stdout.splitlines() if ln.startswith("contributed nothing:")]
    assert len(nothing) == len(a), r.stdout
    for f, ln in zip(a, nothing):
        assert str(f) in ln and "outside the area" in ln


def test_files_that_contributed_nothing_are_named_with_the_reason(two_places, tmp_path):
    root, a, b, header_only = two_places
    ar = _area(root / "a")
    cfg = LoadConfig(bin_size_m=25.0, mbr=(ar["south"] - 0.01, ar["west"] - 0.01,
                                           ar["north"] + 0.01, ar["east"] + 0.01))
    res = pipeline.run_load([str(f) for f in [*a, *b, header_only]], tmp_path / "y.pfm", cfg,
                            mode="serial")
    why = {Path(x["path"]).name: x["why"] for x in res.contributed_nothing}
    assert set(why) == {b[0].name, header_only.name}, res.summary()
    rec = [f for f in res.files if f["path"] == str(b[0])][0]
    loadable = rec["soundings_read"] - rec["ping_skipped"] - rec["beam_rejected"]
    assert loadable > 0 and rec["outside_area"] == loadable
    assert why[b[0].name] == f"all {loadable:,} loadable soundings outside the area"
    assert why[header_only.name] == "no pings"
    assert res.to_dict()["contributed_nothing"] == res.contributed_nothing
    assert f"contributed nothing: {b[0]}: all" in res.summary()
    assert res.exit_code == 0, res.summary()   # some files outside a given area is normal


def test_a_hard_link_is_the_same_file_for_a_load_and_an_append(two_places, tmp_path):
    import os

    root, a, b, _ = two_places
    hard = tmp_path / "hard.gsf"
    os.link(a[0], hard)
    cfg = LoadConfig(bin_size_m=25.0)
    res = pipeline.run_load([str(a[0]), str(hard), str(a[1])], tmp_path / "h.pfm", cfg,
                            mode="serial")
    assert [f["path"] for f in res.files] == [str(a[0]), str(a[1])], res.summary()
    assert [p for p in res.problems if "listed more than once" in p and str(hard) in p]
    # an append recognises a file already in the PFM under another name
    ar = _area(root / "a")
    cfg = LoadConfig(bin_size_m=25.0, mbr=(ar["south"] - 0.01, ar["west"] - 0.01,
                                           ar["north"] + 0.01, ar["east"] + 0.01))
    out = tmp_path / "app.pfm"
    pipeline.run_load([str(a[0])], out, cfg, mode="serial")
    res = pipeline.run_load([str(hard), str(a[1])], out, cfg, mode="serial", append=True)
    assert res.skipped_files == [str(hard)], res.summary()
    assert [f["path"] for f in res.files] == [str(a[1])]


def test_a_fifo_named_gsf_is_reported_and_never_opened(two_places, tmp_path):
    import os
    import shutil
    import subprocess

    root, a, _, _ = two_places
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(a[0], d / a[0].name)
    os.mkfifo(d / "pipe.gsf")                # opening it for reading blocks until a writer
    out = tmp_path / "f.pfm"
    try:
        r = pfm_cli("load", d, "-o", out, "--serial", "--bin-size", "25", "-q", timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the load hung on the FIFO")
    assert r.returncode == 3, r.stdout + r.stderr
    problems = [ln for ln in r.stdout.splitlines() if ln.startswith("problem:")]
    assert problems == [f"problem: {d / 'pipe.gsf'}: a FIFO, not a regular file: skipped, "
                        "never opened"], r.stdout
    rep = json.loads((tmp_path / "f.pfm.data" / "load-report.json").read_text())
    assert [f["path"] for f in rep["files"]] == [str(d / a[0].name)]


def _grid_bins(res) -> int:
    return res.grid["width"] * res.grid["height"]


def test_a_sparse_grid_warns_with_a_bin_size_that_fits(two_places, tmp_path):
    root, a, _, _ = two_places
    heard: list[str] = []
    res = pipeline.run_load([str(f) for f in a], tmp_path / "s.pfm", LoadConfig(bin_size_m=2.0),
                            mode="serial", on_message=heard.append)
    assert res.exit_code == 0, res.summary()
    # independent of the estimate: the soundings actually read over the bins actually made
    density = res.totals["soundings_read"] / _grid_bins(res)
    assert density < 0.1
    assert len(res.warnings) == 1 and heard == res.warnings, (res.warnings, heard)
    w = res.warnings[0]
    assert "soundings per bin" in w and f"{_grid_bins(res):,} bins" in w
    suggested = float(w.split("--bin-size ")[1].split()[0])
    # the suggestion gives about one sounding per bin or more (never a sparser grid)
    assert suggested > 2.0 and density * (suggested / 2.0) ** 2 >= 0.5
    assert "warning: " + w in res.summary() and res.to_dict()["warnings"] == res.warnings
    dense = pipeline.run_load([str(f) for f in a], tmp_path / "d.pfm",
                              LoadConfig(bin_size_m=suggested), mode="serial")
    assert dense.warnings == [] and dense.exit_code == 0


def test_a_grid_past_the_size_limit_is_refused_unless_forced(two_places, tmp_path, monkeypatch):
    from pfm_dask.errors import ConfigError

    root, a, _, _ = two_places
    monkeypatch.setattr(planning, "MAX_GRID_BINS", 10_000)
    out = tmp_path / "big.pfm"
    with pytest.raises(ConfigError, match="--force") as err:
        pipeline.run_load([str(f) for f in a], out, LoadConfig(bin_size_m=2.0), mode="serial")
    assert "bins" in str(err.value) and "--bin-size" in str(err.value)
    assert not out.exists() and not Path(str(out) + ".data").exists()
    res = pipeline.run_load([str(f) for f in a], out, LoadConfig(bin_size_m=2.0), mode="serial",
                            force=True)
    assert res.exit_code == 0 and _grid_bins(res) > 10_000


def test_cli_refuses_a_huge_grid_in_one_line_and_force_makes_it(two_places, tmp_path,
                                                                   monkeypatch):
    from typer.testing import CliRunner

    from pfm_dask.cli import app

    root, a, _, _ = two_places
    monkeypatch.setattr(planning, "MAX_GRID_BINS", 10_000)
    out = tmp_path / "c.pfm"
    args = ["load", *map(str, a), "-o", str(out), "--serial", "-q", "--bin-size", "2"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--force" in lines[0] and "over the limit" in lines[0], r.stderr
    r = CliRunner().invoke(app, [*args, "--force"])
    assert r.exit_code == 0, r.output
    assert "warning: the grid has" in r.stdout


def test_a_huge_automatic_area_names_the_files_that_stretched_it(two_places, tmp_path,
                                                                  monkeypatch):
    from pfm_dask.errors import ConfigError

    root, a, b, _ = two_places
    # survey b lies 0.7 degrees north of survey a: together they stretch the automatic area
    monkeypatch.setattr(planning, "MAX_GRID_BINS", 1_000_000)
    alone = pipeline.run_load([str(f) for f in a], tmp_path / "a.pfm", LoadConfig(bin_size_m=25.0),
                              mode="serial")
    assert _grid_bins(alone) < 1_000_000
    with pytest.raises(ConfigError) as err:
        pipeline.run_load([str(f) for f in [*a, *b]], tmp_path / "ab.pfm",
                          LoadConfig(bin_size_m=25.0), mode="serial")
    text = str(err.value)
    assert "over the limit" in text and f"north: {b[0]}" in text, text


@pytest.mark.parametrize("mode,workers,want", [
    ("local (2 workers)", 1, "(local (2 workers))"),
    ("serial", 0, "(serial)"),
    ("slurm (7 (compute) and 8 (disk node))", 3, "(slurm (7 (compute) and 8 (disk node)), "
                                                "3 Dask workers)"),
    ("pbs (9 (disk node))", 1, "(pbs (9 (disk node)), 1 Dask worker)"),
])
def test_the_summary_names_the_workers_once(mode, workers, want):
    """The embedded cluster's mode names its workers already: its one Dask worker process
    (the threads layout) is not counted beside them ("local (2 workers), 1 worker(s)" read
    as a contradiction); a cluster's jobs are, as Dask workers."""
    from pfm_dask.report import LoadResult

    first = LoadResult(pfm="out.pfm", mode=mode, workers=workers).summary().splitlines()[0]
    assert first == f"PFM: out.pfm  {want}"
