"""``benchmarks/RESULTS.md`` and its plots from the runner's results document (``pfmloader.json``).

Kept apart from the measuring code so that ``python -m benchmarks.run --report`` can redraw
everything from the saved JSON without running a load.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

__all__ = ["write"]

MODE_LABEL = {"serial": "--serial", "dask_1": "Dask, 1 worker", "dask_2": "Dask, 2 workers"}
COLOURS = {"none": "C0", "swath": "C1", "area": "C2", "both": "C3"}


def _figure(path: Path, draw, nrows=1, ncols=1, size=(7, 4.5)) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(nrows, ncols, figsize=size, squeeze=False)
    try:
        draw(axes)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path.name


def _gb(b) -> str:
    return f"{b / 1e9:.2f}"


def _mib(b) -> str:
    return f"{b / 2**20:,.0f}"


def _pct(x) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def _x(x) -> str:
    return "–" if x is None else f"{x:.2f}x"


def _rate(sec_per_byte) -> str:
    """MB/s from seconds per byte (``inf`` when the stage took no measurable time)."""
    return "inf" if not sec_per_byte else f"{1e-6 / sec_per_byte:,.1f}"


def _code_line(code: dict) -> str:
    if not code.get("commit"):
        return "?"
    line = f"commit {code['commit'][:12]}"
    if code.get("snapshot"):
        return line + " (a frozen copy: every run on the same code)"
    changed = code.get("pfm_dask_changed") or []
    return line + (f", working tree with {len(changed)} changed file(s) in pfm_dask/"
                   if changed else "")


def _codes_line(code: dict, loads: dict) -> str:
    """The code the run measured, or, when loads were added later at other commits (``--resume``),
    each commit with the loads it measured (the disk and memory parts ran with the first run)."""
    by_commit: dict = {}
    for k in sorted(loads, key=int):
        for c in loads[k]["setups"].values():
            commit = (c.get("code") or code or {}).get("commit")
            if commit:
                by_commit.setdefault(commit, [])
                if k not in by_commit[commit]:
                    by_commit[commit].append(k)
    if len(by_commit) <= 1:
        return _code_line(code)
    first = code.get("commit")
    parts = []
    for commit, ks in by_commit.items():
        extra = "; disk, memory" if commit == first else ""
        parts.append(f"{commit[:7]} ({', '.join(ks)} files{extra})")
    return "commits " + ", ".join(parts) + "; each a frozen copy, every run of a load on one code"


def _table(head: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


# -------------------------------------------------------------------------------------- plots
def _plots(res: dict, out: Path, name: str, titles: dict, seed: dict) -> dict:
    from . import model as model_mod

    pngs = {}
    loads = res.get("loads", {})
    keys = sorted(loads, key=int)
    setups = [s for s in titles if any(s in loads[k]["setups"] for k in keys)]
    top = keys[-1] if keys else None

    if keys:
        def speedup(axes):
            for ax, setup in zip(axes.flat, list(titles)):
                ks = [k for k in keys if setup in loads[k]["setups"]]
                files = [int(k) for k in ks]
                for key, style in (("dask_1", "s--"), ("dask_2", "o-")):
                    ax.plot(files, [loads[k]["setups"][setup]["speedup"][key] for k in ks], style,
                            color=COLOURS[setup], label=f"pfm-dask, {MODE_LABEL[key]}")
                best = seed["best_speedup"].get(setup)
                if best:
                    ax.axhline(best, color="k", ls=":", lw=1,
                               label=f"Pfm_loader best ({best}x, <=16 procs)")
                ax.axhline(1.0, color="grey", lw=0.6)
                ax.set_title(titles[setup])
                ax.set_xlabel("GSF files in the load")
                ax.set_ylabel("speedup over serial")
                ax.set_xticks(files)
                ax.set_ylim(0, max(11, (best or 0) + 1))
                ax.grid(alpha=0.3)
                ax.legend(fontsize=7)
        pngs["speedup"] = _figure(out / f"{name}_speedup.png", speedup, 2, 2, (10, 7.5))

        def phases(axes):
            ax = axes[0, 0]
            bars, labels = [], []
            for setup in setups:
                for key in ("serial", "dask_1", "dask_2"):
                    m = loads[top]["setups"][setup]["modes"].get(key)
                    if m:
                        bars.append(m["phases_s"])
                        labels.append(f"{setup}\n{key.replace('dask_', '')}{'w' if key != 'serial' else ''}")
            parts = [("cluster_start", "cluster start"), ("prescan", "pre-scan"),
                     ("load_wall", "load (decode, bin, write)"), ("area_filter", "area filter"),
                     ("recompute", "recompute"), ("check", "check")]
            bottom = [0.0] * len(bars)
            for k, lab in parts:
                vals = [b.get(k, 0.0) for b in bars]
                ax.bar(range(len(bars)), vals, bottom=bottom, label=lab)
                bottom = [x + v for x, v in zip(bottom, vals)]
            ax.set_xticks(range(len(bars)), labels, fontsize=7)
            ax.set_ylabel("seconds (median run)")
            ax.set_title(f"Where the time goes, {top}-file load ({_gb(loads[top]['gsf_bytes'])} GB)")
            ax.legend(fontsize=7)
        pngs["phases"] = _figure(out / f"{name}_phases.png", phases, size=(9, 4.5))

        def share(axes):
            ax = axes[0, 0]
            for setup in setups:
                ks = [k for k in keys if setup in loads[k]["setups"]]
                for key, style in (("serial", "s--"), ("dask_2", "o-")):
                    ax.plot([int(k) for k in ks],
                            [100 * loads[k]["setups"][setup]["serial_share"][key]
                             ["area_filter_and_recompute"] for k in ks], style,
                            color=COLOURS[setup], label=f"{titles[setup]}, {MODE_LABEL[key]}")
            ax.set_xlabel("GSF files in the load")
            ax.set_ylabel("% of wall time in area filter + recompute")
            ax.set_title("The serial phase")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        pngs["serial_share"] = _figure(out / f"{name}_serial_share.png", share)

    wd = res.get("writer_vs_disk", {})
    disk = res.get("disk")
    if disk and top and top in wd:
        def diskplot(axes):
            ax = axes[0, 0]
            names = ["disk: raw write", "disk: raw read"]
            vals = [disk["write_mb_per_s"],
                    disk.get("read_direct_mb_per_s") or disk["read_mb_per_s"]]
            cols = ["k", "grey"]
            for setup in setups:
                for key in ("serial", "dask_2"):
                    r = wd[top].get(setup, {}).get(key)
                    if r and r.get("busy_mb_per_s"):
                        names.append(f"writer busy\n{setup} {key.replace('dask_', '')}"
                                     f"{'w' if key != 'serial' else ''}")
                        vals.append(r["busy_mb_per_s"])
                        cols.append(COLOURS[setup])
            ax.bar(range(len(vals)), vals, color=cols)
            ax.set_xticks(range(len(vals)), names, fontsize=6)
            ax.set_ylabel("MB/s")
            ax.set_title(f"The writer against the disk, {top}-file load")
        pngs["disk"] = _figure(out / f"{name}_disk.png", diskplot, size=(9, 4.5))

    mem = res.get("memory")
    if mem:
        def memplot(axes):
            ax = axes[0, 0]
            x = [r["input_ratio"] for r in mem["sizes"]]

            def line(get, style, label, col):
                ys = [get(r) for r in mem["sizes"]]
                if all(y is not None for y in ys):
                    ax.plot(x, [y / 2**20 for y in ys], style, color=col, label=label)
            line(lambda r: r["serial"]["peak_rss_bytes"], "s-", "--serial, peak", "C0")
            line(lambda r: r["serial"].get("load_phase_peak_bytes"), "s--",
                 "--serial, load phase", "C0")
            line(lambda r: r["dask"]["writer_peak_rss_bytes"], "o-", "writer's worker, peak", "C1")
            line(lambda r: r["dask"].get("writer_load_phase_peak_bytes"), "o--",
                 "writer's worker, load phase", "C1")
            line(lambda r: r["dask"]["compute_peak_rss_bytes"], "^-", "other worker, peak", "C2")
            ax.axhline(mem["max_backlog_bytes"] / 2**20, color="k", ls=":", lw=1,
                       label=f"--max-backlog {_mib(mem['max_backlog_bytes'])} MiB")
            ax.set_xlabel("input size (x the smallest)")
            ax.set_ylabel("RSS, MiB")
            ax.set_ylim(bottom=0)
            ax.set_title("Peak memory against input size (same grid)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        pngs["memory"] = _figure(out / f"{name}_memory.png", memplot)

    if res.get("model", {}).get("cells"):
        pngs["model"] = _figure(out / f"{name}_model.png",
                                lambda axes: model_mod.plot(axes[0, 0], res["model"],
                                                            seed["best_speedup"],
                                                            seed["run_600_files"], titles),
                                size=(8, 5))
    return pngs


# ----------------------------------------------------------------------------------- markdown
def write(doc: dict, md_path: Path, results_dir: Path, name: str) -> None:
    """Draw the plots into ``results_dir`` and write the markdown report to ``md_path``."""
    from .run import SETUP_TITLES

    res, mach = doc["results"], doc["machine"]
    results_dir.mkdir(parents=True, exist_ok=True)
    seed = res["seed"]
    pngs = _plots(res, results_dir, name, SETUP_TITLES, seed)
    rel = os.path.relpath(results_dir, md_path.parent)

    def img(key, alt):
        return f"![{alt}]({rel}/{pngs[key]})" if key in pngs else ""

    cfg = res.get("config", {})
    loads = res.get("loads", {})
    keys = sorted(loads, key=int)
    setups = [s for s in SETUP_TITLES if any(s in loads[k]["setups"] for k in keys)]
    top = keys[-1] if keys else None
    L = []
    L.append("# pfm-dask against NAVO's parallel Pfm_loader, and against the disk\n")
    L.append("Generated by `" + cfg.get("command", "python -m benchmarks.run") + "` "
             f"({mach.get('date_utc')}, {res.get('elapsed_s', 0) / 60:.0f} min of measuring in all); redraw with "
             "`python -m benchmarks.run --report`. Method and model: `docs/performance.md`. "
             "Raw figures: `" + f"{rel}/{name}.json" + "`.\n")
    said = set()
    for later in cfg.get("later_runs", []):   # each command once, however often it was run
        line = (f"Measured again afterwards ({later.get('redo') or 'missing parts'}): "
                f"`{later['command']}`.\n")
        if line not in said:
            said.add(line)
            L.append(line)

    summary = _summary(res, SETUP_TITLES)
    if summary:
        L.append("## Summary\n")
        L.append(summary + "\n")

    # machine
    L.append("## Machine\n")
    mem = mach.get("memory_bytes")
    d = res.get("disk", {})
    L.append(_table(["", ""], [
        ["cores (usable / logical)", f"{mach.get('usable_cores')} / {mach.get('logical_cores')}"],
        ["memory", f"{mem / 2**30:.1f} GiB" if mem else "?"],
        ["disk (output and inputs)", d.get("device", "?")],
        ["platform", mach.get("platform")],
        ["Python, numpy, pyarrow", f"{mach.get('python')}, {mach.get('numpy_version')}, "
                                   f"{mach.get('pyarrow_version')}"],
        ["dask / distributed", f"{mach.get('dask_version')} / {mach.get('distributed_version')}"],
        ["pfm-dask code", _codes_line(cfg.get("code", {}), loads)],
        ["load average at the end (1 min)", f"{mach.get('load_average_1m', 0):.1f}"],
    ]) + "\n")
    L.append("The machine was shared with other jobs while this ran, so wall times carry noise; "
             "each cell is the median of interleaved runs, and CPU seconds are in the JSON.\n")

    # inputs
    if keys:
        L.append("## Inputs\n")
        L.append(f"One synthetic EM302-like survey (`benchmarks/datasets.py`: `pfm-dask synth`, "
                 f"432 beams, {cfg.get('pings')} pings per file, deep water 800-2,500 m); the "
                 "N-file load is its first N lines. Bins of "
                 f"{cfg.get('bin_size_m'):g} m (2 m bins over deep-water EM302 data would make a "
                 "grid of tens of GB). Inputs are read from the page cache (the runs repeat).\n")
        L.append(_table(["files", "GSF GB", "soundings loaded", "PFM out GB"],
                        [[k, _gb(loads[k]["gsf_bytes"]),
                          f"{next(iter(loads[k]['setups'].values()))['modes']['serial']['soundings_loaded']:,}",
                          _gb(next(iter(loads[k]['setups'].values()))['modes']['serial']
                              ['output_bytes']['total'])] for k in keys]) + "\n")

    # speedup
    if keys:
        L.append("## Speedup over `--serial`, against the load\n")
        L.append(f"Median of {cfg.get('repeat')} runs each. Pfm_loader's best figures (up to 16 "
                 "processors) for comparison: " + ", ".join(
                     f"{SETUP_TITLES[s]} {v}x" for s, v in seed["best_speedup"].items()) + ".\n")
        head = ["files"] + [f"{s}: 1 w / 2 w" for s in setups] + ["code measured"]
        rows = []
        for k in keys:
            row = [k]
            for s in setups:
                c = loads[k]["setups"].get(s)
                row.append("–" if c is None else
                           f"{_x(c['speedup']['dask_1'])} / {_x(c['speedup']['dask_2'])}")
            commits = sorted({(c.get("code") or cfg.get("code") or {}).get("commit") or "?"
                              for c in loads[k]["setups"].values()})
            row.append(", ".join(x[:7] for x in commits))
            rows.append(row)
        L.append(_table(head, rows) + "\n")
        if len({r[-1] for r in rows}) > 1:
            L.append("Loads measured at different commits compare within a row (every cell "
                     "times its three modes interleaved on the same code), not across rows "
                     "as a trend of one code.\n")
        L.append(img("speedup", "speedup against load") + "\n")
        L.append("Median wall times, seconds (serial / 1 worker / 2 workers):\n")
        rows = []
        for k in keys:
            row = [k]
            for s in setups:
                c = loads[k]["setups"].get(s)
                row.append("–" if c is None else " / ".join(
                    f"{c['modes'][m]['wall_median_s']:.1f}" for m in ("serial", "dask_1", "dask_2")))
            rows.append(row)
        L.append(_table(["files"] + setups, rows) + "\n")

        # phases
        L.append(f"## Phase breakdown, {top}-file load\n")
        L.append("Wall seconds of the median run. `load` is decode, place/filter/bin, transfer and "
                 "write overlapping; the CPU columns sum the per-piece times over all tasks.\n")
        rows = []
        for s in setups:
            for m in ("serial", "dask_1", "dask_2"):
                r = loads[top]["setups"][s]["modes"][m]
                p = r["phases_s"]
                rows.append([s, MODE_LABEL[m], f"{r['wall_s']:.1f}", f"{p['cluster_start']:.1f}",
                             f"{p['prescan']:.1f}", f"{p['load_wall']:.1f}",
                             f"{p['area_filter']:.1f}", f"{p['recompute']:.1f}", f"{p['check']:.1f}",
                             f"{p['decode_cpu']:.1f}", f"{p['place_filter_bin_cpu']:.1f}",
                             f"{p['sort_cpu']:.1f}", f"{p['transfer']:.1f}", f"{p['write']:.1f}",
                             f"{r['cpu_s']:.0f}"])
        L.append(_table(["setup", "mode", "wall", "cluster", "pre-scan", "load", "area filter",
                         "recompute", "check", "decode", "place/filter/bin", "sort", "transfer",
                         "writer busy", "CPU s (all processes)"], rows) + "\n")
        L.append(img("phases", "phase breakdown") + "\n")

        # serial share
        L.append("## The serial phase\n")
        L.append("Share of the wall time spent in the area filter and the recompute (one process, "
                 "after all pieces are written); this is what capped Pfm_loader's speedup. The "
                 "check (pfm-dask's full validation of the output, also serial) is shown apart.\n")
        rows = []
        for k in keys:
            row = [k]
            for s in setups:
                c = loads[k]["setups"].get(s)
                if c is None:
                    row.append("–")
                    continue
                sh = c["serial_share"]
                row.append(f"{_pct(sh['serial']['area_filter_and_recompute'])} / "
                           f"{_pct(sh['dask_2']['area_filter_and_recompute'])} "
                           f"(check {_pct(sh['dask_2']['check'])})")
            rows.append(row)
        L.append(_table(["files"] + [f"{s}: serial / 2 w" for s in setups], rows) + "\n")
        L.append(img("serial_share", "serial phase share") + "\n")

    # disk
    wd = res.get("writer_vs_disk", {})
    if d:
        L.append("## The writer against the disk\n")
        L.append(f"Raw sequential bandwidth of the output disk ({d.get('device')}), "
                 f"{d['bytes'] / 2**20:,.0f} MiB, best of {d['runs']}: write (4 MiB writes + fsync) "
                 f"**{d['write_mb_per_s']:,.0f} MB/s**, read after dropping the cache "
                 f"**{d['read_mb_per_s']:,.0f} MB/s**"
                 + (f", O_DIRECT read **{d['read_direct_mb_per_s']:,.0f} MB/s**"
                    if "read_direct_mb_per_s" in d else "")
                 + (f", O_DIRECT write **{d['write_direct_mb_per_s']:,.0f} MB/s**"
                    if "write_direct_mb_per_s" in d else "") + ".\n")
        if top and top in wd:
            L.append("Writer throughput = PFM bytes written (`.ndx` + `.bin`) per second; *busy* "
                     "divides by the writer's own time in `add_sorted` (what it could sustain), "
                     "*achieved* by the load phase's wall time (what it delivered). The GSF read "
                     "rate is the input bytes over the load phase.\n")
            rows = []
            for s in setups:
                for m in ("serial", "dask_1", "dask_2"):
                    r = wd[top].get(s, {}).get(m)
                    if not r:
                        continue
                    rows.append([s, MODE_LABEL[m], _gb(r["output_bytes"]),
                                 f"{r['busy_mb_per_s']:.0f}" if r.get("busy_mb_per_s") else "–",
                                 _pct(r.get("busy_fraction_of_disk")),
                                 f"{r['achieved_mb_per_s']:.0f}" if r.get("achieved_mb_per_s") else "–",
                                 _pct(r.get("achieved_fraction_of_disk")),
                                 f"{r['gsf_read_mb_per_s']:.0f}" if r.get("gsf_read_mb_per_s") else "–",
                                 _pct(r.get("gsf_read_fraction_of_disk"))])
            L.append(_table(["setup", "mode", "PFM GB", "writer busy MB/s", "of disk write",
                             "achieved MB/s", "of disk write", "GSF read MB/s", "of disk read"],
                            rows) + "\n")
        L.append(img("disk", "writer against the disk") + "\n")

    # allocator
    ma = res.get("malloc")
    if ma and "loads" in ma:
        cell = loads.get(str(ma["files"]), {}).get("setups", {}).get(ma["setup"])
        t_serial = cell["modes"]["serial"]["wall_median_s"] if cell else None
        c = ma["piece_cost"]
        bw, bo = c["best"]["with_trim"], c["best"]["without_trim"]
        L.append("## Dask's allocator setting\n")
        L.append("Dask starts workers with `MALLOC_TRIM_THRESHOLD_=65536`, which turns off "
                 "glibc's adaptive mmap threshold: every large array is a fresh, zeroed mapping "
                 "(`docs/performance.md`; pfm-dask's embedded cluster starts its workers without "
                 f"it since commit f773409). Preparing the pieces of {c['files']} files "
                 f"({SETUP_TITLES[c['setup']]}) in a child process, best of "
                 f"{len(c['runs']['with_trim'])}: with the setting {bw['user_s']:.1f} s user + "
                 f"{bw['sys_s']:.1f} s system CPU and {bw['minor_faults']:,} minor page faults; "
                 f"without it {bo['user_s']:.1f} s + {bo['sys_s']:.1f} s and "
                 f"{bo['minor_faults']:,}: **{c['cpu_ratio']:.2f}x the CPU** and "
                 f"{c['fault_ratio']:.1f}x the page faults.\n")
        L.append(f"The Dask runs of the {ma['files']}-file load ({SETUP_TITLES[ma['setup']]}), "
                 "workers started with and without the variable, alternating; medians, CPU "
                 "seconds of all processes"
                 + (", speedup over the matrix's `--serial` median" if t_serial else "") + ":\n")
        rows = []
        for key in ("dask_1", "dask_2"):
            a_, b_ = ma["loads"]["with_trim"][key], ma["loads"]["without_trim"][key]
            rows.append([MODE_LABEL[key], f"{a_['wall_median_s']:.1f} s",
                         f"{b_['wall_median_s']:.1f} s",
                         f"{statistics.median(a_['cpu_all_s']):.0f} s",
                         f"{statistics.median(b_['cpu_all_s']):.0f} s",
                         _x(t_serial / a_["wall_median_s"]) if t_serial else "–",
                         _x(t_serial / b_["wall_median_s"]) if t_serial else "–"])
        L.append(_table(["mode", "wall, with", "wall, without", "CPU, with", "CPU, without",
                         "speedup, with", "speedup, without"], rows) + "\n")

    # memory
    m = res.get("memory")
    if m:
        L.append("## Memory against input size\n")
        L.append(f"`--max-backlog {_mib(m['max_backlog_bytes'])}MiB`, setup `{m['setup']}`, "
                 f"files of {m.get('pings_per_file', '?')} pings, the same grid for every size "
                 "(the MBR of the whole survey), so only the amount of input grows. `--serial`: "
                 "the whole process (a child process). Dask: each worker of a fresh "
                 f"{m['workers']}-worker cluster; the writer's worker also decodes pieces. Peak RSS "
                 "(`VmHWM`), and the peak of RSS samples (every 20 ms) while pieces stream to "
                 "the writer (*load*) and during the final step's recompute and check:\n")

        def mb(v):
            return _mib(v) if v else "–"
        rows = []
        for r in m["sizes"]:
            s_, d_ = r["serial"], r["dask"]
            rows.append([f"{r['input_ratio']:.1f}x", r["files"], _gb(r["gsf_bytes"]),
                         mb(s_.get("load_phase_peak_bytes")), mb(s_.get("recompute_peak_bytes")),
                         mb(s_.get("check_peak_bytes")), mb(s_["peak_rss_bytes"]),
                         mb(d_.get("writer_load_phase_peak_bytes")),
                         mb(d_.get("writer_recompute_peak_bytes")),
                         mb(d_.get("writer_check_peak_bytes")), mb(d_["writer_peak_rss_bytes"]),
                         mb(d_["compute_peak_rss_bytes"]), mb(d_["peak_backlog_bytes"])])
        L.append(_table(["input", "files", "GSF GB", "serial: load", "recompute", "check",
                         "peak", "writer worker: load", "recompute", "check", "peak",
                         "other worker peak", "peak backlog"], rows) + "\n")
        L.append("All in MiB. Growth from the smallest to the largest input "
                 f"({m['sizes'][-1]['input_ratio']:.1f}x): peak RSS serial "
                 f"{_x(m['serial_growth'])}, writer's worker {_x(m['writer_growth'])}; "
                 f"load phase only: serial {_x(m.get('serial_load_phase_growth'))}, writer's "
                 f"worker {_x(m.get('writer_load_phase_growth'))}.\n")
        L.append(img("memory", "memory against input size") + "\n")

    # model
    mod = res.get("model", {})
    if mod.get("cells"):
        L.append("## Scaling model\n")
        L.append("Per-stage rates measured above, plus the disk, predict the time on N workers "
                 "(`benchmarks/model.py`; assumptions in `docs/performance.md`). The model takes "
                 "the rates inside Dask workers from the 1-worker run; the *ideal* model takes "
                 "them from `--serial` (Dask's per-process costs removed). Check against the "
                 f"measured runs (this machine: {mod['machine_cores_for_check']} cores, inputs "
                 "cached), speedup measured / predicted (error of the predicted time, bound):\n")
        rows = []
        ideal = mod.get("ideal", {})
        for k in sorted(mod["cells"], key=int):
            for s in setups:
                c = mod["cells"][k].get(s)
                if not c:
                    continue
                ic = ideal.get(k, {}).get(s, {"check": {}})
                row = [k, s]
                for model_cell in (c, ic):
                    for w in ("dask_1", "dask_2"):
                        ch = model_cell["check"].get(w)
                        row.append("–" if not ch else
                                   f"{_x(ch['measured_speedup'])} / {_x(ch['predicted_speedup'])} "
                                   f"({ch['error'] * 100:+.0f} %, {ch['bound']})")
                rows.append(row)
        L.append(_table(["files", "setup", "model, 1 w", "model, 2 w", "ideal, 1 w", "ideal, 2 w"],
                        rows) + "\n")
        L.append(_model_check_line(mod))
        topm = max(mod["cells"], key=int)
        L.append(f"Predicted speedup, {topm}-file load (each worker a core of its own, the writer "
                 "on its own core, inputs read from the disk); model, then ideal:\n")
        ws = [str(w) for w in mod["workers"]]
        rows = []
        for label, table in (("model", mod["cells"]), ("ideal", ideal)):
            for s in setups:
                c = table.get(topm, {}).get(s)
                if c:
                    rows.append([f"{s} ({label})"] + [f"{c['predict'][w]['speedup']:.1f}" for w in ws]
                                + [f"{c['ceiling_speedup']:.1f} ({c['ceiling_bound']})"])
        L.append(_table(["setup"] + [f"{w} w" for w in ws] + ["ceiling (bound)"], rows) + "\n")
        rows = []
        for label, table in (("model", mod["cells"]), ("ideal", ideal)):
            for s in setups:
                c = table.get(topm, {}).get(s)
                if c:
                    p = c["params"]
                    rows.append([f"{s} ({label})", _rate(p["c"]), _rate(p["x"]), _rate(p["w"]),
                                 f"{p['P']:.1f}", f"{p['S']:.1f}", f"{p['K']:.1f}"])
        L.append("The rates behind it, in GSF MB per second (one core's piece work, the hand-over "
                 "to the writer, the writer), and seconds (pre-scan on one worker, serial phase, "
                 "cluster start):\n")
        L.append(_table(["setup", "decode+bin MB/s/core", "transfer MB/s", "writer MB/s",
                         "pre-scan s", "serial phase s", "cluster start s"], rows) + "\n")
        ext = mod.get("extrapolation_600_files")
        if ext:
            s600 = seed["run_600_files"]
            n16 = str(s600["processors"])
            L.append(f"Extrapolated to 600 files of the same size (from the {ext['from_load']}-file "
                     f"load, everything but the cluster start scaled by files), on {n16} workers: "
                     + ", ".join(f"{s} {v[n16]:.1f}x" for s, v in ext["setups"].items() if n16 in v)
                     + " (ideal: " + ", ".join(f"{s} {v[n16]:.1f}x" for s, v in
                                              ext.get("ideal", {}).items() if n16 in v)
                     + f"); Pfm_loader: {s600['speedup']}x on {n16} processors "
                     f"({s600['serial_h']:.0f} h to 2 h 39 min).\n")
        L.append(img("model", "scaling model") + "\n")

    L.append(_startup(results_dir))
    from .bench_ceiling import markdown as ceiling_markdown

    L.append(ceiling_markdown(results_dir))
    L.append(_others(results_dir))
    md_path.write_text("\n".join(x for x in L if x is not None))


def _model_check_line(mod: dict) -> str:
    """The model against the measured runs in one sentence: how many within 10 %."""
    from .model import check_summary

    cs = check_summary(mod)
    if not cs["runs"]:
        return ""
    miss = "; ".join(f"{f} files, {s}, {w} w: {e * 100:+.1f} %" for f, s, w, e in cs["outside"])
    return (f"The model predicts {cs['within']} of the {cs['runs']} measured 1- and 2-worker "
            f"runs within {cs['tolerance'] * 100:.0f} % of their time"
            + (f"; outside: {miss}." if miss else ".") + "\n")


def _summary(res: dict, titles: dict) -> str:
    """A few sentences with the headline figures, written from the numbers."""
    loads = res.get("loads", {})
    if not loads:
        return ""
    top = max(loads, key=int)
    e = loads[top]
    seed = res["seed"]["best_speedup"]
    out = []
    sp = [f"{titles[s]} {_x(c['speedup']['dask_2'])} ({_x(c['speedup']['dask_1'])} with 1)"
          for s, c in e["setups"].items()]
    out.append(f"- **Speedup, {top}-file load ({_gb(e['gsf_bytes'])} GB), 2 workers:** "
               + "; ".join(sp) + ". Pfm_loader's best: "
               + ", ".join(f"{titles[s]} {v}x" for s, v in seed.items()) + " (up to 16 processors).")
    wd = res.get("writer_vs_disk", {}).get(top, {})
    disk = res.get("disk", {})
    if wd and disk:
        fr = [(s, m, r) for s, ms in wd.items() for m, r in ms.items()
              if r.get("busy_fraction_of_disk") is not None]
        if fr:
            lo = min(fr, key=lambda t: t[2]["busy_fraction_of_disk"])
            hi = max(fr, key=lambda t: t[2]["busy_fraction_of_disk"])
            ach = max(r.get("achieved_fraction_of_disk") or 0 for _, _, r in fr)
            out.append(f"- **The writer against the disk:** raw sequential write "
                       f"{disk['write_mb_per_s']:,.0f} MB/s; the writer's busy throughput is "
                       f"{_pct(lo[2]['busy_fraction_of_disk'])} ({lo[0]}, {MODE_LABEL[lo[1]]}) to "
                       f"{_pct(hi[2]['busy_fraction_of_disk'])} ({hi[0]}, {MODE_LABEL[hi[1]]}) "
                       f"of it, and what it delivered over the load phase at most {_pct(ach)}."
                       + (" The disk is not what bounds pfm-dask here."
                          if hi[2]["busy_fraction_of_disk"] < 0.5 else ""))
    shares = [(s, c["serial_share"]["serial"]["area_filter_and_recompute"])
              for s, c in e["setups"].items()]
    out.append("- **The serial phase** (area filter + recompute) takes "
               + ", ".join(f"{_pct(v)} ({s})" for s, v in shares)
               + f" of the serial time at {top} files.")
    m = res.get("memory")
    if m:
        out.append(f"- **Memory** at `--max-backlog {_mib(m['max_backlog_bytes'])}MiB`, "
                   f"{m['sizes'][-1]['input_ratio']:.0f}x the input: the load phase's peak grows "
                   f"{_x(m.get('serial_load_phase_growth'))} (serial) and "
                   f"{_x(m.get('writer_load_phase_growth'))} (writer's worker); the whole run's "
                   f"peak grows {_x(m['serial_growth'])} and {_x(m['writer_growth'])}"
                   + (", set by the final step (recompute, check), which the backlog does not "
                      "bound." if (m["serial_growth"] or 0) > 1.2 * (m.get("serial_load_phase_growth")
                                                                     or 0) else "."))
    mod = res.get("model", {}).get("cells", {}).get(top)
    if mod:
        ceil = ", ".join(f"{s} {c['ceiling_speedup']:.1f}x ({c['ceiling_bound']})"
                         for s, c in mod.items())
        p16 = ", ".join(f"{s} {c['predict']['16']['speedup']:.1f}x" for s, c in mod.items()
                        if "16" in c["predict"])
        out.append(f"- **Model, {top} files:** 16 workers {p16}; ceiling with unlimited workers "
                   f"{ceil}.")
    ma = res.get("malloc")
    if ma and "piece_cost" in ma:
        w_ = ma.get("loads", {})
        extra = ""
        if "with_trim" in w_ and "without_trim" in w_:
            extra = (f"; the 2-worker load took {w_['with_trim']['dask_2']['wall_median_s']:.1f} s "
                     f"with it and {w_['without_trim']['dask_2']['wall_median_s']:.1f} s without")
        out.append(f"- **Dask's `MALLOC_TRIM_THRESHOLD_`** (which the embedded cluster no longer "
                   f"passes to workers) makes preparing a piece cost "
                   f"{_x(ma['piece_cost']['cpu_ratio'])} the CPU "
                   f"({ma['piece_cost']['fault_ratio']:.1f}x the page faults){extra}.")
    return "\n".join(out)


def _ceiling(r: dict) -> str:
    """bench_load's two-core ceilings: the CPU bound (cores over the cores `--serial` keeps
    busy), and two --serial processes on half the files each, if run."""
    out = ""
    if "cpu_bound_speedup" in r:
        out += (f"; at most {r['cpu_bound_speedup']:.2f}x on {r['cores']} cores without more CPU "
                f"than `--serial` (it keeps {r['serial_cores_busy']:.2f} busy)")
    if "speedup_two_serial_halves" in r:
        out += (f"; two --serial processes on half the files each: "
                f"{r['speedup_two_serial_halves']:.2f}x")
    return out


def _swath_line(r: dict) -> str:
    """bench_swath: both kernels' CPU per sounding, measured in the same run, and the flag check."""
    s = r["speed"]
    line = (f"swath filter: {s['compiled']['us_per_sounding_median']:.2f} µs of CPU per sounding "
            f"on one core, against {s['numpy']['us_per_sounding_median']:.2f} µs for the numpy "
            f"kernel it replaced ({s['speedup_median']:.1f}x, medians of {s['runs']}, "
            f"{s['soundings']:,} soundings)")
    f = r.get("flags")
    if f:
        line += (f"; flags identical on {f['surveys']} surveys ({f['soundings']:,} soundings)"
                 if f["identical"] else f"; flags differ on {f['soundings_differing']} soundings")
    return line


