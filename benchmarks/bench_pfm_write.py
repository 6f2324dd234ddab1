"""PFM write speed: soundings sorted by bin into a new PFM v7, against plain sequential writes.

The PFM writer (``PfmFile.add_sorted``) bit-packs soundings into physical records and bin
records; the question is whether that packing keeps up with the disk. The benchmark writes
``--soundings`` soundings (default 50 million, ~10-30 per bin over a square grid of 2 m bins)
into a new PFM in batches of ``--batch`` soundings, each batch a band of bins sorted by bin as
a tiling writer would deliver them, then closes the PFM with fsync. In the same run it writes
the same number of bytes (the ``.ndx`` plus the header and bin records written to ``.bin``) with
plain 4 MiB ``os.write`` calls and fsync; PFM and plain writes alternate, twice each, and the
best of each counts (both meet the same page-cache state), and it reports
both rates and their ratio (target >= 0.8: the PFM writer limited by the disk, not by
packing); with ``--repeat`` (default 3) the whole comparison runs several times and the run
with the median ratio is reported, all runs listed under ``repeats``. The writer's own phase
timings (``PfmFile.timings``) say where the time goes (plots ``_rates.png``, ``_phases.png``).

    python -m benchmarks.bench_pfm_write [--soundings 50000000] [--batch 4000000] [--repeat 3] [--quick]
    python -m benchmarks.bench_pfm_write --load-pieces [--files 74] [--bin-size 50] [--threads 1] [--baseline DIR]

``--load-pieces`` measures the writer as a real load drives it: the pieces a ``--serial`` load of
the first ``--files`` lines of the benchmark survey (``benchmarks.datasets``) hands to the writer
are recorded once under ``--work`` (Arrow IPC files), then replayed into a fresh ``PfmWriter``
with its journal on, each piece copied into memory before its (timed) hand-over; the writer's
busy throughput (``.ndx`` + ``.bin`` bytes over its ``write`` time, as ``benchmarks.run``
reports it) is compared with plain writes of the same bytes in the same run, with the writer's
and the store's phase timings (results ``bench_pfm_write_pieces_<N>f.json``). With ``--baseline DIR``
(a checkout of another commit, e.g. ``git worktree add --detach /tmp/base <commit>``) that
checkout's writer replays the same pieces in a subprocess after each of this one's runs, and
the ratios of their write and thread-CPU times are reported. ``--group-sweep 128MiB,256MiB``
replays the pieces with each group budget in turn, ``--repeat`` rounds interleaved in one
process, and reports each budget's medians against the first (results
``bench_pfm_write_groups_<N>f.json``): what memory buys the writer (docs/performance.md).

Sounding values are generated once per batch shape (random, in range) and reused for every
band, shifted to its bins, all before timing, so generation is not timed. Neither is the
one-time warm-up (``warm_up_s``: importing numba and loading the cached bit-packing kernels,
or compiling them on the first run after a change, then writing a tiny PFM). ``--quick``
writes 300,000 soundings in seconds; its results go to ``bench_pfm_write_quick.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from benchmarks._report import BENCH_DIR, write_results

CHUNK = 4 << 20


def make_grid(n_bins: int):
    """A roughly square grid of 2 m bins with at least ``n_bins`` bins, near 30 N."""
    from pfm_dask.bins import BinGrid

    side = math.ceil(math.sqrt(n_bins))
    # one 2 m bin is about 1.8e-5 deg of latitude and 2.07e-5 deg of longitude at 30 N
    return BinGrid.from_mbr(30.0, -88.8, 30.0 + side * 1.8043e-5 - 1e-7, -88.8 + side * 2.0752e-5 - 1e-7,
                            bin_size_m=2.0)


def make_band(rng, n_bins: int, mean_per_bin: int, spread: int) -> dict:
    """Soundings for ``n_bins`` consecutive bins starting at 0, sorted by bin, in the types the
    load hands to the writer (``soundings.BATCH_SCHEMA``; file and line numbers as uint32)."""
    counts = rng.integers(mean_per_bin - spread, mean_per_bin + spread + 1, n_bins)
    return sounding_fields(rng, np.repeat(np.arange(n_bins, dtype=np.int64), counts))


def sounding_fields(rng, b: np.ndarray, *, files: int = 500, lines: int = 5000,
                    depth: tuple = (5.0, 3000.0)) -> dict:
    """Random sounding fields (in range) for the sorted bins ``b``, as ``make_band`` returns."""
    n = b.size
    u32, u16 = np.uint32, np.uint16
    return dict(
        bin_index=b,
        file=rng.integers(0, files, n, dtype=u32), line=rng.integers(0, lines, n, dtype=u32),
        ping=rng.integers(1, 200_000, n, dtype=u32), beam=rng.integers(1, 433, n, dtype=u16),
        depth=np.round(rng.uniform(*depth, n), 2),
        x_off=rng.integers(0, 4096, n, dtype=u16), y_off=rng.integers(0, 4096, n, dtype=u16),
        validity=rng.choice(np.array([64, 64, 64, 66, 2 | 4096 | 64], dtype=u32), n),
        horizontal_error=np.round(rng.uniform(0.5, 5.0, n), 2).astype(np.float32),
        vertical_error=np.round(rng.uniform(0.1, 2.0, n), 2).astype(np.float32))


def sequential_write(path: Path, nbytes: int) -> dict:
    """Plain buffered sequential writes of ``nbytes`` (4 MiB per os.write) plus fsync."""
    buf = np.random.default_rng(1).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            n = os.write(fd, buf[: min(CHUNK, left)])
            left -= n
        t1 = time.perf_counter()
        os.fsync(fd)
    finally:
        os.close(fd)
    t2 = time.perf_counter()
    os.remove(path)
    return {"seconds": t2 - t0, "write_s": t1 - t0, "fsync_s": t2 - t1, "mb_per_s": nbytes / (t2 - t0) / 1e6}


def run(soundings: int, batch: int, per_bin: int, spread: int, work: Path, seed: int = 0) -> dict:
    from pfm_dask import pfm
    from pfm_dask.pfm._bitpack import load_kernels

    # numba import and kernel load (or first compile) once per process, not timed with the writes
    kernels_s = load_kernels()

    work.mkdir(parents=True, exist_ok=True)
    path = work / "bench.pfm"
    for p in (path, Path(str(path) + ".data")):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)

    bins_total = max(1, soundings // per_bin)
    grid = make_grid(bins_total)
    bins_per_band = max(1, batch // per_bin)
    rng = np.random.default_rng(seed)
    band = make_band(rng, bins_per_band, per_bin, spread)
    band_n = band["bin_index"].size
    n_bands = math.ceil(soundings / band_n)
    if n_bands * bins_per_band > grid.width * grid.height:
        grid = make_grid(n_bands * bins_per_band)

    tmp = work / "seq.bin"
    opts = dict(bin_size_m=2.0, max_files=500, max_lines=5000, max_pings=200_000, max_beams=432)
    # warm-up, not timed: a tiny PFM with the same record layout (first calls of everything)
    t = time.perf_counter()
    warm = work / "warm.pfm"
    with pfm.create(str(warm), grid, **opts) as w:
        w.add_sorted(**{k: v[:1000] for k, v in band.items()})
    shutil.rmtree(str(warm) + ".data", ignore_errors=True)
    warm.unlink(missing_ok=True)
    kernels_s += time.perf_counter() - t

    def write_pfm() -> dict:
        """One timed PFM write of ``calls`` into a new file (removed afterwards)."""
        for p in (path, Path(str(path) + ".data")):
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        f = pfm.create(str(path), grid, **opts)
        f.add_files([f"line_{i:04d}.gsf" for i in range(500)])
        written = 0
        cpu0 = time.process_time()
        t0 = time.perf_counter()
        for args in calls:
            f.add_sorted(**args)
            written += args["bin_index"].size
        t_add = time.perf_counter() - t0
        f.close(durable=True)
        t_total = time.perf_counter() - t0
        out = {"seconds": t_total, "add_sorted_s": t_add, "close_fsync_s": t_total - t_add,
               "cpu_s": time.process_time() - cpu0, "written": written,
               "timings": {k: round(v, 4) for k, v in f.timings.items() if k != "add_soundings"},
               "sizes": {p: os.path.getsize(os.path.join(str(path) + ".data", f"bench.pfm.{p}"))
                         for p in ("ndx", "bin", "cvg")},
               "header": {k: getattr(f.header, k) for k in (
                   "depth_bits", "file_number_bits", "line_number_bits", "ping_number_bits",
                   "beam_number_bits", "horizontal_error_bits", "vertical_error_bits")}}
        out["header"].update(bin_record_bytes=f.bin_record_size, ndx_record_bytes=f.ndx_record_size,
                             grid=f"{grid.width} x {grid.height}")
        shutil.rmtree(str(path) + ".data", ignore_errors=True)
        path.unlink(missing_ok=True)
        return out

    # the calls' arguments, made before timing (each band's bin indices shifted to its bins)
    calls = []
    planned = 0
    for k in range(n_bands):
        take = min(band_n, soundings - planned)
        if take <= 0:
            break
        end = take
        if take < band_n:   # last band: whole bins only
            end = int(np.searchsorted(band["bin_index"], band["bin_index"][take - 1], side="right"))
        args = {key: v[:end] for key, v in band.items()}
        args["bin_index"] = band["bin_index"][:end] + k * bins_per_band
        calls.append(args)
        planned += end

    # PFM and plain writes alternate, twice each, and the best of each counts: both then
    # meet the same page-cache state (on this VM the first touch of fresh page-cache memory
    # is several times slower than reusing pages a removed file freed; a plain run right
    # after a PFM run paid for that, and one PFM run against the best of two plain ones
    # compared a cold writer with a warm one).
    pfm_runs, base_runs = [], []
    nbytes = None
    for _ in range(2):
        one = write_pfm()
        pfm_runs.append(one)
        if nbytes is None:
            sizes = one["sizes"]
            # the .bin is sparse until written: count only what add_sorted wrote (all bins it touched)
            touched_bin_bytes = n_bands * bins_per_band * one["header"]["bin_record_bytes"]
            nbytes = sizes["ndx"] + min(sizes["bin"], touched_bin_bytes + 131072)
        base_runs.append(sequential_write(tmp, nbytes))
    best = min(pfm_runs, key=lambda r: r["seconds"])
    base_s = min(r["seconds"] for r in base_runs)
    t_total, t_add, cpu, written = best["seconds"], best["add_sorted_s"], best["cpu_s"], best["written"]
    timings, sizes, header = best["timings"], best["sizes"], best["header"]
    pfm_mb_s = nbytes / t_total / 1e6
    base_mb_s = nbytes / base_s / 1e6
    return {
        "soundings": written,
        "bins_written": min(n_bands * bins_per_band, grid.width * grid.height),
        "mean_soundings_per_bin": written / max(1, n_bands * bins_per_band),
        "batch_soundings": band_n,
        "bytes_compared": nbytes,
        "file_sizes": sizes,
        "layout": header,
        "pfm": {"seconds": t_total, "add_sorted_s": t_add, "close_fsync_s": t_total - t_add,
                "cpu_s": cpu, "mb_per_s": pfm_mb_s, "soundings_per_s": written / t_total},
        "sequential": {"best_seconds": base_s, "mb_per_s": base_mb_s, "soundings_per_s": written / base_s,
                       "runs": base_runs},
        "pfm_runs_s": [r["seconds"] for r in pfm_runs],
        "ratio_pfm_to_sequential": pfm_mb_s / base_mb_s,
        "writer_phases_s": timings,
        "warm_up_s": kernels_s,
        "load_average_1m_at_end": os.getloadavg()[0],
    }


# --------------------------------------------------------------------------- --load-pieces
# The writer as a real load drives it: the pieces a `--serial` load of a survey hands to the
# writer, recorded once (prepared by the load's own task code), then replayed into a fresh
# PfmWriter from memory, with the disk's raw write of the same bytes measured in the same run.


def record_pieces(folder: Path, files: int, bin_size: float, work: Path, quiet: bool = False):
    """The prepared pieces of a ``--serial`` load of the first ``files`` lines of ``folder`` at
    ``bin_size`` m, cached as Arrow IPC files under ``work`` (made on first use). Returns
    (directory, grid, config, input paths, pieces)."""
    import json
    import pickle

    import pyarrow as pa

    from benchmarks import datasets
    from pfm_dask import pipeline
    from pfm_dask.config import LoadConfig
    from pfm_dask.soundings import prepare_piece

    paths = [str(p) for p in datasets.load_files(folder, files)]
    cfg = LoadConfig(bin_size_m=bin_size)
    out = work / f"pieces_{Path(folder).name}_{files}f_{bin_size:g}m"
    plan = out / "plan.pkl"
    if plan.exists():
        with open(plan, "rb") as fh:
            grid, pieces = pickle.load(fh)
        return out, grid, cfg, paths, pieces
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t = time.perf_counter()
    scans = [pipeline.prescan_file(p) for p in paths]
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    for p in pieces:
        pp = prepare_piece(p, grid, cfg)
        for name, table in (("batch", pa.Table.from_batches([pp.batch], schema=pp.batch.schema)),
                            ("pings", pp.pings)):
            with pa.OSFile(str(out / f"{p.seq:05d}.{name}.arrow"), "wb") as sink:
                with pa.ipc.new_file(sink, table.schema) as w:
                    w.write_table(table)
        (out / f"{p.seq:05d}.json").write_text(json.dumps(
            {"counts": pp.counts, "damage": pp.damage, "timings": pp.timings}, default=str))
        if not quiet:
            print(f"  recorded piece {p.seq + 1}/{len(pieces)} ({pp.batch.num_rows:,} soundings)",
                  flush=True)
    with open(plan, "wb") as fh:
        pickle.dump((grid, pieces), fh)
    if not quiet:
        print(f"recorded {len(pieces)} pieces in {time.perf_counter() - t:.0f} s: {out}", flush=True)
    return out, grid, cfg, paths, pieces


def _load_piece(folder: Path, piece):
    """A recorded piece back in memory (copied out of the file: the writer gets fresh memory)."""
    import json

    import pyarrow as pa

    from pfm_dask.soundings import PreparedPiece

    def read(name):
        with pa.memory_map(str(folder / f"{piece.seq:05d}.{name}.arrow")) as src:
            t = pa.ipc.open_file(src).read_all()
        return pa.concat_tables([t]).combine_chunks()

    batch = read("batch")
    batches = batch.to_batches()
    rb = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=batch.schema)
    # a deep copy, so that the replay does not read the mapped file
    rb = pa.RecordBatch.from_arrays([pa.array(c.to_numpy(zero_copy_only=False).copy())
                                     for c in rb.columns], schema=rb.schema)
    meta = json.loads((folder / f"{piece.seq:05d}.json").read_text())
    return PreparedPiece(piece, rb, read("pings"), meta["counts"], meta["damage"], meta["timings"])


def replay_pieces(folder: Path, grid, cfg, paths, pieces, work: Path, *, threads: int = 1,
                  journal: bool = True, group_bytes: int = 0) -> dict:
    """One replay of the recorded pieces into a new PFM through ``PfmWriter`` as ``--serial``
    drives it (each piece put, then ``write_ready``; ``threads`` pack threads, the journal on;
    ``group_bytes`` overrides the writer's group budget when not 0); returns the writer's busy
    time and phases, and the PFM's sizes."""
    from pfm_dask.writer import PfmWriter

    path = work / "replay.pfm"
    for p in (path, Path(str(path) + ".data")):
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
    static = {"cfg": {}, "inputs": [{"path": p} for p in paths]} if journal else None
    w = PfmWriter(path, grid, cfg, paths, len(pieces), journal=static, threads=threads)
    if group_bytes:
        w.group_bytes = group_bytes
    busy = 0.0
    try:
        for p in pieces:
            held = _load_piece(folder, p)
            t0 = time.perf_counter()
            w.put(held)
            w.write_ready()
            busy += time.perf_counter() - t0
            del held
        t0 = time.perf_counter()
        w.pfm.flush()
        flush_s = time.perf_counter() - t0
        sizes = {k: os.path.getsize(os.path.join(str(path) + ".data", f"replay.pfm.{k}"))
                 for k in ("ndx", "bin")}
        touched = int(w.touched.sum())
        res = {"busy_s": busy, "write_s": w.timings["write"], "flush_s": flush_s,
               "write_cpu_s": w.timings["write_cpu"], "group_bytes": getattr(w, "group_bytes", None),
               "chunk_bytes": getattr(w, "chunk_bytes", None),
               "writer_timings": {k: round(v, 4) for k, v in w.timings.items()
                                  if not k.startswith("task_")},
               "store_timings": {k: round(v, 4) for k, v in w.pfm.timings.items()},
               "journal": w.journal_cost(), "sizes": sizes, "touched_bins": touched,
               "bin_record_bytes": w.pfm.bin_record_size, "soundings": w.soundings_written}
    finally:
        w.abort()
        shutil.rmtree(str(path) + ".data", ignore_errors=True)
        path.unlink(missing_ok=True)
    return res


def _recorded(a):
    """The survey's pieces recorded (once) and the kernels loaded, for ``--load-pieces``:
    (survey folder, recording folder, grid, config, input paths, pieces to replay)."""
    from benchmarks import datasets
    from pfm_dask.pfm._bitpack import load_kernels

    folder = a.survey or datasets.survey(datasets.pings_for(datasets.DEFAULT_GB))
    rec, grid, cfg, paths, pieces = record_pieces(Path(folder), a.files, a.bin_size, a.work)
    if a.pieces:
        pieces = pieces[:a.pieces]
    load_kernels()
    return folder, rec, grid, cfg, paths, pieces


def load_pieces_main(a) -> dict:
    """``--load-pieces``: replay a survey's recorded pieces, against raw writes in the same run."""
    folder, rec, grid, cfg, paths, pieces = _recorded(a)
    runs, raw, base_runs = [], [], []
    for _ in range(max(1, a.repeat or 2)):
        r = replay_pieces(rec, grid, cfg, paths, pieces, a.work, threads=a.threads,
                          journal=not a.no_journal, group_bytes=a.group_bytes)
        runs.append(r)
        # PFM bytes the writer wrote: the .ndx and the bin records of the bins it touched
        nbytes = r["sizes"]["ndx"] + r["touched_bins"] * r["bin_record_bytes"]
        raw.append(sequential_write(a.work / "seq.bin", nbytes))
        if a.baseline:
            base_runs.append(_baseline_replay(a, Path(folder)))
    best = min(runs, key=lambda r: r["write_s"])
    raw_mb_s = max(x["mb_per_s"] for x in raw)
    out_bytes = best["sizes"]["ndx"] + best["sizes"]["bin"]
    busy_mb_s = out_bytes / best["write_s"] / 1e6
    res = {"survey": str(folder), "files": a.files, "bin_size_m": a.bin_size,
           "writer_cpu_s": best["write_cpu_s"],
           "pieces": len(pieces), "threads": a.threads, "journal": not a.no_journal,
           "group_bytes": best["group_bytes"], "output_bytes": out_bytes,
           "writer_busy_mb_per_s": busy_mb_s, "raw_write_mb_per_s": raw_mb_s,
           "busy_fraction_of_raw_write": busy_mb_s / raw_mb_s,
           "best": best, "runs_write_s": [r["write_s"] for r in runs],
           "raw_runs": raw, "load_average_1m_at_end": os.getloadavg()[0]}
    if base_runs:
        b = min(base_runs, key=lambda r: r["write_s"])
        b_bytes = b["sizes"]["ndx"] + b["sizes"]["bin"]
        res["baseline"] = {"checkout": str(a.baseline), "best": b,
                           "runs_write_s": [r["write_s"] for r in base_runs],
                           "writer_busy_mb_per_s": b_bytes / b["write_s"] / 1e6,
                           "busy_fraction_of_raw_write": b_bytes / b["write_s"] / 1e6 / raw_mb_s}
        res["write_s_baseline_over_this"] = b["write_s"] / best["write_s"]
        res["write_cpu_baseline_over_this"] = b["write_cpu_s"] / best["write_cpu_s"]
    res["command"] = ("python -m benchmarks.bench_pfm_write --load-pieces"
                      f" --files {a.files} --bin-size {a.bin_size:g} --threads {a.threads}"
                      + (" --no-journal" if a.no_journal else "")
                      + (f" --pieces {a.pieces}" if a.pieces else "")
                      + (f" --group-bytes {a.group_bytes}" if a.group_bytes else "")
                      + (f" --baseline {a.baseline}" if a.baseline else ""))
    write_results(f"bench_pfm_write_pieces_{a.files}f" + (f"_{a.pieces}p" if a.pieces else ""), res,
                  results_dir=a.results_dir)
    return res


def group_sweep_main(a) -> dict:
    """``--group-sweep``: the same pieces replayed with each group budget, rounds interleaved."""
    import statistics

    from pfm_dask.config import parse_size

    budgets = [parse_size(x) for x in a.group_sweep.split(",") if x.strip()]
    folder, rec, grid, cfg, paths, pieces = _recorded(a)
    rounds = {g: [] for g in budgets}
    for i in range(max(1, a.repeat or 3)):
        for g in budgets:
            r = replay_pieces(rec, grid, cfg, paths, pieces, a.work, threads=a.threads,
                              journal=not a.no_journal, group_bytes=g)
            row = {"write_s": r["write_s"], "write_cpu_s": r["write_cpu_s"],
                   "tails_s": r["store_timings"].get("add_tails", 0.0),
                   "bins_read_s": r["store_timings"].get("add_bins_read", 0.0),
                   "merge_cpu_s": r["writer_timings"].get("merge_cpu", 0.0)}
            rounds[g].append(row)
            print(f"  round {i + 1}, groups of {g / 2**20:g} MiB: write {row['write_s']:.2f} s, "
                  f"writer thread {row['write_cpu_s']:.2f} CPU-s, tails {row['tails_s']:.2f} s",
                  flush=True)
    med = {g: {k: statistics.median(x[k] for x in rows) for k in rows[0]}
           for g, rows in rounds.items()}
    first = med[budgets[0]]
    res = {"survey": str(folder), "files": a.files, "bin_size_m": a.bin_size,
           "pieces": len(pieces), "threads": a.threads, "journal": not a.no_journal,
           "rounds": len(rounds[budgets[0]]),
           "budgets": [{"group_bytes": g, "median": med[g], "runs": rounds[g],
                        "write_speedup": first["write_s"] / med[g]["write_s"],
                        "cpu_speedup": first["write_cpu_s"] / med[g]["write_cpu_s"]}
                       for g in budgets],
           "load_average_1m_at_end": os.getloadavg()[0],
           "command": ("python -m benchmarks.bench_pfm_write --load-pieces"
                       f" --files {a.files} --bin-size {a.bin_size:g} --threads {a.threads}"
                       f" --group-sweep {a.group_sweep} --repeat {len(rounds[budgets[0]])}"
                       + (" --no-journal" if a.no_journal else "")
                       + (f" --pieces {a.pieces}" if a.pieces else ""))}
    write_results(f"bench_pfm_write_groups_{a.files}f", res, plots=_group_plots(res),
                  results_dir=a.results_dir)
    return res


def _group_plots(res: dict) -> dict:
    def times(ax):
        mib = [b["group_bytes"] / 2**20 for b in res["budgets"]]
        for key, label in (("write_s", "writing (s)"), ("write_cpu_s", "writer thread (CPU-s)"),
                           ("tails_s", "old tails (s)")):
            ax.plot(mib, [b["median"][key] for b in res["budgets"]], marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("group budget (MiB)")
        ax.set_ylabel("median of the rounds")
        ax.set_title(f"{res['files']} files, {res['pieces']} pieces, {res['threads']} thread(s)")
        ax.legend()
    return {"groups": times}


_BASELINE_SCRIPT = """
import json, sys
from pathlib import Path
from benchmarks import bench_pfm_write as B
from pfm_dask.pfm._bitpack import load_kernels
a = json.loads(sys.argv[1])
rec, grid, cfg, paths, pieces = B.record_pieces(Path(a["folder"]), a["files"], a["bin_size"],
                                                Path(a["work"]), quiet=True)
if a["pieces"]:
    pieces = pieces[:a["pieces"]]
load_kernels()
r = B.replay_pieces(rec, grid, cfg, paths, pieces, Path(a["work"]), threads=a["threads"],
                    journal=a["journal"])
print("RESULT " + json.dumps(r))
"""


def _baseline_replay(a, folder: Path) -> dict:
    """One replay of the same recorded pieces by the writer of the checkout ``a.baseline`` (its
    own package and benchmark, in a subprocess), as :func:`replay_pieces` reports it."""
    import json
    import subprocess
    import sys

    args = {"folder": str(folder), "files": a.files, "bin_size": a.bin_size, "work": str(a.work),
            "pieces": a.pieces, "threads": a.threads, "journal": not a.no_journal}
    env = dict(os.environ, PYTHONPATH=str(Path(a.baseline).resolve()))
    out = subprocess.run([sys.executable, "-c", _BASELINE_SCRIPT, json.dumps(args)], env=env,
                         cwd=str(Path(a.baseline).resolve()), capture_output=True, text=True,
                         check=True).stdout
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("RESULT "))[7:])


