"""The bin grid of a geographic PFM, built and used exactly as the PFM library does.

The format defines this grid (its header fields, the library's binning), so the PFM codec
owns it; the loader imports it as :mod:`pfm_dask.bins`.

A grid made here is the grid pfmLoader would have made for the same area and
bin size (docs/geodesy-and-bins.md §3, §4; ``lib-pfm_lib : pfm_io.c`` ``write_bin_header``
init branch, ``read_bin_header``, ``compute_index_ptr``, ``bin_inside_ptr``;
``pfm_cached_io.c`` for the sounding offsets):

1. The MBR is the polygon's bounding box. Metre bins become degrees by
   stepping ``bin_size_m`` east and north from the MBR centre with the NGS
   direct geodesic (:func:`pfm_dask.geodesy.direct`).
2. ``width = int((max_x - min_x) / x_bin + 1)`` (C truncation), same for the
   height, and the max corner is pushed out to ``min + n * size``.
3. The library then writes the header as text and reads it straight back, so
   what it actually bins with are the printed values: corners and polygon
   points with 9 decimals, bin sizes with 15. :class:`BinGrid` holds those
   round-tripped values.
4. On every open the library recomputes ``bin_size_xy`` as the inverse
   geodesic length of one y bin at the (pushed-out) area centre.

Sounding positions: column/row by truncation, acceptance by the library's
crossings-multiply point-in-polygon test plus its MBR check, and sub-bin
offsets coded as ``NINT(frac * (2**bits - 1))`` with the offset held in a C
``float`` (:meth:`BinGrid.assign`, :meth:`BinGrid.decode_position`).

Dateline: an area crossing 180 degrees is handled as pfmLoad/pfmLoader do,
with longitudes east of the dateline written as ``lon + 360`` (so ``max_x >
180``); soundings with negative longitude then get +360 before binning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import geodesy
from .._numeric import CompiledKernels
from ..errors import ConfigError

__all__ = [
    "BinGrid",
    "BinAssignment",
    "DEFAULT_OFFSET_BITS",
    "MAX_BINS",
    "MAX_POLY",
    "point_in_polygon",
]

#: ``[OFFSET BITS]`` written by PFM library v7 (``PFM_OFFSET_BITS``).
DEFAULT_OFFSET_BITS = 12

#: Largest grid accepted: pfmLoader computes ``bin_width * bin_height`` in a
#: 32-bit ``int`` (its add map and bin loop), so larger grids overflow there.
MAX_BINS = 2**31 - 1

#: Most ``[POINT]`` polygon points the library accepts (``MAX_POLY`` in ``pfm.h``).
MAX_POLY = 2000


def _fmt(value: float, decimals: int) -> float:
    """The value the library reads back after printing it with ``%.<decimals>f``."""
    return float(f"{value:.{decimals}f}")


def point_in_polygon(poly_lat, poly_lon, lat, lon) -> np.ndarray:
    """The library's ``PointInsidePolygon`` (crossings-multiply test), vectorised over points.

    The polygon is closed implicitly (last point joins the first). A point is
    inside when an odd number of edges cross the ray going east from it; the
    half-open rule ``vertex_y >= y`` decides edges through the point's
    latitude, so points on edges and vertices fall inside or outside exactly as
    in the C code. Fewer than 3 points means nothing is inside
    (``bin_inside_ptr``). The test is :func:`_inside_polygon`, the one
    :meth:`BinGrid.assign` runs.
    """
    py = np.ascontiguousarray(poly_lat, dtype=np.float64)
    px = np.ascontiguousarray(poly_lon, dtype=np.float64)
    y, x = np.broadcast_arrays(np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64))
    inside = np.empty(y.size, dtype=bool)
    _kernel("point_in_polygon")(py, px, np.ascontiguousarray(y).reshape(-1),
                                np.ascontiguousarray(x).reshape(-1), inside)
    return inside.reshape(y.shape)


def _inside_polygon(poly_lat, poly_lon, y, x):
    """``PointInsidePolygon`` for one point: the C code's comparisons in its order,
    ``((py[i]-y) * (px[j]-px[i]) >= (px[i]-x) * (py[j]-py[i])) == yflag1`` at each crossing."""
    n_poly = poly_lat.size
    if n_poly < 3:
        return False
    ins = False
    j = n_poly - 1
    yflag0 = poly_lat[j] >= y
    for i in range(n_poly):
        yflag1 = poly_lat[i] >= y
        if yflag0 != yflag1:
            t = ((poly_lat[i] - y) * (poly_lon[j] - poly_lon[i])
                 >= (poly_lon[i] - x) * (poly_lat[j] - poly_lat[i]))
            if t == yflag1:
                ins = not ins
        yflag0 = yflag1
        j = i
    return ins


def _nint(v):
    """:func:`pfm_dask._numeric.nint` of one double (0 for NaN and out of range)."""
    shifted = v - 0.5 if v < 0.0 else v + 0.5
    if np.isfinite(shifted) and abs(shifted) < 9.2e18:
        return np.int64(math.trunc(shifted))
    return np.int64(0)


def _k_point_in_polygon(poly_lat, poly_lon, lat, lon, inside):  # pragma: no cover - compiled
    """numba kernel of :func:`point_in_polygon`."""
    for k in range(lat.size):
        inside[k] = _inside_polygon(poly_lat, poly_lon, lat[k], lon[k])


def _k_assign(lat, lon, dateline, min_x, min_y, max_x, max_y, x_bin, y_bin, width, height, scale,
              poly_lat, poly_lon, rect, rect_box, col, row, inside, bin_index, x_code,
              y_code):  # pragma: no cover
    """numba kernel of :meth:`BinGrid.assign`: :func:`_assign_points` over all the points."""
    _assign_points(lat, lon, 0, lat.size, dateline, min_x, min_y, max_x, max_y, x_bin, y_bin,
                   width, height, scale, poly_lat, poly_lon, rect, rect_box, col, row, inside,
                   bin_index, x_code, y_code)


def _assign_points(lat, lon, lo, hi, dateline, min_x, min_y, max_x, max_y, x_bin, y_bin, width,
                   height, scale, poly_lat, poly_lon, rect, rect_box, col, row, inside, bin_index,
                   x_code, y_code):
    """Points ``lo:hi`` of :meth:`BinGrid.assign` (see there). ``rect``: the polygon is the
    axis-parallel rectangle ``rect_box`` (south, west, north, east), so a point well inside it
    is inside the polygon without the test (:func:`_rectangle`). Shared with the load's task
    kernel (``pfm_dask._task_kernels``), which calls it once per ping.

    Two passes: the first, without a branch (so the compiler vectorises it), computes every
    point as a finite point well inside a rectangle grid, with offset codes below 2**51, and
    marks in ``inside`` the points that are so; the second redoes the others one at a time by
    :func:`_assign_one`, the library's path written out (on a grid whose polygon is not a
    rectangle, every point). Both do the same IEEE operations."""
    if not rect:   # every point needs the polygon test: no point is simple
        for k in range(lo, hi):
            _assign_one(lat, lon, k, dateline, min_x, min_y, max_x, max_y, x_bin, y_bin, width,
                        height, scale, poly_lat, poly_lon, rect, rect_box, col, row, inside,
                        bin_index, x_code, y_code)
        return
    ry0, rx0, ry1, rx1 = rect_box[0], rect_box[1], rect_box[2], rect_box[3]
    magic = 6755399441055744.0      # 1.5 * 2**52: adding it to an integer below 2**51 is exact
    magic_bits = np.float64(magic).view(np.int64)
    lim = 2.0**51
    n_slow = 0
    for k in range(lo, hi):
        y = lat[k]
        x0 = lon[k]
        x = x0 + 360.0 if (dateline and x0 < 0.0) else x0
        fx = (x - min_x) / x_bin
        fy = (y - min_y) / y_bin
        # NaN fails every comparison: such points are not simple (and never reach a conversion)
        vx = min(fx if fx >= 0.0 else -1.0, 2.0**31 - 1)
        vy = min(fy if fy >= 0.0 else -1.0, 2.0**31 - 1)
        c = np.int32(vx)
        r = np.int32(vy)
        xo = np.float64(np.float32(x - (min_x + np.float64(c) * x_bin)))
        yo = np.float64(np.float32(y - (min_y + np.float64(r) * y_bin)))
        vxc = (xo / x_bin) * scale
        vyc = (yo / y_bin) * scale
        sx = vxc - 0.5 if vxc < 0.0 else vxc + 0.5
        sy = vyc - 0.5 if vyc < 0.0 else vyc + 0.5
        simple = ((fx >= 0.0) & (fy >= 0.0) & (x >= min_x) & (x <= max_x) & (y >= min_y)
                  & (y <= max_y) & (c < width) & (r < height) & (y > ry0) & (y < ry1)
                  & (x - rx0 > _CLEAR) & (rx1 - x > _CLEAR) & (abs(sx) < lim) & (abs(sy) < lim))
        cx = np.float64(np.trunc(sx) + magic).view(np.int64) - magic_bits
        cy = np.float64(np.trunc(sy) + magic).view(np.int64) - magic_bits
        col[k] = c
        row[k] = r
        inside[k] = simple
        bin_index[k] = np.int64(r) * width + c
        x_code[k] = cx
        y_code[k] = cy
        n_slow += 0 if simple else 1
    if n_slow:
        for k in range(lo, hi):
            if not inside[k]:
                _assign_one(lat, lon, k, dateline, min_x, min_y, max_x, max_y, x_bin, y_bin,
                            width, height, scale, poly_lat, poly_lon, rect, rect_box, col, row,
                            inside, bin_index, x_code, y_code)


def _assign_one(lat, lon, k, dateline, min_x, min_y, max_x, max_y, x_bin, y_bin, width,
                height, scale, poly_lat, poly_lon, rect, rect_box, col, row, inside, bin_index,
                x_code, y_code):
    """Point ``k`` of :meth:`BinGrid.assign`: the library's path, with every check."""
    ry0, rx0, ry1, rx1 = rect_box[0], rect_box[1], rect_box[2], rect_box[3]
    y = lat[k]
    x = lon[k]
    if dateline and x < 0.0:
        x = x + 360.0
    fx = (x - min_x) / x_bin
    fy = (y - min_y) / y_bin
    finite = np.isfinite(fx) and np.isfinite(fy)
    vx = fx if finite else -1.0
    vy = fy if finite else -1.0
    vx = min(max(vx, -2.0**31), 2.0**31 - 1)
    vy = min(max(vy, -2.0**31), 2.0**31 - 1)
    c = np.int32(math.trunc(vx))
    r = np.int32(math.trunc(vy))
    col[k] = c
    row[k] = r
    ok = (finite and x >= min_x and x <= max_x and y >= min_y and y <= max_y
          and c >= 0 and c < width and r >= 0 and r < height)
    if ok and not (rect and y > ry0 and y < ry1 and x - rx0 > _CLEAR and rx1 - x > _CLEAR):
        ok = _inside_polygon(poly_lat, poly_lon, y, x)
    inside[k] = ok
    if ok:
        bin_index[k] = np.int64(r) * width + c
        # the offset from the bin corner is held in a C float before scaling
        xo = np.float64(np.float32(x - (min_x + np.float64(c) * x_bin)))
        yo = np.float64(np.float32(y - (min_y + np.float64(r) * y_bin)))
        x_code[k] = _nint((xo / x_bin) * scale)
        y_code[k] = _nint((yo / y_bin) * scale)
    else:
        bin_index[k] = -1
        x_code[k] = 0
        y_code[k] = 0


