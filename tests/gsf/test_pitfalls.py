"""Pitfalls P1-P15 (docs/gsf-format.md §8) that concern a GSF reader, one test (or more) each.

Synthetic files are built here byte by byte with :mod:`struct`, straight from the
format description (nothing from ``pfm_dask.gsf`` is used to write them), so the
expected values are known by construction. The builders are imported by the other
GSF test modules.
"""

from __future__ import annotations

import os
import struct
import threading

import numpy as np
import pytest

from pfm_dask import gsf
from pfm_dask.errors import GsfError

# --- byte builders (independent of the package) ------------------------------------------


def pad4(b: bytes) -> bytes:
    return b + b"\0" * (-len(b) % 4)


def record(rid: int, data: bytes, *, checksum: bool = False, size: int | None = None) -> bytes:
    """One record: size word, id word (bit 31 = checksum), [checksum], data padded to 4."""
    data = pad4(data)
    size = len(data) if size is None else size
    if checksum:
        cs = sum(data) & 0xFFFFFFFF
        return struct.pack(">III", size, rid | 0x80000000, cs) + data
    return struct.pack(">II", size, rid) + data


def header_record(version: str = "GSF-v03.07") -> bytes:
    return record(1, version.encode().ljust(12, b"\0"))


def sub(sid: int, payload: bytes, *, declared: int | None = None) -> bytes:
    """A subrecord: u32 (id << 24 | size) then the payload."""
    size = len(payload) if declared is None else declared
    return struct.pack(">I", (sid << 24) | size) + payload


def sf_table(entries) -> bytes:
    """Scale-factor subrecord 100 from (array id, compression flag, multiplier, offset)."""
    body = struct.pack(">I", len(entries))
    for aid, flag, mult, off in entries:
        body += struct.pack(">BBHIi", aid, flag, 0, mult, off)
    return sub(100, body)


def array(sid: int, raw, fmt: str, *, declared: int | None = None) -> bytes:
    """An array subrecord from raw integers packed with struct format char ``fmt``."""
    payload = b"".join(struct.pack(">" + fmt, int(v)) for v in raw)
    return sub(sid, payload, declared=declared)


def ping_record(subrecords: bytes, *, n: int, major: int = 3, sec: int = 1_500_000_000,
                nsec: int = 250_000_000, lat: float = 17.5, lon: float = -64.25,
                heading: float = 90.0, ping_flags: int = 0, center: int | None = None,
                size: int | None = None) -> bytes:
    """A swath ping record: header (42 bytes before major 3, 56 from 3) + subrecords."""
    center = n // 2 if center is None else center
    hdr = struct.pack(">IIiiHHHHhiHhhhHH", sec, nsec, round(lon * 1e7), round(lat * 1e7),
                      n, center, ping_flags, 0, 0, 0, round(heading * 100), 0, 0, 0, 0, 0)
    assert len(hdr) == 42
    if major >= 3:
        hdr += struct.pack(">iiiH", 0, 0, 0, 0)
    return record(2, hdr + subrecords, size=size)


def depth_ping(depths_raw, *, mult=100, off=0, table=True, major=3, extra=b"", **kw) -> bytes:
    """A ping with a depth array (2-byte) and beam flags (all 0)."""
    n = len(depths_raw)
    body = sf_table([(1, 0x20, mult, off)]) if table else b""
    body += array(1, depths_raw, "H") + array(16, [0] * n, "B") + extra
    return ping_record(body, n=n, major=major, **kw)


def write(tmp_path, name: str, blob: bytes):
    p = tmp_path / name
    p.write_bytes(blob)
    return p


# --- P1: latitude/longitude order ---------------------------------------------------------


def test_p1_longitude_is_first_on_disk(tmp_path):
    """P1: the ping header stores longitude before latitude; we return them by name."""
    blob = header_record() + depth_ping([1000, 1001], lat=17.8471517, lon=-64.5970738)
    t = gsf.read_pings(write(tmp_path, "p1.gsf", blob))
    assert t.column("latitude").to_pylist() == [17.8471517] * 2
    assert t.column("longitude").to_pylist() == [-64.5970738] * 2


def test_p1_real_sample_positions_are_not_swapped(sample_by_name):
    """P1: sample #3 lies near 8.71 N 167.48 E (Marshall Islands), not at latitude 167."""
    t = gsf.read_pings(sample_by_name("EX1604"))
    lat = t.column("latitude").to_numpy()
    lon = t.column("longitude").to_numpy()
    assert 8.71 < lat.min() <= lat.max() < 8.72
    assert 167.47 < lon.min() <= lon.max() < 167.48


