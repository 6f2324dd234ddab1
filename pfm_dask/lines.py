"""Survey lines as pfmLoader numbers and names them, from the ping table of each piece.

The writer feeds the pieces of a file to one :class:`LineTracker` in order (a new line
depends on the heading at the previous line start, which may lie in an earlier piece).
"""

from __future__ import annotations

import os
import time as _time

import numpy as np
import pyarrow as pa

__all__ = ["LineTracker", "line_name"]


def line_name(basename: str, time_sec: int, time_nsec: int) -> str:
    """pfmLoader's line name: ``<gsf basename>-YYYY-DDD-HH:MM:SS`` (seconds rounded)."""
    t = _time.gmtime(int(time_sec))
    second = np.float32(t.tm_sec + time_nsec / 1e9)  # pfmLoader's cvtime gives a float
    sec = int(np.floor(float(second) + 0.5))
    return f"{basename}-{t.tm_year}-{t.tm_yday:03d}-{t.tm_hour:02d}:{t.tm_min:02d}:{sec:02d}"


class LineTracker:
    """Numbers lines as pfmLoader does, across the pieces of one file in order.

    A new line starts at the first contributing ping of a file, and whenever the
    heading differs from the heading at the last line start by more than 120°
    and less than 345° (a plain difference, as pfmLoader computes it).
    """

    def __init__(self, path: str):
        self.basename = os.path.basename(path)
        self.prev_heading = None
        self.names: list[str] = []

    def assign(self, pings: pa.Table) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Local line index for each contributing ping, plus the names of new lines."""
        p = pings.column("ping").to_numpy()
        h = pings.column("heading").to_numpy()
        ts = pings.column("time_sec").to_numpy()
        tn = pings.column("time_nsec").to_numpy()
        local = np.empty(p.size, dtype=np.int64)
        new_names = []
        # A loop per contributing ping (not per sounding): each start depends on the last.
        for i in range(p.size):
            hi = float(h[i])
            if self.prev_heading is None or 120.0 < abs(hi - self.prev_heading) < 345.0:
                self.prev_heading = hi
                name = line_name(self.basename, int(ts[i]), int(tn[i]))
                self.names.append(name)
                new_names.append(name)
            local[i] = len(self.names) - 1
        return p, local, new_names


