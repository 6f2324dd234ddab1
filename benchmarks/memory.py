"""Peak memory of the writer for growing inputs: it must stay flat at a fixed ``--max-backlog``.

Two measurements per input, both from outside the pipeline:

* ``--serial`` runs in a child process, which reports its own peak RSS (``VmHWM``) at the
  end: reader, writer and final step in one process.
* Dask with ``workers`` workers runs on a fresh embedded cluster (``make_local_cluster``, as
  ``pfm-dask load --workers N`` makes it); every worker reports its peak RSS at the end, and
  the one that held the writer actor (``LoadResult.writer_worker``) is the writer's figure.
  That worker also decodes pieces (on one machine the disk worker computes too), so the figure
  is an upper bound on the writer's own memory.

Both also sample the RSS every 20 ms, so the peak can be split into the load phase (pieces
streaming to the writer: bounded by ``--max-backlog``) and the final step (recompute, check).
The grid is fixed (``cfg.mbr``) for all sizes, so only the amount of input grows.

The first serial measurement of a process is preceded by one unmeasured run of the same load:
a fresh copy of the code (the runner's frozen snapshot) compiles its numba kernels into its
cache on first use, which costs ~60 MiB in that one process and would make the smallest input
look larger than the others. The Dask workers then load the compiled kernels from that cache.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from ._report import remove_pfm

__all__ = ["peak_rss_serial", "peak_rss_dask", "fixed_grid", "survey_peaks"]

_SAMPLER: dict = {}
_WARMED: list = []  # non-empty once a serial load has run in a child (numba cache filled)
_INTERVAL = 0.02  # seconds between two RSS samples


def _maxrss_bytes() -> int:
    """This process's peak resident set size in bytes.

    Linux: ``VmHWM`` of ``/proc/self/status``, the high-water mark of this process's own
    memory map. Not ``ru_maxrss``: Linux carries that over from the parent across fork and
    exec, so a child of a large runner process would report the runner's size.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(r) * (1 if sys.platform == "darwin" else 1024)


def _rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _start_sampler() -> int:
    """Sample this process's RSS every few milliseconds on a thread, until _stop_sampler."""
    import threading

    import psutil

    proc, samples, stop = psutil.Process(), [], threading.Event()

    def loop():
        while not stop.is_set():
            samples.append((time.time(), proc.memory_info().rss))
            stop.wait(_INTERVAL)

    th = threading.Thread(target=loop, name="rss-sampler", daemon=True)
    th.start()
    _SAMPLER.update(samples=samples, stop=stop, thread=th)
    return os.getpid()


def _stop_sampler() -> list:
    _SAMPLER["stop"].set()
    _SAMPLER["thread"].join()
    return _SAMPLER.pop("samples")


def _phase_peaks(samples: list, t0: float, timings: dict) -> dict:
    """Peak sampled RSS while pieces stream to the writer, and during the final step.

    ``t0`` is the wall-clock time the load started; the load phase ends ``prescan + load``
    seconds later (``LoadResult.timings``), and the final step (area filter, recompute, check)
    follows.
    """
    t_end_load = t0 + timings.get("prescan", 0.0) + timings.get("load", 0.0)
    t_end_recompute = t_end_load + timings.get("area_filter", 0.0) + timings.get("recompute", 0.0)

    def peak(lo, hi):
        v = [r for t, r in samples if lo <= t < hi]
        return max(v) if v else None
    return {"load_phase_peak_bytes": peak(t0, t_end_load),
            "recompute_peak_bytes": peak(t_end_load, t_end_recompute),
            "check_peak_bytes": peak(t_end_recompute, float("inf"))}


def _cfg_to_json(cfg) -> str:
    return json.dumps(asdict(cfg))


def _cfg_from_json(text: str):
    from pfm_dask.config import LoadConfig, SwathFilterConfig

    d = json.loads(text)
    d["swath"] = SwathFilterConfig(**d["swath"])
    for k in ("mbr", "bin_size_deg"):
        if d.get(k) is not None:
            d[k] = tuple(d[k])
    if d.get("polygon") is not None:
        d["polygon"] = tuple(tuple(p) for p in d["polygon"])
    return LoadConfig(**d)


def peak_rss_serial(paths, cfg, out: Path) -> dict:
    """Run ``--serial`` in a child process; its peak RSS, wall time and soundings loaded."""
    if not _WARMED:  # fill the numba cache first (see the module docstring)
        _WARMED.append(True)
        peak_rss_serial(paths, cfg, out)
    remove_pfm(out)
    job = json.dumps({"paths": [str(p) for p in paths], "out": str(out), "cfg": _cfg_to_json(cfg)})
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("MALLOC_TRIM_THRESHOLD_", None)  # as a user's shell starts it (Dask may have set it here)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child", job],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"serial child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    remove_pfm(out)
    return res


def _child(job_text: str) -> None:
    from pfm_dask import pipeline

    job = json.loads(job_text)
    base = _rss_bytes()
    _start_sampler()
    t0, t = time.time(), time.perf_counter()
    res = pipeline.run_load(job["paths"], job["out"], _cfg_from_json(job["cfg"]), mode="serial")
    wall = time.perf_counter() - t
    samples = _stop_sampler()
    if res.exit_code != 0:
        raise SystemExit(res.summary())
    print(json.dumps({"peak_rss_bytes": _maxrss_bytes(), "rss_before_bytes": base,
                      **_phase_peaks(samples, t0, res.timings),
                      "wall_s": wall, "soundings_loaded": res.totals["loaded"],
                      "peak_backlog_bytes": res.peak_backlog_bytes}))


