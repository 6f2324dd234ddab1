"""Look inside a PFM: ``info`` (a summary), ``dump`` (everything as Parquet) and ``check``.

``check`` is a full validity check that reads the parts with its own small
raw reader (header text, bit layouts from the header, ``.bin``/``.ndx``/``.cvg``
bytes), so that it does not trust the code that wrote the file and keeps going
on damaged bytes: anything wrong becomes a :class:`Problem`; only a header from
which no layout can be derived raises :class:`PfmFormatError` (path and byte
offset). It works in bands of bins in raster order; chains are walked for all
bins of a band at once, one step of chain depth at a time, with a bitmap over
the ``.ndx`` physical records to find records reached twice (a cycle, or a
record shared by two bins) and records reached by no bin (orphans). Only the
runs where the sparse ``.bin`` holds data are read, and only its records that
are not all zero walked (a hole is an empty bin by definition); the coverage
bytes of empty bins in ``.bin`` holes are checked in a pass of their own.

``info`` and ``dump`` read through :mod:`._store`; ``dump`` streams by bands of
rows into ``pyarrow.parquet.ParquetWriter``. The Parquet column names are
fixed (:data:`SOUNDING_COLUMNS`, :data:`BIN_COLUMNS`): other tools compare
PFMs through them.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import re
import tempfile
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .._numeric import nint, scaled_code_f32
from ..errors import PfmDaskError, PfmFormatError
from . import validity as V
from ._bitpack import BitLayout, unpack_records
from ._chains import chain_records, visit
from ._header import BIN_HEADER_SIZE, NUM_ATTR, PfmHeader, bits_for, version_number
from ._recompute import THREADS, grouped_bin_stats
from ._repeats import RepeatedRecords
from ._summary import summary_part
from ._sparse import (gather_runs, nonzero_records, positions_to_items, record_runs,
                      subtract_runs)

__all__ = [
    "Problem",
    "check",
    "info",
    "dump",
    "SOUNDING_COLUMNS",
    "BIN_COLUMNS",
]

#: Columns of the soundings Parquet file, in order (sorted by bin_y, bin_x, chain order).
SOUNDING_COLUMNS = ("file", "line", "ping", "beam", "bin_x", "bin_y", "x", "y", "depth",
                    "validity", "horizontal_error", "vertical_error")
#: Columns of the bins Parquet file, in order (bins with soundings, raster order).
BIN_COLUMNS = ("bin_x", "bin_y", "num_soundings", "num_valid", "std", "avg_filtered",
               "min_filtered", "max_filtered", "avg", "min", "max", "validity")

_COV_HEADER_SIZE = 65536
_BAND_BINS = 1 << 18          # bin records per check band
_BAND_SOUNDINGS = 500_000     # soundings per check band (soft): bounds the check's memory
_BITMAP_IN_MEMORY = 1 << 20   # bytes of visited map kept in memory; larger ones go to a file
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)  # absent where mmap has no madvise (Windows)
#: bands are first walked by the fast path (:func:`_fast_band`); False: the exact walk only
_FAST_WALK = True
_MAX_PER_KIND = 20            # problems reported per kind before a summary line
_AVERAGE_NAMES = ("Average Filtered Depth", "Average Edited")


# ---------------------------------------------------------------------------
# Problems

@dataclass(frozen=True)
class Problem:
    """One thing wrong with a PFM.

    ``part`` is the file concerned (``"handle"``, ``".ctl"``, ``".lin"``,
    ``".bin"``, ``".ndx"``, ``".cvg"``) or ``"header"``; ``where`` says where
    in it (``"bin (col, row)"``, ``"byte N"``, ``"line N"``, or ``""``);
    ``what`` says what is wrong, with the numbers.
    """

    part: str
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.part} {self.where}: {self.what}" if self.where else f"{self.part}: {self.what}"


class _Problems:
    """Collects problems: at most ``_MAX_PER_KIND`` described per kind, the rest counted.

    Problems are listed in the order they were added, except that each is
    filed under the current :attr:`slot` and the list is ordered by slot:
    the check's pipeline walks band k + 1 (slot 2k + 2) before it has merged
    the data checks of band k (slot 2k + 1), and still lists them in band
    order.
    """

    def __init__(self):
        self.slot = 0
        self._items: list[tuple[int, str, Problem]] = []
        self._first: dict[str, tuple[int, int]] = {}   # kind -> (slot, order) of its first mention
        self._total: dict[str, int] = {}
        self._described: dict[str, int] = {}
        self._part: dict[str, str] = {}

    @property
    def items(self) -> list[Problem]:
        return [p for _, _, p in sorted(self._items, key=lambda t: t[0])]

    def _touch(self, kind: str) -> None:
        if kind not in self._first:
            self._first[kind] = (self.slot, len(self._first))

    def add(self, kind: str, part: str, where: str, what: str) -> None:
        self._touch(kind)
        self._total[kind] = self._total.get(kind, 0) + 1
        self._part.setdefault(kind, part)
        if self._described.get(kind, 0) < _MAX_PER_KIND:
            self._described[kind] = self._described.get(kind, 0) + 1
            self._items.append((self.slot, kind, Problem(part, where, what)))

    def each(self, kind: str, part: str, where) -> np.ndarray:
        """Indices (of a mask or index array) still worth describing; the rest are only counted.

        The caller then calls :meth:`add` with the same ``kind`` for each index returned.
        """
        w = np.asarray(where)
        idx = np.flatnonzero(w) if w.dtype == bool else w
        room = max(0, _MAX_PER_KIND - self._described.get(kind, 0))
        self.more(kind, part, idx.size - min(room, idx.size))
        return idx[:room]

    def more(self, kind: str, part: str, n: int) -> None:
        """Count ``n`` further problems of ``kind`` without describing them."""
        if n > 0:
            self._touch(kind)
            self._total[kind] = self._total.get(kind, 0) + int(n)
            self._part.setdefault(kind, part)

    def merge(self, other: "_Problems", slot: int) -> None:
        """Add what ``other`` collected (a band's, on its own) as if added here now, under ``slot``.

        ``other`` described the first problems of each kind it met, up to the
        cap, and counted the rest; re-adding them in order here describes the
        same first ones this collector would have described itself.
        """
        keep, self.slot = self.slot, slot
        try:
            for _, kind, p in other._items:
                self.add(kind, p.part, p.where, p.what)
            for kind, n in other._total.items():
                self.more(kind, other._part[kind], n - other._described.get(kind, 0))
        finally:
            self.slot = keep

    def copy(self) -> "_Problems":
        out = _Problems()
        out.slot = self.slot
        out._items = list(self._items)
        out._first = dict(self._first)
        out._total, out._described, out._part = dict(self._total), dict(self._described), dict(self._part)
        return out

    def finish(self) -> list[Problem]:
        out = self.items
        for kind in sorted(self._total, key=lambda k: self._first[k]):
            rest = self._total[kind] - self._described.get(kind, 0)
            if rest > 0:
                out.append(Problem(self._part[kind], "",
                                   f"{rest:,} more problem(s) of this kind: {kind}"))
        return out


def _bin_where(b: int, width: int) -> str:
    return f"bin ({int(b) % width}, {int(b) // width})"


def _byte_where(off: int) -> str:
    return f"byte {int(off):,}"


# ---------------------------------------------------------------------------
# Paths and the raw layout

def _parts(path) -> dict:
    """The six part paths of the PFM whose handle is ``path``."""
    handle = os.fspath(path)
    data = handle + ".data"
    stem = os.path.join(data, os.path.basename(handle))
    return {"handle": handle, "data": data, ".ctl": stem + ".ctl", ".lin": stem + ".lin",
            ".bin": stem + ".bin", ".ndx": stem + ".ndx", ".cvg": stem + ".cvg"}


class _Layout:
    """Bit layouts of bin and physical records derived from a header (``set_offsets``)."""

    def __init__(self, h: PfmHeader, has_num_valid: bool):
        f, pos = [], 0
        for key, nb in (("count", h.count_bits), ("std", h.std_bits),
                        ("avg_filtered", h.depth_bits), ("min_filtered", h.depth_bits),
                        ("max_filtered", h.depth_bits), ("avg", h.depth_bits),
                        ("min", h.depth_bits), ("max", h.depth_bits)):
            f.append((key, pos, nb))
            pos += nb
        if has_num_valid:
            f.append(("num_valid", pos, h.count_bits))
            pos += h.count_bits
        for i in range(NUM_ATTR):
            pos += int(h.bin_attribute_bits[i])
        for key, nb in (("validity", h.validity_bits), ("head", h.record_pointer_bits),
                        ("tail", h.record_pointer_bits)):
            f.append((key, pos, nb))
            pos += nb
        self.bin = BitLayout(f)
        per, pos = [], 0
        for key, nb in (("file", h.file_number_bits), ("line", h.line_number_bits),
                        ("ping", h.ping_number_bits), ("beam", h.beam_number_bits),
                        ("depth", h.depth_bits), ("x_off", h.offset_bits), ("y_off", h.offset_bits)):
            per.append((key, pos, nb))
            pos += nb
        for i in range(NUM_ATTR):
            pos += int(h.ndx_attribute_bits[i])
        for key, nb in (("validity", h.validity_bits), ("horizontal_error", h.horizontal_error_bits),
                        ("vertical_error", h.vertical_error_bits)):
            per.append((key, pos, nb))
            pos += nb
        self.sounding_bits = pos
        self.L = int(h.record_length)
        nf = [((k, s), s * pos + o, nb) for s in range(self.L) for k, o, nb in per]
        nf.append(("cont", self.L * pos, h.record_pointer_bits))
        self.ndx = BitLayout(nf)
        self.bin_bytes = self.bin.record_bytes
        self.phys = self.ndx.record_bytes
        self.sounding_keys = [k for k, _, _ in per]
        self.item_fields = {k: (o, nb) for k, o, nb in per}
        cont_off, cont_bits = self.L * pos, int(h.record_pointer_bits)
        self.cont_field = (cont_off, cont_bits)
        #: bytes of a physical record holding its continuation pointer, and their layout
        self.cont_bytes = (cont_off // 8, (cont_off + cont_bits + 7) // 8)
        self.cont = BitLayout([("cont", cont_off % 8, cont_bits)],
                              record_bytes=self.cont_bytes[1] - self.cont_bytes[0])


_LAYOUT_KEYS = [  # (attribute, key phrase, lo, hi): a header outside these has no usable layout
    ("record_length", "[RECORD LENGTH]", 1, 4096),
    ("bin_width", "[BIN WIDTH]", 1, 2**31 - 1),
    ("bin_height", "[BIN HEIGHT]", 1, 2**31 - 1),
    ("bin_header_size", "[BIN HEADER SIZE]", 1, 1 << 30),
    ("count_bits", "[COUNT BITS]", 1, 32),
    ("std_bits", "[STD BITS]", 1, 64),
    ("depth_bits", "[DEPTH BITS]", 1, 32),
    ("record_pointer_bits", "[RECORD POINTER BITS]", 1, 64),
    ("file_number_bits", "[FILE NUMBER BITS]", 0, 32),
    ("line_number_bits", "[LINE NUMBER BITS]", 0, 32),
    ("ping_number_bits", "[PING NUMBER BITS]", 0, 32),
    ("beam_number_bits", "[BEAM NUMBER BITS]", 0, 32),
    ("offset_bits", "[OFFSET BITS]", 0, 32),
    ("validity_bits", "[VALIDITY BITS]", 1, 32),
    ("horizontal_error_bits", "[HORIZONTAL ERROR BITS]", 0, 32),
    ("vertical_error_bits", "[VERTICAL ERROR BITS]", 0, 32),
]


def _read_header(bin_path: str) -> PfmHeader:
    """Parse the ``.bin`` header; raise :class:`PfmFormatError` if no layout can be derived."""
    try:
        with open(bin_path, "rb") as fh:
            raw = fh.read(BIN_HEADER_SIZE)
    except OSError as exc:
        raise PfmFormatError(f"cannot read the bin file: {exc.strerror}", path=bin_path, offset=0) from exc
    text_end = raw.find(b"\0")
    text = raw if text_end < 0 else raw[:text_end]

    def where(key: str) -> int:
        i = text.find(key.encode("latin-1"))
        return i if i >= 0 else 0

    if not text.strip() or b"[VERSION]" not in text:
        raise PfmFormatError("no PFM header: the [VERSION] key is missing", path=bin_path, offset=0)
    try:
        h = PfmHeader.parse(raw, path=bin_path)
    except PfmFormatError as exc:
        m = re.search(r"\[[^\]]*\]", exc.reason)
        raise PfmFormatError(exc.reason, path=bin_path, offset=where(m.group(0)) if m else 0) from None
    if "PFM" not in h.version:
        raise PfmFormatError(f"[VERSION] = {h.version!r} is not a PFM version", path=bin_path,
                             offset=where("[VERSION]"))
    for attr, key, lo, hi in _LAYOUT_KEYS:
        v = int(getattr(h, attr))
        if not lo <= v <= hi:
            raise PfmFormatError(f"header {key} = {v} is outside {lo}..{hi}: no record layout",
                                 path=bin_path, offset=where(key))
    for i in range(NUM_ATTR):
        for name, arr in (("BIN", h.bin_attribute_bits), ("NDX", h.ndx_attribute_bits)):
            if not 0 <= int(arr[i]) <= 32:
                key = f"[{name} ATTRIBUTE BITS {i}]"
                raise PfmFormatError(f"header {key} = {arr[i]} is outside 0..32", path=bin_path,
                                     offset=where(key))
    for attr, key in (("depth_scale", "[DEPTH SCALE]"), ("std_scale", "[STD SCALE]")):
        v = float(getattr(h, attr))
        if not (math.isfinite(v) and v > 0):
            raise PfmFormatError(f"header {key} = {v} must be a positive number", path=bin_path,
                                 offset=where(key))
    for attr, key in (("depth_offset", "[DEPTH OFFSET]"), ("null_depth", "[NULL DEPTH]")):
        if not math.isfinite(float(getattr(h, attr))):
            raise PfmFormatError(f"header {key} is not a finite number", path=bin_path, offset=where(key))
    return h


def _file_size(p: str) -> int | None:
    try:
        return os.stat(p).st_size
    except OSError:
        return None


# ---------------------------------------------------------------------------
# check: pieces

def _check_handle(parts: dict, pr: _Problems) -> None:
    try:
        with open(parts["handle"], "rb") as fh:
            raw = fh.read(1 << 20)
    except OSError:
        pr.add("missing handle", "handle", "", f"the handle file {parts['handle']} is missing")
        return
    lines = raw.decode("latin-1").split("\n")
    if "PFM Handle File" not in lines[0]:
        pr.add("handle first line", "handle", "line 1", "first line does not contain 'PFM Handle File'")
    for i, ln in enumerate(lines[1:], start=2):
        if ln.strip() and not ln.startswith("#"):
            pr.add("handle comment", "handle", f"line {i}", f"line does not start with '#': {ln[:60]!r}")


_CTL_LINE = re.compile(r"^([+-]) (\d{5,}) (\d{2,}) (.+)$")


def _check_ctl(path: str, pr: _Problems) -> tuple[int | None, list[bool]]:
    """Parse the file list; returns (number of files or None, deleted flags)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read().decode("latin-1")
    except OSError:
        pr.add("missing .ctl", ".ctl", "", "the control (file list) file is missing")
        return None, []
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(lines) < 5:
        pr.add("ctl short", ".ctl", "", f"the control file has {len(lines)} line(s); the version, bin, "
               "ndx, mosaic and feature lines (5) are required")
        return None, []
    ver = version_number(lines[0])
    if "PFM I/O library V" not in lines[0]:
        pr.add("ctl version", ".ctl", "line 1", f"no library version string: {lines[0][:80]!r}")
    elif ver != 70:
        pr.add("ctl version", ".ctl", "line 1", f"version {ver / 10:.2f}, expected 7.00")
    n, deleted = 0, []
    offset = sum(len(x) + 1 for x in lines[:5])
    for i, ln in enumerate(lines[5:], start=6):
        s = ln.rstrip("\r")
        m = _CTL_LINE.match(s)
        if not m:
            pr.add("ctl line", ".ctl", f"line {i} (byte {offset:,})",
                   f"not a file line ('+ NNNNN TT path'): {s[:80]!r}")
        else:
            seq = int(m.group(2))
            if seq != n:
                pr.add("ctl sequence", ".ctl", f"line {i} (byte {offset:,})",
                       f"file sequence number {seq} should be {n}: the library refuses this list as corrupted")
            deleted.append(m.group(1) == "-")
        n += 1
        offset += len(ln) + 1
    return n, deleted


def _check_lin(path: str, pr: _Problems) -> int | None:
    try:
        with open(path, "rb") as fh:
            raw = fh.read().decode("latin-1")
    except OSError:
        pr.add("missing .lin", ".lin", "", "the line file is missing")
        return None
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines and raw:
        pr.add("lin end", ".lin", "", "the last line name has no newline")
    for i, ln in enumerate(lines, start=1):
        if not ln.strip():
            pr.add("lin empty", ".lin", f"line {i}", "empty line name")
    return len(lines)


def _check_header(h: PfmHeader, sizes: dict, lay: _Layout, n_files, n_lines,
                  pr: _Problems) -> None:
    W, H = int(h.bin_width), int(h.bin_height)
    hs = int(h.bin_header_size)
    add = lambda kind, what: pr.add(kind, "header", "", what)  # noqa: E731
    if version_number(h.version) != 70:
        add("header version", f"[VERSION] {h.version!r} is not V7.00")
    if h.size_missing:
        add("header size", "[BIN HEADER SIZE] is missing (a pre-6.0 header); v7 writes 131072")
    elif hs != BIN_HEADER_SIZE:
        add("header size", f"[BIN HEADER SIZE] = {hs:,}; PFM library V7.00 writes {BIN_HEADER_SIZE:,}")
    if not 0 <= int(h.class_type) <= 10:
        add("header class type", f"[CLASS TYPE] = {h.class_type} is not 0..10; statistics not checked")
    if int(h.validity_bits) != 23:
        add("header bits", f"[VALIDITY BITS] = {h.validity_bits}; v7 uses 23")
    # depth coding
    scale, off, null = float(h.depth_scale), float(h.depth_offset), float(h.null_depth)
    null_code = int(scaled_code_f32(null, off, scale))
    if null_code < 0 or null_code >= (1 << int(h.depth_bits)):
        add("header depth", f"NULL DEPTH {null:g} codes to {null_code}, which does not fit "
            f"[DEPTH BITS] = {h.depth_bits}")
    want_bits = bits_for(float(np.float32(np.float32(null + off) * np.float32(scale))))
    if want_bits != int(h.depth_bits):
        add("header depth", f"[DEPTH BITS] = {h.depth_bits}, but the library's rule gives {want_bits} "
            f"for NULL DEPTH {null:g}, DEPTH OFFSET {off:g}, DEPTH SCALE {scale:g}")
    if not null > -off:
        add("header depth", f"NULL DEPTH {null:g} is not above the minimum depth {-off:g}")
    for name, bits, scl, mx in (("HORIZONTAL", h.horizontal_error_bits, h.horizontal_error_scale,
                                 h.max_horizontal_error),
                                ("VERTICAL", h.vertical_error_bits, h.vertical_error_scale,
                                 h.max_vertical_error)):
        if int(bits) and float(scl) > 0:
            code = int(nint(np.float32(mx) * np.float32(scl)))
            if code > (1 << int(bits)) - 1:
                add("header errors", f"[MAXIMUM {name} ERROR] {mx:g} x scale {scl:g} = {code} does not "
                    f"fit [{name} ERROR BITS] = {bits}")
    if n_files is not None and n_files > (1 << int(h.file_number_bits)):
        add("header bits", f"{n_files} input files do not fit [FILE NUMBER BITS] = {h.file_number_bits}")
    if n_lines is not None and n_lines > (1 << int(h.line_number_bits)):
        add("header bits", f"{n_lines} lines do not fit [LINE NUMBER BITS] = {h.line_number_bits}")
    ndx = sizes.get(".ndx")
    if ndx is not None and ndx >= (1 << int(h.record_pointer_bits)):
        add("header bits", f"the .ndx ({ndx:,} bytes) is too large for [RECORD POINTER BITS] = "
            f"{h.record_pointer_bits}")
    # geometry
    geo = [("MIN X", h.min_x), ("MIN Y", h.min_y), ("MAX X", h.max_x), ("MAX Y", h.max_y),
           ("X BIN SIZE", h.x_bin_size), ("Y BIN SIZE", h.y_bin_size)]
    if not all(math.isfinite(float(v)) for _, v in geo):
        add("header geometry", "MBR or bin size is not a finite number")
    elif not (h.x_bin_size > 0 and h.y_bin_size > 0):
        add("header geometry", f"bin sizes must be positive: x {h.x_bin_size}, y {h.y_bin_size}")
    elif not (h.max_x > h.min_x and h.max_y > h.min_y):
        add("header geometry", "the MBR is empty or inverted")
    else:
        for name, lo, hi, size, n in (("WIDTH", h.min_x, h.max_x, h.x_bin_size, W),
                                      ("HEIGHT", h.min_y, h.max_y, h.y_bin_size, H)):
            span = (float(hi) - float(lo)) / float(size)
            if abs(span - n) > 1e-3 * max(1.0, n) + 1e-6:
                add("header geometry", f"[BIN {name}] = {n} but the MBR spans {span:.6f} bins "
                    f"of {size!r} degrees")
        pts = np.asarray(h.points, dtype=np.float64).reshape(-1, 2)
        if len(pts) < 3:
            add("header geometry", f"the [POINT] polygon has {len(pts)} point(s); at least 3 are needed")
        else:
            tol = 1e-6
            if (pts[:, 0].min() < h.min_y - tol or pts[:, 0].max() > h.max_y + tol
                    or pts[:, 1].min() < h.min_x - tol or pts[:, 1].max() > h.max_x + tol):
                add("header geometry", "the [POINT] polygon reaches outside the MBR")
        if not int(h.projection):
            try:
                from ..geodesy import inverse
                cy = h.min_y + (h.max_y - h.min_y) * 0.5
                cx = h.min_x + (h.max_x - h.min_x) * 0.5
                d = float(inverse(cy, cx, cy + h.y_bin_size, cx)[0])
                if h.bin_size_xy and abs(d - float(h.bin_size_xy)) > 1e-4 * max(1.0, d):
                    add("header geometry", f"[BIN SIZE XY] = {h.bin_size_xy} m but one y bin at the "
                        f"area centre is {d:.6f} m")
            except Exception:  # noqa: BLE001 - geodesy on absurd values; reported above
                pass
    # sizes of the parts
    bsz = sizes.get(".bin")
    if bsz is not None:
        need = hs + W * H * lay.bin_bytes
        if bsz < hs:
            pr.add("bin size", ".bin", _byte_where(bsz), f"the file ends inside the {hs:,}-byte header")
        elif bsz != need:
            pr.add("bin size", ".bin", _byte_where(min(bsz, need)),
                   f"the file is {bsz:,} bytes; header + {W} x {H} records of {lay.bin_bytes} bytes "
                   f"is {need:,} ({'truncated' if bsz < need else 'trailing bytes'})")
    csz = sizes.get(".cvg")
    if csz is not None and csz != _COV_HEADER_SIZE + W * H:
        pr.add("cvg size", ".cvg", _byte_where(min(csz, _COV_HEADER_SIZE + W * H)),
               f"the file is {csz:,} bytes; 65,536 + {W} x {H} is {_COV_HEADER_SIZE + W * H:,}")
    if ndx is not None and ndx % lay.phys:
        pr.add("ndx size", ".ndx", _byte_where(ndx - ndx % lay.phys),
               f"the file is {ndx:,} bytes, not a whole number of {lay.phys}-byte physical records "
               f"({ndx % lay.phys} bytes left over: torn append?)")


def _check_cvg_header(path: str, pr: _Problems) -> None:
    try:
        with open(path, "rb") as fh:
            raw = fh.read(4096)
    except OSError:
        return
    text = raw.split(b"\0", 1)[0].decode("latin-1")
    lines = text.split("\n")
    if "PFM I/O library V" not in lines[0]:
        pr.add("cvg header", ".cvg", "byte 0", "the coverage header has no version line")
    if "[END OF HEADER]" not in text:
        pr.add("cvg header", ".cvg", "", "the coverage header lacks [END OF HEADER]")


class _Bitmap:
    """One bit per ``.ndx`` physical record: has a chain reached it yet?

    Up to :data:`_BITMAP_IN_MEMORY` bytes the bits are an ordinary array. A
    larger map (a very large ``.ndx``) lives in a shared mapping of an unnamed
    temporary file in ``directory`` (the PFM's data directory), whose pages
    :meth:`drop_pages` hands back to the page cache, so the check's resident
    memory does not grow with the number of records. Where no such file can be
    made (a read-only directory, a full disk) the bits stay in memory.
    """

    def __init__(self, n: int, directory: str | None = None):
        self.n = int(n)
        nbytes = (self.n + 7) // 8
        self._file = self._mm = None
        if directory is not None and nbytes > _BITMAP_IN_MEMORY:
            try:
                self._file = tempfile.TemporaryFile(dir=directory, prefix=".check-bitmap-")
                fd = self._file.fileno()
                # blocks reserved now (reading as zeros): a full disk is an OSError here, and
                # falls back to memory, rather than a SIGBUS on the first write to the map
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, nbytes)
                else:
                    os.ftruncate(fd, nbytes)
                self._mm = mmap.mmap(fd, nbytes)
            except (OSError, ValueError):
                self.close()
        if self._mm is not None:
            self.bits = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes)
        else:
            self.bits = np.zeros(nbytes, dtype=np.uint8)

    @property
    def in_file(self) -> bool:
        return self._mm is not None

    def test(self, idx: np.ndarray) -> np.ndarray:
        return ((self.bits[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1).astype(bool)

    def set(self, idx: np.ndarray) -> None:
        np.bitwise_or.at(self.bits, idx >> 3, (np.uint8(1) << (idx & 7).astype(np.uint8)))

    def drop_pages(self) -> None:
        """Unmap the file-backed pages from this process (their bits stay in the file)."""
        if self._mm is not None and _DONTNEED is not None:
            self._mm.madvise(_DONTNEED)

    def unset(self, first: int = 5, chunk: int = 1 << 20) -> tuple[int, list[int]]:
        """Number of records never reached, and the first few of them (chunked, bounded memory)."""
        total, firsts = 0, []
        for a in range(0, self.bits.size, chunk):
            bits = np.unpackbits(self.bits[a: a + chunk], bitorder="little")
            bits = bits[: max(0, min(bits.size, self.n - a * 8))]
            zero = np.flatnonzero(bits == 0)
            total += zero.size
            if len(firsts) < first:
                firsts += [a * 8 + int(z) for z in zero[: first - len(firsts)]]
            self.drop_pages()
        return total, firsts

    def close(self) -> None:
        self.bits = np.zeros(0, dtype=np.uint8)
        mm, self._mm = self._mm, None
        f, self._file = self._file, None
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a view is still alive: the mapping goes with it
                pass
        if f is not None:
            f.close()


class _Walker:
    """Walks chains of many bins at once over a memory-mapped ``.ndx``.

    The walk reads only the continuation pointers, one step of chain depth at
    a time for all bins of a band; the records it reached are then gathered
    once and the sounding fields the check needs unpacked in one go.
    """

    #: sounding fields the check looks at
    KEYS = ("file", "line", "depth", "validity")

    def __init__(self, ndx_path: str, ndx_size: int | None, lay: _Layout, width: int, pr: _Problems):
        self.lay = lay
        self.W = width
        self.pr = pr
        self.size = int(ndx_size or 0)
        self.n_phys = self.size // lay.phys
        self.mm = None
        self.recs = np.zeros((0, lay.phys), dtype=np.uint8)
        self.words = None
        # the pointer in one big-endian 64-bit word read at byte ``wstart`` of a record, if it fits
        off, nb = lay.cont_field
        self.wstart = max(0, lay.cont_bytes[1] - 8)
        self.wshift = 64 - (off - 8 * self.wstart + nb)
        if self.n_phys:
            with open(ndx_path, "rb") as fh:
                self.mm = mmap.mmap(fh.fileno(), self.n_phys * lay.phys, access=mmap.ACCESS_READ)
            self.recs = np.frombuffer(self.mm, dtype=np.uint8,
                                      count=self.n_phys * lay.phys).reshape(self.n_phys, lay.phys)
            if self.wstart <= lay.cont_bytes[0] and self.wstart + 8 <= lay.phys:
                self.words = np.ndarray((self.n_phys * lay.phys - 7,), dtype=">u8", buffer=self.recs,
                                        strides=(1,))
        self.visited = _Bitmap(self.n_phys, os.path.dirname(os.path.abspath(ndx_path)))
        self.classified = 0

    def drop_pages(self) -> None:
        """Unmap the ``.ndx`` pages read so far (and the visited map's) from this process.

        Reading chains faults pages of the read-only map in, and they would stay
        resident until the end: the whole ``.ndx`` by then. Dropped pages stay
        in the page cache and come back on the next touch (a minor fault), so
        this is safe at any time, even while another thread reads the map.
        """
        if self.mm is not None and _DONTNEED is not None:
            self.mm.madvise(_DONTNEED)
        self.visited.drop_pages()

    def close(self) -> None:
        mm, self.mm = self.mm, None
        self.recs = np.zeros((0, self.lay.phys), dtype=np.uint8)
        self.words = None
        self.visited.close()
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a view is still alive: the mapping goes with it
                pass

    def _pointers(self, idx: np.ndarray) -> np.ndarray:
        """Continuation pointers of physical records ``idx`` (only their bytes are read)."""
        if self.words is not None:
            v = self.words[idx * self.lay.phys + self.wstart].astype(np.uint64)
            v >>= np.uint64(self.wshift)
            v &= np.uint64((1 << self.lay.cont_field[1]) - 1)
            return v.astype(np.int64)
        b0, b1 = self.lay.cont_bytes
        return self.lay.cont.unpack(self.recs[idx, b0:b1], ["cont"])["cont"].astype(np.int64)

    def _classify(self, b: int, head: int, target: int, steps: int) -> str:
        """Cycle or shared: walk bin ``b`` again (slowly) and see if it met ``target`` before."""
        if self.classified >= 2 * _MAX_PER_KIND:
            return "reached twice (a cycle, or shared with another bin)"
        self.classified += 1
        cur = head
        L = self.lay
        for _ in range(steps):
            if cur == target:
                return "reached twice by this bin's own chain (a cycle)"
            if cur % L.phys or cur < 0 or cur + L.phys > self.size:
                break
            cur = int(self._pointers(np.array([cur // L.phys]))[0])
        return "already part of another bin's chain (a record shared by two bins)"

    def walk(self, bidx: np.ndarray, count: np.ndarray, head: np.ndarray, tail: np.ndarray, *,
             collect: bool = True, mark: bool = True):
        """Walk the chains; returns (ok mask per bin, the records reached).

        The second item (``None`` with ``collect=False``) goes to
        :meth:`soundings`, which may run on another thread. ``collect=False``
        only validates (for bands whose counts are too large to trust with
        memory); ``mark=False`` neither tests nor sets the visited map (a second
        walk over chains already validated).
        """
        L = self.lay
        n = bidx.size
        nrec = (count + L.L - 1) // L.L
        ok = np.ones(n, dtype=bool)
        active = np.flatnonzero(count > 0)
        cur = head.astype(np.int64).copy()
        step = 0
        W = self.W
        reached_bin, reached_step, reached_idx = [], [], []
        while active.size:
            a = cur[active]
            bad = (a < 0) | (a % L.phys != 0) | (a + L.phys > self.size)
            for j in self.pr.each("chain pointer", ".ndx", bad):
                bi = active[j]
                what = ("head pointer" if step == 0 else f"continuation pointer (record {step + 1} "
                        "of the chain)")
                self.pr.add("chain pointer", ".bin" if step == 0 else ".ndx", _bin_where(bidx[bi], W),
                            f"{what} {int(a[j]):,} is not a physical record of the .ndx "
                            f"({self.size:,} bytes of {L.phys}-byte records)")
            if bad.any():
                ok[active[bad]] = False
                active, a = active[~bad], a[~bad]
                if not active.size:
                    break
            idx = a // L.phys
            # records reached twice: already visited, or twice within this step
            if mark:
                order = np.argsort(idx, kind="stable")
                dup_in_step = np.zeros(idx.size, dtype=bool)
                same = idx[order][1:] == idx[order][:-1]
                dup_in_step[order[1:][same]] = True
                again = self.visited.test(idx) | dup_in_step
            else:
                again = np.zeros(idx.size, dtype=bool)
            for j in self.pr.each("chain revisit", ".ndx", again):
                bi = active[j]
                kind = self._classify(int(bidx[bi]), int(head[bi]), int(a[j]), step)
                self.pr.add("chain revisit", ".ndx", _bin_where(bidx[bi], W),
                            f"physical record at byte {int(a[j]):,} (step {step + 1} of the chain) {kind}")
            if again.any():
                ok[active[again]] = False
                keep = ~again
                active, a, idx = active[keep], a[keep], idx[keep]
                if not active.size:
                    break
            if mark:
                self.visited.set(idx)
            cont = self._pointers(idx)
            if collect:
                reached_bin.append(active)
                reached_step.append(step)
                reached_idx.append(idx)
            last = nrec[active] == step + 1
            for j in self.pr.each("chain long", ".ndx", last & (cont != 0)):
                bi = active[j]
                self.pr.add("chain long", ".ndx", _bin_where(bidx[bi], W),
                            f"the chain continues (to byte {int(cont[j]):,}) after the "
                            f"{int(nrec[bi])} record(s) that {int(count[bi])} soundings need: "
                            "the count is smaller than the chain")
            ok[active[last & (cont != 0)]] = False
            for j in self.pr.each("chain tail", ".bin", last & (a != tail[active])):
                bi = active[j]
                self.pr.add("chain tail", ".bin", _bin_where(bidx[bi], W),
                            f"tail pointer {int(tail[bi]):,} but the chain ends at byte {int(a[j]):,}")
            ok[active[last & (a != tail[active])]] = False
            short = ~last & (cont == 0)
            for j in self.pr.each("chain short", ".ndx", short):
                bi = active[j]
                self.pr.add("chain short", ".ndx", _bin_where(bidx[bi], W),
                            f"the chain ends after {step + 1} record(s) but the count {int(count[bi])} "
                            f"needs {int(nrec[bi])}")
            ok[active[short]] = False
            go = ~last & ~short
            active = active[go]
            cur[active] = cont[go]
            step += 1
        if not collect:
            return ok, None
        return ok, (count, nrec, reached_bin, reached_step, reached_idx)

    def soundings(self, reached) -> dict:
        """The soundings of the records a :meth:`walk` reached, by bin then chain order.

        A dict of ``b`` (the bin's position in the walk's ``bidx``) and the
        :attr:`KEYS` fields (uint64) of every sounding in those records.
        """
        count, nrec, reached_bin, reached_step, reached_idx = reached
        if not reached_bin:
            return self._gather(count, *(np.zeros(0, dtype=np.int64),) * 3)
        # order the records reached by (bin, step): slot rstart[bin] + step of the full chains
        rstart = np.cumsum(nrec) - nrec
        R = int(nrec.sum())
        where = np.concatenate([rstart[b] + s for b, s in zip(reached_bin, reached_step)])
        present = np.zeros(R, dtype=bool)
        present[where] = True
        rec_idx = np.zeros(R, dtype=np.int64)
        rec_idx[where] = np.concatenate(reached_idx)
        rec_bin = np.repeat(np.arange(nrec.size, dtype=np.int64), nrec)
        rec_step = np.arange(R, dtype=np.int64) - np.repeat(rstart, nrec)
        if not present.all():
            rec_idx, rec_bin, rec_step = rec_idx[present], rec_bin[present], rec_step[present]
        return self._gather(count, rec_idx, rec_bin, rec_step)

    def walk_clean(self, count: np.ndarray, head: np.ndarray, tail: np.ndarray) -> np.ndarray | None:
        """The records of a band's chains in (bin, step) order if nothing in them is wrong, else
        ``None``: every pointer a whole record of the file, no chain ending early, each ending
        at its tail pointer with a 0 continuation (:func:`._chains.chain_records`; the visited
        map is neither read nor set). Thread-safe; ``None`` too where the pointer is not in
        one 64-bit word of its record."""
        if self.words is None and self.n_phys:
            return None
        L = self.lay
        nrec = (count + L.L - 1) // L.L
        addr = chain_records(self.recs.reshape(-1), L.phys, self.wstart, self.wshift,
                             L.cont_field[1], nrec, head)
        if addr is None:
            return None
        has = nrec > 0
        last = addr[np.cumsum(nrec)[has] - 1]
        if np.any(last != tail[has]) or np.any(self._pointers(last // L.phys) != 0):
            return None
        return addr // L.phys

    def soundings_of_chains(self, count: np.ndarray, rec_idx: np.ndarray) -> dict:
        """:meth:`soundings` of whole chains given by :meth:`walk_clean`."""
        nrec = (count + self.lay.L - 1) // self.lay.L
        R = rec_idx.size
        rec_bin = np.repeat(np.arange(nrec.size, dtype=np.int64), nrec)
        rec_step = np.arange(R, dtype=np.int64) - np.repeat(np.cumsum(nrec) - nrec, nrec)
        return self._gather(count, rec_idx, rec_bin, rec_step)

    def _gather(self, count, rec_idx, rec_bin, rec_step) -> dict:
        """The :attr:`KEYS` fields of the soundings in records ``rec_idx`` (in that order), the
        ``rec_step``-th records of the chains of bins ``rec_bin``."""
        L = self.lay
        keys = {k: L.item_fields[k] for k in self.KEYS}
        if not rec_idx.size:
            out = {k: np.zeros(0, dtype=np.uint64) for k in keys}
            out["b"] = np.zeros(0, dtype=np.int64)
            return out
        n_here = np.minimum(L.L, count[rec_bin] - rec_step * L.L)
        first = np.cumsum(n_here) - n_here
        # item positions in the whole .ndx: unpacked straight from the map
        select = np.repeat(rec_idx * L.L - first, n_here)
        select += np.arange(select.size, dtype=np.int64)
        out = unpack_records(self.recs, L.L, L.sounding_bits, keys, select)
        out["b"] = np.repeat(rec_bin, n_here)
        return out


def _split_by_soundings(cnt: np.ndarray, budget: int):
    """Cut a run of bins into consecutive pieces of at most ``budget`` soundings (>= 1 bin each)."""
    n = cnt.size
    csum = np.cumsum(np.minimum(cnt, budget))
    a = 0
    while a < n:
        base = csum[a - 1] if a else 0
        b = int(np.searchsorted(csum, base + budget, side="right"))
        b = max(b, a + 1)
        yield a, min(b, n)
        a = b


def _check_journal(parts: dict, pr: _Problems) -> None:
    """A pfm-dask load that has not finished leaves ``journal.json`` in a phase other than
    ``complete`` (docs/reliability.md): such a PFM is incomplete whatever its bytes say."""
    jpath = os.path.join(parts["data"], "journal.json")
    try:
        with open(jpath, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return
    except OSError as exc:
        pr.add("incomplete", "journal", "", f"incomplete: the load journal {jpath} cannot be "
               f"read ({exc.strerror}); the load that writes this PFM may not have finished")
        return
    try:
        j = json.loads(raw)
        phase = j.get("phase")
    except (ValueError, AttributeError):
        pr.add("incomplete", "journal", "", f"incomplete: the load journal {jpath} is damaged; "
               "the load that writes this PFM may not have finished")
        return
    if phase != "complete":
        done = f", {j.get('watermark', 0):,} of {j.get('n_pieces', 0):,} pieces written" \
            if phase == "loading" else ""
        cmd = j.get("resume_command")
        pr.add("incomplete", "journal", "",
               f"incomplete: the load that writes this PFM stopped in phase {phase!r}{done}"
               + (f"; continue it with: {cmd}" if cmd else ""))


def check(path, *, journal: bool = True, threads: int | None = None,
          band_soundings: int | None = None, bins: bool = True) -> list[Problem]:
    """Full validity check of the PFM whose handle is ``path``; returns the problems found.

    See the module docstring and docs/pfm-format.md ("What check verifies").
    With ``journal`` (default), a pfm-dask load journal that is not ``complete``
    is reported as the first problem (the load's own final check passes False).
    ``bins=False``: only the fast structural checks (handle, lists, header, file
    sizes, coverage header), no pass over the bins. Raises
    :class:`PfmFormatError` only when there is no PFM at ``path`` or its header
    yields no record layout. ``threads`` (default
    :data:`pfm_dask.pfm._recompute.THREADS`) bands have their soundings
    checked at once while the next chains are walked; the problems, and
    their order, do not depend on it.

    Memory: bins go by bands of about ``band_soundings`` soundings (default
    :data:`_BAND_SOUNDINGS`; a bin is never split), at most ``threads`` + 1
    bands at once, and the ``.ndx`` pages a band read are unmapped once it is
    checked; beyond that the check holds per-bin arrays of a band and one bit
    per ``.ndx`` record (in a temporary file of the data directory when large).
    The resident memory does not grow with the number of soundings. The
    problems do not depend on ``band_soundings`` either.
    """
    parts = _parts(path)
    if not os.path.exists(parts["handle"]) and not os.path.isdir(parts["data"]):
        raise PfmFormatError("no PFM here (neither the handle file nor its .data directory exists)",
                             path=parts["handle"])
    pr = _Problems()
    if journal:
        _check_journal(parts, pr)
    _check_handle(parts, pr)
    sizes = {}
    for p in (".ctl", ".lin", ".bin", ".ndx", ".cvg"):
        sizes[p] = _file_size(parts[p])
    for p in (".bin", ".ndx", ".cvg"):
        if sizes[p] is None:
            pr.add(f"missing {p}", p, "", f"the {p} file is missing ({parts[p]})")
    n_files, deleted = _check_ctl(parts[".ctl"], pr)
    n_lines = _check_lin(parts[".lin"], pr)
    if sizes[".bin"] is None:
        return pr.finish()
    h = _read_header(parts[".bin"])
    lay = _Layout(h, version_number(h.version) >= 70)
    _check_header(h, sizes, lay, n_files, n_lines, pr)
    if sizes[".cvg"] is not None:
        _check_cvg_header(parts[".cvg"], pr)
    if not bins:   # the fast structural checks only (pfm_dask.pfm_guard)
        return pr.finish()
    threads = THREADS if threads is None else max(1, int(threads))
    budget = _BAND_SOUNDINGS if band_soundings is None else max(1, int(band_soundings))
    if threads > 1:
        # Pipelined; on any error the sequential pass below decides what is reported
        # (where it stops and what it found before), so the answer never depends on threads.
        trial = pr.copy()
        try:
            _check_bins(parts, h, lay, sizes, n_files, n_lines, deleted, trial, threads, budget)
        except Exception:  # noqa: BLE001 - redone sequentially
            pass
        else:
            return trial.finish()
    try:
        _check_bins(parts, h, lay, sizes, n_files, n_lines, deleted, pr, 1, budget)
    except PfmDaskError:
        raise
    except (OSError, ValueError, IndexError, OverflowError, MemoryError) as exc:
        pr.add("check aborted", ".bin", "", f"the bin pass stopped on unreadable data: {exc}")
    return pr.finish()


class _BandContext:
    """What every band of the bin pass needs: layout, header values, open files, totals."""

    def __init__(self, h: PfmHeader, lay: _Layout, walker: "_Walker", cvg_fd, n_files, n_lines,
                 deleted):
        self.h, self.lay, self.walker, self.cvg_fd = h, lay, walker, cvg_fd
        self.W = int(h.bin_width)
        self.n_files, self.n_lines, self.deleted = n_files, n_lines, deleted
        self.scale32, self.off32 = np.float32(h.depth_scale), np.float32(h.depth_offset)
        self.null32 = np.float32(h.null_depth)
        self.std32 = np.float32(h.std_scale)
        self.std_max = (1 << int(h.std_bits)) - 1
        self.compute_average = h.average_filtered_name in _AVERAGE_NAMES
        self.class_type = int(h.class_type) if 0 <= int(h.class_type) <= 10 else None
        self.budget = _BAND_SOUNDINGS  # soundings per band (check's band_soundings)


def _check_bins(parts, h: PfmHeader, lay: _Layout, sizes, n_files, n_lines, deleted,
                pr: _Problems, threads: int = 1, budget: int | None = None) -> None:
    """The bin pass: bands of bins in raster order, then orphans and header extrema.

    Each band is first checked by :func:`_fast_band` (on a thread pool of
    ``threads`` when there is more than one), which assumes that its chains
    are sound; in band order, the records it reached are then marked on the
    visited map (:func:`._chains.visit`). A band the fast path gives up on, or
    one that reaches a record reached before, is checked again exactly:
    :func:`_walk_band` on the visited map as the bands before left it, then
    :func:`_check_band_data`. Problems are merged, and the extrema folded, in
    band order, so neither depends on the path or on ``threads``. Once a band
    is merged, the pages of the ``.ndx`` map read so far are handed back
    (:meth:`_Walker.drop_pages`): the resident memory stays at the few bands in
    flight (:data:`_BAND_SOUNDINGS` soundings each), not the whole ``.ndx``.
    """
    W, H = int(h.bin_width), int(h.bin_height)
    hs = int(h.bin_header_size)
    n_bins = W * H
    budget = _BAND_SOUNDINGS if budget is None else budget
    avail = max(0, (sizes[".bin"] - hs) // lay.bin_bytes)
    n_read = min(n_bins, avail)
    walker = _Walker(parts[".ndx"], sizes[".ndx"], lay, W, pr)
    cvg_fd = None
    pool = None
    pending: deque = deque()
    try:
        if sizes[".cvg"] is not None:
            cvg_fd = os.open(parts[".cvg"], os.O_RDONLY)
        ctx = _BandContext(h, lay, walker, cvg_fd, n_files, n_lines, deleted)
        ctx.budget = budget
        ext = _ExtremaCheck(W, ctx.null32)
        if threads > 1:
            pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pfm-check")

        def merge_one() -> None:
            band, bidx, recs, cover, local, fut = pending.popleft()
            fast = fut.result() if pool is not None else fut
            if fast is not None and visit(walker.visited.bits, fast[0]):
                pr.merge(local, 2 * band + 1)
                ext.update(*fast[1])
            else:
                # something to report in this band, or a record reached before: the
                # exact walk, on the visited map as the bands before left it
                pr.slot = 2 * band
                walked = _walk_band(bidx, recs, cover, ctx, pr)
                pr.slot = 2 * band + 1
                ext.update(*_check_band_data(walked, ctx, pr))
                del walked
            walker.drop_pages()

        band = 0
        bs = lay.bin_bytes
        bin_fd = os.open(parts[".bin"], os.O_RDONLY)
        try:
            # only what holds data: bins outside these runs are holes of the .bin (all-zero
            # records, valid empty bins); those the .cvg holds data for have their coverage
            # bytes checked afterwards (_check_empty_coverage)
            runs = record_runs(bin_fd, hs, bs, 0, n_read)
            # one buffer for every read (fresh memory costs page faults); bands keep copies.
            # Short runs (a line crossing every row leaves one a row) share a buffer: the
            # positions in it map to bins piece by piece (positions_to_items).
            buf = np.empty(_BAND_BINS * bs, dtype=np.uint8)
            cbuf = np.empty(_BAND_BINS, dtype=np.uint8)
            cvalid = np.empty(_BAND_BINS, dtype=bool)
            for lo, hi, at in gather_runs(runs, _BAND_BINS):
                n, short = int(hi[-1] - lo[-1] + at[-1]), False
                for a, b, p in zip(lo.tolist(), hi.tolist(), at.tolist()):
                    got = os.preadv(bin_fd, [memoryview(buf)[p * bs: (p + b - a) * bs]], hs + a * bs)
                    if got != (b - a) * bs:
                        n, short = p + got // bs, True
                        break
                if n == 0:
                    break
                # the pieces' coverage bytes (a band whose bytes the .cvg lacks skips the test)
                cvalid[:n] = False
                if cvg_fd is not None:
                    for a, b, p in zip(lo.tolist(), hi.tolist(), at.tolist()):
                        m = min(b - a, n - p)
                        if m <= 0:
                            break
                        got = os.preadv(cvg_fd, [memoryview(cbuf)[p: p + m]], _COV_HEADER_SIZE + a)
                        cvalid[p: p + got] = True
                recs = buf[: n * bs].reshape(n, bs)
                # all-zero records are empty bins: only their coverage bytes are checked
                nz = nonzero_records(recs)
                bins = positions_to_items(nz, lo, at)
                recs = recs[nz]
                cnt = lay.bin.unpack(recs, ["count"])["count"].astype(np.int64)
                pieces = list(_split_by_soundings(cnt, budget)) if nz.size else [(0, 0)]
                for i, (a, b) in enumerate(pieces):
                    # the band's positions (for the coverage) reach the next band's first
                    p0 = int(nz[a]) if i else 0
                    p1 = int(nz[b]) if i + 1 < len(pieces) else n
                    cover = None
                    if p1 > p0 and cvalid[p0:p1].all():
                        cover = (positions_to_items(np.arange(p0, p1, dtype=np.int64), lo, at),
                                 cbuf[p0:p1].copy())
                    bidx = bins[a:b]
                    local = _Problems()
                    fut = (pool.submit(_fast_band, bidx, recs[a:b], cover, ctx, local)
                           if pool is not None else _fast_band(bidx, recs[a:b], cover, ctx, local))
                    pending.append((band, bidx, recs[a:b], cover, local, fut))
                    while len(pending) > (threads if pool is not None else 0):
                        merge_one()
                    band += 1
                if short:
                    break
        finally:
            os.close(bin_fd)
        while pending:
            merge_one()
        pr.slot = 2 * band
        if cvg_fd is not None:
            _check_empty_coverage(cvg_fd, subtract_runs(
                record_runs(cvg_fd, _COV_HEADER_SIZE, 1, 0, n_read), runs), W, pr)
        # orphans
        if walker.n_phys:
            n_orphans, firsts = walker.visited.unset()
            if n_orphans:
                first = ", ".join(f"{int(x) * lay.phys:,}" for x in firsts)
                pr.add("orphans", ".ndx", "", f"{n_orphans:,} physical record(s) belong to no bin's "
                       f"chain (first at byte(s) {first})")
        ext.compare(h, pr)
    finally:
        if pool is not None:
            for *_, fut in pending:
                fut.cancel()
            pool.shutdown(wait=True)
        walker.close()
        if cvg_fd is not None:
            os.close(cvg_fd)


def _check_empty_coverage(cvg_fd: int, runs: np.ndarray, W: int, pr: _Problems) -> None:
    """Coverage bytes of bins whose record is a hole of the ``.bin`` (empty: validity 0), in
    the ``runs`` where the ``.cvg`` holds data: none may set DATA, CHECKED or VERIFIED."""
    mask = V.COV_DATA | V.COV_CHECKED | V.COV_VERIFIED
    buf = np.empty(min(_BAND_BINS * 16, max(1, int((runs[:, 1] - runs[:, 0]).max(initial=1)))),
                   dtype=np.uint8)
    for a, b in runs.tolist():
        for lo in range(a, b, buf.size):
            hi = min(b, lo + buf.size)
            got = os.preadv(cvg_fd, [memoryview(buf)[: hi - lo]], _COV_HEADER_SIZE + lo)
            cov = buf[:got]
            for j in pr.each("coverage", ".cvg", (cov & mask) != 0):
                pr.add("coverage", ".cvg", _bin_where(lo + int(j), W),
                       f"coverage byte {int(cov[j]):#04x} disagrees with the bin flags "
                       "(DATA False, CHECKED False, VERIFIED False)")


class _ExtremaCheck:
    """Header extrema recomputed from the stored bin records, pfmLoader's rules."""

    def __init__(self, width: int, null32):
        self.W = width
        self.null = float(null32)
        self.v = {}
        self.any = False

    def _take(self, key, vals, bidx, lower, quantum):
        if vals.size == 0:
            return
        j = int(np.argmin(vals) if lower else np.argmax(vals))
        x = float(vals[j])
        cur = self.v.get(key)
        if cur is None or ((x < cur[0]) if lower else (x > cur[0])):
            self.v[key] = (x, int(bidx[j]), quantum)

    def update(self, bidx, cnt, vals: dict, validity, depth_q, std_q):
        has = cnt > 0
        if not has.any():
            return
        self.any = True
        bi = bidx[has]
        self._take("bin_count_min", cnt[has].astype(np.float64), bi, True, 0)
        self._take("bin_count_max", cnt[has].astype(np.float64), bi, False, 0)
        ok = vals["max"][has] < self.null - 0.5 * depth_q  # below NULL DEPTH
        data = ok & ((validity[has] & V.DATA) != 0)
        self._take("min_filtered", vals["min_filtered"][has][data], bi[data], True, depth_q)
        self._take("max_filtered", vals["max_filtered"][has][data], bi[data], False, depth_q)
        self._take("min_std", vals["std"][has][data], bi[data], True, std_q)
        self._take("max_std", vals["std"][has][data], bi[data], False, std_q)
        self._take("min", vals["min"][has][ok], bi[ok], True, depth_q)
        self._take("max", vals["max"][has][ok], bi[ok], False, depth_q)

    def compare(self, h: PfmHeader, pr: _Problems) -> None:
        if not self.any:
            return
        W = self.W
        checks = [("bin_count_min", "[MINIMUM BIN COUNT]", h.min_bin_count, h.min_count_coord),
                  ("bin_count_max", "[MAXIMUM BIN COUNT]", h.max_bin_count, h.max_count_coord),
                  ("min_filtered", "[MIN FILTERED DEPTH]", h.min_filtered_depth, h.min_filtered_coord),
                  ("max_filtered", "[MAX FILTERED DEPTH]", h.max_filtered_depth, h.max_filtered_coord),
                  ("min", "[MIN DEPTH]", h.min_depth, h.min_coord),
                  ("max", "[MAX DEPTH]", h.max_depth, h.max_coord),
                  ("min_std", "[MIN STANDARD DEVIATION]", h.min_standard_deviation, None),
                  ("max_std", "[MAX STANDARD DEVIATION]", h.max_standard_deviation, None)]
        part = summary_part(h)   # stale (warning) or impossible (error): pfm/_summary.py
        for key, name, hv, hc in checks:
            got = self.v.get(key)
            if got is None:
                continue
            val, b, q = got
            tol = q * 1.01 + 2e-6 * max(1.0, abs(val))  # header floats print with 6 decimals
            if abs(float(hv) - val) > tol:
                pr.add("header extrema", part, "",
                       f"{name} = {float(hv):g} but the bins give {val:g} at {_bin_where(b, W)}")
            elif hc is not None and q == 0 and tuple(hc) != (b % W, b // W):
                pr.add("header extrema", part, "",
                       f"{name} is at {tuple(hc)} in the header but first reached at {_bin_where(b, W)}")


def _walk_band(bidx, recs, cover, ctx: _BandContext, pr: _Problems) -> dict:
    """A band's record checks and chain walk (in band order: the visited map spans bands).

    ``bidx`` (increasing) and ``recs``: the band's bins whose record is not all zero;
    ``cover``: ``(bins, coverage bytes)`` of every bin the band covers (the others in it are
    empty: all-zero records), or ``None`` where the ``.cvg`` lacks them."""
    W, lay, walker = ctx.W, ctx.lay, ctx.walker
    u = lay.bin.unpack(recs)
    cnt = u["count"].astype(np.int64)
    # empty bins must be all zero bytes (never written)
    empty = cnt == 0
    dirty = empty & recs.any(axis=1)
    for j in pr.each("empty bin dirty", ".bin", dirty):
        pr.add("empty bin dirty", ".bin", _bin_where(bidx[j], W),
               "count is 0 but the record has non-zero fields (statistics, flags or pointers)")
    # cap the chain walk: a count larger than the .ndx can hold is corrupt
    cap = walker.n_phys * lay.L
    huge = (cnt > cap) if walker.n_phys else np.zeros(cnt.size, dtype=bool)
    for j in pr.each("count too large", ".bin", huge):
        pr.add("count too large", ".bin", _bin_where(bidx[j], W),
               f"count {int(cnt[j]):,} is more than the whole .ndx holds ({cap:,} soundings)")
    walk_cnt = np.where(huge, 0, cnt)
    head, tail = u["head"].astype(np.int64), u["tail"].astype(np.int64)
    walker.pr = pr
    if int(walk_cnt.sum()) > 2 * ctx.budget:
        # a band this heavy is one bin with a huge count: validate its chain before
        # allocating for its soundings
        ok, _ = walker.walk(bidx, walk_cnt, head, tail, collect=False)
        walker.pr = _Problems()
        try:
            _, reached = walker.walk(bidx, np.where(ok, walk_cnt, 0), head, tail, mark=False)
        finally:
            walker.pr = pr
    else:
        ok, reached = walker.walk(bidx, walk_cnt, head, tail)
    ok &= ~huge
    return {"bidx": bidx, "u": u, "cnt": cnt, "ok": ok, "reached": reached, "cover": cover}


def _fast_band(bidx, recs, cover, ctx: _BandContext, pr: _Problems):
    """A band checked on the assumption that its records and chains are sound (any thread).

    Returns ``(records reached, the band's extrema arguments)`` when the bin
    record checks of :func:`_walk_band` and the chain walk
    (:meth:`_Walker.walk_clean`) find nothing, with the sounding checks'
    problems in ``pr``; ``None`` whenever the exact walk has anything to say
    (or this fast path cannot tell), and then the caller runs the exact one.
    The records reached are still to be :func:`._chains.visit`\ ed in band order.
    """
    if not _FAST_WALK:
        return None
    try:
        lay, walker = ctx.lay, ctx.walker
        u = lay.bin.unpack(recs)
        cnt = u["count"].astype(np.int64)
        if ((cnt == 0) & recs.any(axis=1)).any():
            return None
        if walker.n_phys and (cnt > walker.n_phys * lay.L).any():
            return None
        if int(cnt.sum()) > 2 * ctx.budget:   # a heavy bin: validated first by the exact walk
            return None
        rec_idx = walker.walk_clean(cnt, u["head"].astype(np.int64), u["tail"].astype(np.int64))
        if rec_idx is None:
            return None
        walked = {"bidx": bidx, "u": u, "cnt": cnt, "ok": np.ones(cnt.size, dtype=bool),
                  "snd": walker.soundings_of_chains(cnt, rec_idx), "cover": cover}
        return rec_idx, _check_band_data(walked, ctx, pr)
    except Exception:  # noqa: BLE001 - the exact walk decides what is reported
        return None


def _check_band_data(walked: dict, ctx: _BandContext, pr: _Problems) -> tuple:
    """A band's sounding checks: file and line numbers, statistics, coverage.

    Thread-safe given its own ``pr``. Returns the arguments of the band's
    :meth:`_ExtremaCheck.update`, which the caller applies in band order.
    """
    W = ctx.W
    bidx, u, cnt, ok = walked["bidx"], walked["u"], walked["cnt"], walked["ok"]
    scale32, off32, std32, null32 = ctx.scale32, ctx.off32, ctx.std32, ctx.null32
    class_type = ctx.class_type
    validity = u["validity"].astype(np.int64)
    snd = walked["snd"] if "snd" in walked else ctx.walker.soundings(walked["reached"])
    has = cnt > 0
    # file and line numbers
    if snd["b"].size:
        for key, n, part in (("file", ctx.n_files, ".ctl"), ("line", ctx.n_lines, ".lin")):
            if n is None:
                continue
            bad = snd[key] >= np.uint64(n)
            for j in pr.each(f"{key} reference", ".ndx", bad):
                pr.add(f"{key} reference", ".ndx", _bin_where(bidx[snd['b'][j]], W),
                       f"a sounding names {key} {int(snd[key][j])} but the {part} lists {n}")
        deleted = ctx.deleted
        if deleted and any(deleted):
            dfl = np.asarray(deleted + [False], dtype=bool)
            fnum = np.minimum(snd["file"].astype(np.int64), len(deleted))
            nodel = dfl[fnum] & ((snd["validity"].astype(np.int64) & V.DELETED) == 0)
            for j in pr.each("deleted file", ".ndx", nodel):
                pr.add("deleted file", ".ndx", _bin_where(bidx[snd['b'][j]], W),
                       f"a sounding of deleted file {int(snd['file'][j])} is not flagged DELETED")
    # statistics: recompute the bins whose chain was walked cleanly
    good = np.flatnonzero(has & ok) if class_type is not None else np.zeros(0, np.int64)
    depth_q = 1.0 / float(scale32)
    std_q = 1.0 / float(std32)
    stored_code = {k: u[k].astype(np.int64) for k in ("std", "avg_filtered", "min_filtered",
                                                       "max_filtered", "avg", "min", "max")}
    if good.size:
        # a cleanly walked bin has all its soundings, contiguous and in chain order
        is_good = np.zeros(bidx.size, dtype=bool)
        is_good[good] = True
        sel = is_good[snd["b"]]
        code, val = snd["depth"], snd["validity"].view(np.int64)   # validity < 2**32
        if not sel.all():
            code, val = code[sel], val[sel]
        z = code.astype(np.float64) / np.float64(scale32) - np.float64(off32)
        prior_std = (u["std"][good].astype(np.float32) / std32).astype(np.float32)
        st = grouped_bin_stats(good, cnt[good], z, val, null_depth=null32, class_type=class_type,
                               prior_validity=validity[good], prior_std=prior_std)
        # st is ordered by b ascending == good ascending
        kind = "bin statistics"
        msgs = []
        if "num_valid" in u:
            nv = u["num_valid"].astype(np.int64)[good]
            for j in pr.each(kind, ".bin", nv != st["num_valid"]):
                msgs.append((j, f"num_valid is {int(nv[j])}, the soundings give {int(st['num_valid'][j])}"))
        fields = ["std", "min_filtered", "max_filtered", "min", "max"]
        if ctx.compute_average:
            fields += ["avg_filtered", "avg"]
        for f in fields:
            if f == "std":  # clamped to the field, as the store writes it
                want = np.minimum(nint(st["std"].astype(np.float32) * std32), ctx.std_max)
            else:
                want = scaled_code_f32(st[f], off32, scale32)
            have = stored_code[f][good]
            diff = np.abs(have - want)
            for j in pr.each(kind, ".bin", diff > 1):
                q = std_q if f == "std" else depth_q
                hv = have[j] * q - (0 if f == "std" else float(off32))
                wv = want[j] * q - (0 if f == "std" else float(off32))
                msgs.append((j, f"{f} is {hv:.6g}, the soundings give {wv:.6g} (stale or wrong statistic)"))
        vv = validity[good]
        for j in pr.each(kind, ".bin", vv != st["validity"].astype(np.int64)):
            msgs.append((j, f"validity is {int(vv[j]):#x}, the soundings give "
                         f"{int(st['validity'][j]):#x}"))
        for j, m in msgs:
            pr.add(kind, ".bin", _bin_where(bidx[good[j]], W), m)
    # coverage map, over every bin the band covers (its empty bins have validity 0)
    if walked["cover"] is not None:
        cbins, cov = walked["cover"]
        # an empty bin (all-zero record, validity 0) may set none of the three flags
        wrong = (cov & (V.COV_DATA | V.COV_CHECKED | V.COV_VERIFIED)) != 0
        at = np.searchsorted(cbins, bidx)
        c = cov[at].astype(np.int64)
        d = (validity & V.DATA) != 0
        w = (d != ((c & V.COV_DATA) != 0))
        w |= ((validity & V.CHECKED) != 0) != ((c & V.COV_CHECKED) != 0)
        w |= ((validity & V.VERIFIED) != 0) != ((c & V.COV_VERIFIED) != 0)
        w |= d & ((c & V.COV_SURVEYED) == 0)
        wrong[at] = w
        for j in pr.each("coverage", ".cvg", wrong):
            k = int(np.searchsorted(at, j))
            v = int(validity[k]) if k < at.size and at[k] == j else 0
            pr.add("coverage", ".cvg", _bin_where(cbins[j], W),
                   f"coverage byte {int(cov[j]):#04x} disagrees with the bin flags "
                   f"(DATA {bool(v & V.DATA)}, CHECKED {bool(v & V.CHECKED)}, "
                   f"VERIFIED {bool(v & V.VERIFIED)})")
    # header extrema from the stored values of this band
    vals = {}
    for f in ("min_filtered", "max_filtered", "min", "max"):
        vals[f] = (stored_code[f].astype(np.float32) / scale32 - off32).astype(np.float64)
    vals["std"] = (stored_code["std"].astype(np.float32) / std32).astype(np.float64)
    return bidx, cnt, vals, validity, depth_q, std_q


# ---------------------------------------------------------------------------
# info and dump (through the store)

def info(path) -> dict:
    """Geometry, bit widths, depth coding, counts and extremes of a PFM, JSON-serialisable."""
    from ._store import open_pfm

    f = open_pfm(path, "r")
    try:
        h = f.header
        W, H = f.width, f.height
        counts = {"bins": W * H, "bins_with_soundings": 0, "bins_with_data": 0,
                  "soundings": 0, "valid_soundings": 0}
        ext = _ExtremaCheck(W, np.float32(h.null_depth))
        step = max(1, _BAND_BINS // max(1, W))
        depth_q = 1.0 / float(np.float32(h.depth_scale))
        std_q = 1.0 / float(np.float32(h.std_scale))
        for r in range(0, H, step):
            b = f.read_bin_records(r, min(H, r + step))
            cnt = b["num_soundings"]
            has = cnt > 0
            counts["bins_with_soundings"] += int(has.sum())
            counts["bins_with_data"] += int(((b["validity"] & V.DATA) != 0).sum())
            counts["soundings"] += int(cnt.sum())
            counts["valid_soundings"] += int(b["num_valid"].sum())
            ext.update(b["bin_index"], cnt, b, b["validity"], depth_q, std_q)
        files = f.files()
        recomputed = {}
        names = {"bin_count_min": "min_bin_count", "bin_count_max": "max_bin_count",
                 "min_filtered": "min_filtered_depth", "max_filtered": "max_filtered_depth",
                 "min": "min_depth", "max": "max_depth", "min_std": "min_standard_deviation",
                 "max_std": "max_standard_deviation"}
        for k, name in names.items():
            if k in ext.v:
                val, bi, _ = ext.v[k]
                recomputed[name] = int(val) if "count" in name else val
                if "std" not in k:
                    recomputed[name.replace("_depth", "").replace("bin_count", "count") + "_coord"] = \
                        [int(bi % W), int(bi // W)]
        return {
            "path": os.fspath(path),
            "version": h.version,
            "creation_software": h.creation_software,
            "date": h.date,
            "geometry": {
                "min_x": h.min_x, "min_y": h.min_y, "max_x": h.max_x, "max_y": h.max_y,
                "x_bin_size_deg": h.x_bin_size, "y_bin_size_deg": h.y_bin_size,
                "bin_size_m": h.bin_size_xy, "width": W, "height": H,
                "polygon": [[float(a), float(b)] for a, b in h.points],
            },
            "bits": {k: int(getattr(h, k)) for k in (
                "count_bits", "std_bits", "depth_bits", "record_pointer_bits", "file_number_bits",
                "line_number_bits", "ping_number_bits", "beam_number_bits", "offset_bits",
                "validity_bits", "horizontal_error_bits", "vertical_error_bits")},
            "record_length": int(h.record_length),
            "bin_record_bytes": int(f.bin_record_size),
            "ndx_record_bytes": int(f.ndx_record_size),
            "depth": {"min_depth": -float(h.depth_offset), "null_depth": float(h.null_depth),
                      "max_depth": float(h.null_depth) - 1.0, "precision": depth_q,
                      "depth_scale": float(h.depth_scale), "depth_offset": float(h.depth_offset),
                      "std_scale": float(h.std_scale)},
            "counts": {**counts, "input_files": len(files),
                       "deleted_files": sum(1 for x in files if x.deleted),
                       "lines": len(f.lines()),
                       "ndx_records": int(f.ndx_size // f.ndx_record_size)},
            "header_extrema": {
                "min_filtered_depth": h.min_filtered_depth, "max_filtered_depth": h.max_filtered_depth,
                "min_filtered_coord": list(h.min_filtered_coord),
                "max_filtered_coord": list(h.max_filtered_coord),
                "min_depth": h.min_depth, "max_depth": h.max_depth,
                "min_coord": list(h.min_coord), "max_coord": list(h.max_coord),
                "min_bin_count": int(h.min_bin_count), "max_bin_count": int(h.max_bin_count),
                "min_count_coord": list(h.min_count_coord), "max_count_coord": list(h.max_count_coord),
                "min_standard_deviation": h.min_standard_deviation,
                "max_standard_deviation": h.max_standard_deviation},
            "bin_extrema": recomputed,
            "class_type": int(h.class_type),
            "average_filtered_name": h.average_filtered_name,
        }
    finally:
        f.close()


def _sounding_schema():
    import pyarrow as pa

    return pa.schema([
        ("file", pa.int32()), ("line", pa.int32()), ("ping", pa.int64()), ("beam", pa.int32()),
        ("bin_x", pa.int32()), ("bin_y", pa.int32()),
        pa.field("x", pa.float64(), metadata={"unit": "degrees east (longitude)"}),
        pa.field("y", pa.float64(), metadata={"unit": "degrees north (latitude)"}),
        pa.field("depth", pa.float64(), metadata={"unit": "m, positive down"}),
        ("validity", pa.int32()),
        pa.field("horizontal_error", pa.float32(), metadata={"unit": "m, -999 = null"}),
        pa.field("vertical_error", pa.float32(), metadata={"unit": "m, -999 = null"}),
    ])


def _bin_schema():
    import pyarrow as pa

    f32 = pa.float32()
    return pa.schema([
        ("bin_x", pa.int32()), ("bin_y", pa.int32()), ("num_soundings", pa.int64()),
        ("num_valid", pa.int64()), ("std", f32), ("avg_filtered", f32), ("min_filtered", f32),
        ("max_filtered", f32), ("avg", f32), ("min", f32), ("max", f32), ("validity", pa.int32()),
    ])


def dump(path, *, soundings=None, bins=None) -> dict:
    """Write a PFM's soundings and/or bins with soundings as Parquet; returns the counts.

    Soundings are sorted by (bin_y, bin_x), then chain order; positions ``x``
    (longitude) and ``y`` (latitude) are decoded as the library does. Bins
    are those with at least one sounding, in raster order, with their stored
    statistics (decoded float32). Streaming by bands of rows keeps memory
    bounded. Column names: :data:`SOUNDING_COLUMNS`, :data:`BIN_COLUMNS`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ._recompute import _plan_bands
    from ._store import open_pfm

    if soundings is None and bins is None:
        raise PfmFormatError("dump: give a soundings and/or a bins output path", path=path)
    f = open_pfm(path, "r")
    sw = bw = None
    n_snd = n_bins = 0
    once = RepeatedRecords(f)   # a chain with a cycle never gives a sounding twice
    try:
        if soundings is not None:
            sw = pq.ParquetWriter(os.fspath(soundings), _sounding_schema())
        if bins is not None:
            bw = pq.ParquetWriter(os.fspath(bins), _bin_schema())
        for r0, r1, c0, c1 in _plan_bands(f, None, None, _BAND_SOUNDINGS):
            if bw is not None:
                b = f.read_bin_records(r0, r1, c0, c1)
                has = b["num_soundings"] > 0
                if has.any():
                    cols = {"bin_x": b["col"][has].astype(np.int32),
                            "bin_y": b["row"][has].astype(np.int32),
                            "num_soundings": b["num_soundings"][has],
                            "num_valid": b["num_valid"][has]}
                    for k in ("std", "avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max"):
                        cols[k] = b[k][has].astype(np.float32)
                    cols["validity"] = b["validity"][has].astype(np.int32)
                    bw.write_table(pa.table(cols, schema=_bin_schema()))
                    n_bins += int(has.sum())
            if sw is not None:
                s = once.first_reads(f.read_soundings(r0, r1, c0, c1))
                if s["bin_index"].size:
                    lat, lon = f.decode_positions(s["col"], s["row"], s["x_off"], s["y_off"])
                    cols = {"file": s["file"].astype(np.int32), "line": s["line"].astype(np.int32),
                            "ping": s["ping"].astype(np.int64), "beam": s["beam"].astype(np.int32),
                            "bin_x": s["col"].astype(np.int32), "bin_y": s["row"].astype(np.int32),
                            "x": np.asarray(lon, dtype=np.float64), "y": np.asarray(lat, dtype=np.float64),
                            "depth": s["depth"].astype(np.float64),
                            "validity": s["validity"].astype(np.int32),
                            "horizontal_error": s["horizontal_error"].astype(np.float32),
                            "vertical_error": s["vertical_error"].astype(np.float32)}
                    sw.write_table(pa.table(cols, schema=_sounding_schema()))
                    n_snd += int(s["bin_index"].size)
    finally:
        if sw is not None:
            sw.close()
        if bw is not None:
            bw.close()
        f.close()
    out = {"path": os.fspath(path)}
    if soundings is not None:
        out["soundings"] = n_snd
        out["soundings_path"] = os.fspath(soundings)
        if once.dropped:
            out["repeated_soundings_dropped"] = once.dropped
    if bins is not None:
        out["bins"] = n_bins
        out["bins_path"] = os.fspath(bins)
    return out
