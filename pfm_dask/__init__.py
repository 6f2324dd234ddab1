"""pfm-dask: many GSF multibeam files in, one PFM v7 bin file out, on Dask.

The codecs (:mod:`pfm_dask.gsf`, :mod:`pfm_dask.pfm`, which owns the bin grid), the
kernels (:mod:`pfm_dask.geodesy`, :mod:`pfm_dask.filters`) and the writer never import
Dask or typer; Dask lives in :mod:`pfm_dask.pipeline`, :mod:`pfm_dask.cluster`,
:mod:`pfm_dask.dashboard` (with its plugin), :mod:`pfm_dask.security` and :mod:`pfm_dask.warmup` only
(docs/design.md, "Layers", checked by tests/test_layers.py).
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"


def _numba_cache_dir() -> str | None:
    """The per-user folder for numba's compiled kernels: ``$XDG_CACHE_HOME/pfm-dask/numba``
    (``~/.cache/pfm-dask/numba``), so that ``cache=True`` never writes into the installed
    package (site-packages). None when there is no absolute home to put it in."""
    base = _os.environ.get("XDG_CACHE_HOME") or ""
    if not _os.path.isabs(base):  # unset, or relative (which XDG says to ignore)
        base = _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "pfm-dask", "numba") if _os.path.isabs(base) else None


if not _os.environ.get("NUMBA_CACHE_DIR") and _numba_cache_dir():
    # A NUMBA_CACHE_DIR the user set is kept (docs/cluster.md, Security). numba reads it
    # when imported and again before each compilation; a kernel's cache locator is chosen
    # when it is decorated, which here is on its first use. Worker processes inherit the
    # variable, or set it the same way when they import pfm_dask.
    _os.environ["NUMBA_CACHE_DIR"] = _numba_cache_dir()
    if "numba" in _sys.modules:  # imported before us: make it read the variable now
        from numba.core import config as _numba_config

        _numba_config.reload_config()
