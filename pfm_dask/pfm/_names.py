"""Names in the ``.ctl`` and ``.lin``: the file system's own bytes.

The PFM library stores each input's path as plain bytes and opens it with
them; a path written in any other coding (``?`` for what latin-1 cannot
say) names a different, missing file, and an append would load the file
again. Python keeps a path's undecodable bytes as lone surrogates
(``os.fsdecode``), so ``os.fsencode`` gives back exactly the bytes the file
system holds, and reading decodes the same way: names round-trip byte for
byte, whatever the coding of the file system or of the tool that wrote them.
"""

from __future__ import annotations

import os
import sys

__all__ = ["encode_names", "decode_names", "TEXT_CODING"]

#: ``open(..., "w", **TEXT_CODING)``: text files holding paths (the handle, a new ``.ctl``)
#: written in the same coding as :func:`encode_names`
TEXT_CODING = {"encoding": sys.getfilesystemencoding(), "errors": sys.getfilesystemencodeerrors()}


def encode_names(text: str) -> bytes:
    """Lines of ``.ctl`` or ``.lin`` text to bytes, each path as the file system's bytes."""
    return os.fsencode(text)


def decode_names(raw: bytes) -> str:
    """The bytes of a ``.ctl`` or ``.lin`` as text whose names :func:`encode_names` restores."""
    return os.fsdecode(raw)
