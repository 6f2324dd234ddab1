"""The automatic area: the grid a load makes when neither ``--mbr`` nor ``--polygon`` is given.

Four jobs, each robust to what real surveys hold:

* **Positions far from a file's own track** (a ping at a wrong but legal
  latitude, a null fix at (0, 0)) are damage: :func:`far_pings` names them
  (file, ping, byte offset) and the pre-scan leaves them out of the file's
  extent, so one bad fix cannot stretch the area to billions of bins. A ping
  is far when a ship could not have reached it from most of the file's other
  pings in the time between them (:data:`MAX_SPEED_MS`, plus
  :data:`POSITION_SLACK_M`).
* **Every ping inside, not only the sampled ones.** The pre-scan decodes a sample of
  pings; :func:`swath_outline` puts each other ping, by its own header's position and
  heading, at the corners of the wider of the two sampled swaths around it, so a turn or
  a jog between samples stays inside the area.
* **Longitudes as an arc, not an interval.** A file's extent
  (:func:`extent_of`) and the union of all files' extents
  (:func:`covering_arc`) are the shortest arc of longitude holding every
  position, so a survey across the 180th meridian spans a few bins, not the
  whole globe. Like pfmLoad, an area crossing it is written with longitudes
  east of 180 as ``lon + 360``.
* **Grid-size errors name their cause**: any refusal of an automatic area
  (too many bins, wider than a PFM can span) names the files that set its
  sides (:func:`stretched_by`) and a bin size that fits the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .bins import BinGrid
from .errors import ConfigError
from .geodesy import radii

__all__ = ["far_pings", "swath_outline", "extent_of", "covering_arc", "automatic_grid",
           "stretched_by", "position_problems", "FarPings", "MAX_SPEED_MS", "POSITION_SLACK_M"]

#: the fastest a survey platform moves (m/s, about 58 knots): a position further from
#: another ping than this speed covers in the time between them is not on the track
MAX_SPEED_MS = 30.0
#: metres of position noise always allowed between two pings
POSITION_SLACK_M = 5_000.0
#: pings each ping is compared with (evenly spaced over the file)
_ANCHORS = 64
_EARTH_M = 6_371_008.8  # mean radius: a threshold needs no ellipsoid
_DEG_M = math.pi * _EARTH_M / 180.0


def _distance_m(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Great-circle distance (haversine, mean sphere); broadcasts; right across 180."""
    p1, p2 = np.radians(lat1), np.radians(lat2)
    a = (np.sin((p2 - p1) / 2) ** 2
         + np.cos(p1) * np.cos(p2) * np.sin(np.radians(lon2 - lon1) / 2) ** 2)
    return 2 * _EARTH_M * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))


@dataclass
class FarPings:
    """The pings of one file whose position is far from its track (0-based indices), and
    each as a damage entry (the shape of :meth:`PfmDaskError.to_dict`)."""

    pings: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    damage: list = field(default_factory=list)
    #: per ping: its position is legal and not far (what may size the area)
    usable: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))


def _times_usable(t: np.ndarray) -> bool:
    """Ping times that increase through the file (a few repeats or jumps back allowed)."""
    d = np.diff(t[np.isfinite(t)])
    return d.size > 0 and np.mean(d > 0) >= 0.9


def _unreachable(lat, lon, t, i, j) -> np.ndarray:
    """True where ping ``i`` lies further from ping ``j`` than a ship gets in between."""
    reach = MAX_SPEED_MS * np.abs(t[i] - t[j]) + POSITION_SLACK_M
    return _distance_m(lat[i], lon[i], lat[j], lon[j]) > reach


def _far_by_speed(lat, lon, t, anchors) -> np.ndarray:
    """Anchors: far when unreachable from most other anchors. Every ping: far when unreachable
    from both good anchors nearest to it in the file (a real track never is: two pings of it
    are never further apart than the ship goes in the time between them)."""
    n, m = lat.size, anchors.size
    un = _unreachable(lat, lon, t, anchors[:, None], anchors[None, :])
    bad_anchor = 2 * un.sum(axis=1) > m - 1
    good = anchors[~bad_anchor]
    if good.size * 2 <= m:   # no majority of anchors on one track
        return np.zeros(n, dtype=bool)
    if good.size == 1:
        return _unreachable(lat, lon, t, np.arange(n), np.full(n, good[0]))
    k = np.clip(np.searchsorted(good, np.arange(n)), 1, good.size - 1)
    return (_unreachable(lat, lon, t, np.arange(n), good[k - 1])
            & _unreachable(lat, lon, t, np.arange(n), good[k]))


