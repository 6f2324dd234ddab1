"""``check``'s chain walk over a memory-mapped ``.ndx``, and its map of the records reached.

Chains are walked for all bins of a band at once, one step of chain depth at a time, with a
bitmap over the ``.ndx`` physical records to find records reached twice (a cycle, or a record
shared by two bins) and records reached by no bin (orphans).
"""

from __future__ import annotations

import mmap
import os
import tempfile

import numpy as np

from .._fileio import close_map
from ._bitpack import unpack_records
from ._check_parts import _Layout
from ._problems import _MAX_PER_KIND, _Problems, _bin_where

_BITMAP_IN_MEMORY = 1 << 20   # bytes of visited map kept in memory; larger ones go to a file
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)  # absent where mmap has no madvise (Windows)

class _Bitmap:
    """One bit per ``.ndx`` physical record: has a chain reached it yet?

    Up to :data:`_BITMAP_IN_MEMORY` bytes the bits are an ordinary array. A
    larger map (a very large ``.ndx``) lives in a shared mapping of an unnamed
    temporary file in ``directory`` (the PFM's data directory), whose pages
    :meth:`drop_pages` hands back to the page cache, so the check's resident
    memory does not grow with the number of records. Where no such file can be
    made (a read-only directory, a full disk) the bits stay in memory.
    """

    def __init__(self, n: int, directory: str | None = None):
        self.n = int(n)
        nbytes = (self.n + 7) // 8
        self._file = self._mm = None
        if directory is not None and nbytes > _BITMAP_IN_MEMORY:
            try:
                self._file = tempfile.TemporaryFile(dir=directory, prefix=".check-bitmap-")
                fd = self._file.fileno()
                # blocks reserved now (reading as zeros): a full disk is an OSError here, and
                # falls back to memory, rather than a SIGBUS on the first write to the map
                if hasattr(os, "posix_fallocate"):
                    os.posix_fallocate(fd, 0, nbytes)
                else:
                    os.ftruncate(fd, nbytes)
                self._mm = mmap.mmap(fd, nbytes)
            except (OSError, ValueError):
                self.close()
        if self._mm is not None:
            self.bits = np.frombuffer(self._mm, dtype=np.uint8, count=nbytes)
        else:
            self.bits = np.zeros(nbytes, dtype=np.uint8)

    @property
    def in_file(self) -> bool:
        return self._mm is not None

    def test(self, idx: np.ndarray) -> np.ndarray:
        return ((self.bits[idx >> 3] >> (idx & 7).astype(np.uint8)) & 1).astype(bool)

    def set(self, idx: np.ndarray) -> None:
        np.bitwise_or.at(self.bits, idx >> 3, (np.uint8(1) << (idx & 7).astype(np.uint8)))

    def drop_pages(self) -> None:
        """Unmap the file-backed pages from this process (their bits stay in the file)."""
        if self._mm is not None and _DONTNEED is not None:
            self._mm.madvise(_DONTNEED)

    def unset(self, first: int = 5, chunk: int = 1 << 20) -> tuple[int, list[int]]:
        """Number of records never reached, and the first few of them (chunked, bounded memory)."""
        total, firsts = 0, []
        for a in range(0, self.bits.size, chunk):
            bits = np.unpackbits(self.bits[a: a + chunk], bitorder="little")
            bits = bits[: max(0, min(bits.size, self.n - a * 8))]
            zero = np.flatnonzero(bits == 0)
            total += zero.size
            if len(firsts) < first:
                firsts += [a * 8 + int(z) for z in zero[: first - len(firsts)]]
            self.drop_pages()
        return total, firsts

    def close(self) -> None:
        self.bits = np.zeros(0, dtype=np.uint8)
        mm, self._mm = self._mm, None
        f, self._file = self._file, None
        close_map(mm)
        if f is not None:
            f.close()


