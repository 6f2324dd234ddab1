"""Bin statistics recomputed from soundings, exactly as the PFM library does it.

The PFM I/O library (V7.00, ``recompute_bin_values`` in ``pfm_io.c``) rebuilds
a bin record from the soundings of its chain. This module does the same for
many bins at once, with the same rules and the same arithmetic, so that once
packed (NINT of float32 values) our bin records are the library's bytes. See
docs/pfm-format.md, "Bin recompute".

The rules, per bin, with soundings taken in chain order:

* a sounding with REFERENCE sets the bin's REFERENCE flag;
* soundings with DELETED or REFERENCE, or with depth >= NULL DEPTH, are skipped;
* every other sounding feeds the unfiltered min/max/sum and has its validity
  OR-ed into the bin (minus the caller's ``keep_mask`` bits);
* of those, soundings without an INVAL bit (and, with CLASS TYPE k > 0, only
  those carrying USER_k) feed the filtered min/max/sum/sum of squares;
* the bin's previous validity keeps only MODIFIED, CHECKED, DATA, DELETED,
  INTERPOLATED, VERIFIED, USER_05, USER_06, USER_08, USER_09 and USER_10
  (:data:`PRIOR_KEEP`), plus the ``keep_mask`` bits;
* DATA is set when at least one sounding is valid, cleared otherwise.

Arithmetic (the part that decides byte parity): depths are doubles; the three
sums are double accumulators added *in chain order*; mean = sum / n; variance
= (sum2 - n * mean**2) / (n - 1), std = sqrt(variance) in double, 0 when n <= 1
or the variance is negative; every result is then stored in a C ``float``
(float32). Min and max are float32 of the double extremes. A bin with no valid
sounding gets NULL DEPTH for its filtered min/max/average and keeps the
standard deviation it had (the library does not reset it).

Speed: the per-sounding work (sums, extrema, counts, flag bits) is one pass
of a small numba kernel over soundings grouped by bin (:func:`_group_pass`);
:func:`recompute` skips the holes of the sparse ``.bin`` and its empty
records, and works on bands of bins with soundings on a few threads, each
band recomputed and packed in one compiled pass over its records' bytes
(:mod:`._recompute_kernel`) and written back on its thread.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from .._arrays import unique_sorted
from .._numeric import CompiledKernels
from ..errors import PfmFormatError
from .. import validity as V
from ._extrema import EXTREMA_START, _Extrema, band_extrema, std_limit
from ._recompute_kernel import (SCATTERED_DROP_SOUNDINGS, NdxView, _step, record_fields,
                                recompute_records, step_args)
from ._coverage import update_coverage
from ._io import RMW_GAP, Spans, write_runs

__all__ = [
    "PRIOR_KEEP",
    "EXTREMA_START",
    "compute_bin_stats",
    "grouped_bin_stats",
    "ordered_imap",
    "THREADS",
    "recompute",
    "THREADS",
]

# The library ANDs the bin's previous validity with 65535 ^ (SUSPECT | SELECTED |
# USER | REFERENCE | INVAL). Its PFM_USER (7672256) has bits above 2**16, so the
# XOR *sets* them in the mask: USER_05/06/08/09/10 survive from the prior record,
# while USER_07, DESIGNATED_SOUNDING and the low per-sounding flags are cleared.
_LIBRARY_PFM_USER = 7672256
PRIOR_KEEP = 65535 ^ (V.SUSPECT | V.SELECTED | _LIBRARY_PFM_USER | V.REFERENCE | V.INVAL)

_USER_FLAGS = (V.USER_01, V.USER_02, V.USER_03, V.USER_04, V.USER_05,
               V.USER_06, V.USER_07, V.USER_08, V.USER_09, V.USER_10)

STAT_FIELDS = ("std", "avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max")


def _per_bin(value, n_bins: int, name: str, dtype) -> np.ndarray:
    """Broadcast a scalar or check a per-bin array for ``compute_bin_stats``."""
    if value is None:
        return np.zeros(n_bins, dtype=dtype)
    arr = np.asarray(value)
    if arr.ndim == 0:
        return np.full(n_bins, arr, dtype=dtype)
    if arr.shape != (n_bins,):
        raise ValueError(f"{name} must be a scalar or one value per bin "
                         f"({n_bins}), got shape {arr.shape}")
    return arr.astype(dtype, copy=False)


_DELETED_OR_REFERENCE = V.DELETED | V.REFERENCE
_INVAL = V.INVAL
_REFERENCE = V.REFERENCE


def _k_group_pass(z, v, start, counts, null64, user_flag, or_mask, out_f, out_i):
    """numba kernel: one pass over every group (bin) of soundings, in chain order.

    Per group: the running sums (from 0.0, left to right, a masked-out member
    adding 0.0) of filtered depths, of their squares and of used depths; the
    filtered and used minima and maxima; the numbers of filtered and used
    soundings; the OR of ``v & or_mask`` over used soundings; and flags: 1 =
    a REFERENCE sounding, 2 / 4 = both +0.0 and -0.0 among the filtered / used
    depths (numpy's minimum/maximum then pick a zero by lane order, which the
    caller reproduces with numpy for those groups). One sounding's step is
    :func:`._recompute_kernel._step`, shared with the compiled band passes.
    """
    for g in range(start.size):
        s_f = s_f2 = s_u = 0.0
        min_f = min_u = np.inf
        max_f = max_u = -np.inf
        n_f = n_u = bits = flags = 0
        i0 = start[g]
        for i in range(i0, i0 + counts[g]):
            s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags = _step(
                z[i], v[i], null64, user_flag, or_mask, _REFERENCE, _DELETED_OR_REFERENCE, _INVAL,
                s_f, s_f2, s_u, min_f, max_f, min_u, max_u, n_f, n_u, bits, flags)
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
        out_i[g, 3] = (flags & 1) | (2 if (flags & 6) == 6 else 0) | (4 if (flags & 24) == 24 else 0)


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    f8, i8 = T.Array(T.float64, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro)
    return {"group_pass": T.void(f8, i8, i8, i8, T.float64, T.int64, T.int64,
                                 T.Array(T.float64, 2, "C"), T.Array(T.int64, 2, "C"))}


#: The numba-compiled ``_k_<name>`` (compiled, or loaded from the on-disk cache, on first use).
#: Compiled without fastmath, so every addition and multiplication is the plain IEEE double
#: operation in the order written (no reassociation, no fused multiply-add): the sums are the
#: library's running sums exactly. ``nogil``: the recompute's and the check's threads run in
#: parallel.
_kernel = CompiledKernels(globals(), _signatures, helpers=("_step",))


def _group_pass(z: np.ndarray, v: np.ndarray, start: np.ndarray, counts: np.ndarray, null64: float,
                class_type: int, keep_mask: int) -> dict:
    """Per-bin sums, extrema, counts and flag bits of grouped soundings (see :func:`_k_group_pass`).

    Groups are contiguous (``start``, ``counts`` > 0). The sums are the
    library's running double sums in chain order (``np.add.reduceat`` would
    sum pairwise and differ in the last bit). The extrema are numpy's
    ``minimum``/``maximum`` reductions of the masked depths; where a group has
    zeros of both signs, those are taken from numpy itself.
    """
    G = len(start)
    out_f = np.empty((G, 7), dtype=np.float64)
    out_i = np.empty((G, 4), dtype=np.int64)
    user_flag = _USER_FLAGS[class_type - 1] if class_type else 0
    if G:
        _kernel("group_pass")(np.ascontiguousarray(z, dtype=np.float64),
                              np.ascontiguousarray(v, dtype=np.int64),
                              np.ascontiguousarray(start, dtype=np.int64),
                              np.ascontiguousarray(counts, dtype=np.int64), float(null64),
                              int(user_flag), int(V.VAL_MASK ^ keep_mask), out_f, out_i)
    res = {"sum_f": out_f[:, 0], "sum2_f": out_f[:, 1], "sum_u": out_f[:, 2],
           "min_f": out_f[:, 3], "max_f": out_f[:, 4], "min_u": out_f[:, 5], "max_u": out_f[:, 6],
           "n_valid": out_i[:, 0], "n_used": out_i[:, 1], "bits": out_i[:, 2],
           "any_ref": (out_i[:, 3] & 1) != 0}
    mixed = (out_i[:, 3] & 6) != 0
    if mixed.any():
        used = ((v & (V.DELETED | V.REFERENCE)) == 0) & (z < null64)
        filt = used & ((v & V.INVAL) == 0)
        if class_type:
            filt &= (v & user_flag) != 0
        for key, mask, fill, red in (("min_f", filt, np.inf, np.minimum), ("max_f", filt, -np.inf, np.maximum),
                                     ("min_u", used, np.inf, np.minimum), ("max_u", used, -np.inf, np.maximum)):
            res[key][mixed] = red.reduceat(np.where(mask, z, fill), start)[mixed]
    return res


def compute_bin_stats(bin_index, depth, validity, *, null_depth, class_type=0,
                      prior_validity=None, keep_mask=0, prior_std=None) -> dict:
    """Bin statistics for every bin that has soundings, by the library's rules.

    ``bin_index``, ``depth`` and ``validity`` hold one entry per sounding; the
    soundings of a bin may come in any order relative to other bins, but within
    a bin their order is the summation order (give chain order for byte parity).
    ``depth`` is the decoded double value; ``null_depth`` the header's NULL
    DEPTH (a C float, so it is rounded to float32 here). ``class_type`` k > 0
    restricts the filtered set to soundings with USER_k.

    ``prior_validity`` (scalar or one value per returned bin, i.e. aligned with
    ``np.unique(bin_index)``) is the validity of the bin record before the
    recompute; only :data:`PRIOR_KEEP` and ``keep_mask`` bits of it survive.
    ``keep_mask`` is the library's ``mask`` argument (pfmLoader passes 0): those
    bits are kept from the prior word and not taken from the soundings.
    ``prior_std`` is the standard deviation the record held; the library leaves
    it in place for a bin with no valid sounding (default 0).

    Returns a dict of arrays, one entry per unique bin in increasing
    ``bin_index`` order: ``bin_index``, ``num_soundings``, ``num_valid``
    (uint32), ``std``, ``avg_filtered``, ``min_filtered``, ``max_filtered``,
    ``avg``, ``min``, ``max`` (float32, as the library's C floats) and
    ``validity`` (uint32).
    """
    bin_index = np.asarray(bin_index)
    depth = np.asarray(depth, dtype=np.float64)
    vals = np.asarray(validity).astype(np.int64, copy=False)
    if not (bin_index.shape == depth.shape == vals.shape) or bin_index.ndim != 1:
        raise ValueError("bin_index, depth and validity must be 1-D arrays of one length")
    class_type = int(class_type)
    if not 0 <= class_type <= 10:
        raise PfmFormatError(f"CLASS TYPE must be 0..10, got {class_type}")
    if len(bin_index) > 1 and not np.all(bin_index[1:] >= bin_index[:-1]):
        order = np.argsort(bin_index, kind="stable")
        bin_index, depth, vals = bin_index[order], depth[order], vals[order]
    if len(bin_index):
        first = np.ones(len(bin_index), dtype=bool)
        first[1:] = bin_index[1:] != bin_index[:-1]
        start = np.flatnonzero(first)
    else:
        start = np.zeros(0, dtype=np.int64)
    counts = np.diff(np.append(start, len(bin_index)))
    return grouped_bin_stats(bin_index[start], counts, depth, vals, null_depth=null_depth,
                             class_type=class_type, prior_validity=prior_validity,
                             keep_mask=keep_mask, prior_std=prior_std)


def grouped_bin_stats(bins, counts, depth, validity, *, null_depth, class_type=0,
                      prior_validity=None, keep_mask=0, prior_std=None, sums=None) -> dict:
    """:func:`compute_bin_stats` for soundings already grouped by bin.

    ``bins`` (increasing) and ``counts`` (all > 0) describe consecutive runs of
    ``depth``/``validity``: the first ``counts[0]`` soundings belong to
    ``bins[0]``, and so on, each run in chain order. This is how chains come
    back from the store, so the recompute and the check skip the sort and
    the search for bin boundaries. Same arguments and result otherwise.
    ``sums``: the bins' :func:`_group_pass` values when already taken (the
    check's fast path reads them from the records, with ``keep_mask`` 0);
    ``depth`` and ``validity`` are then not used.
    """
    uniq = np.asarray(bins)
    counts = np.asarray(counts, dtype=np.int64)
    z = np.asarray(depth, dtype=np.float64)
    v = np.asarray(validity).astype(np.int64, copy=False)
    class_type = int(class_type)
    if not 0 <= class_type <= 10:
        raise PfmFormatError(f"CLASS TYPE must be 0..10, got {class_type}")
    if sums is None and (uniq.shape != counts.shape or int(counts.sum()) != len(z)
                         or len(z) != len(v) or (counts.size and counts.min() <= 0)):
        raise ValueError("bins/counts do not describe the soundings")
    keep_mask = int(keep_mask)
    null32 = np.float32(null_depth)
    null64 = float(null32)
    n_bins = len(uniq)
    start = np.cumsum(counts) - counts

    prior = _per_bin(prior_validity, n_bins, "prior_validity", np.int64)
    std_prior = _per_bin(prior_std, n_bins, "prior_std", np.float32)

    out = {"bin_index": uniq,
           "num_soundings": counts.astype(np.uint32)}
    if n_bins == 0:
        out["num_valid"] = np.zeros(0, np.uint32)
        for f in STAT_FIELDS:
            out[f] = np.zeros(0, np.float32)
        out["validity"] = np.zeros(0, np.uint32)
        return out

    r = sums if sums is not None else _group_pass(z, v, start, counts, null64, class_type, keep_mask)
    n_valid, n_used = r["n_valid"], r["n_used"]
    sum_f, sum2_f, sum_u = r["sum_f"], r["sum2_f"], r["sum_u"]
    min_f, max_f, min_u, max_u = r["min_f"], r["max_f"], r["min_u"], r["max_u"]

    with np.errstate(invalid="ignore", divide="ignore"):
        mean_f = sum_f / n_valid
        mean_u = sum_u / n_used
        nf = n_valid.astype(np.float64)
        var = (sum2_f - nf * (mean_f * mean_f)) / (nf - 1.0)
        std = np.where((n_valid > 1) & (var >= 0), np.sqrt(np.where(var >= 0, var, 0.0)), 0.0)

    has_valid = n_valid > 0
    has_used = n_used > 0
    out["num_valid"] = n_valid.astype(np.uint32)
    out["std"] = np.where(has_valid, std.astype(np.float32), std_prior).astype(np.float32)
    out["avg_filtered"] = np.where(has_valid, mean_f.astype(np.float32), null32)
    out["min_filtered"] = np.where(has_valid, min_f.astype(np.float32), null32)
    out["max_filtered"] = np.where(has_valid, max_f.astype(np.float32), null32)
    out["avg"] = np.where(has_used, mean_u.astype(np.float32), null32)
    out["min"] = np.where(has_used, min_u.astype(np.float32), null32)
    out["max"] = np.where(has_used, max_u.astype(np.float32), null32)

    word = (prior & PRIOR_KEEP) | (prior & keep_mask) | r["bits"]
    word |= np.where(r["any_ref"], V.REFERENCE, 0)
    word = np.where(has_valid, word | V.DATA, word & ~V.DATA)
    out["validity"] = (word & V.VAL_MASK).astype(np.uint32)
    return out


# ---------------------------------------------------------------------------
# Recompute of an open PfmFile, by bands, with pfmLoader's header extrema.

#: Soundings per band of :func:`recompute` (about 100 bytes each while a band is worked on,
#: at most ``threads`` + 1 bands at once): what bounds the recompute's memory, whatever the
#: number of soundings in the PFM.
BAND_SOUNDINGS = 500_000
#: Default thread count of :func:`recompute` and of the check's band pipeline.
THREADS = min(4, os.cpu_count() or 1)
#: Bin records read at once while planning bands (their raw bytes and copies: about 150 bytes
#: a bin, on each of the recompute's threads; 1 << 20 made the recompute's peak 130 MB higher,
#: 1 << 18 about 30 MB higher than this, for no time saved)
_PLAN_BINS = 1 << 17
#: False: every band takes the general path (numpy passes and the store's record writes)
#: instead of the compiled band pass; the tests compare the two.
FUSED = True

_AVERAGE_NAMES = ("Average Filtered Depth", "Average Edited")


def _plan_bands(pfm_file, want_rows: np.ndarray | None, rows_per_band: int | None,
                budget: int):
    """Yield (row0, row1, col0, col1) rectangles holding at most ~``budget`` soundings.

    Counts come from the bin records that hold data (read ``_PLAN_BINS`` at a time); rows are
    grouped while their soundings fit, a row too heavy on its own is cut into
    column ranges. ``want_rows`` restricts the plan to those rows.
    """
    W, H = pfm_file.width, pfm_file.height
    if rows_per_band is not None:
        rows_per_band = max(1, int(rows_per_band))
    chunk = max(1, _PLAN_BINS // max(1, W))
    for r0 in range(0, H, chunk):
        r1 = min(H, r0 + chunk)
        if want_rows is not None:
            if not np.any((want_rows >= r0) & (want_rows < r1)):
                continue
        cnt = np.zeros((r1 - r0) * W, dtype=np.int64)
        for recs in pfm_file.bin_records_with_data(r0 * W, r1 * W, fields=("num_soundings",)):
            cnt[recs["bin_index"] - r0 * W] = recs["num_soundings"]
        cnt = cnt.reshape(r1 - r0, W)
        per_row = cnt.sum(axis=1)
        row = r0
        while row < r1:
            if (want_rows is not None and not np.isin(row, want_rows)) or per_row[row - r0] == 0:
                row += 1
                continue
            if per_row[row - r0] > budget and rows_per_band is None:
                csum = np.cumsum(cnt[row - r0])
                c0 = 0
                while c0 < W:
                    base = csum[c0 - 1] if c0 else 0
                    c1 = int(np.searchsorted(csum, base + budget, side="right"))
                    c1 = max(c1, c0 + 1)
                    yield row, row + 1, c0, min(c1, W)
                    c0 = c1
                row += 1
                continue
            end = row + 1
            tot = int(per_row[row - r0])
            while end < r1 and (rows_per_band is None or end - row < rows_per_band):
                nxt = int(per_row[end - r0])
                if rows_per_band is None and tot + nxt > budget:
                    break
                if want_rows is not None and not np.isin(end, want_rows) and nxt:
                    break
                tot += nxt
                end += 1
            yield row, end, 0, W
            row = end


#: Wanted bins further apart than this are looked for in separate runs of the ``.bin``.
_WANTED_GAP = 1 << 16


def _wanted_runs(wanted: np.ndarray | None, n_bins: int) -> list[tuple[int, int]]:
    """Bin ranges ``[a, b)`` that hold every wanted bin (the whole grid when ``None``)."""
    if wanted is None:
        return [(0, n_bins)]
    brk = np.flatnonzero(np.diff(wanted) > _WANTED_GAP) + 1
    first = wanted[np.r_[0, brk]]
    last = wanted[np.r_[brk - 1, wanted.size - 1]] + 1
    return list(zip(first.tolist(), last.tolist()))


def _cuts(cnt: np.ndarray, budget: int):
    """Consecutive pieces of at most ``budget`` soundings (a heavier bin alone)."""
    csum = np.cumsum(np.minimum(cnt, budget))
    a, n = 0, cnt.size
    while a < n:
        base = csum[a - 1] if a else 0
        b = max(a + 1, int(np.searchsorted(csum, base + budget, side="right")))
        yield a, min(b, n)
        a = b


def _data_bands(pfm_file, wanted: np.ndarray | None, rows_per_band: int | None, budget: int,
                fields: tuple):
    """Yield the bands of :func:`recompute`: the decoded ``fields`` of consecutive bins with
    soundings (only ``wanted`` ones, when given) in raster order, at most ``budget`` soundings
    a band (a heavier bin alone), or with ``rows_per_band`` the bins of that many rows.

    The records come from :meth:`PfmFile.bin_records_with_data`: holes of the sparse ``.bin``
    are not read and empty records not decoded, so the plan costs what the bins with data
    cost, not what the grid does.
    """
    ranges = _wanted_runs(wanted, pfm_file.width * pfm_file.height)
    for recs in pfm_file.bin_records_with_data(fields=fields, chunk=_PLAN_BINS, only=wanted,
                                               ranges=ranges):
        sel = np.flatnonzero(recs["num_soundings"] > 0)
        if sel.size == 0:
            continue
        recs = {k: v[sel] for k, v in recs.items()}
        if rows_per_band is None:
            pieces = _cuts(recs["num_soundings"], budget)
        else:
            key = recs["row"] // rows_per_band
            edge = np.r_[0, np.flatnonzero(np.diff(key)) + 1, sel.size]
            pieces = zip(edge[:-1].tolist(), edge[1:].tolist())
        for i, j in pieces:
            yield {k: v[i:j] for k, v in recs.items()}


def recompute(pfm_file, bin_index=None, *, rows=None, keep_mask: int = 0, clear_mask: int = 0,
              extrema: dict | None = None, band_soundings: int = BAND_SOUNDINGS,
              threads: int | None = None, walk=None, fresh: bool = False) -> dict:
    """Recompute bins of an open (``"r+"``) :class:`PfmFile` and return the header extrema.

    ``bin_index``: the bins to recompute (``row * width + col``), or ``None``
    for every bin with soundings. Work goes by bands of consecutive bins with
    soundings in raster order (those of ``rows`` rows per band, or as many as
    hold about ``band_soundings`` soundings; :func:`_data_bands` reads only the
    parts of the sparse ``.bin`` that hold data, so the time follows the bins
    with data and their chains, not the grid): the band's soundings,
    :func:`grouped_bin_stats` with the records' validity and std as the prior
    values, the records written back and the ``.cvg`` updated. ``keep_mask`` is the library's recompute mask (0 as in
    pfmLoader); ``clear_mask`` bits are cleared from the new validity (pfmLoader
    clears CHECKED | VERIFIED on an append; here the coverage map follows).

    ``threads`` (default :data:`THREADS`) bands are read, computed and written at
    once on a thread pool (numpy, numba and ``os.pread`` release the GIL; bands
    are disjoint, so are the bytes they write); the extrema are folded in band
    order on the calling thread, so the result does not depend on the thread count.

    ``walk``: a :class:`._chains.ChainWalk` that the same pass fills with the check's chain
    walk (``check(..., walked=walk)`` then does not walk the chains again); it stays not
    ``clean`` unless every bin with soundings took the compiled band pass.

    ``fresh``: the bins of a new PFM, recomputed as from the writer's records (std 0, coverage
    bytes 0) whatever a recompute before left (:class:`BandRecompute`).

    Returns pfmLoader's header extrema over the recomputed bins, in raster
    order from ``extrema`` (default :data:`EXTREMA_START`), as a dict of
    :class:`PfmHeader` field names ready for ``pfm_file.write_header(**...)``.
    Bins whose max depth is not below NULL DEPTH are left out, as pfmLoader
    does. The averages are only rewritten while ``[AVERAGE FILTERED NAME]`` is
    one the library recomputes.
    """
    W = pfm_file.width
    null32 = np.float32(pfm_file.null_depth)
    ext = _Extrema(extrema, W)
    # The store clamps a std too large for [STD BITS]; the header states what is stored.
    ext.std_max = std_limit(pfm_file.header)
    wanted = None
    if bin_index is not None:
        wanted = unique_sorted(np.asarray(bin_index, dtype=np.int64))
        if wanted.size == 0:
            return ext.result()
        if wanted[0] < 0 or wanted[-1] >= W * pfm_file.height:
            raise PfmFormatError(f"bin_index outside 0..{W * pfm_file.height - 1}", path=pfm_file.path)
    rows_per_band = None if rows is None else max(1, int(rows))

    threads = THREADS if threads is None else threads
    view = None
    # the compiled band pass (_recompute_kernel), unless bands go by rows or a test wraps the
    # store's record writes (the crash tests count them)
    if rows_per_band is None and "write_bin_records" not in vars(pfm_file) and FUSED:
        pfm_file._sync()
        view = NdxView(pfm_file)
        if not view.ok:
            view.close()
            view = None
    if view is not None and wanted is not None and scattered(wanted.size, W * pfm_file.height):
        view.scattered()
    if walk is not None:
        walk.spoil()
        if view is not None and wanted is None:
            walk.begin(view.buf.size // view.rsize, view.rsize)
    walking = walk is not None and walk.clean
    bp = BandRecompute(pfm_file, view, keep_mask=keep_mask, clear_mask=clear_mask,
                       walking=walking, std_max=ext.std_max, fresh=fresh)
    if view is None:
        bands = _data_bands(pfm_file, wanted, rows_per_band, int(band_soundings), bp.rec_fields)

        def work(band):
            return [bp.general(band)]
    else:
        def work(job):
            # a span of bins read and cut into bands on this thread (the calling thread
            # only folds the results: reading the records there left the pool waiting)
            out = []
            for bidx, raw in job():
                out.append(bp(bidx, raw))
                # the pages the band read: resident memory stays at a few bands' worth
                view.drop_pages(int(out[-1][1]["num_soundings"].sum()))
            return out

        bands = _raw_jobs(pfm_file, wanted, int(band_soundings))
    try:
        # the extrema are folded in band order on this thread: raster order, as pfmLoader
        for results in ordered_imap(work, bands, threads):
            for result in results:
                if result is None:
                    continue
                if len(result) > 3:
                    ext.fold(result[3])
                else:
                    ext.update(result[0], result[1], null32)
                if walking:     # the general path's bands leave the check to walk them
                    if len(result) > 2 and result[2] is not None:
                        walk.add(*result[2])
                    else:
                        walk.spoil()
    except BaseException:
        if walk is not None:
            walk.spoil()
        raise
    finally:
        if view is not None:
            view.close()
    return ext.result()


def running_args(pfm_file, keep_mask: int = 0) -> tuple:
    """The per-sounding rule's constants of :class:`BandRecompute` over ``pfm_file``
    (:func:`._recompute_kernel.step_args`), for the bins' running values summed elsewhere
    (``pre`` of :meth:`BandRecompute.__call__`)."""
    return step_args(np.float32(pfm_file.null_depth), int(pfm_file.header.class_type),
                     _USER_FLAGS, keep_mask)


class BandRecompute:
    """A band of bin records recomputed and written back, on any thread: the compiled pass
    over their bytes (:func:`._recompute_kernel.recompute_records`) when ``view`` is given
    and the band is ordinary, else the general path (numpy passes and the store's record
    writes), which reports what it finds. Calling it returns ``(bins, stats, walk or None,
    extrema candidates)``; :meth:`general` takes decoded records."""

    def __init__(self, pfm_file, view, *, keep_mask: int = 0, clear_mask: int = 0,
                 walking: bool = False, std_max: float | None = None, write_lock=None,
                 fresh: bool = False, sums: dict | None = None, on_sums=None):
        h = pfm_file.header
        # bands that are not runs of consecutive bins (tiles) write under a lock: a band's
        # read-modify-write of coverage bytes, or the general path's of bin records, spans
        # the bins between its own, which a band on another thread may be writing
        self.lock = write_lock if write_lock is not None else contextlib.nullcontext()
        self.pfm, self.view, self.h = pfm_file, view, h
        self.keep_mask, self.clear_mask, self.walking = int(keep_mask), int(clear_mask), walking
        self.null32 = np.float32(pfm_file.null_depth)
        self.compute_average = h.average_filtered_name in _AVERAGE_NAMES
        self.std_max = std_limit(h) if std_max is None else std_max
        self.rec_fields = ("num_soundings", "validity", "std", "head")
        if not self.compute_average:
            self.rec_fields += ("avg_filtered", "avg")
        self.fd = pfm_file._fd("bin") if view is not None else None
        #: a new PFM's bins: recomputed from the state the writer leaves them in (std 0, no
        #: coverage byte set), whatever a recompute before wrote (tiles done early, then
        #: soundings the area filter cut: a bin with no valid one keeps its prior std)
        self.fresh = bool(fresh)
        #: the area filter's per-bin sums taken in the same walk (``._area_sums``: its
        #: skip masks and null depth), handed to ``on_sums(bins, sums or None)`` with each
        #: band's results (None: the general path took the band, without them)
        self.sums, self.on_sums = sums, on_sums
        if self.fresh:
            self._no_std = field_mask(pfm_file._bin_layout, "std")

    def general(self, recs) -> tuple:
        """Decoded records of a band recomputed with numpy and written by the store."""
        pfm_file, h, null32 = self.pfm, self.h, self.null32
        ub, cnt = recs["bin_index"], recs["num_soundings"]
        # soundings come back grouped by bin, in raster then chain order
        snd = pfm_file._read_chains(ub, cnt, recs["head"], fields=("depth", "validity"))
        prior_std = recs["std"].astype(np.float32)
        if self.fresh:
            prior_std = np.zeros_like(prior_std)
        stats = grouped_bin_stats(ub, cnt, snd["depth"], snd["validity"],
                                  null_depth=null32, class_type=h.class_type,
                                  prior_validity=recs["validity"], prior_std=prior_std,
                                  keep_mask=self.keep_mask)
        if self.clear_mask:
            stats["validity"] = (stats["validity"].astype(np.int64)
                                 & ~self.clear_mask).astype(np.uint32)
        if not self.compute_average:
            # the record keeps its averages (e.g. a CUBE surface): report those
            stats["avg_filtered"] = recs["avg_filtered"].astype(np.float32)
            stats["avg"] = recs["avg"].astype(np.float32)
        fields = {k: stats[k] for k in ("num_valid", "std", "min_filtered", "max_filtered",
                                         "min", "max")}
        if self.compute_average:
            fields["avg_filtered"] = stats["avg_filtered"]
            fields["avg"] = stats["avg"]
        fields["validity"] = stats["validity"].astype(np.int64)
        # Written here, on the band's thread (packing the records on the calling thread left
        # the pool idle for a third of the time): write_bin_records reads and writes back
        # between a band's first and last bin, which for the recompute's bands (runs of
        # bins in raster order) are their own; tiles' bands span other bins: their writes
        # take the lock.
        with self.lock:
            pfm_file.write_bin_records(ub, fresh=self.fresh, **fields)
        if self.on_sums is not None:
            self.on_sums(ub, None)
        return ub, stats, None, band_extrema(ub, stats, null32, self.std_max)

    def kernel(self, bidx, raw, pre=None):
        """The band's new records (a copy of ``raw`` recomputed) and the compiled pass's
        results, or None when it gave up on the band (nothing written either way); ``pre``:
        the bins' running values, summed already (:func:`._recompute_kernel._bin_steps`)."""
        h = self.h
        new = raw.copy()
        if self.fresh:
            new &= self._no_std
        got = recompute_records(self.view, new, header=h, null32=self.null32,
                                class_type=int(h.class_type), keep_mask=self.keep_mask,
                                clear_mask=self.clear_mask, compute_average=self.compute_average,
                                user_flags=_USER_FLAGS, prior_keep=PRIOR_KEEP, walk=self.walking,
                                sums=self.sums, pre=pre)
        return None if got is None else (new, got)

    def write(self, bidx, new, validity) -> None:
        """Write the band's new records and coverage bytes (the caller holds :attr:`lock`;
        the store's write-behind queue is not waited for: the caller sees to it)."""
        pfm_file = self.pfm
        write_runs(self.fd, bidx, new, pfm_file.bin_header_size, pfm_file.bin_path,
                    getattr(pfm_file, "_zero_bins", None))
        pfm_file._touch(bidx)
        update_coverage(pfm_file._fd("cvg"), bidx, validity, path=pfm_file.cvg_path,
                        fresh=self.fresh)

    def results(self, bidx, got) -> tuple:
        """``(bins, stats, walk or None, extrema candidates)`` of a band :meth:`kernel` did."""
        if self.on_sums is not None:
            self.on_sums(bidx, got[-1])
        cnt, val, f32 = got[:3]
        stats = {"num_soundings": cnt, "validity": val, "std": f32[:, 0],
                 "min_filtered": f32[:, 1], "max_filtered": f32[:, 2],
                 "min": f32[:, 3], "max": f32[:, 4]}
        return (bidx, stats, (got[3] if self.walking else None),
                band_extrema(bidx, stats, self.null32, self.std_max))

    def __call__(self, bidx, raw, pre=None) -> tuple:
        done = self.kernel(bidx, raw, pre)
        if done is None:     # something out of the ordinary: the general path says what
            return self.general(self.pfm._decode_bins(bidx, raw, fields=self.rec_fields))
        new, got = done
        self.pfm._sync()
        with self.lock:
            self.write(bidx, new, got[1])
        # the band's extrema candidates here, folded in band order by the caller
        return self.results(bidx, got)


