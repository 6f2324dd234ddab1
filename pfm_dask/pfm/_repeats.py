"""Soundings read twice: a chain with a cycle, or a record shared by two bins.

Reading follows each bin's chain for as many records as its count needs; a
continuation pointer that leads back into the chain (or into another bin's)
makes the walk read the same physical records again, and every sounding in
them would come out twice. :class:`RepeatedRecords` keeps one bit per
``.ndx`` physical record over a whole read (bands in any order) and passes
each sounding slot once: the first time its record is reached.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RepeatedRecords"]


class RepeatedRecords:
    """Drop the soundings of records already read (``f``: an open :class:`PfmFile`)."""

    def __init__(self, f):
        self._rsize = int(f.ndx_record_size)
        self._L = int(f.record_length)
        self._seen = np.zeros((int(f.ndx_size) // self._rsize + 8) // 8 + 1, dtype=np.uint8)
        self.dropped = 0

    def first_reads(self, s: dict) -> dict:
        """``s`` (a :meth:`PfmFile.read_soundings` result with ``record_offset`` and ``slot``)
        without the soundings whose record an earlier chain step or band already read."""
        rec = np.asarray(s["record_offset"], dtype=np.int64) // self._rsize
        if rec.size == 0:
            return s
        key = rec * self._L + np.asarray(s["slot"], dtype=np.int64)
        _, first = np.unique(key, return_index=True)
        keep = np.zeros(rec.size, dtype=bool)
        keep[first] = True
        need = int(rec.max()) // 8 + 1
        if need > self._seen.size:   # the .ndx grew past its size at open
            self._seen = np.concatenate([self._seen, np.zeros(need - self._seen.size, np.uint8)])
        byte, bit = rec >> 3, (rec & 7).astype(np.uint8)
        keep &= ((self._seen[byte] >> bit) & 1) == 0
        np.bitwise_or.at(self._seen, byte, np.left_shift(np.uint8(1), bit))
        if keep.all():
            return s
        self.dropped += int(rec.size - keep.sum())
        return {k: (v[keep] if isinstance(v, np.ndarray) and v.shape[:1] == keep.shape else v)
                for k, v in s.items()}
