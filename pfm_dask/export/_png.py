"""PNG quick-look of a PFM: hillshaded, colour-coded depth beside the sounding density.

Made for a glance after a long load, not for measuring. The grid is block
averaged down to at most ``max_pixels`` per side while it streams (sums and
counts per block with ``np.bincount``), so a grid of any size costs one small
image in memory. Panel 1: the surface coloured by depth, shaded by a light
from the north-west, with colour bar, scale bar and a title naming the file,
bin size and counts. Panel 2: valid soundings per bin (block mean, log scale).
Drawn with matplotlib's object API (no pyplot state, Agg renderer).
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..errors import ConfigError, PfmDaskError
from ._surface import (DEFAULT_MEMORY, DEFAULT_SURFACE, check_surface, read_tiles,
                       replace_atomically, temp_path)

__all__ = ["write_png", "block_reduce_surface"]


def block_reduce_surface(f, surface: str, memory: int, factor: int) -> dict:
    """Block means of the surface and of the valid-sounding count over ``factor`` x ``factor`` bins.

    Returns ``depth`` (float64, NaN where a block has no surface value),
    ``count`` (mean valid soundings per bin of the block, empty bins
    included), and totals: ``bins_with_surface``, ``soundings``,
    ``valid_soundings``. Arrays are (rows, cols), row 0 the southmost.
    """
    W, H = f.width, f.height
    bw, bh = -(-W // factor), -(-H // factor)
    zsum = np.zeros(bh * bw, dtype=np.float64)
    zn = np.zeros(bh * bw, dtype=np.int64)
    csum = np.zeros(bh * bw, dtype=np.float64)
    nbins = np.zeros(bh * bw, dtype=np.int64)
    tot = {"bins_with_surface": 0, "soundings": 0, "valid_soundings": 0}
    for t in read_tiles(f, surface, memory, row_multiple=factor):
        # only the block rows this tile touches: bincount over a short range, added in place
        b0, b1 = t.row0 // factor, (t.row1 - 1) // factor + 1
        n = (b1 - b0) * bw
        rb = np.arange(t.row0, t.row1) // factor - b0
        cb = np.arange(t.col0, t.col1) // factor
        idx = (rb[:, None] * bw + cb[None, :]).ravel()
        z = t.depth.ravel()
        ok = ~np.isnan(z)
        sl = slice(b0 * bw, b1 * bw)
        zsum[sl] += np.bincount(idx[ok], weights=z[ok].astype(np.float64), minlength=n)
        zn[sl] += np.bincount(idx[ok], minlength=n)
        csum[sl] += np.bincount(idx, weights=t.num_valid.ravel().astype(np.float64), minlength=n)
        nbins[sl] += np.bincount(idx, minlength=n)
        tot["bins_with_surface"] += int(ok.sum())
        tot["soundings"] += int(t.num_soundings.sum(dtype=np.int64))
        tot["valid_soundings"] += int(t.num_valid.sum(dtype=np.int64))
    with np.errstate(invalid="ignore", divide="ignore"):
        depth = np.where(zn > 0, zsum / np.maximum(zn, 1), np.nan).reshape(bh, bw)
        count = (csum / np.maximum(nbins, 1)).reshape(bh, bw)
    return {"depth": depth, "count": count, **tot}


def _nice_length(metres: float) -> float:
    """A round length (1, 2 or 5 x 10^k m) no longer than ``metres``."""
    if not metres > 0:
        return 1.0
    k = math.floor(math.log10(metres))
    for m in (5, 2, 1):
        if m * 10 ** k <= metres:
            return m * 10 ** k
    return 10 ** k


def _shade(depth: np.ndarray, dx: float, dy: float, cmap, norm):
    """RGBA image: colour by depth, soft-light blended with a hillshade of the elevation."""
    from matplotlib.colors import LightSource

    valid = ~np.isnan(depth)
    elev = -depth
    fill = float(np.nanmean(elev)) if valid.any() else 0.0
    elev = np.where(valid, elev, fill)
    rgb = cmap(norm(np.where(valid, depth, norm.vmin)))[..., :3]
    relief = float(np.ptp(elev[valid])) if valid.any() else 0.0
    if relief > 0 and elev.shape[0] > 1 and elev.shape[1] > 1:
        ls = LightSource(azdeg=315, altdeg=45)
        # exaggerate gentle seafloor so relief shows, a little, at any scale
        span = max(dx * elev.shape[1], dy * elev.shape[0])
        vert = float(np.clip(0.05 * span / relief, 1.0, 20.0))
        rgb = ls.shade_rgb(rgb, elev, fraction=1.0, blend_mode="soft", vert_exag=vert, dx=dx, dy=dy)
    rgba = np.empty(depth.shape + (4,), dtype=np.float64)
    rgba[..., :3] = np.clip(rgb, 0.0, 1.0)
    rgba[..., 3] = valid
    return rgba


def write_png(pfm_path, out, *, surface: str = DEFAULT_SURFACE, memory: int = DEFAULT_MEMORY,
              max_pixels: int = 1000, dpi: int = 100, title: str | None = None) -> dict:
    """Draw the quick-look PNG of a PFM; returns a summary (size in pixels, reduction factor)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise ConfigError("PNG quick-looks need matplotlib: pip install 'pfm-dask[plots]'") from err
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LogNorm, Normalize
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter
    from mpl_toolkits.axes_grid1.anchored_artists import AnchoredSizeBar

    from .. import geodesy
    from ..pfm import open_pfm

    check_surface(surface)
    out = os.fspath(out)
    tmp = temp_path(out) + ".png"
    f = open_pfm(pfm_path, "r")
    try:
        g = f.grid
        W, H = f.width, f.height
        factor = max(1, -(-max(W, H) // int(max_pixels)))
        red = block_reduce_surface(f, surface, memory, factor)
        name = os.path.basename(os.fspath(f.path))
    finally:
        f.close()
    depth, count = red["depth"], red["count"]
    cy = 0.5 * (g.min_y + g.max_y)
    cx = 0.5 * (g.min_x + g.max_x)
    m_per_deg_x = float(geodesy.inverse(cy, cx - 0.005, cy, cx + 0.005)[0]) / 0.01
    m_per_deg_y = float(geodesy.inverse(cy - 0.005, cx, cy + 0.005, cx)[0]) / 0.01
    dx, dy = g.x_bin * factor * m_per_deg_x, g.y_bin * factor * m_per_deg_y
    width_m, height_m = (g.max_x - g.min_x) * m_per_deg_x, (g.max_y - g.min_y) * m_per_deg_y
    extent = (g.min_x, g.max_x, g.min_y, g.max_y)
    aspect = m_per_deg_y / m_per_deg_x          # degrees drawn at true ground proportions

    valid = ~np.isnan(depth)
    if valid.any():
        lo, hi = np.percentile(depth[valid], [1, 99])
        if not hi > lo:
            lo, hi = lo - 0.5, hi + 0.5
    else:
        lo, hi = 0.0, 1.0
    cmap = matplotlib.colormaps["viridis_r"].with_extremes(bad=(0, 0, 0, 0))
    norm = Normalize(vmin=lo, vmax=hi, clip=True)
    rgba = _shade(depth, dx, dy, cmap, norm)

    wide = width_m >= 1.4 * height_m
    panel_ratio = height_m / max(width_m, 1e-9)
    if wide:
        fig_w = 10.0
        fig_h = min(14.0, max(4.0, 2 * fig_w * 0.82 * panel_ratio + 1.6))
        fig = Figure(figsize=(fig_w, fig_h), dpi=dpi, layout="constrained")
        ax1, ax2 = fig.subplots(2, 1)
    else:
        fig_h = 6.0
        fig_w = min(16.0, max(8.0, 2 * (fig_h - 1.2) / max(panel_ratio, 1e-9) + 2.5))
        fig = Figure(figsize=(fig_w, fig_h), dpi=dpi, layout="constrained")
        ax1, ax2 = fig.subplots(1, 2)
    total = (f"{red['bins_with_surface']:,} bins with a surface, {red['soundings']:,} soundings "
             f"({red['valid_soundings']:,} valid)")
    head = title or f"{name}  -  {surface}  -  bin {g.bin_size_xy:.3g} m ({W:,} x {H:,} bins)"
    fig.suptitle(f"{head}\n{total}" + (f"; drawn at 1:{factor} (block means)" if factor > 1 else ""),
                 fontsize=10)

    ax1.imshow(rgba, origin="lower", extent=extent, interpolation="nearest", aspect=aspect)
    ax1.set_facecolor((0.92, 0.92, 0.92))
    ax1.set_title("depth (hillshaded)", fontsize=9)
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax1, label="depth (m, positive down)",
                 shrink=0.9)
    bar_m = _nice_length(width_m / 5)
    bar_label = f"{bar_m / 1000:g} km" if bar_m >= 1000 else f"{bar_m:g} m"
    ax1.add_artist(AnchoredSizeBar(ax1.transData, bar_m / m_per_deg_x, bar_label, "lower right",
                                   pad=0.4, frameon=True, size_vertical=0.0))

    cmap2 = matplotlib.colormaps["magma"].with_extremes(bad=(0, 0, 0, 0), under=(0, 0, 0, 0))
    pos = count[count > 0]
    if pos.size:
        cmin, cmax = float(pos.min()), float(pos.max())
        cnorm = LogNorm(vmin=cmin, vmax=cmax if cmax > cmin else cmin * 10)
        shown = np.ma.masked_less_equal(count, 0)
    else:
        cnorm = LogNorm(vmin=1, vmax=10)
        shown = np.ma.masked_all(count.shape)
    ax2.imshow(shown, origin="lower", extent=extent, interpolation="nearest", aspect=aspect,
               cmap=cmap2, norm=cnorm)
    ax2.set_facecolor((0.92, 0.92, 0.92))
    ax2.set_title("sounding density", fontsize=9)
    cb = fig.colorbar(ScalarMappable(norm=cnorm, cmap=cmap2), ax=ax2,
                      label="valid soundings per bin", shrink=0.9)
    cb.ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    # minor ticks of a log axis: label the 2s and 5s only, so the labels never crowd
    cb.ax.yaxis.set_minor_formatter(FuncFormatter(
        lambda v, _pos: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
    cb.ax.tick_params(labelsize=7, which="both")
    for ax in (ax1, ax2):
        ax.set_xlabel("longitude (deg)", fontsize=8)
        ax.set_ylabel("latitude (deg)", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.ticklabel_format(useOffset=False, style="plain")
    try:
        fig.savefig(tmp, format="png", dpi=dpi)
        replace_atomically(tmp, out)
    except OSError as err:
        raise PfmDaskError(f"cannot write the PNG: {err}", path=out) from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    w_px, h_px = (int(round(v * dpi)) for v in fig.get_size_inches())
    return {"path": out, "format": "PNG", "surface": surface, "reduction": factor,
            "image_bins": list(depth.shape[::-1]), "pixels": [w_px, h_px],
            "bins_with_surface": red["bins_with_surface"], "soundings": red["soundings"],
            "valid_soundings": red["valid_soundings"]}
