"""``check(..., only=bins)``, the load's final check when it wrote a few bins of a fine grid:
damage planted in a bin it reads, or found by its other passes (coverage of the other bins,
orphans, header), is reported exactly as the full check reports it; a record outside
``only`` is not read (``pfm-dask check`` reads it). The damage is made with test_check's
byte-level helpers, independent of the library code."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pfm_dask import pfm as P
from pfm_dask.pfm import validity as V
from pfm_dask.pfm import _check

from .test_check import (BinFile, copy_pfm, get_continuation, has_problem, header, ndx_record,
                         part, set_continuation)
from .test_recompute import build_pfm


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    path, _, _ = build_pfm(tmp_path_factory.mktemp("only"), seed=11, batches=2, heavy=25,
                           lat_fraction=0.7)
    return path


def _touched(path) -> np.ndarray:
    """The bins with soundings (what a new load wrote), from the bytes."""
    bf = BinFile(path)
    return np.array(sorted(r * bf.h.bin_width + c for c, r in bf.bins_with()), dtype=np.int64)


def _stale(path, bf):
    c, r = bf.bins_with(min_count=3)[0]
    bf.set(c, r, "avg_filtered", bf.get(c, r, "avg_filtered") + 50)
    bf.set(c, r, "num_valid", bf.get(c, r, "num_valid") + 1)
    return ".bin", "stale", (c, r)


def _validity(path, bf):
    c, r = bf.bins_with()[1]
    bf.set(c, r, "validity", bf.get(c, r, "validity") ^ V.SUSPECT)
    return ".bin", "validity", (c, r)


def _cycle(path, bf):
    c, r = bf.bins_with(min_count=3 * bf.h.record_length + 1)[0]
    head = bf.get(c, r, "head")
    set_continuation(path, bf.h, get_continuation(path, bf.h, head), head)
    return ".ndx", "cycle", (c, r)


def _count(path, bf):
    c, r = bf.bins_with(min_count=2 * bf.h.record_length + 1)[0]
    bf.set(c, r, "count", bf.get(c, r, "count") + bf.h.record_length)
    return ".ndx", "chain ends after", (c, r)


def _tail(path, bf):
    c, r = bf.bins_with(min_count=bf.h.record_length + 1)[0]
    bf.set(c, r, "tail", bf.get(c, r, "head"))
    return ".bin", "tail pointer", (c, r)


def _shared(path, bf):
    a = [b for b in bf.bins_with() if bf.get(*b, "count") <= bf.h.record_length]
    (c1, r1), (c2, r2) = a[0], a[1]
    for k in ("count", "head", "tail"):
        bf.set(c2, r2, k, bf.get(c1, r1, k))
    return ".ndx", "shared", (c2, r2)


def _coverage_touched(path, bf):
    c, r = bf.bins_with()[2]
    with open(part(path, "cvg"), "r+b") as fh:
        fh.seek(65536 + r * bf.h.bin_width + c)
        fh.write(bytes([0]))
    return ".cvg", "coverage byte", (c, r)


def _coverage_untouched(path, bf):
    c, r = next((c, r) for r in range(bf.h.bin_height) for c in range(bf.h.bin_width)
                if bf.get(c, r, "count") == 0)
    with open(part(path, "cvg"), "r+b") as fh:
        fh.seek(65536 + r * bf.h.bin_width + c)
        fh.write(bytes([V.COV_DATA | V.COV_SURVEYED]))
    return ".cvg", "coverage byte", (c, r)


def _orphan(path, bf):
    with open(part(path, "ndx"), "ab") as fh:
        fh.write(bytes(ndx_record(header(path))[2]))
    return ".ndx", "belong to no bin", None


def _extrema(path, bf):
    with P.open_pfm(path, "r+") as f:
        f.write_header(max_depth=5000.0)
    return "header", "[MAX DEPTH] = 5000", None


DAMAGE = [_stale, _validity, _cycle, _count, _tail, _shared, _coverage_touched,
          _coverage_untouched, _orphan, _extrema]


def test_a_sound_pfm_is_sound_either_way(sound):
    only = _touched(sound)
    assert 0 < only.size
    assert P.check(sound, only=only) == P.check(sound) == []


@pytest.mark.parametrize("damage", DAMAGE, ids=lambda f: f.__name__.strip("_"))
def test_damage_is_reported_as_the_full_check_reports_it(sound, tmp_path, damage):
    path = copy_pfm(sound, tmp_path / "copy")
    only = _touched(sound)         # the bins the load wrote, before the damage
    where_part, words, at = damage(path, BinFile(path))
    full = P.check(path)
    assert has_problem(full, where_part, words, *([f"({at[0]}, {at[1]})"] if at else [])), full
    for threads in (1, 2):
        assert P.check(path, only=only, threads=threads) == full, threads


def test_only_reads_those_bins_and_the_full_check_reads_the_rest(sound, tmp_path, monkeypatch):
    """Garbage in a record of a bin the load did not write: the load's check does not read it
    (nor scan the .bin's data runs); the full check (``pfm-dask check``) finds it."""
    path = copy_pfm(sound, tmp_path / "copy")
    bf = BinFile(path)
    c, r = next((c, r) for r in range(bf.h.bin_height) for c in range(bf.h.bin_width)
                if bf.get(c, r, "count") == 0)
    bf.set(c, r, "std", 12345)
    assert has_problem(P.check(path), ".bin", "count is 0", f"({c}, {r})")

    def no_scan(*args, **kwargs):
        raise AssertionError("the .bin's data runs were scanned")

    monkeypatch.setattr(_check, "record_runs", lambda fd, base, rsize, *a: (
        no_scan() if rsize != 1 else np.array([[0, os.fstat(fd).st_size - base]])))
    assert P.check(path, only=_touched(sound)) == []
