"""GSF read speed: our numpy reader against gsfpy (libgsf), same files, same process, one core.

Both readers turn every ping of every file into numpy arrays of the same quantities: depth,
across- and along-track distance, beam flags, and latitude, longitude and time per sounding.
The input is a synthetic EM302-like survey (``pfm_dask.synth``) of at least ``--mb`` megabytes,
generated once and cached in ``benchmarks/_data/``. The files are read once before timing so
both readers start from the page cache; then each reader runs ``--runs`` times, alternating, and
the median and best soundings per second are reported with their ratio (target: ours ≥ 3×).

    python -m benchmarks.bench_gsf [--quick] [--mb 200] [--runs 3]

``--quick`` uses a tiny survey and one run so that it finishes in seconds (CI keeps it working);
its results go to ``bench_gsf_quick.json`` so they never overwrite a real run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks._report import DATA_DIR, cached_survey, write_results

BYTES_PER_PING_ESTIMATE = 8_000   # 432 beams with travel time and beam angle: ~8.3 kB


# ---------------------------------------------------------------------------------- input
def survey(mb: float, *, seed: int = 0, pings_per_file: int = 2000, beams: int = 432,
           data_dir: Path = DATA_DIR, quiet: bool = False) -> tuple[Path, list[Path], dict]:
    """A cached synthetic survey of at least ``mb`` megabytes: (directory, files, survey.json)."""
    from pfm_dask import synth

    pings = max(1, min(pings_per_file, math.ceil(mb * 1e6 / BYTES_PER_PING_ESTIMATE)))
    files = max(1, math.ceil(mb * 1e6 / (pings * BYTES_PER_PING_ESTIMATE)))
    out = Path(data_dir) / f"gsf_{files}x{pings}x{beams}_seed{seed}"
    meta = cached_survey(out, files, pings, beams, seed)
    if meta is None:
        if not quiet:
            print(f"generating {files} files × {pings} pings × {beams} beams in {out} …", flush=True)
        if out.exists():
            shutil.rmtree(out)
        s = synth.generate(out, files=files, pings=pings, beams=beams, seed=seed,
                           workers=min(2, os.cpu_count() or 1) if mb >= 50 else 1)
        if not quiet:
            print(f"  {s['bytes'] / 1e6:.1f} MB in {s['elapsed_s']:.2f} s "
                  f"({s['mb_per_s']:.0f} MB/s)", flush=True)
        meta = cached_survey(out, files, pings, beams, seed)
        meta["generation"] = {"elapsed_s": s["elapsed_s"], "mb_per_s": s["mb_per_s"]}
    paths = [out / f["name"] for f in meta["files"]]
    return out, paths, meta


# ---------------------------------------------------------------------------------- readers
def read_ours(paths) -> dict:
    """Our reader: every file into numpy arrays of the benchmark's quantities."""
    from pfm_dask.gsf import read_pings

    n, checksum = 0, 0.0
    for path in paths:
        t = read_pings(path)
        cols = {c: t.column(c).to_numpy() for c in ("depth", "across_track", "along_track",
                                                    "beam_flags", "latitude", "longitude", "time")}
        n += len(cols["depth"])
        checksum += float(cols["depth"].sum())
    return {"soundings": n, "depth_sum": checksum}


def read_gsfpy(paths) -> dict:
    """gsfpy (libgsf 3.08): the same arrays, one file open at a time (P2), lat/lon unswapped (P1)."""
    from gsfpy import open_gsf
    from gsfpy3_08 import GsfException

    n, checksum = 0, 0.0
    as_array = np.ctypeslib.as_array
    for path in paths:
        depth, across, along, flags, counts, lat, lon, tim = [], [], [], [], [], [], [], []
        with open_gsf(str(path)) as f:
            while True:
                try:
                    rid, rec = f.read()
                except GsfException as err:
                    if err.error_code != -23:   # GSF_READ_TO_END_OF_FILE
                        raise
                    break
                if rid.recordID != 2:
                    continue
                m = rec.mb_ping
                nb = m.number_beams
                depth.append(as_array(m.depth, (nb,)).copy())
                across.append(as_array(m.across_track, (nb,)).copy())
                along.append(as_array(m.along_track, (nb,)).copy())
                flags.append(as_array(m.beam_flags, (nb,)).copy())
                counts.append(nb)
                lat.append(m.longitude)      # P1: gsfpy's fields are swapped
                lon.append(m.latitude)
                tim.append(m.ping_time.tv_sec + m.ping_time.tv_nsec * 1e-9)
        cnt = np.array(counts)
        cols = {"depth": np.concatenate(depth), "across_track": np.concatenate(across),
                "along_track": np.concatenate(along), "beam_flags": np.concatenate(flags),
                "latitude": np.repeat(np.array(lat), cnt), "longitude": np.repeat(np.array(lon), cnt),
                "time": np.repeat(np.array(tim), cnt)}
        n += len(cols["depth"])
        checksum += float(cols["depth"].sum())
    return {"soundings": n, "depth_sum": checksum}


def _one_core() -> None:
    """Keep Arrow (and BLAS, if anything uses it) on one thread: we compare single cores."""
    try:
        import pyarrow as pa

        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
    except Exception:  # noqa: BLE001 - older pyarrow: it only matters for fairness
        pass


