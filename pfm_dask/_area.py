"""The area filter: pfmLoader's 3 x 3-bin statistical depth filter, row-streaming, with its bugs fixed.

pfmLoader (``abe-pfmLoader : pfmFilter.cpp``; PFM_NOTES 3.5) compares every sounding of a bin
with the mean of the 3 x 3 block of bins around it and cuts those more than
``cellstd x 2 x spread`` deeper (or, two-sided, away). This module runs the same algorithm one
bin row at a time from caller callbacks, holding at most three rows, vectorised within a row.
Fixed relative to pfmLoader (PFM_NOTES 3.6): the first and last rows are filtered (the block is
clipped at the grid edges), a zero or undefined spread cuts nothing, and statistics are computed
in double precision with a two-pass variance. Bins are not recomputed here: the kernel reports
the soundings and bins that changed and the caller recomputes every bin afterwards.
See ``docs/filters.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import numpy as np

from .errors import ConfigError
from .pfm import validity as V

__all__ = ["AreaFilter", "AreaFilterSummary", "RowResult", "RowSoundings"]

_CUT = np.uint32(V.FILTER_INVAL | V.MODIFIED)
_SKIP = np.uint32(V.INVAL | V.DELETED)

# The 3 x 3 block in pfmLoader's summation order (row y-1, y, y+1; column x-1, x, x+1).
_BLOCK = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]
_CENTRE = 4


@dataclass(frozen=True)
class RowSoundings:
    """All soundings of one row of bins, as the caller reads them.

    ``col``: bin column (0 .. width-1) of each sounding; ``depth`` (metres, positive down);
    ``validity`` (PFM words). ``address`` is opaque to the filter: when it is an array with one
    entry per sounding, results carry the entries of the changed soundings, otherwise it is
    passed back as is. ``active``: optional boolean per bin column, the bins to filter
    (pfmLoader filters only bins that received new soundings); ``None`` means every bin.
    """

    col: np.ndarray
    depth: np.ndarray
    validity: np.ndarray
    address: Any = None
    active: np.ndarray | None = None

    @classmethod
    def empty(cls) -> "RowSoundings":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.float64), np.zeros(0, np.uint32))


@dataclass(frozen=True)
class RowResult:
    """What the filter changed in one row.

    ``index``: positions (into the row's arrays) of the soundings whose validity changed, in
    increasing order; ``validity``: their new words (old | FILTER_INVAL | MODIFIED);
    ``address``: the row's address sliced to those soundings (or passed back as is);
    ``changed_cols``: the bin columns that hold a changed sounding; ``examined``, ``good``,
    ``bad``: pfmLoader's filter counts for the row (every sounding of each bin that went
    through the test, and how many of them are valid / INVAL or DELETED afterwards).
    """

    row: int
    index: np.ndarray
    validity: np.ndarray
    address: Any
    changed_cols: np.ndarray
    examined: int = 0
    good: int = 0
    bad: int = 0


@dataclass
class AreaFilterSummary:
    """Totals over the rows processed so far (pfmLoader writes total/good/bad to the handle file).

    ``bins_filtered``: bins that went through the test; ``bins_sparse``: active bins with data
    left alone because fewer than ``min_cells`` cells of their block have data;
    ``bins_no_spread``: filtered bins whose threshold was 0 or undefined (nothing cut);
    ``cut``: soundings newly invalidated.
    """

    total: int = 0
    good: int = 0
    bad: int = 0
    cut: int = 0
    bins_filtered: int = 0
    bins_sparse: int = 0
    bins_no_spread: int = 0
    rows: int = 0
    raster_passes: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Stats:
    """Per-bin statistics of one row as the filter sees them (no data => avg = std = 0)."""

    data: np.ndarray
    avg: np.ndarray
    std: np.ndarray

    @classmethod
    def none(cls, width: int) -> "_Stats":
        return cls(np.zeros(width, bool), np.zeros(width), np.zeros(width))

    def take(self, mask: np.ndarray, other: "_Stats") -> "_Stats":
        """These statistics where ``mask`` is False, ``other``'s where it is True."""
        return _Stats(np.where(mask, other.data, self.data), np.where(mask, other.avg, self.avg),
                      np.where(mask, other.std, self.std))

    def differs(self, other: "_Stats") -> np.ndarray:
        return (self.data != other.data) | (self.data & ((self.avg != other.avg)
                                                         | (self.std != other.std)))


