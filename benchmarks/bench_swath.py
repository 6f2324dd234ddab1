"""Swath filter speed: the compiled kernel against an earlier one and the numpy kernel, same run.

Speed: a synthetic EM302-like survey (``pfm_dask.synth``, 432 beams, ``--files`` x ``--pings``)
is loaded as pfmLoader loads it (skips, GSF flags, depth limits) and filtered file by file with
``pfm_dask.filters.swath_filter``, with the same function of an earlier tree (``--baseline``, a
checkout of the commit to compare with, e.g. ``git worktree add --detach /tmp/base f328ca8``;
imported as a separate package, ``pfm_dask_base``) and with the numpy kernel of
``benchmarks/_swath_numpy.py``, in turn, ``--runs`` times each after a warm-up (which compiles
the kernels or loads them from numba's cache). CPU time of the calling thread, per sounding;
best and median, and the ratios of the medians. The compiled kernel with ``model="median"``
is timed too.

Flags: the kernels run on every survey the tests use (the ``pfm_dask.synth`` parameter sets of
``tests/``, the in-test ping x beam surveys of ``tests/test_swath_filter.py``, the real GSF
samples) and on the surveys of ``docs/filters.md``; the validity words must be identical to the
numpy kernel's (and to the baseline's), and any difference is listed. The detection and
false-positive figures of ``docs/filters.md`` are recomputed with the compiled kernel.

    python -m benchmarks.bench_swath [--baseline DIR] [--quick] [--files 2] [--pings 1000]
                                     [--runs 5] [--no-flags]

``--quick`` times a tiny survey once and checks flags on a few small surveys (seconds; for CI);
its results go to ``bench_swath_quick.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks._report import write_results
from benchmarks._swath_numpy import swath_filter_numpy

#: ``synth.generate`` arguments of the surveys in tests/ (files, pings, beams, seed, extras).
TEST_SURVEYS = [
    dict(files=3, pings=20, beams=32, seed=5), dict(files=3, pings=40, beams=64, seed=5),
    dict(files=3, pings=40, beams=64, seed=1), dict(files=2, pings=60, beams=128, seed=11),
    dict(files=2, pings=30, beams=64, seed=3), dict(files=3, pings=40, beams=96, seed=7),
    dict(files=4, pings=60, beams=128, seed=11), dict(files=4, pings=30, beams=64, seed=3),
    dict(files=1, pings=300, beams=64, seed=3), dict(files=2, pings=120, beams=432, seed=5),
    dict(files=1, pings=30, beams=16, seed=4), dict(files=1, pings=5, beams=8, seed=1),
    dict(files=1, pings=300, beams=432, seed=11),
    dict(files=1, pings=40, seed=4, spike_rate=2e-3, cluster_rate=0.1),
]
#: The surveys of docs/filters.md's table (the first is also test_score_on_synth's).
DOC_SURVEYS = [
    dict(files=2, pings=200, seed=11, spike_rate=2e-3, cluster_rate=0.05),
    dict(files=8, pings=500, seed=1),
    dict(files=4, pings=1000, seed=2, spike_rate=2e-3, cluster_rate=0.05),
]


def _loader():
    from tests.test_swath_filter import _load_like_pfmloader

    return _load_like_pfmloader


def _flags(new, old) -> np.ndarray:
    return new != old


#: ``swath_filter`` of the ``--baseline`` tree, once loaded
_BASELINE: dict = {}


def load_baseline(tree: Path):
    """``swath_filter`` of another checkout of this repository, imported as ``pfm_dask_base``
    (its modules import each other relatively, so none of this tree's code is mixed in)."""
    pkg = Path(tree) / "pfm_dask"
    spec = importlib.util.spec_from_file_location("pfm_dask_base", pkg / "__init__.py",
                                                  submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["pfm_dask_base"] = mod
    spec.loader.exec_module(mod)
    from pfm_dask_base.filters import swath_filter  # type: ignore[import-not-found]

    _BASELINE["fn"], _BASELINE["tree"] = swath_filter, str(tree)
    return swath_filter


# ---------------------------------------------------------------------------------- speed
def speed(files: int, pings: int, runs: int, seed: int = 302) -> dict:
    """us of CPU per sounding of both kernels on one survey, alternating, after a warm-up."""
    from pfm_dask import synth
    from pfm_dask.filters import swath_filter

    load = _loader()
    with tempfile.TemporaryDirectory() as tmp:
        synth.generate(tmp, files=files, pings=pings, beams=432, seed=seed)
        inputs = [load(p) for p in sorted(Path(tmp).glob("*.gsf"))]
    n = sum(len(x[0]) for x in inputs)
    kernels = {"compiled": swath_filter, "numpy": swath_filter_numpy}
    if _BASELINE:
        kernels["baseline"] = _BASELINE["fn"]
    out = {}
    t0 = time.perf_counter()
    for name, fn in kernels.items():                   # warm-up: compile or load the cache
        out[name] = [fn(*x)[0] for x in inputs[:1]]
    warm_s = time.perf_counter() - t0
    times: dict[str, list[float]] = {k: [] for k in kernels}
    for r in range(runs):
        for name in (list(kernels) if r % 2 == 0 else list(kernels)[::-1]):
            fn = kernels[name]
            t = time.thread_time()
            out[name] = [fn(*x)[0] for x in inputs]
            times[name].append((time.thread_time() - t) / n * 1e6)
    same = all(np.array_equal(a, b) for k in kernels if k != "compiled"
               for a, b in zip(out["compiled"], out[k]))
    res = {"survey": dict(files=files, pings=pings, beams=432, seed=seed), "soundings": n,
           "runs": runs, "warm_up_s": warm_s, "flags_identical": same,
           "flagged": int(sum(np.count_nonzero(_flags(v, x[3])) for v, x in
                              zip(out["compiled"], inputs)))}
    for name, ts in times.items():
        res[name] = {"us_per_sounding_best": min(ts), "us_per_sounding_median":
                     statistics.median(ts), "us_per_sounding_runs": ts}
    res["speedup_median"] = res["numpy"]["us_per_sounding_median"] / \
        res["compiled"]["us_per_sounding_median"]
    res["speedup_best"] = res["numpy"]["us_per_sounding_best"] / \
        res["compiled"]["us_per_sounding_best"]
    if "baseline" in kernels:
        res["baseline_tree"] = _BASELINE["tree"]
        res["speedup_vs_baseline_median"] = res["baseline"]["us_per_sounding_median"] / \
            res["compiled"]["us_per_sounding_median"]
        res["speedup_vs_baseline_best"] = res["baseline"]["us_per_sounding_best"] / \
            res["compiled"]["us_per_sounding_best"]
    ts = []
    for _ in range(runs):                               # the median model, for the docs
        t = time.thread_time()
        for x in inputs:
            swath_filter(*x, model="median")
        ts.append((time.thread_time() - t) / n * 1e6)
    res["compiled_median_model"] = {"us_per_sounding_best": min(ts),
                                    "us_per_sounding_median": statistics.median(ts)}
    return res


# ---------------------------------------------------------------------------------- flags
def _compare(p, b, z, v, **kw) -> dict:
    from pfm_dask.filters import swath_filter

    new, st = swath_filter(p, b, z, v, **kw)
    old, _ = swath_filter_numpy(p, b, z, v, **kw)
    diff = np.flatnonzero(new != old)
    if _BASELINE:                       # the earlier compiled kernel must agree as well
        base, _ = _BASELINE["fn"](p, b, z, v, **kw)
        diff = np.union1d(diff, np.flatnonzero(new != base))
    return {"soundings": int(len(p)), "flagged": st.flagged, "differ": int(diff.size),
            "differing": [(int(p[i]), int(b[i])) for i in diff[:20]], "new": new}


def _synth_flags(params: dict, truth_scores: bool = False) -> dict:
    """Both kernels on every file of one synth survey (whole files, default parameters)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from pfm_dask import synth
    from pfm_dask.filters import score_against_truth, spike_mask
    from pfm_dask.pfm import validity as V

    load = _loader()
    row = {"survey": dict(params), "soundings": 0, "flagged": 0, "differ": 0, "differing": []}
    per_threshold: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        synth.generate(tmp, **params)
        truth = pq.read_table(Path(tmp) / "truth.parquet")
        for path in sorted(Path(tmp).glob("*.gsf")):
            p, b, z, v = load(path)
            if p.size == 0:
                continue
            c = _compare(p, b, z, v)
            for k in ("soundings", "flagged", "differ"):
                row[k] += c[k]
            row["differing"] += [(path.name, pb) for pb in c["differing"]]
            if not truth_scores:
                continue
            mine = truth.filter(pc.equal(truth["file"], path.name))
            spikes = spike_mask(p, b, mine["ping"].to_numpy(), mine["beam"].to_numpy())
            eligible = (v & V.INVAL) == 0
            runs = {5.0: c["new"]}
            for thr in (4.0, 6.0):
                runs[thr] = _new_filter(p, b, z, v, threshold=thr)
            runs["median"] = _new_filter(p, b, z, v, model="median")
            for key, new in runs.items():
                acc = per_threshold.setdefault(str(key), [[], [], []])
                acc[0].append(_flags(new, v))
                acc[1].append(spikes)
                acc[2].append(eligible)
    if truth_scores:
        row["scores"] = {k: score_against_truth(np.concatenate(f), np.concatenate(s),
                                                np.concatenate(e))
                         for k, (f, s, e) in per_threshold.items()}
    return row


def _new_filter(p, b, z, v, **kw):
    from pfm_dask.filters import swath_filter

    return swath_filter(p, b, z, v, **kw)[0]


def _in_test_surveys() -> list[dict]:
    """tests/test_swath_filter.py's ping x beam surveys: the slope study of docs/filters.md
    (400 x 256, seeds 0-2, slopes 0-15 degrees, plane and median) and the tests' own."""
    from pfm_dask.filters import score_against_truth
    from tests.test_swath_filter import survey

    rows = []
    for slope in (0.0, 5.0, 10.0, 15.0):
        for model in ("plane", "median"):
            agg = {"all": [[], []], "edge": [[], []]}
            row = {"survey": f"survey(400 x 256, slope {slope:g}, seeds 0-2), model={model}",
                   "soundings": 0, "flagged": 0, "differ": 0, "differing": []}
            for seed in range(3):
                p, b, z, spike = survey(n_pings=400, n_beams=256, slope_deg=slope, seed=seed)
                v = np.zeros(len(z), np.uint32)
                c = _compare(p, b, z, v, model=model)
                for k in ("soundings", "flagged", "differ"):
                    row[k] += c[k]
                f = _flags(c["new"], v)
                edge = (b <= 8) | (b >= 256 - 7)
                agg["all"][0].append(f)
                agg["all"][1].append(spike)
                agg["edge"][0].append(f[edge])
                agg["edge"][1].append(spike[edge])
            row["scores"] = {k: score_against_truth(np.concatenate(f), np.concatenate(s))
                             for k, (f, s) in agg.items()}
            rows.append(row)
    for kw in (dict(), dict(slope_deg=0.0, seed=7), dict(slope_deg=10.0, seed=7),
               dict(slope_deg=15.0, seed=7), dict(slope_deg=15.0, seed=8),
               dict(slope_deg=10.0, seed=9, spike_frac=0.02),
               dict(n_pings=60, n_beams=48, seed=3, spike_frac=0.03)):
        p, b, z, _ = survey(**kw)
        for model in ("plane", "median"):
            c = _compare(p, b, z, np.zeros(len(z), np.uint32), model=model)
            rows.append({"survey": f"survey({kw}), model={model}",
                         **{k: c[k] for k in ("soundings", "flagged", "differ", "differing")}})
    return rows


def _gsf_samples() -> list[dict]:
    from tests.conftest import SAMPLE_FILES

    load = _loader()
    rows = []
    for path in SAMPLE_FILES:
        p, b, z, v = load(path)
        if p.size == 0:
            continue
        c = _compare(p, b, z, v)
        rows.append({"survey": path.name, **{k: c[k] for k in ("soundings", "flagged", "differ",
                                                               "differing")}})
    return rows


def flags(quick: bool) -> dict:
    """Both kernels' flags on the tests' and the docs' surveys: counts and any difference."""
    rows = [_synth_flags(s) for s in (TEST_SURVEYS[:3] if quick else TEST_SURVEYS)]
    docs = [_synth_flags(s, truth_scores=True) for s in DOC_SURVEYS[: 1 if quick else 3]]
    in_test = [] if quick else _in_test_surveys()
    gsf = _gsf_samples()
    every = rows + docs + in_test + gsf
    return {"test_synth_surveys": rows, "doc_surveys": docs, "in_test_surveys": in_test,
            "gsf_samples": gsf, "surveys": len(every),
            "soundings": sum(r["soundings"] for r in every),
            "soundings_differing": sum(r["differ"] for r in every),
            "identical": all(r["differ"] == 0 for r in every)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_swath",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny survey, one run (seconds; CI)")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--pings", type=int, default=1000, help="pings per file (default 1000)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per kernel (default 5)")
    ap.add_argument("--no-flags", action="store_true", help="time only, skip the flag check")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of an earlier commit whose swath_filter to time and "
                         "compare with (e.g. a worktree at f328ca8)")
    ap.add_argument("--results-dir", type=Path, default=None, help="default benchmarks/results")
    args = ap.parse_args(argv)
    if args.quick:
        args.files, args.pings, args.runs = 1, 30, 1
    if args.baseline is not None:
        load_baseline(args.baseline)
    results = {"command": "python -m benchmarks.bench_swath" + (" --quick" if args.quick else "")
               + (f" --baseline {args.baseline}" if args.baseline else ""),
               "speed": speed(args.files, args.pings, args.runs)}
    if not args.no_flags:
        results["flags"] = flags(args.quick)
    s = results["speed"]

    def bars(ax):
        names = ["numpy", "baseline", "compiled"] if "baseline" in s else ["numpy", "compiled"]
        labels = {"numpy": "numpy kernel", "baseline": "baseline tree", "compiled": "compiled kernel"}
        x = np.arange(len(names))
        ax.bar(x - 0.2, [s[k]["us_per_sounding_median"] for k in names], 0.4, label="median")
        ax.bar(x + 0.2, [s[k]["us_per_sounding_best"] for k in names], 0.4, label="best")
        ax.axhline(0.35, color="k", lw=0.8, ls="--", label="target 0.35 µs")
        ax.set_xticks(x, [labels[k] for k in names])
        ax.set_ylabel("µs of CPU per sounding (one core)")
        vs = (f"{s['speedup_vs_baseline_median']:.2f}× the baseline" if "baseline" in s
              else f"{s['speedup_median']:.1f}× the numpy kernel")
        ax.set_title(f"swath filter, {s['soundings']:,} soundings: {vs}")
        ax.legend()

    name = "bench_swath_quick" if args.quick else "bench_swath"
    write_results(name, results, plots={"speed": bars}, results_dir=args.results_dir)
    print(f"compiled {s['compiled']['us_per_sounding_median']:.3f} µs/sounding, numpy "
          f"{s['numpy']['us_per_sounding_median']:.3f} µs/sounding (medians of {s['runs']}): "
          f"{s['speedup_median']:.1f}×; target <= 0.35 µs")
    if "baseline" in s:
        print(f"baseline ({s['baseline_tree']}) {s['baseline']['us_per_sounding_median']:.3f} "
              f"µs/sounding: {s['speedup_vs_baseline_median']:.2f}× (best "
              f"{s['speedup_vs_baseline_best']:.2f}×)")
    if "flags" in results:
        f = results["flags"]
        print(f"flags on {f['surveys']} surveys, {f['soundings']:,} soundings: "
              + ("identical" if f["identical"] else f"{f['soundings_differing']} differ"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
