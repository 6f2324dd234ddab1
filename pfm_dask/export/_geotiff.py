"""GeoTIFF of a PFM surface, written through rasterio (GDAL), one band per chosen layer.

North-up, pixel-is-area: pixel (0, 0) is the north-west bin and the
geotransform puts pixel edges on the PFM's bin edges, in WGS 84 degrees
(EPSG:4326). Bands are float32 with NaN as no-data: ``surface`` (depth,
metres, positive down, as in the PFM), ``count`` (valid soundings) and
``std`` (standard deviation of the valid soundings, NaN below two). Tiled,
deflated, written tile by tile from bands of PFM rows.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError, PfmDaskError
from ._surface import (DEFAULT_MEMORY, DEFAULT_SURFACE, LAYERS, check_surface, plan_tiles,
                       read_tiles, replace_atomically, surface_label, temp_path)

__all__ = ["write_geotiff", "layer_descriptions"]

_BLOCK = 256          # tile width, and tile height when a band of rows holds that many


def layer_descriptions(surface: str) -> dict[str, str]:
    """Band descriptions written for each layer name."""
    return {"surface": f"depth (m, positive down): {surface}, {surface_label(surface)}",
            "count": "count: number of valid soundings in the bin",
            "std": "std (m): standard deviation of the valid soundings (NaN below two)"}


def _rasterio():
    try:
        import rasterio
        from rasterio.windows import Window
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ConfigError("GeoTIFF export needs rasterio: pip install 'pfm-dask[geotiff]'") from err
    return rasterio, Window


def write_geotiff(pfm_path, out, *, surface: str = DEFAULT_SURFACE, layers=LAYERS,
                  memory: int = DEFAULT_MEMORY) -> dict:
    """Write the chosen layers of a PFM surface as a tiled GeoTIFF; returns a summary dict."""
    from ..pfm import open_pfm

    check_surface(surface)
    layers = tuple(layers)
    bad = [x for x in layers if x not in LAYERS]
    if bad or not layers or len(set(layers)) != len(layers):
        raise ConfigError(f"GeoTIFF layers must be distinct names among {', '.join(LAYERS)}; "
                          f"got {', '.join(layers) or 'none'}")
    rasterio, Window = _rasterio()
    from rasterio.transform import Affine

    out = os.fspath(out)
    tmp = temp_path(out)
    f = open_pfm(pfm_path, "r")
    try:
        g = f.grid
        W, H = f.width, f.height
        # tile height: whole tiles per band of rows where the budget allows (a multiple of 16)
        band = plan_tiles(W, H, memory)[0]
        tile_h = int(min(_BLOCK, max(16, (band[1] - band[0]) // 16 * 16)))
        # GDAL's block cache holds two rows of tiles of every band, so partly written tiles
        # stay in memory until complete instead of being compressed, evicted and re-read
        tile_row = tile_h * (-(-W // _BLOCK) * _BLOCK) * 4 * len(layers)
        cache = max(2 * tile_row, 4 << 20)
        profile = {
            "driver": "GTiff", "width": W, "height": H, "count": len(layers), "dtype": "float32",
            "crs": "EPSG:4326", "nodata": float("nan"),
            "transform": Affine(g.x_bin, 0.0, g.min_x, 0.0, -g.y_bin, g.max_y),
            "tiled": True, "blockxsize": _BLOCK, "blockysize": tile_h,
            "compress": "deflate", "predictor": 3, "interleave": "band", "bigtiff": "if_safer",
        }
        desc = layer_descriptions(surface)
        n_tiles = 0
        try:
            with rasterio.Env(GDAL_CACHEMAX=int(cache), GDAL_NUM_THREADS=1):
                with rasterio.open(tmp, "w", **profile) as ds:
                    for i, name in enumerate(layers, start=1):
                        ds.set_band_description(i, desc[name])
                    ds.update_tags(PFM=os.path.basename(os.fspath(f.path)), SURFACE=surface,
                                   DEPTH_POSITIVE="down", SOFTWARE="pfm-dask")
                    for t in read_tiles(f, surface, memory, row_multiple=tile_h, from_north=True):
                        n_tiles += 1
                        win = Window(t.col0, H - t.row1, t.col1 - t.col0, t.row1 - t.row0)
                        for i, name in enumerate(layers, start=1):
                            a = {"surface": t.depth, "std": t.std}.get(name)
                            if a is None:
                                a = t.num_valid.astype(np.float32)
                            ds.write(a[::-1], i, window=win)
            replace_atomically(tmp, out)
        except (OSError, rasterio.errors.RasterioError) as err:  # disk full, unwritable path
            raise PfmDaskError(f"cannot write the GeoTIFF: {err}", path=out) from err
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        f.close()
    return {"path": out, "format": "GeoTIFF", "surface": surface, "layers": list(layers),
            "width": W, "height": H, "tiles_read": n_tiles}
