"""The check's compiled passes over a PFM's bytes: the chains walked (:func:`check_sums`)
and a band of records the recompute already walked checked at once (:func:`walked_summary`).

Kept apart from the recompute's kernels (``._recompute_kernel``), whose bit-field readers
(``_fld``, ``_be64``) and per-sounding step (``_step``) these use: one implementation of each,
put here compiled before these kernels compile. numba's cache keys these kernels on this
file: after editing those helpers, touch this file too. No Dask here.
"""

from __future__ import annotations

import numpy as np

from .. import validity as V
from .._numeric import CompiledKernels

__all__ = ["check_sums", "walked_summary", "WALKED_FIELDS"]

_OK = -1
_GAVE_UP = 1
_fld = _be64 = _step = None     # the recompute kernel's helpers, put here by _prepare


def _prepare(numba) -> dict:
    from . import _recompute_kernel as R

    with R._kernel._lock:
        R._kernel._ready(numba)
    return {"_fld": R._fld, "_be64": R._be64, "_step": R._step}


def _k_check_sums(ndx, rsize, L, slot_bits, head, tail, wstart, wshift, pmask, cnt, d_off, d_nb,
                  v_off, v_nb, f_off, f_nb, l_off, l_nb, dscale, doff, null64, user_flag, or_mask,
                  ref_bit, del_ref, inval, n_files, n_lines, dfl, del_bit, rec_idx, out_f, out_i):
    """numba kernel: the check's walk of a band's chains and ``_k_group_pass``'s per-bin
    values (same layout) of their soundings, read straight from the ``.ndx``.

    Each chain from ``head`` must run through whole records of the file (the continuation
    pointer: the big-endian word at ``wstart`` shifted by ``wshift``, masked by ``pmask``)
    for the ``cnt`` soundings, its last record be ``tail`` and continue to 0; the records
    reached go to ``rec_idx`` (record numbers, in (bin, step) order) for the visited map.
    The sounding tests: a file number below ``n_files`` and a line number below ``n_lines``
    (-1: not tested), DELETED on every sounding of a deleted file (``dfl[min(file,
    dfl.size - 1)]``; empty: not tested). Returns -1, or 1 at the first chain or sounding
    that fails or a bin with zeros of both signs (the exact walk then reports)."""
    nbytes = ndx.size
    k = 0
    nd = dfl.size
    for g in range(cnt.size):
        c = cnt[g]
        s_f = s_f2 = s_u = 0.0
        min_f = min_u = np.inf
        max_f = max_u = -np.inf
        n_f = n_u = bits = flags = 0
        cur = head[g]
        nrec = (c + L - 1) // L
        for s in range(nrec):
            if cur < 0 or (cur == 0 and s > 0) or cur % rsize != 0 or cur + rsize > nbytes:
                return _GAVE_UP
            rec_idx[k] = cur // rsize
            k += 1
            base = cur * 8
            nxt = np.int64((_be64(ndx, cur + wstart, nbytes) >> np.uint64(wshift)) & pmask)
            if s + 1 == nrec:
                if nxt != 0 or cur != tail[g]:
                    return _GAVE_UP
            cur = nxt
            for j in range(min(L, c - s * L)):
                p = base + j * slot_bits
                w = np.int64(_fld(ndx, nbytes, p + v_off, v_nb))
                if n_files >= 0 or nd:
                    fnum = np.int64(_fld(ndx, nbytes, p + f_off, f_nb)) if f_nb else 0
                    if n_files >= 0 and fnum >= n_files:
                        return _GAVE_UP
                    if nd and dfl[min(fnum, nd - 1)] and (w & del_bit) == 0:
                        return _GAVE_UP
                if n_lines >= 0:
                    lnum = np.int64(_fld(ndx, nbytes, p + l_off, l_nb)) if l_nb else 0
                    if lnum >= n_lines:
                        return _GAVE_UP
                x = np.float64(_fld(ndx, nbytes, p + d_off, d_nb)) / dscale - doff
                s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags = _step(
                    x, w, null64, user_flag, or_mask, ref_bit, del_ref, inval,
                    s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags)
        if (flags & 6) == 6 or (flags & 24) == 24:
            return _GAVE_UP
        out_f[g, 0] = s_f
        out_f[g, 1] = s_f2
        out_f[g, 2] = s_u
        out_f[g, 3] = min_f
        out_f[g, 4] = max_f
        out_f[g, 5] = min_u
        out_f[g, 6] = max_u
        out_i[g, 0] = n_f
        out_i[g, 1] = n_u
        out_i[g, 2] = bits
        out_i[g, 3] = flags & 1
    return _OK


