"""The writer's area filter step: run pfmLoader's area filter over the PFM a load wrote.

The filter reads the rows of the bins the load touched, a band at a time on the writer's
threads, and its result goes to a redo file (record offset, slot, validity per changed
sounding) with a checksum; :func:`apply_redo` writes it into the PFM afterwards. Applying
the redo file twice is harmless, filtering twice is not (the second pass would see the
first's flags): that split is what makes the step safe to resume. No Dask here.
"""

from __future__ import annotations

import json
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from . import journal as J
from . import validity as V
from . import pfm
from ._faults import crash_point
from .errors import LoadError
from .pfm._recompute import running_args
from .pfm._recompute_kernel import NdxView, band_soundings, record_fields

__all__ = ["run_area_filter", "run_area_filter_sums", "area_bands", "apply_redo",
           "AREA_BAND_SOUNDINGS", "AREA_HALO_ROWS"]

_REDO_DTYPE = np.dtype("<i8")    # redo entries: (record offset, slot, validity) as int64
_REDO_CHUNK = 1 << 20            # redo entries applied per set_validity call
AREA_BAND_SOUNDINGS = 2_000_000  # soundings of one band of the area filter's rows


def run_area_filter(f, touched_bins: np.ndarray, cfg, redo_path,
                    threads: int | None, changed: list | None = None) -> tuple[dict, dict]:
    """pfmLoader's area filter over the bins a load touched (``touched_bins``: a boolean per
    bin), row by row from the open PFM ``f``; writes the redo file and returns (the
    filter's summary, the redo file's record for the journal). ``changed``: a list that
    gets the bins holding a sounding the filter cut (arrays, ascending), when given.

    The rows go by bands of about :data:`AREA_BAND_SOUNDINGS` soundings, filtered at once on
    ``threads`` threads (:func:`_filter_band`); the redo file and the summary are those of
    the plain pass over the rows in order, byte for byte (docs/filters.md, "Bands").
    """
    from .filters import AreaFilterSummary

    g = f.grid
    w, h = g.width, g.height
    touched = touched_bins.reshape(h, w)
    needed = _needed_rows(touched)
    filt = _make_filter(g, cfg)
    threads = max(1, int(threads or pfm.THREADS))
    # rows nobody reads are rows without data for the filter: nothing to do, counted
    summary = AreaFilterSummary(rows=int((~needed).sum()))
    # One thread: the bands in order, each from the true state the band before left.
    # More: each band from a guess, checked against the band before (_filter_band).
    truth: dict = {"end": 0, "post": None}
    halo = AREA_HALO_ROWS if threads > 1 else None

    def work(band):
        y0, y1 = band
        above = truth["post"] if (halo is None and truth["end"] == y0) else None
        return _filter_band(f, filt, touched, needed, y0, y1, halo, above, view)

    # The result goes to a redo file, applied afterwards (apply_redo): applying it twice
    # is harmless, while filtering twice is not (the second pass sees the first's flags).
    # Deferring the writes is exact: no row is read after its neighbour is written.
    redo = _RedoFile(redo_path)
    # the .ndx mapped once for the bands' compiled reads (its pages handed back band by band)
    f._sync()
    view = NdxView(f)
    if not view.ok:
        view.close()
        view = None
    bands = pfm.ordered_imap(work, area_bands(f, needed), threads)
    try:
        for out in bands:
            y0, y1 = out["rows"]
            # the true state above the band: the band before's last row, or no data
            true_above = (truth["post"] if truth["end"] == y0 and y0 > 0 and needed[y0 - 1]
                          else None)
            if out["guess"] is not None and not out["guess"].same(
                    true_above if true_above is not None else filt.none_stats(w)):
                # the guess did not meet the true state in time: the band again, from it
                out = _filter_band(f, filt, touched, needed, y0, y1, None, true_above, view)
            summary.add(out["summary"])
            if changed is not None and out["changed"].size:
                changed.append(out["changed"])
            for rec in out["redo"]:
                redo.add(rec)
            truth["end"], truth["post"] = y1, out["post"]
            if view is not None:
                view.drop_pages(out["soundings"])
        redo.sync()
    finally:
        bands.close()
        redo.close()
        if view is not None:
            view.close()
        _BUFFERS.__dict__.clear()    # this thread's; the pool's threads are gone
    filt.summary = summary
    return _report(summary), redo.record()


