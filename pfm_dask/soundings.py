"""One GSF file (or a ping range of one) → soundings sorted by bin, ready to write.

This is the work of a load's worker task, in plain numpy and Arrow, with no
Dask: decode the pings, drop what pfmLoader drops, map GSF beam flags to PFM
validity, place the beams on WGS-84, run the swath filter, assign bins, count
every sounding that does not reach the PFM and why, and sort by (bin, ping,
beam) so that the writer only writes.

Every beam decoded is accounted for exactly once::

    soundings_read = ping_skipped + beam_rejected + outside_area + loaded

Soundings whose depth lies outside the depth range are *loaded* (as pfmLoader
does: null depth, FILTER_INVAL | MODIFIED) and also counted in
``depth_out_of_range``.

Lines are not numbered here: whether a ping starts a new line depends on the
heading at the previous line start, which for a split file lies in another
task. The task returns, for every ping that contributed a sounding, its
heading and time; the writer, which sees the pieces of a file in order,
numbers the lines (:class:`pfm_dask.lines.LineTracker`). What the task hands over
(:class:`~pfm_dask.pieces.PreparedPiece`) is defined in :mod:`pfm_dask.pieces`.
"""

from __future__ import annotations

import time as _time

import numpy as np
import pyarrow as pa

from . import _task_kernels as K
from . import filters, gsf
from .geodesy import PLACE_NODES
from .pfm._grid import BinGrid
from .config import LoadConfig
from .errors import GsfError
from .pieces import BATCH_SCHEMA, PING_SCHEMA, Piece, PreparedPiece, empty_counts

__all__ = ["prepare_piece"]


def _nothing(piece: Piece, counts: dict, err: GsfError) -> PreparedPiece:
    """The result for a piece whose file could not be read at all."""
    return PreparedPiece(piece, pa.RecordBatch.from_pylist([], schema=BATCH_SCHEMA),
                         PING_SCHEMA.empty_table(), counts, [err.to_dict()])


#: soundings decoded, screened, placed and binned at a time: a piece's per-sounding work
#: arrays (a few hundred bytes a sounding) exist for one chunk only, the piece keeps the
#: result columns (46 bytes a sounding) until its one sort (docs/performance.md, memory)
CHUNK_SOUNDINGS = 1 << 17

# the result columns of a chunk, in BATCH_SCHEMA order, with the ping table's columns
_OUT = ("bin_index", "ping", "beam", "depth", "x_off", "y_off", "validity",
        "horizontal_error", "vertical_error")
_PINGS = ("ping", "heading", "time_sec", "time_nsec")


