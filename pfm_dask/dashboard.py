"""The writer's progress where a cluster operator looks: Prometheus gauges, JSON, a dashboard page.

The writer actor publishes its status every half second with
``worker.log_event("pfm-writer", status)``. The scheduler hands each event to
:class:`PfmWriterPlugin`, which keeps the latest status and a history, and
serves them three ways from the scheduler's dashboard port (docs/cluster.md, Watching a load):

* ``/metrics``: gauges such as ``pfm_writer_backlog_bytes``,
  ``pfm_writer_backlog_batches``, ``pfm_writer_soundings_total``,
  ``pfm_files_done`` (a custom collector on the global Prometheus registry,
  registered in ``start`` and removed in ``close``, so a second scheduler in
  the same process does not clash);
* ``/pfm/writer.json``: the latest status as JSON;
* ``/pfm-writer``: a Bokeh page, "PFM writer", with the backlog (batches and
  bytes) and the writing rate over time, files done and total, and the phase.

The page needs this module as a scheduler **preload**
(``dask scheduler --preload pfm_dask.dashboard``; pfm-dask's own clusters pass
it): Dask builds its Bokeh apps when the scheduler starts, from an internal
dict that the import of this module extends. The gauges and the JSON route
work on any scheduler, because ``pfm-dask load`` registers the plugin itself.

The plugin also keeps workers holding the ``disk`` resource out of adaptive
downscaling, so the writer's worker is never retired under a load.
"""

from __future__ import annotations

import json
import logging
import time
import weakref
from collections import deque
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

__all__ = ["PfmWriterPlugin", "TOPIC", "PLUGIN_NAME", "PAGE", "JSON_ROUTE", "PHASES",
           "install_pages", "dask_setup"]

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


# ------------------------------------------------------------------ page
class _WriterPage:
    """Bokeh models of the "PFM writer" page, refreshed from the plugin twice a second."""

    def __init__(self, scheduler, sizing_mode: str = "stretch_width"):
        from bokeh.layouts import column
        from bokeh.models import ColumnDataSource, Div
        from bokeh.plotting import figure

        self.scheduler = scheduler
        self.source = ColumnDataSource({"time": [], "backlog_batches": [], "backlog_mib": [],
                                        "rate": []})
        self.seen = 0
        self.load_id: Any = object()
        self.text = Div(text="", sizing_mode="stretch_width")
        common = {"x_axis_type": "datetime", "height": 200, "sizing_mode": sizing_mode,
                  "tools": "pan,wheel_zoom,box_zoom,reset", "toolbar_location": "above"}
        f_bytes = figure(title="Writer backlog (MiB)", **common)
        f_bytes.line("time", "backlog_mib", source=self.source, line_width=2)
        f_batches = figure(title="Writer backlog (batches)", x_range=f_bytes.x_range, **common)
        f_batches.step("time", "backlog_batches", source=self.source, line_width=2,
                       mode="after")
        f_rate = figure(title="Soundings written per second", x_range=f_bytes.x_range, **common)
        f_rate.line("time", "rate", source=self.source, line_width=2)
        for f in (f_bytes, f_batches, f_rate):
            f.y_range.start = 0
        self.root = column(self.text, f_bytes, f_batches, f_rate, sizing_mode=sizing_mode)

    def update(self) -> None:
        plugin = self.scheduler.plugins.get(PLUGIN_NAME)
        if plugin is None:
            self.text.text = ("<h3>PFM writer</h3><p>No pfm-dask load has run on this "
                              "scheduler yet (plugin not registered).</p>")
            return
        if plugin.load_id != self.load_id or plugin.updates < self.seen:
            self.source.data = {"time": [], "backlog_batches": [], "backlog_mib": [], "rate": []}
            self.load_id = plugin.load_id
            self.seen = plugin.updates - len(plugin.history)
        new = min(plugin.updates - self.seen, len(plugin.history))
        if new > 0:
            rows = list(plugin.history)[-new:]
            self.source.stream({"time": [r[0] * 1000.0 for r in rows],
                                "backlog_batches": [r[1] for r in rows],
                                "backlog_mib": [r[2] / 2**20 for r in rows],
                                "rate": [r[3] for r in rows]}, rollover=plugin.maxlen)
            self.seen = plugin.updates
        self.text.text = _summary_html(plugin.snapshot())