def run_area_filter_sums(f, touched_bins: np.ndarray, cfg, redo_path, sums,
                         changed: list | None = None, running: list | None = None,
                         threads: int | None = None) -> tuple[dict, dict, int] | None:
    """:func:`run_area_filter` from the per-bin sums the load's tiles took
    (``pfm._area_sums``), a chain walked only for a bin whose soundings reach its threshold.
    The same redo file and summary, byte for byte, and how many bins it walked; None when a
    chain is broken (the caller then runs :func:`run_area_filter`, which reports it).
    ``changed`` gets the bins with a cut, a band at a time, and ``running`` their recompute's
    running values (``pfm.running_args``).

    The rows go by bands (:func:`_sum_bands`) on ``threads`` threads, each band from a guess
    run ``AREA_HALO_ROWS`` rows early and checked against the band before, as
    :func:`run_area_filter` (docs/filters.md, "Bands"); the bands read the sums in place
    (``AreaSums.map``), and the rows a band and the next no longer need are freed on a
    thread of their own (``AreaSums.free``)."""
    from .filters import AreaFilterSummary
    from ._area_rows import RowBands, pre_stats

    g = f.grid
    w, h = g.width, g.height
    touched = touched_bins.reshape(h, w)
    filt = _make_filter(g, cfg)
    needed = _needed_rows(touched)
    summary = AreaFilterSummary(rows=int((~needed).sum()))
    threads = max(1, int(threads or pfm.THREADS))
    halo = AREA_HALO_ROWS if threads > 1 else None
    f._sync()
    view = NdxView(f)
    if not view.ok:
        view.close()
        return None
    rb = RowBands(filt, view, running_args(f))
    mapped = [sums.map().reshape(h, w)]     # (let go in the end, before the file closes)
    none = filt.none_stats(w)
    truth: dict = {"post": none}       # the post statistics of the last row filtered

    def run(y0: int, y1: int, above) -> dict | None:
        # rows y0 .. y1 - 1 from above (row y0 - 1's post), or from a guess ``halo`` rows
        # early when above is None; the row below read for its pre statistics
        start = y0
        if above is None:
            while start > 0 and start > y0 - halo and needed[start - 1]:
                start -= 1
        seed = above is None and start > 0 and needed[start - 1]
        r0 = start - 1 if seed else start
        r1 = y1 + 1 if y1 < h and needed[y1] else y1
        block = mapped[0][r0:r1]
        if above is None:
            above = pre_stats(block[0]) if seed else none
        got = rb.band(block, touched[r0:r1], start - r0, y1 - r0, y0 - r0, r1 > y1, above, r0)
        if got is not None and got["guess"] is None:
            got["guess"] = above
        return got

    def work(band):
        y0, y1 = band
        if not (y0 > 0 and needed[y0 - 1]):
            return run(y0, y1, none)           # the top of a run of rows: no data above
        # one thread: the bands in order, each from the true state the band before left
        return run(y0, y1, truth["post"] if halo is None else None)

    redo = _RedoFile(redo_path)
    freeing = ThreadPoolExecutor(1, thread_name_prefix="pfm-sums")
    freed = 0
    walked = 0
    bands = pfm.ordered_imap(work, _sum_bands(needed, w), threads, name="pfm-area")
    try:
        for band, out in zip(_sum_bands(needed, w), bands):
            y0, y1 = band
            if out is None:
                return None
            true_above = truth["post"] if y0 > 0 and needed[y0 - 1] else none
            if not out["guess"].same(true_above):
                # the guess did not meet the true state in time: the band again, from it
                out = run(y0, y1, true_above)
                if out is None:
                    return None
            counts = out["counts"]
            summary.count_row(counts, rows=y1 - y0)
            walked += int(counts[8])
            if out["changed"].size and changed is not None:
                changed.append(out["changed"])
                if running is not None:
                    running.append(out["running"])
            if out["redo"].shape[0]:     # a row at a time (a crash point after each)
                a = 0
                for b in np.unique(out["row_end"]).tolist():
                    if b > a:
                        redo.add(out["redo"][a:b])
                    a = b
            truth["post"] = out["post"]
            # by all the band's soundings, not the few walked: the chains of cut bins are all
            # over the .ndx, and each fault maps 64 kB around it (counting only the walked
            # ones, the map's pages were let go 3 times on the 74-file survey: RSS 2.5 GB)
            view.drop_pages(out["soundings"])
            # rows no band reads again: the next starts its halo and guess above its first
            keep = max(freed, y1 - (AREA_HALO_ROWS + 1))
            if keep > freed:
                freeing.submit(sums.free, freed * w, (keep - freed) * w)
                freed = keep
        redo.sync()
    finally:
        bands.close()
        freeing.shutdown(wait=True)
        redo.close()
        mapped.clear()
        view.close()
    return _report(summary), redo.record(), walked