def _warm(paths) -> None:
    for p in paths:
        with open(p, "rb") as fh:
            while fh.read(1 << 24):
                pass


def measure(paths, runs: int, *, with_gsfpy: bool = True) -> dict:
    """Time both readers ``runs`` times (alternating); soundings/s median and best."""
    readers = {"ours": read_ours}
    if with_gsfpy:
        readers["gsfpy"] = read_gsfpy
    times = {k: [] for k in readers}
    cpu = {k: [] for k in readers}
    counts = {}
    for fn in readers.values():          # untimed warm-up: imports, first-call costs
        fn(paths[:1])
    for _ in range(runs):
        for name, fn in readers.items():
            c0, t0 = time.process_time(), time.perf_counter()
            got = fn(paths)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            counts[name] = got
    n = counts["ours"]["soundings"]
    out = {"soundings": n, "runs": runs}
    for name in readers:
        if counts[name]["soundings"] != n:
            raise SystemExit(f"{name} read {counts[name]['soundings']:,} soundings, ours {n:,}")
        if not math.isclose(counts[name]["depth_sum"], counts["ours"]["depth_sum"], rel_tol=1e-9):
            raise SystemExit(f"{name} and ours disagree on the depths (sum "
                             f"{counts[name]['depth_sum']!r} vs {counts['ours']['depth_sum']!r})")
        med, best = statistics.median(times[name]), min(times[name])
        cmed = statistics.median(cpu[name])
        out[name] = {"seconds": times[name], "median_s": med, "best_s": best,
                     "soundings_per_s_median": n / med, "soundings_per_s_best": n / best,
                     # CPU time resists other jobs on a shared machine (both readers use 1 thread)
                     "cpu_seconds": cpu[name], "soundings_per_cpu_s_median": n / cmed}
    if "gsfpy" in readers:
        o, g = out["ours"], out["gsfpy"]
        out["speedup_median"] = o["soundings_per_s_median"] / g["soundings_per_s_median"]
        out["speedup_best"] = o["soundings_per_s_best"] / g["soundings_per_s_best"]
        out["speedup_cpu_median"] = o["soundings_per_cpu_s_median"] / g["soundings_per_cpu_s_median"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_gsf", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny input, one run (seconds; for CI)")
    ap.add_argument("--mb", type=float, default=200.0, help="survey size in MB (default 200)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per reader (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR, help="cache for generated surveys")
    ap.add_argument("--results-dir", type=Path, default=None, help="default benchmarks/results")
    args = ap.parse_args(argv)
    if args.quick:
        args.mb, args.runs = 0.6, 1
    _one_core()
    try:
        import gsfpy  # noqa: F401
        with_gsfpy = True
    except ImportError:
        with_gsfpy = False
        print("gsfpy is not installed: measuring our reader only")

    pings_per_file = 40 if args.quick else 2000
    folder, paths, meta = survey(args.mb, seed=args.seed, pings_per_file=pings_per_file,
                                 data_dir=args.data_dir)
    total = sum(p.stat().st_size for p in paths)
    _warm(paths)
    res = measure(paths, args.runs, with_gsfpy=with_gsfpy)
    results = {
        "input": {"directory": str(folder), "files": len(paths), "bytes": total,
                  "pings": meta["pings"], "beams": meta["beams"], "soundings": res["soundings"]},
        "quantities": ["depth", "across_track", "along_track", "beam_flags", "latitude",
                       "longitude", "time"],
        "one_core": True, **res,
    }
    if "generation" in meta:
        results["synth_generation"] = meta["generation"]
    for name in ("ours", "gsfpy"):
        if name in res:
            results[name]["mb_per_s_median"] = total / 1e6 / res[name]["median_s"]

    def bars(ax):
        names = [n for n in ("ours", "gsfpy") if n in res]
        med = [res[n]["soundings_per_s_median"] / 1e6 for n in names]
        best = [res[n]["soundings_per_s_best"] / 1e6 for n in names]
        x = np.arange(len(names))
        ax.bar(x - 0.2, med, 0.4, label="median")
        ax.bar(x + 0.2, best, 0.4, label="best")
        ax.set_xticks(x, ["pfm_dask.gsf.read_pings" if n == "ours" else "gsfpy 2.0.0 (libgsf 3.08)"
                          for n in names])
        ax.set_ylabel("million soundings / s (one core)")
        title = f"GSF read, {total / 1e6:.0f} MB, {res['soundings'] / 1e6:.1f} M soundings"
        if "speedup_median" in res:
            title += f": {res['speedup_median']:.1f}× faster"
        ax.set_title(title)
        ax.legend()

    name = "bench_gsf_quick" if args.quick else "bench_gsf"
    write_results(name, results, plots={"rates": bars}, results_dir=args.results_dir)
    if "speedup_median" in res:
        print(f"ours {res['ours']['soundings_per_s_median'] / 1e6:.2f} M soundings/s, gsfpy "
              f"{res['gsfpy']['soundings_per_s_median'] / 1e6:.2f} M soundings/s: "
              f"{res['speedup_median']:.1f}× (best of {res['runs']}: {res['speedup_best']:.1f}×, "
              f"CPU time: {res['speedup_cpu_median']:.1f}×; target ≥ 3×)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
