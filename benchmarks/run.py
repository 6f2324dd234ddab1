"""The Pfm_loader experiments on pfm-dask: speedup over ``--serial`` for growing loads, four setups.

NAVO's parallel Pfm_loader reported its speedup over the serial loader for loads of 7, 12, 24,
48 and 74 GSF files with no filter, the swath filter, the area filter and both. This runner
measures the same matrix for pfm-dask (``--serial`` against Dask with 1 and 2 workers; each
cell the median of ``--repeat`` interleaved runs), and in the same run the disk (raw
sequential write/read bandwidth of the output disk, and the writer's throughput as a fraction
of it), the writer's peak memory for inputs of 1x, 4x and 10x at a fixed ``--max-backlog``,
the share of the serial final phase, and a scaling model for 4 to 64 workers checked against
the measured 1 and 2 workers. Then it writes ``benchmarks/RESULTS.md`` and its plots.

    python -m benchmarks.run                 # the full matrix (see --gb); RESULTS.md
    python -m benchmarks.run --report        # RESULTS.md and plots again from the JSON
    python -m benchmarks.run --quick         # tiny loads, one run each: keeps the code working

Inputs come from :mod:`benchmarks.datasets` (one cached survey; the N-file load is its first
N lines). Bins are 50 m: deep-water EM302 data in 2 m bins would make a grid of tens of GB.
Partial results are saved after every cell, so ``--resume`` continues an interrupted run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from . import alloc, datasets, disk, memory, model
from ._report import BENCH_DIR, RESULTS_DIR, machine_facts, remove_pfm, write_results

__all__ = ["SETUPS", "MODES", "SEED_BEST", "main", "write_markdown"]

NAME = "pfmloader"
#: setup name -> (swath filter, area filter)
SETUPS = {"none": (False, False), "swath": (True, False), "area": (False, True), "both": (True, True)}
SETUP_TITLES = {"none": "no filter", "swath": "swath filter", "area": "area filter",
                "both": "swath and area filters"}
#: result key -> (pipeline mode, workers)
MODES = {"serial": ("serial", 1), "dask_1": ("local", 1), "dask_2": ("local", 2)}
#: Pfm_loader's published best speedups (processor counts up to 16) and the 600-file run
SEED_BEST = {"none": 10.0, "swath": 8.0, "area": 6.5, "both": 7.0}
SEED_600 = {"files": 600, "processors": 16, "speedup": 12.6, "serial_h": 33.0,
            "parallel_h": 2 + 39 / 60}
#: default size of the 74-file load for the runner (the dataset builder's default is 2 GB);
#: chosen so that the whole matrix finishes in about an hour on the 2-core test machine
RUN_GB = 0.08
SNAPSHOT_ENV = "PFM_BENCH_SNAPSHOT"   # set in a run on a frozen copy: the commit
COMMAND_ENV = "PFM_BENCH_COMMAND"     # the command as the user typed it
PHASES = ("cluster_start", "prescan", "load_wall", "area_filter", "recompute", "check")


# ---------------------------------------------------------------------------------- one run
def _cpu_s() -> float:
    """CPU seconds of this process plus its reaped children (the Dask workers, once closed)."""
    s = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _output_bytes(work: Path, tag: str) -> dict:
    data = work / f"{tag}.pfm.data"
    sizes = {p.suffix.lstrip("."): p.stat().st_size for p in data.glob(f"{tag}.pfm.*")}
    return {"ndx": sizes.get("ndx", 0), "bin": sizes.get("bin", 0), "total": sum(sizes.values())}


def one_run(paths, key: str, cfg, work: Path) -> dict:
    """One load through ``bench_load.run_once``, plus CPU seconds and the output's size."""
    from .bench_load import run_once

    mode, workers = MODES[key]
    tag = f"{NAME}_{key}"
    c0 = _cpu_s()
    r = run_once(paths, mode, workers, cfg, tag, work=work)
    r["cpu_s"] = _cpu_s() - c0
    r["output_bytes"] = _output_bytes(work, tag)
    r["load_average_1m"] = os.getloadavg()[0]
    remove_pfm(work / f"{tag}.pfm")
    return r


