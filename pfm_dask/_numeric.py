"""The PFM library's rounding and single-precision rules, as numpy functions.

The PFM I/O library stores every number as an integer code made with its
``NINT`` macro (round half away from zero), and it computes bin-record fields
and sounding offsets partly in C ``float``. A writer that wants the same codes
as the library has to round the same way at the same precision; these helpers
do that, vectorised, so the PFM and bin code never reimplement them
(PFM_NOTES 2.5, 2.7, 2.12).

Two C facts drive the details:

* ``NINT(a)`` is ``(int)(a - 0.5)`` or ``(int)(a + 0.5)``; ``0.5`` is a double
  literal, so a ``float`` argument is first widened to double (exactly), the
  half is added in double, and the cast truncates toward zero. :func:`nint`
  does the same: float32 input is widened exactly, never rounded in float32.
* ``float op float`` is computed in single precision (SSE, FLT_EVAL_METHOD 0);
  ``float op double`` is computed in double. :func:`scaled_code_f32` follows
  the library's ``(float value + float offset) * float scale`` order.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "nint",
    "nint32",
    "to_f32",
    "scaled_code_f32",
    "scaled_code_f64",
    "njit_cached",
    "CompiledKernels",
]


def nint(x) -> np.ndarray | np.int64:
    """Round half away from zero to int64, like the C library's ``NINT``.

    ``x`` may be a scalar or an array of float32 or float64 (integers are
    accepted too). The value is widened to float64 (exact for float32) and
    ``+/- 0.5`` is added in float64 before truncation, exactly as the C macro
    evaluates it. NaN and values outside the int64 range are not meaningful
    codes; they map to 0 here instead of C's undefined behaviour.
    """
    a = np.asarray(x)
    scalar = a.ndim == 0
    v = a.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        shifted = np.where(v < 0.0, v - 0.5, v + 0.5)
        ok = np.isfinite(shifted) & (np.abs(shifted) < 9.2e18)
        out = np.trunc(np.where(ok, shifted, 0.0)).astype(np.int64)
    return out[()] if scalar else out


def nint32(x) -> np.ndarray | np.int64:
    """``NINT`` including its ``(int32_t)`` cast as compiled for x86-64 (values as int64).

    The C macro converts to ``int32_t``; out-of-range values and NaN are
    undefined behaviour in C, and x86-64 (``cvttsd2si``) gives the "integer
    indefinite" value -2**31 for them. This matters only for codes that can
    exceed 2**31 - 1, e.g. a standard deviation above 2147.48 m with the
    default STD SCALE of 1e6: the library then packs 0x80000000.
    """
    a = np.asarray(x)
    scalar = a.ndim == 0
    v = a.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore"):
        shifted = np.where(v < 0.0, v - 0.5, v + 0.5)
        t = np.trunc(shifted)
        ok = np.isfinite(t) & (t >= -2.0**31) & (t <= 2.0**31 - 1)
        out = np.where(ok, t, -2.0**31).astype(np.int64)
    return out[()] if scalar else out


def to_f32(x) -> np.ndarray:
    """Round to C ``float`` (IEEE single, round-to-nearest), as an assignment to ``float`` does."""
    return np.asarray(x, dtype=np.float64).astype(np.float32)


def scaled_code_f32(value, offset, scale) -> np.ndarray | np.int64:
    """``NINT((float(value) + float(offset)) * float(scale))`` with float arithmetic.

    This is how the library codes bin-record fields (average/min/max depths,
    standard deviation, bin attributes): the value is held in a C ``float``,
    the offset and scale are ``float`` header fields, so the sum and the
    product are single-precision operations; only NINT widens to double.
    """
    v = to_f32(value)
    o = np.float32(offset)
    s = np.float32(scale)
    with np.errstate(over="ignore", invalid="ignore"):
        prod = (v + o) * s  # float32 + float32, then float32 * float32
    return nint(prod)


def scaled_code_f64(value, offset, scale) -> np.ndarray | np.int64:
    """``NINT((double(value) + offset) * scale)`` in double, with float32 header fields.

    Sounding depths are held in double by the library while DEPTH OFFSET and
    DEPTH SCALE are ``float`` header fields: ``double + float`` promotes to
    double, so the offset and scale enter as their float32 values widened to
    double. Pass plain Python floats for ``offset``/``scale`` as written in
    the header; they are rounded to float32 here as the library stores them.
    """
    v = np.asarray(value, dtype=np.float64)
    o = np.float64(np.float32(offset))
    s = np.float64(np.float32(scale))
    with np.errstate(over="ignore", invalid="ignore"):
        prod = (v + o) * s
    return nint(prod)


def njit_cached(fn, sig):
    """``fn`` compiled by numba for signature ``sig`` (nogil, numpy's error model, no fastmath:
    every double operation as written), from the on-disk cache when a cache directory is
    writable, else compiled in memory."""
    import numba

    opts = dict(nogil=True, error_model="numpy")
    try:
        return numba.njit(sig, cache=True, **opts)(fn)
    except RuntimeError as exc:  # no writable cache directory
        if "cannot cache" not in str(exc):
            raise
        return numba.njit(sig, **opts)(fn)


class CompiledKernels:
    """A module's numba kernels ``_k_<name>``, each compiled (or loaded from the on-disk cache)
    by :func:`njit_cached` on its first use, once per process, safely from several threads.

    ``namespace``: the module's ``globals()``; ``signatures(numba.types)``: ``{name: signature}``;
    ``helpers``: names of the module's plain functions that kernels call, replaced in
    ``namespace`` by their numba versions (compiled as the kernels are) before the first kernel
    compiles.
    """

    def __init__(self, namespace: dict, signatures, helpers: tuple = ()):
        import threading

        self._namespace, self._signatures, self._helpers = namespace, signatures, tuple(helpers)
        self._lock = threading.Lock()
        self._compiled: dict = {}

    def __call__(self, name: str):
        k = self._compiled.get(name)
        if k is None:
            with self._lock:
                k = self._compiled.get(name)
                if k is None:
                    import numba

                    for h in self._helpers:
                        fn = self._namespace[h]
                        if not isinstance(fn, numba.core.dispatcher.Dispatcher):
                            self._namespace[h] = numba.njit(nogil=True, error_model="numpy")(fn)
                    k = njit_cached(self._namespace["_k_" + name], self._signatures(numba.types)[name])
                    self._compiled[name] = k
        return k
