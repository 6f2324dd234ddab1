"""The task's numpy path as it was before the compiled one (commit f3ca986): the independent
reference the tests compare :func:`pfm_dask.soundings.prepare_piece` with, column for column.

Arrow tables from :meth:`pfm_dask.gsf.GsfFile.read`, about forty numpy passes per chunk
(screening, GSF flags to validity, depth limits, the swath filter, placement, bins), then
``np.lexsort((beam, ping, bin_index))`` and per-column Arrow copies. Kept in the tests (and
timed by ``benchmarks/bench_prepare.py``), not in the package.
"""

from __future__ import annotations

import time as _time

import numpy as np
import pyarrow as pa

from pfm_dask import filters, gsf
from pfm_dask import validity as V
from pfm_dask._arrays import runs, unique_sorted
from pfm_dask.config import LoadConfig
from pfm_dask.errors import GsfError
from pfm_dask.pfm._grid import BinGrid
from pfm_dask.pieces import BATCH_SCHEMA, PING_SCHEMA, Piece, PreparedPiece, empty_counts

__all__ = ["prepare_piece_reference"]

def _nothing(piece: Piece, counts: dict, err: GsfError) -> PreparedPiece:
    """The result for a piece whose file could not be read at all."""
    return PreparedPiece(piece, pa.RecordBatch.from_pylist([], schema=BATCH_SCHEMA),
                         PING_SCHEMA.empty_table(), counts, [err.to_dict()])


def _column(table: pa.Table, name: str, dtype, fill=np.nan):
    """A column as numpy, with nulls replaced by ``fill`` (absent arrays → all fill)."""
    if name not in table.column_names:
        return np.full(table.num_rows, fill, dtype=dtype)
    col = table.column(name)
    if col.null_count == 0:
        return col.to_numpy().astype(dtype, copy=False)
    values, valid = _values_and_validity(col)
    return np.where(valid, values, fill).astype(dtype, copy=False)