def _far_mask(lat: np.ndarray, lon: np.ndarray, t: np.ndarray) -> np.ndarray:
    """True where a position is far from the track of the others (legal positions only)."""
    n = lat.size
    far = np.zeros(n, dtype=bool)
    if n < 2:
        return far
    anchors = np.unique(np.linspace(0, n - 1, min(n, _ANCHORS)).round().astype(np.int64))
    timed = _times_usable(t)
    if not timed:   # no usable clock: only what lies far beyond the file's own spread
        mlat, mlon = np.median(lat), lon[anchors[0]] + np.median(
            (lon - lon[anchors[0]] + 180.0) % 360.0 - 180.0)
        d = _distance_m(lat, lon, mlat, mlon)
        reach = 10.0 * np.percentile(d, 90) + 50_000.0
        far = d > reach
    else:
        far = _far_by_speed(lat, lon, t, anchors)
    if far.sum() * 2 >= n:   # no clear majority on a track: nothing can be called far
        far[:] = False
    # a null fix at exactly (0, 0) in a file whose other pings are elsewhere
    null = (lat == 0.0) & (lon == 0.0)
    if null.any() and (~null).any():
        elsewhere = _distance_m(0.0, 0.0, lat[~null], lon[~null]) > POSITION_SLACK_M
        if elsewhere.all():
            far |= null
    return far


def far_pings(headers: dict, ping_offsets: np.ndarray, path: str) -> FarPings:
    """The pings of a file (``headers``: :meth:`GsfFile.ping_headers`) whose positions are
    far from the file's own track, with a damage entry each (file, ping, byte offset)."""
    lat = np.asarray(headers["latitude"], dtype=np.float64)
    lon = np.asarray(headers["longitude"], dtype=np.float64)
    t = np.asarray(headers["time"], dtype=np.float64)
    legal = np.isfinite(lat) & np.isfinite(lon) & (np.abs(lat) <= 90.0) & (np.abs(lon) <= 180.0)
    idx = np.flatnonzero(legal)
    far = idx[_far_mask(lat[idx], lon[idx], t[idx])]
    usable = legal.copy()
    usable[far] = False
    out = FarPings(pings=far, usable=usable)
    if far.size:
        clat, clon = np.median(lat[idx]), np.median(lon[idx])
        for i in far[:20].tolist():
            km = _distance_m(lat[i], lon[i], clat, clon) / 1000.0
            out.damage.append({
                "error": "GsfError", "path": str(path), "offset": int(ping_offsets[i]),
                "reason": (f"ping {i + 1}: position {lat[i]:.7f}, {lon[i]:.7f} is "
                           f"{km:,.0f} km from the file's own track (a damaged fix); not used "
                           "to size the automatic area, its soundings count as outside "
                           "the area unless the area holds them")})
        if far.size > 20:
            out.damage.append({"error": "GsfError", "path": str(path), "offset": None,
                               "reason": f"{far.size - 20:,} more pings with positions far "
                                         "from the file's own track"})
    return out