# --- P2: libgsf's 4-open-files limit and thread-unsafety do not apply ----------------------


def test_p2_many_files_open_at_once_and_threads(tmp_path):
    """P2: libgsf allows 4 open files and is not thread-safe; this reader has neither limit."""
    paths = [write(tmp_path, f"f{i}.gsf", header_record() + depth_ping([100 * i + 1, 7]))
             for i in range(6)]
    files = [gsf.GsfFile(p) for p in paths]
    try:
        got = [f.read().column("depth").to_pylist() for f in files]
    finally:
        for f in files:
            f.close()
    assert got == [[(100 * i + 1) / 100, 0.07] for i in range(6)]

    big = header_record() + b"".join(depth_ping(list(range(k, k + 50))) for k in range(40))
    path = write(tmp_path, "big.gsf", big)
    expected = gsf.read_pings(path)
    results = [None] * 4

    def work(slot):
        with gsf.GsfFile(path) as f:
            results[slot] = f.read()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert all(r.equals(expected) for r in results)


# --- P3: no index file is written ------------------------------------------------------------


def test_p3_reading_writes_nothing_next_to_the_data(tmp_path):
    """P3: libgsf's indexed mode writes x.mbn21 beside x.mb121; reading here writes nothing."""
    path = write(tmp_path, "line.mb121", header_record() + depth_ping([5, 6, 7]))
    before = sorted(os.listdir(tmp_path))
    with gsf.GsfFile(path) as f:
        f.read(start_ping=0)
        f.info()
    gsf.info(path)
    assert sorted(os.listdir(tmp_path)) == before


# --- P4: the header record is part of the framing -------------------------------------------


def test_p4_header_record_read_once_and_counted(tmp_path):
    """P4: gsfOpen consumes the header; here the framing lists it and parses the version."""
    path = write(tmp_path, "h.gsf", header_record("GSF-v02.09") + depth_ping([1], major=2))
    with gsf.GsfFile(path) as f:
        assert (f.version, f.major, f.minor) == ("GSF-v02.09", 2, 9)
        assert f.record_counts == {"HEADER": 1, "SWATH_BATHYMETRY_PING": 1}
        assert f.n_pings == 1


# --- P5: summary records are not extents -----------------------------------------------------


def _summary(lat0, lat1, lon0, lon1) -> bytes:
    return record(9, struct.pack(">IIIIiiiiii", 1, 0, 2, 0, round(lat0 * 1e7), round(lon0 * 1e7),
                                 round(lat1 * 1e7), round(lon1 * 1e7), 0, 100))


def test_p5_info_extents_come_from_pings(tmp_path):
    """P5: a summary record claiming other bounds is ignored by info()."""
    blob = (header_record() + _summary(10.0, 11.0, 20.0, 21.0)
            + depth_ping([1], lat=17.25, lon=-64.5, sec=1_600_000_000)
            + depth_ping([1], lat=17.75, lon=-64.0, sec=1_600_000_010))
    d = gsf.info(write(tmp_path, "s.gsf", blob))
    assert d["latitude"] == {"min": 17.25, "max": 17.75}
    assert d["longitude"] == {"min": -64.5, "max": -64.0}
    assert d["time"]["start"] == 1_600_000_000.25 and d["time"]["end"] == 1_600_000_010.25


def test_p5_real_summary_is_narrower_than_pings(sample_by_name):
    """P5: in sample #3 the first ping is south of the summary's minimum latitude."""
    path = sample_by_name("EX1604")
    blob = path.read_bytes()
    pos = 0
    summary = None
    while pos + 8 <= len(blob):
        size, word = struct.unpack_from(">II", blob, pos)
        if word & 0x3FFFFF == 9:
            summary = struct.unpack_from(">IIIIiiiiii", blob, pos + 8)
        pos += 8 + size
    assert summary is not None
    d = gsf.info(path)
    assert d["latitude"]["min"] < summary[4] / 1e7
    assert d["time"]["start"] < summary[0] + summary[1] / 1e9


# --- P6: the sensor subrecord id can lie -------------------------------------------------------


def test_p6_sensor_id_not_used_for_decoding(sample_by_name):
    """P6: HIPS labels EM302 data as EM3002D (131); decoding does not depend on the id."""
    d = gsf.info(sample_by_name("EX1502L2"))
    assert d["sensor_subrecords"] == [131]
    assert d["n_beams"] == 4 * 432


