"""The recompute of a band of bin records in one compiled pass over their bytes.

:func:`recompute_records` takes a band's raw bin records (the bytes as read from the
``.bin``) and the ``.ndx`` mapped read-only, and for each bin follows its chain, decodes
the depth and validity of each sounding, sums, codes and packs the new statistics back
into the record bytes: what :func:`._recompute.grouped_bin_stats` followed by
``PfmFile.write_bin_records`` do in a dozen numpy passes and temporary arrays, here with
the same operations in the same order (plain IEEE double and float arithmetic, no
fastmath), so the bytes are the same. Anything out of the ordinary (a chain that leaves
the file, a code out of its field's range, zeros of both signs in a bin, a field wider
than the kernel reads) makes it give up on the band, and the caller takes the general
path, which reports it. The time follows the soundings and the records they sit in.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from .. import validity as V
from .._fileio import close_map
from .._numeric import CompiledKernels

__all__ = ["NdxView", "BAND_FIELDS", "recompute_records", "step_args", "band_soundings",
           "record_fields"]

#: Bin record fields the kernel reads or writes, in the order of its offset/width arrays.
BAND_FIELDS = ("num_soundings", "std", "avg_filtered", "min_filtered", "max_filtered", "avg",
               "min", "max", "num_valid", "validity", "head", "tail")
_F_COUNT, _F_STD, _F_AVGF, _F_MINF, _F_MAXF, _F_AVG, _F_MIN, _F_MAX, _F_NV, _F_VAL, _F_HEAD, \
    _F_TAIL = range(len(BAND_FIELDS))

_OK = -1
_GAVE_UP = 1


#: ``_be64(buf, o, n)`` and ``_bits(buf, n, p, nb)``: the big-endian 8-byte load and the
#: bit-field read of the bit-packing kernels (``pfm._bitpack_kernels._load_be`` and ``_get``,
#: one implementation), and their unaligned byte-swapped 8-byte load and store ``_ld64(buf, o)``
#: and ``_st64(buf, o, v)``, put here compiled by :func:`_shared_helpers` before the kernels
#: compile.
_be64 = _bits = _ld64 = _st64 = None


def _shared_helpers(numba) -> dict:
    """The bit-packing kernels' byte and bit readers, compiled as they compile them."""
    from . import _bitpack_kernels as B

    with B._kernel._lock:
        B._kernel._ready(numba)
    return {"_be64": B._load_be, "_bits": B._get, "_ld64": B._ld_be64, "_st64": B._st_be64}


def _fld(buf, n, p, nb):
    """The ``nb``-bit field at bit ``p`` of a stream of ``n`` bytes, as ``_bits``; a field of
    at most 57 bits (every sounding field the kernels read) lies within the 8 bytes from its
    first byte, so one load and two shifts read it (``_bits``' general path, with its ninth
    byte, made the per-sounding reads ten times slower)."""
    if nb <= 57:
        return (_be64(buf, p >> 3, n) << np.uint64(p & 7)) >> np.uint64(64 - nb)
    return _bits(buf, n, p, nb)


def _put(buf, p, nb, val):
    """Write the low ``nb`` bits of ``val`` at bit ``p`` of ``buf`` (other bits kept); a field
    of at most 57 bits with 8 bytes from its first byte in ``buf``: one 8-byte read-modify-write
    (the byte loop below took most of a bin's time)."""
    o = p >> 3
    if nb <= 57 and o + 8 <= buf.size:
        sh = np.uint64(64 - (p & 7) - nb)
        ones = (np.uint64(1) << np.uint64(nb)) - np.uint64(1)
        w = _ld64(buf, o) & ~(ones << sh)
        _st64(buf, o, w | ((val & ones) << sh))
        return
    end = p + nb
    i = p
    while i < end:
        b0 = i & 7
        take = min(8 - b0, end - i)
        low = 8 - b0 - take
        chunk = (val >> np.uint64(end - i - take)) & np.uint64((1 << take) - 1)
        mask = ((1 << take) - 1) << low
        j = i >> 3
        buf[j] = np.uint8((np.int64(buf[j]) & ~mask) | (np.int64(chunk) << low))
        i += take


def _nint(x):
    """The C library's NINT of a double, as :func:`pfm_dask._numeric.nint` (0 for NaN/huge)."""
    s = x - 0.5 if x < 0.0 else x + 0.5
    if not (np.isfinite(s) and np.abs(s) < 9.2e18):
        return np.int64(0)
    return np.int64(s)



