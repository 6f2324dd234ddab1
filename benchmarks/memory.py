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
    return _status()["rss"]


#: fields of /proc/self/status sampled: the resident set, split into anonymous memory (the
#: heap, numpy and Arrow buffers: what the process really needs) and file-backed pages (the
#: code, and the PFM's mapped parts: clean ones the kernel may drop at any time)
_FIELDS = {"VmRSS:": "rss", "RssAnon:": "anon", "RssFile:": "file", "RssShmem:": "shmem",
           "VmHWM:": "hwm"}


def _status() -> dict:
    """This process's resident set now, in bytes, by kind (``_FIELDS``)."""
    out = dict.fromkeys(_FIELDS.values(), 0)
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                key = _FIELDS.get(line.split(b":", 1)[0].decode() + ":")
                if key:
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        import psutil

        out["rss"] = out["anon"] = int(psutil.Process().memory_info().rss)
    return out


def _start_sampler() -> int:
    """Sample this process's RSS (total, anonymous, file-backed) every ``_INTERVAL`` seconds on
    a thread, until _stop_sampler."""
    import threading

    samples, stop = [], threading.Event()

    def loop():
        while not stop.is_set():
            st = _status()
            samples.append((time.time(), st["rss"], st["anon"], st["file"] + st["shmem"]))
            stop.wait(_INTERVAL)

    th = threading.Thread(target=loop, name="rss-sampler", daemon=True)
    th.start()
    _SAMPLER.update(samples=samples, stop=stop, thread=th)
    return os.getpid()


def _stop_sampler() -> list:
    _SAMPLER["stop"].set()
    _SAMPLER["thread"].join()
    return _SAMPLER.pop("samples")


#: the phases of a load, in order, and the ``LoadResult.timings`` entries each lasts
PHASES = (("prescan", ("prescan",)), ("load", ("load",)),
          ("recompute", ("area_filter", "recompute")), ("check", None))


def _phase_peaks(samples: list, t0: float, timings: dict) -> dict:
    """Per phase (``PHASES``: the pre-scan, pieces streaming to the writer, the area filter and
    recompute, the check), the peak sampled RSS and, at that moment, its anonymous and
    file-backed parts, plus the phase's peak anonymous RSS (which may come at another moment).

    ``t0`` is the wall-clock time the load started; each phase ends its timings' seconds
    after the previous one; the check runs to the end.
    """
    out, lo = {}, t0
    for name, keys in PHASES:
        hi = float("inf") if keys is None else lo + sum(timings.get(k, 0.0) for k in keys)
        v = [s for s in samples if lo <= s[0] < hi]
        if v:
            top = max(v, key=lambda s: s[1])
            out[name] = {"peak_bytes": top[1], "anon_bytes": top[2], "file_bytes": top[3],
                         "peak_anon_bytes": max(s[2] for s in v)}
        else:
            out[name] = None
        lo = hi
    return {"phases": out,
            "peak_anon_bytes": max((s[2] for s in samples), default=None),
            "load_phase_peak_bytes": (out["load"] or {}).get("peak_bytes"),
            "recompute_peak_bytes": (out["recompute"] or {}).get("peak_bytes"),
            "check_peak_bytes": (out["check"] or {}).get("peak_bytes")}


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


def _run_child(kind: str, paths, cfg, out: Path, workers: int = 0) -> dict:
    """Run one load (``kind`` serial or dask) in a fresh child process; its JSON answer."""
    remove_pfm(out)
    job = json.dumps({"kind": kind, "paths": [str(p) for p in paths], "out": str(out),
                      "cfg": _cfg_to_json(cfg), "workers": workers})
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("MALLOC_TRIM_THRESHOLD_", None)  # as a user's shell starts it (Dask may have set it here)
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--child", job],
                          capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    remove_pfm(out)
    return res


def peak_rss_serial(paths, cfg, out: Path) -> dict:
    """Run ``--serial`` in a child process; its peak RSS, wall time and soundings loaded."""
    if not _WARMED:  # fill the numba cache first (see the module docstring)
        _WARMED.append(True)
        peak_rss_serial(paths, cfg, out)
    return _run_child("serial", paths, cfg, out)


