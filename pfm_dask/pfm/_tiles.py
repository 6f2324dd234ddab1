"""The recompute of a new PFM's bins while its load still writes, tile by tile, beside it.

A survey's lines cross the grid one after another, so most of its bins receive their last
sounding long before the load ends. :class:`TileRecompute` follows which tiles of
:data:`TILE` x :data:`TILE` bins each group of pieces wrote; once a tile has gone
:data:`LAG` groups without a write, a thread of its own recomputes its bins while the writer
goes on (the compiled pass of the final recompute, :class:`._recompute.BandRecompute`),
walks their chains for the check (:class:`._chains.ChainWalk`) and keeps their header
extrema candidates (:class:`._extrema.Candidates`). The final step then recomputes only
the tiles not done. The result is the bytes of one recompute at the end (the tests compare
them); only the time differs.

Sharing the files with the writer, by one lock (:attr:`TileRecompute.lock`): the writer
holds it for each call that adds soundings, and bumps the generation of the tiles it wrote
before letting go. The thread notes the generations under it, waits until the writes the
writer had queued are in the files, maps the ``.ndx``, reads and computes the tiles it was
handed without the lock, and takes it once again to write them: those no write reached
meanwhile, after the writer's queued writes have landed (its read-modify-write of bin
records also rewrites the records between its bins, which may be ours). A later write into a done tile makes its
rectangle not done again (the walk is then spoiled: the check walks the chains itself).

Columns of tiles, not rows: lines run across rows as often as along them, and a band of
rows is only finished when the last line crossing it is. On the 74-file benchmark survey
94 % of the bins are done before the last group (docs/performance.md).

With the area filter, which changes soundings after the load, :meth:`TileRecompute.finish`
also recomputes the bins the filter changed, as from the records the writer left
(``fresh``: a bin whose valid soundings were all cut keeps no std nor "surveyed" of the
tile's), and sets the extrema of the rectangles whose best bin changed right
(:meth:`TileRecompute._refresh`).

Plain numpy and threads: no Dask. Not for appends (the recompute there also clears flags of
old bins) or a resumed load (its earlier tiles are not known): ``PfmWriter`` keeps the one
recompute there.
"""

from __future__ import annotations

import os
import queue
import threading
import time

import numpy as np

from ._chains import ChainWalk
from .. import validity as V
from .._numeric import nint
from ._extrema import KEYS, Candidates, _Extrema
from ._io import RMW_GAP, Spans
from ._recompute import BAND_SOUNDINGS, BandRecompute, _cuts, _raw_jobs, ordered_imap
from ._area_sums import as_sums
from ._recompute_kernel import NdxView, record_fields

__all__ = ["EARLY", "TILE", "LAG", "RUN_TILES", "TileRecompute"]

#: The extrema whose values the area filter can change (of :data:`._extrema.KEYS`): the
#: filtered depths and the std. It only sets FILTER_INVAL and MODIFIED on soundings, which
#: leave a bin's count and its depths of every used sounding as they were.
FILTERED_KEYS = np.array([k[0] in ("min_filtered_depth", "max_filtered_depth",
                                   "min_standard_deviation", "max_standard_deviation")
                          for k in KEYS])

#: False: every bin is recomputed in the final step (the tests compare the two;
#: ``PFM_DASK_EARLY_TILES=0`` sets it for a process, to measure the difference).
EARLY = os.environ.get("PFM_DASK_EARLY_TILES", "1") != "0"
#: Bins a side of a tile. 64: on the 74-file survey 94 % of the bins are done early, 91 %
#: with 256 (fewer, larger tiles finish later).
TILE = 64
#: Groups a tile must go without a write before it is recomputed: 1 = it was not written
#: in the group just written (adjacent lines overlap within a group, rarely across two).
LAG = 1
#: Adjacent tiles of a row of tiles worked on as one rectangle of bins, at most (a read and
#: a write per row of bins of the rectangle instead of per row of each tile).
RUN_TILES = 16
#: While the load goes on, the thread's bands hold at most this many soundings (about 100
#: bytes each while worked on) and it lets go of the ``.ndx`` pages it read every this many
#: (about 40 bytes each): the load's own memory is at its peak meanwhile.
BESIDE_BAND_SOUNDINGS = 100_000
BESIDE_DROP_SOUNDINGS = 250_000
#: Bin records the thread holds computed before it writes them (with their band's other
#: results, about 5x that): a few writes a group.
BESIDE_WRITE_BYTES = 2 << 20


