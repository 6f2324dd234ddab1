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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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
    """SHA-256 of the .bin and .cvg (holes read as zeros)."""
    h = hashlib.sha256()
    stem = Path(str(path) + ".data") / path.name
    for ext in (".bin", ".cvg"):
        with open(str(stem) + ext, "rb") as fh:
            for blk in iter(lambda: fh.read(64 << 20), b""):
                h.update(blk)
    return h.hexdigest()


_RUNNER = r"""
import json, os, sys, tempfile, time
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
t = time.perf_counter()
if op == "check":
    out = [str(p) for p in pfm.check(path, threads=threads)]
else:
    with pfm.open_pfm(path, "r+") as f:
        if op == "recompute":          # as the load's final step: the header takes the extrema
            out = pfm.recompute(f, None, threads=threads)
            f.write_header(**out)
        else:
            out = pfm.recompute(f, np.load(touched), threads=threads)
print(json.dumps({"seconds": time.perf_counter() - t, "result": repr(out)}))
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
    a = ap.parse_args(argv)
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