def _step(x, w, null64, user_flag, or_mask, ref_bit, del_ref, inval,
          s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags):
    """One sounding (depth ``x``, validity ``w``) into its bin's running values, by the
    library's rules (module ``_recompute``): returns them updated. ``flags``: 1 = a REFERENCE
    sounding; 2 / 4 = +0.0 / -0.0 among the filtered depths, 8 / 16 among the used ones."""
    if w & ref_bit:
        flags |= 1
    used = (w & del_ref) == 0 and x < null64
    filt = used and (w & inval) == 0
    if filt and user_flag:
        filt = (w & user_flag) != 0
    zf = x if filt else 0.0
    zu = x if used else 0.0
    s_f += zf
    s_f2 += zf * zf
    s_u += zu
    if used:
        n_u += 1
        bits |= w & or_mask
        if x < min_u:
            min_u = x
        if x > max_u:
            max_u = x
        if x == 0.0:
            flags |= 16 if np.signbit(x) else 8
        if filt:
            n_f += 1
            if x < min_f:
                min_f = x
            if x > max_f:
                max_f = x
            if x == 0.0:
                flags |= 4 if np.signbit(x) else 2
    return s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags


def _bin_steps(z, v, cut, cut_bits, cnt, null64, user_flag, or_mask, ref_bit, del_ref, inval,
               out_f, out_i, k):
    """A bin's running values of :func:`_step` (``out_f[k]``: the sums and extrema,
    ``out_i[k]``: the counts, flag bits and flags) from its ``cnt`` soundings in chain order
    (``z`` depths, ``v`` validity, ``cut[i]``: ``cut_bits`` to be set on sounding i): what the
    recompute's walk sums once those bits are written, handed to it as ``pre_f``/``pre_i``."""
    s_f = s_f2 = s_u = 0.0
    min_f = min_u = np.inf
    max_f = max_u = -np.inf
    n_f = n_u = bits = flags = 0
    for i in range(cnt):
        w = np.int64(v[i] | cut_bits) if cut[i] else np.int64(v[i])
        s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags = _step(
            z[i], w, null64, user_flag, or_mask, ref_bit, del_ref, inval,
            s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags)
    out_f[k, 0], out_f[k, 1], out_f[k, 2] = s_f, s_f2, s_u
    out_f[k, 3], out_f[k, 4], out_f[k, 5], out_f[k, 6] = min_f, max_f, min_u, max_u
    out_i[k, 0], out_i[k, 1], out_i[k, 2], out_i[k, 3] = n_f, n_u, bits, flags


