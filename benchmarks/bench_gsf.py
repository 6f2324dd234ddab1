"""GSF read speed: our numpy reader against gsfpy (libgsf), same files, same process, one core.

Both readers turn every ping of every file into numpy arrays of the same quantities: depth,
across- and along-track distance, beam flags, and latitude, longitude and time per sounding.
The input is a synthetic EM302-like survey (``pfm_dask.synth``) of at least ``--mb`` megabytes,
generated once and cached in ``benchmarks/_data/``. The files are read once before timing so
both readers start from the page cache; then each reader runs ``--runs`` times, alternating, and
the median and best soundings per second are reported with their ratio (target: ours ≥ 3×).

    python -m benchmarks.bench_gsf [--quick] [--mb 200] [--runs 3]
    python -m benchmarks.bench_gsf --real [--quick] [--mb 100] [--runs 3]

``--real`` reads a file of at least ``--mb`` MB made of the real EX1811 EM302 sample's ping
records instead (``benchmarks.real_gsf``: the 50 pings repeated with shifted times and
positions, every subrecord as recorded, layouts changing from ping to ping). gsfpy reads
depth, across- and along-track and beam flags, ``read_pings`` decodes every column; the
ratio of best times (best of ``--runs``) is the target (≥ 3×). Before timing, the four
arrays are checked equal, value for value, between the two readers. Without the sample it
says why and skips. Results: ``bench_gsf_real.json``.

``--quick`` uses a tiny input and one run so that it finishes in seconds (CI keeps it working);
its results go to ``bench_gsf[_real]_quick.json`` so they never overwrite a real run.
"""

from __future__ import annotations

import argparse
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
QUANTITIES = ("depth", "across_track", "along_track", "beam_flags", "latitude", "longitude",
              "time")
#: what the real-file run asks of gsfpy (the issue's baseline): the per-beam arrays only
REAL_QUANTITIES = ("depth", "across_track", "along_track", "beam_flags")


def read_ours(paths, quantities=QUANTITIES, *, keep: bool = False) -> dict:
    """Our reader: every file into numpy arrays of the benchmark's quantities.

    ``read_pings`` decodes every column of the schema whatever is asked; ``keep`` returns
    the arrays of the last file too (for the equality check)."""
    from pfm_dask.gsf import read_pings

    n, checksum = 0, 0.0
    for path in paths:
        t = read_pings(path)
        cols = {c: t.column(c).to_numpy() for c in quantities}
        n += len(cols["depth"])
        checksum += float(cols["depth"].sum())
    return {"soundings": n, "depth_sum": checksum, **({"arrays": cols} if keep else {})}


def read_gsfpy(paths, quantities=QUANTITIES, *, keep: bool = False) -> dict:
    """gsfpy (libgsf 3.08): the same arrays, one file open at a time (P2), lat/lon unswapped (P1).

    Only ``quantities`` are copied out of each ping (the per-ping ones only if asked)."""
    from gsfpy import open_gsf
    from gsfpy3_08 import GsfException

    n, checksum = 0, 0.0
    as_array = np.ctypeslib.as_array
    per_ping = any(q in quantities for q in ("latitude", "longitude", "time"))
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
                if per_ping:
                    lat.append(m.longitude)      # P1: gsfpy's fields are swapped
                    lon.append(m.latitude)
                    tim.append(m.ping_time.tv_sec + m.ping_time.tv_nsec * 1e-9)
        cnt = np.array(counts)
        cols = {"depth": np.concatenate(depth), "across_track": np.concatenate(across),
                "along_track": np.concatenate(along), "beam_flags": np.concatenate(flags)}
        if per_ping:
            cols.update({"latitude": np.repeat(np.array(lat), cnt),
                         "longitude": np.repeat(np.array(lon), cnt),
                         "time": np.repeat(np.array(tim), cnt)})
        n += len(cols["depth"])
        checksum += float(cols["depth"].sum())
    return {"soundings": n, "depth_sum": checksum, **({"arrays": cols} if keep else {})}


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


