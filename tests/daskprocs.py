"""Hand-started ``dask scheduler``/``dask worker`` processes for the tests that need real ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


class DaskProcesses:
    """Processes started with ``python -m ARGS`` in ``folder`` (one log file each), stopped
    when the ``with`` block ends: all but the first, then the first (the scheduler)."""

    def __init__(self, folder: Path, env: dict | None = None):
        self.folder = Path(folder)
        self.env = dict(os.environ) if env is None else env
        self.procs: list[subprocess.Popen] = []
        self._logs = []

    def spawn(self, args: list[str], name: str) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")
        self._logs.append(log)
        p = subprocess.Popen([sys.executable, "-m", *args], stdout=log,
                             stderr=subprocess.STDOUT, env=self.env, cwd=self.folder)
        self.procs.append(p)
        return p

    def scheduler_identity(self, sfile: Path, proc: subprocess.Popen, name: str = "scheduler",
                           timeout: float = 30) -> dict:
        """The scheduler file's content once the scheduler has written it."""
        t0 = time.monotonic()
        while not sfile.exists() or not sfile.read_text().strip().endswith("}"):
            if proc.poll() is not None or time.monotonic() - t0 > timeout:
                pytest.fail("dask scheduler did not start: "
                            + (self.folder / f"{name}.log").read_text()[-2000:])
            time.sleep(0.1)
        return json.loads(sfile.read_text())

    def __enter__(self) -> "DaskProcesses":
        return self

    def __exit__(self, *exc) -> None:
        stop(self.procs[1:])
        stop(self.procs[:1])
        for log in self._logs:
            log.close()


def stop(procs) -> None:
    """Terminate, then kill what has not ended after 15 s."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