def _valid_mask(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    col = table.column(name)
    if col.null_count == 0:
        return np.ones(table.num_rows, dtype=bool)
    return _values_and_validity(col)[1]


def _values_and_validity(col) -> tuple[np.ndarray, np.ndarray]:
    """A fixed-width column's values (null slots hold whatever the buffer holds) and its
    validity as booleans, read from the Arrow buffers: ``fill_null``/``is_valid`` would import
    ``pyarrow.compute``, a tenth of a second of a small load's start-up."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    n, off = len(arr), arr.offset
    bitmap, data = arr.buffers()[:2]
    values = np.frombuffer(data, dtype=arr.type.to_pandas_dtype())[off:off + n]
    if bitmap is None:
        return values, np.ones(n, dtype=bool)
    bits = np.unpackbits(np.frombuffer(bitmap, dtype=np.uint8), bitorder="little")
    return values, bits[off:off + n].astype(bool)


#: soundings decoded, screened, placed and binned at a time: a piece's per-sounding work
#: arrays (a few hundred bytes a sounding) exist for one chunk only, the piece keeps the
#: result columns (46 bytes a sounding) until its one sort (docs/performance.md, memory)
CHUNK_SOUNDINGS = 1 << 18

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


def prepare_piece_reference(piece: Piece, grid: BinGrid, cfg: LoadConfig) -> PreparedPiece:
    """Decode, screen, place, filter, bin and sort one piece, in numpy (see the module docstring).

    The piece is read and placed in chunks of pings (each with the swath filter's halo of
    context, as a piece has), then sorted once: the same soundings in the same order as in
    one pass, for a fraction of the memory."""
    t0 = _time.perf_counter()
    c0 = _time.thread_time()
    counts = empty_counts()
    halo = filters.swath_halo(cfg.swath.window_pings) if cfg.swath.enabled else 0
    parts, t_read = [], 0.0
    try:
        with gsf.GsfFile(piece.path, strict=False) as f:
            damage = [d.to_dict() for d in f.damage]
            n = f.n_pings
            start = min(piece.start_ping, n)
            stop = n if piece.stop_ping is None else min(piece.stop_ping, n)
            step = _chunk_pings(piece, n)
            for a in range(start, stop, step) if stop > start else [start]:
                b = min(stop, a + step)
                t_r = _time.perf_counter()
                lo, hi = max(0, a - halo), min(n, b + halo)
                table = f.read(lo, hi) if hi > lo else f.read(0, 0)
                t_read += _time.perf_counter() - t_r
                parts.append(_place_chunk(table, a, b, grid, cfg, counts))
                del table
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
    cols = _concat(parts, _OUT)
    ping_cols = _concat(parts, _PINGS, key="pings")
    del parts
    order = _bin_order(cols["bin_index"], cols["ping"], cols["beam"])
    arrays = []
    for name in _OUT:  # each column sorted, then its unsorted copy dropped
        arrays.append(pa.array(cols.pop(name)[order], BATCH_SCHEMA.field(name).type))
    del order
    batch = pa.RecordBatch.from_arrays(arrays, schema=BATCH_SCHEMA)
    pings = pa.table([pa.array(ping_cols[k], PING_SCHEMA.field(k).type) for k in _PINGS],
                     schema=PING_SCHEMA)
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


def _place_chunk(table: pa.Table, start: int, stop: int, grid: BinGrid, cfg: LoadConfig,
                 counts: dict) -> dict:
    """The soundings of pings ``(start, stop]`` (1-based) of ``table`` (which may hold halo
    pings around them) screened, placed and binned, unsorted; ``counts`` accumulates."""
    ping = _column(table, "ping", np.int64, 0)
    # Pings of the chunk proper (the halo is context for the swath filter only).
    own = (ping > start) & (ping <= stop)  # ``ping`` is 1-based
    beam = _column(table, "beam", np.int64, 0)
    lat = _column(table, "latitude", np.float64)
    lon = _column(table, "longitude", np.float64)
    heading = _column(table, "heading", np.float64)
    ping_flags = _column(table, "ping_flags", np.int64, 0)
    depth_col = "nominal_depth" if (cfg.use_nominal_depth and "nominal_depth" in table.column_names
                                   and table.column("nominal_depth").null_count < table.num_rows
                                   ) else "depth"
    depth = _column(table, depth_col, np.float64, 0.0).astype(np.float32)  # pfmLoader holds depth in a C float
    has_flags = _valid_mask(table, "beam_flags")
    beam_flags = _column(table, "beam_flags", np.int64, 0).astype(np.uint8)
    across = _column(table, "across_track", np.float64, 0.0)
    along_present = _valid_mask(table, "along_track")
    along = _column(table, "along_track", np.float64, 0.0)
    herr_present = _valid_mask(table, "horizontal_error")
    verr_present = _valid_mask(table, "vertical_error")
    herr = np.where(herr_present, _column(table, "horizontal_error", np.float64, 0.0),
                    cfg.default_horizontal_error).astype(np.float32)
    verr = np.where(verr_present, _column(table, "vertical_error", np.float64, 0.0),
                    cfg.default_vertical_error).astype(np.float32)

    # Beams per ping: a one-beam ping is loaded at the ping position with the
    # default errors and no depth/flag screening (pfmLoader's single-beam branch).
    ping_values, first_idx, per_ping = runs(ping)
    nbeams = np.repeat(per_ping, per_ping)
    single = nbeams == 1

    counts["pings_read"] += int(np.count_nonzero(unique_sorted(ping[own]))) if own.any() else 0
    counts["soundings_read"] += int(np.count_nonzero(own))

    # 1. Pings pfmLoader skips: bad position or the ignore-ping flag.
    ping_ok = (lat <= 90.0) & (lon <= 180.0) & ((ping_flags & 1) == 0)
    ping_ok &= np.isfinite(lat) & np.isfinite(lon)
    counts["ping_skipped"] += int(np.count_nonzero(own & ~ping_ok))

    # 2. Beams pfmLoader skips: zero depth, no beam-flags array, null beam (0x01).
    usable = filters.beam_usable(depth, beam_flags, has_flags)
    usable = np.where(single, True, usable)
    rejected = ping_ok & ~usable
    counts["beam_rejected"] += int(np.count_nonzero(own & rejected))
    keep = ping_ok & usable

    # 3. Validity from the GSF flags; the swath filter sees the whole window.
    validity = filters.gsf_flags_to_validity(beam_flags).astype(np.uint32)
    gsf_invalid = (validity & V.INVAL) != 0
    # Depths outside the range become the null depth, invalid (pfmLoader); done before
    # the swath filter so that they are neither tested nor used as neighbours.
    zlim, validity = filters.apply_depth_limits(depth.astype(np.float64), validity,
                                                cfg.min_depth, cfg.max_depth, cfg.null_depth)
    out_of_range = zlim == cfg.null_depth
    if cfg.swath.enabled:
        kw = {"window_pings": cfg.swath.window_pings, "window_beams": cfg.swath.window_beams}
        if cfg.swath.threshold is not None:
            kw["threshold"] = cfg.swath.threshold
        sel = np.flatnonzero(keep)
        new_val, _stats = filters.swath_filter(ping[sel], beam[sel], depth[sel].astype(np.float64),
                                               validity[sel], score_mask=own[sel], **kw)
        changed = new_val != validity[sel]
        validity[sel] = new_val
        counts["flagged_swath_filter"] += int(np.count_nonzero(changed & own[sel]))
    keep &= own

    # 4. Positions: across-track along heading+90, then along-track along heading.
    plat = lat.copy()
    plon = lon.copy()
    multi = keep & ~single
    if multi.any():
        idx = np.flatnonzero(multi)
        blat, blon = gsf.beam_positions(lat[idx], lon[idx], heading[idx], across[idx],
                                        along[idx], along_present=along_present[idx])
        plat[idx] = blat
        plon[idx] = blon

    # 5. Bins; soundings outside the grid or polygon are counted and dropped.
    idx = np.flatnonzero(keep)
    a = grid.assign(plat[idx], plon[idx])
    inside = np.asarray(a.inside, dtype=bool)
    counts["outside_area"] += int(np.count_nonzero(~inside))
    idx_in = idx[inside]
    counts["loaded"] += int(idx_in.size)
    counts["invalid_by_gsf_flags"] += int(np.count_nonzero(gsf_invalid[idx_in]))
    counts["depth_out_of_range"] += int(np.count_nonzero(out_of_range[idx_in]))

    # the hand-off's own width (pieces.BATCH_SCHEMA: 4 bytes, a grid has < 2**31 bins)
    out = {"bin_index": np.asarray(a.bin_index)[inside].astype(np.uint32),
           "ping": ping[idx_in].astype(np.uint32), "beam": beam[idx_in].astype(np.uint16),
           "depth": zlim[idx_in], "x_off": np.asarray(a.x_off)[inside].astype(np.uint16),
           "y_off": np.asarray(a.y_off)[inside].astype(np.uint16),
           "validity": validity[idx_in].astype(np.uint32),
           "horizontal_error": herr[idx_in], "vertical_error": verr[idx_in]}
    # Pings that contributed, for line numbering by the writer.
    contributing = unique_sorted(ping[idx_in]) if idx_in.size else np.zeros(0, np.int64)
    pos = first_idx[np.searchsorted(ping_values, contributing)]
    pings = {"ping": contributing.astype(np.uint32), "heading": heading[pos],
             "time_sec": _column(table, "time_sec", np.int64, 0)[pos],
             "time_nsec": _column(table, "time_nsec", np.int64, 0)[pos].astype(np.int32)}
    return {"soundings": out, "pings": pings}


def _bin_order(bin_index: np.ndarray, ping: np.ndarray, beam: np.ndarray) -> np.ndarray:
    """``np.lexsort((beam, ping, bin_index))``; a stable sort on the bin alone when the
    soundings already come in (ping, beam) order, as decoded pings do (same result, faster)."""
    if ping.size > 1:
        p0, p1 = ping[:-1], ping[1:]  # compared, not subtracted: the columns may be unsigned
        if np.all((p1 > p0) | ((p1 == p0) & (beam[1:] >= beam[:-1]))):
            return np.argsort(bin_index, kind="stable")
    return np.lexsort((beam, ping, bin_index))