def _startup(results_dir: Path) -> str:
    """The start-up section from ``bench_startup.json``, if that benchmark has run."""
    import json

    try:
        doc = json.loads((results_dir / "bench_startup.json").read_text())
    except (OSError, ValueError):
        return ""
    r, mach = doc["results"], doc["machine"]
    trees = [t for t in ("baseline", "ours") if t in r]
    head = ["command"] + [f"{t}: best / median wall, CPU" for t in trees] + ["ours / floor"]
    rows = []
    for case, ours in r["ours"].items():
        cells = [f"`{case}`"]
        for t in trees:
            c = r[t].get(case)
            cells.append(f"{c['wall_best_s']:.2f} / {c['wall_median_s']:.2f} s, "
                         f"{c['cpu_best_s']:.2f} s" if c else "")
        cells.append(_x(ours["over_floor_x"]) if ours.get("over_floor_x") else "")
        rows.append(cells)
    imports = "; ".join(f"`{case}`: {', '.join(c['imported']) or 'none'}"
                        for case, c in r["ours"].items() if c.get("imported") is not None)
    L = ["## Start-up and small loads (`benchmarks/bench_startup.py`)", "",
         f"Each command a fresh process, {r['repeats']} measured runs after one warm-up, on "
         f"{mach.get('date_utc', '?')} (load average {mach.get('load_average_1m', 0):.1f} at the "
         f"start, {r.get('load_avg_1m_at_end', 0):.1f} at the end" +
         (": the machine was shared, so the best run is the figure and CPU time the steadier "
          "one" if max(mach.get('load_average_1m', 0), r.get('load_avg_1m_at_end', 0)) >= 1.5
          else ": an idle machine") + "). Input: the real "
         f"`{r['sample']}` ({r['sample_bytes'] / 1e6:.1f} MB)." +
         (" `baseline` is the package before this work, timed in the same run." if
          "baseline" in r else ""), "", _table(head, rows), "",
         f"Heavy packages each command imported (ours): {imports}.", ""]
    if "cluster_overhead_s" in r:
        be = r.get("break_even", {})
        parts = [f"{k}: {v['saving_s_per_mb']:.3f} s/MB saved, break-even "
                 f"{v['break_even_mb']:.0f} MB" for k, v in be.items() if v.get("break_even_mb")]
        L += [f"The embedded cluster's extra cost on this input (median `--workers 2` minus "
              f"median `--serial`): {r['cluster_overhead_s']:.2f} s. "
              + ("With the second worker's saving per MB from " + "; ".join(parts) + ". "
                 if parts else "")
              + f"The default load stays in-process under "
              f"{r['small_load_bytes']['plain'] / 2**20:.0f} MiB "
              f"({r['small_load_bytes']['swath'] / 2**20:.0f} MiB with the swath filter).", ""]
    return "\n".join(L)


