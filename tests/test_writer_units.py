"""Small pieces of the single writer, tested without a load."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pfm_dask._writer_merge import lookup as _lookup


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300, unique=True),
       st.integers(0, 2**31), st.booleans())
def test_lookup_equals_binary_search(keys, seed, dense):
    """Line numbers by ping: the table gather equals the binary search it replaces, for dense
    ping numbers (a table) and sparse ones (the search itself)."""
    rng = np.random.default_rng(seed)
    k = np.array(sorted(keys), dtype=np.uint32)
    if dense:
        k = (np.arange(k.size) * int(rng.integers(1, 4)) + int(k[0]) // 2).astype(np.uint32)
    values = rng.integers(0, 5000, k.size)
    want = k[rng.integers(0, k.size, 1000)]
    assert np.array_equal(_lookup(k, values, want), values[np.searchsorted(k, want)])


class _CountsOnly:
    """Just what the area filter's band planner reads of a PFM: the grid and bin counts."""

    def __init__(self, counts: np.ndarray):
        self.counts = counts
        self.height, self.width = counts.shape

    def row_counts(self, f, r0, r1):
        return self.counts[r0:r1].sum(axis=1)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 30), st.integers(0, 2**31), st.integers(1, 400))
def test_area_bands_cover_the_needed_rows_within_the_budget(h, w, seed, budget):
    """Bands are runs of whole needed rows, in order, covering each needed row once; a band
    over the budget is a single row; a band stops only at a row not needed or at the budget."""
    import pfm_dask._writer_area as A

    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 12, (h, w)) * (rng.random((h, w)) < 0.7)
    needed = rng.random(h) < 0.7
    old = A.AREA_BAND_SOUNDINGS
    A.AREA_BAND_SOUNDINGS = budget
    try:
        fake = _CountsOnly(counts)
        bands = list(A.area_bands(fake, needed, fake.row_counts))
    finally:
        A.AREA_BAND_SOUNDINGS = old
    rows = [y for y0, y1 in bands for y in range(y0, y1)]
    assert rows == list(np.flatnonzero(needed))
    per_row = counts.sum(axis=1)
    for (y0, y1), nxt in zip(bands, bands[1:] + [None]):
        total = int(per_row[y0:y1].sum())
        assert total <= budget or y1 - y0 == 1
        if nxt is not None and nxt[0] == y1:       # adjacent: split for the budget only
            assert total + int(per_row[y1]) > budget


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=40), min_size=1, max_size=5),
       st.booleans())
def test_merged_pieces_equal_a_stable_sort_of_their_concatenation(bins, reuse):
    """A group's pieces (each sorted by bin) merge into the run a stable sort of their
    concatenation gives: by bin, then piece order, then each piece's own order; with the
    buffers of an earlier, larger group reused."""
    from pfm_dask._writer_merge import merge_sorted as _merge_sorted

    parts = [{"bin_index": np.sort(np.array(b, dtype=np.int64)),
              "seq": np.arange(len(b), dtype=np.int32) + 1000 * j,
              "depth": np.arange(len(b), dtype=np.float64) * 0.5 + j}
             for j, b in enumerate(bins)]
    bufs = {}
    if reuse:
        _merge_sorted([{k: np.concatenate([v, v, v]) for k, v in p.items()} for p in parts] * 2,
                      bufs)
    got = _merge_sorted(parts, bufs)
    whole = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    order = np.argsort(whole["bin_index"], kind="stable")
    for k in whole:
        assert got[k].dtype == whole[k].dtype
        assert np.array_equal(got[k], whole[k][order]), k


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, 1 << 40), max_size=30), min_size=2, max_size=5))
def test_merged_pieces_over_a_wide_range_of_bins_equal_a_stable_sort(bins):
    """Bins spread far wider than their number (merged run by run, not counted) merge as a
    stable sort of the pieces' concatenation too; a one-value column is repeated."""
    from pfm_dask._writer_merge import merge_sorted as _merge_sorted

    parts = [{"bin_index": np.sort(np.array(b, dtype=np.int64)),
              "file": np.uint32(j + 7),
              "beam": (np.arange(len(b)) % 500).astype(np.uint16)}
             for j, b in enumerate(bins)]
    got = _merge_sorted(parts, {})
    whole = {"bin_index": np.concatenate([p["bin_index"] for p in parts]),
             "file": np.concatenate([np.full(len(b), j + 7, np.uint32) for j, b in enumerate(bins)]),
             "beam": np.concatenate([p["beam"] for p in parts])}
    order = np.argsort(whole["bin_index"], kind="stable")
    for k in whole:
        assert got[k].dtype == whole[k].dtype, k
        assert np.array_equal(got[k], whole[k][order]), k


