"""The load report: :class:`LoadResult` (per file, totals, timings, the check, the exit code),
the problems it lists, why a file or a whole load put nothing in the PFM, and
``load-report.json``. Built from the writer's result; no Dask.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .bins import BinGrid

__all__ = ["LoadResult", "write_report"]


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

    def _how(self) -> str:
        """The mode, with the Dask workers of a cluster; the embedded cluster's and
        ``--serial``'s name their workers themselves (the threads layout's one Dask worker
        process beside "local (2 workers)" read as a contradiction)."""
        n = self.workers
        if n <= 0 or self.mode.startswith(("local", "serial")):
            return self.mode
        return f"{self.mode}, {n} Dask worker{'s' if n != 1 else ''}"

    def summary(self) -> str:
        t = self.totals
        lines = [f"PFM: {self.pfm}  ({self._how()})",
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


def _problems(files: list[dict]) -> list[str]:
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
                     problems=(list(extra_problems or []) + _problems(files)
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
