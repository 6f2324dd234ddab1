"""The final step skips the holes of the sparse .bin and .cvg and decodes no empty record.

Every answer is compared with the same PFM copied densely (the holes written out as zero
bytes, so that the file system reports no hole and every record is read): the recompute must
leave the same bytes and return the same extrema, the check must report the same problems in
the same order, for sound files and for damage planted where the files are otherwise holes.
The helpers (``nonzero_records``, ``data_extents``) are compared with plain numpy and with the
bytes written.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from pfm_dask import pfm as P
from pfm_dask.bins import BinGrid
from pfm_dask.pfm import _sparse
from pfm_dask.pfm import validity as V
from pfm_dask.pfm._sparse import (data_extents, gather_runs, merge_runs, nonzero_records,
                                  positions_to_items, record_runs, subtract_runs)

NAME = "s.pfm"
PARTS = ("ctl", "lin", "bin", "ndx", "cvg")


def _part(path, ext):
    return f"{path}.data/{NAME}.{ext}"


def _holes_supported(path) -> bool:
    """Does the file system report the holes of a sparse file here?"""
    probe = os.path.join(os.path.dirname(path), ".probe")
    fd = os.open(probe, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, 16 << 20)
        os.pwrite(fd, b"x", 8 << 20)
        return os.lseek(fd, 0, os.SEEK_DATA) > 0
    except OSError:
        return False
    finally:
        os.close(fd)
        os.remove(probe)


def _build(tmp_path, *, seed=0, recomputed=True):
    """A sparse PFM: a grid of about 1.4 M bins at 2 m with soundings in three small patches."""
    os.makedirs(tmp_path, exist_ok=True)
    grid = BinGrid.from_mbr(30.0, -80.0, 30.02, -79.98, bin_size_m=2.0)
    W, H = grid.width, grid.height
    rng = np.random.default_rng(seed)
    patches = [(5, 40, 30, 90), (H // 2, H // 2 + 6, W - 50, W), (H - 3, H, 0, 25)]
    bins = []
    for r0, r1, c0, c1 in patches:
        n = (r1 - r0) * (c1 - c0) // 2
        bins.append(rng.integers(r0, r1, n) * W + rng.integers(c0, c1, n))
    b = np.sort(np.concatenate(bins + [bins[0][:50]]))   # some bins get several soundings
    n = b.size
    path = os.fspath(tmp_path / NAME)
    f = P.create(path, grid)
    f.add_files(["a.gsf", "b.gsf"])
    f.add_lines(["a-1", "b-1", "b-2"])
    f.add_sorted(b, rng.integers(0, 2, n).astype(np.uint32), rng.integers(0, 3, n).astype(np.uint32),
                 rng.integers(1, 1000, n).astype(np.uint32), rng.integers(1, 200, n).astype(np.uint16),
                 np.round(rng.uniform(3000.0, 4000.0, n), 2), rng.integers(0, 4096, n).astype(np.uint16),
                 rng.integers(0, 4096, n).astype(np.uint16),
                 rng.choice(np.array([64, 64, 66, 2 | 4096 | 64], dtype=np.uint32), n),
                 np.full(n, 1.5, np.float32), np.full(n, 0.5, np.float32))
    if recomputed:
        f.write_header(**P.recompute(f))
    f.close()
    return path


def _copy(src, dst_dir, *, holes: bool) -> str:
    """The PFM at ``src`` copied into ``dst_dir``: with ``holes``, its all-zero 4 KiB blocks are
    left as holes; without, every byte is written (the file system then reports no hole)."""
    os.makedirs(dst_dir + "/" + NAME + ".data", exist_ok=True)
    dst = os.path.join(dst_dir, NAME)
    with open(src, "rb") as a, open(dst, "wb") as b:
        b.write(a.read())
    for ext in PARTS:
        size = os.path.getsize(_part(src, ext))
        fd = os.open(_part(dst, ext), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            with open(_part(src, ext), "rb") as a:
                for off in range(0, size, 4096):
                    blk = a.read(4096)
                    if not holes or blk.count(0) != len(blk):
                        os.pwrite(fd, blk, off)
        finally:
            os.close(fd)
    return dst


def _dense_copy(src, dst_dir) -> str:
    return _copy(src, dst_dir, holes=False)


def _sparse_copy(src, dst_dir) -> str:
    return _copy(src, dst_dir, holes=True)


def _allocated(path, ext) -> int:
    return os.stat(_part(path, ext)).st_blocks * 512


def _bytes(path, ext) -> bytes:
    with open(_part(path, ext), "rb") as fh:
        return fh.read()


def _in_hole(path, ext, offset) -> bool:
    fd = os.open(_part(path, ext), os.O_RDONLY)
    try:
        return os.lseek(fd, offset, os.SEEK_DATA) > offset
    except OSError:
        return True     # no data after offset
    finally:
        os.close(fd)


@pytest.fixture(scope="module")
def sparse_sound(tmp_path_factory):
    d = tmp_path_factory.mktemp("sparse")
    path = _build(d)
    if not _holes_supported(path):
        pytest.skip("this file system does not report holes (SEEK_DATA)")
    return path


# --- helpers --------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 3, 8, 9, 27, 39, 64])
def test_nonzero_records_match_numpy(size):
    rng = np.random.default_rng(size)
    for n in (0, 1, 2, 7, 1000, 33333):
        recs = np.zeros((n, size), np.uint8)
        if n:
            k = rng.integers(0, n * size, max(1, n // 7))
            recs.reshape(-1)[k] = rng.integers(1, 256, k.size)
        for view in (recs, recs[1:], recs[:, :]):
            want = np.flatnonzero(view.any(axis=1)) if view.size else np.zeros(0, np.int64)
            assert np.array_equal(nonzero_records(view), want)
    full = np.full((100, size), 255, np.uint8)
    assert np.array_equal(nonzero_records(full), np.arange(100))


def test_merge_runs():
    runs = np.array([[5, 9], [0, 2], [2, 3], [8, 12], [20, 20], [30, 31]])
    assert merge_runs(runs).tolist() == [[0, 3], [5, 12], [30, 31]]
    assert merge_runs(np.zeros((0, 2), np.int64)).shape == (0, 2)


def test_subtract_and_gather_runs():
    rng = np.random.default_rng(1)
    n = 300
    for _ in range(200):
        masks = []
        for _k in range(2):
            m = np.zeros(n, bool)
            for _j in range(rng.integers(0, 7)):
                x = int(rng.integers(0, n))
                m[x: x + int(rng.integers(1, 40))] = True
            masks.append(m)
        runs = [np.stack([np.flatnonzero(np.diff(np.r_[0, m.astype(int)]) == 1),
                          np.flatnonzero(np.diff(np.r_[m.astype(int), 0]) == -1) + 1], axis=1)
                for m in masks]
        got = np.zeros(n, bool)
        for a, b in subtract_runs(*runs).tolist():
            got[a:b] = True
        assert np.array_equal(got, masks[0] & ~masks[1])
        # gathered into groups of at most 17 items, every item once, in order
        seen = []
        for lo, hi, at in gather_runs(runs[0], 17):
            assert int((hi - lo).sum()) <= 17
            seen += positions_to_items(np.arange(int((hi - lo).sum())), lo, at).tolist()
        assert seen == np.flatnonzero(masks[0]).tolist()


def test_data_extents_hold_every_written_byte(tmp_path, monkeypatch):
    p = os.fspath(tmp_path / "f")
    if not _holes_supported(p):
        pytest.skip("this file system does not report holes (SEEK_DATA)")
    size = 64 << 20
    rng = np.random.default_rng(3)
    where = np.sort(rng.integers(0, size - 10, 40))
    fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, size)
        for w in where.tolist():
            os.pwrite(fd, b"\x07" * 10, w)
        for lo, hi in ((0, size), (int(where[5]) + 3, int(where[30])), (size - 5, size)):
            ext = data_extents(fd, lo, hi, merge=0)
            assert (ext[:, 0] >= lo).all() and (ext[:, 1] <= hi).all()
            inside = np.zeros(hi - lo, bool)
            for a, b in ext.tolist():
                inside[a - lo: b - lo] = True
            data = np.frombuffer(os.pread(fd, hi - lo, lo), np.uint8)
            assert not data[~inside].any()            # outside the extents: zeros only
            if lo == 0 and hi == size:
                assert inside.sum() < size // 10      # and most of the file is skipped
        # record runs cover every record with a written byte
        runs = record_runs(fd, 100, 39, 0, (size - 100) // 39)
        data = np.frombuffer(os.pread(fd, size, 0), np.uint8)[100: 100 + (size - 100) // 39 * 39]
        has = np.flatnonzero(data.reshape(-1, 39).any(axis=1))
        covered = np.zeros((size - 100) // 39, bool)
        for a, b in runs.tolist():
            covered[a:b] = True
        assert covered[has].all()
        monkeypatch.setattr(_sparse, "SKIP_HOLES", False)
        assert data_extents(fd, 10, size).tolist() == [[10, size]]
    finally:
        os.close(fd)


# --- recompute ------------------------------------------------------------------------------

def test_the_test_file_is_sparse(sparse_sound):
    assert _allocated(sparse_sound, "bin") < os.path.getsize(_part(sparse_sound, "bin")) // 4
    assert P.check(sparse_sound) == []


@pytest.mark.parametrize("threads", [1, 2])
def test_recompute_sparse_equals_dense(tmp_path, threads, monkeypatch):
    src = _build(tmp_path / "src", seed=5, recomputed=False)
    if not _holes_supported(src):
        pytest.skip("this file system does not report holes (SEEK_DATA)")
    sparse = _sparse_copy(src, os.fspath(tmp_path / "sparse"))
    dense = _dense_copy(src, os.fspath(tmp_path / "dense"))
    assert _allocated(sparse, "bin") < _allocated(dense, "bin") // 4
    got = {}
    for name, path, skip in (("sparse", sparse, True), ("dense", dense, True),
                             ("read-all", _sparse_copy(src, os.fspath(tmp_path / "all")), False)):
        monkeypatch.setattr(_sparse, "SKIP_HOLES", skip)
        with P.open_pfm(path, "r+") as f:
            ext = P.recompute(f, threads=threads, band_soundings=97)
            f.write_header(**ext)
            some = np.unique(f.read_soundings(0, f.height // 2, fields=("bin_index",))["bin_index"])
            sub = P.recompute(f, some[::3], threads=threads, clear_mask=V.CHECKED)
            every = f.compute_extrema()
        got[name] = (ext, sub, every, _bytes(path, "bin"), _bytes(path, "cvg"))
    assert got["sparse"] == got["dense"] == got["read-all"]


# --- check ----------------------------------------------------------------------------------

def _bin_layout(path):
    with P.open_pfm(path) as f:
        return f.width, f.height, f.bin_header_size, f.bin_record_size


def _damage(path, kind):
    """Plant damage ``kind`` where the .bin (and, but for 'cvg next to data', the .cvg) is a
    hole; returns (part, offset) of the byte changed."""
    W, H, hs, bs = _bin_layout(path)
    empty = (H // 3 + 9 * KINDS.index(kind)) * W + W // 2    # far from the three patches
    if kind == "byte in an empty record":
        off, ext, val = hs + empty * bs + bs - 1, "bin", b"\x10"
    elif kind == "count in an empty record":
        off, ext, val = hs + empty * bs, "bin", b"\x80"
    elif kind == "coverage of an empty bin":
        off, ext, val = 65536 + empty, "cvg", bytes([V.COV_DATA | V.COV_SURVEYED])
    elif kind == "checked flag of an empty bin":
        off, ext, val = 65536 + empty + 7, "cvg", bytes([V.COV_CHECKED])
    elif kind == "cvg next to data":
        # a bin after the first patch: its coverage block holds data, its record is a hole
        with P.open_pfm(path) as f:
            has = f.read_bin_records(0, 45, fields=("num_soundings",))
        last = int(has["bin_index"][has["num_soundings"] > 0].max())
        b = last + 4096 // bs * 3 + 1
        off, ext, val = 65536 + b, "cvg", bytes([V.COV_VERIFIED])
        assert not _in_hole(path, "cvg", off) and _in_hole(path, "bin", hs + b * bs)
        with open(_part(path, ext), "r+b") as fh:
            fh.seek(off)
            fh.write(val)
        return ext, off
    else:
        raise AssertionError(kind)
    assert _in_hole(path, ext, off)
    with open(_part(path, ext), "r+b") as fh:
        fh.seek(off)
        fh.write(val)
    return ext, off


KINDS = ["byte in an empty record", "count in an empty record", "coverage of an empty bin",
         "checked flag of an empty bin", "cvg next to data"]


@pytest.mark.parametrize("kind", KINDS)
def test_check_finds_damage_in_sparse_regions(sparse_sound, tmp_path, kind):
    sparse = _sparse_copy(sparse_sound, os.fspath(tmp_path / "sparse"))
    _damage(sparse, kind)
    dense = _dense_copy(sparse, os.fspath(tmp_path / "dense"))
    assert _allocated(sparse, "bin") < _allocated(dense, "bin") // 4
    found = P.check(sparse)
    assert found, kind
    assert found == P.check(dense)
    for threads, band in ((1, None), (2, 50), (2, 10**9)):
        assert P.check(sparse, threads=threads, band_soundings=band) == found
    part = {"byte in an empty record": ".bin", "count in an empty record": ".bin"}.get(kind, ".cvg")
    assert any(p.part == part for p in found), found


def test_check_reports_sparse_damage_like_the_read_all_path(sparse_sound, tmp_path, monkeypatch):
    """All the damage at once: the same problems, holes skipped or not (listed band by band,
    so in another order where the bands differ: a band lists its chain problems first)."""
    sparse = _sparse_copy(sparse_sound, os.fspath(tmp_path / "sparse"))
    for kind in KINDS:
        _damage(sparse, kind)
    found = P.check(sparse, threads=2)
    assert len(found) >= len(KINDS)
    want = sorted(map(str, found))
    dense = _dense_copy(sparse, os.fspath(tmp_path / "dense"))
    assert sorted(map(str, P.check(dense, threads=2))) == want
    monkeypatch.setattr(_sparse, "SKIP_HOLES", False)
    assert sorted(map(str, P.check(sparse, threads=2))) == want
    assert sorted(map(str, P.check(sparse, threads=1, band_soundings=7))) == want
