"""How many bytes of prepared pieces a Dask load lets wait for the writer, and why.

A prepared piece waits in the writer's process (its reorder buffer) from the moment a task
hands it over until its group is written. To never wait, the writer needs the group it is
writing, the next one complete by the time it finishes, and the pieces being made meanwhile:
bytes beyond that are pieces made early, which cost the writer's process memory and buy no
speed while the writer is the slower side (docs/performance.md, memory: on two cores the
writer waited as long for its pieces with this hold as with all of ``--max-backlog``). The
driver's window therefore keeps the estimated bytes of the pieces in flight plus those
buffered under :func:`hold_bytes`, never more than ``--max-backlog``: a rule of the settings
and the plan, never of the input's size.
"""

from __future__ import annotations

__all__ = ["HOLD_GROUPS", "HOLD_PIECES", "hold_bytes"]

#: groups the writer's process holds at most: the one being written and the next
HOLD_GROUPS = 2
#: pieces in flight beyond them (one per compute slot of a 2-worker cluster)
HOLD_PIECES = 2


def hold_bytes(max_backlog_bytes: int, group_bytes: int, piece_bytes: int) -> int:
    """Bytes of pieces in flight and waiting in the writer at most: ``HOLD_GROUPS`` groups of
    ``group_bytes`` and ``HOLD_PIECES`` of the largest piece (``piece_bytes``, the driver's
    estimate), within ``max_backlog_bytes``."""
    need = HOLD_GROUPS * max(0, int(group_bytes)) + HOLD_PIECES * max(0, int(piece_bytes))
    return max(1, min(int(max_backlog_bytes), need))
