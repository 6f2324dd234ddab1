"""The PFM bin grid, bin assignment, polygon test and offset codes.

References: hand-worked grids from the library rules (docs/pfm-format.md §2-§4), a
slow per-point reimplementation written here (Franklin's PNPOLY for the
polygon, struct-based float32 rounding and decimal rounding for the offsets),
and geographiclib for the geodesic quantities.
"""

from __future__ import annotations

import math
import pickle
import struct
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfm_dask.bins import MAX_BINS, MAX_POLY, BinGrid, point_in_polygon
from pfm_dask.errors import ConfigError

try:  # independent reference for the geodesic quantities; the other tests run without it
    from geographiclib.geodesic import Geodesic
    GEOD = Geodesic.WGS84
except ImportError:  # pragma: no cover
    GEOD = None
needs_geographiclib = pytest.mark.skipif(GEOD is None, reason="geographiclib is not installed")


# ---------------------------------------------------------------------------- slow references

def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def round_half_away(x: float) -> int:
    return int(Decimal(x).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def pnpoly(poly_latlon, lat: float, lon: float) -> bool:
    """W. R. Franklin's even-odd ray test; agrees with any correct test away from edges."""
    inside = False
    n = len(poly_latlon)
    j = n - 1
    for i in range(n):
        yi, xi = poly_latlon[i]
        yj, xj = poly_latlon[j]
        if (yi > lat) != (yj > lat) and lon < (xj - xi) * (lat - yi) / (yj - yi) + xi:
            inside = not inside
        j = i
    return inside


def ref_assign(grid: BinGrid, lat: float, lon: float):
    """One sounding through pfmLoader's steps, written plainly. None when rejected."""
    x = lon + 360.0 if (grid.max_x > 180.0 and lon < 0.0) else lon
    y = lat
    if not (grid.min_x <= x <= grid.max_x and grid.min_y <= y <= grid.max_y):
        return None
    col = int((x - grid.min_x) / grid.x_bin)  # Python int() truncates toward zero, like a C cast
    row = int((y - grid.min_y) / grid.y_bin)
    if not (0 <= col < grid.width and 0 <= row < grid.height):
        return None
    if not pnpoly(grid.polygon.tolist(), y, x):
        return None
    scale = float(2 ** grid.offset_bits - 1)
    xo = f32(x - (grid.min_x + col * grid.x_bin))
    yo = f32(y - (grid.min_y + row * grid.y_bin))
    return col, row, round_half_away(xo / grid.x_bin * scale), round_half_away(yo / grid.y_bin * scale)


def check_against_reference(grid: BinGrid, lat: np.ndarray, lon: np.ndarray) -> int:
    got = grid.assign(lat, lon)
    n_in = 0
    for i in range(lat.size):
        ref = ref_assign(grid, float(lat[i]), float(lon[i]))
        if ref is None:
            assert not got.inside[i], (lat[i], lon[i])
            assert got.bin_index[i] == -1
            continue
        n_in += 1
        col, row, xo, yo = ref
        assert got.inside[i], (lat[i], lon[i])
        assert (got.col[i], got.row[i], got.x_off[i], got.y_off[i]) == (col, row, xo, yo), (lat[i], lon[i])
        assert got.bin_index[i] == row * grid.width + col
    return n_in


# ---------------------------------------------------------------------------- grid construction

@needs_geographiclib
def test_degree_bins_hand_worked_exact_multiple_gets_one_extra_bin():
    # width = int(1.0 / 0.125 + 1) = 9, not 8: the library always adds a bin, then pushes max out
    g = BinGrid.from_mbr(10.0, 20.0, 11.0, 21.0, x_bin_deg=0.125, y_bin_deg=0.25)
    assert (g.width, g.height) == (9, 5)
    assert (g.min_x, g.min_y, g.max_x, g.max_y) == (20.0, 10.0, 21.125, 11.25)
    assert (g.x_bin, g.y_bin) == (0.125, 0.25)
    assert g.n_bins == 45
    # SW, NW, NE, SE of the input MBR (not of the pushed-out one)
    assert g.polygon.tolist() == [[10.0, 20.0], [11.0, 20.0], [11.0, 21.0], [10.0, 21.0]]
    # [BIN SIZE XY]: geodesic length of one y bin at the centre of the final area
    cy, cx = 10.0 + 1.25 * 0.5, 20.0 + 1.125 * 0.5
    exact = GEOD.Inverse(cy, cx, cy + 0.25, cx)["s12"]
    assert g.bin_size_xy == pytest.approx(exact, abs=1e-3)


def test_degree_bins_hand_worked_non_multiple():
    # 10.9 - 10.0 = 0.9000000000000004 -> / 0.1 = 9.000000000000004 -> + 1 -> int 10 -> max 11.0
    # 20.95 - 20.0 = 0.9499999999999993 -> / 0.1 = 9.49999... -> + 1 -> int 10 -> max 21.0
    g = BinGrid.from_mbr(10.0, 20.0, 10.9, 20.95, x_bin_deg=0.1, y_bin_deg=0.1)
    assert (g.width, g.height) == (10, 10)
    assert (g.max_x, g.max_y) == (21.0, 11.0)


@needs_geographiclib
def test_metre_bins_at_the_pfm_notes_latitude():
    # area centred on 30.16264 N, where docs/geodesy-and-bins.md §1 gives y = 1.80424827e-5 deg for 2 m bins
    g = BinGrid.from_mbr(30.15, -88.2, 30.17528, -88.1, bin_size_m=2.0)
    assert f"{g.y_bin:.8e}" == "1.80424827e-05"
    # header values are what %.15f / %.9f print and sscanf reads back
    assert g.y_bin == float(f"{g.y_bin:.15f}") and g.x_bin == float(f"{g.x_bin:.15f}")
    for v in (g.min_x, g.min_y, g.max_x, g.max_y, *g.polygon.ravel()):
        assert v == float(f"{v:.9f}")
    # x bin: 2 m east at the centre, within the NGS algorithm's millimetre
    cy, cx = 30.16264, -88.15
    exact_x = GEOD.Direct(cy, cx, 90.0, 2.0)["lon2"] - cx
    metres_per_deg_x = 2.0 / exact_x
    assert abs(g.x_bin - exact_x) * metres_per_deg_x < 0.002
    # the library's 2 m y bin is really ~2.0001 m long, hence headers showing [BIN SIZE XY] = 2.0001...
    assert f"{g.bin_size_xy:.4f}" == "2.0001"
    fcy = g.min_y + (g.max_y - g.min_y) * 0.5
    fcx = g.min_x + (g.max_x - g.min_x) * 0.5
    assert g.bin_size_xy == pytest.approx(GEOD.Inverse(fcy, fcx, fcy + g.y_bin, fcx)["s12"], abs=1e-6)
    # counts: the pushed-out max lies less than one bin beyond the input max
    assert g.min_x + (g.width - 1) * g.x_bin <= -88.1 < g.max_x + 1e-9
    assert g.min_y + (g.height - 1) * g.y_bin <= 30.17528 < g.max_y + 1e-9
    assert g.max_x == pytest.approx(g.min_x + g.width * g.x_bin, abs=1e-9)
    assert g.max_y == pytest.approx(g.min_y + g.height * g.y_bin, abs=1e-9)


@needs_geographiclib
def test_minute_bins_and_bin_size_xy_recomputed():
    g = BinGrid.from_mbr(45.0, -60.0, 45.5, -59.5, x_bin_deg=1 / 60, y_bin_deg=1 / 60)
    assert g.x_bin == float(f"{1 / 60:.15f}")
    assert (g.width, g.height) == (31, 31)  # int(0.5 * 60 + 1), up to rounding of the 15-decimal size
    cy = g.min_y + (g.max_y - g.min_y) * 0.5
    cx = g.min_x + (g.max_x - g.min_x) * 0.5
    assert g.bin_size_xy == pytest.approx(GEOD.Inverse(cy, cx, cy + g.y_bin, cx)["s12"], abs=2e-3)


def test_from_polygon_uses_its_bounding_box():
    pts = [(40.0, -70.0), (40.03, -69.98), (40.01, -69.95), (39.99, -69.97)]
    g = BinGrid.from_polygon(pts, x_bin_deg=0.001, y_bin_deg=0.001)
    assert (g.min_y, g.min_x) == (39.99, -70.0)
    assert g.polygon.tolist() == [list(p) for p in pts]
    assert g.height == int((40.03 - 39.99) / 0.001 + 1)
    assert g.width == int((-69.95 - -70.0) / 0.001 + 1)


def test_from_header_values_round_trip_and_ignores_header_bin_size_xy():
    g = BinGrid.from_mbr(30.15, -88.2, 30.17528, -88.1, bin_size_m=2.0)
    h = BinGrid.from_header_values(min_x=g.min_x, min_y=g.min_y, max_x=g.max_x, max_y=g.max_y,
                                   x_bin=g.x_bin, y_bin=g.y_bin, width=g.width, height=g.height,
                                   polygon=g.polygon.tolist(), bin_size_xy=2.0)
    assert h == g and hash(h) == hash(g)


def test_value_semantics_pickle_and_readonly_polygon():
    g = BinGrid.from_mbr(10.0, 20.0, 11.0, 21.0, x_bin_deg=0.125, y_bin_deg=0.25)
    g2 = pickle.loads(pickle.dumps(g))
    assert g2 == g and hash(g2) == hash(g)
    assert g != BinGrid.from_mbr(10.0, 20.0, 11.0, 21.0, x_bin_deg=0.125, y_bin_deg=0.125)
    with pytest.raises(ValueError):
        g.polygon[0, 0] = 1.0


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(south=11.0, west=20.0, north=10.0, east=21.0), "south"),
    (dict(south=10.0, west=20.0, north=10.0, east=21.0), "south"),
    (dict(south=10.0, west=20.0, north=11.0, east=20.0), "no width"),
    (dict(south=10.0, west=20.0, north=11.0, east=21.0, bin_size_m=0.0), "bin_size_m"),
    (dict(south=10.0, west=20.0, north=11.0, east=21.0, bin_size_m=-2.0), "bin_size_m"),
    (dict(south=10.0, west=20.0, north=11.0, east=21.0, bin_size_m=float("nan")), "bin_size_m"),
    (dict(south=float("nan"), west=20.0, north=11.0, east=21.0), "finite"),
    (dict(south=10.0, west=20.0, north=91.0, east=21.0), "latitudes"),
    (dict(south=10.0, west=20.0, north=11.0, east=21.0, x_bin_deg=0.1), "both"),
    (dict(south=10.0, west=20.0, north=11.0, east=21.0, x_bin_deg=0.1, y_bin_deg=-0.1), "positive"),
    (dict(south=0.0, west=0.0, north=10.0, east=10.0, bin_size_m=0.01), "bins"),
    (dict(south=10.0, west=20.0, north=11.0, east=21.0, offset_bits=0), "offset_bits"),
])
def test_invalid_areas_raise_config_error(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        BinGrid.from_mbr(**kwargs)


def test_invalid_polygons_raise_config_error():
    with pytest.raises(ConfigError, match="at least 3"):
        BinGrid.from_polygon([(10.0, 20.0), (11.0, 21.0)])
    with pytest.raises(ConfigError, match="lat, lon"):
        BinGrid.from_polygon([1.0, 2.0, 3.0])
    with pytest.raises(ConfigError, match=r"lon\+360"):
        BinGrid.from_polygon([(10.0, 179.5), (11.0, 179.5), (11.0, -179.5), (10.0, -179.5)])
    circle = [(10 + 0.1 * math.sin(t), 20 + 0.1 * math.cos(t)) for t in np.linspace(0, 6.28, MAX_POLY + 1)]
    with pytest.raises(ConfigError, match="at most 2000"):
        BinGrid.from_polygon(circle)
    with pytest.raises(ConfigError, match="header"):
        BinGrid.from_header_values(min_x=1.0, min_y=1.0, max_x=0.5, max_y=2.0, x_bin=0.1, y_bin=0.1,
                                   width=5, height=10, polygon=[(1, 1), (2, 1), (2, 2)])


def test_max_bins_is_the_int32_limit():
    assert MAX_BINS == 2**31 - 1


# ---------------------------------------------------------------------------- assignment

@pytest.fixture(scope="module")
def binary_grid():
    return BinGrid.from_mbr(10.0, 20.0, 11.0, 21.0, x_bin_deg=0.125, y_bin_deg=0.25)


def test_points_on_edges_hand_worked(binary_grid):
    g = binary_grid
    # (lat, lon) -> expected (inside, col, row, x_off, y_off); derived by hand from the
    # crossings-multiply test: the ray goes east, an edge counts when its crossing is at or right
    # of the point for upward edges and strictly right for downward ones, and vertices at the
    # point's latitude count as above it. Hence west, east and south edges are outside, north inside.
    cases = {
        (10.5, 20.375): (True, 3, 2, 0, 0),     # exactly on a bin corner: offsets 0
        (10.5, 20.0): (False,),                  # west edge of the polygon
        (10.5, 21.0): (False,),                  # east edge
        (10.0, 20.5): (False,),                  # south edge
        (11.0, 20.5): (True, 4, 4, 0, 0),        # north edge (row 4 of 5: the pushed-out grid)
        (10.25, 20.125): (True, 1, 1, 0, 0),
    }
    lat = np.array([k[0] for k in cases])
    lon = np.array([k[1] for k in cases])
    a = g.assign(lat, lon)
    for i, exp in enumerate(cases.values()):
        assert bool(a.inside[i]) == exp[0], (lat[i], lon[i])
        if exp[0]:
            assert (a.col[i], a.row[i], a.x_off[i], a.y_off[i]) == exp[1:]
    assert a.col.dtype == np.int32 and a.x_off.dtype == np.uint16 and a.bin_index.dtype == np.int64


def test_max_edge_is_outside_even_when_polygon_covers_it():
    # polygon equal to the pushed-out MBR: x == max_x gives col == width, which the library would
    # index one past the row; we report it as outside
    poly = [(10.0, 20.0), (11.25, 20.0), (11.25, 21.125), (10.0, 21.125)]
    g = BinGrid.from_header_values(min_x=20.0, min_y=10.0, max_x=21.125, max_y=11.25, x_bin=0.125,
                                   y_bin=0.25, width=9, height=5, polygon=poly)
    a = g.assign([10.6, 11.25, 10.6], [21.125, 20.5, 21.124999])
    assert a.inside.tolist() == [False, False, True]
    assert a.col[0] == 9 and a.row[1] == 5
    assert (a.col[2], a.x_off[2]) == (8, 4095)  # top of the last bin codes as 4095


def test_assign_matches_slow_reference_rectangle():
    g = BinGrid.from_mbr(30.15, -88.2, 30.16, -88.19, bin_size_m=2.0)
    rng = np.random.default_rng(11)
    lat = rng.uniform(30.149, 30.161, 400)
    lon = rng.uniform(-88.201, -88.189, 400)
    assert check_against_reference(g, lat, lon) > 200


def test_assign_matches_slow_reference_concave_polygon():
    # a U open to the north: the notch (lon 1..2, lat 1..3 in units of 0.01 deg) is outside
    u = [(0, 0), (0, 3), (3, 3), (3, 2), (1, 2), (1, 1), (3, 1), (3, 0)]  # (lon, lat) units
    poly = [(40.0 + 0.01 * b, -70.0 + 0.01 * a) for a, b in u]
    g = BinGrid.from_polygon(poly, x_bin_deg=0.0005, y_bin_deg=0.0005)
    rng = np.random.default_rng(5)
    lat = rng.uniform(39.999, 40.031, 500)
    lon = rng.uniform(-70.001, -69.969, 500)
    n_in = check_against_reference(g, lat, lon)
    assert 150 < n_in < 450
    a = g.assign([40.02, 40.005, 40.02], [-69.985, -69.985, -69.995])
    assert a.inside.tolist() == [False, True, True]  # notch, bottom of the U, left arm


def test_point_in_polygon_agrees_with_pnpoly_away_from_edges():
    rng = np.random.default_rng(9)
    ang = np.sort(rng.uniform(0, 2 * np.pi, 12))
    rad = rng.uniform(0.3, 1.0, 12)
    poly = np.c_[rad * np.sin(ang), rad * np.cos(ang)]  # star-shaped, usually concave
    lat = rng.uniform(-1, 1, 600)
    lon = rng.uniform(-1, 1, 600)
    got = point_in_polygon(poly[:, 0], poly[:, 1], lat, lon)
    ref = [pnpoly(poly.tolist(), a, b) for a, b in zip(lat, lon)]
    assert got.tolist() == ref
    assert not point_in_polygon([0.0, 1.0], [0.0, 1.0], [0.5], [0.5]).any()  # < 3 points: nothing inside


def test_nan_positions_are_outside_without_warnings(binary_grid):
    a = binary_grid.assign([np.nan, 10.5, 10.5], [20.5, np.nan, 20.5])
    assert a.inside.tolist() == [False, False, True]
    assert a.col[0] == -1 and a.bin_index[1] == -1


@pytest.mark.parametrize("west, east", [
    (179.95, -179.95),  # centre exactly on 180: pfm_lib would fail (negative width); we unwrap
    (179.99, -179.80),  # centre east of 180: the library's own "+360" fix-up path
])
@needs_geographiclib
def test_dateline_area(west, east):
    g = BinGrid.from_mbr(-16.6, west, -16.5, east, bin_size_m=50.0)
    assert g.dateline and g.min_x == west and g.max_x > east + 360.0
    exact_x = GEOD.Direct(-16.55, 180.0, 90.0, 50.0)["lon2"] + 360.0 - 180.0
    assert abs(g.x_bin - exact_x) * (50.0 / exact_x) < 0.002
    lat = np.array([-16.55, -16.55, -16.55, -16.55])
    lon = np.array([east - 0.01, west + 0.005, east + 0.01, west - 0.01])
    a = g.assign(lat, lon)
    assert a.inside.tolist() == [True, True, False, False]
    assert a.col[0] == int((east + 360.0 - 0.01 - g.min_x) / g.x_bin)
    dlat, dlon = g.decode_position(a.col[:2], a.row[:2], a.x_off[:2], a.y_off[:2])
    assert abs(dlon[0] - (east + 360.0 - 0.01)) < g.x_bin / 4095  # stored east of 180
    assert abs(dlon[1] - (west + 0.005)) < g.x_bin / 4095
    lons = np.linspace(west - 0.01, east + 360.01, 60)
    lons = np.where(lons > 180.0, lons - 360.0, lons)  # soundings arrive in -180..180
    check_against_reference(g, np.full(lons.size, -16.55), lons)


def test_decode_hand_value_and_bin_center(binary_grid):
    g = binary_grid
    lat, lon = g.decode_position(3, 2, 4095, 0)
    assert lon == pytest.approx(20.5, abs=1e-12) and lat == 10.5
    # float path: 2047/4095 in single precision, times the bin size, held as float
    lat, lon = g.decode_position(0, 0, 2047, 2047)
    assert lon == 20.0 + f32(f32(2047.0) / f32(4095.0) * 0.125)
    assert g.bin_center(3, 2) == (10.625, 20.4375)
    clat, clon = g.bin_center(np.array([0, 8]), np.array([0, 4]))
    assert clat.tolist() == [10.125, 11.125] and clon.tolist() == [20.0625, 21.0625]


@needs_geographiclib
def test_bin_diagonal_rules():
    # metre bins at 30 N: x and y degree sizes differ by more than 1e-6, so pfmLoader's 2*sqrt(size)
    g = BinGrid.from_mbr(30.15, -88.2, 30.17528, -88.1, bin_size_m=2.0)
    assert g.bin_diagonal_m() == 2.0 * math.sqrt(g.bin_size_xy)
    # minute bins: the geodesic across one bin, from the SW corner in the north ...
    g = BinGrid.from_mbr(45.0, -60.0, 45.5, -59.5, x_bin_deg=1 / 60, y_bin_deg=1 / 60)
    ref = GEOD.Inverse(g.min_y, g.min_x, g.min_y + g.y_bin, g.min_x + g.x_bin)["s12"]
    assert g.bin_diagonal_m() == pytest.approx(ref, abs=2e-3)
    # ... and from the NW corner going south when min_y <= 0
    g = BinGrid.from_mbr(-45.5, -60.0, -45.0, -59.5, x_bin_deg=1 / 60, y_bin_deg=1 / 60)
    ref = GEOD.Inverse(g.max_y, g.min_x, g.max_y - g.y_bin, g.min_x + g.x_bin)["s12"]
    assert g.bin_diagonal_m() == pytest.approx(ref, abs=2e-3)


def test_offset_bits_16_and_20_codes():
    g16 = BinGrid.from_mbr(10.0, 20.0, 11.0, 21.0, x_bin_deg=0.125, y_bin_deg=0.25, offset_bits=16)
    a = g16.assign([10.3], [20.3])
    assert a.x_off.dtype == np.uint16 and g16.offset_scale == 65535
    g20 = BinGrid.from_mbr(10.0, 20.0, 11.0, 21.0, x_bin_deg=0.125, y_bin_deg=0.25, offset_bits=20)
    b = g20.assign([10.3], [20.3])
    assert b.x_off.dtype == np.uint32
    check_against_reference(g20, np.array([10.3, 10.7]), np.array([20.3, 20.9]))


# ---------------------------------------------------------------------------- properties

@st.composite
def grids_and_points(draw):
    south = draw(st.floats(-70.0, 70.0))
    west = draw(st.floats(-179.0, 178.0))
    dlat = draw(st.floats(0.001, 0.5))
    dlon = draw(st.floats(0.001, 0.5))
    if draw(st.booleans()):
        nx = draw(st.integers(1, 400))
        ny = draw(st.integers(1, 400))
        g = BinGrid.from_mbr(south, west, south + dlat, west + dlon, x_bin_deg=dlon / nx, y_bin_deg=dlat / ny)
    else:
        size = draw(st.sampled_from([0.5, 2.0, 5.0, 50.0]))
        try:
            g = BinGrid.from_mbr(south, west, south + dlat, west + dlon, bin_size_m=size)
        except ConfigError:  # too many bins for a tiny size over a big area
            g = BinGrid.from_mbr(south, west, south + dlat, west + dlon, bin_size_m=500.0)
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    lat = rng.uniform(g.min_y - 0.1 * dlat, g.max_y, 40)
    lon = rng.uniform(g.min_x - 0.1 * dlon, g.max_x, 40)
    return g, lat, lon


@settings(max_examples=25, deadline=None)
@given(grids_and_points())
def test_property_assignment_reference_and_round_trip(case):
    g, lat, lon = case
    check_against_reference(g, lat, lon)
    a = g.assign(lat, lon)
    m = a.inside
    assert np.all((a.col[m] >= 0) & (a.col[m] < g.width) & (a.row[m] >= 0) & (a.row[m] < g.height))
    assert np.all(a.x_off <= g.offset_scale) and np.all(a.y_off <= g.offset_scale)
    dlat, dlon = g.decode_position(a.col[m], a.row[m], a.x_off[m], a.y_off[m])
    # decode(encode(p)) is within half a code of p (plus float32 rounding of the offset)
    assert np.all(np.abs(dlon - lon[m]) <= (0.5 / g.offset_scale + 1e-6) * g.x_bin)
    assert np.all(np.abs(dlat - lat[m]) <= (0.5 / g.offset_scale + 1e-6) * g.y_bin)
    # header round trip holds for every constructed grid
    assert g.x_bin == float(f"{g.x_bin:.15f}") and g.min_y == float(f"{g.min_y:.9f}")


@pytest.mark.parametrize("corners", [
    [(10.0, 20.0), (11.0, 20.0), (11.0, 21.0), (10.0, 21.0)],                # SW NW NE SE
    [(10.0, 21.0), (11.0, 21.0), (11.0, 20.0), (10.0, 20.0), (10.0, 21.0)],  # reversed, closed
    [(-0.5, -1e-80), (0.5, -1e-80), (0.5, 1e-80), (-0.5, 1e-80)],            # sides near 0
], ids=["sw-nw-ne-se", "reversed-closed", "near-zero"])
def test_rectangle_shortcut_agrees_with_the_polygon_test(corners, monkeypatch):
    """A point well inside a rectangle polygon skips the crossings test: same answers, on the
    sides, a float step either side of them, at the corners and at random."""
    from pfm_dask.pfm import _grid

    poly = np.array(corners)
    g = BinGrid.from_header_values(min_x=poly[:, 1].min() - 0.25, min_y=poly[:, 0].min() - 0.25,
                                   max_x=poly[:, 1].max() + 0.25, max_y=poly[:, 0].max() + 0.25,
                                   x_bin=0.125, y_bin=0.125, width=int(1 + np.ptp(poly[:, 1]) * 8 + 4),
                                   height=int(1 + np.ptp(poly[:, 0]) * 8 + 4), polygon=poly)
    assert _grid._rectangle(np.asarray(g.polygon)) is not None
    rng = np.random.default_rng(3)
    ys, xs = np.unique(g.polygon[:, 0]), np.unique(g.polygon[:, 1])
    edge_y = np.concatenate([ys, np.nextafter(ys, -np.inf), np.nextafter(ys, np.inf)])
    edge_x = np.concatenate([xs, np.nextafter(xs, -np.inf), np.nextafter(xs, np.inf),
                             [0.0, -0.0, 5e-324, -5e-324, 1e-250]])
    lat = np.concatenate([rng.uniform(ys[0] - 0.1, ys[1] + 0.1, 300), edge_y.repeat(edge_x.size),
                          rng.uniform(ys[0], ys[1], edge_x.size)])
    lon = np.concatenate([rng.uniform(xs[0] - 0.1, xs[1] + 0.1, 300), np.tile(edge_x, edge_y.size),
                          edge_x])
    fast = g.assign(lat, lon)
    monkeypatch.setattr(_grid, "_rectangle", lambda p: None)
    slow = g.assign(lat, lon)
    assert fast.inside.any() and not fast.inside.all()
    for name in ("inside", "bin_index", "x_off", "y_off", "col", "row"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(slow, name), err_msg=name)


def test_rectangle_detection():
    from pfm_dask.pfm._grid import _rectangle

    assert _rectangle(np.array([(0.0, 0.0), (1.0, 0.0), (1.0, 2.0), (0.0, 2.0)])).tolist() == [0, 0, 1, 2]
    for not_rect in ([(0, 0), (1, 0), (0, 2), (1, 2)],            # a bow tie
                     [(0, 0), (1, 0), (1, 2), (0, 2.5)],          # not axis-parallel
                     [(0, 0), (1, 0), (1, 2)],                    # a triangle
                     [(0, 0), (1, 0), (1, 2), (0, 2), (0, 1)],    # five distinct points
                     [(0, 0), (1e-300, 0), (1e-300, 2), (0, 2)]):  # too thin for the shortcut
        assert _rectangle(np.array(not_rect, dtype=float)) is None


@pytest.mark.parametrize("bits", [12, 20])
def test_assign_mixed_points_match_reference(bits):
    """The assignment's branch-free pass and its point-by-point pass for the others (outside,
    not finite, on bin edges) mixed in one call, rectangle and dateline grids:
    each point as the slow reference says, whatever its neighbours."""
    rng = np.random.default_rng(bits)
    for grid in (BinGrid.from_mbr(36.0, -123.0, 36.5, -122.2, bin_size_m=50.0, offset_bits=bits),
                 BinGrid.from_mbr(-16.8, 179.7, -16.3, -179.6, bin_size_m=25.0,
                                  offset_bits=bits)):
        n = 3000
        lat = rng.uniform(grid.min_y - 0.05, grid.max_y + 0.05, n)
        lon = rng.uniform(grid.min_x - 0.05, grid.max_x + 0.05, n)
        lon = np.where(lon > 180.0, lon - 360.0, lon)
        cols, rows = rng.integers(1, grid.width, 200), rng.integers(1, grid.height, 200)
        lat[:200] = grid.min_y + rows * grid.y_bin          # on bin edges
        lon[200:400] = grid.min_x + cols * grid.x_bin
        lon[200:400] = np.where(lon[200:400] > 180.0, lon[200:400] - 360.0, lon[200:400])
        lat[400:410], lon[410:420] = np.nan, np.inf
        assert check_against_reference(grid, lat, lon) > n // 2
