"""A load's kernels: on Dask made ready once on every worker during the pre-scan, so that no
task (and not the writer) stalls on a compilation; in this process (``--serial``, a small
input) each loaded from numba's cache on its first use, so that a small load reads only the
kernels it runs (:class:`KernelWatch`).

When numba really compiles (a first run, or an unusable cache), one line says so before the
wait; an unusable cache is said once, in one line, for the whole load (all workers together).
"""

from __future__ import annotations

import importlib
import threading
import uuid
from typing import Callable

from . import kernel_cache
from .kernel_cache import CompileWatch, WarmResult, prefetch, warm

__all__ = ["COMPILING", "TOPIC", "describe", "warm_here", "warm_workers", "WorkerWarmup",
           "KernelWatch", "LOAD_KERNELS"]

#: the line said when numba starts compiling
COMPILING = "compiling kernels (first run only; `pfm-dask warmup` does it ahead of a batch job)"
#: the same when nothing can be cached
COMPILING_UNCACHED = "compiling kernels (numba cannot cache them, so every run compiles)"
#: the scheduler event topic on which a worker says it started compiling
TOPIC = "pfm-dask-kernels"


#: the kernels a new in-process load without filters calls, in the order it first calls them
#: (module, name): :class:`KernelWatch` loads them on a thread ahead of the load
#: (tests/test_startup.py checks the list against what a load loads)
LOAD_KERNELS = (
    *(("pfm_dask.gsf._kernels", k) for k in ("frame", "walk", "decode")),
    ("pfm_dask.geodesy", "place"), ("pfm_dask.geodesy", "direct"),
    ("pfm_dask.pfm._grid", "assign16"),
    *(("pfm_dask._task_kernels", k) for k in ("screen", "place_emit", "in_order", "gather")),
    *(("pfm_dask.pfm._runs_kernels", k)
      for k in ("gather_u32", "bin_runs", "bits_all", "undo_needed", "bits_set_div", "bits_clear")),
    ("pfm_dask.pfm._chains", "chain_plan"),
    *(("pfm_dask.pfm._bitpack_kernels", k) for k in ("record_ends", "pack_soundings", "pack_new")),
    ("pfm_dask.pfm._runs_kernels", "touch_new"),
    ("pfm_dask.pfm._recompute_kernel", "record_fields"),
    ("pfm_dask.pfm._recompute_kernel", "recompute_records"),
    ("pfm_dask.pfm._sparse", "nonzero_records"),
    ("pfm_dask.pfm._check_kernel", "check_sums"),
    ("pfm_dask.pfm._chains", "visit"),
)


def _compiling_line(cache: str | None) -> str:
    return COMPILING if cache else COMPILING_UNCACHED


def _for_load(cfg) -> dict:
    """:func:`~pfm_dask.kernel_cache.warm`'s arguments for a load with ``cfg``: the swath
    filter's window, or None; the area filter's kernels left out when it is off. No ``cfg``
    (a resume whose settings are not read yet): everything, with the default window."""
    if cfg is None:
        return {"swath": (5, 9)}
    return {"swath": (cfg.swath.window_pings, cfg.swath.window_beams) if cfg.swath.enabled
            else None, "skip": () if cfg.area_filter else ("_area",)}


def warm_here(say: Callable[[str], None], cfg=None, *, everything: bool = False) -> WarmResult:
    """Warm this process's kernels for a load with ``cfg`` (``everything``: all of them, the
    swath filter's for its default window), saying so when numba compiles and, once, when its
    cache is unusable."""
    args = {"swath": (5, 9)} if everything else _for_load(cfg)
    res = warm(**args, on_compile=lambda cache: say(_compiling_line(cache)))
    if res.cache_problem:
        say(res.cache_problem)
    return res


