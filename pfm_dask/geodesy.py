"""WGS-84 forward and inverse geodesics, computed the way the PFM/ABE C code does.

pfmLoader places every beam with nvutility's ``newgp`` (a wrapper around the
NGS "direct" routine, ``lib-utility : newgp.c, direct.c``), and the PFM library
turns metre bin sizes into degrees with its own copy of the same routine
(``lib-pfm_lib : gp.c``, ``pfm_newgp``/``pfm_direct``). The two copies are the
same algorithm with the same constants and the same operation order, so one
port, :func:`direct`, serves both. The library's inverse (``pfm_invgp``, same
as nvutility's ``invgp``) gives the bin size in metres recomputed on open and
the area filter's bin diagonal; it is :func:`inverse`.

:func:`direct` is a numba kernel written for this project (the NGS operations
in numba helpers, one point at a time, in the C operation order, so results
agree with the C code to the last bit or two: libm ``sin``/``cos`` may differ
by an ulp); :func:`inverse` is numpy. Both broadcast (scalars give numpy
scalars). The operation order matters for parity: the header stores degree bin
sizes to 15 decimals and sounding offsets are quantised to 1/4095 of a bin.
``tests/test_geodesy_speed.py`` compares :func:`direct` bit for bit with the
numpy port it replaced.

:func:`place_beams` places beams (pfmLoader's two NGS moves per beam) from
one expansion per ping of those same NGS helpers: within 0.01 mm of the two
moves below 80 degrees, about ten times faster (``docs/geodesy-and-bins.md``).

Accuracy against an exact geodesic (geographiclib), distances 0-20 km, all
latitudes below 89 degrees: see ``tests/test_geodesy.py`` and
``docs/geodesy-and-bins.md``. Two artefacts of the NGS code are kept on purpose
because pfmLoader has them: a displacement component smaller than 1 mm along
either local axis is replaced by +1 mm (so a zero-length move still moves the
point by about 1.4 mm, and a pure north or east move picks up a 1 mm sideways
step), and arc seconds are converted with the rounded constant
``0.484813681110e-5`` rad.
"""

from __future__ import annotations

import math

import numpy as np

from ._numeric import CompiledKernels

__all__ = [
    "WGS84_A",
    "WGS84_B",
    "direct",
    "inverse",
    "place_beams",
    "radii",
]

#: WGS-84 semi-major axis (m), as ``PFM_A0`` / ``NV_A0``.
WGS84_A = 6378137.0
#: WGS-84 semi-minor axis (m), as ``PFM_B0`` / ``NV_B0``.
WGS84_B = 6356752.314245
_F = 1.0 / 298.257223563      # WGS-84 flattening, and the first eccentricity squared
_E2 = _F * (2.0 - _F)


def radii(lat_deg):
    """Meridian (M) and prime-vertical (N) radii of curvature of WGS-84 (metres) at
    ``lat_deg``: metres north and east per radian of latitude and (times cos lat) longitude,
    for moves on the plane tangent there."""
    s = np.sin(np.radians(lat_deg))
    w = 1.0 - _E2 * s * s
    return WGS84_A * (1.0 - _E2) / w ** 1.5, WGS84_A / np.sqrt(w)

# --- constants of the NGS direct routine (WGS-84 / NAD 83 values from its hdinit) ---
_AXIS = 6378137.0
_ESQ = 6.69438002292318e-3
_Z1 = 6367449.145771138
_Z2 = 0.1104825480468667
_Z3 = 21.25880271589918
_Z4 = 5048.250737106752
_W1 = 0.1570487611454482e-6
_W2 = 0.23832988623869
_W3 = 29.36926254762117
_W4 = 5022.894084128594
_ARC1 = 0.484813681110e-5  # radians per arc second, as rounded in the C code

# --- constants of the inverse routine ---
_PI = 3.141592653589793
_TWOPI = 6.283185307179586
_RAD_TO_DEG = 57.2957795147195  # as written in the C code (not exactly 180/pi)
_TINY = 1.0e-31


def _out(*arrays):
    """Return 0-d results as numpy scalars, others as arrays."""
    res = tuple(a[()] if a.ndim == 0 else a for a in arrays)
    return res if len(res) > 1 else res[0]