def _median_run(runs: list[dict]) -> dict:
    """The run with the median wall time (the lower middle one for an even count), with all times."""
    ordered = sorted(runs, key=lambda r: r["wall_s"])
    med = dict(ordered[(len(ordered) - 1) // 2])
    med["wall_all_s"] = [r["wall_s"] for r in runs]
    med["wall_median_s"] = statistics.median(med["wall_all_s"])
    med["cpu_all_s"] = [r["cpu_s"] for r in runs]
    return med


# ---------------------------------------------------------------------------------- matrix
def _cfg(setup: str, bin_size: float, **kw):
    from pfm_dask.config import LoadConfig, SwathFilterConfig

    swath, area = SETUPS[setup]
    return LoadConfig(bin_size_m=bin_size, area_filter=area, swath=SwathFilterConfig(enabled=swath), **kw)


def measure_matrix(folder: Path, loads, setups, repeat: int, bin_size: float, work: Path,
                   partial: dict, save) -> dict:
    """Every (load, setup): ``repeat`` rounds of serial, 1 and 2 workers, interleaved."""
    out = partial.setdefault("loads", {})
    for n in loads:
        paths = datasets.load_files(folder, n)
        gsf_bytes = sum(p.stat().st_size for p in paths)
        entry = out.setdefault(str(n), {"files": n, "gsf_bytes": gsf_bytes, "setups": {}})
        for setup in setups:
            if setup in entry["setups"]:
                print(f"{n} files, {setup}: kept from the saved partial results", flush=True)
                continue
            cfg = _cfg(setup, bin_size)
            runs = {k: [] for k in MODES}
            for r in range(repeat):
                for key in MODES:  # interleaved, so drift in the machine's load hits every mode
                    one = one_run(paths, key, cfg, work)
                    runs[key].append(one)
                    print(f"{n:3d} files {setup:5s} run {r + 1}/{repeat} {key:6s}: "
                          f"{one['wall_s']:7.1f} s  cpu {one['cpu_s']:7.1f} s  "
                          f"load {one['load_average_1m']:.1f}", flush=True)
            cell = {"modes": {k: _median_run(v) for k, v in runs.items()}, "code": _code_version()}
            t_serial = cell["modes"]["serial"]["wall_median_s"]
            cell["speedup"] = {k: t_serial / cell["modes"][k]["wall_median_s"]
                               for k in MODES if k != "serial"}
            cell["serial_share"] = {k: _serial_share(m) for k, m in cell["modes"].items()}
            entry["setups"][setup] = cell
            save()
    return out


def _warm_up(folder: Path, bin_size: float, work: Path) -> None:
    """One untimed serial load of one file with both filters: imports and compiled kernels are
    then loaded in this process, as they are in every fresh Dask worker before its first task."""
    one_run(datasets.load_files(folder, 1), "serial", _cfg("both", bin_size), work)


def _serial_share(run: dict) -> dict:
    """Shares of the wall time in the area filter, the recompute, and the check."""
    ph, wall = run["phases_s"], run["wall_s"]
    return {"area_filter": ph["area_filter"] / wall, "recompute": ph["recompute"] / wall,
            "area_filter_and_recompute": (ph["area_filter"] + ph["recompute"]) / wall,
            "check": ph["check"] / wall}


def writer_vs_disk(loads: dict, disk_res: dict) -> dict:
    """The writer's throughput (output bytes / time) against the disk's raw write bandwidth."""
    out = {}
    for n, entry in loads.items():
        for setup, cell in entry["setups"].items():
            for key, run in cell["modes"].items():
                b = run["output_bytes"]["ndx"] + run["output_bytes"]["bin"]
                busy = run["phases_s"]["write"]
                load = run["phases_s"]["load_wall"]
                rec = {"output_bytes": b, "write_busy_s": busy, "load_wall_s": load,
                       "busy_mb_per_s": b / 1e6 / busy if busy else None,
                       "achieved_mb_per_s": b / 1e6 / load if load else None,
                       "gsf_read_mb_per_s": entry["gsf_bytes"] / 1e6 / load if load else None}
                w = disk_res.get("write_mb_per_s")
                if w:
                    rec["busy_fraction_of_disk"] = rec["busy_mb_per_s"] / w if busy else None
                    rec["achieved_fraction_of_disk"] = rec["achieved_mb_per_s"] / w if load else None
                r = disk_res.get("read_direct_mb_per_s") or disk_res.get("read_mb_per_s")
                if r and load:
                    rec["gsf_read_fraction_of_disk"] = rec["gsf_read_mb_per_s"] / r
                out.setdefault(n, {}).setdefault(setup, {})[key] = rec
    return out


def measure_malloc(folder: Path, n: int, setup: str, repeat: int, bin_size: float,
                   work: Path) -> dict:
    """Dask's ``MALLOC_TRIM_THRESHOLD_`` for workers against none (``benchmarks/alloc.py``):
    the CPU cost of preparing the same pieces, and the cell's Dask runs, interleaved."""
    paths = datasets.load_files(folder, n)
    cost = alloc.piece_cost(paths[:24], setup, bin_size)
    print(f"allocator: preparing {cost['files']} files' pieces costs {cost['cpu_ratio']:.2f}x the "
          f"CPU and {cost['fault_ratio']:.1f}x the page faults with MALLOC_TRIM_THRESHOLD_",
          flush=True)
    runs = alloc.interleaved_loads(paths, _cfg(setup, bin_size), repeat, work, one_run,
                                   _median_run)
    return {"files": n, "setup": setup, "piece_cost": cost, "loads": runs}


# ---------------------------------------------------------------------------------- memory
def measure_memory(folder: Path, sizes, bin_size: float, backlog: int, work: Path,
                   workers: int = 2) -> dict:
    """Peak RSS of ``--serial`` and of the Dask writer's worker, same grid, growing inputs."""
    base = _cfg("none", bin_size, max_backlog_bytes=backlog)
    cfg = memory.fixed_grid(base, folder / "survey.json")
    rows = []
    for n in sizes:
        paths = datasets.load_files(folder, n)
        gsf = sum(p.stat().st_size for p in paths)
        s = memory.peak_rss_serial(paths, cfg, work / f"{NAME}_mem_serial.pfm")
        d = memory.peak_rss_dask(paths, cfg, work / f"{NAME}_mem_dask.pfm", workers=workers)
        rows.append({"files": n, "gsf_bytes": gsf, "serial": s, "dask": d})
        print(f"memory {n:3d} files ({gsf / 1e9:.2f} GB): serial peak "
              f"{s['peak_rss_bytes'] / 2**20:,.0f} MiB, Dask writer worker peak "
              f"{d['writer_peak_rss_bytes'] / 2**20:,.0f} MiB", flush=True)
    first = rows[0]
    for r in rows:
        r["input_ratio"] = r["gsf_bytes"] / first["gsf_bytes"]
    last = rows[-1]

    def growth(get):
        try:
            return get(last) / get(first)
        except (TypeError, ZeroDivisionError):
            return None
    return {"max_backlog_bytes": backlog, "workers": workers, "setup": "none",
            "grid_mbr": list(cfg.mbr), "sizes": rows,
            "serial_growth": growth(lambda r: r["serial"]["peak_rss_bytes"]),
            "writer_growth": growth(lambda r: r["dask"]["writer_peak_rss_bytes"]),
            "serial_load_phase_growth": growth(lambda r: r["serial"]["load_phase_peak_bytes"]),
            "writer_load_phase_growth": growth(lambda r: r["dask"]["writer_load_phase_peak_bytes"])}


# ---------------------------------------------------------------------------------- main
def _parse(argv):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gb", type=float, default=RUN_GB,
                   help=f"size of the 74-file load in GB (default {RUN_GB}; the issue's size is 2)")
    g.add_argument("--pings", type=int, help="pings per file (overrides --gb)")
    ap.add_argument("--loads", default=",".join(map(str, datasets.LOADS)),
                    help="file counts, comma-separated (default the seed's 7,12,24,48,74)")
    ap.add_argument("--setups", default=",".join(SETUPS), help="none,swath,area,both")
    ap.add_argument("--repeat", type=int, default=3, help="runs per cell; the median is kept")
    ap.add_argument("--bin-size", type=float, default=50.0,
                    help="bin size in metres (default 50: 2 m bins over deep-water EM302 data "
                         "make a grid of tens of GB)")
    ap.add_argument("--max-backlog", default="64MiB", help="fixed backlog for the memory runs")
    ap.add_argument("--memory-files", default="7,28,70",
                    help="file counts of the 1x, 4x and 10x memory inputs")
    ap.add_argument("--memory-pings", type=int, default=600,
                    help="pings per file of the memory runs' survey (default 600, ~5 MB files: "
                         "pieces large enough for the backlog limit to bind)")
    ap.add_argument("--disk-mb", type=float, default=2048.0, help="size of the raw disk test")
    ap.add_argument("--no-malloc-trim", action="store_true",
                    help="start Dask workers without Dask's MALLOC_TRIM_THRESHOLD_=65536 "
                         "(an experiment: pfm-dask as shipped keeps Dask's default)")
    ap.add_argument("--skip", default="", help="parts to leave out: matrix,memory,disk,malloc")
    ap.add_argument("--resume", action="store_true",
                    help="keep what an interrupted run measured (or, with --redo, a finished one)")
    ap.add_argument("--redo", default="",
                    help="with --resume: parts of the saved results to measure again "
                         "(disk,memory,malloc)")
    ap.add_argument("--report", action="store_true",
                    help="measure nothing: RESULTS.md and plots from the saved JSON")
    ap.add_argument("--quick", action="store_true", help="tiny loads, one run each (CI)")
    ap.add_argument("--no-snapshot", action="store_true",
                    help="measure the working tree as it is, not a frozen copy of HEAD")
    ap.add_argument("--data-dir", type=Path, default=datasets.DATA_DIR)
    ap.add_argument("--work", type=Path, default=BENCH_DIR / "_work")
    ap.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    ap.add_argument("--markdown", type=Path, default=None,
                    help="where RESULTS.md goes (default benchmarks/RESULTS.md; with --quick, "
                         "RESULTS_quick.md in the results directory)")
    a = ap.parse_args(argv)
    if a.quick:
        a.pings, a.loads, a.setups, a.repeat = 12, "3", "both", 1
        a.skip = ",".join(filter(None, [a.skip, "malloc"]))
        a.memory_files, a.disk_mb, a.max_backlog, a.memory_pings = "2", 16.0, "4MiB", 12
    return a


def main(argv=None) -> dict:
    a = _parse(argv)
    from pfm_dask.config import parse_size

    name = NAME + ("_quick" if a.quick else "")
    json_path = a.results_dir / f"{name}.json"
    md_path = a.markdown or (a.results_dir / "RESULTS_quick.md" if a.quick
                             else BENCH_DIR / "RESULTS.md")
    if a.report:
        doc = json.loads(json_path.read_text())
        r = doc["results"]
        if "loads" in r:  # derived from the measured cells: refitted by the model's code now
            cores = r.get("model", {}).get("machine_cores_for_check") or os.cpu_count() or 1
            r["model"] = model.fit_and_predict(r["loads"], r.get("disk", {}), machine_cores=cores)
            json_path.write_text(json.dumps(doc, indent=2) + "\n")
        write_markdown(doc, md_path, a.results_dir, name)
        print(f"{md_path} rewritten from {json_path}")
        return doc["results"]
    code = _run_on_snapshot(a, argv, md_path)
    if code is not None:
        if code:
            sys.exit(code)
        return json.loads(json_path.read_text())["results"]

    loads = [int(x) for x in a.loads.split(",") if x]
    setups = [s for s in a.setups.split(",") if s]
    bad = [s for s in setups if s not in SETUPS]
    if bad:
        sys.exit(f"unknown setup(s) {bad}: choose from {list(SETUPS)}")
    skip = {s for s in a.skip.split(",") if s}
    mem_files = [int(x) for x in a.memory_files.split(",") if x]
    backlog = parse_size(a.max_backlog)
    files_needed = max(loads)
    pings = a.pings or datasets.pings_for(a.gb)
    a.work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    folder = datasets.survey(pings, files=files_needed if a.quick
                             else max(files_needed, datasets.LOADS[-1]), data_dir=a.data_dir)
    partial_path = a.work / f"{name}_partial.json"
    partial = {}
    if a.resume and partial_path.exists():
        partial = json.loads(partial_path.read_text())
    elif a.resume and json_path.exists():
        partial = json.loads(json_path.read_text())["results"]
        for derived in ("writer_vs_disk", "model", "seed"):
            partial.pop(derived, None)
    if partial and partial.get("config", {}).get("pings") != pings:
        sys.exit("the saved results were measured with other inputs; run without --resume")
    for part in filter(None, a.redo.split(",")):
        partial.pop(part, None)
    command = os.environ.get(COMMAND_ENV) or (
        "python -m benchmarks.run " + " ".join(argv if argv is not None else sys.argv[1:]))
    if "config" in partial:  # resumed: the first run's settings stand, this run is noted
        partial["config"].setdefault("later_runs", []).append(
            {"command": command.strip(), "redo": a.redo, "code": _code_version()})
    else:
        partial["config"] = _config(pings, loads, setups, a, backlog, mem_files, folder, command)
    partial["config"]["worker_malloc_trim_threshold"] = _malloc_setting(a.no_malloc_trim)

    def save():
        partial_path.write_text(json.dumps(partial, indent=1, default=str))

    if "disk" not in skip and "disk" not in partial:
        partial["disk"] = disk.sequential_bandwidth(a.work, int(a.disk_mb * 2**20),
                                                    settled=not a.quick)
        d = partial["disk"]
        print(f"disk: write {d['write_mb_per_s']:.0f} MB/s, read {d['read_mb_per_s']:.0f} MB/s"
              + (f", O_DIRECT read {d['read_direct_mb_per_s']:.0f} MB/s"
                 if "read_direct_mb_per_s" in d else "")
              + (f", O_DIRECT write {d['write_direct_mb_per_s']:.0f} MB/s"
                 if "write_direct_mb_per_s" in d else ""), flush=True)
        save()
    if "matrix" not in skip and not a.quick:
        _warm_up(folder, a.bin_size, a.work)
    if "matrix" not in skip:
        measure_matrix(folder, loads, setups, a.repeat, a.bin_size, a.work, partial, save)
    if ("malloc" not in skip and "malloc" not in partial and not a.no_malloc_trim
            and "both" in setups):
        partial["malloc"] = measure_malloc(folder, max(loads), "both", a.repeat, a.bin_size, a.work)
        save()
    if "memory" not in skip and "memory" not in partial:
        survey_files = files_needed if a.quick else datasets.LOADS[-1]
        mem_folder = datasets.survey(a.memory_pings, files=max(max(mem_files), survey_files),
                                     data_dir=a.data_dir)
        partial["memory"] = measure_memory(mem_folder, mem_files, a.bin_size, backlog, a.work)
        partial["memory"]["pings_per_file"] = a.memory_pings
        save()

    results = dict(partial)
    results["elapsed_s"] = time.perf_counter() - t_start + partial.get("elapsed_s", 0.0)
    if "loads" in results:
        results["writer_vs_disk"] = writer_vs_disk(results["loads"], results.get("disk", {}))
        results["model"] = model.fit_and_predict(results["loads"], results.get("disk", {}),
                                                 machine_cores=os.cpu_count() or 1)
    results["seed"] = {"best_speedup": SEED_BEST, "run_600_files": SEED_600,
                       "processors_up_to": 16}
    write_results(name, results, results_dir=a.results_dir, quiet=True)
    doc = {"benchmark": name, "machine": machine_facts(), "results": results}
    write_markdown(json.loads(json_path.read_text()), md_path, a.results_dir, name)
    _print_headline(results, md_path)
    partial_path.unlink(missing_ok=True)
    return doc["results"]


def _config(pings, loads, setups, a, backlog, mem_files, folder, command) -> dict:
    return {"pings": pings, "beams": datasets.BEAMS, "loads": loads, "setups": setups,
            "repeat": a.repeat, "bin_size_m": a.bin_size, "max_backlog_bytes_memory": backlog,
            "memory_files": mem_files, "survey": str(folder), "command": command.strip(),
            "inputs_in_page_cache": True, "code": _code_version()}


def _run_on_snapshot(a, argv, md_path: Path) -> int | None:
    """Run this command again on a frozen copy of the committed code (``git archive HEAD``).

    Others change the working tree while a run lasts an hour, and every Dask run starts fresh
    workers that import whatever is on disk at that moment; a copy keeps every run of the
    matrix on the same code. Returns the child's exit code, or None to measure here (``--quick``,
    ``--no-snapshot``, already in a snapshot, or not a git checkout).
    """
    if a.quick or a.no_snapshot or os.environ.get(SNAPSHOT_ENV):
        return None
    root = BENCH_DIR.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=30, check=True).stdout.strip()
        tar = subprocess.run(["git", "archive", "--format=tar", "HEAD", "pfm_dask", "benchmarks"],
                             cwd=root, capture_output=True, timeout=120, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    import io
    import tarfile

    snap = (a.work / f"snapshot-{commit[:12]}").resolve()
    if not (snap / ".complete").exists():
        shutil.rmtree(snap, ignore_errors=True)
        snap.mkdir(parents=True)
        with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
            tf.extractall(snap, filter="data")
        (snap / ".complete").write_text(commit + "\n")
    given = list(argv if argv is not None else sys.argv[1:])
    args = given + ["--data-dir", str(a.data_dir.resolve()), "--work", str(a.work.resolve()),
                    "--results-dir", str(a.results_dir.resolve()), "--markdown",
                    str(Path(md_path).resolve())]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(snap) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[SNAPSHOT_ENV] = commit
    env[COMMAND_ENV] = "python -m benchmarks.run " + " ".join(given)
    print(f"measuring commit {commit[:12]} from a frozen copy in {snap}", flush=True)
    return subprocess.call([sys.executable, "-m", "benchmarks.run", *args], cwd=snap, env=env)


def _code_version() -> dict:
    """The commit the package was measured at, and which of its files differed from it."""
    import pfm_dask

    if os.environ.get(SNAPSHOT_ENV):
        return {"commit": os.environ[SNAPSHOT_ENV], "snapshot": True, "pfm_dask_changed": [],
                "pfm_dask_imported_from": str(Path(pfm_dask.__file__).parent)}
    root = BENCH_DIR.parent

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                                  timeout=30).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
    changed = [ln[3:] for ln in git("status", "--porcelain", "--", "pfm_dask").splitlines()]
    return {"commit": git("rev-parse", "HEAD").strip() or None, "snapshot": False,
            "pfm_dask_changed": changed,
            "pfm_dask_imported_from": str(Path(pfm_dask.__file__).parent)}


