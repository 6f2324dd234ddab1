"""Start-up and small loads: the command line's wall time against ``python -c pass``.

A survey office loads one line at a time as often as a whole survey, so what a small command
costs beyond starting Python matters. Each case below runs as a fresh process, the way a user
runs it (``pfm-dask ...`` is ``python -c 'from pfm_dask.cli import main; main()'``), once
unmeasured (byte-code and numba caches warm) and then ``--repeats`` times; the JSON keeps the
best and median wall time, the best CPU time (user + system, children included), the ratio of
the best wall time to the floor's measured in the same run, which heavy packages the process
imported, and for a load the seconds it spent making its kernels ready (its report's
``kernels``: numba's import and the kernels read from the cache) and each phase's best
(``phases_best_s``: pre-scan, load, final step with its recompute and check, ...).

Cases: the floor ``python -c pass``; ``pfm-dask --help``; ``info`` of a small PFM (the EX1811
sample at 25 m bins) and of the 2 m PFM of the default load; ``gsf-info`` and ``check``; the
EX1811 sample loaded with the default options, with ``--serial`` and with ``--workers 2``.
The last two give the embedded cluster's extra cost on a small input, which with bench_load's
per-MB saving of the second worker (``results/bench_load*.json``) puts the break-even input
size behind the default mode choice (``pipeline.SMALL_LOAD_BYTES``).

``--baseline DIR`` runs every case also against another copy of the package (e.g.
``git archive ee8a947 | tar -x -C /tmp/base``), in the same run, interleaved repeat by repeat.

    python -m benchmarks.bench_startup                       # -> results/bench_startup.json
    python -m benchmarks.bench_startup --baseline /tmp/base  # before/after in one run
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._report import BENCH_DIR, remove_pfm, write_results

SAMPLES = Path(os.environ.get("PFM_DASK_GSF_SAMPLES", "/work/shared/data/gsf"))
EX1811 = "ukho-gsfpy__0059_20181102_212138_EX1811_MB_EM302.gsf.mb121"
HEAVY = ("dask", "distributed", "numba", "pydantic", "pyarrow", "typer")

# The console script's body, plus a line on stderr naming the heavy packages it imported.
_CLI = ("import atexit, sys\n"
        "atexit.register(lambda: sys.stderr.write('IMPORTED ' + ' '.join(sorted("
        "{m.split('.')[0] for m in sys.modules} & set(%r))) + '\\n'))\n"
        "sys.argv[0] = 'pfm-dask'\n"
        "from pfm_dask.cli import main\n"
        "sys.exit(main())\n") % (HEAVY,)


def _env(tree: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its byte-code cached
    return env


def _run(argv: list[str], env: dict, before=None, cwd=None) -> dict:
    """One run of ``argv``: wall and CPU seconds, the exit code, the heavy imports."""
    if before:
        before()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    # cwd: ``python -c`` puts the working directory first on sys.path, before PYTHONPATH
    p = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=cwd)
    wall = time.perf_counter() - t
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    imported = [ln.split()[1:] for ln in p.stderr.splitlines() if ln.startswith("IMPORTED")]
    phases = _load_timings(argv, cwd)
    return {"wall": wall, "cpu": cpu, "rc": p.returncode,
            "kernels": phases.get("kernels") if phases else None, "phases": phases,
            "imported": imported[-1] if imported else None,
            "said": [ln for ln in p.stderr.splitlines() if "no cluster" in ln],
            "stderr": p.stderr[-2000:] if p.returncode not in (0, 3) else ""}


#: a load's phases kept from its report's timings: where its seconds go beyond the imports
_PHASES = ("kernels", "prescan", "load", "final", "recompute", "check", "journal_checkpoint",
           "write", "total")


def _load_timings(argv: list[str], cwd) -> dict | None:
    """A load's seconds by phase (:data:`_PHASES`, its report's ``timings``; ``kernels``:
    numba's import, cache loads, compilations); None for other commands."""
    import json

    if "load" not in argv or "-o" not in argv:
        return None
    report = Path(cwd or ".") / (argv[argv.index("-o") + 1] + ".data") / "load-report.json"
    try:
        timings = json.loads(report.read_text())["timings"]
    except (OSError, ValueError, KeyError):
        return None
    return {k: timings[k] for k in _PHASES if k in timings}


def _cases(work: Path, sample: Path, small_pfm: Path, big_pfm: Path) -> dict:
    """name -> (command-line arguments or None for the floor, a function run before each)."""
    out = work / "load.pfm"
    clean = lambda: remove_pfm(out)  # noqa: E731
    return {
        "python -c pass": (None, None),
        "pfm-dask --help": (["--help"], None),
        "info (25 m PFM)": (["info", small_pfm], None),
        "info (2 m PFM)": (["info", big_pfm], None),
        "gsf-info": (["gsf-info", sample], None),
        "check (25 m PFM)": (["check", small_pfm], None),
        "load (default)": (["load", sample, "-o", out], clean),
        "load --serial": (["load", sample, "-o", out, "-q", "--serial"], clean),
        "load --workers 2": (["load", sample, "-o", out, "-q", "--workers", "2"], clean),
    }