def direct(lat_deg, lon_deg, azimuth_deg, distance_m):
    """Point reached from (lat, lon) after ``distance_m`` along ``azimuth_deg`` (from north).

    The NGS forward position computation on WGS-84 as pfmLoader (``newgp``)
    and the PFM library (``pfm_newgp``) run it, including its quirks: the
    equator east/west nudge, the 1 mm floor on each local displacement
    component, and the wrap of the output longitude into [-180, 180] once.
    Negative distances move the other way. Azimuths need not be reduced to
    [0, 360). NaN in any input gives NaN out. Inputs broadcast; returns
    ``(lat2_deg, lon2_deg)`` (numpy scalars for scalar input). Every point is
    computed by the compiled :func:`_k_direct`, so the result of a point does
    not depend on the shape or the other points.
    """
    arrays = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64)
                                   for v in (lat_deg, lon_deg, azimuth_deg, distance_m)))
    shape = arrays[0].shape
    lat, lon, az, s = (np.ascontiguousarray(a).reshape(-1) for a in arrays)
    lat2 = np.empty(lat.size)
    lon2 = np.empty(lat.size)
    _kernel("direct")(lat, lat.view(np.int64), lon, az, az.view(np.int64), s, lat2, lon2)
    return _out(lat2.reshape(shape), lon2.reshape(shape))


# --------------------------------------------------------------------------------------------
# The NGS forward computation, in numba helpers (compiled with the kernels that call them).
# No fastmath: every operation is the IEEE double operation written, in the C code's order
# (no reassociation, no fused multiply-add); math.sin/cos are the C library's.

def _ngs_start(lat):
    """The NGS terms of a start latitude (degrees): ``ef`` and the meridian arc ``y0``."""
    phj = (3600.0 * lat) * _ARC1  # arc seconds, then radians with the rounded constant
    sina = math.sin(phj)
    u = 1.0 - _ESQ * sina * sina
    ef = (u * u * 1.0e15) / (3.0 * _AXIS * _AXIS * (1.0 - _ESQ))
    cosa = math.cos(phj)
    cssq = cosa * cosa
    y0 = _Z1 * (phj + ((sina * cosa) * 1.0e-6) * (-_Z4 + cssq * (_Z3 + -_Z2 * cssq)))
    return ef, y0


def _ngs_azimuth(az):
    """sin and cos of the azimuth from south (the NGS convention), from an azimuth from north."""
    az_s = az + 180.0
    if az_s > 360.0:  # subtracted once, as the C code does
        az_s = az_s - 360.0
    fazj = (3600.0 * az_s) * _ARC1
    return math.sin(fazj), math.cos(fazj)


def _ngs_move(x, y, lon, ef, y0):
    """The NGS move by the local components ``x`` (m, west) and ``y`` (m, north) from a start of
    longitude ``lon`` and latitude terms ``(ef, y0)``; returns ``(lat2, lon2)`` in degrees,
    the longitude wrapped into [-180, 180] once. No 1 mm floor here (see :func:`_ngs_direct`).

    One guard the C code lacks: a move ending exactly on the equator (``phi1 == 0``) adds the
    limit 0 of the ``cay`` correction instead of ``inf * 0``; the floored direct move never
    gets there, the unfloored moves of :func:`_k_place` may.
    """
    alam = 3600.0 * lon
    t = y / 10000.0
    b = t * t
    xcor = b * ef / 2.0
    xpri = x - xcor * x * 1.0e-7
    t = xpri / 10000.0
    a2 = t * t
    ycor = ef * a2
    ypri = y + ycor * y * 1.0e-7
    y1 = y0 + ypri
    omega = _W1 * y1
    sin1 = math.sin(omega)
    cos1 = math.cos(omega)
    css1 = cos1 * cos1
    phi1 = omega + ((sin1 * cos1) * 1.0e-6) * (_W4 + css1 * (_W3 + _W2 * css1))
    sin1 = math.sin(phi1)
    cos1 = math.cos(phi1)
    faca = math.sqrt(1.0 - _ESQ * sin1 * sin1) / (2.0 * _AXIS)
    v = sin1 / cos1 * faca * 1.0e8
    va = v * a2
    y2 = y1 - va
    t = va / 1000.0
    if t != 0.0:
        facb = (1.0 + 3.0 * ((sin1 * sin1) / (cos1 * cos1))) / (3.0 * (sin1 / cos1))
        facc = (3.0 * _ESQ * sin1 * cos1) / (1.0 - _ESQ)
        cay = (faca * (facb - facc)) * 1.0e6
        y3 = y2 + cay * (t * t)
    else:
        y3 = y2 + 0.0
    omegb = _W1 * y3
    sin2 = math.sin(omegb)
    cos2 = math.cos(omegb)
    css2 = cos2 * cos2
    phipri = omegb + ((sin2 * cos2) * 1.0e-6) * (_W4 + css2 * (_W3 + _W2 * css2))
    sp = math.sin(phipri)
    h = math.sqrt(1.0 - _ESQ * (sp * sp)) / (_AXIS * math.cos(phipri) * _ARC1)
    applam = h * xpri
    asinco = (v * va) / 15.0
    dellam = applam + applam * asinco * 1.0e-7
    alampr = alam - dellam
    phipri = phipri / _ARC1
    if abs(alampr) > 648000.0:
        if alampr > 0.0:
            alampr = alampr - 1296000.0
        elif alampr < 0.0:
            alampr = alampr + 1296000.0
    return phipri / 3600.0, alampr / 3600.0


