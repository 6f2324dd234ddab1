"""``check``'s work on one band of bins: the bin records, the chains, the soundings'
file and line numbers, the statistics recomputed, the coverage bytes, the header extrema.

:func:`_fast_band` may run on any thread; :func:`_walk_band` runs in band order (the
visited map spans bands). Both hand their problems to a band's own collector.
"""

from __future__ import annotations


import numpy as np

from .._numeric import nint, scaled_code_f32
from .. import validity as V
from ._header import PfmHeader
from ._recompute import _USER_FLAGS, grouped_bin_stats
from ._check_kernel import WALKED_FIELDS, check_sums, walked_summary
from ._recompute_kernel import record_fields
from ._check_parts import _Layout
from ._check_walk import _Walker
from ._problems import _Problems, _bin_where
from ._summary import summary_part

#: bands are first walked by the fast path (:func:`_fast_band`); False: the exact walk only
_FAST_WALK = True
_AVERAGE_NAMES = ("Average Filtered Depth", "Average Edited")

class _BandContext:
    """What every band of the bin pass needs: layout, header values, open files, totals."""

    def __init__(self, h: PfmHeader, lay: _Layout, walker: "_Walker", cvg_fd, n_files, n_lines,
                 deleted, budget: int):
        self.h, self.lay, self.walker, self.cvg_fd = h, lay, walker, cvg_fd
        self.W = int(h.bin_width)
        self.n_files, self.n_lines, self.deleted = n_files, n_lines, deleted
        self.scale32, self.off32 = np.float32(h.depth_scale), np.float32(h.depth_offset)
        self.null32 = np.float32(h.null_depth)
        self.std32 = np.float32(h.std_scale)
        self.std_max = (1 << int(h.std_bits)) - 1
        self.compute_average = h.average_filtered_name in _AVERAGE_NAMES
        self.class_type = int(h.class_type) if 0 <= int(h.class_type) <= 10 else None
        self.budget = budget  # soundings per band (check's band_soundings)
        self.walked = False   # the chains were walked by the recompute (check's ``walked``)


def _first(out, key, vals, bidx, lower, quantum) -> None:
    if vals.size:
        j = int(np.argmin(vals) if lower else np.argmax(vals))
        out.append((key, float(vals[j]), int(bidx[j]), lower, quantum))


def extrema_candidates(null: float, bidx, cnt, vals: dict, validity, depth_q, std_q):
    """A band's candidates for the header extrema (its first extreme of each, with its bin;
    ``None`` when it has no bin with soundings), on any thread; the caller folds them in
    band order (:meth:`_ExtremaCheck.fold`)."""
    has = cnt > 0
    if not has.any():
        return None
    out: list = []
    bi = bidx[has]
    _first(out, "bin_count_min", cnt[has].astype(np.float64), bi, True, 0)
    _first(out, "bin_count_max", cnt[has].astype(np.float64), bi, False, 0)
    ok = vals["max"][has] < null - 0.5 * depth_q  # below NULL DEPTH
    data = ok & ((validity[has] & V.DATA) != 0)
    _first(out, "min_filtered", vals["min_filtered"][has][data], bi[data], True, depth_q)
    _first(out, "max_filtered", vals["max_filtered"][has][data], bi[data], False, depth_q)
    _first(out, "min_std", vals["std"][has][data], bi[data], True, std_q)
    _first(out, "max_std", vals["std"][has][data], bi[data], False, std_q)
    _first(out, "min", vals["min"][has][ok], bi[ok], True, depth_q)
    _first(out, "max", vals["max"][has][ok], bi[ok], False, depth_q)
    return out


