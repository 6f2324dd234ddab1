"""Synthetic EM302-like surveys: GSF files with known seafloor, realistic flags and planted spikes.

A survey is a lawnmower of straight lines (one GSF file per line) over a smooth analytic seafloor
with a regional slope, long-wavelength undulations, a seamount, a ridge and a scarp. Each ping
has 432 equiangular beams over ±65°, depth noise of 0.2 % (nadir) to 0.5 % (outer beams) of
depth, NAVO/HMPS beam flags (docs/filters.md §1), and a sidecar ``truth.parquet`` naming every
planted spike (isolated beams and small clusters, 3–30 % of depth, deeper or shallower) so that
filters can be scored. The same seed and parameters give byte-identical files: nothing depends
on the clock. Each file is generated in a few vectorised steps and written by
:class:`~pfm_dask.gsf.GsfWriter`; memory is bounded by one file. See ``docs/synth.md``.
"""

from __future__ import annotations

import json
import math
import os
import time as _time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import ConfigError
from .geodesy import radii as _radii
from .gsf import GsfWriter

__all__ = ["generate", "Seafloor", "FLAG_NAMES", "SOUND_SPEED", "TRUTH_SCHEMA"]

SOUND_SPEED = 1500.0          #: m/s, used for travel times and ping intervals
KNOT = 1852.0 / 3600.0        # m/s

#: The beam-flag values the generator uses (NAVO/HMPS convention, docs/filters.md §1).
FLAG_NAMES = {
    0x00: "valid",
    0x01: "null beam (no detection)",
    0x05: "manually edited",
    0x09: "filter edited",
    0x10: "does not meet 1x IHO (informational, valid)",
    0x21: "exceeds 2x IHO",
    0x41: "footprint too big",
}

#: Columns of ``truth.parquet``: one row per planted spike.
TRUTH_SCHEMA = pa.schema([
    pa.field("file", pa.string(), metadata={"doc": "GSF file name"}),
    pa.field("file_index", pa.int32(), metadata={"doc": "0-based line index (file name prefix − 1)"}),
    pa.field("ping", pa.int32(), metadata={"doc": "1-based ping record number in the file"}),
    pa.field("beam", pa.int32(), metadata={"doc": "1-based beam number (1 = port-most)"}),
    pa.field("kind", pa.string(), metadata={"doc": "single_deep, single_shallow, cluster_deep, cluster_shallow"}),
    pa.field("cluster", pa.int32(), metadata={"doc": "cluster id within the file, −1 for isolated spikes"}),
    pa.field("true_depth", pa.float64(), metadata={"unit": "m", "doc": "noise-free seafloor at the beam"}),
    pa.field("clean_depth", pa.float64(), metadata={"unit": "m", "doc": "the noisy depth the spike replaced"}),
    pa.field("planted_depth", pa.float64(), metadata={"unit": "m", "doc": "depth written to the file"}),
    pa.field("magnitude", pa.float64(), metadata={"doc": "(planted − clean) / true depth"}),
    pa.field("latitude", pa.float64(), metadata={"unit": "deg", "doc": "beam footprint (±~3 m)"}),
    pa.field("longitude", pa.float64(), metadata={"unit": "deg", "doc": "beam footprint (±~3 m)"}),
])


@dataclass(frozen=True)
class Seafloor:
    """The analytic seafloor, depth (m, positive down) as a function of projected metres.

    (E, N) are east/north metres of an equirectangular projection about the survey origin
    (``lat0``, ``lon0``).
    """

    lat0: float
    lon0: float
    d_base: float
    grad_e: float
    grad_n: float
    waves: tuple          # (k_e, k_n, phase, amplitude) per undulation
    seamount: tuple       # (E0, N0, sigma, height)
    ridge: tuple          # (cos, sin, c, sigma, height): a Gaussian ridge along a line
    scarp: tuple          # (cos, sin, c, width, height): a tanh step across a line
    dmin: float
    dmax: float

    def depth(self, e, n):
        """Depth at projected (E, N) metres; float32 in, float32 out (any shape)."""
        e = np.asarray(e, dtype=np.float32)
        n = np.asarray(n, dtype=np.float32)
        f32 = np.float32
        d = e * f32(self.grad_e)
        d += n * f32(self.grad_n)
        d += f32(self.d_base)
        t = np.empty_like(d)
        for ke, kn, ph, amp in self.waves:
            np.multiply(e, f32(ke), out=t)
            t += n * f32(kn)
            t += f32(ph)
            np.sin(t, out=t)
            t *= f32(amp)
            d += t
        e0, n0, sig, h = self.seamount
        de = e - f32(e0)
        dn = n - f32(n0)
        de *= de
        dn *= dn
        de += dn
        de *= f32(-0.5 / sig ** 2)
        np.exp(de, out=de)
        de *= f32(h)
        d -= de
        c, s, c0, sig, h = self.ridge
        np.multiply(e, f32(c), out=t)
        t += n * f32(s)
        t -= f32(c0)
        t *= t
        t *= f32(-0.5 / sig ** 2)
        np.exp(t, out=t)
        t *= f32(h)
        d -= t
        c, s, c0, w, h = self.scarp
        np.multiply(e, f32(c / w), out=t)
        t += n * f32(s / w)
        t -= f32(c0 / w)
        np.tanh(t, out=t)
        t *= f32(h / 2)
        d += t
        np.clip(d, f32(self.dmin), f32(self.dmax), out=d)
        return d

    def unproject(self, e, n):
        m0, n0 = _radii(self.lat0)
        lon = self.lon0 + np.degrees(np.asarray(e) / (n0 * math.cos(math.radians(self.lat0))))
        lat = self.lat0 + np.degrees(np.asarray(n) / m0)
        return lat, lon


