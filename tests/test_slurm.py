"""Loads on a real one-node Slurm (``.ci/slurm-up``; CI runs it): compute workers and the
disk-node writer as separate Slurm jobs, and every job cancelled at the end or on Ctrl-C.

Where no Slurm answers, the tests are skipped with the reason, except under CI
(``CI`` set), where they must run and a missing Slurm fails them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pfm_dask import pfm, pipeline
from pfm_dask.cluster import ClusterProfile
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

pytestmark = [pytest.mark.slurm, pytest.mark.cluster]

SLURM_DIR = Path(os.environ.get("PFM_SLURM_DIR", "/tmp/pfm-slurm"))
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def slurm():
    """SLURM_CONF of a Slurm that answers (``sinfo``), or a skip (a failure under CI)."""
    conf = os.environ.get("SLURM_CONF") or str(SLURM_DIR / "slurm.conf")
    reason = None
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        reason = "Slurm client commands (sbatch, sinfo) are not installed"
    elif not Path(conf).exists():
        reason = f"no Slurm configuration at {conf}"
    else:
        r = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True,
                           env=dict(os.environ, SLURM_CONF=conf), timeout=30)
        state = r.stdout.strip()
        if r.returncode or not state.startswith(("idle", "mixed", "allocated")):
            reason = f"Slurm does not answer (sinfo: {r.stderr.strip() or state or 'nothing'})"
    if reason:
        msg = f"{reason}: run `.ci/slurm-up` as root and export SLURM_CONF={conf}"
        if os.environ.get("CI"):
            pytest.fail("CI must run the Slurm tests, but " + msg)
        pytest.skip(msg)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    yield conf
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old


def _jobs() -> dict[str, str]:
    """Our jobs in the queue: {job id: name}."""
    r = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True,
                       check=True)
    out = {}
    for ln in r.stdout.splitlines():
        jid, name = ln.split(maxsplit=1)
        if name in ("pfm-compute", "pfm-disk"):
            out[jid] = name
    return out


def _wait_no_jobs(timeout=20.0) -> dict:
    t0 = time.monotonic()
    while (left := _jobs()) and time.monotonic() - t0 < timeout:
        time.sleep(0.25)
    return left


def _profile(tmp: Path) -> dict:
    return {
        "kind": "slurm",
        "scheduler": {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
        "interface": "lo",
        "log_directory": str(tmp / "logs"),
        "wait_timeout": 90,
        "compute": {"queue": "debug", "cores": 1, "processes": 1, "memory": "2GB",
                    "walltime": "00:10:00", "minimum_jobs": 1, "maximum_jobs": 2},
        "disk": {"queue": "debug", "cpus": 1, "memory": "2GB", "walltime": "00:10:00"},
    }


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("slurm-survey")
    synth.generate(out, files=3, pings=40, beams=64, seed=1)
    return out


def test_load_on_slurm_with_the_writer_on_its_disk_job(slurm, survey, tmp_path):
    assert not _wait_no_jobs(), "pfm-* jobs from an earlier run are still queued"
    prof = ClusterProfile.from_dict(_profile(tmp_path))
    out = tmp_path / "slurm.pfm"
    messages: list[str] = []
    during: dict = {}

    def progress(status):
        if during:
            return
        from distributed import default_client

        info = default_client().scheduler_info(n_workers=-1)["workers"]
        during["workers"] = {w["name"]: (a, w["resources"]) for a, w in info.items()}
        during["jobs"] = _jobs()
        # the "PFM writer" page, built at this first request (pfm_dask.dashboard_plugin)
        page = dashboards[0].rsplit("/", 1)[0] + "/pfm-writer"
        with urllib.request.urlopen(page, timeout=60) as r:
            during["page"] = (r.status, b"bokeh" in r.read().lower())

    dashboards = []
    res = pipeline.run_load(expand_inputs([survey]), out, LoadConfig(bin_size_m=25.0),
                            mode="cluster", cluster_profile=prof, progress=progress,
                            on_message=messages.append, on_dashboard=dashboards.append)
    assert res.exit_code == 0, res.summary()
    assert pfm.info(out)["counts"]["soundings"] == res.totals["loaded"] > 0
    assert dashboards and dashboards[0].startswith("http://127.0.0.1:")
    assert during["page"] == (200, True)
    # The writer ran on the worker of the disk-node job, which holds the disk resource.
    workers = during["workers"]
    addr, resources = workers["pfm-disk"]
    assert res.writer_worker == addr and resources.get("disk") == 1
    compute = [n for n in workers if n.startswith("pfm-compute")]
    assert compute and all(workers[n][1].get("compute") == 1 for n in compute)
    # Both kinds of job were Slurm jobs while the load ran, and none is left afterwards.
    assert "pfm-disk" in during["jobs"].values()
    assert "pfm-compute" in during["jobs"].values()
    assert not _wait_no_jobs()
    assert any("submitted the disk-node job" in m for m in messages), messages
    logs = sorted(p.name for p in (tmp_path / "logs").iterdir())
    assert any(n.startswith("pfm-disk-") for n in logs), logs
    assert any(n.startswith("pfm-compute-") for n in logs), logs


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupting_a_slurm_load_cancels_the_jobs(slurm, survey, tmp_path, sig):
    """Ctrl-C, or SIGTERM (scancel of a driver job, its walltime), cancels every job."""
    assert not _wait_no_jobs(), "pfm-* jobs from an earlier run are still queued"
    cfg_file = tmp_path / "slurm.yaml"
    prof = _profile(tmp_path)
    prof["compute"] = {**prof["compute"], "minimum_jobs": 2, "maximum_jobs": 2}
    cfg_file.write_text(yaml.safe_dump(prof))
    # SIGINT as a terminal's Ctrl-C: a test runner started in the background may hand its
    # children an ignored SIGINT, so the child puts Python's handler back first.
    start = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
             "from pfm_dask.cli import main; sys.exit(main())")
    proc = subprocess.Popen([sys.executable, "-c", start, "load", str(survey),
                             "-o", str(tmp_path / "int.pfm"), "--bin-size", "25",
                             "--cluster", "slurm", "--cluster-config", str(cfg_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:  # interrupt once all three jobs are in the queue
            if sorted(_jobs().values()) == ["pfm-compute", "pfm-compute", "pfm-disk"]:
                break
            assert proc.poll() is None, "".join(lines)
            time.sleep(0.2)
        else:
            pytest.fail("the jobs never showed in squeue: " + "".join(lines))
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    text = "".join(lines)
    assert proc.returncode != 0, text
    assert "interrupted: cancelling Slurm jobs" in text, text
    assert "(disk node)" in text and "jobs cancelled" in text, text
    assert not _wait_no_jobs(), text


def test_submit_load_script_runs_a_whole_load_as_a_job(slurm, survey, tmp_path):
    """workflows/submit-load.slurm: the driver itself is a Slurm job that submits the others."""
    assert not _wait_no_jobs(), "pfm-* jobs from an earlier run are still queued"
    cfg_file = tmp_path / "slurm.yaml"
    cfg_file.write_text(yaml.safe_dump(_profile(tmp_path)))
    out = tmp_path / "job.pfm"
    r = subprocess.run(["sbatch", "--parsable", "-p", "debug", "--mem=1G", "-t", "10",
                        "--chdir", str(tmp_path), "-o", str(tmp_path / "load-%j.out"),
                        str(REPO / "workflows" / "submit-load.slurm"),
                        str(survey), str(out), str(cfg_file), "--bin-size", "25"],
                       env=dict(os.environ, PFM_DASK=f"{sys.executable} -m pfm_dask.cli"),
                       capture_output=True, text=True, check=True)
    jid = r.stdout.strip().split(";")[0]
    t0 = time.monotonic()
    while time.monotonic() - t0 < 120:
        q = subprocess.run(["squeue", "-h", "-j", jid, "-o", "%T"], capture_output=True,
                           text=True)
        if not q.stdout.strip():
            break
        time.sleep(0.5)
    log = (tmp_path / f"load-{jid}.out").read_text()
    show = subprocess.run(["scontrol", "show", "job", jid], capture_output=True, text=True).stdout
    assert "JobState=COMPLETED" in show and "ExitCode=0:0" in show, show + log
    assert "submitted the disk-node job" in log and "check: sound" in log, log
    assert pfm.check(out) == []
    assert not _wait_no_jobs()
