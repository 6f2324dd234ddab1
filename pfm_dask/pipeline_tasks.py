"""What runs on the Dask workers of a load: the writer actor and the piece task.

:class:`WriterActor` wraps the :class:`~pfm_dask.writer.PfmWriter` as a Dask actor on the worker
that holds the ``disk`` resource; :func:`_piece_task` prepares one piece on a compute worker and
hands it to that actor, in memory when the actor is in the task's own process. The driver's side
(submitting, the window, the final step's wait) is :mod:`pfm_dask.pipeline`'s.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
import uuid

import numpy as np

from ._faults import kill_compute_worker_once
from .bins import BinGrid
from .config import LoadConfig
from .pieces import Piece
from .soundings import prepare_piece
from .writer import PfmWriter

__all__ = ["WriterActor", "STATUS_TOPIC"]

log = logging.getLogger("pfm_dask")

STATUS_TOPIC = "pfm-writer"  # the writer's status events (pfm_dask.dashboard.TOPIC)
_STATUS_EVERY = 0.5  # seconds between two status events


class WriterActor:
    """The Dask actor around :class:`PfmWriter`: sync methods run on the actor thread."""

    def __init__(self, pfm_path, grid, cfg, files, n_pieces, append=False, journal=None,
                 resume=False, checkpoint_seconds=10.0):
        self.writer = PfmWriter(pfm_path, grid, cfg, files, n_pieces, append=append,
                                journal=journal, resume=resume,
                                checkpoint_seconds=checkpoint_seconds)
        self.writer.start()
        try:
            from distributed import get_worker
            self._worker = get_worker()
            self.host = self._worker.address
        except Exception:  # noqa: BLE001 - outside a worker (tests)
            self._worker = None
            self.host = None
        # The status goes to the scheduler's pfm-writer plugin (pfm_dask.dashboard) every
        # _STATUS_EVERY seconds from a thread of ours; log_event may be called from any thread.
        self._load_id = uuid.uuid4().hex
        self._final: concurrent.futures.Future | None = None   # the final step (start_finish)
        self._publish_stop = threading.Event()
        self._publisher = None
        if self._worker is not None:
            self._publish()
            self._publisher = threading.Thread(target=self._publish_loop, daemon=True,
                                               name="pfm-writer-status")
            self._publisher.start()

    def _publish(self, **override) -> None:
        try:
            st = self.writer.status()
            st.update(pfm=str(self.writer.path), load_id=self._load_id, time=time.time(),
                      **override)
            st = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in st.items()}
            self._worker.log_event(STATUS_TOPIC, st)
        except Exception as err:  # noqa: BLE001 - progress reports must never break a load
            log.debug("writer status not published: %s", err)

    def _publish_loop(self) -> None:
        while not self._publish_stop.wait(_STATUS_EVERY):
            self._publish()

    def _stop_publishing(self, **override) -> None:
        if self._publisher is not None:
            self._publish_stop.set()
            self._publisher.join(timeout=5)
            self._publisher = None
            self._publish(**override)

    def where(self) -> str | None:
        return self.host

    def compute_threads(self, n: int) -> None:
        self.writer.compute_threads(n)

    def grid(self):
        return self.writer.pfm.grid

    def cfg(self):
        return self.writer.cfg

    def watermark(self) -> int:
        return self.writer.watermark

    def put(self, prepared) -> bool:
        return self.writer.put(prepared)

    def skip(self, piece, error) -> bool:
        return self.writer.skip(piece, error)

    def status(self) -> dict:
        return self.writer.status()

    def finish(self) -> dict:
        try:
            return self.writer.finish()
        finally:
            self._stop_publishing()

    def start_finish(self) -> None:
        """Start the final step on a thread of its own and return. A worker runs every actor's
        calls on one thread: the final step run there (minutes on a large survey) held up
        every call of another load's writer on this disk worker, its pieces and its status."""
        if self._final is None:
            final = self._final = concurrent.futures.Future()

            def run() -> None:
                try:
                    final.set_result(self.finish())
                except BaseException as err:  # noqa: BLE001 - raised again by finished()
                    final.set_exception(err)

            threading.Thread(target=run, name="pfm-writer-final", daemon=True).start()

    def finished(self, wait: bool = False) -> dict | None:
        """The final step's result once it has ended (its error raised); None while it runs,
        unless ``wait`` (for a caller in this process: a call through the actor never waits)."""
        return self._final.result() if wait or self._final.done() else None

    def abort(self) -> None:
        if self._final is not None:  # never close the PFM under a final step that runs
            concurrent.futures.wait([self._final])
        try:
            self.writer.abort()
        finally:
            self._stop_publishing(phase="aborted")