def _k_recompute_records(recs, foff, fnb, ndx, rsize, L, slot_bits, d_off, d_nb, v_off, v_nb,
                         wstart, wshift, pmask, dscale, doff, null64, null32, user_flag, or_mask,
                         prior_keep, keep_mask, clear_mask, compute_average, off32, scale32,
                         std_scale32, depth_lim, std_lim, count_lim, val_lim, ref_bit, data_bit,
                         del_ref, inval, val_mask, out_cnt, out_val, out32, f_off, f_nb, l_off,
                         l_nb, rec_out, walk_out, sum_skip, sum_post_skip, sum_null, zb, vb,
                         sums_f, sums_i, pre_f, pre_i):
    """numba kernel: recompute every record of ``recs`` (n, record bytes) in place.

    Per bin, as ``_k_group_pass`` and ``grouped_bin_stats`` then ``write_bin_records``: the
    soundings in chain order (depth ``code / dscale - doff`` in double), the running double
    sums, the extrema, the counts and the OR of their flags; the float results; the codes
    (depths ``NINT((float + float offset) * float scale)``, the std ``NINT(float * float
    scale)`` clamped to its field) packed into the record. ``out_cnt``/``out_val``/``out32``
    (std, min filtered, max filtered, min, max as floats) feed the header extrema. Returns
    -1, or 1 when it gave up on the band (the record bytes are then not to be used).

    With ``rec_out`` not empty, the same walk is also the check's
    (``._check_kernel._k_check_sums``): the records reached go to ``rec_out`` (record
    numbers, (bin, step) order), and ``walk_out`` gets 0 in ``[0]`` when a chain's last
    record is not its ``tail`` or continues, and the largest file (``[1]``) and line (``[2]``) number of a sounding.

    With ``sums_f`` not empty, each bin's sums for the area filter go there and to
    ``sums_i`` (:func:`_filter_sums`, from the soundings kept in ``zb``/``vb``, which hold
    the largest bin's): the same walk gives them.

    With ``pre_f`` not empty, no chain is walked: bin g's running values (:func:`_step`'s,
    which :func:`_bin_steps` took from its soundings in chain order) are ``pre_f[g]`` (sums,
    extrema) and ``pre_i[g]`` (counts, flag bits, flags).
    """
    n_rec = out_cnt.size
    collect = rec_out.size > 0
    summing = sums_f.shape[0] > 0
    given = pre_f.shape[0] > 0
    kr = 0
    rb = recs.size // max(1, n_rec)
    rn = recs.size
    nbytes = ndx.size
    for g in range(n_rec):
        r0 = g * rb * 8          # the record's first bit
        cnt = np.int64(_fld(recs, rn, r0 + foff[_F_COUNT], fnb[_F_COUNT]))
        head = np.int64(_fld(recs, rn, r0 + foff[_F_HEAD], fnb[_F_HEAD]))
        prior = np.int64(_fld(recs, rn, r0 + foff[_F_VAL], fnb[_F_VAL]))
        std_code = _fld(recs, rn, r0 + foff[_F_STD], fnb[_F_STD])
        s_f = s_f2 = s_u = 0.0
        min_f = min_u = np.inf
        max_f = max_u = -np.inf
        n_f = n_u = bits = flags = 0
        nrec = 0 if given else (cnt + L - 1) // L
        if given:
            s_f, s_f2, s_u = pre_f[g, 0], pre_f[g, 1], pre_f[g, 2]
            min_f, max_f, min_u, max_u = pre_f[g, 3], pre_f[g, 4], pre_f[g, 5], pre_f[g, 6]
            n_f, n_u, bits, flags = pre_i[g, 0], pre_i[g, 1], pre_i[g, 2], pre_i[g, 3]
        cur = head
        for s in range(nrec):
            if cur < 0 or (cur == 0 and s > 0) or cur % rsize != 0 or cur + rsize > nbytes:
                return _GAVE_UP
            base = cur * 8
            if collect:
                rec_out[kr] = cur // rsize
                kr += 1
                nxt = np.int64((_be64(ndx, cur + wstart, nbytes) >> np.uint64(wshift)) & pmask)
                if s + 1 == nrec and (nxt != 0 or
                                      cur != np.int64(_fld(recs, rn, r0 + foff[_F_TAIL],
                                                           fnb[_F_TAIL]))):
                    walk_out[0] = 0
                cur = nxt
            elif s + 1 < nrec:
                cur = np.int64((_be64(ndx, cur + wstart, nbytes) >> np.uint64(wshift)) & pmask)
            m = min(L, cnt - s * L)
            for j in range(m):
                p = base + j * slot_bits
                code = _fld(ndx, nbytes, p + d_off, d_nb)
                w = np.int64(_fld(ndx, nbytes, p + v_off, v_nb))
                if collect:
                    if f_nb:
                        fnum = np.int64(_fld(ndx, nbytes, p + f_off, f_nb))
                        if fnum > walk_out[1]:
                            walk_out[1] = fnum
                    if l_nb:
                        lnum = np.int64(_fld(ndx, nbytes, p + l_off, l_nb))
                        if lnum > walk_out[2]:
                            walk_out[2] = lnum
                x = np.float64(code) / dscale - doff
                if summing:
                    zb[s * L + j] = x
                    vb[s * L + j] = np.uint32(w)
                s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags = _step(
                    x, w, null64, user_flag, or_mask, ref_bit, del_ref, inval,
                    s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags)
        if (flags & 6) == 6 or (flags & 24) == 24:
            return _GAVE_UP          # numpy's own reductions decide those (the general path)
        # the float results, as grouped_bin_stats
        has_valid = n_f > 0
        has_used = n_u > 0
        prior_std = np.float32(np.float32(std_code) / std_scale32)
        if has_valid:
            mean_f = s_f / n_f
            nf = np.float64(n_f)
            std = 0.0
            if n_f > 1:
                var = (s_f2 - nf * (mean_f * mean_f)) / (nf - 1.0)
                if var >= 0:
                    std = np.sqrt(var)
            std32 = np.float32(std)
            avgf32 = np.float32(mean_f)
            minf32 = np.float32(min_f)
            maxf32 = np.float32(max_f)
        else:
            std32 = prior_std
            avgf32 = null32
            minf32 = null32
            maxf32 = null32
        if has_used:
            avg32 = np.float32(s_u / n_u)
            min32 = np.float32(min_u)
            max32 = np.float32(max_u)
        else:
            avg32 = null32
            min32 = null32
            max32 = null32
        word = (prior & prior_keep) | (prior & keep_mask) | bits
        if flags & 1:
            word |= ref_bit
        if has_valid:
            word |= data_bit
        else:
            word &= ~data_bit
        word &= val_mask
        if clear_mask:
            word &= ~clear_mask
        # codes, range-checked as the store does (out of range: the general path raises)
        c_std = _nint(np.float64(std32 * std_scale32))
        if c_std > std_lim:
            c_std = std_lim
        if c_std < 0 or n_f > count_lim or word > val_lim:
            return _GAVE_UP
        c_minf = _nint(np.float64((minf32 + off32) * scale32))
        c_maxf = _nint(np.float64((maxf32 + off32) * scale32))
        c_min = _nint(np.float64((min32 + off32) * scale32))
        c_max = _nint(np.float64((max32 + off32) * scale32))
        c_avgf = _nint(np.float64((avgf32 + off32) * scale32))
        c_avg = _nint(np.float64((avg32 + off32) * scale32))
        for c in (c_minf, c_maxf, c_min, c_max):
            if c < 0 or c > depth_lim:
                return _GAVE_UP
        if compute_average and (c_avgf < 0 or c_avgf > depth_lim or c_avg < 0 or c_avg > depth_lim):
            return _GAVE_UP
        _put(recs, r0 + foff[_F_NV], fnb[_F_NV], np.uint64(n_f))
        _put(recs, r0 + foff[_F_STD], fnb[_F_STD], np.uint64(c_std))
        _put(recs, r0 + foff[_F_MINF], fnb[_F_MINF], np.uint64(c_minf))
        _put(recs, r0 + foff[_F_MAXF], fnb[_F_MAXF], np.uint64(c_maxf))
        _put(recs, r0 + foff[_F_MIN], fnb[_F_MIN], np.uint64(c_min))
        _put(recs, r0 + foff[_F_MAX], fnb[_F_MAX], np.uint64(c_max))
        if compute_average:
            _put(recs, r0 + foff[_F_AVGF], fnb[_F_AVGF], np.uint64(c_avgf))
            _put(recs, r0 + foff[_F_AVG], fnb[_F_AVG], np.uint64(c_avg))
        _put(recs, r0 + foff[_F_VAL], fnb[_F_VAL], np.uint64(word))
        out_cnt[g] = cnt
        out_val[g] = word
        out32[g, 0] = std32
        out32[g, 1] = minf32
        out32[g, 2] = maxf32
        out32[g, 3] = min32
        out32[g, 4] = max32
        if summing:
            _filter_sums(zb, vb, cnt, head, sum_skip, sum_post_skip, sum_null, sums_f, sums_i, g)
    return _OK


