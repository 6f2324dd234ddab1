"""Fast beam placement against pfmLoader's two NGS moves per beam and against geographiclib.

``beam_positions`` expands the two NGS direct geodesics of a ping's beams once
per ping; it must stay within 1 mm of ``beam_positions_reference`` (the two NGS
moves per beam, itself checked bit for bit against the old numpy port in
``test_geodesy_speed.py``) on swaths up to 30 km wide (the 10 km of the
requirement and more), along-track moves up to 1 km, latitudes up to 85
degrees, across the dateline, and through the NGS code's special cases (the
1 mm floors on cardinal and zero moves, the equator nudge). Measured: at most
0.01 mm below 80 degrees, 0.06 mm at 80-85.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pfm_dask import geodesy as G
from pfm_dask.gsf import beam_positions, beam_positions_reference

try:
    from geographiclib.geodesic import Geodesic
    GEOD = Geodesic.WGS84
except ImportError:  # pragma: no cover
    GEOD = None
needs_geographiclib = pytest.mark.skipif(GEOD is None, reason="geographiclib is not installed")

A, E2 = 6378137.0, 6.69437999014e-3


def _miss_m(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Distance (m) between nearby points from the local radii of curvature (exact to ~1e-5
    relative for the sub-metre gaps measured here); longitudes compared modulo 360."""
    phi = np.radians(lat1)
    w = 1.0 - E2 * np.sin(phi) ** 2
    m = A * (1.0 - E2) / w ** 1.5
    n = A / np.sqrt(w)
    dlon = (np.asarray(lon2) - lon1 + 180.0) % 360.0 - 180.0
    return np.hypot(np.radians(lat2 - lat1) * m, np.radians(dlon) * n * np.cos(phi))


