"""The area filter: pfmLoader's 3 x 3-bin statistical depth filter, row-streaming, with its bugs fixed.

pfmLoader (``abe-pfmLoader : pfmFilter.cpp``; docs/filters.md §3) compares every sounding of a bin
with the mean of the 3 x 3 block of bins around it and cuts those more than
``cellstd x 2 x spread`` deeper (or, two-sided, away). This module runs the same algorithm one
bin row at a time from caller callbacks, holding at most three rows; a compiled kernel walks
each row in pfmLoader's raster order (a loop per bin, one pass).
Fixed relative to pfmLoader (docs/filters.md §3): the first and last rows are filtered (the block is
clipped at the grid edges), a zero or undefined spread cuts nothing, and statistics are computed
in double precision with a two-pass variance. Bins are not recomputed here: the kernel reports
the soundings and bins that changed and the caller recomputes every bin afterwards.
See ``docs/filters.md``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator

import numpy as np

from .._numeric import CompiledKernels
from ..errors import ConfigError
from .. import validity as V

__all__ = ["AreaFilter", "AreaFilterSummary", "RowResult", "RowSoundings"]

_CUT = np.uint32(V.FILTER_INVAL | V.MODIFIED)
_SKIP = np.uint32(V.INVAL | V.DELETED)          # left out of pfmLoader's filter statistics
_POST_SKIP = np.uint32(V.INVAL | V.DELETED | V.REFERENCE)   # and of the library's bin statistics

# The 3 x 3 block in pfmLoader's summation order (row y-1, y, y+1; column x-1, x, x+1).
_BLOCK = [(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)]


@dataclass(frozen=True)
class RowSoundings:
    """All soundings of one row of bins, as the caller reads them.

    ``col``: bin column (0 .. width-1) of each sounding; ``depth`` (metres, positive down);
    ``validity`` (PFM words). ``address`` is opaque to the filter: when it is an array with one
    entry per sounding, results carry the entries of the changed soundings, otherwise it is
    passed back as is. ``active``: optional boolean per bin column, the bins to filter
    (pfmLoader filters only bins that received new soundings); ``None`` means every bin.
    ``pre``: optional ``(data, avg, std)`` per bin column, the row's pre-filter statistics
    when the caller has them already (the mean and sample std of the soundings neither
    INVAL nor DELETED, summed in sounding order, exactly as the filter computes them);
    ``None``: the filter computes them.
    """

    col: np.ndarray
    depth: np.ndarray
    validity: np.ndarray
    address: Any = None
    active: np.ndarray | None = None
    pre: Any = None

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

    def as_dict(self) -> dict:
        return asdict(self)

    def add(self, other: "AreaFilterSummary") -> None:
        """Add ``other``'s totals (rows filtered apart, e.g. in bands)."""
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def count_row(self, counts, rows: int = 1) -> None:
        """Add a row's kernel counts (or ``rows`` rows'): examined, bad, cut, bins filtered,
        sparse, no spread."""
        examined, bad, n_cut, filtered, sparse, no_spread = (int(c) for c in counts[:6])
        self.total += examined
        self.good += examined - bad
        self.bad += bad
        self.cut += n_cut
        self.bins_filtered += filtered
        self.bins_sparse += sparse
        self.bins_no_spread += no_spread
        self.rows += rows


class _Stats:
    """Per-bin statistics of one row as the filter sees them (no data => avg = std = 0)."""

    __slots__ = ("data", "avg", "std")

    def __init__(self, data: np.ndarray, avg: np.ndarray, std: np.ndarray):
        self.data, self.avg, self.std = data, avg, std

    @classmethod
    def none(cls, width: int) -> "_Stats":
        return cls(np.zeros(width, np.bool_), np.zeros(width), np.zeros(width))

    def same(self, other: "_Stats") -> bool:
        """Bit for bit the same statistics (what a row hands the next: see AreaFilter.band)."""
        return (np.array_equal(self.data, other.data)
                and np.array_equal(self.avg.view(np.uint64), other.avg.view(np.uint64))
                and np.array_equal(self.std.view(np.uint64), other.std.view(np.uint64)))


# ---------------------------------------------------------------------------------- kernels
# Compiled with numba on first use (cached on disk), without fastmath: every sum is the plain
# IEEE double operation in the order written, the order pfmLoader's loops and the test's
# reference use. nogil: the writer's other threads run meanwhile.

