"""The PFM ``.bin`` header: every key of PFM library V7.00, as a typed dataclass.

The header is ASCII ``[KEY] = value`` lines in a fixed order, zero filled to
``[BIN HEADER SIZE]`` bytes (131072 for files created by v7). The key order,
value types and print formats follow the library's key table
(``lib-pfm_lib : pfm_header.h``) and its writer/reader (``write_bin_header``,
``read_bin_header`` in ``pfm_io.c``); see docs/pfm-format.md §2:

* ``f32`` keys print with ``%f`` of the C ``float`` value, ``f64`` keys with
  ``%f``, ``f64pN`` keys with ``%.Nf`` (9 decimals for the MBR, 15 for bin
  sizes, 3/12 for projection parameters), ``[POINT]`` as ``%.9f,%.9f``
  (latitude, longitude), coordinates ``x,y`` as ``%d,%d``.
* Reading scans lines up to the first NUL byte; the value is what follows the
  first ``=``; strings are trimmed of blanks; ``[POINT]`` repeats. Unknown keys
  are kept in :attr:`PfmHeader.unknown` and not written back (the library
  drops them too).
* Files without ``[BIN HEADER SIZE]`` are pre-6.0 (16384-byte header).

This module knows nothing about the bit layouts; :mod:`._store` derives them.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, fields as dc_fields
from typing import Any

import numpy as np

from ..errors import PfmFormatError

__all__ = [
    "LIBRARY_VERSION",
    "BIN_HEADER_SIZE",
    "OLD_BIN_HEADER_SIZE",
    "NUM_ATTR",
    "PFM_USER_FLAGS",
    "WGS84_WKT",
    "PfmHeader",
    "bits_for",
    "version_number",
]

#: Version string written by PFM library V7.00; the first part must never change.
LIBRARY_VERSION = "PFM Software - PFM I/O library V7.00 - 05/15/19"
#: Header block size of files created by v7 (``BIN_HEADER_SIZE`` in ``pfm_io.c``).
BIN_HEADER_SIZE = 131072
#: Header size assumed when ``[BIN HEADER SIZE]`` is missing (pre-6.0 files).
OLD_BIN_HEADER_SIZE = 16384
#: Number of bin / ndx attribute slots in v7.
NUM_ATTR = 20
#: Number of user flag names.
PFM_USER_FLAGS = 10

#: The geographic WGS-84 / ellipsoid-height WKT that pfmLoader stores for GSF input
#: (the example given in ``pfm.h``).
WGS84_WKT = (
    'COMPD_CS["WGS84 with ellipsoid Z",GEOGCS["WGS 84",DATUM["WGS_1984",SPHEROID["WGS 84",'
    '6378137,298.257223563,AUTHORITY["EPSG","7030"]],TOWGS84[0,0,0,0,0,0,0],AUTHORITY["EPSG",'
    '"6326"]],PRIMEM["Greenwich",0,AUTHORITY["EPSG","8901"]],UNIT["degree",0.01745329251994328,'
    'AUTHORITY["EPSG","9108"]],AXIS["Lat",NORTH],AXIS["Long",EAST],AUTHORITY["EPSG","4326"]],'
    'VERT_CS["ellipsoid Z in meters",VERT_DATUM["Ellipsoid",2002],UNIT["metre",1],AXIS["Z",UP]]]'
)


def bits_for(value: float) -> int:
    """The library's bit-width rule: ``NINT(log10(value) / log10(2) + 0.5)``.

    ``value`` is the (offset) range times the scale, already including the
    ``+1`` that leaves room for a null; e.g. depth: ``(max + offset + 1) *
    scale``. For positive results this is ``floor(log2(value)) + 1``.
    """
    v = float(value)
    if v <= 0.0:
        return 0
    x = np.log10(v) / np.log10(2.0) + 0.5
    return int(x + 0.5) if x >= 0 else int(x - 0.5)


def version_number(version: str) -> int:
    """``list_file_ver`` of a version string: the number after "library V", times 10 (7.00 -> 70)."""
    m = re.search(r"library V\s*([0-9]+(?:\.[0-9]*)?)", version or "")
    if not m:
        return 0
    # sscanf into a C float, then float * 10.0 + 0.05 in double, truncated to int16
    return int(float(np.float32(float(m.group(1)))) * 10.0 + 0.05)


def _f32(x) -> float:
    return float(np.float32(x))


# --- the key table: (key phrase, attribute, type, index) in library order -----------------
# type: "string", "i32", "ui32", "ui16", "uc", "b", "i64", "f32", "f64", "f64pN",
#       "i32c2" (x,y), "f64c2" (repeating [POINT], lat,lon)

def _key_table() -> list[tuple[str, str, str, int | None]]:
    t: list[tuple[str, str, str, int | None]] = [
        ("[VERSION]", "version", "string", None),
        ("[RECORD LENGTH]", "record_length", "ui32", None),
        ("[DATE]", "date", "string", None),
        ("[CLASSIFICATION]", "classification", "string", None),
        ("[CREATION SOFTWARE]", "creation_software", "string", None),
        ("[MIN Y]", "min_y", "f64p9", None),
        ("[MIN X]", "min_x", "f64p9", None),
        ("[MAX Y]", "max_y", "f64p9", None),
        ("[MAX X]", "max_x", "f64p9", None),
        ("[BIN SIZE XY]", "bin_size_xy", "f64p15", None),
        ("[X BIN SIZE]", "x_bin_size", "f64p15", None),
        ("[Y BIN SIZE]", "y_bin_size", "f64p15", None),
        ("[BIN WIDTH]", "bin_width", "i32", None),
        ("[BIN HEIGHT]", "bin_height", "i32", None),
        ("[MIN FILTERED DEPTH]", "min_filtered_depth", "f32", None),
        ("[MAX FILTERED DEPTH]", "max_filtered_depth", "f32", None),
        ("[MIN FILTERED COORD]", "min_filtered_coord", "i32c2", None),
        ("[MAX FILTERED COORD]", "max_filtered_coord", "i32c2", None),
        ("[MIN DEPTH]", "min_depth", "f32", None),
        ("[MAX DEPTH]", "max_depth", "f32", None),
        ("[MIN COORD]", "min_coord", "i32c2", None),
        ("[MAX COORD]", "max_coord", "i32c2", None),
        ("[BIN HEADER SIZE]", "bin_header_size", "ui32", None),
        ("[COUNT BITS]", "count_bits", "ui32", None),
        ("[STD BITS]", "std_bits", "ui32", None),
        ("[STD SCALE]", "std_scale", "f32", None),
        ("[DEPTH BITS]", "depth_bits", "ui32", None),
        ("[DEPTH SCALE]", "depth_scale", "f32", None),
        ("[DEPTH OFFSET]", "depth_offset", "f32", None),
        ("[RECORD POINTER BITS]", "record_pointer_bits", "ui32", None),
        ("[FILE NUMBER BITS]", "file_number_bits", "ui32", None),
        ("[LINE NUMBER BITS]", "line_number_bits", "ui32", None),
        ("[PING NUMBER BITS]", "ping_number_bits", "ui32", None),
        ("[BEAM NUMBER BITS]", "beam_number_bits", "ui32", None),
        ("[OFFSET BITS]", "offset_bits", "ui32", None),
        ("[VALIDITY BITS]", "validity_bits", "ui32", None),
        ("[POINT]", "points", "f64c2", None),
        ("[MINIMUM BIN COUNT]", "min_bin_count", "i32", None),
        ("[MAXIMUM BIN COUNT]", "max_bin_count", "i32", None),
        ("[MIN COUNT COORD]", "min_count_coord", "i32c2", None),
        ("[MAX COUNT COORD]", "max_count_coord", "i32c2", None),
        ("[MIN STANDARD DEVIATION]", "min_standard_deviation", "f64", None),
        ("[MAX STANDARD DEVIATION]", "max_standard_deviation", "f64", None),
        ("[CHART SCALE]", "chart_scale", "f32", None),
        ("[CLASS TYPE]", "class_type", "i32", None),
        ("[PROJECTION]", "projection", "uc", None),
        ("[PROJECTION ZONE]", "projection_zone", "ui16", None),
        ("[HEMISPHERE]", "hemisphere", "uc", None),
        ("[WELL-KNOWN TEXT]", "well_known_text", "string", None),
    ]
    for i in range(16):
        t.append((f"[PROJECTION PARAMETER {i}]", "projection_parameters",
                  "f64p3" if i < 2 else "f64p12", i))
    t += [
        ("[AVERAGE FILTERED NAME]", "average_filtered_name", "string", None),
        ("[AVERAGE NAME]", "average_name", "string", None),
        ("[DYNAMIC RELOAD]", "dynamic_reload", "b", None),
        ("[NUMBER OF BIN ATTRIBUTES]", "num_bin_attributes", "ui16", None),
    ]
    t += [(f"[BIN ATTRIBUTE {i}]", "bin_attribute_names", "string", i) for i in range(NUM_ATTR)]
    t += [(f"[BIN ATTRIBUTE OFFSET {i}]", "bin_attribute_offsets", "f32", i) for i in range(NUM_ATTR)]
    t += [(f"[BIN ATTRIBUTE MAX {i}]", "bin_attribute_max", "f32", i) for i in range(NUM_ATTR)]
    t += [(f"[BIN ATTRIBUTE NULL {i}]", "bin_attribute_null", "f32", i) for i in range(NUM_ATTR)]
    for i in range(NUM_ATTR):
        t.append((f"[MINIMUM BIN ATTRIBUTE {i}]", "min_bin_attribute", "f32", i))
        t.append((f"[MAXIMUM BIN ATTRIBUTE {i}]", "max_bin_attribute", "f32", i))
    t += [(f"[BIN ATTRIBUTE BITS {i}]", "bin_attribute_bits", "i32", i) for i in range(NUM_ATTR)]
    t += [(f"[BIN ATTRIBUTE SCALE {i}]", "bin_attribute_scale", "f32", i) for i in range(NUM_ATTR)]
    t.append(("[NUMBER OF NDX ATTRIBUTES]", "num_ndx_attributes", "ui16", None))
    t += [(f"[NDX ATTRIBUTE {i}]", "ndx_attribute_names", "string", i) for i in range(NUM_ATTR)]
    for i in range(NUM_ATTR):
        t.append((f"[MINIMUM NDX ATTRIBUTE {i}]", "min_ndx_attribute", "f32", i))
        t.append((f"[MAXIMUM NDX ATTRIBUTE {i}]", "max_ndx_attribute", "f32", i))
    t += [(f"[NDX ATTRIBUTE BITS {i}]", "ndx_attribute_bits", "i32", i) for i in range(NUM_ATTR)]
    t += [(f"[NDX ATTRIBUTE SCALE {i}]", "ndx_attribute_scale", "f32", i) for i in range(NUM_ATTR)]
    t += [(f"[USER FLAG {i + 1} NAME]", "user_flag_names", "string", i) for i in range(PFM_USER_FLAGS)]
    t += [
        ("[COVERAGE MAP ADDRESS]", "coverage_map_address", "i64", None),
        ("[HORIZONTAL ERROR BITS]", "horizontal_error_bits", "i32", None),
        ("[HORIZONTAL ERROR SCALE]", "horizontal_error_scale", "f32", None),
        ("[MAXIMUM HORIZONTAL ERROR]", "max_horizontal_error", "f32", None),
        ("[VERTICAL ERROR BITS]", "vertical_error_bits", "i32", None),
        ("[VERTICAL ERROR SCALE]", "vertical_error_scale", "f32", None),
        ("[MAXIMUM VERTICAL ERROR]", "max_vertical_error", "f32", None),
        ("[NULL DEPTH]", "null_depth", "f32", None),
    ]
    return t


KEYS = _key_table()
_KEY_INDEX = {k: (attr, typ, idx) for k, attr, typ, idx in KEYS}


def _zeros(n=NUM_ATTR, v=0.0):
    return field(default_factory=lambda: [v] * n)


@dataclass
class PfmHeader:
    """All keys of a v7 ``.bin`` header, with the library's types.

    Floats marked ``f32`` in the library are kept as Python floats holding the
    C ``float`` value (they are rounded to float32 when set through
    :meth:`parse` or printed by :meth:`to_text`). Coordinates are ``(x, y)``
    = ``(column, row)`` tuples. ``points`` is the polygon as ``(lat, lon)``
    pairs. Per-attribute keys are lists of 20.
    """

    version: str = LIBRARY_VERSION
    record_length: int = 6
    date: str = ""
    classification: str = "UNCLASSIFIED"
    creation_software: str = ""
    min_y: float = 0.0
    min_x: float = 0.0
    max_y: float = 0.0
    max_x: float = 0.0
    bin_size_xy: float = 0.0
    x_bin_size: float = 0.0
    y_bin_size: float = 0.0
    bin_width: int = 0
    bin_height: int = 0
    min_filtered_depth: float = 0.0
    max_filtered_depth: float = 0.0
    min_filtered_coord: tuple[int, int] = (0, 0)
    max_filtered_coord: tuple[int, int] = (0, 0)
    min_depth: float = 0.0
    max_depth: float = 0.0
    min_coord: tuple[int, int] = (0, 0)
    max_coord: tuple[int, int] = (0, 0)
    bin_header_size: int = OLD_BIN_HEADER_SIZE
    count_bits: int = 0
    std_bits: int = 0
    std_scale: float = 0.0
    depth_bits: int = 0
    depth_scale: float = 0.0
    depth_offset: float = 0.0
    record_pointer_bits: int = 0
    file_number_bits: int = 0
    line_number_bits: int = 0
    ping_number_bits: int = 0
    beam_number_bits: int = 0
    offset_bits: int = 0
    validity_bits: int = 0
    points: list[tuple[float, float]] = field(default_factory=list)
    min_bin_count: int = 0
    max_bin_count: int = 0
    min_count_coord: tuple[int, int] = (0, 0)
    max_count_coord: tuple[int, int] = (0, 0)
    min_standard_deviation: float = 0.0
    max_standard_deviation: float = 0.0
    chart_scale: float = 0.0
    class_type: int = 0
    projection: int = 0
    projection_zone: int = 0
    hemisphere: int = 0
    well_known_text: str = ""
    projection_parameters: list[float] = _zeros(16)
    average_filtered_name: str = "Average Filtered Depth"
    average_name: str = "Average Depth"
    dynamic_reload: int = 0
    num_bin_attributes: int = 0
    bin_attribute_names: list[str] = _zeros(v="")
    bin_attribute_offsets: list[float] = _zeros()
    bin_attribute_max: list[float] = _zeros()
    bin_attribute_null: list[float] = _zeros()
    min_bin_attribute: list[float] = _zeros()
    max_bin_attribute: list[float] = _zeros()
    bin_attribute_bits: list[int] = _zeros(v=0)
    bin_attribute_scale: list[float] = _zeros()
    num_ndx_attributes: int = 0
    ndx_attribute_names: list[str] = _zeros(v="")
    min_ndx_attribute: list[float] = _zeros()
    max_ndx_attribute: list[float] = _zeros()
    ndx_attribute_bits: list[int] = _zeros(v=0)
    ndx_attribute_scale: list[float] = _zeros()
    user_flag_names: list[str] = field(
        default_factory=lambda: [f"PFM_USER_{i + 1:02d}" for i in range(PFM_USER_FLAGS)])
    coverage_map_address: int = 0
    horizontal_error_bits: int = 0
    horizontal_error_scale: float = 0.0
    max_horizontal_error: float = 0.0
    vertical_error_bits: int = 0
    vertical_error_scale: float = 0.0
    max_vertical_error: float = 0.0
    null_depth: float = 0.0
    #: keys found in a parsed header that the v7 table does not know: key -> list of raw values
    unknown: dict[str, list[str]] = field(default_factory=dict)
    #: True if the parsed text had no ``[BIN HEADER SIZE]`` key (pre-6.0 layout)
    size_missing: bool = False

    # ------------------------------------------------------------ properties
    @property
    def list_file_version(self) -> int:
        """Version times 10 (70 for V7.00), as the library's ``list_file_ver``."""
        return version_number(self.version)

    @property
    def has_num_valid(self) -> bool:
        """Bin records carry the v7 ``num_valid`` field."""
        return self.list_file_version >= 70

    # ------------------------------------------------------------ formatting
    @staticmethod
    def _fmt(typ: str, value: Any) -> str:
        if typ == "string":
            return str(value)
        if typ in ("i32", "ui32", "ui16", "uc", "b", "i64"):
            return "%d" % int(value)
        if typ == "f32":
            return "%f" % float(np.float32(value))
        if typ == "f64":
            return "%f" % float(value)
        if typ.startswith("f64p"):
            return "%.*f" % (int(typ[4:]), float(value))
        if typ == "i32c2":
            return "%d,%d" % (int(value[0]), int(value[1]))
        if typ == "f64c2":
            return "%.9f,%.9f" % (float(value[0]), float(value[1]))
        raise ValueError(typ)

    def to_text(self) -> str:
        """The header lines exactly as ``write_bin_header`` prints them (no zero fill)."""
        out = []
        for key, attr, typ, idx in KEYS:
            v = getattr(self, attr)
            if typ == "f64c2":
                pts = v if v else [(0.0, 0.0)]  # the library writes one dummy for an empty repeat
                out.extend(f"{key} = {self._fmt(typ, p)}\n" for p in pts)
                continue
            if idx is not None:
                v = v[idx]
            out.append(f"{key} = {self._fmt(typ, v)}\n")
        return "".join(out)

    def to_bytes(self) -> bytes:
        """The whole header block: text, zero filled to :attr:`bin_header_size` bytes."""
        raw = self.to_text().encode("latin-1")
        size = int(self.bin_header_size)
        if len(raw) >= size:
            raise PfmFormatError(f"header text is {len(raw):,} bytes, more than the "
                                 f"{size:,}-byte header block (too many [POINT]s or a long WKT?)")
        return raw + bytes(size - len(raw))

    # --------------------------------------------------------------- parsing
    @classmethod
    def parse(cls, data: bytes | str, *, path=None) -> "PfmHeader":
        """Parse header text or a header block (stops at the first NUL byte).

        Unknown keys go to :attr:`unknown`; a missing ``[BIN HEADER SIZE]``
        leaves :attr:`bin_header_size` at 16384 and sets :attr:`size_missing`.
        """
        if isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
            nul = raw.find(b"\0")
            if nul >= 0:
                raw = raw[:nul]
            text = raw.decode("latin-1")
        else:
            text = data.split("\0", 1)[0]
        h = cls(version="", classification="", average_filtered_name="", average_name="",
                user_flag_names=[""] * PFM_USER_FLAGS)
        seen_size = False
        for line in text.split("\n"):
            if "=" not in line and not line.strip():
                continue
            lb = line.find("[")
            rb = line.find("]", lb + 1)
            if lb < 0 or rb < 0:
                continue
            key = line[lb: rb + 1]
            value = line.split("=", 1)[1] if "=" in line else ""
            ent = _KEY_INDEX.get(key)
            if ent is None:
                h.unknown.setdefault(key, []).append(value.strip(" "))
                continue
            attr, typ, idx = ent
            if attr == "bin_header_size":
                seen_size = True
            try:
                val = cls._scan(typ, value)
            except ValueError as exc:
                raise PfmFormatError(f"header key {key}: cannot read value {value.strip()!r}",
                                     path=path) from exc
            if typ == "f64c2":
                h.points.append(val)
            elif idx is not None:
                getattr(h, attr)[idx] = val
            else:
                setattr(h, attr, val)
        h.size_missing = not seen_size
        # read_bin_header's defaults for empty names
        for i in range(PFM_USER_FLAGS):
            if not h.user_flag_names[i]:
                h.user_flag_names[i] = f"PFM_USER_{i + 1:02d}"
        if not h.average_filtered_name:
            h.average_filtered_name = "Average Filtered Depth"
        if not h.average_name:
            h.average_name = "Average Depth"
        return h

    @staticmethod
    def _scan(typ: str, value: str):
        s = value.strip()
        if typ == "string":
            return value.strip(" ").rstrip("\r")
        if typ in ("i32", "ui32", "ui16", "uc", "b", "i64"):
            m = re.match(r"[+-]?\d+", s)
            return int(m.group(0)) if m else 0
        if typ in ("f32", "f64") or typ.startswith("f64p"):
            m = re.match(r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?|inf|nan)", s, re.I)
            v = float(m.group(0)) if m else 0.0
            return _f32(v) if typ == "f32" else v
        if typ == "i32c2":
            a, _, b = s.partition(",")
            return (PfmHeader._scan("i32", a), PfmHeader._scan("i32", b))
        if typ == "f64c2":
            a, _, b = s.partition(",")
            return (PfmHeader._scan("f64", a), PfmHeader._scan("f64", b))
        raise ValueError(typ)

    # --------------------------------------------------------------- helpers
    def copy(self) -> "PfmHeader":
        """A deep copy."""
        kw = {}
        for f in dc_fields(self):
            v = getattr(self, f.name)
            kw[f.name] = (list(v) if isinstance(v, list)
                          else dict(v) if isinstance(v, dict) else v)
        return PfmHeader(**kw)

    @staticmethod
    def now() -> str:
        """The creation date as the library writes it (``asctime`` of local time, no newline)."""
        return time.asctime(time.localtime())
