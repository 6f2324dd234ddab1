"""pfm-dask's numba kernels as a whole: compile them all into numba's on-disk cache, say where
that cache is, and notice compilations.

Every kernel is otherwise compiled (or loaded from the cache) on its first call. A first run
compiles them all, which takes 20 s to minutes: :func:`warm` does it at one chosen moment (a
load's pre-scan, ``pfm-dask warmup``), :class:`CompileWatch` tells when numba really compiles
rather than loads from the cache, and :func:`cache_location` finds out whether numba can cache
at all (without a writable cache every process compiles every kernel again). No Dask here.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .heap import release_code_pages

__all__ = ["CompileWatch", "WarmResult", "cache_location", "kernel_modules", "prefetch", "warm"]

_PACKAGE = Path(__file__).resolve().parent
#: what marks a module as holding kernels: a registry of :class:`~pfm_dask._numeric.CompiledKernels`
#: (compiled by name), or a ``load_kernels()`` function that compiles its module's own kernels
_MARKERS = ("CompiledKernels(", "def load_kernels(")


@dataclass
class WarmResult:
    """What :func:`warm` did: seconds in all, kernels numba compiled (not found in the cache) and
    the seconds those took, the cache folder (None: nothing can be cached) and its problem."""

    seconds: float = 0.0
    compiled: int = 0
    compile_seconds: float = 0.0
    cache: str | None = None
    cache_problem: str | None = None
    modules: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def kernel_modules() -> list[str]:
    """The package's modules that hold numba kernels, found by reading the sources (a few
    milliseconds), so that a kernel module added or moved is warmed without a list to edit."""
    found = []
    for path in sorted(_PACKAGE.rglob("*.py")):
        if path.name in ("_numeric.py", "kernel_cache.py"):  # the registry's definition, us
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if any(m in text for m in _MARKERS):
            rel = path.relative_to(_PACKAGE.parent).with_suffix("")
            found.append(".".join(rel.parts))
    return found


def _probe() -> int:  # pragma: no cover - only handed to numba's cache locator
    return 0


def cache_location() -> tuple[str | None, str | None]:
    """``(folder, problem)``: where numba caches this package's kernels, and, when that is not
    the folder pfm-dask chose (``NUMBA_CACHE_DIR``), why, in one line. ``folder`` None means
    nothing can be cached: every process then compiles every kernel."""
    from numba.core.caching import FunctionCache

    wanted = os.environ.get("NUMBA_CACHE_DIR") or None
    try:
        folder = FunctionCache(_probe)._cache_path
    except RuntimeError:                  # numba: "cannot cache function ...: no locator"
        folder = None
    if wanted is not None and folder is not None and _inside(folder, wanted):
        return wanted, None                # (each source folder has a subfolder there)
    if wanted is None and folder is not None:
        return folder, None
    why = f"{wanted}: {_unwritable(wanted)}" if wanted else "no writable folder"
    if folder is None:
        return None, (f"numba cannot cache the kernels ({why}): every process compiles "
                      "them again; set NUMBA_CACHE_DIR to a writable folder")
    why = _unwritable(wanted)
    return folder, (f"numba's cache folder {wanted} is not usable ({why}): kernels are "
                    f"cached in {folder} instead")


def _inside(path: str, folder: str) -> bool:
    p, f = os.path.realpath(path), os.path.realpath(folder)
    return p == f or p.startswith(f.rstrip(os.sep) + os.sep)


def _unwritable(folder: str) -> str:
    """Why numba cannot write into ``folder`` (it needs to create it and a file in it)."""
    import tempfile

    try:
        os.makedirs(folder, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        return err.strerror or type(err).__name__
    return "numba did not use it"


class CompileWatch:
    """Counts numba's real compilations (a kernel loaded from the cache is not one) while
    active, and their seconds; ``on_compile`` is called once, when the first one starts.

    A context manager; numba reports through its event API (``numba:compile``, emitted only
    when the on-disk cache had no entry), from any thread of the process. Compilations nested
    in another (a helper compiled for a kernel) count once, with the outer one.
    """

    def __init__(self, on_compile: Callable[[], None] | None = None):
        from numba.core import event

        self._event = event
        self._on_compile = on_compile
        self._local = threading.local()
        self._lock = threading.Lock()
        self.compiled = 0
        self.seconds = 0.0
        #: the part of ``seconds`` not inside ``_numeric``'s timed kernel loads (a kernel
        #: compiled for new argument types at its call)
        self.seconds_outside_loads = 0.0
        watch = self

        class _Listener(event.Listener):
            def on_start(self, ev):
                watch._start()

            def on_end(self, ev):
                watch._end()

        self._listener = _Listener()

    def _start(self) -> None:
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            from ._numeric import loading_kernel

            self._local.t0 = time.perf_counter()
            self._local.in_load = loading_kernel()
            with self._lock:
                first = self.compiled == 0
                self.compiled += 1
            if first and self._on_compile is not None:
                self._on_compile()

    def _end(self) -> None:
        depth = getattr(self._local, "depth", 0)
        if depth == 0:             # started before this watch was: not ours to count
            return
        self._local.depth = depth - 1
        if depth == 1:
            dt = time.perf_counter() - self._local.t0
            with self._lock:
                self.seconds += dt
                if not self._local.in_load:
                    self.seconds_outside_loads += dt

    def __enter__(self) -> "CompileWatch":
        self._event.register("numba:compile", self._listener)
        return self

    def __exit__(self, *exc) -> None:
        self._event.unregister("numba:compile", self._listener)


def _registries(module):
    """The kernel registries (:class:`~pfm_dask._numeric.CompiledKernels`) a module holds."""
    from ._numeric import CompiledKernels

    return (v for v in list(vars(module).values()) if isinstance(v, CompiledKernels))


def prefetch(kernels, stop: threading.Event) -> None:
    """Load ``kernels`` ((module, name) pairs, in that order) from numba's cache, or compile
    them, until ``stop`` is set: on a thread beside the work that will call them, so that
    their loads (much of it in LLVM, without the GIL) overlap that work. A kernel the work
    calls first is loaded there as usual (each registry loads a kernel once, under its lock);
    an error here is left for that call to raise."""
    for module_name, name in kernels:
        if stop.is_set():
            return
        try:
            reg = next(_registries(importlib.import_module(module_name)))
            reg(name)
        except Exception:  # noqa: BLE001 - raised again where the kernel is called
            return


def _swath_kernels(window: tuple[int, int]) -> None:
    """The swath filter's kernel is compiled per window size: run the filter once on a small
    sloping swath with ``window`` (pings, beams), which compiles what a load with it uses."""
    import numpy as np

    from .filters import swath_filter

    pings, beams = window[0] + 1, window[1] + 1
    ping, beam = np.repeat(np.arange(pings), beams), np.tile(np.arange(beams), pings)
    swath_filter(ping, beam, 100.0 + 0.1 * beam, np.zeros(ping.size, np.uint32),
                 window_pings=window[0], window_beams=window[1])


def warm(*, swath: tuple[int, int] | None = (5, 9), skip: tuple[str, ...] = (),
         on_compile: Callable[[str | None], None] | None = None) -> WarmResult:
    """Compile, or load from the on-disk cache, every kernel of the package, in this process.

    ``swath``: the swath filter's window (pings, beams) to compile its kernel for; None: not
    at all (a load without the filter).
    ``skip``: modules left out, by a part of their name (``"_area"``: no area filter).
    ``on_compile(cache)``: called once, when numba starts a real compilation (a cold or
    unusable cache), with the cache folder (None: nothing can be cached).
    """
    import numba

    t0 = time.perf_counter()
    cache, problem = cache_location()
    modules = [m for m in kernel_modules() if not any(part in m for part in skip)]
    with CompileWatch(on_compile and (lambda: on_compile(cache))) as watch:
        for name in modules:
            module = importlib.import_module(name)
            for reg in _registries(module):
                # the registry's kernel names are its signature table's keys
                for kernel in reg._signatures(numba.types):
                    reg(kernel)
            loader = getattr(module, "load_kernels", None)
            if callable(loader):
                loader()
        if swath:
            _swath_kernels(swath)
    # every kernel is in: the code generator's pages need not stay resident (heap.py)
    release_code_pages()
    return WarmResult(seconds=time.perf_counter() - t0, compiled=watch.compiled,
                      compile_seconds=watch.seconds, cache=cache, cache_problem=problem,
                      modules=modules)
