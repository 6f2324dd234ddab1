"""The embedded cluster's layouts: by default the first compute worker also holds the
writer (the faster on two cores, docs/performance.md); ``writer_apart`` gives the writer a
disk process of its own, as on a disk node. Checked on the specs and on a running cluster.
"""

from __future__ import annotations

from pfm_dask import cluster as cluster_mod
from pfm_dask.cluster import LOCAL_DISK_WORKER, local_worker_specs


def _resources(specs: dict) -> dict:
    return {name: s["options"]["resources"] for name, s in specs.items()}


def test_with_the_writer_apart_the_disk_worker_computes_nothing():
    specs = local_worker_specs(2, scratch="/tmp", host="127.0.0.1", writer_apart=True)
    assert _resources(specs) == {LOCAL_DISK_WORKER: {"disk": 1},
                                 "pfm-worker-0": {"compute": 1}, "pfm-worker-1": {"compute": 1}}
    assert all(s["options"]["nthreads"] == 1 for s in specs.values())


def test_by_default_the_first_worker_also_holds_the_writer():
    specs = local_worker_specs(2, scratch="/tmp", host="127.0.0.1")
    assert _resources(specs) == {"pfm-worker-0": {"compute": 1, "disk": 1},
                                 "pfm-worker-1": {"compute": 1}}


def test_a_running_embedded_cluster_can_have_the_writer_apart():
    from distributed import Client

    with cluster_mod.make_local_cluster(1, processes=False, writer_apart=True) as cluster, Client(cluster) as client:
        info = client.scheduler_info(n_workers=-1)["workers"].values()
        got = sorted((w["name"], tuple(sorted(w["resources"].items()))) for w in info)
    assert got == [(LOCAL_DISK_WORKER, (("disk", 1),)), ("pfm-worker-0", (("compute", 1),))]


def test_bench_load_runs_the_other_layout_beside_the_default(tmp_path):
    """``bench_load --writer-apart`` times 2 workers plus a disk worker that only writes in
    the same rotation, for an A/B of the two layouts; it loads what --serial loads."""
    from benchmarks import bench_load
    from pfm_dask import synth
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs

    synth.generate(tmp_path / "gsf", files=3, pings=20, beams=32, seed=2)
    paths = expand_inputs([tmp_path / "gsf"])
    cfg = LoadConfig(bin_size_m=25.0)
    ser = bench_load.run_once(paths, "serial", 1, cfg, "serial", work=tmp_path)
    apart = bench_load.run_once(paths, "apart", 2, cfg, "apart", work=tmp_path)
    assert apart["soundings_loaded"] == ser["soundings_loaded"] > 0
    assert apart["phases_s"]["cluster_start"] > 0
