"""PFM v7 codec: create, write, read, recompute, check, info and dump PFM files.

Nothing here imports Dask or knows about GSF.
"""

from .. import validity  # noqa: F401  (the bits live at the bottom: pfm_dask.validity)
from ._store import *  # noqa: F401,F403  (header, bit packing, create/open/add/read/append)
from ._store import __all__ as _store_all
from ._recompute import *  # noqa: F401,F403  (bin statistics by the library's rules)
from ._recompute import __all__ as _recompute_all
from ._check import *  # noqa: F401,F403  (check and its Problem)
from ._check import __all__ as _check_all
from ._info import *  # noqa: F401,F403  (info, dump)
from ._info import __all__ as _info_all

__all__ = ["validity", *_store_all, *_recompute_all, *_check_all, *_info_all]
