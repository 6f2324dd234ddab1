"""A user's ordinary mistakes get one line and exit 2 before any work starts (issue 20).

Each case runs the real command line (a new process, or typer's runner where a module must
look uninstalled) and checks the exit code, that standard error is one ``pfm-dask: error:``
line naming the problem, and that nothing was written at the output.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pfm_dask
from pfm_dask import synth
from pfm_dask.cli import app

from .test_resume import pfm_cli

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def survey(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("pre")
    synth.generate(root, files=2, pings=20, beams=32, seed=1)
    return sorted(root.glob("*.gsf"))


def one_line(stderr: str) -> str:
    """The one error line a refused command prints (and nothing else on stderr)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("pfm-dask: error: "), lines[0]
    return lines[0]


def nothing_at(out: Path) -> bool:
    return not out.exists() and not Path(str(out) + ".data").exists()


# ------------------------------------------------------------------ inputs
@pytest.mark.parametrize("area", [[], ["--mbr", "10", "-65", "11", "-64"]], ids=["auto", "mbr"])
def test_a_missing_input_says_no_such_file(survey, tmp_path, area):
    out = tmp_path / "x.pfm"
    gone = tmp_path / "gone.gsf"
    r = pfm_cli("load", survey[0], gone, "-o", out, "--serial", "-q", *area)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert str(gone) in line and "no such file" in line
    assert nothing_at(out)


def test_a_missing_file_in_a_list_names_the_list(survey, tmp_path):
    lst = tmp_path / "lines.txt"
    lst.write_text(f"{survey[0]}\nnot-there.gsf\n")
    out = tmp_path / "x.pfm"
    r = pfm_cli("load", f"@{lst}", "-o", out, "--serial", "-q")
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert "not-there.gsf" in line and "no such file" in line and str(lst) in line
    assert nothing_at(out)
