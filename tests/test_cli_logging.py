"""``-v``/``-q`` configure the ``pfm_dask`` logger: ``log.info`` lines reach standard error with
``-v`` (before either option existed they never did), and ``-q`` leaves errors only."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pfm_dask import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("tiny-log")
    synth.generate(out, files=2, pings=20, beams=32, seed=4)
    return out


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "pfm_dask.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_verbose_shows_the_loads_info_lines(tiny, tmp_path):
    quiet = _cli("load", tiny, "-o", tmp_path / "a.pfm", "--serial", "-q", "--bin-size", "25")
    assert quiet.returncode == 0, quiet.stderr
    assert "INFO" not in quiet.stderr
    for args in (["-v", "load"], ["load", "-v"]):
        out = tmp_path / f"{args[0].strip('-')}.pfm"
        r = _cli(*args, tiny, "-o", out, "--serial", "-q", "--bin-size", "25")
        assert r.returncode == 0, r.stderr
        info = [ln for ln in r.stderr.splitlines() if ln.startswith("pfm-dask: INFO: ")]
        assert any("plan: 2 pieces from 2 files" in ln for ln in info), r.stderr


def test_quiet_leaves_errors_only_and_the_default_is_pythons():
    logger = logging.getLogger("pfm_dask")
    try:
        cli._configure_logging(0, True)
        assert logger.getEffectiveLevel() == logging.ERROR
        cli._configure_logging(2, False)
        assert logger.getEffectiveLevel() == logging.DEBUG
        assert len([h for h in logger.handlers if getattr(h, "_pfm_dask_cli", False)]) == 1
    finally:
        cli._configure_logging(0, False)
    assert not [h for h in logger.handlers if getattr(h, "_pfm_dask_cli", False)]
    assert logger.level == logging.NOTSET