class TileRecompute:
    """Which tiles of a new PFM are recomputed already, and the thread that does it.

    The writer holds :attr:`lock` around each call that adds soundings and calls
    :meth:`after_write` with the bins it wrote before letting go; :meth:`end_group` between
    groups hands the tiles that are ready to the thread; :meth:`finish` at the end stops it,
    recomputes the rest on ``threads`` threads and returns the header extrema, :attr:`walk`
    then holding the check's walk. :meth:`close` stops the thread (an aborted load).
    """

    def __init__(self, pfm_file, touched: np.ndarray, threads: int = 1, *,
                 tile: int | None = None, lag: int | None = None,
                 band_soundings: int = BAND_SOUNDINGS):
        self.pfm = pfm_file
        self.W, self.H = int(pfm_file.width), int(pfm_file.height)
        self.touched = touched
        self.threads = max(1, int(threads))
        self.tile = int(TILE if tile is None else tile)
        self.lag = int(LAG if lag is None else lag)
        self.budget = int(band_soundings)
        self.ntc = -(-self.W // self.tile)
        n = self.ntc * -(-self.H // self.tile)
        self.last = np.full(n, -1, dtype=np.int64)   # the last group that wrote in the tile
        self.gen = np.zeros(n, dtype=np.int64)       # writes into the tile so far
        self.done = np.zeros(n, dtype=bool)          # recomputed since its last write
        self.busy = np.zeros(n, dtype=bool)          # handed to the thread, not back yet
        self.cands = Candidates(n)    # per rectangle recomputed, at its first tile
        self.owner = np.full(n, -1, dtype=np.int64)   # the first tile of a done tile's rectangle
        self.walk = ChainWalk()
        self.group = 0
        self.off = False          # the kernel cannot read this file, or the thread failed
        #: whether tiles are handed to the thread (:meth:`use_cores`); when not, the writes
        #: are still followed, and the final step recomputes every bin
        self.beside = usable_cores() > 1
        self.error: BaseException | None = None      # the thread's (the final step redoes)
        self.tiles_early = 0      # tiles recomputed before the final step
        self.tiles_redone = 0     # done tiles written again (their recompute was wasted)
        self.tiles_refreshed = 0  # rectangles recomputed again for their extrema (finish)
        self.seconds = 0.0        # the thread's time
        self.cpu = 0.0            # and its CPU time
        self.lock = threading.Lock()
        self._walk_begun = False
        self._hurry = False
        self._q: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        #: called by the thread after each write of tiles, under the lock (the crash tests'
        #: hook: ``PfmWriter`` sets it to its ``tiles-write`` crash point)
        self.on_written = None
        #: the area filter's per-bin sums (``._area_sums.AreaSums``), taken with each tile
        #: when set (:meth:`sum_for_filter`); ``sums_ok``: every bin done has its sums
        self.sums = None
        self.sums_ok = False
        self._sum_args: dict = {}

    def sum_for_filter(self, sums, *, skip: int, post_skip: int, null_depth: float) -> None:
        """Take the area filter's sums (``._recompute_kernel._filter_sums``) of each tile's
        bins into ``sums`` (an ``._area_sums.AreaSums``) as the tile is recomputed (before
        any is handed to the thread)."""
        self.sums, self.sums_ok = sums, True
        self._sum_args = {"skip": int(skip), "post_skip": int(post_skip),
                          "null_depth": float(null_depth)}

    def _recompute(self, view, **options) -> BandRecompute:
        """The band pass of a new PFM's tiles, taking the filter's sums when asked."""
        if self.sums is None:
            return BandRecompute(self.pfm, view, fresh=True, **options)
        return BandRecompute(self.pfm, view, fresh=True, sums=self._sum_args,
                             on_sums=self._keep_sums, **options)

    def _keep_sums(self, bidx, got) -> None:
        """Write a band's sums for the area filter (None: the band took the general path,
        without them, and the filter reads every chain itself)."""
        if got is None:
            self.sums_ok = False
        else:
            self.sums.write(bidx, as_sums(got))

    # ------------------------------------------------------------- the writer's calls
    def tiles_of(self, bins: np.ndarray) -> np.ndarray:
        """The tiles holding ``bins``, each once, ascending."""
        mark = np.zeros(self.last.size, dtype=bool)
        mark[self.tiles_at(bins)] = True
        return np.flatnonzero(mark)

    def after_write(self, bins: np.ndarray) -> None:
        """``bins`` received soundings in the current group (the caller holds :attr:`lock`):
        their tiles are written in it, and those done are not any more."""
        if bins.size == 0:
            return
        t = self.tiles_of(bins)
        self.last[t] = self.group
        self.gen[t] += 1
        again = t[self.done[t]]
        if again.size:
            # the rectangles they were recomputed in are undone (their candidates are one)
            owners = np.unique(self.owner[again])
            again = np.flatnonzero(np.isin(self.owner, owners))
            self.done[again] = False
            self.owner[again] = -1
            self.cands.clear(owners)
            self.walk.spoil()      # their records were visited: the check walks everything
            self.tiles_redone += int(again.size)

    def end_group(self) -> int:
        """A group is written: hand the thread the tiles it and the ``lag - 1`` before it did
        not write in; returns how many."""
        with self.lock:
            ready = np.flatnonzero(~self.done & ~self.busy & (self.last >= 0)
                                   & (self.last <= self.group - self.lag))
            self.group += 1
            if self.off or not self.beside or ready.size == 0:
                return 0
            self.busy[ready] = True
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="pfm-tiles", daemon=True)
            self._thread.start()
        self._q.put(ready)
        return int(ready.size)

    def use_cores(self, busy_threads: int) -> None:
        """The writer and the load's tasks keep ``busy_threads`` threads computing on this
        machine: the thread recomputes tiles only if the machine has cores beyond those. On
        the 2-core benchmark machine it took CPU from the others: a 2-worker load of the
        74-file survey was 3 % slower with it, the replay of the same load (the writer's
        thread and its merge thread busy) twice as slow."""
        self.beside = usable_cores() > max(1, int(busy_threads))

    @property
    def early(self) -> bool:
        """Whether any tile was recomputed before the final step."""
        return self.tiles_early > 0

    def close(self, hurry: bool = False) -> None:
        """Stop the thread once it has done what it was handed; ``hurry``: once it has
        written the rectangle it is on (the final step recomputes the rest on all its
        threads: the last groups' tiles, handed late, were left to one thread)."""
        if self._thread is not None:
            self._hurry = hurry
            self._q.put(None)
            self._thread.join()
            self._thread = None

    def finish_rest(self) -> None:
        """Stop the thread and recompute every tile not done (before the area filter, which
        then has every bin's sums); :meth:`finish` then refreshes every bin it changed."""
        self.close(hurry=True)
        rest = np.flatnonzero(~self.done & (self.last >= 0))
        if rest.size:
            self._run(rest)

    def finish(self, extrema: dict | None = None, changed: np.ndarray | None = None,
               running: tuple | None = None) -> dict:
        """Recompute every tile not done; the header extrema of all, as :func:`recompute`.

        ``changed``: bins whose soundings changed since their tile was recomputed (the area
        filter's cuts, ascending): recomputed again, and the extrema set right
        (:meth:`_refresh`); ``running``: their recompute's running values, when the filter
        summed them (``BandRecompute``'s ``pre``: then no chain is walked again)."""
        self.close(hurry=True)
        early = self.done.copy()
        self.finish_rest()
        extra = None
        if changed is not None and changed.size:
            changed = np.asarray(changed, dtype=np.int64)
            keep = early[self.tiles_at(changed)]     # the rest was just recomputed
            changed = changed[keep]
            if running is not None:
                running = (running[0][keep], running[1][keep])
            if changed.size:
                extra = self._refresh(changed, running)
        ext = _Extrema(extrema, self.W)
        self.cands.fold_into(ext, np.unique(self.owner[self.done]))
        if extra is not None:
            extra.fold_into(ext)
        if self.walk.clean:
            self.walk.grow(self.pfm.ndx_size // self.pfm.ndx_record_size)
        return ext.result()

    def tiles_at(self, bins: np.ndarray) -> np.ndarray:
        """The tile of each of ``bins``."""
        b = np.asarray(bins, dtype=np.int64)
        r = b // self.W
        return (r // self.tile) * self.ntc + (b - r * self.W) // self.tile

    def _refresh(self, changed: np.ndarray, running: tuple | None = None) -> Candidates:
        """Recompute ``changed`` bins of done rectangles (their records written again), and
        return their extrema candidates, the rectangles' own set right: a rectangle whose
        candidate for a key is a changed bin drops it if it cannot be the best any more,
        else finds its best again (:meth:`_best_again`).

        Why that is exact: every other bin of such a rectangle was behind its candidate,
        so the rectangle's best among its unchanged bins is behind it too. Once behind the
        best of the candidates that still hold (those of bins not changed, and the changed
        bins' new ones), it cannot be the result. On the 74-file survey about a tenth of the
        rectangles whose deepest filtered bin was cut still beat it."""
        pfm_file = self.pfm
        pfm_file._sync()
        view = NdxView(pfm_file)
        if not view.ok:
            view.close()
            view = None
        else:
            view.scattered()      # the changed bins are few, all over the grid
        extra = Candidates(1)
        try:
            bp = BandRecompute(pfm_file, view, write_lock=self.lock, fresh=True)   # no sums
            jobs = list(_raw_jobs(pfm_file, changed, self.budget))

            def work(job):
                out = []
                for bidx, raw in job():
                    pre = None
                    if running is not None:
                        at = np.searchsorted(changed, bidx)
                        pre = (running[0][at], running[1][at])
                    out.append(bp(bidx, raw, pre) if view is not None
                               else bp.general(pfm_file._decode_bins(bidx, raw,
                                                                     fields=bp.rec_fields)))
                    if view is not None:
                        view.drop_pages(int(out[-1][1]["num_soundings"].sum()))
                return out

            for out in ordered_imap(work, jobs, self.threads, name="pfm-tile"):
                for got in out:
                    extra.put(0, got[3])
            # per key, the rectangles whose candidate is a changed bin
            slots = np.unique(self.owner[self.done])
            cb = self.cands.bin[slots]
            stale = np.isin(cb, changed) & (cb >= 0)
            stale[:, ~FILTERED_KEYS] = False
            again = np.zeros(stale.shape, dtype=bool)    # (rectangle, key) to find again
            for i, (_, _, lower) in enumerate(KEYS):
                st = stale[:, i]
                if not st.any():
                    continue
                # the best of the candidates that hold
                vals = [self.cands.val[slots[~st], i][cb[~st, i] >= 0]]
                bins = [cb[~st, i][cb[~st, i] >= 0]]
                if extra.bin[0, i] >= 0:
                    vals.append(extra.val[0:1, i])
                    bins.append(extra.bin[0:1, i])
                v, b = np.concatenate(vals), np.concatenate(bins)
                sv, sb = self.cands.val[slots[st], i], cb[st, i]
                if v.size == 0:
                    beats = np.ones(sv.size, dtype=bool)
                else:
                    best = v.min() if lower else v.max()
                    bb = b[v == best].min()
                    beats = ((sv < best) if lower else (sv > best)) | ((sv == best) & (sb < bb))
                again[np.flatnonzero(st)[beats], i] = True
                # the others cannot be the best: their candidate for this key goes
                self.cands.bin[slots[np.flatnonzero(st)[~beats]], i] = -1
            redo = np.flatnonzero(again.any(axis=1)).tolist()
            jobs = [(int(slots[j]), np.flatnonzero(again[j])) for j in redo]
            for (t0, keys), found in zip(jobs, ordered_imap(
                    lambda job: self._best_again(*job, bp), jobs, self.threads,
                    name="pfm-tile")):
                self._put_again(t0, keys, found)
            self.tiles_refreshed = len(redo)
        finally:
            if view is not None:
                view.close()
        return extra

    def _put_again(self, t0: int, keys: np.ndarray, found) -> None:
        """Rectangle ``t0``'s candidates for ``keys`` from :meth:`_best_again`'s result."""
        self.cands.bin[t0, keys] = -1
        if found is not None:
            self.cands.put(t0, [g if i in keys else None for i, g in enumerate(found)])

    def _best_again(self, t0: int, keys: np.ndarray, bp: BandRecompute):
        """The best bin of rectangle ``t0`` found again for ``keys`` (of :data:`KEYS`, among
        :data:`FILTERED_KEYS`): the extrema candidates of the bins it recomputed (the caller
        puts those of ``keys``), or None when no bin can be one; on any thread (it writes
        nothing). From the rectangle's bin records: a stored depth or std code is a
        monotone function of the float value the extrema compare (a rounding of float32
        operations), so the best value is among the bins of the best code, which are
        recomputed (not written: the records hold those values already) to compare their
        values exactly. A bin whose max depth code does not tell whether it is below NULL
        DEPTH (which the filtered extrema ask) is recomputed too."""
        pfm_file = self.pfm
        k = int(np.count_nonzero(self.owner == t0))
        lay = pfm_file._bin_layout
        got = self._bands(t0, k, pfm_file._fd("bin"), lay, budget=1 << 62)
        if not got:
            return None
        bins, raw = got[0][0], got[0][1]
        h = pfm_file.header
        f = record_fields(raw, lay, ["validity", "std", "min_filtered", "max_filtered", "max"])
        off32, scale32 = np.float32(h.depth_offset), np.float32(h.depth_scale)
        c_null = nint(np.float64((np.float32(pfm_file.null_depth) + off32) * scale32))
        data = (f["validity"].astype(np.int64) & V.DATA) != 0
        sure = data & (f["max"].astype(np.int64) < c_null)
        unsure = data & ~sure
        pick = np.zeros(bins.size, dtype=bool)
        for i in keys.tolist():
            name, lower = KEYS[i][0], KEYS[i][2]
            code = f["std" if "standard" in name else name.replace("_depth", "")].astype(np.int64)
            if sure.any():
                best = code[sure].min() if lower else code[sure].max()
                pick |= sure & (code == best)
                pick |= unsure & ((code <= best) if lower else (code >= best))
            else:
                pick |= unsure
        sel = np.flatnonzero(pick)
        if sel.size == 0:
            return None
        sb, sr = bins[sel], np.ascontiguousarray(raw[sel])
        done = bp.kernel(sb, sr) if bp.view is not None else None
        if done is not None:
            return bp.results(sb, done[1])[3]
        return bp.general(pfm_file._decode_bins(sb, sr, fields=bp.rec_fields))[3]

    # ------------------------------------------------------------------- the work
    def _rects(self, tiles: np.ndarray):
        """Runs of at most :data:`RUN_TILES` adjacent ``tiles`` in one row of tiles, as
        ``(first tile, tiles in the run)``: read, recomputed and written as one rectangle."""
        t = np.asarray(tiles, dtype=np.int64)
        if t.size == 0:
            return []
        brk = np.flatnonzero((np.diff(t) != 1) | (t[1:] % self.ntc == 0)) + 1
        out = []
        for a, b in zip(np.r_[0, brk].tolist(), np.r_[brk, t.size].tolist()):
            for s in range(a, b, RUN_TILES):
                out.append((int(t[s]), min(RUN_TILES, b - s)))
        return out

    def _bands(self, t: int, k: int, fd: int, layout, budget: int | None = None):
        """The bins that received soundings in the ``k`` tiles from tile ``t`` and their
        records, in bands of at most ``band_soundings`` soundings."""
        r0, c0 = (t // self.ntc) * self.tile, (t % self.ntc) * self.tile
        sub = self.touched.reshape(self.H, self.W)[r0:r0 + self.tile, c0:c0 + k * self.tile]
        rr, cc = np.nonzero(sub)
        bins = (rr + r0).astype(np.int64) * self.W + (cc + c0)
        if bins.size == 0:
            return []
        bs, hs = self.pfm.bin_record_size, self.pfm.bin_header_size
        raw = Spans(fd, hs + bins * bs, bs, max_gap=RMW_GAP, path=self.pfm.bin_path,
                    what="bin record").records()
        cnt = record_fields(raw, layout, ["num_soundings"])["num_soundings"]
        sel = np.flatnonzero(cnt > 0)
        bins, raw, cnt = bins[sel], raw[sel], cnt[sel].astype(np.int64)
        cuts = _cuts(cnt, self.budget if budget is None else budget)
        return [(bins[i:j], raw[i:j], int(cnt[i:j].sum())) for i, j in cuts]

    def _begin(self):
        """The ``.ndx`` mapped and the walk begun or grown to it (the caller holds the lock
        and the files hold every write so far); None if the kernel cannot read this file."""
        view = NdxView(self.pfm)
        if not view.ok:
            view.close()
            self.off = True
            return None
        n_phys = view.buf.size // view.rsize
        if not self._walk_begun:
            self._walk_begun = True
            self.walk.begin(n_phys, view.rsize)
        else:
            self.walk.grow(n_phys)
        return view

    def _barrier(self):
        """An event set once the writes queued on the store's write-behind thread so far are
        done (the caller holds the lock: the writer queues none meanwhile), or None."""
        w = self.pfm._writer_obj
        if w is None:
            return None
        ev = threading.Event()
        w.run(lambda: None, done=ev.set)
        return ev

    def _loop(self) -> None:
        while True:
            tiles = self._q.get()
            if tiles is None:
                return
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                if not self.off:
                    self._run_beside(tiles)
            except BaseException as err:  # noqa: BLE001 - the final step recomputes them
                self.error, self.off = err, True
            finally:
                with self.lock:
                    self.busy[tiles] = False
                self.seconds += time.perf_counter() - t0
                self.cpu += time.thread_time() - c0

    def _run_beside(self, tiles: np.ndarray) -> None:
        """Recompute ``tiles`` while the writer goes on (the module doc says how)."""
        pfm_file = self.pfm
        with self.lock:
            seen = self.gen.copy()
            settled = self._barrier()
        if settled is not None:
            settled.wait()      # every write of the generations seen is in the files
        with self.lock:
            view = self._begin()
        if view is None:
            return
        # its pages resident beside the load's own memory: a few MB of them at most
        view.drop_every = BESIDE_DROP_SOUNDINGS
        try:
            bp = self._recompute(view, walking=self.walk.clean)
            fd, layout = pfm_file._fd("bin"), pfm_file._bin_layout
            done = []       # (first tile, tiles, [(bins, new records, kernel results)])
            for t0, k in self._rects(tiles):
                if self._hurry:
                    break         # the final step has begun: it does the rest
                if (self.gen[t0:t0 + k] != seen[t0:t0 + k]).any():
                    continue      # written since: a later group hands it over again
                bands = []
                for bidx, raw, n_snd in self._bands(t0, k, fd, layout, BESIDE_BAND_SOUNDINGS):
                    got = bp.kernel(bidx, raw)
                    view.drop_pages(n_snd)
                    if got is None:
                        break      # something out of the ordinary: the final step says what
                    bands.append((bidx, *got))
                else:
                    done.append((t0, k, bands))
                if sum(b[1].nbytes for _, _, bb in done for b in bb) >= BESIDE_WRITE_BYTES:
                    self._write_beside(bp, seen, done)
                    done = []
            if done:
                self._write_beside(bp, seen, done)
        finally:
            view.close()

    def _write_beside(self, bp: BandRecompute, seen: np.ndarray, done: list) -> None:
        """Write the rectangles no write reached since ``seen``, under the lock: after the
        writes the writer has queued (its read-modify-write of bin records also rewrites the
        records between its bins, which may be ours: those must land first), several
        rectangles at once (:data:`BESIDE_WRITE_BYTES`) so that the writer seldom waits."""
        with self.lock:
            settled = self._barrier()
            if settled is not None:
                settled.wait()
            walking = self.walk.clean
            for t0, k, bands in done:
                if (self.gen[t0:t0 + k] != seen[t0:t0 + k]).any():
                    continue
                for bidx, new, got in bands:
                    bp.write(bidx, new, got[1])
                    _, _, walked, found = bp.results(bidx, got)
                    self.cands.put(t0, found)
                    if walking and walked is not None:
                        self.walk.add(*walked)
                    elif walking:
                        self.walk.spoil()
                self.done[t0:t0 + k] = True
                self.owner[t0:t0 + k] = t0
                self.tiles_early += k
            if self.on_written is not None:
                self.on_written()

    def _run(self, tiles: np.ndarray) -> None:
        """Recompute ``tiles`` on ``threads`` threads, the writer done (the final step)."""
        pfm_file = self.pfm
        pfm_file._sync()
        view = self._begin()
        try:
            walking = self.walk.clean and view is not None
            bp = self._recompute(view, walking=walking, write_lock=self.lock)
            fd, layout = pfm_file._fd("bin"), pfm_file._bin_layout

            def work(rect):
                out = []
                for bidx, raw, n_snd in self._bands(*rect, fd, layout):
                    out.append(bp(bidx, raw) if view is not None
                               else bp.general(pfm_file._decode_bins(bidx, raw,
                                                                     fields=bp.rec_fields)))
                    if view is not None:
                        view.drop_pages(n_snd)
                return out

            rects = self._rects(tiles)
            for (t0, k), out in zip(rects, ordered_imap(work, rects, self.threads,
                                                        name="pfm-tile")):
                for _, _, walked, found in out:
                    self.cands.put(t0, found)
                    if walking and walked is not None:
                        self.walk.add(*walked)
                    else:
                        self.walk.spoil()
                self.done[t0:t0 + k] = True
                self.owner[t0:t0 + k] = t0
        except BaseException:
            self.walk.spoil()
            raise
        finally:
            if view is not None:
                view.close()


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
