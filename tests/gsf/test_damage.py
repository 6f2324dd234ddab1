"""Damaged input: only GsfError comes out (strict), or the pings before the damage (lenient).

Explicit cases name each kind of damage the reader must recognise; property tests
(hypothesis) truncate, flip and splice bytes of real samples and synthetic files.
The reference for "pings before the damage" is the undamaged file, cut at record
boundaries found by the slow framing walk in this module.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pfm_dask import gsf
from pfm_dask.errors import GsfError
from tests.conftest import missing_sample

from .test_pitfalls import (array, depth_ping, header_record, ping_record, record, sf_table,
                            write)

# --- helpers -------------------------------------------------------------------------------


def slow_ping_ends(blob: bytes) -> list[int]:
    """Byte offset just past each ping record, by a plain walk of the size words."""
    ends, pos = [], 0
    while pos + 8 <= len(blob):
        size, word = struct.unpack_from(">II", blob, pos)
        hdr = 12 if word & 0x80000000 else 8
        end = pos + hdr + size
        if end > len(blob):
            break
        if word & 0x3FFFFF == 2:
            ends.append(end)
        pos = end
    return ends


def pings_of(table: pa.Table, k: int) -> pa.Table:
    """The rows of the first k pings of a whole-file table."""
    ping = table.column("ping").to_numpy()
    return table.slice(0, int(np.count_nonzero(ping <= k)))


def read_both(path):
    """(strict outcome, lenient table, lenient damage); strict outcome is a table or GsfError."""
    try:
        strict = gsf.read_pings(path)
    except GsfError as err:
        strict = err
    with gsf.GsfFile(path, strict=False) as f:
        lenient = f.read()
        damage = list(f.damage)
    return strict, lenient, damage


def check_wellformed(table: pa.Table):
    assert table.schema.equals(SCHEMA)
    ping = table.column("ping").to_numpy()
    beam = table.column("beam").to_numpy()
    if table.num_rows:
        assert ping[0] == 1 and np.all(np.diff(ping) >= 0)
        assert np.all(np.diff(ping) <= 1)
        starts = np.r_[True, np.diff(ping) > 0]
        assert np.all(beam[starts] == 1)


SCHEMA = gsf.SOUNDING_SCHEMA


def synthetic_file(pings: int = 6, n: int = 5) -> bytes:
    blob = header_record() + record(12, struct.pack(">IIH", 1, 0, 0) + b"\0" * 6)
    for k in range(pings):
        table = k % 3 == 0
        body = (sf_table([(1, 0x20, 100, 0), (2, 0, 10, 0)]) if table else b"")
        body += array(1, range(k, k + n), "H") + array(2, range(-n, 0), "h")
        body += array(16, [k % 2] * n, "B")
        blob += ping_record(body, n=n, sec=1_500_000_000 + k)
        blob += record(12, struct.pack(">IIH", 2 + k, 0, 0) + b"\0" * 6)
    return blob


# --- explicit damage kinds -------------------------------------------------------------------


def test_not_gsf(tmp_path):
    path = write(tmp_path, "notes.txt", b"this is plainly not a GSF file, just some text\n" * 3)
    with pytest.raises(GsfError, match="not a GSF file") as exc:
        gsf.read_pings(path)
    assert exc.value.path == str(path) and exc.value.offset == 0
    with gsf.GsfFile(path, strict=False) as f:
        assert f.version is None and f.n_pings == 0 and len(f.damage) == 1
        t = f.read()
        assert t.num_rows == 0 and t.schema.equals(SCHEMA)
    with pytest.raises(GsfError, match="not a GSF file"):
        gsf.info(path)


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(GsfError, match="not a GSF file"):
        gsf.read_pings(write(tmp_path, "empty.gsf", b""))
    with pytest.raises(GsfError, match="cannot open") as exc:
        gsf.read_pings(tmp_path / "nope.gsf")
    assert exc.value.path == str(tmp_path / "nope.gsf")


def test_truncated_record(tmp_path):
    blob = synthetic_file()
    ends = slow_ping_ends(blob)
    cut = ends[2] - 7
    path = write(tmp_path, "cut.gsf", blob[:cut])
    with pytest.raises(GsfError, match=r"remain \(truncated file\?\)") as exc:
        gsf.read_pings(path)
    rec_start = ends[2] - len(ping_record(b"", n=1)) if False else None  # noqa: F841
    # The error names the byte offset of the record that is cut short.
    size, _ = struct.unpack_from(">II", blob, exc.value.offset)
    assert exc.value.offset + 8 + size == ends[2]
    whole = gsf.read_pings(write(tmp_path, "whole.gsf", blob))
    _, lenient, damage = read_both(path)
    assert lenient.equals(pings_of(whole, 2)) and len(damage) == 1


def test_file_ends_inside_record_header(tmp_path):
    blob = synthetic_file() + b"\0\0\0"
    with pytest.raises(GsfError, match="ends inside a record header") as exc:
        gsf.read_pings(write(tmp_path, "tail.gsf", blob))
    assert exc.value.offset == len(blob) - 3


def test_absurd_record_size(tmp_path):
    blob = header_record() + struct.pack(">II", 600_000, 2) + b"\0" * 64
    with pytest.raises(GsfError, match="524,288") as exc:
        gsf.read_pings(write(tmp_path, "big.gsf", blob))
    assert exc.value.offset == 20


def test_checksums(tmp_path):
    ping = depth_ping([10, 20, 30])
    data = ping[8:]
    good = header_record() + record(2, data, checksum=True)
    t = gsf.read_pings(write(tmp_path, "cs.gsf", good))
    assert t.column("depth").to_pylist() == [0.1, 0.2, 0.3]
    bad = bytearray(good)
    bad[20 + 12 + 60] ^= 0x01           # one data byte of the ping
    with pytest.raises(GsfError, match="checksum") as exc:
        gsf.read_pings(write(tmp_path, "csbad.gsf", bytes(bad)))
    assert exc.value.offset == 20


def test_file_with_no_pings(sample_by_name, tmp_path):
    t = gsf.read_pings(sample_by_name("TN136HS"))
    assert t.num_rows == 0 and t.schema.equals(SCHEMA)
    t = gsf.read_pings(write(tmp_path, "h.gsf", header_record()))
    assert t.num_rows == 0
    assert list(gsf.iter_batches(tmp_path / "h.gsf")) == []


@pytest.mark.parametrize("body, n, match", [
    (sf_table([(1, 0, 100, 0)]) + array(1, [1, 2], "H"), 3, "needs 6 bytes"),
    (sf_table([(1, 0, 0, 0)]) + array(1, [1, 2], "H"), 2, "multiplier 0"),
    (array(2, [1, 2], "h"), 2, "no scale factor"),
    (struct.pack(">II", (100 << 24) | 16, 5) + b"\0" * 12, 2, "5 entries"),
    (struct.pack(">II", (100 << 24) | 4, 0), 2, "0 entries"),
    (sf_table([(1, 0, 1, 0)]) + array(1, [1], "H"), 0, "0 beams"),
    (sf_table([(1, 0, 1, 0)]) + struct.pack(">I", 15 << 24) + b"\1\2\3\4", 40, "quality-flags"),
])
def test_bad_ping_contents(tmp_path, body, n, match):
    blob = header_record() + depth_ping([1, 2]) + ping_record(body, n=n) + depth_ping([3, 4])
    path = write(tmp_path, "bad.gsf", blob)
    with pytest.raises(GsfError, match=match) as exc:
        gsf.read_pings(path)
    assert exc.value.offset == 20 + len(depth_ping([1, 2]))     # the bad ping's record
    with gsf.GsfFile(path, strict=False) as f:
        t = f.read()
        assert t.column("ping").to_pylist() == [1, 1]           # pings before the damage
        assert [d.offset for d in f.damage] == [exc.value.offset]
        assert sum(b.num_rows for b in f.iter_batches(1)) == 2
        assert f.info()["damage"][0]["offset"] == exc.value.offset


def test_ping_shorter_than_its_header(tmp_path):
    blob = header_record() + record(2, b"\0" * 40)
    with pytest.raises(GsfError, match="fewer than its 56-byte ping header"):
        gsf.read_pings(write(tmp_path, "short.gsf", blob))


def test_unknown_records_are_skipped_by_size(tmp_path):
    blob = header_record() + record(77, b"xyz" * 5) + depth_ping([1, 2]) + record(4000, b"\1" * 9)
    with gsf.GsfFile(write(tmp_path, "u.gsf", blob)) as f:
        assert f.record_counts == {"HEADER": 1, "SWATH_BATHYMETRY_PING": 1,
                                   "UNKNOWN_77": 1, "UNKNOWN_4000": 1}
        assert f.read().num_rows == 2


# --- properties -------------------------------------------------------------------------------

_SMALL = ["EX1502L2", "6_184_1440", "EX1604"]


@pytest.fixture(scope="module")
def blobs():
    from tests.conftest import SAMPLE_FILES
    out = {"synthetic": synthetic_file(8, 7)}
    for frag in _SMALL:
        hits = [p for p in SAMPLE_FILES if frag in p.name]
        if hits:
            out[frag] = hits[0].read_bytes()
    return out


_settings = settings(max_examples=25, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])


def _whole(blob, tmp_path):
    return gsf.read_pings(write(tmp_path, "whole.gsf", blob))


@_settings
@given(which=st.sampled_from(["synthetic"] + _SMALL), frac=st.floats(0.0, 1.0))
def test_truncation_gives_a_prefix(blobs, tmp_path, which, frac):
    """Cut anywhere: strict raises GsfError unless the cut is a record boundary; lenient
    returns exactly the pings whose records end before the cut."""
    if which not in blobs:
        missing_sample(which)
    blob = blobs[which]
    cut = int(frac * len(blob))
    whole = _whole(blob, tmp_path)
    strict, lenient, damage = read_both(write(tmp_path, "cut.gsf", blob[:cut]))
    k = sum(1 for e in slow_ping_ends(blob) if e <= cut)
    assert lenient.equals(pings_of(whole, k))
    if isinstance(strict, GsfError):
        assert damage and damage[0].offset is not None and damage[0].offset <= cut
    else:
        assert not damage and strict.equals(lenient)


@_settings
@given(which=st.sampled_from(["synthetic"] + _SMALL), frac=st.floats(0.0, 1.0),
       xor=st.integers(1, 255), count=st.integers(1, 4))
def test_flipped_bytes(blobs, tmp_path, which, frac, xor, count):
    """Flip bytes: only GsfError (strict) comes out; lenient keeps every ping that ends
    before the first flipped byte, unchanged."""
    if which not in blobs:
        missing_sample(which)
    blob = bytearray(blobs[which])
    at = min(int(frac * len(blob)), len(blob) - 1)
    for j in range(count):
        if at + j < len(blob):
            blob[at + j] ^= xor
    whole = _whole(blobs[which], tmp_path)
    strict, lenient, damage = read_both(write(tmp_path, "flip.gsf", bytes(blob)))
    check_wellformed(lenient)
    k = sum(1 for e in slow_ping_ends(blobs[which]) if e <= at)
    assert pings_of(lenient, k).equals(pings_of(whole, k))
    if not isinstance(strict, GsfError):
        assert not damage and strict.equals(lenient)


@_settings
@given(which=st.sampled_from(["synthetic"] + _SMALL), frac=st.floats(0.0, 1.0),
       junk=st.binary(min_size=0, max_size=40), drop=st.integers(0, 40))
def test_spliced_bytes(blobs, tmp_path, which, frac, junk, drop):
    """Replace a stretch of bytes by other bytes (insert/delete): same guarantees as flips."""
    if which not in blobs:
        missing_sample(which)
    blob = blobs[which]
    at = int(frac * len(blob))
    spliced = blob[:at] + junk + blob[at + drop:]
    whole = _whole(blob, tmp_path)
    strict, lenient, damage = read_both(write(tmp_path, "splice.gsf", spliced))
    check_wellformed(lenient)
    k = sum(1 for e in slow_ping_ends(blob) if e <= at)
    assert pings_of(lenient, k).equals(pings_of(whole, k))
    if not isinstance(strict, GsfError):
        assert not damage


@settings(max_examples=60, deadline=None)
@given(data=st.binary(min_size=0, max_size=300))
def test_random_small_byte_strings(tmp_path_factory, data):
    """Arbitrary bytes, raw or after a valid header record: GsfError or a well-formed table."""
    d = tmp_path_factory.mktemp("rnd")
    for blob in (data, header_record() + data, header_record() + depth_ping([1, 2]) + data):
        path = write(d, "r.gsf", blob)
        try:
            check_wellformed(gsf.read_pings(path))
        except GsfError as err:
            assert err.path == str(path)
        with gsf.GsfFile(path, strict=False) as f:
            check_wellformed(f.read())
            f.info()


def test_lenient_read_pings_reports_damage_in_metadata(tmp_path):
    import json
    blob = header_record() + depth_ping([1, 2]) + depth_ping([3, 4])
    path = write(tmp_path, "t.gsf", blob[:-5])
    t = gsf.read_pings(path, strict=False)
    assert t.column("depth").to_pylist() == [0.01, 0.02]
    (d,) = json.loads(t.schema.metadata[b"gsf_damage"])
    assert d["offset"] == 20 + len(depth_ping([1, 2])) and d["error"] == "GsfError"
    assert t.schema.equals(SCHEMA)            # metadata aside, the same schema
    assert b"gsf_damage" not in (gsf.read_pings(write(tmp_path, "ok.gsf", blob)).schema.metadata or {})


# --- the fast walk (whole runs of pings at once) equals the plain per-ping walk -----------------


def _directories(blob: bytes, tmp_path):
    from pfm_dask.gsf._decode import ScaleState, walk_pings
    from pfm_dask.gsf._framing import scan_records
    from pfm_dask.gsf._records import ping_header_dtype

    fr = scan_records(blob, "x")
    if fr.version is None:
        return None
    pi = fr.ping_index
    args = (blob, fr.data_offsets[pi], fr.sizes[pi], fr.offsets[pi],
            ping_header_dtype(fr.major).itemsize)
    out = []
    for fast in (True, False):
        d, dmg = walk_pings(*args, ScaleState(), "x", strict=False, fast=fast)
        out.append((d, None if dmg is None else (dmg.offset, dmg.reason)))
    return out


def _assert_same_directory(pair):
    (a, da), (b, db) = pair
    assert da == db
    for name in ("data_offsets", "n_beams", "pos", "width", "mult", "off"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


@pytest.mark.parametrize("which", ["synthetic", "EM302", "6_184_1440", "EX1604"])
def test_fast_walk_equals_plain_walk(blobs, tmp_path, which):
    if which == "EM302":
        from tests.conftest import SAMPLE_FILES
        hits = [p for p in SAMPLE_FILES if "EM302" in p.name]
        if not hits:
            missing_sample("EM302")
        blob = hits[0].read_bytes()
    elif which not in blobs:
        missing_sample(which)
    else:
        blob = blobs[which]
    _assert_same_directory(_directories(blob, tmp_path))


@_settings
@given(which=st.sampled_from(["synthetic"] + _SMALL), frac=st.floats(0.0, 1.0),
       xor=st.integers(1, 255))
def test_fast_walk_equals_plain_walk_on_damaged_files(blobs, tmp_path, which, frac, xor):
    """Byte flips anywhere (inside subrecord headers, tables, sizes): both walks agree on
    every ping's layout and scale factors, and on the damage."""
    if which not in blobs:
        missing_sample(which)
    blob = bytearray(blobs[which])
    blob[min(int(frac * len(blob)), len(blob) - 1)] ^= xor
    pair = _directories(bytes(blob), tmp_path)
    if pair is not None:
        _assert_same_directory(pair)


