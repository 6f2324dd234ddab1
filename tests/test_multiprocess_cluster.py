"""A real multi-process cluster: ``dask scheduler`` (with the pfm_dask.dashboard preload) and two
``dask worker`` processes, one ``--resources disk=1``, one ``--resources compute=1``.

Loads go through ``--scheduler``; the writer must land on the disk worker, and
the scheduler's ``/metrics``, ``/pfm/writer.json`` and ``/pfm-writer`` must
show the load while it runs (the scheduler is another process, so this proves
the gauges live there, docs/cluster.md). The finished PFM, read back with
``pfm.info``, is the reference for the final gauges.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from pfm_dask import pfm, pipeline
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

from .daskprocs import DaskProcesses, stop

pytestmark = pytest.mark.cluster


def _get(url: str, tries: int = 10) -> tuple[int, str]:
    """GET ``url``; a refused connection is retried (a loaded machine starts servers late)."""
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except urllib.error.URLError:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _metrics(base: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    code, body = _get(base + "/metrics")
    assert code == 200
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(body) for s in fam.samples
            if s.name.startswith("pfm_")}


def _phase(v: dict) -> str:
    on = [dict(k[1])["phase"] for k, val in v.items() if k[0] == "pfm_writer_phase" and val == 1]
    assert len(on) == 1, v
    return on[0]


def _page(base: str) -> tuple[str, list[str]]:
    """The "PFM writer" page as a browser gets it: the server-side Bokeh document (text, titles)."""
    from bokeh.client import pull_session
    from bokeh.models import Div
    from bokeh.plotting import figure

    with pull_session(url=base + "/pfm-writer") as session:
        doc = session.document
        text = " ".join(d.text for d in doc.select({"type": Div}))
        titles = [f.title.text for f in doc.select({"type": figure})]
    return text, titles


@pytest.fixture(scope="module")
def dask_cluster(tmp_path_factory):
    """The three processes; yields (scheduler address, dashboard base URL, {name: address})."""
    from distributed import Client

    tmp = tmp_path_factory.mktemp("mpcluster")
    sfile = tmp / "scheduler.json"
    with DaskProcesses(tmp) as dp:
        sched = dp.spawn(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                          "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sfile),
                          "--preload", "pfm_dask.dashboard"], "scheduler")
        ident = dp.scheduler_identity(sfile, sched)
        addr = ident["address"]
        base = f"http://127.0.0.1:{ident['services']['dashboard']}"
        for name, res in (("disk-node", "disk=1"), ("compute-node", "compute=1")):
            dp.spawn(["distributed.cli.dask_worker", addr, "--name", name, "--nthreads", "1",
                      "--resources", res, "--host", "127.0.0.1", "--no-dashboard"], name)
        with Client(addr, timeout="30s") as client:
            client.wait_for_workers(2, timeout=60)
            names = {w["name"]: a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
        yield addr, base, names


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("mp-survey")
    synth.generate(out, files=3, pings=40, beams=64, seed=1)
    return out


def test_page_and_routes_answer_before_any_load(dask_cluster):
    _, base, _ = dask_cluster
    code, body = _get(base + "/pfm/writer.json")
    assert code == 200 and "phase" in json.loads(body)
    code, body = _get(base + "/pfm-writer")
    assert code == 200 and "bokeh" in body.lower()
    assert _get(base + "/pfm-writer-nonexistent")[0] == 404
    text, titles = _page(base)
    assert "PFM writer" in text
    assert sorted(titles) == ["Soundings written per second", "Writer backlog (MiB)",
                              "Writer backlog (batches)"]
    v = _metrics(base)
    assert ("pfm_writer_backlog_bytes", ()) in v and ("pfm_files_done", ()) in v


def test_cli_load_through_scheduler_puts_the_writer_on_the_disk_worker(dask_cluster, survey,
                                                                         tmp_path):
    addr, base, names = dask_cluster
    out = tmp_path / "cli.pfm"
    r = subprocess.run([sys.executable, "-m", "pfm_dask.cli", "load", str(survey), "-o", str(out),
                        "--bin-size", "25", "--scheduler", addr],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "check: sound" in r.stdout
    rep = json.loads((tmp_path / "cli.pfm.data" / "load-report.json").read_text())
    assert rep["writer_worker"] == names["disk-node"]
    assert rep["check"]["sound"]
    port = base.rsplit(":", 1)[1]
    dash = [ln for ln in r.stderr.splitlines() if ln.startswith("Dask dashboard: ")]
    assert dash and f":{port}/" in dash[0], r.stderr
    # The finished load, as the scheduler's gauges tell it (the last status may still be on
    # its way from the disk worker when the command returns).
    t0 = time.monotonic()
    while _phase(v := _metrics(base)) != "done" and time.monotonic() - t0 < 5:
        time.sleep(0.1)
    soundings = pfm.info(out)["counts"]["soundings"]
    assert _phase(v) == "done"
    assert v[("pfm_files_done", ())] == v[("pfm_files_total", ())] == 3
    assert v[("pfm_writer_soundings_total", ())] == soundings > 0
    assert v[("pfm_writer_backlog_batches", ())] == 0
    assert v[("pfm_writer_backlog_bytes", ())] == 0
    assert v[("pfm_writer_pieces_written", ())] == v[("pfm_writer_pieces_total", ())]


def test_metrics_and_page_during_a_load(dask_cluster, survey, tmp_path):
    addr, base, names = dask_cluster
    out = tmp_path / "live.pfm"
    cfg = LoadConfig(bin_size_m=25.0, split_pings=5)  # 24 pieces: a load with a middle
    seen: list[dict] = []

    def progress(status):
        if seen:
            return
        # Wait for this load's first status to reach the scheduler (the plugin may still
        # show the previous load for a moment).
        t0 = time.monotonic()
        while time.monotonic() - t0 < 5:
            code, body = _get(base + "/pfm/writer.json")
            st = json.loads(body)
            if st.get("pfm") == str(out.resolve()):
                break
            time.sleep(0.05)
        metrics = _metrics(base)
        code, _ = _get(base + "/pfm-writer")
        seen.append({"json": st, "metrics": metrics, "page": code, "text": _page(base)[0]})

    res = pipeline.run_load(expand_inputs([survey]), out, cfg, mode="scheduler", scheduler=addr,
                            progress=progress)
    assert res.exit_code == 0
    assert res.writer_worker == names["disk-node"]
    assert seen, "the progress callback never ran"
    live = seen[0]
    st, v = live["json"], live["metrics"]
    assert st["pfm"] == str(out.resolve()), st
    assert live["page"] == 200
    assert "loading" in live["text"] and str(out.resolve()) in live["text"]
    assert _phase(v) == "loading"
    total = v[("pfm_writer_pieces_total", ())]
    assert total == 24
    assert 0 <= v[("pfm_writer_pieces_written", ())] < total
    assert 0 <= v[("pfm_writer_backlog_batches", ())] <= total
    assert 0 <= v[("pfm_writer_backlog_bytes", ())] <= cfg.max_backlog_bytes
    assert v[("pfm_files_total", ())] == 3
    assert 0 <= v[("pfm_files_done", ())] < 3
    soundings = pfm.info(out)["counts"]["soundings"]
    assert 0 <= v[("pfm_writer_soundings_total", ())] < soundings
    # The end of the same load.
    t0 = time.monotonic()
    while _phase(_metrics(base)) != "done" and time.monotonic() - t0 < 5:
        time.sleep(0.1)
    v = _metrics(base)
    assert v[("pfm_writer_soundings_total", ())] == soundings
    assert v[("pfm_writer_pieces_written", ())] == 24
    assert v[("pfm_writer_peak_backlog_bytes", ())] == res.peak_backlog_bytes


def test_adaptive_scaling_spares_the_disk_worker(tmp_path):
    """Adaptive down to zero retires the compute workers of the cluster's spec, never the
    hand-started disk worker (docs/cluster.md, What runs where): the scheduler as pfm_dask.cluster
    runs it, with the pfm_dask.dashboard preload, and its adaptive class."""
    from distributed import Client, LocalCluster

    from pfm_dask.cluster import _compute_adaptive_class

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp://",
                      host="127.0.0.1", dashboard_address=":0", resources={"compute": 1},
                      scheduler_kwargs={"preload": ["pfm_dask.dashboard"]}) as cl, \
            Client(cl) as client:
        disk = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker",
                                 cl.scheduler_address, "--name", "pfm-disk", "--nthreads", "1",
                                 "--resources", "disk=1", "--no-nanny", "--host", "127.0.0.1",
                                 "--no-dashboard"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=tmp_path)
        try:
            client.wait_for_workers(3, timeout=60)
            # Without the plugin, the scheduler's advice for "no workers needed" includes the
            # disk worker; with it, only the compute workers.
            def advice(dask_scheduler, with_plugin):
                plugins = dask_scheduler.plugins
                saved = plugins.pop("pfm-writer") if not with_plugin else None
                try:
                    return sorted(map(str, dask_scheduler.workers_to_close(target=0,
                                                                           attribute="name")))
                finally:
                    if saved is not None:
                        plugins["pfm-writer"] = saved

            assert client.run_on_scheduler(advice, with_plugin=False) == ["0", "1", "pfm-disk"]
            assert client.run_on_scheduler(advice, with_plugin=True) == ["0", "1"]
            cl.adapt(Adaptive=_compute_adaptive_class(), minimum=0, maximum=2,
                     interval="100ms", wait_count=1)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 30:
                names = [w["name"] for w in client.scheduler_info(n_workers=-1)["workers"].values()]
                if names == ["pfm-disk"]:
                    break
                time.sleep(0.1)
            assert names == ["pfm-disk"]
            assert disk.poll() is None  # the disk worker process is still up
        finally:
            stop([disk])


def test_local_profile_runs_the_embedded_cluster(survey, tmp_path):
    """``--cluster local --cluster-config`` is the embedded cluster, dashboard page included."""
    from pfm_dask.cluster import ClusterProfile

    prof = ClusterProfile.from_dict({"kind": "local", "workers": 1,
                                     "scheduler": {"dashboard_address": "127.0.0.1:0"}})
    links: list[str] = []
    pages: list[int] = []

    def progress(status):
        if not pages:  # the link names the machine's address; ask over loopback
            port = links[0].rsplit(":", 1)[1].split("/")[0]
            pages.append(_get(f"http://127.0.0.1:{port}/pfm-writer")[0])

    res = pipeline.run_load(expand_inputs([survey]), tmp_path / "local.pfm",
                            LoadConfig(bin_size_m=25.0), mode="cluster", cluster_profile=prof,
                            on_dashboard=links.append, progress=progress)
    assert res.exit_code == 0 and res.mode == "local (1 workers)"
    assert links and links[0].endswith("/status")
    assert pages == [200]
