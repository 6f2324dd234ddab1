"""The header a new PFM gets and the bit layouts of its bin and depth records.

:func:`new_header` computes what ``open_pfm_file`` and pfmLoader write for a new PFM (bit
widths from the maxima, error scales, null depth); :func:`bin_layout` and :func:`ndx_layout`
place the fields of a bin record and of a physical depth record as ``set_offsets`` does.
No I/O.
"""

from __future__ import annotations

import numpy as np

from .. import __version__ as _PKG_VERSION
from ..errors import ConfigError
from ._bitpack import BitLayout
from ._header import BIN_HEADER_SIZE, LIBRARY_VERSION, NUM_ATTR, WGS84_WKT, PfmHeader, bits_for

__all__ = ["new_header", "bin_layout", "ndx_layout", "DEPTH_FIELDS", "PFM_RECORD_LENGTH"]

# pfm.h defaults
PFM_FILE_BITS = 14
PFM_LINE_BITS = 15
PFM_PING_BITS = 32
PFM_BEAM_BITS = 16
PFM_RECORD_LENGTH = 6
PFM_COUNT_BITS = 24
PFM_STD_BITS = 32
PFM_STD_SCALE = 1000000.0
PFM_RECORD_POINTER_BITS = 38
PFM_OFFSET_BITS = 12
PFM_VALIDITY_BITS = 23

#: The depth fields of a bin record (statistics written by the recompute).
DEPTH_FIELDS = ("avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max")


def _f32(x) -> float:
    return float(np.float32(x))


def new_header(grid, *, min_depth=-10000.0, max_depth=12000.0, precision=0.01, max_files=0,
               max_lines=0, max_pings=0, max_beams=0, max_bin_soundings=0,
               record_length=PFM_RECORD_LENGTH, horizontal_error_max=None,
               vertical_error_max=None, horizontal_error_scale=100.0,
               vertical_error_scale=100.0, bin_size_m=None, max_record_pointer=0,
               classification="UNCLASSIFIED", creation_software=None, wkt=WGS84_WKT,
               dynamic_reload=1, user_flag_names=None) -> PfmHeader:
    """The header ``open_pfm_file`` + pfmLoader would write for a new PFM (no I/O)."""
    if not precision > 0:
        raise ConfigError(f"precision must be positive, got {precision}")
    if not max_depth > min_depth:
        raise ConfigError(f"max_depth ({max_depth}) must be greater than min_depth ({min_depth})")
    if not 1 <= int(record_length) <= 255:
        raise ConfigError(f"record_length must be 1..255, got {record_length}")
    for name, v in (("max_files", max_files), ("max_lines", max_lines), ("max_pings", max_pings),
                    ("max_beams", max_beams), ("max_bin_soundings", max_bin_soundings)):
        if v is not None and (int(v) < 0 or int(v) > 2**32 - 1):
            raise ConfigError(f"{name} must be 0 (library default) .. 2**32-1, got {v}")
    md = np.float32(max_depth)                       # PFM_OPEN_ARGS.max_depth is float
    off = np.float32(-float(min_depth))              # open_args.offset = -min_depth
    scale = np.float32(1.0 / float(precision))       # open_args.scale = 1 / precision
    # temp = max_depth + offset + 1.0 (float + float, then + double, stored in float)
    temp = np.float32(float(np.float32(md + off)) + 1.0)
    depth_bits = bits_for(float(np.float32(temp * scale)))
    null_depth = _f32(float(md) + 1.0)

    if vertical_error_max is None:
        vertical_error_max = 15.0 if float(md) < 150.0 else float(md) * 0.10
    if horizontal_error_max is None:
        if bin_size_m:
            horizontal_error_max = float(bin_size_m) * 10.0
        else:
            from ..geodesy import inverse

            d, _, _ = inverse(grid.min_y, grid.min_x, grid.min_y + grid.y_bin, grid.min_x)
            horizontal_error_max = float(d) * 10.0

    def err_bits(mx, sc):
        if not sc > 0.00001:
            return 0
        t = np.float32(np.float32(mx) + 1.0)
        return bits_for(float(np.float32(t * np.float32(sc))))

    h = PfmHeader()
    h.version = LIBRARY_VERSION
    h.record_length = int(record_length)
    h.date = PfmHeader.now()
    h.classification = classification
    h.creation_software = creation_software or f"PFM Software - pfm-dask V{_PKG_VERSION}"
    h.min_y, h.min_x, h.max_y, h.max_x = (float(grid.min_y), float(grid.min_x),
                                          float(grid.max_y), float(grid.max_x))
    h.bin_size_xy = float(grid.bin_size_xy)
    h.x_bin_size, h.y_bin_size = float(grid.x_bin), float(grid.y_bin)
    h.bin_width, h.bin_height = int(grid.width), int(grid.height)
    # pfmLoader's initial extrema (replaced by write_header at the end of a load)
    h.min_filtered_depth = h.min_depth = 9999999.0
    h.max_filtered_depth = h.max_depth = -9999999.0
    h.min_bin_count, h.max_bin_count = 9999999, 0
    h.min_standard_deviation, h.max_standard_deviation = 9999999.0, -9999999.0
    h.bin_header_size = BIN_HEADER_SIZE
    h.count_bits = bits_for(max_bin_soundings) if max_bin_soundings else PFM_COUNT_BITS
    h.std_bits = PFM_STD_BITS
    h.std_scale = PFM_STD_SCALE
    h.depth_bits = depth_bits
    h.depth_scale = float(scale)
    h.depth_offset = float(off)
    h.record_pointer_bits = (bits_for(max_record_pointer) if max_record_pointer
                             else PFM_RECORD_POINTER_BITS)
    h.file_number_bits = bits_for(max_files) if max_files else PFM_FILE_BITS
    h.line_number_bits = bits_for(max_lines) if max_lines else PFM_LINE_BITS
    h.ping_number_bits = bits_for(max_pings) if max_pings else PFM_PING_BITS
    h.beam_number_bits = bits_for(max_beams) if max_beams else PFM_BEAM_BITS
    h.offset_bits = int(getattr(grid, "offset_bits", PFM_OFFSET_BITS) or PFM_OFFSET_BITS)
    h.validity_bits = PFM_VALIDITY_BITS
    h.points = [(float(a), float(b)) for a, b in np.asarray(grid.polygon, dtype=np.float64)]
    h.well_known_text = wkt
    h.dynamic_reload = int(dynamic_reload)
    if user_flag_names is not None:
        names = list(user_flag_names)[:10]
        h.user_flag_names = names + h.user_flag_names[len(names):]
    h.coverage_map_address = 0
    h.horizontal_error_scale = _f32(horizontal_error_scale)
    h.max_horizontal_error = _f32(horizontal_error_max)
    h.horizontal_error_bits = err_bits(horizontal_error_max, horizontal_error_scale)
    h.vertical_error_scale = _f32(vertical_error_scale)
    h.max_vertical_error = _f32(vertical_error_max)
    h.vertical_error_bits = err_bits(vertical_error_max, vertical_error_scale)
    h.null_depth = null_depth
    if h.record_pointer_bits < 33:
        raise ConfigError("max_record_pointer gives fewer than 33 pointer bits; the library's "
                          "64-bit pointer packing needs at least 33")
    return h


