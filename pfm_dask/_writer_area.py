"""The writer's area filter step: run pfmLoader's area filter over the PFM a load wrote.

The filter reads the rows of the bins the load touched, a band at a time on the writer's
threads, and its result goes to a redo file (record offset, slot, validity per changed
sounding) with a checksum; :func:`apply_redo` writes it into the PFM afterwards. Applying
the redo file twice is harmless, filtering twice is not (the second pass would see the
first's flags): that split is what makes the step safe to resume. No Dask here.
"""

from __future__ import annotations

import json
import os
import zlib

import numpy as np

from . import journal as J
from . import pfm
from ._faults import crash_point
from ._fileio import pwrite_all
from .errors import LoadError

__all__ = ["run_area_filter", "area_bands", "apply_redo", "AREA_BAND_SOUNDINGS"]

_REDO_DTYPE = np.dtype("<i8")    # redo entries: (record offset, slot, validity) as int64
_REDO_CHUNK = 1 << 20            # redo entries applied per set_validity call
AREA_BAND_SOUNDINGS = 500_000    # soundings the area filter reads ahead at a time


def run_area_filter(f, touched_bins: np.ndarray, cfg, redo_path,
                    threads: int | None) -> tuple[dict, dict]:
    """pfmLoader's area filter over the bins a load touched (``touched_bins``: a boolean per
    bin), row by row from the open PFM ``f``; writes the redo file and returns (the
    filter's summary, the redo file's record for the journal)."""
    from .filters import AreaFilter, RowSoundings

    g = f.grid
    w, h = g.width, g.height
    touched = touched_bins.reshape(h, w)
    rows_touched = touched.any(axis=1)
    # A row is read if it, or a neighbour row, has bins to filter.
    needed = rows_touched.copy()
    needed[1:] |= rows_touched[:-1]
    needed[:-1] |= rows_touched[1:]
    # Metre bins: the true diagonal (pfmLoader's 2*sqrt(size) is right only for 2 m);
    # degree bins: the geodesic diagonal, as pfmLoader computes it.
    diag = g.bin_diagonal_m() if cfg.bin_size_deg is not None else None
    filt = AreaFilter(w, h, bin_size_xy=g.bin_size_xy if cfg.bin_size_deg is None else 0.0,
                      bin_diagonal=diag, cellstd=cfg.cellstd,
                      deep_only=cfg.deep_only, null_depth=cfg.null_depth)

    # Rows are read a band at a time (one chain walk and one map of the .ndx per band,
    # about AREA_BAND_SOUNDINGS soundings; row by row cost 8x as much per sounding), up
    # to ``threads`` bands ahead on the writer's threads while the filter works (one
    # thread, as in --serial: in order, no pool), and handed to the filter row by row.
    fields = ("row", "col", "depth", "validity", "record_offset", "slot")

    def read_band(band):
        y0, y1 = band
        s = f.read_soundings(y0, y1, fields=fields)
        cut = np.searchsorted(s["row"], np.arange(y0, y1 + 1))
        return y0, y1, [{k: v[cut[r]:cut[r + 1]] for k, v in s.items()} for r in range(y1 - y0)]

    bands = pfm.ordered_imap(read_band, area_bands(f, needed), threads or pfm.THREADS)
    ahead: dict[int, dict] = {}

    def read_row(y: int):
        if not needed[y]:
            return None
        while y not in ahead:
            y0, y1, rows = next(bands)
            ahead.update(zip(range(y0, y1), rows))
        s = ahead.pop(y)
        return RowSoundings(col=s["col"].astype(np.int64), depth=s["depth"],
                            validity=s["validity"].astype(np.uint32),
                            address=np.stack([s["record_offset"], s["slot"]], axis=1),
                            active=touched[y])

    # The result goes to a redo file, applied afterwards (apply_redo): applying it twice
    # is harmless, while filtering twice is not (the second pass sees the first's flags).
    # Deferring the writes is exact: a row is never read after its neighbour is written.
    fd = os.open(redo_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    acc = {"count": 0, "crc": 0, "size": 0}

    def write_row(y: int, res) -> None:
        if res.index.size:
            rec = np.empty((res.index.size, 3), dtype=_REDO_DTYPE)
            rec[:, 0] = res.address[:, 0]
            rec[:, 1] = res.address[:, 1]
            rec[:, 2] = res.validity
            raw = rec.tobytes()
            pwrite_all(fd, raw, acc["size"])
            acc["size"] += len(raw)
            acc["crc"] = zlib.crc32(raw, acc["crc"])
            acc["count"] += res.index.size
            crash_point("area-filter-row")

    try:
        summary = filt.run(read_row, write_row)
        os.fsync(fd)
    finally:
        bands.close()
        os.close(fd)
    out = summary.as_dict()
    out["flagged"] = out.get("cut", 0)
    out = json.loads(json.dumps(out, default=_plain))
    return out, {"file": J.REDO_NAME, **acc}


def area_bands(f, needed: np.ndarray):
    """Bands ``(row0, row1)`` of consecutive needed rows holding about
    ``AREA_BAND_SOUNDINGS`` soundings (a heavier row is a band of its own), planned from
    the bin records' counts a block of rows at a time."""
    w, h = f.width, f.height
    step = max(1, (1 << 20) // w)
    start, tot = None, 0
    for r0 in range(0, h, step):
        r1 = min(h, r0 + step)
        if not needed[r0:r1].any():
            per_row = np.zeros(r1 - r0, np.int64)
        else:
            cnt = f.read_bin_records(r0, r1, fields=("num_soundings",))["num_soundings"]
            per_row = cnt.reshape(r1 - r0, w).sum(axis=1, dtype=np.int64)
        for y in range(r0, r1):
            if not needed[y]:
                if start is not None:
                    yield start, y
                    start = None
                continue
            n = int(per_row[y - r0])
            if start is not None and tot + n > AREA_BAND_SOUNDINGS:
                yield start, y
                start = None
            if start is None:
                start, tot = y, 0
            tot += n
    if start is not None:
        yield start, h


def apply_redo(f, redo_path, redo: dict) -> None:
    """Write the area filter's result into the PFM (idempotent: fixed values at fixed places)."""
    path = redo_path
    n = int(redo["count"])
    step = _REDO_CHUNK * 3 * np.dtype(_REDO_DTYPE).itemsize   # bytes of one chunk
    # verify the whole file first (nothing applied from a damaged one), then apply it;
    # both a chunk at a time: it holds 24 bytes per sounding the filter changed
    size, crc = 0, 0
    with open(path, "rb") as fh:
        while chunk := fh.read(step):
            size += len(chunk)
            crc = zlib.crc32(chunk, crc)
    if size != redo["size"] or size != n * step // _REDO_CHUNK or crc != redo["crc"]:
        raise LoadError("the area filter's redo file does not match its checksum; remove the "
                        "PFM and load again", path=path)
    with open(path, "rb") as fh:
        while chunk := fh.read(step):
            r = np.frombuffer(chunk, dtype=_REDO_DTYPE).reshape(-1, 3)
            f.set_validity(r[:, 0], r[:, 1], r[:, 2])
            crash_point("area-filter-apply")
    f.flush()


def _plain(v):
    """JSON for numpy scalars in reports."""
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    return str(v)
