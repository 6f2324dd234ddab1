"""Beam positions on WGS-84 from a ping position, heading and across/along-track distances.

pfmLoader places a beam of a multibeam ping (docs/geodesy-and-bins.md §8)
by moving from the ping position ``across_track`` metres along azimuth
``heading + 90`` and then, when the ping has an along-track array,
``along_track`` metres along ``heading``, both with nvutility's ``newgp`` (the
NGS direct geodesic, :func:`pfm_dask.geodesy.direct`). :func:`beam_positions`
gives those positions to within 0.01 mm below 80 degrees of latitude from one
per-ping expansion of the two moves (:func:`pfm_dask.geodesy.place_beams`);
:func:`beam_positions_reference` makes the two NGS moves per beam, as pfmLoader
does (slow; the reference in the tests and the benchmark).
"""

from __future__ import annotations

import numpy as np

from ..geodesy import direct, place_beams

__all__ = ["beam_positions", "beam_positions_reference"]


def beam_positions(latitude, longitude, heading, across_track, along_track=None, *,
                   along_present=None, exact_zero: bool = False):
    """Geographic positions (lat, lon) of beams, as pfmLoader computes them (to 0.01 mm).

    All arguments broadcast together: typically ``latitude``, ``longitude``
    and ``heading`` (degrees, heading true) are per-beam copies of the ping
    values, or shaped ``(n_pings, 1)`` against ``(n_pings, n_beams)`` arrays of
    ``across_track`` (metres, + starboard) and ``along_track`` (metres,
    + forward). ``along_track=None`` means the ping has no along-track array:
    only the across-track move is made, as pfmLoader does. When beams of
    pings with and without an along-track array are mixed in one call, pass
    ``along_present`` (bool, broadcastable): where it is false the along-track
    move is skipped (the ``along_track`` value there is ignored). Do not
    substitute 0 m for a missing array: a 0 m move is not a no-op (below).

    pfmLoader calls the geodesic even for a zero distance, and the NGS code
    then moves the point by about 1.4 mm (it floors each local displacement
    component at 1 mm); that is the default here, for parity.
    ``exact_zero=True`` skips moves of exactly 0 m instead (computed by
    :func:`beam_positions_reference`). NaN in any input gives NaN in the
    output. A beam's result depends only on its own inputs, not on the other
    beams of the call. Returns float64 ``(lat, lon)`` arrays (numpy scalars
    for scalar input).
    """
    if exact_zero:
        return beam_positions_reference(latitude, longitude, heading, across_track, along_track,
                                        along_present=along_present, exact_zero=True)
    present = along_track is not None if along_present is None else along_present
    arrays = np.broadcast_arrays(
        *(np.asarray(v, dtype=np.float64) for v in
          (latitude, longitude, heading, across_track, 0.0 if along_track is None else along_track)),
        np.asarray(present, dtype=bool))
    shape = arrays[0].shape
    lat, lon = place_beams(*(np.ascontiguousarray(a).reshape(-1) for a in arrays))
    return _out(lat.reshape(shape)), _out(lon.reshape(shape))


def beam_positions_reference(latitude, longitude, heading, across_track, along_track=None, *,
                             along_present=None, exact_zero: bool = False):
    """:func:`beam_positions` by two NGS direct geodesics per beam, as pfmLoader runs them."""
    lat = np.asarray(latitude, dtype=np.float64)
    lon = np.asarray(longitude, dtype=np.float64)
    hdg = np.asarray(heading, dtype=np.float64)
    across = np.asarray(across_track, dtype=np.float64)
    lat1, lon1 = direct(lat, lon, hdg + 90.0, across)
    if exact_zero:
        lat1 = np.where(across == 0.0, lat, lat1)
        lon1 = np.where(across == 0.0, lon, lon1)
    if along_track is None:
        return _out(lat1), _out(lon1)
    along = np.asarray(along_track, dtype=np.float64)
    if along_present is not None:
        present = np.asarray(along_present, dtype=bool)
        along = np.where(present, along, 0.0)  # keep NaN from absent entries out of the result
    lat2, lon2 = direct(lat1, lon1, hdg, along)
    if exact_zero:
        lat2 = np.where(along == 0.0, lat1, lat2)
        lon2 = np.where(along == 0.0, lon1, lon2)
    if along_present is not None:
        lat2 = np.where(present, lat2, lat1)
        lon2 = np.where(present, lon2, lon1)
    return _out(lat2), _out(lon2)


def _out(a):
    a = np.asarray(a)
    return a[()] if a.ndim == 0 else a