#: how far (degrees) inside a rectangle polygon's sides a point skips the polygon test: there
#: the test's products ``(lon_i - x) * (lat_j - lat_i)`` cannot underflow to zero, so it finds
#: one crossing (the east side) and says inside (sides at least _MIN_SIDE long)
_CLEAR = 1.0e-200
_MIN_SIDE = 1.0e-90


def _rectangle(poly: np.ndarray) -> np.ndarray | None:
    """``(south, west, north, east)`` when the polygon is an axis-parallel rectangle (4 corners,
    each side along a meridian or a parallel, in either direction), else None."""
    p = poly[:-1] if len(poly) == 5 and np.array_equal(poly[0], poly[-1]) else poly
    if len(p) != 4 or not np.isfinite(p).all():
        return None
    lats, lons = np.unique(p[:, 0]), np.unique(p[:, 1])
    if len(lats) != 2 or len(lons) != 2 or len({tuple(v) for v in p.tolist()}) != 4:
        return None
    nxt = np.roll(p, -1, axis=0)
    along_lat = p[:, 0] == nxt[:, 0]
    along_lon = p[:, 1] == nxt[:, 1]
    if not np.all(along_lat ^ along_lon) or not np.all(along_lat != np.roll(along_lat, -1)):
        return None
    if lats[1] - lats[0] < _MIN_SIDE or lons[1] - lons[0] < _MIN_SIDE:
        return None
    return np.array([lats[0], lons[0], lats[1], lons[1]])