def _ping_interval(depth, swath_deg):
    """Seconds between pings: two-way time to the outer beam plus overhead (EM302-like)."""
    return 2.0 * depth / math.cos(math.radians(swath_deg)) / SOUND_SPEED + 0.5


def _smooth(rng, t, amp, periods):
    """A smooth random series at times ``t``: a sum of sinusoids with random phases."""
    out = np.zeros_like(t, dtype=np.float64)
    for p in periods:
        out += amp * math.sqrt(2.0 / len(periods)) * np.sin(2 * np.pi * t / p + rng.uniform(0, 2 * np.pi))
    return out


def _parse_start(start) -> int:
    if isinstance(start, (int, np.integer)):
        return int(start)
    dt = datetime.fromisoformat(str(start).replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp())


def _stamp(sec: int) -> str:
    return datetime.fromtimestamp(sec, tz=timezone.utc).strftime("%Y%m%d_%H%M%S")


def generate(outdir, *, files: int = 8, pings: int = 200, beams: int = 432, seed: int = 0,
             start="2026-03-14T12:00:00Z", latitude: float = 36.0, longitude: float = -123.0,
             azimuth: float = 0.0, speed_knots: float = 8.0, swath_deg: float = 65.0,
             overlap: float = 0.25, depth_range: tuple[float, float] = (800.0, 2500.0),
             spike_rate: float = 2e-4, cluster_rate: float = 0.01, flag_scale: float = 1.0,
             extras: bool = True, version: str = "GSF-v03.08", workers: int = 1) -> dict:
    """Write a synthetic survey of ``files`` GSF lines into ``outdir``; return a JSON-ready summary.

    ``latitude``/``longitude`` is the south-west-ish origin of the first line, ``azimuth`` the
    heading of even lines (odd lines run back at azimuth + 180°). Line spacing gives ``overlap``
    at the shallowest depth. ``spike_rate`` is the chance that a valid sounding is an isolated
    spike; ``cluster_rate`` the chance per ping that a spike cluster starts there;
    ``flag_scale`` multiplies the rates of rejected beams. ``extras`` adds travel time and beam
    angle arrays. ``workers`` > 1 writes files in that many processes (the bytes do not
    depend on it). Also writes ``truth.parquet`` (see :data:`TRUTH_SCHEMA`) and ``survey.json``.
    """
    t_start = _time.perf_counter()
    if int(workers) < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    _check_args(files, pings, beams, depth_range, swath_deg, overlap, speed_knots, latitude,
                longitude, spike_rate, cluster_rate, flag_scale)
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    _remove_previous(outdir)
    start_sec = _parse_start(start)
    params = dict(files=files, pings=pings, beams=beams, seed=seed,
                  start=_stamp(start_sec), latitude=latitude, longitude=longitude,
                  azimuth=azimuth, speed_knots=speed_knots, swath_deg=swath_deg, overlap=overlap,
                  depth_range=list(map(float, depth_range)), spike_rate=spike_rate,
                  cluster_rate=cluster_rate, flag_scale=flag_scale, extras=extras,
                  version=version)

    plan = _plan(files, pings, seed, start_sec, latitude, longitude, azimuth, speed_knots,
                 swath_deg, overlap, depth_range)
    theta = (np.linspace(-swath_deg, swath_deg, beams) if beams > 1 else np.zeros(1))
    truth_parts, file_rows = [], []
    flag_counts = np.zeros(256, dtype=np.int64)
    box = [90.0, 180.0, -90.0, -180.0]
    dmin_all, dmax_all = math.inf, -math.inf
    total_bytes = 0
    slim = {k: plan[k] for k in ("seafloor", "ue", "ve")}
    jobs = [(outdir, line, slim, theta, dict(seed=seed, spike_rate=spike_rate,
                                              cluster_rate=cluster_rate, flag_scale=flag_scale,
                                              extras=extras, version=version, params=params))
            for line in plan["lines"]]
    for res in _run_jobs(jobs, workers):
        truth_parts.append(res["truth"])
        flag_counts += res["flag_counts"]
        s, w, n, e = res["area"]
        box = [min(box[0], s), min(box[1], w), max(box[2], n), max(box[3], e)]
        dmin_all = min(dmin_all, res["depth_range"][0])
        dmax_all = max(dmax_all, res["depth_range"][1])
        total_bytes += res["bytes"]
        file_rows.append({"name": res["name"], "bytes": res["bytes"], "pings": pings,
                          "soundings": pings * beams, "start": res["start"], "end": res["end"]})

    truth = pa.concat_tables(truth_parts) if truth_parts else TRUTH_SCHEMA.empty_table()
    truth_path = outdir / "truth.parquet"
    pq.write_table(truth, truth_path)
    kinds = truth.column("kind").to_pylist()
    spikes = {k: kinds.count(k) for k in ("single_deep", "single_shallow", "cluster_deep",
                                           "cluster_shallow")}
    spikes["total"] = len(kinds)
    flags = {f"0x{v:02X}": int(c) for v, c in enumerate(flag_counts) if c}
    soundings = files * pings * beams
    survey = {
        "generator": "pfm_dask.synth", "parameters": params,
        "files": file_rows, "pings": files * pings, "beams": beams, "soundings": soundings,
        "bytes": total_bytes,
        "area": {"south": box[0], "west": box[1], "north": box[2], "east": box[3]},
        "depth_range": [dmin_all, dmax_all],
        "flags": flags, "flag_names": {f"0x{k:02X}": v for k, v in FLAG_NAMES.items()},
        "spikes": spikes, "ignored_pings": int(plan["ignored"]),
        "truth": truth_path.name,
        "seafloor": _seafloor_dict(plan["seafloor"]),
    }
    (outdir / "survey.json").write_text(json.dumps(survey, indent=2) + "\n")
    elapsed = _time.perf_counter() - t_start
    summary = dict(survey)
    summary.pop("flag_names")
    summary.pop("seafloor")
    summary["outdir"] = str(outdir)
    summary["truth"] = str(truth_path)
    summary["survey_json"] = str(outdir / "survey.json")
    summary["elapsed_s"] = round(elapsed, 3)
    summary["mb_per_s"] = round(total_bytes / 1e6 / elapsed, 1) if elapsed > 0 else None
    return summary


