"""Soundings coded and packed into ``.ndx`` physical records in one pass (the writer's hot loop).

:func:`pack_soundings` codes depths and errors by the PFM library's rules
(:class:`SoundingCoding`) and packs new chained physical records; :func:`fill_slots`
codes soundings into the free slots of existing records (a chain's old tail). Both
check every value as they code it (:func:`check_failures` reads what they saw). The
generic bit packing they build on is :mod:`._bitpack`'s, the kernels are in
:mod:`._bitpack_kernels`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping

import numpy as np

from ._bitpack import _out_matrix, _run, _split
from ._bitpack_kernels import _kernel

__all__ = ["CHECK_SIZE", "SoundingCoding", "check_failures", "fill_slots", "pack_soundings"]

_U64 = np.uint64

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
               count: np.ndarray, *, check: np.ndarray | None = None,
               at: np.ndarray | None = None) -> list[str]:
    """Code soundings into free slots of records held in ``buf``, in place (numba, one pass).

    ``buf`` is a flat writeable uint8 array of whole records of ``record_bytes``;
    record ``rows[g]`` gets soundings ``first[g] .. first[g] + count[g] - 1`` of
    ``values`` in slots ``slot0[g] .. slot0[g] + count[g] - 1``, coded as
    :func:`pack_soundings` codes them (same ``item_fields``, ``values`` and
    ``coding``); every other bit (the soundings already there, the continuation
    pointer) is kept. This is how new soundings fill the free slots of a bin's
    last record before new records are chained to it. With ``at`` (instead of
    ``rows``, which is then ignored): record ``g`` starts at byte ``at[g]`` of
    ``buf`` (a read span's buffer, gaps between its records), changed in place.

    The soundings are checked as they are coded: returns the fields whose values
    did not fit (integer fields wider than their bits or negative, depths coding
    outside ``0 .. coding.depth_code_max``; such values are stored truncated, so
    the caller must not keep the records); ``check`` (a uint64 array of
    :data:`CHECK_SIZE`), if given, accumulates the raw findings over calls.
    """
    if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or buf.ndim != 1 \
            or not buf.flags.c_contiguous or not buf.flags.writeable:
        raise ValueError("buf must be a flat contiguous writeable uint8 array")
    if at is not None:
        rows = at
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
    lim = n_rec if at is None else buf.size - record_bytes + 1
    if (rows[use].min() < 0 or rows[use].max() >= lim or slot0[use].min() < 0
            or (slot0 + count)[use].max() > slots or first[use].min() < 0
            or (first + count)[use].max() > a.n_items):
        raise ValueError("slots outside the records, or soundings past the end of the values")
    words = np.zeros((record_bytes + 15) // 8, dtype=_U64)
    seen = np.zeros(CHECK_SIZE, dtype=_U64)
    rec_at = rows * int(record_bytes) if at is None else rows
    _kernel("fill_slots")(buf, int(record_bytes), int(slot_bits), rec_at, slot0, first, count,
                          *a.args, words, seen)
    if check is not None:
        check |= seen
    return check_failures(seen, item_fields)


def pack_soundings(item_fields: Mapping[Hashable, tuple[int, int]], values: Mapping[Hashable, np.ndarray],
                   coding: SoundingCoding, first: np.ndarray, count: np.ndarray, rec0: np.ndarray,
                   n_records: int, slots: int, slot_bits: int, cont_field: tuple[int, int],
                   cont_base: int, record_bytes: int, *, executor=None, out: np.ndarray | None = None,
                   block: int = 8192, sink=None, chunk_bytes: int = 1 << 20, buffers=None,
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
    cache instead of from memory. With ``buffers`` (``get()`` a buffer of at
    least ``chunk_bytes`` bytes, ``put(buffer)`` it back) every chunk is packed
    into a buffer got there and the sink keeps it (e.g. hands it to another
    thread, which puts it back once written: the chunk's view's ``base``);
    without, each thread reuses one buffer and the sink must not keep it.

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
            buf = np.empty(step * record_bytes, dtype=np.uint8) if buffers is None else buffers.get()
            try:
                for a in range(r0, r1, step):
                    b = min(a + step, r1)
                    pack(a, b, buf, a * record_bytes, lanes, tmp, seen[j])
                    held, buf = buf, None
                    sink(a * record_bytes, held[: (b - a) * record_bytes])
                    # the sink keeps that buffer (and gives it back)
                    buf = held if buffers is None else buffers.get()
            finally:
                if buffers is not None and buf is not None:
                    buffers.put(buf)
        return do

    _run([job(j, a, b) for j, (a, b) in enumerate(_split(n_records, parts))], executor)
    if check is not None:
        check |= np.bitwise_or.reduce(seen, axis=0)
    return None if sink is not None else res
