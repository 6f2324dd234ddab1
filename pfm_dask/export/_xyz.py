"""XYZ text of a PFM surface: one ``longitude,latitude,depth`` line per bin with a value.

Positions are bin centres (degrees, WGS 84, 9 decimals like the PFM header);
depth is the chosen surface in metres, positive down as in the PFM, printed in fixed point
with the decimals of the PFM's depth precision (nothing the PFM stores is
lost). Bins come in the PFM's raster order (rows from the south, west to
east), the order of ``pfm-dask dump --bins``. Formatting is vectorised with
pyarrow, band by band.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import PfmDaskError
from ._surface import (DEFAULT_MEMORY, DEFAULT_SURFACE, bin_centres, check_surface, depth_decimals,
                       read_tiles, replace_atomically, temp_path)

__all__ = ["write_xyz", "XYZ_HEADER"]

#: First line of the file.
XYZ_HEADER = "longitude,latitude,depth"


def _fmt(values: np.ndarray, decimals: int):
    """Numbers as fixed-point text with ``decimals`` decimals (no exponent, no "-0")."""
    import pyarrow as pa
    import pyarrow.compute as pc

    scale = 10 ** decimals
    q = np.rint(values.astype(np.float64) * scale).astype(np.int64)
    neg = pa.array(np.where(q < 0, "-", ""))
    a = np.abs(q)
    text = pc.cast(pa.array(a // scale), pa.string())
    if decimals:
        frac = pc.utf8_lpad(pc.cast(pa.array(a % scale), pa.string()), decimals, "0")
        text = pc.binary_join_element_wise(text, frac, ".")
    return pc.binary_join_element_wise(neg, text, "")


def write_xyz(pfm_path, out, *, surface: str = DEFAULT_SURFACE, memory: int = DEFAULT_MEMORY,
              header: bool = True) -> dict:
    """Write the bins that have a surface value as ``lon,lat,depth`` CSV; returns a summary."""
    import pyarrow.compute as pc

    from ..pfm import open_pfm

    check_surface(surface)
    out = os.fspath(out)
    tmp = temp_path(out)
    f = open_pfm(pfm_path, "r")
    n = 0
    try:
        g = f.grid
        dec = depth_decimals(1.0 / float(np.float32(f.header.depth_scale)))
        try:
            with open(tmp, "w", encoding="ascii", newline="\n") as fh:
                if header:
                    fh.write(XYZ_HEADER + "\n")
                for t in read_tiles(f, surface, memory):
                    r, c = np.nonzero(~np.isnan(t.depth))
                    if not r.size:
                        continue
                    lon, lat = bin_centres(g, t.row0, t.row1, t.col0, t.col1)
                    line = pc.binary_join_element_wise(
                        _fmt(lon[c], 9), _fmt(lat[r], 9), _fmt(t.depth[r, c], dec), ",")
                    fh.write("\n".join(line.to_pylist()))
                    fh.write("\n")
                    n += int(r.size)
            replace_atomically(tmp, out)
        except OSError as err:
            raise PfmDaskError(f"cannot write the XYZ file: {err}", path=out) from err
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        f.close()
    return {"path": out, "format": "XYZ", "surface": surface, "points": n,
            "depth_decimals": dec}
