"""numpy and bit-string references for the PFM bit packing (:mod:`pfm_dask.pfm._bitpack`).

The package packs and unpacks with numba kernels; these are the implementations they replaced
(one or two ``shift``/``or`` passes per field over columns of words) and a '0'/'1' string
packer, kept as second, independent references for the tests.
"""

from __future__ import annotations

from typing import Hashable, Mapping, Sequence

import numpy as np

from pfm_dask.pfm._bitpack import BitLayout

_U64 = np.uint64


def from_words(layout: BitLayout, words: np.ndarray) -> np.ndarray:
    """Reference for ``BitLayout._from_words``: the words byte-swapped, cut to the record length."""
    be = words.astype(">u8", copy=False)
    raw = be.view(np.uint8).reshape(words.shape[0], layout.n_words * 8)
    return np.ascontiguousarray(raw[:, : layout.record_bytes])


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


# Items (soundings) into 64-bit lanes, then the lanes of every slot into the records.

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
    """Reference for :func:`pfm_dask.pfm._bitpack.pack_records` in numpy (values must fit their widths).

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


def unpack_records(records: np.ndarray, slots: int, slot_bits: int,
                   item_fields: Mapping[Hashable, tuple[int, int]], select: np.ndarray,
                   block: int = 8192) -> dict:
    """Reference for :func:`pfm_dask.pfm._bitpack.unpack_records` in numpy (``select`` increasing).

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


def error_codes(err, bits: int, scale: float) -> np.ndarray:
    """The numpy coding of an error field, as the store coded it before the kernels:
    ``NINT(float(err) * float(scale))`` with a float product; NaN, negative or too large
    values code as null (``2**bits - 1``)."""
    null = (1 << bits) - 1
    e32 = np.asarray(err).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~(e32 >= 0)                       # NaN or negative
        e32 *= np.float32(scale)                # float * float, as the library
        np.minimum(e32, np.float32(null + 1), out=e32)
        e32[bad] = np.float32(null)
    t = e32.astype(np.float64)
    t += 0.5                                    # NINT widens to double, then adds 0.5
    np.trunc(t, out=t)
    code = t.astype(np.uint64)
    np.minimum(code, np.uint64(null), out=code)
    return code
