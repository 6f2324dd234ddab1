"""``benchmarks.bench_swath --quick`` still runs, writes its results and finds the flags identical.

No timing is asserted (the machine running the tests may be busy). Started as a separate
process, as a user would start it, with its results in a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_swath_quick(tmp_path):
    env = dict(os.environ)
    extra = os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    env["PYTHONPATH"] = str(ROOT) + extra
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_swath", "--quick",
                           "--results-dir", str(tmp_path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "bench_swath_quick.json").read_text())["results"]
    s = r["speed"]
    assert s["flags_identical"] and s["soundings"] > 0
    for k in ("compiled", "numpy"):
        assert s[k]["us_per_sounding_median"] > 0
    f = r["flags"]
    assert f["identical"] and f["soundings_differing"] == 0 and f["surveys"] >= 4
    assert (tmp_path / "bench_swath_quick_speed.png").is_file()
