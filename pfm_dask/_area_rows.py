"""The area filter's rows from the per-bin sums a load's tiles took (``pfm._area_sums``).

:class:`RowBands` runs a band of the filter's rows (``filters._area``, docs/filters.md §3)
from the sums in pfmLoader's raster order, in one compiled call, and walks the chain of a bin
only when its deepest (or, two-sided, its farthest) sounding reaches the threshold: the only
bins whose soundings it must see one by one. ``z - mean`` rounds monotonically in ``z``, so
the deepest sounding reaches the threshold if any does. The sums are those the filter sums,
in the same order (plain IEEE doubles, no fastmath), and the block, threshold and cut of a bin
are the filter's own compiled helpers (``filters._area._block``, ``_cut_bin``), so the cuts,
counts and statistics are the same, bit for bit (``tests/test_early_tiles.py`` compares the
bytes with the filter reading every chain). A band may start a few rows early from a guess
(the caller checks it: ``pfm_dask._writer_area.run_area_filter_sums``). Here, beside the
writer, because it joins the PFM's chains and the filter: the codec and the filters know
nothing of each other. numba's cache keys this module's kernel on this file: after editing
those helpers (or ``pfm._recompute_kernel._chain_into``, ``_bin_steps``), touch this file
too. No Dask here.
"""

from __future__ import annotations

import threading

import numpy as np

from ._numeric import CompiledKernels
from .pfm._area_sums import SUM_DTYPE

__all__ = ["RowBands", "pre_stats"]

_chain_into = _bin_steps = _block = _cut_bin = None      # compiled helpers, put by _prepare


def _prepare(numba) -> dict:
    from .pfm import _recompute_kernel as R
    from .filters import _area as A

    for mod in (R, A):
        with mod._kernel._lock:
            mod._kernel._ready(numba)
    return {"_chain_into": R._chain_into, "_bin_steps": R._bin_steps, "_block": A._block,
            "_cut_bin": A._cut_bin}


_OK = -1
_GAVE_UP = 1       # a chain leaves the file or ends early: the caller's reader says where
_SCRATCH = 2       # a bin has more soundings than the scratch holds: the caller grows it

def _filter_row(sf, si, active, a_data, a_avg, a_std, p_data, p_avg, p_std, b_data, b_avg,
                  b_std, dxs, cellstd, max_slope, null_depth, deep_only, exact_raster,
                  min_cells, skip, post_skip, cut_bits, ndx, rsize, L, slot_bits, d_off, d_nb,
                  v_off, v_nb, wstart, wshift, pmask, dscale, doff, zb, vb, ob, sb, cutb, r_off,
                  r_slot, r_val, changed, q_data, q_avg, q_std, counts, null64, user_flag,
                  or_mask, ref_bit, del_ref, inval, pre_f, pre_i, ybase, c_data, c_avg,
                  c_std, no_order):
    """One row of ``filters._area._k_filter_row`` (REFERENCE soundings cut as
    pfmLoader cuts them) from the sums of its bins (``sf``/``si``: the row's
    :data:`SUM_DTYPE` records seen as (width, 10) doubles and integers): a bin whose deepest
    (two-sided: also shallowest) sounding of the cut set does not reach the threshold is
    counted and given its post statistics from the sums; the others have their chain walked
    and every sounding tested, as there. The redo entries of the cuts go to
    ``r_off``/``r_slot``/``r_val`` (record address, slot, new validity) in the order of the
    row's soundings, the bins with a cut (``ybase`` + column) to ``changed``, and the
    recompute's running values of their soundings once cut
    (``pfm._recompute_kernel._bin_steps``, with its constants ``null64 .. inval``) to
    ``pre_f``/``pre_i``, a row each: the recompute of the changed bins then walks no chain
    again. ``counts``: examined, bad, cut, bins filtered,
    sparse, no spread, redo entries, changed columns, bins walked."""
    w = p_data.shape[0]
    nbytes = ndx.size
    for x in range(w):
        q_data[x] = p_data[x]
        q_avg[x] = p_avg[x]
        q_std[x] = p_std[x]
    for x in range(w):
        if not (active[x] and p_data[x]):
            continue
        filtered, ok, mean, thr = _block(x, a_data, a_avg, a_std, p_data, p_avg, p_std,
                                         b_data, b_avg, b_std, q_data, q_avg, q_std,
                                         exact_raster, dxs, cellstd, max_slope, min_cells,
                                         c_data, c_avg, c_std, counts)
        if not filtered:
            continue
        reach = False
        if ok and si[x, 8] > 0:
            dev = sf[x, 2] - mean
            if deep_only:
                reach = dev >= thr
            else:
                reach = np.abs(dev) >= thr or np.abs(sf[x, 3] - mean) >= thr
        if not reach:
            counts[0] += si[x, 7]
            counts[1] += si[x, 7] - si[x, 8]
            q_data[x] = si[x, 9] > 0
            q_avg[x] = sf[x, 4]
            q_std[x] = sf[x, 5]
            continue
        cnt = si[x, 7]
        if cnt > zb.size or counts[6] + cnt > r_off.size or counts[7] >= changed.size:
            return _SCRATCH
        counts[8] += 1
        if not _chain_into(ndx, nbytes, si[x, 6], cnt, rsize, L, slot_bits, d_off, d_nb,
                           v_off, v_nb, wstart, wshift, pmask, dscale, doff, zb, vb, ob, sb, 0):
            return _GAVE_UP
        for i in range(cnt):
            cutb[i] = 0
        k0 = counts[2]
        q_data[x], q_avg[x], q_std[x] = _cut_bin(
            zb, vb, 0, cnt, no_order, True, True, mean, thr, deep_only, True, skip, post_skip,
            cut_bits, 0, null_depth, cutb, r_slot, counts)
        # the cuts' positions (in r_slot) made redo entries
        for k in range(k0, counts[2]):
            i = r_slot[k]
            r_off[k] = ob[i]
            r_slot[k] = sb[i]
            r_val[k] = vb[i] | cut_bits
        counts[6] = counts[2]
        cut_here = counts[2] > k0
        if cut_here:
            _bin_steps(zb, vb, cutb, cut_bits, cnt, null64, user_flag, or_mask, ref_bit,
                       del_ref, inval, pre_f, pre_i, counts[7])
            changed[counts[7]] = ybase + x
            counts[7] += 1
    return _OK


