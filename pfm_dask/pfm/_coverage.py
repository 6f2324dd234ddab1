"""The v7 coverage map (``X.pfm.cvg``): creation and updates from bin validity.

Layout (docs/pfm-format.md §5; ``lib-pfm_lib : pfm_io.c`` ``create_cov_file``,
``update_cov_map``): the version string and ``[END OF HEADER]`` lines, zero
filled to 65536 bytes, then one byte per bin in bin order (row-major from the
south-west). After a bin record is written the library copies three bin
flags into the byte: DATA sets COV_DATA and COV_SURVEYED (SURVEYED is never
cleared), no DATA clears COV_DATA; CHECKED and VERIFIED set or clear
COV_CHECKED and COV_VERIFIED. COV_GAP is left alone.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import PfmFormatError
from .. import validity as V

__all__ = [
    "COV_HEADER_SIZE",
    "create_coverage_file",
    "coverage_from_validity",
    "read_coverage",
    "update_coverage",
]

#: Size of the ``.cvg`` header block (``COV_HEADER_SIZE`` in ``pfm.h``).
COV_HEADER_SIZE = 65536


def create_coverage_file(path: str | os.PathLike, width: int, height: int, version: str) -> None:
    """Write a new, all-zero coverage file for a ``width`` x ``height`` grid.

    The bin bytes are made by extending the file (a sparse file reads as
    zeros), the same content as the library's row-by-row zero writes.
    """
    head = f"{version}\n[END OF HEADER]\n".encode("latin-1")
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        os.write(fd, head + bytes(COV_HEADER_SIZE - len(head)))
        os.ftruncate(fd, COV_HEADER_SIZE + int(width) * int(height))
    finally:
        os.close(fd)


def coverage_from_validity(old: np.ndarray, validity: np.ndarray) -> np.ndarray:
    """New coverage bytes from old ones and bin validity words (``update_cov_map``)."""
    cov = np.asarray(old, dtype=np.uint8).copy()
    val = np.asarray(validity, dtype=np.int64)
    data = (val & V.DATA) != 0
    chk = (val & V.CHECKED) != 0
    ver = (val & V.VERIFIED) != 0
    cov = np.where(data, cov | (V.COV_DATA | V.COV_SURVEYED), cov & ~np.uint8(V.COV_DATA))
    cov = np.where(chk, cov | V.COV_CHECKED, cov & ~np.uint8(V.COV_CHECKED))
    cov = np.where(ver, cov | V.COV_VERIFIED, cov & ~np.uint8(V.COV_VERIFIED))
    return cov.astype(np.uint8)


def _runs(idx: np.ndarray, max_gap: int):
    """Split sorted unique indices into runs whose gaps are at most ``max_gap``."""
    if idx.size == 0:
        return []
    brk = np.flatnonzero(np.diff(idx) > max_gap + 1) + 1
    starts = np.r_[0, brk]
    ends = np.r_[brk, idx.size]
    return list(zip(starts.tolist(), ends.tolist()))


def read_coverage(fd: int, bin_index: np.ndarray, *, base: int = COV_HEADER_SIZE,
                  path=None, max_gap: int = 65536) -> np.ndarray:
    """Coverage bytes of the given bins (any order), read in a few large reads."""
    bi = np.asarray(bin_index, dtype=np.int64)
    order = np.argsort(bi, kind="stable")
    u, inv = np.unique(bi[order], return_inverse=True)
    out_u = np.empty(u.size, dtype=np.uint8)
    for a, b in _runs(u, max_gap):
        lo, hi = int(u[a]), int(u[b - 1]) + 1
        raw = os.pread(fd, hi - lo, base + lo)
        if len(raw) != hi - lo:
            raise PfmFormatError(f"coverage map ends early: wanted {hi - lo:,} bytes",
                                 path=path, offset=base + lo)
        out_u[a:b] = np.frombuffer(raw, dtype=np.uint8)[u[a:b] - lo]
    res = np.empty(bi.size, dtype=np.uint8)
    res[order] = out_u[inv]
    return res


def update_coverage(fd: int, bin_index: np.ndarray, validity: np.ndarray, *,
                    base: int = COV_HEADER_SIZE, path=None, max_gap: int = 4096,
                    fresh: bool = False) -> None:
    """Apply ``update_cov_map`` for many bins at once: batched read-modify-write.

    ``bin_index`` and ``validity`` are parallel arrays; for a bin given more
    than once the last validity wins. ``fresh``: from a byte of 0 (a new PFM's before any
    recompute) instead of the byte there.
    """
    bi = np.asarray(bin_index, dtype=np.int64)
    val = np.broadcast_to(np.asarray(validity, dtype=np.int64), bi.shape)
    if bi.size == 0:
        return
    order = np.argsort(bi, kind="stable")
    bs, vs = bi[order], val[order]
    last = np.r_[bs[1:] != bs[:-1], True]
    u, vu = bs[last], vs[last]
    for a, b in _runs(u, max_gap):
        lo, hi = int(u[a]), int(u[b - 1]) + 1
        raw = os.pread(fd, hi - lo, base + lo)
        if len(raw) != hi - lo:
            raise PfmFormatError(f"coverage map ends early: wanted {hi - lo:,} bytes",
                                 path=path, offset=base + lo)
        buf = np.frombuffer(raw, dtype=np.uint8).copy()
        pos = u[a:b] - lo
        buf[pos] = coverage_from_validity(np.zeros(pos.size, np.uint8) if fresh else buf[pos],
                                          vu[a:b])
        os.pwrite(fd, buf.tobytes(), base + lo)
