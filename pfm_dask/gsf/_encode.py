"""A vectorised GSF 03.0x writer: header, comment, history, processing parameters, summary and pings.

The writer exists so that tests and benchmarks can make GSF files of any size and shape that
libgsf (through gsfpy) and our reader both accept. Ping records are built many at a time: the
pings of one :meth:`GsfWriter.write_pings` call that share a layout become numpy structured
arrays (about a megabyte of beams at a time) whose memory is written to the file as is, so
writing runs at close to disk speed (~360 MB/s for EM302-sized pings on one core).

Conventions follow docs/gsf-format.md §1–§3: big-endian, records padded to 4 bytes with the size word
counting the padding, a 56-byte ping header for major version ≥ 3 (42 bytes before), a
scale-factor subrecord (id 100) in the first ping and again whenever factors change (listing
only the entries that changed), per-beam arrays quantised as
``raw = round_half_away((value + offset) × multiplier)``, beam flags (id 16) raw, and a closing
"unknown sensor" subrecord (id 0, size 0) as libgsf itself writes.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..errors import GsfError

__all__ = ["GsfWriter", "ScaleFactor"]

# Record ids (docs/gsf-format.md §2; the reader's table is gsf/_records.py).
_REC_HEADER = 1
_REC_PING = 2
_REC_PROCESSING_PARAMETERS = 4
_REC_COMMENT = 6
_REC_HISTORY = 7
_REC_SUMMARY = 9

_SUB_SCALE_FACTORS = 100
_SUB_BEAM_FLAGS = 16
_MAX_RECORD_SIZE = 524_288  # libgsf's GSF_MAX_RECORD_SIZE (data part)

#: Array subrecord ids the writer can produce, by the name of the keyword argument.
ARRAY_IDS = {
    "depth": 1,
    "across_track": 2,
    "along_track": 3,
    "travel_time": 4,
    "beam_angle": 5,
    "nominal_depth": 14,
    "vertical_error": 19,
    "horizontal_error": 20,
}

# Per array: signed?, and the (width, multiplier) pairs tried in order by the automatic
# choice (the first that holds the whole range wins). Arrays that libgsf reads with one fixed
# width (beam_angle, errors) only list that width, with coarser multipliers as fallbacks.
_ARRAY_RULES: dict[str, tuple[bool, tuple[tuple[int, int], ...]]] = {
    "depth": (False, ((2, 100), (4, 1000))),
    "nominal_depth": (False, ((2, 100), (4, 1000))),
    "across_track": (True, ((2, 100), (4, 1000))),
    "along_track": (True, ((2, 100), (4, 1000))),
    "travel_time": (False, ((2, 10_000), (4, 1_000_000))),
    "beam_angle": (True, ((2, 100), (2, 10))),
    "vertical_error": (False, ((2, 100), (2, 10), (2, 1))),
    "horizontal_error": (False, ((2, 100), (2, 10), (2, 1))),
}
_FIXED_WIDTH = {"beam_angle": 2, "vertical_error": 2, "horizontal_error": 2}

_INT_RANGE = {
    (1, False): (0, 0xFF), (2, False): (0, 0xFFFF), (4, False): (0, 0xFFFF_FFFF),
    (1, True): (-0x80, 0x7F), (2, True): (-0x8000, 0x7FFF), (4, True): (-0x8000_0000, 0x7FFF_FFFF),
}
_WIDTH_NIBBLE = {1: 0x10, 2: 0x20, 4: 0x40}

_NULL_HEIGHT = 9999.99  # GSF_NULL_HEIGHT / GSF_NULL_SEP


def round_half_away(x):
    """Round to the nearest integer, halves away from zero (GSF's encoder rule), as float64."""
    x = np.asarray(x, dtype=np.float64)
    return np.trunc(x + np.copysign(0.5, x))


def _quantise(a: np.ndarray, sf: "ScaleFactor", nonnegative: bool) -> np.ndarray:
    """(a + offset) × multiplier ± ½ in float64: casting it to an integer type (which truncates
    toward zero) then gives round_half_away((a + offset) × multiplier).

    ``nonnegative`` says the scaled values are known to be ≥ 0 (unsigned fields after the
    range check), which saves a pass.
    """
    t = np.add(a, float(sf.offset), dtype=np.float64)
    t *= float(sf.multiplier)
    if nonnegative:
        t += 0.5
    else:
        t += np.copysign(0.5, t)
    return t


@dataclass(frozen=True)
class ScaleFactor:
    """One scale-factor entry: ``raw = round_half_away((value + offset) × multiplier)``.

    ``width`` is the field size in bytes (1, 2 or 4); it goes into the high nibble of the
    compression-flag byte.
    """

    multiplier: int
    offset: int
    width: int

    def __post_init__(self):
        if not (1 <= int(self.multiplier) <= 0xFFFF_FFFF) or int(self.multiplier) != self.multiplier:
            raise GsfError(f"multiplier must be an integer in 1..2**32-1, got {self.multiplier!r}")
        if not (-0x8000_0000 <= int(self.offset) <= 0x7FFF_FFFF) or int(self.offset) != self.offset:
            raise GsfError(f"offset must be a 32-bit integer, got {self.offset!r}")
        if self.width not in (1, 2, 4):
            raise GsfError(f"width must be 1, 2 or 4 bytes, got {self.width!r}")


def _parse_version(version: str, path=None) -> tuple[int, int]:
    m = re.fullmatch(r"GSF-v([0-9]+)\.([0-9]+)", version)
    if not m or len(version) > 12:
        raise GsfError(f"version must look like 'GSF-v03.08' (at most 12 characters), got {version!r}",
                       path=path)
    return int(m.group(1)), int(m.group(2))


def _time_pair(time, path=None) -> tuple[int, int]:
    """(seconds, nanoseconds) from None (0), a number of seconds, or a (sec, nsec) pair."""
    if time is None:
        return 0, 0
    if isinstance(time, (tuple, list)):
        sec, nsec = int(time[0]), int(time[1])
    else:
        t = float(time)
        sec = int(np.floor(t))
        nsec = int(round((t - sec) * 1e9))
        if nsec >= 1_000_000_000:
            sec, nsec = sec + 1, nsec - 1_000_000_000
    if not (0 <= sec <= 0xFFFF_FFFF and 0 <= nsec < 1_000_000_000):
        raise GsfError(f"time must be 0 ≤ seconds < 2**32 and 0 ≤ ns < 1e9, got {time!r}", path=path)
    return sec, nsec


def _pad4(n: int) -> int:
    return (-n) % 4


class GsfWriter:
    """Write a GSF file: the header record at open, then comments, history, pings, … in call order.

    Use as a context manager (``with GsfWriter(path) as w: w.write_pings(...)``). Scale factors
    are state of the file: the writer remembers the table it last wrote and emits a new
    scale-factor subrecord, listing only the entries that changed, when a later call needs
    different factors.
    """

    def __init__(self, path: str | os.PathLike, *, version: str = "GSF-v03.08"):
        self.path = os.fspath(path)
        self.version = version
        self.major, self.minor = _parse_version(version, self.path)
        self.scale_factors: dict[int, ScaleFactor] = {}  #: current table, by array id
        self.pings_written = 0
        self.records_written = 0
        self._fh = open(self.path, "wb")
        self._offset = 0
        body = version.encode("ascii").ljust(12, b"\0")
        self._write_record(_REC_HEADER, body)

    # -- plumbing -----------------------------------------------------------------------------
    def __enter__(self) -> "GsfWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def close(self) -> None:
        """Flush and close the file (idempotent)."""
        if self._fh is not None and not self._fh.closed:
            self._fh.close()

    @property
    def bytes_written(self) -> int:
        """Bytes written to the file so far."""
        return self._offset

    def _error(self, message: str) -> GsfError:
        return GsfError(message, path=self.path, offset=self._offset)

    def _write_record(self, record_id: int, data: bytes) -> None:
        pad = _pad4(len(data))
        size = len(data) + pad
        if size > _MAX_RECORD_SIZE:
            raise self._error(f"record of {size:,} bytes exceeds the GSF maximum of {_MAX_RECORD_SIZE:,}")
        self._fh.write(np.array([size, record_id], dtype=">u4").tobytes() + data + b"\0" * pad)
        self._offset += 8 + size
        self.records_written += 1

    # -- small records ------------------------------------------------------------------------
    def write_comment(self, text: str, *, time=None) -> None:
        """A COMMENT record (id 6): time, u32 length, the text (UTF-8, no terminating NUL)."""
        sec, nsec = _time_pair(time, self.path)
        raw = text.encode("utf-8")
        self._write_record(_REC_COMMENT, np.array([sec, nsec, len(raw)], ">u4").tobytes() + raw)

    def write_history(self, *, time=None, host_name: str = "", operator_name: str = "",
                      command_line: str = "", comment: str = "") -> None:
        """A HISTORY record (id 7): time, then four u16-length NUL-terminated strings."""
        sec, nsec = _time_pair(time, self.path)
        parts = [np.array([sec, nsec], ">u4").tobytes()]
        for name, s in (("host_name", host_name), ("operator_name", operator_name),
                        ("command_line", command_line), ("comment", comment)):
            raw = s.encode("utf-8") + b"\0"
            if name in ("host_name", "operator_name") and len(raw) > 65:
                raise self._error(f"{name} is limited to 64 bytes by libgsf, got {len(raw) - 1}")
            if len(raw) > 0xFFFF:
                raise self._error(f"{name} is too long for a u16 length ({len(raw)} bytes)")
            parts.append(np.array([len(raw)], ">u2").tobytes() + raw)
        self._write_record(_REC_HISTORY, b"".join(parts))

    def write_processing_parameters(self, params: Mapping[str, object] | list[str], *,
                                    time=None) -> None:
        """A PROCESSING_PARAMETERS record (id 4): ``KEY=VALUE`` strings (u16 length incl. NUL)."""
        sec, nsec = _time_pair(time, self.path)
        items = ([f"{k}={v}" for k, v in params.items()] if isinstance(params, Mapping)
                 else [str(p) for p in params])
        if len(items) > 128:
            raise self._error(f"libgsf reads at most 128 processing parameters, got {len(items)}")
        parts = [np.array([sec, nsec], ">u4").tobytes(), np.array([len(items)], ">u2").tobytes()]
        for s in items:
            raw = s.encode("utf-8") + b"\0"
            parts.append(np.array([len(raw)], ">u2").tobytes() + raw)
        self._write_record(_REC_PROCESSING_PARAMETERS, b"".join(parts))

    def write_summary(self, *, start_time, end_time, min_latitude: float, min_longitude: float,
                      max_latitude: float, max_longitude: float, min_depth: float,
                      max_depth: float) -> None:
        """A SWATH_BATHY_SUMMARY record (id 9): time span, position box (1e-7°), depths (0.01 m)."""
        s0, n0 = _time_pair(start_time, self.path)
        s1, n1 = _time_pair(end_time, self.path)
        pos = round_half_away(np.array([min_latitude, min_longitude, max_latitude, max_longitude]) * 1e7)
        dep = round_half_away(np.array([min_depth, max_depth]) * 100.0)
        if np.any(np.abs(pos) > 0x7FFF_FFFF) or np.any(np.abs(dep) > 0x7FFF_FFFF):
            raise self._error("summary positions or depths out of range")
        body = (np.array([s0, n0, s1, n1], ">u4").tobytes()
                + pos.astype(">i4").tobytes() + dep.astype(">i4").tobytes())
        self._write_record(_REC_SUMMARY, body)

    # -- pings --------------------------------------------------------------------------------
    def write_pings(self, *, time_sec, time_nsec, latitude, longitude, heading, depth,
                    across_track, along_track, beam_flags, ping_flags=None,
                    number_beams=None, pitch=None, roll=None, heave=None, speed=None,
                    course=None, depth_corrector=None, tide_corrector=None, height=None,
                    separation=None, gps_tide_corrector=None, travel_time=None,
                    beam_angle=None, nominal_depth=None, horizontal_error=None,
                    vertical_error=None,
                    scale_factors: Mapping[str, ScaleFactor | tuple] | None = None) -> int:
        """Write many ping records (id 2) at once; returns the number of bytes written.

        Per-ping arguments are 1-D arrays of length P (scalars are broadcast). Per-beam
        arguments are 2-D arrays P × B, port beam first; ``beam_flags`` is uint8, raw. With
        ``number_beams`` (1-D, each 1..B) ping *i* keeps only its first ``number_beams[i]``
        columns, so pings of different widths can share one call. Units: degrees, metres,
        seconds, knots. ``heading``/``course`` are wrapped into [0, 360). Optional arrays
        absent here are absent from the records. ``scale_factors`` maps array names to
        :class:`ScaleFactor` (or ``(multiplier, offset, width)``) and overrides the automatic
        choice, which picks per array the first (width, multiplier) of its rule list that holds
        the values (e.g. depth 2-byte ×100, else 4-byte ×1000) with an integer offset.
        Nothing is written if any value cannot be represented (:class:`GsfError`).
        """
        hdr = self._ping_header_fields(
            time_sec=time_sec, time_nsec=time_nsec, latitude=latitude, longitude=longitude,
            heading=heading, ping_flags=ping_flags, pitch=pitch, roll=roll, heave=heave,
            speed=speed, course=course, depth_corrector=depth_corrector,
            tide_corrector=tide_corrector, height=height, separation=separation,
            gps_tide_corrector=gps_tide_corrector, depth=depth)
        P = hdr["_P"]
        flags = np.asarray(beam_flags)
        if flags.ndim != 2 or flags.shape[0] != P:
            raise self._error(f"beam_flags must be a 2-D array of {P} pings × beams, got shape {flags.shape}")
        B = flags.shape[1]
        if flags.dtype != np.uint8:
            if flags.size and (not np.issubdtype(flags.dtype, np.integer)
                               or flags.min() < 0 or flags.max() > 255):
                raise self._error("beam_flags must hold integers 0..255 (uint8)")
            flags = flags.astype(np.uint8)
        if B < 1:
            raise self._error("pings need at least one beam")
        if B > 32767:
            raise self._error(f"{B} beams per ping exceeds the GSF limit of 32,767")
        if number_beams is None:
            nb = np.full(P, B, dtype=np.int64)
        else:
            nb = np.broadcast_to(np.asarray(number_beams, dtype=np.int64), (P,))
            if P and (nb.min() < 1 or nb.max() > B):
                raise self._error(f"number_beams must lie in 1..{B} (the array width)")
        ragged = P > 0 and bool(np.any(nb != B))
        valid = (np.arange(B)[None, :] < nb[:, None]) if ragged else None

        given = {"depth": depth, "across_track": across_track, "along_track": along_track,
                 "travel_time": travel_time, "beam_angle": beam_angle,
                 "nominal_depth": nominal_depth, "vertical_error": vertical_error,
                 "horizontal_error": horizontal_error}
        arrays: dict[str, np.ndarray] = {}
        for name, value in given.items():
            if value is None:
                continue
            a = np.asarray(value)
            if a.dtype not in (np.float64, np.float32):
                a = a.astype(np.float64)
            if a.shape != (P, B):
                raise self._error(f"{name} must have shape {(P, B)} (pings × beams), got {a.shape}")
            arrays[name] = a
        if P == 0:
            return 0

        # Scale factors: explicit ones first, the rest chosen from the data.
        overrides = {}
        for name, sf in (scale_factors or {}).items():
            if name not in ARRAY_IDS:
                raise self._error(f"unknown array {name!r} in scale_factors; known: {sorted(ARRAY_IDS)}")
            try:
                overrides[name] = sf if isinstance(sf, ScaleFactor) else ScaleFactor(*sf)
            except GsfError as err:
                raise self._error(f"scale factor for {name}: {err.reason}") from None
        chosen: dict[str, ScaleFactor] = {}
        for name, a in arrays.items():
            vals = a[valid] if ragged else a
            vmin, vmax = float(vals.min()), float(vals.max())
            if not (np.isfinite(vmin) and np.isfinite(vmax)):   # NaN propagates into min/max
                bad = np.argwhere(~np.isfinite(a) & (valid if ragged else True))[0]
                raise self._error(f"{name} holds a non-finite value at ping {bad[0]} beam {bad[1]} "
                                  "of this call; GSF cannot store NaN or infinity")
            signed = _ARRAY_RULES[name][0]
            if name in overrides:
                sf = overrides[name]
                if name in _FIXED_WIDTH and sf.width != _FIXED_WIDTH[name]:
                    raise self._error(f"{name} is always {_FIXED_WIDTH[name]} bytes wide in GSF, "
                                     f"got width {sf.width}")
            else:
                sf = self._choose(name, vmin, vmax)
            # quantisation is monotone, so the extremes decide whether everything fits
            lo, hi = _INT_RANGE[(sf.width, signed)]
            rmin, rmax = (round_half_away((np.array([vmin, vmax]) + sf.offset) * sf.multiplier))
            if rmin < lo or rmax > hi:
                raise self._error(
                    f"{name} values {vmin:.6g} to {vmax:.6g} do not fit "
                    f"{sf.width}-byte {'signed' if signed else 'unsigned'} fields with multiplier "
                    f"{sf.multiplier} and offset {sf.offset}")
            chosen[name] = sf

        # Which entries of the file's table change (the first ping of a file lists all).
        changes = {ARRAY_IDS[n]: sf for n, sf in chosen.items()
                   if self.scale_factors.get(ARRAY_IDS[n]) != sf}
        order = sorted(arrays, key=lambda n: ARRAY_IDS[n])

        # Runs of pings that share a layout: same beam count, table only in the first ping.
        bounds = [0]
        if changes:
            bounds.append(1)
        if ragged:
            cut = np.flatnonzero(np.diff(nb)) + 1
            bounds.extend(int(c) for c in cut)
        bounds = sorted(set(bounds + [P]))
        runs = []
        for i0, i1 in zip(bounds[:-1], bounds[1:]):
            table = changes if (i0 == 0 and changes) else None
            dt, rec_size = self._ping_dtype(int(nb[i0]), order, chosen, table)
            if rec_size - 8 > _MAX_RECORD_SIZE:
                raise self._error(f"a ping of {int(nb[i0])} beams needs {rec_size - 8:,} bytes, "
                                  f"more than the GSF maximum record size of {_MAX_RECORD_SIZE:,}")
            runs.append((i0, i1, dt, table))

        # Everything is checked: encode and write in blocks of about a megabyte per array, so
        # the temporaries stay in cache and memory does not grow with the call.
        total = 0
        block = max(1, (1 << 17) // max(B, 1))
        for i0, i1, dt, table in runs:
            n = int(nb[i0])
            for j0 in range(i0, i1, block):
                j1 = min(i1, j0 + block)
                rec = self._encode_block(hdr, j0, j1, n, dt, order, arrays, chosen, flags, table)
                self._fh.write(memoryview(rec).cast("B"))
                total += rec.nbytes
        self._offset += total
        self.records_written += P
        self.pings_written += P
        for aid, sf in changes.items():
            self.scale_factors[aid] = sf
        return total

    def _choose(self, name: str, vmin: float, vmax: float) -> ScaleFactor:
        signed, rules = _ARRAY_RULES[name]
        for width, mult in rules:
            lo, hi = _INT_RANGE[(width, signed)]
            offsets = [0]
            if signed:
                offsets.append(-int(round_half_away((vmin + vmax) / 2.0)))
            else:
                offsets.append(-int(np.floor(vmin)))
            for off in offsets:
                rmin = round_half_away((vmin + off) * mult)
                rmax = round_half_away((vmax + off) * mult)
                if lo <= rmin and rmax <= hi and -0x8000_0000 <= off <= 0x7FFF_FFFF:
                    return ScaleFactor(mult, off, width)
        raise self._error(f"{name} values {vmin:.6g} to {vmax:.6g} cannot be stored in GSF "
                          f"({'signed' if signed else 'unsigned'}, widths {[w for w, _ in rules]})")

    def _ping_header_fields(self, *, depth, **kw) -> dict:
        """Validate and quantise the per-ping fields into integer arrays of length P."""
        t = np.asarray(kw["time_sec"])
        P = int(np.asarray(depth).shape[0]) if np.ndim(depth) >= 1 else int(t.size)

        def per_ping(name, value, default=None):
            if value is None:
                value = default
            a = np.asarray(value)
            try:
                a = np.broadcast_to(a, (P,))
            except ValueError:
                raise self._error(f"{name} must be a scalar or a 1-D array of {P} pings, "
                                  f"got shape {a.shape}") from None
            return a

        out: dict = {"_P": P}

        def ints(name, value, lo, hi, default=None):
            a = per_ping(name, value, default)
            if np.issubdtype(a.dtype, np.floating):
                if not np.all(a == np.floor(a)):
                    raise self._error(f"{name} must hold whole numbers")
            elif not (np.issubdtype(a.dtype, np.integer) or a.dtype == bool):
                raise self._error(f"{name} must be integers, got dtype {a.dtype}")
            a = a.astype(np.int64)
            if P and (a.min() < lo or a.max() > hi):
                raise self._error(f"{name} must lie in {lo}..{hi}, got {a.min()}..{a.max()}")
            return a

        def scaled(name, value, mult, lo, hi, default=0.0, wrap=None):
            a = per_ping(name, value, default).astype(np.float64)
            if not np.all(np.isfinite(a)):
                raise self._error(f"{name} holds a non-finite value")
            if wrap is not None:
                a = np.mod(a, wrap)
            r = round_half_away(a * mult)
            if wrap is not None:
                r[r >= wrap * mult] = 0  # 359.999… rounds to 360.00: store 0.00
            if P and (r.min() < lo or r.max() > hi):
                raise self._error(f"{name} values {a.min():.9g} to {a.max():.9g} are out of range "
                                  f"({lo / mult:g} to {hi / mult:g})")
            return r.astype(np.int64)

        out["time_sec"] = ints("time_sec", kw["time_sec"], 0, 0xFFFF_FFFF)
        out["time_nsec"] = ints("time_nsec", kw["time_nsec"], 0, 999_999_999)
        out["ping_flags"] = ints("ping_flags", kw["ping_flags"], 0, 0xFFFF, 0)
        lat = per_ping("latitude", kw["latitude"]).astype(np.float64)
        lon = per_ping("longitude", kw["longitude"]).astype(np.float64)
        if P and not (np.all(np.abs(lat) <= 91.0) and np.all(np.abs(lon) <= 181.0)):
            raise self._error("latitude must lie in ±90° (91 = null) and longitude in ±180° (181 = null)")
        out["latitude"] = scaled("latitude", lat, 1e7, -0x8000_0000, 0x7FFF_FFFF)
        out["longitude"] = scaled("longitude", lon, 1e7, -0x8000_0000, 0x7FFF_FFFF)
        out["heading"] = scaled("heading", kw["heading"], 100, 0, 0xFFFF, wrap=360.0)
        course = kw["course"] if kw["course"] is not None else kw["heading"]
        out["course"] = scaled("course", course, 100, 0, 0xFFFF, wrap=360.0)
        out["pitch"] = scaled("pitch", kw["pitch"], 100, -0x8000, 0x7FFF)
        out["roll"] = scaled("roll", kw["roll"], 100, -0x8000, 0x7FFF)
        out["heave"] = scaled("heave", kw["heave"], 100, -0x8000, 0x7FFF)
        out["speed"] = scaled("speed", kw["speed"], 100, 0, 0xFFFF)
        out["tide_corrector"] = scaled("tide_corrector", kw["tide_corrector"], 100, -0x8000, 0x7FFF)
        out["depth_corrector"] = scaled("depth_corrector", kw["depth_corrector"], 100,
                                        -0x8000_0000, 0x7FFF_FFFF)
        out["height"] = scaled("height", kw["height"], 1000, -0x8000_0000, 0x7FFF_FFFF, _NULL_HEIGHT)
        out["separation"] = scaled("separation", kw["separation"], 1000, -0x8000_0000, 0x7FFF_FFFF,
                                   _NULL_HEIGHT)
        out["gps_tide_corrector"] = scaled("gps_tide_corrector", kw["gps_tide_corrector"], 1000,
                                           -0x8000_0000, 0x7FFF_FFFF)
        return out

    def _ping_dtype(self, n: int, order, chosen, table) -> tuple[np.dtype, int]:
        fields = [("size", ">u4"), ("rid", ">u4"),
                  ("time_sec", ">u4"), ("time_nsec", ">u4"),
                  ("longitude", ">i4"), ("latitude", ">i4"),
                  ("number_beams", ">u2"), ("center_beam", ">u2"),
                  ("ping_flags", ">u2"), ("reserved", ">u2"),
                  ("tide_corrector", ">i2"), ("depth_corrector", ">i4"),
                  ("heading", ">u2"), ("pitch", ">i2"), ("roll", ">i2"), ("heave", ">i2"),
                  ("course", ">u2"), ("speed", ">u2")]
        if self.major >= 3:
            fields += [("height", ">i4"), ("separation", ">i4"), ("gps_tide_corrector", ">i4"),
                       ("spare", ">u2")]
        if table:
            fields += [("sf_header", ">u4"), ("sf_count", ">u4"),
                       ("sf_entries", "V%d" % (12 * len(table)))]
        # Subrecords in id order, as libgsf writes them; beam flags (16) sit between
        # nominal depth (14) and the error arrays (19, 20).
        flags_done = False
        for name in order:
            if ARRAY_IDS[name] > _SUB_BEAM_FLAGS and not flags_done:
                fields += [("beam_flags__header", ">u4"), ("beam_flags", "u1", (n,))]
                flags_done = True
            sf = chosen[name]
            signed = _ARRAY_RULES[name][0]
            code = {1: "i1" if signed else "u1", 2: ">i2" if signed else ">u2",
                    4: ">i4" if signed else ">u4"}[sf.width]
            fields += [(name + "__header", ">u4"), (name, code, (n,))]
        if not flags_done:
            fields += [("beam_flags__header", ">u4"), ("beam_flags", "u1", (n,))]
        fields += [("sensor__header", ">u4")]
        size = np.dtype(fields).itemsize
        pad = _pad4(size)
        if pad:
            fields.append(("padding", "V%d" % pad))
        return np.dtype(fields), size + pad

    def _encode_block(self, hdr, i0, i1, n, dt, order, arrays, chosen, flags, table) -> np.ndarray:
        """Pings i0..i1 (all of width ``n``) as one structured array whose bytes are the records."""
        data_size = dt.itemsize - 8
        rec = np.zeros(i1 - i0, dtype=dt)
        rec["size"] = data_size
        rec["rid"] = _REC_PING
        for name in ("time_sec", "time_nsec", "longitude", "latitude", "ping_flags",
                     "tide_corrector", "depth_corrector", "heading", "pitch", "roll", "heave",
                     "course", "speed"):
            rec[name] = hdr[name][i0:i1]
        if self.major >= 3:
            for name in ("height", "separation", "gps_tide_corrector"):
                rec[name] = hdr[name][i0:i1]
        rec["number_beams"] = n
        rec["center_beam"] = n // 2
        if table:
            rec["sf_header"] = (_SUB_SCALE_FACTORS << 24) | (4 + 12 * len(table))
            rec["sf_count"] = len(table)
            ent = np.zeros(len(table), dtype=[("id", "u1"), ("flag", "u1"), ("reserved", ">u2"),
                                              ("multiplier", ">u4"), ("offset", ">i4")])
            for k, (aid, sf) in enumerate(sorted(table.items())):
                ent[k] = (aid, _WIDTH_NIBBLE[sf.width], 0, sf.multiplier, sf.offset)
            rec["sf_entries"] = np.frombuffer(ent.tobytes(), dtype="V%d" % (12 * len(table)))[0]
        for name in order:
            sf = chosen[name]
            rec[name + "__header"] = (ARRAY_IDS[name] << 24) | (n * sf.width)
            # range-checked already; the cast to the integer field truncates toward 0
            rec[name] = _quantise(arrays[name][i0:i1, :n], sf, nonnegative=not _ARRAY_RULES[name][0])
        rec["beam_flags__header"] = (_SUB_BEAM_FLAGS << 24) | n
        rec["beam_flags"] = flags[i0:i1, :n]
        return rec