def _ngs_floor(v):
    """The NGS code's floor: a local component smaller than 1 mm becomes +1 mm."""
    return 0.001 if abs(v) < 1.0e-3 else v


def _ngs_direct(lat, lon, az, s):
    """One NGS direct geodesic as pfmLoader's ``newgp`` runs it: the equator east/west nudge,
    the 1 mm floors, the move. Returns ``(lat2, lon2)`` in degrees."""
    if lat == 0.0 and (az == 90.0 or az == 270.0):  # the series divides by tan(lat)
        lat = lat + 1.0e-37
    sin_az, cos_az = _ngs_azimuth(az)
    ef, y0 = _ngs_start(lat)
    return _ngs_move(_ngs_floor(s * sin_az), _ngs_floor(-s * cos_az), lon, ef, y0)


def _k_direct(lat, lat_bits, lon, az, az_bits, s, lat2, lon2):  # pragma: no cover - compiled
    """numba kernel of :func:`direct` over flat arrays: :func:`_ngs_direct` per point, with the
    azimuth and latitude terms reused while their inputs repeat (same bits)."""
    sin_az = cos_az = ef = y0 = 0.0
    nudged_prev = False
    for i in range(lat.size):
        la = lat[i]
        a = az[i]
        nudged = la == 0.0 and (a == 90.0 or a == 270.0)
        if nudged:
            la = la + 1.0e-37
        if i == 0 or az_bits[i] != az_bits[i - 1]:
            sin_az, cos_az = _ngs_azimuth(a)
        if i == 0 or lat_bits[i] != lat_bits[i - 1] or nudged != nudged_prev:
            ef, y0 = _ngs_start(la)
        nudged_prev = nudged
        lat2[i], lon2[i] = _ngs_move(_ngs_floor(s[i] * sin_az), _ngs_floor(-s[i] * cos_az), lon[i],
                                     ef, y0)


# --------------------------------------------------------------------------------------------
# Beam placement: the two NGS moves of every beam of a ping from one per-ping expansion.

#: Across-track distances (m) placed by the expansion: |across| <= this.
PLACE_ACROSS_M = 15000.0
#: Along-track distances (m) placed by the expansion: |along| <= this.
PLACE_ALONG_M = 1000.0
#: Ping latitudes (deg) placed by the expansion: |lat| <= this. Beyond, and for distances
#: beyond the two limits above, beams get the two NGS moves themselves.
PLACE_LAT_DEG = 85.0
#: Nodes of the across-track series (degree 5), and of the along-track move (across x along).
_N_ACROSS, _N_ACROSS2, _N_ALONG = 6, 4, 4


def _nodes(k: int):
    """Chebyshev nodes of the first kind on [-1, 1] and the inverse of their Vandermonde matrix:
    it takes values at the nodes to the coefficients of the interpolating polynomial in powers
    of t (well conditioned at these degrees: the coefficients stay below 2**k of the values)."""
    t = np.cos(np.pi * (np.arange(k) + 0.5) / k)
    return np.ascontiguousarray(t), np.ascontiguousarray(np.linalg.inv(np.vander(t, k, increasing=True)))


