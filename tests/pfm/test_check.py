"""``check`` on sound PFMs and on deliberately damaged copies.

Each damage is made here by editing bytes at places computed by hand from the
header (bit offsets summed in the test, fields edited through Python integers),
and each must be named in the problem list with the right part; the CLI must
exit 1 on them and 0 on the sound file. Random damage must never make
``check`` raise anything but a PfmDaskError.
"""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from pfm_dask import pfm as P
from pfm_dask.cli import app
from pfm_dask.errors import PfmDaskError, PfmFormatError
from pfm_dask.pfm import validity as V
from pfm_dask.pfm._header import PfmHeader

from .test_recompute import build_pfm

NAME = "t.pfm"


# --- byte-level helpers (independent of the library code) ---------------------------

def part(path, ext):
    return f"{path}.data/{NAME}.{ext}"


def header(path) -> PfmHeader:
    with open(part(path, "bin"), "rb") as fh:
        return PfmHeader.parse(fh.read(131072))


def bin_fields(h: PfmHeader):
    """Bit offsets of the v7 bin record fields (no attributes), summed by hand."""
    widths = [("count", h.count_bits), ("std", h.std_bits)]
    widths += [(k, h.depth_bits) for k in ("avg_filtered", "min_filtered", "max_filtered",
                                          "avg", "min", "max")]
    widths += [("num_valid", h.count_bits), ("validity", h.validity_bits),
               ("head", h.record_pointer_bits), ("tail", h.record_pointer_bits)]
    pos, out = 0, {}
    for k, nb in widths:
        out[k] = (pos, nb)
        pos += nb
    return out, (pos + 7) // 8


def ndx_record(h: PfmHeader):
    """(bits per sounding, continuation bit offset, physical record bytes)."""
    per = (h.file_number_bits + h.line_number_bits + h.ping_number_bits + h.beam_number_bits
           + h.depth_bits + 2 * h.offset_bits + h.validity_bits + h.horizontal_error_bits
           + h.vertical_error_bits)
    cont = per * h.record_length
    return per, cont, (cont + h.record_pointer_bits + 7) // 8


def get_bits(buf: bytes, off: int, nb: int) -> int:
    v = int.from_bytes(buf, "big")
    return (v >> (len(buf) * 8 - off - nb)) & ((1 << nb) - 1)


def set_bits(buf: bytes, off: int, nb: int, value: int) -> bytes:
    total = len(buf) * 8
    v = int.from_bytes(buf, "big")
    sh = total - off - nb
    v = (v & ~(((1 << nb) - 1) << sh)) | ((value & ((1 << nb) - 1)) << sh)
    return v.to_bytes(len(buf), "big")


class BinFile:
    """Read and edit bin record fields of a PFM in place."""

    def __init__(self, path):
        self.path = path
        self.h = header(path)
        self.fields, self.size = bin_fields(self.h)

    def _addr(self, col, row):
        return self.h.bin_header_size + (row * self.h.bin_width + col) * self.size

    def get(self, col, row, key) -> int:
        with open(part(self.path, "bin"), "rb") as fh:
            fh.seek(self._addr(col, row))
            rec = fh.read(self.size)
        return get_bits(rec, *self.fields[key])

    def set(self, col, row, key, value) -> None:
        a = self._addr(col, row)
        with open(part(self.path, "bin"), "r+b") as fh:
            fh.seek(a)
            rec = fh.read(self.size)
            fh.seek(a)
            fh.write(set_bits(rec, *self.fields[key], value))

    def bins_with(self, min_count=1):
        out = []
        for r in range(self.h.bin_height):
            for c in range(self.h.bin_width):
                if self.get(c, r, "count") >= min_count:
                    out.append((c, r))
        return out


def set_continuation(path, h, addr, value):
    _, cont, size = ndx_record(h)
    with open(part(path, "ndx"), "r+b") as fh:
        fh.seek(addr)
        rec = fh.read(size)
        fh.seek(addr)
        fh.write(set_bits(rec, cont, h.record_pointer_bits, value))


def get_continuation(path, h, addr):
    _, cont, size = ndx_record(h)
    with open(part(path, "ndx"), "rb") as fh:
        fh.seek(addr)
        return get_bits(fh.read(size), cont, h.record_pointer_bits)


def copy_pfm(src, dst_dir):
    os.makedirs(dst_dir, exist_ok=True)
    dst = os.path.join(dst_dir, NAME)
    shutil.copy(src, dst)
    shutil.copytree(src + ".data", dst + ".data")
    return dst


def has_problem(problems, part_name, *words):
    return any(p.part == part_name and all(w in p.what or w in p.where for w in words)
               for p in problems)


def cli(path, *extra):
    return CliRunner().invoke(app, ["check", os.fspath(path), *extra])