def _one_job(job):
    outdir, line, plan, theta, kw = job
    return _write_line(outdir, line, plan, theta, **kw)


def _run_jobs(jobs, workers: int):
    """Results of the per-line jobs, in order; in ``workers`` spawned processes if > 1."""
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield _one_job(job)
        return
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(max_workers=min(workers, len(jobs)),
                                mp_context=mp.get_context("spawn")) as ex:
        yield from ex.map(_one_job, jobs)


def _check_args(files, pings, beams, depth_range, swath_deg, overlap, speed_knots, lat, lon,
                spike_rate, cluster_rate, flag_scale):
    def bad(msg):
        raise ConfigError(msg)
    if not 1 <= files <= 9999:
        bad(f"files must be 1..9999, got {files}")
    if pings < 1:
        bad(f"pings must be at least 1, got {pings}")
    if not 1 <= beams <= 32767:
        bad(f"beams must be 1..32767, got {beams}")
    lo, hi = depth_range
    if not 0 < lo < hi:
        bad(f"depth_range must be (shallow, deep) with 0 < shallow < deep, got {depth_range}")
    if not 0 < swath_deg < 85:
        bad(f"swath_deg must be in (0, 85), got {swath_deg}")
    if not 0 <= overlap < 1:
        bad(f"overlap must be in [0, 1), got {overlap}")
    if speed_knots <= 0:
        bad(f"speed_knots must be positive, got {speed_knots}")
    if not (-80 <= lat <= 80 and -180 <= lon <= 180):
        bad("latitude must be within ±80° and longitude within ±180°")
    if not (0 <= spike_rate < 0.1 and 0 <= cluster_rate <= 1 and 0 <= flag_scale <= 10):
        bad("spike_rate must be in [0, 0.1), cluster_rate in [0, 1], flag_scale in [0, 10]")


