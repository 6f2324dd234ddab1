"""GSF beam flags to PFM validity, pfmLoader's beam skips and depth limits (numpy, no I/O).

See ``docs/filters.md`` section 1.
"""

from __future__ import annotations

import numpy as np

from .. import validity as V

__all__ = [
    "GSF_NULL_BEAM",
    "GSF_MANUALLY_EDITED",
    "GSF_FILTER_EDITED",
    "GSF_NOT_2X_IHO",
    "GSF_FOOTPRINT_TOO_BIG",
    "GSF_TPE_EXCEEDS_IHO",
    "GSF_NOT_1X_IHO",
    "GSF_SELECTED_LEAST",
    "GSF_SELECTED_FEATURE",
    "GSF_SELECTED_SPARE_1",
    "GSF_SELECTED_DESIGNATED",
    "GSF_FLAG_TABLE",
    "gsf_flags_to_validity",
    "beam_usable",
    "apply_depth_limits",
]

# NAVO's HMPS beam-flag codes (lib-utility navo_gsf_flags.h); docs/filters.md §1.
GSF_NULL_BEAM = 0x01            # ignore, no detection: tested by exact equality
GSF_MANUALLY_EDITED = 0x05      # ignore, manually edited
GSF_FILTER_EDITED = 0x09        # ignore, filter edited
GSF_NOT_2X_IHO = 0x21           # ignore, exceeds 2x IHO
GSF_FOOTPRINT_TOO_BIG = 0x41    # ignore, footprint too big
GSF_TPE_EXCEEDS_IHO = 0x81      # ignore, TPE exceeds IHO: NOT mapped by pfmLoader
GSF_NOT_1X_IHO = 0x10           # informational: tested as "any bit"
GSF_SELECTED_LEAST = 0x06
GSF_SELECTED_FEATURE = 0x22
GSF_SELECTED_SPARE_1 = 0x42
GSF_SELECTED_DESIGNATED = 0x82


def _build_flag_table() -> np.ndarray:
    """The PFM validity of each of the 256 GSF beam-flag bytes, as pfmLoader's gsf_to_pfm_flags.

    Every code except NOT_1X_IHO is tested as "all bits of the code present" (so 0x0D is both
    manually and filter edited; 0x07 is manually edited *and* least depth). USER_01 ("meets
    1x IHO") is set only when 0x10 is clear and none of the four ignore tests fired.
    """
    f = np.arange(256, dtype=np.uint32)

    def has(code: int) -> np.ndarray:
        return (f & code) == code

    v = np.zeros(256, dtype=np.uint32)
    v |= np.where(has(GSF_MANUALLY_EDITED), V.MANUALLY_INVAL, 0).astype(np.uint32)
    v |= np.where(has(GSF_FILTER_EDITED), V.FILTER_INVAL, 0).astype(np.uint32)
    v |= np.where(has(GSF_FOOTPRINT_TOO_BIG), V.FILTER_INVAL | V.USER_04, 0).astype(np.uint32)
    v |= np.where(has(GSF_NOT_2X_IHO), V.FILTER_INVAL | V.USER_03, 0).astype(np.uint32)
    not_1x = (f & GSF_NOT_1X_IHO) != 0
    v |= np.where(not_1x, V.USER_02, 0).astype(np.uint32)
    v |= np.where(~not_1x & ((v & V.INVAL) == 0), V.USER_01, 0).astype(np.uint32)
    v |= np.where(has(GSF_SELECTED_LEAST), V.SELECTED_SOUNDING, 0).astype(np.uint32)
    v |= np.where(has(GSF_SELECTED_FEATURE), V.SELECTED_FEATURE, 0).astype(np.uint32)
    v |= np.where(has(GSF_SELECTED_SPARE_1), V.SUSPECT, 0).astype(np.uint32)
    v |= np.where(has(GSF_SELECTED_DESIGNATED), V.DESIGNATED_SOUNDING, 0).astype(np.uint32)
    v.setflags(write=False)
    return v


#: ``GSF_FLAG_TABLE[b]`` is the PFM validity pfmLoader gives a beam whose GSF flag byte is ``b``.
GSF_FLAG_TABLE = _build_flag_table()


def gsf_flags_to_validity(beam_flags) -> np.ndarray:
    """Map GSF beam-flag bytes to PFM validity words (uint32), exactly as pfmLoader does.

    A table lookup; any integer array of values 0..255 is accepted. Beams pfmLoader skips
    (see :func:`beam_usable`) still get a value here; dropping them is the caller's job.
    """
    b = np.asarray(beam_flags)
    if b.dtype != np.uint8:
        if b.size and (b.min() < 0 or b.max() > 255):
            raise ValueError("beam flags must be bytes (0..255)")
        b = b.astype(np.uint8)
    return GSF_FLAG_TABLE[b]


def beam_usable(depth, beam_flags, has_flags, *, single_beam=None) -> np.ndarray:
    """pfmLoader's per-beam skip rules, as a boolean mask of the beams it loads.

    A beam is skipped when its depth (as a 32-bit float, which is how pfmLoader holds it) is
    0.0, when its ping carries no beam-flags array (``has_flags`` False: scalar or per beam),
    or when its flag byte is exactly 0x01 (null beam). Where ``single_beam`` is True (the
    beam is the only one of its ping) pfmLoader loads it without any of these checks.
    ``beam_flags`` values are ignored where ``has_flags`` is False.
    """
    d = np.asarray(depth)
    f = np.asarray(beam_flags)
    ok = d.astype(np.float32) != np.float32(0.0)
    ok &= np.broadcast_to(np.asarray(has_flags, dtype=bool), ok.shape)
    ok &= np.broadcast_to(f, ok.shape) != GSF_NULL_BEAM
    if single_beam is not None:
        ok |= np.broadcast_to(np.asarray(single_beam, dtype=bool), ok.shape)
    return ok


def apply_depth_limits(depth, validity, min_depth: float, max_depth: float,
                       null_depth: float):
    """Replace out-of-range depths by the null depth and flag them, as pfmLoader does.

    A depth with ``z > max_depth`` or ``z <= min_depth`` becomes ``null_depth`` (pfmLoader:
    max_depth + 1) and gets FILTER_INVAL | MODIFIED. Unlike pfmLoader, a NaN depth is also
    treated as out of range (GSF cannot encode NaN; this only guards our own callers).
    Returns new ``(depth float64, validity uint32)`` arrays; the inputs are not modified.
    """
    z = np.array(depth, dtype=np.float64, copy=True)
    v = np.array(validity, dtype=np.uint32, copy=True)
    if z.shape != v.shape:
        raise ValueError(f"depth has shape {z.shape} but validity has {v.shape}")
    out = (z > max_depth) | (z <= min_depth) | np.isnan(z)
    z[out] = null_depth
    v[out] |= np.uint32(V.FILTER_INVAL | V.MODIFIED)
    return z, v
