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

* ``pack_soundings`` (in :mod:`._bitpack_soundings`), the ``.ndx`` writer's
  loop: codes depths and errors (the library's rules) and assembles a
  block of soundings at a time, field by field in vector loops (integer
  fields read in their own types from raw bytes, no converted copies), then
  writes the records as one big-endian bit stream, keeping the pending
  64-bit word in a register.
* :func:`pack_records` / :func:`unpack_records` (items in slots of fixed
  records), :meth:`BitLayout.unpack_words`, :meth:`BitLayout.pack_at` /
  :meth:`BitLayout.unpack_at` (records inside a read buffer, in place), the
  byte/word conversions, and the writer's record updates (:func:`tails_clean`,
  :func:`update_bin_records`).

The kernels themselves are in :mod:`pfm_dask.pfm._bitpack_kernels`; the writer's
bins and bit maps (runs of bins, the merge, the zero-bin and undo maps) are
:mod:`pfm_dask.pfm._runs`'s. Until
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
    "pack_records",
    "unpack_records",
    "load_kernels",
    "tails_clean",
    "update_bin_records",
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

def tails_clean(recs: np.ndarray, keep: np.ndarray, *, at: np.ndarray | None = None) -> np.ndarray:
    """Per row of the (n, size) uint8 records ``recs``: whether every bit from bit ``keep`` on
    (the slots past its soundings, then the continuation pointer) is zero, so clearing those bits
    restores it. The partial byte at the first free bit, then every byte after it: no byte after
    it is non-zero when the record's last non-zero byte is at it or before. A record all zero
    has no last non-zero byte: it counts as not clean (logged whole, safely) unless ``keep``
    reaches its last byte. One compiled pass. With ``at``: ``recs`` = (flat uint8 buffer, record
    size), record ``j`` at byte ``at[j]`` of it (a read span's, tested in place)."""
    if at is None:
        r = np.ascontiguousarray(recs, dtype=np.uint8)
        if r.ndim != 2:
            raise ValueError("recs must be (n, size) and keep one per row")
        buf, size = r.reshape(-1), r.shape[1]
        pos = np.arange(r.shape[0], dtype=np.int64) * size
    else:
        (buf, size), pos = recs, np.ascontiguousarray(at, dtype=np.int64)
        if pos.size and (pos.min() < 0 or int(pos.max()) + size > buf.size):
            raise ValueError("records outside the buffer")
    k = np.ascontiguousarray(keep, dtype=np.int64)
    if k.shape != (pos.size,):
        raise ValueError("recs must be (n, size) and keep one per row")
    if k.size and k.min() < 0:
        raise ValueError("keep must not be negative")
    out = np.empty(pos.size, dtype=np.bool_)
    if pos.size and size:
        _kernel("tails_clean")(buf, pos, int(size), k, out)
    elif pos.size:
        out[:] = False
    return out


def update_bin_records(layout: "BitLayout", buf: np.ndarray, offsets: np.ndarray, cur: Mapping,
                       total: np.ndarray, vor: np.ndarray, val_mask: int, first_new: np.ndarray,
                       last_new: np.ndarray, m: np.ndarray) -> None:
    """A call's bin records at byte ``offsets`` of the flat uint8 ``buf``, in place, in one
    compiled pass (every other bit kept): count ``total``, validity ``(cur validity | vor) &
    val_mask``, head ``first_new`` where ``cur``'s count is 0, tail ``last_new`` where ``m`` new
    records were chained (> 0); ``cur`` holds the records' present count, validity, head and
    tail (uint64). What unpacking, numpy and :meth:`BitLayout.pack_at` did in ten passes."""
    keys = ("num_soundings", "validity", "head", "tail")
    offs, _ = layout._at_args(buf, offsets, list(keys))
    if not offs.size:
        return
    if not buf.flags.writeable:
        raise ValueError("buf is read-only")
    fs = [layout.fields[k] for k in keys]
    i64 = [np.ascontiguousarray(a, dtype=np.int64) for a in (total, first_new, last_new, m)]
    u64 = [np.ascontiguousarray(cur[k], dtype=_U64) for k in keys] + [np.ascontiguousarray(vor, dtype=_U64)]
    if any(a.shape != offs.shape for a in i64 + u64):
        raise ValueError("one value per record")
    words = np.zeros((max(f.offset + f.nbits for f in fs) - min(f.offset for f in fs)) // 64 + 3,
                     dtype=_U64)
    _kernel("bin_update")(buf, offs, np.array([f.offset for f in fs], np.int64),
                          np.array([f.nbits for f in fs], np.int64), i64[0], *u64,
                          _U64(val_mask), i64[1], i64[2], i64[3], words)
