"""Loads on Dask: same output whatever the mode, the writer pinned to the disk worker,
a bounded backlog behind a slow writer."""

from __future__ import annotations

import time

import dask
import numpy as np
import pyarrow.parquet as pq
import pytest

from pfm_dask import pfm, pipeline
from pfm_dask import pipeline_tasks as tasks
from pfm_dask.cluster import make_local_cluster
from pfm_dask.config import LoadConfig, SwathFilterConfig
from pfm_dask.inputs import expand_inputs

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("dsurvey")
    synth.generate(out, files=4, pings=60, beams=128, seed=11)
    return out


def _dump_tables(pfm_path, tmp):
    s, b = tmp / (pfm_path.stem + "-s.parquet"), tmp / (pfm_path.stem + "-b.parquet")
    pfm.dump(pfm_path, soundings=s, bins=b)
    return pq.read_table(s), pq.read_table(b)


def test_same_dump_serial_one_and_two_workers_and_across_runs(survey, tmp_path):
    paths = expand_inputs([survey])
    # Small pieces so that files are split and arrive out of order.
    cfg = LoadConfig(bin_size_m=25.0, split_pings=17, area_filter=True,
                     swath=SwathFilterConfig(enabled=True))
    outs = {}
    for name, mode, workers in [("serial", "serial", 1), ("w1", "local", 1),
                                ("w2", "local", 2), ("w2b", "local", 2)]:
        out = tmp_path / f"{name}.pfm"
        res = pipeline.run_load(paths, out, cfg, mode=mode, workers=workers)
        assert res.exit_code == 0, res.summary()
        outs[name] = _dump_tables(out, tmp_path)
    ref_s, ref_b = outs["serial"]
    assert ref_s.num_rows > 0
    for name in ("w1", "w2", "w2b"):
        s, b = outs[name]
        assert s.equals(ref_s), name
        assert b.equals(ref_b), name
    # Writes happen in input order, so even the raw files are identical.
    for part in (".ndx", ".bin", ".lin"):
        a = (tmp_path / "serial.pfm.data" / f"serial.pfm{part}").read_bytes()
        b = (tmp_path / "w2.pfm.data" / f"w2.pfm{part}").read_bytes()
        if part == ".bin":  # the header holds the creation date
            a, b = a[131072:], b[131072:]
        assert a == b, part


def test_writer_runs_on_the_disk_worker(survey, tmp_path):
    from distributed import Client

    with make_local_cluster(2) as cluster, Client(cluster) as client:
        info = client.scheduler_info(n_workers=-1)["workers"]
        disk = [a for a, w in info.items() if w["resources"].get("disk")]
        assert len(disk) == 1
        res = pipeline.run_load(expand_inputs([survey]), tmp_path / "d.pfm",
                                LoadConfig(bin_size_m=25.0), mode="scheduler", client=client)
    assert res.writer_worker == disk[0]
    assert res.exit_code == 0


def test_no_disk_worker_is_a_clear_error(survey, tmp_path):
    from distributed import Client, LocalCluster

    from pfm_dask.errors import ConfigError

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                      resources={"compute": 1}, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        with pytest.raises(ConfigError, match="--resources disk=1"):
            pipeline.run_load(expand_inputs([survey]), tmp_path / "n.pfm", LoadConfig(),
                              mode="scheduler", client=client)


def test_slow_writer_keeps_the_backlog_under_its_limit(survey, tmp_path, monkeypatch):
    """Producers outpace a slow writer; the driver's window keeps the bytes waiting bounded."""
    from distributed import Client

    from pfm_dask.writer import PfmWriter

    real = PfmWriter._write_group

    def slow(self, group):
        time.sleep(0.15 * len(group))
        return real(self, group)

    monkeypatch.setattr(PfmWriter, "_write_group", slow)
    limit = 1 << 20
    cfg = LoadConfig(bin_size_m=25.0, split_pings=6, max_backlog_bytes=limit)
    with make_local_cluster(2, processes=False) as cluster, Client(cluster) as client:
        res = pipeline.run_load(expand_inputs([survey]), tmp_path / "slow.pfm", cfg,
                                mode="scheduler", client=client)
    assert res.exit_code == 0
    n_pieces = sum(r["pieces"] for r in res.files)
    assert n_pieces >= 30
    assert 0 < res.peak_backlog_bytes <= limit
    # The same content as an unthrottled serial run.
    ser = pipeline.run_load(expand_inputs([survey]), tmp_path / "ser.pfm",
                            LoadConfig(bin_size_m=25.0), mode="serial")
    a, _ = _dump_tables(tmp_path / "slow.pfm", tmp_path)
    b, _ = _dump_tables(tmp_path / "ser.pfm", tmp_path)
    assert a.equals(b)
    assert ser.exit_code == 0
    np.testing.assert_equal(res.totals["loaded"], ser.totals["loaded"])


