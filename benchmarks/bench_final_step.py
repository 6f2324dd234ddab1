"""The final step (recompute and check) on a sparse grid: a few survey lines in a big MBR.

A load at 2 m bins over deep water makes a grid of hundreds of millions of bins of which a few
per cent get soundings: the ``.bin`` and ``.cvg`` are sparse files, holes wherever no sounding
went. The benchmark writes such a PFM straight through the writer (``PfmFile.add_sorted``):
``--bins`` bins (default 356 M, a square grid of 2 m bins) and ``--soundings`` soundings (default
8 M) along ``--lines`` slanted survey lines ``--swath`` bins wide, crossing the grid from south to
north. It then times, on ``--threads`` threads (default 2), what the load's final step runs:
``recompute(f, None)`` (a new PFM), ``recompute(f, touched)`` (an append that touched the bins of
a tenth of the rows) and ``check``, each by this code and by the code of ``--baseline`` (default:
the commit before the final step skipped holes, extracted with ``git archive`` under
``benchmarks/_data``), alternating, ``--repeat`` times each (default 2), every run in a fresh,
warmed-up process; the best of each counts and their ratio is measured in the same run. Both
codes must return the same extrema and problems and leave the same bytes (asserted); a byte
planted in an empty record inside the holes must be found.

    python -m benchmarks.bench_final_step [--bins 356000000] [--soundings 8000000] [--quick]

``--quick`` (4 M bins, 200,000 soundings, swaths of 100 bins, one repeat) runs in a minute; its results go to
``bench_final_step_quick.json``. The machine may be shared: the load average is recorded.

``--survey`` measures the final step of a real load instead: the Pfm_loader survey of
``benchmarks/datasets.py`` (the first ``--files`` of its 74 files, 50 m bins), for each of
``--setups`` (``none``: no filter; ``area``: the area filter), two ``--serial`` loads in this
process, alternating: one as the CLI runs it (the final step on one thread: the baseline),
one whose final step (area filter, recompute, check) runs on ``--threads`` threads, as on a
disk node. Each phase's time and thread count, and the final step as a percentage of the
serial load's wall time, measured in the same run; both loads must leave the same bytes.

    python -m benchmarks.bench_final_step --survey [--files 74] [--setups none,area] [--data DIR]

Results go to ``bench_final_step_survey.json``.

``--survey --pfm PATH`` times the final step's phases on a PFM already loaded without filters
(``pfm-dask load <the 74 files> -o PATH --serial --bin-size 50``; keep it under /tmp, it is
3 GB): the area filter (the writer's step, every bin with data touched; its redo file is
compared, not applied), the recompute with the header, the check, and ``final``: the
writer's recompute, header and check in a row (where the code has it, one walk of the chains
for both: ``recompute(walk=)``, ``check(walked=)``), each by this code and by the code of
``--baseline`` (default f3ca986), alternating, for each of ``--thread-counts``
(default 1,2), every run in a fresh warmed-up process: wall time, CPU seconds and the phase's
peak RSS (VmHWM, reset when the phase starts). Both codes must give the same redo file,
summary, extrema, problems and bytes. The final step without filters is ``final``, with the
area filter ``area`` + ``final``; percentages refer to ``--load-s`` (default: the PFM's load
report, compile time taken out). Results go to ``bench_final_step_pfm.json``.

    python -m benchmarks.bench_final_step --survey --pfm /tmp/x.pfm [--thread-counts 2] [--load-s 95.1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks._report import BENCH_DIR, DATA_DIR, remove_pfm, write_results
from benchmarks.bench_pfm_write import make_grid, sounding_fields


def build(path: Path, n_bins: int, soundings: int, lines: int, swath: int, seed: int = 0) -> dict:
    """A new PFM of about ``n_bins`` 2 m bins with ``soundings`` soundings along ``lines`` survey
    lines ``swath`` bins wide (a fresh load's bytes before its final step); returns its facts."""
    from pfm_dask import pfm

    remove_pfm(path)
    grid = make_grid(n_bins)
    W, H = grid.width, grid.height
    swath = min(swath, W // max(1, lines))
    rng = np.random.default_rng(seed)
    per_row = max(1, soundings // (lines * H))
    # line k starts at column x0[k] on row 0 and drifts east by `drift` columns over the grid
    x0 = (np.arange(lines) * (W // max(1, lines))).astype(np.int64)
    drift = max(0, W // max(1, lines) - swath)
    opts = dict(bin_size_m=2.0, max_files=20, max_lines=20, max_pings=200_000, max_beams=432)
    t0 = time.perf_counter()
    f = pfm.create(str(path), grid, **opts)
    f.add_files([f"line_{i:02d}.gsf" for i in range(20)])
    f.add_lines([f"line {i}" for i in range(20)])
    written = 0
    rows_per_call = max(1, 2_000_000 // (per_row * lines))
    try:
        for r0 in range(0, H, rows_per_call):
            r1 = min(H, r0 + rows_per_call)
            rows = np.repeat(np.arange(r0, r1, dtype=np.int64), per_row * lines)
            k = np.tile(np.repeat(np.arange(lines), per_row), r1 - r0)
            start = x0[k] + rows * drift // H
            cols = start + rng.integers(0, swath, rows.size)
            b = np.sort(rows * W + cols)
            f.add_sorted(**sounding_fields(rng, b, files=20, lines=20, depth=(3000.0, 5000.0)))
            written += b.size
    finally:
        f.close(durable=True)     # written out before anything is timed
    return {"grid": f"{W} x {H}", "bins": W * H, "soundings": written, "lines": lines,
            "swath_bins": swath, "build_s": time.perf_counter() - t0}


def _disk_use(path: Path) -> dict:
    d = Path(str(path) + ".data")
    out = {}
    for p in d.iterdir():
        st = p.stat()
        out[p.suffix[1:]] = {"bytes": st.st_size, "allocated": st.st_blocks * 512}
    return out


def _digest(path: Path) -> str:
    """SHA-256 of the .bin and .cvg with holes read as zeros: every aligned 1 MiB block that
    holds data and is not all zero, with its place (only the allocated parts are read, so a
    sparse 14 GB .bin costs what it holds)."""
    h = hashlib.sha256()
    stem = Path(str(path) + ".data") / path.name
    blk = 1 << 20
    for ext in (".bin", ".cvg"):
        fd = os.open(str(stem) + ext, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            h.update(f"{ext} {size}".encode())
            pos = 0
            while pos < size:
                try:
                    start = os.lseek(fd, pos, os.SEEK_DATA)
                    end = os.lseek(fd, start, os.SEEK_HOLE)
                except OSError:          # no more data (ENXIO), or no SEEK_DATA: read it all
                    start, end = (pos, size) if pos == 0 and not hasattr(os, "SEEK_DATA") else (size, size)
                b = start // blk * blk
                while b < end:
                    data = os.pread(fd, min(blk, size - b), b)
                    if data.strip(b"\0"):
                        h.update(b.to_bytes(8, "little"))
                        h.update(data)
                    b += blk
                pos = max(end, b)
        finally:
            os.close(fd)
    return h.hexdigest()


_RUNNER = r"""
import json, os, resource, sys, tempfile, time
import numpy as np
from pfm_dask import pfm
from pfm_dask.bins import BinGrid
op, path, threads, touched = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
with tempfile.TemporaryDirectory() as d:     # warm-up (numba kernels), not timed
    g = BinGrid.from_mbr(30.0, -80.0, 30.0006, -79.9993, bin_size_m=10.0)
    f = pfm.create(os.path.join(d, "w.pfm"), g)
    f.add_files(["a"]); f.add_lines(["a"])
    n = 50
    b = np.sort(np.arange(n) % (g.width * g.height))
    z = np.zeros(n, np.uint32)
    f.add_sorted(b, z, z, z + 1, (z + 1).astype(np.uint16), np.full(n, 100.0), z.astype(np.uint16),
                 z.astype(np.uint16), z + 64, np.ones(n, np.float32), np.ones(n, np.float32))
    f.write_header(**pfm.recompute(f, None, threads=threads))
    pfm.recompute(f, b[::2], threads=threads)
    f.close()
    pfm.check(os.path.join(d, "w.pfm"), threads=threads)
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def hwm_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) / 1024
    return None
try:                                   # the phase's own peak (Linux): reset it now
    open("/proc/self/clear_refs", "w").write("5")
except OSError:
    pass
if op == "area":                       # the writer's area filter step, redo file not applied
    from pfm_dask._writer_area import run_area_filter
    from pfm_dask.config import LoadConfig
    f = pfm.open_pfm(path, "r")
    t_bins = np.zeros(f.width * f.height, dtype=bool)   # a new PFM: every bin with data
    for recs in f.bin_records_with_data(fields=("num_soundings",)):
        t_bins[recs["bin_index"]] = recs["num_soundings"] > 0
t, c = time.perf_counter(), cpu()
if op == "check":
    out = [str(p) for p in pfm.check(path, threads=threads)]
elif op == "area":
    summary, redo = run_area_filter(f, t_bins, LoadConfig(bin_size_m=float(f.grid.bin_size_xy),
                                    area_filter=True), touched, threads)
    out = (summary, redo["count"], redo["crc"])
    f.close()
elif op == "final":                    # the writer's recompute, header and check
    try:                               # one walk of the chains for both, where the code has it
        from pfm_dask.pfm._chains import ChainWalk
        w = {"walk": ChainWalk()}
    except ImportError:
        w = {}
    with pfm.open_pfm(path, "r+") as f:
        ext = pfm.recompute(f, None, threads=threads, **w)
        f.write_header(**ext)
    probs = pfm.check(path, threads=threads, **({"walked": w["walk"]} if w else {}))
    out = (ext, [str(p) for p in probs])
else:
    with pfm.open_pfm(path, "r+") as f:
        if op == "recompute":          # as the load's final step: the header takes the extrema
            out = pfm.recompute(f, None, threads=threads)
            f.write_header(**out)
        else:
            out = pfm.recompute(f, np.load(touched), threads=threads)
print(json.dumps({"seconds": time.perf_counter() - t, "cpu_s": cpu() - c, "peak_rss_mb": hwm_mb(),
                  "result": repr(out)}))
"""


def baseline_tree(rev: str) -> tuple[Path, str]:
    """The package as of commit ``rev``, extracted (``git archive``) under ``benchmarks/_data``."""
    root = BENCH_DIR.parent
    sha = subprocess.run(["git", "rev-parse", rev], cwd=root, check=True, capture_output=True,
                         text=True).stdout.strip()
    d = DATA_DIR / f"baseline-{sha[:12]}"
    if not (d / "pfm_dask" / "__init__.py").is_file():
        d.mkdir(parents=True, exist_ok=True)
        arch = subprocess.run(["git", "archive", sha, "pfm_dask"], cwd=root, check=True,
                              capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(d)], input=arch, check=True)
    return d, sha


def default_baseline() -> str:
    """The commit before the one that made the final step skip holes (``pfm/_sparse.py``)."""
    out = subprocess.run(["git", "log", "--format=%H", "--diff-filter=A", "--",
                          "pfm_dask/pfm/_sparse.py"], cwd=BENCH_DIR.parent, check=True,
                         capture_output=True, text=True).stdout.split()
    return (out[-1] + "^") if out else "HEAD"


def _timed(tree: Path, op: str, path: Path, threads: int, touched: Path) -> dict:
    """One run of ``op`` by the package in ``tree``, in a fresh process (warmed up, not timed)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    r = subprocess.run([sys.executable, "-c", _RUNNER, op, str(path), str(threads), str(touched)],
                       env=env, check=True, capture_output=True, text=True, cwd=str(tree))
    return json.loads(r.stdout.strip().splitlines()[-1])


def run(n_bins: int, soundings: int, lines: int, swath: int, threads: int, repeat: int,
        work: Path, baseline: str) -> dict:
    from pfm_dask import pfm

    work.mkdir(parents=True, exist_ok=True)
    old_tree, old_sha = baseline_tree(baseline)
    new_tree = BENCH_DIR.parent
    path = work / "final.pfm"
    facts = build(path, n_bins, soundings, lines, swath)
    with pfm.open_pfm(str(path)) as f:   # an append's touched bins: those of a tenth of the rows
        b = f.read_soundings(0, max(1, f.height // 10), fields=("bin_index",))["bin_index"]
    touched_path = work / "touched.npy"
    np.save(touched_path, np.unique(b))
    # the first recompute is the load's (it writes the statistics); untimed: then both codes
    # meet the same bytes
    first = _timed(new_tree, "recompute", path, threads, touched_path)
    digest = _digest(path)
    ops = ("recompute", "recompute_touched", "check")
    times = {op: {"new": [], "old": []} for op in ops}
    results = {}
    for _ in range(repeat):
        for code, tree in (("old", old_tree), ("new", new_tree)):
            for op in ops:
                r = _timed(tree, op, path, threads, touched_path)
                times[op][code].append(r["seconds"])
                results.setdefault(op, set()).add(r["result"])
                assert _digest(path) == digest, f"{code} {op} changed the bytes"
    for op, seen in results.items():
        assert len(seen) == 1, f"{op}: the old and new code disagree: {seen}"
    assert results["check"] == {"[]"}, results["check"]
    # damage inside the sparse region: the count of an empty bin far from every line
    with pfm.open_pfm(str(path)) as f:
        W, H, hs, bs = f.width, f.height, f.bin_header_size, f.bin_record_size
    bin_file = Path(str(path) + ".data") / (path.name + ".bin")
    with open(bin_file, "r+b") as fh:
        fh.seek(hs + ((H // 2) * W + W - 1) * bs)
        fh.write(b"\x01")
    found = pfm.check(str(path), threads=threads)
    assert any(p.where == f"bin ({W - 1}, {H // 2})" for p in found), found
    out = dict(facts, threads=threads, repeat=repeat, baseline_commit=old_sha,
               first_recompute_s=first["seconds"], touched_bins=int(np.unique(b).size),
               disk=_disk_use(path), damage_found=str(found[0]),
               load_average_1m=os.getloadavg()[0])
    for op, v in times.items():
        best_new, best_old = min(v["new"]), min(v["old"])
        out[op] = {"new_s": best_new, "old_s": best_old, "speedup": best_old / best_new, "runs": v}
    remove_pfm(path)
    touched_path.unlink(missing_ok=True)
    return out


def _sha_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for blk in iter(lambda: fh.read(64 << 20), b""):
            h.update(blk)
    return h.hexdigest()


def run_pfm(path: Path, thread_counts, repeat: int, baseline: str, load_s: float | None,
            ops=("area", "recompute", "check", "final")) -> dict:
    """The final step's phases on a loaded PFM (module doc, ``--pfm``): area filter (its
    redo file, not applied), recompute + header, check; by this code and ``baseline``'s,
    alternating, each run in a fresh warmed-up process; wall, CPU and the phase's peak RSS.
    Both codes must give the same redo file, summary, extrema, problems and bytes."""
    old_tree, old_sha = baseline_tree(baseline)
    new_tree = BENCH_DIR.parent
    redo = Path(str(path) + ".bench-redo")
    digest = _digest(path)
    ops = tuple(ops)
    runs: dict = {op: {} for op in ops}
    seen: dict = {op: set() for op in ops}
    if "area" in ops:
        seen["area_redo"] = set()
    for _ in range(repeat):
        for n in thread_counts:
            for code, tree in (("old", old_tree), ("new", new_tree)):
                for op in ops:
                    r = _timed(tree, op, path, n, redo)
                    runs[op].setdefault(f"{code}_{n}", []).append(r)
                    seen[op].add(r.pop("result"))
                    if op == "area":
                        seen["area_redo"].add(_sha_file(redo))
                    assert _digest(path) == digest, f"{code} {op} changed the bytes"
    redo.unlink(missing_ok=True)
    for op, v in seen.items():
        assert len(v) == 1, f"{op}: the old and new code disagree: {v}"
    assert seen.get("check", {"[]"}) == {"[]"}, seen["check"]
    assert all(x.endswith("[])") for x in seen.get("final", ())), seen["final"]
    out = {"pfm": str(path), "baseline_commit": old_sha, "thread_counts": list(thread_counts),
           "repeat": repeat, "serial_load_s": load_s, "load_average_1m": os.getloadavg()[0],
           "area_filter": next(iter(seen.get("area", ())), None), "phases": {}, "final_step": {}}
    for op, by in runs.items():
        out["phases"][op] = {}
        for key, rs in by.items():
            best = min(rs, key=lambda r: r["seconds"])
            out["phases"][op][key] = {"wall_s": best["seconds"], "cpu_s": best["cpu_s"],
                                      "peak_rss_mb": max(r["peak_rss_mb"] or 0 for r in rs),
                                      "runs_s": [r["seconds"] for r in rs]}
    for setup, phases in (("none", ("final",)), ("area", ("area", "final"))):
        if not set(phases) <= set(ops):
            continue
        for key in runs[phases[0]]:
            wall = sum(out["phases"][op][key]["wall_s"] for op in phases)
            cpu = sum(out["phases"][op][key]["cpu_s"] for op in phases)
            row = {"wall_s": wall, "cpu_s": cpu,
                   "peak_rss_mb": max(out["phases"][op][key]["peak_rss_mb"] for op in phases)}
            if load_s:
                row["pct_of_serial_load"] = 100.0 * wall / load_s
            out["final_step"].setdefault(setup, {})[key] = row
    for setup, by in out["final_step"].items():
        for n in thread_counts:
            old, new = by.get(f"old_{n}"), by.get(f"new_{n}")
            if old and new:
                by[f"speedup_{n}"] = {"wall": old["wall_s"] / new["wall_s"],
                                      "cpu": old["cpu_s"] / new["cpu_s"]}
    return out


#: The issue's targets: the final step as a share of the serial load, on 2 threads.
TARGET_PCT = {"none": 5.0, "area": 10.0}
_PHASES = ("area_filter", "recompute", "check")


def _serial_load(paths, cfg, out: Path, final_threads: int | None) -> dict:
    """A ``--serial`` load of ``paths`` into ``out``; with ``final_threads`` its final step runs
    on that many threads (the writer's ``threads``, set when the load phase is over)."""
    from pfm_dask import pipeline
    from pfm_dask.writer import PfmWriter

    remove_pfm(out)
    orig = PfmWriter.finish

    def finish(self):
        self.threads = final_threads or 1     # None: one thread (the CLI's --final-threads 1)
        return orig(self)

    PfmWriter.finish = finish
    try:
        t = time.perf_counter()
        res = pipeline.run_load(paths, out, cfg, mode="serial")
        wall = time.perf_counter() - t
    finally:
        PfmWriter.finish = orig
    if res.exit_code != 0:
        raise SystemExit(f"load failed:\n{res.summary()}")
    tm = res.timings
    return {"wall_s": wall, "threads": final_threads or 1,
            "phases_s": {k: float(tm.get(k, 0.0)) for k in ("prescan", "load", "final") + _PHASES}}


def _digest_all(path: Path) -> str:
    """SHA-256 of every part of a PFM but the header's creation date."""
    h = hashlib.sha256()
    stem = Path(str(path) + ".data") / path.name
    for ext in (".bin", ".ndx", ".cvg", ".lin", ".ctl"):
        with open(str(stem) + ext, "rb") as fh:
            if ext == ".bin":
                h.update(re.sub(rb"\[DATE\] = [^\n]*", b"[DATE]", fh.read(131072)))
            for blk in iter(lambda: fh.read(64 << 20), b""):
                h.update(blk)
    return h.hexdigest()


def run_survey(folder: Path, files: int, setups, threads: int, bin_size: float, work: Path,
               repeat: int = 1) -> dict:
    """The final step of real ``--serial`` loads, one thread against ``threads`` (module doc)."""
    from benchmarks.datasets import load_files
    from pfm_dask.config import LoadConfig

    work.mkdir(parents=True, exist_ok=True)
    paths = load_files(folder, files)
    # untimed: one file, so that both loads meet loaded kernels
    _serial_load(paths[:1], LoadConfig(bin_size_m=bin_size, area_filter=True), work / "warm.pfm", None)
    remove_pfm(work / "warm.pfm")
    out = {"survey": str(folder), "files": files, "gsf_bytes": sum(p.stat().st_size for p in paths),
           "bin_size_m": bin_size, "threads": threads, "repeat": repeat, "setups": {}}
    for setup in setups:
        cfg = LoadConfig(bin_size_m=bin_size, area_filter=(setup == "area"))
        runs = {"serial": [], "threads": []}
        digests = set()
        for _ in range(repeat):
            for key, n in (("serial", None), ("threads", threads)):
                pfm_path = work / f"survey_{setup}.pfm"
                runs[key].append(_serial_load(paths, cfg, pfm_path, n))
                digests.add(_digest_all(pfm_path))
        assert len(digests) == 1, f"{setup}: the final step's thread count changed the bytes"
        remove_pfm(work / f"survey_{setup}.pfm")
        base = min(runs["serial"], key=lambda r: r["wall_s"])
        best = min(runs["threads"], key=lambda r: sum(r["phases_s"][k] for k in _PHASES))
        final_1 = sum(base["phases_s"][k] for k in _PHASES)
        final_n = sum(best["phases_s"][k] for k in _PHASES)
        out["setups"][setup] = {
            "serial_load_s": base["wall_s"],
            "final_step_1_thread_s": final_1,
            f"final_step_{threads}_threads_s": final_n,
            "phases_1_thread_s": {k: base["phases_s"][k] for k in _PHASES},
            f"phases_{threads}_threads_s": {k: best["phases_s"][k] for k in _PHASES},
            "final_pct_of_serial_1_thread": 100.0 * final_1 / base["wall_s"],
            f"final_pct_of_serial_{threads}_threads": 100.0 * final_n / base["wall_s"],
            "target_pct": TARGET_PCT.get(setup),
            "runs": runs,
        }
    out["load_average_1m"] = os.getloadavg()[0]
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bins", type=int, default=356_000_000)
    ap.add_argument("--soundings", type=int, default=8_000_000)
    ap.add_argument("--lines", type=int, default=4)
    ap.add_argument("--swath", type=int, default=1000, help="line width in bins")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=None, help="runs of each path (default 2, 1 quick)")
    ap.add_argument("--quick", action="store_true", help="4 M bins, 200,000 soundings, 100-bin swaths")
    ap.add_argument("--baseline", default=None,
                    help="git revision of the code to compare with (default: the commit before "
                         "the final step skipped holes)")
    ap.add_argument("--work", type=Path, default=BENCH_DIR / "_work", help="directory for the files")
    ap.add_argument("--survey", action="store_true",
                    help="the final step of real --serial loads of the Pfm_loader survey")
    ap.add_argument("--files", type=int, default=74, help="with --survey: the first N files")
    ap.add_argument("--setups", default="none,area", help="with --survey: none,area")
    ap.add_argument("--bin-size", type=float, default=50.0, help="with --survey: bin size (m)")
    ap.add_argument("--data", type=Path, default=None,
                    help="with --survey: the survey's folder (default: benchmarks.datasets')")
    ap.add_argument("--pfm", type=Path, default=None,
                    help="with --survey: time the final step's phases on this loaded PFM (no "
                         "filter) instead of loading, this code against --baseline")
    ap.add_argument("--thread-counts", default="1,2", help="with --pfm: thread counts")
    ap.add_argument("--ops", default="area,recompute,check,final",
                    help="with --pfm: the phases to time (area, recompute, check, final)")
    ap.add_argument("--load-s", type=float, default=None,
                    help="with --pfm: the --serial load's wall time the percentages refer to "
                         "(default: the PFM's load report, compile time taken out)")
    a = ap.parse_args(argv)
    if a.survey and a.pfm is not None:
        load_s = a.load_s
        rep = Path(str(a.pfm) + ".data") / "load-report.json"
        if load_s is None and rep.is_file():
            tm = json.loads(rep.read_text()).get("timings", {})
            load_s = tm.get("total", 0.0) - tm.get("compile", 0.0) or None
        counts = [int(x) for x in a.thread_counts.split(",") if x]
        res = run_pfm(a.pfm, counts, max(1, a.repeat or 1), a.baseline or "f3ca986", load_s,
                      [x for x in a.ops.split(",") if x])
        res["command"] = (f"python -m benchmarks.bench_final_step --survey --pfm {a.pfm}"
                          f" --thread-counts {a.thread_counts} --ops {a.ops}"
                          + (f" --repeat {a.repeat}" if a.repeat else "")
                          + (f" --baseline {a.baseline}" if a.baseline else "")
                          + (f" --load-s {a.load_s}" if a.load_s else ""))
        write_results("bench_final_step_pfm", res)
        for setup, by in res["final_step"].items():
            for key, r in by.items():
                if key.startswith("speedup"):
                    print(f"{setup} {key}: wall {r['wall']:.2f}x, CPU {r['cpu']:.2f}x")
                else:
                    pct = f", {r['pct_of_serial_load']:.1f} % of the load" if "pct_of_serial_load" in r else ""
                    print(f"{setup} {key}: {r['wall_s']:.2f} s wall, {r['cpu_s']:.2f} CPU-s, "
                          f"peak RSS {r['peak_rss_mb']:.0f} MB{pct}")
        return res
    if a.survey:
        from benchmarks.datasets import DEFAULT_GB, pings_for, survey

        folder = a.data or survey(pings_for(DEFAULT_GB))
        setups = [x for x in a.setups.split(",") if x]
        res = run_survey(folder, a.files, setups, a.threads, a.bin_size, a.work,
                         max(1, a.repeat or 1))
        res["command"] = ("python -m benchmarks.bench_final_step --survey"
                          + (f" --files {a.files}" if a.files != 74 else "")
                          + (f" --setups {a.setups}" if a.setups != "none,area" else "")
                          + (f" --repeat {a.repeat}" if a.repeat else ""))
        write_results("bench_final_step_survey", res)
        for setup, r in res["setups"].items():
            print(f"{setup}: serial load {r['serial_load_s']:.1f} s; final step "
                  f"{r['final_step_1_thread_s']:.2f} s on 1 thread "
                  f"({r['final_pct_of_serial_1_thread']:.1f} %), "
                  f"{r[f'final_step_{a.threads}_threads_s']:.2f} s on {a.threads} "
                  f"({r[f'final_pct_of_serial_{a.threads}_threads']:.1f} %; target "
                  f"{r['target_pct']} %)", flush=True)
        return res
    n_bins, n_snd = (4_000_000, 200_000) if a.quick else (a.bins, a.soundings)
    swath = min(a.swath, 100) if a.quick else a.swath
    repeat = max(1, a.repeat if a.repeat is not None else (1 if a.quick else 2))
    res = run(n_bins, n_snd, a.lines, swath, a.threads, repeat, a.work,
              a.baseline or default_baseline())
    res["command"] = "python -m benchmarks.bench_final_step" + (
        " --quick" if a.quick else f" --bins {n_bins} --soundings {n_snd}") + \
        (f" --repeat {repeat}" if a.repeat is not None else "")
    write_results("bench_final_step_quick" if a.quick else "bench_final_step", res)
    shutil.rmtree(a.work / "final.pfm.data", ignore_errors=True)
    return res


if __name__ == "__main__":
    main()
