"""What ``check`` reports: :class:`Problem`, and the collector that caps each kind's list.

The collector files each problem under a slot (a band's position in the check's pipeline)
so that the report's order does not depend on how many threads checked the bands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


_MAX_PER_KIND = 20            # problems reported per kind before a summary line

# ---------------------------------------------------------------------------
# Problems

@dataclass(frozen=True)
class Problem:
    """One thing wrong with a PFM.

    ``part`` is the file concerned (``"handle"``, ``".ctl"``, ``".lin"``,
    ``".bin"``, ``".ndx"``, ``".cvg"``) or ``"header"``; ``where`` says where
    in it (``"bin (col, row)"``, ``"byte N"``, ``"line N"``, or ``""``);
    ``what`` says what is wrong, with the numbers.
    """

    part: str
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.part} {self.where}: {self.what}" if self.where else f"{self.part}: {self.what}"


class _Problems:
    """Collects problems: at most ``_MAX_PER_KIND`` described per kind, the rest counted.

    Problems are listed in the order they were added, except that each is
    filed under the current :attr:`slot` and the list is ordered by slot:
    the check's pipeline walks band k + 1 (slot 2k + 2) before it has merged
    the data checks of band k (slot 2k + 1), and still lists them in band
    order.
    """

    def __init__(self):
        self.slot = 0
        self._items: list[tuple[int, str, Problem]] = []
        self._first: dict[str, tuple[int, int]] = {}   # kind -> (slot, order) of its first mention
        self._total: dict[str, int] = {}
        self._described: dict[str, int] = {}
        self._part: dict[str, str] = {}

    @property
    def items(self) -> list[Problem]:
        return [p for _, _, p in sorted(self._items, key=lambda t: t[0])]

    def _touch(self, kind: str) -> None:
        if kind not in self._first:
            self._first[kind] = (self.slot, len(self._first))

    def add(self, kind: str, part: str, where: str, what: str) -> None:
        self._touch(kind)
        self._total[kind] = self._total.get(kind, 0) + 1
        self._part.setdefault(kind, part)
        if self._described.get(kind, 0) < _MAX_PER_KIND:
            self._described[kind] = self._described.get(kind, 0) + 1
            self._items.append((self.slot, kind, Problem(part, where, what)))

    def each(self, kind: str, part: str, where) -> np.ndarray:
        """Indices (of a mask or index array) still worth describing; the rest are only counted.

        The caller then calls :meth:`add` with the same ``kind`` for each index returned.
        """
        w = np.asarray(where)
        idx = np.flatnonzero(w) if w.dtype == bool else w
        room = max(0, _MAX_PER_KIND - self._described.get(kind, 0))
        self.more(kind, part, idx.size - min(room, idx.size))
        return idx[:room]

    def more(self, kind: str, part: str, n: int) -> None:
        """Count ``n`` further problems of ``kind`` without describing them."""
        if n > 0:
            self._touch(kind)
            self._total[kind] = self._total.get(kind, 0) + int(n)
            self._part.setdefault(kind, part)

    def merge(self, other: "_Problems", slot: int) -> None:
        """Add what ``other`` collected (a band's, on its own) as if added here now, under ``slot``.

        ``other`` described the first problems of each kind it met, up to the
        cap, and counted the rest; re-adding them in order here describes the
        same first ones this collector would have described itself.
        """
        keep, self.slot = self.slot, slot
        try:
            for _, kind, p in other._items:
                self.add(kind, p.part, p.where, p.what)
            for kind, n in other._total.items():
                self.more(kind, other._part[kind], n - other._described.get(kind, 0))
        finally:
            self.slot = keep

    def copy(self) -> "_Problems":
        out = _Problems()
        out.slot = self.slot
        out._items = list(self._items)
        out._first = dict(self._first)
        out._total, out._described, out._part = dict(self._total), dict(self._described), dict(self._part)
        return out

    def finish(self) -> list[Problem]:
        out = self.items
        for kind in sorted(self._total, key=lambda k: self._first[k]):
            rest = self._total[kind] - self._described.get(kind, 0)
            if rest > 0:
                out.append(Problem(self._part[kind], "",
                                   f"{rest:,} more problem(s) of this kind: {kind}"))
        return out


def _bin_where(b: int, width: int) -> str:
    return f"bin ({int(b) % width}, {int(b) // width})"


def _byte_where(off: int) -> str:
    return f"byte {int(off):,}"
