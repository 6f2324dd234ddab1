"""``python -m tests.tiles_waiting_cli ARGS``: ``pfm-dask ARGS`` with each group's end waiting
for the tile thread (:func:`wait_for_the_thread`), so that a load's subprocess in the tests
takes the early-tiles path every time rather than when the thread happens to keep up."""

from __future__ import annotations

import runpy
import sys
import time

from pfm_dask.pfm import _tiles


def wait_for_the_thread(setattr_=setattr) -> None:
    """Make :meth:`_tiles.TileRecompute.end_group` return only once the thread has done the
    tiles it was handed (within a minute). Whether a tile is done before the next group
    writes is otherwise a race: CI once saw a load of out-of-order lines redo no tile."""
    end_group = _tiles.TileRecompute.end_group

    def waiting(self):
        handed = end_group(self)
        deadline = time.monotonic() + 60
        while handed and self.busy.any() and time.monotonic() < deadline:
            time.sleep(0.001)
        return handed

    setattr_(_tiles.TileRecompute, "end_group", waiting)


if __name__ == "__main__":
    wait_for_the_thread()
    sys.argv[0] = "pfm-dask"
    runpy.run_module("pfm_dask.cli", run_name="__main__", alter_sys=True)
