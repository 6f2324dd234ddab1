"""Reading an open PFM: bin records by rectangle or by the bins holding data, and soundings
by walking their chains through a read-only map of the ``.ndx``.

:class:`PfmReads` is the reading half of :class:`~._store.PfmFile` (a mixin: it uses the
file's descriptors, layouts and header). Several threads may read at once.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from ..errors import ConfigError, PfmFormatError
from ._bitpack import BitLayout, unpack_records
from ._chains import chain_records, item_positions
from ._io import NdxMap
from ._layout import DEPTH_FIELDS
from ._sparse import gather_runs, nonzero_records, positions_to_items, record_runs

__all__ = ["PfmReads", "SOUNDING_FIELDS"]

#: Per-sounding fields of a physical record, in bit order (attributes sit before validity).
SOUNDING_FIELDS = ("file", "line", "ping", "beam", "depth", "x_off", "y_off",
                   "validity", "horizontal_error", "vertical_error")


class PfmReads:
    """Reading bins and soundings of an open PFM (mixed into ``PfmFile``)."""

    # ------------------------------------------------------------------ reading bins
    def _rect(self, row0, row1, col0, col1):
        col1 = self.width if col1 is None else int(col1)
        row0, row1, col0 = int(row0), int(row1), int(col0)
        if not (0 <= row0 <= row1 <= self.height and 0 <= col0 <= col1 <= self.width):
            raise ConfigError(f"rectangle rows {row0}..{row1}, cols {col0}..{col1} is outside the "
                              f"{self.width} x {self.height} grid")
        return row0, row1, col0, col1

    def _read_bin_raw(self, row0, row1, col0, col1):
        """(bin_index, raw records) of a rectangle, read with one pread."""
        W, bs = self.width, self.bin_record_size
        nr, nc = row1 - row0, col1 - col0
        if nr == 0 or nc == 0:
            return np.zeros(0, np.int64), np.zeros((0, bs), np.uint8)
        first = row0 * W + col0
        last = (row1 - 1) * W + col1
        lo = self.bin_header_size + first * bs
        want = (last - first) * bs
        raw = os.pread(self._fd("bin"), want, lo)
        if len(raw) != want:
            raise PfmFormatError("bin file ends early", path=self.bin_path, offset=lo + len(raw))
        allrec = np.frombuffer(raw, dtype=np.uint8).reshape(last - first, bs)
        rows = np.arange(row0, row1, dtype=np.int64)
        cols = np.arange(col0, col1, dtype=np.int64)
        bidx = (rows[:, None] * W + cols[None, :]).ravel()
        if nc == W:
            return bidx, allrec
        return bidx, allrec[bidx - first]

    def read_bin_records(self, row0: int, row1: int, col0: int = 0, col1: int | None = None,
                         *, codes: bool = False, fields: Sequence[str] | None = None) -> dict:
        """Bin records of rows ``row0..row1-1``, columns ``col0..col1-1`` (one read); see module doc.

        ``fields`` limits the result to ``bin_index``, ``row``, ``col`` and the
        fields named: the others are not decoded.
        """
        self._sync()
        row0, row1, col0, col1 = self._rect(row0, row1, col0, col1)
        bidx, recs = self._read_bin_raw(row0, row1, col0, col1)
        return self._decode_bins(bidx, recs, codes=codes, fields=fields)

    def bin_records_with_data(self, first: int = 0, last: int | None = None, *,
                              fields: Sequence[str] | None = None, chunk: int = 1 << 20,
                              only: np.ndarray | None = None, ranges=None):
        """Yield the decoded records (as :meth:`read_bin_records`, ``bin_index`` increasing) of
        the bins in ``first..last-1`` (or in the ``[a, b)`` bin ``ranges``) whose record is not
        all zero (of those in the sorted ``only``, when given), at most ``chunk`` bins' bytes
        read at a time (many short runs of data are read into one buffer).

        Holes of the sparse ``.bin`` (bins never written) are not read
        (:func:`._sparse.record_runs`) and all-zero records (empty bins) not decoded, so the
        work follows the bins that hold data, not the size of the grid.
        """
        self._sync()
        n = self.width * self.height
        last = n if last is None else int(last)
        first = int(first)
        if not 0 <= first <= last <= n:
            raise ConfigError(f"bins {first}..{last} are outside the grid of {n} bins")
        if ranges is None:
            ranges = [(first, last)]
        for bidx, recs in self.raw_records_with_data(ranges, chunk=chunk, only=only):
            yield self._decode_bins(bidx, recs, fields=fields)

    def raw_records_with_data(self, ranges, *, chunk: int = 1 << 20,
                              only: np.ndarray | None = None):
        """Yield ``(bin indices, records)``: the bytes of the records that are not all zero in
        the ``[a, b)`` bin ``ranges`` (of those in the sorted ``only``, when given), as in the
        ``.bin`` (a copy), at most ``chunk`` bins' bytes read at a time; holes of the sparse
        ``.bin`` are not read. :meth:`bin_records_with_data` decodes them; the recompute's
        compiled band pass takes them as they are."""
        bs, hs = self.bin_record_size, self.bin_header_size
        chunk = max(1, int(chunk))
        fd = self._fd("bin")
        buf = None    # one buffer for every read: fresh memory costs page faults on each
        runs = [record_runs(fd, hs, bs, a, b) for a, b in ranges]
        runs = np.concatenate(runs) if runs else np.zeros((0, 2), np.int64)
        for lo, hi, at in gather_runs(runs, chunk):
            n = int(hi[-1] - lo[-1] + at[-1])
            if buf is None or buf.size < n * bs:
                buf = np.empty(n * bs, dtype=np.uint8)
            mv = memoryview(buf)
            for a, b, p in zip(lo.tolist(), hi.tolist(), at.tolist()):
                got = os.preadv(fd, [mv[p * bs: (p + b - a) * bs]], hs + a * bs)
                if got != (b - a) * bs:
                    raise PfmFormatError("bin file ends early", path=self.bin_path,
                                         offset=hs + a * bs + got)
            recs = buf[: n * bs].reshape(n, bs)
            nz = nonzero_records(recs)
            bidx = positions_to_items(nz, lo, at)
            if only is not None and nz.size:
                w = np.minimum(np.searchsorted(only, bidx), only.size - 1)
                keep = only[w] == bidx
                nz, bidx = nz[keep], bidx[keep]
            if nz.size:
                yield bidx, recs[nz]

    def _decode_bins(self, bidx, recs, *, codes=False, fields=None) -> dict:
        h = self.header
        want = None if fields is None else set(fields)
        if codes and want is not None:
            want |= {"std", *DEPTH_FIELDS}

        def wanted(k) -> bool:
            return want is None or k in want

        layout = self._bin_layout.fields
        keys = [k for k in layout if wanted(f"attr_{k[1]}" if isinstance(k, tuple) else k)]
        u = self._bin_layout.unpack(recs, keys)
        out = {"bin_index": bidx, "row": bidx // self.width, "col": bidx % self.width}
        if wanted("num_soundings"):
            out["num_soundings"] = u["num_soundings"].astype(np.int64)
        if wanted("num_valid"):
            out["num_valid"] = (u["num_valid"].astype(np.int64) if "num_valid" in u
                                else np.zeros(bidx.size, np.int64))
        if wanted("std"):
            out["std"] = (u["std"].astype(np.float32) / np.float32(h.std_scale)).astype(np.float64)
        for k in DEPTH_FIELDS:
            if wanted(k):
                out[k] = self._bin_depth_decode(u[k])
        for i in range(self._n_bin_attr):
            if wanted(f"attr_{i}"):
                c = u[("attr", i)]
                out[f"attr_{i}"] = (c.astype(np.float64) / np.float64(np.float32(h.bin_attribute_scale[i]))
                                    - np.float64(np.float32(h.bin_attribute_offsets[i]))).astype(np.float32)
        for k in ("validity", "head", "tail"):
            if wanted(k):
                out[k] = u[k].astype(np.int64)
        if codes:
            for k in ("std",) + DEPTH_FIELDS:
                out[k + "_code"] = u[k].astype(np.int64)
        return out

    # ------------------------------------------------------------------ reading soundings
    def read_soundings(self, row0: int, row1: int, col0: int = 0, col1: int | None = None,
                       *, fields: Sequence[str] | None = None) -> dict:
        """Every sounding of every bin in the rectangle (see module doc), in chain order.

        Bin rows come from one read; physical records are gathered from a
        read-only map of the ``.ndx``, chains walked vectorised over chain
        depth. ``fields`` limits the result to the keys named (e.g.
        ``("depth", "validity")``): the others are not decoded.
        Safe to call from several threads at once (no writes meanwhile).
        """
        self._sync()
        row0, row1, col0, col1 = self._rect(row0, row1, col0, col1)
        bidx, recs = self._read_bin_raw(row0, row1, col0, col1)
        u = self._bin_layout.unpack(recs, ["num_soundings", "head"])
        return self._read_chains(bidx, u["num_soundings"].astype(np.int64), u["head"].astype(np.int64),
                                 fields=fields)

    def _read_chains(self, bidx, cnt, head, *, fields: Sequence[str] | None = None) -> dict:
        """Soundings of bins ``bidx`` (count ``cnt``, first record ``head``); see read_soundings."""
        L = self.record_length
        rsize = self.ndx_record_size
        NL = self._ndx_layout
        nz = np.flatnonzero(cnt > 0)
        bidx, cnt, head = bidx[nz], cnt[nz], head[nz]
        nrec = (cnt + L - 1) // L
        R = int(nrec.sum())
        rstart = np.cumsum(nrec) - nrec
        ndx_size = os.fstat(self._fd("ndx")).st_size
        self.ndx_size = ndx_size
        ndx = NdxMap(self._fds["ndx"], rsize, ndx_size, path=self.ndx_path)
        try:
            word = self._continuation_word()
            recaddr = None
            if word is not None:
                recaddr = chain_records(ndx.buf, rsize, *word, self._ndx_layout.fields["continuation"].nbits,
                                        nrec, head)
            if recaddr is None:   # something out of place (or a pointer over 9 bytes): step by step
                recaddr = self._walk_chains(ndx, bidx, cnt, nrec, rstart, head)
            # where each sounding is: a chain's records are consecutive in recaddr, filled slot
            # by slot; record r (step s of bin b) holds min(L, cnt[b] - s * L) soundings
            want = set(fields) if fields is not None else None
            keys = list(SOUNDING_FIELDS) + [("attr", i) for i in range(self._n_ndx_attr)]
            if fields is not None:
                keys = [k for k in keys if (f"attr_{k[1]}" if isinstance(k, tuple) else k) in want]
            layout = {k: (NL.fields[(k, 0)].offset, NL.fields[(k, 0)].nbits) for k in keys}
            aligned = not np.any(recaddr % rsize)
            # aligned records are unpacked straight from the map (item positions in the file)
            base = recaddr // rsize if aligned else np.arange(R, dtype=np.int64)
            loc = item_positions(base, recaddr, nrec, cnt, bidx, L, self.width,
                                 bins=want is None or bool(want & {"bin_index", "row", "col"}),
                                 rows=want is None or bool(want & {"row", "col"}),
                                 addresses=want is None or bool(want & {"record_offset", "slot",
                                                                        "address"}))
            pos = loc.pop("pos")
            u = {k: np.zeros(0, dtype=np.uint64) for k in keys}
            if R and keys:
                raw = ndx.records() if aligned else ndx.get(recaddr)
                u = unpack_records(raw, L, self._single_bits, layout, pos)
                del raw
            del pos
        finally:
            ndx.close()
        h = self.header
        out = {k: loc[k] for k in ("bin_index", "row", "col") if k in loc}
        for key in keys:
            vals = u[key]
            if key == "depth":
                out["depth"] = self._depth_decode(vals)
            elif key == "horizontal_error":
                out[key] = self._error_decode(vals, h.horizontal_error_bits, h.horizontal_error_scale)
            elif key == "vertical_error":
                out[key] = self._error_decode(vals, h.vertical_error_bits, h.vertical_error_scale)
            elif isinstance(key, tuple):
                i = key[1]
                out[f"attr_{i}"] = (vals.astype(np.float64) / np.float64(np.float32(h.ndx_attribute_scale[i]))
                                    + np.float64(np.float32(h.min_ndx_attribute[i]))).astype(np.float32)
            else:
                out[key] = vals.view(np.int64)          # < 2**32: same bits as int64
        if "record_offset" in loc:
            out["record_offset"], out["slot"] = loc["record_offset"], loc["slot"]
            out["address"] = (out["record_offset"] * L + out["slot"]).astype(np.uint64)
        return out

    def _walk_chains(self, ndx: "NdxMap", bidx, cnt, nrec, rstart, head) -> np.ndarray:
        """Byte addresses of the chains' records in (bin, step) order, one step of chain depth
        at a time for all bins; raises :class:`PfmFormatError` where a chain breaks."""
        rsize = self.ndx_record_size
        recaddr = np.zeros(int(nrec.sum()), dtype=np.int64)
        active = np.arange(bidx.size)
        cur = head.copy()
        step = 0
        while active.size:
            recaddr[rstart[active] + step] = cur
            go = nrec[active] > step + 1
            active = active[go]
            if not active.size:
                break
            prev = cur[go]
            nxt = self._continuations(ndx, prev)
            bad = (nxt <= 0) | (nxt % rsize != 0) | (nxt + rsize > ndx.file_size)
            if np.any(bad):
                j = int(np.flatnonzero(bad)[0])
                raise PfmFormatError(
                    f"chain of bin {int(bidx[active[j]])} breaks after {step + 1} record(s): continuation "
                    f"pointer {int(nxt[j])} but {int(cnt[active[j]])} soundings need "
                    f"{int(nrec[active[j]])} records", path=self.ndx_path, offset=int(prev[j]))
            cur = nxt
            step += 1
        return recaddr

    def _continuation_word(self) -> tuple[int, int] | None:
        """``(start, shift)``: the continuation pointer is the big-endian 64-bit word at byte
        ``start`` of its record shifted right by ``shift`` (and cut to its width); ``None``
        when the pointer does not fit one such word of the record."""
        f = self._ndx_layout.fields["continuation"]
        b0 = f.offset // 8
        b1 = (f.offset + f.nbits + 7) // 8
        s = max(0, b1 - 8)        # an 8-byte window ending with the pointer's last byte
        if s <= b0 and s + 8 <= self.ndx_record_size:
            return s, 64 - ((f.offset - 8 * s) + f.nbits)
        return None

    def _continuations(self, cache: "NdxMap", addr: np.ndarray) -> np.ndarray:
        """Continuation pointers of the records at ``addr`` (reads only the pointer's bytes)."""
        f = self._ndx_layout.fields["continuation"]
        word = self._continuation_word()
        if word is not None:
            s, shift = word
            v = cache.words(addr + s, addr).astype(np.uint64)
            v >>= np.uint64(shift)
            v &= np.uint64((1 << f.nbits) - 1)
            return v.astype(np.int64)
        b0 = f.offset // 8
        b1 = (f.offset + f.nbits + 7) // 8
        # short records, or a 64-bit pointer over 9 bytes
        part = cache.get(addr, b0, b1)
        one = BitLayout([("p", f.offset - 8 * b0, f.nbits)], record_bytes=b1 - b0)
        return one.unpack(np.ascontiguousarray(part), ["p"])["p"].astype(np.int64)

    def read_bin(self, col: int, row: int) -> tuple[dict, dict]:
        """One bin: its record (scalars) and its soundings (arrays)."""
        rec = self.read_bin_records(row, row + 1, col, col + 1)
        snd = self.read_soundings(row, row + 1, col, col + 1)
        return {k: v[0] for k, v in rec.items()}, snd

    def decode_positions(self, col, row, x_off, y_off):
        """(lat, lon) of soundings from their bin and offset codes, as the library decodes them."""
        return self.grid.decode_position(col, row, x_off, y_off)
