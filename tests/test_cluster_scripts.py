"""Cluster profiles and the job scripts they render for Slurm and PBS (no batch system needed).

The expected directives and worker arguments are written out by hand from the
profiles; the scripts are split into ``#SBATCH``/``#PBS`` lines and the worker
command (shlex), and compared line by line.
"""

from __future__ import annotations

import math
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pfm_dask.cli import app
from pfm_dask.cluster import (ClusterProfile, PfmCluster, load_profile, render_job_scripts)
from pfm_dask.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = REPO / "workflows"
ADDR = "tcp://10.0.0.5:8786"


def _split(script: str, prefix: str) -> tuple[list[str], list[str], list[str]]:
    """(directive lines without the prefix, prologue lines, worker command words)."""
    lines = [ln for ln in script.splitlines() if ln.strip()]
    assert lines[0] == "#!/usr/bin/env bash"
    directives = [ln[len(prefix):].strip() for ln in lines[1:] if ln.startswith(prefix)]
    body = [ln for ln in lines[1:] if not ln.startswith("#")]
    worker = [ln for ln in body if "distributed.cli.dask_worker" in ln]
    assert len(worker) == 1, body
    prologue = [ln for ln in body if ln is not worker[0]]
    return directives, prologue, shlex.split(worker[0])


def _args(words: list[str]) -> dict[str, list[str]]:
    """``--flag value`` pairs of a worker command (flags without a value map to [])."""
    out: dict[str, list[str]] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            vals = []
            if i + 1 < len(words) and not words[i + 1].startswith("--"):
                vals.append(words[i + 1])
                i += 1
            out.setdefault(w, []).extend(vals)
        i += 1
    return out


def _gib_ceil(text_bytes: float) -> int:
    return math.ceil(text_bytes / 2**30)


# -------------------------------------------------------------------- Slurm
def test_slurm_workflow_profile_renders_compute_and_disk_jobs():
    prof = load_profile(WORKFLOWS / "slurm.yaml")
    assert prof.kind == "slurm" and prof.compute.adaptive
    scripts = render_job_scripts(prof, ADDR)

    d, pro, cmd = _split(scripts["compute"], "#SBATCH")
    assert d == ["-J pfm-compute",
                 "-e pfm-dask-logs/pfm-compute-%J.err", "-o pfm-dask-logs/pfm-compute-%J.out",
                 "-p compute", "-A navo", "-n 1", "--cpus-per-task=8",
                 f"--mem={_gib_ceil(32e9)}G", "-t 12:00:00"]
    assert pro == ['cd "$SLURM_SUBMIT_DIR"']
    assert cmd[:4] == [sys.executable, "-m", "distributed.cli.dask_worker", ADDR]
    a = _args(cmd)
    assert a["--nthreads"] == ["4"]  # 8 cores / 2 processes, and only once
    assert a["--nworkers"] == ["2"]
    assert a["--resources"] == ["compute=4"]
    assert a["--lifetime"] == ["11h"] and a["--lifetime-stagger"] == ["5m"]
    assert a["--interface"] == ["ib0"]
    assert a["--name"] == ["pfm-compute-0"]

    d, pro, cmd = _split(scripts["disk"], "#SBATCH")
    assert d == ["-J pfm-disk",
                 "-e pfm-dask-logs/pfm-disk-%J.err", "-o pfm-dask-logs/pfm-disk-%J.out",
                 "-p io", "-A navo", "-n 1", "--cpus-per-task=4",
                 f"--mem={_gib_ceil(16e9)}G", "-t 48:00:00", "--nodelist=disk01"]
    a = _args(cmd)
    assert a["--nthreads"] == ["1"]
    assert a["--resources"] == ["disk=1"]
    assert a["--name"] == ["pfm-disk"]
    assert "--nworkers" not in a
    assert not any(k.startswith("--lifetime") for k in a)
    # Rendering submits nothing and leaves no log directory behind.
    assert not (Path.cwd() / "pfm-dask-logs").exists()