def _remove_previous(outdir: Path) -> None:
    """Delete the files of an earlier synthetic survey in ``outdir`` (named in its survey.json)."""
    meta = outdir / "survey.json"
    if not meta.is_file():
        return
    try:
        old = json.loads(meta.read_text())
        names = [f["name"] for f in old.get("files", [])]
    except (ValueError, KeyError, TypeError):
        return
    if old.get("generator") != "pfm_dask.synth":
        return
    for name in names:
        p = outdir / os.path.basename(name)
        if p.suffix == ".gsf" and p.is_file():
            p.unlink()


def _seafloor_dict(sf: Seafloor) -> dict:
    return {"lat0": sf.lat0, "lon0": sf.lon0, "d_base": sf.d_base, "grad_e": sf.grad_e,
            "grad_n": sf.grad_n, "waves": [list(w) for w in sf.waves],
            "seamount": list(sf.seamount), "ridge": list(sf.ridge), "scarp": list(sf.scarp),
            "dmin": sf.dmin, "dmax": sf.dmax}


# ---------------------------------------------------------------------------------- planning
def _plan(files, pings, seed, start_sec, lat0, lon0, azimuth, speed_knots, swath_deg, overlap,
          depth_range):
    """Lay out the lines and the seafloor, then every line's ping distances and times."""
    rng = np.random.default_rng([seed, 0x5EAF100])
    dmin, dmax = map(float, depth_range)
    span = dmax - dmin
    speed = speed_knots * KNOT
    tan_sw = math.tan(math.radians(swath_deg))
    spacing = 2.0 * dmin * tan_sw * (1.0 - overlap)
    d_mid = dmin + 0.6 * span
    length_est = max(pings * speed * _ping_interval(d_mid, swath_deg), 1.0)
    width = (files - 1) * spacing + 2.0 * d_mid * tan_sw
    az = math.radians(azimuth)
    ue = np.array([math.sin(az), math.cos(az)])          # along-line unit (E, N)
    ve = np.array([math.cos(az), -math.sin(az)])         # to starboard of even lines

    # seafloor features placed in the survey box (u along lines, v across)
    def place(fu, fv):
        u, v = fu * length_est, fv * width - d_mid * tan_sw
        return u * ue + v * ve
    size = max(min(length_est, width), 1.0)
    g_dir = rng.uniform(0, 2 * np.pi)
    g = min(0.3 * span / max(length_est, width, 1.0), 0.03)
    waves = []
    for amp_frac, wl in ((0.03, rng.uniform(8e3, 15e3)), (0.02, rng.uniform(4e3, 8e3)),
                         (0.01, rng.uniform(1.5e3, 3e3)), (0.003, rng.uniform(400.0, 800.0))):
        ang = rng.uniform(0, 2 * np.pi)
        k = 2 * np.pi / wl
        waves.append((k * math.cos(ang), k * math.sin(ang), rng.uniform(0, 2 * np.pi), amp_frac * span))
    sm = place(rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7))
    seamount = (float(sm[0]), float(sm[1]), max(2000.0, 0.15 * size), 0.3 * span)
    r_ang = rng.uniform(0, np.pi)
    rp = place(rng.uniform(0.1, 0.9), rng.uniform(0.1, 0.9))
    rc, rs = math.cos(r_ang), math.sin(r_ang)
    ridge = (rc, rs, float(rp[0] * rc + rp[1] * rs), max(800.0, 0.05 * size), 0.06 * span)
    s_ang = rng.uniform(0, np.pi)
    sp = place(rng.uniform(0.2, 0.8), rng.uniform(0.2, 0.8))
    sc, ss = math.cos(s_ang), math.sin(s_ang)
    scarp = (sc, ss, float(sp[0] * sc + sp[1] * ss), max(150.0, 0.01 * size), 0.08 * span)
    seafloor = Seafloor(lat0=float(lat0), lon0=float(lon0), d_base=d_mid,
                        grad_e=g * math.sin(g_dir), grad_n=g * math.cos(g_dir),
                        waves=tuple(waves), seamount=seamount, ridge=ridge, scarp=scarp,
                        dmin=dmin, dmax=dmax)

    lines = []
    t_line = start_sec * 10**9  # nanoseconds
    ignored = 0
    for i in range(files):
        lr = np.random.default_rng([seed, 0x11E, i])
        forward = i % 2 == 0
        v = i * spacing
        # nadir depth along the line on a coarse grid long enough for any depth
        reach = pings * speed * _ping_interval(dmax, swath_deg) + 100.0
        step = max(min(speed * _ping_interval(dmin, swath_deg) / 4, 200.0), 0.5)
        s = np.arange(0.0, reach + step, step)
        u = s if forward else length_est - s
        en = u[:, None] * ue + v * ve
        dn = seafloor.depth(en[:, 0], en[:, 1]).astype(np.float64)
        gap = speed * _ping_interval(dn, swath_deg)       # metres between pings
        count = np.concatenate([[0.0], np.cumsum(np.diff(s) / gap[:-1])])
        sk = np.interp(np.arange(pings, dtype=np.float64), count, s)
        t_ns = t_line + np.round(sk / speed * 1e9).astype(np.int64)
        ping_flags = np.zeros(pings, dtype=np.uint16)
        bad = lr.random(pings) < 0.001
        ping_flags[bad] = 0x0001 | 0x0008    # ignore: bad position
        ignored += int(bad.sum())
        lines.append({"index": i, "forward": forward, "v": v, "s": sk, "t_ns": t_ns,
                      "ping_flags": ping_flags, "u0": 0.0 if forward else length_est})
        t_line = int(t_ns[-1]) + 15 * 60 * 10**9 + 10**9 * int(lr.integers(0, 300))
    return {"lines": lines, "seafloor": seafloor, "ue": ue, "ve": ve, "speed": speed,
            "swath_deg": swath_deg, "ignored": ignored}