def _on_compute_worker() -> bool:
    """True in a worker without the ``disk`` resource (where the worker-loss tests strike)."""
    from distributed import get_worker

    return not get_worker().state.total_resources.get("disk", 0)


def _local_writer(cls, address: str, key: str):
    """The writer actor object itself when this task runs in the process that holds it (on its
    worker, or on another worker of the same process: the embedded cluster's threads), else
    None."""
    from distributed import Worker

    for worker in list(Worker._instances):
        if worker.address == address:
            actor = worker.state.actors.get(key)
            return actor if isinstance(actor, cls) else None
    return None


#: nice value of a compute thread that shares its process with the writer (0: unchanged;
#: docs/performance.md, "Two workers on two cores")
TASK_NICE = int(os.environ.get("PFM_DASK_TASK_NICE", "10"))
_niced = threading.local()


def _yield_to_writer() -> None:
    """Lower this compute thread's scheduling priority (once per thread) when it shares a
    process, and so the cores, with the writer's threads: the writer is the load's serial
    step, and a core it waits for is time every task waits for later."""
    if TASK_NICE <= 0 or getattr(_niced, "done", False):
        return
    _niced.done = True
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid)
                                                 + TASK_NICE))
    except (OSError, AttributeError):  # not Linux, or refused: run as is
        pass


def _piece_task(piece: Piece, grid: BinGrid, cfg: LoadConfig, writer) -> dict:
    """A worker task: prepare the piece and hand it to the writer actor (never waits for order).

    A retried or re-run task delivers its piece again: the writer drops the duplicate.
    ``writer`` is the actor, or ``(class, address, key)`` to rebuild its proxy here (an
    Actor argument is a task dependency, which would send every task to the disk worker).
    """
    local = None
    if isinstance(writer, tuple):
        from distributed.actor import Actor

        local = _local_writer(*writer)
        writer = Actor(*writer)
    if local is not None:
        _yield_to_writer()
    prepared = prepare_piece(piece, grid, cfg)
    kill_compute_worker_once("before", _on_compute_worker)
    t0 = time.perf_counter()
    # In the writer's own process (its worker, or another worker of the embedded cluster's
    # threads) the piece is handed over in memory: a call through the actor would pickle it
    # and send it to this same process over TCP.
    accepted = local.put(prepared) if local is not None else writer.put(prepared).result()
    kill_compute_worker_once("after", _on_compute_worker)
    timings = dict(prepared.timings, transfer=time.perf_counter() - t0)
    summary = {"seq": piece.seq, "nbytes": prepared.nbytes, "accepted": accepted,
               "timings": timings}
    box = _summaries.get(id(local)) if local is not None else None
    if box is not None:  # the driver is in this process too: no fetch through the scheduler
        box[piece.seq] = summary
    return summary


#: summaries of the tasks that ran in the driver's process, by seq, in a box per writer actor
#: (by its id) that the driver of that load opens (:func:`_run_dask`) and removes when it
#: ends: a worker that holds the writer without the driver (a disk worker) keeps nothing
_summaries: dict[int, dict] = {}
