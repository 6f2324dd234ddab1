"""Beam placement against geographiclib (two exact geodesic steps) and a hand-computed case."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pfm_dask.gsf import beam_positions

try:  # independent reference for the geodesic quantities; the other tests run without it
    from geographiclib.geodesic import Geodesic
    GEOD = Geodesic.WGS84
except ImportError:  # pragma: no cover
    GEOD = None
needs_geographiclib = pytest.mark.skipif(GEOD is None, reason="geographiclib is not installed")

# each NGS step is within 0.21 mm of exact below 80 degrees, plus up to 1.42 mm from its 1 mm floor
STEP_TOL_M = 0.002


@needs_geographiclib
def test_matches_two_exact_steps():
    rng = np.random.default_rng(42)
    n_pings, n_beams = 30, 12
    lat = rng.uniform(-75.0, 75.0, (n_pings, 1))
    lon = rng.uniform(-180.0, 180.0, (n_pings, 1))
    heading = rng.uniform(0.0, 360.0, (n_pings, 1))
    across = rng.uniform(-6000.0, 6000.0, (n_pings, n_beams))
    along = rng.uniform(-50.0, 50.0, (n_pings, n_beams))
    blat, blon = beam_positions(lat, lon, heading, across, along)
    assert blat.shape == (n_pings, n_beams)
    for p in range(n_pings):
        for b in range(n_beams):
            mid = GEOD.Direct(lat[p, 0], lon[p, 0], heading[p, 0] + 90.0, across[p, b])
            end = GEOD.Direct(mid["lat2"], mid["lon2"], heading[p, 0], along[p, b])
            miss = GEOD.Inverse(end["lat2"], end["lon2"], blat[p, b], blon[p, b])["s12"]
            assert miss < 2 * STEP_TOL_M, (p, b, miss)


@needs_geographiclib
def test_across_only_when_no_along_track_array():
    lat, lon = beam_positions(-33.0, 151.0, 300.0, np.array([-120.0, 250.0]))
    for i, d in enumerate([-120.0, 250.0]):
        end = GEOD.Direct(-33.0, 151.0, 390.0, d)  # heading + 90 = 390, i.e. 30 degrees
        assert GEOD.Inverse(end["lat2"], end["lon2"], lat[i], lon[i])["s12"] < STEP_TOL_M


def test_hand_case_due_east_at_30n():
    # heading north, 100 m to starboard = due east. Over 100 m the geodesic's southward drift is
    # 100**2 * tan(30) / (2 * 6.38e6) = 0.45 mm, so the longitude change is d / (N cos(lat)) with
    # N the prime-vertical radius, to well under a millimetre.
    a, f = 6378137.0, 1 / 298.257223563
    e2 = f * (2 - f)
    phi = math.radians(30.0)
    n_radius = a / math.sqrt(1 - e2 * math.sin(phi) ** 2)
    dlon = math.degrees(100.0 / (n_radius * math.cos(phi)))
    lat, lon = beam_positions(30.0, -80.0, 0.0, 100.0)
    assert np.ndim(lat) == 0
    assert lon - (-80.0) == pytest.approx(dlon, abs=1e-8)  # 1e-8 deg ~ 1 mm
    assert lat == pytest.approx(30.0, abs=2e-8)


@needs_geographiclib
def test_zero_moves_follow_pfmloader_unless_exact_zero():
    # pfmLoader calls newgp even for 0 m; the NGS code then moves the point ~1.4 mm
    lat, lon = beam_positions(30.0, -80.0, 45.0, 0.0, 0.0)
    assert 0.001 < GEOD.Inverse(30.0, -80.0, lat, lon)["s12"] < 0.004
    lat, lon = beam_positions(30.0, -80.0, 45.0, 0.0, 0.0, exact_zero=True)
    assert (lat, lon) == (30.0, -80.0)
    lat, lon = beam_positions(30.0, -80.0, 45.0, np.array([0.0, 10.0]), None, exact_zero=True)
    assert (lat[0], lon[0]) == (30.0, -80.0) and lat[1] != 30.0


def test_nan_in_nan_out_without_warnings():
    lat, lon = beam_positions(np.array([30.0, 30.0, np.nan]), -80.0, 10.0,
                              np.array([np.nan, 5.0, 5.0]), np.array([0.0, np.nan, 0.0]))
    assert np.isnan(lat).tolist() == [True, True, True]
    lat, lon = beam_positions(30.0, -80.0, np.array([10.0, np.nan]), 5.0)
    assert np.isfinite(lat[0]) and np.isnan(lon[1])


def test_along_present_mask_mixes_pings_with_and_without_along_track():
    lat = np.array([30.0, 30.0, 30.0])
    across = np.array([100.0, 100.0, 100.0])
    along = np.array([5.0, np.nan, 0.0])  # the second ping has no along-track array
    present = np.array([True, False, True])
    blat, blon = beam_positions(lat, -80.0, 10.0, across, along, along_present=present)
    only_lat, only_lon = beam_positions(30.0, -80.0, 10.0, 100.0)
    both_lat, both_lon = beam_positions(30.0, -80.0, 10.0, 100.0, 5.0)
    zero_lat, zero_lon = beam_positions(30.0, -80.0, 10.0, 100.0, 0.0)
    assert (blat[0], blon[0]) == (both_lat, both_lon)
    assert (blat[1], blon[1]) == (only_lat, only_lon)  # no second move at all, not a 0 m move
    assert (blat[2], blon[2]) == (zero_lat, zero_lon)
    assert (zero_lat, zero_lon) != (only_lat, only_lon)
