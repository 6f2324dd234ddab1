"""Surfaces people can open anywhere, made from a PFM: BAG, GeoTIFF, XYZ and PNG quick-looks.

Each writer streams the PFM's bins by bands of rows within a memory budget
(:func:`read_tiles`), so grids far larger than memory export in bounded
space. No Dask, no typer: the command line is ``pfm-dask export``.
See ``docs/products.md`` for what each product holds and why.
"""

from ._surface import (DEFAULT_MEMORY, DEFAULT_SURFACE, LAYERS, SURFACES, Tile, plan_tiles,
                       read_tiles, surface_label)
from ._bag import BAG_NULL, BAG_VERSION, TRACKING_LIST_DTYPE, bag_metadata_xml, write_bag
from ._geotiff import layer_descriptions, write_geotiff
from ._png import block_reduce_surface, write_png
from ._xyz import XYZ_HEADER, write_xyz

__all__ = [
    "SURFACES",
    "DEFAULT_SURFACE",
    "DEFAULT_MEMORY",
    "LAYERS",
    "Tile",
    "plan_tiles",
    "read_tiles",
    "surface_label",
    "write_bag",
    "bag_metadata_xml",
    "BAG_VERSION",
    "BAG_NULL",
    "TRACKING_LIST_DTYPE",
    "write_geotiff",
    "layer_descriptions",
    "write_xyz",
    "XYZ_HEADER",
    "write_png",
    "block_reduce_surface",
]
