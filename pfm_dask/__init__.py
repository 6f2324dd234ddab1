"""pfm-dask: many GSF multibeam files in, one PFM v7 bin file out, on Dask.

The codecs (:mod:`pfm_dask.gsf`, :mod:`pfm_dask.pfm`), the kernels
(:mod:`pfm_dask.geodesy`, :mod:`pfm_dask.bins`, :mod:`pfm_dask.filters`) and the
writer class never import Dask or typer; Dask lives in :mod:`pfm_dask.pipeline`,
:mod:`pfm_dask.cluster` and :mod:`pfm_dask.security` only.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"


def _numba_cache_dir() -> str:
    """The per-user folder for numba's compiled kernels: ``$XDG_CACHE_HOME/pfm-dask/numba``
    (``~/.cache/pfm-dask/numba``), so that ``cache=True`` never writes into the installed
    package (site-packages). A ``NUMBA_CACHE_DIR`` the user set is kept (docs/usage.md)."""
    base = _os.environ.get("XDG_CACHE_HOME") or _os.path.join(_os.path.expanduser("~"), ".cache")
    return _os.path.join(base, "pfm-dask", "numba")


if not _os.environ.get("NUMBA_CACHE_DIR"):
    # numba reads it when imported and again before each compilation; the cache
    # locator of a kernel is chosen when it is decorated, which here is on first use.
    # Worker processes inherit the variable, or set it the same way when they import us.
    _os.environ["NUMBA_CACHE_DIR"] = _numba_cache_dir()
    if "numba" in _sys.modules:  # imported before us: make it read the variable now
        from numba.core import config as _numba_config

        _numba_config.reload_config()