def _filter_sums(zb, vb, cnt, head, skip, post_skip, null_depth, out_f, out_i, g):
    """A bin's sums for the area filter (``._area_sums.SUM_DTYPE``) from its ``cnt``
    soundings in chain order (``zb`` depths, ``vb`` validity): the pre-filter mean and std of
    ``_k_band_soundings`` (no bit of ``skip``), the deepest and shallowest of those, and the
    post statistics of ``filters._area._k_filter_row`` when nothing is cut (no bit of
    ``post_skip``, shallower than ``null_depth``): the same sums in the same order."""
    n = 0
    sm = 0.0
    zmax = -np.inf
    zmin = np.inf
    for i in range(cnt):
        if (vb[i] & skip) == 0:
            if zb[i] > zmax:
                zmax = zb[i]
            if zb[i] < zmin:
                zmin = zb[i]
            if zb[i] < np.inf:
                n += 1
                sm += zb[i]
    m = sm / n if n > 0 else 0.0
    sd = 0.0
    if n > 1:
        ss = 0.0
        for i in range(cnt):
            if (vb[i] & skip) == 0 and zb[i] < np.inf:
                d = zb[i] - m
                ss += d * d
        sd = np.sqrt(ss / (n - 1))
    n2 = 0
    s2 = 0.0
    for i in range(cnt):
        if (vb[i] & post_skip) == 0 and zb[i] < null_depth:
            n2 += 1
            s2 += zb[i]
    m2 = s2 / n2 if n2 > 0 else 0.0
    ss2 = 0.0
    for i in range(cnt):
        if (vb[i] & post_skip) == 0 and zb[i] < null_depth:
            d = zb[i] - m2
            ss2 += d * d
    out_f[g, 0] = m
    out_f[g, 1] = sd
    out_f[g, 2] = zmax
    out_f[g, 3] = zmin
    out_f[g, 4] = m2
    out_f[g, 5] = np.sqrt(ss2 / (n2 - 1)) if n2 > 1 else 0.0
    out_i[g, 0] = head
    out_i[g, 1] = cnt
    out_i[g, 2] = n
    out_i[g, 3] = n2



def _chain_into(ndx, nbytes, head, cnt, rsize, L, slot_bits, d_off, d_nb, v_off, v_nb, wstart,
                wshift, pmask, dscale, doff, depth, val, rec, slot, k0):
    """The ``cnt`` soundings of the chain from ``head`` into ``depth`` (decoded), ``val``
    (validity), ``rec`` (the record's byte address) and ``slot`` from index ``k0`` on;
    False when the chain leaves the file or ends early."""
    nrec = (cnt + L - 1) // L
    cur = head
    k = k0
    for s in range(nrec):
        if cur < 0 or (cur == 0 and s > 0) or cur % rsize != 0 or cur + rsize > nbytes:
            return False
        base = cur * 8
        here = cur
        if s + 1 < nrec:
            cur = np.int64((_be64(ndx, cur + wstart, nbytes) >> np.uint64(wshift)) & pmask)
        m = min(L, cnt - s * L)
        for j in range(m):
            p = base + j * slot_bits
            depth[k] = np.float64(_fld(ndx, nbytes, p + d_off, d_nb)) / dscale - doff
            val[k] = np.uint32(_fld(ndx, nbytes, p + v_off, v_nb))
            rec[k] = here
            slot[k] = j
            k += 1
    return True


