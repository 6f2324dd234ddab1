"""What ``gsf-info`` reports of a GSF file: :func:`info`, without numba, Arrow or Dask.

``gsf-info`` runs after each line a survey office receives, so its cost is start-up: the
numba import and kernel loads took more time than its answer. Here the record framing
and the subrecord walk of every ping run in Python (``scan_records(fast=False)``,
``walk_pings(fast=False)``: the rules the kernels are tested against), one step per record
and per subrecord, never per beam; ping times and positions come from the fixed ping
headers with numpy. :meth:`GsfFile.info <pfm_dask.gsf.GsfFile.info>` builds the same dict
with :func:`summarize` after the kernels' walk.
"""

from __future__ import annotations

import datetime as _dt
import mmap
import os

import numpy as np

from .._fileio import close_map
from ..errors import GsfError
from ._decode import HeadersAlong, ScaleState, walk_pings_in_runs
from ._framing import scan_records
from ._records import ARRAY_SPECS, SUB_INTENSITY_SERIES, SUB_QUALITY_FLAGS, ping_header_dtype

__all__ = ["info", "summarize", "map_file", "check_mapped_size", "add_damage", "unmap_pages",
           "PagesBehind"]


def map_file(path: str):
    """``(size, mmap or None, os.stat_result)`` of a file opened for reading; ``None`` for an
    empty file (nothing to map). Any failure is a :class:`GsfError` naming the file."""
    mm = None
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_size > 0:
                mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as err:
        raise GsfError(f"cannot open: {err}", path=path) from err
    return st.st_size, mm, st


def unmap_pages(mm, lo: int, hi: int) -> bool:
    """Unmap this process's pages of bytes ``[lo, hi)`` of the map ``mm`` (both on page
    bounds; the page cache keeps them, a later read maps them again); False where nothing was."""
    if mm is None or hi <= lo or not hasattr(mmap, "MADV_DONTNEED"):
        return False
    try:
        mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
    except (OSError, ValueError):   # pragma: no cover - advisory
        return False
    return True


