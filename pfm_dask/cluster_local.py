"""The embedded cluster: its worker layout (compute threads beside the writer in the driver's
process, or worker processes), the Dask settings it runs with, and the factory ``pfm-dask
load`` starts.

Every server listens on loopback (pfm_dask.security); :mod:`pfm_dask.cluster` re-exports
these names beside the Slurm and PBS clusters.
"""

from __future__ import annotations

import logging

from .errors import ConfigError
from .heap import limit_arenas
from .security import LOOPBACK, scratch_folder

__all__ = ["LAYOUTS", "LOCAL_DISK_WORKER", "LOCAL_WORKER", "PRELOAD", "local_worker_specs",
           "make_local_cluster", "worker_environment"]

#: the preload of pfm-dask's own schedulers: the writer's plugin, the dashboard on demand
PRELOAD = "pfm_dask.dashboard_plugin"
LOCAL_DISK_WORKER = "pfm-disk"  #: the embedded cluster's disk worker (the writer's process)
#: the C heaps (glibc arenas) the threads started by a threads-layout cluster share
THREADS_ARENAS = 1


#: The embedded cluster's layouts (``make_local_cluster(layout=...)``).
LAYOUTS = ("threads", "processes", "apart")
LOCAL_WORKER = "pfm-local"  #: the threads layout's one worker (in the driver's process)
INPROC = "inproc://"  #: the threads layout's transport: Dask's messages as objects in memory


def local_worker_specs(workers: int, *, scratch: str, host: str, layout: str = "threads",
                       processes: bool = True, memory_limit: str | int = "auto") -> dict:
    """The embedded cluster's worker layout, as :class:`distributed.SpecCluster` specs.

    ``threads`` (the default): one worker in this process with ``workers`` threads
    (``compute=workers``) that also holds ``disk=1``: the writer actor and every task share
    the driver's process, so no worker process starts, no kernel is loaded twice, and every
    piece reaches the writer in memory. The task kernels and the writer's packing are numba
    kernels that release the GIL and numpy calls on whole arrays, so the threads run side by
    side; on two cores this layout spends 7-8 CPU-s less than ``processes`` on 8 files of 37 MB
    (docs/performance.md, "The embedded cluster's layout"). Its worker and scheduler talk
    ``inproc``: Dask's messages between the driver's client, the scheduler and the worker are
    handed over as objects, not serialised through loopback TCP (only the dashboards listen).

    ``processes``: ``workers`` worker processes (one thread, ``compute=1`` each), the first
    also holding ``disk=1``; ``apart``: the same plus a process that holds ``disk=1`` and
    computes nothing, as on a disk node. ``processes=False`` runs those workers in this process
    instead (tests that patch code).
    """
    from distributed import Nanny, Worker

    if layout not in LAYOUTS:
        raise ConfigError(f"unknown layout {layout!r} of the embedded cluster (one of "
                          f"{', '.join(LAYOUTS)})")
    in_process = layout == "threads" or not processes

    def spec(resources: dict, nthreads: int = 1) -> dict:
        opts = {"nthreads": nthreads, "resources": resources, "memory_limit": memory_limit,
                "host": host, "dashboard_address": f"{host}:0", "local_directory": scratch}
        if not in_process:
            opts["silence_logs"] = logging.WARNING
            opts["preload"] = ["pfm_dask._worker_signals"]  # Ctrl-C is the driver's
        return {"cls": Worker if in_process else Nanny, "options": opts}

    if layout == "threads":
        # No memory limit of Dask's: the worker's process is the load's, whose memory the
        # driver's window bounds; a limit of Dask's ("auto": the machine's memory times its
        # share of the cores) would pause the tasks whenever the whole load's memory passed
        # 80 % of it, and a process's memory need not fall while its tasks wait.
        threads = spec({"compute": workers, "disk": 1}, nthreads=workers)
        threads["options"]["memory_limit"] = 0 if memory_limit == "auto" else memory_limit
        # Scheduler, worker and client share this process: their messages are passed in
        # memory (inproc), not serialised through loopback TCP; only the dashboards listen.
        threads["options"]["protocol"] = INPROC
        del threads["options"]["host"]
        return {LOCAL_WORKER: threads}
    specs = {}
    if layout == "apart":
        specs[LOCAL_DISK_WORKER] = spec({"disk": 1})
    for i in range(workers):
        specs[f"pfm-worker-{i}"] = spec({"compute": 1, **({} if layout == "apart" or i else {"disk": 1})})
    return specs