def _shape_line(shape: str, what: str):
    """The RESULTS.md line of one of bench_load's shapes (its own results file)."""
    return lambda r: (f"bench_load --shape {shape}: {r['speedup_2_workers']:.2f}x with 2 workers "
                      f"({r['speedup_1_worker']:.2f}x with 1) on {r['files']} {what} of "
                      f"{r['gsf_bytes'] / r['files'] / 1e6:.0f} MB, no filter" + _ceiling(r))


def _cores_line(r: dict) -> str:
    """``benchmarks.cores``: what the cores give independent processes."""
    w = r["workloads"]
    return (f"{r['procs']} processes at once against one alone (median of {r['repeat']}): "
            + ", ".join(f"{k} {w[k]['speedup']:.2f}x" for k in w)
            + " (the cores, the memory bandwidth they share, fresh pages)")


def _groups_line(r: dict) -> str:
    """``bench_pfm_write --group-sweep``: what a larger group budget gives the writer."""
    b = r["budgets"]
    return (f"the writer replaying {r['files']} files' pieces on {r['threads']} threads, groups of "
            + ", ".join(f"{x['group_bytes'] / 2**20:g}" for x in b) + " MiB: writing "
            + " / ".join(f"{x['median']['write_s']:.2f}" for x in b) + " s ("
            + " / ".join(f"{x['write_speedup']:.2f}x" for x in b) + "; medians of "
            + f"{r['rounds']} interleaved rounds): memory bought back as writer time")


