"""The compiled ``geodesy.direct`` gives the results of the numpy port it replaced bit for bit.

``direct`` runs a numba kernel, one point at a time, whatever the shapes. It is
compared here with the numpy implementation it replaced (``_old_direct``, kept
verbatim as the reference) on millions of random cases and the edge cases the
NGS code has branches for, and ``beam_positions_reference`` (pfmLoader's two
NGS moves per beam) with the old two-move computation. Equal means the same
64 bits, except that NaN (from NaN input) only has to stay NaN. The fast
placement, ``beam_positions``, is checked against both in ``test_placement.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from pfm_dask import geodesy as G
from pfm_dask.gsf import beam_positions_reference


def _series_angle(omg, sn, cs, c4, css, c3, c2):
    """The NGS latitude series ``omg + sn*cs*1e-6*(c4 + css*(c3 + c2*css))`` in C order."""
    return omg + ((sn * cs) * 1.0e-6) * (c4 + css * (c3 + c2 * css))


def _old_direct(lat_deg, lon_deg, azimuth_deg, distance_m):
    """The previous implementation of ``direct``, unchanged but for constant names."""
    # No up-front broadcast: terms that depend only on the start latitude or only on the azimuth
    # (per ping, when beams come as (pings, beams) against (pings, 1)) are computed once per ping.
    lat = np.asarray(lat_deg, dtype=np.float64)
    lon = np.asarray(lon_deg, dtype=np.float64)
    az = np.asarray(azimuth_deg, dtype=np.float64)
    s = np.asarray(distance_m, dtype=np.float64)
    shape = np.broadcast_shapes(lat.shape, lon.shape, az.shape, s.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # newgp: on the equator heading exactly east or west the series divides by
        # tan(0); the C wrapper lifts the start latitude by 1e-37 degrees.
        lat = np.where((lat == 0.0) & ((az == 90.0) | (az == 270.0)), lat + 1.0e-37, lat)
        # azimuth from north -> from south, subtracting 360 once if above 360
        az_s = az + 180.0
        az_s = np.where(az_s > 360.0, az_s - 360.0, az_s)

        phi = 3600.0 * lat  # arc seconds
        alam = 3600.0 * lon
        fazi = 3600.0 * az_s

        fazj = fazi * G._ARC1
        x = s * np.sin(fazj)
        x = np.where(np.abs(x) < 1.0e-3, 0.001, x)
        y = -s * np.cos(fazj)
        y = np.where(np.abs(y) < 1.0e-3, 0.001, y)
        t = y / 10000.0
        b = t * t
        phj = phi * G._ARC1
        sina = np.sin(phj)
        u = 1.0 - G._ESQ * sina * sina
        ef = (u * u * 1.0e15) / (3.0 * G._AXIS * G._AXIS * (1.0 - G._ESQ))
        xcor = b * ef / 2.0
        xpri = x - xcor * x * 1.0e-7
        t = xpri / 10000.0
        a = t * t
        ycor = ef * a
        ypri = y + ycor * y * 1.0e-7
        cosa = np.cos(phj)
        cssq = cosa * cosa
        y0 = G._Z1 * _series_angle(phj, sina, cosa, -G._Z4, cssq, G._Z3, -G._Z2)
        y1 = y0 + ypri
        omega = G._W1 * y1
        sin1 = np.sin(omega)
        cos1 = np.cos(omega)
        css1 = cos1 * cos1
        phi1 = _series_angle(omega, sin1, cos1, G._W4, css1, G._W3, G._W2)
        sin1 = np.sin(phi1)
        cos1 = np.cos(phi1)
        faca = np.sqrt(1.0 - G._ESQ * sin1 * sin1) / (2.0 * G._AXIS)
        v = sin1 / cos1 * faca * 1.0e8
        va = v * a
        y2 = y1 - va
        facb = (1.0 + 3.0 * ((sin1 * sin1) / (cos1 * cos1))) / (3.0 * (sin1 / cos1))
        facc = (3.0 * G._ESQ * sin1 * cos1) / (1.0 - G._ESQ)
        cay = (faca * (facb - facc)) * 1.0e6
        t = va / 1000.0
        y3 = y2 + cay * (t * t)
        omegb = G._W1 * y3
        sin2 = np.sin(omegb)
        cos2 = np.cos(omegb)
        css2 = cos2 * cos2
        phipri = _series_angle(omegb, sin2, cos2, G._W4, css2, G._W3, G._W2)
        sp = np.sin(phipri)
        h = np.sqrt(1.0 - G._ESQ * (sp * sp)) / (G._AXIS * np.cos(phipri) * G._ARC1)
        applam = h * xpri
        asinco = (v * va) / 15.0
        dellam = applam + applam * asinco * 1.0e-7
        alampr = alam - dellam
        phipri = phipri / G._ARC1
        wrap = np.abs(alampr) > 648000.0
        alampr = np.where(wrap & (alampr > 0.0), alampr - 1296000.0,
                          np.where(wrap & (alampr < 0.0), alampr + 1296000.0, alampr))
        lat2 = np.broadcast_to(phipri / 3600.0, shape)
        lon2 = np.broadcast_to(alampr / 3600.0, shape)
    return G._out(np.array(lat2), np.array(lon2))



def _same(a, b) -> bool:
    """Bit for bit, except that any NaN equals any NaN (the sign of a NaN means nothing)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all((a.view(np.int64) == b.view(np.int64)) | both_nan))


