"""GSF record and subrecord layouts as data: ids, names, numpy dtypes, array widths.

Everything here is a table; the code that walks bytes lives in ``_framing`` and
``_decode``. Layouts follow the GSF specification and what libgsf 3.0x–3.11
actually decodes (see ``docs/gsf-format.md``). All fields are big-endian.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "RECORD_NAMES",
    "REC_HEADER",
    "REC_SWATH_PING",
    "MAX_RECORD_SIZE",
    "MIN_RECORD_SIZE",
    "PING_HEADER_V2",
    "PING_HEADER_V3",
    "SCALE_ENTRY",
    "SUMMARY_RECORD",
    "ArraySpec",
    "ARRAY_SPECS",
    "SUB_SCALE_FACTORS",
    "SUB_QUALITY_FLAGS",
    "SUB_BEAM_FLAGS",
    "SUB_INTENSITY_SERIES",
    "MAX_ARRAY_ID",
    "MAX_BEAMS",
    "OUTPUT_ARRAYS",
    "ping_header_dtype",
]

# --- records -------------------------------------------------------------------------

#: Record id (bits 21-0 of the id word) -> name. libgsf knows exactly these 12.
RECORD_NAMES: dict[int, str] = {
    1: "HEADER",
    2: "SWATH_BATHYMETRY_PING",
    3: "SOUND_VELOCITY_PROFILE",
    4: "PROCESSING_PARAMETERS",
    5: "SENSOR_PARAMETERS",
    6: "COMMENT",
    7: "HISTORY",
    8: "NAVIGATION_ERROR",
    9: "SWATH_BATHY_SUMMARY",
    10: "SINGLE_BEAM_PING",
    11: "HV_NAVIGATION_ERROR",
    12: "ATTITUDE",
}
REC_HEADER = 1
REC_SWATH_PING = 2

#: libgsf's GSF_MAX_RECORD_SIZE (512 KiB since 2009): a larger size word is damage.
MAX_RECORD_SIZE = 524_288
#: libgsf rejects a data part of 8 bytes or fewer; no real record is that small.
MIN_RECORD_SIZE = 9

# --- ping header ---------------------------------------------------------------------

_PING_HEADER_COMMON = [
    ("time_sec", ">u4"),         # POSIX seconds, read unsigned as libgsf does
    ("time_nsec", ">u4"),
    ("longitude", ">i4"),        # 1e-7 degree; longitude FIRST on disk (P1)
    ("latitude", ">i4"),         # 1e-7 degree
    ("number_beams", ">u2"),     # libgsf keeps it in a C short: valid 1..32767
    ("center_beam", ">u2"),
    ("ping_flags", ">u2"),
    ("reserved", ">u2"),
    ("tide_corrector", ">i2"),   # 0.01 m
    ("depth_corrector", ">i4"),  # 0.01 m
    ("heading", ">u2"),          # 0.01 degree
    ("pitch", ">i2"),            # 0.01 degree
    ("roll", ">i2"),             # 0.01 degree
    ("heave", ">i2"),            # 0.01 m
    ("course", ">u2"),           # 0.01 degree
    ("speed", ">u2"),            # 0.01 knot
]

#: Ping header of GSF major versions 1 and 2: 42 bytes, packed.
PING_HEADER_V2 = np.dtype(_PING_HEADER_COMMON)

#: Ping header from major version 3 on: 56 bytes (height, separation, GPS tide, spare).
PING_HEADER_V3 = np.dtype(_PING_HEADER_COMMON + [
    ("height", ">i4"),              # 0.001 m above the ellipsoid
    ("separation", ">i4"),          # 0.001 m
    ("gps_tide_corrector", ">i4"),  # 0.001 m
    ("spare", ">u2"),
])

assert PING_HEADER_V2.itemsize == 42 and PING_HEADER_V3.itemsize == 56


def ping_header_dtype(major: int) -> np.dtype:
    """The ping-header layout for a file's major version (the file's, not the library's)."""
    return PING_HEADER_V3 if major >= 3 else PING_HEADER_V2