# --- fixtures ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def sound_one(tmp_path_factory):
    """A PFM written in one batch (each bin's records contiguous), recomputed."""
    d = tmp_path_factory.mktemp("one")
    path, grid, inputs = build_pfm(d, seed=11, batches=1, heavy=25, lat_fraction=0.7)
    return path


@pytest.fixture(scope="module")
def sound_two(tmp_path_factory):
    """A PFM written in two batches (chains continue into a second run)."""
    d = tmp_path_factory.mktemp("two")
    path, grid, inputs = build_pfm(d, seed=12, batches=2, heavy=25)
    return path


@pytest.fixture
def damaged(sound_one, tmp_path):
    return copy_pfm(sound_one, tmp_path / "copy")


# --- sound files ------------------------------------------------------------------------

def test_sound_single_batch(sound_one):
    problems = P.check(sound_one)
    assert problems == [], [str(p) for p in problems]
    r = cli(sound_one)
    assert r.exit_code == 0, r.output
    assert "sound" in r.output


def test_sound_two_batches(sound_two):
    problems = P.check(sound_two)
    assert problems == [], [str(p) for p in problems]


def test_not_recomputed_is_reported(tmp_path):
    path, _, _ = build_pfm(tmp_path, seed=13, batches=1, do_recompute=False)
    problems = P.check(path)
    assert has_problem(problems, ".bin", "num_valid")
    assert has_problem(problems, "header", "[MAX DEPTH]")


def test_json_output(sound_one):
    import json

    r = cli(sound_one, "--json")
    assert r.exit_code == 0
    assert json.loads(r.output)["sound"] is True


# --- damage -----------------------------------------------------------------------------

def test_cycle(damaged):
    bf = BinFile(damaged)
    c, r = bf.bins_with(min_count=3 * bf.h.record_length + 1)[0]
    head = bf.get(c, r, "head")
    second = get_continuation(damaged, bf.h, head)
    set_continuation(damaged, bf.h, second, head)  # record 2 points back to record 1
    problems = P.check(damaged)
    assert has_problem(problems, ".ndx", "cycle", f"({c}, {r})"), [str(p) for p in problems]
    assert cli(damaged).exit_code == 1


def test_pointer_past_the_end(damaged):
    bf = BinFile(damaged)
    c, r = bf.bins_with()[3]
    size = os.path.getsize(part(damaged, "ndx"))
    bf.set(c, r, "head", size + 10 * ndx_record(bf.h)[2])
    problems = P.check(damaged)
    assert has_problem(problems, ".bin", "head pointer", "not a physical record", f"({c}, {r})")
    assert has_problem(problems, ".ndx", "belong to no bin")  # its records are now orphans
    r_ = cli(damaged)
    assert r_.exit_code == 1 and "head pointer" in r_.output


def test_count_too_large_and_too_small(damaged):
    bf = BinFile(damaged)
    L = bf.h.record_length
    big = bf.bins_with(min_count=2 * L + 1)
    (c1, r1), (c2, r2) = big[0], big[1]
    bf.set(c1, r1, "count", bf.get(c1, r1, "count") + L)   # needs one more record
    bf.set(c2, r2, "count", bf.get(c2, r2, "count") - L)   # chain goes on past the count
    problems = P.check(damaged)
    assert has_problem(problems, ".ndx", "chain ends after", f"({c1}, {r1})")
    assert has_problem(problems, ".ndx", "count is smaller than the chain", f"({c2}, {r2})")


def test_stale_statistic(damaged):
    bf = BinFile(damaged)
    c, r = bf.bins_with(min_count=3)[0]
    bf.set(c, r, "avg_filtered", bf.get(c, r, "avg_filtered") + 50)
    bf.set(c, r, "num_valid", bf.get(c, r, "num_valid") + 1)
    problems = P.check(damaged)
    assert has_problem(problems, ".bin", "avg_filtered", "stale", f"({c}, {r})")
    assert has_problem(problems, ".bin", "num_valid", f"({c}, {r})")


def test_wrong_validity(damaged):
    bf = BinFile(damaged)
    c, r = bf.bins_with()[0]
    bf.set(c, r, "validity", bf.get(c, r, "validity") ^ V.SUSPECT)
    problems = P.check(damaged)
    assert has_problem(problems, ".bin", "validity", f"({c}, {r})")


def test_truncated_ndx(damaged):
    p = part(damaged, "ndx")
    size = os.path.getsize(p)
    with open(p, "r+b") as fh:
        fh.truncate(size - 10)
    problems = P.check(damaged)
    assert has_problem(problems, ".ndx", "not a whole number of")
    assert any("not a physical record" in p.what or "pointer" in p.what for p in problems)
    assert cli(damaged).exit_code == 1