def _k_filter_rows(S, SI, active, k0, k1, keep, has_below, above_d, above_a, above_s,
                   dxs, cellstd, max_slope, null_depth, deep_only, exact_raster, min_cells,
                   skip, post_skip, cut_bits, ndx, rsize, L, slot_bits, d_off, d_nb, v_off,
                   v_nb, wstart, wshift, pmask, dscale, doff, zb, vb, ob, sb, cutb, r_off,
                   r_slot, r_val, changed, counts, null64, user_flag, or_mask, ref_bit,
                   del_ref, inval, pre_f, pre_i, y_base, guess_d, guess_a, guess_s, post_d,
                   post_a, post_s, row_end, sb_, sf_, c_data, c_f):
    """numba kernel: rows ``k0 .. k1 - 1`` of a block of sums (``S``/``SI``: (rows, width,
    10), row k of the grid's row ``y_base + k``), each by :func:`_filter_row` from the one
    above's post statistics (``above_*`` for row k0) and the pre statistics of it and the
    one below (none below row ``k1 - 1`` unless ``has_below``: row k1 of the block). The
    outputs and ``counts`` cover rows ``keep`` on only: the rows before are a halo, run
    from a guess, whose last post statistics go to ``guess_*``; row ``k1 - 1``'s go to
    ``post_*``, and where each kept row's redo entries end to ``row_end``. ``sb_`` (4, width)
    and ``sf_`` (8, width), ``c_data`` (9) and ``c_f`` (2, 9): its scratch (it allocates
    nothing: compiled without reference counts, which cost more than the rows' work)."""
    w = S.shape[1]
    # the pre statistics of two rows and the post of two, swapped as the rows go
    p_d, p_a, p_s = sb_[0], sf_[0], sf_[1]
    b_d, b_a, b_s = sb_[1], sf_[2], sf_[3]
    q_d, q_a, q_s = sb_[2], sf_[4], sf_[5]
    a_d, a_a, a_s = sb_[3], sf_[6], sf_[7]
    c_avg, c_std = c_f[0], c_f[1]
    no_order = row_end[:0]
    for x in range(w):
        a_d[x], a_a[x], a_s[x] = above_d[x], above_a[x], above_s[x]
        p_d[x], p_a[x], p_s[x] = SI[k0, x, 8] > 0, S[k0, x, 0], S[k0, x, 1]
    for k in range(k0, k1):
        if k == keep:
            for j in range(counts.size):
                counts[j] = 0
        if k + 1 < k1 or has_below:
            for x in range(w):
                b_d[x], b_a[x], b_s[x] = SI[k + 1, x, 8] > 0, S[k + 1, x, 0], S[k + 1, x, 1]
        else:
            for x in range(w):
                b_d[x], b_a[x], b_s[x] = False, 0.0, 0.0
        r = _filter_row(S[k], SI[k], active[k], a_d, a_a, a_s, p_d, p_a, p_s, b_d, b_a, b_s,
                        dxs, cellstd, max_slope, null_depth, deep_only, exact_raster,
                        min_cells, skip, post_skip, cut_bits, ndx, rsize, L, slot_bits, d_off,
                        d_nb, v_off, v_nb, wstart, wshift, pmask, dscale, doff, zb, vb, ob,
                        sb, cutb, r_off, r_slot, r_val, changed, q_d, q_a, q_s, counts, null64,
                        user_flag, or_mask, ref_bit, del_ref, inval, pre_f, pre_i,
                        (y_base + k) * w, c_data, c_avg, c_std, no_order)
        if r != _OK:
            return r
        if k >= keep:
            row_end[k - keep] = counts[6]
        if k + 1 == keep:
            for x in range(w):
                guess_d[x], guess_a[x], guess_s[x] = q_d[x], q_a[x], q_s[x]
        # this row's post is the next one's above, its below the next one's pre
        a_d, q_d = q_d, a_d
        a_a, q_a = q_a, a_a
        a_s, q_s = q_s, a_s
        p_d, b_d = b_d, p_d
        p_a, b_a = b_a, p_a
        p_s, b_s = b_s, p_s
    for x in range(w):
        post_d[x], post_a[x], post_s[x] = a_d[x], a_a[x], a_s[x]
    return _OK


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    i8, f8, u8, u4, b = T.int64, T.float64, T.uint64, T.uint32, T.boolean
    a_f8r = T.Array(T.float64, 1, "C", **ro)
    a_br, a_u1r = T.Array(T.bool_, 1, "C", **ro), T.Array(T.uint8, 1, "C", **ro)
    a_i8, a_f8 = T.Array(T.int64, 1, "C"), T.Array(T.float64, 1, "C")
    a_u4, a_i4 = T.Array(T.uint32, 1, "C"), T.Array(T.int32, 1, "C")
    a_u1, a_b = T.Array(T.uint8, 1, "C"), T.Array(T.bool_, 1, "C")
    walk = (a_u1r, i8, i8, i8, i8, i8, i8, i8, i8, i8, u8, f8, f8)
    return {
        "filter_rows": T.int64(
            T.Array(T.float64, 3, "C", **ro), T.Array(T.int64, 3, "C", **ro),
            T.Array(T.bool_, 2, "C", **ro), i8, i8, i8, b, a_br, a_f8r, a_f8r, a_f8r, f8, f8,
            f8, b, b, i8, u4, u4, u4, *walk, a_f8, a_u4, a_i8, a_i4, a_u1, a_i8, a_i8, a_i8,
            a_i8, a_i8, f8, i8, i8, i8, i8, i8, T.Array(T.float64, 2, "C"),
            T.Array(T.int64, 2, "C"), i8, a_b, a_f8, a_f8, a_b, a_f8, a_f8, a_i8,
            T.Array(T.bool_, 2, "C"), T.Array(T.float64, 2, "C"), a_b,
            T.Array(T.float64, 2, "C")),
    }