def _chunk_pings(piece: Piece, n_pings: int) -> int:
    """Pings per chunk: about CHUNK_SOUNDINGS soundings at the piece's estimated beams."""
    span = (n_pings if piece.stop_ping is None or piece.n_pieces == 1
            else max(1, piece.stop_ping - piece.start_ping))
    beams = piece.est_soundings / span if piece.est_soundings and span else 512.0
    return max(16, int(CHUNK_SOUNDINGS // max(1.0, beams)))


def prepare_piece(piece: Piece, grid: BinGrid, cfg: LoadConfig) -> PreparedPiece:
    """Decode, screen, place, filter, bin and sort one piece (see the module docstring).

    The piece is read and placed in chunks of pings (each with the swath filter's halo of
    context, as a piece has), then sorted once: the same soundings in the same order as in
    one pass, for a fraction of the memory."""
    t0 = _time.perf_counter()
    c0 = _time.thread_time()
    counts = empty_counts()
    halo = filters.swath_halo(cfg.swath.window_pings) if cfg.swath.enabled else 0
    parts, t_read = [], 0.0
    try:
        with gsf.GsfFile(piece.path, strict=False, remember=True) as f:
            damage = [d.to_dict() for d in f.damage]
            n = f.n_pings
            start = min(piece.start_ping, n)
            stop = n if piece.stop_ping is None else min(piece.stop_ping, n)
            step = _chunk_pings(piece, n)
            f.forget(stop + halo, n)   # what a first open's framing scan read past the piece
            for a in range(start, stop, step) if stop > start else [start]:
                b = min(stop, a + step)
                t_r = _time.perf_counter()
                lo, hi = max(0, a - halo), min(n, b + halo)
                cols = f.read_columns(*((lo, hi) if hi > lo else (0, 0)), per_ping=True)
                f.forget(0, lo)            # what reaching it read (a walk from an earlier ping)
                t_read += _time.perf_counter() - t_r
                parts.append(_place_chunk(cols, a, b, grid, cfg, counts))
                del cols
                f.forget(lo, b - halo)     # its pages are decoded (but the next halo's)
            # A decode error found while reading is added to the file's damage list.
            for d in f.damage:
                dd = d.to_dict()
                if dd not in damage:
                    damage.append(dd)
    except GsfError as err:  # not GSF at all, or unreadable from its first record
        return _nothing(piece, empty_counts(), err)
    except OSError as err:  # vanished, unreadable, a directory...
        return _nothing(piece, empty_counts(), GsfError(f"cannot read file: {err.strerror or err}",
                                                         path=piece.path))
    t_bin = _time.perf_counter()
    batch, pings = _sorted_batch(parts, grid)
    del parts
    t_end = _time.perf_counter()
    timings = {"decode": t_read, "place_filter_bin": t_bin - t0 - t_read,
               "sort_pack": t_end - t_bin, "cpu": _time.thread_time() - c0}
    return PreparedPiece(piece, batch, pings, counts, damage, timings)


def _concat(parts: list, names: tuple, key: str = "soundings") -> dict:
    out = {}
    for name in names:
        arrs = [p[key][name] for p in parts]
        out[name] = arrs[0] if len(arrs) == 1 else np.concatenate(arrs)
        for p in parts:  # the chunk's copy is no longer needed
            del p[key][name]
    return out


_COUNT_SLOTS = (("pings_read", K.PINGS_READ), ("soundings_read", K.SOUNDINGS_READ),
                ("ping_skipped", K.PING_SKIPPED), ("beam_rejected", K.BEAM_REJECTED),
                ("outside_area", K.OUTSIDE_AREA), ("loaded", K.LOADED),
                ("depth_out_of_range", K.DEPTH_OUT_OF_RANGE),
                ("invalid_by_gsf_flags", K.INVALID_BY_GSF_FLAGS))


def _valid(cols: dict, name: str, n: int) -> np.ndarray:
    """The rows of a decoded column that hold a value (all of them unless some ping lacks it)."""
    v = cols["_valid"].get(name)
    return np.ones(n, dtype=bool) if v is None else v


def _place_chunk(cols: dict, start: int, stop: int, grid: BinGrid, cfg: LoadConfig,
                 counts: dict) -> dict:
    """The soundings of pings ``(start, stop]`` (1-based) of the decoded columns ``cols``
    (:meth:`pfm_dask.gsf.GsfFile.read_columns` with ``per_ping=True``, which may hold halo
    pings around them) screened, placed and binned, unsorted; ``counts`` accumulates."""
    ping = cols["ping"]
    n = ping.size
    c = np.zeros(K.N_COUNTS, dtype=np.int64)
    depth_col = "depth"
    if cfg.use_nominal_depth:
        nominal = cols["_valid"].get("nominal_depth")
        if nominal is None or (n and nominal.any()):   # some row holds a nominal depth
            depth_col = "nominal_depth"
    flags_ok = _valid(cols, "beam_flags", n)
    keep = np.empty(n, dtype=bool)
    validity = np.empty(n, dtype=np.uint32)
    zlim = np.empty(n, dtype=np.float64)
    depth32 = np.empty(n if cfg.swath.enabled else 0, dtype=np.float32)
    # 1. screening, validity from the GSF flags, depth limits (pfmLoader's rules)
    K.kernel("screen")(ping, cols["latitude"], cols["longitude"], cols["ping_flags"],
                       cols[depth_col], _valid(cols, depth_col, n), cols["beam_flags"], flags_ok,
                       int(start), int(stop), filters.GSF_FLAG_TABLE, float(cfg.min_depth),
                       float(cfg.max_depth), float(cfg.null_depth), keep, validity, zlim,
                       depth32, c)
    # 2. the swath filter sees the whole window, halo pings included
    if cfg.swath.enabled:
        kw = {"window_pings": cfg.swath.window_pings, "window_beams": cfg.swath.window_beams}
        if cfg.swath.threshold is not None:
            kw["threshold"] = cfg.swath.threshold
        sel = np.flatnonzero(keep)
        sel_ping = ping[sel].astype(np.int64)
        own = (sel_ping > start) & (sel_ping <= stop)
        before = validity[sel]
        new_val, _stats = filters.swath_filter(sel_ping, cols["beam"][sel].astype(np.int64),
                                               depth32[sel].astype(np.float64), before,
                                               score_mask=own, **kw)
        validity[sel] = new_val
        counts["flagged_swath_filter"] += int(np.count_nonzero((new_val != before) & own))
    # 3. the kept soundings of the own pings placed on WGS-84 (one-beam pings: at the ping),
    # binned (soundings outside the grid or polygon counted and dropped) and written out
    out = {name: np.empty(n, dtype=BATCH_SCHEMA.field(name).type.to_pandas_dtype())
           for name in _OUT}
    # at most one row per ping (the per-ping columns' length), not per sounding: a piece of
    # one chunk keeps these arrays in its ping table until the writer has written it
    n_pings = cols["heading"].size
    pings = {name: np.empty(n_pings, dtype=PING_SCHEMA.field(name).type.to_pandas_dtype())
             for name in _PINGS}
    box = np.array([2**62, -1, 2**62, -1], dtype=np.int64)   # rows and columns of the bins
    k, g = K.kernel("place_emit")(
        ping, keep, int(start), int(stop), cols["latitude"], cols["longitude"], cols["heading"],
        cols["across_track"], _valid(cols, "across_track", n), cols["along_track"],
        _valid(cols, "along_track", n), *PLACE_NODES, *grid.kernel_args(), cols["beam"], zlim,
        validity, cols["horizontal_error"], _valid(cols, "horizontal_error", n),
        cols["vertical_error"], _valid(cols, "vertical_error", n),
        float(cfg.default_horizontal_error), float(cfg.default_vertical_error),
        cols["beam_flags"], flags_ok, filters.GSF_FLAG_TABLE, float(cfg.null_depth),
        cols["time_sec"], cols["time_nsec"], *(out[name] for name in _OUT),
        *(pings[name] for name in _PINGS), c, box)
    for key, slot in _COUNT_SLOTS:
        counts[key] += int(c[slot])
    return {"soundings": {name: v[:k] for name, v in out.items()},
            "pings": {name: v[:g] for name, v in pings.items()}, "box": box}


#: a piece whose soundings' bins fit in a box of at most this many bins per sounding (plus
#: _BOX_SLACK) is sorted by counting (one pass to size the box, one to count, one to place);
#: others by numpy's stable sort and a gather
_BOX_PER_SOUNDING = 4
_BOX_SLACK = 1 << 16


def _sorted_batch(parts: list, grid: BinGrid | None = None) -> tuple[pa.RecordBatch, pa.Table]:
    """The chunks' soundings as one batch sorted by (bin, ping, beam), and their pings."""
    ping_cols = _concat(parts, _PINGS, key="pings")
    out = _counting_sort(parts, grid.width) if grid is not None else None
    if out is None:
        cols = _concat(parts, _OUT)
        order = _bin_order(cols["bin_index"], cols["ping"], cols["beam"])
        out = [np.empty_like(cols[name]) for name in _OUT]
        K.kernel("gather")(order, *(cols[name] for name in _OUT), *out)
        del order, cols
    batch = pa.RecordBatch.from_arrays([_arrow(v, BATCH_SCHEMA.field(name).type)
                                        for name, v in zip(_OUT, out)], schema=BATCH_SCHEMA)
    pings = pa.table([_arrow(ping_cols[k], PING_SCHEMA.field(k).type) for k in _PINGS],
                     schema=PING_SCHEMA)
    return batch, pings


def _counting_sort(parts: list, width: int) -> list | None:
    """The chunks' soundings in (bin, ping, beam) order by a stable counting sort on the bin,
    as the output columns; None when that does not apply (soundings not in (ping, beam) order,
    or their bins spread over too large a box of rows and columns of the grid)."""
    soundings = [p["soundings"] for p in parts]
    n = sum(s["bin_index"].size for s in soundings)
    if n == 0:
        return None
    last = None
    for s in soundings:
        ping, beam = s["ping"], s["beam"]
        if ping.size == 0:
            continue
        if (ping.dtype != np.uint32 or beam.dtype != np.uint16
                or not K.kernel("in_order")(ping, beam)):
            return None
        if last is not None and (last[0], last[1]) > (int(ping[0]), int(beam[0])):
            return None
        last = (int(ping[-1]), int(beam[-1]))
    width = int(width)
    inv_w = 1.0 / width
    boxes = np.array([p["box"] for p in parts])
    r0, r1 = int(boxes[:, 0].min()), int(boxes[:, 1].max())
    c0, c1 = int(boxes[:, 2].min()), int(boxes[:, 3].max())
    span_c = c1 - c0 + 1
    span = (r1 - r0 + 1) * span_c
    if span > _BOX_PER_SOUNDING * n + _BOX_SLACK:
        return None
    nxt = np.zeros(span + 1, dtype=np.uint32)   # counts, then places: a piece has < 2**32 rows
    for s in soundings:
        K.kernel("bin_count")(s["bin_index"], width, inv_w, r0, c0, span_c, nxt)
    np.cumsum(nxt, out=nxt)
    out = [np.empty(n, dtype=soundings[0][name].dtype) for name in _OUT]
    for p, s in zip(parts, soundings):
        K.kernel("bin_scatter")(*(s[name] for name in _OUT), width, inv_w, r0, c0, span_c, nxt,
                                *out)
        p["soundings"] = {}      # the chunk's copy is no longer needed
    return out


def _arrow(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A numpy column as an Arrow array without a copy (the array keeps it alive)."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(typ, values.size, [None, pa.py_buffer(values)])


def _bin_order(bin_index: np.ndarray, ping: np.ndarray, beam: np.ndarray) -> np.ndarray:
    """``np.lexsort((beam, ping, bin_index))``; a stable sort on the bin alone when the
    soundings already come in (ping, beam) order, as decoded pings do (same result, faster)."""
    if ping.dtype == np.uint32 and beam.dtype == np.uint16:
        in_order = K.kernel("in_order")(ping, beam)
    else:
        in_order = K.kernel("in_order64")(np.ascontiguousarray(ping, dtype=np.int64),
                                          np.ascontiguousarray(beam, dtype=np.int64))
    if in_order:
        return np.argsort(bin_index, kind="stable")
    return np.lexsort((beam, ping, bin_index))