def _k_band_soundings(recs, foff, fnb, ndx, rsize, L, slot_bits, d_off, d_nb, v_off, v_nb,
                      wstart, wshift, pmask, dscale, doff, bstart, col_of, col, depth, val, rec,
                      slot, skip, b_data, b_avg, b_std):
    """numba kernel: every sounding of the bins whose raw records are ``recs`` (n, record
    bytes; ``col_of``: one entry per bin), bin by bin then in chain order, as
    ``PfmFile.read_soundings`` gives them: the bin's column, the decoded depth, the validity, the record's byte address
    and the slot. ``bstart[g]``: where bin g's soundings go. Also each bin's mean and sample
    std (two-pass, 0 when n <= 1) of its soundings without a bit of ``skip`` (``b_data``: any),
    summed in chain order: the area filter's statistics of a row (``filters._area``'s
    ``_k_row_stats``, the same sums in the same order). Returns -1, or 1 when a chain
    leaves the file or ends early (the caller's reader then says where)."""
    n_rec = col_of.size
    rb = recs.size // max(1, n_rec)
    rn = recs.size
    nbytes = ndx.size
    for g in range(n_rec):
        r0 = g * rb * 8
        cnt = np.int64(_fld(recs, rn, r0 + foff[_F_COUNT], fnb[_F_COUNT]))
        cur = np.int64(_fld(recs, rn, r0 + foff[_F_HEAD], fnb[_F_HEAD]))
        k = bstart[g]
        c = col_of[g]
        if not _chain_into(ndx, nbytes, cur, cnt, rsize, L, slot_bits, d_off, d_nb, v_off, v_nb,
                           wstart, wshift, pmask, dscale, doff, depth, val, rec, slot, k):
            return _GAVE_UP
        for i in range(k, k + cnt):
            col[i] = c
        k += cnt
        n = 0
        sm = 0.0
        for i in range(bstart[g], k):
            if (val[i] & skip) == 0 and depth[i] < np.inf:
                n += 1
                sm += depth[i]
        m = sm / n if n > 0 else 0.0
        b_data[g] = n > 0
        b_avg[g] = m
        b_std[g] = 0.0
        if n > 1:
            ss = 0.0
            for i in range(bstart[g], k):
                if (val[i] & skip) == 0 and depth[i] < np.inf:
                    d = depth[i] - m
                    ss += d * d
            b_std[g] = np.sqrt(ss / (n - 1))
    return _OK


def _k_record_fields(recs, foff, fnb, out):
    """numba kernel: fields ``foff``/``fnb`` (widths may be 0) of each raw record ``out[f, g]``."""
    n_rec = out.shape[1]
    rb = recs.size // max(1, n_rec)
    rn = recs.size
    for g in range(n_rec):
        r0 = g * rb * 8
        for f in range(foff.size):
            nb = fnb[f]
            out[f, g] = _fld(recs, rn, r0 + foff[f], nb) if nb else np.uint64(0)


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    i8, f8, f4, u8 = T.int64, T.float64, T.float32, T.uint64
    return {"recompute_records": T.int64(
        T.Array(T.uint8, 1, "C"), T.Array(T.int64, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro),
        T.Array(T.uint8, 1, "C", **ro), i8, i8, i8, i8, i8, i8, i8, i8, i8, u8,
        f8, f8, f8, f4, i8, i8, i8, i8, i8, T.boolean, f4, f4, f4, i8, i8, i8, i8, i8, i8,
        i8, i8, i8, T.Array(T.int64, 1, "C"), T.Array(T.int64, 1, "C"),
        T.Array(T.float32, 2, "C"), i8, i8, i8, i8, T.Array(T.int64, 1, "C"),
        T.Array(T.int64, 1, "C"), T.uint32, T.uint32, f8, T.Array(T.float64, 1, "C"),
        T.Array(T.uint32, 1, "C"), T.Array(T.float64, 2, "C"), T.Array(T.int64, 2, "C"),
        T.Array(T.float64, 2, "C", **ro), T.Array(T.int64, 2, "C", **ro)),
        "band_soundings": T.int64(
            T.Array(T.uint8, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro),
            T.Array(T.int64, 1, "C", **ro), T.Array(T.uint8, 1, "C", **ro), i8, i8, i8, i8, i8,
            i8, i8, i8, i8, u8, f8, f8, T.Array(T.int64, 1, "C", **ro),
            T.Array(T.int64, 1, "C", **ro), T.Array(T.int64, 1, "C"), T.Array(T.float64, 1, "C"),
            T.Array(T.uint32, 1, "C"), T.Array(T.int64, 1, "C"), T.Array(T.int32, 1, "C"),
            T.uint32, T.Array(T.bool_, 1, "C"), T.Array(T.float64, 1, "C"),
            T.Array(T.float64, 1, "C")),
        "record_fields": T.void(
            T.Array(T.uint8, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro),
            T.Array(T.int64, 1, "C", **ro), T.Array(T.uint64, 2, "C"))}