def _plots(res: dict) -> dict:
    """Rates of every repeat (PFM writer vs plain writes) and the median run's writer phases."""
    reps = res["repeats"]

    def rates(ax):
        x = range(len(reps))
        ax.bar([i - 0.2 for i in x], [r["pfm_mb_per_s"] for r in reps], width=0.4, label="PFM writer")
        ax.bar([i + 0.2 for i in x], [r["sequential_mb_per_s"] for r in reps], width=0.4,
               label="plain writes + fsync")
        for i, r in enumerate(reps):
            ax.text(i, max(r["pfm_mb_per_s"], r["sequential_mb_per_s"]), f"{r['ratio']:.2f}",
                    ha="center", va="bottom")
        ax.set_xticks(list(x), [f"run {i + 1}\nload {r['load_average_1m']:.1f}" for i, r in enumerate(reps)])
        ax.set_ylabel("MB/s")
        ax.set_title(f"{res['soundings']:,} soundings: PFM / plain = {res['ratio_median']:.2f} (median)")
        ax.legend()

    def phases(ax):
        ph = dict(res["writer_phases_s"], close_fsync=res["pfm"]["close_fsync_s"])
        names = [k for k, v in ph.items() if v > 0.001]
        ax.barh(names, [ph[k] for k in names])
        ax.set_xlabel("seconds (median run)")
        ax.set_title("where the PFM writer's time goes")

    return {"rates": rates, "phases": phases}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--soundings", type=int, default=50_000_000)
    ap.add_argument("--batch", type=int, default=4_000_000, help="soundings per add_sorted call")
    ap.add_argument("--per-bin", type=int, default=20, help="mean soundings per bin (spread +-10)")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs; the median ratio is reported (default 3, 1 with --quick)")
    ap.add_argument("--quick", action="store_true", help="300,000 soundings, done in seconds")
    ap.add_argument("--work", type=Path, default=BENCH_DIR / "_work", help="directory for the files")
    ap.add_argument("--results-dir", type=Path, default=None,
                    help="default benchmarks/results (an ad hoc run: elsewhere)")
    lp = ap.add_argument_group("--load-pieces: the writer fed a real load's pieces")
    lp.add_argument("--load-pieces", action="store_true",
                    help="replay the pieces of a --serial load of the benchmark survey")
    lp.add_argument("--survey", type=Path, default=None,
                    help="survey folder (default: benchmarks.datasets' 2 GB survey)")
    lp.add_argument("--files", type=int, default=74, help="first N lines of the survey")
    lp.add_argument("--bin-size", type=float, default=50.0, help="bin size, metres")
    lp.add_argument("--threads", type=int, default=1, help="writer threads (--serial: 1)")
    lp.add_argument("--no-journal", action="store_true", help="without crash safety")
    lp.add_argument("--pieces", type=int, default=0, help="replay only the first N pieces")
    lp.add_argument("--group-bytes", type=int, default=0,
                    help="the writer's group budget (default: its own, a quarter of the backlog)")
    lp.add_argument("--group-sweep", default="",
                    help="group budgets to replay in turn, e.g. 128MiB,256MiB,512MiB (rounds: "
                         "--repeat, default 3)")
    lp.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of another commit (e.g. a git worktree): its writer replays "
                         "the same pieces in a subprocess, interleaved with this one's runs")
    a = ap.parse_args(argv)
    if a.load_pieces and a.group_sweep:
        res = group_sweep_main(a)
        for b in res["budgets"]:
            m = b["median"]
            print(f"groups of {b['group_bytes'] / 2**20:g} MiB: write {m['write_s']:.2f} s "
                  f"({b['write_speedup']:.2f}x), writer thread {m['write_cpu_s']:.2f} CPU-s "
                  f"({b['cpu_speedup']:.2f}x), tails {m['tails_s']:.2f} s")
        return res
    if a.load_pieces:
        res = load_pieces_main(a)
        print(f"writer busy {res['writer_busy_mb_per_s']:.0f} MB/s, raw write "
              f"{res['raw_write_mb_per_s']:.0f} MB/s: {res['busy_fraction_of_raw_write']:.3f}")
        if "baseline" in res:
            print(f"baseline {res['baseline']['checkout']}: busy "
                  f"{res['baseline']['busy_fraction_of_raw_write']:.3f} of the raw write; write "
                  f"time baseline / this {res['write_s_baseline_over_this']:.2f}, thread CPU "
                  f"{res['write_cpu_baseline_over_this']:.2f}")
        return res
    n = 300_000 if a.quick else a.soundings
    batch = min(a.batch, 100_000) if a.quick else a.batch
    spread = max(0, min(10, a.per_bin - 1))
    repeat = max(1, a.repeat if a.repeat is not None else (1 if a.quick else 3))
    runs = [run(n, batch, a.per_bin, spread, a.work) for _ in range(repeat)]
    order = sorted(range(repeat), key=lambda i: runs[i]["ratio_pfm_to_sequential"])
    res = dict(runs[order[(repeat - 1) // 2]])          # the median run (lower median)
    res["ratio_median"] = res["ratio_pfm_to_sequential"]
    res["repeats"] = [{"ratio": r["ratio_pfm_to_sequential"], "pfm_seconds": r["pfm"]["seconds"],
                       "pfm_cpu_s": r["pfm"]["cpu_s"], "pfm_mb_per_s": r["pfm"]["mb_per_s"],
                       "sequential_seconds": r["sequential"]["best_seconds"],
                       "sequential_mb_per_s": r["sequential"]["mb_per_s"],
                       "load_average_1m": r["load_average_1m_at_end"]} for r in runs]
    res["command"] = "python -m benchmarks.bench_pfm_write" + (" --quick" if a.quick else
                                                               f" --soundings {n} --batch {batch}") \
        + (f" --repeat {repeat}" if a.repeat is not None else "")
    write_results("bench_pfm_write_quick" if a.quick else "bench_pfm_write", res, plots=_plots(res),
                  results_dir=a.results_dir)
    return res


if __name__ == "__main__":
    main()
