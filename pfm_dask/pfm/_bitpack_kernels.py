"""The numba kernels of the PFM bit packing (:mod:`pfm_dask.pfm._bitpack` calls them).

Plain functions here, compiled on first use by :class:`pfm_dask._numeric.CompiledKernels`
(numba is imported then, not when the package is imported), each for one explicit signature
(read-only arrays, which accept writable ones too), so no call compiles anything new.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .._numeric import CompiledKernels

__all__ = ["load_kernels"]

_U64 = np.uint64


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
            "_clear", "_raw_u64", "_put_raw", "_bit_range", "_load_words",
            "_store_words")
# unaligned big-endian 64-bit store/load of ``arr[i:i + 8]`` (uint8 array), numba intrinsics
# made by _make_intrinsics() when the first kernel compiles
_st_be64 = None
_ld_be64 = None
# unaligned native-order loads of a 2-, 4- or 8-byte unsigned integer at ``arr[i:]`` (uint8
# array), widened to uint64 (same)
_ld_u16 = None
_ld_u32 = None
_ld_u64 = None
# the same for a float64 / float32 (as its own type)
_ld_f64 = None
_ld_f32 = None


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

    def ld_native(bits):
        @intrinsic
        def ld(typingctx, arr, idx):
            def codegen(context, builder, sig, args):
                ary = context.make_array(sig.args[0])(context, builder, args[0])
                ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(bits).as_pointer())
                v = builder.load(ptr)
                v.align = 1
                return builder.zext(v, ir.IntType(64)) if bits < 64 else v
            return T.uint64(arr, idx), codegen
        return ld

    def ld_float(lltype, nbtype):
        @intrinsic
        def ld(typingctx, arr, idx):
            def codegen(context, builder, sig, args):
                ary = context.make_array(sig.args[0])(context, builder, args[0])
                ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), lltype.as_pointer())
                v = builder.load(ptr)
                v.align = 1
                return v
            return nbtype(arr, idx), codegen
        return ld

    return {"_st_be64": st_be64, "_ld_be64": ld_be64, "_ld_u16": ld_native(16),
            "_ld_u32": ld_native(32), "_ld_u64": ld_native(64),
            "_ld_f64": ld_float(ir.DoubleType(), T.float64), "_ld_f32": ld_float(ir.FloatType(), T.float32)}


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
    """Integer value ``i`` of raw bytes holding ``kind``-byte unsigned integers (see :func:`_col_or_raw`):
    one load each, with no array view made per value."""
    if kind == 8:
        return _ld_u64(raw, i * 8)
    if kind == 4:
        return _ld_u32(raw, i * 4)
    if kind == 2:
        return _ld_u16(raw, i * 2)
    return np.uint64(raw[i])


def _put_raw(scratch, p, nb, raw, kind, i):
    """:func:`_put` of integer value ``i`` of raw bytes (:func:`_raw_u64`), if the field has bits;
    returns the value as given (0 for a field without bits)."""
    if nb:
        v = _raw_u64(raw, kind, i)
        _put(scratch, p, nb, v & _mask(nb))
        return v
    return np.uint64(0)


def _k_fill_slots(flat, rbytes, slot_bits, rec_at, slot0, first, cnt,
                  file_, line, ping, beam, xo, yo, val, depth, herr, verr, attrs, kinds, pos,
                  nbits, apos, anb, doff, dscale, dlim, hscale, hcap, hnull, vscale, vcap, vnull, words,
                  seen):
    """Soundings into free slots of existing records, coded as :func:`_k_pack_soundings` codes them.

    Record ``g`` (bytes ``rec_at[g]`` on of ``flat``) gets soundings
    ``first[g] .. first[g] + cnt[g] - 1`` in slots ``slot0[g]`` on; every other
    bit of the record is kept. Each record is loaded once into the 64-bit words
    ``words``, the soundings' fields are put in there, and it is stored back: no
    overlapping unaligned stores and loads per field. Field order in ``kinds`` /
    ``pos`` / ``nbits``, and the checks into ``seen``: those of :func:`_k_pack_soundings`.
    """
    full = rbytes >> 3
    rest = rbytes - 8 * full
    for g in range(rec_at.size):
        c = cnt[g]
        if c <= 0:
            continue
        o = rec_at[g]
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
                z = _ld_f64(depth, i * 8) if kinds[4] == 8 else np.float64(_ld_f32(depth, i * 4))
                code, ok = _depth_code_in(z, doff, dscale, dlim)
                if not ok:
                    seen[10] |= np.uint64(1)
                _put(words, p0 + pos[4], nbits[4], code & _mask(nbits[4]))
            seen[5] |= _put_raw(words, p0 + pos[5], nbits[5], xo, kinds[5], i)
            seen[6] |= _put_raw(words, p0 + pos[6], nbits[6], yo, kinds[6], i)
            seen[7] |= _put_raw(words, p0 + pos[7], nbits[7], val, kinds[7], i)
            if nbits[8]:
                e = np.float32(_ld_f64(herr, i * 8)) if kinds[8] == 8 else _ld_f32(herr, i * 4)
                _put(words, p0 + pos[8], nbits[8], _err_code(e, hscale, hcap, hnull) & _mask(nbits[8]))
            if nbits[9]:
                e = np.float32(_ld_f64(verr, i * 8)) if kinds[9] == 8 else _ld_f32(verr, i * 4)
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
    lo_bit, hi_bit = _bit_range(foff, fnb)
    for j in range(bit_base.size):
        o0 = (bit_base[j] + lo_bit) >> 3
        o1 = (bit_base[j] + hi_bit + 7) >> 3
        _load_words(buf, o0, o1, words)
        rel = bit_base[j] - 8 * o0
        for f in range(foff.size):
            nb = fnb[f]
            p = rel + foff[f]
            _clear(words, p, nb)
            _put(words, p, nb, vals[f, j] & _mask(nb))
        _store_words(buf, o0, o1, words)


def _bit_range(foff, fnb):
    """The first bit and the bit past the last of fields ``foff``/``fnb`` (at least one)."""
    lo_bit = foff[0]
    hi_bit = foff[0] + fnb[0]
    for f in range(foff.size):
        lo_bit = min(lo_bit, foff[f])
        hi_bit = max(hi_bit, foff[f] + fnb[f])
    return lo_bit, hi_bit


def _load_words(buf, o0, o1, words):
    """Bytes ``o0 .. o1`` of ``buf`` into the MSB-first 64-bit ``words`` (the last one padded)."""
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


def _store_words(buf, o0, o1, words):
    """:func:`_load_words` the other way: the words back into bytes ``o0 .. o1`` of ``buf``."""
    nw = (o1 - o0 + 7) >> 3
    for w in range(nw):
        q = o0 + 8 * w
        if q + 8 <= o1:
            _st_be64(buf, q, words[w])
        else:
            for k in range(o1 - q):
                buf[q + k] = np.uint8(words[w] >> np.uint64(56 - 8 * k))


def _k_bin_update(buf, offs, foff, fnb, total, c0, v0, h0, t0, vor, vmask, first_new, last_new,
                  m, words):
    """The bin records at byte ``offs[j]`` of ``buf`` after a call's soundings, in place (every
    other bit kept); fields ``foff``/``fnb``: count, validity, head, tail. Count ``total``;
    validity ``(v0 | vor) & vmask``; head ``first_new`` where the bin had no soundings (``c0``
    0), else ``h0``; tail ``last_new`` where new records were chained to it (``m`` > 0), else
    ``t0``. One pass: no temporaries per field."""
    lo_bit, hi_bit = _bit_range(foff, fnb)
    for j in range(offs.size):
        b = offs[j] * 8
        o0 = (b + lo_bit) >> 3
        o1 = (b + hi_bit + 7) >> 3
        _load_words(buf, o0, o1, words)
        rel = b - 8 * o0
        for f in range(4):
            nb = fnb[f]
            if nb == 0:
                continue
            if f == 0:
                v = np.uint64(total[j])
            elif f == 1:
                v = (v0[j] | vor[j]) & vmask
            elif f == 2:
                v = np.uint64(first_new[j]) if c0[j] == 0 else h0[j]
            else:
                v = np.uint64(last_new[j]) if m[j] > 0 else t0[j]
            p = rel + foff[f]
            _clear(words, p, nb)
            _put(words, p, nb, v & _mask(nb))
        _store_words(buf, o0, o1, words)


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


def _k_tails_clean(buf, at, size, keep, clean):
    """``clean[j]``: whether every bit of the ``size``-byte record at byte ``at[j]`` of ``buf``
    from bit ``keep[j]`` on is zero and the record has a non-zero byte (an all-zero one counts as
    not clean unless ``keep[j]`` reaches its last byte, as the numpy rule it replaces)."""
    for j in range(at.size):
        o = at[j]
        kb = keep[j]
        byte0 = kb >> 3
        q = byte0 if byte0 < size - 1 else size - 1
        part = np.int64(buf[o + q]) & ((np.int64(1) << (8 - (kb & 7))) - 1)
        last = size - 1
        for b in range(size - 1, -1, -1):
            if buf[o + b] != 0:
                last = b
                break
        clean[j] = part == 0 and last <= byte0


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
        "record_ends": (ai, ai, i64, arr(i64, ro=False)),
        "tails_clean": (arr(T.uint8), ai, i64, ai, arr(T.boolean, ro=False)),
        "pack_new": (arr(T.uint8, ro=False), ai, arr(u64, 2), ai, ai, i64),
        "pack_bits": (arr(T.uint8, ro=False), ai, arr(u64, 2), ai, ai, scratch),
        "bin_update": (arr(T.uint8, ro=False), ai, ai, ai, ai) + (arr(u64),) * 5 + (u64, ai, ai, ai,
                                                                                   scratch),
        "unpack_at": (arr(T.uint8), ai, ai, ai, arr(u64, 2, ro=False)),
        "from_words": (arr(u64, 2, "A"), arr(T.uint8, 2, "A", ro=False)),
    }
    ret = {"record_ends": T.int64}.get(name, T.void)
    return ret(*sigs[name])


_KERNEL_NAMES = ("pack_items", "pack_soundings", "fill_slots", "unpack_items", "unpack_words",
                 "to_words", "from_words", "record_ends", "tails_clean", "pack_new", "pack_bits",
                 "unpack_at", "bin_update")


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
