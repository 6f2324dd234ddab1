"""The area filter's rows from the per-bin sums a load's tiles took (``pfm._area_sums``).

:class:`RowFilter` runs a row of the filter (``filters._area``, docs/filters.md §3) from the
sums in pfmLoader's raster order, and walks the chain of a bin only when its deepest (or,
two-sided, its farthest) sounding reaches the threshold: the only bins whose soundings it must
see one by one. ``z - mean`` rounds monotonically in ``z``, so the deepest sounding reaches the
threshold if any does. The sums are those the filter sums, in the same order (plain IEEE
doubles, no fastmath), and the block, threshold and cut of a bin are the filter's own compiled
helpers (``filters._area._block``, ``_cut_bin``), so the cuts, counts and statistics are the
same, bit for bit (``tests/test_early_tiles.py`` compares the bytes with the filter reading
every chain). Here, beside the writer, because it joins the PFM's chains and the filter: the
codec and the filters know nothing of each other. numba's cache keys this module's kernel on
this file: after editing those helpers (or ``pfm._recompute_kernel._chain_into``), touch this
file too. No Dask here.
"""

from __future__ import annotations

import numpy as np

from ._numeric import CompiledKernels
from .pfm._area_sums import SUM_DTYPE

__all__ = ["RowFilter", "pre_stats"]

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

def _k_filter_row(sf, si, active, a_data, a_avg, a_std, p_data, p_avg, p_std, b_data, b_avg,
                  b_std, dxs, cellstd, max_slope, null_depth, deep_only, exact_raster,
                  min_cells, skip, post_skip, cut_bits, ndx, rsize, L, slot_bits, d_off, d_nb,
                  v_off, v_nb, wstart, wshift, pmask, dscale, doff, zb, vb, ob, sb, cutb, r_off,
                  r_slot, r_val, changed, q_data, q_avg, q_std, counts, null64, user_flag,
                  or_mask, ref_bit, del_ref, inval, pre_f, pre_i):
    """numba kernel: one row of ``filters._area._k_filter_row`` (REFERENCE soundings cut as
    pfmLoader cuts them) from the sums of its bins (``sf``/``si``: the row's
    :data:`SUM_DTYPE` records seen as (width, 10) doubles and integers): a bin whose deepest
    (two-sided: also shallowest) sounding of the cut set does not reach the threshold is
    counted and given its post statistics from the sums; the others have their chain walked
    and every sounding tested, as there. The redo entries of the cuts go to
    ``r_off``/``r_slot``/``r_val`` (record address, slot, new validity) in the order of the
    row's soundings, the columns with a cut to ``changed``, and the recompute's running
    values of their soundings once cut (``pfm._recompute_kernel._bin_steps``, with its
    constants ``null64 .. inval``) to ``pre_f``/``pre_i``, a row each: the recompute of the
    changed bins then walks no chain again. ``counts``: examined, bad, cut, bins filtered,
    sparse, no spread, redo entries, changed columns, bins walked."""
    w = p_data.shape[0]
    nbytes = ndx.size
    for x in range(w):
        q_data[x] = p_data[x]
        q_avg[x] = p_avg[x]
        q_std[x] = p_std[x]
    c_data = np.zeros(9, np.bool_)
    c_avg = np.zeros(9)
    c_std = np.zeros(9)
    no_order = np.zeros(0, np.int64)
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
        if cnt > zb.size or counts[6] + cnt > r_off.size:
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
            changed[counts[7]] = x
            counts[7] += 1
    return _OK


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    i8, f8, u8, u4, b = T.int64, T.float64, T.uint64, T.uint32, T.boolean
    a_f8r = T.Array(T.float64, 1, "C", **ro)
    a_br, a_u1r = T.Array(T.bool_, 1, "C", **ro), T.Array(T.uint8, 1, "C", **ro)
    a_i8, a_f8, a_u4 = T.Array(T.int64, 1, "C"), T.Array(T.float64, 1, "C"), T.Array(T.uint32, 1, "C")
    a_i4, a_u1, a_b = T.Array(T.int32, 1, "C"), T.Array(T.uint8, 1, "C"), T.Array(T.bool_, 1, "C")
    walk = (a_u1r, i8, i8, i8, i8, i8, i8, i8, i8, i8, u8, f8, f8)
    return {
        "filter_row": T.int64(T.Array(T.float64, 2, "C", **ro), T.Array(T.int64, 2, "C", **ro),
                              a_br, a_br, a_f8r, a_f8r, a_br, a_f8r, a_f8r, a_br, a_f8r, a_f8r,
                              a_f8r, f8, f8, f8, b, b, i8, u4, u4, u4, *walk, a_f8, a_u4,
                              a_i8, a_i4, a_u1, a_i8, a_i8, a_i8, a_i8, a_b, a_f8, a_f8, a_i8,
                              f8, i8, i8, i8, i8, i8, T.Array(T.float64, 2, "C"),
                              T.Array(T.int64, 2, "C")),
    }


