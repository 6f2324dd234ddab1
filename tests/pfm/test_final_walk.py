"""The load's final step walks the chains once: the recompute's walk stands for the check's.

``recompute(..., walk=w)`` fills a :class:`ChainWalk` in the same pass that rewrites the
bins, and ``check(..., walked=w)`` then skips its own chain walk. The references are the
check alone (``check(path)``, which walks everything itself) on the same bytes: with the
walk it must give the same problems, in the same order, on sound and damaged PFMs, damage
planted before the recompute (the recompute's walk must notice it or leave the check to)
or after it (coverage, orphans, lists: what the check still reads itself).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from pfm_dask import pfm as P
from pfm_dask.errors import PfmDaskError
from pfm_dask.pfm import _check, _check_band, _recompute
from pfm_dask.pfm._chains import ChainWalk

from .test_check import BinFile, part
from .test_final_step_speed import _copy, damage
from .test_recompute import build_pfm


@pytest.fixture(scope="module")
def sound(tmp_path_factory):
    d = tmp_path_factory.mktemp("walk")
    path, _, _ = build_pfm(d, seed=43, n=1500, batches=3, heavy=45)
    return path


def _copy_t(sound, d):
    """A copy of ``sound`` under ``d`` (its parts keep their name: ``t.pfm``)."""
    d.mkdir(parents=True, exist_ok=True)
    return _copy(sound, os.fspath(d / "t.pfm"))


def _final_step(path, threads=1, band=None):
    """The writer's final step on ``path``: recompute with the walk, header, check with it."""
    w = ChainWalk()
    kw = {} if band is None else {"band_soundings": band}
    try:
        with P.open_pfm(path, "r+") as f:
            f.write_header(**P.recompute(f, None, threads=threads, walk=w, **kw))
    except PfmDaskError:
        assert not w.clean       # a recompute that stops leaves nothing for the check
    return w, P.check(path, threads=threads, walked=w)


@pytest.mark.parametrize("threads,band", [(1, None), (2, None), (2, 37), (3, 11)])
def test_a_sound_pfm_is_walked_once(sound, tmp_path, monkeypatch, threads, band):
    p = _copy_t(sound, tmp_path)
    calls = []
    for name in ("_fast_band", "_walk_band"):
        orig = getattr(_check, name)
        monkeypatch.setattr(_check, name, lambda *a, _o=orig, _n=name: calls.append(_n) or _o(*a))
    w, got = _final_step(p, threads, band)
    assert w.clean and got == []
    assert calls == [], "the check walked chains the recompute had walked"
    # the recompute's visited map is the check's: every record of the .ndx reached once
    assert w.n_phys and np.unpackbits(w.bits, bitorder="little")[: w.n_phys].all()
    monkeypatch.undo()
    assert P.check(p, threads=1) == []


@pytest.mark.parametrize("seed,many", [(0, False), (1, False), (2, True), (3, False),
                                       (4, True), (5, False), (6, False), (8, False)])
def test_damage_before_the_recompute_gives_the_checks_problems(sound, tmp_path, seed, many):
    p = _copy_t(sound, tmp_path)
    damage(p, seed, many)
    w, got = _final_step(p, threads=2)
    assert got == P.check(p, threads=1)


def test_a_shared_record_spoils_the_walk(sound, tmp_path):
    p = _copy_t(sound, tmp_path)
    bf = BinFile(p)
    (c1, r1), (c2, r2) = bf.bins_with()[:2]
    for k in ("count", "head", "tail"):
        bf.set(c2, r2, k, bf.get(c1, r1, k))
    w, got = _final_step(p)
    assert not w.clean
    assert any("another bin" in x.what for x in got), got
    assert got == P.check(p, threads=1)