def _wrap180(d):
    """A longitude difference into [-180, 180] (one turn at most)."""
    if d > 180.0:
        return d - 360.0
    if d < -180.0:
        return d + 360.0
    return d


def _coef(c, q):
    """Row ``q`` of the (2, 22) coefficient array as a tuple (scalars for the beam loop)."""
    return (c[q, 0], c[q, 1], c[q, 2], c[q, 3], c[q, 4], c[q, 5], c[q, 6], c[q, 7], c[q, 8],
            c[q, 9], c[q, 10], c[q, 11], c[q, 12], c[q, 13], c[q, 14], c[q, 15], c[q, 16],
            c[q, 17], c[q, 18], c[q, 19], c[q, 20], c[q, 21])


def _series(c, t, u, pm):
    """The placement polynomial: degree 5 in ``t`` (the across-track move) plus ``pm`` times
    a polynomial of degree 3 in ``t`` and 3 in ``u`` (the along-track move), by Horner."""
    p = ((((c[5] * t + c[4]) * t + c[3]) * t + c[2]) * t + c[1]) * t + c[0]
    r0 = ((c[9] * u + c[8]) * u + c[7]) * u + c[6]
    r1 = ((c[13] * u + c[12]) * u + c[11]) * u + c[10]
    r2 = ((c[17] * u + c[16]) * u + c[15]) * u + c[14]
    r3 = ((c[21] * u + c[20]) * u + c[19]) * u + c[18]
    return p + pm * (((r3 * t + r2) * t + r1) * t + r0)


def _k_place(lat, lat_bits, lon, lon_bits, hdg, hdg_bits, across, along, present,
             ta, ma, ta2, ma2, tb, mb, out_lat, out_lon):  # pragma: no cover - compiled
    """numba kernel of :func:`place_beams` (see there). Beams whose ping position and heading
    repeat (same bits) share the expansion, built once per run by :func:`_place_run`; the
    result of a beam does not depend on that."""
    fa, g, coef = _place_scratch(ta, ta2, tb)
    n = lat.size
    i = 0
    while i < n:
        j = i + 1
        while (j < n and lat_bits[j] == lat_bits[i] and lon_bits[j] == lon_bits[i]
               and hdg_bits[j] == hdg_bits[i]):
            j += 1
        _place_run(lat[i], lon[i], hdg[i], across, along, present, i, j, ta, ma, ta2, ma2, tb,
                   mb, fa, g, coef, out_lat, out_lon)
        i = j


def _place_scratch(ta, ta2, tb):
    """The work arrays of :func:`_place_run` (node values and coefficients)."""
    return (np.empty((2, ta.size)), np.empty((2, ta2.size, tb.size)),
            np.zeros((2, ta.size + ta2.size * tb.size)))


