"""MSB-first bit packing of fixed-layout PFM records (numba kernels, numpy reference).

Every PFM record (a bin record in ``.bin``, a physical depth record in
``.ndx``) is a bit stream: unsigned fields packed back to back, most
significant bit first, the record padded with zero bits to a whole byte
(``lib-pfm_lib : bit_pack.c``; PFM_NOTES 2.6, 2.7). A :class:`BitLayout`
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

The numpy implementations they replaced (``_pack_records_numpy``,
``_unpack_records_numpy``, ``BitLayout._unpack_words_numpy``: one or two
``shift``/``or`` passes per field over columns of words) stay as a second
reference for the tests.

Field values are taken modulo ``2**nbits`` (as the C packer does); range
checks belong to the caller, which knows what a field means.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

from .._numeric import CompiledKernels

__all__ = [
    "BitField",
    "BitLayout",
    "SoundingCoding",
    "pack_lanes",
    "place_lanes",
    "pack_records",
    "pack_soundings",
    "unpack_records",
    "load_kernels",
    "bin_runs",
    "bits_all_set",
    "clear_bits",
    "pack_reference",
    "unpack_reference",
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

    def _from_words_numpy(self, words: np.ndarray) -> np.ndarray:
        """Reference for :meth:`_from_words`."""
        be = words.astype(">u8", copy=False)
        raw = be.view(np.uint8).reshape(words.shape[0], self.n_words * 8)
        return np.ascontiguousarray(raw[:, : self.record_bytes])

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


def pack_reference(fields: Sequence[tuple[int, int, int]], record_bytes: int) -> bytes:
    """Pack ``(bit_offset, nbits, value)`` triples into ``record_bytes`` bytes via a '0'/'1' string."""
    bits = ["0"] * (record_bytes * 8)
    for off, nb, val in fields:
        if nb == 0:
            continue
        s = format(int(val) % (1 << nb), f"0{nb}b")
        bits[off: off + nb] = list(s)
    s = "".join(bits)
    return bytes(int(s[i: i + 8], 2) for i in range(0, len(s), 8))


def unpack_reference(record: bytes, offset: int, nbits: int) -> int:
    """One field of one record, read through a '0'/'1' string."""
    if nbits == 0:
        return 0
    s = "".join(format(b, "08b") for b in record)
    return int(s[offset: offset + nbits], 2)


# ---------------------------------------------------------------------------
# Fast path for many soundings: pack each sounding into a few 64-bit lanes,
# then place the lanes of every slot into the physical records.

def pack_lanes(fields: Sequence[tuple[int, int]], values: Sequence[np.ndarray], n: int) -> np.ndarray:
    """Pack per-item fields into ``(n_lanes, n)`` big-endian-ordered uint64 lanes.

    ``fields`` are ``(bit_offset, nbits)`` within one item (a sounding),
    ``values`` the matching uint64 arrays, already known to fit their width
    (no masking here). Lane ``j`` holds item bits ``64j .. 64j + 63``, MSB
    first. Each field costs one or two shift/or passes over contiguous
    arrays, done in place through one scratch buffer.
    """
    end = max((o + b for o, b in fields), default=0)
    n_lanes = max(1, (end + 63) // 64)
    lanes = np.zeros((n_lanes, n), dtype=_U64)
    tmp = np.empty(n, dtype=_U64)
    for (off, nb), v in zip(fields, values):
        if nb == 0:
            continue
        v = np.asarray(v)
        if v.dtype != _U64:
            v = v.astype(_U64)
        w, b = divmod(off, 64)
        e = b + nb
        if e <= 64:
            if e == 64:
                np.bitwise_or(lanes[w], v, out=lanes[w])
            else:
                np.left_shift(v, _U64(64 - e), out=tmp)
                np.bitwise_or(lanes[w], tmp, out=lanes[w])
        else:
            lo = e - 64
            np.right_shift(v, _U64(lo), out=tmp)
            np.bitwise_or(lanes[w], tmp, out=lanes[w])
            np.left_shift(v, _U64(64 - lo), out=tmp)
            np.bitwise_or(lanes[w + 1], tmp, out=lanes[w + 1])
    return lanes


def place_lanes(lanes: np.ndarray, flat: np.ndarray, n_records: int, slots: int,
                slot_bits: int, words: np.ndarray) -> None:
    """OR item lanes into record words: item ``i`` goes to slot ``flat[i] % slots`` of
    record ``flat[i] // slots``, i.e. at record bit ``slot * slot_bits``.

    ``words`` is the transposed ``(n_words, n_records)`` record matrix. Each
    lane is scattered once into a ``(n_records, slots)`` buffer (``flat`` is
    increasing for soundings sorted by bin, so the scatter streams), then
    shifted into place slot by slot.
    """
    n_words = words.shape[0]
    ext = np.empty(n_records * slots, dtype=_U64)
    extm = ext.reshape(n_records, slots)
    tmp = np.empty(n_records, dtype=_U64)
    col = np.empty(n_records, dtype=_U64)
    for j in range(lanes.shape[0]):
        ext.fill(0)
        ext[flat] = lanes[j]
        for s in range(slots):
            p = s * slot_bits + 64 * j
            w, b = divmod(p, 64)
            if w >= n_words:
                continue
            np.copyto(col, extm[:, s])
            if b == 0:
                np.bitwise_or(words[w], col, out=words[w])
            else:
                np.right_shift(col, _U64(b), out=tmp)
                np.bitwise_or(words[w], tmp, out=words[w])
                if w + 1 < n_words:
                    np.left_shift(col, _U64(64 - b), out=tmp)
                    np.bitwise_or(words[w + 1], tmp, out=words[w + 1])




# ---------------------------------------------------------------------------
# numba kernels. They are plain functions here and compiled on first use by
# _kernel() (numba is imported then, not when the package is imported). Two
# rules keep them correct: shift amounts are always 0..63 (a shift by 64 is
# undefined in LLVM), and every integer that meets a uint64 is a uint64
# (numba types uint64 op int64 as float64).

_ALL = 0xFFFFFFFFFFFFFFFF


def _mask(nb):
    """The low ``nb`` bits set, 1 <= nb <= 64."""
    return np.uint64(_ALL) >> np.uint64(64 - nb)


def _put(scratch, p, nb, v):
    """OR the ``nb``-bit value ``v`` (masked) in at bit ``p`` of an MSB-first word array."""
    w = np.uint64(p) >> np.uint64(6)          # unsigned index: no negative-index wraparound code
    e = (p & 63) + nb
    if e <= 64:
        scratch[w] |= v << np.uint64(64 - e)
    else:
        scratch[w] |= v >> np.uint64(e - 64)
        scratch[w + np.uint64(1)] |= v << np.uint64(128 - e)


def _emit(scratch, nbytes, out, o):
    """Store the first ``nbytes`` bytes of an MSB-first word array at ``out[o:]`` (big-endian)."""
    nfull = nbytes >> 3
    for j in range(nfull):
        _st_be64(out, o + 8 * j, scratch[j])
    x = scratch[nfull]
    q = o + 8 * nfull
    for k in range(nbytes - 8 * nfull):
        out[q + k] = np.uint8(x >> np.uint64(56 - 8 * k))


def _load_be(buf, o, n):
    """The 8 bytes at ``buf[o:]`` as a big-endian integer (zero bytes past ``n``)."""
    if o + 8 <= n:
        return _ld_be64(buf, o)
    x = np.uint64(0)
    for k in range(8):
        x <<= np.uint64(8)
        if o + k < n:
            x |= np.uint64(buf[o + k])
    return x


def _get(buf, n, p, nb):
    """The ``nb``-bit field (1..64) at bit ``p`` of a byte stream of ``n`` bytes."""
    o = p >> 3
    sh = p & 7
    x = _load_be(buf, o, n) << np.uint64(sh)
    if sh + nb > 64:
        x |= np.uint64(buf[o + 8]) >> np.uint64(8 - sh)
    return x >> np.uint64(64 - nb)


def _depth_code_in(z, off, scale, lim):
    """``(code, ok)``: the depth code ``NINT((z + offset) * scale)`` in double, and whether it lies
    in ``0 .. lim - 1``.

    With ``t = (z + offset) * scale + 0.5`` (the packer's own arithmetic), NINT is ``>= 0``
    exactly when ``t > 0`` and at most ``lim - 1`` exactly when ``t < lim``; NaN fails both.
    An out-of-range depth gets code 0 (no undefined float-to-integer conversion)."""
    t = (z + off) * scale
    t += 0.5
    ok = (t > 0.0) & (t < lim)
    return np.uint64(t if ok else 0.0), ok


def _err_code(e, scale, cap, null):
    """``NINT(float(e) * float(scale))`` clamped to ``null``; NaN and negative -> ``null``.

    Written with selects, no branches, so that loops over it become vector code.
    """
    zero = np.float32(0.0)
    ok = e >= zero                     # False for NaN
    p = e * scale                      # float * float
    p = p if p <= cap else cap         # too large, or NaN from 0 * inf
    p = p if ok else zero
    c = np.uint64(np.float64(p) + 0.5)
    c = c if c < null else null
    return c if ok else null


_HELPERS = ("_mask", "_put", "_emit", "_load_be", "_get", "_depth_code_in", "_err_code",
            "_bw_put", "_bw_skip", "_col_or", "_col_or_raw", "_code_depths_raw", "_code_errors_raw",
            "_clear", "_raw_u64", "_put_raw", "_runs_or")
# unaligned big-endian 64-bit store/load of ``arr[i:i + 8]`` (uint8 array), numba intrinsics
# made by _make_intrinsics() when the first kernel compiles
_st_be64 = None
_ld_be64 = None


def _make_intrinsics(numba) -> dict:
    """``_st_be64(arr, i, value)`` and ``_ld_be64(arr, i)``: one unaligned byte-swapped store/load."""
    from llvmlite import ir
    from numba.extending import intrinsic

    T = numba.types

    def ptr64(context, builder, arrtype, arr, i):
        ary = context.make_array(arrtype)(context, builder, arr)
        return builder.bitcast(builder.gep(ary.data, [i]), ir.IntType(64).as_pointer())

    @intrinsic
    def st_be64(typingctx, arr, idx, val):
        def codegen(context, builder, sig, args):
            st = builder.store(builder.bswap(args[2]), ptr64(context, builder, sig.args[0], args[0], args[1]))
            st.align = 1
            return context.get_dummy_value()
        return T.void(arr, idx, val), codegen

    @intrinsic
    def ld_be64(typingctx, arr, idx):
        def codegen(context, builder, sig, args):
            ld = builder.load(ptr64(context, builder, sig.args[0], args[0], args[1]))
            ld.align = 1
            return builder.bswap(ld)
        return T.uint64(arr, idx), codegen

    return {"_st_be64": st_be64, "_ld_be64": ld_be64}


def _k_pack_items(vals, foff, fnb, flat, slots, slot_bits, r0, r1, rvals, roff, rnb, rbytes,
                  out, scratch):
    """Records ``r0..r1-1`` into ``out`` (bytes from ``r0 * rbytes``).

    Item ``i`` (values ``vals[:, i]``, fields ``foff``/``fnb`` with widths >= 1)
    sits at position ``flat[i]`` = record * slots + slot; record fields take
    ``rvals[:, r - r0]``. All items must lie in the record range.
    """
    rbits = rbytes * 8
    nbytes = (r1 - r0) * rbytes
    for j in range((nbytes >> 3) + 2):
        scratch[j] = 0
    nf = foff.size
    p0 = r0 * slots
    cur = 0                 # record (relative to r0) of the last item, and its first position
    cur_p = 0
    for i in range(flat.size):
        p = flat[i] - p0
        if p < cur_p or p >= cur_p + slots:
            cur = p // slots
            cur_p = cur * slots
        bit = cur * rbits + (p - cur_p) * slot_bits
        for f in range(nf):
            _put(scratch, bit + foff[f], fnb[f], vals[f, i] & _mask(fnb[f]))
    for f in range(roff.size):
        m = _mask(rnb[f])
        for r in range(r1 - r0):
            _put(scratch, r * rbits + roff[f], rnb[f], rvals[f, r] & m)
    _emit(scratch, nbytes, out, r0 * rbytes)


def _bw_put(out, acc, fill, o, v, nb):
    """Append the ``nb``-bit value ``v`` (1..64 bits, masked) to a bit stream.

    The stream state is ``acc`` (pending bits, MSB-aligned), ``fill`` (their
    number, 0..63) and ``o`` (byte offset in ``out`` of the next whole word);
    each full word is stored once, big-endian. Keeping the pending word in
    a register is what makes this fast: no read-modify-write of memory.
    """
    free = 64 - fill
    if nb < free:
        return acc | (v << np.uint64(free - nb)), fill + nb, o
    over = nb - free
    _st_be64(out, o, acc | (v >> np.uint64(over)))
    return (v << np.uint64(63 - over)) << np.uint64(1), over, o + 8


def _bw_skip(out, acc, fill, o, n):
    """Append ``n`` zero bits."""
    while n > 0:
        k = min(n, 64)
        acc, fill, o = _bw_put(out, acc, fill, o, np.uint64(0), k)
        n -= k
    return acc, fill, o


def _col_or(lanes, m, s, p, nb):
    """OR the ``nb``-bit values ``s[0:m]`` (masked) in at bit ``p`` of sounding columns
    ``lanes[:, 0:m]`` (64-bit words, MSB first). The same shifts for every sounding: vector code.
    Returns the OR of the values before masking: bits above ``nb`` mean a value did not fit."""
    mask = _mask(nb)
    e = (p & 63) + nb
    a = lanes[p >> 6]
    seen = np.uint64(0)
    if e <= 64:
        k = np.uint64(64 - e)
        for t in range(m):
            v = np.uint64(s[t])
            seen |= v
            a[t] |= (v & mask) << k
    else:
        b = lanes[(p >> 6) + 1]
        k1 = np.uint64(e - 64)
        k2 = np.uint64(128 - e)
        for t in range(m):
            v = np.uint64(s[t])
            seen |= v
            v &= mask
            a[t] |= v >> k1
            b[t] |= v << k2
    return seen


def _col_or_raw(lanes, m, raw, kind, lo, p, nb):
    """:func:`_col_or` for integer values given as raw bytes, ``kind`` = bytes per value (8, 4, 2
    or 1). Values are checked >= 0 by the caller, so signed ones read as unsigned are the same."""
    if kind == 8:
        return _col_or(lanes, m, raw.view(np.uint64)[lo:lo + m], p, nb)
    if kind == 4:
        return _col_or(lanes, m, raw.view(np.uint32)[lo:lo + m], p, nb)
    if kind == 2:
        return _col_or(lanes, m, raw.view(np.uint16)[lo:lo + m], p, nb)
    return _col_or(lanes, m, raw[lo:lo + m], p, nb)


def _code_depths_raw(tmp, m, raw, kind, lo, off, scale, lim):
    """``tmp[t]`` = depth code of sounding ``lo + t`` (float64, ``kind`` 8, or float32, 4); returns
    True if every code lies in ``0 .. lim - 1`` (see :func:`_depth_code_in`)."""
    ok = True
    if kind == 8:
        s = raw.view(np.float64)[lo:lo + m]
        for t in range(m):
            c, good = _depth_code_in(s[t], off, scale, lim)
            tmp[t] = c
            ok &= good
    else:
        s32 = raw.view(np.float32)[lo:lo + m]
        for t in range(m):
            c, good = _depth_code_in(np.float64(s32[t]), off, scale, lim)
            tmp[t] = c
            ok &= good
    return ok


def _code_errors_raw(tmp, m, raw, kind, lo, scale, cap, null):
    """``tmp[t]`` = error code of sounding ``lo + t`` (float64, ``kind`` 8, or float32, 4)."""
    if kind == 8:
        s = raw.view(np.float64)[lo:lo + m]
        for t in range(m):
            tmp[t] = _err_code(np.float32(s[t]), scale, cap, null)
    else:
        s32 = raw.view(np.float32)[lo:lo + m]
        for t in range(m):
            tmp[t] = _err_code(s32[t], scale, cap, null)


def _k_pack_soundings(file_, line, ping, beam, xo, yo, val, depth, herr, verr, attrs, kinds, pos,
                      nbits, apos, anb, doff, dscale, dlim, hscale, hcap, hnull, vscale, vcap, vnull,
                      first, cnt, rec0, rend, g0, r0, r1, slots, slot_bits, item_end, cgap, cnb, pad,
                      cbase, rbytes, n_items, lanes, tmp, out, obase, seen):
    """New physical records ``r0..r1-1``, coding and packing soundings in one pass.

    Bin ``g`` owns records ``rec0[g] .. rend[g] - 1`` holding its soundings
    ``first[g] .. first[g] + cnt[g] - 1`` in order, ``slots`` per record;
    every record but a bin's last points to the next one (``cbase + (r + 1)
    * rbytes``), the last holds 0. Field order in ``kinds``/``pos``/``nbits`` (bit
    offset within the sounding, width; width 0 = absent): file, line, ping,
    beam, depth, x_off, y_off, validity, horizontal error, vertical error;
    ``attrs[t]`` are coded attributes.

    Soundings are handled a block at a time: the float fields are coded into
    ``tmp``, and each field is OR-ed into ``lanes`` (``ceil(item_end / 64)``
    words per sounding, one column per sounding of the block) by a loop with
    the same shifts for every sounding (vector code); fields arrive as raw
    bytes with ``kinds[j]`` bytes per value and are read as they are.
    Then the records are written as one
    bit stream from byte ``r0 * rbytes - obase`` of ``out``: the soundings' bits, zeros for the
    rest of each slot and for empty slots, ``cgap`` zeros, the ``cnb``-bit
    continuation pointer and ``pad`` zeros.

    The soundings are checked on the way (read by :func:`check_failures`): ``seen[f] |=`` the OR of
    integer field ``f``'s values as given (bits above its width: a value too large or
    negative), ``seen[10] |= 1`` if a depth codes outside ``0 .. dlim - 1``.
    """
    cm = _mask(cnb)
    nl = max(1, (item_end + 63) >> 6)           # words per sounding
    wl = item_end - 64 * (nl - 1)                # bits of the last one
    tail = slot_bits - item_end
    blk = lanes.shape[1]
    z = np.uint64(0)
    acc = z
    fill = 0
    o = r0 * rbytes - obase                      # record r starts at byte r * rbytes - obase of out
    lo = 0                                       # soundings lo .. hi-1 are in lanes
    hi = 0
    nbins = first.size
    g = g0
    r = r0                                       # record being written
    while r < r1 and g < nbins:
        R = rec0[g]
        last = rend[g] - 1                       # the bin's last record: continuation 0
        i = first[g] + (r - R) * slots
        i_end = first[g] + min(cnt[g], (r1 - R) * slots)
        slot = 0
        while i < i_end:
            if i >= hi:                          # code and assemble the next block
                lo = i
                hi = min(i + blk, n_items)
                m = hi - lo
                for k in range(nl):
                    lanes[k, :m] = 0
                if nbits[0]:
                    seen[0] |= _col_or_raw(lanes, m, file_, kinds[0], lo, pos[0], nbits[0])
                if nbits[1]:
                    seen[1] |= _col_or_raw(lanes, m, line, kinds[1], lo, pos[1], nbits[1])
                if nbits[2]:
                    seen[2] |= _col_or_raw(lanes, m, ping, kinds[2], lo, pos[2], nbits[2])
                if nbits[3]:
                    seen[3] |= _col_or_raw(lanes, m, beam, kinds[3], lo, pos[3], nbits[3])
                if nbits[4]:
                    if not _code_depths_raw(tmp, m, depth, kinds[4], lo, doff, dscale, dlim):
                        seen[10] |= np.uint64(1)
                    _col_or(lanes, m, tmp, pos[4], nbits[4])
                if nbits[5]:
                    seen[5] |= _col_or_raw(lanes, m, xo, kinds[5], lo, pos[5], nbits[5])
                if nbits[6]:
                    seen[6] |= _col_or_raw(lanes, m, yo, kinds[6], lo, pos[6], nbits[6])
                if nbits[7]:
                    seen[7] |= _col_or_raw(lanes, m, val, kinds[7], lo, pos[7], nbits[7])
                if nbits[8]:
                    _code_errors_raw(tmp, m, herr, kinds[8], lo, hscale, hcap, hnull)
                    _col_or(lanes, m, tmp, pos[8], nbits[8])
                if nbits[9]:
                    _code_errors_raw(tmp, m, verr, kinds[9], lo, vscale, vcap, vnull)
                    _col_or(lanes, m, tmp, pos[9], nbits[9])
                for a in range(anb.size):
                    _col_or(lanes, m, attrs[a, lo:lo + m], apos[a], anb[a])
            j = i - lo
            for k in range(nl - 1):
                acc, fill, o = _bw_put(out, acc, fill, o, lanes[k, j], 64)
            acc, fill, o = _bw_put(out, acc, fill, o, lanes[nl - 1, j] >> np.uint64(64 - wl), wl)
            if tail:
                acc, fill, o = _bw_skip(out, acc, fill, o, tail)
            i += 1
            slot += 1
            if slot == slots:                    # record complete: pointer to the next one, padding
                cont = np.uint64(cbase + (r + 1) * rbytes) & cm if r < last else z
                acc, fill, o = _bw_skip(out, acc, fill, o, cgap)
                acc, fill, o = _bw_put(out, acc, fill, o, cont, cnb)
                acc, fill, o = _bw_skip(out, acc, fill, o, pad)
                slot = 0
                r += 1
        if slot:                                 # the bin's last record, partly filled
            acc, fill, o = _bw_skip(out, acc, fill, o, (slots - slot) * slot_bits + cgap)
            acc, fill, o = _bw_put(out, acc, fill, o, z, cnb)
            acc, fill, o = _bw_skip(out, acc, fill, o, pad)
            r += 1
        g += 1
    for k in range(fill >> 3):                   # records end on whole bytes
        out[o + k] = np.uint8(acc >> np.uint64(56 - 8 * k))


def _clear(scratch, p, nb):
    """Clear ``nb`` bits (any number) from bit ``p`` of an MSB-first word array."""
    while nb > 0:
        k = nb if nb < 64 else 64
        w = np.uint64(p) >> np.uint64(6)
        e = (p & 63) + k
        m = _mask(k)
        if e <= 64:
            scratch[w] &= ~(m << np.uint64(64 - e))
        else:
            scratch[w] &= ~(m >> np.uint64(e - 64))
            scratch[w + np.uint64(1)] &= ~(m << np.uint64(128 - e))
        p += k
        nb -= k


def _raw_u64(raw, kind, i):
    """Integer value ``i`` of raw bytes holding ``kind``-byte unsigned integers (see :func:`_col_or_raw`)."""
    if kind == 8:
        return raw.view(np.uint64)[i]
    if kind == 4:
        return np.uint64(raw.view(np.uint32)[i])
    if kind == 2:
        return np.uint64(raw.view(np.uint16)[i])
    return np.uint64(raw[i])


def _put_raw(scratch, p, nb, raw, kind, i):
    """:func:`_put` of integer value ``i`` of raw bytes (:func:`_raw_u64`), if the field has bits;
    returns the value as given (0 for a field without bits)."""
    if nb:
        v = _raw_u64(raw, kind, i)
        _put(scratch, p, nb, v & _mask(nb))
        return v
    return np.uint64(0)


def _k_fill_slots(flat, rbytes, slot_bits, rec_row, slot0, first, cnt,
                  file_, line, ping, beam, xo, yo, val, depth, herr, verr, attrs, kinds, pos,
                  nbits, apos, anb, doff, dscale, dlim, hscale, hcap, hnull, vscale, vcap, vnull, words,
                  seen):
    """Soundings into free slots of existing records, coded as :func:`_k_pack_soundings` codes them.

    Record ``g`` (bytes ``rec_row[g] * rbytes`` on of ``flat``) gets soundings
    ``first[g] .. first[g] + cnt[g] - 1`` in slots ``slot0[g]`` on; every other
    bit of the record is kept. Each record is loaded once into the 64-bit words
    ``words``, the soundings' fields are put in there, and it is stored back: no
    overlapping unaligned stores and loads per field. Field order in ``kinds`` /
    ``pos`` / ``nbits``, and the checks into ``seen``: those of :func:`_k_pack_soundings`.
    """
    full = rbytes >> 3
    rest = rbytes - 8 * full
    for g in range(rec_row.size):
        c = cnt[g]
        if c <= 0:
            continue
        o = rec_row[g] * rbytes
        for w in range(full):
            words[w] = _ld_be64(flat, o + 8 * w)
        if rest:
            x = np.uint64(0)
            for b in range(rest):
                x |= np.uint64(flat[o + 8 * full + b]) << np.uint64(56 - 8 * b)
            words[full] = x
        for t in range(c):
            i = first[g] + t
            p0 = (slot0[g] + t) * slot_bits
            _clear(words, p0, slot_bits)
            seen[0] |= _put_raw(words, p0 + pos[0], nbits[0], file_, kinds[0], i)
            seen[1] |= _put_raw(words, p0 + pos[1], nbits[1], line, kinds[1], i)
            seen[2] |= _put_raw(words, p0 + pos[2], nbits[2], ping, kinds[2], i)
            seen[3] |= _put_raw(words, p0 + pos[3], nbits[3], beam, kinds[3], i)
            if nbits[4]:
                z = depth.view(np.float64)[i] if kinds[4] == 8 else np.float64(depth.view(np.float32)[i])
                code, ok = _depth_code_in(z, doff, dscale, dlim)
                if not ok:
                    seen[10] |= np.uint64(1)
                _put(words, p0 + pos[4], nbits[4], code & _mask(nbits[4]))
            seen[5] |= _put_raw(words, p0 + pos[5], nbits[5], xo, kinds[5], i)
            seen[6] |= _put_raw(words, p0 + pos[6], nbits[6], yo, kinds[6], i)
            seen[7] |= _put_raw(words, p0 + pos[7], nbits[7], val, kinds[7], i)
            if nbits[8]:
                e = np.float32(herr.view(np.float64)[i]) if kinds[8] == 8 else herr.view(np.float32)[i]
                _put(words, p0 + pos[8], nbits[8], _err_code(e, hscale, hcap, hnull) & _mask(nbits[8]))
            if nbits[9]:
                e = np.float32(verr.view(np.float64)[i]) if kinds[9] == 8 else verr.view(np.float32)[i]
                _put(words, p0 + pos[9], nbits[9], _err_code(e, vscale, vcap, vnull) & _mask(nbits[9]))
            for a in range(anb.size):
                _put(words, p0 + apos[a], anb[a], attrs[a, i] & _mask(anb[a]))
        for w in range(full):
            _st_be64(flat, o + 8 * w, words[w])
        for b in range(rest):
            flat[o + 8 * full + b] = np.uint8(words[full] >> np.uint64(56 - 8 * b))


def _k_pack_bits(buf, bit_base, vals, foff, fnb, words):
    """Overwrite fields (``foff``/``fnb``, widths >= 1) of the items starting at bit
    ``bit_base[j]`` of ``buf`` with ``vals[:, j]``, keeping every other bit (records updated
    in place, soundings filling free slots: an item need not start on a byte).

    The bytes an item's fields cover are loaded once into the 64-bit words ``words``, the
    fields cleared and put there, and the bytes stored back: one pass of whole-word loads and
    stores per item, not a load and a store per field that overlap the last field's store.
    """
    lo_bit = foff[0]
    hi_bit = foff[0] + fnb[0]
    for f in range(foff.size):
        lo_bit = min(lo_bit, foff[f])
        hi_bit = max(hi_bit, foff[f] + fnb[f])
    for j in range(bit_base.size):
        o0 = (bit_base[j] + lo_bit) >> 3
        o1 = (bit_base[j] + hi_bit + 7) >> 3
        nw = (o1 - o0 + 7) >> 3
        for w in range(nw):
            q = o0 + 8 * w
            if q + 8 <= o1:
                words[w] = _ld_be64(buf, q)
            else:
                x = np.uint64(0)
                for k in range(o1 - q):
                    x |= np.uint64(buf[q + k]) << np.uint64(56 - 8 * k)
                words[w] = x
        rel = bit_base[j] - 8 * o0
        for f in range(foff.size):
            nb = fnb[f]
            p = rel + foff[f]
            _clear(words, p, nb)
            _put(words, p, nb, vals[f, j] & _mask(nb))
        for w in range(nw):
            q = o0 + 8 * w
            if q + 8 <= o1:
                _st_be64(buf, q, words[w])
            else:
                for k in range(o1 - q):
                    buf[q + k] = np.uint8(words[w] >> np.uint64(56 - 8 * k))


def _k_pack_new(buf, offsets, vals, foff, fnb, rbytes):
    """Whole ``rbytes``-byte records at byte ``offsets[j]`` of ``buf``, each written as one bit
    stream: field ``f`` (offsets increasing, not overlapping) gets ``vals[f, j]``, masked to
    ``fnb[f]`` bits; every other bit is 0."""
    rbits = rbytes * 8
    for j in range(offsets.size):
        o = offsets[j]
        acc = np.uint64(0)
        fill = 0
        p = 0
        for f in range(foff.size):
            acc, fill, o = _bw_skip(buf, acc, fill, o, foff[f] - p)
            acc, fill, o = _bw_put(buf, acc, fill, o, vals[f, j] & _mask(fnb[f]), fnb[f])
            p = foff[f] + fnb[f]
        acc, fill, o = _bw_skip(buf, acc, fill, o, rbits - p)
        for k in range(fill >> 3):               # records end on whole bytes
            buf[o + k] = np.uint8(acc >> np.uint64(56 - 8 * k))


def _k_unpack_at(buf, offsets, foff, fnb, out):
    """Fields (widths may be 0) of the records starting at byte ``offsets[j]`` of ``buf``."""
    n = buf.size
    for j in range(offsets.size):
        base = offsets[j] * 8
        for f in range(foff.size):
            nb = fnb[f]
            out[f, j] = _get(buf, n, base + foff[f], nb) if nb else np.uint64(0)


def _k_bits_all(bits, pos):
    """True if bit ``pos[j]`` (MSB first within each byte) is set for every j."""
    for j in range(pos.size):
        p = pos[j]
        if not (bits[p >> 3] >> (7 - (p & 7))) & 1:
            return False
    return True


def _k_bits_clear(bits, pos):
    """Clear bit ``pos[j]`` (MSB first within each byte) for every j."""
    for j in range(pos.size):
        p = pos[j]
        bits[p >> 3] &= np.uint8(~(1 << (7 - (p & 7))) & 255)


def _runs_or(b, nbins, v, with_or, starts, values, ors):
    """:func:`_k_bin_runs` for values ``v`` of one type; the OR only ``with_or``."""
    nr = 0
    prev = np.int64(-1)
    acc = np.uint64(0)
    for i in range(b.size):
        x = b[i]
        if x != prev or i == 0:
            if x < prev or x < 0 or x >= nbins:
                return -1
            if with_or and nr:
                ors[nr - 1] = acc
            acc = np.uint64(0)
            starts[nr] = i
            values[nr] = x
            nr += 1
            prev = x
        if with_or:
            acc |= np.uint64(v[i])
    if with_or and nr:
        ors[nr - 1] = acc
    return nr


def _k_bin_runs(b, nbins, vraw, vkind, starts, values, ors):
    """Start (``starts``) and value (``values``) of every run of equal values in ``b``; -1 if a
    value is outside 0..nbins-1 or smaller than the one before it. With ``vkind`` > 0, ``ors``
    gets the OR of each run's integers in ``vraw`` (raw bytes, ``vkind`` bytes each), found in
    the same pass."""
    if vkind == 8:
        return _runs_or(b, nbins, vraw.view(np.uint64), True, starts, values, ors)
    if vkind == 4:
        return _runs_or(b, nbins, vraw.view(np.uint32), True, starts, values, ors)
    if vkind == 2:
        return _runs_or(b, nbins, vraw.view(np.uint16), True, starts, values, ors)
    return _runs_or(b, nbins, vraw, vkind == 1, starts, values, ors)


def _k_record_ends(count, rec0, slots, rend):
    """``rend[g] = rec0[g] + ceil(count[g] / slots)``; the records in all, or -1 if the bins'
    runs of records do not follow one another from record 0."""
    nxt = 0
    for g in range(count.size):
        if rec0[g] != nxt or count[g] < 0:
            return -1
        nxt += (count[g] + slots - 1) // slots
        rend[g] = nxt
    return nxt


def _k_unpack_items(buf, rbytes, slots, slot_bits, select, foff, fnb, out):
    """Fields (``foff``/``fnb``, widths may be 0) of the items at positions ``select``
    (record * slots + slot) of a record byte stream; ``out[f, j]``."""
    n = buf.size
    rbits = rbytes * 8
    nf = foff.size
    cur = 0
    cur_p = 0
    for j in range(select.size):
        p = select[j]
        if p < cur_p or p >= cur_p + slots:
            cur = p // slots
            cur_p = cur * slots
        bit = cur * rbits + (p - cur_p) * slot_bits
        for f in range(nf):
            nb = fnb[f]
            if nb == 0:
                out[f, j] = 0
            else:
                out[f, j] = _get(buf, n, bit + foff[f], nb)


def _k_unpack_words(words, rows, foff, fnb, out):
    """Fields of word rows (``words[r]`` MSB-first 64-bit words), for ``rows`` or all rows."""
    nrow = out.shape[1]
    nw_rows = words.shape[0]
    use_rows = rows.size > 0
    for j in range(nrow):
        r = j
        if use_rows:
            r = rows[j]
            if r < 0:
                r += nw_rows
        for f in range(foff.size):
            nb = fnb[f]
            if nb == 0:
                out[f, j] = 0
                continue
            off = foff[f]
            w = off >> 6
            e = (off & 63) + nb
            if e <= 64:
                v = words[r, w] >> np.uint64(64 - e)
            else:
                v = (words[r, w] << np.uint64(e - 64)) | (words[r, w + 1] >> np.uint64(128 - e))
            out[f, j] = v & _mask(nb)


def _k_to_words(recs, words):
    """(n, record_bytes) bytes -> (n, n_words) MSB-first words, zero padded."""
    n, rb = recs.shape
    nw = words.shape[1]
    for i in range(n):
        for w in range(nw):
            x = np.uint64(0)
            for k in range(8):
                x <<= np.uint64(8)
                if w * 8 + k < rb:
                    x |= np.uint64(recs[i, w * 8 + k])
            words[i, w] = x


def _k_from_words(words, out):
    """(n, n_words) MSB-first words -> (n, record_bytes) bytes."""
    n, rb = out.shape
    for i in range(n):
        for b in range(rb):
            out[i, b] = np.uint8(words[i, b >> 3] >> np.uint64(56 - 8 * (b & 7)))


def _signature(name: str, T):
    """Explicit numba signature of kernel ``name`` (``T`` = ``numba.types``): one per kernel, so
    the first call compiles once and later calls with other dtypes fail instead of recompiling.
    Input arrays are typed read-only, which also accepts writable ones."""
    def arr(dt, nd=1, layout="C", ro=True):
        return T.Array(dt, nd, layout, readonly=ro)

    i64, u64, f32, f64 = T.int64, T.uint64, T.float32, T.float64
    ai = arr(i64)
    out_u8 = arr(T.uint8, ro=False)
    scratch = arr(u64, ro=False)
    sigs = {
        "pack_items": (arr(u64, 2), ai, ai, ai, i64, i64, i64, i64, arr(u64, 2), ai, ai, i64,
                       out_u8, scratch),
        "pack_soundings": (arr(T.uint8),) * 10 + (arr(u64, 2), ai, ai, ai, ai, ai,
                             f64, f64, f64, f32, f32, u64, f32, f32, u64, ai, ai, ai, ai)
                          + (i64,) * 12 + (arr(u64, 2, ro=False), scratch, out_u8, i64, scratch),
        "fill_slots": (out_u8, i64, i64, ai, ai, ai, ai) + (arr(T.uint8),) * 10
                      + (arr(u64, 2), ai, ai, ai, ai, ai, f64, f64, f64, f32, f32, u64, f32, f32, u64,
                         scratch, scratch),
        "unpack_items": (arr(T.uint8), i64, i64, i64, ai, ai, ai, arr(u64, 2, ro=False)),
        "unpack_words": (arr(u64, 2, "A"), ai, ai, ai, arr(u64, 2, ro=False)),
        "to_words": (arr(T.uint8, 2, "A"), arr(u64, 2, ro=False)),
        "bin_runs": (ai, i64, arr(T.uint8), i64, arr(i64, ro=False), arr(i64, ro=False), scratch),
        "record_ends": (ai, ai, i64, arr(i64, ro=False)),
        "pack_new": (arr(T.uint8, ro=False), ai, arr(u64, 2), ai, ai, i64),
        "pack_bits": (arr(T.uint8, ro=False), ai, arr(u64, 2), ai, ai, scratch),
        "unpack_at": (arr(T.uint8), ai, ai, ai, arr(u64, 2, ro=False)),
        "bits_all": (arr(T.uint8), ai),
        "bits_clear": (arr(T.uint8, ro=False), ai),
        "from_words": (arr(u64, 2, "A"), arr(T.uint8, 2, "A", ro=False)),
    }
    ret = {"bin_runs": T.int64, "record_ends": T.int64, "bits_all": T.boolean}.get(name, T.void)
    return ret(*sigs[name])


_KERNEL_NAMES = ("pack_items", "pack_soundings", "fill_slots", "unpack_items", "unpack_words", "to_words", "from_words",
                 "bin_runs", "record_ends", "pack_new", "pack_bits", "unpack_at", "bits_all", "bits_clear")


def _signatures(T) -> dict:
    return {name: _signature(name, T) for name in _KERNEL_NAMES}


#: The compiled ``_k_<name>`` (on first use, numba imported then). Without numba's reference
#: counting: the kernels allocate nothing, but every call of a helper that takes an array
#: (``_get(buf, ...)``, ``_bw_put(out, ...)``: once per field of every sounding) would otherwise
#: count references with atomic instructions, measured 4-5x the cost of the bit operations.
#: Python's error model, as the kernels were written and tested.
_kernel = CompiledKernels(globals(), _signatures, _HELPERS, prepare=_make_intrinsics,
                          error_model="python", refcounts=False)


def load_kernels(names: Iterable[str] | None = None) -> float:
    """Compile (or load from the on-disk cache) the numba kernels now; returns the seconds taken.

    Every kernel is otherwise made on its first call, which then pays for
    importing numba (about 0.5 s) and loading or compiling the kernel.
    Benchmarks call this before timing; long-running writers may call it at
    start-up.
    """
    return _kernel.load(names)


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


def _pack_records_numpy(item_fields: Sequence[tuple[int, int]], item_values: Sequence,
                        flat: np.ndarray, n_records: int, slots: int, slot_bits: int,
                        record_fields: Sequence[tuple[int, int]], record_values: Sequence[np.ndarray],
                        record_bytes: int, block: int = 8192, executor=None,
                        out: np.ndarray | None = None) -> np.ndarray:
    """Reference for :func:`pack_records` in numpy (values must fit their widths).

    Per block of records, items are packed into 64-bit lanes
    (:func:`pack_lanes`), the lanes placed into the record words
    (:func:`place_lanes`), and the words byte-swapped into the output.
    """
    n_words = (record_bytes + 7) // 8
    if out is None:
        out = np.empty(n_records * record_bytes, dtype=np.uint8)
    res = out[: n_records * record_bytes].reshape(n_records, record_bytes)
    exact = n_words * 8 == record_bytes
    flat = np.asarray(flat, dtype=np.int64)
    rec_layout = BitLayout([(i, o, b) for i, (o, b) in enumerate(record_fields)],
                           record_bytes=n_words * 8)
    bounds = list(range(0, n_records, block)) + [n_records]
    cuts = np.searchsorted(flat, np.asarray(bounds, dtype=np.int64) * slots)

    def do(first: int, last: int) -> None:
        for j in range(first, last):
            r0, r1 = bounds[j], bounds[j + 1]
            i0, i1 = int(cuts[j]), int(cuts[j + 1])
            words = np.zeros((n_words, r1 - r0), dtype=_U64)
            if i1 > i0:
                vals = [v(i0, i1) if callable(v) else v[i0:i1] for v in item_values]
                lanes = pack_lanes(item_fields, vals, i1 - i0)
                place_lanes(lanes, flat[i0:i1] - r0 * slots, r1 - r0, slots, slot_bits, words)
            if record_fields:
                rec_layout.pack_words(words, {i: v[r0:r1] for i, v in enumerate(record_values)},
                                      transposed=True)
            if exact:
                res[r0:r1].view(">u8")[...] = words.T
            else:
                tmp = np.empty((r1 - r0, n_words), dtype=">u8")
                tmp[...] = words.T
                res[r0:r1] = tmp.view(np.uint8)[:, :record_bytes]

    nblocks = len(bounds) - 1
    if executor is None or nblocks < 4:
        do(0, nblocks)
    else:
        groups = min(nblocks, 16)
        edges = np.linspace(0, nblocks, groups + 1).astype(int)
        futs = [executor.submit(do, int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]) if b > a]
        for fut in futs:
            fut.result()
    return res


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
                   item_fields: Mapping[Hashable, tuple[int, int]], select: np.ndarray,
                   block: int = 8192) -> dict:
    """Item fields of many records, for the item positions ``select``.

    ``records`` is ``(n_records, record_bytes)`` uint8; item ``p`` is slot
    ``p % slots`` of record ``p // slots``; ``item_fields`` maps a key to
    ``(bit_offset, nbits)`` within an item. Returns key -> uint64 array of
    ``len(select)`` values (rows of one matrix). One numba pass reads every
    field straight from the record bytes; ``select`` in increasing order is
    fastest. ``block`` is accepted for compatibility and unused.
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


