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

from . import filters, gsf
from ._arrays import runs, unique_sorted
from .pfm._grid import BinGrid
from .config import LoadConfig
from .errors import GsfError
from .pieces import BATCH_SCHEMA, PING_SCHEMA, Piece, PreparedPiece, empty_counts
from . import validity as V

__all__ = ["prepare_piece"]


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
    return col.fill_null(fill).to_numpy().astype(dtype, copy=False)


def _valid_mask(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        return np.zeros(table.num_rows, dtype=bool)
    col = table.column(name)
    if col.null_count == 0:
        return np.ones(table.num_rows, dtype=bool)
    return col.is_valid().to_numpy(zero_copy_only=False)


def _read_piece(piece: Piece, halo: int) -> tuple[pa.Table, list, int, int]:
    """Decode the piece's pings plus up to ``halo`` pings of context on each side."""
    with gsf.GsfFile(piece.path, strict=False) as f:
        damage = [d.to_dict() for d in f.damage]
        n = f.n_pings
        start = min(piece.start_ping, n)
        stop = n if piece.stop_ping is None else min(piece.stop_ping, n)
        lo = max(0, start - halo)
        hi = min(n, stop + halo)
        table = f.read(lo, hi) if hi > lo else f.read(0, 0)
        # A decode error found while reading is added to the file's damage list.
        for d in f.damage:
            dd = d.to_dict()
            if dd not in damage:
                damage.append(dd)
    return table, damage, start, stop


def prepare_piece(piece: Piece, grid: BinGrid, cfg: LoadConfig) -> PreparedPiece:
    """Decode, screen, place, filter, bin and sort one piece (see the module docstring)."""
    t0 = _time.perf_counter()
    c0 = _time.thread_time()
    counts = empty_counts()
    halo = filters.swath_halo(cfg.swath.window_pings) if cfg.swath.enabled else 0
    try:
        table, damage, start, stop = _read_piece(piece, halo)
    except GsfError as err:  # not GSF at all, or unreadable from its first record
        return _nothing(piece, counts, err)
    except OSError as err:  # vanished, unreadable, a directory...
        return _nothing(piece, counts, GsfError(f"cannot read file: {err.strerror or err}",
                                                path=piece.path))
    t_decode = _time.perf_counter()

    ping = _column(table, "ping", np.int64, 0)
    # Pings of the piece proper (the halo is context for the swath filter only).
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

    counts["pings_read"] = int(np.count_nonzero(unique_sorted(ping[own]))) if own.any() else 0
    counts["soundings_read"] = int(np.count_nonzero(own))

    # 1. Pings pfmLoader skips: bad position or the ignore-ping flag.
    ping_ok = (lat <= 90.0) & (lon <= 180.0) & ((ping_flags & 1) == 0)
    ping_ok &= np.isfinite(lat) & np.isfinite(lon)
    counts["ping_skipped"] = int(np.count_nonzero(own & ~ping_ok))

    # 2. Beams pfmLoader skips: zero depth, no beam-flags array, null beam (0x01).
    usable = filters.beam_usable(depth, beam_flags, has_flags)
    usable = np.where(single, True, usable)
    rejected = ping_ok & ~usable
    counts["beam_rejected"] = int(np.count_nonzero(own & rejected))
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
        counts["flagged_swath_filter"] = int(np.count_nonzero(changed & own[sel]))
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
    counts["outside_area"] = int(np.count_nonzero(~inside))
    idx_in = idx[inside]
    counts["loaded"] = int(idx_in.size)

    z = zlim[idx_in]
    val = validity[idx_in]
    counts["invalid_by_gsf_flags"] = int(np.count_nonzero(gsf_invalid[idx_in]))
    counts["depth_out_of_range"] = int(np.count_nonzero(out_of_range[idx_in]))

    bin_index = np.asarray(a.bin_index)[inside].astype(np.int64)
    order = _bin_order(bin_index, ping[idx_in], beam[idx_in])
    t_bin = _time.perf_counter()

    batch = pa.RecordBatch.from_arrays([
        pa.array(bin_index[order], pa.int64()),
        pa.array(ping[idx_in][order].astype(np.uint32)),
        pa.array(beam[idx_in][order].astype(np.uint16)),
        pa.array(z[order], pa.float64()),
        pa.array(np.asarray(a.x_off)[inside][order].astype(np.uint16)),
        pa.array(np.asarray(a.y_off)[inside][order].astype(np.uint16)),
        pa.array(val[order].astype(np.uint32)),
        pa.array(herr[idx_in][order], pa.float32()),
        pa.array(verr[idx_in][order], pa.float32()),
    ], schema=BATCH_SCHEMA)

    # Pings that contributed, for line numbering by the writer.
    if idx_in.size:
        contributing = unique_sorted(ping[idx_in])
        pos = first_idx[np.searchsorted(ping_values, contributing)]
        tsec = _column(table, "time_sec", np.int64, 0)[pos]
        tnsec = _column(table, "time_nsec", np.int64, 0)[pos].astype(np.int32)
        pings = pa.table([pa.array(contributing.astype(np.uint32)), pa.array(heading[pos]),
                          pa.array(tsec), pa.array(tnsec)], schema=PING_SCHEMA)
    else:
        pings = PING_SCHEMA.empty_table()
    t_end = _time.perf_counter()
    timings = {"decode": t_decode - t0, "place_filter_bin": t_bin - t_decode,
               "sort_pack": t_end - t_bin, "cpu": _time.thread_time() - c0}
    return PreparedPiece(piece, batch, pings, counts, damage, timings)


def _bin_order(bin_index: np.ndarray, ping: np.ndarray, beam: np.ndarray) -> np.ndarray:
    """``np.lexsort((beam, ping, bin_index))``; a stable sort on the bin alone when the
    soundings already come in (ping, beam) order, as decoded pings do (same result, faster)."""
    if ping.size > 1:
        dp = ping[1:] - ping[:-1]
        if np.all((dp > 0) | ((dp == 0) & (beam[1:] >= beam[:-1]))):
            return np.argsort(bin_index, kind="stable")
    return np.lexsort((beam, ping, bin_index))
