"""The load's ceiling, measured: its prepared pieces replayed into the writer from memory.

A load is N workers preparing pieces (decode, place, filter, bin, sort), one writer packing
them into the PFM in input order, then the final step on the writer's node. With infinitely
fast workers what is left is the writer's time and the final step. This benchmark measures
exactly that, instead of modelling it (``benchmarks/model.py``):

1. the survey's pieces are planned as a load plans them and prepared once, one after the
   other, in this process; the prepared pieces stay in memory (timed: the serial loader's
   share of the work that workers divide);
2. for each setup and writer thread count, a fresh writer (crash-safety journal on, as in a
   load) gets every piece at once and writes them as fast as it takes them (*replay*; its
   *busy* time is its own time in ``add_sorted``), then runs the final step (area filter,
   recompute, check) on those threads;
3. the disk's raw sequential write is measured in the same run (``benchmarks/disk.py``).

The ceiling speedup of a setup is its ``--serial`` load time over replay + final step on the
disk node's threads: what a cluster with unlimited workers could reach with this writer and
this final step. The ``--serial`` time is measured for ``--serial-setups`` (default: the
setup without filters; ``all`` for every one) and, for the others, put together from the
same stages measured here (pre-scan + preparing every piece + replay and final step on one
thread, what ``--serial`` runs one after the other); where both exist the JSON gives both.

    python -m benchmarks.bench_ceiling                  # the 74-file 2 GB survey, 50 m bins
    python -m benchmarks.bench_ceiling --survey load48  # bench_load's 48-file 1.1 GB survey
    python -m benchmarks.bench_ceiling --survey real    # 8 lines of real EM302 ping records
    python -m benchmarks.bench_ceiling --quick          # a tiny survey, seconds (the tests)
    python -m benchmarks.bench_ceiling --files 12 --setups none --threads 2   # its first files

Results: ``results/bench_ceiling[_load48|_real|_quick].json``; ``python -m benchmarks.run --report``
puts them in ``RESULTS.md`` (:func:`markdown`).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from ._report import DATA_DIR, RESULTS_DIR, remove_pfm, write_results

__all__ = ["SURVEYS", "SETUPS", "record", "replay", "main", "markdown"]

WORK = Path(__file__).resolve().parent / "_work"
#: survey name -> (files, size): pings per file for ``datasets.survey``, GB for ``bench_load``'s
SURVEYS = {"pfmloader74": (74, 3249),   # datasets.pings_for(2.0): benchmarks.run --gb 2
           "load48": (48, 1.1),         # bench_load's default survey
           "real": (8, 100.0),          # bench_load's real-derived lines (MB each)
           "quick": (6, 40)}
#: setup -> (swath filter, area filter), as benchmarks.run names them
SETUPS = {"none": (False, False), "swath": (True, False), "area": (False, True),
          "both": (True, True)}
TITLES = {"none": "no filter", "swath": "swath filter", "area": "area filter",
          "both": "swath and area filters"}


def _survey(name: str, data_dir: Path) -> list[str]:
    from pfm_dask.inputs import expand_inputs

    files, size = SURVEYS[name]
    if name == "load48":
        from . import bench_load

        return [str(p) for p in expand_inputs([bench_load.survey(size, files)])]
    if name == "real":
        from . import real_gsf

        folder = real_gsf.survey(files, size, data_dir=data_dir)
        if folder is None:
            raise SystemExit(f"--survey real: {real_gsf.SAMPLE_NAME} not found in "
                             f"{real_gsf.samples_dir()} (set PFM_DASK_GSF_SAMPLES)")
        return [str(p) for p in expand_inputs([folder])]
    from . import datasets

    folder = datasets.survey(size, files=files, data_dir=data_dir)
    return [str(p) for p in datasets.load_files(folder, files)]


def _cfg(setup: str, bin_size: float):
    from pfm_dask.config import LoadConfig, SwathFilterConfig

    swath, area = SETUPS[setup]
    return LoadConfig(bin_size_m=bin_size, area_filter=area, swath=SwathFilterConfig(enabled=swath))


def record(files: list[str], cfg) -> dict:
    """Plan the load of ``files`` as ``--serial`` does and prepare every piece in this process.

    Returns the grid, the pieces, the prepared pieces (in memory) and the seconds: the
    pre-scan, and preparing the pieces (wall and this thread's CPU).
    """
    from pfm_dask import pipeline
    from pfm_dask.soundings import prepare_piece

    t0 = time.perf_counter()
    scans = [pipeline.prescan_file(f) for f in files]
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    t1, c1 = time.perf_counter(), time.thread_time()
    prepared = [prepare_piece(p, grid, cfg) for p in pieces]
    return {"grid": grid, "pieces": pieces, "prepared": prepared,
            "prescan_s": t1 - t0, "prepare_s": time.perf_counter() - t1,
            "prepare_cpu_s": time.thread_time() - c1,
            "soundings": sum(p.batch.num_rows for p in prepared),
            "piece_bytes": sum(p.nbytes for p in prepared)}


def _static(files: list[str], cfg, pieces) -> dict:
    """What a load's journal keeps (``load.json``), so that the writer journals as in a load."""
    from pfm_dask import journal as J

    return {"command": ["python", "-m", "benchmarks.bench_ceiling"], "resume_command": "",
            "given": list(files), "inputs": [J.input_record(f) for f in files],
            "cfg": J.config_to_dict(cfg), "append": False,
            "pieces": [asdict(p) for p in pieces], "input_problems": [], "created": time.time()}


def replay(rec: dict, files: list[str], cfg, out: Path, threads: int, keep: bool = False) -> dict:
    """Hand every recorded piece to a fresh writer at once, let it write, run the final step
    (the PFM at ``out`` is removed after, unless ``keep``)."""
    from pfm_dask.writer import PfmWriter

    from .disk import reported_kib

    remove_pfm(out)
    w = PfmWriter(out, rec["grid"], cfg, files, len(rec["pieces"]),
                  journal=_static(files, cfg, rec["pieces"]), threads=threads)
    k0, c0 = reported_kib(), os.times()
    t0 = time.perf_counter()
    try:
        w.start()
        for p in rec["prepared"]:
            w.put(p)
        w.wait_written()
        t1 = time.perf_counter()
        k1, c1 = reported_kib(), os.times()
        res = w.finish()
    except BaseException:
        w.abort()
        raise
    t2 = time.perf_counter()
    if not res["check"]["sound"]:
        raise SystemExit(f"the replayed PFM does not check: {res['check']['problems'][:3]}")
    tm = res["writer_timings"]
    data = Path(str(out) + ".data")
    pfm_bytes = sum((data / f"{out.name}.{k}").stat().st_size for k in ("ndx", "bin"))
    phases = {k: tm.get(k, 0.0) for k in ("area_filter", "recompute", "check")}
    r = {"threads": threads, "replay_s": t1 - t0, "final_s": t2 - t1,
         "ceiling_s": (t1 - t0) + (t2 - t1), "writer_busy_s": tm.get("write", 0.0),
         "writer_thread_cpu_s": tm.get("write_cpu", 0.0),
         "journal_s": res.get("journal", {}).get("seconds", 0.0),
         "final_phases_s": phases, "pfm_bytes": pfm_bytes,
         # tiles recomputed beside the writer during the replay (pfm/_tiles.py)
         "tiles_s": tm.get("tiles", 0.0), "tiles_cpu_s": tm.get("tiles_cpu", 0.0),
         "tiles_early": int(tm.get("tiles_early", 0)),
         "soundings_written": res["soundings_written"],
         # the process's CPU while writing, and the free memory the VM gave its host meanwhile
         # (its pages are slow to use again: docs/performance.md, "Fresh pages on this VM")
         "replay_user_s": c1.user - c0.user, "replay_system_s": c1.system - c0.system,
         "reported_mib_during_replay": None if k0 is None or k1 is None else (k1 - k0) / 1024}
    r["writer_busy_mb_per_s"] = pfm_bytes / 1e6 / r["writer_busy_s"] if r["writer_busy_s"] else None
    r["replay_mb_per_s"] = pfm_bytes / 1e6 / r["replay_s"] if r["replay_s"] else None
    if not keep:
        remove_pfm(out)
    return r


def _serial_load(files: list[str], cfg, out: Path) -> dict:
    """One ``--serial`` load (the speedup baseline), as ``bench_load.run_once`` times it."""
    from .bench_load import run_once

    r = run_once(files, "serial", 1, cfg, out.stem, work=out.parent)
    remove_pfm(out)
    return {"wall_s": r["wall_s"], "phases_s": r["phases_s"], "cpu_s": r["cpu_s"]["total"]}


def measure(files: list[str], setups, threads, serial_setups, bin_size: float, work: Path,
            say=print) -> dict:
    """Every setup's replays, grouped by piece set (the swath filter changes the pieces)."""
    out = work / "ceiling.pfm"
    cells: dict = {}
    for swath in (False, True):
        group = [s for s in setups if SETUPS[s][0] == swath]
        if not group:
            continue
        t = time.perf_counter()
        rec = record(files, _cfg(group[0], bin_size))
        say(f"recorded {len(rec['prepared'])} pieces ({rec['soundings']:,} soundings, "
            f"{rec['piece_bytes'] / 2**20:,.0f} MiB) with{'' if swath else 'out'} the swath "
            f"filter in {time.perf_counter() - t:.1f} s")
        for setup in group:
            cfg = _cfg(setup, bin_size)
            cell = {"prescan_s": rec["prescan_s"], "prepare_s": rec["prepare_s"],
                    "prepare_cpu_s": rec["prepare_cpu_s"], "pieces": len(rec["pieces"]),
                    "soundings": rec["soundings"], "piece_bytes": rec["piece_bytes"],
                    "replays": {}}
            for n in threads:
                r = replay(rec, files, cfg, out, n)
                cell["replays"][str(n)] = r
                say(f"  {setup}, {n} thread(s): replay {r['replay_s']:.2f} s (writer busy "
                    f"{r['writer_busy_s']:.2f} s, {r['writer_busy_mb_per_s'] or 0:,.0f} MB/s), "
                    f"final {r['final_s']:.2f} s "
                    + " ".join(f"{k} {v:.2f}" for k, v in r["final_phases_s"].items() if v))
            one = cell["replays"].get("1")
            if one:  # --serial's stages one after the other, as measured here
                cell["serial_from_stages_s"] = (rec["prescan_s"] + rec["prepare_s"]
                                                + one["replay_s"] + one["final_s"])
            cells[setup] = cell
        del rec
        gc.collect()
    for setup in setups:
        if setup in serial_setups:
            r = _serial_load(files, _cfg(setup, bin_size), work / "ceiling-serial.pfm")
            cells[setup]["serial_load"] = r
            say(f"  {setup}: --serial load {r['wall_s']:.2f} s")
    top = str(max(threads))
    for setup, cell in cells.items():
        measured = cell.get("serial_load", {}).get("wall_s")
        cell["serial_s"] = measured or cell.get("serial_from_stages_s")
        cell["serial_measured"] = measured is not None
        best = cell["replays"][top]
        cell["ceiling_threads"] = int(top)
        cell["ceiling_speedup"] = (cell["serial_s"] / best["ceiling_s"]
                                   if cell.get("serial_s") else None)
        cell["final_share_of_serial"] = (best["final_s"] / cell["serial_s"]
                                         if cell.get("serial_s") else None)
    return cells


def disk_bound(cell: dict, raw_mb_per_s: float) -> dict:
    """The ceiling this disk allows whatever the writer: writing the PFM's bytes at the raw
    sequential write measured in the same run takes ``disk_write_s``; with no final step at
    all the load can go at most ``disk_bound_speedup`` times faster than ``--serial``, and
    with this run's final step ``disk_bound_with_final_speedup``. A target above the first
    asks for a faster disk, not a faster writer."""
    best = cell["replays"][str(cell["ceiling_threads"])]
    write_s = best["pfm_bytes"] / 1e6 / raw_mb_per_s if raw_mb_per_s else None
    cell["disk_write_s"] = write_s
    ok = bool(write_s) and bool(cell.get("serial_s"))
    cell["disk_bound_speedup"] = cell["serial_s"] / write_s if ok else None
    cell["disk_bound_with_final_speedup"] = (cell["serial_s"] / (write_s + best["final_s"])
                                             if ok else None)
    return cell


def _model_ceiling(results_dir: Path, files: int) -> dict:
    """The scaling model's speedup with unlimited workers for the same load, if the runner's
    results (``pfmloader.json``) hold a load of this many files: modelled against measured."""
    try:
        doc = json.loads((results_dir / "pfmloader.json").read_text())
        cells = doc["results"]["model"]["cells"][str(files)]
    except (OSError, ValueError, KeyError):
        return {}
    return {s: {"speedup": c["ceiling_speedup"], "bound": c["ceiling_bound"]}
            for s, c in cells.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_ceiling",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--survey", choices=sorted(SURVEYS), default="pfmloader74")
    ap.add_argument("--setups", default=",".join(SETUPS))
    ap.add_argument("--threads", default="1,2", help="writer threads to replay with")
    ap.add_argument("--serial-setups", default="none",
                    help="setups whose --serial load is measured: a comma list, 'all', or '' "
                         "(the others: the sum of its stages)")
    ap.add_argument("--bin-size", type=float, default=50.0)
    ap.add_argument("--disk-mb", type=float, default=1024.0)
    ap.add_argument("--quick", action="store_true", help="a tiny survey (the test suite)")
    ap.add_argument("--files", type=int, default=0,
                    help="only the survey's first N files (a few minutes on a shared machine)")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR)
    ap.add_argument("--work", type=Path, default=WORK)
    a = ap.parse_args(argv)
    if a.quick:
        a.survey, a.disk_mb = "quick", 16.0
    setups = [s for s in a.setups.split(",") if s]
    threads = sorted({int(t) for t in a.threads.split(",")})
    serial_setups = setups if a.serial_setups == "all" else [
        s for s in a.serial_setups.split(",") if s in SETUPS]
    a.work.mkdir(parents=True, exist_ok=True)
    files = _survey(a.survey, a.data_dir)
    if a.files:
        files = files[:a.files]
    gsf_bytes = sum(os.path.getsize(f) for f in files)
    print(f"{a.survey}: {len(files)} files, {gsf_bytes / 1e9:.2f} GB, {a.bin_size:g} m bins")
    from . import disk

    from .bench_load import run_once

    t, load_at_start = time.perf_counter(), os.getloadavg()[0]
    run_once(files[:1], "serial", 1, _cfg("none", a.bin_size), "ceiling-warm", work=a.work)
    remove_pfm(a.work / "ceiling-warm.pfm")
    cells = measure(files, setups, threads, serial_setups, a.bin_size, a.work)
    bw = disk.sequential_bandwidth(a.work, int(a.disk_mb * 2**20), settled=not a.quick)
    raw = bw["write_mb_per_s"]
    settled = bw.get("write_settled_mb_per_s")
    for cell in cells.values():
        for r in cell["replays"].values():
            r["writer_busy_of_disk_write"] = (r["writer_busy_mb_per_s"] or 0) / raw
            r["replay_of_disk_write"] = (r["replay_mb_per_s"] or 0) / raw
            if settled:
                r["writer_busy_of_settled_write"] = (r["writer_busy_mb_per_s"] or 0) / settled
        disk_bound(cell, raw)
    results = {"survey": a.survey, "files": len(files), "gsf_bytes": gsf_bytes,
               "bin_size_m": a.bin_size, "threads": threads, "disk": bw, "setups": cells,
               "model_ceiling": _model_ceiling(a.results_dir, len(files)),
               "load_avg_1m_at_start": load_at_start, "load_avg_1m_at_end": os.getloadavg()[0],
               "minutes": (time.perf_counter() - t) / 60}
    name = "bench_ceiling" + ("_quick" if a.quick else "" if a.survey == "pfmloader74"
                              else f"_{a.survey}") + (f"_{a.files}files" if a.files else "")
    write_results(name, results, results_dir=a.results_dir, quiet=True)
    print(markdown(a.results_dir, names=(name,)))
    return results