def _child(job_text: str) -> None:
    job = json.loads(job_text)
    cfg = _cfg_from_json(job["cfg"])
    if job["kind"] == "dask":
        res = _dask_here(job["paths"], Path(job["out"]), cfg, job["workers"])
    else:
        res = _serial_here(job["paths"], job["out"], cfg)
    print(json.dumps(res))


def _serial_here(paths, out, cfg) -> dict:
    from pfm_dask import pipeline

    base = _rss_bytes()
    _start_sampler()
    t0, t = time.time(), time.perf_counter()
    res = pipeline.run_load(paths, out, cfg, mode="serial")
    wall = time.perf_counter() - t
    samples = _stop_sampler()
    if res.exit_code != 0:
        raise SystemExit(res.summary())
    return {"peak_rss_bytes": _maxrss_bytes(), "rss_before_bytes": base,
            **_phase_peaks(samples, t0, res.timings),
            "wall_s": wall, "soundings_loaded": res.totals["loaded"],
            "peak_backlog_bytes": res.peak_backlog_bytes, "timings": _timings(res)}


def _timings(res) -> dict:
    """The load's phases and the writer's own time: writing, and (Dask) waiting for pieces."""
    return {k: res.timings.get(k) for k in ("prescan", "load", "final", "write", "wait_pieces")}


def _worker_memory() -> dict:
    return {"peak_rss_bytes": _maxrss_bytes(), "rss_bytes": _rss_bytes(), "pid": os.getpid()}


def peak_rss_dask(paths, cfg, out: Path, workers: int = 2) -> dict:
    """A load on a fresh ``workers``-worker cluster, run from a child process (the driver, which
    also runs the scheduler, as ``pfm-dask load`` does); every process's peak RSS."""
    return _run_child("dask", paths, cfg, out, workers)


def _dask_here(paths, out: Path, cfg, workers: int) -> dict:
    from distributed import Client

    from pfm_dask import pipeline
    from pfm_dask.cluster import make_local_cluster

    with make_local_cluster(workers) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(cluster.worker_spec), timeout=120)
        before = client.run(_worker_memory)
        # the default layout's worker is a thread pool of this process: one sampler serves both
        in_process = all(m["pid"] == os.getpid() for m in before.values())
        if not in_process:
            client.run(_start_sampler)
        _start_sampler()
        t0, t = time.time(), time.perf_counter()
        res = pipeline.run_load(paths, out, cfg, mode="local", client=client)
        wall = time.perf_counter() - t
        own = _stop_sampler()
        driver = _phase_peaks(own, t0, res.timings)
        samples = ({a: own for a in before} if in_process else client.run(_stop_sampler))
        after = client.run(_worker_memory)
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
            "driver": {"peak_rss_bytes": _maxrss_bytes(), **driver},
            "workers": per, "wall_s": wall, "soundings_loaded": res.totals["loaded"],
            "peak_backlog_bytes": res.peak_backlog_bytes, "timings": _timings(res)}


def fixed_grid(cfg, survey_json: Path):
    """``cfg`` with its MBR set to the whole survey's footprint (padded), so the grid is fixed."""
    area = json.loads(Path(survey_json).read_text())["area"]
    pad_lat = (area["north"] - area["south"]) * 0.01 + 1e-4
    pad_lon = (area["east"] - area["west"]) * 0.01 + 1e-4
    return replace(cfg, mbr=(area["south"] - pad_lat, area["west"] - pad_lon,
                             area["north"] + pad_lat, area["east"] + pad_lon))