def _k_walked_summary(recs, foff, fnb, bidx, cbins, cov, cover, max_count, data_bit, cov_data,
                      cov_checked, cov_verified, cov_surveyed, checked_bit, verified_bit,
                      scale32, off32, std32, ok_below, out_val, out_bin):
    """numba kernel: a band the recompute walked, as the check's numpy path reads it (module
    ``_check_band``: ``_walked_band``), for a band with nothing to report. Fields in ``foff``/
    ``fnb`` order: count, validity, std, min_filtered, max_filtered, min, max. Returns 1 when
    the numpy path must look (a record with bytes but no soundings, a count past the
    ``.ndx``, a coverage byte that disagrees with its bin), else 0 with each header extremum's
    first candidate in ``out_val``/``out_bin`` (bin -1: none), in the order of
    ``extrema_candidates``."""
    n = bidx.size
    rb = recs.size // max(1, n)
    rn = recs.size
    for k in range(8):
        out_bin[k] = -1
    j = 0                        # the coverage position of bin g (cbins and bidx increase)
    for g in range(n):
        r0 = g * rb * 8
        cnt = np.int64(_fld(recs, rn, r0 + foff[0], fnb[0]))
        val = np.int64(_fld(recs, rn, r0 + foff[1], fnb[1]))
        if cnt == 0 or cnt > max_count:
            return 1
        b = bidx[g]
        if cover:
            while j < cbins.size and cbins[j] < b:
                if (cov[j] & (cov_data | cov_checked | cov_verified)) != 0:
                    return 1     # an empty bin's coverage byte may set none of the three
                j += 1
            if j == cbins.size or cbins[j] != b:
                return 1
            c = np.int64(cov[j])
            d = (val & data_bit) != 0
            if d != ((c & cov_data) != 0) or d and (c & cov_surveyed) == 0:
                return 1
            if ((val & checked_bit) != 0) != ((c & cov_checked) != 0):
                return 1
            if ((val & verified_bit) != 0) != ((c & cov_verified) != 0):
                return 1
            j += 1
        x = np.float64(cnt)
        if out_bin[0] < 0 or x < out_val[0]:
            out_val[0], out_bin[0] = x, b
        if out_bin[1] < 0 or x > out_val[1]:
            out_val[1], out_bin[1] = x, b
        mx = np.float64(np.float32(np.float32(_fld(recs, rn, r0 + foff[6], fnb[6])) / scale32)
                        - off32)
        if not mx < ok_below:
            continue
        mn = np.float64(np.float32(np.float32(_fld(recs, rn, r0 + foff[5], fnb[5])) / scale32)
                        - off32)
        if out_bin[6] < 0 or mn < out_val[6]:
            out_val[6], out_bin[6] = mn, b
        if out_bin[7] < 0 or mx > out_val[7]:
            out_val[7], out_bin[7] = mx, b
        if (val & data_bit) == 0:
            continue
        mnf = np.float64(np.float32(np.float32(_fld(recs, rn, r0 + foff[3], fnb[3])) / scale32)
                         - off32)
        mxf = np.float64(np.float32(np.float32(_fld(recs, rn, r0 + foff[4], fnb[4])) / scale32)
                         - off32)
        sd = np.float64(np.float32(np.float32(_fld(recs, rn, r0 + foff[2], fnb[2])) / std32))
        if out_bin[2] < 0 or mnf < out_val[2]:
            out_val[2], out_bin[2] = mnf, b
        if out_bin[3] < 0 or mxf > out_val[3]:
            out_val[3], out_bin[3] = mxf, b
        if out_bin[4] < 0 or sd < out_val[4]:
            out_val[4], out_bin[4] = sd, b
        if out_bin[5] < 0 or sd > out_val[5]:
            out_val[5], out_bin[5] = sd, b
    if cover:
        while j < cbins.size:
            if (cov[j] & (cov_data | cov_checked | cov_verified)) != 0:
                return 1
            j += 1
    return 0


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    i8, f8, f4, u8 = T.int64, T.float64, T.float32, T.uint64
    return {
        "walked_summary": T.int64(
            T.Array(T.uint8, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro),
            T.Array(T.int64, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro),
            T.Array(T.int64, 1, "C", **ro), T.Array(T.uint8, 1, "C", **ro), T.boolean,
            i8, i8, i8, i8, i8, i8, i8, i8, f4, f4, f4, f8, T.Array(T.float64, 1, "C"),
            T.Array(T.int64, 1, "C")),
        "check_sums": T.int64(
            T.Array(T.uint8, 1, "C", **ro), i8, i8, i8, T.Array(T.int64, 1, "C", **ro),
            T.Array(T.int64, 1, "C", **ro), i8, i8, u8, T.Array(T.int64, 1, "C", **ro),
            i8, i8, i8, i8, i8, i8, i8, i8, f8, f8, f8, i8, i8,
            i8, i8, i8, i8, i8, T.Array(T.uint8, 1, "C", **ro), i8, T.Array(T.int64, 1, "C"),
            T.Array(T.float64, 2, "C"), T.Array(T.int64, 2, "C"))}


#: as the recompute's kernels: no reference counting (they allocate nothing)
_kernel = CompiledKernels(globals(), _signatures, prepare=_prepare, refcounts=False)


