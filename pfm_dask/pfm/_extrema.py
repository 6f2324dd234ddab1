"""pfmLoader's header extrema from recomputed bins: per band, its first extreme value and
bin of each (:func:`band_extrema`), folded in raster order (:class:`_Extrema`) or, for bands
recomputed out of raster order (the tiles a load finished early, :mod:`._tiles`), kept per
tile and merged by value and then bin (:class:`Candidates`), which gives the same result."""

from __future__ import annotations

import numpy as np

from .. import validity as V

__all__ = ["EXTREMA_START", "KEYS", "band_extrema", "std_limit", "Candidates"]


#: pfmLoader's starting values for the header extrema of a new PFM; they stay in
#: the header when no bin qualifies. Keys are :class:`PfmHeader` field names.
EXTREMA_START = {
    "min_filtered_depth": 9999999.0, "max_filtered_depth": -9999999.0,
    "min_filtered_coord": (0, 0), "max_filtered_coord": (0, 0),
    "min_depth": 9999999.0, "max_depth": -9999999.0,
    "min_coord": (0, 0), "max_coord": (0, 0),
    "min_bin_count": 9999999, "max_bin_count": 0,
    "min_count_coord": (0, 0), "max_count_coord": (0, 0),
    "min_standard_deviation": 9999999.0, "max_standard_deviation": -9999999.0,
}

def _first_extreme(vals, bidx, key, coord_key, lower: bool):
    """A band's candidate for one extremum: its first lowest (highest) value and bin."""
    if vals.size == 0:
        return None
    j = int(np.argmin(vals) if lower else np.argmax(vals))  # first occurrence = raster order
    return key, coord_key, lower, vals[j], int(bidx[j])


def band_extrema(bidx, stats, null32, std_max=None) -> list:
    """A band's candidates for pfmLoader's header extrema (:meth:`_Extrema.fold`), on any
    thread: per extremum, the band's first extreme value and its bin."""
    cnt = stats["num_soundings"].astype(np.int64)
    out = [_first_extreme(cnt, bidx, "min_bin_count", "min_count_coord", True),
           _first_extreme(cnt, bidx, "max_bin_count", "max_count_coord", False)]
    # pfmLoader: bin max depth (float) < max_depth + 1.0, i.e. below NULL DEPTH
    ok = stats["max"].astype(np.float64) < float(null32)
    data = ok & ((stats["validity"].astype(np.int64) & V.DATA) != 0)
    bd = bidx[data]
    out.append(_first_extreme(stats["min_filtered"][data], bd, "min_filtered_depth",
                              "min_filtered_coord", True))
    out.append(_first_extreme(stats["max_filtered"][data], bd, "max_filtered_depth",
                              "max_filtered_coord", False))
    std = stats["std"][data].astype(np.float64)  # header std extrema are doubles
    if std_max is not None:
        std = np.minimum(std, std_max)
    out.append(_first_extreme(std, bd, "min_standard_deviation", None, True))
    out.append(_first_extreme(std, bd, "max_standard_deviation", None, False))
    bo = bidx[ok]
    out.append(_first_extreme(stats["min"][ok], bo, "min_depth", "min_coord", True))
    out.append(_first_extreme(stats["max"][ok], bo, "max_depth", "max_coord", False))
    return out