def test_slurm_profile_options_reach_the_script(tmp_path):
    prof = ClusterProfile.from_dict({
        "kind": "slurm",
        "python": "/opt/venv/bin/python",
        "job-script-prologue": ["source /opt/venv/bin/activate"],
        "local_directory": "$TMPDIR",
        "compute": {"queue": "short", "cores": 6, "processes": 3, "memory": "12GiB",
                    "walltime": 108000,  # what YAML makes of an unquoted 30:00:00
                    "job_directives_skip": ["--mem"],
                    "job_extra_directives": ["--exclusive", "--constraint=avx2"],
                    "worker_extra_args": ["--death-timeout 120"], "jobs": 3},
        "disk": {"queue": "io", "cpus": 2, "memory": "8GB", "walltime": "1-00:00:00"},
    })
    assert prof.compute.jobs == 3 and not prof.compute.adaptive
    scripts = render_job_scripts(prof, ADDR)
    d, pro, cmd = _split(scripts["compute"], "#SBATCH")
    assert d == ["-J pfm-compute", "-p short", "-n 1", "--cpus-per-task=6", "-t 30:00:00",
                 "--exclusive", "--constraint=avx2"]
    assert pro == ["source /opt/venv/bin/activate"]
    assert cmd[0] == "/opt/venv/bin/python"
    a = _args(cmd)
    assert a["--nthreads"] == ["2"] and a["--nworkers"] == ["3"]
    assert a["--resources"] == ["compute=2"]
    assert a["--local-directory"] == ["$TMPDIR"]
    assert a["--memory-limit"] == ["4.00GiB"]
    assert "120" in a["--death-timeout"]
    d, _, cmd = _split(scripts["disk"], "#SBATCH")
    assert "--cpus-per-task=2" in d and "-t 1-00:00:00" in d and "--mem=8G" in d
    assert _args(cmd)["--memory-limit"] == ["7.45GiB"]


# ---------------------------------------------------------------------- PBS
def test_pbs_workflow_profile_renders_compute_and_disk_jobs():
    prof = load_profile(WORKFLOWS / "pbs.yaml")
    scripts = render_job_scripts(prof, ADDR)
    d, pro, cmd = _split(scripts["compute"], "#PBS")
    assert d == ["-N pfm-compute", "-q standard", "-A NAVO12345",
                 f"-l select=1:ncpus=8:mem={_gib_ceil(32e9)}GB", "-l walltime=12:00:00",
                 "-e pfm-dask-logs/", "-o pfm-dask-logs/"]
    assert pro == ['cd "$PBS_O_WORKDIR"']
    a = _args(cmd)
    assert a["--nthreads"] == ["4"] and a["--nworkers"] == ["2"]
    assert a["--resources"] == ["compute=4"]
    d, _, cmd = _split(scripts["disk"], "#PBS")
    assert d == ["-N pfm-disk", "-q io", "-A NAVO12345",
                 "-l select=1:ncpus=4:mem=16GB:host=disk01", "-l walltime=48:00:00",
                 "-e pfm-dask-logs/", "-o pfm-dask-logs/"]
    a = _args(cmd)
    assert a["--nthreads"] == ["1"] and a["--resources"] == ["disk=1"]
    assert a["--name"] == ["pfm-disk"]


def test_pbs_disk_job_default_select_line():
    prof = ClusterProfile.from_dict({
        "kind": "pbs",
        "compute": {"cores": 4, "memory": "8GB", "resource_spec": "select=1:ncpus=4:mem=8gb",
                    "minimum_jobs": 2, "maximum_jobs": 5, "walltime": "01:00:00"},
        "disk": {"cpus": 3, "memory": "6GiB", "walltime": "10:00:00"},
    })
    assert prof.compute.adaptive and prof.compute.minimum_jobs == 2
    scripts = render_job_scripts(prof, ADDR)
    d, _, _ = _split(scripts["compute"], "#PBS")
    assert "-l select=1:ncpus=4:mem=8gb" in d
    d, _, _ = _split(scripts["disk"], "#PBS")
    assert "-l select=1:ncpus=3:mem=6144MB" in d  # jobqueue's PBS size format, 6 GiB


def test_local_profile_has_no_job_script():
    prof = load_profile(WORKFLOWS / "local.yaml")
    assert prof.kind == "local" and prof.workers == 4
    with pytest.raises(ConfigError, match="no batch jobs"):
        render_job_scripts(prof)


# ------------------------------------------------------------- bad profiles
BASE = {"kind": "slurm", "compute": {"cores": 2, "memory": "4GB", "walltime": "1:00:00"},
        "disk": {"memory": "4GB", "walltime": "2:00:00"}}


def _with(section, **kw):
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    if section is None:
        d.update(kw)
    else:
        d[section].update(kw)
    return d