def test_groups_follow_the_pieces_bytes_not_their_arrival():
    """The writer's groups are the consecutive pieces from the watermark until their bytes
    reach the budget, or up to the last piece; a group waits for all its pieces, and pieces
    that arrive out of order make the same groups."""
    from pfm_dask.writer import PfmWriter, _Skipped

    class P:
        def __init__(self, seq, nbytes):
            self.piece = type("Piece", (), {"seq": seq})()
            self.nbytes = nbytes

    sizes = [30, 50, 10, 70, 5, 5, 5, 40]
    for arrival in (range(8), [3, 1, 0, 7, 2, 5, 6, 4]):
        w = PfmWriter.__new__(PfmWriter)
        w.group_bytes, w.n_pieces, w._next, w._buffer = 60, len(sizes), 0, {}
        groups = []
        for seq in arrival:
            w._buffer[seq] = _Skipped(P(seq, 0).piece, {}) if seq == 6 else P(seq, sizes[seq])
            while (end := w._group_end()) is not None:
                groups.append((w._next, end))
                for s in range(w._next, end):
                    del w._buffer[s]
                w._next = end
        # 30+50 >= 60; 10+70; 5+5+(skipped 6)+40 up to the last piece
        assert groups == [(0, 2), (2, 4), (4, 8)], arrival


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(0, 60), max_size=50), min_size=1, max_size=5),
       st.integers(1, 40))
def test_bin_chunks_cut_every_piece_at_the_same_bins(bins, per_chunk):
    """A group is written by runs of consecutive bins: every chunk cuts each piece at the same
    bin boundary, the chunks cover each piece once in order, none is empty, and each holds at
    most ``per_chunk`` soundings unless it is a single bin."""
    from pfm_dask._writer_merge import bin_chunks as _bin_chunks

    arrays = [np.sort(np.array(b, dtype=np.int64)) for b in bins]
    chunks = list(_bin_chunks(arrays, per_chunk))
    pos = [0] * len(arrays)
    last_bin = -1
    for cuts in chunks:
        got = np.concatenate([a[s:e] for a, (s, e) in zip(arrays, cuts)])
        assert got.size > 0
        assert got.min() > last_bin
        assert got.size <= per_chunk or np.unique(got).size == 1
        last_bin = int(got.max())
        for j, (s, e) in enumerate(cuts):
            assert s == pos[j] <= e
            pos[j] = e
    assert pos == [a.size for a in arrays]


def test_add_sorted_by_runs_of_bins_writes_the_bytes_of_one_call(tmp_path):
    """Why a group may be written a run of bins at a time: new records go to the end of the
    .ndx in bin order, tails and bin records are per bin, so consecutive calls on consecutive
    bin ranges give the bytes one call gives (tails filled, chains linked, bins rewritten)."""
    from pathlib import Path

    from pfm_dask import pfm

    from .pfm.test_store import make_soundings, small_grid

    out = {}
    for name, cuts in (("one", [0, 63]), ("runs", [0, 5, 6, 30, 62, 63])):
        rng = np.random.default_rng(3)
        path = str(tmp_path / f"{name}.pfm")
        with pfm.create(path, small_grid(9, 7), max_files=8, max_lines=64) as f:
            first = np.arange(0, 63, 2)
            f.add_sorted(**make_soundings(rng, first, rng.integers(1, 9, first.size)))
            bins = np.arange(0, 63)
            s = make_soundings(rng, bins, rng.integers(0, 11, bins.size))
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                a, b = np.searchsorted(s["bin_index"], [lo, hi])
                if b > a:
                    f.add_sorted(**{k: v[a:b] for k, v in s.items()})
            hsize = f.bin_header_size
        stem = Path(path + ".data") / f"{name}.pfm"
        out[name] = {k: Path(f"{stem}.{k}").read_bytes() for k in ("ndx", "bin", "cvg")}
        out[name]["bin"] = out[name]["bin"][hsize:]            # the header holds a date
    for k in ("ndx", "bin", "cvg"):
        assert out["one"][k] == out["runs"][k], k


