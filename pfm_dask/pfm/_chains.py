"""Chains of physical records followed in compiled passes, for the store's reader and the check.

:func:`chain_records` gives the records of many bins' chains in (bin, step)
order. The store's reader (the recompute, the area filter, dump) trusts the
file it reads but not blindly: anything out of place sends it to its
step-by-step walk, which names the problem. :func:`item_positions` then says
where each of their soundings is.

``check`` must find records reached twice across the whole ``.ndx`` (a cycle,
or a record shared by two bins), so its exact walk (``_check_walk._Walker.walk``)
tests and sets one visited map in band order, and cannot run on several
threads. Almost every band of a sound file has nothing to report, though, so
the check first follows each band's chains on its thread pool, without the
visited map, in the same compiled pass that reads their soundings
(``_check_kernel.check_sums``), and gives up on the band at the first
thing the exact walk would report. The main thread then visits (:func:`visit`) the
records a clean band reached, in band order: if none was reached before, the
band's answer is the exact walk's answer (no problem, the same records, in the
same order), and otherwise the exact walk redoes that band on the unchanged
map. So the problems never depend on which path ran; only the time does.
"""

from __future__ import annotations

import numpy as np

from .._numeric import CompiledKernels

__all__ = ["visit", "chain_records", "item_positions", "chain_plan", "ChainWalk"]


def _k_visit(bits, idx, n):
    """numba kernel: set the visited bit of each record in ``idx``, in order.

    Returns -1 when none was set before (counting a record twice in ``idx``) and
    all lie in ``0 .. n - 1``; otherwise the position of the first that was (or
    lies outside), with the bits this call set cleared again, so the map is as
    it was.
    """
    for i in range(idx.size):
        r = idx[i]
        if r < 0 or r >= n:
            for j in range(i):
                q = idx[j]
                bits[q >> 3] &= ~np.uint8(1 << (q & 7))
            return i
        m = np.uint8(1 << (r & 7))
        if bits[r >> 3] & m:
            for j in range(i):
                q = idx[j]
                bits[q >> 3] &= ~np.uint8(1 << (q & 7))
            return i
        bits[r >> 3] |= m
    return -1


def _k_chain_records(buf, rsize, wstart, wshift, mask, size, nrec, head, out):
    """numba kernel: the byte address of every record of every chain, in (bin, step) order.

    Returns -1, or the first bin whose chain has a record that is not a whole,
    aligned record of the ``size`` bytes, or a continuation pointer of 0
    before its ``nrec`` records.
    """
    k = 0
    for b in range(nrec.size):
        cur = head[b]
        for s in range(nrec[b]):
            if cur < 0 or (cur == 0 and s > 0) or cur % rsize != 0 or cur + rsize > size:
                return b
            out[k] = cur
            k += 1
            if s + 1 < nrec[b]:
                p = cur + wstart
                w = np.uint64(0)
                for i in range(8):
                    w = (w << np.uint64(8)) | np.uint64(buf[p + i])
                cur = np.int64((w >> np.uint64(wshift)) & mask)
    return -1


def _k_item_positions(base, recaddr, nrec, cnt, bidx, L, width, pos, bin_index, row, col,
                      rec_off, slot):
    """numba kernel: per sounding of the chains, in chain order, its item position
    (``base[k] * L + slot`` of its record k) and, for the outputs that are not empty, its bin,
    the bin's row and column, its record's byte address and its slot in the record."""
    want_b = bin_index.size > 0
    want_rc = row.size > 0
    want_a = rec_off.size > 0
    i = 0
    k = 0
    for b in range(nrec.size):
        c = cnt[b]
        bi = bidx[b]
        r = bi // width
        cc = bi - r * width
        for s in range(nrec[b]):
            m = min(L, c - s * L)
            p0 = base[k] * L
            a = recaddr[k]
            for j in range(m):
                pos[i] = p0 + j
                if want_b:
                    bin_index[i] = bi
                if want_rc:
                    row[i] = r
                    col[i] = cc
                if want_a:
                    rec_off[i] = a
                    slot[i] = j
                i += 1
            k += 1


