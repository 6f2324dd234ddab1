"""Where a load's CPU goes, thread by thread: the driver and every worker process.

    python -m benchmarks.thread_cpu               # bench_load's survey, 2 workers, no filter
    python -m benchmarks.thread_cpu --filters     # the swath and area filters on
    python -m benchmarks.thread_cpu --serial      # the same in one process (the baseline)
    python -m benchmarks.thread_cpu --shape few-large --layout processes   # 8 files, worker processes

A sampler thread in each process reads every thread's user and system time from
``/proc/self/task`` every 0.1 s, so the threads that end during the load (the writer's,
the pack and band threads) are counted too, up to their last 0.1 s. Each thread's CPU is
split at the end of the load phase: what it spent while pieces streamed to the writer, and
in the final step. ``bench_load`` says how much more CPU a Dask run spends than
``--serial``; this says which threads spend it. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import threading
import time

_EVERY = 0.1  # seconds between samples


def sample() -> dict[str, tuple[float, float]]:
    """``{"<thread name>#<tid>": (user s, system s)}`` for every thread of this process."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                f = fh.read().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[f"{names.get(int(tid), '?')}#{tid}"] = (int(f[11]) / tick, int(f[12]) / tick)
    return out


def start_sampler() -> None:
    """Sample this process's threads every :data:`_EVERY` s from a daemon thread."""
    store: list = []
    threading._pfm_thread_cpu = store  # where get_samples finds them (a picklable lookup)

    def loop():
        while True:
            store.append((time.perf_counter(), sample()))
            time.sleep(_EVERY)

    threading.Thread(target=loop, daemon=True, name="thread-cpu-sampler").start()


def get_samples() -> list:
    return list(getattr(threading, "_pfm_thread_cpu", []))


def attribute(samples: list, t_split: float) -> dict[str, list[float]]:
    """Per thread, ``[user, system]`` before ``t_split`` and ``[user, system]`` after it.

    ``samples``: ``(time, sample())`` pairs in time order. A thread is counted from the
    first sample (or from zero if it started later) to its last one; the sampler itself
    and threads that spent less than 0.01 s are left out.
    """
    if not samples:
        return {}
    first = samples[0][1]
    before: dict = {}
    last: dict = {}
    for t, snap in samples:
        for k, v in snap.items():
            last[k] = v
            if t <= t_split:
                before[k] = v
    rows = {}
    for k, v in last.items():
        if k.startswith("thread-cpu-sampler#"):
            continue
        base = first.get(k, (0.0, 0.0))
        b = before.get(k, base)
        row = [b[0] - base[0], b[1] - base[1], v[0] - b[0], v[1] - b[1]]
        if sum(row) >= 0.01:
            rows[k] = row
    return rows


def _print(title: str, rows: dict) -> list[float]:
    print(title)
    tot = [0.0] * 4
    for k, r in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {k[-48:]:<48} load {r[0]:6.2f} + {r[1]:5.2f}   final {r[2]:6.2f} + {r[3]:5.2f}")
        tot = [a + b for a, b in zip(tot, r)]
    return tot


def main(argv=None) -> None:
    from distributed import Client

    from pfm_dask import pipeline
    from pfm_dask.cluster import make_local_cluster
    from pfm_dask.config import LoadConfig, SwathFilterConfig
    from pfm_dask.inputs import expand_inputs

    from . import bench_load
    from ._report import remove_pfm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=1.1)
    ap.add_argument("--files", type=int, default=48)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--filters", action="store_true")
    ap.add_argument("--serial", action="store_true")
    ap.add_argument("--layout", default="threads", choices=["threads", "processes", "apart"],
                    help="the embedded cluster's layout (cluster_local.LAYOUTS)")
    ap.add_argument("--shape", choices=list(bench_load.SHAPES), default="many",
                    help="bench_load's survey shape (many: --gb and --files)")
    args = ap.parse_args(argv)
    shape = bench_load.SHAPES[args.shape]
    data = (bench_load.survey(args.gb, args.files) if shape is None
            else bench_load.survey(0.0, shape[0], seed=shape[2], pings=shape[1]))
    paths = expand_inputs([data])
    cfg = LoadConfig(bin_size_m=50.0, area_filter=args.filters,
                     swath=SwathFilterConfig(enabled=args.filters))
    bench_load.WORK.mkdir(parents=True, exist_ok=True)
    out = bench_load.WORK / "thread_cpu.pfm"
    bench_load.run_once(paths[:1], "serial", 1, cfg, "warm-up")  # kernels loaded before the clock
    remove_pfm(out)
    per_process: dict[str, list] = {}
    start_sampler()
    if args.serial:
        time.sleep(0.2)
        t = time.perf_counter()
        res = pipeline.run_load(paths, out, cfg, mode="serial")
        time.sleep(2 * _EVERY)
        per_process["this process"] = get_samples()
    else:
        with make_local_cluster(args.workers, layout=args.layout) as cluster, \
                Client(cluster) as client:
            client.wait_for_workers(len(cluster.worker_spec))
            if args.layout != "threads":  # the default layout's worker is this process
                client.run(start_sampler)
            time.sleep(0.3)
            t = time.perf_counter()
            res = pipeline.run_load(paths, out, cfg, client=client)
            time.sleep(2 * _EVERY)
            if args.layout != "threads":
                per_process.update(client.run(get_samples))
            per_process["driver (scheduler, nannies, client; the threads layout's worker)"] = (
                get_samples())
    wall = time.perf_counter() - t
    t_split = t + wall - res.timings["final"]
    print(f"{'serial' if args.serial else f'{args.workers} workers'}, "
          f"{'both filters' if args.filters else 'no filter'}: {wall:.2f} s "
          f"(final step {res.timings['final']:.2f} s); CPU seconds, user + system:")
    total = [0.0] * 4
    for name, samples in per_process.items():
        total = [a + b for a, b in zip(total, _print(name, attribute(samples, t_split)))]
    print(f"all: load phase {total[0] + total[1]:.2f} CPU-s, final step "
          f"{total[2] + total[3]:.2f} CPU-s")


if __name__ == "__main__":
    main()
