"""Worker preload of the embedded cluster: Ctrl-C is the driver's to handle.

A terminal sends SIGINT to its whole foreground process group, so the embedded
cluster's worker processes get the user's Ctrl-C too; each would die printing
tracebacks while the driver is still stopping the load in order (cancelling
tasks, closing the writer at its last checkpoint). The workers ignore SIGINT;
the driver closes them.
"""

from __future__ import annotations

import signal
import threading


def dask_setup(worker) -> None:  # noqa: ARG001 - Dask's preload hook
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