def _cases(seed: int, n: int):
    """Random moves with the special values of the NGS code sprinkled in."""
    rng = np.random.default_rng(seed)
    lat = rng.uniform(-89.9, 89.9, n)
    lon = rng.uniform(-180.0, 180.0, n)
    az = rng.uniform(-360.0, 720.0, n)
    s = rng.normal(0.0, 2000.0, n) * rng.choice([1.0, 1e-3, 30.0], n)
    lat[rng.random(n) < 0.02] = 0.0
    lat[rng.random(n) < 0.01] = -0.0
    az[rng.random(n) < 0.03] = 90.0
    az[rng.random(n) < 0.03] = 270.0
    az[rng.random(n) < 0.01] = 180.0
    s[rng.random(n) < 0.02] = 0.0
    s[rng.random(n) < 0.01] = 5e-4
    lon[rng.random(n) < 0.02] = rng.choice([179.9999999, -179.9999999, 180.0, -180.0])
    for a in (lat, lon, az, s):
        a[rng.random(n) < 0.001] = np.nan
    return lat, lon, az, s


def _pings(seed: int, n_pings: int, beams: int):
    """Flat per-beam arrays of pings (position and heading repeat within a ping)."""
    rng = np.random.default_rng(seed)
    lat = np.repeat(rng.uniform(-80.0, 80.0, n_pings), beams)
    lon = np.repeat(rng.uniform(-180.0, 180.0, n_pings), beams)
    hdg = np.repeat(rng.uniform(0.0, 360.0, n_pings), beams)
    hdg[: beams * 3] = 90.0        # some pings on the equator heading east/west
    lat[: beams * 2] = 0.0
    across = np.tile(np.linspace(-4000.0, 4000.0, beams), n_pings) + rng.normal(0, 1, n_pings * beams)
    along = rng.normal(0.0, 3.0, n_pings * beams)
    along[rng.random(along.size) < 0.05] = 0.0
    return lat, lon, hdg, across, along


@pytest.mark.parametrize("seed", range(4))
def test_flat_direct_equals_the_previous_implementation(seed):
    lat, lon, az, s = _cases(seed, 1_000_000)
    want = _old_direct(lat, lon, az, s)
    got = G.direct(lat, lon, az, s)
    assert _same(got[0], want[0]) and _same(got[1], want[1])


def test_repeated_start_points_reuse_terms_without_changing_anything():
    lat, lon, hdg, across, along = _pings(7, 3000, 200)
    for az in (hdg + 90.0, hdg):
        want = _old_direct(lat, lon, az, across)
        got = G.direct(lat, lon, az, across)
        assert _same(got[0], want[0]) and _same(got[1], want[1])
    # the same moves as (pings, beams) against (pings, 1): the broadcast path
    sh = (3000, 200)
    got2 = G.direct(lat.reshape(sh)[:, :1], lon.reshape(sh)[:, :1], (hdg + 90.0).reshape(sh)[:, :1],
                    across.reshape(sh))
    want = _old_direct(lat, lon, hdg + 90.0, across)
    assert _same(got2[0].ravel(), want[0]) and _same(got2[1].ravel(), want[1])


def test_small_and_scalar_inputs():
    for args in ((10.0, 20.0, 30.0, 1000.0), (0.0, 0.0, 90.0, 0.0), ([1.0], [2.0], [3.0], [4.0]),
                 (np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0))):
        got, want = G.direct(*args), _old_direct(*args)
        assert _same(got[0], want[0]) and _same(got[1], want[1])


