"""Planning a load before anything is written: the pre-scan of each input, the automatic area,
the grid's sanity check, the pieces, and where ``mode="auto"`` runs (serial or a cluster).

Plain functions with no Dask: the pipeline runs :func:`prescan_file` as Dask tasks or in
its own process, and everything else here in the driver. The plan depends on the inputs
and the configuration only, so every mode and worker count writes the same bytes.
"""

from __future__ import annotations

import os
from itertools import groupby

import numpy as np

from . import gsf
from ._arrays import runs
from .auto_area import automatic_grid, extent_of, far_pings, stretched_by, swath_outline
from .bins import BinGrid
from .config import LoadConfig
from .errors import ConfigError, GsfError, LoadError
from .pieces import COUNTED_ROW_BYTES, Piece

__all__ = ["prescan_file", "area_from_scans", "grid_sanity", "plan_pieces", "auto_mode",
           "MAX_GRID_BINS", "SPARSE_SOUNDINGS_PER_BIN", "SMALL_LOAD_BYTES",
           "SMALL_LOAD_BYTES_SWATH", "BYTES_PER_SOUNDING"]

BYTES_PER_SOUNDING = COUNTED_ROW_BYTES + 16  # batch (as groups count it) + ping table slack
_SAMPLE_PINGS = 48  # pings read per file by the pre-scan (first, last and evenly spaced)
_PIECE_OVERHEAD = 16 * 1024  # Arrow buffers and the ping table of a piece, beyond its soundings


#: ``mode="auto"`` (the command line's default) loads inputs smaller than this in the driver's
#: own process, as ``--serial`` does: below it the embedded cluster's start-up and its second
#: worker cost more than they save. Without the swath filter the writer is the slower stage and
#: the compute threads share its two cores: ``bench_load --shape all --repeat 1`` (2-core VM,
#: shared, load 3-6, d99d266) gave 2 workers 0.55x ``--serial`` on 8 files of 37 MB (0.3 GB:
#: 4.52 s against 2.49 s), 0.97x on 48 files of 23 MB (1.1 GB: 11.77 s against 11.46 s) and
#: 1.28x on the 74-file survey (2.0 GB: 25.3 s against 32.3 s): break-even near 1.15 GB, and
#: the limit is a little above it. With the swath filter, which the workers run in parallel,
#: the second worker saves about 0.045 s per MB (bench_load's 1.1 GB survey: 107.6 s against
#: 57.9 s) against the cluster's 2-6.5 s (benchmarks/bench_startup.py): 44 to 143 MB.
SMALL_LOAD_BYTES = 1280 << 20
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
            # one walk over the pings and their headers, the sampled pings decoded together
            headers, cols = f.sample_at(picks)
            far = far_pings(headers, f.ping_offsets, path)   # damaged fixes
            out["far_pings"] = far.damage
            out["damage"] += far.damage
            ping = cols["ping"]
            _, _, beams_seen = runs(ping)
            lat = cols["latitude"]
            lon = cols["longitude"]
            # impossible positions (|lat| > 90, lon outside -180..360) must not stretch
            # the area; the load skips or counts them
            ok = ((np.abs(lat) <= 90) & (lon >= -180) & (lon <= 180) & np.isfinite(lat)
                  & np.isfinite(lon) & ~np.isin(ping.astype(np.int64) - 1, far.pings))
            single = np.repeat(beams_seen, beams_seen) == 1   # one-beam pings: the ping position
            lats, lons = [lat[ok & single]], [lon[ok & single]]
            multi = ok & ~single
            across = along = np.zeros(0)
            beam_ping = ping.astype(np.int64)[multi] - 1
            if multi.any():
                valid = cols["_valid"]
                across = np.where(valid.get("across_track", True), cols["across_track"], 0.0)
                present = valid.get("along_track", np.ones(ping.size, dtype=bool))
                along = np.where(present, cols["along_track"], 0.0)
                blat, blon = gsf.beam_positions(lat[multi], lon[multi], cols["heading"][multi],
                                                across[multi], along[multi],
                                                along_present=present[multi])
                lats.append(blat)
                lons.append(blon)
                across, along = across[multi], along[multi]
            # the pings between the samples, each with the wider swath of the two around it
            olat, olon = swath_outline(headers, far.usable, np.asarray(picks), beam_ping,
                                       across, along)
            lats.append(olat)
            lons.append(olon)
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
                out["extent"] = _extent(np.concatenate(lats), np.concatenate(lons))
    except GsfError as err:
        out["error"] = err.to_dict()
    except OSError as err:
        out["error"] = GsfError(f"cannot read file: {err.strerror or err}", path=path).to_dict()
    return out


def _extent(lat: np.ndarray, lon: np.ndarray) -> list[float] | None:
    """:func:`extent_of` of the positions, from their corners alone when every longitude
    lies in [-180, 180) within less than half a turn: the shortest arc holding them is then
    [min, max] (the largest gap, over 180 degrees, is the one across the meridian opposite),
    which :func:`extent_of` finds from those two longitudes as from all of them."""
    fin = np.isfinite(lat) & np.isfinite(lon)
    if fin.all() and lat.size:
        lo_min, lo_max = lon.min(), lon.max()
        if -180.0 <= lo_min and lo_max < 180.0 and lo_max - lo_min < 180.0:
            return extent_of(np.array([lat.min(), lat.max()]), np.array([lo_min, lo_max]))
    return extent_of(lat, lon)


def area_from_scans(scans: list[dict], cfg: LoadConfig) -> BinGrid:
    """The bin grid: the user's MBR or polygon, else the union of the scanned extents."""
    kw = ({"bin_size_m": cfg.bin_size_m} if cfg.bin_size_deg is None
          else {"x_bin_deg": cfg.bin_size_deg[0], "y_bin_deg": cfg.bin_size_deg[1]})
    if cfg.polygon is not None:
        return BinGrid.from_polygon(np.asarray(cfg.polygon, dtype=float), **kw)
    if cfg.mbr is not None:
        return BinGrid.from_mbr(*cfg.mbr, **kw)
    return automatic_grid(scans, cfg, **kw)


#: the most bins a load makes without ``force``: about 10 GB of bin records (2 m bins over
#: a deep-water survey made a 356 M-bin grid, a 14 GB sparse .bin, for 8 M soundings)
MAX_GRID_BINS = 250_000_000
#: under this many soundings per bin (estimated after the pre-scan) the load warns
SPARSE_SOUNDINGS_PER_BIN = 0.1


def _round_up_nicely(x: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``x``."""
    k = 10.0 ** np.floor(np.log10(x))
    return float(next(m * k for m in (1, 2, 2.5, 5, 10) if m * k >= x * (1 - 1e-9)))


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
                          f"or give --force to make it anyway{stretched_by(scans, cfg)}. "
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