def _argv(args) -> list[str]:
    if args is None:
        return [sys.executable, "-c", "pass"]
    return [sys.executable, "-c", _CLI, *map(str, args)]


def _summary(runs: list[dict]) -> dict:
    walls = [r["wall"] for r in runs]
    kernels = [r["kernels"] for r in runs if r.get("kernels") is not None]
    phases = [r["phases"] for r in runs if r.get("phases")]
    return {"wall_best_s": min(walls), "wall_median_s": statistics.median(walls),
            "cpu_best_s": min(r["cpu"] for r in runs), "runs": len(runs),
            "kernels_best_s": min(kernels) if kernels else None,
            # each phase's best over the runs (a load's report timings, wall seconds)
            "phases_best_s": ({k: min(p[k] for p in phases if k in p)
                               for k in _PHASES if any(k in p for p in phases)}
                              if phases else None),
            "exit_codes": sorted({r["rc"] for r in runs}), "imported": runs[-1]["imported"],
            "said": runs[-1]["said"][:1]}


def _break_even(over_s: float) -> dict:
    """Input size where the second worker's per-MB saving (bench_load) pays ``over_s``."""
    import json

    out = {}
    for name in ("bench_load", "bench_load_filters"):
        try:
            r = json.loads((BENCH_DIR / "results" / f"{name}.json").read_text())["results"]
        except (OSError, ValueError, KeyError):
            continue
        mb = r["gsf_bytes"] / 1e6
        save = (r["modes"]["serial"]["wall_s"] - r["modes"]["dask_2_workers"]["wall_s"]) / mb
        out[name] = {"saving_s_per_mb": save,
                     "break_even_mb": over_s / save if save > 0 else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another copy of the package to time too")
    ap.add_argument("--sample", type=Path, default=SAMPLES / EX1811)
    ap.add_argument("--only", nargs="*", help="case names to run (default: all)")
    ap.add_argument("--results-dir", type=Path)
    a = ap.parse_args(argv)
    if not a.sample.is_file():
        print(f"bench_startup: no sample at {a.sample} (PFM_DASK_GSF_SAMPLES)", file=sys.stderr)
        return 2
    trees = {"ours": BENCH_DIR.parent}
    if a.baseline is not None:
        trees["baseline"] = a.baseline.resolve()
    work = Path(tempfile.mkdtemp(prefix="bench-startup-"))
    try:
        small_pfm, big_pfm = work / "small.pfm", work / "big.pfm"
        for pfm, extra in ((small_pfm, ["--bin-size", "25"]), (big_pfm, [])):
            made = _run(_argv(["load", a.sample, "-o", pfm, "-q", "--serial", *extra]),
                        _env(trees["ours"]), cwd=work)
            if made["rc"] != 0:
                raise SystemExit(f"could not make {pfm}: {made['stderr']}")
        cases = _cases(work, a.sample, small_pfm, big_pfm)
        if a.only:
            cases = {k: v for k, v in cases.items() if k in a.only or k == "python -c pass"}
        runs: dict = {t: {k: [] for k in cases} for t in trees}
        for rep in range(a.repeats + 1):          # repeat 0 warms the caches, unmeasured
            for name, (args, before) in cases.items():
                for tree, root in trees.items():
                    r = _run(_argv(args), _env(root), before, cwd=work)
                    if r["stderr"]:
                        print(f"{tree} {name}: exit {r['rc']}\n{r['stderr']}", file=sys.stderr)
                    if rep:
                        runs[tree][name].append(r)
            print(f"repeat {rep}/{a.repeats} done", file=sys.stderr)
        results: dict = {"sample": a.sample.name, "sample_bytes": a.sample.stat().st_size,
                         "repeats": a.repeats, "load_avg_1m_at_end": os.getloadavg()[0]}
        for tree in trees:
            summ = {k: _summary(v) for k, v in runs[tree].items()}
            floor = summ["python -c pass"]["wall_best_s"]
            for s in summ.values():
                s["over_floor_x"] = s["wall_best_s"] / floor if floor else None
            results[tree] = summ
        ours = results["ours"]
        if "load --workers 2" in ours and "load --serial" in ours:
            over = ours["load --workers 2"]["wall_median_s"] - ours["load --serial"]["wall_median_s"]
            results["cluster_overhead_s"] = over
            results["break_even"] = _break_even(over)
        from pfm_dask.pipeline import SMALL_LOAD_BYTES, SMALL_LOAD_BYTES_SWATH

        results["small_load_bytes"] = {"plain": SMALL_LOAD_BYTES, "swath": SMALL_LOAD_BYTES_SWATH}
        write_results("bench_startup", results, results_dir=a.results_dir)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