def _unpack_records_numpy(records: np.ndarray, slots: int, slot_bits: int,
                   item_fields: Mapping[Hashable, tuple[int, int]], select: np.ndarray,
                   block: int = 8192) -> dict:
    """Reference for :func:`unpack_records` in numpy (``select`` increasing).

    ``records`` is ``(n_records, record_bytes)`` uint8; item ``p`` is slot
    ``p % slots`` of record ``p // slots``; ``item_fields`` maps a key to
    ``(bit_offset, nbits)`` within an item. Returns key -> uint64 array of
    ``len(select)`` values. The work runs block by block (cache resident):
    bytes to 64-bit words, each slot's item bits to lanes, lanes to fields.
    """
    recs = np.asarray(records, dtype=np.uint8)
    n_rec, rbytes = recs.shape
    n_words = (rbytes + 7) // 8
    sel = np.asarray(select, dtype=np.int64)
    end = max((o + b for o, b in item_fields.values()), default=0)
    n_lanes = max(1, (end + 63) // 64)
    out = {k: np.empty(sel.size, dtype=_U64) for k in item_fields}
    bounds = np.arange(0, n_rec + block, block)
    bounds[-1] = n_rec
    cuts = np.searchsorted(sel, bounds * slots)
    pad = np.zeros((min(block, max(n_rec, 1)), n_words * 8), dtype=np.uint8)
    for j in range(len(bounds) - 1):
        r0, r1 = int(bounds[j]), int(bounds[j + 1])
        s0, s1 = int(cuts[j]), int(cuts[j + 1])
        if s1 <= s0:
            continue
        nb = r1 - r0
        pad[:nb, :rbytes] = recs[r0:r1]
        words = pad[:nb].view(">u8").T.astype(_U64)          # (n_words, nb), rows contiguous
        pos = sel[s0:s1] - r0 * slots
        res = {k: np.empty((slots, nb), dtype=_U64) for k in item_fields}
        for s in range(slots):
            lanes = []
            for li in range(n_lanes):
                p = s * slot_bits + 64 * li
                w, b = divmod(p, 64)
                if w >= n_words:
                    lanes.append(np.zeros(nb, dtype=_U64))
                    continue
                if b == 0:
                    lanes.append(words[w])
                else:
                    lane = words[w] << _U64(b)
                    if w + 1 < n_words:
                        lane |= words[w + 1] >> _U64(64 - b)
                    lanes.append(lane)
            for k, (off, nbits) in item_fields.items():
                dst = res[k][s]
                if nbits == 0:
                    dst[...] = 0
                    continue
                w, b = divmod(off, 64)
                e = b + nbits
                if e <= 64:
                    np.right_shift(lanes[w], _U64(64 - e), out=dst)
                else:
                    lo = e - 64
                    np.left_shift(lanes[w], _U64(lo), out=dst)
                    dst |= lanes[w + 1] >> _U64(64 - lo)
                if nbits < 64:
                    dst &= _U64((1 << nbits) - 1)
        # item position p = rec * slots + s  ->  res[k][s, rec]
        rr = pos // slots
        ss = pos - rr * slots
        flat_t = ss * nb + rr
        for k in item_fields:
            out[k][s0:s1] = res[k].reshape(-1)[flat_t]
    return out


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