# --- P7: null beams keep their depth -------------------------------------------------------------


def test_p7_null_beams_keep_a_nonzero_depth(sample_by_name):
    """P7: sample #1 has flag-0x01 beams holding 2.4 m; the reader returns what is stored."""
    t = gsf.read_pings(sample_by_name("EX1502L2"))
    flags = t.column("beam_flags").to_numpy()
    depth = t.column("depth").to_numpy()
    assert np.count_nonzero(flags == 0x01) == 277
    assert np.any(np.isclose(depth[flags == 0x01], 2.4))
    assert sorted(np.unique(flags).tolist()) == [0, 1, 5]


# --- P8: one-beam pings ------------------------------------------------------------------------


def test_p8_one_beam_ping_center_beam_outside(tmp_path):
    """P8: N = 1 with center_beam = 1 (outside 0..N-1) is a valid one-sounding ping."""
    blob = header_record("GSF-v02.09") + depth_ping([1286], major=2, center=1)
    t = gsf.read_pings(write(tmp_path, "sb.gsf", blob))
    assert t.num_rows == 1 and t.column("beam").to_pylist() == [1]
    assert t.column("depth").to_pylist() == [12.86]


def test_p8_real_single_beam_file(sample_by_name):
    """P8: sample #2 holds 132 one-beam pings with depths 12.12-13.12 m, all flags 0."""
    t = gsf.read_pings(sample_by_name("6_184_1440"))
    assert t.num_rows == 132
    assert t.column("beam").to_pylist() == [1] * 132
    assert t.column("ping").to_pylist() == list(range(1, 133))
    d = t.column("depth").to_numpy()
    assert 12.1 < d.min() and d.max() < 13.13
    assert set(t.column("beam_flags").to_pylist()) == {0}


# --- P9: subrecord overrunning the record -------------------------------------------------------


def test_p9_intensity_series_overrun_is_clamped(tmp_path):
    """P9: a subrecord 21 whose declared size runs past the record end is skipped, clamped."""
    n = 4
    # As in sample #4: subrecord 21 comes last and declares 1 byte more than remains.
    body = (sf_table([(1, 0, 100, 0)]) + array(1, [1, 2, 3, 4], "H")
            + array(16, [0, 1, 0, 5], "B") + sub(21, b"\x01\x02\x03\x04\x05\x06\x07", declared=8))
    blob = header_record() + ping_record(body, n=n)
    t = gsf.read_pings(write(tmp_path, "p9.gsf", blob))
    assert t.column("depth").to_pylist() == [0.01, 0.02, 0.03, 0.04]
    assert t.column("beam_flags").to_pylist() == [0, 1, 0, 5]


def test_p9_real_sample_overrun(sample_by_name):
    """P9: sample #4's subrecord 21 overruns by 1 byte in all 50 pings; all decode."""
    with gsf.GsfFile(sample_by_name("EM302")) as f:
        t = f.read()
        assert f.damage == []
    assert t.num_rows == 50 * 432
    assert "intensity_series" in gsf.info(sample_by_name("EM302"))["arrays"]


# --- P10: scale factors are state, merged, reset per file ---------------------------------------


def test_p10_tables_carry_over_and_merge(tmp_path):
    """P10: a ping without a table uses the last one; a partial table overwrites only its ids."""
    n = 2
    p1 = ping_record(sf_table([(1, 0, 100, 0), (2, 0, 10, -5)])
                     + array(1, [100, 200], "H") + array(2, [10, 20], "h"), n=n)
    p2 = ping_record(array(1, [100, 200], "H") + array(2, [10, 20], "h"), n=n)
    p3 = ping_record(sf_table([(1, 0, 1000, 0)])
                     + array(1, [100, 200], "H") + array(2, [10, 20], "h"), n=n)
    path = write(tmp_path, "p10.gsf", header_record() + p1 + p2 + p3)
    t = gsf.read_pings(path)
    assert t.column("depth").to_pylist() == [1.0, 2.0, 1.0, 2.0, 0.1, 0.2]
    # across = raw / 10 - (-5), in every ping (ping 3's table does not list id 2)
    assert t.column("across_track").to_pylist() == [6.0, 7.0] * 3
    assert t.column("beam_flags").null_count == 6        # no beam-flags array at all
    with gsf.GsfFile(path) as f:                         # starting at ping 2 (no table)
        assert f.read(start_ping=1).equals(t.slice(2))


