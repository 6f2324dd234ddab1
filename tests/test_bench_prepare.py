"""``benchmarks.bench_prepare --quick`` still runs, writes its results, and finds the task's
batches identical to the numpy path's. No timing is asserted (the machine may be busy)."""

from __future__ import annotations

import json


def test_bench_prepare_quick(tmp_path):
    from benchmarks import bench_prepare

    assert bench_prepare.main(["--quick", "--results-dir", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "bench_prepare_quick.json").read_text())
    r = doc["results"]
    assert r["prescan"]["cpu_s_per_file"] > 0
    for variant in ("plain", "swath"):
        v = r[variant]
        assert v["identical"] and v["soundings"] > 0 and v["cpu_ratio"] > 0
        for path in ("task", "numpy"):
            assert set(v[path]) == {"cpu_ns", "decode_ns", "place_filter_bin_ns", "sort_pack_ns"}
    assert (tmp_path / "bench_prepare_quick_phases.png").is_file()
