"""The writer's progress on the scheduler, without Bokeh: the plugin behind the gauges, the JSON
and the page of :mod:`pfm_dask.dashboard`, and the preload of pfm-dask's own schedulers.

The writer actor publishes its status every half second with
``worker.log_event("pfm-writer", status)``. The scheduler hands each event to
:class:`PfmWriterPlugin`, which keeps the latest status and a history, and serves them from the
scheduler's dashboard port (docs/cluster.md, Watching a load):

* ``/metrics``: gauges such as ``pfm_writer_backlog_bytes``, ``pfm_writer_backlog_batches``,
  ``pfm_writer_soundings_total``, ``pfm_files_done`` (a custom collector on the global
  Prometheus registry, registered in ``start`` and removed in ``close``, so a second scheduler
  in the same process does not clash);
* ``/pfm/writer.json``: the latest status as JSON;
* the data of the "PFM writer" page of :mod:`pfm_dask.dashboard`.

These work on any scheduler, because ``pfm-dask load`` registers the plugin itself. The plugin
also keeps workers holding the ``disk`` resource out of adaptive downscaling, so the writer's
worker is never retired under a load.

Dask builds a scheduler's Bokeh dashboard when the scheduler starts; importing Bokeh takes
0.4-0.5 s of the one core a load's start-up keeps busy. pfm-dask's own schedulers (the embedded
cluster, the Slurm and PBS clusters) start with ``dashboard=False`` and this module as their
preload: :func:`serve_dashboard_on_demand` builds the dashboard, the "PFM writer" page included,
at its first request, and a load nobody watches never imports Bokeh. A scheduler started by hand
takes ``--preload pfm_dask.dashboard``, which builds it at the start as Dask does.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import time
import weakref
from collections import deque
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

__all__ = ["PfmWriterPlugin", "TOPIC", "PLUGIN_NAME", "PAGE", "INDIVIDUAL_PAGE", "JSON_ROUTE",
           "PHASES", "serve_dashboard_on_demand", "dask_setup"]

log = logging.getLogger("pfm_dask")

TOPIC = "pfm-writer"
PLUGIN_NAME = "pfm-writer"
PAGE = "/pfm-writer"
INDIVIDUAL_PAGE = "/individual-pfm-writer"
JSON_ROUTE = "/pfm/writer.json"
PHASES = ("idle", "loading", "area filter", "recompute", "check", "done", "aborted")
HISTORY = 7200  # points kept for the page: an hour at one status per half second
#: seconds without a status after which a load counts as gone (its writer or driver died
#: without a last word): the plugin then follows the next load that reports
STALE_SECONDS = 10.0
_ENDED = ("done", "aborted")

_routed: "weakref.WeakSet[Any]" = weakref.WeakSet()  # http applications that have the route


class PfmWriterPlugin(SchedulerPlugin):
    """Scheduler plugin: the latest writer status and its history, for /metrics, JSON, the page."""

    name = PLUGIN_NAME
    idempotent = True  # registering it again (every load does) keeps the running one

    def __init__(self, history: int = HISTORY):
        self.maxlen = int(history)
        self.latest: dict = {}
        self.history: deque = deque(maxlen=self.maxlen)
        self.updates = 0
        self.load_id: str | None = None
        self._heard = 0.0                  # time.monotonic() of the followed load's last status
        self.others: dict[str, tuple[float, dict]] = {}   # other loads: (heard, latest status)
        self._collector = None
        self._scheduler = None

    def __getstate__(self):  # sent from a client before start(): only the settings travel
        return {"maxlen": self.maxlen}

    def __setstate__(self, state):
        self.__init__(state["maxlen"])

    # ----------------------------------------------------------- lifecycle
    async def start(self, scheduler) -> None:
        self._scheduler = scheduler
        for _, msg in scheduler.get_events(TOPIC):  # a load already under way
            self._update(msg)
        try:
            import prometheus_client
        except ImportError:
            log.warning("prometheus_client is not installed: no pfm_* gauges on /metrics")
        else:
            self._collector = _WriterCollector(self)
            prometheus_client.REGISTRY.register(self._collector)
        app = getattr(scheduler, "http_application", None)
        if app is not None and app not in _routed:
            app.add_handlers(r".*$", [(JSON_ROUTE, _WriterJsonHandler, {"scheduler": scheduler})])
            _routed.add(app)

    async def close(self) -> None:
        if self._collector is not None:
            import prometheus_client

            try:
                prometheus_client.REGISTRY.unregister(self._collector)
            except KeyError:
                pass
            self._collector = None

    # -------------------------------------------------------------- events
    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TOPIC and isinstance(msg, dict):
            self._update(msg)

    def _following(self, now: float) -> bool:
        """True while the followed load runs: not ended, and heard of within STALE_SECONDS."""
        return (bool(self.latest) and self.latest.get("phase") not in _ENDED
                and now - self._heard < STALE_SECONDS)

    def _update(self, msg: dict) -> None:
        """Take a writer's status. Two loads may run at once on one scheduler (two drivers):
        the gauges, JSON and page follow one load, from its first status to its end, and list
        the others; statuses of both in turn would restart the history at every one."""
        lid = msg.get("load_id")
        st = dict(msg)
        st.setdefault("time", time.time())
        now = time.monotonic()
        if lid != self.load_id:
            if self._following(now):
                self.others[lid] = (now, st)
                return
            self.others.pop(lid, None)
            self.history.clear()
            self.load_id = lid
        self._heard = now
        self.latest = st
        self.history.append((float(st["time"]), int(st.get("backlog_batches") or 0),
                             int(st.get("backlog_bytes") or 0),
                             float(st.get("soundings_per_second") or 0.0),
                             int(st.get("soundings_written") or 0),
                             int(st.get("files_done") or 0)))
        self.updates += 1

    def valid_workers_downscaling(self, scheduler, workers):
        """Never offer a ``disk`` worker for retirement: it holds (or will hold) the writer."""
        return [ws for ws in workers if not (ws.resources or {}).get("disk")]

    # ------------------------------------------------------------- outputs
    def snapshot(self) -> dict:
        """The latest status for JSON: phase ``idle`` before any load."""
        st = dict(self.latest) if self.latest else {"phase": "idle"}
        st["updates"] = self.updates
        st["age_seconds"] = time.time() - st["time"] if "time" in st else None
        st["other_loads"] = self.other_loads()
        return st

    def other_loads(self) -> list[dict]:
        """The latest status of each other load running on this scheduler (not followed)."""
        now = time.monotonic()
        for lid, (heard, other) in list(self.others.items()):
            if other.get("phase") in _ENDED or now - heard >= STALE_SECONDS:
                del self.others[lid]
        return [other for _, other in self.others.values()]

    def metric_families(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.latest

        def num(key) -> float:
            v = st.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

        def gauge(name, doc, key):
            return GaugeMetricFamily(name, doc, value=num(key))

        yield gauge("pfm_writer_backlog_batches",
                    "Prepared pieces waiting in the writer's reorder buffer", "backlog_batches")
        yield gauge("pfm_writer_backlog_bytes",
                    "Bytes of prepared pieces waiting for the writer", "backlog_bytes")
        yield gauge("pfm_writer_peak_backlog_bytes",
                    "Largest backlog in bytes so far in this load", "peak_backlog_bytes")
        yield CounterMetricFamily("pfm_writer_soundings",
                                  "Soundings written to the PFM in this load",
                                  value=num("soundings_written"))
        yield CounterMetricFamily("pfm_writer_written_bytes",
                                  "Bytes of depth records written in this load",
                                  value=num("bytes_written"))
        yield gauge("pfm_writer_soundings_per_second",
                    "Soundings written per second (10 s window)", "soundings_per_second")
        yield gauge("pfm_writer_pieces_written",
                    "Pieces written or skipped, in input order (the watermark)", "watermark")
        yield gauge("pfm_writer_pieces_total", "Pieces in this load", "pieces_total")
        yield gauge("pfm_files_done", "Input files completely written", "files_done")
        yield gauge("pfm_files_total", "Input files in this load", "files_total")
        yield gauge("pfm_writer_elapsed_seconds", "Seconds since the writer started", "elapsed")
        yield gauge("pfm_writer_last_update_timestamp_seconds",
                    "Unix time of the writer's last status", "time")
        current = st.get("phase") or "idle"
        phase = GaugeMetricFamily("pfm_writer_phase",
                                  "1 for the writer's current phase, 0 for the others",
                                  labels=["phase"])
        for ph in PHASES + ((current,) if current not in PHASES else ()):
            phase.add_metric([ph], 1.0 if ph == current else 0.0)
        yield phase
        running = int(bool(st) and st.get("phase") not in _ENDED) + len(self.other_loads())
        yield GaugeMetricFamily("pfm_loads_running", "Loads whose writers report on this "
                                "scheduler now (the pfm_writer_* gauges follow one of them)",
                                value=float(running))


class _WriterCollector:
    """A Prometheus collector reading the plugin at scrape time (describe() [] skips name checks)."""

    def __init__(self, plugin: PfmWriterPlugin):
        self._plugin = weakref.ref(plugin)

    def describe(self):
        return []

    def collect(self):
        plugin = self._plugin()
        if plugin is not None:
            yield from plugin.metric_families()


class _WriterJsonHandler(web.RequestHandler):
    """``GET /pfm/writer.json``: the plugin's snapshot; 404 while no plugin is registered."""

    def initialize(self, scheduler):
        self.scheduler = scheduler

    def get(self):
        plugin = self.scheduler.plugins.get(PLUGIN_NAME)
        self.set_header("Content-Type", "application/json")
        if plugin is None:
            self.set_status(404)
            self.write(json.dumps({"error": "the pfm-writer plugin is not registered"}))
            return
        self.write(json.dumps(plugin.snapshot(), default=str))


