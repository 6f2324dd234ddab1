"""The bin grid the loader bins soundings into: the PFM format's grid (:mod:`pfm_dask.pfm._grid`).

The format defines the grid, so the PFM codec owns it and needs nothing above itself; the
loader (pre-scan, tasks, writer) names it here.
"""

from .pfm._grid import (DEFAULT_OFFSET_BITS, MAX_BINS, MAX_POLY, BinAssignment, BinGrid,
                        point_in_polygon)

__all__ = ["BinGrid", "BinAssignment", "DEFAULT_OFFSET_BITS", "MAX_BINS", "MAX_POLY", "point_in_polygon"]