def test_p10_state_is_reset_per_file(tmp_path):
    """P10: a file starting with a table-less ping fails even after reading another file."""
    good = write(tmp_path, "a.gsf", header_record() + depth_ping([1, 2]))
    bad = write(tmp_path, "b.gsf", header_record() + depth_ping([1, 2], table=False))
    gsf.read_pings(good)
    with pytest.raises(GsfError, match="no scale factor"):
        gsf.read_pings(bad)


def test_p10_real_samples_without_tables_in_some_pings(sample_by_name):
    """P10: sample #4 pings without a table decode as libgsf does (covered vs gsfpy); here:
    reading from each ping on its own equals the whole read's tail."""
    path = sample_by_name("EM302")
    whole = gsf.read_pings(path)
    ping = whole.column("ping").to_numpy()
    with gsf.GsfFile(path) as f:
        for start in (1, 17, 33, 49):
            part = f.read(start_ping=start, stop_ping=start + 1)
            assert part.equals(whole.filter(ping == start + 1))


# --- P11: stale or missing field-size nibble ----------------------------------------------------


def test_p11_width_from_size_beats_stale_nibble(tmp_path):
    """P11: nibble 0x40 (4 bytes) but size 2N -> 2-byte values; nibble 0 but size 4N -> 4."""
    n = 3
    body = (sf_table([(1, 0x40, 100, 0), (2, 0x00, 100, 0)])
            + array(1, [100, 200, 300], "H") + array(2, [-70000, 0, 70000], "i")
            + array(16, [0, 0, 0], "B"))
    t = gsf.read_pings(write(tmp_path, "p11.gsf", header_record() + ping_record(body, n=n)))
    assert t.column("depth").to_pylist() == [1.0, 2.0, 3.0]
    assert t.column("across_track").to_pylist() == [-700.0, 0.0, 700.0]


def test_p11_wrong_declared_size_recovered_by_lookahead(tmp_path):
    """P11: a depth array declaring 3N bytes but holding 2N: libgsf's look-ahead finds the
    next array header at 2N, so the width is 2 and the following arrays stay aligned."""
    n = 4
    body = (sf_table([(1, 0, 10, 0), (2, 0, 10, 0)])
            + array(1, [11, 22, 33, 44], "H", declared=3 * n)
            + array(2, [-1, -2, -3, -4], "h") + array(16, [0, 1, 0, 1], "B"))
    t = gsf.read_pings(write(tmp_path, "la.gsf", header_record() + ping_record(body, n=n)))
    assert t.column("depth").to_pylist() == [1.1, 2.2, 3.3, 4.4]
    assert t.column("across_track").to_pylist() == [-0.1, -0.2, -0.3, -0.4]
    assert t.column("beam_flags").to_pylist() == [0, 1, 0, 1]


def test_p11_fixed_width_arrays_ignore_the_nibble(tmp_path):
    """P11: vertical/horizontal error are always 2 bytes, whatever the nibble says."""
    n = 2
    body = (sf_table([(1, 0, 1, 0), (19, 0x40, 100, 0), (20, 0x10, 100, 0)])
            + array(1, [5, 6], "H") + array(19, [150, 250], "H") + array(20, [1, 2], "H")
            + array(16, [0, 0], "B"))
    t = gsf.read_pings(write(tmp_path, "fx.gsf", header_record() + ping_record(body, n=n)))
    assert t.column("vertical_error").to_pylist() == [1.5, 2.5]
    assert t.column("horizontal_error").to_pylist() == [0.01, 0.02]


# --- P12 / P13: time ---------------------------------------------------------------------------


def test_p12_exact_time_kept_as_integers(sample_by_name):
    """P12: sample #4's first ping is 21:21:44.559999465; the float loses the last digits."""
    t = gsf.read_pings(sample_by_name("EM302"))
    assert t.column("time_sec")[0].as_py() == 1541193704
    assert t.column("time_nsec")[0].as_py() == 559999465
    assert gsf.info(sample_by_name("EM302"))["time"]["start_iso"] == \
        "2018-11-02T21:21:44.559999465Z"


def test_p13_times_after_2038(tmp_path):
    """P13: seconds are unsigned 32-bit; a 2040 time is not negative."""
    sec = 2_209_032_000  # 2040-01-01
    t = gsf.read_pings(write(tmp_path, "t.gsf", header_record() + depth_ping([1], sec=sec, nsec=7)))
    assert t.column("time_sec").to_pylist() == [sec]
    assert t.column("time_nsec").to_pylist() == [7]