class _Extrema:
    """pfmLoader's running header extrema: strict comparisons in raster order."""

    def __init__(self, start: dict | None, width: int):
        self.v = dict(EXTREMA_START)
        if start:
            unknown = set(start) - set(EXTREMA_START)
            if unknown:
                raise ValueError(f"unknown extrema keys {sorted(unknown)}")
            self.v.update(start)
        self.width = width

    def _coord(self, b) -> tuple[int, int]:
        return (int(b % self.width), int(b // self.width))

    def _take(self, vals, bidx, key, coord_key, lower: bool) -> None:
        self.fold([_first_extreme(vals, bidx, key, coord_key, lower)])

    def fold(self, found) -> None:
        """Fold in a band's :func:`band_extrema` (bands in raster order): a band's first
        extreme replaces the running one only when strictly beyond it, as a bin by bin
        pass would, so the result does not depend on where the bands were cut."""
        for got in found:
            if got is None:
                continue
            key, coord_key, lower, x, b = got
            cur = self.v[key]
            if (x < cur) if lower else (x > cur):
                self.v[key] = x.item()
                if coord_key:
                    self.v[coord_key] = self._coord(b)

    def update(self, bidx, stats, null32) -> None:
        """Fold in a band of recomputed bins (``bidx`` ascending, ``stats`` float32 values)."""
        self.fold(band_extrema(bidx, stats, null32, getattr(self, "std_max", None)))

    def result(self) -> dict:
        out = {}
        for k, v in self.v.items():
            if isinstance(v, tuple):
                out[k] = (int(v[0]), int(v[1]))
            elif k.endswith("bin_count"):
                out[k] = int(v)
            else:
                out[k] = float(v)
        return out


def std_limit(h) -> float:
    """The largest standard deviation the header's [STD BITS] and scale can store."""
    return float(((1 << int(h.std_bits)) - 1) / np.float32(h.std_scale))


#: :func:`band_extrema`'s entries, in its order: (key, coordinate key, lower)
KEYS = (("min_bin_count", "min_count_coord", True), ("max_bin_count", "max_count_coord", False),
        ("min_filtered_depth", "min_filtered_coord", True),
        ("max_filtered_depth", "max_filtered_coord", False),
        ("min_standard_deviation", None, True), ("max_standard_deviation", None, False),
        ("min_depth", "min_coord", True), ("max_depth", "max_coord", False))


class Candidates:
    """Extrema candidates of bands recomputed in any order, kept per slot (a tile of bins):
    for each of :data:`KEYS`, the slot's best value and its bin, -1 for none. A slot's bands
    may come in any order and a slot can be emptied again (its bins changed since).

    A raster-order fold takes, per key, the value furthest beyond the start and, among equal
    ones, the first in raster order: that is the best (value, bin) pair of all candidates,
    whatever order they were found in, so :meth:`fold_into` gives :class:`_Extrema` the same
    result as folding every band in raster order."""

    def __init__(self, n_slots: int):
        self.val = np.zeros((n_slots, len(KEYS)), dtype=np.float64)
        self.bin = np.full((n_slots, len(KEYS)), -1, dtype=np.int64)

    def put(self, slot: int, found: list) -> None:
        """Merge a band's :func:`band_extrema` into ``slot``."""
        for i, got in enumerate(found):
            if got is None:
                continue
            x, b = float(got[3]), int(got[4])
            cb = self.bin[slot, i]
            if cb >= 0:
                cx = self.val[slot, i]
                lower = KEYS[i][2]
                if (x > cx if lower else x < cx) or (x == cx and b > cb):
                    continue
            self.val[slot, i], self.bin[slot, i] = x, b

    def clear(self, slots) -> None:
        """Forget the candidates of ``slots`` (their bins are recomputed again)."""
        self.bin[slots] = -1

    def fold_into(self, ext: _Extrema, slots=None) -> None:
        """Fold the best candidate of each key (over ``slots``, default all) into ``ext``."""
        val = self.val if slots is None else self.val[slots]
        bins = self.bin if slots is None else self.bin[slots]
        for i, (key, coord_key, lower) in enumerate(KEYS):
            has = np.flatnonzero(bins[:, i] >= 0)
            if has.size == 0:
                continue
            x, b = val[has, i], bins[has, i]
            best = x.min() if lower else x.max()
            j = has[(x == best)][np.argmin(b[x == best])]
            ext.fold([(key, coord_key, lower, np.float64(val[j, i]), int(bins[j, i]))])
