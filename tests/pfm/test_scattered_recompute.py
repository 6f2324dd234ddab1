"""A few bins scattered over a fine grid are recomputed from their records read where they are
(pfm._recompute.scattered) with the same bytes and extrema as the pass over the sparse .bin's
data runs that finds them itself."""

from __future__ import annotations

import os
import shutil

import numpy as np

from pfm_dask import pfm as P
from pfm_dask.bins import BinGrid
from pfm_dask.pfm._recompute import scattered

PARTS = ("ctl", "lin", "bin", "ndx", "cvg")


def _build(path: str) -> np.ndarray:
    """A 2 m grid of about 1.4 M bins with some 3,000 soundings on one bin in 400; its bins."""
    grid = BinGrid.from_mbr(30.0, -80.0, 30.02, -79.98, bin_size_m=2.0)
    rng = np.random.default_rng(7)
    n_bins = grid.width * grid.height
    b = np.sort(rng.integers(0, n_bins, n_bins // 400))
    b = np.sort(np.concatenate([b, b[:40]]))      # some bins get two soundings
    n = b.size
    f = P.create(path, grid)
    f.add_files(["a.gsf"])
    f.add_lines(["a-1"])
    f.add_sorted(b, np.zeros(n, np.uint32), np.zeros(n, np.uint32),
                 rng.integers(1, 1000, n).astype(np.uint32), rng.integers(1, 200, n).astype(np.uint16),
                 np.round(rng.uniform(3000.0, 4000.0, n), 2), rng.integers(0, 4096, n).astype(np.uint16),
                 rng.integers(0, 4096, n).astype(np.uint16),
                 rng.choice(np.array([64, 66, 2 | 4096 | 64], dtype=np.uint32), n),
                 np.full(n, 1.5, np.float32), np.full(n, 0.5, np.float32))
    f.close()
    return np.unique(b)


def _copy(src: str, dst: str) -> None:
    shutil.copy(src, dst)
    os.makedirs(dst + ".data")
    for ext in PARTS:
        shutil.copy(f"{src}.data/{os.path.basename(src)}.{ext}",
                    f"{dst}.data/{os.path.basename(dst)}.{ext}")


def _no_run_scan(*args, **kwargs):
    raise AssertionError("the scattered bins were found by scanning the .bin's data runs")


def test_scattered_bins_recompute_to_the_same_bytes(tmp_path):
    a = os.fspath(tmp_path / "a" / "s.pfm")
    b = os.fspath(tmp_path / "b" / "s.pfm")
    os.makedirs(os.path.dirname(a))
    os.makedirs(os.path.dirname(b))
    bins = _build(a)
    _copy(a, b)
    with P.open_pfm(a, "r+") as f:
        assert scattered(bins.size, f.width * f.height)
        whole = P.recompute(f, None)
        f.write_header(**whole)
    with P.open_pfm(b, "r+") as f:
        f.raw_records_with_data = _no_run_scan
        listed = P.recompute(f, bins)
        f.write_header(**listed)
    assert listed == whole
    for ext in PARTS:
        with open(f"{a}.data/s.pfm.{ext}", "rb") as x, open(f"{b}.data/s.pfm.{ext}", "rb") as y:
            assert x.read() == y.read(), ext
