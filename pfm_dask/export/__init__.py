"""Surfaces people can open anywhere, made from a PFM: BAG, GeoTIFF, XYZ and PNG quick-looks.

Each writer streams the PFM's bins by bands of rows within a memory budget
(:func:`read_tiles`), so grids far larger than memory export in bounded
space. No Dask, no typer: the command line is ``pfm-dask export``.
See ``docs/products.md`` for what each product holds and why.
"""

from . import _bag, _geotiff, _png, _surface, _xyz
from ._bag import *  # noqa: F401,F403
from ._geotiff import *  # noqa: F401,F403
from ._png import *  # noqa: F401,F403
from ._surface import *  # noqa: F401,F403
from ._xyz import *  # noqa: F401,F403

__all__ = [*_surface.__all__, *_bag.__all__, *_geotiff.__all__, *_xyz.__all__, *_png.__all__]
