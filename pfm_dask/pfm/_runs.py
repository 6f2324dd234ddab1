"""A writer's bins and bit maps, each a compiled pass (kernels in :mod:`._runs_kernels`).

The runs of a sorted column of bin numbers (with the OR of each run's flags), the merge of a
group's pieces sorted by bin and the scatter of their columns to the merged places, lookups
by ping, the "touched" flags of the bins a load wrote, the store's map of bin records still
zero, the undo log's map of records whose pre-image it holds, and the reads that skip the
records known to be zero. What numpy did in several passes with temporaries (fancy
indexing, ``np.bitwise_or.at``, a stable argsort), one pass over the data here.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ._runs_kernels import _kernel, load_kernels

__all__ = ["bin_runs", "merge_runs_to", "scatter", "gather_u32", "touch_new", "bits_all_set",
           "clear_bits", "records_needed", "mark_records", "rows_nonzero", "gather_rows",
           "read_parts", "load_kernels"]

_U64 = np.uint64


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


def merge_runs_to(keys: np.ndarray, bounds: Sequence[int], dest: np.ndarray,
                  merged: np.ndarray) -> None:
    """Where a stable sort puts ``keys`` when ``keys[bounds[j]:bounds[j + 1]]`` are runs each
    sorted (the pieces of a group, by bin): ``dest[h]`` (int64, at least ``keys.size``) = the
    place of key ``h``, ``merged`` (int64) = the keys in that order. Linear compiled passes
    instead of a sort; a caller then moves each run's values straight to their places, with
    no concatenation."""
    k = np.ascontiguousarray(keys, dtype=np.int64)
    b = np.asarray(bounds, dtype=np.int64)
    if b.size < 2 or b[0] != 0 or b[-1] != k.size or np.any(np.diff(b) < 0):
        raise ValueError("bounds must run from 0 to len(keys), not decreasing")
    if dest.dtype != np.int64 or merged.dtype != np.int64 or dest.size < k.size \
            or merged.size < k.size:
        raise ValueError("dest and merged must be int64 arrays of at least len(keys)")
    if not k.size:
        return
    lo, hi = int(k.min()), int(k.max())
    if hi - lo < 2 * k.size + 4096:
        # keys in a range not much wider than their number (a group's bins): by counting,
        # in two passes whatever the number of runs
        _kernel("merge_count")(k, lo, np.empty(hi - lo + 2, dtype=np.int64), dest[:k.size],
                               merged[:k.size])
    else:
        _kernel("merge_runs_to")(k, b, np.empty(b.size - 1, dtype=np.int64), dest[:k.size],
                                 merged[:k.size])


def scatter(src: np.ndarray, dest: np.ndarray, out: np.ndarray, *, check: bool = True) -> None:
    """``out[dest] = src`` in one compiled pass (``dest`` int64 places, each within ``out``;
    ``src`` and ``out`` of one item size, 1, 2, 4 or 8 bytes, read and written as raw bits).
    ``check=False`` for places known to be within ``out`` (from :func:`merge_runs_to`): no
    pass over them first."""
    s = np.ascontiguousarray(src)
    d = np.ascontiguousarray(dest, dtype=np.int64)
    if s.shape != d.shape or s.ndim != 1 or out.ndim != 1 or s.dtype.itemsize != out.dtype.itemsize \
            or s.dtype.itemsize not in (1, 2, 4, 8) or not out.flags.c_contiguous \
            or not out.flags.writeable:
        raise ValueError("scatter: src and dest of one length, src and out of one item size")
    if check and d.size and (d.min() < 0 or d.max() >= out.size):
        raise ValueError("scatter: places outside out")
    if d.size:
        _kernel("scatter")(s.view(np.uint8), s.dtype.itemsize, d, out.view(np.uint8))


def gather_u32(table: np.ndarray, lo: int, want: np.ndarray) -> np.ndarray | None:
    """``table[want - lo]`` (uint32 ``table`` and ``want``) in one compiled pass, with no
    temporaries; None if a ``want`` falls outside the table."""
    t = np.ascontiguousarray(table, dtype=np.uint32)
    w = np.ascontiguousarray(want, dtype=np.uint32)
    out = np.empty(w.size, dtype=np.uint32)
    if w.size and _kernel("gather_u32")(t, int(lo), w, out) < 0:
        return None
    return out


def touch_new(bins: np.ndarray, touched: np.ndarray) -> np.ndarray:
    """The ``bins`` (int64, each within ``touched``) whose flag in the bool array ``touched``
    is not set yet, in order; their flags are set. One compiled pass."""
    b = np.ascontiguousarray(bins, dtype=np.int64)
    if touched.dtype != np.bool_ or touched.ndim != 1 or not touched.flags.c_contiguous \
            or not touched.flags.writeable:
        raise ValueError("touched must be a writeable flat contiguous bool array")
    if b.size and (b.min() < 0 or b.max() >= touched.size):
        raise ValueError("bins outside the flags")
    out = np.empty(b.size, dtype=np.int64)
    k = _kernel("touch_new")(b, touched, out) if b.size else 0
    return out[:k]


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


def records_needed(offsets: np.ndarray, size: int, limit: int, bits: np.ndarray | None) -> np.ndarray:
    """Per ``size``-byte record at ``offsets`` (int64): below ``limit`` and its bit (record
    ``offset // size``, MSB first) clear in ``bits`` (None: none set). ``bits`` must hold every
    record below ``limit``."""
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    out = np.empty(off.size, dtype=np.bool_)
    if off.size:
        b = np.zeros(0, np.uint8) if bits is None else bits
        if b.size and (off.min() < 0 or (limit - 1) // int(size) >= 8 * b.size):
            raise ValueError("record offsets outside the bit array")
        _kernel("undo_needed")(off, int(size), int(limit), b, out)
    return out


def mark_records(bits: np.ndarray, offsets: np.ndarray, size: int) -> None:
    """Set bit ``offset // size`` (MSB first) of ``bits`` for every record at ``offsets``."""
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    if not off.size:
        return
    if off.min() < 0 or int(off.max()) // int(size) >= 8 * bits.size:
        raise ValueError("record offsets outside the bit array")
    if bits.dtype != np.uint8 or bits.ndim != 1 or not bits.flags.c_contiguous or not bits.flags.writeable:
        raise ValueError("bits must be a writeable flat contiguous uint8 array")
    _kernel("bits_set_div")(bits, off, int(size))


def rows_nonzero(buf: np.ndarray, pos: np.ndarray, size: int) -> np.ndarray:
    """Per record of ``size`` bytes at byte ``pos[j]`` of the flat uint8 ``buf``: whether it has
    a non-zero byte (read in place: no copy of the records)."""
    p = np.ascontiguousarray(pos, dtype=np.int64)
    out = np.empty(p.size, dtype=np.bool_)
    if p.size:
        if p.min() < 0 or int(p.max()) + int(size) > buf.size:
            raise ValueError("records outside the buffer")
        _kernel("rows_nonzero")(buf, p, int(size), out)
    return out


def gather_rows(buf: np.ndarray, pos: np.ndarray, size: int, out: np.ndarray) -> None:
    """The records of ``size`` bytes at bytes ``pos`` of the flat uint8 ``buf``, end to end into
    the flat uint8 ``out`` (``pos.size * size`` bytes: a slice of a buffer about to be written)."""
    p = np.ascontiguousarray(pos, dtype=np.int64)
    if out.size != p.size * int(size):
        raise ValueError("out must hold the records exactly")
    if p.size:
        if p.min() < 0 or int(p.max()) + int(size) > buf.size:
            raise ValueError("records outside the buffer")
        _kernel("gather_rows")(buf, p, int(size), out)


def read_parts(span_lo: np.ndarray, span_len: np.ndarray, span_at: np.ndarray, base: int,
               size: int, zero_bits: np.ndarray, min_skip: int):
    """What to read of spans of whole ``size``-byte records (record ``i`` at byte ``base + i *
    size``) when runs of records marked in ``zero_bits`` (bit ``i``, MSB first: known to be all
    zero in the file) need no reading: those at either end of a span (no more calls) and those
    of at least ``min_skip`` records inside one. (file offsets, lengths, buffer positions) of
    the parts left, in order. One compiled pass over the spans' records."""
    lo = np.ascontiguousarray(span_lo, dtype=np.int64)
    ln = np.ascontiguousarray(span_len, dtype=np.int64)
    at = np.ascontiguousarray(span_at, dtype=np.int64)
    size, base, min_skip = int(size), int(base), max(1, int(min_skip))
    if lo.size and (np.any((lo - base) % size) or np.any(ln % size) or lo.min() < base):
        raise ValueError("spans must be whole records")
    cap = lo.size + int(ln.sum()) // size // min_skip + 1
    out = [np.empty(cap, dtype=np.int64) for _ in range(3)]
    k = _kernel("read_parts")(lo, ln, at, base, size, zero_bits, min_skip, *out) if lo.size else 0
    return tuple(o[:k] for o in out)