def _signatures(T) -> dict:
    f8r = T.Array(T.float64, 1, "C", readonly=True)
    b1 = T.Array(T.boolean, 1, "C")
    i4, i8 = T.Array(T.int32, 1, "C"), T.Array(T.int64, 1, "C")
    u2, u4 = T.Array(T.uint16, 1, "C"), T.Array(T.uint32, 1, "C")
    return {
        "point_in_polygon": T.void(f8r, f8r, f8r, f8r, b1),
        "assign": T.void(f8r, f8r, T.boolean, *(T.float64,) * 6, T.int64, T.int64, T.float64, f8r,
                         f8r, T.boolean, f8r, i4, i4, b1, i8, u4, u4),
        # offset codes straight into uint16 (up to 16 offset bits: every PFM v7 file)
        "assign16": T.void(f8r, f8r, T.boolean, *(T.float64,) * 6, T.int64, T.int64, T.float64,
                           f8r, f8r, T.boolean, f8r, i4, i4, b1, i8, u2, u2),
    }


#: the compiled ``_k_<name>`` (compiled, or loaded from numba's on-disk cache, on first use;
#: no fastmath: each operation is the IEEE double or float operation written)
_k_assign16 = _k_assign
_kernel = CompiledKernels(globals(), _signatures,
                          helpers=("_inside_polygon", "_nint", "_assign_one", "_assign_points"))