@pytest.mark.parametrize("what", ["orphan", "cvg", "ctl", "lin", "extrema"])
def test_damage_after_the_recompute_is_still_found(sound, tmp_path, what):
    """What the check reads itself, changed between the recompute and the check."""
    p = _copy_t(sound, tmp_path)
    w = ChainWalk()
    with P.open_pfm(p, "r+") as f:
        f.write_header(**P.recompute(f, None, threads=2, walk=w))
    assert w.clean
    bf = BinFile(p)
    c, r = bf.bins_with()[0]
    if what == "orphan":
        with open(part(p, "ndx"), "ab") as fh:
            fh.write(bytes(os.path.getsize(part(p, "ndx")) // w.n_phys))
    elif what == "cvg":
        with open(part(p, "cvg"), "r+b") as fh:
            fh.seek(65536 + r * bf.h.bin_width + c)
            fh.write(bytes([0]))
    elif what == "ctl":        # a file the soundings name is no longer listed
        lines = open(part(p, "ctl"), "rb").read().split(b"\n")
        open(part(p, "ctl"), "wb").write(b"\n".join(lines[:6] + [b""]))
    elif what == "lin":
        lines = open(part(p, "lin"), "rb").read().split(b"\n")
        open(part(p, "lin"), "wb").write(b"\n".join(lines[:1] + [b""]))
    else:       # (a bin's statistic is not re-derived: the same pass wrote it)
        with P.open_pfm(p, "r+") as f:
            f.write_header(max_depth=float(f.header.max_depth) + 10.0)
    want = P.check(p, threads=1)
    assert want, "the damage must be found"
    for threads in (1, 2):
        assert P.check(p, threads=threads, walked=w) == want


def test_the_general_path_leaves_the_walk_to_the_check(sound, tmp_path, monkeypatch):
    """Bands the compiled pass does not take (here: all of them) are not walked for the check."""
    p = _copy_t(sound, tmp_path)
    monkeypatch.setattr(_recompute, "FUSED", False)
    w, got = _final_step(p, threads=2)
    assert not w.clean and got == []


def test_a_subset_recompute_does_not_walk_for_the_check(sound, tmp_path):
    p = _copy_t(sound, tmp_path)
    w = ChainWalk()
    with P.open_pfm(p, "r+") as f:
        P.recompute(f, np.array([0, 1, 2]), walk=w)
    assert not w.clean


def test_the_check_without_the_walk_is_unchanged(monkeypatch, sound):
    """``walked`` not clean: the check runs exactly as without it."""
    assert not ChainWalk().clean
    assert P.check(sound, walked=ChainWalk()) == P.check(sound) == []
    assert _check_band._FAST_WALK


def test_the_compiled_band_summary_equals_the_numpy_path(sound, tmp_path, monkeypatch):
    """A walked band with nothing to report is checked in one compiled pass
    (``_check_kernel.walked_summary``): its header extrema candidates, band by band,
    are those of the numpy path; a band whose coverage byte disagrees with its bin goes to
    the numpy path, which reports it."""
    p = _copy_t(sound, tmp_path)
    fast, slow = [], []
    real_ws, real_ec = _check_band.walked_summary, _check_band.extrema_candidates

    def both(*a, **k):
        fast.append(real_ws(*a, **k))
        return None                       # so the numpy path runs on the band as well

    def numpy_path(*a, **k):
        slow.append(real_ec(*a, **k))
        return slow[-1]

    monkeypatch.setattr(_check_band, "walked_summary", both)
    monkeypatch.setattr(_check_band, "extrema_candidates", numpy_path)
    w = ChainWalk()
    with P.open_pfm(p, "r+") as f:
        f.write_header(**P.recompute(f, None, threads=1, walk=w))
    got = P.check(p, threads=1, walked=w, band_soundings=37)      # many bands
    assert got == [] and len(fast) == len(slow) > 3
    for f, s in zip(fast, slow):
        assert f is not None
        want = [(key, x, b) for key, x, b, _, _ in s] if s else []
        assert [(_check_band._EXTREMA_KEYS[k], v, b) for k, v, b in f] == want
    monkeypatch.undo()
    # a coverage byte flipped after the recompute: the same problem as the full check's
    w = ChainWalk()
    with P.open_pfm(p, "r+") as f:
        f.write_header(**P.recompute(f, None, threads=2, walk=w))
    h = P.open_pfm(p).header
    with open(part(p, "cvg"), "r+b") as fh:
        fh.seek(os.path.getsize(part(p, "cvg")) - h.bin_width * h.bin_height // 2)
        b = fh.read(1)[0]
        fh.seek(-1, 1)
        fh.write(bytes([b ^ 0x80]))
    got = P.check(p, threads=2, walked=w)
    assert got and got == P.check(p, threads=1)