# ------------------------------------------------------------------------------ RESULTS.md
def _section(name: str, doc: dict) -> str:
    r = doc["results"]
    top = str(max(r["threads"]))
    disk = r["disk"]["write_mb_per_s"]
    start = r.get("load_avg_1m_at_start")
    L = [f"### {r['files']} files, {r['gsf_bytes'] / 1e9:.2f} GB (`{name}.json`, "
         f"{doc['machine'].get('date_utc', '?')}, {r.get('minutes', 0):.0f} min; load average "
         + (f"{start:.1f} at the start, " if start is not None else "")
         + f"{r.get('load_avg_1m_at_end', 0):.1f} at the end on "
         f"{doc['machine'].get('logical_cores', '?')} cores{_memory_state(doc['machine'])})", "",
         *(["**The machine was shared** (load average above its core count): every stage ran "
            "slower than on an idle machine, each by its own factor, so these figures are not "
            "the idle machine's.", ""]
           if r.get("load_avg_1m_at_end", 0) > (doc["machine"].get("logical_cores") or 1)
           else []),
         f"Raw sequential write of the disk in the same run: **{disk:,.0f} MB/s**"
         + (_settled_note(r) if r["disk"].get("write_settled_mb_per_s") else "")
         + (f"; past the page cache (`O_DIRECT`) {r['disk']['write_direct_mb_per_s']:,.0f} MB/s"
            if r["disk"].get("write_direct_mb_per_s") else "")
         + ". Replay and "
         f"final step on {top} thread(s) (the Dask writer's); `--serial` measured where marked, "
         "else the sum of its stages measured here (pre-scan + preparing every piece + replay "
         "and final step on one thread).", ""]
    head = ["setup", "`--serial` s", "prepare pieces s", "replay s", "writer busy s",
            "writer busy MB/s", "of disk write", "final step s", "replay + final s",
            "ceiling speedup"]
    rows = []
    for s, c in r["setups"].items():
        b = c["replays"][top]
        rows.append([TITLES.get(s, s),
                     f"{c['serial_s']:.1f}" + ("" if c["serial_measured"] else " (stages)"),
                     f"{c['prepare_s']:.1f}", f"{b['replay_s']:.2f}", f"{b['writer_busy_s']:.2f}",
                     f"{b['writer_busy_mb_per_s'] or 0:,.0f}",
                     f"{100 * b['writer_busy_of_disk_write']:.1f} %", f"{b['final_s']:.2f}",
                     f"{b['ceiling_s']:.2f}", f"**{c['ceiling_speedup']:.1f}x**"])
    L += [_md_table(head, rows), ""]
    bound = [(s, c) for s, c in r["setups"].items() if c.get("disk_bound_speedup")]
    if bound:
        L += ["What the disk allows whatever the writer (the PFM's bytes written at the raw "
              "write above, `--serial` over that time): " + "; ".join(
                  f"{TITLES.get(s, s)} {c['disk_bound_speedup']:.1f}x with no final step, "
                  f"{c['disk_bound_with_final_speedup']:.1f}x with this run's "
                  f"({c['disk_write_s']:.2f} s for "
                  f"{c['replays'][top]['pfm_bytes'] / 1e9:.2f} GB)" for s, c in bound) + ".", ""]
    head = ["setup", "threads", "area filter s", "recompute s", "check s", "final step s",
            "of `--serial`", "writer busy s", "replay s"]
    rows = []
    for s, c in r["setups"].items():
        for n, b in c["replays"].items():
            ph = b["final_phases_s"]
            rows.append([TITLES.get(s, s), n, f"{ph['area_filter']:.2f}",
                         f"{ph['recompute']:.2f}", f"{ph['check']:.2f}", f"{b['final_s']:.2f}",
                         f"{100 * b['final_s'] / c['serial_s']:.1f} %" if c.get("serial_s") else "–",
                         f"{b['writer_busy_s']:.2f}", f"{b['replay_s']:.2f}"])
    L += ["The final step by phase and thread count (the replay's writer threads too):", "",
          _md_table(head, rows), ""]
    both = [(s, c) for s, c in r["setups"].items()
            if c.get("serial_load") and "1" in c["replays"]]
    if both:
        L += ["`--serial` measured against the sum of its stages: " + "; ".join(
            f"{TITLES.get(s, s)} {c['serial_load']['wall_s']:.1f} s against "
            f"{c['serial_from_stages_s']:.1f} s" for s, c in both) + ".", ""]
    mc = r.get("model_ceiling") or {}
    if mc:
        L += ["The scaling model's ceiling (unlimited workers) for this load in `pfmloader.json`: "
              + "; ".join(f"{TITLES.get(s, s)} {v['speedup']:.1f}x ({v['bound']})"
                          for s, v in mc.items()) + ".", ""]
    return "\n".join(L)


