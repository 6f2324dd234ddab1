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


def test_group_sweep_replays_each_budget_and_reports_them(tmp_path):
    """``--load-pieces --group-sweep`` replays a small survey's pieces with each group budget
    and writes one result per budget (medians of its rounds) and its plot where told."""
    from pfm_dask import synth

    synth.generate(tmp_path / "gsf", files=3, pings=40, beams=64, seed=2)
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_pfm_write", "--load-pieces",
                           "--survey", str(tmp_path / "gsf"), "--files", "3", "--bin-size", "25",
                           "--group-sweep", "64KiB,1MiB", "--repeat", "2",
                           "--results-dir", str(tmp_path / "results"), "--work", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "results" / "bench_pfm_write_groups_3f.json").read_text())["results"]
    assert [b["group_bytes"] for b in r["budgets"]] == [64 << 10, 1 << 20]
    assert all(len(b["runs"]) == 2 and b["median"]["write_s"] > 0 for b in r["budgets"])
    assert r["budgets"][0]["write_speedup"] == 1.0
    assert (tmp_path / "results" / "bench_pfm_write_groups_3f_groups.png").exists()
    from benchmarks.report_md import _groups_line

    assert "64, 1 MiB" not in _groups_line(r) and "0.0625, 1 MiB" in _groups_line(r)