def _place_run(lat0, lon0, h, across, along, present, i, j, ta, ma, ta2, ma2, tb, mb, fa, g,
               coef, out_lat, out_lon):
    """Beams ``i:j`` of one ping (position ``lat0, lon0``, heading ``h``) placed into
    ``out_lat, out_lon``: the per-ping expansion, then each beam's polynomial and 1 mm floors
    (the beam loop has no branch, so the compiler vectorises it; beams outside the expansion
    are redone after it by the two NGS moves). Shared by :func:`_k_place` and the load's task
    kernel (``pfm_dask._task_kernels``)."""
    na, na2, nb = ta.size, ta2.size, tb.size
    deg = 180.0 / math.pi
    inv_a = 1.0 / PLACE_ACROSS_M
    inv_b = 1.0 / PLACE_ALONG_M
    expand = abs(lat0) <= PLACE_LAT_DEG and math.isfinite(lon0) and math.isfinite(h)
    sa1 = ca1 = sa2 = ca2 = k_lat = k_lon = 0.0
    if expand:
        sa1, ca1 = _ngs_azimuth(h + 90.0)
        sa2, ca2 = _ngs_azimuth(h)
        ef0, y00 = _ngs_start(lat0)
        # the across-track move at the nodes, without the 1 mm floors
        for k in range(na):
            s = PLACE_ACROSS_M * ta[k]
            la, lo = _ngs_move(s * sa1, -s * ca1, lon0, ef0, y00)
            fa[0, k] = la - lat0
            fa[1, k] = _wrap180(lo - lon0)
        for q in range(2):
            for c in range(na):
                acc = 0.0
                for k in range(na):
                    acc += ma[c, k] * fa[q, k]
                coef[q, c] = acc
        # the along-track move from some across-track nodes, relative to its start
        for k in range(na2):
            s = PLACE_ACROSS_M * ta2[k]
            la1, lo1 = _ngs_move(s * sa1, -s * ca1, lon0, ef0, y00)
            ef1, y01 = _ngs_start(la1)
            for m in range(nb):
                s = PLACE_ALONG_M * tb[m]
                la, lo = _ngs_move(s * sa2, -s * ca2, lo1, ef1, y01)
                g[0, k, m] = la - la1
                g[1, k, m] = _wrap180(lo - lo1)
        for q in range(2):
            for c in range(na2):
                for d in range(nb):
                    acc = 0.0
                    for k in range(na2):
                        row = 0.0
                        for m in range(nb):
                            row += mb[d, m] * g[q, k, m]
                        acc += ma2[c, k] * row
                    coef[q, na + c * nb + d] = acc
        # degrees per metre north and east at the ping, for the 1 mm floors
        sphi = math.sin(lat0 / deg)
        w = 1.0 - _ESQ * sphi * sphi
        k_lat = deg * w * math.sqrt(w) / (_AXIS * (1.0 - _ESQ))
        k_lon = deg * math.sqrt(w) / (_AXIS * math.cos(lat0 / deg))
        cl = _coef(coef, 0)
        co = _coef(coef, 1)
        for ri in range(i, j):  # no branch: vectorised
            r = np.uint64(ri)   # unsigned indices: no negative-index fix-up per access
            b = along[r]
            b = b if present[r] else 0.0  # (loaded first: a conditional load is not)
            pm = 1.0 if present[r] else 0.0
            t = across[r] * inv_a
            u = b * inv_b
            out_lat[r] = lat0 + _series(cl, t, u, pm)
            out_lon[r] = lon0 + _series(co, t, u, pm)
    for ri in range(i, j):
        r = np.uint64(ri)
        a = across[r]
        has_along = present[r]
        b = along[r] if has_along else 0.0
        if not (expand and abs(a) <= PLACE_ACROSS_M and abs(b) <= PLACE_ALONG_M):
            # outside the expansion (or NaN): the two NGS moves themselves
            la, lo = _ngs_direct(lat0, lon0, h + 90.0, a)
            if has_along:
                la, lo = _ngs_direct(la, lo, h, b)
            out_lat[r] = la
            out_lon[r] = lo
            continue
        # the 1 mm floors: a local component below 1 mm was +1 mm (x west, y north);
        # their effect is a local step of under 2.9 mm, linear to within micrometres
        x1 = a * sa1
        y1 = -a * ca1
        x2 = b * sa2
        y2 = -b * ca2
        if (abs(x1) < 1.0e-3 or abs(y1) < 1.0e-3
                or (has_along and (abs(x2) < 1.0e-3 or abs(y2) < 1.0e-3))):
            fx = 0.001 - x1 if abs(x1) < 1.0e-3 else 0.0
            fy = 0.001 - y1 if abs(y1) < 1.0e-3 else 0.0
            if has_along:
                if abs(x2) < 1.0e-3:
                    fx += 0.001 - x2
                if abs(y2) < 1.0e-3:
                    fy += 0.001 - y2
            out_lat[r] += fy * k_lat
            out_lon[r] -= fx * k_lon
        lo = out_lon[r]
        if abs(lo) > 180.0:  # wrapped once, as the NGS code does
            out_lon[r] = lo - 360.0 if lo > 0.0 else lo + 360.0


_TA, _MA = _nodes(_N_ACROSS)
_TA2, _MA2 = _nodes(_N_ACROSS2)
_TB, _MB = _nodes(_N_ALONG)
#: the nodes and inverse Vandermonde matrices :func:`_place_run` takes
PLACE_NODES = (_TA, _MA, _TA2, _MA2, _TB, _MB)


