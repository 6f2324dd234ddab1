"""``check``: a full validity check that reads the parts with its own small
raw reader (header text, bit layouts from the header, ``.bin``/``.ndx``/``.cvg``
bytes), so that it does not trust the code that wrote the file and keeps going
on damaged bytes: anything wrong becomes a :class:`Problem`; only a header from
which no layout can be derived raises :class:`PfmFormatError` (path and byte
offset). It works in bands of bins in raster order; chains are walked for all
bins of a band at once, one step of chain depth at a time, with a bitmap over
the ``.ndx`` physical records to find records reached twice (a cycle, or a
record shared by two bins) and records reached by no bin (orphans). Only the
runs where the sparse ``.bin`` holds data are read, and only its records that
are not all zero walked (a hole is an empty bin by definition); the coverage
bytes of empty bins in ``.bin`` holes are checked in a pass of their own.

Its parts: :mod:`._check_parts` (paths, header, small files), :mod:`._check_walk` (the
chain walk), :mod:`._check_band` (one band's checks), :mod:`._problems` (the report).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from ..errors import PfmDaskError, PfmFormatError
from .. import validity as V
from ._chains import visit
from ._header import PfmHeader, version_number
from ._recompute import THREADS, ordered_imap
from ._recompute_kernel import record_fields
from ._sparse import (gather_runs, nonzero_records, positions_to_items, record_runs,
                      subtract_runs)
from ._check_band import (_BandContext, _check_band_data, _ExtremaCheck, _fast_band,
                          _walk_band, _walked_band)
from ._check_parts import (_COV_HEADER_SIZE, _Layout, _check_ctl, _check_cvg_header,
                           _check_handle, _check_header, _check_journal, _check_lin, _file_size,
                           _parts, _read_header)
from ._check_walk import _Walker
from ._problems import Problem, _Problems, _bin_where

__all__ = ["Problem", "check"]

_BAND_BINS = 1 << 17          # bin records per check band
_BAND_SOUNDINGS = 250_000     # soundings per check band (soft): bounds the check's memory
# (half of 1 << 18 and 500,000: 60 MB less at the peak, no slower; docs/performance.md)

def _split_by_soundings(cnt: np.ndarray, budget: int):
    """Cut a run of bins into consecutive pieces of at most ``budget`` soundings (>= 1 bin each)."""
    n = cnt.size
    csum = np.cumsum(np.minimum(cnt, budget))
    a = 0
    while a < n:
        base = csum[a - 1] if a else 0
        b = int(np.searchsorted(csum, base + budget, side="right"))
        b = max(b, a + 1)
        yield a, min(b, n)
        a = b


class _NotWalked(Exception):
    """A band the recompute's walk (``walked``) cannot answer for: check walks everything."""