def _k_row_stats(col, z, v, skip, null_depth, data, avg, std):
    """Mean and sample std (two-pass, 0 when n <= 1) per column of the soundings carrying no
    bit of ``skip`` and shallower than ``null_depth``; sums in sounding order. Soundings
    grouped by column (a row read bin by bin, as the writer reads it) take one pass per
    column's run, the same sums in the same order."""
    w = data.shape[0]
    n_snd = col.shape[0]
    grouped = True
    for i in range(1, n_snd):
        if col[i] < col[i - 1]:
            grouped = False
            break
    if grouped:
        for x in range(w):
            data[x] = False
            avg[x] = 0.0
            std[x] = 0.0
        a = 0
        while a < n_snd:
            c = col[a]
            b = a
            n = 0
            s = 0.0
            while b < n_snd and col[b] == c:
                if (v[b] & skip) == 0 and z[b] < null_depth:
                    n += 1
                    s += z[b]
                b += 1
            data[c] = n > 0
            m = s / n if n > 0 else 0.0
            avg[c] = m
            if n > 1:
                ss = 0.0
                for i in range(a, b):
                    if (v[i] & skip) == 0 and z[i] < null_depth:
                        d = z[i] - m
                        ss += d * d
                std[c] = np.sqrt(ss / (n - 1))
            a = b
        return
    n = np.zeros(w, np.int64)
    s = np.zeros(w)
    for i in range(n_snd):
        if (v[i] & skip) == 0 and z[i] < null_depth:
            n[col[i]] += 1
            s[col[i]] += z[i]
    for x in range(w):
        data[x] = n[x] > 0
        avg[x] = s[x] / n[x] if n[x] > 0 else 0.0
        s[x] = 0.0
    for i in range(n_snd):
        if (v[i] & skip) == 0 and z[i] < null_depth:
            d = z[i] - avg[col[i]]
            s[col[i]] += d * d
    for x in range(w):
        std[x] = np.sqrt(s[x] / (n[x] - 1)) if n[x] > 1 else 0.0


def _block(x, a_data, a_avg, a_std, p_data, p_avg, p_std, b_data, b_avg, b_std, q_data, q_avg,
           q_std, exact_raster, dxs, cellstd, max_slope, min_cells, c_data, c_avg, c_std,
           counts):
    """Bin ``x``'s 3 x 3 block (docs/filters.md §3): whether the bin is filtered (the block
    has ``min_cells`` cells with data), whether its threshold is usable, the cells' mean and
    the threshold ``cellstd x spread``; ``counts`` [3], [4], [5] (filtered, sparse, no
    spread) counted. Rows as :func:`_k_filter_row` names them; ``c_*``: scratch for the nine
    cells. Shared with the filter's pass over a load's per-bin sums (``pfm._area_sums``),
    which must decide exactly as this one."""
    w = p_data.shape[0]
    # the 3 x 3 block in pfmLoader's order: rows y-1, y, y+1; columns x-1, x, x+1
    count = 0
    avgsum = 0.0
    stdsum = 0.0
    for k in range(9):
        dy = k // 3 - 1
        j = x + k % 3 - 1
        if j < 0 or j >= w:
            c_data[k] = False
        elif dy == -1:
            c_data[k], c_avg[k], c_std[k] = a_data[j], a_avg[j], a_std[j]
        elif dy == 1:
            c_data[k], c_avg[k], c_std[k] = b_data[j], b_avg[j], b_std[j]
        elif j < x and exact_raster:
            c_data[k], c_avg[k], c_std[k] = q_data[j], q_avg[j], q_std[j]
        else:
            c_data[k], c_avg[k], c_std[k] = p_data[j], p_avg[j], p_std[j]
        if c_data[k]:
            count += 1
            avgsum = avgsum + c_avg[k]
            stdsum = stdsum + c_std[k]
    if count < min_cells:
        counts[4] += 1
        return False, False, 0.0, 0.0
    mean = avgsum / count
    flat = True
    ss = 0.0
    for k in range(9):
        if c_data[k]:
            if k != 4 and np.abs(c_avg[4] - c_avg[k]) / dxs[k] > max_slope:
                flat = False
            d = c_avg[k] - mean
            ss = ss + d * d
    if flat:
        spread = 2.0 * (stdsum / count)
    else:
        spread = 2.0 * np.sqrt(ss / max(count - 1, 1))
    thr = cellstd * spread
    ok = np.isfinite(thr) and thr > 0
    counts[3] += 1
    if not ok:
        counts[5] += 1
    return True, ok, mean, thr


