"""``benchmarks.bench_pfm_write --quick`` still runs, and an ad hoc run's results go where it is
told (``--results-dir``), not over the committed ones. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_writes_its_results_where_told(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    committed = ROOT / "benchmarks" / "results" / "bench_pfm_write_quick.json"
    before = committed.read_bytes() if committed.exists() else None
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_pfm_write", "--quick",
                           "--results-dir", str(tmp_path / "results"), "--work", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "results" / "bench_pfm_write_quick.json").read_text())["results"]
    assert r["soundings"] >= 300_000 and r["ratio_median"] > 0
    assert sorted(p.suffix for p in (tmp_path / "results").iterdir()) == [".json", ".png", ".png"]
    after = committed.read_bytes() if committed.exists() else None
    assert after == before