# --- P14: spec vs code -------------------------------------------------------------------------


def test_p14_kmall_arrays_variable_width_are_stepped_over(tmp_path):
    """P14: detection_window (29) 1-byte and TVG (31) 4-byte arrays, then depth, decode."""
    n = 3
    body = (sf_table([(1, 0, 100, 0), (29, 0, 1, 0), (31, 0, 1, 0)])
            + array(29, [1, 2, 3], "B") + array(31, [7, 8, 9], "I")
            + array(1, [400, 500, 600], "H") + array(16, [0, 0, 0], "B"))
    t = gsf.read_pings(write(tmp_path, "k.gsf", header_record("GSF-v03.10") + ping_record(body, n=n)))
    assert t.column("depth").to_pylist() == [4.0, 5.0, 6.0]
    assert set(gsf.info(write(tmp_path, "k2.gsf", header_record("GSF-v03.10")
                              + ping_record(body, n=n)))["arrays"]) >= {"detection_window", "tvg_db"}


# --- P15: across-track error is not across-track ----------------------------------------------


def test_p15_across_track_is_array_2_not_error_array_12(tmp_path):
    """P15: one PyPI reader fills across_track_error with across-track; here array 2 is
    across_track and the obsolete error array 12 is not mixed in."""
    n = 2
    body = (sf_table([(1, 0, 1, 0), (2, 0, 1, 0), (12, 0, 1, 0)])
            + array(1, [10, 20], "H") + array(2, [-3, 3], "h") + array(12, [99, 98], "H")
            + array(16, [0, 0], "B"))
    t = gsf.read_pings(write(tmp_path, "x.gsf", header_record() + ping_record(body, n=n)))
    assert t.column("across_track").to_pylist() == [-3.0, 3.0]


# --- other reader rules from the format notes ----------------------------------------------------


def test_quality_flags_subrecord_15_is_stepped_over(tmp_path):
    """Subrecord 15 (2-bit flags, ceil(N/4) bytes) is skipped and later arrays stay aligned."""
    n = 5
    body = (sf_table([(1, 0, 100, 0)]) + sub(15, bytes([0b11100100, 0b01000000]))
            + array(1, [1, 2, 3, 4, 5], "H") + array(16, [1, 0, 1, 0, 1], "B"))
    t = gsf.read_pings(write(tmp_path, "q.gsf", header_record() + ping_record(body, n=n)))
    assert t.column("depth").to_pylist() == [0.01, 0.02, 0.03, 0.04, 0.05]
    assert t.column("beam_flags").to_pylist() == [1, 0, 1, 0, 1]


def test_v2_header_is_42_bytes(tmp_path):
    """Before major version 3 the ping header has no height/separation/GPS tide (42 bytes)."""
    blob = header_record("GSF-v01.07") + depth_ping([123, 456], major=2)
    t = gsf.read_pings(write(tmp_path, "v1.gsf", blob))
    assert t.column("depth").to_pylist() == [1.23, 4.56]


def test_array_compression_is_a_clear_error(tmp_path):
    """GSF 3.09 array compression (low nibble 1) is refused with a clear message."""
    body = sf_table([(1, 0x21, 100, 0)]) + array(1, [1, 2], "H")
    path = write(tmp_path, "c.gsf", header_record("GSF-v03.09") + ping_record(body, n=2))
    with pytest.raises(GsfError, match="compression") as exc:
        gsf.read_pings(path)
    assert exc.value.offset == 20 and exc.value.path == str(path)


def test_unsigned_and_signed_arrays_and_offsets(tmp_path):
    """depth is unsigned, across/along signed; value = raw / multiplier - offset."""
    n = 2
    body = (sf_table([(1, 0x40, 1000, -1460), (2, 0, 100, 0), (3, 0x20, 100, 0)])
            + array(1, [4_000_000_000, 0], "I") + array(2, [-32768, 32767], "h")
            + array(3, [-1, 1], "h") + array(16, [0, 0], "B"))
    t = gsf.read_pings(write(tmp_path, "u.gsf", header_record() + ping_record(body, n=n)))
    assert t.column("depth").to_pylist() == [4_000_000_000 / 1000 + 1460, 1460.0]
    assert t.column("across_track").to_pylist() == [-327.68, 327.67]
    assert t.column("along_track").to_pylist() == [-0.01, 0.01]