def survey_peaks(folder: Path, *, bin_size: float = 25.0, max_backlog: str | None = None,
                 workers: int = 2, results_dir: Path | None = None,
                 only: str | None = None) -> dict:
    """Peak RSS of a ``--serial`` load and of each process of a ``workers``-worker load of the
    survey in ``folder``, beside its size, at the command line's default ``--max-backlog``."""
    from pfm_dask.config import LoadConfig, format_size, parse_size
    from pfm_dask.inputs import expand_inputs

    from ._report import write_results

    paths = expand_inputs([str(folder)])
    gsf = sum(os.path.getsize(p) for p in paths)
    cfg = LoadConfig(bin_size_m=bin_size)
    if max_backlog is not None:
        cfg = replace(cfg, max_backlog_bytes=parse_size(max_backlog))
    max_backlog = format_size(cfg.max_backlog_bytes)
    work = Path(folder).parent / "memory-work"
    work.mkdir(exist_ok=True)
    s = peak_rss_serial(paths, cfg, work / "serial.pfm") if only != "dask" else None
    d = peak_rss_dask(paths, cfg, work / "dask.pfm", workers=workers) if only != "serial" else None
    procs = ([v["peak_rss_bytes"] for v in d["workers"].values()]
             + [d["driver"]["peak_rss_bytes"]]) if d else []
    res = {"files": len(paths), "gsf_bytes": gsf, "bin_size_m": bin_size,
           "max_backlog": max_backlog, "serial": s, f"dask_{workers}_workers": d,
           "serial_peak_rss_bytes": s and s["peak_rss_bytes"],
           "dask_max_process_peak_rss_bytes": max(procs) if procs else None,
           "serial_peak_over_input": s and s["peak_rss_bytes"] / gsf}
    write_results("memory_survey", res, results_dir=results_dir)
    print(summary(res, workers))
    return res


def summary(res: dict, workers: int = 2) -> str:
    """The figures as a small table: per process, its peak RSS and, per phase, the peak with
    its anonymous / file-backed split (MB)."""
    mb = lambda b: "-" if b is None else f"{b / 1e6:,.0f}"  # noqa: E731

    def row(name, r):
        cells = []
        for ph, _ in PHASES:
            v = (r.get("phases") or {}).get(ph)
            cells.append("-" if not v else
                         f"{mb(v['peak_bytes'])} ({mb(v['anon_bytes'])}a/{mb(v['file_bytes'])}f)")
        return (f"{name:<18} {mb(r['peak_rss_bytes']):>7} {mb(r.get('peak_anon_bytes')):>7}  "
                + "  ".join(f"{c:<19}" for c in cells))

    lines = [f"{res['files']} files, {res['gsf_bytes'] / 1e6:,.0f} MB of GSF, "
             f"{res['bin_size_m']:g} m bins, --max-backlog {res['max_backlog']}",
             f"{'process':<18} {'peak':>7} {'anon':>7}  "
             + "  ".join(f"{ph + ' (anon/file)':<19}" for ph, _ in PHASES)]
    if res.get("serial"):
        lines.append(row("serial", res["serial"]))
    d = res.get(f"dask_{workers}_workers")
    if d:
        lines.append(row("dask driver", d["driver"]))
        for i, (addr, w) in enumerate(sorted(d["workers"].items())):
            lines.append(row(f"worker {i}" + (" (writer)" if w["writer"] else ""), w))
        lines.append(f"dask peak backlog {mb(d['peak_backlog_bytes'])} MB, "
                     f"wall {d['wall_s']:.1f} s, writer writing "
                     f"{d['timings']['write'] or 0:.1f} s, waiting for pieces "
                     f"{d['timings']['wait_pieces'] or 0:.1f} s")
    if res.get("serial"):
        lines.append(f"serial peak backlog {mb(res['serial']['peak_backlog_bytes'])} MB, "
                     f"wall {res['serial']['wall_s']:.1f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        from benchmarks.memory import _child as child  # by module: workers run its samplers

        child(sys.argv[2])
    else:
        import argparse

        ap = argparse.ArgumentParser(description="peak RSS of a serial and a Dask load of a "
                                                 "survey (results/memory_survey.json)")
        ap.add_argument("survey", type=Path, help="folder of GSF files (pfm-dask synth ...)")
        ap.add_argument("--bin-size", type=float, default=25.0)
        ap.add_argument("--max-backlog", default=None, help="default: the load's own default")
        ap.add_argument("--workers", type=int, default=2)
        ap.add_argument("--results-dir", type=Path)
        ap.add_argument("--only", choices=("serial", "dask"), help="run one of the two loads")
        ap.add_argument("--no-warm", action="store_true",
                        help="skip the unmeasured first load (the numba cache is already filled)")
        a = ap.parse_args()
        if a.no_warm:
            _WARMED.append(True)
        from benchmarks import memory

        memory._WARMED.extend(_WARMED)
        run = memory.survey_peaks  # by module: workers run its samplers

        run(a.survey, bin_size=a.bin_size, max_backlog=a.max_backlog,
            workers=a.workers, results_dir=a.results_dir, only=a.only)
