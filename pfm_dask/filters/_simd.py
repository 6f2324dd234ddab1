"""Float vectors as numba values (8 x float32, 4 x float64), for kernels vectorised by hand.

numba leaves LLVM's SLP vectoriser off and its loop vectoriser skips loops of fewer than 16
iterations, so a kernel that works on 8 neighbouring cells at once stays scalar. ``F8`` is an
LLVM ``<8 x float>`` and ``D4`` a ``<4 x double>`` (one AVX register each); the intrinsics
below load, store, convert and combine them with plain IEEE operations (no fast-math, no
fused multiply-add), lane by lane exactly as scalar code would; :func:`vsort_pair` runs
a sorting network on the rows of a ``(K, 8)`` float32 array held in registers, and
:func:`vsort_rows` on K rows scattered over a flat array. Without AVX, LLVM splits the
vectors in two.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic, models, register_model

__all__ = ["F8", "D4", "LANES", "vload", "vstore", "vsplat", "vadd", "vsub", "vmul", "vdiv",
           "vabs", "vpos", "vnan_is", "vlt_select", "vgt0_select", "vnanmax", "vwiden",
           "vnarrow", "vsort_pair", "vsort_rows", "odd_even_merge_sort", "pairwise_sort",
           "select_network", "token"]

LANES = 8
_I32 = ir.IntType(32)


class _VecType(types.Type):
    def __init__(self, dtype, lanes):
        self.dtype, self.lanes = dtype, lanes
        super().__init__(name=f"{dtype}x{lanes}")

    @property
    def key(self):
        return self.dtype, self.lanes


#: numba type of eight float32 lanes, and of four float64 lanes.
F8 = _VecType(types.float32, 8)
D4 = _VecType(types.float64, 4)


def _ll(vt) -> ir.VectorType:
    return ir.VectorType(ir.FloatType() if vt.dtype == types.float32 else ir.DoubleType(),
                         vt.lanes)


@register_model(_VecType)
class _VecModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _ll(fe_type))


def _vec_of_array(arr):
    """The vector type loaded from a C-contiguous float32 / float64 array, else None."""
    if isinstance(arr, types.Array) and arr.layout == "C":
        return {types.float32: F8, types.float64: D4}.get(arr.dtype)
    return None


def _lane_ptr(context, builder, arrty, arr, idx, idxty):
    a = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return builder.bitcast(builder.gep(a.data, [i]), _ll(_vec_of_array(arrty)).as_pointer())


@intrinsic
def vload(typingctx, arr, idx):
    """The lanes at flat element offset ``idx`` of a C-contiguous float array (no bounds check)."""
    vt = _vec_of_array(arr)
    if vt is None or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.load(_lane_ptr(context, builder, sig.args[0], args[0], args[1],
                                      sig.args[1]), align=vt.dtype.bitwidth // 8)
    return vt(arr, idx), codegen


@intrinsic
def vstore(typingctx, arr, idx, v):
    """Store lanes at flat element offset ``idx`` of a C-contiguous array (no bounds check)."""
    vt = _vec_of_array(arr)
    if vt is None or not isinstance(idx, types.Integer) or v != vt:
        return None

    def codegen(context, builder, sig, args):
        builder.store(args[2], _lane_ptr(context, builder, sig.args[0], args[0], args[1],
                                         sig.args[1]), align=vt.dtype.bitwidth // 8)
        return context.get_dummy_value()
    return types.void(arr, idx, v), codegen


@intrinsic
def vsplat(typingctx, x):
    """A float32 in each of 8 lanes, or a float64 in each of 4."""
    vt = {types.float32: F8, types.float64: D4}.get(x)
    if vt is None:
        return None

    def codegen(context, builder, sig, args):
        v = ir.Constant(_ll(vt), ir.Undefined)
        for k in range(vt.lanes):
            v = builder.insert_element(v, args[0], ir.Constant(_I32, k))
        return v
    return vt(x), codegen


def _same(*tys) -> bool:
    return isinstance(tys[0], _VecType) and all(t == tys[0] for t in tys)


def _binary(op, doc):
    @intrinsic
    def fn(typingctx, a, b):
        if not _same(a, b):
            return None

        def codegen(context, builder, sig, args):
            return getattr(builder, op)(args[0], args[1])
        return a(a, b), codegen
    fn.__doc__ = doc
    return fn


vadd = _binary("fadd", "a + b")
vsub = _binary("fsub", "a - b")
vmul = _binary("fmul", "a * b")
vdiv = _binary("fdiv", "a / b")


@intrinsic
def vabs(typingctx, a):
    """|a| (clears the sign bit, as numpy's abs)."""
    if not _same(a):
        return None

    def codegen(context, builder, sig, args):
        vt = _ll(a)
        name = f"llvm.fabs.v{a.lanes}f{a.dtype.bitwidth}"
        fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt]), name)
        return builder.call(fabs, [args[0]])
    return a(a), codegen