def test_chunks_merged_ahead_on_the_merge_thread_write_the_bytes_of_one_chunk(tmp_path):
    """A group written as many runs of bins, each merged on the merge thread while the one
    before is written (two sets of buffers in turn), gives the bytes of the group written whole."""
    from pathlib import Path

    from pfm_dask import pipeline, synth
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs
    from pfm_dask.soundings import prepare_piece
    from pfm_dask.writer import PfmWriter

    synth.generate(tmp_path / "s", files=3, pings=60, beams=128, seed=5)
    paths = expand_inputs([tmp_path / "s"])
    cfg = LoadConfig(bin_size_m=25.0, split_pings=20)
    scans = [pipeline.prescan_file(p) for p in paths]
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    out = {}
    for name, chunk in (("whole", 1 << 40), ("runs", 20_000)):
        path = tmp_path / f"{name}.pfm"
        w = PfmWriter(path, grid, cfg, paths, len(pieces), checkpoint_seconds=0)
        try:
            w.chunk_bytes = chunk
            for p in pieces:
                w.put(prepare_piece(p, grid, cfg))
                w.write_ready()
            if name == "runs":
                assert w.timings["merge"] > 0 and w._merge_pool is not None
            w.pfm.flush()
            stem = Path(str(path) + ".data") / path.name
            out[name] = {k: Path(f"{stem}.{k}").read_bytes() for k in ("ndx", "bin", "cvg")}
            out[name]["bin"] = out[name]["bin"][w.pfm.bin_header_size:]   # the header holds a date
        finally:
            w.abort()
    for k in ("ndx", "bin", "cvg"):
        assert out["whole"][k] == out["runs"][k], k


def test_a_compute_thread_beside_the_writer_yields_to_it(monkeypatch):
    """_yield_to_writer lowers the calling thread's priority once, and only that thread's."""
    import os
    import threading

    from pfm_dask import pipeline_tasks as tasks

    if not hasattr(os, "setpriority"):
        import pytest
        pytest.skip("no setpriority here")
    monkeypatch.setattr(tasks, "TASK_NICE", 7)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = {}

    def task():
        tid = threading.get_native_id()
        tasks._yield_to_writer()
        tasks._yield_to_writer()
        seen["task"] = os.getpriority(os.PRIO_PROCESS, tid)

    t = threading.Thread(target=task)
    t.start()
    t.join()
    assert seen["task"] == min(19, base + 7)
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base


def test_a_task_keeps_its_summary_only_for_a_driver_collecting_in_its_process(monkeypatch):
    """A task beside the writer leaves its summary for the driver only in the box that
    driver opened; a worker holding the writer without the driver (a disk worker, worker 0
    of the processes layout) keeps nothing, load after load."""
    from types import SimpleNamespace

    import distributed.actor

    from pfm_dask import pipeline_tasks as tasks

    local = SimpleNamespace(put=lambda prepared: True)
    monkeypatch.setattr(tasks, "_local_writer", lambda *a: local)
    monkeypatch.setattr(distributed.actor, "Actor", lambda *a: None)
    monkeypatch.setattr(tasks, "prepare_piece",
                        lambda piece, grid, cfg: SimpleNamespace(timings={}, nbytes=5))
    monkeypatch.setattr(tasks, "TASK_NICE", 0)
    monkeypatch.setattr(tasks, "_summaries", {})
    ref = ("WriterActor", "tcp://127.0.0.1:1", "key")
    tasks._piece_task(SimpleNamespace(seq=3), None, None, ref)
    assert tasks._summaries == {}
    tasks._summaries[id(local)] = box = {}
    out = tasks._piece_task(SimpleNamespace(seq=4), None, None, ref)
    assert box == {4: out} and out["seq"] == 4


def _planned(tmp_path, files: int):
    """A small synthetic survey of ``files`` files at 25 m: its paths, config, grid, pieces."""
    from pfm_dask import synth
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs
    from pfm_dask.pipeline import area_from_scans, plan_pieces, prescan_file

    synth.generate(tmp_path / "gsf", files=files, pings=20, beams=32, seed=4)
    paths = expand_inputs([tmp_path / "gsf"])
    cfg = LoadConfig(bin_size_m=25.0)
    scans = [prescan_file(p) for p in paths]
    return paths, cfg, area_from_scans(scans, cfg), plan_pieces(scans, cfg)