def _sum_bands(needed: np.ndarray, width: int):
    """Bands ``(row0, row1)`` of consecutive needed rows, :data:`_SUM_ROWS_BYTES` of sums
    each at most (one row at least)."""
    from .pfm._area_sums import SUM_DTYPE

    rows = max(1, _SUM_ROWS_BYTES // max(1, width * SUM_DTYPE.itemsize))
    h = needed.size
    y = 0
    while y < h:
        if not needed[y]:
            y += 1
            continue
        y1 = y
        while y1 < h and needed[y1] and y1 - y < rows:
            y1 += 1
        yield y, y1
        y = y1


class _RedoFile(J.Int64Log):
    """The area filter's redo file as it is written: its entries appended, with their count
    and CRC for the journal (:meth:`record`); a crash point after each row's."""

    def __init__(self, path):
        super().__init__(path, size=0)
        self.count, self.crc = 0, 0

    def add(self, rec: np.ndarray) -> None:
        """Append ``rec`` ((n, 3) entries: record offset, slot, validity)."""
        self.crc = zlib.crc32(self.append(rec), self.crc)
        self.count += rec.shape[0]
        crash_point("area-filter-row")

    def record(self) -> dict:
        """The redo file's record for the journal."""
        return {"file": J.REDO_NAME, "count": self.count, "crc": self.crc, "size": self.size}


def _report(summary) -> dict:
    """The filter's summary as the load report gives it (plain JSON values)."""
    out = summary.as_dict()
    out["flagged"] = out.get("cut", 0)
    return json.loads(json.dumps(out, default=_plain))


#: bytes of sums a band of :func:`run_area_filter_sums` filters (rows of the grid): on the
#: 74-file survey 52 rows, two of which a band runs before its own from a guess
_SUM_ROWS_BYTES = 16 << 20


def _needed_rows(touched: np.ndarray) -> np.ndarray:
    """The rows the filter reads: a row with bins to filter, or a neighbour of one."""
    rows_touched = touched.any(axis=1)
    needed = rows_touched.copy()
    needed[1:] |= rows_touched[:-1]
    needed[:-1] |= rows_touched[1:]
    return needed


def _make_filter(g, cfg):
    """The load's :class:`~pfm_dask.filters.AreaFilter` over grid ``g``."""
    from .filters import AreaFilter

    # Metre bins: the true diagonal (pfmLoader's 2*sqrt(size) is right only for 2 m);
    # degree bins: the geodesic diagonal, as pfmLoader computes it.
    diag = g.bin_diagonal_m() if cfg.bin_size_deg is not None else None
    return AreaFilter(g.width, g.height,
                      bin_size_xy=g.bin_size_xy if cfg.bin_size_deg is None else 0.0,
                      bin_diagonal=diag, cellstd=cfg.cellstd, deep_only=cfg.deep_only,
                      null_depth=cfg.null_depth)


#: rows a band filters before its own, from a guess, when bands run at once (_filter_band)
AREA_HALO_ROWS = 2
_FIELDS = ("row", "col", "depth", "validity", "record_offset", "slot")
_BUFFERS = threading.local()    # each thread's arrays for its bands' soundings (reused)


def _read_rows(f, view, r0: int, r1: int) -> dict:
    """The soundings of rows ``r0 .. r1 - 1`` (column, depth, validity, record address and
    slot, by bin then chain order) and ``cut``: where each row's begin, and the total. One
    compiled pass over the rows' chains (``band_soundings``) when ``view`` maps the .ndx;
    otherwise, or on a broken chain (which it then reports), the store's reader."""
    if view is not None:
        W = f.width
        got = list(f.raw_records_with_data([(r0 * W, r1 * W)]))
        bidx = np.concatenate([b for b, _ in got]) if got else np.zeros(0, np.int64)
        recs = (np.concatenate([r for _, r in got]) if got
                else np.zeros((0, f.bin_record_size), np.uint8))
        bufs = getattr(_BUFFERS, "arrays", None)
        if bufs is None:
            bufs = _BUFFERS.arrays = {}
        s = band_soundings(view, recs, bidx % W, bufs, skip=_PRE_SKIP)
        if s is not None:
            first = np.searchsorted(bidx // W, np.arange(r0, r1 + 1))
            s["cut"] = s.pop("start")[first]
            s["bin_cut"], s["bin_col"] = first, bidx % W
            return s
    s = f.read_soundings(r0, r1, fields=_FIELDS)
    s["cut"] = np.searchsorted(s["row"], np.arange(r0, r1 + 1))
    return s


def _filter_band(f, filt, touched, needed, y0: int, y1: int, halo: int | None, above,
                 view=None):
    """The area filter's rows ``y0 .. y1 - 1`` (consecutive needed rows), read from ``f``
    in one go (:func:`_read_rows`), on any thread: the redo records of each row with cuts, the band's summary,
    its last row's post-filter statistics (``post``), and ``guess``.

    Row y's cuts depend on the soundings and on row y - 1's post-filter statistics only.
    ``halo`` None: ``above`` is that state for row y0 - 1 (``None``: no data), and the band
    is exact (``guess`` None). Otherwise the band starts ``halo`` rows early (not above
    the run of needed rows, where the state is known: no data) from row start - 1's
    pre-filter statistics, and ``guess`` is what it reaches for row y0 - 1: its rows are
    the plain pass's when that equals, bit for bit, the true state the band before
    leaves, which the caller checks (else it runs the band again with ``halo`` None).
    """
    start = y0
    if halo is not None:
        while start > 0 and start > y0 - halo and needed[start - 1]:
            start -= 1
    seed = halo is not None and start > 0 and needed[start - 1]   # guess from row start - 1
    r0 = start - 1 if seed else start
    r1 = y1 + 1 if y1 < needed.size and needed[y1] else y1
    s = _read_rows(f, view, r0, r1)
    cut = s["cut"]
    rows = {y: slice(cut[y - r0], cut[y - r0 + 1]) for y in range(r0, r1)}
    from .filters import RowSoundings

    def read_row(y: int):
        if y not in rows:
            return None
        sl = rows[y]
        return RowSoundings(col=s["col"][sl], depth=s["depth"][sl],
                            validity=s["validity"][sl].astype(np.uint32, copy=False),
                            active=touched[y], pre=_row_pre(s, y - r0, filt.width))

    guess = None
    if halo is not None:
        above = filt.pre_stats(read_row(start - 1), start - 1) if seed else None
    res = filt.band(read_row, start, y1, above, keep_from=y0)
    if halo is not None:
        if start < y0:
            guess = res["boundary"]
        else:
            guess = above if above is not None else filt.none_stats(filt.width)
    redo, changed = [], []
    for r in res["results"]:
        if r.changed_cols.size:
            changed.append(r.row * filt.width + r.changed_cols.astype(np.int64))
        if r.index.size:
            i = r.index + rows[r.row].start
            rec = np.empty((i.size, 3), dtype=_REDO_DTYPE)
            rec[:, 0] = s["record_offset"][i]
            rec[:, 1] = s["slot"][i]
            rec[:, 2] = r.validity
            redo.append(rec)
    return {"rows": (y0, y1), "redo": redo, "summary": res["summary"], "post": res["post"],
            "guess": guess, "soundings": int(cut[-1]),
            "changed": np.concatenate(changed) if changed else np.zeros(0, np.int64)}


#: soundings left out of the filter's pre-filter statistics (filters._area: INVAL, DELETED)
_PRE_SKIP = V.INVAL | V.DELETED


def _row_pre(s: dict, i: int, width: int):
    """Row ``i`` (of those read)'s pre-filter statistics per column, from the per-bin ones
    the read summed (``band_soundings``), or ``None`` (the filter computes them)."""
    if "bin_cut" not in s:
        return None
    a, b = int(s["bin_cut"][i]), int(s["bin_cut"][i + 1])
    cols = s["bin_col"][a:b]
    data, avg, std = np.zeros(width, np.bool_), np.zeros(width), np.zeros(width)
    data[cols], avg[cols], std[cols] = s["bin_data"][a:b], s["bin_avg"][a:b], s["bin_std"][a:b]
    return data, avg, std


def area_bands(f, needed: np.ndarray, row_counts=None):
    """Bands ``(row0, row1)`` of consecutive needed rows holding about
    ``AREA_BAND_SOUNDINGS`` soundings (a heavier row is a band of its own), planned from
    the soundings per row (``row_counts(f, r0, r1)``, by default :func:`_row_counts`), a
    block of rows at a time (the first bands go to the threads before the rest is planned)."""
    row_counts = row_counts or _row_counts
    w, h = f.width, f.height
    step = max(1, _PLAN_BINS // w)
    start, tot = None, 0
    for r0 in range(0, h, step):
        r1 = min(h, r0 + step)
        per_row = (row_counts(f, r0, r1) if needed[r0:r1].any()
                   else np.zeros(r1 - r0, np.int64))
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


#: bins whose records area_bands reads at once to plan
_PLAN_BINS = 1 << 18


def _row_counts(f, r0: int, r1: int) -> np.ndarray:
    """The soundings of each row ``r0 .. r1 - 1``: the count field of the records that
    hold data (holes of the sparse ``.bin`` and empty records not read or decoded), read by
    one compiled pass over their bytes."""
    w = f.width
    f._sync()
    per_row = np.zeros(r1 - r0, np.int64)
    for bidx, recs in f.raw_records_with_data([(r0 * w, r1 * w)], chunk=(r1 - r0) * w):
        cnt = record_fields(recs, f._bin_layout, ["num_soundings"])["num_soundings"]
        per_row += np.bincount(bidx // w - r0, weights=cnt.astype(np.float64),
                               minlength=r1 - r0).astype(np.int64)   # exact below 2**53
    return per_row


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
