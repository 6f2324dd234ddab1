"""Sounding filters: GSF beam flags to PFM validity, the per-file swath filter, the area filter.

Plain numpy and numba kernels, no file I/O and no Dask. The loader calls
:func:`gsf_flags_to_validity`, :func:`beam_usable`, :func:`apply_depth_limits` and
:func:`swath_filter` in its per-file tasks, and drives :class:`AreaFilter` row by row
on the writer as the last step. See ``docs/filters.md``.

Modules: ``_flags`` (flag mapping, skips, depth limits), ``_swath`` (the swath filter's
interface) with its kernel ``_swath_kernel`` and vector types ``_simd``, ``_area`` (the area
filter).
"""

from ._flags import *  # noqa: F401,F403
from ._flags import __all__ as _flags_all
from ._swath import SwathStats, score_against_truth, spike_mask, swath_filter, swath_halo
from ._area import AreaFilter, AreaFilterSummary, RowResult, RowSoundings

__all__ = [
    *_flags_all,
    "swath_filter",
    "swath_halo",
    "SwathStats",
    "score_against_truth",
    "spike_mask",
    "AreaFilter",
    "AreaFilterSummary",
    "RowSoundings",
    "RowResult",
]
