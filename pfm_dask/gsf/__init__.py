"""GSF (Generic Sensor Format) codec: framing, ping decoding, writing.

Reading: :func:`read_pings`, :func:`iter_batches`, :func:`info`, :class:`GsfFile`.
Writing: :class:`GsfWriter`. Beam placement: :func:`beam_positions`.
Nothing here imports Dask.
"""

from ._reader import *  # noqa: F401,F403  (framing, decoding, the public reading API)
from ._reader import __all__ as _reader_all
from ._encode import *  # noqa: F401,F403  (the GSF 03.0x writer)
from ._encode import __all__ as _encode_all
from ._position import *  # noqa: F401,F403  (beam placement on WGS-84)
from ._position import __all__ as _position_all
from ._decode import keep_buffers  # noqa: F401  (the decoder's recycled buffers)

__all__ = [*_reader_all, *_encode_all, *_position_all, "keep_buffers"]
