"""A PFM's bins as surface tiles, read band by band under a memory budget.

Every exporter walks the grid through :func:`read_tiles`: rectangles of whole
rows (or, for a grid so wide that one row is over budget, pieces of a row),
south to north, each decoded once with ``PfmFile.read_bin_records``. The
budget covers the decoder's own temporaries, so peak memory stays near it
whatever the grid size.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..errors import ConfigError

__all__ = [
    "SURFACES",
    "DEFAULT_SURFACE",
    "DEFAULT_MEMORY",
    "LAYERS",
    "Tile",
    "plan_tiles",
    "read_tiles",
    "surface_label",
]

#: Bin statistics that can be exported as the surface (depths, metres, positive down).
SURFACES = ("avg_filtered", "min_filtered", "max_filtered", "avg")
#: The average of the valid soundings of each bin.
DEFAULT_SURFACE = "avg_filtered"
#: Memory budget of an export when none is given (bytes).
DEFAULT_MEMORY = 256 << 20
#: Layers of a GeoTIFF, in band order when all are chosen.
LAYERS = ("surface", "count", "std")

# Peak bytes per bin of one read: ``read_bin_records`` peaks at about 415 bytes
# per bin (measured with tracemalloc on v7 records); the tile arrays and the
# writers' temporaries add a few tens.
_BYTES_PER_BIN = 512

_LABELS = {
    "avg_filtered": "average of the valid soundings",
    "min_filtered": "shallowest valid sounding",
    "max_filtered": "deepest valid sounding",
    "avg": "average of all soundings (valid or not, deleted excluded)",
}


def surface_label(surface: str) -> str:
    """A few words saying which statistic a surface name is."""
    return _LABELS[check_surface(surface)]


def check_surface(surface: str) -> str:
    if surface not in SURFACES:
        raise ConfigError(f"unknown surface {surface!r}: choose one of {', '.join(SURFACES)}")
    return surface


@dataclass(frozen=True, eq=False)
class Tile:
    """Bins ``row0..row1-1`` x ``col0..col1-1``; arrays are (rows, cols), row 0 the southmost.

    ``depth`` is the chosen surface (float32, metres, positive down, NaN where
    the bin has none); ``std`` the standard deviation of the valid soundings
    (float32, NaN where fewer than two are valid, since one sounding has no
    spread); ``num_soundings`` and ``num_valid`` are counts (uint32).
    """

    row0: int
    row1: int
    col0: int
    col1: int
    depth: np.ndarray
    std: np.ndarray
    num_soundings: np.ndarray
    num_valid: np.ndarray


def plan_tiles(width: int, height: int, memory: int = DEFAULT_MEMORY, *,
               row_multiple: int = 1, from_north: bool = False) -> list[tuple[int, int, int, int]]:
    """Rectangles ``(row0, row1, col0, col1)`` covering the grid in raster order (south first).

    Bands of whole rows hold as many rows as the budget allows, rounded down
    to a multiple of ``row_multiple`` when at least that many fit (so HDF5
    chunks or TIFF tiles are written whole). ``from_north``: bands are cut
    from the north edge and listed north to south (the order of a north-up
    image). When one row alone is over budget, rows are cut into column pieces.
    """
    if memory <= 0:
        raise ConfigError(f"memory budget must be positive; got {memory}")
    per_row = width * _BYTES_PER_BIN
    rows = int(memory // per_row)
    out: list[tuple[int, int, int, int]] = []
    if rows >= 1:
        m = max(1, int(row_multiple))
        if rows >= m:
            rows -= rows % m
        rows = min(rows, height)
        if from_north:
            for top in range(height, 0, -rows):
                out.append((max(0, top - rows), top, 0, width))
        else:
            for r in range(0, height, rows):
                out.append((r, min(height, r + rows), 0, width))
        return out
    cols = max(1, int(memory // _BYTES_PER_BIN))
    for r in (range(height - 1, -1, -1) if from_north else range(height)):
        for c in range(0, width, cols):
            out.append((r, r + 1, c, min(width, c + cols)))
    return out


def read_tiles(pfm_file, surface: str = DEFAULT_SURFACE, memory: int = DEFAULT_MEMORY, *,
               row_multiple: int = 1, from_north: bool = False) -> Iterator[Tile]:
    """Decode the grid tile by tile (see :func:`plan_tiles`) into :class:`Tile` values."""
    check_surface(surface)
    null = np.float32(pfm_file.null_depth)
    W, H = pfm_file.width, pfm_file.height
    for r0, r1, c0, c1 in plan_tiles(W, H, memory, row_multiple=row_multiple,
                                     from_north=from_north):
        b = pfm_file.read_bin_records(r0, r1, c0, c1)
        shape = (r1 - r0, c1 - c0)
        nsnd = b["num_soundings"].astype(np.uint32).reshape(shape)
        nval = b["num_valid"].astype(np.uint32).reshape(shape)
        z = b[surface].astype(np.float32).reshape(shape)
        std = b["std"].astype(np.float32).reshape(shape)
        del b
        has = (z < null) & (nsnd > 0)
        if surface != "avg":
            has &= nval > 0
        z[~has] = np.nan
        std[nval < 2] = np.nan
        yield Tile(r0, r1, c0, c1, z, std, nsnd, nval)


def replace_atomically(tmp: str, out: str) -> None:
    """Move a finished output into place (same directory, so the rename is atomic)."""
    os.replace(tmp, out)


def temp_path(out) -> str:
    """A sibling temporary name for ``out``, written first and renamed when complete."""
    out = os.fspath(out)
    d, n = os.path.split(os.path.abspath(out))
    return os.path.join(d, f".{n}.{os.getpid()}.part")


def bin_centres(grid, row0: int, row1: int, col0: int, col1: int):
    """Longitudes of the columns' and latitudes of the rows' bin centres (degrees)."""
    lon = grid.min_x + (np.arange(col0, col1, dtype=np.float64) + 0.5) * grid.x_bin
    lat = grid.min_y + (np.arange(row0, row1, dtype=np.float64) + 0.5) * grid.y_bin
    return lon, lat


def depth_decimals(precision: float) -> int:
    """Decimals that show a depth quantised to ``precision`` without loss (0.01 -> 2)."""
    if not precision > 0:
        return 3
    return max(0, int(math.ceil(-math.log10(precision) - 1e-9)))