class PagesBehind:
    """Unmaps from this process the pages of a mapped file that a pass over it has gone by (the
    page cache keeps them): ``walked(pos)`` for the framing walk, past byte ``pos``;
    ``passed(lo, hi)`` for a pass over the pings, from byte ``lo`` on to ``hi`` (whole pages
    in between). A long pass then holds a few MB of a large file, not all of it."""

    def __init__(self, mm):
        self.mm, self.below = mm, 0

    def walked(self, pos: int) -> None:
        hi = int(pos) // mmap.PAGESIZE * mmap.PAGESIZE
        if unmap_pages(self.mm, self.below, hi):
            self.below = hi

    def passed(self, lo: int, hi: int) -> None:
        page = mmap.PAGESIZE
        unmap_pages(self.mm, int(lo) // page * page, int(hi) // page * page)


def check_mapped_size(mm, size: int, path: str) -> None:
    """Raise a truncation :class:`GsfError` if the file of ``mm`` is now shorter than ``size``.

    Touching a mapped page past a file's new end is a SIGBUS, which no handler turns into
    an exception; so every walk and decode first asks the mapping for the file's size.
    """
    if mm is None:
        return
    now = mm.size()
    if now < size:
        raise GsfError(f"file truncated while being read: it now ends here, "
                       f"{size - now:,} of its {size:,} bytes are gone", path=path, offset=now)


def add_damage(damage: list, err: GsfError) -> None:
    """Append ``err`` to ``damage`` unless the list already names that offset and reason."""
    if not any(d.offset == err.offset and d.reason == err.reason for d in damage):
        damage.append(err)


def info(path) -> dict:
    """A JSON-ready summary of one GSF file: version, record counts, ping and beam counts,
    arrays, time and position extents, damage (see :func:`summarize`).

    Damage is reported in the ``damage`` list, not raised; a file that is not GSF at all
    (no GSF header record) raises :class:`GsfError`. The same dict as
    ``GsfFile(path, strict=False).info()``, without numba.
    """
    path = os.fspath(path)
    size, mm, _ = map_file(path)
    behind = PagesBehind(mm)
    try:
        check_mapped_size(mm, size, path)
        fr = scan_records(mm if mm is not None else b"", path, fast=False,
                          walked=behind.walked if mm is not None else None)
        if fr.version is None:
            raise fr.damage[0] if fr.damage else GsfError("not a GSF file", path=path)
        damage = list(fr.damage)
        pidx = fr.ping_index
        hdr_dtype = ping_header_dtype(fr.major or 3)
        seen: set = set()
        check_mapped_size(mm, size, path)
        u8 = np.frombuffer(mm, dtype=np.uint8)
        # the ping headers read as the walk goes by: a large file mapped once for both
        along = HeadersAlong(u8, fr.data_offsets[pidx], hdr_dtype, behind.passed)
        try:
            dirn, dmg = walk_pings_in_runs(mm, fr.data_offsets[pidx], fr.sizes[pidx],
                                           fr.offsets[pidx], hdr_dtype.itemsize,
                                           ScaleState(fill=0), path, passed=along.passed,
                                           strict=False, seen=seen, fast=False)
            if dmg is not None:
                add_damage(damage, dmg)
            return summarize(path, size, fr.version, fr.major, fr.minor, fr.record_counts(),
                             len(pidx), dirn.n_beams, along.finish(len(dirn.n_beams)), seen,
                             damage)
        finally:
            along.u8 = None
            del u8
    finally:
        close_map(mm)


def summarize(path: str, size: int, version, major, minor, record_counts: dict,
              n_ping_records: int, n_beams: np.ndarray, headers: np.ndarray, seen: set,
              damage: list) -> dict:
    """The info dict of a walked file: ``n_beams`` and ``headers`` (their fixed ping headers)
    of the readable pings (those before any damage), ``seen`` the subrecord ids met on the walk.

    Extents are computed from the pings' own headers, never from the summary record (P5).
    """
    n = len(n_beams)
    out = {
        "path": path,
        "size": int(size),
        "version": version,
        "major": major,
        "minor": minor,
        "record_counts": dict(record_counts),
        "n_pings": n,
        "n_ping_records": int(n_ping_records),
        "n_beams": int(n_beams.sum()),
        "beams_per_ping": {"min": int(n_beams.min()) if n else None,
                           "max": int(n_beams.max()) if n else None},
        "arrays": _array_names(seen),
        "sensor_subrecords": sorted(int(s) for s in seen if s >= 102 or s == 0),
        "time": {"start": None, "end": None, "start_iso": None, "end_iso": None},
        "latitude": {"min": None, "max": None},
        "longitude": {"min": None, "max": None},
    }
    if n:
        sec = headers["time_sec"].astype(np.int64)
        nsec = headers["time_nsec"].astype(np.int64)
        t = sec * 1_000_000_000 + nsec
        i0, i1 = int(np.argmin(t)), int(np.argmax(t))
        out["time"] = {
            "start": float(sec[i0] + nsec[i0] / 1e9),
            "end": float(sec[i1] + nsec[i1] / 1e9),
            "start_iso": _iso(int(sec[i0]), int(nsec[i0])),
            "end_iso": _iso(int(sec[i1]), int(nsec[i1])),
        }
        lat = headers["latitude"].astype(np.float64) / 1.0e7
        lon = headers["longitude"].astype(np.float64) / 1.0e7
        ok = (np.abs(lat) <= 90.0) & (np.abs(lon) <= 180.0)   # 91/181 = null
        if ok.any():
            out["latitude"] = {"min": float(lat[ok].min()), "max": float(lat[ok].max())}
            out["longitude"] = {"min": float(lon[ok].min()), "max": float(lon[ok].max())}
    out["damage"] = [d.to_dict() for d in damage]
    return out


def _array_names(seen: set) -> list:
    names = []
    for sid in sorted(seen):
        if sid in ARRAY_SPECS:
            names.append(ARRAY_SPECS[sid].name)
        elif sid == SUB_QUALITY_FLAGS:
            names.append("quality_flags")
        elif sid == SUB_INTENSITY_SERIES:
            names.append("intensity_series")
    return names


def _iso(sec: int, nsec: int) -> str:
    try:
        t = _dt.datetime.fromtimestamp(sec, tz=_dt.timezone.utc)
    except (OverflowError, OSError, ValueError):  # pragma: no cover - u32 always fits
        return f"@{sec}.{nsec:09d}"
    return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{nsec:09d}Z"
