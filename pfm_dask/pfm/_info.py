"""Look inside a PFM: ``info`` (a summary) and ``dump`` (everything as Parquet).

Both read through :mod:`._store`; ``dump`` streams by bands of rows into
``pyarrow.parquet.ParquetWriter``. The Parquet column names are fixed
(:data:`SOUNDING_COLUMNS`, :data:`BIN_COLUMNS`): other tools compare PFMs through them.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import PfmFormatError
from .. import validity as V
from ._check import _BAND_BINS, _BAND_SOUNDINGS
from ._check_band import _ExtremaCheck
from ._repeats import RepeatedRecords

__all__ = ["info", "dump", "SOUNDING_COLUMNS", "BIN_COLUMNS"]

#: Columns of the soundings Parquet file, in order (sorted by bin_y, bin_x, chain order).
SOUNDING_COLUMNS = ("file", "line", "ping", "beam", "bin_x", "bin_y", "x", "y", "depth",
                    "validity", "horizontal_error", "vertical_error")
#: Columns of the bins Parquet file, in order (bins with soundings, raster order).
BIN_COLUMNS = ("bin_x", "bin_y", "num_soundings", "num_valid", "std", "avg_filtered",
               "min_filtered", "max_filtered", "avg", "min", "max", "validity")


# ---------------------------------------------------------------------------
# info and dump (through the store)

def info(path) -> dict:
    """Geometry, bit widths, depth coding, counts and extremes of a PFM, JSON-serialisable."""
    from ._store import open_pfm

    f = open_pfm(path, "r")
    try:
        h = f.header
        W, H = f.width, f.height
        counts = {"bins": W * H, "bins_with_soundings": 0, "bins_with_data": 0,
                  "soundings": 0, "valid_soundings": 0}
        ext = _ExtremaCheck(W, np.float32(h.null_depth))
        step = max(1, _BAND_BINS // max(1, W))
        depth_q = 1.0 / float(np.float32(h.depth_scale))
        std_q = 1.0 / float(np.float32(h.std_scale))
        for r in range(0, H, step):
            b = f.read_bin_records(r, min(H, r + step))
            cnt = b["num_soundings"]
            has = cnt > 0
            counts["bins_with_soundings"] += int(has.sum())
            counts["bins_with_data"] += int(((b["validity"] & V.DATA) != 0).sum())
            counts["soundings"] += int(cnt.sum())
            counts["valid_soundings"] += int(b["num_valid"].sum())
            ext.update(b["bin_index"], cnt, b, b["validity"], depth_q, std_q)
        files = f.files()
        recomputed = {}
        names = {"bin_count_min": "min_bin_count", "bin_count_max": "max_bin_count",
                 "min_filtered": "min_filtered_depth", "max_filtered": "max_filtered_depth",
                 "min": "min_depth", "max": "max_depth", "min_std": "min_standard_deviation",
                 "max_std": "max_standard_deviation"}
        for k, name in names.items():
            if k in ext.v:
                val, bi, _ = ext.v[k]
                recomputed[name] = int(val) if "count" in name else val
                if "std" not in k:
                    recomputed[name.replace("_depth", "").replace("bin_count", "count") + "_coord"] = \
                        [int(bi % W), int(bi // W)]
        return {
            "path": os.fspath(path),
            "version": h.version,
            "creation_software": h.creation_software,
            "date": h.date,
            "geometry": {
                "min_x": h.min_x, "min_y": h.min_y, "max_x": h.max_x, "max_y": h.max_y,
                "x_bin_size_deg": h.x_bin_size, "y_bin_size_deg": h.y_bin_size,
                "bin_size_m": h.bin_size_xy, "width": W, "height": H,
                "polygon": [[float(a), float(b)] for a, b in h.points],
            },
            "bits": {k: int(getattr(h, k)) for k in (
                "count_bits", "std_bits", "depth_bits", "record_pointer_bits", "file_number_bits",
                "line_number_bits", "ping_number_bits", "beam_number_bits", "offset_bits",
                "validity_bits", "horizontal_error_bits", "vertical_error_bits")},
            "record_length": int(h.record_length),
            "bin_record_bytes": int(f.bin_record_size),
            "ndx_record_bytes": int(f.ndx_record_size),
            "depth": {"min_depth": -float(h.depth_offset), "null_depth": float(h.null_depth),
                      "max_depth": float(h.null_depth) - 1.0, "precision": depth_q,
                      "depth_scale": float(h.depth_scale), "depth_offset": float(h.depth_offset),
                      "std_scale": float(h.std_scale)},
            "counts": {**counts, "input_files": len(files),
                       "deleted_files": sum(1 for x in files if x.deleted),
                       "lines": len(f.lines()),
                       "ndx_records": int(f.ndx_size // f.ndx_record_size)},
            "header_extrema": {
                "min_filtered_depth": h.min_filtered_depth, "max_filtered_depth": h.max_filtered_depth,
                "min_filtered_coord": list(h.min_filtered_coord),
                "max_filtered_coord": list(h.max_filtered_coord),
                "min_depth": h.min_depth, "max_depth": h.max_depth,
                "min_coord": list(h.min_coord), "max_coord": list(h.max_coord),
                "min_bin_count": int(h.min_bin_count), "max_bin_count": int(h.max_bin_count),
                "min_count_coord": list(h.min_count_coord), "max_count_coord": list(h.max_count_coord),
                "min_standard_deviation": h.min_standard_deviation,
                "max_standard_deviation": h.max_standard_deviation},
            "bin_extrema": recomputed,
            "class_type": int(h.class_type),
            "average_filtered_name": h.average_filtered_name,
        }
    finally:
        f.close()


def _sounding_schema():
    import pyarrow as pa

    return pa.schema([
        ("file", pa.int32()), ("line", pa.int32()), ("ping", pa.int64()), ("beam", pa.int32()),
        ("bin_x", pa.int32()), ("bin_y", pa.int32()),
        pa.field("x", pa.float64(), metadata={"unit": "degrees east (longitude)"}),
        pa.field("y", pa.float64(), metadata={"unit": "degrees north (latitude)"}),
        pa.field("depth", pa.float64(), metadata={"unit": "m, positive down"}),
        ("validity", pa.int32()),
        pa.field("horizontal_error", pa.float32(), metadata={"unit": "m, -999 = null"}),
        pa.field("vertical_error", pa.float32(), metadata={"unit": "m, -999 = null"}),
    ])


def _bin_schema():
    import pyarrow as pa

    f32 = pa.float32()
    return pa.schema([
        ("bin_x", pa.int32()), ("bin_y", pa.int32()), ("num_soundings", pa.int64()),
        ("num_valid", pa.int64()), ("std", f32), ("avg_filtered", f32), ("min_filtered", f32),
        ("max_filtered", f32), ("avg", f32), ("min", f32), ("max", f32), ("validity", pa.int32()),
    ])


def dump(path, *, soundings=None, bins=None) -> dict:
    """Write a PFM's soundings and/or bins with soundings as Parquet; returns the counts.

    Soundings are sorted by (bin_y, bin_x), then chain order; positions ``x``
    (longitude) and ``y`` (latitude) are decoded as the library does. Bins
    are those with at least one sounding, in raster order, with their stored
    statistics (decoded float32). Streaming by bands of rows keeps memory
    bounded. Column names: :data:`SOUNDING_COLUMNS`, :data:`BIN_COLUMNS`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ._recompute import _plan_bands
    from ._store import open_pfm

    if soundings is None and bins is None:
        raise PfmFormatError("dump: give a soundings and/or a bins output path", path=path)
    f = open_pfm(path, "r")
    sw = bw = None
    n_snd = n_bins = 0
    once = RepeatedRecords(f)   # a chain with a cycle never gives a sounding twice
    try:
        if soundings is not None:
            sw = pq.ParquetWriter(os.fspath(soundings), _sounding_schema())
        if bins is not None:
            bw = pq.ParquetWriter(os.fspath(bins), _bin_schema())
        for r0, r1, c0, c1 in _plan_bands(f, None, None, _BAND_SOUNDINGS):
            if bw is not None:
                b = f.read_bin_records(r0, r1, c0, c1)
                has = b["num_soundings"] > 0
                if has.any():
                    cols = {"bin_x": b["col"][has].astype(np.int32),
                            "bin_y": b["row"][has].astype(np.int32),
                            "num_soundings": b["num_soundings"][has],
                            "num_valid": b["num_valid"][has]}
                    for k in ("std", "avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max"):
                        cols[k] = b[k][has].astype(np.float32)
                    cols["validity"] = b["validity"][has].astype(np.int32)
                    bw.write_table(pa.table(cols, schema=_bin_schema()))
                    n_bins += int(has.sum())
            if sw is not None:
                s = once.first_reads(f.read_soundings(r0, r1, c0, c1))
                if s["bin_index"].size:
                    lat, lon = f.decode_positions(s["col"], s["row"], s["x_off"], s["y_off"])
                    cols = {"file": s["file"].astype(np.int32), "line": s["line"].astype(np.int32),
                            "ping": s["ping"].astype(np.int64), "beam": s["beam"].astype(np.int32),
                            "bin_x": s["col"].astype(np.int32), "bin_y": s["row"].astype(np.int32),
                            "x": np.asarray(lon, dtype=np.float64), "y": np.asarray(lat, dtype=np.float64),
                            "depth": s["depth"].astype(np.float64),
                            "validity": s["validity"].astype(np.int32),
                            "horizontal_error": s["horizontal_error"].astype(np.float32),
                            "vertical_error": s["vertical_error"].astype(np.float32)}
                    sw.write_table(pa.table(cols, schema=_sounding_schema()))
                    n_snd += int(s["bin_index"].size)
    finally:
        if sw is not None:
            sw.close()
        if bw is not None:
            bw.close()
        f.close()
    out = {"path": os.fspath(path)}
    if soundings is not None:
        out["soundings"] = n_snd
        out["soundings_path"] = os.fspath(soundings)
        if once.dropped:
            out["repeated_soundings_dropped"] = once.dropped
    if bins is not None:
        out["bins"] = n_bins
        out["bins_path"] = os.fspath(bins)
    return out