#: This module's kernels, without numba's reference counting (as the bit-packing kernels):
#: they allocate nothing, and the counts numba keeps on the arrays its helpers take cost more
#: than the helpers' own work (the band pass ran 2.2x slower with them); the helpers are
#: inlined into each kernel.
_kernel = CompiledKernels(globals(), _signatures, ("_fld", "_put", "_nint", "_step",
                                                  "_filter_sums", "_chain_into", "_bin_steps"),
                          prepare=_shared_helpers, helper_options={"inline": "always"},
                          refcounts=False)


#: soundings read between two drops of the ``.ndx`` map's pages (:meth:`NdxView.drop_pages`):
#: about 40 MB of records resident at most, besides the bands in flight (4 M held 160 MB of
#: file-backed pages in a load's final step, for no measurable time saved)
DROP_SOUNDINGS = 1_000_000


#: soundings read between two drops of the ``.ndx`` pages when bins are scattered
#: (:meth:`NdxView.scattered`); the recompute's bands of scattered bins are as small
SCATTERED_DROP_SOUNDINGS = 2048


class NdxView:
    """The ``.ndx`` of an open PFM mapped read-only once for a whole recompute, with the
    layout numbers the kernel needs; ``None`` fields mean the kernel cannot read this file
    (a continuation pointer over nine bytes, a field over 57 bits) and the caller keeps to
    the general path."""

    def __init__(self, pfm_file):
        self.ok = False
        self._mm = None
        self._since = 0
        self.drop_every = DROP_SOUNDINGS
        self.buf = np.zeros(0, dtype=np.uint8)
        word = pfm_file._continuation_word()
        NL = pfm_file._ndx_layout
        BL = pfm_file._bin_layout
        if word is None or any(k not in BL.fields for k in BAND_FIELDS):
            return
        d, v = NL.fields[("depth", 0)], NL.fields[("validity", 0)]
        if not (0 < d.nbits <= 57 and 0 < v.nbits <= 57):
            return
        for k in BAND_FIELDS:
            nb = BL.fields[k].nbits
            if not 0 < nb <= 64 or (k not in ("head", "tail") and nb > 62):
                return
        size = os.fstat(pfm_file._fd("ndx")).st_size
        if size:
            self._mm = mmap.mmap(pfm_file._fd("ndx"), size, access=mmap.ACCESS_READ)
            self.buf = np.frombuffer(self._mm, dtype=np.uint8)
        h = pfm_file.header
        self.rsize = int(pfm_file.ndx_record_size)
        self.L = int(pfm_file.record_length)
        self.slot_bits = int(pfm_file._single_bits)
        self.depth = (int(d.offset), int(d.nbits))
        self.validity = (int(v.offset), int(v.nbits))
        # the file and line numbers the check's walk looks at (0 bits: not read)
        fl = [NL.fields.get((k, 0)) for k in ("file", "line")]
        self.file_line = tuple((int(x.offset), int(x.nbits)) if x is not None and x.nbits <= 57
                               else (0, 0) for x in fl)
        self.word = (int(word[0]), int(word[1]),
                     np.uint64((1 << NL.fields["continuation"].nbits) - 1))
        self.foff = np.array([BL.fields[k].offset for k in BAND_FIELDS], dtype=np.int64)
        self.fnb = np.array([BL.fields[k].nbits for k in BAND_FIELDS], dtype=np.int64)
        self.dscale = float(np.float32(h.depth_scale))
        self.doff = float(np.float32(h.depth_offset))
        self.limits = ((1 << int(h.depth_bits)) - 1, (1 << int(h.std_bits)) - 1,
                       (1 << int(h.count_bits)) - 1, (1 << int(h.validity_bits)) - 1)
        self.ok = True

    def scattered(self) -> None:
        """Chains read here and there (a few bins over the whole file): the pages are let go
        every :data:`SCATTERED_DROP_SOUNDINGS`. Each page fault maps the cached pages around
        it too (the kernel's fault-around, 64 kB), so 20,000 bins scattered over a 2.4 GB
        ``.ndx`` mapped all of it."""
        self.drop_every = min(self.drop_every, SCATTERED_DROP_SOUNDINGS)

    def drop_pages(self, soundings: int | None = None) -> None:
        """Unmap the pages of the ``.ndx`` read so far from this process (they stay in the page
        cache, and come back on the next touch, even on a thread reading meanwhile): without
        it the whole ``.ndx`` ends up resident (file-backed pages count in RSS). With
        ``soundings`` (those read since the last call), only once :attr:`drop_every` (default
        :data:`DROP_SOUNDINGS`) have been read: each call walks the page tables of the whole map."""
        if soundings is not None:
            self._since += int(soundings)
            if self._since < self.drop_every:
                return
        self._since = 0
        if self._mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._mm.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        mm, self._mm = self._mm, None
        self.buf = np.zeros(0, dtype=np.uint8)
        close_map(mm)