def _others(results_dir: Path) -> str:
    """One line for each earlier benchmark whose results are present."""
    import json

    lines = []
    for fname, fmt in (
        ("bench_gsf.json", lambda r: f"GSF reader: {r['ours']['mb_per_s_median']:.0f} MB/s on one "
                                     f"core, {r.get('speedup_median', 0):.1f}x gsfpy"),
        ("bench_gsf_real.json", lambda r: f"GSF reader on {r['input']['bytes'] / 1e6:.0f} MB of "
                                          f"real EM302 ping records (EX1811, repeated): "
                                          f"{r['speedup_best']:.1f}x gsfpy (best of "
                                          f"{r['runs']}; median {r['speedup_median']:.1f}x)"),
        ("bench_pfm_write.json", lambda r: f"PFM writer: {r['pfm']['mb_per_s']:.0f} MB/s, "
                                           f"{100 * r['ratio_pfm_to_sequential']:.0f} % of plain "
                                           "sequential writes"),
        ("bench_placement.json", lambda r: f"beam placement: {r['new_ns_per_sounding']:.1f} ns per "
                                           f"sounding on one core, {r['speedup']:.1f}x the two NGS "
                                           f"moves per beam ({r['reference_ns_per_sounding']:.0f} ns)"),
        ("bench_final_step.json", lambda r: f"final step on a sparse {r['grid']} grid "
                                            f"({r['bins'] / 1e6:.0f} M bins, "
                                            f"{r['soundings'] / 1e6:.1f} M soundings), "
                                            f"{r['threads']} threads: recompute "
                                            f"{r['recompute']['new_s']:.1f} s "
                                            f"({r['recompute']['speedup']:.1f}x the code before), "
                                            f"check {r['check']['new_s']:.1f} s "
                                            f"({r['check']['speedup']:.1f}x)"),
        ("bench_load.json", lambda r: f"bench_load: {r['speedup_2_workers']:.2f}x with 2 workers "
                                      f"on {r['gsf_bytes'] / 1e9:.2f} GB, no filter"
                                      + _ceiling(r)),
        ("bench_load_filters.json", lambda r: f"bench_load --filters: {r['speedup_2_workers']:.2f}x "
                                              f"with 2 workers on {r['gsf_bytes'] / 1e9:.2f} GB, "
                                              "swath and area filters" + _ceiling(r)),
        ("bench_load_few_large.json", _shape_line("few-large", "files")),
        ("bench_load_real.json", _shape_line("real", "real-derived EM302 lines")),
        ("bench_swath.json", _swath_line),
        ("cores.json", _cores_line),
        ("bench_pfm_write_groups_74f.json", _groups_line),
    ):
        p = results_dir / fname
        try:
            lines.append(f"- `{fname}`: " + fmt(json.loads(p.read_text())["results"]))
        except Exception:  # noqa: BLE001 - absent or older layout: just not listed
            continue
    if not lines:
        return ""
    return "## Other benchmarks (their own commands)\n\n" + "\n".join(lines) + "\n"
