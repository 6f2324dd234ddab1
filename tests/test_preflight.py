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


# ------------------------------------------------------------------ the output folder
def test_a_missing_output_folder_is_refused(survey, tmp_path):
    out = tmp_path / "no" / "such" / "x.pfm"
    r = pfm_cli("load", *survey, "-o", out, "--serial", "-q")
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert "does not exist" in line and str(out.parent) in line
    assert not (tmp_path / "no").exists()


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder this process cannot write in: mode 555, or, for root (who writes anywhere),
    a read-only tmpfs mounted there (skipped where root cannot mount)."""
    import subprocess

    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "pfm-dask-test", str(ro)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"running as root and cannot mount a read-only file system: {r.stderr}")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_a_read_only_output_folder_is_refused(survey, read_only_folder):
    out = read_only_folder / "x.pfm"
    r = pfm_cli("load", *survey, "-o", out, "--serial", "-q")
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert "cannot write in the output folder" in line and str(read_only_folder) in line
    assert nothing_at(out)


# ------------------------------------------------------------------ missing extras
def _without(monkeypatch, module: str) -> None:
    """Make ``module`` look uninstalled for this process (import and find_spec both fail)."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)


def test_png_without_matplotlib_is_refused_before_the_load(survey, tmp_path, monkeypatch):
    _without(monkeypatch, "matplotlib")
    out = tmp_path / "x.pfm"
    r = CliRunner().invoke(app, ["load", *map(str, survey), "-o", str(out), "--serial", "-q",
                                 "--png", str(tmp_path / "x.png")])
    assert r.exit_code == 2, r.output
    line = one_line(r.stderr)
    assert "--png" in line and "matplotlib" in line and "pip install" in line
    assert nothing_at(out)


@pytest.mark.parametrize("how", ["cluster-script", "load --cluster-config", "load --cluster"])
def test_batch_clusters_without_dask_jobqueue_are_refused(survey, tmp_path, monkeypatch, how):
    _without(monkeypatch, "dask_jobqueue")
    out = tmp_path / "x.pfm"
    profile = str(REPO / "workflows" / "slurm.yaml")
    args = {"cluster-script": ["cluster-script", profile],
            "load --cluster-config": ["load", *map(str, survey), "-o", str(out), "-q",
                                      "--cluster-config", profile],
            "load --cluster": ["load", *map(str, survey), "-o", str(out), "-q",
                               "--cluster", "slurm", "--cluster-config", profile]}[how]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2, r.output
    line = one_line(r.stderr)
    assert "dask-jobqueue" in line and "pip install" in line
    assert nothing_at(out)


# ------------------------------------------------------------------ the scheduler
def test_an_unreachable_scheduler_is_one_line_at_once(survey, tmp_path):
    with socket.socket() as s:          # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "x.pfm"
    t0 = time.perf_counter()
    r = pfm_cli("load", *survey, "-o", out, "-q", "--scheduler", f"tcp://127.0.0.1:{port}")
    took = time.perf_counter() - t0
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert f"127.0.0.1:{port}" in line and "cannot reach" in line
    assert took < 20, took
    assert nothing_at(out)


# ------------------------------------------------------------------ option values
BAD_VALUES = {
    "bin size 0": (["--bin-size", "0"], "--bin-size"),
    "bin size -5": (["--bin-size", "-5"], "--bin-size"),
    "bin size nan": (["--bin-size", "nan"], "--bin-size"),
    "bin size inf": (["--bin-size", "inf"], "--bin-size"),
    "workers 0": (["--workers", "0"], "--workers"),
    "max backlog lots": (["--max-backlog", "lots"], "cannot read size 'lots'"),
    "south above north": (["--mbr", "11", "-65", "10", "-64"], "SOUTH WEST NORTH EAST"),
    "missing polygon": (["--polygon", "/no/such/polygon.txt"], "cannot read polygon file"),
    "swath window 0": (["--swath-filter", "--swath-window-pings", "0"],
                       "--swath-window-pings"),
    "swath window even": (["--swath-filter", "--swath-window-beams", "4"],
                          "--swath-window-beams"),
    "swath window too small": (["--swath-filter", "--swath-window-pings", "1",
                                "--swath-window-beams", "3"], "neighbours"),
    "swath threshold -1": (["--swath-filter", "--swath-threshold", "-1"], "--swath-threshold"),
    "cellstd nan": (["--cellstd", "nan"], "--cellstd"),
    "horizontal error -1": (["--horizontal-error", "-1"], "--horizontal-error"),
    "vertical error nan": (["--vertical-error", "nan"], "--vertical-error"),
    "checkpoint -1": (["--checkpoint-seconds", "-1"], "--checkpoint-seconds"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_invalid_values_are_refused_before_the_load(survey, tmp_path, case):
    args, words = BAD_VALUES[case]
    out = tmp_path / "x.pfm"
    r = pfm_cli("load", *survey, "-o", out, "-q", *args)   # the embedded cluster: nothing
    assert r.returncode == 2, r.stdout + r.stderr            # may start (no dashboard line)
    line = one_line(r.stderr)
    assert words in line, line
    assert nothing_at(out)


# ------------------------------------------------------------------ the command line itself
@pytest.mark.parametrize("args", [["--help"], ["load", "--help"], ["export", "--help"],
                                  ["check", "--help"]], ids=" ".join)
def test_help_shows_no_bool_placeholder_on_flags(args):
    r = pfm_cli(*args)
    assert r.returncode == 0, r.stderr
    assert "<bool>" not in r.stdout, r.stdout
    assert "--help" in r.stdout


@pytest.mark.parametrize("word", ["true", "False", "1"])
def test_a_flag_given_a_value_is_refused_not_taken_as_an_input(survey, tmp_path, word):
    out = tmp_path / "x.pfm"
    r = pfm_cli("load", *survey, "--serial", word, "-o", out, "-q")
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert "--serial" in line and "takes no value" in line and repr(word) in line
    assert nothing_at(out)


def test_version():
    r = pfm_cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"pfm-dask {pfm_dask.__version__}"


def test_json_and_non_terminal_runs_log_progress_without_a_zero_rate(survey, tmp_path):
    out = tmp_path / "p.pfm"
    r = pfm_cli("load", *survey, "-o", out, "--serial", "--bin-size", "25", "--json")
    assert r.returncode == 0, r.stderr
    import json

    assert json.loads(r.stdout)["check"]["sound"]           # the report alone on stdout
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("loading: ")]
    assert lines, r.stderr
    assert not [ln for ln in lines if "(0/s)" in ln], lines