def _old_beam_positions(lat, lon, hdg, across, along, present):
    lat1, lon1 = _old_direct(lat, lon, hdg + 90.0, across)
    along = np.where(present, along, 0.0)
    lat2, lon2 = _old_direct(lat1, lon1, hdg, along)
    return np.where(present, lat2, lat1), np.where(present, lon2, lon1)


@pytest.mark.parametrize("seed", range(3))
def test_reference_beam_positions_equal_the_previous_computation(seed):
    lat, lon, hdg, across, along = _pings(seed, 2000, 432)
    rng = np.random.default_rng(seed)
    present = np.repeat(rng.random(2000) < 0.8, 432)   # whole pings without an along-track array
    got = beam_positions_reference(lat, lon, hdg, across, along, along_present=present)
    want = _old_beam_positions(lat, lon, hdg, across, along, present)
    assert _same(got[0], want[0]) and _same(got[1], want[1])
    got = beam_positions_reference(lat, lon, hdg, across, along)
    want = _old_beam_positions(lat, lon, hdg, across, along, np.ones(lat.size, bool))
    assert _same(got[0], want[0]) and _same(got[1], want[1])


# --- binning: the compiled BinGrid.assign equals the numpy implementation it replaced -----------

from pfm_dask._numeric import nint  # noqa: E402
from pfm_dask.bins import BinGrid, point_in_polygon  # noqa: E402


def _old_point_in_polygon(poly_lat, poly_lon, lat, lon) -> np.ndarray:
    """The previous numpy ``point_in_polygon``, unchanged."""
    py = np.asarray(poly_lat, dtype=np.float64)
    px = np.asarray(poly_lon, dtype=np.float64)
    y, x = np.broadcast_arrays(np.asarray(lat, dtype=np.float64), np.asarray(lon, dtype=np.float64))
    inside = np.zeros(y.shape, dtype=bool)
    n = py.shape[0]
    if n < 3:
        return inside
    j = n - 1
    yflag0 = py[j] >= y
    for i in range(n):
        yflag1 = py[i] >= y
        crosses = yflag0 != yflag1
        test = ((py[i] - y) * (px[j] - px[i]) >= (px[i] - x) * (py[j] - py[i])) == yflag1
        inside ^= crosses & test
        yflag0 = yflag1
        j = i
    return inside


def _old_assign(g, y, x) -> dict:
    """The previous numpy ``BinGrid._assign_numpy``, unchanged but for ``self`` -> ``g``."""
    y = np.array(y, dtype=np.float64)
    x = np.array(x, dtype=np.float64)
    if g.dateline:
        x = np.where(x < 0.0, x + 360.0, x)
    with np.errstate(invalid="ignore", over="ignore"):
        fx = (x - g.min_x) / g.x_bin
        fy = (y - g.min_y) / g.y_bin
        finite = np.isfinite(fx) & np.isfinite(fy)
        col = np.trunc(np.clip(np.where(finite, fx, -1.0), -2.0**31, 2.0**31 - 1)).astype(np.int32)
        row = np.trunc(np.clip(np.where(finite, fy, -1.0), -2.0**31, 2.0**31 - 1)).astype(np.int32)
        in_mbr = (finite & (x >= g.min_x) & (x <= g.max_x)
                  & (y >= g.min_y) & (y <= g.max_y))
    in_range = in_mbr & (col >= 0) & (col < g.width) & (row >= 0) & (row < g.height)
    inside = np.zeros(y.shape, dtype=bool)
    idx = np.nonzero(in_range)
    if idx[0].size:
        inside[idx] = _old_point_in_polygon(g.polygon[:, 0], g.polygon[:, 1], y[idx], x[idx])
    bin_index = np.where(inside, row.astype(np.int64) * g.width + col, np.int64(-1))
    x_off = np.zeros(y.shape, dtype=g._offset_dtype)
    y_off = np.zeros(y.shape, dtype=g._offset_dtype)
    sel = np.nonzero(inside)
    if sel[0].size:
        c = col[sel].astype(np.float64)
        r = row[sel].astype(np.float64)
        scale = np.float64(np.float32(g.offset_scale))
        xo = (x[sel] - (g.min_x + c * g.x_bin)).astype(np.float32).astype(np.float64)
        yo = (y[sel] - (g.min_y + r * g.y_bin)).astype(np.float32).astype(np.float64)
        x_off[sel] = nint((xo / g.x_bin) * scale).astype(g._offset_dtype)
        y_off[sel] = nint((yo / g.y_bin) * scale).astype(g._offset_dtype)
    return dict(col=col, row=row, inside=inside, bin_index=bin_index, x_off=x_off, y_off=y_off)


