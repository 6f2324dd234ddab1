"""A full disk: a clear error naming the file, nothing claimed valid, and ``--resume``
finishes once there is room. Two ways to fill a disk: a file-size limit on the load's
process (``RLIMIT_FSIZE`` with SIGXFSZ ignored gives EFBIG), and a small tmpfs (root only)
that is grown afterwards. The reference is an uninterrupted load of the same inputs.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from pfm_dask import journal as J
from pfm_dask import pfm, pipeline
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

from .test_resume import assert_same_pfm, pfm_cli, rsurvey  # noqa: F401

# 50 m bins: the .bin (about 350 kB) is smaller than the .ndx (about 410 kB), so a limit
# between the two lets the load start and stops it in its last pieces.
OPTS = ["--bin-size", "50", "--serial", "-q"]
LIMIT = 370_000


@pytest.fixture(scope="module")
def disk_reference(rsurvey, tmp_path_factory):
    out = tmp_path_factory.mktemp("fullref") / "ref.pfm"
    res = pipeline.run_load(expand_inputs([rsurvey]), out, LoadConfig(bin_size_m=50.0),
                            mode="serial")
    assert res.exit_code == 0
    ndx = Path(str(out) + ".data") / "ref.pfm.ndx"
    assert ndx.stat().st_size > 1.05 * LIMIT, "the survey is too small for the limit"
    return out


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _assert_full_disk_failure(r, out: Path) -> None:
    assert r.returncode == 1, (r.returncode, r.stderr)
    msg = r.stderr
    assert "disk is full" in msg or "file size limit" in msg, msg
    assert ".pfm.data" in msg or ".pfm" in msg, msg      # names the file
    assert "--resume" in msg, msg
    state = J.read_journal(out)
    assert state is not None and state["phase"] != "complete"
    problems = pfm.check(out)
    assert problems and "incomplete" in str(problems[0])


def test_file_size_limit_is_a_clear_error_and_resume_finishes(rsurvey, disk_reference, tmp_path):
    out = tmp_path / "lim.pfm"
    r = pfm_cli("load", rsurvey, "-o", out, *OPTS, preexec_fn=_limit_file_size)
    _assert_full_disk_failure(r, out)
    assert "ndx" in r.stderr  # the file that grew past the limit
    res = pipeline.run_load([], out, None, mode="serial", resume=True)
    assert res.exit_code == 0, res.summary()
    assert_same_pfm(out, disk_reference, tmp_path)


def _can_mount() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("mount") is not None


def test_full_tmpfs_is_a_clear_error_and_resume_finishes_once_grown(rsurvey, disk_reference,
                                                                    tmp_path):
    if not _can_mount():
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if m.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here: {m.stderr.strip()}")
    try:
        out = mnt / "tmp.pfm"
        r = pfm_cli("load", rsurvey, "-o", out, *OPTS)
        _assert_full_disk_failure(r, out)
        assert "disk is full" in r.stderr
        g = subprocess.run(["mount", "-o", "remount,size=16m", str(mnt)], capture_output=True,
                           text=True)
        assert g.returncode == 0, g.stderr
        res = pipeline.run_load([], out, None, mode="serial", resume=True)
        assert res.exit_code == 0, res.summary()
        assert_same_pfm(out, disk_reference, tmp_path)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
