"""Independent references for end-to-end load tests.

Nothing here uses pfm-dask's reader, geodesy or binning: GSF is decoded by the C
GSF library (through gsfpy), beams are placed with geographiclib, and pfmLoader's
screening rules and bin statistics are written out again, plainly, from
docs/pfm-format.md §6 and docs/filters.md §1.
"""

from __future__ import annotations

import calendar
import os
import time

import numpy as np

USER_01, USER_02, USER_03, USER_04 = 64, 128, 256, 4096
MANUALLY_INVAL, FILTER_INVAL, MODIFIED, DELETED, REFERENCE = 1, 2, 32, 2048, 16384

# pfmLoader's mapping for the GSF beam flags the samples and synthetic surveys contain.
FLAG_TO_VALIDITY = {
    0x00: USER_01,
    0x05: MANUALLY_INVAL,
    0x09: FILTER_INVAL,
    0x10: USER_02,
    0x21: FILTER_INVAL | USER_03,
    0x41: FILTER_INVAL | USER_04,
}


def gsfpy_beams(path) -> dict:
    """Every beam of every ping record, decoded by libgsf (gsfpy), as flat arrays."""
    from gsfpy import open_gsf

    out = {k: [] for k in ("ping", "beam", "lat", "lon", "heading", "depth", "across", "along",
                           "flags", "ping_flags", "herr", "verr", "nbeams", "tsec", "tnsec")}
    n_ping = 0
    with open_gsf(str(path)) as f:
        while True:
            try:
                rid, rec = f.read()
            except Exception:  # noqa: BLE001 - gsfpy signals EOF with an exception
                break
            if rid.recordID != 2:
                continue
            n_ping += 1
            p = rec.mb_ping
            nb = p.number_beams

            def arr(name):
                ptr = getattr(p, name)
                return np.array(ptr[:nb], dtype=float) if ptr else None

            depth = arr("depth")
            across = arr("across_track")
            along = arr("along_track")
            flags = arr("beam_flags")
            herr = arr("horizontal_error")
            verr = arr("vertical_error")
            # P1: gsfpy declares longitude before latitude in the ping struct.
            lat, lon = p.longitude, p.latitude
            out["ping"].append(np.full(nb, n_ping))
            out["beam"].append(np.arange(1, nb + 1))
            out["lat"].append(np.full(nb, lat))
            out["lon"].append(np.full(nb, lon))
            out["heading"].append(np.full(nb, p.heading))
            out["depth"].append(depth)
            out["across"].append(across if across is not None else np.zeros(nb))
            out["along"].append(along if along is not None else np.full(nb, np.nan))
            out["flags"].append(flags.astype(int) if flags is not None else np.full(nb, -1))
            out["ping_flags"].append(np.full(nb, p.ping_flags))
            out["herr"].append(herr if herr is not None else np.full(nb, np.nan))
            out["verr"].append(verr if verr is not None else np.full(nb, np.nan))
            out["nbeams"].append(np.full(nb, nb))
            out["tsec"].append(np.full(nb, p.ping_time.tv_sec))
            out["tnsec"].append(np.full(nb, p.ping_time.tv_nsec))
    return {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in out.items()}


def expected_soundings(path, *, herr_default=1.5, verr_default=0.25) -> dict:
    """pfmLoader's rules applied to libgsf's beams; positions by geographiclib."""
    from geographiclib.geodesic import Geodesic

    b = gsfpy_beams(path)
    n = b["ping"].size
    ping_ok = (b["lat"] <= 90) & (b["lon"] <= 180) & ((b["ping_flags"].astype(int) & 1) == 0)
    single = b["nbeams"] == 1
    depth32 = b["depth"].astype(np.float32)
    usable = single | ((depth32 != 0) & (b["flags"] >= 0) & (b["flags"] != 0x01))
    keep = ping_ok & usable
    lat = np.empty(n)
    lon = np.empty(n)
    g = Geodesic.WGS84
    for i in range(n):  # a slow, obviously-correct reference
        if not keep[i] or single[i]:
            lat[i], lon[i] = b["lat"][i], b["lon"][i]
            continue
        r = g.Direct(b["lat"][i], b["lon"][i], b["heading"][i] + 90.0, b["across"][i])
        la, lo = r["lat2"], r["lon2"]
        if not np.isnan(b["along"][i]):
            r = g.Direct(la, lo, b["heading"][i], b["along"][i])
            la, lo = r["lat2"], r["lon2"]
        lat[i], lon[i] = la, lo
    flags = np.where(single & (b["flags"] < 0), 0, b["flags"])
    validity = np.array([FLAG_TO_VALIDITY[int(f)] if int(f) in FLAG_TO_VALIDITY else -1
                         for f in flags], dtype=np.int64)
    herr = np.where(single | np.isnan(b["herr"]), herr_default, b["herr"])
    verr = np.where(single | np.isnan(b["verr"]), verr_default, b["verr"])
    return {"n_read": n, "ping_skipped": int((~ping_ok).sum()),
            "beam_rejected": int((ping_ok & ~usable).sum()),
            "keep": keep, "ping": b["ping"].astype(int), "beam": b["beam"].astype(int),
            "lat": lat, "lon": lon, "depth": depth32.astype(np.float64),
            "validity": validity, "herr": herr, "verr": verr, "heading": b["heading"],
            "tsec": b["tsec"].astype(int), "tnsec": b["tnsec"].astype(int)}


def expected_line_names(path, pings_in_order, headings, tsec, tnsec) -> list[str]:
    """pfmLoader's line naming and breaks, written again: >120° and <345° from the last start."""
    base = os.path.basename(str(path))
    names, prev = [], None
    for h, s, ns in zip(headings, tsec, tnsec):
        if prev is None or 120.0 < abs(h - prev) < 345.0:
            prev = h
            t = time.gmtime(int(s))
            sec = int(np.floor(float(np.float32(t.tm_sec + ns / 1e9)) + 0.5))
            names.append(f"{base}-{t.tm_year}-{t.tm_yday:03d}-{t.tm_hour:02d}:"
                         f"{t.tm_min:02d}:{sec:02d}")
    return names


def bin_stats(bin_x, bin_y, depth, validity, null_depth):
    """Per-bin statistics by the library's rules, recomputed plainly (dict keyed by (x, y))."""
    out = {}
    order = np.lexsort((bin_x, bin_y))
    keys = np.stack([bin_x[order], bin_y[order]], 1)
    z = depth[order]
    v = validity[order]
    start = 0
    n = len(order)
    while start < n:
        end = start
        while end < n and (keys[end] == keys[start]).all():
            end += 1
        zz, vv = z[start:end], v[start:end]
        use = ((vv & (DELETED | REFERENCE)) == 0) & (zz < null_depth)
        good = use & ((vv & (MANUALLY_INVAL | FILTER_INVAL)) == 0)
        zg = zz[good]
        za = zz[use]
        out[(int(keys[start][0]), int(keys[start][1]))] = {
            "num_soundings": end - start,
            "num_valid": int(good.sum()),
            "avg_filtered": float(zg.mean()) if zg.size else null_depth,
            "min_filtered": float(zg.min()) if zg.size else null_depth,
            "max_filtered": float(zg.max()) if zg.size else null_depth,
            "std": float(zg.std(ddof=1)) if zg.size > 1 else 0.0,
            "avg": float(za.mean()) if za.size else None,
            "min": float(za.min()) if za.size else None,
            "max": float(za.max()) if za.size else None,
        }
        start = end
    return out


def utc(year, month, day, hour=0, minute=0, second=0) -> int:
    return calendar.timegm((year, month, day, hour, minute, second))
