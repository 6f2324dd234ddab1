"""The README's first command: a synthetic survey loaded on the embedded cluster, then checked."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pfm_dask.cli import app

pytestmark = pytest.mark.cluster


def test_demo_runs_a_real_load_and_check(tmp_path):
    r = CliRunner().invoke(app, ["demo", str(tmp_path / "d"), "--files", "3", "--pings", "40"])
    assert r.exit_code == 0, r.output
    assert "check" in r.output and "sound" in r.output
    rep = json.loads((tmp_path / "d" / "demo.pfm.data" / "load-report.json").read_text())
    assert rep["totals"]["files"] == 3 and rep["totals"]["loaded"] > 0
    assert rep["check"]["sound"] and rep["mode"].startswith("local")
    # Running it again starts from a clean output rather than refusing.
    r = CliRunner().invoke(app, ["demo", str(tmp_path / "d"), "--files", "3", "--pings", "40"])
    assert r.exit_code == 0, r.output
    assert Path(tmp_path / "d" / "demo.pfm").exists()


@pytest.mark.parametrize("planted", ["folder", "pfm"])
def test_demo_removes_only_an_earlier_demos_output(tmp_path, planted):
    """What sits at DIR/demo.pfm and is not an earlier demo's load (its own journal names the
    demo's survey as its inputs) is refused and left as it is, not deleted to start over."""
    d = tmp_path / "d"
    data = d / "demo.pfm.data"
    data.mkdir(parents=True)
    (data / "notes.txt").write_text("the user's")
    if planted == "pfm":  # a PFM handle and parts made by another tool, no pfm-dask journal
        (d / "demo.pfm").write_text("PFM Handle File - PFM Software - v7\n")
        (data / "demo.pfm.ctl").write_text("theirs")
    r = CliRunner().invoke(app, ["demo", str(d), "--files", "1", "--pings", "10"])
    assert r.exit_code == 2, r.output
    assert "demo.pfm" in r.output
    assert (data / "notes.txt").read_text() == "the user's"
    if planted == "pfm":
        assert (d / "demo.pfm").exists() and (data / "demo.pfm.ctl").read_text() == "theirs"
    assert not (d / "survey").exists()      # refused before anything was made
