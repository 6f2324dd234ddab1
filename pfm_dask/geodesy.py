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
are quantised to 1/4095 of a bin.

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

import numpy as np

__all__ = [
    "WGS84_A",
    "WGS84_B",
    "direct",
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


def direct(lat_deg, lon_deg, azimuth_deg, distance_m):
    """Point reached from (lat, lon) after ``distance_m`` along ``azimuth_deg`` (from north).

    The NGS forward position computation on WGS-84 as pfmLoader (``newgp``)
    and the PFM library (``pfm_newgp``) run it, including its quirks: the
    equator east/west nudge, the 1 mm floor on each local displacement
    component, and the wrap of the output longitude into [-180, 180] once.
    Negative distances move the other way. Azimuths need not be reduced to
    [0, 360). NaN in any input gives NaN out. Returns ``(lat2_deg, lon2_deg)``.
    """
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

        fazj = fazi * _ARC1
        x = s * np.sin(fazj)
        x = np.where(np.abs(x) < 1.0e-3, 0.001, x)
        y = -s * np.cos(fazj)
        y = np.where(np.abs(y) < 1.0e-3, 0.001, y)
        t = y / 10000.0
        b = t * t
        phj = phi * _ARC1
        sina = np.sin(phj)
        u = 1.0 - _ESQ * sina * sina
        ef = (u * u * 1.0e15) / (3.0 * _AXIS * _AXIS * (1.0 - _ESQ))
        xcor = b * ef / 2.0
        xpri = x - xcor * x * 1.0e-7
        t = xpri / 10000.0
        a = t * t
        ycor = ef * a
        ypri = y + ycor * y * 1.0e-7
        cosa = np.cos(phj)
        cssq = cosa * cosa
        y0 = _Z1 * _series_angle(phj, sina, cosa, -_Z4, cssq, _Z3, -_Z2)
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
        lat2 = np.broadcast_to(phipri / 3600.0, shape)
        lon2 = np.broadcast_to(alampr / 3600.0, shape)
    return _out(np.array(lat2), np.array(lon2))


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