def test_pieces_made_on_the_disk_worker_reach_the_writer_in_memory(survey, tmp_path, monkeypatch):
    """A task in the writer's own process hands its piece over directly (no pickling, no TCP),
    from the writer's worker or another worker of that process (the embedded cluster's
    threads); the output is the serial one. (Tasks in other processes go through the actor:
    tests/test_worker_loss.py, tests/test_multiprocess_cluster.py.)"""
    from distributed import Client

    from pfm_dask.pipeline import WriterActor

    calls = []
    real_local = tasks._local_writer

    def spy(*a):
        got = real_local(*a)
        calls.append(got is not None)
        return got

    monkeypatch.setattr(tasks, "_local_writer", spy)
    puts = []
    real_put = WriterActor.put
    monkeypatch.setattr(WriterActor, "put", lambda self, p: puts.append(p.piece.seq) or real_put(self, p))
    cfg = LoadConfig(bin_size_m=25.0, split_pings=6)
    with make_local_cluster(2, processes=False, layout="processes") as cluster, Client(cluster) as client:
        res = pipeline.run_load(expand_inputs([survey]), tmp_path / "local.pfm", cfg,
                                mode="scheduler", client=client)
    assert res.exit_code == 0, res.summary()
    n_pieces = sum(r["pieces"] for r in res.files)
    assert len(calls) == n_pieces + 1 and all(calls)  # each task, and the driver once
    assert sorted(puts) == list(range(n_pieces))
    ser = pipeline.run_load(expand_inputs([survey]), tmp_path / "ser.pfm",
                            LoadConfig(bin_size_m=25.0), mode="serial")
    a, _ = _dump_tables(tmp_path / "local.pfm", tmp_path)
    b, _ = _dump_tables(tmp_path / "ser.pfm", tmp_path)
    assert a.equals(b) and ser.exit_code == 0


def test_a_faster_worker_gets_more_pieces(survey, tmp_path, monkeypatch):
    """Pieces go to whichever worker frees first: with the disk worker's tasks made slow, the
    other worker takes most of them (dynamic load balancing)."""
    from distributed import Client, get_worker

    real = tasks.prepare_piece
    ran = []

    def slow_on_disk_worker(piece, grid, cfg):
        on_disk = bool(get_worker().state.total_resources.get("disk", 0))
        ran.append(on_disk)
        if on_disk:
            time.sleep(0.4)
        return real(piece, grid, cfg)

    monkeypatch.setattr(tasks, "prepare_piece", slow_on_disk_worker)
    cfg = LoadConfig(bin_size_m=25.0, split_pings=10)
    with make_local_cluster(2, processes=False, layout="processes") as cluster, Client(cluster) as client:
        res = pipeline.run_load(expand_inputs([survey]), tmp_path / "bal.pfm", cfg,
                                mode="scheduler", client=client)
    assert res.exit_code == 0, res.summary()
    assert len(ran) >= 20
    assert sum(ran) / len(ran) < 0.3, f"disk worker ran {sum(ran)} of {len(ran)} pieces"


def _worker_settings():
    import os

    import dask

    return (dask.config.get("distributed.worker.profile.enabled"),
            os.environ.get("MALLOC_TRIM_THRESHOLD_"))


def _callback_periods(dask_worker):
    return {k: pc.callback_time for k, pc in dask_worker.periodic_callbacks.items()}


def _scheduler_callback_periods(dask_scheduler):
    return {k: pc.callback_time for k, pc in dask_scheduler.periodic_callbacks.items()}


