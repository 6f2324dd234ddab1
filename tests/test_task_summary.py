"""The driver fetches a finished piece task's summary without waiting on a dead writer.

When the worker that ran a task dies with the writer (the disk worker computes too), Dask
reschedules the task, whose rerun can wait minutes on the writer's address; a plain
``Future.result()`` hung the driver there (seen in tests/test_worker_loss.py under load).
"""

from __future__ import annotations

import threading
import time

import pytest

from pfm_dask.pipeline import _actor_lost, _task_summary


class _NeverReady:
    """A future whose result never comes: ``result()`` blocks, ``result(timeout)`` times out."""

    def __init__(self):
        self.calls = 0

    def result(self, timeout=None):
        self.calls += 1
        threading.Event().wait(timeout if timeout is not None else 30)
        raise TimeoutError


class _Status:
    def __init__(self, status):
        self.status = status


def test_the_writer_lost_while_fetching_a_summary_raises_at_once():
    t = time.monotonic()
    with pytest.raises(RuntimeError) as err:
        _task_summary(_NeverReady(), _Status("error"), every=0.05)
    assert time.monotonic() - t < 5
    assert _actor_lost(err.value)   # the driver's loss path: the resume command, exit 1


def test_a_slow_summary_is_waited_for_while_the_writer_lives():
    class _Late(_NeverReady):
        def result(self, timeout=None):
            if self.calls >= 3:
                return {"timings": {"transfer": 0.5}}
            return super().result(timeout)

    fut = _Late()
    assert _task_summary(fut, _Status("pending"), every=0.01) == {"timings": {"transfer": 0.5}}
    assert fut.calls == 3
