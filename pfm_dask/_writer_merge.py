"""A group's pieces as the columns ``PfmFile.add_sorted`` takes, merged by bin.

The writer writes a group of consecutive pieces at once (``writer.PfmWriter._write_group``):
their soundings merged by bin, stably (within a bin, piece order), so that a bin the group's
overlapping lines share is written once, and cut at common bin boundaries into runs of about
``chunk_bytes``, so that the writing's memory follows the run, not the group. Here: slicing a
piece's columns (with its line numbers looked up by ping), the cuts, and the merge itself
(compiled passes of :mod:`pfm_dask.pfm._runs`). No Dask, no I/O.
"""

from __future__ import annotations

import numpy as np

from .pfm._runs import gather_u32, merge_runs_to, scatter

__all__ = ["PLAIN_COLUMNS", "sounding_columns", "bin_chunks", "merge_sorted", "lookup"]

#: batch columns handed to ``add_sorted`` as they are
PLAIN_COLUMNS = ("x_off", "y_off", "validity", "horizontal_error", "vertical_error")


def sounding_columns(part: dict, a: int, b: int) -> dict:
    """Soundings ``a .. b - 1`` of a piece (:meth:`PfmWriter._columns`) as the columns
    ``add_sorted`` takes (once :func:`merge_sorted` has repeated the file number, one value
    here), the PFM's null depth and their line numbers (looked up by ping); the other
    columns are views."""
    depth = part["depth"][a:b]
    ping = part["ping"][a:b]
    if part["nulls"] is not None:
        depth = np.where(depth == part["nulls"][0], part["nulls"][1], depth)
    return {"bin_index": part["bin_index"][a:b],
            "file": np.uint32(part["file"]),     # one value: repeated by the merge
            "line": lookup(*part["line"], ping), "ping": ping, "beam": part["beam"][a:b],
            "depth": depth,
            **{k: part[k][a:b] for k in PLAIN_COLUMNS}}


def bin_chunks(bins: list[np.ndarray], per_chunk: int):
    """Cut sorted bin-index arrays at common bin boundaries into chunks of about ``per_chunk``
    soundings in all (at least one bin each; a rule of the data only). Yields, per chunk,
    each array's ``(start, end)``. (Searched with values of the arrays' own type: numpy
    converts a whole 4-byte array to search it for a Python int, 100 times slower.)"""
    total = sum(b.size for b in bins)
    if total <= per_chunk:
        if total:
            yield [(0, b.size) for b in bins]
        return
    lo = min(int(b[0]) for b in bins if b.size)
    hi = max(int(b[-1]) for b in bins if b.size) + 1
    start = [0] * len(bins)
    done = 0
    while done < total:
        # the largest bin boundary ``cut`` with at most per_chunk soundings in lo .. cut - 1,
        # but at least lo + 1 (a bin with more soundings than per_chunk goes alone)
        a, c = lo + 1, hi
        while a < c:
            mid = (a + c + 1) // 2
            if sum(int(b.searchsorted(b.dtype.type(mid))) for b in bins) - done <= per_chunk:
                a = mid
            else:
                c = mid - 1
        cut = a
        end = [int(b.searchsorted(b.dtype.type(cut))) for b in bins]
        if sum(end) > done:
            yield list(zip(start, end))
        done = sum(end)
        start, lo = end, cut


def merge_sorted(parts: list[dict], bufs: dict, scratch: dict | None = None) -> dict:
    """The columns of several pieces, each sorted by bin, as one run sorted by bin; within a
    bin the pieces' order and each piece's own order are kept (a stable sort, which finds the
    pieces' sorted runs and merges them). A column may be one value for all of a piece's
    soundings (a numpy scalar: its file number), repeated in the result.

    The merge finds where each sounding goes (one linear pass over the bins, which also
    gives the merged bins); every other column is then moved piece by piece straight to those
    places, in a buffer of ``bufs`` kept from group to group (fresh memory costs a page fault
    per page). The merge's own temporaries (the pieces' bins end to end, the places) go in
    ``scratch`` when given: free again when it returns, they may be shared by output sets
    written in turn.
    """
    if len(parts) == 1:
        return {k: (np.full(parts[0]["bin_index"].size, v) if np.ndim(v) == 0 else v)
                for k, v in parts[0].items()}
    n = sum(p["bin_index"].size for p in parts)
    scratch = bufs if scratch is None else scratch

    def buf(key, dtype):
        d = scratch if isinstance(key, tuple) or key == "order" else bufs
        b = d.get(key)
        if b is None or b.dtype != dtype or b.size < n:
            b = d[key] = np.empty(n, dtype=dtype)
        return b[:n]

    i64 = np.dtype(np.int64)
    whole = np.concatenate([p["bin_index"] for p in parts], out=buf(("scratch", i64.str), i64))
    bounds = np.cumsum([0] + [p["bin_index"].size for p in parts])
    dest = buf("order", i64)
    out = {"bin_index": buf("bin_index", i64)}
    # the pieces' runs merged in one linear pass (what a stable sort gives)
    merge_runs_to(whole, bounds, dest, out["bin_index"])
    for k in parts[0]:
        if k == "bin_index":
            continue
        col = out[k] = buf(k, np.result_type(*[np.asarray(p[k]).dtype for p in parts]))
        for j, p in enumerate(parts):
            if np.ndim(p[k]) == 0:
                col[dest[bounds[j]:bounds[j + 1]]] = p[k]
            else:
                scatter(p[k].astype(col.dtype, copy=False), dest[bounds[j]:bounds[j + 1]], col,
                        check=False)     # places 0 .. n - 1, from the merge
    return out


def lookup(keys: np.ndarray, values: np.ndarray, want: np.ndarray) -> np.ndarray:
    """``values[searchsorted(keys, want)]`` for sorted unique integer ``keys`` that all of ``want``
    are among: through a table indexed by key when the keys are dense (ping numbers of a
    piece), an O(1) gather per sounding instead of a binary search into a table the
    soundings, sorted by bin, visit in no order."""
    if keys.size == 0:
        return values[np.searchsorted(keys, want)]
    lo, hi = int(keys[0]), int(keys[-1])
    if hi - lo + 1 > 4 * keys.size + 1024:
        return values[np.searchsorted(keys, want)]
    table = np.empty(hi - lo + 1, dtype=values.dtype)
    table[keys.astype(np.int64) - lo] = values
    if table.dtype == np.uint32 and want.dtype == np.uint32:
        got = gather_u32(table, lo, want)       # one compiled pass, no temporaries
        if got is not None:
            return got
    return table[want.astype(np.int64) - lo]