def _cut_bin(z, v, lo, hi, order, grouped, ok, mean, thr, deep_only, cut_reference, skip,
             post_skip, cut_bits, ref_bit, null_depth, cut, cut_idx, counts):
    """A filtered bin's soundings ``lo .. hi - 1`` (through ``order`` unless ``grouped``):
    the cut ones marked in ``cut`` and listed in ``cut_idx``, the counts (examined, bad,
    cut) added, and its post-filter statistics (two-pass, in sounding order) returned as
    (data, mean, std). Shared with ``pfm._area_sums``, which must cut exactly as this."""
    n = 0
    s = 0.0
    for r in range(lo, hi):
        i = r if grouped else order[r]
        vi = v[i]
        if ok and (vi & skip) == 0 and (cut_reference or (vi & ref_bit) == 0):
            dev = z[i] - mean
            if (dev >= thr) if deep_only else (np.abs(dev) >= thr):
                cut[i] = 1
                vi = vi | cut_bits
                cut_idx[counts[2]] = i
                counts[2] += 1
        counts[0] += 1
        if (vi & skip) != 0:
            counts[1] += 1
        if (vi & post_skip) == 0 and z[i] < null_depth:
            n += 1
            s += z[i]
    avg = s / n if n > 0 else 0.0
    ss = 0.0
    for r in range(lo, hi):
        i = r if grouped else order[r]
        vi = v[i] | cut_bits if cut[i] else v[i]
        if (vi & post_skip) == 0 and z[i] < null_depth:
            d = z[i] - avg
            ss += d * d
    return n > 0, avg, (np.sqrt(ss / (n - 1)) if n > 1 else 0.0)


def _k_filter_row(col, z, v, active, a_data, a_avg, a_std, p_data, p_avg, p_std,
                  b_data, b_avg, b_std, dxs, cellstd, max_slope, null_depth, deep_only,
                  exact_raster, min_cells, cut_reference, skip, post_skip, cut_bits, ref_bit,
                  cut, cut_idx, q_data, q_avg, q_std, counts):
    """One row of the area filter in pfmLoader's raster order (docs/filters.md §3, bugs fixed).

    Row y-1's post-filter statistics ``a_*``, this row's pre-filter ``p_*``, row y+1's
    pre-filter ``b_*``; bin x sees bin x-1 after filtering (``exact_raster``) or before.
    Writes ``cut`` (1 per sounding cut), this row's post-filter statistics ``q_*`` (the
    library's: REFERENCE and null depths left out, for bins that were filtered; the pre-filter
    ones elsewhere) and ``counts``: examined, bad, cut, bins filtered, sparse, no spread;
    ``cut_idx[:counts[2]]`` the soundings cut, in the order found.
    """
    w = p_data.shape[0]
    n_snd = col.shape[0]
    # the soundings of each column, in their order (a stable counting sort; none needed
    # when they come grouped by column, as the writer reads a row: then order[r] = r)
    first = np.zeros(w + 1, np.int64)
    grouped = True
    for i in range(n_snd):
        first[col[i] + 1] += 1
        if i > 0 and col[i] < col[i - 1]:
            grouped = False
    for x in range(w):
        first[x + 1] += first[x]
    order = np.empty(0 if grouped else n_snd, np.int64)
    if not grouped:
        fill = first[:w].copy()
        for i in range(n_snd):
            order[fill[col[i]]] = i
            fill[col[i]] += 1
    for x in range(w):
        q_data[x] = p_data[x]
        q_avg[x] = p_avg[x]
        q_std[x] = p_std[x]
    c_data = np.zeros(9, np.bool_)
    c_avg = np.zeros(9)
    c_std = np.zeros(9)
    for x in range(w):
        if not (active[x] and p_data[x]):
            continue
        filtered, ok, mean, thr = _block(x, a_data, a_avg, a_std, p_data, p_avg, p_std,
                                         b_data, b_avg, b_std, q_data, q_avg, q_std,
                                         exact_raster, dxs, cellstd, max_slope, min_cells,
                                         c_data, c_avg, c_std, counts)
        if not filtered:
            continue
        q_data[x], q_avg[x], q_std[x] = _cut_bin(
            z, v, first[x], first[x + 1], order, grouped, ok, mean, thr, deep_only,
            cut_reference, skip, post_skip, cut_bits, ref_bit, null_depth, cut, cut_idx, counts)


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    i8r, f8r = T.Array(T.int64, 1, "C", **ro), T.Array(T.float64, 1, "C", **ro)
    u4r, br = T.Array(T.uint32, 1, "C", **ro), T.Array(T.bool_, 1, "C", **ro)
    f8, b1, u1 = T.Array(T.float64, 1, "C"), T.Array(T.bool_, 1, "C"), T.Array(T.uint8, 1, "C")
    i8 = T.Array(T.int64, 1, "C")
    return {
        "row_stats": T.void(i8r, f8r, u4r, T.uint32, T.float64, b1, f8, f8),
        "filter_row": T.void(i8r, f8r, u4r, br, br, f8r, f8r, br, f8r, f8r, br, f8r, f8r,
                             f8r, T.float64, T.float64, T.float64, T.boolean, T.boolean,
                             T.int64, T.boolean, T.uint32, T.uint32, T.uint32, T.uint32,
                             u1, i8, b1, f8, f8, i8),
    }