def _pings(rng, n_pings, beams, lat_lo, lat_hi, half_swath=5000.0, along_max=1000.0):
    """Flat per-beam arrays (ping values repeated), with the NGS special values sprinkled in."""
    lat = rng.choice([-1.0, 1.0], n_pings) * rng.uniform(lat_lo, lat_hi, n_pings)
    lon = rng.uniform(-180.0, 180.0, n_pings)
    lon[: n_pings // 4] = rng.choice([179.99, -179.99, 180.0, -180.0], n_pings // 4)  # dateline
    hdg = rng.uniform(0.0, 360.0, n_pings)
    hdg[rng.random(n_pings) < 0.2] = rng.choice([0.0, 90.0, 180.0, 270.0, 360.0, 450.0])
    across = rng.uniform(-half_swath, half_swath, (n_pings, beams))
    across[:, : beams // 8] = rng.choice([0.0, 5e-4, -5e-4, 1e-3, 2e-3])        # the 1 mm floors
    along = rng.uniform(-along_max, along_max, (n_pings, beams)) * rng.choice([1.0, 1e-2], (n_pings, 1))
    along[:, beams // 8: beams // 4] = rng.choice([0.0, 5e-4, -2e-3])
    present = np.repeat(rng.random(n_pings) < 0.8, beams)
    return (np.repeat(lat, beams), np.repeat(lon, beams), np.repeat(hdg, beams), across.ravel(),
            along.ravel(), present)


@pytest.mark.parametrize("band", [(0.0, 30.0), (30.0, 60.0), (60.0, 80.0), (80.0, 85.0)])
def test_within_a_millimetre_of_the_ngs_moves(band):
    rng = np.random.default_rng(int(band[1]))
    for half_swath in (5000.0, 15000.0):
        lat, lon, hdg, across, along, present = _pings(rng, 600, 96, *band, half_swath=half_swath)
        got = beam_positions(lat, lon, hdg, across, along, along_present=present)
        want = beam_positions_reference(lat, lon, hdg, across, along, along_present=present)
        miss = _miss_m(want[0], want[1], got[0], got[1])
        assert miss.max() < (2e-5 if band[1] <= 80.0 else 2e-4), (band, half_swath, miss.max())
        assert np.all(np.abs(got[1]) <= 180.0)


def test_the_equator_and_the_floors_exactly_where_the_ngs_code_has_them():
    # on the equator heading north: across-track due east, the NGS nudge; cardinal headings put
    # one local component of every move under 1 mm (+1 mm); nadir beams put both there
    lat = np.zeros(8)
    hdg = np.array([0.0, 90.0, 180.0, 270.0, 0.0, 0.0, 45.0, 360.0])
    across = np.array([0.0, 2500.0, -2500.0, 1e-4, 5000.0, -0.0, 0.0, 12000.0])
    along = np.array([0.0, 0.0, 3.0, -3.0, 2e-4, 0.0, 1e-3, 999.0])
    for la in (0.0, -0.0, 45.0, -79.9):
        got = beam_positions(lat + la, 10.0, hdg, across, along)
        want = beam_positions_reference(lat + la, 10.0, hdg, across, along)
        assert _miss_m(want[0], want[1], got[0], got[1]).max() < 2e-5
        # the floors are there: a zero move is not a no-op
        assert _miss_m(lat + la, 10.0, got[0], got[1])[0] > 1e-3


def test_beams_outside_the_expansion_get_the_ngs_moves_themselves():
    lat = np.array([30.0, 30.0, 30.0, 86.0, 89.0, -88.0, np.nan, 30.0, 30.0])
    lon = np.array([10.0] * 6 + [10.0, np.nan, 10.0])
    across = np.array([15000.1, -20000.0, 100.0, 100.0, 3000.0, -3000.0, 10.0, 10.0, np.inf])
    along = np.array([0.0, 1.0, 1000.5, 5.0, 5.0, -5.0, 1.0, 1.0, 1.0])
    got = beam_positions(lat, lon, 33.0, across, along)
    want = beam_positions_reference(lat, lon, 33.0, across, along)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert np.isnan(got[1][6:]).all() and np.isnan(got[0][[6, 8]]).all()  # lat2 needs no lon


def test_nan_in_nan_out_and_absent_along_track_ignored():
    got = beam_positions(np.array([30.0, 30.0, 30.0, 30.0]), -80.0, 10.0,
                         np.array([np.nan, 5.0, 5.0, 5.0]), np.array([0.0, np.nan, np.nan, 2.0]),
                         along_present=np.array([True, True, False, True]))
    assert np.isnan(got[0][:2]).all() and np.isnan(got[1][:2]).all()
    assert np.isfinite(got[0][2:]).all()
    only = beam_positions(30.0, -80.0, 10.0, 5.0)
    assert (got[0][2], got[1][2]) == (only[0], only[1])


def test_a_beam_does_not_depend_on_the_other_beams_of_the_call():
    # the expansion is per ping position and heading; splitting, reordering or broadcasting the
    # beams must give the same bits (a load's pieces place the beams of different subsets)
    rng = np.random.default_rng(5)
    lat, lon, hdg, across, along, present = _pings(rng, 50, 40, 0.0, 80.0)
    whole = beam_positions(lat, lon, hdg, across, along, along_present=present)
    perm = rng.permutation(lat.size)
    shuffled = beam_positions(lat[perm], lon[perm], hdg[perm], across[perm], along[perm],
                              along_present=present[perm])
    np.testing.assert_array_equal(shuffled[0], whole[0][perm])
    np.testing.assert_array_equal(shuffled[1], whole[1][perm])
    part = beam_positions(lat[17:301], lon[17:301], hdg[17:301], across[17:301], along[17:301],
                          along_present=present[17:301])
    np.testing.assert_array_equal(part[0], whole[0][17:301])
    sh = (50, 40)
    grid = beam_positions(lat.reshape(sh)[:, :1], lon.reshape(sh)[:, :1], hdg.reshape(sh)[:, :1],
                          across.reshape(sh), along.reshape(sh), along_present=present.reshape(sh)[:, :1])
    np.testing.assert_array_equal(grid[0].ravel(), whole[0])
    np.testing.assert_array_equal(grid[1].ravel(), whole[1])


@needs_geographiclib
@pytest.mark.parametrize("lat_band", [(0.0, 40.0), (40.0, 70.0), (70.0, 80.0)])
def test_against_two_exact_geodesics(lat_band):
    # 10 km swaths, along-track up to 200 m, across the dateline. The NGS series is within
    # 0.21 mm of exact per move below 80 degrees; beams are kept clear of its 1 mm floors here
    # (those are checked against the NGS code above).
    rng = np.random.default_rng(int(lat_band[0]) + 1)
    n_pings, beams = 40, 16
    lat = rng.choice([-1.0, 1.0], n_pings) * rng.uniform(*lat_band, n_pings)
    lon = rng.uniform(-180.0, 180.0, n_pings)
    lon[::3] = rng.choice([179.995, -179.995], lon[::3].size)
    hdg = rng.uniform(0.0, 360.0, n_pings)
    across = rng.uniform(-5000.0, 5000.0, (n_pings, beams))
    along = rng.uniform(-200.0, 200.0, (n_pings, beams))
    got = beam_positions(lat[:, None], lon[:, None], hdg[:, None], across, along)
    crossed = 0
    for p in range(n_pings):
        for b in range(beams):
            mid = GEOD.Direct(lat[p], lon[p], hdg[p] + 90.0, across[p, b])
            end = GEOD.Direct(mid["lat2"], mid["lon2"], hdg[p], along[p, b])
            miss = GEOD.Inverse(end["lat2"], end["lon2"], got[0][p, b], got[1][p, b])["s12"]
            assert miss < 1e-3, (p, b, miss)
            crossed += (end["lon2"] > 0) != (lon[p] > 0)
    assert crossed > 0  # some swaths did cross the dateline


def test_expansion_limits_are_what_the_docs_say():
    assert (G.PLACE_ACROSS_M, G.PLACE_ALONG_M, G.PLACE_LAT_DEG) == (15000.0, 1000.0, 85.0)
    assert math.isclose(_miss_m(0.0, 0.0, 0.0, 1e-5), 1.1132, rel_tol=1e-4)