def measure(paths, runs: int, *, with_gsfpy: bool = True, quantities=QUANTITIES) -> dict:
    """Time both readers ``runs`` times (alternating); soundings/s median and best."""
    from functools import partial

    readers = {"ours": partial(read_ours, quantities=quantities)}
    if with_gsfpy:
        readers["gsfpy"] = partial(read_gsfpy, quantities=quantities)
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
    ap.add_argument("--real", action="store_true",
                    help="read a file made of the real EX1811 EM302 ping records instead")
    ap.add_argument("--mb", type=float, default=None,
                    help="input size in MB (default 200 synthetic, 100 real)")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per reader (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR, help="cache for generated surveys")
    ap.add_argument("--results-dir", type=Path, default=None, help="default benchmarks/results")
    args = ap.parse_args(argv)
    if args.mb is None:
        args.mb = 100.0 if args.real else 200.0
    if args.quick:
        args.mb, args.runs = (2.0 if args.real else 0.6), 1
    _one_core()
    try:
        import gsfpy  # noqa: F401
        with_gsfpy = True
    except ImportError:
        with_gsfpy = False
        print("gsfpy is not installed: measuring our reader only")
    if args.real:
        return main_real(args, with_gsfpy)

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


def same_arrays(path) -> dict:
    """Both readers' depth, across, along and beam flags of ``path``, compared value for value
    (untimed): the benchmark refuses to time readers that disagree."""
    ours = read_ours([path], REAL_QUANTITIES, keep=True)["arrays"]
    theirs = read_gsfpy([path], REAL_QUANTITIES, keep=True)["arrays"]
    for q in REAL_QUANTITIES:
        if not np.array_equal(ours[q], theirs[q]):
            raise SystemExit(f"{q}: read_pings and gsfpy disagree on {path}")
    return {"checked": list(REAL_QUANTITIES), "values": int(len(ours["depth"])) * len(ours)}


def main_real(args, with_gsfpy: bool) -> int:
    """The ``--real`` run: the real-derived file, read_pings (all columns) against gsfpy."""
    from benchmarks import real_gsf

    got = real_gsf.cached_file(args.mb, data_dir=args.data_dir)
    if got is None:
        print(f"skipped: the real sample {real_gsf.SAMPLE_NAME} is not in "
              f"{real_gsf.samples_dir()} (set PFM_DASK_GSF_SAMPLES)")
        return 0
    path, built = got
    _warm([path])
    check = same_arrays(path) if with_gsfpy else None
    res = measure([path], args.runs, with_gsfpy=with_gsfpy, quantities=REAL_QUANTITIES)
    from pfm_dask import gsf

    with gsf.GsfFile(path) as f:
        n_pings = f.n_pings
    results = {
        "input": {"path": str(path), "bytes": path.stat().st_size, "pings": n_pings,
                  "soundings": res["soundings"], "sample": real_gsf.SAMPLE_NAME,
                  "made_by": "benchmarks.real_gsf: the sample's 50 ping records repeated, "
                             "time and latitude shifted per repetition"},
        "quantities_gsfpy": list(REAL_QUANTITIES),
        "ours_decodes": "every column of pfm_dask.gsf.SOUNDING_SCHEMA",
        "equality_check": check, "one_core": True, **res,
    }
    if "gsfpy" in res:
        results["target_best_ratio"] = 3.0
    name = "bench_gsf_real_quick" if args.quick else "bench_gsf_real"
    write_results(name, results, results_dir=args.results_dir)
    if "speedup_best" in res:
        print(f"real-derived file, {results['input']['bytes'] / 1e6:.0f} MB, {n_pings:,} pings: "
              f"read_pings best {res['ours']['best_s']:.3f} s, gsfpy best "
              f"{res['gsfpy']['best_s']:.3f} s: {res['speedup_best']:.2f}x (best of "
              f"{res['runs']}; median {res['speedup_median']:.2f}x; target >= 3x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