class _ExtremaCheck:
    """Header extrema recomputed from the stored bin records, pfmLoader's rules."""

    def __init__(self, width: int, null32):
        self.W = width
        self.null = float(null32)
        self.v = {}
        self.any = False

    def update(self, bidx, cnt, vals: dict, validity, depth_q, std_q):
        self.fold(extrema_candidates(self.null, bidx, cnt, vals, validity, depth_q, std_q))

    def fold(self, found) -> None:
        """Fold in a band's :func:`extrema_candidates` (bands in order): a band's first
        extreme replaces the running one only when strictly beyond it, as one pass would."""
        if found is None:
            return
        self.any = True
        for key, x, b, lower, quantum in found:
            cur = self.v.get(key)
            if cur is None or ((x < cur[0]) if lower else (x > cur[0])):
                self.v[key] = (x, b, quantum)

    def compare(self, h: PfmHeader, pr: _Problems) -> None:
        if not self.any:
            return
        W = self.W
        checks = [("bin_count_min", "[MINIMUM BIN COUNT]", h.min_bin_count, h.min_count_coord),
                  ("bin_count_max", "[MAXIMUM BIN COUNT]", h.max_bin_count, h.max_count_coord),
                  ("min_filtered", "[MIN FILTERED DEPTH]", h.min_filtered_depth, h.min_filtered_coord),
                  ("max_filtered", "[MAX FILTERED DEPTH]", h.max_filtered_depth, h.max_filtered_coord),
                  ("min", "[MIN DEPTH]", h.min_depth, h.min_coord),
                  ("max", "[MAX DEPTH]", h.max_depth, h.max_coord),
                  ("min_std", "[MIN STANDARD DEVIATION]", h.min_standard_deviation, None),
                  ("max_std", "[MAX STANDARD DEVIATION]", h.max_standard_deviation, None)]
        part = summary_part(h)   # stale (warning) or impossible (error): pfm/_summary.py
        for key, name, hv, hc in checks:
            got = self.v.get(key)
            if got is None:
                continue
            val, b, q = got
            tol = q * 1.01 + 2e-6 * max(1.0, abs(val))  # header floats print with 6 decimals
            if abs(float(hv) - val) > tol:
                pr.add("header extrema", part, "",
                       f"{name} = {float(hv):g} but the bins give {val:g} at {_bin_where(b, W)}")
            elif hc is not None and q == 0 and tuple(hc) != (b % W, b // W):
                pr.add("header extrema", part, "",
                       f"{name} is at {tuple(hc)} in the header but first reached at {_bin_where(b, W)}")


def _walk_band(bidx, recs, cover, ctx: _BandContext, pr: _Problems) -> dict:
    """A band's record checks and chain walk (in band order: the visited map spans bands).

    ``bidx`` (increasing) and ``recs``: the band's bins whose record is not all zero;
    ``cover``: ``(bins, coverage bytes)`` of every bin the band covers (the others in it are
    empty: all-zero records), or ``None`` where the ``.cvg`` lacks them."""
    W, lay, walker = ctx.W, ctx.lay, ctx.walker
    u = lay.bin.unpack(recs)
    cnt = u["count"].astype(np.int64)
    # empty bins must be all zero bytes (never written)
    empty = cnt == 0
    dirty = empty.copy()
    dirty[empty] = recs[empty].any(axis=1)     # only the empty bins' bytes are looked at
    for j in pr.each("empty bin dirty", ".bin", dirty):
        pr.add("empty bin dirty", ".bin", _bin_where(bidx[j], W),
               "count is 0 but the record has non-zero fields (statistics, flags or pointers)")
    # cap the chain walk: a count larger than the .ndx can hold is corrupt
    cap = walker.n_phys * lay.L
    huge = (cnt > cap) if walker.n_phys else np.zeros(cnt.size, dtype=bool)
    for j in pr.each("count too large", ".bin", huge):
        pr.add("count too large", ".bin", _bin_where(bidx[j], W),
               f"count {int(cnt[j]):,} is more than the whole .ndx holds ({cap:,} soundings)")
    walk_cnt = np.where(huge, 0, cnt)
    head, tail = u["head"].astype(np.int64), u["tail"].astype(np.int64)
    walker.pr = pr
    if int(walk_cnt.sum()) > 2 * ctx.budget:
        # a band this heavy is one bin with a huge count: validate its chain before
        # allocating for its soundings
        ok, _ = walker.walk(bidx, walk_cnt, head, tail, collect=False)
        walker.pr = _Problems()
        try:
            _, reached = walker.walk(bidx, np.where(ok, walk_cnt, 0), head, tail, mark=False)
        finally:
            walker.pr = pr
    else:
        ok, reached = walker.walk(bidx, walk_cnt, head, tail)
    ok &= ~huge
    return {"bidx": bidx, "u": u, "cnt": cnt, "ok": ok, "reached": reached, "cover": cover}


def _fast_band(bidx, recs, cover, ctx: _BandContext, pr: _Problems):
    """A band checked on the assumption that its records and chains are sound (any thread).

    Returns ``(records reached, the band's extrema arguments)`` when the bin
    record checks of :func:`_walk_band` and the chain walk with the sums
    (:func:`._check_kernel.check_sums`) find nothing, with the sounding checks'
    problems in ``pr``; ``None`` whenever the exact walk has anything to say
    (or this fast path cannot tell), and then the caller runs the exact one.
    The records reached are still to be visited (:func:`._chains.visit`) in band order.
    """
    if not _FAST_WALK:
        return None
    try:
        lay, walker = ctx.lay, ctx.walker
        u = record_fields(recs, lay.bin)
        cnt = u["count"].astype(np.int64)
        empty = cnt == 0
        if empty.any() and recs[empty].any():   # an empty bin with bytes: the exact walk
            return None
        if walker.n_phys and (cnt > walker.n_phys * lay.L).any():
            return None
        if int(cnt.sum()) > 2 * ctx.budget:   # a heavy bin: validated first by the exact walk
            return None
        if walker.words is None and walker.n_phys:   # a pointer over two 64-bit words
            return None
        # the chains walked, the soundings' tests and the bins' sums straight from the
        # records, in one compiled pass; anything to report, and the exact walk decides
        h = ctx.h
        got = check_sums(
            walker.recs.reshape(-1), lay.phys, lay.L, lay.sounding_bits, cnt,
            u["head"].astype(np.int64), u["tail"].astype(np.int64),
            (walker.wstart, walker.wshift, lay.cont_field[1]),
            {k: lay.item_fields[k] for k in ("depth", "validity", "file", "line")},
            depth_scale=h.depth_scale, depth_offset=h.depth_offset, null_depth=ctx.null32,
            class_type=ctx.class_type or 0, user_flags=_USER_FLAGS, n_files=ctx.n_files,
            n_lines=ctx.n_lines, deleted=ctx.deleted)
        if got is None:
            return None
        rec_idx, sums = got
        walked = {"bidx": bidx, "u": u, "cnt": cnt, "ok": np.ones(cnt.size, dtype=bool),
                  "cover": cover, "sums": sums}
        return rec_idx, extrema_candidates(float(ctx.null32), *_check_band_data(walked, ctx, pr))
    except Exception:  # noqa: BLE001 - the exact walk decides what is reported
        return None


#: the bin record fields :func:`_walked_band` reads
#: :func:`extrema_candidates`' keys in its order (even: the least, odd: the greatest)
_EXTREMA_KEYS = ("bin_count_min", "bin_count_max", "min_filtered", "max_filtered", "min_std",
                 "max_std", "min", "max")


def _walked_band(bidx, recs, cover, ctx: _BandContext, pr: _Problems):
    """A band whose chains the recompute walked (check's ``walked``), on any thread: the
    bin record checks of :func:`_walk_band`, the coverage and the extrema; ``None`` when a
    record needs the exact walk (the whole check then runs without ``walked``)."""
    try:
        depth_q, std_q = 1.0 / float(ctx.scale32), 1.0 / float(ctx.std32)
        n_max = ctx.walker.n_phys * ctx.lay.L if ctx.walker.n_phys else np.iinfo(np.int64).max
        # a band with nothing to report: one compiled pass (the same tests and candidates)
        fast = walked_summary(recs, ctx.lay.bin, bidx, cover, max_count=n_max,
                              scale32=ctx.scale32, off32=ctx.off32, std32=ctx.std32,
                              ok_below=float(ctx.null32) - 0.5 * depth_q)
        if fast is not None:
            if not fast:
                return None, None
            quantum = (0, 0, depth_q, depth_q, std_q, std_q, depth_q, depth_q)
            return None, [(_EXTREMA_KEYS[k], v, b, k % 2 == 0, quantum[k]) for k, v, b in fast]
        # only the fields this path reads (the statistics are not re-derived here)
        u = record_fields(recs, ctx.lay.bin, [k for k in WALKED_FIELDS if k in ctx.lay.bin.fields])
        cnt = u["count"].astype(np.int64)
        empty = cnt == 0
        if empty.any() and recs[empty].any():   # an empty bin with bytes: the exact walk
            return None
        if ctx.walker.n_phys and (cnt > ctx.walker.n_phys * ctx.lay.L).any():
            return None
        walked = {"bidx": bidx, "u": u, "cnt": cnt, "ok": np.ones(cnt.size, dtype=bool),
                  "cover": cover, "walked": True}
        return None, extrema_candidates(float(ctx.null32), *_check_band_data(walked, ctx, pr))
    except Exception:  # noqa: BLE001 - the whole check decides what is reported
        return None


def _check_band_data(walked: dict, ctx: _BandContext, pr: _Problems) -> tuple:
    """A band's sounding checks: file and line numbers, statistics, coverage.

    Thread-safe given its own ``pr``. Returns the arguments of the band's
    :meth:`_ExtremaCheck.update`, which the caller applies in band order.
    """
    W = ctx.W
    bidx, u, cnt, ok = walked["bidx"], walked["u"], walked["cnt"], walked["ok"]
    scale32, off32, std32, null32 = ctx.scale32, ctx.off32, ctx.std32, ctx.null32
    class_type = ctx.class_type
    validity = u["validity"].astype(np.int64)
    sums = walked.get("sums")       # the fast path's: its soundings passed these tests
    by_recompute = walked.get("walked", False)   # and the recompute's walk passed them too
    snd = (None if sums is not None or by_recompute
           else ctx.walker.soundings(walked["reached"]))
    has = cnt > 0
    # file and line numbers
    if snd is not None and snd["b"].size:
        for key, n, part in (("file", ctx.n_files, ".ctl"), ("line", ctx.n_lines, ".lin")):
            if n is None:
                continue
            bad = snd[key] >= np.uint64(n)
            for j in pr.each(f"{key} reference", ".ndx", bad):
                pr.add(f"{key} reference", ".ndx", _bin_where(bidx[snd['b'][j]], W),
                       f"a sounding names {key} {int(snd[key][j])} but the {part} lists {n}")
        deleted = ctx.deleted
        if deleted and any(deleted):
            dfl = np.asarray(deleted + [False], dtype=bool)
            fnum = np.minimum(snd["file"].astype(np.int64), len(deleted))
            nodel = dfl[fnum] & ((snd["validity"].astype(np.int64) & V.DELETED) == 0)
            for j in pr.each("deleted file", ".ndx", nodel):
                pr.add("deleted file", ".ndx", _bin_where(bidx[snd['b'][j]], W),
                       f"a sounding of deleted file {int(snd['file'][j])} is not flagged DELETED")
    # statistics: recompute the bins whose chain was walked cleanly
    # (after the recompute's walk: the statistics are the ones that same pass wrote)
    good = (np.flatnonzero(has & ok) if class_type is not None and not by_recompute
            else np.zeros(0, np.int64))
    depth_q = 1.0 / float(scale32)
    std_q = 1.0 / float(std32)
    stored_code = {k: u[k].astype(np.int64) for k in ("std", "avg_filtered", "min_filtered",
                                                       "max_filtered", "avg", "min", "max")
                   if k in u}   # the walked path reads no averages (and compares none)
    if good.size:
        prior_std = (u["std"][good].astype(np.float32) / std32).astype(np.float32)
        if sums is not None:
            z = val = np.zeros(0)
            part = {k: v[good] for k, v in sums.items()}
        else:
            # a cleanly walked bin has all its soundings, contiguous and in chain order
            is_good = np.zeros(bidx.size, dtype=bool)
            is_good[good] = True
            sel = is_good[snd["b"]]
            code, val = snd["depth"], snd["validity"].view(np.int64)   # validity < 2**32
            if not sel.all():
                code, val = code[sel], val[sel]
            z = code.astype(np.float64) / np.float64(scale32) - np.float64(off32)
            part = None
        st = grouped_bin_stats(good, cnt[good], z, val, null_depth=null32, class_type=class_type,
                               prior_validity=validity[good], prior_std=prior_std, sums=part)
        # st is ordered by b ascending == good ascending
        kind = "bin statistics"
        msgs = []
        if "num_valid" in u:
            nv = u["num_valid"].astype(np.int64)[good]
            for j in pr.each(kind, ".bin", nv != st["num_valid"]):
                msgs.append((j, f"num_valid is {int(nv[j])}, the soundings give {int(st['num_valid'][j])}"))
        fields = ["std", "min_filtered", "max_filtered", "min", "max"]
        if ctx.compute_average:
            fields += ["avg_filtered", "avg"]
        for f in fields:
            if f == "std":  # clamped to the field, as the store writes it
                want = np.minimum(nint(st["std"].astype(np.float32) * std32), ctx.std_max)
            else:
                want = scaled_code_f32(st[f], off32, scale32)
            have = stored_code[f][good]
            diff = np.abs(have - want)
            for j in pr.each(kind, ".bin", diff > 1):
                q = std_q if f == "std" else depth_q
                hv = have[j] * q - (0 if f == "std" else float(off32))
                wv = want[j] * q - (0 if f == "std" else float(off32))
                msgs.append((j, f"{f} is {hv:.6g}, the soundings give {wv:.6g} (stale or wrong statistic)"))
        vv = validity[good]
        for j in pr.each(kind, ".bin", vv != st["validity"].astype(np.int64)):
            msgs.append((j, f"validity is {int(vv[j]):#x}, the soundings give "
                         f"{int(st['validity'][j]):#x}"))
        for j, m in msgs:
            pr.add(kind, ".bin", _bin_where(bidx[good[j]], W), m)
    # coverage map, over every bin the band covers (its empty bins have validity 0)
    if walked["cover"] is not None:
        cbins, cov = walked["cover"]
        # an empty bin (all-zero record, validity 0) may set none of the three flags
        wrong = (cov & (V.COV_DATA | V.COV_CHECKED | V.COV_VERIFIED)) != 0
        at = np.searchsorted(cbins, bidx)
        c = cov[at].astype(np.int64)
        d = (validity & V.DATA) != 0
        w = (d != ((c & V.COV_DATA) != 0))
        w |= ((validity & V.CHECKED) != 0) != ((c & V.COV_CHECKED) != 0)
        w |= ((validity & V.VERIFIED) != 0) != ((c & V.COV_VERIFIED) != 0)
        w |= d & ((c & V.COV_SURVEYED) == 0)
        wrong[at] = w
        for j in pr.each("coverage", ".cvg", wrong):
            k = int(np.searchsorted(at, j))
            v = int(validity[k]) if k < at.size and at[k] == j else 0
            pr.add("coverage", ".cvg", _bin_where(cbins[j], W),
                   f"coverage byte {int(cov[j]):#04x} disagrees with the bin flags "
                   f"(DATA {bool(v & V.DATA)}, CHECKED {bool(v & V.CHECKED)}, "
                   f"VERIFIED {bool(v & V.VERIFIED)})")
    # header extrema from the stored values of this band
    vals = {}
    for f in ("min_filtered", "max_filtered", "min", "max"):
        vals[f] = (stored_code[f].astype(np.float32) / scale32 - off32).astype(np.float64)
    vals["std"] = (stored_code["std"].astype(np.float32) / std32).astype(np.float64)
    return bidx, cnt, vals, validity, depth_q, std_q
