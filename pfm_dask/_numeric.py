"""The PFM library's rounding and single-precision rules, as numpy functions.

The PFM I/O library stores every number as an integer code made with its
``NINT`` macro (round half away from zero), and it computes bin-record fields
and sounding offsets partly in C ``float``. A writer that wants the same codes
as the library has to round the same way at the same precision; these helpers
do that, vectorised, so the PFM and bin code never reimplement them
(docs/pfm-format.md §7).

Two C facts drive the details:

* ``NINT(a)`` is ``(int)(a - 0.5)`` or ``(int)(a + 0.5)``; ``0.5`` is a double
  literal, so a ``float`` argument is first widened to double (exactly), the
  half is added in double, and the cast truncates toward zero. :func:`nint`
  does the same: float32 input is widened exactly, never rounded in float32.
* ``float op float`` is computed in single precision (SSE, FLT_EVAL_METHOD 0);
  ``float op double`` is computed in double. :func:`scaled_code_f32` follows
  the library's ``(float value + float offset) * float scale`` order.

The same precision rules hold for the numba kernels, so this module also compiles every
kernel of the package (:func:`njit_cached`, :func:`njit_helper`, :class:`CompiledKernels`):
one set of options (no fastmath), one on-disk cache and one fallback when it is not writable.
``tests/test_numeric.py`` checks that no other module calls numba's compilers.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import time

import numpy as np

__all__ = [
    "nint",
    "nint32",
    "to_f32",
    "scaled_code_f32",
    "scaled_code_f64",
    "JIT_OPTIONS",
    "njit_cached",
    "njit_helper",
    "CompiledKernels",
    "kernel_seconds",
    "loading_kernel",
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


#: Options of every kernel: the GIL released (the writer's and the final step's threads run
#: kernels side by side), numpy's error model (division by zero gives inf/NaN, as numpy does),
#: no fastmath (every double operation as written). A module may override one (``**options``).
JIT_OPTIONS = {"nogil": True, "error_model": "numpy"}


@functools.lru_cache(maxsize=None)
def _refcount_switch(numba) -> dict:
    """numba's option that compiles without reference counting (``_nrt=False``, numba.core.options),
    or nothing when this numba has no such option (the refcounts then stay)."""
    try:
        numba.njit(_nrt=False)(lambda: 0)
    except (TypeError, KeyError, ValueError):
        return {}
    return {"_nrt": False}


def _jit_options(numba, options: dict) -> dict:
    opts = {**JIT_OPTIONS, **options}
    if opts.pop("refcounts", True) is False:
        opts.update(_refcount_switch(numba))
    return opts


_loads = threading.local()          # .depth: this thread is making a kernel ready
_loads_lock = threading.Lock()
_load_seconds = [0.0]                # over all threads, since the process started


@contextlib.contextmanager
def _timed_load():
    """Counts the seconds of making one kernel ready (numba's import, a cache load or a
    compilation) into :func:`kernel_seconds`, once when nested."""
    depth = getattr(_loads, "depth", 0)
    _loads.depth = depth + 1
    t = time.perf_counter()
    try:
        yield
    finally:
        _loads.depth = depth
        if depth == 0:
            with _loads_lock:
                _load_seconds[0] += time.perf_counter() - t


def kernel_seconds() -> float:
    """Seconds this process has spent making kernels ready in :func:`njit_cached` and
    :class:`CompiledKernels` (numba's import, cache loads, compilations), all threads."""
    return _load_seconds[0]


def loading_kernel() -> bool:
    """Whether this thread is making a kernel ready in :func:`njit_cached` or
    :class:`CompiledKernels` now."""
    return getattr(_loads, "depth", 0) > 0


def njit_cached(fn, sig=None, **options):
    """``fn`` compiled by numba: the one way a kernel of this package is compiled.

    With :data:`JIT_OPTIONS` (``options`` override them; ``refcounts=False`` compiles without
    numba's reference counting where numba can, for kernels that allocate nothing), for
    signature ``sig`` now, or for each new argument types on its calls when ``sig`` is None.
    From the on-disk cache when a cache directory is writable (``pfm_dask.__init__`` chooses
    it; :func:`_kernel_cache` says how an entry is keyed and loaded), else compiled in memory.
    """
    with _timed_load():
        import numba
        from numba.core import typeinfer
        from numba.core.dispatcher import Dispatcher

        disp = numba.njit(**_jit_options(numba, options))(fn)
        if not isinstance(disp, Dispatcher):  # NUMBA_DISABLE_JIT: the plain function
            return disp
        try:
            disp._cache = _kernel_cache()(fn)
        except RuntimeError as exc:  # "cannot cache function ...: no locator available"
            if "cannot cache" not in str(exc):
                raise
        if sig is not None:  # as numba.njit(sig) does: compile now, no other types later
            with typeinfer.register_dispatcher(disp):
                disp.compile(sig)
            disp.disable_compile()
        return disp


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def _kernel_cache():
    """numba's on-disk cache of one kernel (``FunctionCache``), with two changes.

    * Its entries are keyed also by the package's source files that hold the compiled helpers
      and intrinsics the kernel calls, transitively (:func:`_helper_sources`). numba keys an
      entry by the kernel's own file and bytecode only, so a kernel whose helper from another
      module had changed was loaded stale from the cache.
    * An entry is loaded without numba's full refresh of its compiler registries (a third of
      a second of CPU on the first kernel of a process, for typing and lowering tables that
      only a compilation reads): the loaded machine code links only to numba's runtime (NRT),
      its C helpers and math functions, and the hash secret, which are put in place here. A
      compilation (a cache miss) still refreshes everything itself.
    """
    from numba.core.caching import FunctionCache
    from numba.core.runtime import rtsys

    class KernelCache(FunctionCache):
        def _index_key(self, sig, codegen):
            return (*super()._index_key(sig, codegen), _helper_sources(self._py_func))

        def load_overload(self, sig, target_context):
            rtsys.initialize(target_context)
            import numba.cpython.hashing  # noqa: F401  (the hash secret's symbols)

            with self._guard_against_spurious_io_errors():
                return self._load_overload(sig, target_context)

    return KernelCache


def _helper_sources(fn) -> str:
    """A digest of the contents of :func:`_helper_files` of ``fn``."""
    return _files_digest(_helper_files(fn))


def _helper_files(fn) -> tuple[str, ...]:
    """The package's source files whose functions ``fn`` calls, transitively (numba
    dispatchers, intrinsics and plain functions named in its code, in its closures, or as
    attributes of a module it names), ``fn``'s own file included; sorted absolute paths."""
    import types

    package = _PACKAGE_DIR + os.sep
    files: set[str] = set()
    seen: set[int] = set()
    todo = [fn]
    while todo:
        obj = todo.pop()
        obj = getattr(obj, "py_func", obj)   # a numba dispatcher: its Python function
        obj = getattr(obj, "_defn", obj)     # a numba intrinsic: the function that makes its IR
        if not isinstance(obj, types.FunctionType) or id(obj) in seen:
            continue
        seen.add(id(obj))
        path = os.path.abspath(obj.__code__.co_filename)
        if not path.startswith(package):
            continue
        files.add(path)
        names = _code_names(obj.__code__)
        for name in names:
            value = obj.__globals__.get(name)
            if isinstance(value, types.ModuleType):  # ``_kernels.helper``: one of ours only
                if (getattr(value, "__file__", None) or "").startswith(package):
                    todo += [getattr(value, n, None) for n in names]
            elif value is not None:
                todo.append(value)
        todo += [cell.cell_contents for cell in obj.__closure__ or () if _filled(cell)]
    return tuple(sorted(files))


def _code_names(code) -> set[str]:
    """The global and attribute names of ``code`` and of the code nested in it."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= _code_names(const)
    return names


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


@functools.lru_cache(maxsize=None)
def _files_digest(paths: tuple[str, ...]) -> str:
    import hashlib

    h = hashlib.sha256()
    for path in paths:
        h.update(os.path.relpath(path, _PACKAGE_DIR).encode() + b"\0" + _file_digest(path))
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _file_digest(path: str) -> bytes:
    import hashlib

    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).digest()


def njit_helper(fn=None, **options):
    """``fn`` compiled by numba as a function that kernels call (compiled into each kernel's
    cache entry, never cached alone); options as :func:`njit_cached`. Usable as a decorator,
    bare or with options."""
    import numba

    if fn is None:
        return functools.partial(njit_helper, **options)
    return numba.njit(**_jit_options(numba, options))(fn)


class CompiledKernels:
    """A module's numba kernels ``_k_<name>``, each compiled (or loaded from the on-disk cache)
    by :func:`njit_cached` on its first use, once per process, safely from several threads.

    ``namespace``: the module's ``globals()``; ``signatures(numba.types)``: ``{name: signature}``;
    ``helpers``: names of the module's plain functions that kernels call, replaced in
    ``namespace`` by their :func:`njit_helper` versions before the first kernel compiles, with
    ``options`` and then ``helper_options`` (e.g. ``inline="always"``); ``prepare(numba)``: more
    names (numba intrinsics) put into ``namespace`` then. ``options``: as :func:`njit_cached`.
    """

    def __init__(self, namespace: dict, signatures, helpers: tuple = (), *, prepare=None,
                 helper_options: dict | None = None, **options):
        self._namespace, self._signatures, self._helpers = namespace, signatures, tuple(helpers)
        self._prepare, self._options = prepare, options
        self._helper_options = {**options, **(helper_options or {})}
        self._lock = threading.Lock()
        self._sigs: dict | None = None
        self.compiled: dict = {}

    def _ready(self, numba) -> dict:
        """Helpers and intrinsics in place, signatures made (once; under the lock)."""
        if self._sigs is None:
            if self._prepare is not None:
                self._namespace.update(self._prepare(numba))
            for h in self._helpers:
                fn = self._namespace[h]
                if not isinstance(fn, numba.core.dispatcher.Dispatcher):
                    self._namespace[h] = njit_helper(fn, **self._helper_options)
            self._sigs = self._signatures(numba.types)
        return self._sigs

    def __call__(self, name: str):
        k = self.compiled.get(name)
        if k is None:
            with self._lock:
                k = self.compiled.get(name)
                if k is None:
                    with _timed_load():
                        import numba

                        sig = self._ready(numba)[name]
                        k = njit_cached(self._namespace["_k_" + name], sig, **self._options)
                    self.compiled[name] = k
        return k

    def load(self, names=None) -> float:
        """Compile (or load from the cache) the kernels ``names`` (all by default) now; the
        seconds it took, numba's import included when this is the first use."""
        import time

        t = time.perf_counter()
        if names is None:
            import numba

            with self._lock:
                names = list(self._ready(numba))
        for name in names:
            self(name)
        return time.perf_counter() - t
