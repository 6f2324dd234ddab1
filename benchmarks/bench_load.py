"""Load speed: the same synthetic survey loaded ``--serial`` and on Dask with 1 and 2 workers.

One run measures all three side by side on the same files (cached under
``benchmarks/_data``), so the speedup is a ratio of times taken on the same
machine minutes apart. Each mode runs ``--repeat`` times; the median is kept.

    python -m benchmarks.bench_load              # both shapes below, the issue's figures
    python -m benchmarks.bench_load --shape many # 48 files of 23 MB (1.1 GB)
    python -m benchmarks.bench_load --shape few-large   # 8 files of 37 MB (0.3 GB)
    python -m benchmarks.bench_load --shape survey74    # the 74-file, 2 GB survey of datasets.py
    python -m benchmarks.bench_load --shape real # 8 lines of real EM302 ping records (0.8 GB)
    python -m benchmarks.bench_load --shape all  # every shape in turn
    python -m benchmarks.bench_load --quick      # seconds; CI runs this to keep it working
    python -m benchmarks.bench_load --shape few-large --layouts processes,apart   # A/B layouts

Two survey shapes: *many* files of moderate size (48 x 23 MB, ``--gb``/``--files``) and *few
large* files (8 x 37 MB, 15.5 M soundings: ``pfm-dask synth --files 8 --pings 4506``), where
each piece is a large share of the load, so the pipeline's fill and drain and the writer's
pace weigh more (issue 19: the default 2-worker load lost to ``--serial`` on it). A third,
*survey74*, is the 74-file, 2 GB survey of ``benchmarks.datasets`` (3,249 pings a file, the
survey of ``docs/performance.md``'s load rows and of ``bench_ceiling``). A fourth, *real*, is
real-derived: 8 side-by-side lines of 100 MB of the EX1811 sample's EM302 ping records
(``benchmarks.real_gsf.survey``; 2 M soundings a line, its bytes mostly the sonar's own
subrecords), skipped where the sample is not. ``--shape both`` runs the first two, ``--shape
all`` every one. Each shape writes its own results (``bench_load[_filters].json``,
``bench_load_few_large[_filters].json``, ``bench_load_survey74[_filters].json``,
``bench_load_real[_filters].json``). The 2-worker target over ``--serial`` is 1.8x on *many*
and *survey74*, 1.6x on *few large* and *real* (``TARGETS``).
The Dask modes run the embedded cluster's default layout (threads beside the writer in this
process); ``--layouts`` adds its ``processes`` and ``apart`` layouts to the rotation. When
``pfm-dask load``'s default would load the survey in-process (a small input, ``--quick``), the
rotation also runs that default (``default_mode``): ``speedup_default`` is what a user gets.

Phases reported: decode, place/filter/bin and sort (seconds summed over the
tasks; the keys end in ``_cpu`` for history, but they are the tasks' wall
times, which grow when the cores are shared), the tasks' and the writer
thread's own CPU seconds (``task_thread_cpu``, ``writer_thread_cpu``), transfer
(tasks waiting for the writer to accept a piece), write (the writer's wall time
per piece), area filter, recompute and check (the serial final step), and the
wall time of each stage. ``cpu_s``: the CPU seconds every process of the run spent
(this one, and the cluster's worker processes), against which the wall time shows
how many cores were busy: the speedup is bounded by the serial run's CPU over the
Dask run's CPU per core.

``two_serial_halves`` (in the same rotation, ``--no-halves`` to leave it out): the
survey's files split in two (alternate files), each half loaded ``--serial`` into a PFM
of its own by a process of its own, both at once. Nothing is shared or coordinated, and
the two halves together do the serial run's work, so its speedup over ``--serial`` is
what two cores of this machine give this code at best: a ceiling for the Dask run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import time
from pathlib import Path

from pfm_dask import pipeline, synth
from pfm_dask.config import LoadConfig, SwathFilterConfig
from pfm_dask.inputs import expand_inputs

from ._report import DATA_DIR, remove_pfm, write_results

WORK = Path(__file__).resolve().parent / "_work"
PING_BYTES = 8320  # bytes of one 432-beam synthetic ping record (measured)


#: shape -> (files, pings per file, seed); None: from --gb and --files; "survey74": the
#: 74-file survey of :mod:`benchmarks.datasets` at its default 2 GB
SHAPES = {"many": None, "few-large": (8, 4506, 0), "survey74": "survey74", "real": "real"}
#: the *real* shape: lines of real EM302 ping records (:func:`benchmarks.real_gsf.survey`)
REAL_LINES, REAL_MB = 8, 100.0
#: what ``--shape both`` runs (``all``: every shape of :data:`SHAPES`)
BOTH = ("many", "few-large")
#: shape -> the 2-worker speedup over ``--serial`` issue 19 asks for
TARGETS = {"many": 1.8, "few-large": 1.6, "survey74": 1.8, "real": 1.6}


def survey(gb: float, files: int, seed: int = 3, pings: int | None = None) -> Path:
    """A cached synthetic EM302-like survey of about ``gb`` gigabytes (or ``pings`` per file)."""
    pings = pings or max(20, int(gb * 1e9 / PING_BYTES / files))
    out = DATA_DIR / f"load_{files}x{pings}_s{seed}"
    marker = out / "survey.json"
    if not marker.exists():
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        s = synth.generate(out, files=files, pings=pings, beams=432, seed=seed)
        print(f"generated {s['bytes'] / 1e9:.2f} GB in {time.perf_counter() - t:.1f}s: {out}")
    return out


def run_once(paths, mode: str, workers: int, cfg: LoadConfig, tag: str,
             work: Path | None = None) -> dict:
    """One load of ``paths`` into ``<work>/<tag>.pfm`` (default ``WORK``): wall time and phases."""
    out = (WORK if work is None else Path(work)) / f"{tag}.pfm"
    remove_pfm(out)
    t = time.perf_counter()
    c0 = os.times()
    if mode in ("processes", "apart"):  # the embedded cluster's other layouts (A/B)
        res = _run_layout(paths, out, cfg, workers, mode)
    else:
        res = pipeline.run_load(paths, out, cfg, mode=mode, workers=workers)
    wall = time.perf_counter() - t
    cpu = cpu_seconds(c0, os.times())
    if res.exit_code != 0:
        raise SystemExit(f"load failed ({mode}, {workers}):\n{res.summary()}")
    tm = res.timings
    return {
        "wall_s": wall,
        "soundings_loaded": res.totals["loaded"],
        "soundings_per_s": res.totals["loaded"] / wall,
        "phases_s": {
            "cluster_start": tm.get("cluster_start", 0.0),
            "prescan": tm.get("prescan", 0.0),
            "load_wall": tm.get("load", 0.0),
            "final_wall": tm.get("final", 0.0),
            "decode_cpu": tm.get("task_decode", 0.0),
            "place_filter_bin_cpu": tm.get("task_place_filter_bin", 0.0),
            "sort_cpu": tm.get("task_sort_pack", 0.0),
            "transfer": tm.get("task_transfer", 0.0),
            "write": tm.get("write", 0.0),
            "task_thread_cpu": tm.get("task_cpu", 0.0),
            "writer_thread_cpu": tm.get("write_cpu", 0.0),
            "area_filter": tm.get("area_filter", 0.0),
            "recompute": tm.get("recompute", 0.0),
            "check": tm.get("check", 0.0),
        },
        "peak_backlog_bytes": res.peak_backlog_bytes,
        "cpu_s": cpu,
        "cores_busy": cpu["total"] / wall,
    }


def _run_layout(paths, out: Path, cfg: LoadConfig, workers: int, layout: str):
    """A load on an embedded cluster of another layout (``make_local_cluster(layout=...)``:
    ``processes``, worker processes, the first holding the writer; ``apart``, the same plus a
    disk process that only writes), timed as ``run_load`` times its own."""
    from distributed import Client

    from pfm_dask import cluster as cluster_mod

    t = time.perf_counter()
    with cluster_mod.make_local_cluster(workers, layout=layout) as cluster, \
            Client(cluster) as client:
        client.wait_for_workers(len(cluster.worker_spec), timeout=120)
        t_cluster = time.perf_counter() - t
        res = pipeline.run_load(paths, out, cfg, mode="scheduler", client=client)
    res.timings["cluster_start"] = t_cluster
    return res


def _half_child(paths, out, cfg, barrier, conn) -> None:
    """One half of :func:`run_halves`, in a process of its own: warm up, wait, load, report."""
    try:
        warm = Path(str(out) + "-warm.pfm")
        remove_pfm(out)
        # the compiled kernels are loaded before the clock starts, as in the runner
        run_once(paths[:1], "serial", 1, cfg, warm.stem, work=warm.parent)
        remove_pfm(warm)
        barrier.wait()
        t, c0 = time.perf_counter(), os.times()
        res = pipeline.run_load(paths, out, cfg, mode="serial")
        wall, c1 = time.perf_counter() - t, os.times()
        conn.send({"wall_s": wall, "t0": t, "t1": t + wall, "exit_code": res.exit_code,
                   "soundings_loaded": res.totals["loaded"],
                   "user": c1.user - c0.user, "sys": c1.system - c0.system})
    except BaseException as err:  # noqa: BLE001 - reported to the parent, which raises
        try:
            barrier.abort()
        except Exception:  # noqa: BLE001
            pass
        conn.send({"error": f"{type(err).__name__}: {err}"})
    finally:
        conn.close()


def run_halves(paths, cfg: LoadConfig, tag: str, work: Path | None = None) -> dict:
    """Two ``--serial`` loads of alternate halves of ``paths``, in two processes at once.

    The wall time runs from the first process's start (both are ready by then: imported,
    kernels loaded, met at a barrier) to the last one's end, on the machine's monotonic
    clock; ``cpu_s`` adds up the two processes' user and system time.
    """
    work = WORK if work is None else Path(work)
    halves = [list(paths[0::2]), list(paths[1::2])]
    ctx = mp.get_context("spawn")  # nothing inherited from a runner that ran Dask
    barrier = ctx.Barrier(3)
    procs, conns = [], []
    for i, half in enumerate(halves):
        recv, send = ctx.Pipe(duplex=False)
        pr = ctx.Process(target=_half_child, name=f"half-{i}",
                         args=(half, work / f"{tag}-{i}.pfm", cfg, barrier, send))
        pr.start()
        send.close()
        procs.append(pr)
        conns.append(recv)
    try:
        barrier.wait(timeout=600)
    except Exception:  # noqa: BLE001 - a child failed while warming up: its message below
        pass
    got = []
    for recv in conns:
        try:
            got.append(recv.recv())
        except EOFError:
            got.append({"error": "the process died without a word"})
    for pr in procs:
        pr.join()
    bad = [g["error"] if "error" in g else f"exit code {g['exit_code']}"
           for g in got if "error" in g or g["exit_code"] != 0]
    if bad:
        raise SystemExit(f"two_serial_halves failed: {bad}")
    # perf_counter is CLOCK_MONOTONIC, one clock for every process of the machine
    wall = max(g["t1"] for g in got) - min(g["t0"] for g in got)
    user, sys_ = sum(g["user"] for g in got), sum(g["sys"] for g in got)
    loaded = sum(g["soundings_loaded"] for g in got)
    cpu = {"driver_user": 0.0, "driver_sys": 0.0, "workers_user": user, "workers_sys": sys_,
           "total": user + sys_}
    return {"wall_s": wall, "soundings_loaded": loaded, "soundings_per_s": loaded / wall,
            "halves_wall_s": [g["wall_s"] for g in got], "files": [len(h) for h in halves],
            "phases_s": {}, "cpu_s": cpu, "cores_busy": cpu["total"] / wall}


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:      # not Linux
        return os.cpu_count() or 1


def cpu_bound(serial: dict, cores: int) -> dict:
    """The most any schedule on ``cores`` cores can give over ``--serial`` while spending no
    more CPU than it: ``--serial`` already keeps ``serial_cores_busy`` cores busy (its
    write-behind and pack threads beside the task), so the bound is ``cores`` over that."""
    busy = serial["cpu_s"]["total"] / serial["wall_s"]
    return {"cores": cores, "serial_cores_busy": busy, "cpu_bound_speedup": cores / busy}


def cpu_seconds(before: os.times_result, after: os.times_result) -> dict:
    """CPU seconds of this process (``driver``: in Dask modes also the scheduler and the
    nannies) and of its reaped children (``workers``: the embedded cluster's worker processes,
    which the load closes and reaps before it returns), user and system, between two
    :func:`os.times`; with the wall time they say how much more CPU a Dask run spends than
    ``--serial`` does for the same work."""
    out = {"driver_user": after.user - before.user, "driver_sys": after.system - before.system,
           "workers_user": after.children_user - before.children_user,
           "workers_sys": after.children_system - before.children_system}
    out["total"] = sum(out.values())
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=["both", "all", *SHAPES], default="both",
                    help="many files (--gb, --files), few large files, both in turn, the "
                         "74-file survey (survey74), real-derived lines (real), or all")
    ap.add_argument("--gb", type=float, default=1.1, help="survey size in GB (default 1.1)")
    ap.add_argument("--files", type=int, default=48)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bin-size", type=float, default=50.0,
                    help="bin size (m); deep-water EM302 data at 2 m bins would make a "
                         "grid of tens of GB")
    ap.add_argument("--filters", action="store_true", help="swath and area filter on")
    ap.add_argument("--quick", action="store_true", help="a tiny survey, one repeat")
    ap.add_argument("--no-halves", action="store_true",
                    help="leave out the two_serial_halves ceiling (two --serial processes)")
    ap.add_argument("--layouts", default="",
                    help="also 2 workers in the embedded cluster's other layouts, in the same "
                         "rotation: 'processes' (worker processes, the first holding the "
                         "writer), 'apart' (plus a disk process that only writes), or both "
                         "comma-separated")
    ap.add_argument("--writer-apart", action="store_true", help="the same as --layouts apart")
    args = ap.parse_args(argv)
    args.layouts = [x for x in args.layouts.split(",") if x] + (
        ["apart"] if args.writer_apart and "apart" not in args.layouts else [])
    bad = [x for x in args.layouts if x not in ("processes", "apart")]
    if bad:
        ap.error(f"unknown layout(s) {bad}: processes, apart")
    if args.quick:
        args.gb, args.files, args.repeat, args.shape = 0.004, 4, 1, "many"
    shapes = {"both": list(BOTH), "all": list(SHAPES)}.get(args.shape, [args.shape])
    return {shape: run_shape(args, shape) for shape in shapes}


def run_shape(args, shape: str) -> dict:
    """bench_load's interleaved runs of every mode on one survey shape; writes its results."""
    WORK.mkdir(parents=True, exist_ok=True)
    if SHAPES[shape] is None:
        data = survey(args.gb, args.files)
    elif shape == "survey74":
        from . import datasets

        data = datasets.survey(datasets.pings_for(datasets.DEFAULT_GB), quiet=True)
    elif shape == "real":
        from . import real_gsf

        data = real_gsf.survey(REAL_LINES, REAL_MB, data_dir=DATA_DIR)
        if data is None:
            print(f"real: skipped, {real_gsf.SAMPLE_NAME} not found in {real_gsf.samples_dir()} "
                  "(set PFM_DASK_GSF_SAMPLES)")
            return {}
    else:
        files, pings, seed = SHAPES[shape]
        data = survey(0.0, files, seed=seed, pings=pings)
    paths = expand_inputs([data])
    gsf_bytes = sum(os.path.getsize(p) for p in paths)
    cfg = LoadConfig(bin_size_m=args.bin_size, area_filter=args.filters,
                     swath=SwathFilterConfig(enabled=args.filters))
    modes = [("serial", "serial", 1), ("dask_1_worker", "local", 1),
             ("dask_2_workers", "local", 2)]
    for layout in args.layouts:
        modes.append((f"dask_2_workers_{layout}", layout, 2))
    default_mode = pipeline.auto_mode(paths, cfg)[0]
    if default_mode == "serial":  # pfm-dask load's default runs this load in-process
        modes.append(("default_mode", "auto", 2))
    if not args.no_halves:
        modes.append(("two_serial_halves", "halves", 2))
    runs: dict[str, list[dict]] = {m: [] for m, _, _ in modes}
    # one untimed serial load of one file loads the compiled kernels in this process, as
    # each fresh Dask worker and each half's process does before its first piece
    run_once(paths[:1], "serial", 1, cfg, "warm-up")
    for r in range(args.repeat):
        for name, mode, workers in modes:  # interleaved, so drift hits every mode alike
            if mode == "halves":
                one = run_halves(paths, cfg, name)
            else:
                one = run_once(paths, mode, workers, cfg, name)
            runs[name].append(one)
            print(f"run {r + 1}/{args.repeat} {name}: {one['wall_s']:.2f}s "
                  f"({one['soundings_per_s']:,.0f} soundings/s; {one['cpu_s']['total']:.1f} "
                  f"CPU-s, {one['cores_busy']:.2f} cores busy)")
    results = {"shape": shape, "gsf_bytes": gsf_bytes, "files": len(paths),
               "bin_size_m": args.bin_size,
               "filters": args.filters, "repeats": args.repeat, "modes": {}}
    for name in runs:
        med = sorted(runs[name], key=lambda x: x["wall_s"])[len(runs[name]) // 2]
        med = dict(med, wall_all_s=[x["wall_s"] for x in runs[name]],
                   gsf_mb_per_s=gsf_bytes / 1e6 / med["wall_s"])
        results["modes"][name] = med
    t_serial = results["modes"]["serial"]["wall_s"]
    results["speedup_1_worker"] = t_serial / results["modes"]["dask_1_worker"]["wall_s"]
    results["speedup_2_workers"] = t_serial / results["modes"]["dask_2_workers"]["wall_s"]
    results["target_speedup_2_workers"] = TARGETS[shape]
    results.update(cpu_bound(results["modes"]["serial"], _usable_cores()))
    for layout in args.layouts:
        results[f"speedup_2_workers_{layout}"] = (
            t_serial / results["modes"][f"dask_2_workers_{layout}"]["wall_s"])
    # what `pfm-dask load` does with no mode option: 2 workers, or in-process for a small load
    results["default_mode"] = default_mode
    results["speedup_default"] = t_serial / results["modes"][
        "default_mode" if default_mode == "serial" else "dask_2_workers"]["wall_s"]
    if "two_serial_halves" in results["modes"]:
        t_halves = results["modes"]["two_serial_halves"]["wall_s"]
        results["speedup_two_serial_halves"] = t_serial / t_halves
        # the Dask run's speedup as a share of what two independent processes reach
        results["dask_2_workers_of_ceiling"] = (results["speedup_2_workers"]
                                                / results["speedup_two_serial_halves"])
    results["median_note"] = f"median of {args.repeat} runs per mode ({statistics.__name__})"

    def plot_phases(ax):
        names = [n for n in results["modes"] if results["modes"][n]["phases_s"]]
        keys = ["cluster_start", "prescan", "load_wall", "final_wall"]
        bottom = [0.0] * len(names)
        for k in keys:
            vals = [results["modes"][n]["phases_s"][k] for n in names]
            ax.bar(names, vals, bottom=bottom, label=k)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("seconds (median run)")
        ax.set_title(f"pfm-dask load, {gsf_bytes / 1e9:.2f} GB GSF, {len(paths)} files "
                     f"({shape})")
        ax.legend()

    def plot_speedup(ax):
        names = list(results["modes"])
        ax.bar(names, [t_serial / results["modes"][n]["wall_s"] for n in names])
        ax.axhline(TARGETS[shape], color="k", ls="--", lw=1, label="target with 2 workers")
        ax.tick_params(axis="x", labelrotation=15)
        ax.set_ylabel("speedup over --serial")
        ax.legend()

    def plot_cpu(ax):
        names = list(results["modes"])
        bottom = [0.0] * len(names)
        for k in ("driver_user", "driver_sys", "workers_user", "workers_sys"):
            vals = [results["modes"][n]["cpu_s"][k] for n in names]
            ax.bar(names, vals, bottom=bottom, label=k)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel("CPU seconds (median run)")
        ax.set_title("CPU spent on the same load")
        ax.legend()

    suffix = ("" if shape == "many" else "_" + shape.replace("-", "_")) + (
        "_quick" if args.quick else ("_filters" if args.filters else ""))
    write_results(f"bench_load{suffix}", results,
                  plots={"phases": plot_phases, "speedup": plot_speedup, "cpu": plot_cpu})
    print(f"{shape}: speedup with 2 workers: {results['speedup_2_workers']:.2f}x "
          f"(target {TARGETS[shape]}x); 1 worker: {results['speedup_1_worker']:.2f}x; the "
          f"default mode ({default_mode}): {results['speedup_default']:.2f}x")
    print(f"--serial keeps {results['serial_cores_busy']:.2f} cores busy: no schedule spending "
          f"no more CPU beats {results['cpu_bound_speedup']:.2f}x on {results['cores']} cores")
    if "speedup_two_serial_halves" in results:
        print(f"two --serial processes on half the files each: "
              f"{results['speedup_two_serial_halves']:.2f}x (this machine's ceiling for two "
              f"cores); the 2-worker run reaches {100 * results['dask_2_workers_of_ceiling']:.0f}%"
              " of it")
    return results


if __name__ == "__main__":
    main()