# ---------------------------------------------------------------------------------- one line
# flag for each probability band of the single draw; the last band is "planted spike"
_FLAG_OF_BAND = np.array([0x01, 0x09, 0x21, 0x41, 0x10, 0x00], dtype=np.uint8)

_BLOCK = 64  # pings generated together: small enough for the temporaries to stay in cache


def _write_line(outdir, line, plan, theta, *, seed, spike_rate, cluster_rate, flag_scale,
                extras, version, params):
    """Generate and write one line's GSF file; return its truth rows and counts."""
    sf: Seafloor = plan["seafloor"]
    rng = np.random.default_rng([seed, 0xDA7A, line["index"]])
    P, B = len(line["s"]), len(theta)
    f32 = np.float32
    ue, ve = plan["ue"], plan["ve"]
    sign = 1.0 if line["forward"] else -1.0
    t_rel = (line["t_ns"] - line["t_ns"][0]) * 1e-9

    # ship track: along-line distance, cross-track wander and GPS noise, heading with yaw
    u = line["u0"] + sign * line["s"] + rng.normal(0, 0.3, P)
    v = line["v"] + _smooth(rng, t_rel, 4.0, (300.0, 900.0)) + rng.normal(0, 0.5, P)
    ship_e = u * ue[0] + v * ve[0]
    ship_n = u * ue[1] + v * ve[1]
    lat, lon = sf.unproject(ship_e, ship_n)
    course = (params["azimuth"] + (0.0 if line["forward"] else 180.0)) % 360.0
    heading = (course + _smooth(rng, t_rel, 0.6, (120.0, 400.0)) + rng.normal(0, 0.05, P)) % 360.0
    pitch = _smooth(rng, t_rel, 1.0, (7.0, 11.0))
    roll = _smooth(rng, t_rel, 2.5, (8.0, 13.0))
    heave = _smooth(rng, t_rel, 0.6, (9.0, 14.0))
    tide = 0.8 * np.sin(2 * np.pi * (line["t_ns"] * 1e-9) / 44712.0)   # M2 tide, m
    speed_kn = np.full(P, params["speed_knots"]) + rng.normal(0, 0.05, P)
    smile_k = f32(rng.normal(0, 0.0008))      # this line's refraction error, outer beams

    # per-ping terms of the beam footprint: true metres in the ship's tangent plane are scaled
    # into the projected plane (k_e, k_n) at the ship's latitude
    h = np.radians(heading)
    ch, sh = np.cos(h).astype(f32)[:, None], np.sin(h).astype(f32)[:, None]
    m_s, n_s = _radii(lat)
    m0, n0 = _radii(sf.lat0)
    k_e = (n0 * math.cos(math.radians(sf.lat0)) / (n_s * np.cos(np.radians(lat)))).astype(f32)[:, None]
    k_n = (m0 / m_s).astype(f32)[:, None]
    se, sn = ship_e.astype(f32)[:, None], ship_n.astype(f32)[:, None]
    along_k = np.tan(np.radians(0.15 * pitch)).astype(f32)[:, None]
    nadir = sf.depth(ship_e, ship_n)[:, None]

    # per-beam terms
    tan_t = np.tan(np.radians(theta)).astype(f32)[None, :]
    rel = (np.abs(theta) / max(params["swath_deg"], 1e-9)).astype(f32)[None, :]
    sigma_rel = f32(0.002) + f32(0.003) * rel * rel       # 0.2 % nadir … 0.5 % outer (1 σ)
    smile = smile_k * rel ** 4
    fs = f32(flag_scale)
    p_null = fs * (f32(0.002) + f32(0.05) * rel ** 10)
    p_filt = fs * (f32(0.003) + f32(0.02) * rel ** 6)
    p_iho2 = fs * f32(0.0004) * rel ** 2
    p_foot = fs * f32(0.002) * rel ** 12
    p_info = fs * (f32(0.002) + f32(0.01) * rel ** 4)
    bands = np.broadcast_arrays(p_null, p_filt, p_iho2, p_foot, p_info,
                                np.full_like(p_null, spike_rate))
    edges = np.cumsum(np.stack([b_[0] for b_ in bands]), axis=0)   # (6, B)
    top = edges[-1][None, :]
    sub = np.unique(np.r_[np.arange(0, B, 4), B - 1])    # beams of the first footprint pass
    if len(sub) < B:
        jb = np.arange(B)
        kb = np.clip(np.searchsorted(sub, jb, side="right") - 1, 0, len(sub) - 2)
        wb = ((jb - sub[kb]) / np.maximum(sub[kb + 1] - sub[kb], 1)).astype(f32)
    valid_ping = line["ping_flags"] == 0

    true_depth = np.empty((P, B), f32)
    depth = np.empty((P, B), f32)
    x = np.empty((P, B), f32)
    y = np.empty((P, B), f32)
    vert_err = np.empty((P, B), f32)
    horiz_err = np.empty((P, B), f32)
    travel = np.empty((P, B), f32) if extras else None
    flags = np.zeros((P, B), np.uint8)
    single = np.zeros((P, B), bool)
    emin = nmin = math.inf
    emax = nmax = -math.inf
    for b0 in range(0, P, _BLOCK):
        q = slice(b0, min(P, b0 + _BLOCK))

        def footprint(xx, yy, q=q):
            e = se[q] + k_e[q] * (xx * ch[q] + yy * sh[q])
            n = sn[q] + k_n[q] * (yy * ch[q] - xx * sh[q])
            return e, n

        # footprint: from the nadir depth, then one refinement on every 4th beam, enough to
        # bend the swath over slopes; the depth is the seafloor at the final footprint
        xs = nadir[q] * tan_t[:, sub]
        d_sub = sf.depth(*footprint(xs, nadir[q] * along_k[q]))
        d1 = d_sub[:, kb] * (f32(1) - wb) + d_sub[:, kb + 1] * wb if len(sub) < B else d_sub
        xq = d1 * tan_t
        yq = d1 * along_k[q]
        yq += rng.random(xq.shape, dtype=np.float32) * f32(0.7) - f32(0.35)   # σ ≈ 0.2 m
        e_f, n_f = footprint(xq, yq)
        td = sf.depth(e_f, n_f)
        emin, emax = min(emin, float(e_f.min())), max(emax, float(e_f.max()))
        nmin, nmax = min(nmin, float(n_f.min())), max(nmax, float(n_f.max()))
        true_depth[q], x[q], y[q] = td, xq, yq

        # measurement noise and the refraction smile
        noise = rng.standard_normal(xq.shape, dtype=np.float32)
        noise *= sigma_rel
        noise += smile
        noise += f32(1)
        np.multiply(td, noise, out=depth[q])
        # 95 % uncertainties
        np.multiply(f32(1.96) * sigma_rel, td, out=vert_err[q])
        vert_err[q] += f32(0.15)
        slant = np.sqrt(td * td + xq * xq)
        np.multiply(slant, f32(1.96 * 0.002), out=horiz_err[q])
        horiz_err[q] += f32(1.96 * 0.5)
        if extras:
            np.multiply(slant, f32(2.0 / SOUND_SPEED), out=travel[q])

        # beam flags (NAVO/HMPS), mostly 0x00, and isolated spikes: one uniform draw per beam
        # falls in at most one of the stacked probability bands; only the few candidates
        # below the top band are classified
        r = rng.random(xq.shape, dtype=np.float32)
        cp, cb = np.nonzero(r < top)
        cat = (r[cp, cb][None, :] >= edges[:, cb]).sum(axis=0)
        flags[q][cp, cb] = _FLAG_OF_BAND[cat]
        hit = (cat == len(_FLAG_OF_BAND) - 1) & valid_ping[q][cp]
        single[q][cp[hit], cb[hit]] = True

    # manually edited patches: an operator boxed a few areas of pings × beams
    for _ in range(rng.poisson(P / 400.0 * flag_scale)):
        p0 = int(rng.integers(0, P))
        b0 = int(rng.integers(0, B))
        box = (slice(p0, min(P, p0 + int(rng.integers(3, 20)))),
               slice(b0, min(B, b0 + int(rng.integers(5, 40)))))
        hit = (rng.random(flags[box].shape) < 0.6) & (flags[box] != 0x01)
        flags[box] = np.where(hit, np.uint8(0x05), flags[box])
        single[box] &= ~hit
    # rejected beams often really were outliers
    rej_p, rej_b = np.nonzero((flags == 0x05) | (flags == 0x09) | (flags == 0x21) | (flags == 0x41))
    if len(rej_p):
        junk = rng.uniform(-0.15, 0.15, len(rej_p)) * (rng.random(len(rej_p)) < 0.5)
        depth[rej_p, rej_b] *= (1.0 + junk).astype(f32)
    # null beams: no detection, depth 0 (70 %) or a junk value (P7)
    null_p, null_b = np.nonzero(flags == 0x01)
    if len(null_p):
        zero = rng.random(len(null_p)) < 0.7
        depth[null_p, null_b] = np.where(
            zero, f32(0), true_depth[null_p, null_b] * rng.uniform(0.2, 1.5, len(null_p)).astype(f32))
        x[null_p, null_b] = np.where(zero, f32(0), x[null_p, null_b])
        y[null_p, null_b] = np.where(zero, f32(0), y[null_p, null_b])
        vert_err[null_p, null_b] = 0
        horiz_err[null_p, null_b] = 0

    # planted spikes: isolated ones (drawn above) and small clusters of neighbouring beams
    spiked = single
    pi, bi = np.nonzero(single)
    mag_single = _spike_magnitudes(rng, len(pi))
    c_p, c_b, c_m, c_id = [pi], [bi], [mag_single], [np.full(len(pi), -1, np.int32)]
    for c in range(rng.binomial(P, min(cluster_rate, 1.0))):
        p0 = int(rng.integers(0, P))
        b0 = int(rng.integers(0, B))
        box = (slice(p0, min(P, p0 + int(rng.integers(1, 4)))),
               slice(b0, min(B, b0 + int(rng.integers(2, 5)))))
        cells = ((flags[box] == 0) & valid_ping[box[0], None] & ~spiked[box]
                 & (rng.random(flags[box].shape) < 0.8))
        base = _spike_magnitudes(rng, 1)[0]
        m = base * rng.uniform(0.85, 1.15, cells.shape)
        if not cells.any():
            continue
        spiked[box] |= cells
        cp, cb = np.nonzero(cells)
        c_p.append(cp + p0)
        c_b.append(cb + b0)
        c_m.append(m[cp, cb])
        c_id.append(np.full(len(cp), c, np.int32))
    pi, bi = np.concatenate(c_p), np.concatenate(c_b)
    mag, cl = np.concatenate(c_m), np.concatenate(c_id)
    order = np.lexsort((bi, pi))
    pi, bi, mag, cl = pi[order], bi[order], mag[order], cl[order]
    clean = depth[pi, bi].astype(np.float64)
    tdep = true_depth[pi, bi].astype(np.float64)
    depth[pi, bi] = np.maximum(clean + mag * tdep, 0.1 * tdep).astype(f32)
    planted = depth[pi, bi].astype(np.float64)

    # footprints of the spikes (for area filters)
    e_s = ship_e[pi] + (x[pi, bi] * np.cos(h[pi]) + y[pi, bi] * np.sin(h[pi])) * k_e[pi, 0]
    n_s2 = ship_n[pi] + (y[pi, bi] * np.cos(h[pi]) - x[pi, bi] * np.sin(h[pi])) * k_n[pi, 0]
    flat, flon = sf.unproject(e_s, n_s2)

    name = f"{line['index'] + 1:04d}_{_stamp(int(line['t_ns'][0] // 10**9))}_SYNTH_EM302.gsf"
    kind = np.where(cl >= 0, "cluster_", "single_").astype(object) + \
        np.where(mag > 0, "deep", "shallow").astype(object)
    truth = pa.table({
        "file": pa.array([name] * len(pi), pa.string()),
        "file_index": pa.array(np.full(len(pi), line["index"], np.int32)),
        "ping": pa.array((pi + 1).astype(np.int32)),
        "beam": pa.array((bi + 1).astype(np.int32)),
        "kind": pa.array(kind.tolist(), pa.string()),
        "cluster": pa.array(cl.astype(np.int32)),
        "true_depth": pa.array(tdep),
        "clean_depth": pa.array(clean),
        "planted_depth": pa.array(planted),
        "magnitude": pa.array((planted - clean) / tdep),
        "latitude": pa.array(np.asarray(flat, np.float64)),
        "longitude": pa.array(np.asarray(flon, np.float64)),
    }, schema=TRUTH_SCHEMA)

    # write
    t_ns = line["t_ns"]
    sec = t_ns // 10**9
    nsec = t_ns % 10**9
    path = outdir / name
    vd = depth[(flags != 0x01) & valid_ping[:, None]]
    dr = (float(vd.min()), float(vd.max())) if vd.size else (0.0, 0.0)
    with GsfWriter(path, version=version) as w:
        w.write_summary(start_time=(int(sec[0]), int(nsec[0])), end_time=(int(sec[-1]), int(nsec[-1])),
                        min_latitude=float(lat.min()), min_longitude=float(lon.min()),
                        max_latitude=float(lat.max()), max_longitude=float(lon.max()),
                        min_depth=dr[0], max_depth=dr[1])
        w.write_comment(f"pfm-dask synthetic EM302-like survey, line {line['index'] + 1} of "
                        f"{params['files']}, seed {seed}; not real data",
                        time=(int(sec[0]), int(nsec[0])))
        w.write_history(time=(int(sec[0]), 0), host_name="synth", operator_name="pfm-dask",
                        command_line=(f"pfm-dask synth --files {params['files']} --pings "
                                      f"{params['pings']} --beams {params['beams']} --seed {seed}"),
                        comment="pfm_dask.synth.generate")
        w.write_processing_parameters({
            "REFERENCE TIME": datetime.fromtimestamp(int(sec[0]), tz=timezone.utc).strftime("%Y/%j %H:%M:%S"),
            "ROLL_COMPENSATED": "YES", "PITCH_COMPENSATED": "YES", "HEAVE_COMPENSATED": "YES",
            "TIDE_COMPENSATED": "YES", "DEPTH_CALCULATION": "CORRECTED",
        }, time=(int(sec[0]), 0))
        kw = {}
        if extras:
            kw["travel_time"] = travel
            kw["beam_angle"] = np.broadcast_to(theta[None, :], (P, B))
        w.write_pings(time_sec=sec, time_nsec=nsec, latitude=lat, longitude=lon,
                      heading=heading, course=np.full(P, course), pitch=pitch, roll=roll,
                      heave=heave, speed=speed_kn, depth_corrector=np.full(P, 0.25),
                      tide_corrector=tide, ping_flags=line["ping_flags"],
                      depth=depth, across_track=x, along_track=y, beam_flags=flags,
                      vertical_error=vert_err, horizontal_error=horiz_err, **kw)
        nbytes = w.bytes_written
    return {
        "name": name, "bytes": nbytes, "truth": truth,
        "flag_counts": np.bincount(flags.ravel(), minlength=256).astype(np.int64),
        "area": _footprint_box(sf, emin, emax, nmin, nmax),
        "depth_range": dr,
        "start": f"{_stamp(int(sec[0]))}", "end": f"{_stamp(int(sec[-1]))}",
    }


def _footprint_box(sf: Seafloor, emin, emax, nmin, nmax) -> tuple[float, float, float, float]:
    """(south, west, north, east) of all beam footprints; the projection is separable."""
    lats, lons = sf.unproject(np.array([emin, emax]), np.array([nmin, nmax]))
    return float(lats[0]), float(lons[0]), float(lats[1]), float(lons[1])


def _spike_magnitudes(rng, n):
    """Signed relative magnitudes: |m| log-uniform in [3 %, 30 %] of depth, sign ± with p = ½."""
    m = np.exp(rng.uniform(math.log(0.03), math.log(0.30), n))
    return np.where(rng.random(n) < 0.5, m, -m)
