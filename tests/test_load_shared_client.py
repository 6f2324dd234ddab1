"""Loads that share one Dask client or scheduler: each load's tasks and writer actor are its own.

Dask takes a task's key as its identity: a task submitted under a key the scheduler still holds
is not run again, the existing result is handed back. The writer actor's key was once the
fixed ``pfm-writer``: a driver that still held an earlier load's writer proxy (an ``Actor``
is freed only by the cyclic garbage collector) got that finished actor back for its next load,
wrote nothing, and reported the earlier load's result as its own.
"""

from __future__ import annotations

import gc
import json
import time

import pytest

from pfm_dask import pipeline
from pfm_dask.cluster import make_local_cluster
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("shared")
    synth.generate(out, files=3, pings=20, beams=32, seed=2)
    return expand_inputs([out])


def _report(out) -> dict:
    return json.loads((out.parent / (out.name + ".data") / "load-report.json").read_text())


def test_two_loads_on_one_client_each_write_their_own_pfm(survey, tmp_path):
    """The second load writes its own PFM from its own inputs while the first load's writer
    proxy is still alive in the driver (the garbage collector off, as between two of its
    full collections)."""
    from distributed import Client

    cfg = LoadConfig(bin_size_m=25.0)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with make_local_cluster(2, layout="processes", processes=False) as cluster, \
                Client(cluster) as client:
            first = pipeline.run_load(survey, tmp_path / "p0.pfm", cfg, mode="scheduler",
                                      client=client)
            second = pipeline.run_load(survey[:2], tmp_path / "p1.pfm", cfg, mode="scheduler",
                                       client=client)
    finally:
        if was_enabled:
            gc.enable()
    assert first.exit_code == 0 and second.exit_code == 0
    assert second.pfm == str(tmp_path / "p1.pfm")
    for out, files in ((tmp_path / "p0.pfm", survey), (tmp_path / "p1.pfm", survey[:2])):
        report = _report(out)
        assert report["pfm"] == str(out)
        assert [f["path"] for f in report["files"]] == [str(f) for f in files]
    assert (tmp_path / "p1.pfm.data" / "p1.pfm.ctl").read_text().count(".gsf") == 2


def test_a_finished_load_leaves_no_task_or_actor_on_the_cluster(survey, tmp_path):
    """The writer actor and the warm-up results go when the load ends, not when the driver's
    garbage collector next frees their proxies: a finished writer keeps a byte per bin of the
    grid, and a long-lived cluster would hold one per load."""
    from distributed import Client

    def held(dask_scheduler=None):
        return sorted(str(k) for k in dask_scheduler.tasks)

    def actors(dask_worker=None):
        return len(dask_worker.state.actors)

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        with make_local_cluster(2, layout="processes", processes=False) as cluster, \
                Client(cluster) as client:
            res = pipeline.run_load(survey, tmp_path / "a.pfm", LoadConfig(bin_size_m=25.0),
                                    mode="scheduler", client=client)
            assert res.exit_code == 0
            deadline = time.monotonic() + 10
            while (client.run_on_scheduler(held) or any(client.run(actors).values())) \
                    and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.run_on_scheduler(held) == []
            assert sum(client.run(actors).values()) == 0
    finally:
        if was_enabled:
            gc.enable()


def test_a_load_goes_on_while_another_loads_final_step_runs_on_the_same_disk_worker(
        survey, tmp_path, monkeypatch):
    """Both writers live on the one disk worker, which runs every actor's calls on one
    thread: a final step run on it (minutes on a large survey) held up every call of the other
    load's writer, its pieces and its status, until it ended. The first load's final step is
    slowed to 6 s here; the second, started meanwhile, must end before it."""
    import threading

    from distributed import Client

    from pfm_dask import pfm, writer

    slow_out = str(tmp_path / "slow.pfm")
    real = pfm.recompute
    in_final = threading.Event()

    def recompute(f, *a, **kw):
        if str(f.path) == slow_out:
            in_final.set()
            time.sleep(6)
        return real(f, *a, **kw)

    monkeypatch.setattr(writer.pfm, "recompute", recompute)
    cfg = LoadConfig(bin_size_m=25.0)
    ended: dict = {}
    with make_local_cluster(2, layout="processes", processes=False) as cluster:
        def load(out, files) -> None:
            with Client(cluster) as client:
                res = pipeline.run_load(files, out, cfg, mode="scheduler", client=client)
            ended[str(out)] = (res.exit_code, time.monotonic())

        first = threading.Thread(target=load, args=(tmp_path / "slow.pfm", survey))
        first.start()
        assert in_final.wait(60)
        load(tmp_path / "quick.pfm", survey[:2])
        first.join(120)
    (slow_code, slow_end), (quick_code, quick_end) = (ended[slow_out],
                                                      ended[str(tmp_path / "quick.pfm")])
    assert slow_code == 0 and quick_code == 0
    assert quick_end < slow_end, "the second load waited for the first one's final step"


def test_a_load_survives_another_client_of_its_process_closing(survey, tmp_path):
    """Two clients in one process (two loads from one notebook or service): the writer's proxy
    belongs to its load's client, not to the process's default one (the newest client),
    whose closing cancelled it mid-load."""
    from distributed import Client

    with make_local_cluster(2, layout="processes", processes=False) as cluster:
        mine = Client(cluster, set_as_default=False)
        other = Client(cluster)            # the process's default client from here on

        def close_other(status: dict) -> None:
            if other.status == "running":
                other.close()

        try:
            res = pipeline.run_load(survey, tmp_path / "m.pfm", LoadConfig(bin_size_m=25.0),
                                    mode="scheduler", client=mine, progress=close_other)
        finally:
            other.close()
            mine.close()
    assert res.exit_code == 0
    assert other.status == "closed"
