"""PFM v7 on disk: create, open, append soundings, read bins and soundings, rewrite flags.

A PFM ``X.pfm`` is a handle file plus ``X.pfm.data/`` holding ``X.pfm.ctl``
(input files), ``X.pfm.lin`` (line names), ``X.pfm.bin`` (header and
bit-packed bin records), ``X.pfm.ndx`` (bit-packed physical depth records
chained per bin) and ``X.pfm.cvg`` (coverage map). Layout and numeric rules
are those of PFM library V7.00 (docs/pfm-format.md, ``lib-pfm_lib : pfm_io.c``);
everything here is numpy over many records at once.

This module holds the file itself (opening, creating, the ``.ctl``/``.lin`` lists,
coding, coverage, header); :mod:`._write` appends and rewrites records, :mod:`._reader`
reads bins and soundings, :mod:`._io` does the span I/O and the write-behind thread, and
:mod:`._layout` computes a new header and the record layouts.

API (stable; the recompute, check, dump and filter code rely on it)
--------------------------------------------------------------------
``create(path, grid, *, min_depth=-10000.0, max_depth=12000.0, precision=0.01,
max_files=0, max_lines=0, max_pings=0, max_beams=0, max_bin_soundings=0,
record_length=6, horizontal_error_max=None, vertical_error_max=None,
horizontal_error_scale=100.0, vertical_error_scale=100.0, bin_size_m=None,
max_record_pointer=0, classification="UNCLASSIFIED", creation_software=None,
wkt=WGS84_WKT, mosaic_path="NONE", feature_path="NONE", dynamic_reload=1,
user_flag_names=None) -> PfmFile``
    New PFM from a :class:`pfm_dask.bins.BinGrid`; opened ``"r+"``. A maximum
    of 0 keeps the library default width (``pfm.h``). Error maxima default to
    pfmLoader's: vertical 15 m if ``max_depth < 150`` else 10 % of it;
    horizontal 10 x ``bin_size_m`` (10 x the geodesic y-bin length for degree
    grids or when ``bin_size_m`` is not given).
``open_pfm(path, mode="r" | "r+") -> PfmFile``
    Open an existing PFM (v7; v6.x read-only; older refused).

``PfmFile`` attributes: ``path`` (handle), ``data_dir``, ``ctl_path``,
``lin_path``, ``bin_path``, ``ndx_path``, ``cvg_path``, ``header``
(:class:`PfmHeader`), ``grid`` (:class:`BinGrid`, built from the header),
``width``, ``height``, ``record_length``, ``null_depth``,
``bin_header_size``, ``bin_record_size``, ``ndx_record_size``, ``ndx_size``
(bytes), ``mode``, ``version`` (x10: 70 for V7.00), ``max_file_number`` /
``max_line_number`` / ``max_ping_number`` / ``max_beam_number`` (the
``2**bits - 1`` limits) and ``timings`` (seconds per ``add_sorted`` phase).

Methods:

* ``files() -> list[PfmInputFile]`` (number, path, data_type, deleted);
  ``add_files(paths, data_type=2) -> list[int]``.
* ``lines() -> list[str]``; ``add_lines(names) -> list[int]``.
* ``add_sorted(bin_index, file, line, ping, beam, depth, x_off, y_off,
  validity, horizontal_error, vertical_error, *, attributes=None)``: append
  soundings sorted by ``bin_index`` (see the method).
* ``read_bin_records(row0, row1, col0=0, col1=None, *, codes=False) -> dict``:
  arrays (row-major over the rectangle) ``bin_index, row, col,
  num_soundings, num_valid, std, avg_filtered, min_filtered, max_filtered,
  avg, min, max, validity, head, tail`` (+ ``attr_<i>``). Depths and std are
  decoded with the library's float32 arithmetic and returned as float64;
  ``codes=True`` adds the raw integer codes as ``<field>_code``.
* ``read_soundings(row0, row1, col0=0, col1=None) -> dict``: one entry per
  sounding of every bin in the rectangle, bins row-major and each bin's
  soundings in chain order (= the order they were added): ``bin_index,
  row, col, file, line, ping, beam, x_off, y_off, validity`` (int64),
  ``depth`` (float64, ``code / scale - offset`` in double as the library),
  ``horizontal_error, vertical_error`` (float32 ``code / scale``; -999 for
  null), ``record_offset`` (int64 byte offset of the physical record in
  .ndx), ``slot`` (int64), ``address`` (uint64, ``record_offset *
  record_length + slot``) (+ ``attr_<i>`` for NDX attributes).
* ``read_bin(col, row) -> (dict of scalars, dict of arrays)``.
* ``set_validity(record_offset, slot, validity)``: rewrite sounding flags.
* ``write_bin_records(bin_index, *, coverage=True, **fields)``: write bin
  statistics (``num_valid, std, avg_filtered, min_filtered, max_filtered,
  avg, min, max, validity``); with ``validity`` also updates the ``.cvg``.
* ``update_coverage(bin_index, validity)``; ``read_coverage(bin_index)``.
* ``compute_extrema() -> dict`` (pfmLoader's header extrema from bin
  records); ``write_header(**values)``: set header keys (PfmHeader field
  names) and rewrite the header; with no values the extrema are computed.
* ``decode_positions(col, row, x_off, y_off) -> (lat, lon)``.
* ``flush()``, ``close(durable=False)`` (fsync all parts if durable), context
  manager.

Notes: new depth records are coded and packed by numba kernels on a small
thread pool, each thread writing its records past the end of the ``.ndx``
as it goes (``pwrite`` of about 1 MiB while it is in cache; with one pack
thread, the write-behind thread writes them from pooled buffers); rewrites of
bin and tail records are written by a background thread, and every read
or in-place rewrite first waits for the queued writes that could overlap
it, and ``flush``/``close`` wait for all. Error fields store ``NINT(e * scale)``
clamped to ``2**bits - 1``, which this reader returns as -999; the library
itself would read that code as ``(2**bits - 1) / scale`` (its null test
compares the unscaled value with the scaled null and never fires).
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from ..errors import ConfigError, PfmFormatError
from .. import validity as V
from ._runs import bits_all_set, clear_bits
from ._names import TEXT_CODING, decode_names, encode_names
from ._coverage import (COV_HEADER_SIZE, create_coverage_file, read_coverage,
                        update_coverage)
from ._header import (BIN_HEADER_SIZE, LIBRARY_VERSION, NUM_ATTR, WGS84_WKT, PfmHeader,
                      bits_for, version_number)
from ._io import BackgroundWriter
from ._layout import PFM_RECORD_LENGTH, bin_layout, ndx_layout, new_header
from ._reader import SOUNDING_FIELDS, PfmReads
from ._write import CHUNK_BUFFERS, PfmWrites

__all__ = [
    "PfmFile",
    "PfmInputFile",
    "PfmHeader",
    "create",
    "open_pfm",
    "bits_for",
    "LIBRARY_VERSION",
    "WGS84_WKT",
    "PFM_GSF_DATA",
    "SOUNDING_FIELDS",
    "BIN_FIELDS",
]

#: Data type number of GSF input in the ``.ctl`` (``PFM_GSF_DATA``).
PFM_GSF_DATA = 2

#: Bin record fields that carry statistics (written by the recompute).
BIN_FIELDS = ("num_soundings", "std", "avg_filtered", "min_filtered", "max_filtered",
              "avg", "min", "max", "num_valid", "validity", "head", "tail")
#: threads that pack records in parallel (the numba kernels release the GIL)
PACK_THREADS = min(2, os.cpu_count() or 1)


@dataclass(frozen=True)
class PfmInputFile:
    """One line of the ``.ctl`` file list."""

    number: int
    path: str
    data_type: int
    deleted: bool


class PfmFile(PfmReads, PfmWrites):
    """An open PFM v7 structure; see the module docstring for the API."""

    # ------------------------------------------------------------------ opening
    def __init__(self, path, mode: str = "r"):
        if mode not in ("r", "r+"):
            raise ConfigError(f"mode must be 'r' or 'r+', not {mode!r}")
        self.mode = mode
        self.path = os.fspath(path)
        self._closed = True
        self._fds: dict[str, int] = {}
        self._writer_obj: BackgroundWriter | None = None
        self._pool_obj = None
        #: threads that pack new records (1: all on the calling thread); set before the first add
        self.pack_threads = PACK_THREADS
        # bit per bin: 1 = record known to be all zero (set for a file created by this object)
        self._zero_bins: np.ndarray | None = None
        self._touch_lock = threading.Lock()
        #: crash safety (pfm_dask.journal.UndoLog) or None: add_sorted hands it the records its
        #: in-place writes replace (save_records) and calls commit() before issuing them
        self.undo = None
        #: seconds spent per phase of add_sorted (for benchmarks and profiling)
        self.timings: dict[str, float] = defaultdict(float)
        try:
            with open(self.path, "rb") as fh:
                first = fh.readline(4096)
        except OSError as exc:
            raise PfmFormatError(f"cannot open PFM handle file: {exc.strerror}", path=self.path) from exc
        if b"PFM Handle File" not in first:
            raise PfmFormatError("not a PFM handle file (first line lacks 'PFM Handle File')",
                                 path=self.path, offset=0)
        base = os.path.basename(self.path)
        self.data_dir = self.path + ".data"
        stem = os.path.join(self.data_dir, base)
        self.ctl_path = stem + ".ctl"
        self.lin_path = stem + ".lin"
        self.bin_path = stem + ".bin"
        self.ndx_path = stem + ".ndx"
        self.cvg_path = stem + ".cvg"

        # .ctl first line: the version that selects the layout
        try:
            with open(self.ctl_path, "rb") as fh:
                vline = fh.readline(4096).decode("latin-1")
        except OSError as exc:
            raise PfmFormatError(f"cannot open the control file: {exc.strerror}",
                                 path=self.ctl_path) from exc
        if "Software - PFM I/O library V" not in vline:
            raise PfmFormatError("version string missing from the control file (corrupted?)",
                                 path=self.ctl_path, offset=0)
        self.version = version_number(vline)
        if self.version > 70:
            raise PfmFormatError(f"PFM version {self.version / 10:.1f} is newer than the V7.00 "
                                 "layout this reader knows", path=self.ctl_path, offset=0)
        if self.version < 60:
            raise PfmFormatError(f"PFM version {self.version / 10:.1f} is not supported "
                                 "(versions before 6.0 are refused, as by PFM library V7.00)",
                                 path=self.ctl_path, offset=0)
        if self.version < 70 and mode != "r":
            raise PfmFormatError(f"PFM version {self.version / 10:.1f} (pre-v7: coverage map inside "
                                 ".bin, no num_valid) can only be opened read-only",
                                 path=self.ctl_path)

        flags = os.O_RDWR if mode == "r+" else os.O_RDONLY
        try:
            self._fds["bin"] = os.open(self.bin_path, flags)
            self._fds["ndx"] = os.open(self.ndx_path, flags)
            if self.version >= 70:
                self._fds["cvg"] = os.open(self.cvg_path, flags)
        except OSError as exc:
            self._close_fds()
            raise PfmFormatError(f"cannot open {exc.filename}: {exc.strerror}",
                                 path=exc.filename) from exc
        self._closed = False
        try:
            self._load_header()
        except BaseException:
            self._close_fds()
            self._closed = True
            raise

    def _load_header(self) -> None:
        raw = os.pread(self._fds["bin"], BIN_HEADER_SIZE, 0)
        if not raw or b"=" not in raw[:4096]:
            raise PfmFormatError("bin file has no header", path=self.bin_path, offset=0)
        h = PfmHeader.parse(raw, path=self.bin_path)
        if "Software - PFM I/O library" not in h.version:
            raise PfmFormatError("bin file header corrupt ([VERSION] missing)", path=self.bin_path, offset=0)
        self._set_header(h)

    def _set_header(self, h: PfmHeader) -> None:
        p = self.bin_path
        checks = [
            ("[RECORD LENGTH]", h.record_length, 1, 255),
            ("[COUNT BITS]", h.count_bits, 1, 32),
            ("[STD BITS]", h.std_bits, 1, 32),
            ("[DEPTH BITS]", h.depth_bits, 1, 32),
            ("[RECORD POINTER BITS]", h.record_pointer_bits, 33, 64),
            ("[FILE NUMBER BITS]", h.file_number_bits, 1, 32),
            ("[LINE NUMBER BITS]", h.line_number_bits, 1, 32),
            ("[PING NUMBER BITS]", h.ping_number_bits, 1, 32),
            ("[BEAM NUMBER BITS]", h.beam_number_bits, 1, 32),
            ("[OFFSET BITS]", h.offset_bits, 1, 32),
            ("[VALIDITY BITS]", h.validity_bits, 1, 32),
            ("[HORIZONTAL ERROR BITS]", h.horizontal_error_bits, 0, 32),
            ("[VERTICAL ERROR BITS]", h.vertical_error_bits, 0, 32),
            ("[BIN WIDTH]", h.bin_width, 1, 2**31 - 1),
            ("[BIN HEIGHT]", h.bin_height, 1, 2**31 - 1),
        ]
        for key, v, lo, hi in checks:
            if not lo <= int(v) <= hi:
                raise PfmFormatError(f"header {key} = {v} is outside {lo}..{hi}", path=p)
        for i in range(NUM_ATTR):
            for key, arr in (("BIN", h.bin_attribute_bits), ("NDX", h.ndx_attribute_bits)):
                if not 0 <= int(arr[i]) <= 32:
                    raise PfmFormatError(f"header [{key} ATTRIBUTE BITS {i}] = {arr[i]} is outside 0..32",
                                         path=p)
        if h.depth_scale <= 0:
            raise PfmFormatError(f"header [DEPTH SCALE] = {h.depth_scale} must be positive", path=p)
        self.header = h
        self.width = int(h.bin_width)
        self.height = int(h.bin_height)
        self.record_length = int(h.record_length)
        self.null_depth = float(h.null_depth)
        self.bin_header_size = int(h.bin_header_size)
        self._bin_layout = bin_layout(h, self.version >= 70)
        self._ndx_layout, self._single_bits = ndx_layout(h)
        self.bin_record_size = self._bin_layout.record_bytes
        self.ndx_record_size = self._ndx_layout.record_bytes
        self._n_bin_attr = int(h.num_bin_attributes)
        self._n_ndx_attr = int(h.num_ndx_attributes)
        need = self.bin_header_size + self.width * self.height * self.bin_record_size
        size = os.fstat(self._fds["bin"]).st_size
        if size < need:
            raise PfmFormatError(f"bin file is {size:,} bytes; the header's {self.width} x {self.height} "
                                 f"grid of {self.bin_record_size}-byte records needs {need:,} (truncated?)",
                                 path=p, offset=size)
        self.ndx_size = os.fstat(self._fds["ndx"]).st_size
        if self.mode == "r+" and self.ndx_size % self.ndx_record_size:
            raise PfmFormatError(f".ndx size {self.ndx_size:,} is not a multiple of the "
                                 f"{self.ndx_record_size}-byte record (torn append?); refusing to append",
                                 path=self.ndx_path, offset=self.ndx_size)
        if self.version >= 70:
            csize = os.fstat(self._fds["cvg"]).st_size
            if csize < COV_HEADER_SIZE + self.width * self.height:
                raise PfmFormatError(f"coverage file is {csize:,} bytes, needs "
                                     f"{COV_HEADER_SIZE + self.width * self.height:,}",
                                     path=self.cvg_path, offset=csize)
        self._grid = None
        # limits the library checks on add (read_bin_header: 2**bits - 1)
        self.max_file_number = (1 << h.file_number_bits) - 1
        self.max_line_number = (1 << h.line_number_bits) - 1
        self.max_ping_number = (1 << h.ping_number_bits) - 1
        self.max_beam_number = (1 << h.beam_number_bits) - 1

    @property
    def grid(self):
        """The :class:`pfm_dask.bins.BinGrid` of this file (built from the header on first use)."""
        if self._grid is None:
            from ._grid import BinGrid

            h = self.header
            if h.projection:
                raise PfmFormatError(f"projected PFM ([PROJECTION] = {h.projection}) has no geographic "
                                     "bin grid", path=self.bin_path)
            try:
                self._grid = BinGrid.from_header_values(
                    min_x=h.min_x, min_y=h.min_y, max_x=h.max_x, max_y=h.max_y,
                    x_bin=h.x_bin_size, y_bin=h.y_bin_size, width=h.bin_width,
                    height=h.bin_height, polygon=h.points, offset_bits=h.offset_bits,
                    bin_size_xy=h.bin_size_xy)
            except ConfigError as exc:
                raise PfmFormatError(f"header grid is inconsistent: {exc.reason}",
                                     path=self.bin_path) from exc
        return self._grid

    # ------------------------------------------------------------------ creating
    @classmethod
    def create(cls, path, grid, *, min_depth: float = -10000.0, max_depth: float = 12000.0,
               precision: float = 0.01, max_files: int = 0, max_lines: int = 0,
               max_pings: int = 0, max_beams: int = 0, max_bin_soundings: int = 0,
               record_length: int = PFM_RECORD_LENGTH,
               horizontal_error_max: float | None = None,
               vertical_error_max: float | None = None,
               horizontal_error_scale: float = 100.0, vertical_error_scale: float = 100.0,
               bin_size_m: float | None = None, max_record_pointer: int = 0,
               classification: str = "UNCLASSIFIED", creation_software: str | None = None,
               wkt: str = WGS84_WKT, mosaic_path: str = "NONE", feature_path: str = "NONE",
               dynamic_reload: int = 1, user_flag_names: Sequence[str] | None = None,
               on_claim: Callable[[str], None] | None = None) -> "PfmFile":
        """Create a new PFM v7 structure from a bin grid; returns it opened ``"r+"``.

        ``on_claim(data_dir)`` is called once the data directory is made (the claim on the
        path), before any other file: a load writes there what proves the output its own
        should it die before the PFM is whole."""
        path = os.fspath(path)
        h = cls.new_header(grid, min_depth=min_depth, max_depth=max_depth, precision=precision,
                           max_files=max_files, max_lines=max_lines, max_pings=max_pings,
                           max_beams=max_beams, max_bin_soundings=max_bin_soundings,
                           record_length=record_length, horizontal_error_max=horizontal_error_max,
                           vertical_error_max=vertical_error_max,
                           horizontal_error_scale=horizontal_error_scale,
                           vertical_error_scale=vertical_error_scale, bin_size_m=bin_size_m,
                           max_record_pointer=max_record_pointer, classification=classification,
                           creation_software=creation_software, wkt=wkt,
                           dynamic_reload=dynamic_reload, user_flag_names=user_flag_names)
        data_dir = path + ".data"
        refused = PfmFormatError("refusing to create a PFM over an existing one "
                                 "(the handle file or data directory exists)", path=path)
        if os.path.lexists(path):
            raise refused
        # the data directory is the claim: of two processes creating this PFM at once, one
        # makes it, the other is refused here (mkdir is atomic) and touches nothing
        try:
            os.mkdir(data_dir)
        except FileExistsError:
            raise refused from None
        if on_claim is not None:
            on_claim(data_dir)
        base = os.path.basename(path)
        stem_rel = f"{path}.data{os.sep}{base}"
        with open(path, "w", **TEXT_CODING, newline="\n") as fh:
            fh.write(f"PFM Handle File - {LIBRARY_VERSION}\n")
            fh.write("#\n" + "#" * 80 + "\n#\n")
            fh.write("# This is a PFM handle file.  If you were expecting to see the PFM list file\n")
            fh.write(f"# you need to look for a directory called:\n#\n#\t{data_dir}\n#\n")
            fh.write(f"# In that directory should be a file called:\n#\n#\t{stem_rel}.ctl\n#\n")
            fh.write("# That is the PFM list (or control) file.\n")
            fh.write("#\n" + "#" * 80 + "\n#\n")
        stem = os.path.join(data_dir, base)
        with open(stem + ".ctl", "w", **TEXT_CODING, newline="\n") as fh:
            fh.write(f"{LIBRARY_VERSION}\n{stem_rel}.bin\n{stem_rel}.ndx\n{mosaic_path}\n{feature_path}\n")
        open(stem + ".lin", "w").close()
        layout = bin_layout(h, True)
        fd = os.open(stem + ".bin", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            os.write(fd, h.to_bytes())
            # zero bin records (sparse): the library writes zero rows, the bytes are the same
            os.ftruncate(fd, h.bin_header_size + h.bin_width * h.bin_height * layout.record_bytes)
        finally:
            os.close(fd)
        os.close(os.open(stem + ".ndx", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        create_coverage_file(stem + ".cvg", h.bin_width, h.bin_height, LIBRARY_VERSION)
        f = cls(path, "r+")
        f._grid = grid
        f._zero_bins = np.full((h.bin_width * h.bin_height + 7) // 8, 0xFF, dtype=np.uint8)
        return f

    #: the header a new PFM gets (no I/O); see :func:`._layout.new_header`
    new_header = staticmethod(new_header)

    # ------------------------------------------------------------------ basics
    @property
    def _writer(self) -> BackgroundWriter:
        if self._writer_obj is None:
            # room in its queue for every chunk buffer of new records, and the tail and bin
            # records of a call or two
            self._writer_obj = BackgroundWriter(depth=CHUNK_BUFFERS + 4)
        return self._writer_obj

    @property
    def _pool(self):
        if self.pack_threads <= 1:
            return None
        if self._pool_obj is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool_obj = ThreadPoolExecutor(max_workers=self.pack_threads,
                                                thread_name_prefix="pfm-pack")
        return self._pool_obj

    def _all_zero(self, bins: np.ndarray) -> bool:
        """True if every bin record in ``bins`` is known to be still all zero (no read needed)."""
        z = self._zero_bins
        if z is None:
            return False
        return bits_all_set(z, bins)

    def _touch(self, bins: np.ndarray) -> None:
        """Forget that these bin records are zero (under a lock: the recompute's band threads
        write disjoint bins, but eight bins share a byte of the map)."""
        z = self._zero_bins
        if z is not None and bins.size:
            with self._touch_lock:
                clear_bits(z, bins)

    def _sync(self) -> None:
        """Wait for queued writes (before reading back or rewriting in place)."""
        if self._writer_obj is not None:
            self._writer_obj.drain()

    def _fd(self, name: str) -> int:
        if self._closed:
            raise PfmFormatError("PFM is closed", path=self.path)
        return self._fds[name]

    def _writable(self) -> None:
        if self.mode != "r+":
            raise PfmFormatError("PFM is open read-only (open with mode 'r+' to change it)", path=self.path)
        self._fd("bin")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if self._writer_obj is not None:
                self._writer_obj.close()
            if self._pool_obj is not None:
                self._pool_obj.shutdown(wait=False)
            self._close_fds()
        except Exception:  # noqa: BLE001
            pass

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}

    def flush(self) -> None:
        """Finish queued writes, so that every change is in the files (not fsynced)."""
        self._fd("bin")
        self._sync()

    def close(self, durable: bool = False) -> None:
        """Close the parts; with ``durable=True`` fsync them (and the text files) first."""
        if self._closed:
            return
        if self._pool_obj is not None:
            self._pool_obj.shutdown()
            self._pool_obj = None
        if self._writer_obj is not None:
            w, self._writer_obj = self._writer_obj, None
            try:
                w.close()
            except BaseException:
                self._close_fds()
                self._closed = True
                raise
        if durable and self.mode == "r+":
            for fd in self._fds.values():
                os.fsync(fd)
            for p in (self.ctl_path, self.lin_path, self.path):
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        self._close_fds()
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    # ------------------------------------------------------------------ .ctl / .lin
    def files(self) -> list[PfmInputFile]:
        """The input files of the ``.ctl`` in order; sequence numbers are checked."""
        with open(self.ctl_path, "rb") as fh:
            raw = decode_names(fh.read())
        lines = raw.split("\n")
        out = []
        offset = sum(len(x) + 1 for x in lines[:5])
        for ln in lines[5:]:
            s = ln.rstrip("\r")
            if not s:
                offset += len(ln) + 1
                continue
            parts = s.split(None, 3)
            if len(parts) < 4 or s[1] != " ":
                raise PfmFormatError(f"bad file list line {s!r}", path=self.ctl_path, offset=offset)
            flag, seq, typ, p = parts
            try:
                seq_i, typ_i = int(seq), int(typ)
            except ValueError as exc:
                raise PfmFormatError(f"bad file list line {s!r}", path=self.ctl_path, offset=offset) from exc
            if seq_i != len(out):
                raise PfmFormatError(f"file sequence number {seq_i} on line {len(out) + 6} should be "
                                     f"{len(out)}: the list file has been corrupted",
                                     path=self.ctl_path, offset=offset)
            out.append(PfmInputFile(seq_i, p, typ_i, flag == "-"))
            offset += len(ln) + 1
        return out

    def add_files(self, paths: Iterable[str], data_type: int = PFM_GSF_DATA) -> list[int]:
        """Append input files to the ``.ctl``; returns their file numbers."""
        self._writable()
        paths = [os.fspath(p) for p in paths]
        n0 = len(self.files())
        nums = list(range(n0, n0 + len(paths)))
        if nums and nums[-1] > self.max_file_number:
            raise PfmFormatError(f"file number {nums[-1]} exceeds the {self.header.file_number_bits}-bit "
                                 f"limit {self.max_file_number} ([FILE NUMBER BITS])", path=self.ctl_path)
        for p in paths:
            if "\n" in p:
                raise ConfigError(f"file name contains a newline: {p!r}")
        with open(self.ctl_path, "ab") as fh:
            fh.write(encode_names("".join("+ %05d %02d %s\n" % (n, int(data_type), p)
                                          for n, p in zip(nums, paths))))
        return nums

    def lines(self) -> list[str]:
        """The line names of the ``.lin`` in order."""
        with open(self.lin_path, "rb") as fh:
            raw = decode_names(fh.read())
        out = raw.split("\n")
        if out and out[-1] == "":
            out.pop()
        return [x.rstrip("\r") for x in out]

    def add_lines(self, names: Iterable[str]) -> list[int]:
        """Append line names to the ``.lin``; returns their line numbers."""
        self._writable()
        names = [str(x) for x in names]
        n0 = len(self.lines())
        nums = list(range(n0, n0 + len(names)))
        if nums and nums[-1] > self.max_line_number:
            raise PfmFormatError(f"line number {nums[-1]} exceeds the {self.header.line_number_bits}-bit "
                                 f"limit {self.max_line_number} ([LINE NUMBER BITS])", path=self.lin_path)
        for x in names:
            if "\n" in x:
                raise ConfigError(f"line name contains a newline: {x!r}")
        with open(self.lin_path, "ab") as fh:
            fh.write(encode_names("".join(x + "\n" for x in names)))
        return nums

    # ------------------------------------------------------------------ coding
    def _depth_decode(self, code: np.ndarray) -> np.ndarray:
        h = self.header
        return (code.astype(np.float64) / np.float64(np.float32(h.depth_scale))
                - np.float64(np.float32(h.depth_offset)))

    def _bin_depth_decode(self, code: np.ndarray) -> np.ndarray:
        """Bin depths as ``unpack_bin_record``: ``(float)code / scale - offset`` in float."""
        h = self.header
        v = code.astype(np.float32) / np.float32(h.depth_scale) - np.float32(h.depth_offset)
        return v.astype(np.float64)

    def _error_decode(self, code: np.ndarray, bits: int, scale: float) -> np.ndarray:
        if bits == 0:
            return np.zeros(code.shape, dtype=np.float32)
        null = (1 << bits) - 1
        v = code.astype(np.float32) / np.float32(scale)
        return np.where((code == null) | (v >= np.float32(null)), np.float32(-999.0), v).astype(np.float32)

    def _check_range(self, name: str, arr: np.ndarray, limit: int, key: str) -> None:
        """Raise naming ``name`` and the header ``key`` if any value is outside 0..limit (one pass)."""
        arr = np.asarray(arr)
        if arr.size == 0:
            return
        if np.issubdtype(arr.dtype, np.signedinteger):
            # negative values become huge unsigned ones: a single max() finds both kinds
            hi = int(np.max(arr.view(arr.dtype.str.replace("i", "u"))))
            ok = hi <= limit
        elif np.issubdtype(arr.dtype, np.unsignedinteger):
            ok = int(arr.max()) <= limit
        else:
            ok = arr.min() >= 0 and arr.max() <= limit
        if not ok:
            bad = int(np.flatnonzero((arr < 0) | (arr > limit))[0])
            raise PfmFormatError(f"{name} {arr[bad]} (sounding {bad}) is outside 0..{limit} "
                                 f"({key} = {limit.bit_length()} bits)", path=self.path)

    def update_coverage(self, bin_index, validity, fresh: bool = False) -> None:
        """Coverage bytes of bins from their validity (``update_cov_map``; ``fresh``: from
        bytes of 0); see :mod:`._coverage`."""
        self._writable()
        self._sync()
        update_coverage(self._fds["cvg"], bin_index, validity, path=self.cvg_path, fresh=fresh)

    def read_coverage(self, bin_index) -> np.ndarray:
        """Coverage bytes of the given bins."""
        if self.version < 70:
            base = int(self.header.coverage_map_address)
            return read_coverage(self._fd("bin"), bin_index, base=base, path=self.bin_path)
        return read_coverage(self._fd("cvg"), bin_index, path=self.cvg_path)

    # ------------------------------------------------------------------ header
    def compute_extrema(self, rows_per_read: int | None = None) -> dict:
        """pfmLoader's header extrema from every bin with soundings (float32 values, raster order).

        Counts: min/max ``num_soundings`` and their (col, row). For bins whose
        max depth is below NULL DEPTH: min/max depth with coords; and if the
        bin has DATA: min/max filtered depth with coords and min/max std.
        Start values are pfmLoader's (9999999 / -9999999, count 9999999 / 0).
        Only the bins that hold data are read (:meth:`bin_records_with_data`).
        """
        res = dict(min_filtered_depth=9999999.0, max_filtered_depth=-9999999.0,
                   min_filtered_coord=(0, 0), max_filtered_coord=(0, 0),
                   min_depth=9999999.0, max_depth=-9999999.0, min_coord=(0, 0), max_coord=(0, 0),
                   min_bin_count=9999999, max_bin_count=0, min_count_coord=(0, 0),
                   max_count_coord=(0, 0), min_standard_deviation=9999999.0,
                   max_standard_deviation=-9999999.0)
        step = rows_per_read or max(1, (16 << 20) // max(1, self.width * self.bin_record_size))
        null = np.float32(self.null_depth)

        def better(arr, bidx, key, coord_key, lower):
            if arr.size == 0:
                return
            j = int(np.argmin(arr) if lower else np.argmax(arr))
            v = float(arr[j])
            if (v < res[key]) if lower else (v > res[key]):
                res[key] = v
                if coord_key:
                    res[coord_key] = (int(bidx[j] % self.width), int(bidx[j] // self.width))

        fields = ("num_soundings", "validity", "std", "min_filtered", "max_filtered", "min", "max")
        for b in self.bin_records_with_data(fields=fields, chunk=step * self.width):
            has = b["num_soundings"] > 0
            if not has.any():
                continue
            bi = b["bin_index"][has]
            cnt = b["num_soundings"][has]
            j = int(np.argmin(cnt))
            if cnt[j] < res["min_bin_count"]:
                res["min_bin_count"] = int(cnt[j])
                res["min_count_coord"] = (int(bi[j] % self.width), int(bi[j] // self.width))
            j = int(np.argmax(cnt))
            if cnt[j] > res["max_bin_count"]:
                res["max_bin_count"] = int(cnt[j])
                res["max_count_coord"] = (int(bi[j] % self.width), int(bi[j] // self.width))
            mx = b["max"][has].astype(np.float32)
            ok = mx < null
            data = ok & ((b["validity"][has] & V.DATA) != 0)
            better(b["min_filtered"][has][data].astype(np.float32), bi[data], "min_filtered_depth",
                   "min_filtered_coord", True)
            better(b["max_filtered"][has][data].astype(np.float32), bi[data], "max_filtered_depth",
                   "max_filtered_coord", False)
            better(b["std"][has][data].astype(np.float32), bi[data], "min_standard_deviation", None, True)
            better(b["std"][has][data].astype(np.float32), bi[data], "max_standard_deviation", None, False)
            better(b["min"][has][ok].astype(np.float32), bi[ok], "min_depth", "min_coord", True)
            better(b["max"][has][ok].astype(np.float32), bi[ok], "max_depth", "max_coord", False)
        return res

    def write_header(self, **values) -> None:
        """Set header keys (``PfmHeader`` field names) and rewrite the header block.

        With no values, the extrema are computed from the bin records first
        (:meth:`compute_extrema`). Geometry and bit widths cannot be changed.
        """
        self._writable()
        frozen = {"record_length", "min_x", "min_y", "max_x", "max_y", "x_bin_size", "y_bin_size",
                  "bin_width", "bin_height", "bin_header_size", "count_bits", "std_bits", "std_scale",
                  "depth_bits", "depth_scale", "depth_offset", "record_pointer_bits",
                  "file_number_bits", "line_number_bits", "ping_number_bits", "beam_number_bits",
                  "offset_bits", "validity_bits", "bin_attribute_bits", "ndx_attribute_bits",
                  "horizontal_error_bits", "vertical_error_bits", "horizontal_error_scale",
                  "vertical_error_scale", "null_depth", "points"}
        if not values:
            values = self.compute_extrema()
        h = self.header.copy()
        for k, v in values.items():
            if k in frozen:
                raise ConfigError(f"write_header: {k} defines the layout and cannot be changed")
            if not hasattr(h, k) or k in ("unknown", "size_missing"):
                raise ConfigError(f"write_header: unknown header field {k!r}")
            setattr(h, k, tuple(v) if isinstance(v, list) and k.endswith("coord") else v)
        self._sync()
        data = h.to_bytes()
        if len(data) != self.bin_header_size:
            raise PfmFormatError("header block size changed", path=self.bin_path)
        os.pwrite(self._fds["bin"], data, 0)
        self.header = h


def create(path, grid, **kwargs) -> PfmFile:
    """Create a new PFM v7; see :meth:`PfmFile.create`."""
    return PfmFile.create(path, grid, **kwargs)


def open_pfm(path, mode: str = "r") -> PfmFile:
    """Open an existing PFM (``"r"`` or ``"r+"``)."""
    return PfmFile(path, mode)
