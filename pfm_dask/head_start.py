"""The pre-scan on threads of its own, and what a load on the embedded cluster does while that
cluster starts: the pre-scan, and the kernels of the workers that are threads of this process.

The pre-scan reads every file's framing and ping headers: two files at a time keep two reads
in flight and overlap one file's CPU with the other's page faults (a ``--serial`` load
pre-scans this way too: the 74-file survey's pre-scan 0.85-0.89 s against 1.35-1.58 s one file
at a time, 2.1 s against 2.7-3.1 s from a cold page cache; docs/performance.md).

Starting the embedded cluster (Dask's import, the scheduler, the worker) keeps one core busy
for about half a second; the pre-scan reads every file's framing and mostly waits on the
disk (12 files of the 74-file survey: 0.6 s wall for 0.25 CPU-s); loading the kernels from
numba's cache takes 0.5-1 s more. Run one after the other they leave a core idle for 2-3 s
before the first piece starts; here they run side by side. The files of an embedded cluster's
load are on this machine, so the driver can read them; a cluster of other nodes pre-scans on
its workers instead (:func:`pfm_dask.pipeline._run_dask`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from .planning import prescan_file

__all__ = ["HeadStart"]

#: threads that pre-scan at once: reads in flight, the rest is waiting on the disk
PRESCAN_THREADS = 2


class HeadStart:
    """Start pre-scanning ``files`` (and, if ``kernels``, loading this process's kernels for a
    load with ``cfg``) on threads of their own at once; :meth:`scans` waits for the scans."""

    def __init__(self, files: list[str], exact_beams: bool, *, cfg=None, kernels: bool = False,
                 say: Callable[[str], None] = lambda message: None):
        self._pool = ThreadPoolExecutor(max_workers=PRESCAN_THREADS,
                                        thread_name_prefix="pfm-head-start")
        self._kernels: Future | None = None
        self._say = say
        self.said: set[str] = set()
        if kernels:
            # a daemon thread: a first run compiles for minutes, and Ctrl-C must not wait for it
            self._kernels = Future()
            threading.Thread(target=self._warm, args=(cfg,), daemon=True,
                             name="pfm-head-start-kernels").start()
        self._scans = [self._pool.submit(prescan_file, f, exact_beams) for f in files]

    def _warm(self, cfg) -> None:
        from .warmup import warm_here

        try:
            self._kernels.set_result(warm_here(self._say_once, cfg))
        except BaseException as err:  # noqa: BLE001 - given to whoever asks for the result
            self._kernels.set_exception(err)

    def _say_once(self, message: str) -> None:
        if message not in self.said:
            self.said.add(message)
            self._say(message)

    def say(self, message: str) -> None:
        """Say ``message`` unless it was said here already: the workers' warm-up, in this same
        process, says the compiling line and a cache problem too."""
        self._say_once(message)

    def scans(self) -> list[dict]:
        """The pre-scan of every file, in the order given (a file that cannot be read comes
        back with ``error`` set, as from :func:`~pfm_dask.planning.prescan_file`)."""
        return [f.result() for f in self._scans]

    def kernel_seconds(self) -> dict:
        """``{"compile": s, "kernels": s}`` of the kernels loaded here (zeros if none were)."""
        if self._kernels is None:
            return {"compile": 0.0, "kernels": 0.0}
        res = self._kernels.result()
        return {"compile": res.compile_seconds, "kernels": res.seconds}

    def close(self) -> None:
        """Drop what has not started (a load that stopped early) and let the rest end."""
        self._pool.shutdown(wait=False, cancel_futures=True)