def place_beams(lat, lon, heading, across, along, present):
    """Beam positions from flat per-beam arrays of one length, by the compiled :func:`_k_place`.

    Each beam is moved ``across`` metres along ``heading + 90`` and then, where ``present``,
    ``along`` metres along ``heading``: pfmLoader's two NGS direct geodesics. Per ping position
    and heading, the NGS across-track move (without its 1 mm floors) is evaluated at 6 Chebyshev
    nodes over +-15 km and interpolated by a polynomial of degree 5 in ``across``; the
    along-track move from 4 across-track nodes, at 4 nodes over +-1 km, by a polynomial of
    degree 3 in each of ``across`` and ``along``. Each beam then sums the two polynomials and
    adds, as a local linear step, the effect of the 1 mm floors its own moves trigger (the NGS
    code replaces a local east or north component under 1 mm by +1 mm). That is the NGS result
    to within 0.01 mm below 80 degrees, 0.1 mm to 85 (``tests/test_placement.py``) for 26 NGS
    moves per ping instead of two per beam. Beams beyond those distances, and pings beyond 85
    degrees of latitude, get the two NGS moves themselves; so does NaN. A beam's result depends
    only on its own inputs. Returns ``(lat, lon)``.
    """
    arrs = [np.ascontiguousarray(v, dtype=np.float64) for v in (lat, lon, heading, across, along)]
    pres = np.ascontiguousarray(present, dtype=np.bool_)
    n = arrs[0].size
    out_lat = np.empty(n)
    out_lon = np.empty(n)
    la, lo, hd, ac, al = arrs
    _kernel("place")(la, la.view(np.int64), lo, lo.view(np.int64), hd, hd.view(np.int64), ac, al,
                     pres, *PLACE_NODES, out_lat, out_lon)
    return out_lat, out_lon


def _signatures(T) -> dict:
    f8r = T.Array(T.float64, 1, "C", readonly=True)
    i8r = T.Array(T.int64, 1, "C", readonly=True)
    f8 = T.Array(T.float64, 1, "C")
    m8 = T.Array(T.float64, 2, "C", readonly=True)
    br = T.Array(T.bool_, 1, "C", readonly=True)
    return {
        "direct": T.void(f8r, i8r, f8r, f8r, i8r, f8r, f8, f8),
        "place": T.void(f8r, i8r, f8r, i8r, f8r, i8r, f8r, f8r, br, f8r, m8, f8r, m8, f8r, m8,
                        f8, f8),
    }


#: the compiled ``_k_<name>`` (compiled, or loaded from numba's on-disk cache, on first use)
_kernel = CompiledKernels(globals(), _signatures,
                          helpers=("_ngs_start", "_ngs_azimuth", "_ngs_move", "_ngs_floor",
                                   "_ngs_direct", "_wrap180", "_coef", "_series",
                                   "_place_scratch", "_place_run"))