@_settings
@given(which=st.sampled_from(["synthetic", "EM302", "EX1604", "6_184_1440"]),
       frac=st.floats(0.0, 1.0), xor=st.integers(1, 255), width=st.integers(1, 3))
def test_fast_walk_equals_plain_walk_flips_inside_pings(blobs, tmp_path, which, frac, xor,
                                                        width):
    """Flips aimed at ping records only (headers, tables, arrays, trailing subrecords)."""
    if which == "EM302":
        from tests.conftest import SAMPLE_FILES
        hits = [p for p in SAMPLE_FILES if "EM302" in p.name]
        if not hits:
            missing_sample("EM302")
        blob = bytearray(hits[0].read_bytes())
    elif which not in blobs:
        missing_sample(which)
    else:
        blob = bytearray(blobs[which])
    starts, pos = [], 0                 # (start, end) of each ping record's data
    while pos + 8 <= len(blob):
        size, word = struct.unpack_from(">II", blob, pos)
        hdr = 12 if word & 0x80000000 else 8
        if word & 0x3FFFFF == 2:
            starts.append((pos + hdr, pos + hdr + size))
        pos += hdr + size
    total = sum(b - a for a, b in starts)
    k = int(frac * (total - 1))
    for a, b in starts:
        if k < b - a:
            at = a + k
            break
        k -= b - a
    for j in range(width):
        if at + j < len(blob):
            blob[at + j] ^= xor
    pair = _directories(bytes(blob), tmp_path)
    if pair is not None:
        _assert_same_directory(pair)