def bin_layout(h: PfmHeader, has_num_valid: bool) -> BitLayout:
    """The bin record layout of ``set_offsets`` (count, std, 6 depths, num_valid, attrs, validity, head, tail)."""
    f = []
    pos = 0

    def add(key, nb):
        nonlocal pos
        f.append((key, pos, nb))
        pos += nb

    add("num_soundings", h.count_bits)
    add("std", h.std_bits)
    for k in DEPTH_FIELDS:
        add(k, h.depth_bits)
    if has_num_valid:
        add("num_valid", h.count_bits)
    for i in range(NUM_ATTR):
        add(("attr", i), int(h.bin_attribute_bits[i]))
    add("validity", h.validity_bits)
    add("head", h.record_pointer_bits)
    add("tail", h.record_pointer_bits)
    return BitLayout(f)


def ndx_layout(h: PfmHeader) -> tuple[BitLayout, int]:
    """Physical record layout: ``RECORD LENGTH`` soundings, then the continuation pointer."""
    per = [("file", h.file_number_bits), ("line", h.line_number_bits),
           ("ping", h.ping_number_bits), ("beam", h.beam_number_bits),
           ("depth", h.depth_bits), ("x_off", h.offset_bits), ("y_off", h.offset_bits)]
    per += [(("attr", i), int(h.ndx_attribute_bits[i])) for i in range(NUM_ATTR)]
    per += [("validity", h.validity_bits), ("horizontal_error", h.horizontal_error_bits),
            ("vertical_error", h.vertical_error_bits)]
    single = sum(nb for _, nb in per)
    f = []
    for s in range(h.record_length):
        pos = s * single
        for key, nb in per:
            f.append(((key, s), pos, nb))
            pos += nb
    f.append(("continuation", single * h.record_length, h.record_pointer_bits))
    return BitLayout(f), single