class _Walker:
    """Walks chains of many bins at once over a memory-mapped ``.ndx``.

    The walk reads only the continuation pointers, one step of chain depth at
    a time for all bins of a band; the records it reached are then gathered
    once and the sounding fields the check needs unpacked in one go.
    """

    #: sounding fields the check looks at
    KEYS = ("file", "line", "depth", "validity")

    def __init__(self, ndx_path: str, ndx_size: int | None, lay: _Layout, width: int, pr: _Problems):
        self.lay = lay
        self.W = width
        self.pr = pr
        self.size = int(ndx_size or 0)
        self.n_phys = self.size // lay.phys
        self.mm = None
        self.recs = np.zeros((0, lay.phys), dtype=np.uint8)
        self.words = None
        # the pointer in one big-endian 64-bit word read at byte ``wstart`` of a record, if it fits
        off, nb = lay.cont_field
        self.wstart = max(0, lay.cont_bytes[1] - 8)
        self.wshift = 64 - (off - 8 * self.wstart + nb)
        if self.n_phys:
            with open(ndx_path, "rb") as fh:
                self.mm = mmap.mmap(fh.fileno(), self.n_phys * lay.phys, access=mmap.ACCESS_READ)
            self.recs = np.frombuffer(self.mm, dtype=np.uint8,
                                      count=self.n_phys * lay.phys).reshape(self.n_phys, lay.phys)
            if self.wstart <= lay.cont_bytes[0] and self.wstart + 8 <= lay.phys:
                self.words = np.ndarray((self.n_phys * lay.phys - 7,), dtype=">u8", buffer=self.recs,
                                        strides=(1,))
        self.visited = _Bitmap(self.n_phys, os.path.dirname(os.path.abspath(ndx_path)))
        self.classified = 0

    def drop_pages(self) -> None:
        """Unmap the ``.ndx`` pages read so far (and the visited map's) from this process.

        Reading chains faults pages of the read-only map in, and they would stay
        resident until the end: the whole ``.ndx`` by then. Dropped pages stay
        in the page cache and come back on the next touch (a minor fault), so
        this is safe at any time, even while another thread reads the map.
        """
        if self.mm is not None and _DONTNEED is not None:
            self.mm.madvise(_DONTNEED)
        self.visited.drop_pages()

    def close(self) -> None:
        mm, self.mm = self.mm, None
        self.recs = np.zeros((0, self.lay.phys), dtype=np.uint8)
        self.words = None
        self.visited.close()
        close_map(mm)

    def _pointers(self, idx: np.ndarray) -> np.ndarray:
        """Continuation pointers of physical records ``idx`` (only their bytes are read)."""
        if self.words is not None:
            v = self.words[idx * self.lay.phys + self.wstart].astype(np.uint64)
            v >>= np.uint64(self.wshift)
            v &= np.uint64((1 << self.lay.cont_field[1]) - 1)
            return v.astype(np.int64)
        b0, b1 = self.lay.cont_bytes
        return self.lay.cont.unpack(self.recs[idx, b0:b1], ["cont"])["cont"].astype(np.int64)

    def _classify(self, b: int, head: int, target: int, steps: int) -> str:
        """Cycle or shared: walk bin ``b`` again (slowly) and see if it met ``target`` before."""
        if self.classified >= 2 * _MAX_PER_KIND:
            return "reached twice (a cycle, or shared with another bin)"
        self.classified += 1
        cur = head
        L = self.lay
        for _ in range(steps):
            if cur == target:
                return "reached twice by this bin's own chain (a cycle)"
            if cur % L.phys or cur < 0 or cur + L.phys > self.size:
                break
            cur = int(self._pointers(np.array([cur // L.phys]))[0])
        return "already part of another bin's chain (a record shared by two bins)"

    def walk(self, bidx: np.ndarray, count: np.ndarray, head: np.ndarray, tail: np.ndarray, *,
             collect: bool = True, mark: bool = True):
        """Walk the chains; returns (ok mask per bin, the records reached).

        The second item (``None`` with ``collect=False``) goes to
        :meth:`soundings`, which may run on another thread. ``collect=False``
        only validates (for bands whose counts are too large to trust with
        memory); ``mark=False`` neither tests nor sets the visited map (a second
        walk over chains already validated).
        """
        L = self.lay
        n = bidx.size
        nrec = (count + L.L - 1) // L.L
        ok = np.ones(n, dtype=bool)
        active = np.flatnonzero(count > 0)
        cur = head.astype(np.int64).copy()
        step = 0
        W = self.W
        reached_bin, reached_step, reached_idx = [], [], []
        while active.size:
            a = cur[active]
            bad = (a < 0) | (a % L.phys != 0) | (a + L.phys > self.size)
            for j in self.pr.each("chain pointer", ".ndx", bad):
                bi = active[j]
                what = ("head pointer" if step == 0 else f"continuation pointer (record {step + 1} "
                        "of the chain)")
                self.pr.add("chain pointer", ".bin" if step == 0 else ".ndx", _bin_where(bidx[bi], W),
                            f"{what} {int(a[j]):,} is not a physical record of the .ndx "
                            f"({self.size:,} bytes of {L.phys}-byte records)")
            if bad.any():
                ok[active[bad]] = False
                active, a = active[~bad], a[~bad]
                if not active.size:
                    break
            idx = a // L.phys
            # records reached twice: already visited, or twice within this step
            if mark:
                order = np.argsort(idx, kind="stable")
                dup_in_step = np.zeros(idx.size, dtype=bool)
                same = idx[order][1:] == idx[order][:-1]
                dup_in_step[order[1:][same]] = True
                again = self.visited.test(idx) | dup_in_step
            else:
                again = np.zeros(idx.size, dtype=bool)
            for j in self.pr.each("chain revisit", ".ndx", again):
                bi = active[j]
                kind = self._classify(int(bidx[bi]), int(head[bi]), int(a[j]), step)
                self.pr.add("chain revisit", ".ndx", _bin_where(bidx[bi], W),
                            f"physical record at byte {int(a[j]):,} (step {step + 1} of the chain) {kind}")
            if again.any():
                ok[active[again]] = False
                keep = ~again
                active, a, idx = active[keep], a[keep], idx[keep]
                if not active.size:
                    break
            if mark:
                self.visited.set(idx)
            cont = self._pointers(idx)
            if collect:
                reached_bin.append(active)
                reached_step.append(step)
                reached_idx.append(idx)
            last = nrec[active] == step + 1
            for j in self.pr.each("chain long", ".ndx", last & (cont != 0)):
                bi = active[j]
                self.pr.add("chain long", ".ndx", _bin_where(bidx[bi], W),
                            f"the chain continues (to byte {int(cont[j]):,}) after the "
                            f"{int(nrec[bi])} record(s) that {int(count[bi])} soundings need: "
                            "the count is smaller than the chain")
            ok[active[last & (cont != 0)]] = False
            for j in self.pr.each("chain tail", ".bin", last & (a != tail[active])):
                bi = active[j]
                self.pr.add("chain tail", ".bin", _bin_where(bidx[bi], W),
                            f"tail pointer {int(tail[bi]):,} but the chain ends at byte {int(a[j]):,}")
            ok[active[last & (a != tail[active])]] = False
            short = ~last & (cont == 0)
            for j in self.pr.each("chain short", ".ndx", short):
                bi = active[j]
                self.pr.add("chain short", ".ndx", _bin_where(bidx[bi], W),
                            f"the chain ends after {step + 1} record(s) but the count {int(count[bi])} "
                            f"needs {int(nrec[bi])}")
            ok[active[short]] = False
            go = ~last & ~short
            active = active[go]
            cur[active] = cont[go]
            step += 1
        if not collect:
            return ok, None
        return ok, (count, nrec, reached_bin, reached_step, reached_idx)

    def soundings(self, reached) -> dict:
        """The soundings of the records a :meth:`walk` reached, by bin then chain order.

        A dict of ``b`` (the bin's position in the walk's ``bidx``) and the
        :attr:`KEYS` fields (uint64) of every sounding in those records.
        """
        count, nrec, reached_bin, reached_step, reached_idx = reached
        if not reached_bin:
            return self._gather(count, *(np.zeros(0, dtype=np.int64),) * 3)
        # order the records reached by (bin, step): slot rstart[bin] + step of the full chains
        rstart = np.cumsum(nrec) - nrec
        R = int(nrec.sum())
        where = np.concatenate([rstart[b] + s for b, s in zip(reached_bin, reached_step)])
        present = np.zeros(R, dtype=bool)
        present[where] = True
        rec_idx = np.zeros(R, dtype=np.int64)
        rec_idx[where] = np.concatenate(reached_idx)
        rec_bin = np.repeat(np.arange(nrec.size, dtype=np.int64), nrec)
        rec_step = np.arange(R, dtype=np.int64) - np.repeat(rstart, nrec)
        if not present.all():
            rec_idx, rec_bin, rec_step = rec_idx[present], rec_bin[present], rec_step[present]
        return self._gather(count, rec_idx, rec_bin, rec_step)

    def _gather(self, count, rec_idx, rec_bin, rec_step) -> dict:
        """The :attr:`KEYS` fields of the soundings in records ``rec_idx`` (in that order), the
        ``rec_step``-th records of the chains of bins ``rec_bin``."""
        L = self.lay
        keys = {k: L.item_fields[k] for k in self.KEYS}
        if not rec_idx.size:
            out = {k: np.zeros(0, dtype=np.uint64) for k in keys}
            out["b"] = np.zeros(0, dtype=np.int64)
            return out
        n_here = np.minimum(L.L, count[rec_bin] - rec_step * L.L)
        first = np.cumsum(n_here) - n_here
        # item positions in the whole .ndx: unpacked straight from the map
        select = np.repeat(rec_idx * L.L - first, n_here)
        select += np.arange(select.size, dtype=np.int64)
        out = unpack_records(self.recs, L.L, L.sounding_bits, keys, select)
        out["b"] = np.repeat(rec_bin, n_here)
        return out
