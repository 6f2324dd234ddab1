"""GSF (Generic Sensor Format) codec: framing, ping decoding, writing.

Reading: :func:`read_pings`, :func:`iter_batches`, :func:`info`, :class:`GsfFile`.
Writing: :class:`GsfWriter`. Beam placement: :func:`beam_positions`.
Nothing here imports Dask.

Names are imported from their module on first use (PEP 562), so that ``gsf.info`` (the
``gsf-info`` command) loads neither Arrow (the reader's tables) nor numba.
"""

from __future__ import annotations

import importlib

#: module -> the public names it gives this package
_MODULES = {
    "_reader": ("SOUNDING_SCHEMA", "GsfFile", "read_pings", "iter_batches"),
    "_summary": ("info",),
    "_encode": ("GsfWriter", "ScaleFactor"),
    "_position": ("beam_positions", "beam_positions_reference"),
    "_decode": ("keep_buffers",),
}
_WHERE = {name: mod for mod, names in _MODULES.items() for name in names}

__all__ = list(_WHERE)

_SUBMODULES = ("_decode", "_encode", "_framing", "_kernels", "_position", "_reader", "_records",
               "_summary")


def __getattr__(name: str):
    if name in _WHERE:
        value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted({*globals(), *__all__})