@dataclass(frozen=True, eq=False)
class BinAssignment:
    """Where each sounding falls in a :class:`BinGrid` (arrays of one shape).

    ``col``/``row`` are the library's truncated indices (int32; -1 for NaN
    input, meaningless where ``inside`` is false). ``inside`` is true where the
    library would accept the sounding: inside the ``[POINT]`` polygon, inside
    the MBR, and in range. ``bin_index`` is ``row * width + col`` (int64, -1
    outside). ``x_off``/``y_off`` are the stored offset codes (uint16 for up to
    16 offset bits, else uint32; 0 outside).
    """

    col: np.ndarray
    row: np.ndarray
    inside: np.ndarray
    bin_index: np.ndarray
    x_off: np.ndarray
    y_off: np.ndarray


def _as_polygon(points) -> np.ndarray:
    poly = np.array(points, dtype=np.float64, copy=True)
    if poly.ndim != 2 or poly.shape[1] != 2:
        raise ConfigError(f"polygon must be a sequence of (lat, lon) pairs; got an array of shape {poly.shape}")
    if poly.shape[0] < 3:
        raise ConfigError(f"polygon needs at least 3 (lat, lon) points; got {poly.shape[0]}")
    if poly.shape[0] > MAX_POLY:
        raise ConfigError(f"polygon has {poly.shape[0]} points; the PFM library accepts at most {MAX_POLY}")
    if not np.all(np.isfinite(poly)):
        raise ConfigError("polygon points must be finite numbers (found NaN or infinity)")
    return poly


def _check_lat_lon(lat: np.ndarray, lon: np.ndarray, what: str) -> None:
    if np.any(np.abs(lat) > 90.0):
        raise ConfigError(f"{what}: latitudes must be within [-90, 90]; got {lat.min():.9f} .. {lat.max():.9f}")
    if np.any(lon < -180.0) or np.any(lon > 360.0):
        raise ConfigError(f"{what}: longitudes must be within [-180, 360] (east of the dateline may be "
                          f"written as lon+360); got {lon.min():.9f} .. {lon.max():.9f}")
    if lon.max() - lon.min() > 180.0:
        raise ConfigError(f"{what}: the area spans {lon.max() - lon.min():.6f} degrees of longitude; "
                          "if it crosses the dateline, write the longitudes east of 180 as lon+360 "
                          "(e.g. -179.5 -> 180.5), as pfmLoad does")


