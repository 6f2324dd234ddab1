"""The Pfm_loader experiment's inputs: five loads of 7, 12, 24, 48 and 74 EM302-like GSF files.

NAVO's parallel Pfm_loader was timed on loads of 7, 12, 24, 48 and 74 GSF files. We build one
synthetic survey of 74 lines (``pfm_dask.synth``: 432 beams, deep water, one file per line) and
take the first N lines as the N-file load, so the five loads are nested and only the largest is
ever generated. The file size (pings per file) is a parameter; by default the 74-file load is
just over 2 GB. Surveys are cached under ``benchmarks/_data/`` and reused while their
``survey.json`` and file sizes match.

    python -m benchmarks.datasets [--gb 2.0 | --pings N]    # build (or find) the survey
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import time
from pathlib import Path

from ._report import DATA_DIR, cached_survey

__all__ = ["LOADS", "PING_BYTES", "DEFAULT_GB", "pings_for", "survey", "load_files"]

LOADS = (7, 12, 24, 48, 74)  #: file counts of the seed's loads
PING_BYTES = 8320            #: bytes of one 432-beam synthetic ping record (measured)
DEFAULT_GB = 2.0             #: size of the largest (74-file) load by default
BEAMS = 432
SEED = 302


def pings_for(gb: float, files: int = LOADS[-1]) -> int:
    """Pings per file so that ``files`` files hold at least ``gb`` gigabytes."""
    return max(4, math.ceil(gb * 1e9 / PING_BYTES / files))


def survey(pings: int, *, files: int = LOADS[-1], seed: int = SEED,
           data_dir: str | os.PathLike = DATA_DIR, quiet: bool = False) -> Path:
    """The cached survey of ``files`` lines × ``pings`` pings (generated on first use)."""
    out = Path(data_dir) / f"pfmloader_{files}x{pings}x{BEAMS}_s{seed}"
    if cached_survey(out, files, pings, BEAMS, seed) is None:
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        if not quiet:
            print(f"generating {files} files x {pings} pings in {out} ...", flush=True)
        from pfm_dask import synth

        s = synth.generate(out, files=files, pings=pings, beams=BEAMS, seed=seed,
                           workers=min(2, os.cpu_count() or 1))
        if not quiet:
            print(f"  {s['bytes'] / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s", flush=True)
    return out


def load_files(folder: Path, n: int) -> list[Path]:
    """The first ``n`` lines of a survey (GSF files in line order): the n-file load."""
    meta = json.loads((Path(folder) / "survey.json").read_text())
    names = [f["name"] for f in meta["files"]]
    if n > len(names):
        raise ValueError(f"the survey in {folder} has {len(names)} files, not {n}")
    return [Path(folder) / name for name in names[:n]]


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.datasets",
                                 description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--gb", type=float, default=DEFAULT_GB, help="size of the 74-file load")
    g.add_argument("--pings", type=int, help="pings per file (overrides --gb)")
    a = ap.parse_args(argv)
    folder = survey(a.pings or pings_for(a.gb))
    for n in LOADS:
        paths = load_files(folder, n)
        print(f"{n:3d} files: {sum(p.stat().st_size for p in paths) / 1e9:6.2f} GB")
    return folder


if __name__ == "__main__":
    main()