def check_sums(buf: np.ndarray, rsize: int, L: int, slot_bits: int, cnt: np.ndarray,
               head: np.ndarray, tail: np.ndarray, pointer: tuple, fields: dict, *, depth_scale,
               depth_offset, null_depth, class_type: int, user_flags: tuple, n_files, n_lines,
               deleted):
    """The check's fast path: walks the chains of ``cnt``/``head``/``tail`` through the
    ``.ndx`` bytes ``buf`` (``pointer``: the continuation pointer's ``(word start, shift,
    bits)`` in a record) and returns ``(record numbers reached in (bin, step) order,
    _recompute._group_pass's values as a dict of its keys)``; ``fields`` maps ``depth``,
    ``validity``, ``file`` and ``line`` to ``(bit offset, bits)`` in a slot. ``None`` when a
    chain leaves the file's whole records, ends early, goes on past its count or does not end
    at its tail, a sounding names a file or line beyond ``n_files``/``n_lines`` or a
    ``deleted`` file's sounding is not DELETED, or anything else the exact walk must decide."""
    G = cnt.size
    cnt = np.ascontiguousarray(cnt, dtype=np.int64)
    out_f = np.empty((G, 7), dtype=np.float64)
    out_i = np.empty((G, 4), dtype=np.int64)
    rec_idx = np.empty(int(((cnt + L - 1) // L).sum()), dtype=np.int64)
    user_flag = user_flags[class_type - 1] if class_type else 0
    dfl = (np.asarray(list(deleted) + [False], dtype=np.uint8) if deleted and any(deleted)
           else np.zeros(0, dtype=np.uint8))
    (d_off, d_nb), (v_off, v_nb) = fields["depth"], fields["validity"]
    (f_off, f_nb), (l_off, l_nb) = fields["file"], fields["line"]
    if max(d_nb, v_nb, f_nb, l_nb) > 57 or min(d_nb, v_nb) <= 0:
        return None
    wstart, wshift, pbits = pointer
    r = _kernel("check_sums")(
        buf, int(rsize), int(L), int(slot_bits), np.ascontiguousarray(head, dtype=np.int64),
        np.ascontiguousarray(tail, dtype=np.int64), int(wstart), int(wshift),
        np.uint64((1 << int(pbits)) - 1), cnt, int(d_off), int(d_nb), int(v_off), int(v_nb),
        int(f_off), int(f_nb), int(l_off), int(l_nb), float(np.float32(depth_scale)),
        float(np.float32(depth_offset)), float(np.float32(null_depth)), int(user_flag),
        int(V.VAL_MASK), int(V.REFERENCE), int(V.DELETED | V.REFERENCE), int(V.INVAL),
        -1 if n_files is None else int(n_files), -1 if n_lines is None else int(n_lines),
        dfl, int(V.DELETED), rec_idx, out_f, out_i)
    if r != _OK:
        return None
    return rec_idx, {"sum_f": out_f[:, 0], "sum2_f": out_f[:, 1], "sum_u": out_f[:, 2],
                     "min_f": out_f[:, 3], "max_f": out_f[:, 4], "min_u": out_f[:, 5],
                     "max_u": out_f[:, 6], "n_valid": out_i[:, 0], "n_used": out_i[:, 1],
                     "bits": out_i[:, 2], "any_ref": out_i[:, 3] != 0}


#: the fields :func:`walked_summary` reads, in its order
WALKED_FIELDS = ("count", "validity", "std", "min_filtered", "max_filtered", "min", "max")


def walked_summary(recs: np.ndarray, layout, bidx: np.ndarray, cover, *, max_count: int,
                   scale32, off32, std32, ok_below: float):
    """A band the recompute walked, checked in one compiled pass (:func:`_k_walked_summary`):
    None when the numpy path must look, else the extrema candidates ``[(index of the key in
    extrema_candidates' order, value, bin), ...]`` of the keys that have one. ``layout``: the
    check's bin layout (fields named as ``WALKED_FIELDS``); ``cover``: (bins, coverage
    bytes) of the band's positions, or None."""
    if any(k not in layout.fields or not 0 < layout.fields[k].nbits <= 62 for k in WALKED_FIELDS):
        return None
    recs = np.ascontiguousarray(recs, dtype=np.uint8)
    foff = np.array([layout.fields[k].offset for k in WALKED_FIELDS], np.int64)
    fnb = np.array([layout.fields[k].nbits for k in WALKED_FIELDS], np.int64)
    if cover is None:
        cbins, cov = np.zeros(0, np.int64), np.zeros(0, np.uint8)
    else:
        cbins, cov = (np.ascontiguousarray(cover[0], dtype=np.int64),
                      np.ascontiguousarray(cover[1], dtype=np.uint8))
    out_val = np.zeros(8, np.float64)
    out_bin = np.zeros(8, np.int64)
    status = _kernel("walked_summary")(
        recs.reshape(-1), foff, fnb, np.ascontiguousarray(bidx, dtype=np.int64), cbins, cov,
        cover is not None, int(max_count), V.DATA, V.COV_DATA, V.COV_CHECKED, V.COV_VERIFIED,
        V.COV_SURVEYED, V.CHECKED, V.VERIFIED, np.float32(scale32), np.float32(off32),
        np.float32(std32), float(ok_below), out_val, out_bin)
    if status:
        return None
    return [(k, float(out_val[k]), int(out_bin[k])) for k in range(8) if out_bin[k] >= 0]
