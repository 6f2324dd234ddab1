"""A GSF file that shrinks while it is being read (issue 20): the reader maps the file, and
touching a page past the new end of a mapped file is a SIGBUS, which would kill a worker
with no word about the file. The reader must instead raise a GsfError naming the file and
the byte offset where it now ends.

The read runs in a subprocess, so that a SIGBUS shows as a signal exit, not a dead test run.
Reference: the file's own size after truncation (os.path.getsize), not the reader's output.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pfm_dask import synth

ROOT = Path(__file__).resolve().parents[2]

_CHILD = r"""
import json, os, sys
from pfm_dask import gsf
from pfm_dask.errors import GsfError
path, keep, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
f = gsf.GsfFile(path, strict=False)
os.truncate(path, keep)             # the file shrinks between open and read
try:
    if how == "read":
        n = f.read().num_rows
    elif how == "read_at":
        n = f.read_at([0, f.n_pings - 1]).num_rows
    else:
        n = int(f.beams_per_ping().sum())
    print(json.dumps({"rows": n}))
except GsfError as err:
    print(json.dumps({"error": str(err), "path": err.path, "offset": err.offset}))
"""


@pytest.fixture(scope="module")
def survey_file(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shrink")
    synth.generate(root, files=1, pings=400, beams=64, seed=3)
    return sorted(root.glob("*.gsf"))[0]


@pytest.mark.parametrize("how", ["read", "read_at", "beams_per_ping"])
def test_a_file_truncated_between_open_and_read_is_reported_not_a_sigbus(survey_file, tmp_path,
                                                                         how):
    path = tmp_path / "shrinks.gsf"
    path.write_bytes(survey_file.read_bytes())
    keep = 4096  # one page: everything past it is gone from the mapping
    assert os.path.getsize(path) > 16 * keep
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(keep), how],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, f"exit {r.returncode} (a negative exit is a signal): {r.stderr}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert "error" in out, out
    assert out["path"] == str(path) and out["offset"] == os.path.getsize(path) == keep
    assert "truncated" in out["error"] and str(path) in out["error"]
