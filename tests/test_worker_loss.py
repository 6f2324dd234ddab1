"""Dead Dask workers: a compute worker killed mid-task costs nothing; the writer's worker
killed stops the load at once with the resume command, and the resume works.

Real processes are killed (SIGKILL, by test hooks inside the load: the first task on a
worker without the ``disk`` resource kills its own worker after handing its piece to the
writer; the writer kills its own worker after its second piece), in the embedded cluster's
``processes`` layout, chosen by a local cluster profile (the default layout runs the workers
in the driver's process: killing the writer there is killing the load, tests/test_resume.py).
The reference is an uninterrupted ``--serial`` run (tests/test_resume.py).
"""

from __future__ import annotations

import pytest

from pfm_dask import journal as J

from .test_resume import (LOAD_OPTS, assert_same_pfm, pfm_cli, reference,  # noqa: F401
                          resume_command_in, rsurvey)

pytestmark = pytest.mark.cluster


def _processes(tmp_path):
    """Options for a load on 2 worker processes of the embedded cluster (a local profile)."""
    prof = tmp_path / "processes.yaml"
    prof.write_text("kind: local\nworkers: 2\nlayout: processes\n"
                    "scheduler:\n  dashboard_address: '127.0.0.1:0'\n")
    return ["--cluster", "local", "--cluster-config", prof]


def test_compute_worker_killed_mid_task_the_task_reruns_and_nothing_is_written_twice(
        rsurvey, reference, tmp_path):
    ref, _ = reference
    out = tmp_path / "c.pfm"
    marker = tmp_path / "killed-once"
    r = pfm_cli("load", rsurvey, "-o", out, *_processes(tmp_path), *LOAD_OPTS,
                env={"PFM_DASK_KILL_COMPUTE_WORKER": f"after:{marker}"})
    assert marker.exists(), "the hook did not fire: no task ran on the compute-only worker"
    assert r.returncode == 0, r.stderr
    # a duplicate delivery would add soundings: the dumps would differ
    assert_same_pfm(out, ref, tmp_path)


def test_writer_worker_killed_stops_with_the_resume_command_and_the_resume_works(
        rsurvey, reference, tmp_path):
    ref, _ = reference
    out = tmp_path / "w.pfm"
    r = pfm_cli("load", rsurvey, "-o", out, *_processes(tmp_path), "--checkpoint-seconds", "0",
                *LOAD_OPTS, env={"PFM_DASK_CRASH_AT": "piece:2"})
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "writer's worker died" in r.stderr
    state = J.read_journal(out)
    # the writer checkpoints between its groups of pieces: the watermark is the last
    # group boundary before the second piece (docs/design.md)
    assert state["phase"] == "loading" and state["watermark"] <= 1
    cmd = resume_command_in(r.stderr)
    done = pfm_cli(*cmd)
    assert done.returncode == 0, done.stderr
    assert f"resumed from phase loading at piece {state['watermark']}" in done.stdout
    assert_same_pfm(out, ref, tmp_path)