def field_mask(layout, name) -> np.ndarray:
    """Bytes that, ANDed with a record of ``layout``, set its field ``name`` to 0 (the
    fields are packed from the most significant bit of the record's first byte on)."""
    f = layout.fields[name]
    bit = np.arange(layout.record_bytes * 8)
    keep = ~((bit >= f.offset) & (bit < f.offset + f.nbits))
    return np.packbits(keep)


#: wanted bins are :func:`scattered` when fewer than one bin in this many of the grid
SCATTERED = 64


def scattered(n_wanted: int, n_bins: int) -> bool:
    """Whether ``n_wanted`` bins of a grid of ``n_bins`` are few enough to be read one by one
    (a fine grid's few soundings) rather than by the sparse ``.bin``'s data runs."""
    return n_wanted * SCATTERED < n_bins


def _raw_bands(pfm_file, wanted: np.ndarray | None, budget: int):
    """Yield ``(bins, raw records)`` of consecutive bins with soundings (only ``wanted`` ones,
    when given) in raster order, at most ``budget`` soundings a band (a heavier bin alone): the
    records' bytes as in the ``.bin`` (a copy), for :func:`._recompute_kernel.recompute_records`.
    Only the runs of the sparse ``.bin`` that hold data are read, only records that are not all
    zero kept (:meth:`PfmFile.raw_records_with_data`); a few ``wanted`` bins scattered over a
    large grid (:func:`scattered`) are read where they are instead, records at most
    ``RMW_GAP`` bytes apart in one read: finding the data runs of the whole ``.bin`` and
    scanning them costs more than those records."""
    n_bins = pfm_file.width * pfm_file.height
    if wanted is not None and scattered(wanted.size, n_bins):
        bs, hs, fd = pfm_file.bin_record_size, pfm_file.bin_header_size, pfm_file._fd("bin")
        chunks = ((wanted[a:a + _PLAN_BINS], Spans(
            fd, hs + wanted[a:a + _PLAN_BINS] * bs, bs, max_gap=RMW_GAP, path=pfm_file.bin_path,
            what="bin record").records()) for a in range(0, wanted.size, _PLAN_BINS))
    else:
        chunks = pfm_file.raw_records_with_data(_wanted_runs(wanted, n_bins), chunk=_PLAN_BINS,
                                                only=wanted)
    for bidx, recs in chunks:
        cnt = record_fields(recs, pfm_file._bin_layout, ["num_soundings"])["num_soundings"]
        sel = np.flatnonzero(cnt > 0)
        bidx, cnt = bidx[sel], cnt[sel].astype(np.int64)
        for i, j in _cuts(cnt, budget):
            yield bidx[i:j], recs[sel[i:j]]


