"""A scaling model: measured per-stage rates and the disk → predicted speedup for 4 to 64 workers.

The load is a pipeline: N workers decode, filter and bin pieces (one piece per file); one
writer packs them into the PFM in file order; then one process runs the serial final step.
Per load and setup, from the measured runs:

* ``c``: seconds per GSF byte of a piece's work on one core (decode + place/filter/bin + sort),
  ``x``: seconds per byte a task spends handing its piece to the writer, ``w``: the writer's
  busy seconds per byte;
* ``u``: CPU seconds per byte of the load phase of the 1-worker Dask run, all processes
  (Dask's own CPU too: event loops, hand-overs, page faults of fresh processes; the CPU
  bound uses it when it exceeds ``c + x + w``);
* ``P``: the pre-scan (one task per file), ``S``: the serial phase (area filter + recompute +
  check), ``K``: starting the cluster;
* the disk: raw read ``B_r`` and write ``B_w`` bandwidth; ``I`` GSF bytes in, ``O`` PFM bytes out.

``c``, ``w``, ``P`` and ``S`` come from the 1-worker Dask run (the rates inside Dask workers: the
main model), or from the ``--serial`` run (the *ideal* model: Dask's per-process costs removed;
Dask's extra pre-scan time is then kept apart as ``o``). For N workers and ``p`` pieces, with
``M`` cores on the machine (``None``: every worker and the writer have a core of their own, as
on a cluster with a separate disk node)::

    T(N) = K + o + P/N + T_load(N) + S
    T_load(N) = max( ceil(p/N) (c+x) I/p,          # the workers, in whole pieces
                     w I,                            # the one writer
                     max(c+x+w, u) I / min(N+1, M),  # all the CPU work on the cores there are
                     I/B_r, O/B_w )                  # the disk
                + (c+x) I/p                          # the first piece, before the writer starts

and the predicted speedup is the measured ``--serial`` time over ``T(N)``. ``docs/performance.md``
lists the assumptions. The measured runs read inputs from the page cache, so ``I/B_r`` is left
out of the check against them and kept in the predictions (cold inputs, as the seed's were).
"""

from __future__ import annotations

import math

__all__ = ["params_of", "predict", "fit_and_predict", "check_summary", "WORKERS", "plot"]

WORKERS = (1, 2, 4, 8, 16, 32, 64)


def params_of(cell: dict, gsf_bytes: int, files: int, disk: dict, source: str = "dask_1") -> dict:
    """The model's rates for one (load, setup) cell of the measured matrix.

    ``source="dask_1"`` takes the per-piece, writer, pre-scan and serial-phase times from the
    1-worker Dask run (the rates as they are inside Dask workers); ``"serial"`` takes them from
    the ``--serial`` run (what the workers would do without Dask's overheads), keeping Dask's
    extra pre-scan time apart as ``o``.
    """
    s = cell["modes"]["serial"]
    d1 = cell["modes"].get("dask_1", s)
    src = d1 if source == "dask_1" else s
    ph, ph1 = src["phases_s"], d1["phases_s"]
    dask = [m for k, m in cell["modes"].items() if k != "serial"]
    I = float(gsf_bytes)
    K = _median([m["phases_s"]["cluster_start"] for m in dask]) if dask else 0.0
    return {
        "source": source,
        "I": I, "O": float(s["output_bytes"]["ndx"] + s["output_bytes"]["bin"]),
        "pieces": max(files, 1),
        "c": (ph["decode_cpu"] + ph["place_filter_bin_cpu"] + ph["sort_cpu"]) / I,
        "x": ph1["transfer"] / I,
        "w": ph["write"] / I,
        "P": ph["prescan"],
        "S": ph["area_filter"] + ph["recompute"] + ph["check"],
        "K": K,
        "u": _load_cpu(d1, K) / I if source == "dask_1" and d1 is not s else None,
        "o": (max(0.0, ph1["prescan"] - s["phases_s"]["prescan"])
              if dask and source == "serial" else 0.0),
        "B_r": (disk.get("read_direct_mb_per_s") or disk.get("read_mb_per_s") or math.inf) * 1e6,
        "B_w": (disk.get("write_mb_per_s") or math.inf) * 1e6,
        "T_serial": s["wall_median_s"],
    }


