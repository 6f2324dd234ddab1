"""Beam placement: the per-ping expansion against pfmLoader's two NGS moves per beam, one run.

``gsf.beam_positions`` (the expansion, what a load runs) and ``gsf.beam_positions_reference``
(two NGS direct geodesics per beam, as pfmLoader and the previous placement computed them) place
the same beams in the same process, alternating, ``--runs`` times each; the CPU time of the
calling thread (one core) gives ns per sounding, best and median, and their ratio.

Beams: a synthetic EM302-like survey (``pfm_dask.synth``, 432 beams a ping, ``--files`` x
``--pings``, cached in ``benchmarks/_data/``) and each real GSF sample (read in place from
``$PFM_DASK_GSF_SAMPLES``, default ``../shared/data/gsf`` beside the repository), handed over as
a load's task does: flat per-beam arrays of the beams of multi-beam pings.

Effect on the load: on the synthetic survey and on each sample, the largest distance between the
two placements, and how many soundings a load puts in another bin, at another offset code, or
outside the area, at 2, 25 and 50 m bins: each file is prepared as a task does
(``soundings.prepare_piece``) once with each placement, on the grid the load makes from the
pre-scan (``pipeline.area_from_scans``); ``grid_changes`` says whether the pre-scan with the
reference placement would have made another grid (a corner printed with 9 decimals rounding
the other way), and ``own_grid`` counts the changes end to end, each placement on its own grid.

    python -m benchmarks.bench_placement [--files 2] [--pings 2000] [--runs 7] [--quick]

``--quick`` (2 x 60 pings, 2 runs) checks that it works; results go to
``bench_placement_quick.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path

import numpy as np

from benchmarks._report import BENCH_DIR, DATA_DIR, cached_survey, write_results

BIN_SIZES = (2.0, 25.0, 50.0)


def samples_dir() -> Path:
    return Path(os.environ.get("PFM_DASK_GSF_SAMPLES", BENCH_DIR.parent.parent / "shared" / "data" / "gsf"))


def survey(files: int, pings: int, seed: int = 0, data_dir: Path = DATA_DIR) -> list[Path]:
    """The cached synthetic survey (generated on first use)."""
    from pfm_dask import synth

    out = Path(data_dir) / f"placement_{files}x{pings}x432_seed{seed}"
    meta = cached_survey(out, files, pings, 432, seed)
    if meta is None:
        synth.generate(out, files=files, pings=pings, beams=432, seed=seed)
        meta = cached_survey(out, files, pings, 432, seed)
    return [out / f["name"] for f in meta["files"]]


def beams(paths) -> dict:
    """The beams of the multi-beam pings of ``paths`` with a usable ping position, as flat
    arrays in file order (what a task hands to the placement)."""
    from pfm_dask import gsf
    from pfm_dask._arrays import runs

    cols = {k: [] for k in ("lat", "lon", "hdg", "across", "along", "present")}
    for p in paths:
        with gsf.GsfFile(str(p), strict=False) as f:
            t = f.read(0, f.n_pings)
        if t.num_rows == 0:
            continue
        ping = t.column("ping").to_numpy()
        _, _, per = runs(ping)
        lat = t.column("latitude").to_numpy()
        lon = t.column("longitude").to_numpy()
        keep = (np.repeat(per, per) > 1) & np.isfinite(lat) & np.isfinite(lon)
        along = t.column("along_track")
        for k, v in (("lat", lat), ("lon", lon), ("hdg", t.column("heading").to_numpy()),
                     ("across", t.column("across_track").fill_null(0.0).to_numpy()),
                     ("along", along.fill_null(0.0).to_numpy()),
                     ("present", along.is_valid().to_numpy(zero_copy_only=False))):
            cols[k].append(np.asarray(v)[keep])
    return {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in cols.items()}


def _miss_m(lat1, lon1, lat2, lon2) -> np.ndarray:
    """Distance (m) between nearby points, from the local radii of curvature."""
    a, e2 = 6378137.0, 6.69437999014e-3
    phi = np.radians(lat1)
    w = 1.0 - e2 * np.sin(phi) ** 2
    dlon = (lon2 - lon1 + 180.0) % 360.0 - 180.0
    return np.hypot(np.radians(lat2 - lat1) * a * (1.0 - e2) / w ** 1.5,
                    np.radians(dlon) * a / np.sqrt(w) * np.cos(phi))


def time_placement(b: dict, runs: int) -> dict:
    """ns per sounding of both placements on the beams ``b``, alternating, thread CPU time."""
    from pfm_dask.gsf import beam_positions, beam_positions_reference

    args = (b["lat"], b["lon"], b["hdg"], b["across"], b["along"])
    kw = {"along_present": b["present"]}
    n = b["lat"].size
    new = beam_positions(*args, **kw)                      # compile or load the kernels
    ref = beam_positions_reference(*args, **kw)
    t_new, t_ref = [], []
    for _ in range(runs):
        for fn, ts in ((beam_positions, t_new), (beam_positions_reference, t_ref)):
            c = time.thread_time()
            fn(*args, **kw)
            ts.append(time.thread_time() - c)
    miss = _miss_m(ref[0], ref[1], new[0], new[1])
    fin = np.isfinite(miss)
    out = {"soundings": int(n),
           "new_ns_per_sounding_best": 1e9 * min(t_new) / n,
           "new_ns_per_sounding_median": 1e9 * statistics.median(t_new) / n,
           "reference_ns_per_sounding_best": 1e9 * min(t_ref) / n,
           "reference_ns_per_sounding_median": 1e9 * statistics.median(t_ref) / n,
           "max_distance_mm": float(1e3 * miss[fin].max()) if fin.any() else 0.0,
           "p99_distance_mm": float(1e3 * np.quantile(miss[fin], 0.99)) if fin.any() else 0.0}
    out["speedup_best"] = out["reference_ns_per_sounding_best"] / out["new_ns_per_sounding_best"]
    out["speedup_median"] = (out["reference_ns_per_sounding_median"]
                             / out["new_ns_per_sounding_median"])
    return out


@contextlib.contextmanager
def _reference_placement():
    """The load's placement swapped for the reference one (the load calls ``gsf.beam_positions``)."""
    from pfm_dask import gsf

    saved = gsf.beam_positions
    gsf.beam_positions = gsf.beam_positions_reference
    try:
        yield
    finally:
        gsf.beam_positions = saved