def _raw_jobs(pfm_file, wanted: np.ndarray | None, budget: int):
    """Yield jobs for the band threads: each, called, yields the ``(bins, raw records)``
    bands of :func:`_raw_bands` for a span of ``_PLAN_BINS`` bins of the grid (of the
    ``wanted`` ones), read on the thread that calls it; a few scattered ``wanted`` bins are
    read here instead, band by band (:func:`_raw_bands`)."""
    n_bins = pfm_file.width * pfm_file.height
    if wanted is not None and scattered(wanted.size, n_bins):
        # small bands: the caller lets their pages go after each (NdxView.scattered)
        for band in _raw_bands(pfm_file, wanted, min(budget, SCATTERED_DROP_SOUNDINGS)):
            yield (lambda band=band: iter((band,)))
        return
    for a, b in _wanted_runs(wanted, n_bins):
        for lo in range(a, b, _PLAN_BINS):
            hi = min(b, lo + _PLAN_BINS)
            only = None
            if wanted is not None:
                only = wanted[np.searchsorted(wanted, lo):np.searchsorted(wanted, hi)]
                if only.size == 0:
                    continue
            yield (lambda lo=lo, hi=hi, only=only: _span_bands(pfm_file, lo, hi, only, budget))


def _span_bands(pfm_file, lo: int, hi: int, only, budget: int):
    """The bands of :func:`_raw_bands` in bins ``lo .. hi - 1`` (of ``only``, when given)."""
    for bidx, recs in pfm_file.raw_records_with_data([(lo, hi)], chunk=hi - lo, only=only):
        cnt = record_fields(recs, pfm_file._bin_layout, ["num_soundings"])["num_soundings"]
        has = cnt > 0
        if not has.all():      # (a record with bytes but no soundings: rare)
            bidx, recs, cnt = bidx[has], recs[has], cnt[has]
        cnt = cnt.astype(np.int64)
        for i, j in _cuts(cnt, budget):
            yield bidx[i:j], recs[i:j]     # views: the band thread copies what it rewrites


def ordered_imap(fn, items, threads: int, name: str = "pfm-band"):
    """Yield ``fn(item)`` for every item, in order, ``fn`` running on up to ``threads`` threads
    (named ``name``).

    At most ``threads + 1`` results are in flight (bounded memory); the caller consumes them
    on its own thread. The first error stops the work and is raised. One thread: no pool.
    """
    threads = max(1, int(threads))
    if threads == 1:
        for item in items:
            yield fn(item)
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name) as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) > threads:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for fut in pending:
                fut.cancel()