@intrinsic
def vpos(typingctx, a):
    """a where a > 0, else +0 (numpy's fmax(a, 0) for a NaN, which gives 0)."""
    if not _same(a):
        return None

    def codegen(context, builder, sig, args):
        zero = ir.Constant(_ll(a), [0.0] * a.lanes)
        return builder.select(builder.fcmp_ordered(">", args[0], zero), args[0], zero)
    return a(a), codegen


@intrinsic
def vgt0_select(typingctx, x, a, b):
    """a in the lanes where x > 0, b elsewhere (and where x is NaN)."""
    if not _same(x, a, b):
        return None

    def codegen(context, builder, sig, args):
        zero = ir.Constant(_ll(x), [0.0] * x.lanes)
        return builder.select(builder.fcmp_ordered(">", args[0], zero), args[1], args[2])
    return x(x, a, b), codegen


@intrinsic
def vnan_is(typingctx, p, a, b):
    """a in the lanes where p is NaN, b elsewhere."""
    if not _same(p, a, b):
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_unordered("uno", args[0], args[0]), args[1], args[2])
    return p(p, a, b), codegen


@intrinsic
def vlt_select(typingctx, x, t, a, b):
    """a in the lanes where x < t, b elsewhere."""
    if not _same(x, t, a, b):
        return None

    def codegen(context, builder, sig, args):
        return builder.select(builder.fcmp_ordered("<", args[0], args[1]), args[2], args[3])
    return x(x, t, a, b), codegen


@intrinsic
def vnanmax(typingctx, a, b):
    """numpy's maximum lane by lane: NaN where either is NaN, else the larger."""
    if not _same(a, b):
        return None

    def codegen(context, builder, sig, args):
        x, y = args
        big = builder.select(builder.fcmp_ordered(">=", x, y), x, y)
        big = builder.select(builder.fcmp_unordered("uno", y, y), y, big)
        return builder.select(builder.fcmp_unordered("uno", x, x), x, big)
    return a(a, b), codegen


@intrinsic
def vwiden(typingctx, v, half):
    """Lanes 0-3 (``half`` 0) or 4-7 (``half`` 1) of an F8, exactly, as a D4."""
    if not (v == F8 and isinstance(half, types.IntegerLiteral) and half.literal_value in (0, 1)):
        return None
    h = half.literal_value

    def codegen(context, builder, sig, args):
        part = builder.shuffle_vector(args[0], ir.Constant(_ll(F8), ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, 4),
                                                  [4 * h + k for k in range(4)]))
        return builder.fpext(part, _ll(D4))
    return D4(v, half), codegen


@intrinsic
def vnarrow(typingctx, lo, hi):
    """Two D4 rounded to float32 (round to nearest, as numpy's astype) and joined as one F8."""
    if not (lo == D4 and hi == D4):
        return None

    def codegen(context, builder, sig, args):
        v4 = ir.VectorType(ir.FloatType(), 4)
        a, b = builder.fptrunc(args[0], v4), builder.fptrunc(args[1], v4)
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 8), list(range(8))))
    return F8(lo, hi), codegen


# ------------------------------------------------------------------------- sorting networks
def odd_even_merge_sort(n: int) -> list[tuple[int, int]]:
    """Batcher's odd-even merge sort for ``n`` inputs as compare-exchange pairs ``(i, j)``, i < j.

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


def pairwise_sort(n: int) -> list[tuple[int, int]]:
    """Parberry's pairwise sorting network for ``n`` inputs as compare-exchange pairs ``(i, j)``.

    Built for the next power of two and cut to ``n`` (as :func:`odd_even_merge_sort`). First
    the inputs are sorted in pairs, then pairs of pairs, ... (a comparator ``(b - a, b)`` for
    each block size ``a``); then, from the largest block size down, each wire is compared
    with the ones ``d * a`` below it for ``d`` = 2^k - 1, ..., 3, 1, which merges the sorted
    blocks. Same size as Batcher's network, but more of its comparators can be pruned when only
    the middle outputs are wanted (239 instead of 281 for the 44 neighbours of a 5 x 9 window).
    """
    out: list[tuple[int, int]] = []
    a = 1
    while a < n:                         # sort pairs, then pairs of sorted pairs, ...
        b, c = a, 0
        while b < n:
            out.append((b - a, b))
            b, c = b + 1, (c + 1) % a
            if c == 0:
                b += a
        a *= 2
    a, e = a // 4, 1
    while a > 0:                         # merge, from the largest block size down
        d = e
        while d > 0:
            b, c = (d + 1) * a, 0
            while b < n:
                out.append((b - d * a, b))
                b, c = b + 1, (c + 1) % a
                if c == 0:
                    b += a
            d //= 2
        a, e = a // 2, 2 * e + 1
    return out


@lru_cache(maxsize=None)
def select_network(n: int, ranks: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The compare-exchanges of :func:`pairwise_sort` that decide the outputs ``ranks``.

    Walking the network backwards, a pair is kept when one of its positions is still needed;
    the rest only order positions no kept output depends on.
    """
    need, keep = set(ranks), []
    for i, j in reversed(pairwise_sort(n)):
        if i in need or j in need:
            keep.append((i, j))
            need.update((i, j))
    return tuple(_local_order(keep[::-1]))


