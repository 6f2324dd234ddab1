"""The .bin header: bit widths worked out by hand from docs/pfm-format.md, key order and formats, parsing."""

import math

import numpy as np
import pytest

from pfm_dask.bins import BinGrid
from pfm_dask.errors import PfmFormatError
from pfm_dask.pfm._header import (BIN_HEADER_SIZE, KEYS, LIBRARY_VERSION, PfmHeader, bits_for,
                                  version_number)
from pfm_dask.pfm._store import PfmFile


def hand_bits(value):
    """The library rule written out: NINT(log10(v)/log10(2) + 0.5), NINT = trunc(x + 0.5) for x > 0."""
    return int(math.log10(value) / math.log10(2.0) + 0.5 + 0.5)


def grid():
    return BinGrid.from_mbr(30.1625, -88.7597, 30.1694, -88.7444, bin_size_m=2.0)


def test_bits_rule_hand_values():
    # depth: (max + offset + 1) * scale = (12000 + 10000 + 1) * 100 = 2,200,100 -> 22 bits
    assert bits_for(2200100) == 22 == hand_bits(2200100)
    # the pfm.h sample: offset 500, max 1000, scale 100 -> (1000 + 500 + 1) * 100 -> 18 bits
    assert bits_for(150100) == 18
    # powers of two round up (room for the value itself): 2**k -> k + 1 bits
    assert bits_for(1024) == 11 and bits_for(1023) == 10
    # counts: max_bin_soundings with no +1
    assert bits_for(16383) == 14 and bits_for(16384) == 15
    assert bits_for(0) == 0


def test_default_header_widths():
    h = PfmFile.new_header(grid(), bin_size_m=2.0)
    assert h.depth_bits == 22
    assert h.depth_scale == 100.0 and h.depth_offset == 10000.0
    assert h.null_depth == 12001.0
    assert (h.count_bits, h.std_bits, h.std_scale) == (24, 32, 1000000.0)
    assert (h.file_number_bits, h.line_number_bits, h.ping_number_bits, h.beam_number_bits) == (14, 15, 32, 16)
    assert (h.record_pointer_bits, h.offset_bits, h.validity_bits) == (38, 12, 23)
    assert h.bin_header_size == BIN_HEADER_SIZE == 131072
    # pfmLoader's error maxima: 10 x 2 m bins = 20 m -> (20 + 1) * 100 = 2100 -> 12 bits;
    # max depth >= 150 -> 10 % = 1200 m -> (1200 + 1) * 100 = 120100 -> 17 bits
    assert h.max_horizontal_error == 20.0 and h.horizontal_error_bits == 12
    assert h.max_vertical_error == 1200.0 and h.vertical_error_bits == 17
    h2 = PfmFile.new_header(grid(), bin_size_m=2.0, max_depth=100.0, min_depth=-10.0)
    assert h2.max_vertical_error == 15.0 and h2.vertical_error_bits == hand_bits(1600)


def test_bin_record_size_sample_figure():
    """docs/pfm-format.md §3: 14 depth bits and no attributes make a 263-bit, 33-byte bin record."""
    # 14 bits: (max + offset + 1) * scale must be in [2**13, 2**14): 0..99.99 at 0.01 -> 10001
    h = PfmFile.new_header(grid(), min_depth=0.0, max_depth=99.0, precision=0.01, bin_size_m=2.0)
    assert h.depth_bits == 14
    bits = 24 + 32 + 6 * 14 + 24 + 23 + 38 + 38
    assert bits == 263 and (bits + 7) // 8 == 33
    from pfm_dask.pfm._layout import bin_layout as _bin_layout
    assert _bin_layout(h, True).record_bytes == 33
    assert _bin_layout(h, False).record_bytes == (263 - 24 + 7) // 8   # pre-v7: no num_valid


def test_widths_from_maxima():
    h = PfmFile.new_header(grid(), max_files=8191, max_lines=1000, max_pings=2**31 - 1, max_beams=512,
                           max_bin_soundings=1000, bin_size_m=2.0)
    assert h.file_number_bits == 13
    assert h.line_number_bits == hand_bits(1000) == 10
    assert h.ping_number_bits == 31
    assert h.beam_number_bits == 10
    assert h.count_bits == 10


