"""MSB-first bit packing of fixed-layout PFM records (numba kernels, numpy reference).

Every PFM record (a bin record in ``.bin``, a physical depth record in
``.ndx``) is a bit stream: unsigned fields packed back to back, most
significant bit first, the record padded with zero bits to a whole byte
(``lib-pfm_lib : bit_pack.c``; docs/pfm-format.md §3, §4). A :class:`BitLayout`
describes one such record as a list of ``(key, bit_offset, nbits)`` fields and
packs or unpacks many records at once.

How: the hot paths are small numba kernels, compiled on first use by the
package's one compile helper (:class:`pfm_dask._numeric.CompiledKernels`:
on-disk cache when writable, ``nogil`` so the store's pack threads run in
parallel, here without reference counting). Each has one explicit signature
(read-only arrays, which accept writable ones too), so no call compiles
anything new:

* :func:`pack_soundings`, the ``.ndx`` writer's loop: codes depths and
  errors (the library's rules, :class:`SoundingCoding`) and assembles a
  block of soundings at a time, field by field in vector loops (integer
  fields read in their own types from raw bytes, no converted copies), then
  writes the records as one big-endian bit stream, keeping the pending
  64-bit word in a register.
* :func:`pack_records` / :func:`unpack_records` (items in slots of fixed
  records), :meth:`BitLayout.unpack_words`, :meth:`BitLayout.pack_at` /
  :meth:`BitLayout.unpack_at` (records inside a read buffer, in place), the
  byte/word conversions, :func:`bin_runs` and the bit-array helpers.

The kernels themselves are in :mod:`pfm_dask.pfm._bitpack_kernels`. Until
this process imports numba, reading records (``BitLayout.unpack``) takes
numpy paths (``_to_words_numpy``, ``_unpack_words_numpy``), so ``info`` and
``dump`` need no numba; the other numpy implementations the kernels replaced
are references in ``tests/pfm/bitpack_reference.py``.

Field values are taken modulo ``2**nbits`` (as the C packer does); range
checks belong to the caller, which knows what a field means.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

from ._bitpack_kernels import _kernel, load_kernels

__all__ = [
    "BitField",
    "BitLayout",
    "SoundingCoding",
    "pack_records",
    "pack_soundings",
    "unpack_records",
    "load_kernels",
    "bin_runs",
    "bits_all_set",
    "clear_bits",
]

_U64 = np.uint64


@dataclass(frozen=True)
class BitField:
    """One field of a record: where it starts (bit 0 = MSB of byte 0) and how wide it is."""

    key: Hashable
    offset: int
    nbits: int


class BitLayout:
    """A fixed record layout; packs and unpacks ``(n, record_bytes)`` uint8 matrices.

    ``fields`` is a sequence of ``(key, bit_offset, nbits)``; zero-width fields
    are allowed and ignored (the PFM keeps absent attributes and error fields
    at 0 bits). ``record_bytes`` defaults to the last bit rounded up to bytes.
    """

    def __init__(self, fields: Iterable[tuple[Hashable, int, int]], record_bytes: int | None = None):
        fl = [BitField(k, int(o), int(b)) for k, o, b in fields]
        for f in fl:
            if f.nbits < 0 or f.nbits > 64 or f.offset < 0:
                raise ValueError(f"bad field {f}")
        end = max((f.offset + f.nbits for f in fl), default=0)
        self.total_bits = end
        self.record_bytes = int(record_bytes) if record_bytes is not None else (end + 7) // 8
        if self.record_bytes * 8 < end:
            raise ValueError("record_bytes smaller than the layout")
        self.n_words = (self.record_bytes + 7) // 8
        self.fields = {f.key: f for f in fl}

    # ------------------------------------------------------------------ words
    def _to_words(self, records: np.ndarray) -> np.ndarray:
        """(n, record_bytes) uint8 -> (n, n_words) native uint64, zero padded."""
        if not _numba_loaded():
            return self._to_words_numpy(records)
        recs = self._check_records(records)
        words = np.empty((recs.shape[0], self.n_words), dtype=_U64)
        if recs.shape[0] and self.n_words:
            _kernel("to_words")(recs, words)
        return words

    def _from_words(self, words: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n, n_words) native uint64 -> (n, record_bytes) uint8."""
        words = np.asarray(words, dtype=_U64)
        if out is None:
            out = np.empty((words.shape[0], self.record_bytes), dtype=np.uint8)
        if words.shape[0] and self.record_bytes:
            _kernel("from_words")(words, out)
        return out

    def _check_records(self, records: np.ndarray) -> np.ndarray:
        recs = np.asarray(records, dtype=np.uint8)
        if recs.ndim != 2 or recs.shape[1] != self.record_bytes:
            raise ValueError(f"expected (n, {self.record_bytes}) uint8 records, got {recs.shape}")
        return recs

    def _to_words_numpy(self, records: np.ndarray) -> np.ndarray:
        """Reference for :meth:`_to_words`: pad each record to whole words, view big-endian."""
        recs = self._check_records(records)
        n = recs.shape[0]
        padded = np.zeros((n, self.n_words * 8), dtype=np.uint8)
        padded[:, : self.record_bytes] = recs
        return padded.view(">u8").astype(_U64)

    # --------------------------------------------------------------- packing
    def pack_words(self, words: np.ndarray, values: Mapping[Hashable, np.ndarray],
                   *, clear: bool = False, rows: np.ndarray | None = None,
                   transposed: bool = False) -> None:
        """OR field values into a word matrix in place.

        ``clear=True`` first zeroes each field's bits (read-modify-write of
        existing records). With ``rows``, values apply to those rows only
        (``values[k]`` then has ``len(rows)`` entries). ``transposed=True``
        means ``words`` is ``(n_words, n)``: each word column is contiguous,
        which makes the shifts and ors over many records faster.
        """
        if transposed:
            words = words.T
        for key, vals in values.items():
            f = self.fields[key]
            if f.nbits == 0:
                continue
            v = np.asarray(vals).astype(_U64, copy=False)
            if f.nbits < 64:
                v = v & _U64((1 << f.nbits) - 1)
            w, b = divmod(f.offset, 64)
            end = b + f.nbits  # bit just past the field, counted from word w's MSB
            if end <= 64:
                sh = 64 - end
                part = v << _U64(sh) if sh else v
                if clear:
                    m = _U64((((1 << f.nbits) - 1) << sh) ^ 0xFFFFFFFFFFFFFFFF)
                    self._apply_and(words, w, m, rows)
                self._apply_or(words, w, part, rows)
            else:
                lo_bits = end - 64          # bits that spill into word w + 1
                hi_bits = f.nbits - lo_bits  # bits that stay in word w
                hi = v >> _U64(lo_bits)
                lo = (v & _U64((1 << lo_bits) - 1)) << _U64(64 - lo_bits)
                if clear:
                    self._apply_and(words, w, _U64(((1 << hi_bits) - 1) ^ 0xFFFFFFFFFFFFFFFF), rows)
                    self._apply_and(words, w + 1,
                                    _U64((((1 << lo_bits) - 1) << (64 - lo_bits)) ^ 0xFFFFFFFFFFFFFFFF),
                                    rows)
                self._apply_or(words, w, hi, rows)
                self._apply_or(words, w + 1, lo, rows)

    @staticmethod
    def _apply_or(words, col, part, rows):
        if rows is None:
            words[:, col] |= part
        else:
            words[rows, col] |= part

    @staticmethod
    def _apply_and(words, col, mask, rows):
        if rows is None:
            words[:, col] &= mask
        else:
            words[rows, col] &= mask

    def pack(self, values: Mapping[Hashable, np.ndarray], n: int | None = None,
             *, out: np.ndarray | None = None) -> np.ndarray:
        """Pack ``values`` (key -> length-n array) into a new (n, record_bytes) matrix.

        Fields not given are zero. With ``out`` (an existing record matrix),
        the given fields are overwritten and all other bits kept.
        """
        if out is not None:
            words = self._to_words(out)
            self.pack_words(words, values, clear=True)
            return self._from_words(words, out=out)
        if n is None:
            n = len(next(iter(values.values()))) if values else 0
        words = np.zeros((n, self.n_words), dtype=_U64)
        self.pack_words(words, values)
        return self._from_words(words)

    # ------------------------------------------------------------- unpacking
    def unpack_words(self, words: np.ndarray, keys: Sequence[Hashable] | None = None,
                     rows: np.ndarray | None = None, transposed: bool = False) -> dict:
        """Field values (uint64) from a word matrix, optionally for some ``rows`` only."""
        if transposed:
            words = words.T
        words = np.asarray(words, dtype=_U64)
        if words.ndim != 2 or words.shape[1] < self.n_words:
            raise ValueError(f"expected (n, {self.n_words}) words, got {words.shape}")
        keys = list(self.fields if keys is None else keys)
        if rows is not None:
            rows = np.asarray(rows)
            rows = np.flatnonzero(rows) if rows.dtype == bool else rows.astype(np.int64, copy=False)
            nrow = rows.size
            if nrow and (rows.min() < -words.shape[0] or rows.max() >= words.shape[0]):
                raise IndexError(f"rows outside 0..{words.shape[0] - 1}")
        else:
            nrow = words.shape[0]
        if not _numba_loaded():
            return self._unpack_words_numpy(words, keys, rows)
        out = np.empty((len(keys), nrow), dtype=_U64)
        if nrow and keys:
            fs = [self.fields[k] for k in keys]
            _kernel("unpack_words")(words, np.ascontiguousarray(rows if rows is not None else _NO_ROWS),
                                    np.array([f.offset for f in fs], np.int64),
                                    np.array([f.nbits for f in fs], np.int64), out)
        return {k: out[j] for j, k in enumerate(keys)}

    def _unpack_words_numpy(self, words: np.ndarray, keys: Sequence[Hashable] | None = None,
                            rows: np.ndarray | None = None, transposed: bool = False) -> dict:
        """Reference for :meth:`unpack_words`: one or two shift/or passes per field."""
        if transposed:
            words = words.T
        out = {}
        for key in (self.fields if keys is None else keys):
            f = self.fields[key]
            nrow = words.shape[0] if rows is None else len(rows)
            if f.nbits == 0:
                out[key] = np.zeros(nrow, dtype=_U64)
                continue
            w, b = divmod(f.offset, 64)
            end = b + f.nbits
            col = words[:, w] if rows is None else words[rows, w]
            if end <= 64:
                v = col >> _U64(64 - end) if end < 64 else col.copy()
            else:
                lo_bits = end - 64
                nxt = words[:, w + 1] if rows is None else words[rows, w + 1]
                v = (col << _U64(lo_bits)) | (nxt >> _U64(64 - lo_bits))
            if f.nbits < 64:
                v &= _U64((1 << f.nbits) - 1)
            out[key] = v
        return out

    def pack_at(self, buf: np.ndarray, offsets: np.ndarray, values: Mapping[Hashable, np.ndarray],
                *, executor=None) -> None:
        """Overwrite the given fields of the records that start at byte ``offsets`` of the flat
        uint8 buffer ``buf``, in place (every other bit kept); values are taken modulo their widths.

        Lets a caller update records inside the spans it read (no copy out and back). With an
        ``executor``, many records are shared out between its threads and this one (records
        are whole bytes: no two share one).
        """
        offs, keys = self._at_args(buf, offsets, [k for k in values if self.fields[k].nbits])
        if not keys or not offs.size:
            return
        if not buf.flags.writeable:
            raise ValueError("buf is read-only")
        vals = np.empty((len(keys), offs.size), dtype=_U64)
        for j, k in enumerate(keys):
            vals[j] = values[k]
        fs = [self.fields[k] for k in keys]
        bits = offs * 8
        parts = 1 if executor is None or offs.size < (1 << 16) else 1 + getattr(executor, "_max_workers", 1)
        _run([(lambda a=a, b=b: _pack_bits(buf, bits[a:b], vals[:, a:b], fs))
              for a, b in _split(offs.size, parts)], executor if parts > 1 else None)

    def pack_new_at(self, buf: np.ndarray, offsets: np.ndarray, values: Mapping[Hashable, np.ndarray]) -> None:
        """Write whole records at byte ``offsets`` of the flat uint8 ``buf``: the given fields
        (modulo their widths), every other bit zero, each record one bit stream.

        For records made new (a bin's first soundings): as :meth:`pack_at` into zeroed
        records, at a fraction of its cost, since no byte is read back or merged.
        """
        offs, keys = self._at_args(buf, offsets, [k for k in values if self.fields[k].nbits])
        if not offs.size:
            return
        if not buf.flags.writeable:
            raise ValueError("buf is read-only")
        keys.sort(key=lambda k: self.fields[k].offset)
        vals = np.empty((len(keys), offs.size), dtype=_U64)
        for j, k in enumerate(keys):
            vals[j] = values[k]
        foff = np.array([self.fields[k].offset for k in keys], np.int64)
        fnb = np.array([self.fields[k].nbits for k in keys], np.int64)
        _kernel("pack_new")(buf, offs, vals, foff, fnb, int(self.record_bytes))

    def pack_items_at_bits(self, buf: np.ndarray, bit_base: np.ndarray, keys: Sequence[Hashable],
                           values: np.ndarray) -> None:
        """Overwrite fields ``keys`` of items whose bit 0 is at ``bit_base[j]`` of the flat uint8
        ``buf``, with ``values[i, j]`` for key ``i`` (uint64, taken modulo the widths); the
        fields' offsets are those of the layout, taken relative to each item's start.
        Every other bit is kept."""
        base = np.ascontiguousarray(bit_base, dtype=np.int64)
        values = np.asarray(values)
        used = [i for i, k in enumerate(keys) if self.fields[k].nbits]   # zero-width: absent
        fs = [self.fields[keys[i]] for i in used]
        if not base.size or not fs:
            return
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 \
                or not buf.flags.c_contiguous or not buf.flags.writeable:
            raise ValueError("buf must be a flat contiguous writeable uint8 array")
        end = max(f.offset + f.nbits for f in fs)
        if base.min() < 0 or int(base.max()) + end > buf.size * 8:
            raise ValueError("items outside the buffer")
        vals = np.ascontiguousarray(values.reshape(len(keys), base.size)[used], dtype=_U64)
        _pack_bits(buf, base, vals, fs)

    def unpack_at(self, buf: np.ndarray, offsets: np.ndarray, keys: Sequence[Hashable] | None = None) -> dict:
        """Field values (uint64) of the records that start at byte ``offsets`` of ``buf``."""
        offs, keys = self._at_args(buf, offsets, list(self.fields if keys is None else keys))
        out = np.empty((len(keys), offs.size), dtype=_U64)
        if keys and offs.size:
            fs = [self.fields[k] for k in keys]
            _kernel("unpack_at")(buf, offs, np.array([f.offset for f in fs], np.int64),
                                 np.array([f.nbits for f in fs], np.int64), out)
        return {k: out[j] for j, k in enumerate(keys)}

    def _at_args(self, buf, offsets, keys):
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 or not buf.flags.c_contiguous:
            raise ValueError("buf must be a flat contiguous uint8 array")
        offs = np.ascontiguousarray(offsets, dtype=np.int64)
        if offs.size and (offs.min() < 0 or offs.max() + self.record_bytes > buf.size):
            raise ValueError("records outside the buffer")
        return offs, keys

    def unpack(self, records: np.ndarray, keys: Sequence[Hashable] | None = None) -> dict:
        """Field values (uint64 arrays) of every record in an (n, record_bytes) matrix."""
        return self.unpack_words(self._to_words(records), keys)


