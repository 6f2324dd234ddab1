"""A load's task: ``soundings.prepare_piece`` against the numpy path it replaced, same run, one core.

The pieces of the first ``--files`` files of the benchmark survey (``benchmarks.datasets``: the
74-file EM302-like survey, 432 beams, cached in ``benchmarks/_data/``), planned as a load plans
them (``pipeline.prescan_file``, ``area_from_scans``, ``plan_pieces``; 50 m bins), are prepared by
the task (:func:`pfm_dask.soundings.prepare_piece`) and by the numpy path it replaced
(``tests/prepare_reference.py``), alternating, ``--runs`` times each after a warm-up (which
compiles the kernels or loads them from numba's cache); without and with the swath filter.
Per sounding: the CPU time of the calling thread (one core; robust on a shared machine) and the
wall time of each phase as the task reports it (``decode``, ``place_filter_bin``,
``sort_pack``: the ``task_*`` timings of ``pfm-dask load --json``); best and median of the runs,
and the ratio of the medians. The two paths' batches, pings and counts must be identical.

The pre-scan of the same files (``prescan_file``: framing, ping headers, a sample of pings
decoded and placed) is timed too, CPU per file, best of the runs.

    python -m benchmarks.bench_prepare [--quick] [--files 2] [--runs 3]

``--quick`` (a generated 2 x 60-ping survey, one run) checks that it works (seconds); results go
to ``bench_prepare_quick.json``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks._report import write_results

PHASES = ("decode", "place_filter_bin", "sort_pack")
BIN_SIZE_M = 50.0


def _files(quick: bool, n: int, tmp: str) -> list[Path]:
    from benchmarks import datasets

    if quick:
        from pfm_dask import synth

        synth.generate(tmp, files=2, pings=60, beams=432, seed=302)
        return sorted(Path(tmp).glob("*.gsf"))
    folder = datasets.survey(datasets.pings_for(datasets.DEFAULT_GB))
    return datasets.load_files(folder, n)


def _prescan(files, runs: int) -> dict:
    from pfm_dask import pipeline

    best = float("inf")
    scans = None
    for _ in range(runs):
        c = time.thread_time()
        scans = [pipeline.prescan_file(str(f)) for f in files]
        best = min(best, time.thread_time() - c)
    return {"scans": scans, "cpu_s_per_file": best / len(files),
            "cpu_s_74_files": best / len(files) * 74}


def _one_run(fn, pieces, grid, cfg) -> tuple[dict, list]:
    out = []
    phases = dict.fromkeys(PHASES, 0.0)
    c = time.thread_time()
    for p in pieces:
        r = fn(p, grid, cfg)
        for k in PHASES:
            phases[k] += r.timings.get(k, 0.0)
        out.append(r)
    phases["cpu"] = time.thread_time() - c
    return phases, out


def _same(a, b) -> bool:
    return all(x.batch.equals(y.batch) and x.pings.equals(y.pings) and x.counts == y.counts
               for x, y in zip(a, b)) and len(a) == len(b)


def _variant(scans, swath: bool, runs: int) -> dict:
    from pfm_dask import pipeline, soundings
    from pfm_dask.config import LoadConfig, SwathFilterConfig
    from tests.prepare_reference import prepare_piece_reference

    cfg = LoadConfig(bin_size_m=BIN_SIZE_M, swath=SwathFilterConfig(enabled=swath))
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    paths = {"task": soundings.prepare_piece, "numpy": prepare_piece_reference}
    for fn in paths.values():           # warm-up: kernels compiled or loaded, files cached
        fn(pieces[0], grid, cfg)
    times = {name: [] for name in paths}
    identical = True
    n = 0
    for k in range(runs):
        outs = {}
        for name, fn in paths.items():
            t, outs[name] = _one_run(fn, pieces, grid, cfg)
            times[name].append(t)
        n = sum(r.counts["soundings_read"] for r in outs["task"])
        identical = identical and _same(outs["task"], outs["numpy"])
        del outs
    res = {"pieces": len(pieces), "soundings": n, "identical": identical}
    for name, ts in times.items():
        res[name] = {}
        for key in ("cpu", *PHASES):
            vals = [t[key] / n * 1e9 for t in ts]
            res[name][f"{key}_ns"] = {"best": min(vals), "median": statistics.median(vals)}
    res["cpu_ratio"] = res["numpy"]["cpu_ns"]["median"] / res["task"]["cpu_ns"]["median"]
    res["phase_ratio"] = {k: res["numpy"][f"{k}_ns"]["median"] / res["task"][f"{k}_ns"]["median"]
                          for k in PHASES if res["task"][f"{k}_ns"]["median"] > 0}
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_prepare",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny survey, one run (seconds; CI)")
    ap.add_argument("--files", type=int, default=2, help="first N files of the survey")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--results-dir", default=None)
    args = ap.parse_args(argv)
    runs = 1 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as tmp:
        files = _files(args.quick, args.files, tmp)
        pre = _prescan(files, runs)
        scans = pre.pop("scans")
        results = {"command": "python -m benchmarks.bench_prepare"
                   + (" --quick" if args.quick else f" --files {args.files} --runs {runs}"),
                   "files": len(files), "bin_size_m": BIN_SIZE_M, "runs": runs, "prescan": pre,
                   "plain": _variant(scans, False, runs), "swath": _variant(scans, True, runs)}

    def bars(ax):
        labels, bottoms = [], []
        for v in ("plain", "swath"):
            for name in ("numpy", "task"):
                labels.append(f"{v}\n{name}")
                bottoms.append([results[v][name][f"{k}_ns"]["median"] for k in PHASES])
        x = range(len(labels))
        base = [0.0] * len(labels)
        for j, k in enumerate(PHASES):
            h = [b[j] for b in bottoms]
            ax.bar(x, h, bottom=base, label=k)
            base = [a + b for a, b in zip(base, h)]
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("ns per sounding (wall, median)")
        ax.set_title(f"prepare_piece by phase, {len(files)} files, {BIN_SIZE_M:g} m bins")
        ax.legend()

    name = "bench_prepare_quick" if args.quick else "bench_prepare"
    write_results(name, results, plots={"phases": bars}, results_dir=args.results_dir)
    ok = results["plain"]["identical"] and results["swath"]["identical"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
