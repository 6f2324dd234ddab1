"""The one exception hierarchy of pfm-dask.

Every error that reaches a user names the file it concerns and, where the
problem sits at a known place in that file, the byte offset. The message is
built here, once, so that all modules phrase it the same way:
``line_0012.gsf: at byte 48,212: record declares 9,480 bytes but 3,016 remain``.
"""

from __future__ import annotations

import os

__all__ = [
    "PfmDaskError",
    "GsfError",
    "PfmFormatError",
    "LoadError",
    "ConfigError",
]


class PfmDaskError(Exception):
    """Root of every error raised on purpose by pfm-dask.

    ``path`` and ``offset`` are kept as attributes so that reports can be
    written without parsing the message.
    """

    def __init__(self, message: str, *, path: str | os.PathLike | None = None,
                 offset: int | None = None):
        self.path = os.fspath(path) if path is not None else None
        self.offset = int(offset) if offset is not None else None
        self.reason = message
        super().__init__(self._format())

    def _format(self) -> str:
        parts = []
        if self.path is not None:
            parts.append(self.path)
        if self.offset is not None:
            parts.append(f"at byte {self.offset:,}")
        parts.append(self.reason)
        return ": ".join(parts)

    def to_dict(self) -> dict:
        """A JSON-ready form for load reports."""
        return {"error": type(self).__name__, "path": self.path,
                "offset": self.offset, "reason": self.reason}

    def __reduce__(self):  # keep path/offset across pickling (Dask ships errors)
        return (_rebuild, (type(self), self.reason, self.path, self.offset))


def _rebuild(cls, reason, path, offset):
    return cls(reason, path=path, offset=offset)


class GsfError(PfmDaskError):
    """A GSF file is not GSF, is truncated, or breaks a rule of the format."""


class PfmFormatError(PfmDaskError):
    """A PFM file breaks a layout rule, or a value does not fit the header's bit widths."""


class LoadError(PfmDaskError):
    """A file or a batch failed during a load; the cause is chained with ``from``."""


class ConfigError(PfmDaskError):
    """A user setting is invalid or inconsistent; the message says what to write instead."""