# ---------------------------------------------------------------------------
# Slow, obviously-correct reference (bit strings), used by the tests and for
# single records where speed does not matter.

def _pack_bits(buf: np.ndarray, bit_base: np.ndarray, vals: np.ndarray, fields) -> None:
    """Run the ``pack_bits`` kernel for ``fields`` (objects with ``offset`` and ``nbits`` >= 1)."""
    foff = np.array([f.offset for f in fields], np.int64)
    fnb = np.array([f.nbits for f in fields], np.int64)
    span = int((foff + fnb).max() - foff.min())
    words = np.zeros((span + 7) // 64 + 2, dtype=_U64)
    _kernel("pack_bits")(buf, np.ascontiguousarray(bit_base), np.ascontiguousarray(vals), foff, fnb, words)


def _numba_loaded() -> bool:
    """Whether this process has imported numba. Reading records (``unpack``) takes the numpy
    references, same values, until it has: ``info``, ``dump`` and the exports of a small PFM
    then need no numba (about 0.5 s to import, more than their whole read)."""
    return "numba" in sys.modules


# ---------------------------------------------------------------------------
# Many items (soundings) into records of ``slots`` items each

_NO_ROWS = np.zeros(0, dtype=np.int64)


def _split(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous nearly equal ranges covering 0..n (empty ones dropped)."""
    e = [n * k // parts for k in range(parts + 1)]
    return [(a, b) for a, b in zip(e[:-1], e[1:]) if b > a]


def _run(jobs: list, executor) -> None:
    """Run the callables on ``executor``'s threads and this one, each taking the next job when
    done with its last (so a thread slowed by other work on the machine takes fewer)."""
    if executor is None or len(jobs) < 2:
        for j in jobs:
            j()
        return
    it = iter(jobs)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                j = next(it, None)
            if j is None:
                return
            j()

    helpers = min(len(jobs) - 1, getattr(executor, "_max_workers", 2) - 1) or 1
    futs = [executor.submit(worker) for _ in range(helpers)]
    try:
        worker()
    finally:
        for fu in futs:
            fu.result()


def _out_matrix(out, n_records: int, record_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat uint8 buffer, its (n_records, record_bytes) view)."""
    nbytes = n_records * record_bytes
    if out is None:
        out = np.empty(nbytes, dtype=np.uint8)
    flat = out.reshape(-1)[:nbytes]
    if flat.dtype != np.uint8 or not flat.flags.c_contiguous or not flat.flags.writeable or flat.size < nbytes:
        raise ValueError(f"out must be a writeable contiguous uint8 buffer of at least {nbytes} bytes")
    return flat, flat.reshape(n_records, record_bytes)


def pack_records(item_fields: Sequence[tuple[int, int]], item_values: Sequence,
                 flat: np.ndarray, n_records: int, slots: int, slot_bits: int,
                 record_fields: Sequence[tuple[int, int]], record_values: Sequence[np.ndarray],
                 record_bytes: int, block: int = 8192, executor=None,
                 out: np.ndarray | None = None) -> np.ndarray:
    """Pack many items (soundings) into fixed records of ``slots`` items each.

    Item ``i`` (fields ``item_fields`` = ``(bit_offset, nbits)`` within the
    item) goes to record ``flat[i] // slots``, slot ``flat[i] % slots``, at
    record bit ``slot * slot_bits``; ``flat`` must be increasing. An item
    value may be an array or a callable ``f(i0, i1) -> uint64 array`` giving
    the values of items ``i0..i1-1`` (so that coding runs block by block, in
    cache). ``record_fields`` / ``record_values`` are per-record fields (the
    continuation pointer). Unused slots stay zero. Returns the
    ``(n_records, record_bytes)`` uint8 matrix (written into ``out``, a flat
    uint8 buffer of at least that many bytes, when given, so callers can
    recycle buffers).

    Per block of ``block`` records the item values are gathered into one
    ``(fields, items)`` uint64 matrix and a numba kernel packs the block in a
    cache-resident word scratch. With an ``executor`` (a thread pool) the
    blocks are shared between its threads and this one; the kernels release
    the GIL.
    """
    res_flat, res = _out_matrix(out, n_records, record_bytes)
    if n_records == 0:
        return res
    flat = np.ascontiguousarray(flat, dtype=np.int64)
    keep = [j for j, (_, nb) in enumerate(item_fields) if nb]
    foff = np.array([item_fields[j][0] for j in keep], dtype=np.int64)
    fnb = np.array([item_fields[j][1] for j in keep], dtype=np.int64)
    rkeep = [j for j, (_, nb) in enumerate(record_fields) if nb]
    roff = np.array([record_fields[j][0] for j in rkeep], dtype=np.int64)
    rnb = np.array([record_fields[j][1] for j in rkeep], dtype=np.int64)
    _check_fits(foff, fnb, slots, slot_bits, record_bytes, roff, rnb)
    block = max(1, int(block))
    bounds = list(range(0, n_records, block)) + [n_records]
    cuts = np.searchsorted(flat, np.asarray(bounds, dtype=np.int64) * slots)
    if flat.size and (flat[0] < 0 or flat[-1] >= n_records * slots):
        raise ValueError("item positions outside the records")
    kern = _kernel("pack_items")
    nblocks = len(bounds) - 1

    def do(first: int, last: int) -> None:
        cap = int(max(cuts[j + 1] - cuts[j] for j in range(first, last)))
        vals = np.empty((len(keep), max(cap, 1)), dtype=_U64)
        scratch = np.empty((block * record_bytes >> 3) + 2, dtype=_U64)
        rvals = np.empty((len(rkeep), block), dtype=_U64)
        for j in range(first, last):
            r0, r1 = bounds[j], bounds[j + 1]
            i0, i1 = int(cuts[j]), int(cuts[j + 1])
            for row, jf in enumerate(keep):
                v = item_values[jf]
                vals[row, : i1 - i0] = v(i0, i1) if callable(v) else v[i0:i1]
            for row, jf in enumerate(rkeep):
                rvals[row, : r1 - r0] = record_values[jf][r0:r1]
            kern(vals, foff, fnb, flat[i0:i1], slots, slot_bits, r0, r1, rvals, roff, rnb,
                 record_bytes, res_flat, scratch)

    parts = 1 if executor is None else min(nblocks, 2 * getattr(executor, "_max_workers", 2))
    _run([lambda a=a, b=b: do(a, b) for a, b in _split(nblocks, parts)], executor)
    return res


def _check_fits(foff, fnb, slots, slot_bits, record_bytes, roff=None, rnb=None) -> None:
    end = int(np.max(foff + fnb)) if foff.size else 0
    last = (slots - 1) * slot_bits + end
    if roff is not None and roff.size:
        last = max(last, int(np.max(roff + rnb)))
    if last > record_bytes * 8:
        raise ValueError("item fields do not fit in the record")
    if fnb.size and (fnb.min() < 0 or fnb.max() > 64):
        raise ValueError("field widths must be 0..64 bits")


# ---------------------------------------------------------------------------
# Soundings coded and packed in one pass (the .ndx writer's hot loop)

#: sounding fields coded inside :func:`pack_soundings`, in the kernel's order
_SOUNDING_ORDER = ("file", "line", "ping", "beam", "depth", "x_off", "y_off", "validity",
                   "horizontal_error", "vertical_error")
_FLOAT_FIELDS = ("depth", "horizontal_error", "vertical_error")
#: length of the ``check`` array of :func:`pack_soundings` and :func:`fill_slots`
CHECK_SIZE = 11


@dataclass(frozen=True)
class SoundingCoding:
    """How :func:`pack_soundings` turns float sounding fields into codes (the PFM library's rules).

    depth: ``NINT((z + depth_offset) * depth_scale)`` in double, where the
    offset and scale are the header's float32 values widened to double and
    ``z`` is already checked (code >= 0, so NINT is ``trunc(v + 0.5)``).
    errors: ``NINT(float(e) * float(scale))`` with a float32 product,
    clamped to ``null = 2**bits - 1``; NaN or negative errors are stored as
    ``null``.
    """

    depth_offset: float
    depth_scale: float
    horizontal_error_scale: float
    horizontal_error_null: int
    vertical_error_scale: float
    vertical_error_null: int
    #: the largest depth code allowed (the null depth's code, or the field's maximum)
    depth_code_max: int = 1 << 62

    @classmethod
    def from_header(cls, h) -> "SoundingCoding":
        """The coding of a :class:`PfmHeader` (float32 header fields, error nulls from the bit widths,
        depth codes up to the NULL DEPTH's code and the DEPTH BITS' maximum)."""
        from .._numeric import scaled_code_f64

        null_code = int(scaled_code_f64(h.null_depth, h.depth_offset, h.depth_scale))
        return cls(float(np.float32(h.depth_offset)), float(np.float32(h.depth_scale)),
                   float(np.float32(h.horizontal_error_scale)), (1 << h.horizontal_error_bits) - 1,
                   float(np.float32(h.vertical_error_scale)), (1 << h.vertical_error_bits) - 1,
                   min(null_code, (1 << h.depth_bits) - 1))


def _as_u64(v, n: int) -> np.ndarray:
    """Integer codes as a contiguous uint64 array (no copy for 64-bit integers)."""
    a = np.asarray(v)
    if a.shape != (n,):
        raise ValueError(f"expected {n} values, got shape {a.shape}")
    if a.dtype == np.uint64 or a.dtype == np.int64:
        return np.ascontiguousarray(a).view(_U64)
    return a.astype(_U64)


def _sounding_values(key, v, nbits: int) -> np.ndarray:
    """A sounding field's values as an aligned contiguous array of a type the packer reads as it
    is: any integer type for integer fields; float32/float64 for depth and errors (other types are
    converted as the coding rule reads them: depth to double, errors to float)."""
    if not nbits:
        return np.zeros(0, dtype=np.uint64)
    a = np.asarray(v)
    if a.ndim != 1:
        raise ValueError(f"{key} must be 1-d, got shape {a.shape}")
    if key == "depth" or key.endswith("_error"):
        if a.dtype not in (np.float32, np.float64):
            with np.errstate(over="ignore"):          # too large for float32: inf, coded as null
                a = a.astype(np.float64 if key == "depth" else np.float32)
    elif a.dtype.kind not in "iu":
        a = a.astype(_U64)
    if not a.dtype.isnative:
        a = a.astype(a.dtype.newbyteorder("="))
    return np.require(a, requirements=["C", "A"])


class _SoundingArgs:
    """The sounding fields of :func:`pack_soundings` and :func:`fill_slots` as their kernels take
    them: raw bytes per field with its width in bytes, bit positions and widths in the
    kernels' field order, attribute codes, and the coding constants (``args``)."""

    def __init__(self, item_fields: Mapping[Hashable, tuple[int, int]], values: Mapping[Hashable, np.ndarray],
                 coding: SoundingCoding):
        arrays = [_sounding_values(key, values.get(key), item_fields.get(key, (0, 0))[1])
                  for key in _SOUNDING_ORDER]
        akeys = sorted((k for k in item_fields if k not in _SOUNDING_ORDER and item_fields[k][1]),
                       key=lambda k: item_fields[k][0])
        ns = {a.shape[0] for a in arrays if a.size} | {np.asarray(values[k]).shape[0] for k in akeys}
        ns |= {a.shape[0] for a, k in zip(arrays, _SOUNDING_ORDER) if item_fields.get(k, (0, 0))[1]}
        if len(ns) > 1:
            raise ValueError(f"sounding value arrays differ in length: {sorted(ns)}")
        self.n_items = n_items = ns.pop() if ns else 0
        attrs = (np.stack([_as_u64(values[k], n_items) for k in akeys]) if akeys
                 else np.zeros((0, 0), dtype=_U64))
        cursor = 0
        for key in list(_SOUNDING_ORDER) + akeys:
            off, nb = item_fields.get(key, (0, 0))
            if nb:
                if off < 0 or nb > 64:
                    raise ValueError(f"bad sounding field {key!r}: bit {off}, {nb} bits")
                cursor = max(cursor, off + nb)
        #: bit just past the last field of a sounding
        self.item_end = cursor
        pos = np.array([item_fields.get(k, (0, 0))[0] for k in _SOUNDING_ORDER], dtype=np.int64)
        nbits = np.array([item_fields.get(k, (0, 0))[1] for k in _SOUNDING_ORDER], dtype=np.int64)
        apos = np.array([item_fields[k][0] for k in akeys], dtype=np.int64)
        anb = np.array([item_fields[k][1] for k in akeys], dtype=np.int64)
        c = coding
        hs, vs = np.float32(c.horizontal_error_scale), np.float32(c.vertical_error_scale)
        hcap, vcap = np.float32(c.horizontal_error_null + 1), np.float32(c.vertical_error_null + 1)
        kinds = np.array([a.dtype.itemsize for a in arrays], dtype=np.int64)     # bytes per value
        raw = [a.view(np.uint8) for a in arrays]
        # file, line, ping, beam, x_off, y_off, validity, depth, errors (the kernels' argument order)
        self.args = (*raw[:4], raw[5], raw[6], raw[7], raw[4], raw[8], raw[9], attrs, kinds, pos, nbits,
                     apos, anb, float(c.depth_offset), float(c.depth_scale), float(c.depth_code_max) + 1.0,
                     hs, hcap, _U64(c.horizontal_error_null), vs, vcap, _U64(c.vertical_error_null))
        self.item_fields = item_fields


def check_failures(check: np.ndarray, item_fields: Mapping[Hashable, tuple[int, int]]) -> list[str]:
    """The sounding fields whose values :func:`pack_soundings` or :func:`fill_slots` saw out of
    range, from their ``check`` array: integer fields (in the packing order) with a value wider
    than their bits (a negative one included), then ``depth`` if one coded outside ``0 ..
    depth_code_max``. Fields without bits are not checked."""
    bad = []
    for j, k in enumerate(_SOUNDING_ORDER):
        nb = item_fields.get(k, (0, 0))[1]
        if k not in _FLOAT_FIELDS and nb and int(check[j]) >> int(nb):
            bad.append(k)
    if item_fields.get("depth", (0, 0))[1] and check[10]:
        bad.append("depth")
    return bad


def fill_slots(buf: np.ndarray, record_bytes: int, slots: int, slot_bits: int,
               item_fields: Mapping[Hashable, tuple[int, int]], values: Mapping[Hashable, np.ndarray],
               coding: SoundingCoding, rows: np.ndarray, slot0: np.ndarray, first: np.ndarray,
               count: np.ndarray, *, check: np.ndarray | None = None) -> list[str]:
    """Code soundings into free slots of records held in ``buf``, in place (numba, one pass).

    ``buf`` is a flat writeable uint8 array of whole records of ``record_bytes``;
    record ``rows[g]`` gets soundings ``first[g] .. first[g] + count[g] - 1`` of
    ``values`` in slots ``slot0[g] .. slot0[g] + count[g] - 1``, coded as
    :func:`pack_soundings` codes them (same ``item_fields``, ``values`` and
    ``coding``); every other bit (the soundings already there, the continuation
    pointer) is kept. This is how new soundings fill the free slots of a bin's
    last record before new records are chained to it.

    The soundings are checked as they are coded: returns the fields whose values
    did not fit (integer fields wider than their bits or negative, depths coding
    outside ``0 .. coding.depth_code_max``; such values are stored truncated, so
    the caller must not keep the records); ``check`` (a uint64 array of
    :data:`CHECK_SIZE`), if given, accumulates the raw findings over calls.
    """
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 \
            or not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ValueError("buf must be a flat contiguous writeable uint8 array")
    rows, slot0, first, count = (np.ascontiguousarray(x, dtype=np.int64) for x in (rows, slot0, first, count))
    if not (rows.size == slot0.size == first.size == count.size):
        raise ValueError("rows, slot0, first and count differ in length")
    use = count > 0
    if not use.any():
        return []
    a = _SoundingArgs(item_fields, values, coding)
    n_rec = buf.size // record_bytes
    if not 1 <= a.item_end <= slot_bits or slots * slot_bits > record_bytes * 8:
        raise ValueError("soundings must fit their slots, and the slots their records")
    if (rows[use].min() < 0 or rows[use].max() >= n_rec or slot0[use].min() < 0
            or (slot0 + count)[use].max() > slots or first[use].min() < 0
            or (first + count)[use].max() > a.n_items):
        raise ValueError("slots outside the records, or soundings past the end of the values")
    words = np.zeros((record_bytes + 15) // 8, dtype=_U64)
    seen = np.zeros(CHECK_SIZE, dtype=_U64)
    _kernel("fill_slots")(buf, int(record_bytes), int(slot_bits), rows, slot0, first, count,
                          *a.args, words, seen)
    if check is not None:
        check |= seen
    return check_failures(seen, item_fields)


def pack_soundings(item_fields: Mapping[Hashable, tuple[int, int]], values: Mapping[Hashable, np.ndarray],
                   coding: SoundingCoding, first: np.ndarray, count: np.ndarray, rec0: np.ndarray,
                   n_records: int, slots: int, slot_bits: int, cont_field: tuple[int, int],
                   cont_base: int, record_bytes: int, *, executor=None, out: np.ndarray | None = None,
                   block: int = 8192, sink=None, chunk_bytes: int = 1 << 20,
                   check: np.ndarray | None = None) -> np.ndarray | None:
    """Code and pack soundings into new chained physical records (numba, one pass).

    Bin ``g`` gets records ``rec0[g] .. rec0[g] + ceil(count[g] / slots) - 1``
    (consecutive, ``rec0`` increasing, covering ``0..n_records-1``) holding
    soundings ``first[g] .. first[g] + count[g] - 1`` of ``values`` in order,
    ``slots`` per record at ``slot * slot_bits``. Every record but a bin's
    last gets the continuation pointer ``cont_base + (r + 1) * record_bytes``
    (the next record, records being written contiguously from byte
    ``cont_base``) in ``cont_field = (bit_offset, nbits)``; the last gets 0.

    ``item_fields`` maps each sounding field name (``file, line, ping, beam,
    depth, x_off, y_off, validity, horizontal_error, vertical_error``) and any
    other key (attributes) to ``(bit_offset, nbits)``; the fields of a
    sounding must lie within ``slot_bits``. ``values``: the integer fields as
    arrays of any integer type (read as they are, no converted copy; values
    checked by the caller to be >= 0 and to fit, else taken modulo the
    width), other keys as integer codes, and the float ``depth`` (widened to
    double; already checked to code within range), ``horizontal_error`` and
    ``vertical_error`` (rounded to float; see :class:`SoundingCoding`).
    Zero-width fields may be absent from ``values``. Returns the
    ``(n_records, record_bytes)`` uint8 matrix (in ``out`` if given, a flat
    uint8 buffer). Runs of records are shared out among the ``executor``'s
    threads and this one (the kernel releases the GIL); each codes and
    assembles ``block`` soundings at a time, then writes its records as one
    bit stream.

    With ``sink``, nothing is returned: each thread packs ``chunk_bytes`` of
    records at a time into a buffer of its own and calls ``sink(offset,
    bytes)`` (``offset`` of the chunk's first record, from record 0) while the
    bytes are still in cache, e.g. to ``pwrite`` them, which then copies from
    cache instead of from memory.

    The soundings are checked as they are coded, at no extra pass over memory:
    ``check`` (a uint64 array of :data:`CHECK_SIZE`), if given, accumulates
    what the kernels saw; ``_SoundingArgs.failures`` reads it (integer values
    wider than their fields or negative, depths coding outside ``0 ..
    coding.depth_code_max``: such soundings are packed truncated, so a caller
    that gets failures must drop the records).
    """
    res_flat, res = _out_matrix(out if sink is None else np.zeros(0, np.uint8), n_records if sink is None else 0,
                                record_bytes)
    first = np.ascontiguousarray(first, dtype=np.int64)
    count = np.ascontiguousarray(count, dtype=np.int64)
    rec0 = np.ascontiguousarray(rec0, dtype=np.int64)
    if n_records == 0:
        return None if sink is not None else res
    rend = np.empty(count.size, dtype=np.int64)          # each bin's records end before rend[g]
    if first.size != count.size or rec0.size != count.size or \
            _kernel("record_ends")(count, rec0, int(slots), rend) != n_records:
        raise ValueError("bins must own consecutive records covering 0..n_records-1")
    sa = _SoundingArgs(item_fields, values, coding)
    if count.size and (int(first[-1] + count[-1]) > sa.n_items or first.min() < 0):
        raise ValueError("bins refer to soundings past the end of the values")
    cursor = sa.item_end
    cpos, cnb = int(cont_field[0]), int(cont_field[1])
    if not 1 <= cursor <= slot_bits or slots < 1 or cpos < slots * slot_bits or not 1 <= cnb <= 64 \
            or cpos + cnb > record_bytes * 8:
        raise ValueError("soundings (at least one field) must fit their slots, followed by the "
                         "continuation pointer in the record")
    kern = _kernel("pack_soundings")

    nlanes = max(1, (cursor + 63) >> 6)

    def pack(r0: int, r1: int, buf: np.ndarray, obase: int, lanes: np.ndarray, tmp: np.ndarray,
             seen: np.ndarray) -> None:
        g0 = int(np.searchsorted(rend, r0, side="right"))
        kern(*sa.args, first, count, rec0, rend, g0, r0, r1, slots, slot_bits, cursor,
             cpos - slots * slot_bits, cnb, record_bytes * 8 - cpos - cnb, int(cont_base), record_bytes,
             sa.n_items, lanes, tmp, buf, obase, seen)

    parts = 1 if executor is None else 4 * getattr(executor, "_max_workers", 2)
    parts = max(1, min(parts, n_records * slots // (4 * block)))     # not for a few records
    seen = np.zeros((parts, CHECK_SIZE), dtype=_U64)                  # one row per job: no sharing

    def job(j: int, r0: int, r1: int):
        def do() -> None:
            lanes = np.empty((nlanes, block), dtype=_U64)
            tmp = np.empty(block, dtype=_U64)
            if sink is None:
                pack(r0, r1, res_flat, 0, lanes, tmp, seen[j])
                return
            step = max(1, chunk_bytes // record_bytes)
            buf = np.empty(step * record_bytes, dtype=np.uint8)
            for a in range(r0, r1, step):
                b = min(a + step, r1)
                pack(a, b, buf, a * record_bytes, lanes, tmp, seen[j])
                sink(a * record_bytes, buf[: (b - a) * record_bytes])
        return do

    _run([job(j, a, b) for j, (a, b) in enumerate(_split(n_records, parts))], executor)
    if check is not None:
        check |= np.bitwise_or.reduce(seen, axis=0)
    return None if sink is not None else res


# ---------------------------------------------------------------------------
# Reading items back

def unpack_records(records: np.ndarray, slots: int, slot_bits: int,
                   item_fields: Mapping[Hashable, tuple[int, int]], select: np.ndarray) -> dict:
    """Item fields of many records, for the item positions ``select``.

    ``records`` is ``(n_records, record_bytes)`` uint8; item ``p`` is slot
    ``p % slots`` of record ``p // slots``; ``item_fields`` maps a key to
    ``(bit_offset, nbits)`` within an item. Returns key -> uint64 array of
    ``len(select)`` values (rows of one matrix). One numba pass reads every
    field straight from the record bytes; ``select`` in increasing order is
    fastest.
    """
    recs = np.asarray(records, dtype=np.uint8)
    if recs.ndim != 2:
        raise ValueError(f"expected (n, record_bytes) uint8 records, got {recs.shape}")
    n_rec, rbytes = recs.shape
    sel = np.ascontiguousarray(select, dtype=np.int64)
    keys = list(item_fields)
    foff = np.array([item_fields[k][0] for k in keys], dtype=np.int64)
    fnb = np.array([item_fields[k][1] for k in keys], dtype=np.int64)
    out = np.empty((len(keys), sel.size), dtype=_U64)
    if sel.size and keys:
        if sel.min() < 0 or sel.max() >= n_rec * slots:
            raise ValueError("selected item positions outside the records")
        _check_fits(foff[fnb > 0], fnb[fnb > 0], slots, slot_bits, rbytes)
        buf = np.ascontiguousarray(recs).reshape(-1)
        _kernel("unpack_items")(buf, rbytes, slots, slot_bits, sel, foff, fnb, out)
    return {k: out[j] for j, k in enumerate(keys)}


# ---------------------------------------------------------------------------
# Writer support

def bin_runs(bin_index: np.ndarray, n_bins: int, *, values: bool = False, or_of: np.ndarray | None = None):
    """Start index of each run of equal bin indices, in one pass; ``None`` if any index is
    outside ``0..n_bins-1`` or the indices are not sorted (the caller then says which).
    With ``values``: ``(starts, bins)``, the bin of each run too (read in the same pass).
    With ``or_of`` (integers, one per index): the bitwise OR of each run's values (uint64, their
    bits as unsigned) is appended to the result, so a writer gets each bin's validity flags in
    the same pass (a separate ``np.bitwise_or.reduceat`` measured about twice the time)."""
    b = np.ascontiguousarray(bin_index, dtype=np.int64)
    starts = np.empty(b.size, dtype=np.int64)       # only the pages written are touched
    vals = np.empty(b.size, dtype=np.int64)
    if or_of is None:
        raw, kind, ors = np.zeros(0, np.uint8), 0, np.zeros(0, _U64)
    else:
        v = np.ascontiguousarray(or_of)
        if not np.issubdtype(v.dtype, np.integer) or v.shape != b.shape:
            raise ValueError("or_of must be integers, one per bin index")
        raw, kind, ors = v.view(np.uint8).reshape(-1), v.dtype.itemsize, np.empty(b.size, _U64)
    nr = _kernel("bin_runs")(b, int(n_bins), raw, kind, starts, vals, ors) if b.size else 0
    if nr < 0:
        return None
    out = (starts[:nr], vals[:nr]) if values else (starts[:nr],)
    if or_of is not None:
        out += (ors[:nr],)
    return out if len(out) > 1 else out[0]


def bits_all_set(bits: np.ndarray, positions: np.ndarray) -> bool:
    """True if every bit ``positions`` (bit ``p`` = byte ``p // 8``, MSB first) of ``bits`` is 1."""
    pos = np.ascontiguousarray(positions, dtype=np.int64)
    if pos.size and (pos.min() < 0 or pos.max() >= 8 * bits.size):
        raise ValueError("bit positions outside the array")
    return bool(_kernel("bits_all")(np.ascontiguousarray(bits, dtype=np.uint8), pos)) if pos.size else True


def clear_bits(bits: np.ndarray, positions: np.ndarray) -> None:
    """Set bits ``positions`` (bit ``p`` = byte ``p // 8``, MSB first) of ``bits`` to 0, in place."""
    pos = np.ascontiguousarray(positions, dtype=np.int64)
    if not pos.size:
        return
    if pos.min() < 0 or pos.max() >= 8 * bits.size:
        raise ValueError("bit positions outside the array")
    if bits.dtype != np.uint8 or bits.ndim != 1 or not bits.flags.c_contiguous or not bits.flags.writeable:
        raise ValueError("bits must be a writeable flat contiguous uint8 array")
    _kernel("bits_clear")(bits, pos)