def _summary_html(st: dict) -> str:
    from html import escape

    if st.get("phase", "idle") == "idle" and "files_total" not in st:
        return "<h3>PFM writer</h3><p>Idle: no load has reported yet.</p>"
    mib = (st.get("backlog_bytes") or 0) / 2**20
    peak = (st.get("peak_backlog_bytes") or 0) / 2**20
    rows = [("phase", st.get("phase")),
            ("output", st.get("pfm", "")),
            ("files", f"{st.get('files_done', 0)} done of {st.get('files_total', 0)}"),
            ("pieces", f"{st.get('watermark', 0)} written of {st.get('pieces_total', 0)}"),
            ("soundings written", f"{st.get('soundings_written', 0):,} "
                                  f"({st.get('soundings_per_second', 0.0):,.0f}/s)"),
            ("backlog", f"{st.get('backlog_batches', 0)} batches, {mib:,.1f} MiB "
                        f"(peak {peak:,.1f} MiB)"),
            ("elapsed", f"{st.get('elapsed', 0.0):,.0f} s"),
            ("last status", f"{st.get('age_seconds') or 0.0:,.1f} s ago")]
    if st.get("error"):
        rows.append(("error", st["error"]))
    for other in st.get("other_loads") or []:
        rows.append(("also loading", f"{other.get('pfm', '')} ({other.get('phase')}, "
                                     f"{other.get('watermark', 0)} of "
                                     f"{other.get('pieces_total', 0)} pieces)"))
    body = "".join(f"<tr><th style='text-align:left;padding-right:1em'>{escape(k)}</th>"
                   f"<td>{escape(str(v))}</td></tr>" for k, v in rows)
    return f"<h3>PFM writer</h3><table>{body}</table>"


def writer_doc(scheduler, extra, doc) -> None:
    """The "PFM writer" dashboard page (a Bokeh app function, as Dask's own pages)."""
    from distributed.dashboard.components import add_periodic_callback

    page = _WriterPage(scheduler)
    page.update()
    add_periodic_callback(doc, page, 500)
    doc.title = "Dask: PFM writer"
    doc.add_root(page.root)
    try:  # Dask's page template and theme (internal; the page works without them)
        from distributed.dashboard.components.scheduler import BOKEH_THEME, env

        doc.template = env.get_template("simple.html")
        doc.template_variables.update(extra)
        doc.theme = BOKEH_THEME
    except (ImportError, AttributeError):
        pass


def individual_writer_doc(scheduler, extra, doc) -> None:
    """The same plots without the dashboard's frame (Dask's "individual" plots, e.g. JupyterLab)."""
    from distributed.dashboard.components import add_periodic_callback

    page = _WriterPage(scheduler, sizing_mode="stretch_both")
    page.update()
    add_periodic_callback(doc, page, 500)
    doc.title = "Dask: PFM writer"
    doc.add_root(page.root)


def install_pages() -> bool:
    """Add the page to Dask's dashboard apps; schedulers started afterwards in this process show it.

    Uses ``distributed.dashboard.scheduler.applications``, an internal dict
    (docs/cluster.md, Watching a load): checked against distributed 2026.8 by the tests.
    """
    try:
        from distributed.dashboard import scheduler as dash
    except ImportError:  # no bokeh: no dashboard at all
        return False
    dash.applications.setdefault(PAGE, writer_doc)
    dash.applications.setdefault(INDIVIDUAL_PAGE, individual_writer_doc)
    return True


def dask_setup(scheduler) -> None:
    """Preload hook (``--preload pfm_dask.dashboard``): the plugin is there from the start."""
    scheduler.add_plugin(PfmWriterPlugin(), name=PLUGIN_NAME, idempotent=True)


# A preload is imported before the scheduler builds its dashboard, and only the
# import comes early enough: so the page is added here, at import time.
install_pages()
