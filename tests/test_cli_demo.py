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