def _invgp_distance_azimuth(lat1, lon1, lat2, lon2, a0=WGS84_A, b0=WGS84_B):
    """Distance (m) and azimuth (deg) from point 1 to point 2, as ``pfm_invgp``/``invgp``."""
    flat = 1.0 - (b0 / a0)
    flat2 = flat * flat
    f1 = flat2 * 1.25
    f2 = flat2 * 0.5
    f3 = flat2 * 0.25
    f4 = flat2 * 0.125
    f5 = flat2 * 0.0625
    f6 = flat + flat2
    f7 = f6 + 1.0
    f8 = f6 * 0.5

    drlat1 = lat1 / _RAD_TO_DEG
    drlat2 = lat2 / _RAD_TO_DEG
    drlon1 = lon1 / _RAD_TO_DEG
    drlon2 = lon2 / _RAD_TO_DEG

    beta1 = np.arctan((1.0 - flat) * np.sin(drlat1) / np.cos(drlat1))
    sbeta1 = np.sin(beta1)
    cbeta1 = np.cos(beta1)
    beta2 = np.arctan((1.0 - flat) * np.sin(drlat2) / np.cos(drlat2))
    sbeta2 = np.sin(beta2)
    cbeta2 = np.cos(beta2)

    dell = drlon1 - drlon2
    adell = np.abs(dell)
    # longitudes of opposite sign: measure the gap through the shorter side
    opp = drlon1 * drlon2 < 0.0
    adell_o = np.abs(drlon1) + np.abs(drlon2)
    dell_o = np.where(drlon1 < 0.0, -adell_o, adell_o)
    big = adell_o > _PI
    adell_b = _TWOPI - adell_o
    dell_o = np.where(big, np.where(drlon1 > 0.0, -adell_b, adell_b), dell_o)
    adell_o = np.where(big, adell_b, adell_o)
    adell = np.where(opp, adell_o, adell)
    dell = np.where(opp, dell_o, dell)

    adell = _TWOPI - adell
    sidel = np.sin(adell)
    codel = np.cos(adell)
    a = sbeta1 * sbeta2
    b = cbeta1 * cbeta2
    cophi = a + b * codel
    q1 = sidel * cbeta2
    q1 = q1 * q1
    q2 = sbeta2 * cbeta1 - sbeta1 * cbeta2 * codel
    q2 = q2 * q2
    siphi = np.sqrt(q1 + q2)
    c = b * sidel / siphi
    em = 1.0 - c * c

    phi = np.arctan(siphi / (np.sqrt(1.0 - siphi * siphi) + _TINY))
    phi = np.where(cophi < 0.0, _PI - phi, phi)
    phisq = phi * phi
    csphi = 1.0 / siphi
    ctphi = cophi / siphi
    psyco = siphi / cophi

    term1 = f7 * phi
    term2 = a * (f6 * siphi - f2 * phisq * csphi)
    term3 = em * (f2 * phisq * ctphi - f8 * (phi + psyco))
    term4 = a * a * f2 * psyco
    term5 = em * em * (f5 * (phi + psyco) - f2 * phisq * ctphi - f4 * psyco * cophi * cophi)
    term6 = a * em * f2 * (phisq * csphi + psyco * cophi)
    dist = b0 * (term1 + term2 + term3 - term4 + term5 + term6)

    term1 = f6 * phi
    term2 = a * (f2 * siphi + flat2 * phisq * csphi)
    term3 = em * (f3 * psyco + flat2 * phisq * ctphi - f1 * phi)
    xlam1 = c * (term1 - term2 + term3) + adell
    q1 = sbeta2 * cbeta1 - np.cos(xlam1) * sbeta1 * cbeta2
    q2 = np.sin(xlam1) * cbeta2
    q1 = np.where(q1 == 0.0, _TINY, q1)
    tan = q2 / q1
    az = np.arctan(tan)

    n = np.full(np.shape(az), 3.0)
    n = np.where(dell * tan < 0.0, 4.0, n)
    n = np.where(dell < 0.0, n - 2.0, n)
    n = np.where((q1 > 0.0) & (dell == 0.0), 1.0, n)
    out = np.where(n >= 3.0, (n - 2.0) * _PI + az, n * _PI - _PI - az)
    return dist, out * _RAD_TO_DEG


def inverse(lat1_deg, lon1_deg, lat2_deg, lon2_deg):
    """Distance and azimuths between two points, as the library's ``invgp``.

    Returns ``(distance_m, az12_deg, az21_deg)``: ``az12`` is the azimuth at
    point 1 towards point 2 and ``az21`` the azimuth at point 2 towards
    point 1 (the C routine run with the points swapped), both clockwise from
    north. The distance is the library's approximate ellipsoidal formula
    (second order in the flattening), the one it uses to recompute
    ``[BIN SIZE XY]`` on open and pfmLoader uses for the bin diagonal.
    Coincident points give a distance of about 0 (not exactly 0).
    """
    lat1, lon1, lat2, lon2 = np.broadcast_arrays(
        np.asarray(lat1_deg, dtype=np.float64), np.asarray(lon1_deg, dtype=np.float64),
        np.asarray(lat2_deg, dtype=np.float64), np.asarray(lon2_deg, dtype=np.float64))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        dist, az12 = _invgp_distance_azimuth(lat1, lon1, lat2, lon2)
        _, az21 = _invgp_distance_azimuth(lat2, lon2, lat1, lon1)
    return _out(np.asarray(dist), np.asarray(az12), np.asarray(az21))