def _readonly(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a, dtype=np.float64)
    a.setflags(write=False)
    return a


@dataclass(frozen=True, eq=False)
class BinGrid:
    """A geographic PFM bin grid: corners, bin sizes, dimensions, polygon (docs/pfm-format.md §2).

    Values are those the library itself works with after creating the file:
    ``min_*``/``max_*`` (degrees, max pushed out to ``min + n * size``) and the
    polygon as printed with 9 decimals, ``x_bin``/``y_bin`` (degrees) with 15,
    and ``bin_size_xy`` (metres) recomputed as the library does on open.
    ``polygon`` is an N x 2 read-only array of (lat, lon) ``[POINT]`` values.
    Build one with :meth:`from_mbr`, :meth:`from_polygon` or
    :meth:`from_header_values`.
    """

    min_x: float
    min_y: float
    max_x: float
    max_y: float
    x_bin: float
    y_bin: float
    width: int
    height: int
    bin_size_xy: float
    polygon: np.ndarray
    offset_bits: int = DEFAULT_OFFSET_BITS

    # ------------------------------------------------------------------ constructors

    @classmethod
    def from_mbr(cls, south: float, west: float, north: float, east: float, *,
                 bin_size_m: float | None = 2.0, x_bin_deg: float | None = None,
                 y_bin_deg: float | None = None, offset_bits: int = DEFAULT_OFFSET_BITS) -> "BinGrid":
        """Grid for a rectangle, with metre bins (default 2 m) or degree bins.

        Degree bins: pass ``x_bin_deg`` and ``y_bin_deg`` (``bin_size_m`` is
        then ignored; the library is given ``bin_size_xy = 0`` and recomputes
        it on open). If ``west > east`` the area crosses the dateline and
        ``east`` is taken as ``east + 360``. The polygon is the 4 corners
        SW, NW, NE, SE, the order ABE tools use for a rectangle.
        """
        vals = [south, west, north, east]
        if not all(isinstance(v, (int, float, np.floating, np.integer)) and math.isfinite(v) for v in vals):
            raise ConfigError(f"area bounds must be finite numbers; got south={south}, west={west}, "
                              f"north={north}, east={east}")
        south, west, north, east = (float(v) for v in vals)
        if south >= north:
            raise ConfigError(f"south ({south}) must be less than north ({north})")
        if west == east:
            raise ConfigError(f"west and east are both {west}; the area has no width")
        if west > east:  # crosses the dateline: continue east of 180 as lon + 360
            east += 360.0
        poly = [(south, west), (north, west), (north, east), (south, east)]
        return cls._create(poly, bin_size_m, x_bin_deg, y_bin_deg, offset_bits)

    @classmethod
    def from_polygon(cls, points_latlon, *, bin_size_m: float | None = 2.0,
                     x_bin_deg: float | None = None, y_bin_deg: float | None = None,
                     offset_bits: int = DEFAULT_OFFSET_BITS) -> "BinGrid":
        """Grid for a polygon of (lat, lon) points, as pfmLoader builds it from an area file.

        The MBR is the polygon's bounding box. Polygons crossing the dateline
        must give longitudes east of 180 as ``lon + 360``.
        """
        return cls._create(points_latlon, bin_size_m, x_bin_deg, y_bin_deg, offset_bits)

    @classmethod
    def from_header_values(cls, *, min_x: float, min_y: float, max_x: float, max_y: float,
                           x_bin: float, y_bin: float, width: int, height: int, polygon,
                           offset_bits: int = DEFAULT_OFFSET_BITS,
                           bin_size_xy: float | None = None) -> "BinGrid":
        """Grid from the values parsed out of an existing PFM header.

        Values are used as given (they are already the printed ones).
        ``bin_size_xy`` is accepted so a reader can pass the whole header, but
        like the library on open it is ignored and recomputed from the y bin
        size at the area centre. Inconsistent headers raise :class:`ConfigError`.
        """
        poly = _as_polygon(polygon)
        vals = dict(min_x=min_x, min_y=min_y, max_x=max_x, max_y=max_y, x_bin=x_bin, y_bin=y_bin)
        for k, v in vals.items():
            if not math.isfinite(float(v)):
                raise ConfigError(f"header value {k} is not a finite number: {v!r}")
        if not (float(x_bin) > 0.0 and float(y_bin) > 0.0):
            raise ConfigError(f"header bin sizes must be positive; got x_bin={x_bin}, y_bin={y_bin}")
        if int(width) != width or int(height) != height or int(width) < 1 or int(height) < 1:
            raise ConfigError(f"header bin width/height must be positive integers; got {width} x {height}")
        if not (float(min_y) < float(max_y) and float(min_x) < float(max_x)):
            raise ConfigError(f"header MBR is empty or inverted: MIN Y {min_y}, MAX Y {max_y}, "
                              f"MIN X {min_x}, MAX X {max_x}")
        cls._check_offset_bits(offset_bits)
        return cls._finish(float(min_x), float(min_y), float(max_x), float(max_y), float(x_bin),
                           float(y_bin), int(width), int(height), poly, int(offset_bits))

    @staticmethod
    def _check_offset_bits(offset_bits) -> None:
        if int(offset_bits) != offset_bits or not 1 <= int(offset_bits) <= 32:
            raise ConfigError(f"offset_bits must be an integer from 1 to 32; got {offset_bits!r}")

    @classmethod
    def _create(cls, points, bin_size_m, x_bin_deg, y_bin_deg, offset_bits) -> "BinGrid":
        """The ``write_bin_header`` init branch followed by ``read_bin_header``."""
        cls._check_offset_bits(offset_bits)
        poly = _as_polygon(points)
        lat, lon = poly[:, 0], poly[:, 1]
        _check_lat_lon(lat, lon, "polygon")
        min_y, max_y = float(lat.min()), float(lat.max())
        min_x, max_x = float(lon.min()), float(lon.max())
        if not min_y < max_y:
            raise ConfigError(f"the area has no height: all latitudes are {min_y}")
        if not min_x < max_x:
            raise ConfigError(f"the area has no width: all longitudes are {min_x}")

        # centre of the input MBR (not of the final, pushed-out one)
        cy = min_y + (max_y - min_y) * 0.5
        cx = min_x + (max_x - min_x) * 0.5
        if x_bin_deg is not None or y_bin_deg is not None:
            if x_bin_deg is None or y_bin_deg is None:
                raise ConfigError("degree bins need both x_bin_deg and y_bin_deg")
            x_bin, y_bin = float(x_bin_deg), float(y_bin_deg)
            if not (math.isfinite(x_bin) and math.isfinite(y_bin) and x_bin > 0.0 and y_bin > 0.0):
                raise ConfigError(f"degree bin sizes must be positive; got x_bin_deg={x_bin_deg}, "
                                  f"y_bin_deg={y_bin_deg}")
        else:
            if bin_size_m is None or not math.isfinite(float(bin_size_m)) or float(bin_size_m) <= 0.0:
                raise ConfigError(f"bin_size_m must be a positive number of metres; got {bin_size_m!r}")
            s = float(bin_size_m)
            _, x2 = geodesy.direct(cy, cx, 90.0, s)
            x2 = float(x2)
            if cx > 180.0:  # direct() wrapped the longitude into [-180, 180]
                x2 = x2 + 360.0
            x_bin = x2 - cx
            if x_bin < -180.0:
                # centre within one bin west of 180 (or on it): the step wrapped but the library's
                # "centre > 180" fix-up did not apply, and pfm_lib would fail with a negative
                # width. We unwrap instead (no file the library could write is affected).
                x_bin += 360.0
            y2, _ = geodesy.direct(cy, cx, 0.0, s)
            y_bin = float(y2) - cy
            if not (math.isfinite(x_bin) and math.isfinite(y_bin) and x_bin > 0.0 and y_bin > 0.0):
                raise ConfigError(f"a {s} m bin at {cy:.6f}, {cx:.6f} gives unusable degree sizes "
                                  f"(x {x_bin!r}, y {y_bin!r}); is the area too close to a pole?")
        # count bins and push the max corner out (C int conversion truncates)
        fh = (max_y - min_y) / y_bin + 1.0
        fw = (max_x - min_x) / x_bin + 1.0
        if not (fh < 2**31 and fw < 2**31) or fh * fw > MAX_BINS:
            raise ConfigError(f"the grid would be about {int(fw):,} x {int(fh):,} bins, more than the "
                              f"{MAX_BINS:,} pfmLoader can index; use larger bins or a smaller area")
        height = int(fh)
        width = int(fw)
        max_y = min_y + height * y_bin
        max_x = min_x + width * x_bin
        # the header is written as text and read back: that is the grid the library uses
        poly9 = np.array([[_fmt(a, 9), _fmt(b, 9)] for a, b in poly], dtype=np.float64)
        return cls._finish(_fmt(min_x, 9), _fmt(min_y, 9), _fmt(max_x, 9), _fmt(max_y, 9),
                           _fmt(x_bin, 15), _fmt(y_bin, 15), width, height, poly9, int(offset_bits))

    @classmethod
    def _finish(cls, min_x, min_y, max_x, max_y, x_bin, y_bin, width, height, poly, offset_bits):
        if x_bin <= 0.0 or y_bin <= 0.0:
            raise ConfigError(f"bin sizes round to zero in the header (x {x_bin!r}, y {y_bin!r} degrees); "
                              "use larger bins")
        if width * height > MAX_BINS:
            raise ConfigError(f"{width:,} x {height:,} bins is more than the {MAX_BINS:,} pfmLoader can index")
        # read_bin_header: bin size in metres = geodesic length of one y bin at the area centre
        cy = min_y + (max_y - min_y) * 0.5
        cx = min_x + (max_x - min_x) * 0.5
        dist, _, _ = geodesy.inverse(cy, cx, cy + y_bin, cx)
        return cls(min_x=min_x, min_y=min_y, max_x=max_x, max_y=max_y, x_bin=x_bin, y_bin=y_bin,
                   width=width, height=height, bin_size_xy=float(dist), polygon=_readonly(poly),
                   offset_bits=offset_bits)

    # ------------------------------------------------------------------ value semantics

    def _key(self):
        return (self.min_x, self.min_y, self.max_x, self.max_y, self.x_bin, self.y_bin, self.width,
                self.height, self.bin_size_xy, self.offset_bits, self.polygon.shape, self.polygon.tobytes())

    def __eq__(self, other):
        if not isinstance(other, BinGrid):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    # ------------------------------------------------------------------ properties

    @property
    def n_bins(self) -> int:
        """Number of bin records, ``width * height``."""
        return self.width * self.height

    @property
    def dateline(self) -> bool:
        """True when the area continues east of 180 degrees (pfmLoader's test ``max_x > 180``)."""
        return self.max_x > 180.0

    @property
    def offset_scale(self) -> int:
        """Offset code of the far bin edge, ``2**offset_bits - 1`` (4095 for 12 bits)."""
        return (1 << self.offset_bits) - 1

    @property
    def _offset_dtype(self):
        return np.uint16 if self.offset_bits <= 16 else np.uint32

    # ------------------------------------------------------------------ binning

    def kernel_args(self) -> tuple:
        """The grid as the compiled assignment takes it (:func:`_assign_points`, after the
        points): dateline, MBR, bin sizes, dimensions, offset scale, polygon, rectangle."""
        poly = np.ascontiguousarray(self.polygon, dtype=np.float64)
        box = _rectangle(poly)
        return (bool(self.dateline), float(self.min_x), float(self.min_y), float(self.max_x),
                float(self.max_y), float(self.x_bin), float(self.y_bin), int(self.width),
                int(self.height), float(np.float32(self.offset_scale)),
                np.ascontiguousarray(poly[:, 0]), np.ascontiguousarray(poly[:, 1]),
                box is not None, np.zeros(4) if box is None else box)

    def assign(self, lat, lon) -> BinAssignment:
        """Bin, acceptance and offset codes of soundings at (lat, lon) degrees, vectorised.

        Follows pfmLoader's path for a sounding: +360 for negative longitudes
        on a dateline grid, the ``[POINT]`` polygon test, ``compute_index_ptr``
        truncation, the add routine's MBR check (inclusive), and the cached
        writer's offset coding ``NINT((float)(x - corner) / x_bin * scale)``.
        Points exactly on ``max_x``/``max_y`` would index one past the grid in
        the library; they are reported as not inside. Computed by the compiled
        :func:`_k_assign`, one point at a time.
        """
        y, x = np.broadcast_arrays(np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64))
        shape = y.shape
        y = np.ascontiguousarray(y).reshape(-1)
        x = np.ascontiguousarray(x).reshape(-1)
        n = y.size
        col = np.empty(n, dtype=np.int32)
        row = np.empty(n, dtype=np.int32)
        inside = np.empty(n, dtype=bool)
        bin_index = np.empty(n, dtype=np.int64)
        x_code = np.empty(n, dtype=self._offset_dtype)
        y_code = np.empty(n, dtype=self._offset_dtype)
        _kernel("assign16" if x_code.dtype == np.uint16 else "assign")(
            y, x, *self.kernel_args(), col, row, inside, bin_index, x_code, y_code)
        return BinAssignment(col=col.reshape(shape), row=row.reshape(shape),
                             inside=inside.reshape(shape), bin_index=bin_index.reshape(shape),
                             x_off=x_code.reshape(shape), y_off=y_code.reshape(shape))

    def decode_position(self, col, row, x_off, y_off):
        """Position (lat, lon) of stored soundings, as the library decodes them.

        ``min + col * size + offset`` where the offset is
        ``(float)code / (float)scale * size`` rounded to a C ``float``. On a
        dateline grid longitudes east of 180 are returned as stored (> 180).
        """
        c, r, xo, yo = np.broadcast_arrays(np.asarray(col), np.asarray(row), np.asarray(x_off),
                                           np.asarray(y_off))
        scale32 = np.float32(self.offset_scale)
        fx = (xo.astype(np.float32) / scale32).astype(np.float64)  # float / float in single
        fy = (yo.astype(np.float32) / scale32).astype(np.float64)
        dx = (fx * self.x_bin).astype(np.float32).astype(np.float64)
        dy = (fy * self.y_bin).astype(np.float32).astype(np.float64)
        lon = self.min_x + c.astype(np.float64) * self.x_bin + dx
        lat = self.min_y + r.astype(np.float64) * self.y_bin + dy
        return _scalar_or_array(lat), _scalar_or_array(lon)

    def bin_center(self, col, row):
        """Centre (lat, lon) of bins, ``min + i * size + size * 0.5`` as the library's bin records."""
        c, r = np.broadcast_arrays(np.asarray(col), np.asarray(row))
        lat = self.min_y + r.astype(np.float64) * self.y_bin + self.y_bin * 0.5
        lon = self.min_x + c.astype(np.float64) * self.x_bin + self.x_bin * 0.5
        return _scalar_or_array(lat), _scalar_or_array(lon)

    def bin_diagonal_m(self) -> float:
        """The bin diagonal (m) pfmLoader hands to its area filter.

        If the x and y degree sizes differ by less than 1e-6 degrees (minute
        bins), the inverse geodesic across one bin from the SW corner (from
        the NW corner going south when ``min_y <= 0``). Otherwise
        ``2 * sqrt(bin_size_xy)``, which equals the true diagonal only for
        2 m bins; it is kept because it is what pfmLoader uses (docs/filters.md §3).
        """
        if abs(self.x_bin - self.y_bin) < 0.000001:
            if self.min_y <= 0.0:
                d, _, _ = geodesy.inverse(self.max_y, self.min_x, self.max_y - self.y_bin,
                                          self.min_x + self.x_bin)
            else:
                d, _, _ = geodesy.inverse(self.min_y, self.min_x, self.min_y + self.y_bin,
                                          self.min_x + self.x_bin)
            return float(d)
        return 2.0 * math.sqrt(self.bin_size_xy)


def _scalar_or_array(a: np.ndarray):
    return a[()] if a.ndim == 0 else a