def _local_order(net: list[tuple[int, int]], regs: int = 14) -> list[tuple[int, int]]:
    """The same comparators in an order that reuses recently touched rows (fewer spills).

    Each row still meets its comparators in their original order (a comparator is placed only
    after every earlier one on its two rows), so the outputs are unchanged. Among the ready
    ones it takes the comparator with fewer rows outside the ``regs`` most recently used.
    """
    last: dict[int, int] = {}
    waits = [0] * len(net)
    after: list[list[int]] = [[] for _ in net]
    for k, (i, j) in enumerate(net):
        for p in {last[w] for w in (i, j) if w in last}:
            after[p].append(k)
            waits[k] += 1
        last[i] = last[j] = k
    ready = [k for k in range(len(net)) if waits[k] == 0]
    recent: list[int] = []
    out = []
    while ready:
        k = min(ready, key=lambda c: (sum(w not in recent for w in net[c]), c))
        ready.remove(k)
        out.append(net[k])
        for w in net[k]:
            if w in recent:
                recent.remove(w)
            recent.append(w)
        del recent[:-regs]
        for q in after[k]:
            waits[q] -= 1
            if waits[q] == 0:
                ready.append(q)
    return out


@intrinsic
def vsort_pair(typingctx, arr, token):
    """Order statistics ``K//2 - 1`` and ``K//2`` of each lane of the ``(K, 8)`` array ``arr``.

    ``token`` is any tuple of length K (its length, a compile-time constant, picks the
    network). The K rows are loaded into registers, run through the pruned network of
    :func:`select_network` (min and max per lane, IEEE ``<``; no NaN expected) and the two
    middle rows are returned; ``arr`` is not modified.
    """
    k = _rows(token)
    if not (_vec_of_array(arr) == F8 and k):
        return None

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])

        def load(i):
            p = builder.gep(a.data, [ir.Constant(ir.IntType(64), i * LANES)])
            return builder.load(builder.bitcast(p, _ll(F8).as_pointer()), align=4)
        return context.make_tuple(builder, sig.return_type, _middle_pair(builder, k, load))
    return types.UniTuple(F8, 2)(arr, token), codegen


def _rows(token) -> int:
    """K, the length of a ``token`` tuple type; 0 if it is not one of at least 2."""
    return token.count if isinstance(token, types.UniTuple) and token.count >= 2 else 0


def _middle_pair(builder, k: int, load) -> list:
    """The network of :func:`select_network` on K rows, ``load(i)`` giving row ``i`` (loaded
    once, when first needed): the rows K/2 - 1 and K/2 it leaves."""
    vals: dict = {}

    def row(i):
        if i not in vals:
            vals[i] = load(i)
        return vals[i]

    for i, j in select_network(k, (k // 2 - 1, k // 2)):
        x, y = row(i), row(j)
        lt = builder.fcmp_ordered("<", x, y)
        vals[i] = builder.select(lt, x, y)
        vals[j] = builder.select(lt, y, x)
    return [row(k // 2 - 1), row(k // 2)]


@intrinsic
def vsort_rows(typingctx, arr, offs, base, token):
    """:func:`vsort_pair` on K rows scattered over a flat float32 array: row ``i`` is the
    8 lanes at element ``offs[i] + base`` of ``arr`` (no bounds check), so a window is sorted
    where it lies, without first being copied into a ``(K, 8)`` array."""
    k = _rows(token)
    if not (_vec_of_array(arr) == F8 and isinstance(offs, types.Array) and offs.layout == "C"
            and offs.dtype == types.int64 and isinstance(base, types.Integer) and k):
        return None

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        o = context.make_array(sig.args[1])(context, builder, args[1])
        b = context.cast(builder, args[2], sig.args[2], types.int64)

        def load(i):
            off = builder.load(builder.gep(o.data, [ir.Constant(ir.IntType(64), i)]))
            p = builder.gep(a.data, [builder.add(off, b)])
            return builder.load(builder.bitcast(p, _ll(F8).as_pointer()), align=4)
        return context.make_tuple(builder, sig.return_type, _middle_pair(builder, k, load))
    return types.UniTuple(F8, 2)(arr, offs, base, token), codegen


def token(k: int) -> tuple:
    """The ``token`` argument of :func:`vsort_pair` for ``K = k`` rows."""
    return (np.int8(0),) * int(k)