def test_embedded_workers_start_without_malloc_trim_and_profiler():
    """The embedded cluster's worker processes run without distributed's
    MALLOC_TRIM_THRESHOLD_ (fresh page-faulted memory for every large array) and without
    its statistical profiler (both measured to cost CPU the --serial baseline does not pay)."""
    from distributed import Client

    with make_local_cluster(1, layout="processes") as cluster, Client(cluster) as client:
        got = client.run(_worker_settings)
        # and with fewer event-loop wake-ups, in the worker process and in this one
        # (scheduler, nanny): the periodic callbacks' periods in ms
        worker_cb = list(client.run(_callback_periods).values())[0]
        sched_cb = client.run_on_scheduler(_scheduler_callback_periods)
        nanny_cb = [{k: pc.callback_time for k, pc in n.periodic_callbacks.items()}
                    for n in cluster.workers.values()]
    assert set(got.values()) == {(False, None)} and len(got) == 1  # one worker: it computes and writes
    assert worker_cb["tick"] == 1000 and worker_cb["monitor"] == 1000
    assert worker_cb["memory_monitor"] == 500
    assert sched_cb["tick"] == 1000 and sched_cb["monitor"] == 1000
    assert [n["memory_monitor"] for n in nanny_cb] == [500]
    # the default layout's worker runs in this process: the same profiler and loop settings
    with make_local_cluster(1) as cluster, Client(cluster) as client:
        worker_cb = list(client.run(_callback_periods).values())[0]
    assert "profile" not in worker_cb and "profile-cycle" not in worker_cb
    assert worker_cb["tick"] == 1000 and worker_cb["monitor"] == 1000
    assert "memory_monitor" not in worker_cb  # no Dask memory limit in the load's process


def test_plain_dask_workers_compute_when_none_declares_compute(survey, tmp_path):
    """An ordinary cluster: only the writer's worker declares a resource (``disk=1``), the
    others are plain ``dask worker ADDRESS``; the load runs and writes the serial bytes."""
    from distributed import Client, Scheduler, SpecCluster, Worker

    paths = expand_inputs([survey])
    cfg = LoadConfig(bin_size_m=25.0)
    pipeline.run_load(paths, tmp_path / "ser.pfm", cfg, mode="serial")
    workers = {"disk": {"cls": Worker, "options": {"nthreads": 1, "resources": {"disk": 1}}},
               "plain": {"cls": Worker, "options": {"nthreads": 1}}}
    # (Dask's statistical profiler off: once, with it sampling every 10 ms, this test hung,
    # the event loop inside sys._current_frames and the writer's thread waiting for the GIL
    # in os.fstat; a CPython/distributed matter that this test does not test)
    with dask.config.set({"distributed.worker.profile.enabled": False}), \
            SpecCluster(workers=workers, scheduler={"cls": Scheduler, "options": {
                "dashboard_address": ":0"}}) as cluster, Client(cluster) as client:
        res = pipeline.run_load(paths, tmp_path / "plain.pfm", cfg, mode="scheduler",
                                client=client)
    assert res.exit_code == 0, res.summary()
    s, b = _dump_tables(tmp_path / "plain.pfm", tmp_path)
    rs, rb = _dump_tables(tmp_path / "ser.pfm", tmp_path)
    assert s.equals(rs) and b.equals(rb)


def test_a_whole_group_from_the_writers_watermark_counts_once_delivered():
    """A group counts when the pieces handed over from the writer's watermark on reach
    ``group_bytes``, or the last piece; not while its next piece is missing."""
    est = {0: 60, 1: 60, 2: 60, 3: 10}
    status = {"watermark": 1, "pieces_total": 4}
    ready = pipeline._writer_groups_ready
    assert ready(status, set(), est, 100) == 0
    assert ready(status, {0, 1}, est, 100) == 0           # 60 of 100 bytes: it waits for 2
    assert ready(status, {0, 2}, est, 100) == 0           # its next piece is not there
    assert ready(status, {0, 1, 2}, est, 100) == 1        # 120 bytes: a whole group
    assert ready(status, {0, 1, 2, 3}, est, 100) == 2     # and the last piece ends the next
    assert ready({"watermark": 3, "pieces_total": 4}, {3}, est, 100) == 1  # the last piece


