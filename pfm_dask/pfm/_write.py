"""Writing into an open PFM: appending sorted soundings, rewriting flags and bin statistics.

:class:`PfmWrites` is the writing half of :class:`~._store.PfmFile` (a mixin: it uses the
file's descriptors, layouts and header). ``add_sorted`` packs the new depth records past the
end of the ``.ndx`` on the pack threads, fills and links the old chain tails and rewrites the
bin records, all or nothing; ``set_validity`` and ``write_bin_records`` rewrite records in
place in batched read-modify-writes.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Sequence

import numpy as np

from .._fileio import close_map, pwrite_all
from .._numeric import nint, scaled_code_f32, scaled_code_f64
from ..errors import ConfigError, PfmFormatError
from .. import validity as V
from ._bitpack import tails_clean, update_bin_records
from ._runs import bin_runs
from ._bitpack_soundings import (CHECK_SIZE, SoundingCoding, check_failures, fill_slots,
                                 pack_soundings)
from ._chains import chain_plan
from ._header import NUM_ATTR
from ._io import RMW_GAP, ZERO_GAP, BufferPool, Spans, zero_gaps
from ._layout import DEPTH_FIELDS

__all__ = ["PfmWrites", "CHUNK_BUFFERS"]

#: 1 MiB buffers of packed new records that may wait for the write-behind thread at once
#: (one pack thread, as --serial): enough that packing seldom waits for the page-cache copy
CHUNK_BUFFERS = 16


def _as_array(name: str, a, n: int | None = None) -> np.ndarray:
    arr = np.asarray(a)
    if arr.ndim != 1:
        raise ConfigError(f"{name} must be a 1-d array, got shape {arr.shape}")
    if n is not None and arr.shape[0] != n:
        raise ConfigError(f"{name} has {arr.shape[0]} values, bin_index has {n}")
    return arr


#: :meth:`PfmWrites.set_validity` lets go of the pages of its map of the ``.ndx`` every this
#: many spans (about 64 MB of pages at 64 kB a fault)
DROP_SPANS = 1024


class PfmWrites:
    """Appending soundings and rewriting records of an open PFM (mixed into ``PfmFile``)."""

    # ------------------------------------------------------------------ appending
    def add_sorted(self, bin_index, file, line, ping, beam, depth, x_off, y_off, validity,
                   horizontal_error, vertical_error, *, attributes: Sequence | None = None) -> None:
        """Append soundings already sorted by ``bin_index`` (``row * width + col``).

        For each bin: free slots of its existing tail record are filled first
        (batched read-modify-write of the tail records); the rest go into new
        physical records written contiguously at the end of ``.ndx``, chained
        by continuation pointers (0 ends a chain) and linked from the old tail.
        Bin records get the new count, head/tail and ``validity |=`` the
        soundings' flags (CHECKED cleared, as the library's cached loader
        does); statistics are left to the recompute. Out-of-grid bins, file,
        line, ping, beam, offset or validity values above the header limits,
        and depths outside ``min_depth .. NULL DEPTH`` raise
        :class:`PfmFormatError`. Errors above their bit range, negative or
        NaN are stored as null. ``attributes``: one array per NDX attribute
        of the header (coded ``NINT((v - min) * scale)``), else zeros.

        All or nothing: everything is prepared first (new records packed past
        the end of the ``.ndx``, where nothing refers to them; old tail and bin
        records changed in memory), the values being checked by the packing
        kernels as they code them; only then are the changes written. A value
        out of range raises before anything is written, and the ``.ndx`` is
        cut back to where it was.
        """
        self._writable()
        t_start = time.perf_counter()
        b = _as_array("bin_index", bin_index).astype(np.int64, copy=False)
        n = b.shape[0]
        #: the bins the last call wrote, each once, in order (set once it has written them)
        self.last_bins = np.zeros(0, dtype=np.int64)
        if n == 0:
            return
        h = self.header
        cols = {
            "file": _as_array("file", file, n), "line": _as_array("line", line, n),
            "ping": _as_array("ping", ping, n), "beam": _as_array("beam", beam, n),
            "x_off": _as_array("x_off", x_off, n), "y_off": _as_array("y_off", y_off, n),
            "validity": _as_array("validity", validity, n),
        }
        depth = _as_array("depth", depth, n)
        herr = _as_array("horizontal_error", horizontal_error, n)
        verr = _as_array("vertical_error", vertical_error, n)
        nbins = self.width * self.height
        # where each bin's soundings start, the bin, and the OR of its soundings' validity
        # (of whole-number floats too: validity is checked to be integers below, before use)
        v_ = cols["validity"]
        runs = bin_runs(b, nbins, values=True,
                        or_of=v_ if np.issubdtype(v_.dtype, np.integer) else v_.astype(np.int64))
        starts, ub, vor = runs if runs is not None else (None, None, None)
        if starts is None and (b.min() < 0 or b.max() >= nbins):
            bad = int(np.flatnonzero((b < 0) | (b >= nbins))[0])
            raise PfmFormatError(f"bin_index {b[bad]} (sounding {bad}) is outside the "
                                 f"{self.width} x {self.height} grid (0..{nbins - 1})", path=self.path)
        if starts is None:
            bad = int(np.flatnonzero(b[1:] < b[:-1])[0]) + 1
            raise PfmFormatError(f"soundings are not sorted by bin_index (sounding {bad})", path=self.path)
        # integer fields: whole-number floats are taken as integers. The kernels check a field as
        # they code it when a value out of range shows in bits above its width (unsigned types,
        # or signed ones wider than the field); the others are checked here, in field order.
        NL = self._ndx_layout
        for i, (k, arr) in enumerate(list(cols.items())):
            if not np.issubdtype(arr.dtype, np.integer):
                if np.issubdtype(arr.dtype, np.floating) and np.all(np.mod(arr, 1) == 0):
                    cols[k] = arr = arr.astype(np.int64)
                else:
                    for k_before in list(cols)[:i]:        # an earlier field's error comes first
                        self._check_field(k_before, cols[k_before])
                    raise PfmFormatError(f"{k} must be integers (got {arr.dtype})", path=self.path)
            nb = NL.fields[(k, 0)].nbits
            if not (nb and (arr.dtype.kind == "u" or 8 * arr.dtype.itemsize > nb)):
                self._check_field(k, arr)
        attrs = {}
        for i in range(NUM_ATTR):
            nb = int(h.ndx_attribute_bits[i])
            if nb and attributes is not None and i < len(attributes) and attributes[i] is not None:
                a_ = _as_array(f"attributes[{i}]", attributes[i], n).astype(np.float64)
                c = nint((a_ - np.float64(np.float32(h.min_ndx_attribute[i])))
                         * np.float64(np.float32(h.ndx_attribute_scale[i])))
                self._check_range(f"attribute {i}", c, (1 << nb) - 1, f"[NDX ATTRIBUTE BITS {i}]")
                attrs[("attr", i)] = c.astype(np.uint64)
            elif nb:
                attrs[("attr", i)] = np.zeros(n, np.uint64)
        self.timings["add_validate"] += time.perf_counter() - t_start
        self.timings["add_soundings"] += n

        # integer fields as they come (the kernels read any integer type), floats as values
        codes = dict(cols, depth=depth, horizontal_error=herr, vertical_error=verr, **attrs)
        check = np.zeros(CHECK_SIZE, dtype=np.uint64)
        base = self.ndx_size
        try:
            step = self._prepare(ub, n, codes, starts, vor, check)
            bad = check_failures(check, step["item_fields"])
            if bad:      # the message names the first bad sounding, found again with numpy
                k = bad[0]
                if k == "depth":
                    self._check_depths(depth)
                else:
                    self._check_field(k, cols[k])
                raise PfmFormatError(f"{k} out of range (found while packing)", path=self.path)
        except BaseException:
            # nothing points to the records packed past the old end: cut them off again (once
            # the queued writes of those records are done, or they would extend it again)
            try:
                self._sync()
            except BaseException:  # noqa: BLE001 - the first error is the one raised
                pass
            os.ftruncate(self._fds["ndx"], base)
            raise
        self._commit(step)
        self.last_bins = ub

    def _chunk_buffers(self):
        """The buffers new records are packed into and written from (:class:`BufferPool`): a
        few more than the write-behind queue holds and the pack threads fill at once."""
        pool = getattr(self, "_chunk_pool", None)
        if pool is None:
            pool = self._chunk_pool = BufferPool(1 << 20, CHUNK_BUFFERS + max(1, self.pack_threads))
        return pool

    def drop_write_buffers(self) -> None:
        """Let go of the packing buffers once no more soundings will be appended (after
        :meth:`flush`): they are memory the final step can use."""
        self._chunk_pool = None

    def _check_field(self, key: str, arr: np.ndarray) -> None:
        """Raise naming the first value of integer field ``key`` outside its header limit."""
        limits = {"file": (self.max_file_number, "[FILE NUMBER BITS]"),
                  "line": (self.max_line_number, "[LINE NUMBER BITS]"),
                  "ping": (self.max_ping_number, "[PING NUMBER BITS]"),
                  "beam": (self.max_beam_number, "[BEAM NUMBER BITS]"),
                  "x_off": ((1 << self.header.offset_bits) - 1, "[OFFSET BITS]"),
                  "y_off": ((1 << self.header.offset_bits) - 1, "[OFFSET BITS]"),
                  "validity": ((1 << self.header.validity_bits) - 1, "[VALIDITY BITS]")}
        lim, key_name = limits[key]
        self._check_range(key, arr, lim, key_name)

    def _check_depths(self, depth: np.ndarray) -> None:
        """Raise naming the first depth whose code is outside ``0 ..`` the NULL DEPTH's code."""
        h = self.header
        null_code = int(scaled_code_f64(self.null_depth, h.depth_offset, h.depth_scale))
        dmax = min(null_code, (1 << h.depth_bits) - 1)
        d = np.asarray(depth, dtype=np.float64)
        c = scaled_code_f64(d, h.depth_offset, h.depth_scale)
        bad = np.flatnonzero(~np.isfinite(d) | (c < 0) | (c > dmax))
        if bad.size:
            j = int(bad[0])
            raise PfmFormatError(
                f"depth {d[j]} (sounding {j}) is outside {-h.depth_offset:g} .. "
                f"{self.null_depth:g} (DEPTH OFFSET / NULL DEPTH, {h.depth_bits} depth bits)",
                path=self.path)

    def _prepare(self, ub: np.ndarray, n: int, codes: dict, start: np.ndarray, vor: np.ndarray,
                 check: np.ndarray) -> dict:
        """Everything of :meth:`add_sorted` but the writes to existing data: the new records packed
        past the end of the ``.ndx`` (values checked into ``check``), the old tail and bin records
        read (their pre-images given to the undo log) and changed in memory. The ``n`` soundings
        go to bins ``ub``, bin ``ub[j]``'s from ``start[j]`` on, the OR of their validity ``vor[j]``."""
        h = self.header
        L = self.record_length
        rsize = self.ndx_record_size
        bsize = self.bin_record_size
        BL, NL = self._bin_layout, self._ndx_layout
        tm = self.timings
        t = time.perf_counter()
        nb = ub.size
        writer = self._writer
        known = getattr(self, "_coding", None)       # (header, its coding): once per header
        if known is None or known[0] is not h:
            known = self._coding = (h, SoundingCoding.from_header(h))
        coding = known[1]

        # 1. the touched bin records (wait only if a queued write covers them)
        boff = self.bin_header_size + ub * bsize
        def zero_spans(zero: bool = True) -> Spans:
            # records never written since creation: no need to read them back. A gap goes in
            # the span (as zeros) only when every bin in it is known to be zero too, so that
            # bins a few records apart (a fine grid's scattered soundings) take one write
            join = zero_gaps(ub, bsize, self._zero_bins)
            if join is None:
                return Spans(self._fds["bin"], boff, bsize, max_gap=0, path=self.bin_path,
                             what="bin record", read=False, zero=zero)
            return Spans(self._fds["bin"], boff, bsize, max_gap=ZERO_GAP, path=self.bin_path,
                         what="bin record", read=False, zero=True, joinable=join)

        fresh = self._all_zero(ub)
        if fresh:
            bspans = None       # made with the new bin records (step 4, on a pack thread)
            z = np.zeros(nb, dtype=np.uint64)
            cur = {"num_soundings": z, "validity": z, "head": z, "tail": z}
        else:
            writer.wait_for(self._fds["bin"], int(boff[0]), int(boff[-1]) + bsize)
            # bins not written yet (the zero map) among them: long runs of those are not read
            bspans = Spans(self._fds["bin"], boff, bsize, max_gap=RMW_GAP, path=self.bin_path,
                           what="bin record", known_zero=None if self._zero_bins is None
                           else (self._zero_bins, self.bin_header_size))
            cur = bspans.unpack(BL, ["num_soundings", "validity", "head", "tail"])
        if self.undo is not None:
            # one pre-image per record and checkpoint interval (the first: what a rollback
            # leaves), read in place from the span buffer
            if fresh:
                self.undo.save_records("bin", boff, bsize, None)
            else:
                self.undo.save_records("bin", boff, bsize, bspans.buf, at=bspans.pos)
        self._touch(ub)
        # where every bin's soundings go: old tail slots, new records (one compiled pass)
        base = self.ndx_size
        plan = chain_plan(start, n, cur["num_soundings"], L, base, rsize)
        cmax = (1 << h.count_bits) - 1
        if plan["max_total"] > cmax:
            total = plan["total"]
            j = int(np.argmax(total > cmax))
            raise PfmFormatError(f"bin {int(ub[j])} would hold {int(total[j])} soundings, more than the "
                                 f"{cmax} of [COUNT BITS] = {h.count_bits}", path=self.path)
        fill, used, rem, m, cum_m = (plan[k] for k in ("fill", "used", "rem", "m", "cum_m"))
        first_new, last_new, total, M = plan["first_new"], plan["last_new"], plan["total"], plan["M"]
        item_fields = {k_: (NL.fields[(k_, 0)].offset, NL.fields[(k_, 0)].nbits) for k_ in codes}
        tm["add_bins_read"] += time.perf_counter() - t

        # 4. (first, on a pack thread while the soundings pack: it needs nothing of steps 2
        # and 3) the new bin records, in memory
        made = [bspans]

        def bin_records() -> float:
            t_ = time.perf_counter()
            val_mask = np.uint64(((1 << h.validity_bits) - 1) & ~V.CHECKED)
            if fresh:
                # records still all zero, each bin's first soundings (so its first new record
                # is its head, its last its tail): written whole, nothing to keep or merge
                if made[0] is None:
                    made[0] = zero_spans(zero=False)
                made[0].pack_new(BL, {"num_soundings": total, "validity": vor & val_mask,
                                      "head": first_new, "tail": last_new})
                return time.perf_counter() - t_
            # count, validity |= the soundings', head if the bin was empty, tail if chained
            update_bin_records(BL, made[0].buf, made[0].pos, cur, total, vor, int(val_mask),
                               first_new, last_new, m)
            return time.perf_counter() - t_

        pool = self._pool
        bins_done = pool.submit(bin_records) if pool is not None and M else None
        try:
            tspans = self._new_records_and_tails(
                n, codes, coding, item_fields, start, fill, used, rem, m, cum_m, M, cur,
                plan["n_tail"], first_new, ub, check)
        finally:
            if bins_done is not None:     # never leave a pack thread on bspans behind an error
                t = time.perf_counter()
                tm["add_bins_overlapped"] += bins_done.result()
                tm["add_bins_write"] += time.perf_counter() - t     # the wait for it only
        if bins_done is None:
            tm["add_bins_write"] += bin_records()
        return {"item_fields": item_fields, "tspans": tspans, "bspans": made[0],
                "ndx_size": base + M * rsize}

    def _new_records_and_tails(self, n, codes, coding, item_fields, start, fill, used, rem,
                               m, cum_m, M, cur, n_tail, first_new, ub, check):
        """Steps 2 and 3 of :meth:`_prepare`: the new physical records packed and written past
        the end of the ``.ndx``; the old tail records read, filled and linked in memory (their
        spans returned, or None)."""
        L = self.record_length
        rsize = self.ndx_record_size
        NL = self._ndx_layout
        tm = self.timings
        writer = self._writer
        base = self.ndx_size

        # 2. new physical records, contiguous past the end of .ndx
        t = time.perf_counter()
        if M:
            # one numba pass codes the soundings and packs the chained records (bin by bin:
            # the soundings not filling old tails, from start + fill on, in records cum_m ..).
            # The pack threads write each ~1 MiB of records themselves as soon as it is packed,
            # past the end of the .ndx (nothing reads there yet): pwrite then copies from cache.
            cf = NL.fields["continuation"]
            fd = self._fds["ndx"]
            if self._pool is None:
                # one pack thread (--serial): the write-behind thread writes each chunk (the
                # pwrite's copy into the page cache on another core) and gives its buffer
                # back, while packing goes on into another
                pool = self._chunk_buffers()

                def sink(off, data) -> None:
                    buf = data.base
                    writer.submit(fd, data, base + off, done=lambda: pool.put(buf))
            else:
                # pack threads write their own chunks while in cache (measured faster than
                # handing two threads' chunks to the one write-behind thread)
                pool, lock = None, threading.Lock()

                def sink(off, data) -> None:
                    # one writer at a time: the kernel serialises writes to one file on its
                    # inode lock anyway, and a thread waiting there spins on a core; this sleeps
                    with lock:
                        pwrite_all(fd, data, base + off)

            pack_soundings(item_fields, codes, coding, start + fill, rem, cum_m, M, L,
                           self._single_bits, (cf.offset, cf.nbits), base, rsize,
                           executor=self._pool, sink=sink, buffers=pool, check=check,
                           **({"chunk_bytes": pool.nbytes} if pool is not None else {}))
            writer.start_writeback(fd, base, M * rsize)
            tm["add_pack"] += time.perf_counter() - t

        # 3. old tails: fill free slots and/or link to the new run (in memory)
        t = time.perf_counter()
        tspans = None
        if n_tail:
            c0 = cur["num_soundings"]
            t0 = cur["tail"].astype(np.int64)
            tb = np.flatnonzero((c0 > 0) & ((fill > 0) | (m > 0)))
            tb = tb[np.argsort(t0[tb], kind="stable")]
            writer.wait_for(self._fds["ndx"], int(t0[tb[0]]), int(t0[tb[-1]]) + rsize)
            tspans = Spans(self._fds["ndx"], t0[tb], rsize, max_gap=RMW_GAP,
                            path=self.ndx_path, what="tail record")
            # the tails are read, logged, filled and linked where the span buffer holds them
            flat, row_at = tspans.buf, tspans.pos
            if self.undo is not None:
                self._save_tails(t0[tb], flat, row_at, used[tb], rsize)
            cont_old = NL.unpack_at(flat, row_at, ["continuation"])["continuation"]
            if np.any(cont_old != 0):
                j = int(np.flatnonzero(cont_old != 0)[0])
                raise PfmFormatError(f"tail record of bin {int(ub[tb[j]])} has a non-zero continuation "
                                     "pointer (chain corrupted)", path=self.ndx_path, offset=int(t0[tb[j]]))
            if fill.any():
                # the first fill[b] soundings of bin b go to the free slots of its tail record
                # (row j of trecs for tb[j]), coded, checked and packed in one kernel pass
                fill_slots(flat, rsize, L, self._single_bits, item_fields, codes, coding,
                           None, used[tb], start[tb], fill[tb], check=check, at=row_at)
            link = m[tb] > 0
            if link.any():
                NL.pack_at(flat, row_at[link], {"continuation": first_new[tb[link]].astype(np.uint64)})
        tm["add_tails"] += time.perf_counter() - t
        return tspans

    def _save_tails(self, offsets: np.ndarray, buf: np.ndarray, at: np.ndarray, used: np.ndarray,
                    size: int) -> None:
        """Give the undo log the pre-images of the tail records about to be filled or linked
        (``size`` bytes at ``offsets`` of the ``.ndx``, at bytes ``at`` of the read span ``buf``).

        A tail whose bits past its ``used`` slots are all zero (every record this store packs:
        its free slots and continuation pointer are zero) is restored by clearing those bits
        again, so only its address and the bits to keep are logged (16 bytes, not the record);
        any other (bits set past its soundings, left by another writer) is logged whole.
        """
        need = self.undo.needed("ndx", offsets, size)
        if not need.all():
            if not need.any():
                return
            offsets, at, used = offsets[need], at[need], used[need]
        keep = used.astype(np.int64) * self._single_bits
        clean = tails_clean((buf, size), keep, at=at)
        every = np.ones(offsets.size, dtype=bool)     # (the records needed, tested above)
        self.undo.save_cleared("ndx", offsets[clean], size, keep[clean], need=every[clean])
        if not clean.all():
            self.undo.save_records("ndx", offsets[~clean], size, buf, at=at[~clean],
                                   need=every[~clean])

    def _commit(self, step: dict) -> None:
        """Write what :meth:`_prepare` changed: the undo log made durable first, then the old tail
        records (now pointing to the new ones) and the bin records, all on the write-behind
        thread, in that order (its jobs run one after the other)."""
        t = time.perf_counter()
        if self.undo is not None:
            self.undo.commit_in(self._writer.run)
        if step["tspans"] is not None:
            step["tspans"].write(self._writer)
        step["bspans"].write(self._writer)
        self.ndx_size = step["ndx_size"]
        self.timings["add_bins_write"] += time.perf_counter() - t

    # ------------------------------------------------------------------ rewriting
    def set_validity(self, record_offset, slot, validity) -> None:
        """Rewrite the validity of soundings at (record_offset, slot), in place.

        Batched read-modify-write of the physical records concerned (sorted, merged spans,
        read from a map of the ``.ndx``); of duplicates of (record, slot) the last one wins.
        Bin records are not touched: recompute the bins after.
        """
        self._writable()
        ro = np.asarray(record_offset, dtype=np.int64).ravel()
        sl = np.asarray(slot, dtype=np.int64).ravel()
        va = np.broadcast_to(np.asarray(validity, dtype=np.int64), ro.shape).ravel()
        if not (ro.size == sl.size):
            raise ConfigError("record_offset and slot must have the same length")
        if ro.size == 0:
            return
        L, rsize = self.record_length, self.ndx_record_size
        self._check_range("slot", sl, L - 1, "[RECORD LENGTH]")
        self._check_range("validity", va, (1 << self.header.validity_bits) - 1, "[VALIDITY BITS]")
        bad = (ro < 0) | (ro % rsize != 0) | (ro + rsize > self.ndx_size)
        if np.any(bad):
            j = int(np.flatnonzero(bad)[0])
            raise PfmFormatError(f"record offset {int(ro[j])} is not a physical record of the .ndx",
                                 path=self.ndx_path, offset=int(ro[j]))
        self._sync()
        # the records' spans read from a map of the .ndx, not by a pread each: the soundings
        # an area filter cuts lie all over it (on a real-derived survey 100,383 records in
        # 25,109 spans of 339 MB), and a fault maps the pages around it for the next spans;
        # written back by a pwrite each (a write fault in a shared map costs more than one)
        fd = self._fds["ndx"]
        urec, inv = np.unique(ro, return_inverse=True)
        spans = Spans(fd, urec, rsize, max_gap=RMW_GAP, path=self.ndx_path, read=False,
                      zero=False)
        mm = mmap.mmap(fd, os.fstat(fd).st_size, access=mmap.ACCESS_READ)
        drop = hasattr(mmap, "MADV_DONTNEED")
        try:
            src = np.frombuffer(mm, dtype=np.uint8)
            buf = spans.buf
            for k, (lo, ln, at) in enumerate(zip(spans.span_lo.tolist(), spans.span_len.tolist(),
                                                 spans.span_at.tolist())):
                buf[at:at + ln] = src[lo:lo + ln]
                if drop and k % DROP_SPANS == DROP_SPANS - 1:
                    # the pages mapped so far let go (they stay cached): each fault maps
                    # 64 kB around it, and 26,873 cuts over the 74-file survey's 3 GB .ndx
                    # left 2.3 GB of it resident
                    mm.madvise(mmap.MADV_DONTNEED)
            del src
        finally:
            close_map(mm)
        # every slot's fields are slot 0's moved by the slot's bits; in the order given, so
        # that of duplicates of (record, slot) the last one wins
        self._ndx_layout.pack_items_at_bits(buf, spans.pos[inv] * 8 + sl * self._single_bits,
                                            [("validity", 0)], va.astype(np.uint64)[None, :])
        spans.write()

    def write_bin_records(self, bin_index, *, coverage: bool = True, fresh: bool = False,
                          **fields) -> None:
        """Write bin statistics for bins ``bin_index`` (batched read-modify-write).

        ``fields``: any of ``num_valid, std, avg_filtered, min_filtered,
        max_filtered, avg, min, max, validity`` (arrays parallel to
        ``bin_index`` or scalars). Depths and std are coded with the
        library's float32 rule ``NINT((float(v) + float(offset)) *
        float(scale))``. Count, head and tail are never touched. With
        ``validity`` and ``coverage=True`` the ``.cvg`` is updated too (``fresh``: from
        coverage bytes of 0, see :class:`._recompute.BandRecompute`).
        """
        self._writable()
        allowed = {"num_valid", "std", "validity"} | set(DEPTH_FIELDS)
        unknown = set(fields) - allowed
        if unknown:
            raise ConfigError(f"write_bin_records: unknown field(s) {sorted(unknown)}; "
                              f"allowed: {sorted(allowed)}")
        bi = np.asarray(bin_index, dtype=np.int64).ravel()
        n = bi.size
        if n == 0:
            return
        nbins = self.width * self.height
        if bi.min() < 0 or bi.max() >= nbins:
            raise PfmFormatError(f"bin_index outside 0..{nbins - 1}", path=self.path)
        h = self.header
        order = np.argsort(bi, kind="stable")
        bs = bi[order]
        if np.any(bs[1:] == bs[:-1]):
            raise ConfigError("write_bin_records: a bin is given twice")
        codes = {}
        for k, v in fields.items():
            arr = np.broadcast_to(np.asarray(v), (n,))[order]
            if k in DEPTH_FIELDS:
                c = scaled_code_f32(arr, h.depth_offset, h.depth_scale)
                lim, key = (1 << h.depth_bits) - 1, "[DEPTH BITS]"
            elif k == "std":
                c = nint(np.asarray(arr, np.float64).astype(np.float32) * np.float32(h.std_scale))
                lim, key = (1 << h.std_bits) - 1, "[STD BITS]"
                # A spread too large for the field (garbage depths thousands of metres apart
                # in one bin) is stored as the largest value; the library's int cast would
                # wrap it. (docs/pfm-format.md, quirks we fix)
                c = np.minimum(c, lim)
            elif k == "num_valid":
                if self.version < 70:
                    raise PfmFormatError("num_valid does not exist before v7", path=self.path)
                c = np.asarray(arr, dtype=np.int64)
                lim, key = (1 << h.count_bits) - 1, "[COUNT BITS]"
            else:
                c = np.asarray(arr, dtype=np.int64)
                lim, key = (1 << h.validity_bits) - 1, "[VALIDITY BITS]"
            self._check_range(k, np.asarray(c), lim, key)
            codes[k] = np.asarray(c).astype(np.uint64)
        self._sync()
        spans = Spans(self._fds["bin"], self.bin_header_size + bs * self.bin_record_size,
                       self.bin_record_size, max_gap=RMW_GAP, path=self.bin_path, what="bin record")
        BL = self._bin_layout
        words = BL._to_words(spans.records())
        BL.pack_words(words, codes, clear=True)
        spans.store(BL._from_words(words))
        spans.write()
        self._touch(bs)
        if coverage and "validity" in codes:
            self.update_coverage(bs, codes["validity"].astype(np.int64), fresh=fresh)