@pytest.mark.parametrize("data, key, words", [
    ({"compute": {}, "disk": {}}, "kind", "missing"),
    (_with(None, kind="sge"), "kind", "slurm, pbs, local"),
    (_with(None, colour="blue"), "colour", "unknown key"),
    (_with("compute", coers=4), "compute.coers", "unknown key"),
    (_with("compute", cores="eight"), "compute.cores", "integer"),
    (_with("compute", cores=4, processes=3), "compute.processes", "divide"),
    (_with("compute", memory="lots"), "compute.memory", "size"),
    (_with("compute", jobs=2, maximum_jobs=4), "compute.jobs", "not both"),
    (_with("compute", minimum_jobs=2), "compute.maximum_jobs", "minimum_jobs and maximum_jobs"),
    (_with("compute", minimum_jobs=5, maximum_jobs=4), "compute.minimum_jobs", "exceed"),
    (_with("compute", worker_extra_args=["--nthreads 4"]), "compute.worker_extra_args",
     "--nthreads"),
    (_with("compute", worker_extra_args=["--lifetime=1h"]), "compute.worker_extra_args",
     "compute.lifetime"),
    (_with("compute", lifetime="11h50m"), "compute.lifetime", "duration"),
    (_with("disk", worker_extra_args=["--lifetime", "2h"]), "disk.worker_extra_args",
     "writer"),
    (_with("disk", worker_extra_args=["--resources", "disk=2"]), "disk.worker_extra_args",
     "--resources"),
    (_with("disk", cpus=0), "disk.cpus", "integer"),
    (_with("compute", job_extra_directives="--exclusive"), "compute.job_extra_directives",
     "list"),
    (_with(None, wait_timeout="soon"), "wait_timeout", "duration"),
    (_with(None, scheduler={"host": "a", "interface": "ib0"}), "scheduler.interface",
     "not both"),
    ({"kind": "pbs", "disk": {}}, "compute", "missing"),
    ({"kind": "slurm", "compute": {"cores": 1}}, "disk", "missing"),
    (_with("disk", walltime=None), "disk.walltime", "writer dies"),
    ({**BASE, "compute": {"cores": 1}}, "compute.walltime", "30 minutes"),
])
def test_bad_profiles_name_the_key(data, key, words):
    with pytest.raises(ConfigError) as exc:
        ClusterProfile.from_dict(data, source="site.yaml")
    msg = str(exc.value)
    assert msg.startswith(f"site.yaml: {key}: "), msg
    assert words in msg, msg


def test_yaml_errors_name_the_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("kind: slurm\ncompute: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML") as exc:
        load_profile(p)
    assert exc.value.path == str(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_profile(tmp_path / "missing.yaml")
    p.write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_profile(p)


def test_unquoted_walltime_in_a_yaml_file(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("kind: slurm\ncompute:\n  cores: 1\n  walltime: 30:00:00\n"
                 "disk:\n  walltime: 2:30:00\n")
    prof = load_profile(p)
    assert prof.compute.walltime == "30:00:00"
    assert prof.disk.walltime == "02:30:00"


def test_starting_without_the_submit_command_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    prof = ClusterProfile.from_dict(BASE)
    with pytest.raises(ConfigError, match="sbatch is not on PATH"):
        with PfmCluster(prof):
            pass


# ---------------------------------------------------------------------- CLI
def test_cli_cluster_script():
    r = CliRunner().invoke(app, ["cluster-script", str(WORKFLOWS / "slurm.yaml"),
                                 "--scheduler-address", ADDR])
    assert r.exit_code == 0, r.output
    assert "# ---- compute job" in r.output and "# ---- disk job" in r.output
    assert r.output.count("#SBATCH -J pfm-") == 2
    assert r.output.count(ADDR) == 2
    r = CliRunner().invoke(app, ["cluster-script", str(WORKFLOWS / "local.yaml")])
    assert r.exit_code == 2 and "no batch jobs" in r.output


@pytest.mark.parametrize("args, words", [
    (["--cluster", "slurm"], "needs --cluster-config"),
    (["--cluster", "sge"], "--cluster must be one of"),
    (["--cluster", "pbs", "--cluster-config", str(WORKFLOWS / "slurm.yaml")],
     "does not match the profile's kind: slurm"),
    (["--cluster-config", str(WORKFLOWS / "slurm.yaml"), "--serial"], "cannot be combined"),
    (["--cluster-config", str(WORKFLOWS / "slurm.yaml"), "--scheduler", "tcp://x:1"],
     "cannot be combined"),
])
def test_cli_load_cluster_option_errors(tmp_path, args, words):
    r = CliRunner().invoke(app, ["load", str(tmp_path), "-o", str(tmp_path / "o.pfm"), *args])
    assert r.exit_code == 2, r.output
    assert words in r.output, r.output