def test_a_local_load_prescans_while_its_cluster_starts(survey, tmp_path, monkeypatch):
    """The embedded cluster's load pre-scans its files in this process while the cluster
    starts (pfm_dask.head_start), not as tasks once it is up; the report is unchanged."""
    import threading

    from pfm_dask import cluster as cluster_mod, head_start

    up = threading.Event()
    seen: list[tuple[str, bool]] = []
    real_scan, real_cluster = head_start.prescan_file, cluster_mod.make_local_cluster

    def scan(path, exact_beams=False):
        seen.append((threading.current_thread().name, up.is_set()))
        return real_scan(path, exact_beams)

    def cluster(*a, **kw):
        c = real_cluster(*a, **kw)
        up.set()
        return c

    monkeypatch.setattr(head_start, "prescan_file", scan)
    monkeypatch.setattr(cluster_mod, "make_local_cluster", cluster)
    paths = expand_inputs([survey])
    res = pipeline.run_load(paths, tmp_path / "h.pfm", LoadConfig(bin_size_m=25.0),
                            mode="local", workers=2)
    assert res.exit_code == 0, res.summary()
    assert len(seen) == len(paths)
    assert all(name.startswith("pfm-head-start") for name, _ in seen), seen
    assert not seen[0][1], "the first file was pre-scanned only after the cluster was up"
    ref = pipeline.run_load(paths, tmp_path / "s.pfm", LoadConfig(bin_size_m=25.0),
                            mode="serial")
    assert res.totals == ref.totals and res.grid == ref.grid


def test_a_serial_load_prescans_two_files_at_a_time_in_order(survey, tmp_path, monkeypatch):
    """``--serial`` pre-scans on two threads of its own (two reads in flight: a cold page cache
    answers them faster than one), the results in the files' order; a pre-scan that stops the
    load (Ctrl-C) leaves the files not yet started unscanned."""
    import os
    import signal
    import threading

    from pfm_dask import head_start

    real_scan = head_start.prescan_file
    paths = expand_inputs([survey])
    both = threading.Barrier(2, timeout=30)    # two scans at once, or the barrier breaks
    seen: list[str] = []

    def scan(path, exact_beams=False):
        seen.append(threading.current_thread().name)
        if len(seen) <= 2:
            both.wait()
        return real_scan(path, exact_beams)

    monkeypatch.setattr(head_start, "prescan_file", scan)
    res = pipeline.run_load(paths, tmp_path / "t.pfm", LoadConfig(bin_size_m=25.0),
                            mode="serial")
    assert res.exit_code == 0, res.summary()
    assert len(seen) == len(paths) and len(set(seen)) == 2, seen
    assert all(name.startswith("pfm-head-start") for name in seen), seen
    assert [f["path"] for f in res.files] == [str(p) for p in paths]

    started: list[str] = []

    def stopping(path, exact_beams=False):     # Ctrl-C while the first two files are read
        started.append(path)
        if len(started) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.3)
        return real_scan(path, exact_beams)

    monkeypatch.setattr(head_start, "prescan_file", stopping)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_load(paths, tmp_path / "k.pfm", LoadConfig(bin_size_m=25.0), mode="serial")
    time.sleep(0.5)
    assert len(started) == 2, started


def test_the_window_counts_the_writers_whole_groups():
    """The driver keeps a slot for the in-process writer only when it is behind: the group
    after the one it writes is whole (groups as the writer closes them: at ``group_bytes``,
    or at the last piece)."""
    ready = pipeline._writer_groups_ready
    est = {s: 10 for s in range(10)}
    status = {"watermark": 2, "pieces_total": 10}
    assert ready(status, set(), est, 30) == 0
    assert ready(status, {2, 3}, est, 30) == 0            # the group of 2-4 not whole yet
    assert ready(status, {3, 4, 5}, est, 30) == 0         # 2 missing: nothing in order
    assert ready(status, {2, 3, 4}, est, 30) == 1         # writing it
    assert ready(status, {2, 3, 4, 5, 6}, est, 30) == 1   # the next one not whole
    assert ready(status, {2, 3, 4, 6, 7, 8}, est, 30) == 1   # 5 missing: the next not whole
    assert ready(status, set(range(2, 10)), est, 30) == 2  # behind: 5-7 waits behind 2-4
    assert ready({"watermark": 8, "pieces_total": 10}, {8, 9}, est, 30) == 1   # the last piece ends a group
    assert ready({"watermark": 9, "pieces_total": 10}, {9}, est, 30) == 1
