"""Dask's allocator setting for workers, measured: ``MALLOC_TRIM_THRESHOLD_=65536`` against none.

Dask starts worker processes with ``MALLOC_TRIM_THRESHOLD_=65536``
(``distributed.nanny.pre-spawn-environ``), which turns off glibc's adaptive mmap threshold: every
array over 128 kB becomes a fresh mapping, zeroed on first touch. Two measurements:

* ``piece_cost``: the same pieces prepared (``prepare_piece``) in two child processes, one with
  the variable set and one without; user and system CPU seconds and minor page faults. CPU
  counts and page faults hardly depend on what else runs on the machine.
* ``interleaved_loads``: the Dask runs of one cell with workers started each way, alternating,
  so that drift in the machine's load hits both alike.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["piece_cost", "interleaved_loads", "without_trim"]

TRIM = "65536"


def without_trim() -> dict:
    """Dask's pre-spawn environment for workers, minus ``MALLOC_TRIM_THRESHOLD_``."""
    import dask
    import distributed  # noqa: F401 - loads the distributed config defaults

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {})
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    return env


def _child(job_text: str) -> None:
    from pfm_dask import pipeline
    from pfm_dask.soundings import prepare_piece

    from .run import _cfg

    job = json.loads(job_text)
    cfg = _cfg(job["setup"], job["bin_size"])
    scans = [pipeline.prescan_file(p) for p in job["paths"]]
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    prepare_piece(pieces[0], grid, cfg)  # imports and first-call costs, not counted
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for p in pieces:
        prepare_piece(p, grid, cfg)
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    print(json.dumps({"user_s": r1.ru_utime - r0.ru_utime, "sys_s": r1.ru_stime - r0.ru_stime,
                      "minor_faults": r1.ru_minflt - r0.ru_minflt, "wall_s": t1 - t0,
                      "pieces": len(pieces)}))


def piece_cost(paths, setup: str, bin_size: float, rounds: int = 2) -> dict:
    """CPU seconds and page faults of preparing the same pieces with and without the setting."""
    root = str(Path(__file__).resolve().parent.parent)
    job = json.dumps({"paths": [str(p) for p in paths], "setup": setup, "bin_size": bin_size})
    out = {"with_trim": [], "without_trim": []}
    for _ in range(rounds):
        for key in out:
            env = dict(os.environ)
            env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            env.pop("MALLOC_TRIM_THRESHOLD_", None)
            if key == "with_trim":
                env["MALLOC_TRIM_THRESHOLD_"] = TRIM
            proc = subprocess.run([sys.executable, "-m", "benchmarks.alloc", "--child", job],
                                  env=env, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"allocator child failed:\n{proc.stderr[-3000:]}")
            out[key].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    summary = {}
    for key, runs in out.items():
        best = min(runs, key=lambda r: r["user_s"] + r["sys_s"])
        summary[key] = dict(best, cpu_s=best["user_s"] + best["sys_s"])
    w, wo = summary["with_trim"], summary["without_trim"]
    return {"files": len(paths), "setup": setup, "runs": out, "best": summary,
            "cpu_ratio": w["cpu_s"] / wo["cpu_s"] if wo["cpu_s"] else None,
            "sys_ratio": w["sys_s"] / wo["sys_s"] if wo["sys_s"] else None,
            "fault_ratio": (w["minor_faults"] / wo["minor_faults"]) if wo["minor_faults"] else None}


def _with_trim():
    """Workers started from now on get ``MALLOC_TRIM_THRESHOLD_=65536`` (Dask's default).

    Set in this process's environment, which spawned workers inherit whether or not the
    pipeline drops the variable from Dask's pre-spawn settings.
    """
    os.environ["MALLOC_TRIM_THRESHOLD_"] = TRIM


def _without_trim():
    import dask

    os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
    return dask.config.set({"distributed.nanny.pre-spawn-environ": without_trim()})


def interleaved_loads(paths, cfg, repeat: int, work: Path, one_run, median_run) -> dict:
    """The 1- and 2-worker loads, workers started with and without the setting, alternating."""
    saved = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    runs = {v: {"dask_1": [], "dask_2": []} for v in ("with_trim", "without_trim")}
    try:
        for r in range(repeat):
            for key in ("dask_1", "dask_2"):
                for variant in runs:
                    if variant == "with_trim":
                        _with_trim()
                        one = one_run(paths, key, cfg, work)
                    else:
                        with _without_trim():
                            one = one_run(paths, key, cfg, work)
                    runs[variant][key].append(one)
                    print(f"allocator {variant:12s} run {r + 1}/{repeat} {key}: "
                          f"{one['wall_s']:7.1f} s  cpu {one['cpu_s']:7.1f} s", flush=True)
    finally:
        os.environ.pop("MALLOC_TRIM_THRESHOLD_", None)
        if saved is not None:
            os.environ["MALLOC_TRIM_THRESHOLD_"] = saved
    return {v: {k: median_run(x) for k, x in m.items()} for v, m in runs.items()}


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        sys.exit("internal: python -m benchmarks.alloc --child JOB (the runner calls it)")
