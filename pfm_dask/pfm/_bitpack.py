"""Vectorised MSB-first bit packing of fixed-layout PFM records.

Every PFM record (a bin record in ``.bin``, a physical depth record in
``.ndx``) is a bit stream: unsigned fields packed back to back, most
significant bit first, the record padded with zero bits to a whole byte
(``lib-pfm_lib : bit_pack.c``; PFM_NOTES 2.6, 2.7). A :class:`BitLayout`
describes one such record as a list of ``(key, bit_offset, nbits)`` fields and
packs or unpacks many records at once with numpy.

How: a record of ``B`` bytes is viewed as ``ceil(B / 8)`` big-endian 64-bit
words. A field of at most 64 bits touches one word or two neighbouring ones,
so packing a field is one or two ``shift``/``or`` operations on a column of
words for all records together, and unpacking is the reverse. There is no
Python loop per record or per sounding; the loops run over the (few dozen)
fields of the layout.

Field values are taken modulo ``2**nbits`` (as the C packer does); range
checks belong to the caller, which knows what a field means.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Sequence

import numpy as np

__all__ = [
    "BitField",
    "BitLayout",
    "pack_lanes",
    "place_lanes",
    "pack_records",
    "unpack_records",
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
        recs = np.asarray(records, dtype=np.uint8)
        if recs.ndim != 2 or recs.shape[1] != self.record_bytes:
            raise ValueError(f"expected (n, {self.record_bytes}) uint8 records, got {recs.shape}")
        n = recs.shape[0]
        padded = np.zeros((n, self.n_words * 8), dtype=np.uint8)
        padded[:, : self.record_bytes] = recs
        return padded.view(">u8").astype(_U64)

    def _from_words(self, words: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """(n, n_words) native uint64 -> (n, record_bytes) uint8."""
        be = words.astype(">u8", copy=False)
        raw = be.view(np.uint8).reshape(words.shape[0], self.n_words * 8)
        if out is None:
            return np.ascontiguousarray(raw[:, : self.record_bytes])
        out[...] = raw[:, : self.record_bytes]
        return out

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

    def unpack(self, records: np.ndarray, keys: Sequence[Hashable] | None = None) -> dict:
        """Field values (uint64 arrays) of every record in an (n, record_bytes) matrix."""
        return self.unpack_words(self._to_words(records), keys)


# ---------------------------------------------------------------------------
# Slow, obviously-correct reference (bit strings), used by the tests and for
# single records where speed does not matter.

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


def pack_records(item_fields: Sequence[tuple[int, int]], item_values: Sequence,
                 flat: np.ndarray, n_records: int, slots: int, slot_bits: int,
                 record_fields: Sequence[tuple[int, int]], record_values: Sequence[np.ndarray],
                 record_bytes: int, block: int = 8192, executor=None,
                 out: np.ndarray | None = None) -> np.ndarray:
    """Pack many items (soundings) into fixed records of ``slots`` items each.

    Item ``i`` (fields ``item_fields`` = ``(bit_offset, nbits)`` within the
    item, values already known to fit) goes to record ``flat[i] // slots``,
    slot ``flat[i] % slots``, at record bit ``slot * slot_bits``; ``flat``
    must be increasing. An item value may be an array or a callable
    ``f(i0, i1) -> uint64 array`` giving the values of items ``i0..i1-1``
    (so that coding runs block by block, in cache). ``record_fields`` /
    ``record_values`` are per-record fields (the continuation pointer).
    Unused slots stay zero. Returns the ``(n_records, record_bytes)`` uint8
    matrix (written into ``out``, a flat uint8 buffer of at least that many
    bytes, when given, so callers can recycle buffers).

    Work is done in blocks of ``block`` records so that every temporary stays
    in the CPU cache: per block, items are packed into 64-bit lanes
    (:func:`pack_lanes`), the lanes placed into the record words
    (:func:`place_lanes`), and the words byte-swapped into the output. With
    an ``executor`` (a thread pool) groups of blocks run in parallel; numpy
    releases the GIL inside its loops.
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


def unpack_records(records: np.ndarray, slots: int, slot_bits: int,
                   item_fields: Mapping[Hashable, tuple[int, int]], select: np.ndarray,
                   block: int = 8192) -> dict:
    """Item fields of many records, for the item positions ``select`` (increasing).

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
