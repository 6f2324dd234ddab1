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
"""

from __future__ import annotations

import os
import threading

import numpy as np

from ..errors import PfmFormatError
from . import validity as V

__all__ = [
    "PRIOR_KEEP",
    "EXTREMA_START",
    "compute_bin_stats",
    "grouped_bin_stats",
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


def _k_chain_sums(z, filt, used, start, counts, out):
    """numba kernel: per group, left to right from 0.0, the sums of ``zf``, ``zf * zf`` and
    ``zu`` (``zf`` = the depth where ``filt`` else 0.0, ``zu`` likewise with ``used``)."""
    for g in range(start.size):
        a = 0.0
        b = 0.0
        c = 0.0
        i0 = start[g]
        for i in range(i0, i0 + counts[g]):
            zf = z[i] if filt[i] else 0.0
            zu = z[i] if used[i] else 0.0
            a += zf
            b += zf * zf
            c += zu
        out[g, 0] = a
        out[g, 1] = b
        out[g, 2] = c


_KERNEL_LOCK = threading.Lock()
_KERNELS: dict = {}


def _kernel(name: str):
    """The numba-compiled ``_k_<name>`` (compiled, or loaded from the on-disk cache, on first use).

    Compiled without fastmath, so every addition and multiplication is the
    plain IEEE double operation in the order written (no reassociation, no
    fused multiply-add): the sums are the library's running sums exactly.
    ``nogil``: the recompute's and the check's threads run in parallel.
    """
    k = _KERNELS.get(name)
    if k is None:
        with _KERNEL_LOCK:
            k = _KERNELS.get(name)
            if k is None:
                import numba

                T = numba.types
                ro = dict(readonly=True)
                sigs = {"chain_sums": T.void(T.Array(T.float64, 1, "C", **ro), T.Array(T.bool_, 1, "C", **ro),
                                             T.Array(T.bool_, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro),
                                             T.Array(T.int64, 1, "C", **ro), T.Array(T.float64, 2, "C"))}
                fn = globals()["_k_" + name]
                try:
                    k = numba.njit(sigs[name], nogil=True, cache=True)(fn)
                except RuntimeError as exc:  # no writable cache directory
                    if "cannot cache" not in str(exc):
                        raise
                    k = numba.njit(sigs[name], nogil=True)(fn)
                _KERNELS[name] = k
    return k


def _chain_sums(z: np.ndarray, filt: np.ndarray, used: np.ndarray, start: np.ndarray,
                counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group: the sums of filtered depths, of their squares and of used depths.

    The library keeps running double sums in chain order; ``np.add.reduceat``
    sums pairwise and differs from that in the last bit often enough to change
    a packed standard deviation. Each group (contiguous, ``counts`` > 0) is
    summed left to right from 0.0, masked-out members adding 0.0, by a small
    numba kernel (:func:`_k_chain_sums`).
    """
    out = np.empty((len(start), 3), dtype=np.float64)
    if len(start):
        _kernel("chain_sums")(np.ascontiguousarray(z, dtype=np.float64),
                              np.ascontiguousarray(filt, dtype=bool),
                              np.ascontiguousarray(used, dtype=bool),
                              np.ascontiguousarray(start, dtype=np.int64),
                              np.ascontiguousarray(counts, dtype=np.int64), out)
    return out[:, 0], out[:, 1], out[:, 2]


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
                      prior_validity=None, keep_mask=0, prior_std=None) -> dict:
    """:func:`compute_bin_stats` for soundings already grouped by bin.

    ``bins`` (increasing) and ``counts`` (all > 0) describe consecutive runs of
    ``depth``/``validity``: the first ``counts[0]`` soundings belong to
    ``bins[0]``, and so on, each run in chain order. This is how chains come
    back from the store, so the recompute and the check skip the sort and
    the search for bin boundaries. Same arguments and result otherwise.
    """
    uniq = np.asarray(bins)
    counts = np.asarray(counts, dtype=np.int64)
    z = np.asarray(depth, dtype=np.float64)
    v = np.asarray(validity).astype(np.int64, copy=False)
    class_type = int(class_type)
    if not 0 <= class_type <= 10:
        raise PfmFormatError(f"CLASS TYPE must be 0..10, got {class_type}")
    if uniq.shape != counts.shape or int(counts.sum()) != len(z) or len(z) != len(v) or \
            (counts.size and counts.min() <= 0):
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

    is_ref = (v & V.REFERENCE) != 0
    used = ((v & (V.DELETED | V.REFERENCE)) == 0) & (z < null64)
    filt = used & ((v & V.INVAL) == 0)
    if class_type:
        filt &= (v & _USER_FLAGS[class_type - 1]) != 0

    n_valid = np.add.reduceat(filt, start, dtype=np.int64)
    n_used = np.add.reduceat(used, start, dtype=np.int64)

    sum_f, sum2_f, sum_u = _chain_sums(z, filt, used, start, counts)

    with np.errstate(invalid="ignore", divide="ignore"):
        min_f = np.minimum.reduceat(np.where(filt, z, np.inf), start)
        max_f = np.maximum.reduceat(np.where(filt, z, -np.inf), start)
        min_u = np.minimum.reduceat(np.where(used, z, np.inf), start)
        max_u = np.maximum.reduceat(np.where(used, z, -np.inf), start)
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

    from_soundings = np.bitwise_or.reduceat(np.where(used, v & (V.VAL_MASK ^ keep_mask), 0), start)
    any_ref = np.logical_or.reduceat(is_ref, start)
    word = (prior & PRIOR_KEEP) | (prior & keep_mask) | from_soundings
    word |= np.where(any_ref, V.REFERENCE, 0)
    word = np.where(has_valid, word | V.DATA, word & ~V.DATA)
    out["validity"] = (word & V.VAL_MASK).astype(np.uint32)
    return out


