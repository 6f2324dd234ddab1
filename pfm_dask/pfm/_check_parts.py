"""``check``'s small parts: the paths, the header and its record layouts, the handle,
``.ctl``, ``.lin``, ``.cvg`` header, the sizes of the parts, and the load journal.

Read with a raw reader of its own (not the store's), so that a damaged file becomes
problems (:mod:`._problems`) rather than an exception; only a header from which no layout
can be derived raises :class:`PfmFormatError` (path and byte offset).
"""

from __future__ import annotations

import json
import math
import os
import re

import numpy as np

from .._numeric import nint, scaled_code_f32
from ..errors import PfmFormatError
from ._bitpack import BitLayout
from ._header import BIN_HEADER_SIZE, NUM_ATTR, PfmHeader, bits_for, version_number
from ._problems import _Problems, _byte_where

_COV_HEADER_SIZE = 65536

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