def _load_cpu(run: dict, K: float) -> float:
    """CPU seconds of every process of a Dask run spent outside the serial parts (cluster
    start, pre-scan, final step), each of those counted as one busy core: the load phase's
    CPU, with Dask's own (event loops, hand-overs, fresh processes' page faults), which
    ``c``, ``x`` and ``w`` leave out. 0 when the run has no CPU figure."""
    cpu = run.get("cpu_s")
    if not isinstance(cpu, (int, float)):
        return 0.0
    ph = run["phases_s"]
    return max(0.0, cpu - K - ph["prescan"] - ph["area_filter"] - ph["recompute"] - ph["check"])


def _median(v):
    v = sorted(v)
    n = len(v)
    return 0.0 if n == 0 else (v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2]))


def predict(p: dict, n: int, *, machine_cores: int | None = None, cached_inputs: bool = False) -> dict:
    """Predicted time of a load on ``n`` workers, its parts, and the bound that decides it."""
    I, O, k = p["I"], p["O"], p["pieces"]
    per_piece = (p["c"] + p["x"]) * I / k
    cores = n + 1 if machine_cores is None else min(n + 1, machine_cores)
    bounds = {
        "workers": math.ceil(k / n) * per_piece,
        "writer": p["w"] * I,
        "cpu": max(p["c"] + p["x"] + p["w"], p.get("u") or 0.0) * I / cores,
        "disk_write": O / p["B_w"],
    }
    if not cached_inputs:
        bounds["disk_read"] = I / p["B_r"]
    limit = max(bounds, key=bounds.get)
    t_load = bounds[limit] + per_piece
    prescan = p["o"] + p["P"] / n
    total = p["K"] + prescan + t_load + p["S"]
    return {"workers": n, "total_s": total, "load_s": t_load, "prescan_s": prescan,
            "serial_phase_s": p["S"], "cluster_start_s": p["K"], "bound": limit,
            "bounds_s": bounds, "speedup": p["T_serial"] / total}


def _scaled(p: dict, factor: float) -> dict:
    """The same survey, ``factor`` times as many files of the same size (600-file extrapolation)."""
    q = dict(p)
    for key in ("I", "O", "P", "S", "T_serial"):
        q[key] = p[key] * factor
    q["pieces"] = max(1, round(p["pieces"] * factor))
    return q


def _cell_model(cell: dict, entry: dict, disk: dict, source: str, machine_cores: int,
                workers) -> dict:
    p = params_of(cell, entry["gsf_bytes"], entry["files"], disk, source)
    check = {}
    for key, nw in (("dask_1", 1), ("dask_2", 2)):
        if key not in cell["modes"]:
            continue
        pred = predict(p, nw, machine_cores=machine_cores, cached_inputs=True)
        meas = cell["modes"][key]["wall_median_s"]
        check[key] = {"measured_s": meas, "predicted_s": pred["total_s"],
                      "error": pred["total_s"] / meas - 1.0,
                      "measured_speedup": p["T_serial"] / meas,
                      "predicted_speedup": pred["speedup"], "bound": pred["bound"]}
    preds = {str(nw): predict(p, nw) for nw in workers}
    ceiling = predict(p, 10**6)
    return {"params": p, "check": check,
            "predict": {k: {"speedup": v["speedup"], "total_s": v["total_s"], "bound": v["bound"],
                            "bounds_s": v["bounds_s"]} for k, v in preds.items()},
            "ceiling_speedup": ceiling["speedup"], "ceiling_bound": ceiling["bound"]}


