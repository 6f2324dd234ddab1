"""The header's summary (extrema) when ABE tools have edited a PFM: stale is not broken.

pfmLoader writes the header's extrema (minimum and maximum filtered depth,
depth, standard deviation and bin count, with their bins) once, after its
final recompute. pfmEdit3D never rewrites them after an edit, and the PFM
library's append updates them only from the bins it touched: a PFM edited in
ABE keeps a summary that no longer matches its bins (``[MAX FILTERED DEPTH]
= 1908.28 but the bins give 1907.78``; a maximum bin count whose bin is not
the first, in raster order, to reach it). Nothing reads the summary to find
data, so such a summary is *stale*: ``check`` reports it under the part
:data:`STALE_PART` and the command line lists it as a warning, an error only
with ``--strict``. A summary that could not have been right for this file
at any time (not a number, outside the header's depth coding, minimum above
maximum, a bin outside the grid) stays an error under ``"header"``.
"""

from __future__ import annotations

import math

__all__ = ["STALE_PART", "summary_part", "split_stale"]

#: the ``Problem.part`` of a disagreement between a well-formed summary and the bins
STALE_PART = "header summary"


def _well_formed(h) -> bool:
    """Could this summary have been written for this file (types, ranges, order, bins)?"""
    lo_depth = -float(h.depth_offset) - 1.0 / float(h.depth_scale)
    hi_depth = float(h.null_depth)
    pairs = [(h.min_filtered_depth, h.max_filtered_depth), (h.min_depth, h.max_depth)]
    for lo, hi in pairs:
        lo, hi = float(lo), float(hi)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo <= hi):
            return False
        if lo < lo_depth or hi > hi_depth:
            return False
    s_lo, s_hi = float(h.min_standard_deviation), float(h.max_standard_deviation)
    if not (math.isfinite(s_lo) and math.isfinite(s_hi) and 0.0 <= s_lo <= s_hi):
        return False
    c_lo, c_hi = int(h.min_bin_count), int(h.max_bin_count)
    if not 0 <= c_lo <= c_hi < (1 << int(h.count_bits)):
        return False
    W, H = int(h.bin_width), int(h.bin_height)
    for c in (h.min_filtered_coord, h.max_filtered_coord, h.min_coord, h.max_coord,
              h.min_count_coord, h.max_count_coord):
        x, y = (int(v) for v in c)
        if not (0 <= x < W and 0 <= y < H):
            return False
    return True


def summary_part(h) -> str:
    """The part a summary-against-bins disagreement is filed under: :data:`STALE_PART` when
    the header's summary is well formed (stale, as ABE leaves it), else ``"header"``."""
    return STALE_PART if _well_formed(h) else "header"


def split_stale(problems: list, *, strict: bool = False) -> tuple[list, list]:
    """``(errors, warnings)`` of a check: stale-summary problems are warnings unless
    ``strict``."""
    if strict:
        return list(problems), []
    warn = [p for p in problems if getattr(p, "part", None) == STALE_PART]
    return [p for p in problems if getattr(p, "part", None) != STALE_PART], warn
