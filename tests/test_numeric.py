"""NINT and the single-precision coding rules, against decimal arithmetic and IEEE rounding done by hand."""

from __future__ import annotations

import struct
from decimal import ROUND_HALF_UP, Decimal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfm_dask._numeric import nint, nint32, scaled_code_f32, scaled_code_f64, to_f32


def ref_round_half_away(x: float) -> int:
    """Exact round-half-away-from-zero of the binary value (decimal's ROUND_HALF_UP is away from zero)."""
    return int(Decimal(x).quantize(Decimal(1), rounding=ROUND_HALF_UP))


def f32(x: float) -> float:
    """Round a double to IEEE single the way a C assignment to float does (via struct, not numpy)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


@pytest.mark.parametrize("x, expected", [
    (0.5, 1), (-0.5, -1), (1.5, 2), (2.5, 3), (-2.5, -3), (0.4999, 0), (-0.4999, 0),
    (0.0, 0), (-0.0, 0), (4094.5, 4095), (-4094.5, -4095), (1e15 + 0.5, 1_000_000_000_000_001),
])
def test_nint_hand_values(x, expected):
    # Python's round() is half-to-even (round(2.5) == 2); the library's NINT is half away from zero
    assert nint(x) == expected
    assert nint(np.array([x]))[0] == expected


def test_nint_types_and_shapes():
    assert isinstance(nint(1.2), np.int64)
    out = nint(np.arange(6, dtype=np.float32).reshape(2, 3) + np.float32(0.5))
    assert out.dtype == np.int64 and out.shape == (2, 3)
    assert out.tolist() == [[1, 2, 3], [4, 5, 6]]


def test_nint_float32_is_widened_not_rounded_in_single():
    # 0.49999997f + 0.5f is 1.0 in float arithmetic, but C adds the double literal 0.5 in double
    x = np.float32(0.49999997)
    assert float(x) + 0.5 < 1.0
    assert (x + np.float32(0.5)) == np.float32(1.0)  # what float32 arithmetic would do
    assert nint(x) == 0
    assert nint(np.array([x, -x], dtype=np.float32)).tolist() == [0, 0]


def test_nint_double_follows_c_not_exact_rounding():
    # (int)(0.49999999999999994 + 0.5): the double sum rounds to 1.0, so the C macro gives 1
    x = 0.49999999999999994
    assert ref_round_half_away(x) == 0
    assert nint(x) == 1


def test_nint_nan_and_inf_are_zero():
    assert nint(np.array([np.nan, np.inf, -np.inf])).tolist() == [0, 0, 0]


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-1e12, max_value=1e12, allow_nan=False))
def test_nint_matches_decimal_reference(x):
    # away from binade-crossing sums (where the C double addition itself rounds), NINT is exact rounding
    exact = Decimal(x) + Decimal(0.5) if x >= 0 else Decimal(x) - Decimal(0.5)
    approx = x + 0.5 if x >= 0 else x - 0.5
    if Decimal(approx) == exact:
        assert nint(x) == ref_round_half_away(x)
        assert nint(np.float64(x)) == ref_round_half_away(x)


def test_to_f32_matches_struct():
    vals = [0.1, 1.005, 12000.01, -9999.99, 3.4e38]
    assert [float(v) for v in to_f32(vals)] == [f32(v) for v in vals]


def test_scaled_code_f32_hand_case_differs_from_double():
    # 1.005 * 100: in double 100.49999999999999 -> 100; in float 1.005f*100f rounds to 100.5f -> 101
    assert scaled_code_f64(1.005, 0.0, 100.0) == 100
    assert scaled_code_f32(1.005, 0.0, 100.0) == 101


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-10000.0, max_value=12000.0, allow_nan=False),
       st.sampled_from([(10000.0, 100.0), (10000.0, 1000.0), (0.0, 1.0e6), (500.0, 10.0)]))
def test_scaled_code_f32_matches_hand_ieee(value, off_scale):
    offset, scale = off_scale
    # float + float: the exact sum of two singles of this size fits a double; round it to single
    s = f32(f32(value) + f32(offset))
    p = f32(s * f32(scale))  # the product of two singles is exact in double; round to single
    assert scaled_code_f32(value, offset, scale) == ref_round_half_away(p)


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-10000.0, max_value=12000.0, allow_nan=False))
def test_scaled_code_f64_matches_reference(value):
    p = (value + f32(10000.0)) * f32(100.0)
    exact = Decimal(p) + (Decimal(0.5) if p >= 0 else -Decimal(0.5))
    if Decimal(p + 0.5 if p >= 0 else p - 0.5) == exact:
        assert scaled_code_f64(value, 10000.0, 100.0) == ref_round_half_away(p)


def test_nint32_matches_x86_int32_conversion():
    # in range it is NINT; beyond int32 (or NaN) x86-64's cvttsd2si yields 0x80000000
    assert nint32(np.array([2.5, -2.5, 2147483646.6, 2147483647.4])).tolist() == [3, -3, 2147483647, 2147483647]
    assert nint32(np.array([2147483647.5, 3e9, -2147483648.6, np.nan])).tolist() == [-2**31] * 4
    assert nint32(-2147483648.4) == -2**31


# ---------------------------------------------------------------------------- the compile helper
def test_every_kernel_is_compiled_by_the_one_helper():
    """No module but ``_numeric`` calls numba's compilers (``njit``, ``jit``, ``vectorize``,
    ``cfunc``...): every kernel goes through ``njit_cached``/``njit_helper``/``CompiledKernels``,
    so the options, the cache and its fallback are decided in one place."""
    import ast
    from pathlib import Path

    compilers = {"njit", "jit", "vectorize", "guvectorize", "cfunc", "generated_jit", "stencil"}
    pkg = Path(__file__).resolve().parents[1] / "pfm_dask"
    bad = []
    for path in sorted(pkg.rglob("*.py")):
        if path.name == "_numeric.py" and path.parent == pkg:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in compilers and \
                    isinstance(node.value, ast.Name) and node.value.id == "numba":
                bad.append(f"{path.relative_to(pkg)}:{node.lineno} numba.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module == "numba":
                bad += [f"{path.relative_to(pkg)}:{node.lineno} from numba import {a.name}"
                        for a in node.names if a.name in compilers]
    assert not bad, "compile through pfm_dask._numeric instead: " + ", ".join(bad)


def test_helper_options_and_refcount_switch():
    """Kernels get the package's options; ``refcounts=False`` turns numba's reference counting
    off where numba has the switch; a module's override wins."""
    import numba

    from pfm_dask._numeric import JIT_OPTIONS, njit_cached, njit_helper

    def add(a, b):
        return a + b

    k = njit_cached(add, numba.float64(numba.float64, numba.float64))
    assert k(1.0, 2.0) == 3.0
    for key, value in JIT_OPTIONS.items():
        assert k.targetoptions[key] == value
    k2 = njit_cached(add, numba.int64(numba.int64, numba.int64), refcounts=False, error_model="python")
    assert k2.targetoptions["error_model"] == "python"
    assert k2.targetoptions.get("_nrt", False) is False
    h = njit_helper(inline="always")(add)
    assert h.targetoptions["inline"] == "always" and h.targetoptions["nogil"] is True