_kernel = CompiledKernels(globals(), _signatures, prepare=_prepare)


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



class RowFilter:
    """The filter's rows from the sums, one after the other (:meth:`row`), with the arrays
    they reuse; ``steps``: the recompute's constants for the changed bins' running values
    (``pfm._recompute.BandRecompute.step_args``)."""

    def __init__(self, filt, view, steps: tuple):
        self.filt, self.view = filt, view
        self.steps = steps
        self.sc = _Scratch()
        self.redo = np.empty((3, 1 << 16), np.int64)
        self.walk = _walk_args(view)
        w = filt.width
        self.changed = np.empty(w, np.int64)
        self.pre_f, self.pre_i = np.empty((w, 7)), np.empty((w, 4), np.int64)

    def row(self, sums_row: np.ndarray, active: np.ndarray, above, pre, below):
        """Row of ``sums_row`` (the sums of its ``width`` bins) from the post statistics of the
        row above (``above``) and the pre statistics of this row and the one below: returns
        (redo entries (n, 3), changed columns, counts, this row's post statistics, the changed
        bins' running values for the recompute (doubles (k, 7), integers (k, 4)))."""
        from .filters._area import _CUT, _POST_SKIP, _SKIP, _Stats

        filt = self.filt
        w = filt.width
        sf = sums_row.view(np.float64).reshape(w, len(SUM_DTYPE.names))
        si = sums_row.view(np.int64).reshape(w, len(SUM_DTYPE.names))
        n_all = si[:, 7]
        post = _Stats(np.empty(w, np.bool_), np.empty(w), np.empty(w))
        need = int(n_all.max(initial=0))
        if need > self.sc.n:
            self.sc.grow(need)
        total = int(n_all.sum())
        if total > self.redo.shape[1]:
            self.redo = np.empty((3, total), np.int64)
        counts = np.zeros(9, np.int64)
        sc = self.sc
        r = _kernel("filter_row")(
            sf, si, active, above.data, above.avg, above.std, pre.data, pre.avg, pre.std, below.data, below.avg,
            below.std, filt._dxs, filt.cellstd, filt.max_slope, filt._null, filt.deep_only,
            filt.exact_raster, filt.min_cells, _SKIP, _POST_SKIP, _CUT, *self.walk, sc.zb,
            sc.vb, sc.ob, sc.sb, sc.cutb, self.redo[0], self.redo[1], self.redo[2],
            self.changed, post.data, post.avg, post.std, counts, *self.steps, self.pre_f,
            self.pre_i)
        if r != _OK:
            return None
        k = int(counts[6])
        redo = np.ascontiguousarray(self.redo[:, :k].T)
        k = int(counts[7])
        return (redo, self.changed[:k].copy(), counts, post,
                (self.pre_f[:k].copy(), self.pre_i[:k].copy()))


def pre_stats(sums_row: np.ndarray):
    """A row's pre-filter statistics (the filter's ``_Stats``) from its sums."""
    from .filters._area import _Stats

    return _Stats(sums_row["n_pre"] > 0, np.ascontiguousarray(sums_row["avg"]),
                  np.ascontiguousarray(sums_row["std"]))
