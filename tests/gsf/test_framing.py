"""Record framing: the scan lists exactly the records a plain size-word walk finds.

The reference is the slow loop below (one ``struct.unpack`` per record, nothing
else), plus the record counts of SOURCES.md for the real samples. The scan's
shortcut for runs of identical records (the 73,695 attitude records of sample #4)
is exercised with runs that end in every way: another record, another id with the
same size, a checksummed record, truncation.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pfm_dask import gsf
from pfm_dask.errors import GsfError
from pfm_dask.gsf._framing import scan_records

from .test_pitfalls import depth_ping, header_record, record, write

#: Record counts read from the samples (SOURCES.md, "Records").
EXPECTED_COUNTS = {
    "EX1502L2": {"HEADER": 1, "SWATH_BATHY_SUMMARY": 1, "COMMENT": 2, "PROCESSING_PARAMETERS": 1,
                 "SOUND_VELOCITY_PROFILE": 1, "SWATH_BATHYMETRY_PING": 4, "ATTITUDE": 34,
                 "HISTORY": 1},
    "6_184_1440": {"HEADER": 1, "SWATH_BATHY_SUMMARY": 1, "COMMENT": 2,
                   "PROCESSING_PARAMETERS": 1, "SOUND_VELOCITY_PROFILE": 21,
                   "SWATH_BATHYMETRY_PING": 132, "ATTITUDE": 132, "HISTORY": 1},
    "EX1604": {"HEADER": 1, "SWATH_BATHY_SUMMARY": 1, "COMMENT": 2, "PROCESSING_PARAMETERS": 1,
               "SOUND_VELOCITY_PROFILE": 1, "SWATH_BATHYMETRY_PING": 8, "ATTITUDE": 111,
               "HISTORY": 1},
    "EM302": {"HEADER": 1, "PROCESSING_PARAMETERS": 1, "ATTITUDE": 73695,
              "SOUND_VELOCITY_PROFILE": 1, "SWATH_BATHYMETRY_PING": 50},
    "TN136HS": {"HEADER": 1},
}
VERSIONS = {"EX1502L2": "GSF-v03.06", "6_184_1440": "GSF-v02.09", "EX1604": "GSF-v03.06",
            "EM302": "GSF-v03.07", "TN136HS": "GSF-v03.08"}


def slow_walk(blob: bytes):
    """(record offset, data offset, size, id) of every whole record, then the stop offset."""
    out, pos = [], 0
    while pos + 8 <= len(blob):
        size, word = struct.unpack(">II", blob[pos:pos + 8])
        hdr = 12 if word & 0x80000000 else 8
        if pos + hdr + size > len(blob) or size > 524288 or size <= 8:
            break
        out.append((pos, pos + hdr, size, word & 0x3FFFFF))
        pos += hdr + size
    return out, pos


def assert_same_as_slow(blob: bytes):
    fr = scan_records(blob, "x")
    ref, stop = slow_walk(blob)
    assert fr.offsets.tolist() == [r[0] for r in ref]
    assert fr.data_offsets.tolist() == [r[1] for r in ref]
    assert fr.sizes.tolist() == [r[2] for r in ref]
    assert fr.ids.tolist() == [r[3] for r in ref]
    assert fr.end == stop
    assert bool(fr.damage) == (stop != len(blob))
    return fr


def _key(path):
    return next(k for k in EXPECTED_COUNTS if k in path.name)


def test_samples_framing(gsf_sample):
    blob = gsf_sample.read_bytes()
    fr = assert_same_as_slow(blob)
    key = _key(gsf_sample)
    assert fr.version == VERSIONS[key]
    assert fr.record_counts() == {k: v for k, v in sorted(
        EXPECTED_COUNTS[key].items(), key=lambda kv: _ID[kv[0]])}
    assert fr.damage == [] and fr.end == len(blob)
    with gsf.GsfFile(gsf_sample) as f:
        assert f.size == len(blob)
        assert f.record_counts == EXPECTED_COUNTS[key]
        assert f.n_pings == EXPECTED_COUNTS[key].get("SWATH_BATHYMETRY_PING", 0)
        ref, _ = slow_walk(blob)
        assert f.ping_offsets.dtype == np.int64
        assert f.ping_offsets.tolist() == [r[0] for r in ref if r[3] == 2]


_ID = {"HEADER": 1, "SWATH_BATHYMETRY_PING": 2, "SOUND_VELOCITY_PROFILE": 3,
       "PROCESSING_PARAMETERS": 4, "COMMENT": 6, "HISTORY": 7, "SWATH_BATHY_SUMMARY": 9,
       "ATTITUDE": 12}


def att(k: int, extra: int = 0) -> bytes:
    """An attitude-like record of 12 (+extra) data bytes."""
    return record(12, struct.pack(">IIH", k, 0, 0) + b"\0" * (2 + extra))


@pytest.mark.parametrize("run", [2, 3, 5, 64, 65, 300, 5000])
def test_runs_of_identical_records(run):
    """Runs of every length, ended by a different size, a different id, a checksum, EOF."""
    body = header_record()
    body += b"".join(att(k) for k in range(run)) + att(0, extra=4)
    body += b"".join(att(k) for k in range(run)) + record(6, b"\0" * 14)   # same size, id 6
    body += b"".join(att(k) for k in range(run)) + record(12, b"\0" * 14, checksum=True)
    body += b"".join(att(k) for k in range(run)) + depth_ping([1, 2])
    body += b"".join(att(k) for k in range(run))
    fr = assert_same_as_slow(body)
    assert fr.record_counts()["ATTITUDE"] == 5 * run + 2
    # truncated inside the last run, at a header and inside the data
    assert_same_as_slow(body[:-16 * (run // 2) - 3])
    assert_same_as_slow(body[:-16 * (run // 2) - 13])


def test_checksummed_records_data_offset():
    blob = header_record() + record(12, b"\1" * 12, checksum=True) + att(1)
    fr = assert_same_as_slow(blob)
    assert fr.data_offsets.tolist() == [8, 20 + 12, 20 + 12 + 12 + 8]


@pytest.mark.parametrize("size", [0, 4, 8])
def test_record_too_small(tmp_path, size):
    blob = header_record() + struct.pack(">II", size, 12) + b"\0" * 16
    fr = scan_records(blob, "x")
    assert len(fr.damage) == 1 and fr.damage[0].offset == 20 and "more than 8" in str(fr.damage[0])
    with pytest.raises(GsfError, match="more than 8"):
        gsf.GsfFile(write(tmp_path, "s.gsf", blob))


def test_first_record_must_be_header():
    blob = att(1) + header_record()
    fr = scan_records(blob, "x")
    assert fr.version is None and len(fr.ids) == 0
    assert "not a GSF file" in str(fr.damage[0])
    fr = scan_records(record(1, b"HELLO-v03.07"), "x")
    assert fr.version is None and "HELLO" in str(fr.damage[0])


def test_padding_is_part_of_the_size():
    """The size word includes the padding to 4 bytes; a reader simply trusts it."""
    blob = header_record() + record(6, b"a" * 9) + record(6, b"b" * 15)
    fr = assert_same_as_slow(blob)
    assert fr.sizes.tolist() == [12, 12, 16]