def _malloc_setting(drop: bool):
    """Apply ``--no-malloc-trim`` (Dask config for workers spawned from now on); the setting used."""
    import dask
    import distributed  # noqa: F401 - loads the distributed config defaults

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    if drop:
        env.pop("MALLOC_TRIM_THRESHOLD_", None)
        dask.config.set({"distributed.nanny.pre-spawn-environ": env})
    return env.get("MALLOC_TRIM_THRESHOLD_")


def _print_headline(res: dict, md_path: Path) -> None:
    loads = res.get("loads", {})
    if loads:
        top = loads[max(loads, key=int)]
        print(f"\n{top['files']} files ({top['gsf_bytes'] / 1e9:.2f} GB):")
        for s, cell in top["setups"].items():
            sp = cell["speedup"]
            print(f"  {s:5s}: speedup 1 worker {sp['dask_1']:.2f}x, 2 workers {sp['dask_2']:.2f}x"
                  f"  (serial {cell['modes']['serial']['wall_median_s']:.1f} s)")
    print(f"RESULTS: {md_path}")


def write_markdown(doc: dict, md_path: Path, results_dir: Path, name: str) -> None:
    """RESULTS.md and its plots from a results document (``<name>.json``)."""
    from . import report_md

    report_md.write(doc, Path(md_path), Path(results_dir), name)


if __name__ == "__main__":
    main()
