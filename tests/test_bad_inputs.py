"""Bad input mixed with good: the load completes, names each problem file with its reason and
byte offset, loads every good sounding, and exits 3; ``--strict`` refuses to start. Plus
``check`` on damaged PFMs, and a load-level hypothesis fuzz.

The corpus is made here from small synthetic surveys. References: a load of the good files
alone (itself checked against libgsf in tests/test_load.py), and a plain walk of the GSF
size words that says how many ping records lie wholly before a damage.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pfm_dask import pfm, pipeline, synth
from pfm_dask.config import LoadConfig
from pfm_dask.errors import LoadError

from .test_resume import pfm_cli

CFG = LoadConfig(bin_size_m=25.0)
COUNT_KEYS = ("pings_read", "soundings_read", "ping_skipped", "beam_rejected", "outside_area",
              "loaded", "depth_out_of_range", "invalid_by_gsf_flags", "flagged_swath_filter")


def ping_records(blob: bytes) -> list[tuple[int, int, int]]:
    """(start, header size, end) of each whole ping record, by a plain walk of the size words."""
    out, pos = [], 0
    while pos + 8 <= len(blob):
        size, word = struct.unpack_from(">II", blob, pos)
        hdr = 12 if word & 0x80000000 else 8
        end = pos + hdr + size
        if end > len(blob):
            break
        if word & 0x3FFFFF == 2:
            out.append((pos, hdr, end))
        pos = end
    return out


def whole_pings_before(blob: bytes, offset: int) -> int:
    return sum(1 for _, _, e in ping_records(blob) if e <= offset)


def counts(rec: dict) -> dict:
    return {k: rec[k] for k in COUNT_KEYS}


def accounted(rec: dict) -> bool:
    return rec["soundings_read"] == (rec["ping_skipped"] + rec["beam_rejected"]
                                     + rec["outside_area"] + rec["loaded"])


def load(files, out: Path, cfg=CFG, **kw):
    return pipeline.run_load([str(f) for f in files], out, cfg, mode="serial", **kw)


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """Three good files, and their load alone (the reference)."""
    root = tmp_path_factory.mktemp("good")
    synth.generate(root, files=3, pings=20, beams=32, seed=5)
    files = sorted(root.glob("*.gsf"))
    out = tmp_path_factory.mktemp("goodload") / "good.pfm"
    res = load(files, out)
    assert res.exit_code == 0
    dump = out.parent / "good.parquet"
    pfm.dump(out, soundings=dump)
    return files, res, out, pq.read_table(dump).to_pydict()


@pytest.fixture(scope="module")
def corpus(good, tmp_path_factory):
    """Damaged files made from the first good file: name -> (path, expected pings or None)."""
    files = good[0]
    src = files[0].read_bytes()
    recs = ping_records(src)
    d = tmp_path_factory.mktemp("bad")
    out = {}

    def put(name, data, pings=None):
        (d / name).write_bytes(data)
        out[name] = (d / name, pings)

    put("trunc_boundary.gsf", src[:recs[10][2]], pings=11)            # not damage: ends early
    cut = recs[10][0] + 40
    put("trunc_mid.gsf", src[:cut], pings=whole_pings_before(src, cut))
    b = bytearray(src)
    struct.pack_into(">I", b, recs[7][0], 0x7FFFFFF0)                 # corrupt size word
    put("bad_size.gsf", bytes(b), pings=7)
    b = bytearray(src)
    rng = np.random.default_rng(1)
    for k in rng.integers(recs[12][0] + 60, recs[12][2], 6):          # flipped bytes in a ping
        b[k] ^= 0xFF
    put("flipped.gsf", bytes(b))
    put("random.gsf", rng.integers(0, 256, 20000, dtype=np.uint8).tobytes())
    put("empty.gsf", b"")
    put("not_gsf.gsf", b"hello, this is not a GSF file\n" * 10)
    # unreadable: a symbolic link to itself (chmod 000 does not stop root)
    os.symlink("unreadable.gsf", d / "unreadable.gsf")
    out["unreadable.gsf"] = (d / "unreadable.gsf", None)
    # impossible positions (lat 95, lon 200, lat -95) and times (2**32-1 s with 2 s of
    # nanoseconds, and 0) in pings 4..6, 7 and 9 of an otherwise good file
    b = bytearray(src)
    for k, (lat, lon) in zip((3, 4, 5), ((95.0, 10.0), (10.0, 200.0), (-95.0, 10.0))):
        p, h, _ = recs[k]
        struct.pack_into(">ii", b, p + h + 8, int(lon * 1e7), int(lat * 1e7))
    struct.pack_into(">II", b, recs[6][0] + recs[6][1], 0xFFFFFFFF, 1_999_999_999)
    struct.pack_into(">II", b, recs[8][0] + recs[8][1], 0, 0)
    put("positions.gsf", bytes(b))
    # a good file that vanishes during the run
    shutil.copy(files[1], d / "vanishes.gsf")
    out["vanishes.gsf"] = (d / "vanishes.gsf", None)
    return out


DAMAGED = {"trunc_mid.gsf", "bad_size.gsf", "random.gsf", "empty.gsf", "not_gsf.gsf"}


def test_mixed_corpus_completes_reports_each_problem_and_loads_every_good_sounding(
        good, corpus, tmp_path):
    files, ref, _, ref_dump = good
    names = sorted(corpus)
    inputs = list(files) + [corpus[n][0] for n in names] + [files[0]]  # a duplicate path
    vanish = corpus["vanishes.gsf"][0]

    def progress(st):  # once the first piece is in the writer, the file disappears
        if st["watermark"] + st["backlog_batches"] >= 1 and vanish.exists():
            vanish.unlink()

    res = pipeline.run_load([str(f) for f in inputs], tmp_path / "mix.pfm", CFG, mode="serial",
                            progress=progress)
    assert res.exit_code == 3, res.summary()
    assert res.check["sound"], res.check
    by = {Path(f["path"]).name: f for f in res.files}
    # every file is accounted for, beam by beam
    assert all(accounted(f) for f in res.files)
    # the good files: exactly their soundings, counted as when loaded alone
    for f, r in zip(files, ref.files):
        assert counts(by[f.name]) == counts(r)
    # each problem file is named once, with its reason, and its byte offset where it has one
    text = "\n".join(res.problems)
    for n in DAMAGED:
        lines = [p for p in res.problems if f"/{n}" in p]
        assert len(lines) == 1, (n, res.problems)
        assert "at byte" in lines[0], lines[0]
    assert "unreadable.gsf" in text and "symbolic links" in text
    assert [p for p in res.problems if "vanishes.gsf" in p and "No such file" in p]
    assert "listed more than once" in text and files[0].name in text
    assert "flipped.gsf" not in text or "at byte" in text
    # damaged files: the whole pings before the damage are in (plain size-word walk)
    for n, (_, pings) in corpus.items():
        if pings is not None:
            assert by[n]["pings_read"] == pings, n
            assert by[n]["loaded"] > 0, n
    for n in ("random.gsf", "empty.gsf", "not_gsf.gsf", "unreadable.gsf", "vanishes.gsf"):
        assert by[n]["loaded"] == 0
    # impossible positions: pings 4 and 5 skipped, ping 6 (lat -95) outside the area, the
    # rest of the file exactly as the good original; impossible times change nothing
    pos = by["positions.gsf"]
    orig = ref.files[0]
    assert pos["ping_skipped"] == orig["ping_skipped"] + 2 * 32
    in_bad_pings = np.isin(np.asarray(ref_dump["ping"]), [4, 5, 6]) & (
        np.asarray(ref_dump["file"]) == 0)
    assert pos["loaded"] == orig["loaded"] - int(in_bad_pings.sum())
    # and they do not stretch the area
    assert res.grid == ref.grid


def test_depths_outside_the_range_are_loaded_invalid_and_counted(good, tmp_path):
    files, ref, _, ref_dump = good
    depth = np.asarray(ref_dump["depth"])
    limit = float(np.round(np.median(depth), 2)) + 0.005
    res = load(files, tmp_path / "d.pfm", LoadConfig(bin_size_m=25.0, max_depth=limit))
    assert res.exit_code == 0
    fnum = np.asarray(ref_dump["file"])
    for i, f in enumerate(res.files):
        assert f["depth_out_of_range"] == int(np.count_nonzero(depth[fnum == i] > limit))
        assert f["loaded"] == ref.files[i]["loaded"]


def test_strict_refuses_to_start_on_damage(good, corpus, tmp_path):
    files = good[0]
    out = tmp_path / "strict.pfm"
    bad = corpus["trunc_mid.gsf"][0]
    r = pfm_cli("load", files[1], bad, "-o", out, "--strict", "--serial", "--bin-size", "25")
    assert r.returncode == 1
    assert "--strict" in r.stderr and "trunc_mid.gsf at byte" in r.stderr
    assert not out.exists() and not Path(str(out) + ".data").exists()
    with pytest.raises(LoadError, match="not a GSF file"):
        load([files[1], corpus["not_gsf.gsf"][0]], out, strict=True)
    assert not out.exists()
    assert load(files, out, strict=True).exit_code == 0


# ------------------------------------------------------------------ check on damaged PFMs
def _copy(src: Path, dst: Path) -> Path:
    shutil.copy(src, dst)
    shutil.copytree(str(src) + ".data", str(dst) + ".data")
    for p in Path(str(dst) + ".data").iterdir():
        if p.name.startswith(src.name):
            p.rename(p.with_name(dst.name + p.name[len(src.name):]))
    return dst


def _part(p: Path, ext: str) -> Path:
    return Path(str(p) + ".data") / (p.name + ext)


def _flip(path: Path, offset: int, n: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        raw = bytearray(fh.read(n))
        fh.seek(offset)
        fh.write(bytes(x ^ 0xFF for x in raw))


DAMAGE = {
    "bin bytes": (".bin", lambda p: _flip(p, os.path.getsize(p) // 2, 64)),
    "ndx bytes": (".ndx", lambda p: _flip(p, os.path.getsize(p) // 3, 256)),
    "ndx truncated": (".ndx", lambda p: os.truncate(p, os.path.getsize(p) * 2 // 3 + 5)),
    "bin truncated": (".bin", lambda p: os.truncate(p, os.path.getsize(p) - 1000)),
    "cvg missing": (".cvg", lambda p: p.unlink()),
    "lin missing": (".lin", lambda p: p.unlink()),
    "ctl missing": (".ctl", lambda p: p.unlink()),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_check_names_the_problem_of_a_damaged_pfm(good, tmp_path, kind):
    ext, damage = DAMAGE[kind]
    p = _copy(good[2], tmp_path / "dmg.pfm")
    assert pfm.check(p) == []
    damage(_part(p, ext))
    problems = [str(x) for x in pfm.check(p)]
    assert problems, kind
    assert any(x.startswith(ext) or ext in x for x in problems), (kind, problems[:5])
    if kind.endswith("missing"):
        assert any("missing" in x for x in problems)


# ------------------------------------------------------------------ fuzz
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(op=st.sampled_from(["truncate", "flip", "splice", "size"]),
       where=st.floats(0.0, 1.0), n=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_fuzzed_input_never_breaks_a_load(good, tmp_path_factory, op, where, n, seed):
    files, ref, _, _ = good
    src = bytearray(files[0].read_bytes())
    rng = np.random.default_rng(seed)
    at = int(where * (len(src) - 1))
    if op == "truncate":
        data = bytes(src[:at])
    elif op == "flip":
        for k in rng.integers(0, len(src), n):
            src[k] ^= int(rng.integers(1, 256))
        data = bytes(src)
    elif op == "splice":
        data = bytes(src[:at]) + rng.integers(0, 256, n, dtype=np.uint8).tobytes() + bytes(src[at:])
    else:
        recs = ping_records(bytes(src))
        p = recs[int(where * (len(recs) - 1))][0]
        struct.pack_into(">I", src, p, int(rng.integers(0, 2**32)))
        data = bytes(src)
    tmp = tmp_path_factory.mktemp("fuzz")
    bad = tmp / "fuzzed.gsf"
    bad.write_bytes(data)
    # the area is given: a flipped position must not make the grid enormous
    g = ref.grid
    cfg = LoadConfig(bin_size_m=25.0, mbr=(g["min_y"], g["min_x"], g["max_y"], g["max_x"]))
    res = load([bad, files[1]], tmp / "f.pfm", cfg)
    assert res.check["sound"], res.check["problems"][:5]
    assert res.exit_code in (0, 3), res.summary()
    assert all(accounted(f) for f in res.files)
    assert counts(res.files[1]) == counts(ref.files[1])