# ------------------------------------------------------------------ the embedded cluster
def make_local_cluster(workers: int, *, dashboard_address: str | None = None,
                       memory_limit: str | int = "auto", layout: str = "threads",
                       processes: bool = True):
    """An embedded cluster of ``workers`` compute threads beside the writer in this process,
    or with ``layout="processes"``/``"apart"`` of worker processes (:func:`local_worker_specs`).

    Every server (scheduler, nannies, workers, their HTTP servers) listens on 127.0.0.1
    only; ``dashboard_address`` (default ``127.0.0.1:0``) may open the dashboard. Their
    scratch space is a temporary folder removed when the cluster closes (pfm_dask.security).
    ``processes=False`` runs a process layout's workers in this process (tests that patch code).
    """
    from distributed import Scheduler

    from .security import LOCAL_DASHBOARD, scratch_spec_cluster

    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    scratch = scratch_folder()
    specs = local_worker_specs(workers, scratch=scratch, host=LOOPBACK, layout=layout,
                               processes=processes, memory_limit=memory_limit)
    # The scheduler runs in this process. Its preload adds the writer's plugin, and builds the
    # dashboard ("PFM writer" page included) at its first request rather than at the start:
    # Bokeh's import is 0.4-0.5 s of a start-up that keeps one core busy (pfm_dask.dashboard_plugin).
    scheduler = {"cls": Scheduler, "options": {
        "host": LOOPBACK, "dashboard_address": dashboard_address or LOCAL_DASHBOARD,
        "dashboard": False, "local_directory": scratch, "preload": [PRELOAD]}}
    if layout == "threads":  # every server in this process: messages passed in memory
        scheduler["options"]["protocol"] = INPROC
        del scheduler["options"]["host"]
        # the compute threads and the writer's threads, started later, share one heap: what
        # one thread's task freed serves the next array of any (heap.py; 2-worker load of
        # the 200 MB survey: 30-50 MB less peak RSS, docs/performance.md)
        # (while the cluster is open: its close gives the process's own limit back)
        on_close = limit_arenas(THREADS_ARENAS)
    else:
        on_close = None
    with worker_environment():
        return scratch_spec_cluster()(workers=specs, scheduler=scheduler, scratch=scratch,
                                      silence_logs=logging.WARNING, name="pfm-dask",
                                      on_close=on_close)


#: Periodic work of every Dask server (scheduler, nannies, workers) made less frequent: the
#: event-loop tick measured every 20 ms (a diagnostic: it only warns of a blocked loop), the
#: system monitor every 0.5 s (the dashboard's CPU and memory plots), the memory checks every
#: 0.1 s. An idle 2-worker cluster spent 4.8% of a core on these, 1.3% with these values; a
#: loaded one much more, since each wake-up takes the GIL from a busy task or writer thread
#: (2-worker loads of the 1.1 GB survey: 20.2-20.6 s against 21.3-22.7 s, docs/performance.md).
_QUIET_LOOPS = {"distributed.admin.tick.interval": "1s",
                "distributed.admin.system-monitor.interval": "1s",
                "distributed.worker.memory.monitor-interval": "500ms"}


def worker_environment():
    """Dask's settings for the embedded cluster: no ``MALLOC_TRIM_THRESHOLD_``, no profiler, and
    fewer wake-ups of the event loops (``_QUIET_LOOPS``).

    distributed starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which stops
    glibc from reusing large freed blocks: every large numpy array in a worker is then
    freshly mapped and page-faulted, and the decode and final step cost about 1.5-2x the
    CPU they cost in ``--serial`` (measured). Its statistical profiler samples every
    thread's stack every 10 ms, the writer's and the decoding task's included: about 2-5
    CPU seconds per GB loaded on a 2-core machine (measured), for a dashboard page a
    batch load seldom needs (set ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True`` and
    ``--scheduler`` to an own cluster to profile). Nannies read these settings when
    created, so create them inside this context.
    """
    import dask

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    return dask.config.set({"distributed.nanny.pre-spawn-environ": env,
                            "distributed.worker.profile.enabled": False, **_QUIET_LOOPS})
