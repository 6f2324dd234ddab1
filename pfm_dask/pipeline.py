"""The load: GSF files → Dask tasks → one pinned writer actor → PFM. The only module running Dask.

Shape (docs/usage.md has the user's view, docs/design.md the reasons):

1. **Pre-scan** (one Dask task per file): framing, ping and beam counts,
   damage, and an extent from a sample of pings. The area defaults to the
   union of the extents.
2. **Plan**: one piece per file; a file much larger than the rest is split
   into ping ranges, so no piece is larger than a fraction of the backlog.
3. **Writer**: a :class:`~pfm_dask.writer.PfmWriter` created as an actor on
   the worker that holds the ``disk`` resource.
4. **Pieces**: tasks restricted to the ``compute`` resource (any worker on a
   cluster where no worker declares it) decode and bin a piece (:func:`~pfm_dask.soundings.prepare_piece`) and hand it straight to
   the actor, which only buffers it; tasks never wait for their turn (that
   deadlocks: DASK_NOTES 2.2). The *driver* holds the window: it submits a
   piece only while the estimated bytes in flight plus the writer's backlog
   stay under ``max_backlog_bytes``.
5. **Final step** on the writer: area filter, recompute, header, check.

``--serial`` runs the same stages in one process without Dask: the baseline
for speedups, and the reference the Dask runs must match byte for byte in the
dump.

Crash safety (docs/reliability.md): the writer keeps a journal beside the PFM;
``resume=True`` continues an interrupted load from its last checkpoint, in any
mode, and submits only the pieces past the writer's watermark. A lost writer
actor stops the load at once with the resume command.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import Callable

import numpy as np

from . import gsf
from .bins import BinGrid
from ._arrays import runs
from .config import LoadConfig
from . import journal as J
from .errors import ConfigError, GsfError, LoadError, PfmDaskError
from .soundings import BATCH_SCHEMA, Piece, _column, _valid_mask, prepare_piece
from .outputs import (Complete, _dedupe, _existing, _given, _inspect_output, _new_files,
                      _plan_resume, _refuse_foreign, _refuse_unfinished, _unfinished,
                      check_append_fits)
from .writer import PfmWriter

__all__ = ["prescan_file", "area_from_scans", "plan_pieces", "run_load", "LoadResult",
           "make_local_cluster", "auto_mode", "SMALL_LOAD_BYTES", "SMALL_LOAD_BYTES_SWATH"]

log = logging.getLogger("pfm_dask")

BYTES_PER_SOUNDING = sum(f.type.bit_width // 8 for f in BATCH_SCHEMA) + 16  # batch + ping table slack
_SAMPLE_PINGS = 48  # pings read per file by the pre-scan (first, last and evenly spaced)
_PIECE_OVERHEAD = 16 * 1024  # Arrow buffers and the ping table of a piece, beyond its soundings
_STATUS_TOPIC = "pfm-writer"  # the writer's status events (pfm_dask.dashboard.TOPIC)
_STATUS_EVERY = 0.5  # seconds between two status events
_SLOTS_EVERY = 2.0  # seconds between two looks at the cluster's compute slots


#: ``mode="auto"`` (the command line's default) loads inputs smaller than this in the driver's
#: own process, as ``--serial`` does: below it the embedded cluster's start-up and transfers
#: cost more than its second worker saves. The cluster costs about 2 s more than ``--serial``
#: on the 3.5 MB EX1811 sample on a quiet 2-core machine (2.84 s against 0.88 s), 6.5 s on a
#: busy one (benchmarks/bench_startup.py); the second worker saves about 0.010 s per MB
#: without the swath filter (bench_load's 1.1 GB survey: 32.4 s serial, 21.0 s on 2 workers)
#: and 0.045 s per MB with it, which the workers run in parallel (107.6 s against 57.9 s).
#: Break-even: 190 MB (quiet) to 620 MB (busy) without it, 44 to 143 MB with it; the limits
#: take the quiet figures, so no input that a cluster would load faster stays in-process.
SMALL_LOAD_BYTES = 160 << 20
SMALL_LOAD_BYTES_SWATH = 40 << 20


def auto_mode(files: list[str], cfg: LoadConfig | None) -> tuple[str, int]:
    """``("serial" | "local", input bytes)``: where ``mode="auto"`` runs a load of ``files``."""
    total = 0
    for f in files:
        try:
            total += os.path.getsize(f)
        except OSError:  # reported by the pre-scan, as in any mode
            pass
    swath = cfg is not None and cfg.swath.enabled
    limit = SMALL_LOAD_BYTES_SWATH if swath else SMALL_LOAD_BYTES
    return ("serial" if total < limit else "local"), total


def _estimate_bytes(piece: Piece) -> int:
    """An upper bound on what a piece will hold while it waits for the writer."""
    return piece.est_soundings * BYTES_PER_SOUNDING + _PIECE_OVERHEAD


# ----------------------------------------------------------------- pre-scan
def prescan_file(path: str, exact_beams: bool = False) -> dict:
    """Cheap facts about one input: counts, damage, and the extent of a ping sample.

    ``exact_beams``: take ``max_beams`` from every ping header, not the sample (an append
    checks it against the PFM's beam field before writing anything).
    Never raises for bad input: an unreadable file comes back with ``error`` set.
    """
    out = {"path": str(path), "n_pings": 0, "n_beams": 0, "max_beams": 0, "extent": None,
           "damage": [], "error": None, "size": 0}
    try:
        out["size"] = os.path.getsize(path)
        with gsf.GsfFile(path, strict=False) as f:
            out["damage"] = [d.to_dict() for d in f.damage]
            n = f.n_pings
            out["n_pings"] = n
            if n == 0:
                return out
            step = max(1, n // _SAMPLE_PINGS)
            picks = sorted(set(range(0, n, step)) | {n - 1})
            # one walk over the ping headers, the sampled pings decoded together
            t = f.read_at(picks)
            ping = t.column("ping").to_numpy()
            _, _, beams_seen = runs(ping)
            lat = t.column("latitude").to_numpy()
            lon = t.column("longitude").to_numpy()
            # impossible positions (|lat| > 90, lon outside -180..360) must not stretch
            # the area; the load skips or counts them
            ok = ((np.abs(lat) <= 90) & (lon >= -180) & (lon <= 180) & np.isfinite(lat)
                  & np.isfinite(lon))
            single = np.repeat(beams_seen, beams_seen) == 1   # one-beam pings: the ping position
            lats, lons = [lat[ok & single]], [lon[ok & single]]
            multi = ok & ~single
            if multi.any():
                across = _column(t, "across_track", np.float64, 0.0)  # no pyarrow.compute
                along = _column(t, "along_track", np.float64, 0.0)
                present = _valid_mask(t, "along_track")
                heading = t.column("heading").to_numpy()
                blat, blon = gsf.beam_positions(lat[multi], lon[multi], heading[multi],
                                                across[multi], along[multi],
                                                along_present=present[multi])
                lats.append(blat)
                lons.append(blon)
            beams_seen = beams_seen.tolist()
            for d in f.damage:
                if d.to_dict() not in out["damage"]:
                    out["damage"].append(d.to_dict())
            mean_beams = float(np.mean(beams_seen)) if beams_seen else 0.0
            out["max_beams"] = int(max(beams_seen)) if beams_seen else 0
            if exact_beams:
                every = f.beams_per_ping()
                out["max_beams"] = int(every.max()) if every.size else out["max_beams"]
            out["n_beams"] = int(round(mean_beams * n))
            if lats:
                la = np.concatenate(lats)
                lo = np.concatenate(lons)
                fin = np.isfinite(la) & np.isfinite(lo)
                if fin.any():
                    out["extent"] = [float(la[fin].min()), float(lo[fin].min()),
                                     float(la[fin].max()), float(lo[fin].max())]
    except GsfError as err:
        out["error"] = err.to_dict()
    except OSError as err:
        out["error"] = GsfError(f"cannot read file: {err.strerror or err}", path=path).to_dict()
    return out


def area_from_scans(scans: list[dict], cfg: LoadConfig) -> BinGrid:
    """The bin grid: the user's MBR or polygon, else the union of the scanned extents."""
    kw = ({"bin_size_m": cfg.bin_size_m} if cfg.bin_size_deg is None
          else {"x_bin_deg": cfg.bin_size_deg[0], "y_bin_deg": cfg.bin_size_deg[1]})
    if cfg.polygon is not None:
        return BinGrid.from_polygon(np.asarray(cfg.polygon, dtype=float), **kw)
    if cfg.mbr is not None:
        return BinGrid.from_mbr(*cfg.mbr, **kw)
    ext = np.array([s["extent"] for s in scans if s.get("extent")], dtype=float)
    if ext.size == 0:
        raise ConfigError("no input has a readable ping position: give the area with --mbr "
                          "or --polygon")
    south, west = ext[:, 0].min(), ext[:, 1].min()
    north, east = ext[:, 2].max(), ext[:, 3].max()
    # The extent comes from a sample of pings: pad it so beams of unsampled pings
    # still fall inside (whatever still falls outside is counted, not lost silently).
    pad_lat = max((north - south) * 0.01, 1e-4)
    pad_lon = max((east - west) * 0.01, 1e-4)
    return BinGrid.from_mbr(max(-90.0, south - pad_lat), west - pad_lon,
                            min(90.0, north + pad_lat), east + pad_lon, **kw)


#: the most bins a load makes without ``force``: about 10 GB of bin records (2 m bins over
#: a deep-water survey made a 356 M-bin grid, a 14 GB sparse .bin, for 8 M soundings)
MAX_GRID_BINS = 250_000_000
#: under this many soundings per bin (estimated after the pre-scan) the load warns
SPARSE_SOUNDINGS_PER_BIN = 0.1


def _round_up_nicely(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``x``."""
    k = 10.0 ** np.floor(np.log10(x))
    return float(next(m * k for m in (1, 2, 2.5, 5, 10) if m * k >= x * (1 - 1e-9)))


def _stretched_by(scans: list[dict], cfg: LoadConfig) -> str:
    """For an automatic area: the files whose pre-scan extents set its four sides, in words
    (a file far from the others, or one bad position, is what makes a grid huge)."""
    if cfg.mbr is not None or cfg.polygon is not None:
        return ""
    ext = [(s["path"], s["extent"]) for s in scans if s.get("extent")]
    if not ext:
        return ""
    sides = {"south": min(ext, key=lambda e: e[1][0])[0], "west": min(ext, key=lambda e: e[1][1])[0],
             "north": max(ext, key=lambda e: e[1][2])[0], "east": max(ext, key=lambda e: e[1][3])[0]}
    return "; the area's sides come from " + ", ".join(f"{k}: {v}" for k, v in sides.items())


def grid_sanity(grid: BinGrid, scans: list[dict], cfg: LoadConfig, *,
                force: bool = False) -> list[str]:
    """Judge the grid against the data before anything is written: a warning (returned)
    when the pre-scan's soundings would fill under ``SPARSE_SOUNDINGS_PER_BIN`` of its bins,
    with a bin size giving about one per bin; a :class:`ConfigError` past ``MAX_GRID_BINS``
    bins unless ``force``."""
    bins = int(grid.width) * int(grid.height)
    soundings = sum(int(s.get("n_beams") or 0) for s in scans if not s.get("error"))
    density = soundings / bins if bins else 0.0
    size = f"{grid.width:,} x {grid.height:,} = {bins:,} bins"
    if cfg.bin_size_deg is None and soundings:
        better = _round_up_nicely(cfg.bin_size_m * (1.0 / density) ** 0.5) if density < 1 else None
        hint = f"--bin-size {better:g} gives about one sounding per bin" if better else ""
    else:
        hint = "larger bins"
    if bins > MAX_GRID_BINS and not force:
        raise ConfigError(f"the grid would have {size} (over the limit of {MAX_GRID_BINS:,}) "
                          f"for about {soundings:,} soundings: {hint or 'give larger bins'}; "
                          f"or give --force to make it anyway{_stretched_by(scans, cfg)}. "
                          "Nothing was written")
    if soundings and density < SPARSE_SOUNDINGS_PER_BIN:
        return [f"the grid has {size} for about {soundings:,} soundings ({density:.2g} "
                f"soundings per bin): {hint}"]
    return []


#: a piece of fewer pings than this is not cut in two at the end of a load
_TAIL_MIN_PINGS = 100


def plan_pieces(scans: list[dict], cfg: LoadConfig, *, first_file_number: int = 0) -> list[Piece]:
    """One piece per file; files with many pings become several ping ranges.

    The last ``cfg.tail_pieces`` pieces are then cut in two: the scheduler
    hands out whole pieces, so the run ends when the last worker finishes its
    last piece, and the others wait up to a piece's time; half pieces halve
    that wait. The plan depends on the inputs and the configuration only, never
    on the cluster, so every mode and worker count writes the same bytes.
    """
    # soundings per piece: writing one takes about 6x its batch's bytes more in the writer's
    # process (docs/performance.md, memory), so a piece is a sixteenth of the backlog
    budget = max(1, cfg.max_backlog_bytes // 16 // BYTES_PER_SOUNDING)
    ranges: list[list] = []  # [file index, first ping, end ping, pings in file, beams]
    for i, s in enumerate(scans):
        n = int(s.get("n_pings") or 0)
        beams = max(1, int(s.get("max_beams") or 1))
        per_piece = max(1, min(cfg.split_pings, budget // beams))
        k = max(1, -(-n // per_piece))
        for j in range(k):
            ranges.append([i, j * per_piece, min(n, (j + 1) * per_piece), n, beams])
    # from the end, so that an insertion moves none of the ranges still to cut
    for k in reversed(range(max(0, len(ranges) - max(0, cfg.tail_pieces)), len(ranges))):
        i, a, b, n, beams = ranges[k]
        if b - a >= 2 * _TAIL_MIN_PINGS:
            mid = (a + b) // 2
            ranges[k:k + 1] = [[i, a, mid, n, beams], [i, mid, b, n, beams]]
    pieces: list[Piece] = []
    for i, group in groupby(ranges, key=lambda r: r[0]):
        group = list(group)
        k = len(group)
        for j, (_, a, b, n, beams) in enumerate(group):
            pieces.append(Piece(len(pieces), first_file_number + i, scans[i]["path"], a,
                                b if j < k - 1 else None, j, k,
                                est_soundings=((b - a) if k > 1 else n) * beams))
    return pieces


# ------------------------------------------------------------------ result
@dataclass
class LoadResult:
    """The load report: per file, totals, timings, the check, and the exit code."""

    pfm: str
    mode: str
    files: list = field(default_factory=list)
    totals: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    check: dict = field(default_factory=dict)
    problems: list = field(default_factory=list)
    area_filter: dict | None = None
    grid: dict = field(default_factory=dict)
    workers: int = 0
    dashboard: str | None = None
    writer_worker: str | None = None
    peak_backlog_bytes: int = 0
    skipped_files: list = field(default_factory=list)
    resumed_from: dict | None = None
    journal: dict | None = None
    resume_command: str | None = None
    contributed_nothing: list = field(default_factory=list)  # [{"path", "why"}]
    warnings: list = field(default_factory=list)  # e.g. a grid far sparser than the data

    @property
    def exit_code(self) -> int:
        if not self.check.get("sound", False):
            return 1
        return 3 if self.problems else 0

    def to_dict(self) -> dict:
        return {"pfm": self.pfm, "mode": self.mode, "workers": self.workers,
                "exit_code": self.exit_code, "grid": self.grid, "totals": self.totals,
                "timings": self.timings, "check": self.check, "problems": self.problems,
                "area_filter": self.area_filter, "files": self.files,
                "dashboard": self.dashboard, "writer_worker": self.writer_worker,
                "peak_backlog_bytes": self.peak_backlog_bytes,
                "skipped_files": self.skipped_files, "resumed_from": self.resumed_from,
                "journal": self.journal, "resume_command": self.resume_command,
                "contributed_nothing": self.contributed_nothing, "warnings": self.warnings}

    def summary(self) -> str:
        t = self.totals
        lines = [f"PFM: {self.pfm}  ({self.mode}, {self.workers} worker(s))",
                 *([f"resumed from phase {self.resumed_from.get('phase')} at piece "
                    f"{self.resumed_from.get('watermark')}"] if self.resumed_from else []),
                 f"files: {t.get('files', 0)}  with problems: {len(self.problems)}",
                 f"soundings read: {t.get('soundings_read', 0):,}  loaded: {t.get('loaded', 0):,}",
                 f"  not loaded: skipped pings {t.get('ping_skipped', 0):,}, rejected beams "
                 f"{t.get('beam_rejected', 0):,}, outside area {t.get('outside_area', 0):,}",
                 f"  loaded but invalid: by GSF flags {t.get('invalid_by_gsf_flags', 0):,}, "
                 f"depth out of range {t.get('depth_out_of_range', 0):,}, swath filter "
                 f"{t.get('flagged_swath_filter', 0):,}, area filter "
                 f"{(self.area_filter or {}).get('flagged', 0):,}",
                 "timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()
                                         if isinstance(v, (int, float)))]
        for p in self.problems:
            lines.append(f"problem: {p}")
        for f in self.contributed_nothing:
            lines.append(f"contributed nothing: {f['path']}: {f['why']}")
        for w in self.warnings:
            lines.append(f"warning: {w}")
        for f in self.skipped_files:
            lines.append(f"skipped (already in the PFM): {f}")
        lines.append("check: " + ("sound" if self.check.get("sound") else
                                  f"{len(self.check.get('problems', []))} problem(s)"))
        return "\n".join(lines)


def _totals(files: list[dict]) -> dict:
    keys = [k for k in files[0] if isinstance(files[0][k], int)] if files else []
    tot = {k: int(sum(f.get(k, 0) for f in files)) for k in keys}
    tot["files"] = len(files)
    return tot


def _problems(files: list[dict], scans: list[dict]) -> list[str]:
    out = []
    for f in files:
        for d in f.get("damage", []):
            off = d.get("offset")
            where = f" at byte {off:,}" if off is not None else ""
            out.append(f"{f['path']}{where}: {d.get('reason')}")
    return out


def _why_nothing(f: dict) -> str | None:
    """Why a file put no sounding in the PFM, in words; None when it loaded some."""
    if f.get("loaded", 0) > 0:
        return None
    read, skipped, rejected, outside = (int(f.get(k, 0)) for k in (
        "soundings_read", "ping_skipped", "beam_rejected", "outside_area"))
    if not f.get("pings_read"):
        return "no readable ping (see its problem)" if f.get("damage") else "no pings"
    if read == 0:
        return "its pings hold no beams"
    loadable = read - skipped - rejected
    if loadable > 0:  # and none loaded: each fell outside the area
        return f"all {outside:,} loadable soundings outside the area"
    if skipped == read:
        return f"all {read:,} soundings in skipped pings (ignore flag or impossible position)"
    if rejected == read:
        return f"all {read:,} beams rejected (null or zero depth)"
    return f"every sounding in a skipped ping ({skipped:,}) or a rejected beam ({rejected:,})"


def _nothing_loaded(totals: dict, scans: list[dict]) -> list[str]:
    """The problem of a load that put no sounding in the PFM (an empty PFM checks sound)."""
    if totals.get("loaded", 0) > 0 or not totals.get("files"):
        return []
    outside = int(totals.get("outside_area", 0))
    if not outside:
        return ["no sounding was loaded: no input holds a loadable sounding (each file's "
                "reason is under 'contributed nothing')"]
    ext = np.array([s["extent"] for s in scans if s.get("extent")], dtype=float)
    where = (f"; the inputs lie within {ext[:, 0].min():.6g} {ext[:, 1].min():.6g} "
             f"{ext[:, 2].max():.6g} {ext[:, 3].max():.6g}" if ext.size else "")
    return [f"no sounding fell inside the area (all {outside:,} loadable soundings are "
            "outside it): --mbr takes SOUTH WEST NORTH EAST degrees, --polygon 'lat, lon' "
            f"points{where}"]


def _finalise(result_writer: dict, scans: list[dict], mode: str, grid: BinGrid,
              timings: dict, workers: int, dashboard: str | None = None,
              extra_problems: list[str] | None = None) -> LoadResult:
    files = result_writer["files"]
    totals = _totals(files)
    res = LoadResult(pfm=result_writer["pfm"], mode=mode, files=files, totals=totals,
                     timings=timings, check=result_writer["check"],
                     problems=(list(extra_problems or []) + _problems(files, scans)
                               + _nothing_loaded(totals, scans)),
                     area_filter=result_writer.get("area_filter"),
                     grid={"width": grid.width, "height": grid.height, "min_x": grid.min_x,
                           "min_y": grid.min_y, "max_x": grid.max_x, "max_y": grid.max_y,
                           "x_bin": grid.x_bin, "y_bin": grid.y_bin,
                           "bin_size_xy": grid.bin_size_xy},
                     workers=workers, dashboard=dashboard,
                     peak_backlog_bytes=int(result_writer.get("peak_backlog_bytes", 0)))
    for k, v in result_writer.get("writer_timings", {}).items():
        res.timings.setdefault(k, v)
    res.contributed_nothing = [{"path": f["path"], "why": why} for f in files
                               if (why := _why_nothing(f)) is not None]
    res.resumed_from = result_writer.get("resumed_from")
    res.journal = result_writer.get("journal")
    if res.journal and timings.get("total"):
        res.journal["fraction_of_total"] = res.journal["seconds"] / timings["total"]
    return res


def write_report(res: LoadResult, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(res.to_dict(), indent=2, default=str))
    os.replace(tmp, path)


# ------------------------------------------------------------------ serial
def _plan(scans: list[dict], cfg: LoadConfig, output: Path, files: list[str], append: bool,
          job: "_Job") -> tuple[BinGrid, list[Piece]]:
    """The grid and the pieces; for an append, first prove that every input fits the PFM's
    fields, then mark the append in the journal: both before anything is written."""
    existing_grid, existing = _existing(output, append)
    if append:
        check_append_fits(output, scans, cfg)
    grid = existing_grid if existing_grid is not None else area_from_scans(scans, cfg)
    if existing_grid is None:
        job.warnings = grid_sanity(grid, scans, cfg, force=job.force)
        for w in job.warnings:
            job.say(w)
    pieces = plan_pieces(scans, cfg, first_file_number=len(existing))
    if append and job.journal:
        J.mark_append(output, job.given or _given(files), J.config_to_dict(cfg), job.resume_cmd)
        J.crash_point("append-marked")
    return grid, pieces


@dataclass
class _Job:
    """What a run needs beyond the files: a fresh load's journal facts, or a resume's plan."""

    resume: bool = False
    static: dict | None = None          # load.json of the load being resumed
    command: list | None = None         # the command line, for the resume command
    resume_cmd: str = ""
    strict: bool = False
    checkpoint_seconds: float = 10.0
    input_problems: list = field(default_factory=list)
    journal: bool = True                # False: no crash safety (to measure what it costs)
    given: list = field(default_factory=list)   # the inputs as given (absolute), for a resume
    force: bool = False                 # make a grid past MAX_GRID_BINS
    warnings: list = field(default_factory=list)
    say: Callable[[str], None] = lambda message: None

    def pieces(self) -> list[Piece]:
        return [Piece(**d) for d in self.static["pieces"]]


def _static(job: _Job, files: list[str], cfg: LoadConfig, pieces: list[Piece],
            append: bool) -> dict | None:
    """The facts of a new load that ``load.json`` keeps for a resume."""
    from dataclasses import asdict

    if not job.journal:
        return None
    return {"command": job.command, "resume_command": job.resume_cmd, "given": job.given,
            "inputs": [J.input_record(f) for f in files], "cfg": J.config_to_dict(cfg),
            "append": append, "pieces": [asdict(p) for p in pieces],
            "input_problems": job.input_problems, "created": time.time()}


def _strict_check(scans: list[dict]) -> None:
    """``--strict``: refuse to start when the pre-scan found damage (nothing written yet)."""
    bad = []
    for s in scans:
        for d in ([s["error"]] if s.get("error") else []) + list(s.get("damage") or []):
            off = d.get("offset")
            bad.append(f"{s['path']}" + (f" at byte {off:,}" if off is not None else "")
                       + f": {d.get('reason')}")
    if bad:
        raise LoadError(f"--strict: the pre-scan found {len(bad)} problem(s); nothing was "
                        "written:\n  " + "\n  ".join(bad))


def _run_serial(files: list[str], output: Path, cfg: LoadConfig,
                progress: Callable[[dict], None] | None, append: bool,
                job: _Job | None = None) -> LoadResult:
    job = job or _Job()
    t0 = time.perf_counter()
    if job.resume:
        scans: list[dict] = []
        t_scan = time.perf_counter()
        writer = PfmWriter(output, None, cfg, None, None, resume=True,
                           checkpoint_seconds=job.checkpoint_seconds, threads=1)
        pieces = [p for p in job.pieces() if p.seq >= writer.watermark]
    else:
        scans = [prescan_file(f, append) for f in files]
        if job.strict:
            _strict_check(scans)
        t_scan = time.perf_counter()
        grid, pieces = _plan(scans, cfg, output, files, append, job)
        writer = PfmWriter(output, grid, cfg, files, len(pieces), append=append,
                           journal=_static(job, files, cfg, pieces, append),
                           checkpoint_seconds=job.checkpoint_seconds, threads=1)
    try:
        for p in pieces:
            writer.put(prepare_piece(p, writer.pfm.grid, writer.cfg))
            writer.write_ready()
            if progress:
                progress(writer.status())
        t_load = time.perf_counter()
        rw = writer.finish()
    except BaseException:
        writer.abort()
        raise
    t_end = time.perf_counter()
    timings = {"prescan": t_scan - t0, "load": t_load - t_scan, "final": t_end - t_load,
               "total": t_end - t0}
    return _finalise(rw, scans, "serial" + (" (resumed)" if job.resume else ""),
                     writer.pfm.grid, timings, 1, extra_problems=job.input_problems)


# -------------------------------------------------------------------- Dask
class WriterActor:
    """The Dask actor around :class:`PfmWriter`: sync methods run on the actor thread."""

    def __init__(self, pfm_path, grid, cfg, files, n_pieces, append=False, journal=None,
                 resume=False, checkpoint_seconds=10.0):
        self.writer = PfmWriter(pfm_path, grid, cfg, files, n_pieces, append=append,
                                journal=journal, resume=resume,
                                checkpoint_seconds=checkpoint_seconds)
        self.writer.start()
        try:
            from distributed import get_worker
            self._worker = get_worker()
            self.host = self._worker.address
        except Exception:  # noqa: BLE001 - outside a worker (tests)
            self._worker = None
            self.host = None
        # The status goes to the scheduler's pfm-writer plugin (pfm_dask.dashboard) every
        # _STATUS_EVERY seconds from a thread of ours; log_event may be called from any thread.
        self._load_id = uuid.uuid4().hex
        self._publish_stop = threading.Event()
        self._publisher = None
        if self._worker is not None:
            self._publish()
            self._publisher = threading.Thread(target=self._publish_loop, daemon=True,
                                               name="pfm-writer-status")
            self._publisher.start()

    def _publish(self, **override) -> None:
        try:
            st = self.writer.status()
            st.update(pfm=str(self.writer.path), load_id=self._load_id, time=time.time(),
                      **override)
            st = {k: (v.item() if isinstance(v, np.generic) else v) for k, v in st.items()}
            self._worker.log_event(_STATUS_TOPIC, st)
        except Exception as err:  # noqa: BLE001 - progress reports must never break a load
            log.debug("writer status not published: %s", err)

    def _publish_loop(self) -> None:
        while not self._publish_stop.wait(_STATUS_EVERY):
            self._publish()

    def _stop_publishing(self, **override) -> None:
        if self._publisher is not None:
            self._publish_stop.set()
            self._publisher.join(timeout=5)
            self._publisher = None
            self._publish(**override)

    def where(self) -> str | None:
        return self.host

    def grid(self):
        return self.writer.pfm.grid

    def cfg(self):
        return self.writer.cfg

    def watermark(self) -> int:
        return self.writer.watermark

    def put(self, prepared) -> bool:
        return self.writer.put(prepared)

    def skip(self, piece, error) -> bool:
        return self.writer.skip(piece, error)

    def status(self) -> dict:
        return self.writer.status()

    def finish(self) -> dict:
        try:
            return self.writer.finish()
        finally:
            self._stop_publishing()

    def abort(self) -> None:
        try:
            self.writer.abort()
        finally:
            self._stop_publishing(phase="aborted")


def _kill_compute_worker_once(when: str) -> None:
    """Test hook: ``PFM_DASK_KILL_COMPUTE_WORKER=before|after:MARKER`` makes the first task on
    a worker without the ``disk`` resource SIGKILL its own worker process, before or after it
    hands its piece to the writer (the marker file makes it happen once per load)."""
    spec = os.environ.get("PFM_DASK_KILL_COMPUTE_WORKER")
    if not spec:
        return
    moment, _, marker = spec.partition(":")
    if moment != when:
        return
    from distributed import get_worker

    if get_worker().state.total_resources.get("disk", 0):
        return
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def _local_writer(cls, address: str, key: str):
    """The writer actor object itself when this task runs on the worker that holds it, else None."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:  # not in a worker (a test calling the task directly)
        return None
    if worker.address != address:
        return None
    actor = worker.state.actors.get(key)
    return actor if isinstance(actor, cls) else None


def _piece_task(piece: Piece, grid: BinGrid, cfg: LoadConfig, writer) -> dict:
    """A worker task: prepare the piece and hand it to the writer actor (never waits for order).

    A retried or re-run task delivers its piece again: the writer drops the duplicate.
    ``writer`` is the actor, or ``(class, address, key)`` to rebuild its proxy here (an
    Actor argument is a task dependency, which would send every task to the disk worker).
    """
    local = None
    if isinstance(writer, tuple):
        from distributed.actor import Actor

        local = _local_writer(*writer)
        writer = Actor(*writer)
    prepared = prepare_piece(piece, grid, cfg)
    _kill_compute_worker_once("before")
    t0 = time.perf_counter()
    # On the writer's own worker the piece is handed over in memory: a call through the
    # actor would pickle it and send it to this same process over TCP.
    accepted = local.put(prepared) if local is not None else writer.put(prepared).result()
    _kill_compute_worker_once("after")
    timings = dict(prepared.timings, transfer=time.perf_counter() - t0)
    return {"seq": piece.seq, "nbytes": prepared.nbytes, "accepted": accepted,
            "timings": timings}


def make_local_cluster(workers: int, *, dashboard_address: str | None = None,
                       memory_limit: str | int = "auto", processes: bool = True):
    """An embedded cluster of ``workers`` processes; the first also holds ``disk=1``.

    Every server (scheduler, nannies, workers, their HTTP servers) listens on 127.0.0.1
    only; ``dashboard_address`` (default ``127.0.0.1:0``) may open the dashboard. Their
    scratch space is a temporary folder removed when the cluster closes (pfm_dask.security).
    ``processes=False`` runs the workers in this process (tests that patch code).
    """
    from distributed import Nanny, Scheduler, Worker

    from .security import LOCAL_DASHBOARD, LOOPBACK, scratch_folder, scratch_spec_cluster

    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    scratch = scratch_folder()
    specs = {}
    for i in range(workers):
        res = {"compute": 1}
        if i == 0:
            res["disk"] = 1
        opts = {"nthreads": 1, "resources": res, "memory_limit": memory_limit,
                "host": LOOPBACK, "dashboard_address": f"{LOOPBACK}:0",
                "local_directory": scratch}
        if processes:
            opts["silence_logs"] = logging.WARNING
            opts["preload"] = ["pfm_dask._worker_signals"]  # Ctrl-C is the driver's
        specs[f"pfm-worker-{i}"] = {"cls": Nanny if processes else Worker, "options": opts}
    # The scheduler runs in this process: the preload adds the "PFM writer" page and plugin.
    scheduler = {"cls": Scheduler, "options": {
        "host": LOOPBACK, "dashboard_address": dashboard_address or LOCAL_DASHBOARD,
        "local_directory": scratch, "preload": ["pfm_dask.dashboard"]}}
    with worker_environment():
        return scratch_spec_cluster()(workers=specs, scheduler=scheduler, scratch=scratch,
                                      silence_logs=logging.WARNING, name="pfm-dask")


#: Periodic work of every Dask server (scheduler, nannies, workers) made less frequent: the
#: event-loop tick measured every 20 ms (a diagnostic: it only warns of a blocked loop), the
#: system monitor every 0.5 s (the dashboard's CPU and memory plots), the memory checks every
#: 0.1 s. An idle 2-worker cluster spent 4.8% of a core on these, 1.3% with these values; a
#: loaded one much more, since each wake-up takes the GIL from a busy task or writer thread
#: (2-worker loads of the 1.1 GB survey: 20.2-20.6 s against 21.3-22.7 s, docs/performance.md).
_QUIET_LOOPS = {"distributed.admin.tick.interval": "1s",
                "distributed.admin.system-monitor.interval": "1s",
                "distributed.worker.memory.monitor-interval": "500ms"}


def worker_environment():
    """Dask's settings for the embedded cluster: no ``MALLOC_TRIM_THRESHOLD_``, no profiler, and
    fewer wake-ups of the event loops (``_QUIET_LOOPS``).

    distributed starts workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which stops
    glibc from reusing large freed blocks: every large numpy array in a worker is then
    freshly mapped and page-faulted, and the decode and final step cost about 1.5-2x the
    CPU they cost in ``--serial`` (measured). Its statistical profiler samples every
    thread's stack every 10 ms, the writer's and the decoding task's included: about 2-5
    CPU seconds per GB loaded on a 2-core machine (measured), for a dashboard page a
    batch load seldom needs (set ``DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True`` and
    ``--scheduler`` to an own cluster to profile). Nannies read these settings when
    created, so create them inside this context.
    """
    import dask

    env = dict(dask.config.get("distributed.nanny.pre-spawn-environ", {}) or {})
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    return dask.config.set({"distributed.nanny.pre-spawn-environ": env,
                            "distributed.worker.profile.enabled": False, **_QUIET_LOOPS})


def _check_disk_worker(client) -> dict | None:
    """Refuse a cluster without a ``disk`` worker; return the resources the load's tasks ask
    for: ``{"compute": 1}`` when some worker declares ``compute`` (the work goes to those),
    None on an ordinary cluster of plain ``dask worker ADDRESS`` workers (any worker)."""
    info = client.scheduler_info(n_workers=-1)
    disk = [a for a, w in info["workers"].items() if w.get("resources", {}).get("disk", 0) >= 1]
    if not disk:
        raise ConfigError("no worker in this cluster has the 'disk' resource: start the worker "
                          "on the disk node with `dask worker SCHEDULER --resources disk=1`")
    compute = [a for a, w in info["workers"].items() if w.get("resources", {}).get("compute", 0) >= 1]
    return {"compute": 1} if compute else None


def _compute_slots(client, task_resources: dict | None) -> int:
    """Tasks the cluster can run at once: the ``compute`` resource summed over its workers
    (their threads when the tasks ask for no resource)."""
    try:
        info = client.scheduler_info(n_workers=-1)["workers"].values()
    except Exception:  # noqa: BLE001 - a slow answer must not stop a load: assume one slot
        return 1
    if task_resources is None:
        return max(1, int(sum(w.get("nthreads", 1) for w in info)))
    return max(1, int(sum(w.get("resources", {}).get("compute", 0) for w in info)))


def _register_dashboard(client) -> None:
    """The writer's gauges, JSON route and page data on whatever scheduler runs the load."""
    try:
        from .dashboard import PfmWriterPlugin

        client.register_plugin(PfmWriterPlugin())
    except Exception as err:  # noqa: BLE001 - monitoring must not stop a load
        log.warning("the writer's progress will not show on the dashboard: %s", err)


def _actor_lost(err: BaseException) -> bool:
    """True when ``err`` says the worker holding the writer actor died (DASK_NOTES 2.1):
    "Worker holding Actor was lost" (the scheduler), "Unable to contact Actor's worker"
    (a proxy in a task or the driver), or a closed connection to it."""
    text = f"{type(err).__name__}: {err}"
    return ("Actor" in text and ("lost" in text or "contact" in text)) or type(err).__name__ in (
        "CommClosedError", "StreamClosedError")


def _run_dask(client, files: list[str], output: Path, cfg: LoadConfig,
              progress: Callable[[dict], None] | None, append: bool, mode: str,
              job: _Job | None = None) -> LoadResult:
    from distributed import wait

    job = job or _Job()
    t0 = time.perf_counter()
    _register_dashboard(client)
    task_res = _check_disk_worker(client)
    out_path = str(Path(output).resolve())
    if job.resume:
        scans: list[dict] = []
        t_scan = time.perf_counter()
        pieces = job.pieces()
        actor_fut = client.submit(WriterActor, out_path, None, cfg, None, None, False, None,
                                  True, job.checkpoint_seconds, actor=True,
                                  resources={"disk": 1}, pure=False,
                                  key=f"pfm-writer-resume-{uuid.uuid4().hex[:8]}")
    else:
        scan_futs = client.map(prescan_file, files, exact_beams=append,
                               key=[f"prescan-{i}" for i in range(len(files))],
                               resources=task_res, pure=False)
        scans = client.gather(scan_futs)
        del scan_futs
        if job.strict:
            _strict_check(scans)
        t_scan = time.perf_counter()
        grid, pieces = _plan(scans, cfg, output, files, append, job)
        static = _static(job, files, cfg, pieces, append)
        actor_fut = client.submit(WriterActor, out_path, grid, cfg, files, len(pieces), append,
                                  static, False, job.checkpoint_seconds, actor=True,
                                  resources={"disk": 1}, pure=False, key="pfm-writer")
    try:
        writer = actor_fut.result()
        grid = writer.grid().result()
        cfg = writer.cfg().result()
        writer_addr = writer.where().result()
    except Exception as err:
        if _actor_lost(err) or type(err).__name__ == "KilledWorker":
            raise LoadError(f"the writer's worker died while opening the PFM ({err}); continue "
                            f"with: {job.resume_cmd}", path=out_path) from err
        raise
    log.info("writer actor on %s", writer_addr)
    # the tasks get the actor's address, not the actor: no dependency on the disk worker
    writer_ref = (WriterActor, writer._address, writer.key)

    pending = list(reversed(pieces))
    in_flight: dict = {}
    est = {p.seq: _estimate_bytes(p) for p in pieces}
    status = writer.status().result()
    pending = [p for p in pending if p.seq >= status["watermark"]]
    last_progress = 0.0
    transfer = 0.0
    slots, slots_at = _compute_slots(client, task_res), time.monotonic()
    try:
        while status["watermark"] < len(pieces):
            if status.get("error"):
                raise LoadError(f"the writer stopped: {status['error']}")
            if time.monotonic() - slots_at > _SLOTS_EVERY:  # adaptive clusters grow and shrink
                slots, slots_at = _compute_slots(client, task_res), time.monotonic()
            in_flight_bytes = sum(est[p.seq] for p in in_flight.values())
            # Dask places a task with a resource restriction on a worker as soon as it is
            # submitted, so a deep queue is a static split: a worker slowed by the writer
            # keeps its share while the others idle. At most one task waits per slot, so
            # the next piece goes to whichever worker frees first.
            window = min(cfg.max_window, 2 * slots)
            while pending and len(in_flight) < window:
                nxt = pending[-1]
                room = cfg.max_backlog_bytes - status["backlog_bytes"] - in_flight_bytes
                # Over budget: wait, unless nothing at all is in flight or waiting (a piece
                # larger than the budget must still go through, alone). Waiting cannot
                # deadlock: the piece the writer needs next is in flight or already buffered.
                if est[nxt.seq] > room and (in_flight or status["backlog_batches"]):
                    break
                pending.pop()
                fut = client.submit(_piece_task, nxt, grid, cfg, writer_ref,
                                    key=f"piece-{nxt.seq:06d}", resources=task_res,
                                    pure=False, priority=-nxt.seq, retries=1)
                in_flight[fut] = nxt
                in_flight_bytes += est[nxt.seq]
            if in_flight:
                try:
                    done, _ = wait(list(in_flight), timeout=0.25, return_when="FIRST_COMPLETED")
                except TimeoutError:  # nothing finished in this slice; poll the writer
                    done = ()
                for fut in done:
                    piece = in_flight.pop(fut)
                    if fut.status == "finished":
                        transfer += fut.result()["timings"]["transfer"]
                    if fut.status == "error":
                        err = fut.exception()
                        if _actor_lost(err):  # the task could not reach the writer: it is gone
                            raise err
                        e = LoadError(f"task failed: {type(err).__name__}: {err}",
                                      path=piece.path).to_dict()
                        writer.skip(piece, e).result()
                    fut.release()
            else:
                time.sleep(0.05)
            if actor_fut.status == "error":  # the scheduler saw the disk worker die: no call
                raise RuntimeError("Worker holding Actor was lost")  # (it would wait 30 s)
            status = writer.status().result()
            now = time.perf_counter()
            if progress and now - last_progress > 0.5:
                last_progress = now
                progress(status)
        t_load = time.perf_counter()
        if actor_fut.status == "error":
            raise RuntimeError("Worker holding Actor was lost")
        rw = writer.finish().result()
    except BaseException as err:
        for fut in in_flight:
            fut.cancel()
        if not _actor_lost(err):
            try:
                writer.abort().result(timeout=30)
            except Exception:  # noqa: BLE001 - the actor may be gone
                pass
        if isinstance(err, PfmDaskError) or not isinstance(err, Exception):
            raise
        if _actor_lost(err):
            raise LoadError(f"the writer's worker died ({type(err).__name__}: {err}). Dask does "
                            "not restart a writer, so the load stopped; the PFM is incomplete "
                            "and marked so, and everything up to its last checkpoint is kept. "
                            f"Continue with: {job.resume_cmd}", path=out_path) from err
        raise
    t_end = time.perf_counter()
    timings = {"prescan": t_scan - t0, "load": t_load - t_scan, "final": t_end - t_load,
               "total": t_end - t0}
    nworkers = len(client.scheduler_info(n_workers=-1)["workers"])
    dash = getattr(client, "dashboard_link", None)
    res = _finalise(rw, scans, mode + (" (resumed)" if job.resume else ""), grid, timings,
                    nworkers, dash, extra_problems=job.input_problems)
    res.timings["task_transfer"] = transfer
    res.writer_worker = writer_addr
    return res


def _already_complete(output: Path, state: dict) -> LoadResult:
    """``--resume`` on a finished load: nothing to do; the report is the journal's."""
    from . import pfm

    rw = state.get("result") or {}
    J.remove_scratch(output)
    with pfm.open_pfm(output) as f:
        grid = f.grid
    rw.setdefault("pfm", str(output))
    rw.setdefault("files", [])
    rw.setdefault("check", state.get("check") or {"sound": True, "problems": []})
    static = J.read_static(output) or {}
    return _finalise(rw, [], "already complete (nothing to resume)", grid, {}, 0,
                     extra_problems=static.get("input_problems"))


def run_load(inputs: list[str], output: str | os.PathLike, cfg: LoadConfig | None, *,
             mode: str = "local", workers: int = 2, scheduler: str | None = None,
             append: bool = False, progress: Callable[[dict], None] | None = None,
             on_dashboard: Callable[[str], None] | None = None, client=None,
             cluster_profile=None, dashboard_address: str | None = None, security=None,
             on_message: Callable[[str], None] | None = None,
             resume: bool = False, strict: bool = False, command: list[str] | None = None,
             resume_options: list[str] | None = None,
             checkpoint_seconds: float = 10.0, journal: bool = True,
             input_problems: list[str] | None = None, force: bool = False) -> LoadResult:
    """Run a whole load; ``mode`` is ``serial``, ``local`` (embedded cluster), ``scheduler``,
    ``cluster`` (Slurm, PBS or local jobs from a :class:`~pfm_dask.cluster.ClusterProfile`) or
    ``auto``: ``serial`` for inputs under :data:`SMALL_LOAD_BYTES` (:func:`auto_mode`, said in
    one line through ``on_message``), else ``local``.

    ``client``: an existing :class:`distributed.Client` to run on (any mode but serial).
    ``on_message``: where the cluster's notices go (jobs submitted, waiting, cancelled).
    ``dashboard_address``: the embedded cluster's dashboard (default: loopback, any port).
    ``security``: :class:`~pfm_dask.security.TlsFiles` for ``scheduler`` (default: Dask's
    configuration).
    ``resume``: continue the interrupted load writing ``output`` (its inputs and settings
    come from its journal; ``inputs`` and ``cfg`` may be empty/None, else must match).
    ``strict``: refuse to start when the pre-scan finds damaged input.
    ``command``: the command line (``sys.argv``), kept in ``load.json``.
    ``resume_options``: the run options the printed resume command repeats (absolute paths).
    ``checkpoint_seconds``: the writer's checkpoint interval (docs/reliability.md).
    ``journal=False`` turns crash safety off (no resume possible): only to measure its cost.
    ``input_problems``: what the input expansion skipped (folders it could not search, special
    files), reported with the load's problems.
    ``force``: make a grid larger than ``MAX_GRID_BINS`` bins (refused otherwise).

    Nothing at ``output`` is removed or overwritten unless its own journal proves it is this
    load's unfinished output; anything else there is refused (:class:`ConfigError`).
    """
    files = [str(f) for f in inputs or []]
    output = Path(output)
    skipped: list[str] = []
    job = _Job(command=command, resume_cmd=J.resume_command(output, resume_options),
               strict=strict, checkpoint_seconds=checkpoint_seconds, resume=resume,
               journal=journal, force=force)

    def say(message: str) -> None:
        if on_message:
            on_message(message)

    job.say = say

    if resume:
        planned = _plan_resume(files, output, cfg, append, job, say)
        if isinstance(planned, Complete):
            return _already_complete(output, planned.state)
        files, cfg, append, resume = planned
        job.resume = resume
        pending_ok = True           # a resume may start over an append that wrote nothing
    elif cfg is None:
        raise ConfigError("a load needs its settings (cfg)")
    else:
        pending_ok = False
    if not resume:
        found = _inspect_output(output)
        if found.kind == "foreign":
            raise _refuse_foreign(output, found)
        unfinished = _unfinished(output) if found.kind == "load" else None
        if unfinished is not None and not (
                pending_ok and unfinished.get("phase") == "append-pending"):
            raise _refuse_unfinished(output, unfinished)
        if append:
            if found.kind == "nothing":
                raise ConfigError("--append needs an existing PFM", path=output)
            files, job.input_problems = _dedupe(files)
            job.given = _given(files)
            new = set(_new_files(files, output))
            skipped = [f for f in files if f not in new]
            files = [f for f in files if f in new]
            if not files:
                raise ConfigError("every input file is already in the PFM's .ctl; nothing to "
                                  "append", path=output)
        elif found.kind != "nothing":
            raise ConfigError(f"output {output} already exists: remove it, or add files to it "
                              "with --append", path=output)
        else:
            files, job.input_problems = _dedupe(files)
            job.given = _given(files)
        job.input_problems = list(input_problems or []) + job.input_problems
    if mode == "auto" and client is None:
        mode, size = auto_mode(files, cfg)
        if mode == "serial":
            say(f"{size / 2**20:.1f} MB of input: loading in this process, no cluster "
                "(--workers N starts one)")
    elif mode == "auto":
        mode = "local"
    if mode == "serial":
        res = _run_serial(files, output, cfg, progress, append, job)
    elif client is not None:
        res = _run_dask(client, files, output, cfg, progress, append, mode, job)
    else:
        from distributed import Client

        if mode == "cluster":
            from .cluster import start_cluster

            if cluster_profile is None:
                raise ConfigError("mode 'cluster' needs a cluster profile (--cluster-config)")
            t_start = time.perf_counter()
            with start_cluster(cluster_profile, on_message=on_message) as pc:
                if on_dashboard:
                    on_dashboard(pc.dashboard_link)
                pc.wait_for_workers()
                t_cluster = time.perf_counter() - t_start
                res = _run_dask(pc.client, files, output, cfg, progress, append, pc.describe(),
                                job)
                res.timings["cluster_start"] = t_cluster
        elif mode == "scheduler":
            if not scheduler:
                raise ConfigError("--scheduler needs an address, e.g. tcp://host:8786")
            from .security import client_security

            address, sec = client_security(scheduler, security)
            with Client(address, timeout="30s", security=sec) as client:
                if on_dashboard:
                    on_dashboard(client.dashboard_link)
                res = _run_dask(client, files, output, cfg, progress, append, "scheduler", job)
        else:
            t_start = time.perf_counter()
            with make_local_cluster(workers, dashboard_address=dashboard_address) as cluster, \
                    Client(cluster) as client:
                client.wait_for_workers(workers, timeout=120)
                t_cluster = time.perf_counter() - t_start
                if on_dashboard:
                    on_dashboard(client.dashboard_link)
                res = _run_dask(client, files, output, cfg, progress, append,
                                f"local ({workers} workers)", job)
                res.timings["cluster_start"] = t_cluster
    res.skipped_files = skipped
    res.warnings = list(job.warnings)
    res.resume_command = job.resume_cmd
    write_report(res, Path(str(output) + ".data") / "load-report.json")
    return res
