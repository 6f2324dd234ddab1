"""The embedded cluster's layouts: by default one worker in the driver's process runs the
compute threads beside the writer (the cheapest on two cores, docs/performance.md);
``processes`` runs worker processes, the first also holding the writer; ``apart`` adds a disk
process that only writes, as on a disk node. Checked on the specs and on running clusters.
"""

from __future__ import annotations

import pytest

from pfm_dask import cluster as cluster_mod
from pfm_dask.cluster import LOCAL_DISK_WORKER, LOCAL_WORKER, local_worker_specs
from pfm_dask.errors import ConfigError


def _resources(specs: dict) -> dict:
    return {name: s["options"]["resources"] for name, s in specs.items()}


def test_by_default_one_in_process_worker_has_every_compute_thread_and_the_writer():
    from distributed import Worker

    specs = local_worker_specs(3, scratch="/tmp", host="127.0.0.1")
    assert _resources(specs) == {LOCAL_WORKER: {"compute": 3, "disk": 1}}
    assert specs[LOCAL_WORKER]["options"]["nthreads"] == 3
    assert specs[LOCAL_WORKER]["cls"] is Worker  # no process of its own
    # no Dask memory limit: it would pause the tasks on the whole load's memory
    assert specs[LOCAL_WORKER]["options"]["memory_limit"] == 0
    # its messages to the scheduler in this process are passed in memory, not through TCP
    assert specs[LOCAL_WORKER]["options"]["protocol"] == "inproc://"
    assert "host" not in specs[LOCAL_WORKER]["options"]


def test_with_the_writer_apart_the_disk_worker_computes_nothing():
    specs = local_worker_specs(2, scratch="/tmp", host="127.0.0.1", layout="apart")
    assert _resources(specs) == {LOCAL_DISK_WORKER: {"disk": 1},
                                 "pfm-worker-0": {"compute": 1}, "pfm-worker-1": {"compute": 1}}
    assert all(s["options"]["nthreads"] == 1 for s in specs.values())


def test_in_the_processes_layout_the_first_worker_also_holds_the_writer():
    from distributed import Nanny

    specs = local_worker_specs(2, scratch="/tmp", host="127.0.0.1", layout="processes")
    assert _resources(specs) == {"pfm-worker-0": {"compute": 1, "disk": 1},
                                 "pfm-worker-1": {"compute": 1}}
    assert all(s["cls"] is Nanny for s in specs.values())


def test_an_unknown_layout_is_refused():
    with pytest.raises(ConfigError, match="layout"):
        local_worker_specs(2, scratch="/tmp", host="127.0.0.1", layout="fibres")


def test_a_local_profile_may_choose_the_layout():
    prof = cluster_mod.ClusterProfile.from_dict({"kind": "local", "layout": "processes"})
    assert prof.layout == "processes"
    assert cluster_mod.ClusterProfile.from_dict({"kind": "local"}).layout == "threads"
    with pytest.raises(ConfigError, match="layout"):
        cluster_mod.ClusterProfile.from_dict({"kind": "local", "layout": "fibres"})


def test_running_embedded_clusters_have_the_layouts_resources():
    from distributed import Client

    def got(cluster):
        with Client(cluster) as client:
            info = client.scheduler_info(n_workers=-1)["workers"].values()
            return sorted((w["name"], tuple(sorted(w["resources"].items())), w["nthreads"])
                          for w in info)

    with cluster_mod.make_local_cluster(2) as cluster:
        assert got(cluster) == [(LOCAL_WORKER, (("compute", 2), ("disk", 1)), 2)]
    with cluster_mod.make_local_cluster(1, processes=False, layout="apart") as cluster:
        assert got(cluster) == [(LOCAL_DISK_WORKER, (("disk", 1),), 1),
                                ("pfm-worker-0", (("compute", 1),), 1)]


def test_bench_load_runs_the_other_layouts_beside_the_default(tmp_path):
    """``bench_load --layouts processes,apart`` times 2 workers in the other layouts in the
    same rotation, for an A/B; each loads what --serial loads."""
    from benchmarks import bench_load
    from pfm_dask import synth
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs

    synth.generate(tmp_path / "gsf", files=3, pings=20, beams=32, seed=2)
    paths = expand_inputs([tmp_path / "gsf"])
    cfg = LoadConfig(bin_size_m=25.0)
    ser = bench_load.run_once(paths, "serial", 1, cfg, "serial", work=tmp_path)
    for layout in ("processes", "apart"):
        other = bench_load.run_once(paths, layout, 2, cfg, layout, work=tmp_path)
        assert other["soundings_loaded"] == ser["soundings_loaded"] > 0
        assert other["phases_s"]["cluster_start"] > 0
