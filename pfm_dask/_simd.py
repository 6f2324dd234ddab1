"""Eight float32 lanes as one numba value, for kernels that must be vectorised by hand.

numba leaves LLVM's SLP vectoriser off and its loop vectoriser skips loops of fewer than 16
iterations, so a kernel that works on 8 neighbouring cells at once stays scalar. ``F8`` is an
LLVM ``<8 x float>`` (one AVX register); the intrinsics below load, store and combine such
values with plain IEEE float32 operations (no fast-math, no fused multiply-add), lane by
lane exactly as the scalar code would, and :func:`vsort_pair` runs a sorting network on the
rows of a ``(K, 8)`` array held in registers. Without AVX, LLVM splits the vectors in two.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

__all__ = ["F8", "LANES", "vload", "vstore", "vsplat", "vadd", "vsub", "vmul", "vabs",
           "vpos", "vnan_is", "vlt_select", "vsort_pair", "odd_even_merge_sort", "select_network",
           "token"]

LANES = 8
_V = ir.VectorType(ir.FloatType(), LANES)


class _F8Type(types.Type):
    def __init__(self):
        super().__init__(name="f32x8")


#: numba type of eight float32 lanes.
F8 = _F8Type()


@register_model(_F8Type)
class _F8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _V)


def _f32_array(a) -> bool:
    return isinstance(a, types.Array) and a.dtype == types.float32 and a.layout == "C"


def _lane_ptr(context, builder, arrty, arr, idx, idxty):
    a = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(a.data, [i]), _V.as_pointer())


@intrinsic
def vload(typingctx, arr, idx):
    """The 8 float32 at flat element offset ``idx`` of a C-contiguous array (no bounds check)."""
    if not (_f32_array(arr) and isinstance(idx, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_lane_ptr(context, builder, sig.args[0], args[0], args[1],
                                      sig.args[1]), align=4)
    return F8(arr, idx), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    """Store 8 lanes at flat element offset ``idx`` of a C-contiguous array (no bounds check)."""
    if not (_f32_array(arr) and isinstance(idx, types.Integer) and v == F8):
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _lane_ptr(context, builder, sig.args[0], args[0], args[1],
                                         sig.args[1]), align=4)
        return context.get_dummy_value()
    return types.void(arr, idx, v), codegen


@intrinsic
def vsplat(typingctx, x):
    """A float32 in every lane."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        v = ir.Constant(_V, ir.Undefined)
        for k in range(LANES):
            v = builder.insert_element(v, args[0], ir.Constant(ir.IntType(32), k))
        return v
    return F8(x), codegen


def _binary(op):
    @intrinsic
    def fn(typingctx, a, b):
        if not (a == F8 and b == F8):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return F8(a, b), codegen
    return fn


vadd = _binary("fadd")
vsub = _binary("fsub")
vmul = _binary("fmul")
vadd.__doc__, vsub.__doc__, vmul.__doc__ = "a + b", "a - b", "a * b"


@intrinsic
def vabs(typingctx, a):
    """|a| (clears the sign bit, as numpy's abs)."""
    if a != F8:
        return None

    def codegen(context, builder, sig, args):
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V]),
                                              "llvm.fabs.v8f32")
        return builder.call(fabs, [args[0]])
    return F8(a), codegen


@intrinsic
def vpos(typingctx, a):
    """a where a > 0, else +0 (numpy's fmax(a, 0) for a NaN, which gives 0)."""
    if a != F8:
        return None

    def codegen(context, builder, sig, args):
        zero = ir.Constant(_V, [0.0] * LANES)
        return builder.select(builder.fcmp_ordered(">", args[0], zero), args[0], zero)
    return F8(a), codegen


@intrinsic
def vnan_is(typingctx, p, a, b):
    """a in the lanes where p is NaN, b elsewhere."""
    if not (p == F8 and a == F8 and b == F8):
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_unordered("uno", args[0], args[0]), args[1], args[2])
    return F8(p, a, b), codegen


@intrinsic
def vlt_select(typingctx, x, t, a, b):
    """a in the lanes where x < t, b elsewhere."""
    if not (x == F8 and t == F8 and a == F8 and b == F8):
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered("<", args[0], args[1]), args[2], args[3])
    return F8(x, t, a, b), codegen


# ------------------------------------------------------------------------- sorting networks
def odd_even_merge_sort(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort as compare-exchange pairs ``(i, j)``, ``i < j``, for ``n`` inputs.

    Built for the next power of two and cut to ``n``: a pair reaching past the end would meet
    a +inf and leave its low side as it is, so it is dropped. After applying the pairs in
    order (the smaller value to ``i``) the inputs are ascending. The recursive order (sort each
    half, then merge) keeps neighbouring pairs together, which keeps more rows in registers
    than a layer-by-layer order of the same network.
    """
    size = 1
    while size < n:
        size *= 2
    out: list[tuple[int, int]] = []

    def merge(lo: int, hi: int, r: int) -> None:     # merge the r-strided run lo..hi (inclusive)
        step = 2 * r
        if step < hi - lo:
            merge(lo, hi, step)
            merge(lo + r, hi, step)
            out.extend((i, i + r) for i in range(lo + r, hi - r, step))
        else:
            out.append((lo, lo + r))

    def sort(lo: int, hi: int) -> None:
        if hi > lo:
            mid = (lo + hi) // 2
            sort(lo, mid)
            sort(mid + 1, hi)
            merge(lo, hi, 1)

    sort(0, size - 1)
    return [(i, j) for i, j in out if j < n]


@lru_cache(maxsize=None)
def select_network(n: int, ranks: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The compare-exchanges of :func:`odd_even_merge_sort` that decide the outputs ``ranks``.

    Walking the network backwards, a pair is kept when one of its positions is still needed;
    the rest only order positions no kept output depends on.
    """
    need, keep = set(ranks), []
    for i, j in reversed(odd_even_merge_sort(n)):
        if i in need or j in need:
            keep.append((i, j))
            need.update((i, j))
    return tuple(reversed(keep))


@intrinsic
def vsort_pair(typingctx, arr, token):
    """Order statistics ``K//2 - 1`` and ``K//2`` of each lane of the ``(K, 8)`` array ``arr``.

    ``token`` is any tuple of length K (its length, a compile-time constant, picks the
    network). The K rows are loaded into registers, run through the pruned network of
    :func:`select_network` (min and max per lane, IEEE ``<``; no NaN expected) and the two
    middle rows are returned; ``arr`` is not modified.
    """
    if not (_f32_array(arr) and isinstance(token, types.UniTuple)):
        return None
    k = token.count
    if k < 2:
        return None
    net = select_network(k, (k // 2 - 1, k // 2))

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        vals = {}

        def row(i):
            if i not in vals:
                p = builder.gep(a.data, [ir.Constant(ir.IntType(64), i * LANES)])
                vals[i] = builder.load(builder.bitcast(p, _V.as_pointer()), align=4)
            return vals[i]

        for i, j in net:
            x, y = row(i), row(j)
            lt = builder.fcmp_ordered("<", x, y)
            vals[i] = builder.select(lt, x, y)
            vals[j] = builder.select(lt, y, x)
        return context.make_tuple(builder, sig.return_type, [row(k // 2 - 1), row(k // 2)])
    return types.UniTuple(F8, 2)(arr, token), codegen


def token(k: int) -> tuple:
    """The ``token`` argument of :func:`vsort_pair` for ``K = k`` rows."""
    return (np.int8(0),) * int(k)
