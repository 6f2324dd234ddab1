"""Give the C heap's free pages back to the system between the big steps of a load.

glibc keeps memory freed by numpy arrays below its mmap threshold (which rises to 32 MiB as
large arrays come and go) in its heap: a writer that has merged and packed a group holds on
to that memory at the next step, so the process's resident set shows its past peak, not what
it uses (docs/performance.md, memory). ``malloc_trim(0)`` returns every free page; it costs a
walk of the heap (milliseconds) and a page fault per page touched again, so it is called
between steps that free much (after a group of pieces is written, before the final step),
not per array. A no-op where the C library is not glibc.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["release_free_heap"]

_TRIM: list = []


def _malloc_trim():
    if not _TRIM:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                # the process's own symbols (libc among them): find_library would run
                # ldconfig in a child process, a fork of this whole process
                fn = ctypes.CDLL(None).malloc_trim
                fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _TRIM.append(fn)
    return _TRIM[0]


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system; True if any was released."""
    fn = _malloc_trim()
    return bool(fn(0)) if fn is not None else False