def test_truncated_bin_and_cvg(damaged):
    for ext in ("bin", "cvg"):
        p = part(damaged, ext)
        with open(p, "r+b") as fh:
            fh.truncate(os.path.getsize(p) - 7)
    problems = P.check(damaged)
    assert has_problem(problems, ".bin", "truncated")
    assert has_problem(problems, ".cvg", "65,536")


def test_corrupted_bin_bytes(damaged):
    h = header(damaged)
    _, size = bin_fields(h)
    rng = np.random.default_rng(0)
    p = part(damaged, "bin")
    with open(p, "r+b") as fh:
        fh.seek(h.bin_header_size + 5 * size)
        fh.write(rng.integers(0, 256, 12 * size, dtype=np.uint8).tobytes())
    problems = P.check(damaged)
    assert problems and all(isinstance(x, P.Problem) for x in problems)
    assert cli(damaged).exit_code == 1


@pytest.mark.parametrize("ext,kind", [("cvg", ".cvg"), ("lin", ".lin"), ("ndx", ".ndx"), ("ctl", ".ctl")])
def test_missing_part(damaged, ext, kind):
    os.remove(part(damaged, ext))
    problems = P.check(damaged)
    assert has_problem(problems, kind, "missing"), [str(p) for p in problems]
    r = cli(damaged)
    assert r.exit_code == 1 and "missing" in r.output


def test_missing_handle(damaged):
    os.remove(damaged)
    assert has_problem(P.check(damaged), "handle", "missing")


def test_ctl_bad_sequence_number(damaged):
    p = part(damaged, "ctl")
    with open(p) as fh:
        lines = fh.read().split("\n")
    assert lines[6].startswith("+ 00001 ")
    lines[6] = "+ 00005 " + lines[6][8:]
    with open(p, "w") as fh:
        fh.write("\n".join(lines))
    problems = P.check(damaged)
    assert has_problem(problems, ".ctl", "sequence number 5 should be 1", "line 7")
    r = cli(damaged)
    assert r.exit_code == 1 and "sequence number" in r.output


def test_file_and_line_missing_from_lists(damaged):
    for ext in ("ctl", "lin"):
        p = part(damaged, ext)
        with open(p) as fh:
            lines = fh.read().rstrip("\n").split("\n")
        with open(p, "w") as fh:
            fh.write("\n".join(lines[:-1]) + "\n")  # drop the last file / line
    problems = P.check(damaged)
    assert has_problem(problems, ".ndx", "names file 2 but the .ctl lists 2")
    assert has_problem(problems, ".ndx", "names line 3 but the .lin lists 3")


def test_orphan_record(damaged):
    h = header(damaged)
    with open(part(damaged, "ndx"), "ab") as fh:
        fh.write(bytes(ndx_record(h)[2]))
    problems = P.check(damaged)
    assert has_problem(problems, ".ndx", "1 physical record(s) belong to no bin")


def test_shared_record(damaged):
    bf = BinFile(damaged)
    L = bf.h.record_length
    a = [b for b in bf.bins_with() if bf.get(*b, "count") <= L]
    (c1, r1), (c2, r2) = a[0], a[1]
    for k in ("count", "head", "tail"):
        bf.set(c2, r2, k, bf.get(c1, r1, k))  # bin 2 now claims bin 1's record
    problems = P.check(damaged)
    assert has_problem(problems, ".ndx", "shared", f"({c2}, {r2})"), [str(p) for p in problems]


def test_tail_pointer_wrong(damaged):
    bf = BinFile(damaged)
    c, r = bf.bins_with(min_count=bf.h.record_length + 1)[0]
    bf.set(c, r, "tail", bf.get(c, r, "head"))
    assert has_problem(P.check(damaged), ".bin", "tail pointer", f"({c}, {r})")


def test_coverage_mismatch(damaged):
    h = header(damaged)
    bf = BinFile(damaged)
    c, r = bf.bins_with()[0]
    with open(part(damaged, "cvg"), "r+b") as fh:
        fh.seek(65536 + r * h.bin_width + c)
        fh.write(bytes([0]))
    assert has_problem(P.check(damaged), ".cvg", "coverage byte", f"({c}, {r})")


def test_empty_bin_with_garbage(damaged):
    bf = BinFile(damaged)
    empty = [(c, r) for r in range(bf.h.bin_height) for c in range(bf.h.bin_width)
             if bf.get(c, r, "count") == 0]
    if not empty:
        pytest.skip("no empty bin in this grid")
    c, r = empty[0]
    bf.set(c, r, "std", 12345)
    assert has_problem(P.check(damaged), ".bin", "count is 0", f"({c}, {r})")


def test_header_extrema_wrong(damaged):
    with P.open_pfm(damaged, "r+") as f:
        f.write_header(max_depth=5000.0, min_bin_count=0)
    problems = P.check(damaged)
    assert has_problem(problems, "header", "[MAX DEPTH] = 5000")
    assert has_problem(problems, "header", "[MINIMUM BIN COUNT] = 0")