# ---------------------------------------------------------------------------
# Recompute of an open PfmFile, by bands, with pfmLoader's header extrema.

#: pfmLoader's starting values for the header extrema of a new PFM; they stay in
#: the header when no bin qualifies. Keys are :class:`PfmHeader` field names.
EXTREMA_START = {
    "min_filtered_depth": 9999999.0, "max_filtered_depth": -9999999.0,
    "min_filtered_coord": (0, 0), "max_filtered_coord": (0, 0),
    "min_depth": 9999999.0, "max_depth": -9999999.0,
    "min_coord": (0, 0), "max_coord": (0, 0),
    "min_bin_count": 9999999, "max_bin_count": 0,
    "min_count_coord": (0, 0), "max_count_coord": (0, 0),
    "min_standard_deviation": 9999999.0, "max_standard_deviation": -9999999.0,
}

#: Soundings per band of :func:`recompute` (about 100 bytes each while a band is worked on).
BAND_SOUNDINGS = 2_000_000
#: Default thread count of :func:`recompute` and of the check's band pipeline.
THREADS = min(4, os.cpu_count() or 1)
#: Bin records read at once while planning bands.
_PLAN_BINS = 1 << 20

_AVERAGE_NAMES = ("Average Filtered Depth", "Average Edited")


class _Extrema:
    """pfmLoader's running header extrema: strict comparisons in raster order."""

    def __init__(self, start: dict | None, width: int):
        self.v = dict(EXTREMA_START)
        if start:
            unknown = set(start) - set(EXTREMA_START)
            if unknown:
                raise ValueError(f"unknown extrema keys {sorted(unknown)}")
            self.v.update(start)
        self.width = width

    def _coord(self, b) -> tuple[int, int]:
        return (int(b % self.width), int(b // self.width))

    def _take(self, vals, bidx, key, coord_key, lower: bool) -> None:
        if vals.size == 0:
            return
        j = int(np.argmin(vals) if lower else np.argmax(vals))  # first occurrence = raster order
        x = vals[j]
        cur = self.v[key]
        if (x < cur) if lower else (x > cur):
            self.v[key] = x.item()
            if coord_key:
                self.v[coord_key] = self._coord(bidx[j])

    def update(self, bidx, stats, null32) -> None:
        """Fold in a band of recomputed bins (``bidx`` ascending, ``stats`` float32 values)."""
        cnt = stats["num_soundings"].astype(np.int64)
        self._take(cnt, bidx, "min_bin_count", "min_count_coord", True)
        self._take(cnt, bidx, "max_bin_count", "max_count_coord", False)
        # pfmLoader: bin max depth (float) < max_depth + 1.0, i.e. below NULL DEPTH
        ok = stats["max"].astype(np.float64) < float(null32)
        data = ok & ((stats["validity"].astype(np.int64) & V.DATA) != 0)
        self._take(stats["min_filtered"][data], bidx[data], "min_filtered_depth",
                   "min_filtered_coord", True)
        self._take(stats["max_filtered"][data], bidx[data], "max_filtered_depth",
                   "max_filtered_coord", False)
        std = stats["std"][data].astype(np.float64)  # header std extrema are doubles
        self._take(std, bidx[data], "min_standard_deviation", None, True)
        self._take(std, bidx[data], "max_standard_deviation", None, False)
        self._take(stats["min"][ok], bidx[ok], "min_depth", "min_coord", True)
        self._take(stats["max"][ok], bidx[ok], "max_depth", "max_coord", False)

    def result(self) -> dict:
        out = {}
        for k, v in self.v.items():
            if isinstance(v, tuple):
                out[k] = (int(v[0]), int(v[1]))
            elif k.endswith("bin_count"):
                out[k] = int(v)
            else:
                out[k] = float(v)
        return out


def _plan_bands(pfm_file, want_rows: np.ndarray | None, rows_per_band: int | None,
                budget: int):
    """Yield (row0, row1, col0, col1) rectangles holding at most ~``budget`` soundings.

    Counts come from the bin records (read ``_PLAN_BINS`` at a time); rows are
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
        cnt = pfm_file.read_bin_records(r0, r1)["num_soundings"].reshape(r1 - r0, W)
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


def recompute(pfm_file, bin_index=None, *, rows=None, keep_mask: int = 0, clear_mask: int = 0,
              extrema: dict | None = None, band_soundings: int = BAND_SOUNDINGS,
              threads: int | None = None) -> dict:
    """Recompute bins of an open (``"r+"``) :class:`PfmFile` and return the header extrema.

    ``bin_index``: the bins to recompute (``row * width + col``), or ``None``
    for every bin with soundings. Work goes by bands of rows (``rows`` rows per
    band, or as many as hold about ``band_soundings`` soundings): read the
    band's bin records and soundings, :func:`compute_bin_stats` with the
    records' validity and std as the prior values, write the records back and
    update the ``.cvg``. ``keep_mask`` is the library's recompute mask (0 as in
    pfmLoader); ``clear_mask`` bits are cleared from the new validity (pfmLoader
    clears CHECKED | VERIFIED on an append; here the coverage map follows).

    ``threads`` (default :data:`THREADS`) bands are read and computed at once
    on a thread pool (numpy and ``os.pread`` release the GIL); the records are
    written and the extrema folded in band order on the calling thread, so the
    result does not depend on the thread count.

    Returns pfmLoader's header extrema over the recomputed bins, in raster
    order from ``extrema`` (default :data:`EXTREMA_START`), as a dict of
    :class:`PfmHeader` field names ready for ``pfm_file.write_header(**...)``.
    Bins whose max depth is not below NULL DEPTH are left out, as pfmLoader
    does. The averages are only rewritten while ``[AVERAGE FILTERED NAME]`` is
    one the library recomputes.
    """
    h = pfm_file.header
    W = pfm_file.width
    null32 = np.float32(pfm_file.null_depth)
    compute_average = h.average_filtered_name in _AVERAGE_NAMES
    ext = _Extrema(extrema, W)
    wanted = None
    want_rows = None
    if bin_index is not None:
        wanted = np.unique(np.asarray(bin_index, dtype=np.int64).ravel())
        if wanted.size == 0:
            return ext.result()
        if wanted[0] < 0 or wanted[-1] >= W * pfm_file.height:
            raise PfmFormatError(f"bin_index outside 0..{W * pfm_file.height - 1}", path=pfm_file.path)
        want_rows = np.unique(wanted // W)

    def bands():
        for r0, r1, c0, c1 in _plan_bands(pfm_file, want_rows, rows, int(band_soundings)):
            band_bins = None
            if wanted is not None:
                lo, hi = np.searchsorted(wanted, [r0 * W, r1 * W])
                band_bins = wanted[lo:hi]
                band_bins = band_bins[((band_bins % W) >= c0) & ((band_bins % W) < c1)]
                if band_bins.size == 0:
                    continue
                cols = band_bins % W
                c0, c1 = int(cols.min()), int(cols.max()) + 1
            yield r0, r1, c0, c1, band_bins

    def compute(band):
        r0, r1, c0, c1, band_bins = band
        recs = pfm_file.read_bin_records(r0, r1, c0, c1)
        cnt = recs["num_soundings"]
        if band_bins is not None:
            w = np.zeros(cnt.size, dtype=bool)
            w[(band_bins // W - r0) * (c1 - c0) + band_bins % W - c0] = True
            cnt = np.where(w, cnt, 0)
        has = np.flatnonzero(cnt > 0)
        if has.size == 0:
            return None
        ub, cnt = recs["bin_index"][has], cnt[has]
        # soundings come back grouped by bin, in raster then chain order
        snd = pfm_file._read_chains(ub, cnt, recs["head"][has], fields=("depth", "validity"))
        stats = grouped_bin_stats(ub, cnt, snd["depth"], snd["validity"],
                                  null_depth=null32, class_type=h.class_type,
                                  prior_validity=recs["validity"][has],
                                  prior_std=recs["std"][has].astype(np.float32),
                                  keep_mask=keep_mask)
        if clear_mask:
            stats["validity"] = (stats["validity"].astype(np.int64) & ~int(clear_mask)).astype(np.uint32)
        if not compute_average:
            # the record keeps its averages (e.g. a CUBE surface): report those
            stats["avg_filtered"] = recs["avg_filtered"][has].astype(np.float32)
            stats["avg"] = recs["avg"][has].astype(np.float32)
        return ub, stats

    def store(result) -> None:
        if result is None:
            return
        ub, stats = result
        fields = {k: stats[k] for k in ("num_valid", "std", "min_filtered", "max_filtered",
                                         "min", "max")}
        if compute_average:
            fields["avg_filtered"] = stats["avg_filtered"]
            fields["avg"] = stats["avg"]
        fields["validity"] = stats["validity"].astype(np.int64)
        pfm_file.write_bin_records(ub, **fields)
        ext.update(ub, stats, null32)

    _ordered_map(compute, bands(), store, THREADS if threads is None else threads)
    return ext.result()


def _ordered_map(fn, items, consume, threads: int) -> None:
    """``consume(fn(item))`` for every item, in order; ``fn`` runs on up to ``threads`` threads.

    At most ``threads + 1`` results are in flight (bounded memory); ``consume``
    runs on the calling thread. The first error stops the work and is raised.
    """
    threads = max(1, int(threads))
    if threads == 1:
        for item in items:
            consume(fn(item))
        return
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pfm-band") as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) > threads:
                    consume(pending.popleft().result())
            while pending:
                consume(pending.popleft().result())
        finally:
            for fut in pending:
                fut.cancel()
