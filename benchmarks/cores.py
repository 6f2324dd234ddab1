"""What the machine's cores give independent processes: the ceiling a parallel load meets first.

Each workload runs once alone and then as ``procs`` copies at the same time, in separate
processes (no GIL shared, nothing of ours in them), started together at a barrier. The
*speedup* is the throughput of the copies against one alone: ``procs * alone / slowest``.
It is ``procs`` for work that keeps to its own core, and less where the cores share
something:

* ``scalar``: a Python loop (the interpreter, a few kB of memory): the cores themselves;
* ``stream``: numpy multiplying an array far larger than the caches, in place: the memory
  bandwidth the cores share (decoding, sorting, packing and the page-cache copies of a load
  are partly this);
* ``fresh``: numpy filling newly allocated arrays: first touches of fresh pages, which the
  kernel (and on a VM the host) must back.

A load is a mix of the three; ``bench_load``'s ``two_serial_halves`` (two ``--serial``
loads of half a survey each, at once) measures the mix itself. Neither involves Dask or the
single writer, so a 2-worker load is not expected to beat them.

    python -m benchmarks.cores [--mb 400] [--procs 2] [--repeat 5] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time

__all__ = ["WORKLOADS", "scaling", "main"]

WORKLOADS = ("scalar", "stream", "fresh")
#: Python loop iterations of ``scalar`` per MB of ``--mb`` (400 MB: about half a second here)
_LOOP_PER_MB = 40_000


def _setup(kind: str, mb: float):
    import numpy as np

    n = max(1, int(mb * 1e6 / 8))
    if kind == "stream":
        a = np.ones(n)          # touched now: the timed passes meet no fresh page
        a *= 1.0
        return a
    return n


def _work(kind: str, mb: float, state) -> None:
    import numpy as np

    if kind == "scalar":
        s = 0
        for i in range(int(mb * _LOOP_PER_MB)):
            s += i
    elif kind == "stream":
        for _ in range(20):
            state *= 1.0000001
    else:
        for _ in range(10):
            b = np.empty(state)
            b[:] = 1.0
            del b


def _child(kind: str, mb: float, barrier, out) -> None:
    state = _setup(kind, mb)
    barrier.wait()
    t = time.perf_counter()
    _work(kind, mb, state)
    out.put(time.perf_counter() - t)


def _run(kind: str, mb: float, procs: int) -> list[float]:
    """Seconds each of ``procs`` processes took for the workload, started together."""
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(procs), ctx.Queue()
    ps = [ctx.Process(target=_child, args=(kind, mb, barrier, out)) for _ in range(procs)]
    for p in ps:
        p.start()
    times = [out.get(timeout=600) for _ in ps]
    for p in ps:
        p.join()
    return sorted(times)


def scaling(mb: float = 400.0, procs: int = 2, repeat: int = 5,
            workloads=WORKLOADS) -> dict:
    """Per workload, runs alone and together alternating: the median time alone and the
    median of the slowest copy together, and ``speedup = procs * alone / together``;
    ``speedup_best`` from the best of each (a VM's neighbours move single runs a lot)."""
    out = {}
    for kind in workloads:
        alone, together = [], []
        for _ in range(repeat):
            alone.append(_run(kind, mb, 1)[0])
            together.append(_run(kind, mb, procs))
        slowest = [max(t) for t in together]
        out[kind] = {"alone_s": statistics.median(alone),
                     "together_s": statistics.median(slowest),
                     "speedup": procs * statistics.median(alone) / statistics.median(slowest),
                     "speedup_best": procs * min(alone) / min(slowest),
                     "alone_all_s": alone, "together_all_s": together}
    return out


def _plots(res: dict) -> dict:
    def speedups(ax):
        w = res["workloads"]
        ax.bar(list(w), [v["speedup"] for v in w.values()], label="median")
        ax.plot(list(w), [v["speedup_best"] for v in w.values()], "o", color="k", label="best")
        ax.axhline(res["procs"], ls="--", color="grey", label=f"{res['procs']} cores' worth")
        ax.set_ylabel(f"{res['procs']} processes against one alone")
        ax.legend()
    return {"speedup": speedups}


def main(argv=None) -> dict:
    from ._report import write_results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.cores",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=400.0,
                    help="array size of stream and fresh (and the scalar loop's length)")
    ap.add_argument("--procs", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--results-dir", default=None)
    a = ap.parse_args(argv)
    res = {"mb": a.mb, "procs": a.procs, "repeat": a.repeat,
           "workloads": scaling(a.mb, a.procs, a.repeat)}
    write_results("cores", res, plots=_plots(res), results_dir=a.results_dir, quiet=True)
    print(f"{a.procs} processes at once against one alone (median of {a.repeat}; best): "
          + ", ".join(f"{k} {v['speedup']:.2f}x ({v['speedup_best']:.2f}x)"
                      for k, v in res["workloads"].items()))
    return res


if __name__ == "__main__":
    main()
