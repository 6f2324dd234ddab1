"""The numba kernels of a writer's bins and bit maps (:mod:`pfm_dask.pfm._runs` calls them).

Runs of bin numbers, the merge of a group's sorted pieces, scattering columns to their
places, and the bit maps of bins and records (the store's zero-bin map, the undo log's
record bookkeeping, the reads that skip records known to be zero). Plain functions here,
compiled on first use by :class:`pfm_dask._numeric.CompiledKernels` (numba is imported then,
not when the package is imported), each for one explicit signature (read-only arrays,
which accept writable ones too), so no call compiles anything new.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .._numeric import CompiledKernels

__all__ = ["load_kernels"]

#: helpers the kernels call, compiled and inlined with them
_HELPERS = ("_runs_or", "_scatter")


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


def _k_undo_needed(off, size, limit, bits, out):
    """``out[j]``: the ``size``-byte record at ``off[j]`` lies below ``limit`` and its bit
    (record ``off[j] // size``, MSB first) is clear in ``bits`` (empty: no bit set); returns how
    many. The undo log's test of which records still need a pre-image."""
    k = 0
    have = bits.size > 0
    for j in range(off.size):
        o = off[j]
        need = o < limit
        if need and have:
            i = o // size
            need = ((bits[i >> 3] >> (7 - (i & 7))) & 1) == 0
        out[j] = need
        k += need
    return k


def _k_bits_set_div(bits, off, size):
    """Set bit ``off[j] // size`` (MSB first within each byte) for every j."""
    for j in range(off.size):
        i = off[j] // size
        bits[i >> 3] |= np.uint8((1 << (7 - (i & 7))) & 255)


def _k_rows_nonzero(buf, pos, size, out):
    """``out[j]``: whether any of the ``size`` bytes of ``buf`` from ``pos[j]`` on is non-zero;
    returns how many are."""
    k = 0
    for j in range(pos.size):
        p = pos[j]
        acc = np.uint8(0)
        for b in range(size):        # no early exit: the OR of a short record vectorises
            acc |= buf[p + b]
        nz = acc != 0
        out[j] = nz
        k += nz
    return k


def _k_gather_rows(buf, pos, size, out):
    """The ``size`` bytes of ``buf`` from each ``pos[j]``, end to end into ``out``."""
    o = 0
    for j in range(pos.size):
        p = pos[j]
        for b in range(size):
            out[o + b] = buf[p + b]
        o += size


def _k_read_parts(span_lo, span_len, span_at, base, size, bits, min_skip, lo_out, len_out,
                  at_out):
    """The parts of each span (file bytes ``span_lo[s]`` on, ``span_len[s]`` long, at
    ``span_at[s]`` of a buffer; whole records of ``size`` bytes, record ``i`` at byte ``base + i *
    size``) left to read once runs of records known to be zero (bit ``i`` of ``bits`` set, MSB
    first) are taken out: those at either end of a span, and those of at least ``min_skip``
    records inside one. File offset, length and buffer position of each; returns how many."""
    k = 0
    nbits = bits.size * 8
    for s in range(span_lo.size):
        lo = span_lo[s]
        at = span_at[s]
        n = span_len[s] // size
        r0 = (lo - base) // size
        start = 0
        i = 0
        while i < n:
            r = r0 + i
            if r < nbits and (bits[r >> 3] >> (7 - (r & 7))) & 1:
                j = i + 1
                while j < n:
                    q = r0 + j
                    if q >= nbits or not (bits[q >> 3] >> (7 - (q & 7))) & 1:
                        break
                    j += 1
                if j - i >= min_skip or i == 0 or j == n:     # a span's ends: no call more
                    if i > start:
                        lo_out[k] = lo + start * size
                        len_out[k] = (i - start) * size
                        at_out[k] = at + start * size
                        k += 1
                    start = j
                i = j
            else:
                i += 1
        if n > start:
            lo_out[k] = lo + start * size
            len_out[k] = (n - start) * size
            at_out[k] = at + start * size
            k += 1
    return k


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


def _k_merge_runs_to(keys, bounds, head, dest, merged):
    """For keys made of runs ``keys[bounds[j]:bounds[j + 1]]`` each sorted, the order a stable
    sort gives (by key, then run, then position: for each smallest key left, every run's keys
    equal to it in run order): ``dest[h]`` = where key ``h`` goes, ``merged`` = the keys in
    that order. ``head``: one int64 per run (scratch)."""
    k = bounds.size - 1
    for j in range(k):
        head[j] = bounds[j]
    o = 0
    big = 9223372036854775807  # int64 max (np.iinfo would link numba.np.arraymath)
    while o < merged.size:
        m = big
        for j in range(k):
            if head[j] < bounds[j + 1] and keys[head[j]] < m:
                m = keys[head[j]]
        for j in range(k):
            h = head[j]
            e = bounds[j + 1]
            while h < e and keys[h] == m:
                dest[h] = o
                merged[o] = m
                o += 1
                h += 1
            head[j] = h


def _k_merge_count(keys, lo, count, dest, merged):
    """:func:`_k_merge_runs_to` by counting, for keys (the runs end to end) all within
    ``lo .. lo + count.size - 2``: ``count`` (scratch, zeroed here) counts each key, its running
    sum gives each key's first place, and the keys, taken in order (run by run, each run in
    its own order), go to their key's next place: the same stable order as the merge."""
    for b in range(count.size):
        count[b] = 0
    for i in range(keys.size):
        count[keys[i] - lo + 1] += 1
    for b in range(1, count.size):
        count[b] += count[b - 1]
    for i in range(keys.size):
        b = keys[i] - lo
        o = count[b]
        dest[i] = o
        merged[o] = keys[i]
        count[b] = o + 1


def _scatter(src, dest, out):
    for i in range(src.size):
        out[dest[i]] = src[i]


def _k_scatter(src, kind, dest, out):
    """``out[dest[i]] = src[i]`` for values of ``kind`` bytes (8, 4, 2 or 1) given as raw bytes."""
    if kind == 8:
        _scatter(src.view(np.uint64), dest, out.view(np.uint64))
    elif kind == 4:
        _scatter(src.view(np.uint32), dest, out.view(np.uint32))
    elif kind == 2:
        _scatter(src.view(np.uint16), dest, out.view(np.uint16))
    else:
        _scatter(src, dest, out)


def _k_gather_u32(table, lo, want, out):
    """``out[i] = table[want[i] - lo]``; -1 (nothing more written) at the first ``want`` outside
    the table, else 0."""
    n = table.size
    for i in range(want.size):
        j = np.int64(want[i]) - lo
        if j < 0 or j >= n:
            return -1
        out[i] = table[j]
    return 0


def _k_touch_new(ub, touched, out):
    """The bins of ``ub`` not yet set in the bool array ``touched`` (set now) into ``out``, in
    order; returns how many."""
    k = 0
    for i in range(ub.size):
        b = ub[i]
        if not touched[b]:
            touched[b] = True
            out[k] = b
            k += 1
    return k


def _signatures(T) -> dict:
    """One explicit numba signature per kernel (``T`` = ``numba.types``)."""
    def arr(dt, ro=True):
        return T.Array(dt, 1, "C", readonly=ro)

    i64 = T.int64
    ai = arr(i64)
    out_i64 = arr(i64, ro=False)
    u8, out_u8 = arr(T.uint8), arr(T.uint8, ro=False)
    out_bool = arr(T.boolean, ro=False)
    return {
        "bin_runs": i64(ai, i64, u8, i64, out_i64, out_i64, arr(T.uint64, ro=False)),
        "merge_runs_to": T.void(ai, ai, out_i64, out_i64, out_i64),
        "merge_count": T.void(ai, i64, out_i64, out_i64, out_i64),
        "scatter": T.void(u8, i64, ai, out_u8),
        "gather_u32": i64(arr(T.uint32), i64, arr(T.uint32), arr(T.uint32, ro=False)),
        "touch_new": i64(ai, out_bool, out_i64),
        "bits_all": T.boolean(u8, ai),
        "bits_clear": T.void(out_u8, ai),
        "undo_needed": i64(ai, i64, i64, u8, out_bool),
        "bits_set_div": T.void(out_u8, ai, i64),
        "rows_nonzero": i64(u8, ai, i64, out_bool),
        "gather_rows": T.void(u8, ai, i64, out_u8),
        "read_parts": i64(ai, ai, ai, i64, i64, u8, i64, out_i64, out_i64, out_i64),
    }


#: The compiled ``_k_<name>``, as the bit-packing kernels (:mod:`._bitpack_kernels`): without
#: numba's reference counting (they allocate nothing), Python's error model.
_kernel = CompiledKernels(globals(), _signatures, _HELPERS, error_model="python",
                          refcounts=False)


def load_kernels(names: Iterable[str] | None = None) -> float:
    """Compile (or load from the on-disk cache) these kernels now; returns the seconds taken."""
    return _kernel.load(names)
