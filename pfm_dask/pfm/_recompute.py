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

import numpy as np

from ..errors import PfmFormatError
from . import validity as V

__all__ = [
    "PRIOR_KEEP",
    "compute_bin_stats",
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


def _sequential_group_sums(values: np.ndarray, start: np.ndarray,
                           counts: np.ndarray) -> np.ndarray:
    """Sum ``values`` (N, k) over contiguous groups, left to right, in double.

    ``np.add.reduceat`` sums pairwise, which differs from the library's running
    sum in the last bit often enough to change a packed standard deviation.
    Here the loop runs over the position within a group (chain depth), adding
    the j-th member of every group that has one: the order of additions inside
    each group is exactly the chain order, and the work stays O(N).
    """
    n_groups = len(start)
    out = np.zeros((n_groups,) + values.shape[1:], dtype=np.float64)
    if n_groups == 0:
        return out
    by_size = np.argsort(-counts, kind="stable")
    sizes = counts[by_size]
    starts = start[by_size]
    acc = np.zeros_like(out)
    # active[j] = number of groups with more than j members (a prefix of by_size).
    neg = -sizes
    for j in range(int(sizes[0])):
        m = int(np.searchsorted(neg, -j, side="left"))  # groups with size > j
        if m == 0:
            break
        acc[:m] += values[starts[:m] + j]
    out[by_size] = acc
    return out


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
    keep_mask = int(keep_mask)
    null32 = np.float32(null_depth)
    null64 = float(null32)

    order = np.argsort(bin_index, kind="stable")
    b = bin_index[order]
    z = depth[order]
    v = vals[order]
    if len(b):
        first = np.ones(len(b), dtype=bool)
        first[1:] = b[1:] != b[:-1]
        start = np.flatnonzero(first)
    else:
        start = np.zeros(0, dtype=np.int64)
    uniq = b[start]
    n_bins = len(start)
    counts = np.diff(np.append(start, len(b)))

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

    n_valid = np.add.reduceat(filt.astype(np.int64), start)
    n_used = np.add.reduceat(used.astype(np.int64), start)

    zf = np.where(filt, z, 0.0)
    zu = np.where(used, z, 0.0)
    sums = _sequential_group_sums(np.stack([zf, zf * zf, zu], axis=1), start, counts)
    sum_f, sum2_f, sum_u = sums[:, 0], sums[:, 1], sums[:, 2]

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