#: the compiled ``_k_<name>`` (compiled, or loaded from the on-disk cache, on first use)
_kernel = CompiledKernels(globals(), _signatures, ("_block", "_cut_bin"),
                          helper_options={"inline": "always"})


def _row_stats(row: "RowSoundings", skip: int, width: int, null_depth: float = np.inf) -> _Stats:
    out = _Stats(np.empty(width, np.bool_), np.empty(width), np.empty(width))
    _kernel("row_stats")(row.col, row.depth, row.validity, np.uint32(skip), float(null_depth),
                         out.data, out.avg, out.std)
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
        self._dxs = np.array([self.bin_diagonal if (dy and dx) else side for dy, dx in _BLOCK])
        self._null = np.inf if null_depth is None else float(null_depth)
        self._all_active = np.ones(self.width, np.bool_)

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
        return self._rows(read_row, 0, self.height, _Stats.none(self.width), self.summary, {})

    def band(self, read_row: Callable[[int], RowSoundings | None], y0: int, y1: int,
             above: "_Stats | None" = None, keep_from: int | None = None) -> dict:
        """Filter rows ``y0 .. y1 - 1`` alone, from ``above``: row y0 - 1's post-filter
        statistics (``None``: a row without data), as :meth:`iter_rows` would have them.

        Row y's result depends on the rows' soundings and on row y - 1's post-filter
        statistics only, so a band started from the true statistics gives the rows of the
        whole pass; started from a guess, its rows are right from the first row whose
        previous row's statistics come out bit for bit as the true ones (``boundary``).
        Returns ``results`` (the :class:`RowResult` of rows ``keep_from`` (default y0) ..
        y1 - 1), ``summary`` (their totals, :class:`AreaFilterSummary`), ``boundary`` (row
        ``keep_from`` - 1's post-filter statistics when ``keep_from`` > y0) and ``post``
        (row y1 - 1's). Reads rows y0 .. y1 (y1 as the row below, when it exists).
        """
        keep_from = y0 if keep_from is None else int(keep_from)
        if above is None:
            above = _Stats.none(self.width)
        out: dict = {"results": [], "summary": AreaFilterSummary(), "boundary": None}
        counted = AreaFilterSummary()       # the rows before keep_from: not part of the band
        state: dict = {}
        for res in self._rows(read_row, y0, y1, above, None, state,
                              lambda y: out["summary"] if y >= keep_from else counted):
            if res.row == keep_from - 1:
                out["boundary"] = state["post"]
            if res.row >= keep_from:
                out["results"].append(res)
        out["post"] = state.get("post", above)
        return out

    @staticmethod
    def none_stats(width: int) -> "_Stats":
        """The statistics of a row without data (the state at the top of the grid)."""
        return _Stats.none(width)

    def pre_stats(self, row: RowSoundings | None, y: int) -> "_Stats":
        """Row ``y``'s pre-filter statistics: a guess at its post-filter ones (:meth:`band`)."""
        return self._pre(self._check(row, y))

    def _rows(self, read_row, y0: int, y1: int, above: "_Stats", summary, state: dict,
              summary_of=None) -> Iterator[RowResult]:
        """Rows ``y0 .. y1 - 1`` from ``above`` (row y0 - 1's post-filter statistics); the
        totals go to ``summary`` (or ``summary_of(y)``), the last row's post-filter
        statistics to ``state["post"]``."""
        w = self.width
        cur = self._check(read_row(y0), y0) if y0 < y1 else None
        cur_pre = self._pre(cur) if cur is not None else None
        for y in range(y0, y1):
            if y + 1 < self.height:
                nxt = self._check(read_row(y + 1), y + 1)
                nxt_pre = self._pre(nxt)
            else:
                nxt, nxt_pre = None, _Stats.none(w)
            res, post = self._process(y, cur, above, cur_pre, nxt_pre,
                                      summary if summary_of is None else summary_of(y))
            above = post
            state["post"] = post
            cur, cur_pre = nxt, nxt_pre
            del nxt
            yield res

    # ------------------------------------------------------------------ internals
    def _check(self, row: RowSoundings | None, y: int) -> RowSoundings:
        if row is None:
            return RowSoundings.empty()
        col = np.ascontiguousarray(row.col, dtype=np.int64)
        n = col.shape[0]
        depth = np.ascontiguousarray(row.depth, dtype=np.float64)
        val = np.ascontiguousarray(row.validity, dtype=np.uint32)
        if depth.shape != (n,) or val.shape != (n,):
            raise ValueError(f"row {y}: col, depth and validity must have the same length")
        if n and (col.min() < 0 or col.max() >= self.width):
            raise ValueError(f"row {y}: bin column outside 0..{self.width - 1}")
        active = row.active
        if active is not None:
            active = np.ascontiguousarray(active, dtype=np.bool_)
            if active.shape != (self.width,):
                raise ValueError(f"row {y}: active must have one entry per bin column")
        pre = row.pre
        if pre is not None:
            pre = tuple(np.ascontiguousarray(a, dtype=t)
                        for a, t in zip(pre, (np.bool_, np.float64, np.float64)))
            if any(a.shape != (self.width,) for a in pre):
                raise ValueError(f"row {y}: pre must have one entry per bin column")
        return RowSoundings(col, depth, val, row.address, active, pre)

    def _pre(self, row: RowSoundings) -> _Stats:
        """pfmLoader's filter statistics: soundings neither INVAL nor DELETED, REFERENCE included."""
        if row.pre is not None:
            return _Stats(*row.pre)
        return _row_stats(row, int(_SKIP), self.width)

    def _process(self, y: int, row: RowSoundings, above: _Stats, cur_pre: _Stats,
                 below: _Stats, s: "AreaFilterSummary"):
        """Filter row ``y`` (one pass of :func:`_k_filter_row` in raster order)."""
        w = self.width
        col = row.col
        active = self._all_active if row.active is None else row.active
        cut = np.zeros(col.shape[0], np.uint8)
        cut_idx = np.empty(col.shape[0], np.int64)    # untouched pages cost nothing
        post = _Stats(np.empty(w, np.bool_), np.empty(w), np.empty(w))
        counts = np.zeros(6, np.int64)
        _kernel("filter_row")(
            col, row.depth, row.validity, active, above.data, above.avg, above.std,
            cur_pre.data, cur_pre.avg, cur_pre.std, below.data, below.avg, below.std, self._dxs,
            self.cellstd, self.max_slope, self._null, self.deep_only, self.exact_raster,
            self.min_cells, self.cut_reference, _SKIP, _POST_SKIP, _CUT, np.uint32(V.REFERENCE),
            cut, cut_idx, post.data, post.avg, post.std, counts)
        idx = np.sort(cut_idx[:counts[2]])      # as np.flatnonzero(cut), without its pass
        examined, bad = int(counts[0]), int(counts[1])
        addr = row.address
        if isinstance(addr, np.ndarray) and addr.shape[:1] == col.shape:
            addr = addr[idx]
        res = RowResult(row=y, index=idx, validity=row.validity[idx] | _CUT, address=addr,
                        changed_cols=np.unique(col[idx]), examined=examined,
                        good=examined - bad, bad=bad)
        s.count_row(counts)
        return res, post
