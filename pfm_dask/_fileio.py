"""Writing a whole buffer at a file offset, the one way every part of the package does it.

``os.pwrite`` may write less than asked; :func:`pwrite_all` loops until all is written, in
calls of at most ``WRITE_CHUNK`` bytes, and names the file in the error (a full disk must
say which file it could not grow). No Dask, no PFM knowledge: the PFM store, the journal and
the writer's redo file all use it.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sys

__all__ = ["pwrite_all", "punch_hole", "close_map", "WRITE_CHUNK"]

WRITE_CHUNK = 4 << 20            # bytes per os.pwrite


def pwrite_all(fd: int, data, offset: int) -> None:
    """Write every byte of ``data`` at ``offset`` of ``fd`` (short writes continued)."""
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        try:
            n = os.pwrite(fd, mv[done: done + WRITE_CHUNK], offset + done)
        except OSError as exc:  # name the file (a full disk must say which)
            if exc.filename is None:
                try:
                    exc.filename = os.readlink(f"/proc/self/fd/{fd}")
                except OSError:
                    pass
            raise
        if n <= 0:
            raise OSError(errno.EIO, f"short write at byte {offset + done}")
        done += n


_FALLOC_PUNCH = 0x02 | 0x01      # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (linux/falloc.h)


def close_map(mm) -> None:
    """Close the ``mmap`` ``mm`` (None: nothing to do); while a numpy view of it is still
    alive, the map stays until the view goes (closing it would raise)."""
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        pass


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``length`` bytes of ``fd`` from ``offset`` (they read as zeros after), cached pages
    included, dirty or not, without writing them; False where the system cannot (then
    nothing changed). For scratch data read once: freeing it as it is read, on the reading
    thread, spares whoever deletes the file the work."""
    fn = _fallocate()
    return fn is not None and length > 0 and fn(fd, _FALLOC_PUNCH, offset, length) == 0


@functools.lru_cache(maxsize=1)
def _fallocate():
    """The C library's ``fallocate`` (Linux only; this process's own symbols, libc among
    them), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None).fallocate
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    fn.restype = ctypes.c_int
    return fn
