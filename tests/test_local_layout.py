"""The embedded cluster's layout: the writer's disk worker is a process of its own.

A disk worker that also computed ran the writer beside a task, sharing its GIL and its
allocator: on a few large files the writer fell behind and 2 workers lost to --serial
(issue 19). The layout is checked on the specs and on a running cluster.
"""

from __future__ import annotations

from pfm_dask import cluster as cluster_mod
from pfm_dask.cluster import LOCAL_DISK_WORKER, local_worker_specs


def _resources(specs: dict) -> dict:
    return {name: s["options"]["resources"] for name, s in specs.items()}


def test_the_disk_worker_computes_nothing():
    specs = local_worker_specs(2, scratch="/tmp", host="127.0.0.1")
    assert _resources(specs) == {LOCAL_DISK_WORKER: {"disk": 1},
                                 "pfm-worker-0": {"compute": 1}, "pfm-worker-1": {"compute": 1}}
    assert all(s["options"]["nthreads"] == 1 for s in specs.values())


def test_the_shared_layout_is_still_there_when_asked_for():
    specs = local_worker_specs(2, scratch="/tmp", host="127.0.0.1", writer_apart=False)
    assert _resources(specs) == {"pfm-worker-0": {"compute": 1, "disk": 1},
                                 "pfm-worker-1": {"compute": 1}}


def test_a_running_embedded_cluster_has_the_writer_apart():
    from distributed import Client

    with cluster_mod.make_local_cluster(1, processes=False) as cluster, Client(cluster) as client:
        info = client.scheduler_info(n_workers=-1)["workers"].values()
        got = sorted((w["name"], tuple(sorted(w["resources"].items()))) for w in info)
    assert got == [(LOCAL_DISK_WORKER, (("disk", 1),)), ("pfm-worker-0", (("compute", 1),))]


def test_bench_load_runs_the_old_layout_beside_the_new(tmp_path):
    """``bench_load --shared-layout`` times 2 workers with the writer on a computing worker in
    the same rotation, for an A/B of the two layouts; it loads what --serial loads."""
    from benchmarks import bench_load
    from pfm_dask import synth
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs

    synth.generate(tmp_path / "gsf", files=3, pings=20, beams=32, seed=2)
    paths = expand_inputs([tmp_path / "gsf"])
    cfg = LoadConfig(bin_size_m=25.0)
    ser = bench_load.run_once(paths, "serial", 1, cfg, "serial", work=tmp_path)
    shared = bench_load.run_once(paths, "shared", 2, cfg, "shared", work=tmp_path)
    assert shared["soundings_loaded"] == ser["soundings_loaded"] > 0
    assert shared["phases_s"]["cluster_start"] > 0