def step_args(null32, class_type: int, user_flags: tuple, keep_mask: int = 0) -> tuple:
    """The constants of :func:`_step` (and :func:`_bin_steps`) for a PFM's null depth, class
    type and the recompute's ``keep_mask``: ``(null depth as double, user flag, OR mask,
    REFERENCE, DELETED | REFERENCE, INVAL)``."""
    user_flag = user_flags[class_type - 1] if class_type else 0
    return (float(np.float32(null32)), int(user_flag), int(V.VAL_MASK ^ keep_mask),
            int(V.REFERENCE), int(V.DELETED | V.REFERENCE), int(V.INVAL))


def recompute_records(view: NdxView, recs: np.ndarray, *, header, null32, class_type: int,
                      keep_mask: int, clear_mask: int, compute_average: bool,
                      user_flags: tuple, prior_keep: int, walk: bool = False,
                      sums: dict | None = None, pre: tuple | None = None):
    """Recompute the (n, record bytes) bin records ``recs`` in place (see the module doc).

    Returns ``(counts, validity, floats)`` for the header extrema (floats: std, min
    filtered, max filtered, min, max as float32 columns), or ``None`` when the kernel gave
    up on the band (``recs`` is then partly changed: pass it a copy). With ``walk``, a fourth
    item: the check's view of the same walk, ``(record numbers reached in (bin, step) order,
    every chain ends at its tail, largest file number, largest line number)``. With ``sums``
    (``skip``, ``post_skip``, ``null_depth``: the area filter's), the last item is each bin's
    sums for the filter, ``(doubles (n, 6), integers (n, 4))`` (``._area_sums``). With
    ``pre`` (``(doubles (n, 7), integers (n, 4))`` of :func:`_bin_steps`, from
    :func:`step_args`), no chain is walked: the bins' soundings were summed already.
    """
    n = recs.shape[0]
    if pre is not None and (walk or sums is not None):
        raise ValueError("a recompute from running values walks no chain")
    if walk or sums is not None:
        cnt = np.empty((1, n), dtype=np.uint64)
        _kernel("record_fields")(recs.reshape(-1), view.foff[_F_COUNT:_F_COUNT + 1],
                                 view.fnb[_F_COUNT:_F_COUNT + 1], cnt)
        c = cnt[0].astype(np.int64)
    if sums is not None:
        big = max(1, int(c.max(initial=1)))
        zb, vb = np.empty(big, np.float64), np.empty(big, np.uint32)
        sums_f, sums_i = np.empty((n, 6), np.float64), np.empty((n, 4), np.int64)
        sum_args = (np.uint32(sums["skip"]), np.uint32(sums["post_skip"]),
                    float(sums["null_depth"]))
    else:
        zb, vb = np.empty(0, np.float64), np.empty(0, np.uint32)
        sums_f, sums_i = np.empty((0, 6), np.float64), np.empty((0, 4), np.int64)
        sum_args = (np.uint32(0), np.uint32(0), 0.0)
    if walk:
        total = int(((c + view.L - 1) // view.L).sum())
        rec_out = np.empty(max(1, total), dtype=np.int64)
    else:
        total, rec_out = 0, np.empty(0, dtype=np.int64)
    walk_out = np.array([1, -1, -1], dtype=np.int64)
    out_cnt = np.empty(n, dtype=np.int64)
    out_val = np.empty(n, dtype=np.int64)
    out32 = np.empty((n, 5), dtype=np.float32)
    h = header
    null64, user_flag, or_mask, ref_bit, del_ref, inval = step_args(null32, class_type,
                                                                    user_flags, keep_mask)
    depth_lim, std_lim, count_lim, val_lim = view.limits
    pre_f, pre_i = pre if pre is not None else (np.empty((0, 7)), np.empty((0, 4), np.int64))
    r = _kernel("recompute_records")(
        recs.reshape(-1), view.foff, view.fnb, view.buf, view.rsize, view.L, view.slot_bits,
        view.depth[0], view.depth[1], view.validity[0], view.validity[1], *view.word,
        view.dscale, view.doff, null64, np.float32(null32), user_flag, or_mask,
        int(prior_keep), int(keep_mask), int(clear_mask),
        bool(compute_average), np.float32(h.depth_offset), np.float32(h.depth_scale),
        np.float32(h.std_scale), depth_lim, std_lim, count_lim, val_lim, ref_bit,
        int(V.DATA), del_ref, inval, int(V.VAL_MASK),
        out_cnt, out_val, out32, *view.file_line[0], *view.file_line[1], rec_out, walk_out,
        *sum_args, zb, vb, sums_f, sums_i, np.ascontiguousarray(pre_f, np.float64),
        np.ascontiguousarray(pre_i, np.int64))
    if r != _OK:
        return None
    out = (out_cnt, out_val, out32)
    if walk:
        out += ((rec_out[:total], bool(walk_out[0]), int(walk_out[1]), int(walk_out[2])),)
    if sums is not None:
        out += ((sums_f, sums_i),)
    return out


def band_soundings(view: NdxView, recs: np.ndarray, cols: np.ndarray,
                   buffers: dict | None = None, skip: int = 0) -> dict | None:
    """The soundings of the bins whose raw records are ``recs`` (bins with data, in raster
    order; ``cols``: their columns), read in one compiled pass over their chains: ``col``
    (int64), ``depth`` (decoded, float64), ``validity`` (uint32), ``record_offset`` (int64),
    ``slot`` (int32) and ``start`` (where each bin's soundings begin, and the total), in
    the order of ``PfmFile.read_soundings``, and per bin ``bin_data``, ``bin_avg``,
    ``bin_std``: the mean and sample std of its soundings without a bit of ``skip``, summed
    in chain order. ``None`` when a chain is broken (the store's
    reader then raises with the place). ``buffers``: a dict the caller keeps (one per
    thread) whose arrays are reused from call to call (fresh memory costs a page fault per
    page); the result is then views of them, valid until the next call."""
    n = recs.shape[0]
    flat = np.ascontiguousarray(recs).reshape(-1)
    cnt = np.empty((1, n), dtype=np.uint64)
    _kernel("record_fields")(flat, view.foff[_F_COUNT:_F_COUNT + 1], view.fnb[_F_COUNT:_F_COUNT + 1],
                             cnt)
    start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(cnt[0], out=start[1:])
    total = int(start[-1])
    kinds = {"col": np.int64, "depth": np.float64, "validity": np.uint32,
             "record_offset": np.int64, "slot": np.int32}
    if buffers is None:
        buffers = {}
    if buffers.get("size", -1) < total:
        size = max(total, int(buffers.get("size", 0) * 1.25))
        buffers.clear()
        buffers.update({k: np.empty(size, dtype=t) for k, t in kinds.items()}, size=size)
    out = {k: buffers[k][:total] for k in kinds}
    out.update(bin_data=np.empty(n, np.bool_), bin_avg=np.empty(n), bin_std=np.empty(n))
    r = _kernel("band_soundings")(
        flat, view.foff, view.fnb, view.buf, view.rsize, view.L, view.slot_bits,
        view.depth[0], view.depth[1], view.validity[0], view.validity[1], *view.word,
        view.dscale, view.doff, start, np.ascontiguousarray(cols, dtype=np.int64),
        out["col"], out["depth"], out["validity"], out["record_offset"], out["slot"],
        np.uint32(skip), out["bin_data"], out["bin_avg"], out["bin_std"])
    if r != _OK:
        return None
    out["start"] = start
    return out


def record_fields(recs: np.ndarray, layout, keys=None) -> dict:
    """Fields (uint64, as ``layout.unpack``) of the raw records ``recs`` (n, record bytes):
    one compiled pass of one-load reads over the bytes, not the bit-packing kernels' copy to
    words and unpack. ``layout``: a ``BitLayout`` (its ``fields``' offsets and widths)."""
    keys = list(layout.fields if keys is None else keys)
    recs = np.ascontiguousarray(recs, dtype=np.uint8)
    n = recs.shape[0]
    if recs.ndim != 2 or (n and recs.shape[1] * 8 < max(
            (layout.fields[k].offset + layout.fields[k].nbits for k in keys), default=0)):
        raise ValueError(f"expected (n, {layout.record_bytes}) uint8 records, got {recs.shape}")
    out = np.empty((len(keys), n), dtype=np.uint64)
    if n and keys:
        fs = [layout.fields[k] for k in keys]
        _kernel("record_fields")(recs.reshape(-1), np.array([f.offset for f in fs], np.int64),
                                 np.array([f.nbits for f in fs], np.int64), out)
    return {k: out[j] for j, k in enumerate(keys)}