#: without numba's reference counts: the kernel allocates nothing, and the counts cost more
#: than the rows' work. (The row is a call of its own: over 30 arguments, CPython passes
#: them as a tuple, which numba does not inline.)
_kernel = CompiledKernels(globals(), _signatures, ("_filter_row",), prepare=_prepare,
                          refcounts=False)


#: cuts (and changed bins) a band's arrays hold at first; doubled when a band has more
FIRST_ROOM = 1 << 14


class _Scratch:
    """A thread's arrays for the soundings of one bin (grown as needed)."""

    def __init__(self, n: int = 4096):
        self.grow(n)

    def grow(self, n: int) -> None:
        self.n = int(n)
        self.zb = np.empty(n, np.float64)
        self.vb = np.empty(n, np.uint32)
        self.ob = np.empty(n, np.int64)
        self.sb = np.empty(n, np.int32)
        self.cutb = np.empty(n, np.uint8)


def _walk_args(view) -> tuple:
    return (view.buf, view.rsize, view.L, view.slot_bits, view.depth[0], view.depth[1],
            view.validity[0], view.validity[1], *view.word, view.dscale, view.doff)



class RowBands:
    """The filter's rows from the sums, a band of rows a call (:meth:`band`), on any thread
    (each its own arrays); ``steps``: the recompute's constants for the changed bins' running
    values (``pfm._recompute.running_args``)."""

    def __init__(self, filt, view, steps: tuple):
        self.filt, self.view, self.steps = filt, view, steps
        self.walk = _walk_args(view)
        self._local = threading.local()

    def band(self, S: np.ndarray, active: np.ndarray, k0: int, k1: int, keep: int,
             has_below: bool, above, y_base: int) -> dict | None:
        """Rows ``k0 .. k1 - 1`` of ``S`` (the sums of rows ``y_base ..`` of the grid, as
        :data:`SUM_DTYPE` records (rows, width)) from ``above`` (row k0 - 1's post statistics,
        a ``filters._area._Stats``), the rows before ``keep`` a halo: their outputs are not
        kept (:func:`_k_filter_rows`). Returns the redo entries (n, 3), the changed bins and
        their running values, the counts (examined, bad, cut, bins filtered, sparse, no
        spread, redo entries, changed bins, bins walked), ``post`` (row k1 - 1's), ``guess``
        (row keep - 1's when a halo ran), ``row_end`` (where each kept row's redo entries end)
        and ``soundings`` (the band's, all of them: what the ``.ndx`` map's pages are let go
        by); None when a chain is broken."""
        from .filters._area import _CUT, _POST_SKIP, _SKIP, _Stats

        filt = self.filt
        w = filt.width
        nf = len(SUM_DTYPE.names)
        sf = S.view(np.float64).reshape(S.shape[0], w, nf)
        si = S.view(np.int64).reshape(S.shape[0], w, nf)
        loc = self._local
        if not hasattr(loc, "sc"):
            loc.sc, loc.cap = _Scratch(), FIRST_ROOM
        if getattr(loc, "w", None) != w:
            loc.w, loc.rows_b, loc.rows_f = w, np.empty((4, w), np.bool_), np.empty((8, w))
            loc.c_data, loc.c_f = np.empty(9, np.bool_), np.empty((2, 9))
        need = int(si[k0:k1, :, 7].max(initial=0))
        if need > loc.sc.n:
            loc.sc.grow(need)
        post = _Stats(np.empty(w, np.bool_), np.empty(w), np.empty(w))
        guess = _Stats(np.empty(w, np.bool_), np.empty(w), np.empty(w))
        while True:
            cap, sc = loc.cap, loc.sc
            redo, changed = np.empty((3, cap), np.int64), np.empty(cap, np.int64)
            pre_f, pre_i = np.empty((cap, 7)), np.empty((cap, 4), np.int64)
            counts = np.zeros(9, np.int64)
            row_end = np.zeros(max(0, k1 - keep), np.int64)
            r = _kernel("filter_rows")(
                sf, si, active, k0, k1, keep, bool(has_below), above.data, above.avg,
                above.std, filt._dxs, filt.cellstd, filt.max_slope, filt._null,
                filt.deep_only, filt.exact_raster, filt.min_cells, _SKIP, _POST_SKIP, _CUT,
                *self.walk, sc.zb, sc.vb, sc.ob, sc.sb, sc.cutb, redo[0], redo[1], redo[2],
                changed, counts, *self.steps, pre_f, pre_i, y_base, guess.data, guess.avg,
                guess.std, post.data, post.avg, post.std, row_end, loc.rows_b, loc.rows_f,
                loc.c_data, loc.c_f)
            if r == _OK:
                break
            if r != _SCRATCH:
                return None
            # more cuts in the band than room for them (the scratch holds its largest bin
            # already): again, with twice the room
            loc.cap = cap * 2
        n, m = int(counts[6]), int(counts[7])
        return {"redo": np.ascontiguousarray(redo[:, :n].T), "row_end": row_end,
                "changed": changed[:m].copy(),
                "running": (pre_f[:m].copy(), pre_i[:m].copy()), "counts": counts,
                "post": post, "guess": guess if keep > k0 else None,
                "soundings": int(si[k0:k1, :, 7].sum())}


def pre_stats(sums_row: np.ndarray):
    """A row's pre-filter statistics (the filter's ``_Stats``) from its sums."""
    from .filters._area import _Stats

    return _Stats(sums_row["n_pre"] > 0, np.ascontiguousarray(sums_row["avg"]),
                  np.ascontiguousarray(sums_row["std"]))