def _k_chain_plan(start, n, c0, L, base, rsize, counts, fill, used, rem, m, cum_m, first_new,
                  last_new, total):
    """numba kernel: where each bin's new soundings go (see :func:`chain_plan`), one pass.

    Returns (new records in all, the largest new count, bins whose old tail
    record is filled or linked).
    """
    nb = start.size
    M = 0
    tmax = 0
    ntail = 0
    for j in range(nb):
        e = start[j + 1] if j + 1 < nb else n
        c = e - start[j]
        old = np.int64(c0[j])
        u = old % L
        f = min(L - u, c) if u > 0 else 0
        r = c - f
        mm = (r + L - 1) // L
        counts[j] = c
        used[j] = u
        fill[j] = f
        rem[j] = r
        m[j] = mm
        cum_m[j] = M
        first_new[j] = base + M * rsize
        last_new[j] = base + (M + mm - 1) * rsize
        M += mm
        t = old + c
        total[j] = t
        if t > tmax:
            tmax = t
        if old > 0 and (f > 0 or mm > 0):
            ntail += 1
    return M, tmax, ntail


def _signatures(T) -> dict:
    ro = dict(readonly=True)
    u1, i8 = T.Array(T.uint8, 1, "C", **ro), T.Array(T.int64, 1, "C", **ro)
    return {
        "visit": T.int64(T.Array(T.uint8, 1, "C"), i8, T.int64),
        "item_positions": T.void(i8, i8, i8, i8, i8, T.int64, T.int64,
                                 *(T.Array(T.int64, 1, "C"),) * 6),
        "chain_plan": T.UniTuple(T.int64, 3)(i8, T.int64, T.Array(T.uint64, 1, "C", **ro), T.int64,
                                             T.int64, T.int64, *(T.Array(T.int64, 1, "C"),) * 9),
        "chain_records": T.int64(u1, T.int64, T.int64, T.int64, T.uint64, T.int64, i8, i8,
                                 T.Array(T.int64, 1, "C")),
    }


_kernel = CompiledKernels(globals(), _signatures)


def visit(bits: np.ndarray, idx: np.ndarray, n: int | None = None) -> bool:
    """Mark records ``idx`` visited; False (and the map unchanged) if any was reached before,
    or lies outside ``0 .. n - 1`` (default: the map's bits)."""
    n = bits.size * 8 if n is None else int(n)
    return _kernel("visit")(bits, np.ascontiguousarray(idx, dtype=np.int64), n) < 0


def chain_records(buf: np.ndarray, rsize: int, wstart: int, wshift: int, pointer_bits: int,
                  nrec: np.ndarray, head: np.ndarray) -> np.ndarray | None:
    """Byte addresses of the ``nrec[b]`` records of each chain from ``head[b]``, bin by bin.

    ``buf``: the whole ``.ndx``; each continuation pointer is the big-endian
    64-bit word at byte ``wstart`` of its record shifted right by ``wshift``
    and cut to ``pointer_bits``. ``None``
    when a chain leaves the file's whole, aligned records or ends early: the
    caller's own walk then says where.
    """
    nrec = np.ascontiguousarray(nrec, dtype=np.int64)
    out = np.empty(int(nrec.sum()), dtype=np.int64)
    mask = np.uint64((1 << pointer_bits) - 1)
    bad = _kernel("chain_records")(buf, int(rsize), int(wstart), int(wshift), mask, int(buf.size),
                                   nrec, np.ascontiguousarray(head, dtype=np.int64), out)
    return out if bad < 0 else None


def item_positions(base: np.ndarray, recaddr: np.ndarray, nrec: np.ndarray, cnt: np.ndarray,
                   bidx: np.ndarray, L: int, width: int, *, bins: bool, rows: bool,
                   addresses: bool) -> dict:
    """Where each sounding of the chains is, in chain order (see :func:`_k_item_positions`).

    Returns ``pos`` (item positions for ``unpack_records``) and, as asked,
    ``bin_index``, ``row`` and ``col``, ``record_offset`` and ``slot``: one
    pass instead of a dozen array operations over every sounding.
    """
    n = int(np.asarray(cnt).sum())
    i8 = np.int64

    want = {"pos": True, "bin_index": bins, "row": rows, "col": rows,
            "record_offset": addresses, "slot": addresses}
    out = {k: np.empty(n if w else 0, dtype=i8) for k, w in want.items()}
    c = lambda a: np.ascontiguousarray(a, dtype=i8)  # noqa: E731
    _kernel("item_positions")(c(base), c(recaddr), c(nrec), c(cnt), c(bidx), int(L), int(width),
                              *out.values())
    return {k: v for k, v in out.items() if want[k]}