def _bin_stats(col: np.ndarray, z: np.ndarray, use: np.ndarray, width: int) -> _Stats:
    """Mean and sample standard deviation (two-pass, 0 when n <= 1) of ``z[use]`` per column.

    Sums run in sounding order (``bincount``), so a plain loop reproduces them bit for bit.
    """
    c = col[use]
    zz = z[use]
    n = np.bincount(c, minlength=width)
    s = np.bincount(c, weights=zz, minlength=width)
    data = n > 0
    avg = np.where(data, s / np.maximum(n, 1), 0.0)
    dev = zz - avg[c]
    ss = np.bincount(c, weights=dev * dev, minlength=width)
    std = np.where(n > 1, np.sqrt(ss / np.maximum(n - 1, 1)), 0.0)
    return _Stats(data, avg, std)


def _shift(a: np.ndarray, dx: int, fill) -> np.ndarray:
    """``out[x] = a[x + dx]``, ``fill`` outside the row."""
    out = np.full_like(a, fill)
    if dx == 0:
        out[:] = a
    elif dx > 0:
        out[:-dx] = a[dx:]
    else:
        out[-dx:] = a[:dx]
    return out


class AreaFilter:
    """pfmLoader's area filter over a ``width x height`` bin grid, fed one row at a time.

    Parameters: ``bin_size_xy`` (metres; 0 for geographic/minute bins, in which case every
    neighbour uses ``bin_diagonal`` as pfmLoader does), ``bin_diagonal`` (metres; default
    sqrt(2) x ``bin_size_xy``; pfmLoader's own value 2*sqrt(bin_size) is right only for 2 m
    bins), ``cellstd`` (2.4, "heavy" 2.0), ``deep_only`` (cut only soundings deeper than the
    local mean; False = two-sided), ``exact_raster`` (True: each bin sees its left neighbour
    after filtering, exactly pfmLoader's raster order; False: a whole row is decided at once
    from the row's pre-filter statistics), ``min_cells`` (5: pfmLoader's minimum number of
    cells with data in the block), ``max_slope`` (1.0 rise/run: pfmLoader's "flat" test),
    ``cut_reference`` (True as pfmLoader: REFERENCE soundings can be cut), ``null_depth``
    (soundings at or below it are left out of the library statistics of filtered bins, as
    the PFM library does; ``None``: no such soundings are expected).

    Drive it with :meth:`run` (callbacks) or :meth:`iter_rows` (a generator). Rows are read
    in order 0 .. height-1, each exactly once; row y is processed when row y+1 has been read.
    """

    def __init__(self, width: int, height: int, *, bin_size_xy: float,
                 bin_diagonal: float | None = None, cellstd: float = 2.4,
                 deep_only: bool = True, exact_raster: bool = True, min_cells: int = 5,
                 max_slope: float = 1.0, cut_reference: bool = True,
                 null_depth: float | None = None):
        if int(width) != width or int(height) != height or width < 1 or height < 1:
            raise ConfigError(f"area filter grid must be at least 1 x 1 bins, got {width} x {height}")
        if not bin_size_xy >= 0:
            raise ConfigError(f"bin_size_xy must be >= 0 metres, got {bin_size_xy!r}")
        if bin_diagonal is None:
            bin_diagonal = np.sqrt(2.0) * bin_size_xy
        if not bin_diagonal > 0:
            raise ConfigError("bin_diagonal must be > 0 metres (give it when bin_size_xy is 0)")
        if not cellstd > 0:
            raise ConfigError(f"--cellstd must be > 0 (normal 2.4, heavy 2.0), got {cellstd!r}")
        if not 1 <= min_cells <= 9:
            raise ConfigError(f"min_cells must be in 1..9, got {min_cells!r}")
        if not max_slope > 0:
            raise ConfigError(f"max_slope must be > 0, got {max_slope!r}")
        self.width = int(width)
        self.height = int(height)
        self.bin_size_xy = float(bin_size_xy)
        self.bin_diagonal = float(bin_diagonal)
        self.cellstd = float(cellstd)
        self.deep_only = bool(deep_only)
        self.exact_raster = bool(exact_raster)
        self.min_cells = int(min_cells)
        self.max_slope = float(max_slope)
        self.cut_reference = bool(cut_reference)
        self.null_depth = null_depth
        self.summary = AreaFilterSummary()
        # dx per block cell: diagonals use the diagonal; pfmLoader uses it for all when size is 0.
        side = self.bin_size_xy if self.bin_size_xy > 0 else self.bin_diagonal
        self._dx = [self.bin_diagonal if (dy and dx) else side for dy, dx in _BLOCK]

    # ------------------------------------------------------------------ driving
    def run(self, read_row: Callable[[int], RowSoundings | None],
            write_row: Callable[[int, RowResult], None]) -> AreaFilterSummary:
        """Filter the whole grid: ``read_row(y)`` for each row, ``write_row(y, result)`` after it."""
        for res in self.iter_rows(read_row):
            write_row(res.row, res)
        return self.summary

    def iter_rows(self, read_row: Callable[[int], RowSoundings | None]) -> Iterator[RowResult]:
        """Yield one :class:`RowResult` per row, in row order.

        ``read_row(y)`` may return ``None`` for a row without soundings. Row y+1 is read before
        row y is yielded; row y-1's soundings are released before row y+1 is read, so at most
        two rows of soundings and three rows of bin statistics are held.
        """
        w = self.width
        above = _Stats.none(w)                          # row y-1, post-filter
        cur = self._check(read_row(0), 0)
        cur_pre = self._pre(cur)
        for y in range(self.height):
            if y + 1 < self.height:
                nxt = self._check(read_row(y + 1), y + 1)
                nxt_pre = self._pre(nxt)
            else:
                nxt, nxt_pre = None, _Stats.none(w)
            res, post = self._process(y, cur, above, cur_pre, nxt_pre)
            above = post
            cur, cur_pre = nxt, nxt_pre
            del nxt
            yield res

    # ------------------------------------------------------------------ internals
    def _check(self, row: RowSoundings | None, y: int) -> RowSoundings:
        if row is None:
            return RowSoundings.empty()
        col = np.asarray(row.col)
        n = col.shape[0]
        depth = np.asarray(row.depth, dtype=np.float64)
        val = np.asarray(row.validity, dtype=np.uint32)
        if depth.shape != (n,) or val.shape != (n,):
            raise ValueError(f"row {y}: col, depth and validity must have the same length")
        if n and (col.min() < 0 or col.max() >= self.width):
            raise ValueError(f"row {y}: bin column outside 0..{self.width - 1}")
        active = row.active
        if active is not None:
            active = np.asarray(active, dtype=bool)
            if active.shape != (self.width,):
                raise ValueError(f"row {y}: active must have one entry per bin column")
        return RowSoundings(col.astype(np.int64, copy=False), depth, val, row.address, active)

    def _pre(self, row: RowSoundings) -> _Stats:
        """pfmLoader's filter statistics: soundings neither INVAL nor DELETED, REFERENCE included."""
        return _bin_stats(row.col, row.depth, (row.validity & _SKIP) == 0, self.width)

    def _decide(self, above: _Stats, cur_pre: _Stats, left: _Stats, below: _Stats):
        """Per bin of the row: (filterable, mean of the block, threshold T)."""
        rows = {-1: above, 0: cur_pre, 1: below}
        data, avg, std = [], [], []
        for dy, dx in _BLOCK:
            src = left if (dy == 0 and dx == -1) else rows[dy]
            data.append(_shift(src.data, dx, False))
            avg.append(_shift(src.avg, dx, 0.0))
            std.append(_shift(src.std, dx, 0.0))
        count = np.zeros(self.width, np.int64)
        avgsum = np.zeros(self.width)
        stdsum = np.zeros(self.width)
        for k in range(9):      # pfmLoader's order, so a per-bin loop gives the same sums
            count += data[k]
            avgsum = avgsum + np.where(data[k], avg[k], 0.0)
            stdsum = stdsum + np.where(data[k], std[k], 0.0)
        n = np.maximum(count, 1)
        mean = avgsum / n
        flat = np.ones(self.width, bool)
        centre = avg[_CENTRE]
        ss = np.zeros(self.width)
        for k in range(9):
            if k != _CENTRE:
                slope = np.abs(centre - avg[k]) / self._dx[k]
                flat &= ~(data[k] & (slope > self.max_slope))
            d = np.where(data[k], avg[k] - mean, 0.0)
            ss = ss + d * d
        sd_avg = np.sqrt(ss / np.maximum(count - 1, 1))
        spread = 2.0 * np.where(flat, stdsum / n, sd_avg)
        thr = self.cellstd * spread
        filterable = data[_CENTRE] & (count >= self.min_cells)
        return filterable, mean, thr

    def _process(self, y: int, row: RowSoundings, above: _Stats, cur_pre: _Stats,
                 below: _Stats):
        w = self.width
        col = row.col
        active = np.ones(w, bool) if row.active is None else row.active
        candidates = (row.validity & _SKIP) == 0
        if not self.cut_reference:
            candidates &= (row.validity & np.uint32(V.REFERENCE)) == 0

        # shown[j]: bin j's statistics as bin j+1 sees them. pfmLoader's raster order shows
        # the post-filter state; a first, row-wide pass shows the pre-filter state and later
        # passes redo only the bins whose left neighbour turned out different (see docs).
        shown = cur_pre
        post = cur_pre
        cut = np.zeros(col.shape[0], bool)
        filterable = np.zeros(w, bool)
        no_spread = np.zeros(w, bool)
        sel = np.arange(col.shape[0])          # soundings of the bins being (re)decided
        todo = np.ones(w, bool)
        passes = 0
        while True:
            passes += 1
            f, mean, thr = self._decide(above, cur_pre, shown, below)
            f &= active
            ok_thr = np.isfinite(thr) & (thr > 0)
            filterable = np.where(todo, f, filterable)
            no_spread = np.where(todo, f & ~ok_thr, no_spread)
            cutting = f & ok_thr
            c = col[sel]
            dev = row.depth[sel] - mean[c]
            hit = (dev >= thr[c]) if self.deep_only else (np.abs(dev) >= thr[c])
            cut[sel] = cutting[c] & candidates[sel] & hit
            val_sel = np.where(cut[sel], row.validity[sel] | _CUT, row.validity[sel])
            use = (val_sel & np.uint32(V.INVAL | V.DELETED | V.REFERENCE)) == 0
            if self.null_depth is not None:
                use &= row.depth[sel] < self.null_depth
            lib = _bin_stats(c, row.depth[sel], use, w)
            post = post.take(todo, cur_pre.take(filterable, lib))
            if not self.exact_raster:
                break
            changed = todo & post.differs(shown)
            changed[-1] = False
            if not changed.any():
                break
            shown = shown.take(changed, post)
            todo = np.zeros(w, bool)
            todo[1:] = changed[:-1]
            sel = np.flatnonzero(todo[col])
        val = np.where(cut, row.validity | _CUT, row.validity)
        idx = np.flatnonzero(cut)
        examined_mask = filterable[col]
        examined = int(examined_mask.sum())
        bad = int((examined_mask & ((val & _SKIP) != 0)).sum())
        addr = row.address
        if isinstance(addr, np.ndarray) and addr.shape[:1] == col.shape:
            addr = addr[idx]
        res = RowResult(row=y, index=idx, validity=val[idx], address=addr,
                        changed_cols=np.unique(col[idx]), examined=examined,
                        good=examined - bad, bad=bad)
        s = self.summary
        s.total += examined
        s.good += examined - bad
        s.bad += bad
        s.cut += int(idx.shape[0])
        s.bins_filtered += int(filterable.sum())
        s.bins_sparse += int((active & cur_pre.data & ~filterable).sum())
        s.bins_no_spread += int(no_spread.sum())
        s.rows += 1
        s.raster_passes += passes
        return res, post