def test_header_inconsistent_bits(damaged):
    p = part(damaged, "bin")
    with open(p, "r+b") as fh:
        raw = bytearray(fh.read(131072))
        i = raw.find(b"[NULL DEPTH] = ")
        j = raw.find(b"\n", i)
        new = b"[NULL DEPTH] = 9000000.000000"
        raw[i:j] = new.ljust(j - i, b"0")[: max(j - i, len(new))]
        fh.seek(0)
        fh.write(bytes(raw[:131072]))
    problems = P.check(damaged)
    assert has_problem(problems, "header", "does not fit [DEPTH BITS]")


def test_unreadable_header_raises_with_offset(damaged):
    p = part(damaged, "bin")
    with open(p, "r+b") as fh:
        raw = fh.read(4096)
        i = raw.find(b"[DEPTH BITS] = ")
        fh.seek(i + len(b"[DEPTH BITS] = "))
        fh.write(b"99")
    with pytest.raises(PfmFormatError) as ei:
        P.check(damaged)
    assert ei.value.path == p and ei.value.offset == i
    assert "[DEPTH BITS]" in str(ei.value)
    r = cli(damaged)
    assert r.exit_code == 1 and "DEPTH BITS" in r.output


def test_not_a_pfm(tmp_path):
    with pytest.raises(PfmFormatError):
        P.check(tmp_path / "nothing.pfm")
    (tmp_path / "x.pfm.data").mkdir()
    (tmp_path / "x.pfm.data" / "x.pfm.bin").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(PfmFormatError) as ei:
        P.check(tmp_path / "x.pfm")
    assert ei.value.offset == 0


# --- random damage never crashes ----------------------------------------------------------

@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ext=st.sampled_from(["bin", "ndx", "cvg", "ctl", "lin", "handle"]),
       where=st.floats(0.0, 1.0), length=st.integers(1, 300), seed=st.integers(0, 2**32 - 1),
       truncate=st.booleans())
def test_random_damage_never_crashes(sound_two, tmp_path_factory, ext, where, length, seed, truncate):
    d = copy_pfm(sound_two, tmp_path_factory.mktemp("fuzz"))
    p = d if ext == "handle" else part(d, ext)
    size = os.path.getsize(p)
    rng = np.random.default_rng(seed)
    if ext == "bin" and rng.random() < 0.7:   # mostly hit the records, not the header text
        lo = 131072
    else:
        lo = 0
    off = lo + int(where * max(0, size - lo - 1))
    with open(p, "r+b") as fh:
        if truncate:
            fh.truncate(off)
        else:
            fh.seek(off)
            fh.write(rng.integers(0, 256, length, dtype=np.uint8).tobytes())
    try:
        problems = P.check(d)
    except PfmDaskError:
        return
    assert all(isinstance(x, P.Problem) and str(x) for x in problems)
    assert not any("check aborted" in x.what for x in problems)


def test_small_bands_give_the_same_answer(sound_one, damaged, monkeypatch):
    from pfm_dask.pfm import _check

    monkeypatch.setattr(_check, "_BAND_BINS", 5)
    monkeypatch.setattr(_check, "_BAND_SOUNDINGS", 13)
    assert P.check(sound_one) == []
    # a record shared by bins that sit in different bands is still found
    bf = BinFile(damaged)
    L = bf.h.record_length
    a = [b for b in bf.bins_with() if bf.get(*b, "count") <= L]
    (c1, r1), (c2, r2) = a[0], a[-1]
    for k in ("count", "head", "tail"):
        bf.set(c2, r2, k, bf.get(c1, r1, k))
    assert has_problem(P.check(damaged), ".ndx", "shared", f"({c2}, {r2})")


def test_heavy_bins_are_validated_before_reading(sound_one, damaged, monkeypatch):
    from pfm_dask.pfm import _check

    monkeypatch.setattr(_check, "_BAND_SOUNDINGS", 2)  # every bin of > 4 soundings is "heavy"
    assert P.check(sound_one) == []
    bf = BinFile(damaged)
    L = bf.h.record_length
    c, r = bf.bins_with(min_count=2 * L + 1)[0]
    bf.set(c, r, "count", bf.get(c, r, "count") + 50 * L)
    problems = P.check(damaged)
    assert has_problem(problems, ".ndx", "chain ends after", f"({c}, {r})")
    c2, r2 = bf.bins_with(min_count=3 * L + 1)[1]
    set_continuation(damaged, bf.h, get_continuation(damaged, bf.h, bf.get(c2, r2, "head")),
                     bf.get(c2, r2, "head"))
    assert has_problem(P.check(damaged), ".ndx", "cycle", f"({c2}, {r2})")
