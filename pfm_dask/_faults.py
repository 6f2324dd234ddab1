"""Fault injection for the crash tests: kill this process at a named point of a load.

The tests drive it through environment variables, so that a load run as a subprocess (the
CLI, a Dask worker) can be told where to die:

``PFM_DASK_CRASH_AT="name"`` or ``"name:N"``
    :func:`crash_point` SIGKILLs the process the N-th time (default the 1st) it reaches
    ``name`` (``checkpoint``, ``piece``, ``recompute-write``, ``area-filter-row`` ...).
``PFM_DASK_CRASH_SCOPE=group``
    kill the whole process group (the driver and its workers) instead of this process.
``PFM_DASK_KILL_COMPUTE_WORKER="before|after:MARKER"``
    :func:`kill_compute_worker_once` makes the first task on a compute worker (one without
    the ``disk`` resource) SIGKILL its worker before or after it hands its piece to the
    writer; the marker file makes it happen once per load.

``PFM_DASK_GROUP_BYTES=N``
    :func:`group_bytes` gives the writer's group budget for a new load (1: every piece a
    group of its own), so that a crash test on a tiny survey still finds bin and tail
    records rewritten since the last checkpoint (a resume takes the budget from the
    journal, not from here).

Unset (always, outside tests) each hook costs one dictionary lookup. No Dask imported here:
the caller says whether it runs on a compute worker.
"""

from __future__ import annotations

import os
import signal

__all__ = ["crash_point", "crash_planned", "kill_compute_worker_once", "group_bytes"]

_COUNTS: dict[str, int] = {}


def crash_planned(prefix: str) -> bool:
    """True if ``PFM_DASK_CRASH_AT`` names a point starting with ``prefix`` (for a caller that
    must install a hook before the point can be reached)."""
    return os.environ.get("PFM_DASK_CRASH_AT", "").startswith(prefix)


def crash_point(name: str) -> None:
    """SIGKILL this process (or its group) here if ``PFM_DASK_CRASH_AT`` names this point."""
    spec = os.environ.get("PFM_DASK_CRASH_AT")
    if not spec:
        return
    want, _, nth = spec.partition(":")
    if want != name:
        return
    count = _COUNTS.get(name, 0) + 1
    _COUNTS[name] = count
    if count != (int(nth) if nth else 1):
        return
    if os.environ.get("PFM_DASK_CRASH_SCOPE") == "group":
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_compute_worker_once(when: str, on_compute_worker) -> None:
    """SIGKILL this worker at moment ``when`` (``before``/``after``) if
    ``PFM_DASK_KILL_COMPUTE_WORKER`` asks for it, once per marker file.
    ``on_compute_worker()`` says whether this process is a compute worker (asked only when
    the variable is set)."""
    spec = os.environ.get("PFM_DASK_KILL_COMPUTE_WORKER")
    if not spec:
        return
    moment, _, marker = spec.partition(":")
    if moment != when or not on_compute_worker():
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    os.kill(os.getpid(), signal.SIGKILL)


def group_bytes() -> int | None:
    """The writer's group budget ``PFM_DASK_GROUP_BYTES`` asks for, or None (the default)."""
    v = os.environ.get("PFM_DASK_GROUP_BYTES")
    return int(v) if v else None
