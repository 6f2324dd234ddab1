"""The writer's status on the scheduler: plugin state, Prometheus text, JSON route, Bokeh page,
and the actor's throttled ``log_event`` publishing.

Values are checked against the numbers fed in (or, for the actor, against the
PFM the load wrote, read back with ``pfm.info``). The HTTP checks here run an
in-process scheduler; tests/test_multiprocess_cluster.py repeats them against
a separate ``dask scheduler`` process, where they prove the gauges live on the
scheduler.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
import urllib.request
from types import SimpleNamespace

import msgpack
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pfm_dask import pfm, pipeline
from pfm_dask.config import LoadConfig
from pfm_dask.dashboard import _WriterPage
from pfm_dask.dashboard_plugin import (JSON_ROUTE, PAGE, PHASES, TOPIC, PfmWriterPlugin,
                                       _WriterCollector)
from pfm_dask.inputs import expand_inputs


def _status(**kw) -> dict:
    st = {"phase": "loading", "watermark": 5, "pieces_total": 12, "backlog_batches": 3,
          "backlog_bytes": 123456, "peak_backlog_bytes": 654321, "peak_backlog_batches": 4,
          "soundings_written": 98765, "bytes_written": 4321000, "soundings_per_second": 2500.5,
          "files_done": 2, "files_total": 7, "elapsed": 12.5, "error": None,
          "pfm": "/fast/out.pfm", "load_id": "L1", "time": 1000.0}
    st.update(kw)
    return st


def _samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def _scrape(plugin) -> dict:
    reg = CollectorRegistry()
    reg.register(_WriterCollector(plugin))
    return _samples(generate_latest(reg).decode())


# ------------------------------------------------------------ plugin alone
def test_gauges_follow_the_latest_status():
    plugin = PfmWriterPlugin()
    plugin.log_event(TOPIC, _status(watermark=4))
    plugin.log_event(TOPIC, _status(phase="recompute"))
    plugin.log_event("something-else", _status(backlog_bytes=1))  # other topics are ignored
    plugin.log_event(TOPIC, "not a dict")
    v = _scrape(plugin)
    assert v[("pfm_writer_backlog_batches", ())] == 3
    assert v[("pfm_writer_backlog_bytes", ())] == 123456
    assert v[("pfm_writer_peak_backlog_bytes", ())] == 654321
    assert v[("pfm_writer_soundings_total", ())] == 98765
    assert v[("pfm_writer_written_bytes_total", ())] == 4321000
    assert v[("pfm_writer_soundings_per_second", ())] == 2500.5
    assert v[("pfm_writer_pieces_written", ())] == 5
    assert v[("pfm_writer_pieces_total", ())] == 12
    assert v[("pfm_files_done", ())] == 2
    assert v[("pfm_files_total", ())] == 7
    assert v[("pfm_writer_elapsed_seconds", ())] == 12.5
    assert v[("pfm_writer_last_update_timestamp_seconds", ())] == 1000.0
    phases = {dict(k[1])["phase"]: val for k, val in v.items() if k[0] == "pfm_writer_phase"}
    assert phases == {p: (1.0 if p == "recompute" else 0.0) for p in PHASES}
    assert plugin.updates == 2


def test_idle_gauges_before_any_load():
    v = _scrape(PfmWriterPlugin())
    assert v[("pfm_writer_backlog_bytes", ())] == 0
    assert v[("pfm_files_total", ())] == 0
    assert v[("pfm_writer_phase", (("phase", "idle"),))] == 1.0
    assert PfmWriterPlugin().snapshot()["phase"] == "idle"


def test_history_restarts_with_a_new_load_and_is_bounded():
    plugin = PfmWriterPlugin(history=5)
    for i in range(8):
        plugin.log_event(TOPIC, _status(time=100.0 + i, backlog_batches=i,
                                        phase="done" if i == 7 else "loading"))
    assert [h[0] for h in plugin.history] == [103.0, 104.0, 105.0, 106.0, 107.0]
    assert [h[1] for h in plugin.history] == [3, 4, 5, 6, 7]
    plugin.log_event(TOPIC, _status(load_id="L2", time=200.0))
    assert [h[0] for h in plugin.history] == [200.0]
    assert plugin.load_id == "L2"


def test_two_loads_at_once_the_first_is_followed_the_other_listed(monkeypatch):
    """Two drivers on one scheduler: statuses of both in turn. The gauges and history follow
    the first load to its end (not restarted by every status of the other), the other is
    listed; then the other is followed. A load silent for STALE_SECONDS is let go."""
    from pfm_dask import dashboard_plugin

    clock = [1000.0]
    monkeypatch.setattr(dashboard_plugin.time, "monotonic", lambda: clock[0])
    plugin = PfmWriterPlugin()
    for i in range(3):
        plugin.log_event(TOPIC, _status(time=10.0 + i, watermark=i))
        plugin.log_event(TOPIC, _status(load_id="L2", pfm="/fast/b.pfm", time=10.5 + i,
                                        watermark=10 + i))
        clock[0] += 0.5
    assert plugin.load_id == "L1" and [h[0] for h in plugin.history] == [10.0, 11.0, 12.0]
    assert plugin.latest["watermark"] == 2
    st = plugin.snapshot()
    assert [o["pfm"] for o in st["other_loads"]] == ["/fast/b.pfm"]
    assert st["other_loads"][0]["watermark"] == 12
    assert _scrape(plugin)[("pfm_loads_running", ())] == 2
    page = _WriterPage(SimpleNamespace(plugins={"pfm-writer": plugin}))
    page.update()
    assert "also loading" in page.text.text and "/fast/b.pfm (loading, 12 of 12" in page.text.text
    plugin.log_event(TOPIC, _status(time=13.0, phase="done"))
    assert plugin.load_id == "L1" and _scrape(plugin)[("pfm_loads_running", ())] == 1
    plugin.log_event(TOPIC, _status(load_id="L2", pfm="/fast/b.pfm", time=13.5, watermark=13))
    assert plugin.load_id == "L2" and [h[0] for h in plugin.history] == [13.5]
    assert plugin.snapshot()["other_loads"] == []
    plugin.log_event(TOPIC, _status(load_id="L3", time=14.0))
    assert plugin.load_id == "L2"
    clock[0] += dashboard_plugin.STALE_SECONDS   # L2 went silent (its driver killed): L3 is followed
    plugin.log_event(TOPIC, _status(load_id="L3", time=30.0))
    assert plugin.load_id == "L3" and plugin.snapshot()["other_loads"] == []


def test_disk_workers_are_never_offered_for_downscaling():
    ws = [SimpleNamespace(name="c0", resources={"compute": 1}),
          SimpleNamespace(name="d", resources={"disk": 1}),
          SimpleNamespace(name="plain", resources={})]
    kept = PfmWriterPlugin().valid_workers_downscaling(None, ws)
    assert [w.name for w in kept] == ["c0", "plain"]


def test_only_settings_travel_when_pickled():
    plugin = PfmWriterPlugin(history=9)
    plugin.log_event(TOPIC, _status())
    copy = pickle.loads(pickle.dumps(plugin))
    assert copy.maxlen == 9 and copy.updates == 0 and not copy.latest


def test_page_streams_the_history_and_resets_for_a_new_load():
    plugin = PfmWriterPlugin()
    sched = SimpleNamespace(plugins={})
    page = _WriterPage(sched)
    page.update()
    assert "No pfm-dask load" in page.text.text
    sched.plugins["pfm-writer"] = plugin
    for i in range(3):
        plugin.log_event(TOPIC, _status(time=10.0 + i, backlog_bytes=2**20 * (i + 1),
                                        backlog_batches=i, soundings_per_second=100.0 * i))
    page.update()
    d = page.source.data
    assert list(d["time"]) == [10000.0, 11000.0, 12000.0]
    assert list(d["backlog_mib"]) == [1.0, 2.0, 3.0]
    assert list(d["backlog_batches"]) == [0, 1, 2]
    assert list(d["rate"]) == [0.0, 100.0, 200.0]
    plugin.log_event(TOPIC, _status(time=13.0, phase="done"))
    page.update()
    assert list(page.source.data["time"])[-1] == 13000.0 and len(page.source.data["time"]) == 4
    assert "2 done of 7" in page.text.text and "/fast/out.pfm" in page.text.text
    plugin.log_event(TOPIC, _status(load_id="L2", time=50.0, error="LoadError: disk full"))
    page.update()
    assert list(page.source.data["time"]) == [50000.0]
    assert "disk full" in page.text.text


# -------------------------------------------------- the actor's publishing
@pytest.fixture(scope="module")
def small_survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("dash-survey")
    synth.generate(out, files=3, pings=40, beams=64, seed=1)
    return expand_inputs([out])


class _FakeWorker:
    address = "tcp://fake-disk-node:1"

    def __init__(self, fail=False):
        self.events: list[tuple[float, str, dict]] = []
        self.fail = fail

    def log_event(self, topic, msg):
        if self.fail:
            raise RuntimeError("worker closing")
        self.events.append((time.monotonic(), topic, msg))


def _actor_with(monkeypatch, worker, files, out, cfg):
    import distributed

    monkeypatch.setattr(distributed, "get_worker", lambda: worker)
    scans = [pipeline.prescan_file(f) for f in files]
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    actor = pipeline.WriterActor(str(out), grid, cfg, files, len(pieces))
    return actor, pieces


def test_writer_actor_publishes_throttled_msgpack_status(monkeypatch, small_survey, tmp_path):
    from pfm_dask.soundings import prepare_piece

    cfg = LoadConfig(bin_size_m=25.0, split_pings=10)
    worker = _FakeWorker()
    out = tmp_path / "p.pfm"
    actor, pieces = _actor_with(monkeypatch, worker, small_survey, out, cfg)
    assert actor.where() == worker.address
    assert len(worker.events) == 1  # at once, before any piece
    first = worker.events[0][2]
    assert first["phase"] == "loading" and first["watermark"] == 0
    assert first["files_total"] == 3 and first["pieces_total"] == len(pieces)
    grid = actor.grid()
    for p in reversed(pieces):  # out of order on purpose
        assert actor.put(prepare_piece(p, grid, cfg))
    time.sleep(1.3)
    actor.finish()
    n_after_finish = len(worker.events)
    time.sleep(0.7)
    assert len(worker.events) == n_after_finish  # the publisher stopped with finish()
    ev = worker.events
    assert all(topic == TOPIC for _, topic, _ in ev)
    for _, _, msg in ev:
        msgpack.packb(msg)  # what Worker.log_event requires
        assert msg["pfm"] == str(out) and msg["load_id"] == first["load_id"]
    gaps = [b[0] - a[0] for a, b in zip(ev[:-1], ev[1:-1])]
    assert all(g >= 0.4 for g in gaps), gaps  # throttled to one per half second
    assert 3 <= len(ev) <= 8
    last = ev[-1][2]
    assert last["phase"] == "done"
    assert last["files_done"] == 3 and last["watermark"] == len(pieces)
    assert last["backlog_batches"] == 0 and last["backlog_bytes"] == 0
    assert last["soundings_written"] == pfm.info(out)["counts"]["soundings"]


def test_writer_actor_reports_abort_and_survives_a_failing_log_event(monkeypatch, small_survey,
                                                                     tmp_path):
    cfg = LoadConfig(bin_size_m=25.0)
    worker = _FakeWorker()
    actor, _ = _actor_with(monkeypatch, worker, small_survey, tmp_path / "a.pfm", cfg)
    actor.abort()
    assert worker.events[-1][2]["phase"] == "aborted"
    broken = _FakeWorker(fail=True)
    actor, _ = _actor_with(monkeypatch, broken, small_survey, tmp_path / "b.pfm", cfg)
    assert actor.status()["phase"] == "loading"  # no exception from the publisher
    actor.abort()


# ------------------------------------------ in-process scheduler over HTTP
def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _wait_for(fn, timeout=10.0):
    t0 = time.monotonic()
    while True:
        v = fn()
        if v or time.monotonic() - t0 > timeout:
            return v
        time.sleep(0.05)


@pytest.mark.cluster
def test_preloaded_scheduler_serves_json_metrics_and_the_page():
    import prometheus_client
    from distributed import Client, LocalCluster

    for round_ in range(2):  # a second scheduler in the same process must not clash
        with LocalCluster(n_workers=0, processes=False, dashboard_address="127.0.0.1:0",
                          scheduler_kwargs={"preload": ["pfm_dask.dashboard"]}) as cluster, \
                Client(cluster) as client:
            # Over loopback: the link names the machine's address, the server listens on all.
            base = f"http://127.0.0.1:{cluster.scheduler.http_server.port}"
            preloaded = cluster.scheduler.plugins["pfm-writer"]
            client.register_plugin(PfmWriterPlugin())  # what every load does: keeps the first
            assert cluster.scheduler.plugins["pfm-writer"] is preloaded
            code, body = _get(base + JSON_ROUTE)
            assert code == 200 and json.loads(body)["phase"] == "idle"
            client.log_event(TOPIC, _status(load_id=f"R{round_}", backlog_bytes=777))
            assert _wait_for(lambda: preloaded.updates == 1)
            code, body = _get(base + JSON_ROUTE)
            st = json.loads(body)
            assert code == 200 and st["backlog_bytes"] == 777 and st["load_id"] == f"R{round_}"
            code, body = _get(base + "/metrics")
            v = _samples(body)
            assert code == 200
            assert v[("pfm_writer_backlog_bytes", ())] == 777
            assert v[("pfm_files_total", ())] == 7
            assert any(k[0].startswith("dask_scheduler_") for k in v)  # Dask's own still there
            for path in (PAGE, "/individual-pfm-writer"):
                code, body = _get(base + path)
                assert code == 200, path
                assert "bokeh" in body.lower()
        assert prometheus_client.REGISTRY.get_sample_value("pfm_writer_backlog_bytes") is None


@pytest.mark.cluster
def test_embedded_load_imports_bokeh_only_when_the_dashboard_is_asked_for(small_survey, tmp_path):
    """Bokeh's import is 0.4-0.5 s of a Dask load's start-up: pfm-dask's own schedulers build the
    dashboard at its first request. A 2-worker load nobody watches never imports Bokeh (a fresh
    interpreter: this one may have imported it already)."""
    script = (
        "import json, sys\n"
        "from pfm_dask import pipeline\n"
        "from pfm_dask.config import LoadConfig\n"
        f"res = pipeline.run_load({[str(p) for p in small_survey]!r}, {str(tmp_path / 'q.pfm')!r},"
        " LoadConfig(bin_size_m=25.0), mode='local', workers=2)\n"
        "print(json.dumps([res.exit_code, res.mode, 'bokeh' in sys.modules,"
        " 'pfm_dask.dashboard' in sys.modules]))\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == [0, "local (2 workers)", False, False], r.stdout


@pytest.mark.cluster
def test_own_scheduler_builds_the_dashboard_at_the_first_request():
    """The embedded cluster's scheduler (``dashboard=False``, the dashboard_plugin preload) serves
    /metrics and the JSON without Bokeh; the first page asked for builds Dask's dashboard with the
    "PFM writer" page, requests arriving meanwhile wait for the same build, and an unknown page
    is still a 404."""
    from concurrent.futures import ThreadPoolExecutor

    from distributed import Client

    from pfm_dask.cluster import make_local_cluster
    from pfm_dask.dashboard_plugin import serve_dashboard_on_demand

    with make_local_cluster(1) as cluster, Client(cluster) as client:
        sched = cluster.scheduler
        base = f"http://127.0.0.1:{sched.http_server.port}"
        assert client.dashboard_link.endswith("/status")
        assert len(sched.http_application.applications) == 1  # the waiting handler only
        assert _get(base + JSON_ROUTE)[0] == 200 and _get(base + "/metrics")[0] == 200
        assert len(sched.http_application.applications) == 1  # still not built
        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(lambda p: _get(base + p), [PAGE, "/status", "/"]))
        assert [code for code, _ in got] == [200, 200, 200], got
        assert all("bokeh" in body.lower() for _, body in got)
        apps = sched.http_application.applications
        assert len(apps) == 1 and "Bokeh" in type(apps[0]).__name__  # built once
        assert _get(base + "/individual-pfm-writer")[0] == 200
        assert _get(base + "/no-such-page")[0] == 404
        # a scheduler whose dashboard is built is left alone
        assert not serve_dashboard_on_demand(sched)
        assert sched.http_application.applications == apps
