"""Ctrl-C stops a load within seconds with one line: what the PFM holds and the exact resume
command, no Dask tracebacks, in serial and on the embedded cluster (issue 20).

The interrupt is sent as a terminal sends it: SIGINT to the whole process group, worker
processes included. The printed command is then run and must finish the load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pfm_dask import pfm, synth

from .test_resume import resume_command_in


@pytest.fixture(scope="module")
def survey(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("int")
    synth.generate(root, files=12, pings=500, beams=256, seed=4)
    return root


def _watermark(out: Path) -> int:
    try:
        return int(json.loads((Path(str(out) + ".data") / "journal.json").read_text())
                   .get("watermark", 0))
    except (OSError, ValueError):
        return 0


@pytest.mark.parametrize("mode", [["--serial"], ["--workers", "2"]], ids=["serial", "dask"])
def test_ctrl_c_stops_with_one_line_and_the_printed_command_finishes(survey, tmp_path, mode):
    out = tmp_path / "int.pfm"
    cmd = [sys.executable, "-m", "pfm_dask.cli", "load", str(survey), "-o", str(out), "-q",
           "--bin-size", "25", "--checkpoint-seconds", "0",
           # a small backlog: the writer's groups of pieces are small, and its watermark
           # moves early in the load (docs/design.md)
           "--max-backlog", "8MiB", *mode]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while _watermark(out) < 1 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None, "the load ended before it could be interrupted"
        t0 = time.monotonic()
        os.killpg(p.pid, signal.SIGINT)               # as a terminal's Ctrl-C
        _, err = p.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("Dask dashboard")]
    assert len(lines) == 1, err
    assert lines[0].startswith("pfm-dask: interrupted: ") and "pieces" in lines[0], lines[0]
    assert took < 15, took
    again = resume_command_in(lines[0])
    r = subprocess.run([sys.executable, "-m", "pfm_dask.cli", *again, "-q"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert pfm.check(out) == []


def test_ctrl_c_inside_llvm_is_raised_a_moment_later_outside_it(monkeypatch):
    """An interrupt handled while llvmlite's code runs is not raised there: LLVM's ctypes
    callbacks, which numba's compiles go through, print and drop an exception, and the load
    then died of SIGSEGV (a CI run, the serial case above, while a kernel compiled). It is
    raised once the code is out of llvmlite, by the signal sent again; elsewhere at once."""
    from pfm_dask import _cli_app

    monkeypatch.setattr(_cli_app, "_silence_cluster_logs", lambda: None)
    ns: dict = {}
    where = os.path.join("site-packages", "llvmlite", "binding", "executionengine.py")
    exec(compile("def callback(handler, frame):\n"
                 "    handler(2, frame())\n"
                 "    return 'returned'\n", where, "exec"), ns)
    previous = signal.signal(signal.SIGINT, _cli_app._quiet_on_interrupt)
    try:
        assert ns["callback"](_cli_app._quiet_on_interrupt, sys._getframe) == "returned"
        with pytest.raises(KeyboardInterrupt):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
        with pytest.raises(KeyboardInterrupt):
            _cli_app._quiet_on_interrupt(signal.SIGINT, sys._getframe())
    finally:
        signal.signal(signal.SIGINT, previous)
