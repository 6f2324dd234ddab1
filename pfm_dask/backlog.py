"""How many bytes of prepared pieces a Dask load lets wait for the writer, and why.

A prepared piece waits in the writer's process (its reorder buffer) from the moment a task
hands it over until its group is written. The writer needs the whole group it writes (it
merges the group's pieces by bin); beyond it, the tasks may make the next pieces meanwhile.
Each piece made early costs the writer's process its bytes: with the next group whole as well
(two groups, as before), the 2-worker load of a 200 MB survey peaked at 565 MB; with the group
and two pieces in flight, at 483-492 MB, the writer waiting for the next group's pieces while
the tasks, no longer sharing the cores with it, make them (docs/performance.md, memory). The
driver's window therefore keeps the estimated bytes of the pieces in flight plus those
buffered under :func:`hold_bytes`, never more than ``--max-backlog``: a rule of the settings
and the plan, never of the input's size.
"""

from __future__ import annotations

__all__ = ["HOLD_GROUPS", "HOLD_PIECES", "hold_bytes"]

#: groups the writer's process holds at most: the one being written (or being completed)
HOLD_GROUPS = 1
#: pieces in flight beyond it (one per compute slot of a 2-worker cluster)
HOLD_PIECES = 2


def hold_bytes(max_backlog_bytes: int, group_bytes: int, piece_bytes: int) -> int:
    """Bytes of pieces in flight and waiting in the writer at most: ``HOLD_GROUPS`` groups of
    ``group_bytes`` and ``HOLD_PIECES`` of the largest piece (``piece_bytes``, the driver's
    estimate), within ``max_backlog_bytes``."""
    need = HOLD_GROUPS * max(0, int(group_bytes)) + HOLD_PIECES * max(0, int(piece_bytes))
    return max(1, min(int(max_backlog_bytes), need))