def test_finish_called_again_returns_the_first_result(tmp_path):
    """Dask runs an actor's method again when the connection that carried the call broke:
    a second finish() returns the first one's result instead of touching a closed PFM."""
    from pfm_dask.soundings import prepare_piece
    from pfm_dask.writer import PfmWriter

    paths, cfg, grid, pieces = _planned(tmp_path, files=2)
    w = PfmWriter(tmp_path / "f.pfm", grid, cfg, paths, len(pieces), checkpoint_seconds=0)
    w.start()
    for p in pieces:
        w.put(prepare_piece(p, grid, cfg))
    first = w.finish()
    assert first["check"]["sound"]
    assert w.finish() is first


@pytest.mark.parametrize("intruder", [False, True])
def test_a_new_pfm_failing_before_its_first_checkpoint_removes_only_what_it_made(
        tmp_path, monkeypatch, intruder):
    """The writer removes the new PFM it made when it fails before its first checkpoint: its
    handle, parts and journal files, never a file it did not make in that folder."""
    from pfm_dask import synth
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs
    from pfm_dask.pipeline import area_from_scans, prescan_file
    from pfm_dask.writer import PfmWriter

    synth.generate(tmp_path / "gsf", files=1, pings=10, beams=16, seed=4)
    paths = expand_inputs([tmp_path / "gsf"])
    cfg = LoadConfig(bin_size_m=25.0)
    grid = area_from_scans([prescan_file(p) for p in paths], cfg)
    out = tmp_path / "n.pfm"
    data = tmp_path / "n.pfm.data"

    def fail(self, static, **kw):
        if intruder:  # someone else's file, put there while the load started
            (data / "theirs.txt").write_text("keep")
        raise OSError(5, "planted failure")

    monkeypatch.setattr(PfmWriter, "_start_journal", fail)
    with pytest.raises(OSError, match="planted"):
        PfmWriter(out, grid, cfg, paths, 1, journal={"command": None})
    if intruder:
        assert (data / "theirs.txt").read_text() == "keep"
    else:
        assert not out.exists() and not data.exists()


def test_a_new_loads_first_checkpoint_is_published_beside_the_pieces_and_before_any_write(
        tmp_path, monkeypatch):
    """A new load's first checkpoint (its inputs listed, nothing loaded) is made durable on a
    thread while the pieces are prepared: the writer is ready before its fsyncs end, and its
    first write to the PFM waits until ``journal.json`` is published."""
    import threading

    from pfm_dask import journal as J
    from pfm_dask.soundings import prepare_piece
    from pfm_dask.writer import PfmWriter

    paths, cfg, grid, pieces = _planned(tmp_path, files=1)
    release = threading.Event()
    fsync_path = J.fsync_path

    def held_fsync(path):          # the first checkpoint's fsyncs wait for the test
        assert release.wait(5)
        fsync_path(path)

    monkeypatch.setattr(J, "fsync_path", held_fsync)
    out = tmp_path / "f.pfm"
    release.set()                  # _start_journal's own fsyncs (handle, folder) go through
    monkeypatch.setattr(PfmWriter, "_add_files", _holding(PfmWriter._add_files, release))
    w = PfmWriter(out, grid, cfg, paths, len(pieces), journal={"command": None})
    journal = J.journal_paths(out)["journal"]
    assert not journal.exists()    # not published yet: the writer did not wait for it
    prepared = [prepare_piece(p, grid, cfg) for p in pieces]
    writes = []
    add_sorted = w.pfm.add_sorted
    monkeypatch.setattr(w.pfm, "add_sorted",
                        lambda *a, **k: (writes.append(journal.exists()), add_sorted(*a, **k))[1])
    threading.Timer(0.2, release.set).start()
    for p in prepared:
        w.put(p)
    w.write_ready()
    assert writes and all(writes)
    assert w.finish()["check"]["sound"]


def _holding(add_files, release):
    """``PfmWriter._add_files`` that holds the fsyncs after it (the first checkpoint's)."""
    def run(self, files):
        add_files(self, files)
        release.clear()
    return run