_PLAN_KEYS = ("counts", "fill", "used", "rem", "m", "cum_m", "first_new", "last_new", "total")


def chain_plan(start: np.ndarray, n: int, old_count: np.ndarray, L: int, base: int,
               rsize: int) -> dict:
    """Where the soundings of an append go, bin by bin, in one pass.

    Bin ``j`` gets soundings ``start[j]`` up to the next start (or ``n``); it
    held ``old_count[j]`` before. Its old tail record's free slots take the
    first ``fill`` of them (``used`` slots were taken), the other ``rem`` go to
    ``m`` new records, the bin's run of new records starting after
    ``cum_m`` others, at byte ``first_new`` (``base`` + ``cum_m`` records of
    ``rsize`` bytes) and ending at ``last_new``; ``total`` is its new count.
    Returns those arrays (int64) and ``M`` (new records in all), ``max_total``
    and ``n_tail`` (bins whose old tail record changes).
    """
    start = np.ascontiguousarray(start, dtype=np.int64)
    out = {k: np.empty(start.size, dtype=np.int64) for k in _PLAN_KEYS}
    M, tmax, ntail = _kernel("chain_plan")(start, int(n), np.ascontiguousarray(old_count, dtype=np.uint64),
                                           int(L), int(base), int(rsize), *out.values())
    out.update(M=int(M), max_total=int(tmax), n_tail=int(ntail))
    return out


class ChainWalk:
    """The chain walk of a load's recompute, kept for the check that follows it.

    The recompute of a new PFM follows every bin's chain through the ``.ndx`` in raster
    order; given one of these, it also does what the check's walk does (the records each
    chain reaches marked on a visited map in band order, each chain's end compared with its
    tail, the largest file and line numbers of its soundings), so that ``check(...,
    walked=this)`` need not walk the chains again. :attr:`clean` is True only when every
    bin with soundings was walked that way and nothing was out of place: no record reached
    twice, every chain ending at its tail. Otherwise the check walks everything itself.
    """

    def __init__(self):
        self.clean = False
        self.bits = np.zeros(0, dtype=np.uint8)
        self.n_phys = 0
        self.rsize = 0
        self.file_hi = -1
        self.line_hi = -1

    def begin(self, n_phys: int, rsize: int) -> None:
        """A new walk over an ``.ndx`` of ``n_phys`` records of ``rsize`` bytes."""
        self.clean = True
        self.n_phys, self.rsize = int(n_phys), int(rsize)
        self.bits = np.zeros((self.n_phys + 7) // 8, dtype=np.uint8)
        self.file_hi = self.line_hi = -1

    def grow(self, n_phys: int) -> None:
        """The ``.ndx`` has grown to ``n_phys`` records (a walk made while a load still
        appends: :mod:`._tiles`); the records already visited stay visited."""
        if not self.clean or n_phys <= self.n_phys:
            return
        bits = np.zeros((int(n_phys) + 7) // 8, dtype=np.uint8)
        bits[:self.bits.size] = self.bits
        self.bits, self.n_phys = bits, int(n_phys)

    def spoil(self) -> None:
        """Some bins were not walked this way: the check walks everything."""
        self.clean = False
        self.bits = np.zeros(0, dtype=np.uint8)

    def add(self, rec_idx: np.ndarray, ends_ok: bool, file_hi: int, line_hi: int) -> None:
        """A band's walk, in band order (raster order)."""
        if not self.clean:
            return
        if not ends_ok:
            self.spoil()
            return
        if not visit(self.bits, rec_idx, self.n_phys):   # a revisit, or outside the .ndx
            self.spoil()
            return
        self.file_hi = max(self.file_hi, int(file_hi))
        self.line_hi = max(self.line_hi, int(line_hi))
