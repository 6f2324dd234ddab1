"""Give the C heap's free pages back to the system between the big steps of a load.

glibc keeps memory freed by numpy arrays below its mmap threshold (which rises to 32 MiB as
large arrays come and go) in its heap: a writer that has merged and packed a group holds on
to that memory at the next step, so the process's resident set shows its past peak, not what
it uses (docs/performance.md, memory). ``malloc_trim(0)`` returns every free page; it costs a
walk of the heap (milliseconds) and a page fault per page touched again, so it is called
between steps that free much (after a group of pieces is written, before the final step),
not per array. A no-op where the C library is not glibc.

glibc also gives each new thread a heap of its own (an arena, up to 8 per core), each keeping
what its thread freed for that thread's next arrays: the compute threads and the writer of one
process then each hold their own past peak. :func:`limit_arenas` makes the threads started
afterwards share them, until its caller gives the process's own limit back.

The code generator numba loads its cached kernels with (LLVM, in ``libllvmlite.so``) is a
second such leftover: setting it up and linking the first kernels reads 60-70 MB of that
library into the process, clean file pages a load never touches again once its kernels are in
(loading a further kernel touches a few MB of them). The other big libraries leave 25-30 MB
of the same kind in a Dask process (Arrow's 13 MB, Parquet's, OpenSSL's, read at import and
barely used after). :func:`release_code_pages` takes them out of the resident set
(``MADV_DONTNEED`` on mappings holding only the file's own pages; the page cache keeps them,
and the pages a load does use come back at a minor fault each).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from typing import Callable

__all__ = ["default_arenas", "limit_arenas", "release_code_pages", "release_free_heap"]

_LIBC: dict = {}        # the C library's functions, by name (None: not there)
_CLEAN: dict = {}       # the clean ranges of libraries, by the libraries' names
#: the mapped libraries whose pages :func:`release_code_pages` takes out (parts of their file
#: names): numba's code generator, Arrow and Parquet, OpenSSL (Dask's TLS), C++'s runtime,
#: numpy's extension and BLAS, the interpreter
CODE_LIBRARIES = ("libllvmlite", "libarrow", "libparquet", "libcrypto", "libssl", "libstdc++",
                  "numpy.libs", "_multiarray_umath", "pyarrow/lib.", "libpython")
#: what a shared library's path looks like (``libx.so``, ``libx.so.6``, ``x.cpython-311-x86_64-
#: linux-gnu.so``): a mapping of anything else (a GSF file, a PFM part) is never taken, since
#: its range may be unmapped and reused while the library ranges are kept
_LIBRARY_PATH = re.compile(r"\.so(\.[0-9]+)*$")
_MADV_DONTNEED = 4
_M_ARENA_MAX = -8       # mallopt's parameter (malloc.h)
_ARENA_LOCK = threading.Lock()
_arena_users = 0        # open limits (limit_arenas) not yet released


def _libc(name: str, argtypes: list, restype):
    """The C library's function ``name`` (None where that is not Linux's glibc), found once."""
    if name not in _LIBC:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                # the process's own symbols (libc among them): find_library would run
                # ldconfig in a child process, a fork of this whole process
                fn = getattr(ctypes.CDLL(None), name)
                fn.argtypes, fn.restype = argtypes, restype
            except (OSError, AttributeError):
                fn = None
        _LIBC[name] = fn
    return _LIBC[name]


def limit_arenas(n: int) -> Callable[[], None]:
    """Threads started from now on share at most ``n`` heaps (glibc's ``M_ARENA_MAX``; those
    already made stay) until the function returned is called: when every caller that limited
    them has called its own, the process's default limit (:func:`default_arenas`) comes back,
    so that a library caller's later threads get heaps of their own again."""
    global _arena_users
    with _ARENA_LOCK:
        _arena_users += 1
        if _arena_users == 1:
            _set_arena_max(n)
    released = []

    def release() -> None:
        global _arena_users
        with _ARENA_LOCK:
            if released:
                return
            released.append(True)
            _arena_users -= 1
            if _arena_users == 0:
                _set_arena_max(default_arenas())

    return release


def default_arenas() -> int:
    """glibc's own arena limit for this process: ``MALLOC_ARENA_MAX`` when set, else 8 a core
    (glibc's default on 64-bit machines; ``mallopt`` cannot set "no limit" back)."""
    try:
        n = int(os.environ.get("MALLOC_ARENA_MAX", ""))
    except ValueError:
        n = 0
    return n if n > 0 else 8 * (os.cpu_count() or 1)


def _set_arena_max(n: int) -> bool:
    fn = _libc("mallopt", [ctypes.c_int, ctypes.c_int], ctypes.c_int)
    return bool(fn(_M_ARENA_MAX, int(n))) if fn is not None else False


def release_free_heap() -> bool:
    """Return the C heap's free pages to the system; True if any was released."""
    fn = _libc("malloc_trim", [ctypes.c_size_t], ctypes.c_int)
    return bool(fn(0)) if fn is not None else False


def _clean_mappings(libraries: tuple) -> list[tuple[int, int]]:
    """Address ranges of this process's mappings of ``libraries`` that are not writable and
    hold no page the process ever wrote (``Anonymous: 0 kB`` in ``/proc/self/smaps``: no
    relocated, copy-on-write page), so that their pages equal the file's."""
    try:
        with open("/proc/self/smaps", "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    out, cur = [], None
    for line in text.splitlines():
        head = line.split(None, 5)
        if head and "-" in head[0] and not head[0].endswith(":"):   # a mapping's first line
            cur = None
            if (len(head) == 6 and "w" not in head[1] and _LIBRARY_PATH.search(head[5])
                    and any(n in head[5] for n in libraries)):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                cur = (lo, hi)
        elif cur is not None and head and head[0] == "Anonymous:":
            if head[1] == "0":
                out.append(cur)
            cur = None
    return out


def release_code_pages(libraries: tuple = CODE_LIBRARIES) -> int:
    """Drop this process's resident pages of the clean read-only mappings of ``libraries``
    (parts of their file names; :func:`_clean_mappings`); the bytes of address space dropped
    (0: none mapped, or not Linux). Safe at any time: those pages are the file's, and a page
    used again is mapped again from the page cache (a minor fault). Shared or not (another
    process of the machine running numba maps the same pages), they leave this process's
    resident set."""
    fn = _libc("madvise", [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int)
    if fn is None:
        return 0
    ranges = _CLEAN.get(libraries)
    if ranges is None:
        # found once (reading smaps takes milliseconds): a loaded library stays where it is
        # and its read-only pages are never written
        ranges = _clean_mappings(libraries)
        if ranges:
            _CLEAN[libraries] = ranges
    done = 0
    for lo, hi in ranges:
        if fn(lo, hi - lo, _MADV_DONTNEED) == 0:
            done += hi - lo
    return done
