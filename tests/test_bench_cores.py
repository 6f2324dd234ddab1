"""``benchmarks.cores``: each workload runs alone and as copies started together, and the
speedup is what their times say. No timing is asserted beyond that arithmetic."""

from __future__ import annotations

import json

import pytest


def test_cores_runs_each_workload_alone_and_together_and_writes_where_told(tmp_path):
    from benchmarks import cores

    res = cores.main(["--mb", "2", "--procs", "2", "--repeat", "1",
                      "--results-dir", str(tmp_path)])
    saved = json.loads((tmp_path / "cores.json").read_text())["results"]
    assert saved["procs"] == 2 and set(saved["workloads"]) == set(cores.WORKLOADS)
    assert (tmp_path / "cores_speedup.png").exists()
    for kind, w in res["workloads"].items():
        (alone,), (together,) = w["alone_all_s"], w["together_all_s"]
        assert len(together) == 2 and alone > 0 and min(together) > 0, kind
        assert w["speedup"] == pytest.approx(2 * alone / max(together)), kind


def test_results_list_the_cores_line(tmp_path):
    from benchmarks.report_md import _others

    w = {k: {"speedup": s} for k, s in (("scalar", 1.98), ("stream", 1.12), ("fresh", 1.36))}
    (tmp_path / "cores.json").write_text(json.dumps({"results": {
        "procs": 2, "repeat": 5, "workloads": w}}))
    assert ("- `cores.json`: 2 processes at once against one alone (median of 5): scalar 1.98x, "
            "stream 1.12x, fresh 1.36x") in _others(tmp_path)