# ------------------------------------------------------------ the dashboard on demand
class _DashboardOnDemand(web.RequestHandler):
    """Any dashboard page asked for before the dashboard is built: build it, then send the
    browser to the same address again (Dask's pages and ours answer it from then on)."""

    def initialize(self, build):
        self._build = build

    async def get(self, *_):
        if await self._build():
            self.redirect(self.request.uri)
        else:
            self.set_status(404)
            self.write("no dashboard on this scheduler: bokeh is not installed")


def serve_dashboard_on_demand(scheduler) -> bool:
    """Build ``scheduler``'s Bokeh dashboard at the first request for a page it does not serve
    yet. False (nothing done) if the scheduler has no HTTP server or a dashboard already.

    The waiting handler sits in the scheduler's HTTP application as the last resort of its
    routing (after ``/metrics``, ``/pfm/writer.json`` and Dask's other routes), and is removed
    once the dashboard is there. Requests that come while Bokeh is imported wait for the same
    build.
    """
    http = getattr(scheduler, "http_application", None)
    server = getattr(scheduler, "http_server", None)
    if http is None or server is None or not hasattr(http, "add_application"):
        return False
    if http.applications:  # Dask built the dashboard at the start (``dashboard=True``)
        return False
    built: list[asyncio.Future] = []

    async def build() -> bool:
        if not built:
            built.append(asyncio.ensure_future(_build_dashboard(scheduler, waiting)))
        return await asyncio.shield(built[0])

    waiting = web.Application([(r"/.*", _DashboardOnDemand, {"build": build})])
    http.add_application(waiting)
    return True


async def _build_dashboard(scheduler, waiting) -> bool:
    """Import Bokeh and the "PFM writer" page on a thread (the event loop serves on), then
    connect Dask's dashboard as a scheduler with ``dashboard=True`` does at its start."""
    http = scheduler.http_application
    try:
        await asyncio.get_running_loop().run_in_executor(None, importlib.import_module,
                                                         "pfm_dask.dashboard")
        from distributed.dashboard.scheduler import connect
    except ImportError as err:
        log.warning("no dashboard: %s", err)
        ok = False
    else:
        connect(http, scheduler.http_server, scheduler, prefix="/")  # Dask's default prefix
        ok = True
    if waiting in http.applications:
        http.applications.remove(waiting)
    return ok


def dask_setup(scheduler) -> None:
    """Preload hook of pfm-dask's own schedulers: the plugin is there from the start, and the
    dashboard is built at its first request."""
    scheduler.add_plugin(PfmWriterPlugin(), name=PLUGIN_NAME, idempotent=True)
    serve_dashboard_on_demand(scheduler)
