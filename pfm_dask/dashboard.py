"""The writer's progress on the Dask dashboard: the "PFM writer" page (a Bokeh app), and the
preload that shows it on a scheduler started by hand.

Its data come from the scheduler plugin of :mod:`pfm_dask.dashboard_plugin` (also re-exported
here), which serves ``/metrics`` and ``/pfm/writer.json`` too (docs/cluster.md, Watching a load):

* ``/pfm-writer``: a Bokeh page, "PFM writer", with the backlog (batches and bytes) and the
  writing rate over time, files done and total, and the phase;
* ``/individual-pfm-writer``: the same plots without the dashboard's frame.

Dask builds its Bokeh apps from an internal dict, which importing this module extends. A
scheduler started by hand shows the page with this module as a **preload**
(``dask scheduler --preload pfm_dask.dashboard``), which Dask imports before it builds the
dashboard; pfm-dask's own schedulers import it when the dashboard is first asked for
(:func:`pfm_dask.dashboard_plugin.serve_dashboard_on_demand`). Importing it imports Bokeh.
"""

from __future__ import annotations

from typing import Any

from .dashboard_plugin import (HISTORY, INDIVIDUAL_PAGE, JSON_ROUTE, PAGE, PHASES, PLUGIN_NAME,
                               STALE_SECONDS, TOPIC, PfmWriterPlugin)

__all__ = ["PfmWriterPlugin", "TOPIC", "PLUGIN_NAME", "PAGE", "INDIVIDUAL_PAGE", "JSON_ROUTE",
           "PHASES", "HISTORY", "STALE_SECONDS", "install_pages", "dask_setup"]


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
