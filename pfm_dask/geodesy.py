"""WGS-84 forward and inverse geodesics, computed the way the PFM/ABE C code does.

pfmLoader places every beam with nvutility's ``newgp`` (a wrapper around the
NGS "direct" routine, ``lib-utility : newgp.c, direct.c``), and the PFM library
turns metre bin sizes into degrees with its own copy of the same routine
(``lib-pfm_lib : gp.c``, ``pfm_newgp``/``pfm_direct``). The two copies are the
same algorithm with the same constants and the same operation order, so one
port, :func:`direct`, serves both. The library's inverse (``pfm_invgp``, same
as nvutility's ``invgp``) gives the bin size in metres recomputed on open and
the area filter's bin diagonal; it is :func:`inverse`.

Both functions are numpy ports written for this project, vectorised over
broadcastable arrays (scalars give numpy scalars). They follow the C operation
order so that results agree with the C code to the last bit or two (libm
``sin``/``cos``/``atan`` may differ from numpy's by an ulp). That matters for
parity: the header stores degree bin sizes to 15 decimals and sounding offsets
are quantised to 1/4095 of a bin. :func:`direct` on flat arrays of one length
(the loader's beams) runs a numba kernel of the same operations, one point at
a time (no temporaries; the terms of a repeated start latitude or azimuth
reused); it gives the numpy results bit for bit (``tests/test_geodesy_speed.py``).

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
import threading

import numpy as np

__all__ = [
    "WGS84_A",
    "WGS84_B",
    "direct",
    "direct_numpy",
    "inverse",
]

#: WGS-84 semi-major axis (m), as ``PFM_A0`` / ``NV_A0``.
WGS84_A = 6378137.0
#: WGS-84 semi-minor axis (m), as ``PFM_B0`` / ``NV_B0``.
WGS84_B = 6356752.314245

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


def _series_angle(omg, sn, cs, c4, css, c3, c2):
    """The NGS latitude series ``omg + sn*cs*1e-6*(c4 + css*(c3 + c2*css))`` in C order."""
    return omg + ((sn * cs) * 1.0e-6) * (c4 + css * (c3 + c2 * css))


def _out(*arrays):
    """Return 0-d results as numpy scalars, others as arrays."""
    res = tuple(a[()] if a.ndim == 0 else a for a in arrays)
    return res if len(res) > 1 else res[0]


#: Points per block of the one-dimensional path of :func:`direct` (temporaries stay in cache).
_BLOCK = 1 << 15


def direct(lat_deg, lon_deg, azimuth_deg, distance_m):
    """Point reached from (lat, lon) after ``distance_m`` along ``azimuth_deg`` (from north).

    The NGS forward position computation on WGS-84 as pfmLoader (``newgp``)
    and the PFM library (``pfm_newgp``) run it, including its quirks: the
    equator east/west nudge, the 1 mm floor on each local displacement
    component, and the wrap of the output longitude into [-180, 180] once.
    Negative distances move the other way. Azimuths need not be reduced to
    [0, 360). NaN in any input gives NaN out. Returns ``(lat2_deg, lon2_deg)``.

    Terms that depend only on the start latitude or only on the azimuth are
    computed once per distinct value: per ping when beams come as
    ``(pings, beams)`` against ``(pings, 1)``, and per run of equal values when
    they come as flat arrays of one length (the beams of a ping are adjacent),
    which are worked through in blocks. Every value is computed by the same
    operations either way, so the results do not depend on the layout.
    """
    lat = np.asarray(lat_deg, dtype=np.float64)
    lon = np.asarray(lon_deg, dtype=np.float64)
    az = np.asarray(azimuth_deg, dtype=np.float64)
    s = np.asarray(distance_m, dtype=np.float64)
    shape = np.broadcast_shapes(lat.shape, lon.shape, az.shape, s.shape)
    if len(shape) == 1 and lat.shape == lon.shape == az.shape == s.shape and shape[0] > 1:
        return _direct_flat(lat, lon, az, s)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        # No up-front broadcast: terms that depend only on the start latitude or only on the
        # azimuth (per ping, when beams come as (pings, beams) against (pings, 1)) are
        # computed once per ping.
        lat, az = _nudge(lat, az)
        lat2, lon2 = _move(s, lon, *_latitude_terms(lat), *_azimuth_terms(az))
        lat2 = np.broadcast_to(lat2, shape)
        lon2 = np.broadcast_to(lon2, shape)
    return _out(np.array(lat2), np.array(lon2))


def direct_numpy(lat_deg, lon_deg, azimuth_deg, distance_m):
    """:func:`direct` in numpy only (the reference for the compiled flat path)."""
    lat = np.asarray(lat_deg, dtype=np.float64)
    lon = np.asarray(lon_deg, dtype=np.float64)
    az = np.asarray(azimuth_deg, dtype=np.float64)
    s = np.asarray(distance_m, dtype=np.float64)
    shape = np.broadcast_shapes(lat.shape, lon.shape, az.shape, s.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if len(shape) == 1 and lat.shape == lon.shape == az.shape == s.shape and shape[0] > 1:
            lat2 = np.empty(shape)
            lon2 = np.empty(shape)
            for i in range(0, shape[0], _BLOCK):
                j = min(shape[0], i + _BLOCK)
                la, az_ = _nudge(lat[i:j], az[i:j])
                lat2[i:j], lon2[i:j] = _move(s[i:j], lon[i:j], *_per_run(_latitude_terms, la),
                                             *_per_run(_azimuth_terms, az_))
            return lat2, lon2
        lat, az = _nudge(lat, az)
        lat2, lon2 = _move(s, lon, *_latitude_terms(lat), *_azimuth_terms(az))
        lat2 = np.broadcast_to(lat2, shape)
        lon2 = np.broadcast_to(lon2, shape)
    return _out(np.array(lat2), np.array(lon2))


def _direct_flat(lat, lon, az, s):
    """:func:`direct` over flat arrays of one length, by the compiled kernel."""
    lat = np.ascontiguousarray(lat)
    az = np.ascontiguousarray(az)
    lat2 = np.empty(lat.shape)
    lon2 = np.empty(lat.shape)
    _direct_kernel()(lat, lat.view(np.int64), np.ascontiguousarray(lon), az, az.view(np.int64),
                     np.ascontiguousarray(s), lat2, lon2)
    return lat2, lon2


def _k_direct(lat, lat_bits, lon, az, az_bits, s, lat2, lon2):  # pragma: no cover - compiled
    """numba kernel of :func:`direct` for flat arrays: the operations of :func:`_nudge`,
    :func:`_azimuth_terms`, :func:`_latitude_terms` and :func:`_move`, in the same order,
    per point; the azimuth and latitude terms are reused while their inputs repeat (same
    bits: the beams of one ping)."""
    sin_az = cos_az = ef = y0 = 0.0
    nudged_prev = False
    for i in range(lat.size):
        la = lat[i]
        a = az[i]
        nudged = la == 0.0 and (a == 90.0 or a == 270.0)
        if nudged:
            la = la + 1.0e-37
        if i == 0 or az_bits[i] != az_bits[i - 1]:
            az_s = a + 180.0
            if az_s > 360.0:
                az_s = az_s - 360.0
            fazi = 3600.0 * az_s
            fazj = fazi * _ARC1
            sin_az = math.sin(fazj)
            cos_az = math.cos(fazj)
        if i == 0 or lat_bits[i] != lat_bits[i - 1] or nudged != nudged_prev:
            phi = 3600.0 * la
            phj = phi * _ARC1
            sina = math.sin(phj)
            u = 1.0 - _ESQ * sina * sina
            ef = (u * u * 1.0e15) / (3.0 * _AXIS * _AXIS * (1.0 - _ESQ))
            cosa = math.cos(phj)
            cssq = cosa * cosa
            y0 = _Z1 * (phj + ((sina * cosa) * 1.0e-6) * (-_Z4 + cssq * (_Z3 + -_Z2 * cssq)))
        nudged_prev = nudged
        alam = 3600.0 * lon[i]
        x = s[i] * sin_az
        if abs(x) < 1.0e-3:
            x = 0.001
        y = -s[i] * cos_az
        if abs(y) < 1.0e-3:
            y = 0.001
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
        facb = (1.0 + 3.0 * ((sin1 * sin1) / (cos1 * cos1))) / (3.0 * (sin1 / cos1))
        facc = (3.0 * _ESQ * sin1 * cos1) / (1.0 - _ESQ)
        cay = (faca * (facb - facc)) * 1.0e6
        t = va / 1000.0
        y3 = y2 + cay * (t * t)
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
        lat2[i] = phipri / 3600.0
        lon2[i] = alampr / 3600.0


_KERNEL: list = []
_KERNEL_LOCK = threading.Lock()


def _direct_kernel():
    """The compiled :func:`_k_direct` (compiled, or loaded from numba's on-disk cache, on first use).

    No fastmath: every operation is the IEEE double operation written, in
    order (no reassociation, no fused multiply-add), and ``math.sin``/``cos``
    are the C library's, as numpy's float64 ``sin``/``cos`` are here (the
    tests compare the kernel with :func:`direct_numpy` bit for bit).
    """
    if not _KERNEL:
        with _KERNEL_LOCK:
            if not _KERNEL:
                import numba

                T = numba.types
                f8 = T.Array(T.float64, 1, "C", readonly=True)
                i8 = T.Array(T.int64, 1, "C", readonly=True)
                out = T.Array(T.float64, 1, "C")
                sig = T.void(f8, i8, f8, f8, i8, f8, out, out)
                try:
                    k = numba.njit(sig, nogil=True, cache=True, error_model="numpy")(_k_direct)
                except RuntimeError as exc:  # no writable cache directory
                    if "cannot cache" not in str(exc):
                        raise
                    k = numba.njit(sig, nogil=True, error_model="numpy")(_k_direct)
                _KERNEL.append(k)
    return _KERNEL[0]


def _nudge(lat, az):
    """newgp: on the equator heading exactly east or west the series divides by tan(0); the
    C wrapper lifts the start latitude by 1e-37 degrees."""
    return np.where((lat == 0.0) & ((az == 90.0) | (az == 270.0)), lat + 1.0e-37, lat), az


def _per_run(terms, v: np.ndarray):
    """``terms(v)`` computed once per run of equal values (same bits) of the 1-D ``v``."""
    n = v.size
    if n < 2:
        return terms(v)
    bits = v.view(np.int64)
    starts = np.flatnonzero(bits[1:] != bits[:-1]) + 1
    if 2 * starts.size >= n:
        return terms(v)
    first = np.concatenate(([0], starts))
    reps = np.diff(np.append(first, n))
    return tuple(np.repeat(t, reps) for t in terms(v[first]))


def _azimuth_terms(az):
    """sin and cos of the azimuth from south (in the NGS arc-second units), per azimuth."""
    # azimuth from north -> from south, subtracting 360 once if above 360
    az_s = az + 180.0
    az_s = np.where(az_s > 360.0, az_s - 360.0, az_s)
    fazi = 3600.0 * az_s
    fazj = fazi * _ARC1
    return np.sin(fazj), np.cos(fazj)


def _latitude_terms(lat):
    """The NGS terms of the start latitude: ``ef`` and the meridian arc ``y0``."""
    phi = 3600.0 * lat  # arc seconds
    phj = phi * _ARC1
    sina = np.sin(phj)
    u = 1.0 - _ESQ * sina * sina
    ef = (u * u * 1.0e15) / (3.0 * _AXIS * _AXIS * (1.0 - _ESQ))
    cosa = np.cos(phj)
    cssq = cosa * cosa
    y0 = _Z1 * _series_angle(phj, sina, cosa, -_Z4, cssq, _Z3, -_Z2)
    return ef, y0


def _move(s, lon, ef, y0, sin_az, cos_az):
    """The rest of the NGS forward computation, per point; returns (lat2, lon2) in degrees."""
    alam = 3600.0 * lon
    x = s * sin_az
    x = np.where(np.abs(x) < 1.0e-3, 0.001, x)
    y = -s * cos_az
    y = np.where(np.abs(y) < 1.0e-3, 0.001, y)
    t = y / 10000.0
    b = t * t
    xcor = b * ef / 2.0
    xpri = x - xcor * x * 1.0e-7
    t = xpri / 10000.0
    a = t * t
    ycor = ef * a
    ypri = y + ycor * y * 1.0e-7
    y1 = y0 + ypri
    omega = _W1 * y1
    sin1 = np.sin(omega)
    cos1 = np.cos(omega)
    css1 = cos1 * cos1
    phi1 = _series_angle(omega, sin1, cos1, _W4, css1, _W3, _W2)
    sin1 = np.sin(phi1)
    cos1 = np.cos(phi1)
    faca = np.sqrt(1.0 - _ESQ * sin1 * sin1) / (2.0 * _AXIS)
    v = sin1 / cos1 * faca * 1.0e8
    va = v * a
    y2 = y1 - va
    facb = (1.0 + 3.0 * ((sin1 * sin1) / (cos1 * cos1))) / (3.0 * (sin1 / cos1))
    facc = (3.0 * _ESQ * sin1 * cos1) / (1.0 - _ESQ)
    cay = (faca * (facb - facc)) * 1.0e6
    t = va / 1000.0
    y3 = y2 + cay * (t * t)
    omegb = _W1 * y3
    sin2 = np.sin(omegb)
    cos2 = np.cos(omegb)
    css2 = cos2 * cos2
    phipri = _series_angle(omegb, sin2, cos2, _W4, css2, _W3, _W2)
    sp = np.sin(phipri)
    h = np.sqrt(1.0 - _ESQ * (sp * sp)) / (_AXIS * np.cos(phipri) * _ARC1)
    applam = h * xpri
    asinco = (v * va) / 15.0
    dellam = applam + applam * asinco * 1.0e-7
    alampr = alam - dellam
    phipri = phipri / _ARC1
    wrap = np.abs(alampr) > 648000.0
    alampr = np.where(wrap & (alampr > 0.0), alampr - 1296000.0,
                      np.where(wrap & (alampr < 0.0), alampr + 1296000.0, alampr))
    return phipri / 3600.0, alampr / 3600.0


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