def swath_outline(headers: dict, use: np.ndarray, sampled: np.ndarray, ping: np.ndarray,
                  across: np.ndarray, along: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions around the swaths of the pings the pre-scan did not decode, for the extent.

    The pre-scan decodes a sample of pings (``sampled``, 0-based, sorted); a ping between two
    samples (a turn, a jog, a line's end) can reach past the sample's extent. So every other
    ping where ``use`` is true is placed by its own header (``headers``:
    :meth:`GsfFile.ping_headers`): a one-beam ping at its position, a multibeam ping at the
    four corners of the wider of the two sampled swaths around it (the port- and
    starboard-most ``across``, the fore- and aft-most ``along``, 0 included; ``ping`` gives
    each sampled beam's 0-based ping), turned to its own heading. Returns (lat, lon) arrays.
    """
    rest = use.copy()
    rest[sampled] = False
    lat = np.asarray(headers["latitude"], dtype=np.float64)
    lon = np.asarray(headers["longitude"], dtype=np.float64)
    multi = rest & (np.asarray(headers["number_beams"]) > 1)
    single = rest & ~multi
    lats, lons = [lat[single]], [lon[single]]
    if not multi.any():
        return np.concatenate(lats), np.concatenate(lons)
    if across.size == 0:   # no multibeam ping in the sample: the positions alone
        return np.concatenate(lats + [lat[multi]]), np.concatenate(lons + [lon[multi]])
    # the sampled swaths' sides, one row per sampled multibeam ping
    order = np.argsort(ping, kind="stable")
    p, a, f = ping[order], across[order], np.nan_to_num(along[order])
    first = np.flatnonzero(np.r_[True, p[1:] != p[:-1]])
    own = p[first]
    sides = np.stack([np.minimum.reduceat(a, first), np.maximum.reduceat(a, first),
                      np.minimum(np.minimum.reduceat(f, first), 0.0),
                      np.maximum(np.maximum.reduceat(f, first), 0.0)])
    idx = np.flatnonzero(multi)
    k = np.searchsorted(own, idx)
    lo, hi = np.clip(k - 1, 0, own.size - 1), np.clip(k, 0, own.size - 1)
    port = np.minimum(sides[0, lo], sides[0, hi])
    stbd = np.maximum(sides[1, lo], sides[1, hi])
    aft = np.minimum(sides[2, lo], sides[2, hi])
    fore = np.maximum(sides[3, lo], sides[3, hi])
    c_across = np.stack([port, port, stbd, stbd], axis=1)        # the four corners
    c_along = np.stack([aft, fore, aft, fore], axis=1)
    hdg = np.nan_to_num(np.asarray(headers["heading"], dtype=np.float64)[idx])
    blat, blon = _moved(lat[idx, None], lon[idx, None], hdg[:, None], c_across, c_along)
    return np.concatenate(lats + [blat.ravel()]), np.concatenate(lons + [blon.ravel()])


def _moved(lat, lon, heading, across, along):
    """Positions ``across`` metres to starboard and ``along`` ahead of (lat, lon) on
    ``heading``, on the plane tangent to WGS 84 there: within d² tan|lat| / 6,300 km of
    the geodesic for a move of d metres (for 3 km: 0.5 m at 30°, 1.3 m at 60°, 9 m at 85°),
    inside the area's 1 % pad, at a fiftieth of the geodesic's cost."""
    h = np.radians(heading)
    north = along * np.cos(h) - across * np.sin(h)
    east = along * np.sin(h) + across * np.cos(h)
    meridian, prime = radii(lat)
    dlat = np.degrees(north / meridian)
    dlon = np.degrees(east / (prime * np.maximum(np.cos(np.radians(lat)), 1e-9)))
    return lat + dlat, lon + dlon


def position_problems(scans: list[dict]) -> list[str]:
    """The far-ping damage the pre-scan found, as lines of the load report."""
    out = []
    for s in scans:
        for d in s.get("far_pings") or []:
            off = d.get("offset")
            out.append(f"{d['path']}" + (f" at byte {off:,}" if off is not None else "")
                       + f": {d['reason']}")
    return out


# ----------------------------------------------------------------- longitude arcs
def _wrap(lon):
    """Longitudes into [-180, 180) (those already there unchanged, bit for bit)."""
    lon = np.asarray(lon, dtype=np.float64)
    inside = (lon >= -180.0) & (lon < 180.0)
    return np.where(inside, lon, (lon + 180.0) % 360.0 - 180.0)


def covering_arc(west, east) -> tuple[float, float]:
    """The shortest arc of longitude holding every interval ``[west[i], east[i]]``
    (``east >= west``, each shorter than 360): ``(west, east)`` with west in [-180, 180)
    and east > west, east beyond 180 where the arc crosses the meridian (lon + 360).
    Raises ValueError if the intervals leave no gap (the whole circle)."""
    w = np.asarray(west, dtype=np.float64).ravel()
    e = np.asarray(east, dtype=np.float64).ravel()
    if w.size == 0:
        raise ValueError("no interval")
    length = e - w
    s = _wrap(w)
    order = np.argsort(s, kind="stable")
    s, length = s[order], length[order]
    # the intervals twice round, merged: a gap between merged runs in the second round has
    # every interval of the first round (however far it reaches) already accounted for
    n = s.size
    s2 = np.concatenate([s, s + 360.0])
    e2 = np.concatenate([s + length, s + length + 360.0])
    run_end = np.maximum.accumulate(e2)
    k = np.arange(n, 2 * n)
    k = k[s2[k] > run_end[k - 1]]
    if k.size == 0:
        raise ValueError("the intervals cover every longitude")
    gaps = s2[k] - run_end[k - 1]
    j = int(k[np.argmax(gaps)])
    # the arc starts where the largest gap ends (an interval's own west, one round on)
    # and ends where the gap begins: the east of the interval reaching furthest before it,
    # written as that interval's own east plus whole turns (no rounding beyond the + 360)
    before = np.flatnonzero(e2[:j] == run_end[j - 1])[-1]
    e_own = float(e[order][before % n])
    east = e_own + 360.0 * round((float(run_end[j - 1]) - e_own) / 360.0)
    return float(s[j - n]), east


def extent_of(lat: np.ndarray, lon: np.ndarray) -> list[float] | None:
    """``[south, west, north, east]`` of positions, west..east the shortest arc holding
    every longitude (east beyond 180 when it crosses the meridian); None if none is finite."""
    lat = np.asarray(lat, dtype=np.float64)
    lon = np.asarray(lon, dtype=np.float64)
    fin = np.isfinite(lat) & np.isfinite(lon)
    if not fin.any():
        return None
    la, lo = lat[fin], _wrap(lon[fin])
    u = np.unique(lo)
    try:
        west, east = covering_arc(u, u)
    except ValueError:  # pragma: no cover - points always leave a gap
        west, east = -180.0, 180.0
    return [float(la.min()), west, float(la.max()), east]


# ----------------------------------------------------------------- the grid
def _sides(scans: list[dict]) -> tuple[list, tuple[float, float, float, float]] | None:
    """The files' extents and the automatic area around them (south, west, north, east)."""
    ext = [(s["path"], s["extent"]) for s in scans if s.get("extent")]
    if not ext:
        return None
    e = np.array([x for _, x in ext], dtype=np.float64)
    try:
        west, east = covering_arc(e[:, 1], e[:, 3])
    except ValueError:
        west, east = -180.0, 180.0
    return ext, (float(e[:, 0].min()), west, float(e[:, 2].max()), east)


def _arc_offset(lon: float, west: float) -> float:
    return (lon - west) % 360.0


def stretched_by(scans: list[dict], cfg) -> str:
    """For an automatic area: the files whose extents set its four sides, in words (a file
    far from the others is what makes a grid huge)."""
    if cfg.mbr is not None or cfg.polygon is not None:
        return ""
    got = _sides(scans)
    if got is None:
        return ""
    ext, (_, west, _, _) = got
    sides = {"south": min(ext, key=lambda x: x[1][0])[0],
             "west": min(ext, key=lambda x: _arc_offset(x[1][1], west))[0],
             "north": max(ext, key=lambda x: x[1][2])[0],
             "east": max(ext, key=lambda x: _arc_offset(x[1][1], west) + x[1][3] - x[1][1])[0]}
    return "; the area's sides come from " + ", ".join(f"{k}: {v}" for k, v in sides.items())


def _fitting_bin_size(area: tuple, scans: list[dict]) -> float | None:
    """Metres per bin giving about one pre-scanned sounding per bin over ``area``."""
    south, west, north, east = area
    soundings = sum(int(s.get("n_beams") or 0) for s in scans if not s.get("error"))
    if not soundings:
        return None
    mid = math.radians((south + north) / 2)
    m2 = (north - south) * _DEG_M * (east - west) * _DEG_M * max(math.cos(mid), 1e-3)
    size = math.sqrt(max(m2, 1.0) / soundings)
    k = 10.0 ** math.floor(math.log10(size))
    return next(m * k for m in (1, 2, 2.5, 5, 10) if m * k >= size * (1 - 1e-9))


def automatic_grid(scans: list[dict], cfg, **bin_kw) -> BinGrid:
    """The grid over the union of the pre-scanned extents, padded by 1 % (the extents come
    from a sample of pings); ``bin_kw``: the bin size as :meth:`BinGrid.from_mbr` takes it.
    A refusal (no position, too many bins, wider than 180 degrees) names the files."""
    got = _sides(scans)
    if got is None:
        raise ConfigError("no input has a readable ping position: give the area with --mbr "
                          "or --polygon")
    _, (south, west, north, east) = got
    pad_lat = max((north - south) * 0.01, 1e-4)
    pad_lon = max((east - west) * 0.01, 1e-4)
    area = (max(-90.0, south - pad_lat), west - pad_lon, min(90.0, north + pad_lat),
            east + pad_lon)
    if area[1] < -180.0:   # the pad crossed the meridian westwards: the same arc, + 360
        area = (area[0], area[1] + 360.0, area[2], area[3] + 360.0)
    named = stretched_by(scans, cfg)
    if east - west > 180.0:
        raise ConfigError(f"the inputs spread over {east - west:.1f} degrees of longitude "
                          f"({west:.4f} to {east:.4f} east, the shortest arc), more than the 180 "
                          "a PFM grid can span: load them into separate PFMs, or give the "
                          f"area with --mbr{named}. Nothing was written")
    try:
        return BinGrid.from_mbr(*area, **bin_kw)
    except ConfigError as err:
        fit = _fitting_bin_size(area, scans) if bin_kw.get("x_bin_deg") is None else None
        hint = f"; --bin-size {fit:g} gives about one sounding per bin" if fit else ""
        raise ConfigError(f"automatic area {area[0]:.6f} {area[1]:.6f} {area[2]:.6f} "
                          f"{area[3]:.6f}: {err.reason}{hint}{named}. Nothing was written") \
            from err