def check(path, *, journal: bool = True, threads: int | None = None,
          band_soundings: int | None = None, bins: bool = True, walked=None,
          only=None) -> list[Problem]:
    """Full validity check of the PFM whose handle is ``path``; returns the problems found.

    See the module docstring and docs/pfm-format.md ("What check verifies").
    With ``journal`` (default), a pfm-dask load journal that is not ``complete``
    is reported as the first problem (the load's own final check passes False).
    ``bins=False``: only the fast structural checks (handle, lists, header, file
    sizes, coverage header), no pass over the bins. Raises
    :class:`PfmFormatError` only when there is no PFM at ``path`` or its header
    yields no record layout. ``threads`` (default
    :data:`pfm_dask.pfm._recompute.THREADS`) bands have their soundings
    checked at once while the next chains are walked; the problems, and
    their order, do not depend on it.

    Memory: bins go by bands of about ``band_soundings`` soundings (default
    :data:`_BAND_SOUNDINGS`; a bin is never split), at most ``threads`` + 1
    bands at once, and the ``.ndx`` pages a band read are unmapped once it is
    checked; beyond that the check holds per-bin arrays of a band and one bit
    per ``.ndx`` record (in a temporary file of the data directory when large).
    The resident memory does not grow with the number of soundings. The
    problems do not depend on ``band_soundings`` either.

    ``walked``: the :class:`._chains.ChainWalk` of the recompute that just rewrote every bin
    of this PFM (the load's final step). When it is ``clean`` and fits this ``.ndx``, the
    chains are not walked again: the visited map is the recompute's, its largest file and
    line numbers are tested against the ``.ctl`` and ``.lin``, and the bin statistics are
    not recomputed (they are what the same pass just wrote); every bin record, coverage
    byte, orphan and the header extrema are still checked from the bytes. Anything that pass
    cannot answer for (a deleted file, a dirty empty bin, ...) and the check runs whole, so
    the problems are those of the full check.

    ``only``: the bins (increasing numbers) that a new load wrote, every other bin of the grid
    being the empty bin the load created (the load's final step, when it wrote a few bins of
    a fine grid: ``_recompute.scattered``). Only those records (gathered through read-only
    maps) are read and their chains walked, instead of every data run of the sparse
    ``.bin``; the coverage bytes of all other bins are still checked, and a chain record no
    read bin reaches is still an orphan. A problem in a read bin is reported as the full
    check reports it; a non-zero record outside them goes unseen (``pfm-dask check``, with no
    ``only``, reads every bin).
    """
    parts = _parts(path)
    if not os.path.exists(parts["handle"]) and not os.path.isdir(parts["data"]):
        raise PfmFormatError("no PFM here (neither the handle file nor its .data directory exists)",
                             path=parts["handle"])
    pr = _Problems()
    if journal:
        _check_journal(parts, pr)
    _check_handle(parts, pr)
    sizes = {}
    for p in (".ctl", ".lin", ".bin", ".ndx", ".cvg"):
        sizes[p] = _file_size(parts[p])
    for p in (".bin", ".ndx", ".cvg"):
        if sizes[p] is None:
            pr.add(f"missing {p}", p, "", f"the {p} file is missing ({parts[p]})")
    n_files, deleted = _check_ctl(parts[".ctl"], pr)
    n_lines = _check_lin(parts[".lin"], pr)
    if sizes[".bin"] is None:
        return pr.finish()
    h = _read_header(parts[".bin"])
    lay = _Layout(h, version_number(h.version) >= 70)
    _check_header(h, sizes, lay, n_files, n_lines, pr)
    if sizes[".cvg"] is not None:
        _check_cvg_header(parts[".cvg"], pr)
    if not bins:   # the fast structural checks only (pfm_dask.pfm_guard)
        return pr.finish()
    threads = THREADS if threads is None else max(1, int(threads))
    budget = _BAND_SOUNDINGS if band_soundings is None else max(1, int(band_soundings))
    if _walk_fits(walked, sizes, lay, n_files, n_lines, deleted):
        trial = pr.copy()
        try:
            _check_bins(parts, h, lay, sizes, n_files, n_lines, deleted, trial, threads, budget,
                        walked=walked, only=only)
        except Exception:  # noqa: BLE001 - checked whole below
            pass
        else:
            return trial.finish()
    if threads > 1:
        # Pipelined; on any error the sequential pass below decides what is reported
        # (where it stops and what it found before), so the answer never depends on threads.
        trial = pr.copy()
        try:
            _check_bins(parts, h, lay, sizes, n_files, n_lines, deleted, trial, threads, budget,
                        only=only)
        except Exception:  # noqa: BLE001 - redone sequentially
            pass
        else:
            return trial.finish()
    try:
        _check_bins(parts, h, lay, sizes, n_files, n_lines, deleted, pr, 1, budget, only=only)
    except PfmDaskError:
        raise
    except (OSError, ValueError, IndexError, OverflowError, MemoryError) as exc:
        pr.add("check aborted", ".bin", "", f"the bin pass stopped on unreadable data: {exc}")
    return pr.finish()


def _walk_fits(walked, sizes, lay: _Layout, n_files, n_lines, deleted) -> bool:
    """Can the recompute's walk stand for this check's (see :func:`check`)?"""
    if walked is None or not walked.clean or sizes[".ndx"] is None or any(deleted):
        return False
    if walked.rsize != lay.phys or walked.n_phys != sizes[".ndx"] // lay.phys:
        return False
    if n_files is not None and walked.file_hi >= n_files:
        return False
    return n_lines is None or walked.line_hi < n_lines


