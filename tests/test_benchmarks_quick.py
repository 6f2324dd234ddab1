"""The Pfm_loader benchmark runner's ``--quick`` path still runs and writes its results.

No timing is asserted: the machine running the tests may be busy. The runner is started as a
separate process, as a user would start it, with every output in a temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(args, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return subprocess.run([sys.executable, "-m", "benchmarks.run", *args,
                           "--results-dir", str(tmp_path / "results"),
                           "--data-dir", str(tmp_path / "data"), "--work", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)


def test_quick_run_writes_results_and_report(tmp_path):
    proc = _run(["--quick"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = tmp_path / "results"
    doc = json.loads((res / "pfmloader_quick.json").read_text())
    r = doc["results"]
    for part in ("loads", "disk", "memory", "model", "writer_vs_disk", "seed"):
        assert part in r, part
    cell = r["loads"]["3"]["setups"]["both"]
    assert set(cell["modes"]) == {"serial", "dask_1", "dask_2"}
    assert cell["modes"]["serial"]["soundings_loaded"] > 0
    md = (res / "RESULTS_quick.md").read_text()
    pngs = sorted(p.name for p in res.glob("pfmloader_quick_*.png"))
    assert {f"pfmloader_quick_{k}.png" for k in ("speedup", "phases", "serial_share", "disk",
                                                  "memory", "model")} <= set(pngs)
    for name in pngs:
        assert f"]({name})" in md or f"/{name})" in md, name

    # --report redraws from the JSON alone
    (res / "RESULTS_quick.md").unlink()
    proc = _run(["--quick", "--report"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (res / "RESULTS_quick.md").read_text() == md


def test_results_name_each_commit_with_its_loads():
    """Loads added later with --resume at other commits are named with their commit, not
    passed off as the first run's code."""
    from benchmarks.report_md import _codes_line

    first = {"commit": "a" * 40, "snapshot": True}
    cell = lambda c: {"code": {"commit": c, "snapshot": True}}     # noqa: E731
    loads = {"7": {"setups": {"none": cell("a" * 40), "swath": cell("a" * 40)}},
             "48": {"setups": {"none": cell("b" * 40)}},
             "74": {"setups": {"none": cell("a" * 40)}}}
    line = _codes_line(first, loads)
    assert line.startswith("commits aaaaaaa (7, 74 files; disk, memory), bbbbbbb (48 files)")
    one = {k: v for k, v in loads.items() if k != "48"}
    assert _codes_line(first, one) == "commit aaaaaaaaaaaa (a frozen copy: every run on the same code)"


def test_other_benchmarks_name_the_filter_setup(tmp_path):
    """bench_load's two setups are listed apart, each with what it ran."""
    import json

    from benchmarks.report_md import _others

    for name, speedup in (("bench_load.json", 1.42), ("bench_load_filters.json", 1.76)):
        (tmp_path / name).write_text(json.dumps(
            {"results": {"speedup_2_workers": speedup, "gsf_bytes": 1.1e9}}))
    text = _others(tmp_path)
    assert "- `bench_load.json`: bench_load: 1.42x with 2 workers on 1.10 GB, no filter" in text
    assert ("- `bench_load_filters.json`: bench_load --filters: 1.76x with 2 workers on 1.10 GB, "
            "swath and area filters") in text


def test_other_benchmarks_give_the_two_core_ceiling_when_measured(tmp_path):
    """With bench_load's two --serial halves in the results, the line says what they reached."""
    import json

    from benchmarks.report_md import _others

    (tmp_path / "bench_load.json").write_text(json.dumps(
        {"results": {"speedup_2_workers": 1.45, "gsf_bytes": 1.1e9,
                     "speedup_two_serial_halves": 1.61}}))
    assert ("bench_load: 1.45x with 2 workers on 1.10 GB, no filter; two --serial processes "
            "on half the files each: 1.61x") in _others(tmp_path)


def test_bench_load_cpu_bound_is_cores_over_the_cores_serial_keeps_busy(tmp_path):
    """A --serial load of 7.85 s that spends 9.8 CPU-s keeps 1.25 cores busy: on 2 cores no
    schedule spending no more CPU beats 1.60x; the RESULTS.md line says so."""
    import json

    from benchmarks.bench_load import cpu_bound
    from benchmarks.report_md import _others

    r = cpu_bound({"wall_s": 7.85, "cpu_s": {"total": 9.8}}, 2)
    assert abs(r["serial_cores_busy"] - 9.8 / 7.85) < 1e-12
    assert abs(r["cpu_bound_speedup"] - 2 * 7.85 / 9.8) < 1e-12
    (tmp_path / "bench_load.json").write_text(json.dumps(
        {"results": {"speedup_2_workers": 1.2, "gsf_bytes": 1.1e9, **r}}))
    assert ("bench_load: 1.20x with 2 workers on 1.10 GB, no filter; at most 1.60x on 2 cores "
            "without more CPU than `--serial` (it keeps 1.25 busy)") in _others(tmp_path)