def bin_changes(paths, bin_sizes=BIN_SIZES) -> dict:
    """Soundings a load puts elsewhere with the reference placement instead of the expansion.

    ``same_grid``: both placements binned on the grid the load makes (from the pre-scan with
    the expansion). ``own_grid``: each on the grid its own pre-scan makes, end to end; the
    grids differ (``grid_changes``) when a corner, printed with 9 decimals, rounds the other
    way. ``grid_fields`` lists the header values that differ then, with both values.
    """
    from pfm_dask import pipeline

    scans = [pipeline.prescan_file(str(p)) for p in paths]
    with _reference_placement():
        scans_ref = [pipeline.prescan_file(str(p)) for p in paths]
    out = {}
    for size in bin_sizes:
        from pfm_dask.config import LoadConfig

        cfg = LoadConfig(bin_size_m=size)
        grid = pipeline.area_from_scans(scans, cfg)
        grid_ref = pipeline.area_from_scans(scans_ref, cfg)
        new = [_prepare(p, i, grid, cfg) for i, p in enumerate(paths)]
        with _reference_placement():
            ref = [_prepare(p, i, grid, cfg) for i, p in enumerate(paths)]
            ref_own = ref if grid_ref == grid else [_prepare(p, i, grid_ref, cfg)
                                                    for i, p in enumerate(paths)]
        fields = {k: [getattr(grid_ref, k), getattr(grid, k)]
                  for k in ("min_x", "min_y", "max_x", "max_y", "x_bin", "y_bin", "width", "height")
                  if getattr(grid_ref, k) != getattr(grid, k)}
        out[f"{size:g}m"] = {"same_grid": _compare(new, ref), "own_grid": _compare(new, ref_own),
                             "grid_changes": grid != grid_ref, "grid_fields": fields}
    return out


def _prepare(path, i, grid, cfg):
    from pfm_dask import soundings

    piece = soundings.Piece(seq=i, file_number=i, path=str(path))
    return soundings.prepare_piece(piece, grid, cfg).batch


def _compare(new_batches, ref_batches) -> dict:
    res = {"soundings": 0, "other_bin": 0, "other_offset_code": 0, "inside_only_one": 0}
    for new, ref in zip(new_batches, ref_batches):
        kn, kr = (_by_sounding(x) for x in (new, ref))
        common, i_n, i_r = np.intersect1d(kn["key"], kr["key"], return_indices=True)
        res["soundings"] += int(kr["key"].size)
        res["inside_only_one"] += int(kn["key"].size + kr["key"].size - 2 * common.size)
        res["other_bin"] += int(np.count_nonzero(kn["bin"][i_n] != kr["bin"][i_r]))
        res["other_offset_code"] += int(np.count_nonzero((kn["x"][i_n] != kr["x"][i_r])
                                                         | (kn["y"][i_n] != kr["y"][i_r])))
    return res


def _by_sounding(batch) -> dict:
    ping = batch.column("ping").to_numpy().astype(np.int64)
    beam = batch.column("beam").to_numpy().astype(np.int64)
    return {"key": ping * 65536 + beam, "bin": batch.column("bin_index").to_numpy(),
            "x": batch.column("x_off").to_numpy(), "y": batch.column("y_off").to_numpy()}


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_placement",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--pings", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="tiny survey, 2 runs")
    ap.add_argument("--results-dir", default=None)
    ap.add_argument("--data-dir", default=str(DATA_DIR))
    a = ap.parse_args(argv)
    if a.quick:
        a.files, a.pings, a.runs = 2, 60, 2
    paths = survey(a.files, a.pings, data_dir=Path(a.data_dir))
    results = {"parameters": {"files": a.files, "pings": a.pings, "beams": 432, "runs": a.runs,
                              "clock": "thread CPU time (one core)"},
               "synthetic": {"timing": time_placement(beams(paths), a.runs),
                             "bins": bin_changes(paths)},
               "samples": {}}
    sdir = samples_dir()
    for p in sorted(sdir.glob("*.mb121")) if sdir.is_dir() else []:
        b = beams([p])
        if b["lat"].size == 0:
            results["samples"][p.name] = {"soundings": 0}
            continue
        results["samples"][p.name] = {"timing": time_placement(b, a.runs), "bins": bin_changes([p])}
    syn = results["synthetic"]["timing"]
    results["new_ns_per_sounding"] = syn["new_ns_per_sounding_best"]
    results["reference_ns_per_sounding"] = syn["reference_ns_per_sounding_best"]
    results["speedup"] = syn["speedup_best"]
    name = "bench_placement_quick" if a.quick else "bench_placement"
    return write_results(name, results, results_dir=a.results_dir)


if __name__ == "__main__":
    main()