def test_header_text_formats_and_order():
    h = PfmFile.new_header(grid(), bin_size_m=2.0)
    text = h.to_text()
    lines = text.splitlines()
    keys = [ln.split(" = ")[0] for ln in lines]
    # keys in the library table order, [POINT] repeated once per polygon point
    expected = []
    for k, attr, typ, idx in KEYS:
        expected.extend([k] * (len(h.points) if k == "[POINT]" else 1))
    assert keys == expected
    d = {ln.split(" = ")[0]: ln.split(" = ", 1)[1] for ln in lines}
    assert lines[0] == f"[VERSION] = {LIBRARY_VERSION}"
    assert d["[RECORD LENGTH]"] == "6"
    assert d["[STD SCALE]"] == "1000000.000000"
    assert d["[DEPTH SCALE]"] == "100.000000"
    assert d["[DEPTH OFFSET]"] == "10000.000000"
    assert d["[NULL DEPTH]"] == "12001.000000"
    assert d["[VALIDITY BITS]"] == "23"
    assert d["[COVERAGE MAP ADDRESS]"] == "0"
    assert d["[MIN FILTERED DEPTH]"] == "9999999.000000"
    assert d["[MIN FILTERED COORD]"] == "0,0"
    assert d["[PROJECTION PARAMETER 0]"] == "0.000" and d["[PROJECTION PARAMETER 2]"] == "0.000000000000"
    assert d["[BIN ATTRIBUTE 3]"] == "" and "[BIN ATTRIBUTE 3] = \n" in text
    g = grid()
    assert d["[MIN Y]"] == "%.9f" % g.min_y and len(d["[MIN Y]"].split(".")[1]) == 9
    assert d["[X BIN SIZE]"] == "%.15f" % g.x_bin and len(d["[X BIN SIZE]"].split(".")[1]) == 15
    assert d["[BIN SIZE XY]"] == "%.15f" % g.bin_size_xy
    pts = [ln for ln in lines if ln.startswith("[POINT]")]
    assert pts[0] == "[POINT] = %.9f,%.9f" % tuple(g.polygon[0])
    block = h.to_bytes()
    assert len(block) == 131072 and block[len(text):] == bytes(131072 - len(text))


def test_degree_bin_sizes_in_header():
    """Minute bins: the degree sizes are printed with 15 decimals, exactly as given."""
    g = BinGrid.from_mbr(30.0, -88.8, 30.05, -88.7, x_bin_deg=0.05 / 60.0, y_bin_deg=0.05 / 60.0)
    h = PfmFile.new_header(g)
    text = h.to_text()
    assert "[X BIN SIZE] = 0.000833333333333\n" in text
    assert "[Y BIN SIZE] = 0.000833333333333\n" in text
    assert h.bin_width == int((g.max_x - g.min_x) / g.x_bin + 0.5) == g.width
    # horizontal error max for degree bins: 10 x the geodesic length of one y bin (~92.6 m)
    assert 900 < h.max_horizontal_error < 940


def test_parse_roundtrip_and_tolerance():
    h = PfmFile.new_header(grid(), bin_size_m=2.0)
    h.min_filtered_coord = (12, 34)
    h.bin_attribute_names[2] = "###2"
    h.max_standard_deviation = 2.874570
    text = h.to_text()
    p = PfmHeader.parse(text.encode() + b"\0garbage after the NUL is ignored")
    assert p.to_text() == text
    assert p.min_filtered_coord == (12, 34)
    assert p.points == [tuple(x) for x in grid().polygon.tolist()]
    # unknown keys kept aside, not written back; extra spaces tolerated
    p2 = PfmHeader.parse("[VERSION] =  " + LIBRARY_VERSION + "  \n[ATTRIBUTE FLAG BITS] = 1\n"
                         "[VALIDITY BITS] = 29\n[POINT] = 1.5,2.5\n[POINT] = 3.5,4.5\n")
    assert p2.version == LIBRARY_VERSION
    assert p2.unknown == {"[ATTRIBUTE FLAG BITS]": ["1"]}
    assert p2.validity_bits == 29
    assert p2.points == [(1.5, 2.5), (3.5, 4.5)]
    assert "[ATTRIBUTE FLAG BITS]" not in p2.to_text()
    # no [BIN HEADER SIZE]: the pre-6.0 default of 16384
    assert p2.size_missing and p2.bin_header_size == 16384
    # f32 keys hold C float values
    p3 = PfmHeader.parse("[MIN DEPTH] = 6.6\n")
    assert p3.min_depth == float(np.float32(6.6))
    assert "[MIN DEPTH] = 6.600000\n" in p3.to_text()


def test_version_numbers():
    assert version_number(LIBRARY_VERSION) == 70
    assert version_number("PFM Software - PFM I/O library V6.12 - 01/24/12") == 61
    assert version_number("PFM Software - PFM I/O library V5.40 - 01/24/12") == 54
    assert version_number("nothing here") == 0


def test_header_too_long_is_refused():
    h = PfmFile.new_header(grid(), bin_size_m=2.0)
    h.points = [(30.0, -88.0)] * 5000
    with pytest.raises(PfmFormatError, match="header"):
        h.to_bytes()
