"""The area filter's inputs summed per bin while a load still writes: their record and file.

The filter (``filters._area``, docs/filters.md §3) reads every sounding of every bin after the
last piece. Most bins lose nothing, and for those the soundings matter only through a few
sums per bin: the pre-filter mean and std, the deepest and shallowest sounding that could be
cut, the statistics the library keeps when nothing is cut, the chain's head and counts
(:data:`SUM_DTYPE`). The recompute's own walk of a bin takes them
(``._recompute_kernel._filter_sums``) when its tile is recomputed beside the writer
(``._tiles``); :class:`AreaSums` keeps them in a scratch file indexed by bin (sparse: only
bins with data take room), and ``pfm_dask._area_rows`` runs the filter's rows from them. This
module knows the record, not the filter. No Dask here.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from .._fileio import close_map, pwrite_all

__all__ = ["SUM_DTYPE", "AreaSums", "as_sums"]

#: One bin's sums: pre-filter mean and std (soundings with no bit of INVAL, DELETED), the
#: deepest and shallowest of them, the statistics after the filter if it cuts nothing
#: (``post_*``: without REFERENCE and null depths, as the library), the chain's head, and how
#: many soundings the bin has, in the pre-filter set and in the post set.
#: (every field 8 bytes: a row of them is read as (width, 10) doubles and integers at once)
SUM_DTYPE = np.dtype([("avg", "<f8"), ("std", "<f8"), ("zmax", "<f8"), ("zmin", "<f8"),
                      ("post_avg", "<f8"), ("post_std", "<f8"), ("head", "<i8"),
                      ("n_all", "<i8"), ("n_pre", "<i8"), ("n_post", "<i8")])

def as_sums(got) -> np.ndarray:
    """:data:`SUM_DTYPE` records from the recompute kernel's ``(doubles (n, 6), integers
    (n, 4))`` (``._recompute_kernel.recompute_records(..., sums=)``)."""
    f, i = got
    out = np.empty(f.shape[0], SUM_DTYPE)
    for j, k in enumerate(("avg", "std", "zmax", "zmin", "post_avg", "post_std")):
        out[k] = f[:, j]
    for j, k in enumerate(("head", "n_all", "n_pre", "n_post")):
        out[k] = i[:, j]
    return out


class AreaSums:
    """The scratch file of a load's per-bin sums, :data:`SUM_DTYPE` records indexed by bin
    (a sparse file: bins without data are holes, read as zeros: no soundings)."""

    def __init__(self, path: str | os.PathLike, n_bins: int):
        self.path = os.fspath(path)
        self.n_bins = int(n_bins)
        self.record_bytes = SUM_DTYPE.itemsize
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(self.fd, self.n_bins * SUM_DTYPE.itemsize)
        self._mm: mmap.mmap | None = None

    def write(self, bins: np.ndarray, sums: np.ndarray) -> None:
        """Write the sums of ``bins`` (ascending), a write per run of consecutive bins."""
        if bins.size == 0:
            return
        brk = np.flatnonzero(np.diff(bins) != 1) + 1
        for a, b in zip(np.r_[0, brk].tolist(), np.r_[brk, bins.size].tolist()):
            pwrite_all(self.fd, sums[a:b].tobytes(), int(bins[a]) * SUM_DTYPE.itemsize)

    def map(self) -> np.ndarray:
        """The file's records, mapped read-only (:data:`SUM_DTYPE`, one per bin): the filter's
        bands read their rows in place, on their threads, and :meth:`free` lets rows go."""
        if self._mm is None:
            self._mm = mmap.mmap(self.fd, self.n_bins * SUM_DTYPE.itemsize,
                                 access=mmap.ACCESS_READ)
        return np.frombuffer(self._mm, SUM_DTYPE)

    def free(self, first: int, n: int) -> None:
        """The sums of bins ``first .. first + n - 1`` read for the last time: the map's pages
        of them handed back (they stay cached until the file goes), so that this process
        holds the bands in flight, not the whole file. Not freed in the file: punching holes
        while the bands fault the next rows in blocked them (the 74-file survey's filter
        took 0.40 s instead of 0.20 s); the file goes on a thread of its own after the
        filter (``PfmWriter._drop_sums``)."""
        size, at = n * SUM_DTYPE.itemsize, first * SUM_DTYPE.itemsize
        if size <= 0 or self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        page = mmap.PAGESIZE
        a, b = -(-at // page) * page, (at + size) // page * page
        if b > a:
            self._mm.madvise(mmap.MADV_DONTNEED, a, b - a)

    def close(self, remove: bool = True) -> None:
        mm, self._mm = self._mm, None
        close_map(mm)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if remove:
            try:
                os.unlink(self.path)
            except OSError:
                pass