#: One entry of the scale-factor subrecord (after its u32 count): 12 bytes.
SCALE_ENTRY = np.dtype([
    ("array_id", "u1"),
    ("compression", "u1"),   # high nibble field size, low nibble compression (1 = GSF-compressed)
    ("reserved", ">u2"),
    ("multiplier", ">u4"),
    ("offset", ">i4"),
])

#: SWATH_BATHY_SUMMARY record data (48 bytes). Not trusted for extents (P5).
SUMMARY_RECORD = np.dtype([
    ("start_sec", ">u4"), ("start_nsec", ">u4"),
    ("end_sec", ">u4"), ("end_nsec", ">u4"),
    ("min_latitude", ">i4"), ("min_longitude", ">i4"),
    ("max_latitude", ">i4"), ("max_longitude", ">i4"),
    ("min_depth", ">i4"), ("max_depth", ">i4"),
])

# --- subrecords ----------------------------------------------------------------------

SUB_SCALE_FACTORS = 100
SUB_QUALITY_FLAGS = 15
SUB_BEAM_FLAGS = 16
SUB_INTENSITY_SERIES = 21
#: Highest beam-array id (libgsf 3.10/3.11). Used by libgsf's width look-ahead.
MAX_ARRAY_ID = 31
#: number_beams lives in a C short in libgsf.
MAX_BEAMS = 32767


class ArraySpec(NamedTuple):
    """How one beam-array subrecord is stored.

    ``widths`` maps the field-size nibble (0x10/0x20/0x40) to a byte width; a nibble
    not listed gives ``default``. ``fixed`` arrays always use ``default``. ``scaled``
    arrays are ``raw / multiplier - offset``.
    """

    name: str
    signed: bool
    default: int
    widths: frozenset
    fixed: bool
    scaled: bool = True


def _flex(name, signed, default, widths):
    return ArraySpec(name, signed, default, frozenset(widths), False)


def _fixed(name, signed, width, scaled=True):
    return ArraySpec(name, signed, width, frozenset({width}), True, scaled)


#: Beam arrays 1-31 (15 quality flags and 21 intensity series are handled apart).
ARRAY_SPECS: dict[int, ArraySpec] = {
    1: _flex("depth", False, 2, {2, 4}),
    2: _flex("across_track", True, 2, {2, 4}),
    3: _flex("along_track", True, 2, {2, 4}),
    4: _flex("travel_time", False, 2, {2, 4}),
    5: _fixed("beam_angle", True, 2),
    6: _flex("mc_amplitude", True, 1, {1, 2}),
    7: _flex("mr_amplitude", False, 1, {1, 2}),
    8: _flex("echo_width", False, 1, {1, 2}),
    9: _fixed("quality_factor", False, 1),
    10: _fixed("receive_heave", True, 1),
    11: _fixed("depth_error", False, 2),
    12: _fixed("across_track_error", False, 2),
    13: _fixed("along_track_error", False, 2),
    14: _flex("nominal_depth", False, 2, {2, 4}),
    16: _fixed("beam_flags", False, 1, scaled=False),
    17: _fixed("signal_to_noise", True, 1),
    18: _fixed("beam_angle_forward", False, 2),
    19: _fixed("vertical_error", False, 2),
    20: _fixed("horizontal_error", False, 2),
    22: _fixed("sector_number", False, 1),
    23: _fixed("detection_info", False, 1),
    24: _fixed("incident_beam_adj", True, 1),
    25: _fixed("system_cleaning", False, 1),
    26: _fixed("doppler_corr", True, 1),
    27: _flex("sonar_vert_uncert", False, 2, {2, 4}),
    28: _flex("sonar_horz_uncert", False, 2, {2, 4}),
    29: _flex("detection_window", False, 2, {1, 2, 4}),
    30: _flex("mean_abs_coeff", False, 2, {1, 2, 4}),
    31: _flex("tvg_db", False, 2, {1, 2, 4}),
}

#: The arrays that become sounding columns: array id -> column name, in column order.
OUTPUT_ARRAYS: dict[int, str] = {
    1: "depth",
    2: "across_track",
    3: "along_track",
    14: "nominal_depth",
    16: "beam_flags",
    19: "vertical_error",
    20: "horizontal_error",
}