def _settled_note(r: dict) -> str:
    """The raw write into pages the VM's host took back, and the writer's share of it."""
    top = str(max(r["threads"]))
    fr = [c["replays"][top].get("writer_busy_of_settled_write") for c in r["setups"].values()]
    fr = [f for f in fr if f is not None]
    return (f" into pages freed a moment before, {r['disk']['write_settled_mb_per_s']:,.0f} MB/s "
            "into pages the VM's host had taken back (docs/performance.md, \"Fresh pages on this "
            "VM\")" + (f"; the writer's busy rate is {100 * min(fr):.0f}"
                       + (f"-{100 * max(fr):.0f}" if max(fr) - min(fr) >= 0.005 else "")
                       + " % of the latter" if fr else ""))


def _memory_state(machine: dict) -> str:
    """The memory free and in the page cache when the run ended, if recorded: the same replay
    once ran twice as long with the page cache full of earlier outputs."""
    free, cached = machine.get("memory_free_bytes"), machine.get("page_cache_bytes")
    if free is None or cached is None:
        return ""
    return f"; {free / 1e9:.1f} GB free and {cached / 1e9:.1f} GB of page cache at the end"


def _md_table(head, rows) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(str(x) for x in row) + " |" for row in rows])


def markdown(results_dir: Path, names=None) -> str:
    """The ceiling section of ``RESULTS.md`` from whichever of ``names`` have results (default:
    every ``bench_ceiling*.json`` but the test suite's quick one, the whole survey first)."""
    if names is None:
        found = sorted(p.stem for p in Path(results_dir).glob("bench_ceiling*.json"))
        names = [n for n in found if not n.endswith("_quick")]
    parts = []
    for name in names:
        try:
            doc = json.loads((Path(results_dir) / f"{name}.json").read_text())
        except (OSError, ValueError):
            continue
        parts.append(_section(name, doc))
    if not parts:
        return ""
    return "\n".join(["## The ceiling: the pieces replayed into the writer "
                      "(`benchmarks/bench_ceiling.py`)", "",
                      "Every piece of the load prepared once and kept in memory, then handed to "
                      "a fresh writer at once: the load with infinitely fast workers. Ceiling "
                      "speedup = `--serial` load time / (replay + final step).", "", *parts])


if __name__ == "__main__":
    main()