def fit_and_predict(loads: dict, disk: dict, *, machine_cores: int, workers=WORKERS) -> dict:
    """Per cell: the rates, the check against the measured 1 and 2 workers, and the predictions.

    The main model uses the rates measured inside Dask workers (``cells``); ``ideal`` uses the
    ``--serial`` rates, i.e. what the same pipeline would give without Dask's per-process costs.
    """
    cells, ideal = {}, {}
    for n_files, entry in loads.items():
        for setup, cell in entry["setups"].items():
            cells.setdefault(n_files, {})[setup] = _cell_model(cell, entry, disk, "dask_1",
                                                               machine_cores, workers)
            ideal.setdefault(n_files, {})[setup] = _cell_model(cell, entry, disk, "serial",
                                                               machine_cores, workers)
    out = {"workers": list(workers), "machine_cores_for_check": machine_cores, "cells": cells,
           "ideal": ideal}
    if cells:
        top = max(cells, key=int)
        factor = 600 / int(top)
        out["extrapolation_600_files"] = {
            "from_load": int(top),
            "setups": {s: {str(nw): predict(_scaled(c["params"], factor), nw)["speedup"]
                           for nw in workers} for s, c in cells[top].items()},
            "ideal": {s: {str(nw): predict(_scaled(c["params"], factor), nw)["speedup"]
                          for nw in workers} for s, c in ideal[top].items()}}
    return out


def check_summary(model_res: dict, tolerance: float = 0.10) -> dict:
    """How many measured 1- and 2-worker runs the model predicts within ``tolerance`` (of the
    predicted time), and those it misses: ``{"runs", "within", "outside": [(files, setup,
    workers, error)], "worst"}``."""
    rows = [(files, setup, int(key[-1]), ch["error"])
            for files, cells in model_res.get("cells", {}).items()
            for setup, c in cells.items() for key, ch in c["check"].items()]
    outside = sorted((r for r in rows if abs(r[3]) > tolerance), key=lambda r: -abs(r[3]))
    return {"runs": len(rows), "within": len(rows) - len(outside), "tolerance": tolerance,
            "outside": outside, "worst": max(rows, key=lambda r: abs(r[3])) if rows else None}


def plot(ax, model_res: dict, seed_best: dict, seed_600: dict, titles: dict) -> None:
    """Predicted speedup against workers for the largest load, the measured points, the seed."""
    cells, ideal = model_res["cells"], model_res.get("ideal", {})
    top = max(cells, key=int)
    colours = {"none": "C0", "swath": "C1", "area": "C2", "both": "C3"}
    for setup, c in cells[top].items():
        col = colours.get(setup, "k")
        ws = [int(k) for k in c["predict"]]
        ax.plot(ws, [c["predict"][str(w)]["speedup"] for w in ws], "-", color=col,
                label=f"model, {titles.get(setup, setup)}")
        ic = ideal.get(top, {}).get(setup)
        if ic:
            ax.plot(ws, [ic["predict"][str(w)]["speedup"] for w in ws], "--", color=col, lw=0.8)
        meas = [(1, c["check"].get("dask_1")), (2, c["check"].get("dask_2"))]
        ax.plot([w for w, m in meas if m], [m["measured_speedup"] for w, m in meas if m], "o",
                color=col)
        if setup in seed_best:
            ax.plot([16], [seed_best[setup]], "*", color=col, ms=12, mec="k", mew=0.5)
    ax.plot([seed_600["processors"]], [seed_600["speedup"]], "P", color="k", ms=10,
            label=f"Pfm_loader, 600 files ({seed_600['speedup']}x)")
    ax.plot([], [], "--", color="grey", lw=0.8, label="ideal model (serial rates)")
    ax.plot([], [], "*", color="grey", ms=12, mec="k", mew=0.5, label="Pfm_loader best (<=16 procs)")
    ax.plot([], [], "o", color="grey", label="pfm-dask measured")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(WORKERS), [str(w) for w in WORKERS])
    ax.set_xlabel("workers (processors)")
    ax.set_ylabel("speedup over serial")
    ax.set_title(f"Scaling model, {top}-file load")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