class KernelWatch:
    """The kernels of a load in this process, each loaded from numba's cache (or compiled) on
    its first use rather than all before the work: says the compiling line once, when numba
    starts compiling, and an unusable cache once, at the start. A context manager;
    ``compile_seconds``: numba's compilations so far, ``seconds``: the kernels made ready so
    far, compilations included (both over all threads of the process).

    ``ahead``: kernels ((module, name), e.g. :data:`LOAD_KERNELS`) loaded in that order on a
    thread of their own while the context is open, ahead of the work's first calls: a
    kernel's load is mostly LLVM's, without the GIL, so it overlaps the work's Python, system
    calls and earlier kernels (a small load's 20 kernel loads were 0.12 s of its 0.6 s).
    Leaving the context stops the thread after the kernel it is loading."""

    def __init__(self, say: Callable[[str], None], ahead=()):
        from ._numeric import kernel_seconds

        self._ahead = tuple(ahead)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kernel_seconds = kernel_seconds
        self._start = kernel_seconds()
        self._watch = CompileWatch(lambda: say(_compiling_line(self._cache)))
        self._cache, problem = kernel_cache.cache_location()
        if problem:
            say(problem)

    @property
    def compile_seconds(self) -> float:
        return self._watch.seconds

    @property
    def seconds(self) -> float:
        return (self._kernel_seconds() - self._start) + self._watch.seconds_outside_loads

    def __enter__(self) -> "KernelWatch":
        self._watch.__enter__()
        if self._ahead:
            # their modules imported here, so that the thread imports nothing while this one
            # imports (a module lock held here, a kernel's lock there: neither would wait on
            # the other)
            for module in dict.fromkeys(m for m, _ in self._ahead):
                importlib.import_module(module)
            self._thread = threading.Thread(target=prefetch, args=(self._ahead, self._stop),
                                            name="pfm-kernels", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._watch.__exit__(*exc)


def _warm_task(args: dict) -> dict:
    """A worker task: warm this worker's kernels; announce a compilation on :data:`TOPIC`."""
    from distributed import get_worker

    worker = get_worker()

    def on_compile(cache):
        worker.log_event(TOPIC, {"worker": worker.address, "cache": cache})

    return {"worker": worker.address, **warm(**args, on_compile=on_compile).to_dict()}


class WorkerWarmup:
    """Warm-up tasks on every worker of ``client``, submitted before the pre-scan's tasks (which
    they go ahead of); :meth:`result` waits for them and gives the load's compile timings."""

    def __init__(self, client, say: Callable[[str], None], cfg=None, tag: str = ""):
        self._client, self._say = client, say
        self._said = False
        workers = list(client.scheduler_info(n_workers=-1)["workers"])
        client.subscribe_topic(TOPIC, self._on_event)
        self._futures = [client.submit(_warm_task, _for_load(cfg), workers=[w],
                                       allow_other_workers=False, pure=False, priority=100,
                                       key=f"warm-kernels-{tag or uuid.uuid4().hex[:8]}-{i}")
                         for i, w in enumerate(workers)]

    def _on_event(self, event) -> None:
        if not self._said:
            self._said = True
            msg = event[1] if isinstance(event, tuple) else event
            self._say(_compiling_line((msg or {}).get("cache")))

    def driver(self) -> CompileWatch:
        """A watch over work of the driver's own that may compile (the grid's geodesy): the
        same line, said once with the workers'."""
        return CompileWatch(lambda: self._on_event((0.0, {"cache": "driver"})))

    def result(self) -> dict:
        """``{"compile": s, "kernels": s}``: the longest compilation and the longest warm-up
        (cache loads included) over the workers. A cache problem is said once, in one line."""
        futures, self._futures = self._futures, []   # their keys go with the gather
        try:
            results = self._client.gather(futures)
        finally:
            self._client.unsubscribe_topic(TOPIC)
            del futures
        problems = sorted({r["cache_problem"] for r in results if r.get("cache_problem")})
        if problems:
            n = sum(1 for r in results if r.get("cache_problem"))
            self._say(problems[0] + (f" (on {n} of {len(results)} workers"
                                     + (f"; {len(problems) - 1} other problem(s))"
                                        if len(problems) > 1 else ")")))
        return {"compile": max((r["compile_seconds"] for r in results), default=0.0),
                "kernels": max((r["seconds"] for r in results), default=0.0)}


def warm_workers(client, say: Callable[[str], None], cfg=None, tag: str = "") -> WorkerWarmup:
    """Start warming every worker of ``client`` for a load with ``cfg`` (:class:`WorkerWarmup`);
    ``tag`` makes the tasks' keys the load's own (default: a new one)."""
    return WorkerWarmup(client, say, cfg, tag)


def describe(res: WarmResult) -> str:
    """What ``pfm-dask warmup`` did, for people: kernels compiled or found, and where the
    cache is (a problem with it is said apart, by :func:`warm_here`)."""
    where = res.cache or "nowhere (numba cannot cache them)"
    if res.compiled:
        line = (f"compiled {res.compiled} kernel{'s' if res.compiled > 1 else ''} in "
                f"{res.compile_seconds:.1f} s "
                f"({res.seconds:.1f} s in all); cache: {where}")
    else:
        line = f"every kernel was in the cache (loaded in {res.seconds:.1f} s); cache: {where}"
    return line