def _worker_memory() -> dict:
    return {"peak_rss_bytes": _maxrss_bytes(), "rss_bytes": _rss_bytes(), "pid": os.getpid()}


def peak_rss_dask(paths, cfg, out: Path, workers: int = 2) -> dict:
    """A load on a fresh ``workers``-worker cluster; every worker's peak RSS, the writer's apart."""
    from distributed import Client

    from pfm_dask import pipeline
    from pfm_dask.cluster import make_local_cluster

    remove_pfm(out)
    with make_local_cluster(workers) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(cluster.worker_spec), timeout=120)
        before = client.run(_worker_memory)
        client.run(_start_sampler)
        t0, t = time.time(), time.perf_counter()
        res = pipeline.run_load(paths, out, cfg, mode="local", client=client)
        wall = time.perf_counter() - t
        samples = client.run(_stop_sampler)
        after = client.run(_worker_memory)
    remove_pfm(out)
    if res.exit_code != 0:
        raise RuntimeError(res.summary())
    writer = res.writer_worker
    per = {addr: {"peak_rss_bytes": m["peak_rss_bytes"],
                  "rss_before_bytes": before.get(addr, {}).get("rss_bytes"),
                  **_phase_peaks(samples.get(addr, []), t0, res.timings),
                  "writer": addr == writer} for addr, m in after.items()}
    w = per.get(writer, {})
    others = [v["peak_rss_bytes"] for a, v in per.items() if a != writer]
    return {"writer_peak_rss_bytes": w.get("peak_rss_bytes"),
            "writer_rss_before_bytes": w.get("rss_before_bytes"),
            "writer_load_phase_peak_bytes": w.get("load_phase_peak_bytes"),
            "writer_recompute_peak_bytes": w.get("recompute_peak_bytes"),
            "writer_check_peak_bytes": w.get("check_peak_bytes"),
            "compute_peak_rss_bytes": max(others) if others else None,
            "workers": per, "wall_s": wall, "soundings_loaded": res.totals["loaded"],
            "peak_backlog_bytes": res.peak_backlog_bytes}


def fixed_grid(cfg, survey_json: Path):
    """``cfg`` with its MBR set to the whole survey's footprint (padded), so the grid is fixed."""
    area = json.loads(Path(survey_json).read_text())["area"]
    pad_lat = (area["north"] - area["south"]) * 0.01 + 1e-4
    pad_lon = (area["east"] - area["west"]) * 0.01 + 1e-4
    return replace(cfg, mbr=(area["south"] - pad_lat, area["west"] - pad_lon,
                             area["north"] + pad_lat, area["east"] + pad_lon))


def survey_peaks(folder: Path, *, bin_size: float = 25.0, max_backlog: str = "512MiB",
                 workers: int = 2, results_dir: Path | None = None) -> dict:
    """Peak RSS of a ``--serial`` load and of each process of a ``workers``-worker load of the
    survey in ``folder``, beside its size, at the command line's default ``--max-backlog``."""
    from pfm_dask.config import LoadConfig, parse_size
    from pfm_dask.inputs import expand_inputs

    from ._report import write_results

    paths = expand_inputs([str(folder)])
    gsf = sum(os.path.getsize(p) for p in paths)
    cfg = LoadConfig(bin_size_m=bin_size, max_backlog_bytes=parse_size(max_backlog))
    work = Path(folder).parent / "memory-work"
    work.mkdir(exist_ok=True)
    s = peak_rss_serial(paths, cfg, work / "serial.pfm")
    d = peak_rss_dask(paths, cfg, work / "dask.pfm", workers=workers)
    procs = [v["peak_rss_bytes"] for v in d["workers"].values()]
    res = {"files": len(paths), "gsf_bytes": gsf, "bin_size_m": bin_size,
           "max_backlog": max_backlog, "serial": s, f"dask_{workers}_workers": d,
           "serial_peak_rss_bytes": s["peak_rss_bytes"],
           "dask_max_process_peak_rss_bytes": max(procs) if procs else None,
           "serial_peak_over_input": s["peak_rss_bytes"] / gsf}
    write_results("memory_survey", res, results_dir=results_dir)
    return res


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        _child(sys.argv[2])
    else:
        import argparse

        ap = argparse.ArgumentParser(description="peak RSS of a serial and a Dask load of a "
                                                 "survey (results/memory_survey.json)")
        ap.add_argument("survey", type=Path, help="folder of GSF files (pfm-dask synth ...)")
        ap.add_argument("--bin-size", type=float, default=25.0)
        ap.add_argument("--max-backlog", default="512MiB")
        ap.add_argument("--workers", type=int, default=2)
        ap.add_argument("--results-dir", type=Path)
        a = ap.parse_args()
        from benchmarks.memory import survey_peaks as run  # by module: workers run its samplers

        run(a.survey, bin_size=a.bin_size, max_backlog=a.max_backlog,
                     workers=a.workers, results_dir=a.results_dir)