def _grids():
    yield BinGrid.from_mbr(30.0, -80.0, 30.3, -79.6, bin_size_m=50.0)
    yield BinGrid.from_mbr(-16.6, 179.95, -16.5, -179.95, bin_size_m=50.0)      # dateline
    yield BinGrid.from_polygon([(10.0, 20.0), (10.2, 20.05), (10.1, 20.1), (10.25, 20.25),
                                (10.0, 20.3), (10.05, 20.15)], bin_size_m=30.0)   # concave
    yield BinGrid.from_mbr(0.0, 0.0, 0.01, 0.01, x_bin_deg=2.0**-10, y_bin_deg=2.0**-10,
                           bin_size_m=None)                                        # binary sizes
    yield BinGrid.from_mbr(45.0, 5.0, 45.05, 5.07, bin_size_m=20.0, offset_bits=20)


@pytest.mark.parametrize("k", range(5))
def test_assign_equals_the_previous_numpy_implementation(k):
    g = list(_grids())[k]
    rng = np.random.default_rng(k)
    n = 400_000
    pad_x, pad_y = 3 * g.x_bin, 3 * g.y_bin
    lat = rng.uniform(g.min_y - pad_y, g.max_y + pad_y, n)
    lon = rng.uniform(g.min_x - pad_x, g.max_x + pad_x, n)
    lon = np.where(lon > 180.0, lon - 360.0, lon)
    # exact bin edges, the MBR edges, polygon vertices, NaN
    cols = rng.integers(-1, g.width + 2, 3000)
    rows = rng.integers(-1, g.height + 2, 3000)
    lat[:3000] = g.min_y + rows * g.y_bin
    lon[:3000] = g.min_x + cols * g.x_bin
    lat[3000:3004] = [g.min_y, g.max_y, g.min_y, g.max_y]
    lon[3000:3004] = [g.min_x, g.max_x, g.max_x, g.min_x]
    pts = np.asarray(g.polygon)
    lat[3004:3004 + len(pts)] = pts[:, 0]
    lon[3004:3004 + len(pts)] = pts[:, 1]
    lat[rng.random(n) < 0.001] = np.nan
    lon[rng.random(n) < 0.001] = np.inf
    got = g.assign(lat, lon)
    want = _old_assign(g, lat, lon)
    for f in ("col", "row", "inside", "bin_index", "x_off", "y_off"):
        a, b = getattr(got, f), want[f]
        assert a.dtype == b.dtype and np.array_equal(a, b), f
    assert got.inside.any() and not got.inside.all()
    # any shape, one point, no point: the same kernel
    sh = (400, 1000)
    two_d = g.assign(lat.reshape(sh), lon.reshape(sh))
    assert np.array_equal(two_d.bin_index.ravel(), want["bin_index"])
    assert np.array_equal(two_d.x_off.ravel(), want["x_off"])
    one = g.assign(lat[5000], lon[5000])
    assert one.bin_index.shape == () and one.bin_index == want["bin_index"][5000]
    assert g.assign(lat[:0], lon[:0]).bin_index.shape == (0,)
    inside = point_in_polygon(g.polygon[:, 0], g.polygon[:, 1], lat.reshape(sh), lon.reshape(sh))
    with np.errstate(invalid="ignore"):  # inf longitudes: inf * 0 in the old numpy test
        want_inside = _old_point_in_polygon(g.polygon[:, 0], g.polygon[:, 1], lat.reshape(sh),
                                            lon.reshape(sh))
    assert np.array_equal(inside, want_inside)


def test_bin_order_equals_lexsort():
    """The loader's sort of soundings by (bin, ping, beam) takes a shortcut on decoded order."""
    from pfm_dask.soundings import _bin_order

    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(0, 400))
        ping = rng.integers(0, 30, n)
        beam = rng.integers(0, 6, n)
        if trial % 3:                      # decoded order: by ping, then beam (ties kept)
            o = np.lexsort((beam, ping))
            ping, beam = ping[o], beam[o]
        if trial % 5 == 0 and n > 3:       # one ping out of order
            ping[n // 2] = 1000
        b = rng.integers(0, 12, n)
        assert np.array_equal(_bin_order(b, ping, beam), np.lexsort((beam, ping, b)))
