"""Writing a whole buffer at a file offset, the one way every part of the package does it,
and closing a file map.

``os.pwrite`` may write less than asked; :func:`pwrite_all` loops until all is written, in
calls of at most ``WRITE_CHUNK`` bytes, and names the file in the error (a full disk must
say which file it could not grow). No Dask, no PFM knowledge: the PFM store, the journal and
the writer's redo file all use it.
"""

from __future__ import annotations

import errno
import os

__all__ = ["pwrite_all", "close_map", "WRITE_CHUNK"]

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



def close_map(mm) -> None:
    """Close the ``mmap`` ``mm`` (None: nothing to do); while a numpy view of it is still
    alive, the map stays until the view goes (closing it would raise)."""
    if mm is None:
        return
    try:
        mm.close()
    except BufferError:
        pass