def _check_bins(parts, h: PfmHeader, lay: _Layout, sizes, n_files, n_lines, deleted,
                pr: _Problems, threads: int = 1, budget: int | None = None,
                walked=None, only=None) -> None:
    """The bin pass: bands of bins in raster order, then orphans and header extrema.

    Each band is first checked by :func:`_fast_band` (on a thread pool of
    ``threads`` when there is more than one), which assumes that its chains
    are sound; in band order, the records it reached are then marked on the
    visited map (:func:`._chains.visit`). A band the fast path gives up on, or
    one that reaches a record reached before, is checked again exactly:
    :func:`_walk_band` on the visited map as the bands before left it, then
    :func:`_check_band_data`. Problems are merged, and the extrema folded, in
    band order, so neither depends on the path or on ``threads``. The band
    threads also read the ``.bin`` and ``.cvg`` chunk by chunk and cut the
    bands (the calling thread only merges). Once a band is walked, the pages of
    the ``.ndx`` map read so far are handed back (:meth:`_Walker.drop_pages`):
    the resident memory stays at the few bands in flight
    (:data:`_BAND_SOUNDINGS` soundings each), not the whole ``.ndx``.
    ``only``: the bins to read instead of the ``.bin``'s data runs (:func:`check`).
    """
    W, H = int(h.bin_width), int(h.bin_height)
    hs = int(h.bin_header_size)
    n_bins = W * H
    budget = _BAND_SOUNDINGS if budget is None else budget
    avail = max(0, (sizes[".bin"] - hs) // lay.bin_bytes)
    n_read = min(n_bins, avail)
    walker = _Walker(parts[".ndx"], sizes[".ndx"], lay, W, pr)
    cvg_fd = bin_map = cvg_map = None
    try:
        if sizes[".cvg"] is not None:
            cvg_fd = os.open(parts[".cvg"], os.O_RDONLY)
        ctx = _BandContext(h, lay, walker, cvg_fd, n_files, n_lines, deleted, budget)
        ext = _ExtremaCheck(W, ctx.null32)
        if walked is not None:      # the recompute's walk: its visited map, no walk here
            if walker.visited.bits.size != walked.bits.size:
                raise _NotWalked()
            walker.visited.bits[:] = walked.bits
            ctx.walked = True
        prewalked = walked is not None
        band_fn = _walked_band if prewalked else _fast_band

        def merge_one(band, bidx, recs, cover, local, fast) -> None:
            if prewalked:
                if fast is None:
                    raise _NotWalked()
                pr.merge(local, 2 * band + 1)
                ext.fold(fast[1])
            elif fast is not None and visit(walker.visited.bits, fast[0]):
                pr.merge(local, 2 * band + 1)
                ext.fold(fast[1])
            else:
                # something to report in this band, or a record reached before: the
                # exact walk, on the visited map as the bands before left it
                pr.slot = 2 * band
                walked = _walk_band(bidx, recs, cover, ctx, pr)
                pr.slot = 2 * band + 1
                ext.update(*_check_band_data(walked, ctx, pr))
                del walked
                walker.drop_pages()

        bs = lay.bin_bytes
        bin_fd = os.open(parts[".bin"], os.O_RDONLY)
        # ``only``: a few scattered bins, gathered through maps of the .bin and the .cvg (one
        # read a run cost more than the records); the bins are within the .bin (n_read)
        bin_map = cvg_map = None
        if only is not None:
            bin_map = _Mapped(bin_fd)
            cvg_map = _Mapped(cvg_fd) if cvg_fd is not None else None

        def job(chunk):
            """A chunk of the .bin's data runs, read and cut into bands, each band through
            ``band_fn``, on a band thread (the calling thread only merges, in band order):
            ``(bands, short)``, short when the .bin ended inside it."""
            lo, hi, at = chunk
            n, short = int(hi[-1] - lo[-1] + at[-1]), False
            if bin_map is not None:
                pos = positions_to_items(np.arange(n, dtype=np.int64), lo, at)
                buf = bin_map.gather(hs + pos * bs, bs).reshape(-1)
                cbuf = np.zeros(n, dtype=np.uint8)
                cvalid = np.zeros(n, dtype=bool)
                if cvg_map is not None:
                    cvalid = _COV_HEADER_SIZE + pos < cvg_map.size
                    cbuf[cvalid] = cvg_map.gather(_COV_HEADER_SIZE + pos[cvalid], 1).reshape(-1)
                pos = None
            else:
                buf = np.empty(n * bs, dtype=np.uint8)
                for a, b, p in zip(lo.tolist(), hi.tolist(), at.tolist()):
                    got = os.preadv(bin_fd, [memoryview(buf)[p * bs: (p + b - a) * bs]],
                                    hs + a * bs)
                    if got != (b - a) * bs:
                        n, short = p + got // bs, True
                        break
                # the pieces' coverage bytes (a band whose bytes the .cvg lacks skips the test)
                cbuf = np.empty(n, dtype=np.uint8)
                cvalid = np.zeros(n, dtype=bool)
            if n == 0:
                return [], True
            if cvg_fd is not None and bin_map is None:
                for a, b, p in zip(lo.tolist(), hi.tolist(), at.tolist()):
                    m = min(b - a, n - p)
                    if m <= 0:
                        break
                    got = os.preadv(cvg_fd, [memoryview(cbuf)[p: p + m]], _COV_HEADER_SIZE + a)
                    cvalid[p: p + got] = True
            recs = buf[: n * bs].reshape(n, bs)
            # all-zero records are empty bins: only their coverage bytes are checked
            nz = nonzero_records(recs)
            bins = positions_to_items(nz, lo, at)
            recs = recs[nz]
            cnt = record_fields(recs, lay.bin, ["count"])["count"].astype(np.int64)
            pieces = list(_split_by_soundings(cnt, budget)) if nz.size else [(0, 0)]
            out = []
            for i, (a, b) in enumerate(pieces):
                # the band's positions (for the coverage) reach the next band's first
                p0 = int(nz[a]) if i else 0
                p1 = int(nz[b]) if i + 1 < len(pieces) else n
                cover = None
                if p1 > p0 and cvalid[p0:p1].all():
                    cover = (positions_to_items(np.arange(p0, p1, dtype=np.int64), lo, at),
                             cbuf[p0:p1].copy())
                bidx = bins[a:b]
                local = _Problems()
                out.append((bidx, recs[a:b], cover, local,
                            band_fn(bidx, recs[a:b], cover, ctx, local)))
                if not prewalked:
                    # the .ndx pages the band read: resident memory stays at a few bands'
                    # worth (safe while other threads read the map: _Walker.drop_pages)
                    walker.drop_pages()
            return out, short

        band = 0
        try:
            # only what holds data: bins outside these runs are holes of the .bin (all-zero
            # records, valid empty bins); those the .cvg holds data for have their coverage
            # bytes checked afterwards (_check_empty_coverage)
            if only is None:
                runs = record_runs(bin_fd, hs, bs, 0, n_read)
                # short runs (a line crossing every row leaves one a row) share a chunk: the
                # positions in it map to bins piece by piece (positions_to_items)
                groups = gather_runs(runs, _BAND_BINS)
            else:
                runs = _bin_runs(only, n_read)
                groups = _gather_short_runs(runs, _BAND_BINS)
            chunks = ordered_imap(job, groups, threads, "pfm-check")
            try:
                for bands_, short in chunks:
                    for bidx, recs, cover, local, fast in bands_:
                        merge_one(band, bidx, recs, cover, local, fast)
                        band += 1
                    if short:
                        break
            finally:
                chunks.close()     # the band threads stopped before their file closes
        finally:
            os.close(bin_fd)
        pr.slot = 2 * band
        if cvg_fd is not None:
            held = record_runs(cvg_fd, _COV_HEADER_SIZE, 1, 0, n_read)
            if only is None:
                _check_empty_coverage(cvg_fd, subtract_runs(held, runs), W, pr)
            else:   # many short runs read: skipped by lookup, not subtracted run by run
                _check_empty_coverage(cvg_fd, held, W, pr, read=runs)
        # orphans
        if walker.n_phys:
            n_orphans, firsts = walker.visited.unset()
            if n_orphans:
                first = ", ".join(f"{int(x) * lay.phys:,}" for x in firsts)
                pr.add("orphans", ".ndx", "", f"{n_orphans:,} physical record(s) belong to no bin's "
                       f"chain (first at byte(s) {first})")
        ext.compare(h, pr)
    finally:
        walker.close()
        for m in (bin_map, cvg_map):
            if m is not None:
                m.close()
        if cvg_fd is not None:
            os.close(cvg_fd)


def _bin_runs(bins, n_read: int) -> np.ndarray:
    """Runs ``[a, b)`` of consecutive bins of ``bins`` (increasing) within ``[0, n_read)``."""
    bins = np.asarray(bins, dtype=np.int64)
    bins = bins[(bins >= 0) & (bins < n_read)]
    if bins.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    brk = np.flatnonzero(np.diff(bins) != 1) + 1
    return np.stack([bins[np.r_[0, brk]], bins[np.r_[brk, bins.size] - 1] + 1], axis=1)


def _gather_short_runs(runs: np.ndarray, limit: int):
    """:func:`._sparse.gather_runs` for many short runs, in numpy: groups of whole runs
    of about ``limit`` items (a group ends with the run that reaches it)."""
    if runs.shape[0] == 0:
        return
    size = runs[:, 1] - runs[:, 0]
    at = np.cumsum(size) - size
    group = at // max(1, int(limit))
    cuts = np.r_[0, np.flatnonzero(np.diff(group)) + 1, runs.shape[0]]
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        yield runs[a:b, 0].copy(), runs[a:b, 1].copy(), at[a:b] - at[a]


class _Mapped:
    """A part mapped read-only, for gathering many scattered records in one numpy step."""

    def __init__(self, fd: int):
        self.size = os.fstat(fd).st_size
        self._map = mmap.mmap(fd, self.size, prot=mmap.PROT_READ) if self.size else None
        self.bytes = (np.frombuffer(self._map, dtype=np.uint8) if self._map is not None
                      else np.zeros(0, dtype=np.uint8))

    def gather(self, offsets: np.ndarray, size: int) -> np.ndarray:
        """The ``size`` bytes at each of ``offsets`` (all within the part), as an (n, size) copy."""
        return self.bytes[offsets[:, None] + np.arange(size, dtype=np.int64)]

    def close(self) -> None:
        self.bytes = None
        if self._map is not None:
            self._map.close()
            self._map = None


def _check_empty_coverage(cvg_fd: int, runs: np.ndarray, W: int, pr: _Problems,
                          read: np.ndarray | None = None) -> None:
    """Coverage bytes of bins whose record is a hole of the ``.bin`` (empty: validity 0), in
    the ``runs`` where the ``.cvg`` holds data: none may set DATA, CHECKED or VERIFIED.
    ``read``: runs of bins whose coverage the bands checked (check's ``only``), skipped."""
    mask = V.COV_DATA | V.COV_CHECKED | V.COV_VERIFIED
    buf = np.empty(min(_BAND_BINS * 16, max(1, int((runs[:, 1] - runs[:, 0]).max(initial=1)))),
                   dtype=np.uint8)
    for a, b in runs.tolist():
        for lo in range(a, b, buf.size):
            hi = min(b, lo + buf.size)
            got = os.preadv(cvg_fd, [memoryview(buf)[: hi - lo]], _COV_HEADER_SIZE + lo)
            cov = buf[:got]
            bad = (cov & mask) != 0
            if read is not None and read.size and bad.any():
                at = lo + np.flatnonzero(bad)
                k = np.searchsorted(read[:, 0], at, side="right") - 1
                bad[at[(k >= 0) & (at < read[np.maximum(k, 0), 1])] - lo] = False
            for j in pr.each("coverage", ".cvg", bad):
                pr.add("coverage", ".cvg", _bin_where(lo + int(j), W),
                       f"coverage byte {int(cov[j]):#04x} disagrees with the bin flags "
                       "(DATA False, CHECKED False, VERIFIED False)")
