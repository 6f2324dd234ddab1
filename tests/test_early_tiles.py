"""Tiles recomputed while a new load still writes (``pfm._tiles``) give the bytes of the one
recompute at the end.

The reference is the same load with ``_tiles.EARLY`` off: every bin recomputed in the final
step, the path the public-library and pfmLoader comparisons cover. Loads here write every
piece as a group of its own (``PFM_DASK_GROUP_BYTES=1``), so tiles finish between groups;
each test checks that some did, so none passes by never taking the early path. The header
extrema merged from tiles found out of raster order are compared with a raster-order fold.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from pfm_dask import pfm, pipeline, synth
from pfm_dask.config import LoadConfig, SwathFilterConfig
from pfm_dask.inputs import expand_inputs
from pfm_dask.pfm import _chains, _recompute, _recompute_kernel, _tiles
from pfm_dask.pfm._extrema import Candidates, _Extrema, band_extrema

from .test_resume import assert_same_pfm, pfm_cli
from .tiles_waiting_cli import wait_for_the_thread


@pytest.fixture(scope="module")
def lines(tmp_path_factory) -> list[str]:
    """Six parallel lines, overlapping their neighbours."""
    out = tmp_path_factory.mktemp("tiles-survey")
    synth.generate(out, files=6, pings=60, beams=96, seed=11)
    return [str(p) for p in expand_inputs([out])]


def _load(files, out: Path, monkeypatch, *, early: bool, tile: int = 4, lag: int = 1,
          cfg: LoadConfig | None = None, mode: str = "serial"):
    monkeypatch.setenv("PFM_DASK_GROUP_BYTES", "1")
    wait_for_the_thread(monkeypatch.setattr)   # each path taken every time
    monkeypatch.setattr(_tiles, "EARLY", early)
    monkeypatch.setattr(_tiles, "TILE", tile)
    monkeypatch.setattr(_tiles, "LAG", lag)
    res = pipeline.run_load(files, out, cfg or LoadConfig(bin_size_m=25.0), mode=mode,
                            workers=1, checkpoint_seconds=0)
    assert res.exit_code == 0, res.summary()
    return res


@pytest.mark.parametrize("tile,lag", [(4, 1), (1, 1), (16, 2), (4, 0)])
def test_tiles_done_early_give_the_bytes_of_one_recompute(lines, tmp_path, monkeypatch,
                                                         tile, lag):
    ref = tmp_path / "ref.pfm"
    _load(lines, ref, monkeypatch, early=False)
    out = tmp_path / "out.pfm"
    res = _load(lines, out, monkeypatch, early=True, tile=tile, lag=lag)
    assert res.timings.get("tiles_early", 0) > 0
    assert res.check["sound"]
    assert_same_pfm(out, ref, tmp_path)


def test_tiles_written_again_are_recomputed_again(lines, tmp_path, monkeypatch):
    """Lines out of order: a line between two written before it writes in their done tiles."""
    order = [lines[i] for i in (0, 2, 4, 1, 3, 5)]
    ref = tmp_path / "ref.pfm"
    _load(order, ref, monkeypatch, early=False)
    out = tmp_path / "out.pfm"
    res = _load(order, out, monkeypatch, early=True, lag=0)
    assert res.timings["tiles_redone"] > 0
    assert_same_pfm(out, ref, tmp_path)


def test_with_the_swath_filter_and_on_dask(lines, tmp_path, monkeypatch):
    cfg = LoadConfig(bin_size_m=25.0, swath=SwathFilterConfig(enabled=True))
    ref = tmp_path / "ref.pfm"
    _load(lines, ref, monkeypatch, early=False, cfg=cfg)
    out = tmp_path / "out.pfm"
    monkeypatch.setattr(_tiles, "usable_cores", lambda: 64)   # cores to spare for the tiles
    res = _load(lines, out, monkeypatch, early=True, cfg=cfg, mode="local")
    assert res.timings.get("tiles_early", 0) > 0
    assert_same_pfm(out, ref, tmp_path)


def test_the_area_filter_from_sums_on_dask(lines, tmp_path, monkeypatch):
    """On Dask, the writer's actor runs the filter's bands from the sums on its own threads
    (a disk node with cores to spare for the tiles): the bytes of the plain final step."""
    cfg = LoadConfig(bin_size_m=25.0, area_filter=True, cellstd=1.0)
    ref = tmp_path / "ref.pfm"
    _load(lines, ref, monkeypatch, early=False, cfg=cfg)
    out = tmp_path / "out.pfm"
    monkeypatch.setattr(_tiles, "usable_cores", lambda: 64)   # cores to spare for the tiles
    res = _load(lines, out, monkeypatch, early=True, cfg=cfg, mode="local")
    assert res.timings.get("tiles_early", 0) > 0 and res.timings["area_walked"] > 0
    assert_same_pfm(out, ref, tmp_path)


@pytest.mark.parametrize("name", ["EX1811", "EX1604"])
def test_real_gsf_files(sample_by_name, tmp_path, monkeypatch, name):
    """An EM302 sample, its pieces written as groups of their own."""
    files = [str(sample_by_name(name))]
    cfg = LoadConfig(bin_size_m=10.0, split_pings=5)   # a piece a few pings
    ref = tmp_path / "ref.pfm"
    _load(files, ref, monkeypatch, early=False, cfg=cfg)
    out = tmp_path / "out.pfm"
    res = _load(files, out, monkeypatch, early=True, cfg=cfg, tile=8, lag=0)
    assert res.timings.get("tiles_early", 0) > 0
    assert_same_pfm(out, ref, tmp_path)


@pytest.fixture(scope="module")
def killed_survey(lines, tmp_path_factory):
    """The lines in a folder of their own, and an uninterrupted ``--serial`` load of them
    (each piece a group) that recomputed tiles beside its writer."""
    import json

    survey = tmp_path_factory.mktemp("kill-survey")
    for f in lines:
        shutil.copy(f, survey)
    ref = tmp_path_factory.mktemp("kill-ref") / "ref.pfm"
    r = pfm_cli("load", survey, "-o", ref, *KILL_OPTS, "--json", env=KILL_ENV,
                module=KILL_CLI)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["timings"]["tiles_early"] > 0
    return survey, ref


KILL_OPTS = ["--bin-size", "25", "--serial", "-q", "--checkpoint-seconds", "0"]
KILL_ENV = {"PFM_DASK_GROUP_BYTES": "1",
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]),
                                           os.environ.get("PYTHONPATH", "")])}
KILL_CLI = "tests.tiles_waiting_cli"     # each group's end waits for the tile thread


@pytest.mark.parametrize("point", ["piece:5", "tiles-write:1", "tiles-write:2"])
def test_a_load_killed_after_tiles_were_done_resumes_to_the_same_bytes(killed_survey, tmp_path,
                                                                       point):
    """Tiles done before the kill keep what they wrote (no undo entry): the resumed load
    recomputes every bin in its final step, to the bytes of an uninterrupted load. Killed
    between two pieces, or by the tiles' thread right after it wrote a batch."""
    survey, ref = killed_survey
    out = tmp_path / "out.pfm"
    r = pfm_cli("load", survey, "-o", out, *KILL_OPTS,
                env={**KILL_ENV, "PFM_DASK_CRASH_AT": point}, module=KILL_CLI)
    assert r.returncode == -9, (r.returncode, r.stderr)
    res = pipeline.run_load([], out, None, mode="serial", resume=True)
    assert res.exit_code == 0, res.summary()
    assert_same_pfm(out, ref, tmp_path)


@pytest.mark.parametrize("point", ["tiles-write:1", "area-filter-row:3"])
def test_an_area_filter_load_killed_resumes_to_the_same_bytes(killed_survey, tmp_path, point):
    """With the area filter: killed after the tiles' first write, or in the filter (the
    tiles done, the filter's redo file half written); the resumed load recomputes every
    bin, to the bytes of an uninterrupted load."""
    survey, _ = killed_survey
    opts = [*KILL_OPTS, "--area-filter", "--cellstd", "1.0"]
    ref = tmp_path / "ref.pfm"
    r = pfm_cli("load", survey, "-o", ref, *opts, env=KILL_ENV, module=KILL_CLI)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.pfm"
    r = pfm_cli("load", survey, "-o", out, *opts, env={**KILL_ENV, "PFM_DASK_CRASH_AT": point},
                module=KILL_CLI)
    assert r.returncode == -9, (r.returncode, r.stderr)
    res = pipeline.run_load([], out, None, mode="serial", resume=True)
    assert res.exit_code == 0, res.summary()
    assert_same_pfm(out, ref, tmp_path)


def test_a_failing_tiles_thread_leaves_the_bins_to_the_final_step(lines, tmp_path,
                                                                  monkeypatch):
    """An error in the tiles' thread stops it; the final step recomputes what it left."""
    from pfm_dask.pfm import _recompute

    ref = tmp_path / "ref.pfm"
    _load(lines, ref, monkeypatch, early=False)
    calls = []
    real = _recompute.BandRecompute.kernel

    def fail_on_the_third(self, bidx, raw, pre=None):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("the disk went away for a moment")
        return real(self, bidx, raw, pre)

    monkeypatch.setattr(_recompute.BandRecompute, "kernel", fail_on_the_third)
    out = tmp_path / "out.pfm"
    res = _load(lines, out, monkeypatch, early=True)
    assert len(calls) >= 3 and res.check["sound"]
    assert_same_pfm(out, ref, tmp_path)


def test_a_thread_behind_at_the_end_is_hurried(lines, tmp_path, monkeypatch):
    """When the writer is done and the tiles' thread still has tiles it was handed, it stops
    after the rectangle it is on and the final step recomputes the rest on its threads: the
    bytes are those of the one recompute at the end."""
    import threading
    import time

    ref = tmp_path / "ref.pfm"
    _load(lines, ref, monkeypatch, early=False)
    handed, late = [], []
    run_beside, bands = _tiles.TileRecompute._run_beside, _tiles.TileRecompute._bands

    def slow(self, tiles):
        handed.append(tiles.size)
        if len(handed) > 1 and not self._hurry:
            time.sleep(0.3)      # behind the writer: the load ends while tiles wait
        return run_beside(self, tiles)

    def counted(self, *a, **k):
        if self._hurry and threading.current_thread().name == "pfm-tiles":
            late.append(1)       # a rectangle the thread began once hurried
        return bands(self, *a, **k)

    monkeypatch.setattr(_tiles.TileRecompute, "_run_beside", slow)
    monkeypatch.setattr(_tiles.TileRecompute, "_bands", counted)
    out = tmp_path / "out.pfm"
    res = _load(lines, out, monkeypatch, early=True, tile=1)
    assert res.check["sound"] and len(handed) > 2
    assert res.timings["tiles_early"] > 0 and not late
    assert_same_pfm(out, ref, tmp_path)


@pytest.mark.parametrize("threads", [1, 3])
def test_the_final_step_recomputes_on_its_own_threads(lines, tmp_path, monkeypatch, threads):
    """A --serial load writes on one thread and finishes on ``--final-threads``: the tiles
    left at the end (before the area filter too) and the filter's bands run on those."""
    from pfm_dask import _writer_area

    seen = {"rest": [], "filter": []}
    run, filt = _tiles.TileRecompute._run, _writer_area.run_area_filter_sums

    def rest(self, tiles):
        seen["rest"].append(self.threads)
        return run(self, tiles)

    def filter_sums(*a, **k):
        seen["filter"].append(k.get("threads"))
        return filt(*a, **k)

    monkeypatch.setattr(_tiles.TileRecompute, "_run", rest)
    monkeypatch.setattr("pfm_dask.writer.run_area_filter_sums", filter_sums)
    monkeypatch.setenv("PFM_DASK_GROUP_BYTES", "1")
    monkeypatch.setattr(_tiles, "TILE", 4)
    cfg = LoadConfig(bin_size_m=25.0, area_filter=True, cellstd=1.0)
    res = pipeline.run_load(lines, tmp_path / "out.pfm", cfg, mode="serial", workers=1,
                            checkpoint_seconds=0, final_threads=threads)
    assert res.exit_code == 0 and res.timings.get("tiles_early", 0) > 0
    assert seen["rest"] and set(seen["rest"]) == {threads}
    assert seen["filter"] == [threads]


def test_merged_candidates_are_the_raster_order_fold():
    """Bands found in any order, ties included, merge to the fold of every bin in order."""
    rng = np.random.default_rng(5)
    n = 400
    bidx = np.arange(n, dtype=np.int64) * 3
    stats = {"num_soundings": rng.integers(1, 4, n),
             "validity": np.where(rng.random(n) < 0.8, 1 << 0, 0).astype(np.int64),
             "std": rng.integers(0, 3, n).astype(np.float32)}
    for k in ("min_filtered", "max_filtered", "min", "max"):
        stats[k] = rng.integers(10, 14, n).astype(np.float32)       # many ties
    from pfm_dask import validity as V

    stats["validity"] = np.where(rng.random(n) < 0.8, V.DATA, 0).astype(np.int64)
    null32 = np.float32(1e6)
    want = _Extrema(None, 7)
    want.update(bidx, stats, null32)
    cands = Candidates(50)
    cuts = np.sort(rng.choice(np.arange(1, n), 30, replace=False))
    pieces = list(zip(np.r_[0, cuts], np.r_[cuts, n]))
    for slot, (a, b) in enumerate(rng.permutation(pieces)):
        cands.put(slot % 20, band_extrema(bidx[a:b], {k: v[a:b] for k, v in stats.items()},
                                          null32))
    got = _Extrema(None, 7)
    cands.fold_into(got)
    assert got.result() == want.result()


def test_a_walk_grows_with_the_file():
    w = _chains.ChainWalk()
    w.begin(5, 8)
    w.add(np.array([0, 4]), True, 0, 0)
    w.grow(20)
    w.add(np.array([17]), True, 0, 0)
    assert w.clean and w.n_phys == 20
    w.add(np.array([4]), True, 0, 0)          # reached again
    assert not w.clean


@pytest.mark.parametrize("cores,tasks,beside", [(2, 2, False), (4, 1, True), (3, 1, False),
                                                 (64, 16, True)])
def test_tiles_only_with_cores_to_spare(lines, tmp_path, monkeypatch, cores, tasks, beside):
    """Beside a Dask writer (its thread and its merge thread) and ``tasks`` task threads on
    its machine, tiles are recomputed early only on a machine with more cores."""
    from pfm_dask.writer import PfmWriter

    monkeypatch.setattr(_tiles, "usable_cores", lambda: cores)
    files = lines[:3]
    res = _load(files, tmp_path / "a.pfm", monkeypatch, early=True)
    assert res.timings.get("tiles_early", 0) > 0     # --serial: one thread computes
    seen = {}
    real = PfmWriter.compute_threads

    def spy(self, n):
        real(self, n)
        seen["beside"] = self._tiles.beside
    monkeypatch.setattr(PfmWriter, "compute_threads", spy)
    monkeypatch.setattr(pipeline, "_threads_on_host", lambda client, addr: tasks)
    _load(files, tmp_path / "b.pfm", monkeypatch, early=True, mode="local")
    assert seen["beside"] is beside


def test_the_check_takes_the_tiles_walk(lines, tmp_path, monkeypatch):
    """No done tile written again (every other line: none crosses a tile another wrote): the
    tiles' walk stands for the check's (it walks no chain itself, as after the one
    recompute), and the check finds nothing."""
    from pfm_dask.pfm import _check

    walked = []
    for name in ("_fast_band", "_walk_band"):
        orig = getattr(_check, name)
        monkeypatch.setattr(_check, name, lambda *a, _o=orig, _n=name: walked.append(_n) or _o(*a))
    out = tmp_path / "out.pfm"
    res = _load(lines[::2], out, monkeypatch, early=True)
    assert res.timings["tiles_early"] > 0 and res.timings["tiles_redone"] == 0
    assert res.check["sound"] and walked == []
    monkeypatch.undo()
    assert pfm.check(out) == []




@pytest.mark.parametrize("tile,deep_only", [(1, True), (4, True), (4, False)])
def test_with_the_area_filter(lines, tmp_path, monkeypatch, tile, deep_only):
    """The area filter runs after tiles were recomputed: the bins it changed are recomputed
    again from the state a new PFM's bins have before any recompute (a bin whose valid
    soundings were all cut keeps a std of 0 and is not "surveyed" in the .cvg), and the
    extrema of the rectangles whose best bin changed are set right."""
    cfg = LoadConfig(bin_size_m=25.0, area_filter=True, cellstd=1.0, deep_only=deep_only)
    ref = tmp_path / "ref.pfm"
    want = _load(lines, ref, monkeypatch, early=False, cfg=cfg)
    out = tmp_path / "out.pfm"
    handed = []
    real = _tiles.TileRecompute._refresh

    def refresh(self, changed, running=None):
        handed.append((changed.size, None if running is None else running[0].shape[0]))
        return real(self, changed, running)

    monkeypatch.setattr(_tiles.TileRecompute, "_refresh", refresh)
    res = _load(lines, out, monkeypatch, early=True, cfg=cfg, tile=tile)
    assert res.timings.get("tiles_early", 0) > 0
    # the filter ran from the tiles' sums, walking only the chains of bins with a cut, and
    # handed their recompute the running values of their soundings
    assert 0 < res.timings["area_walked"] < res.area_filter["bins_filtered"]
    assert len(handed) == 1 and handed[0][0] > 0 and handed[0][0] == handed[0][1]
    assert res.area_filter["cut"] > 1000 and res.area_filter == want.area_filter
    assert_same_pfm(out, ref, tmp_path)


@pytest.mark.parametrize("name", ["EX1811", "EX1604"])
def test_real_gsf_files_with_the_area_filter(sample_by_name, tmp_path, monkeypatch, name):
    files = [str(sample_by_name(name))]
    cfg = LoadConfig(bin_size_m=10.0, split_pings=5, area_filter=True, cellstd=1.5)
    ref = tmp_path / "ref.pfm"
    _load(files, ref, monkeypatch, early=False, cfg=cfg)
    out = tmp_path / "out.pfm"
    res = _load(files, out, monkeypatch, early=True, cfg=cfg, tile=8, lag=0)
    assert res.timings.get("tiles_early", 0) > 0
    assert 0 < res.timings["area_walked"] < res.area_filter["bins_filtered"]
    assert res.area_filter["cut"] > 0
    assert_same_pfm(out, ref, tmp_path)


def test_a_rectangles_best_found_again_from_its_records(lines, tmp_path, monkeypatch):
    """``_best_again`` (the best bin of a rectangle from its codes, the few of the best code
    recomputed) finds, for every rectangle and every key the filter can change, the
    candidate the rectangle's full recompute found."""
    cfg = LoadConfig(bin_size_m=25.0, area_filter=True, cellstd=1.0)
    out = tmp_path / "out.pfm"
    _load(lines, out, monkeypatch, early=False, cfg=cfg)
    f = pfm.open_pfm(out, "r+")
    try:
        touched = np.zeros(f.width * f.height, dtype=bool)
        for bidx, _ in f.raw_records_with_data([(0, touched.size)]):
            touched[bidx] = True
        tr = _tiles.TileRecompute(f, touched, tile=2)
        tr.last[tr.tiles_of(np.flatnonzero(touched))] = 0
        tr._run(np.flatnonzero(tr.last >= 0))
        slots = np.unique(tr.owner[tr.done])
        want_val, want_bin = tr.cands.val[slots].copy(), tr.cands.bin[slots].copy()
        keys = np.flatnonzero(_tiles.FILTERED_KEYS)
        view = _recompute_kernel.NdxView(f)
        bp = _recompute.BandRecompute(f, view)
        for t0 in slots.tolist():
            tr.cands.val[t0, keys] = np.nan
            tr._put_again(t0, keys, tr._best_again(t0, keys, bp))
        view.close()
        has = want_bin[:, keys] >= 0
        assert has.sum() > 100
        assert np.array_equal(tr.cands.bin[slots][:, keys], want_bin[:, keys])
        assert np.array_equal(tr.cands.val[slots][:, keys][has], want_val[:, keys][has])
    finally:
        f.close()


def test_scattered_bins_are_recomputed_in_small_bands(lines, tmp_path, monkeypatch):
    """A few bins all over a file (the area filter's changed bins, a fine grid's) are read
    in bands of a few thousand soundings whose ``.ndx`` pages are let go after each: the
    kernel maps the cached pages around each fault too, and 20,000 such bins of the
    74-file survey had mapped all of its 2.4 GB ``.ndx``."""
    out = tmp_path / "out.pfm"
    _load(lines, out, monkeypatch, early=False)
    f = pfm.open_pfm(out, "r+")
    try:
        bins = np.concatenate([b for b, _ in f.raw_records_with_data([(0, f.width * f.height)])])
        want = bins[:: max(1, bins.size // 50)]
        assert _recompute.scattered(want.size, f.width * f.height)
        monkeypatch.setattr(_recompute_kernel, "SCATTERED_DROP_SOUNDINGS", 4)
        monkeypatch.setattr(_recompute, "SCATTERED_DROP_SOUNDINGS", 4)
        bands = [b for job in _recompute._raw_jobs(f, want, 1 << 30) for b in job()]
        assert len(bands) > 10
        cnt = [int(_recompute_kernel.record_fields(r, f._bin_layout, ["num_soundings"])
                   ["num_soundings"].sum()) for _, r in bands]
        assert all(c <= 4 or b.size == 1 for c, (b, _) in zip(cnt, bands))
        view = _recompute_kernel.NdxView(f)
        view.scattered()
        assert view.drop_every == 4
        view.close()
    finally:
        f.close()


@pytest.mark.parametrize("threads,halo,room", [(1, 2, 1 << 14), (2, 2, 1 << 14),
                                               (2, 0, 1 << 14), (3, 1, 2)])
def test_the_filter_from_sums_skips_rows_across_blocks(lines, tmp_path, monkeypatch, threads,
                                                       halo, room):
    """``run_area_filter_sums`` filters bands of rows on threads, each from a guess a halo of
    rows early, checked against the band before (run again from the truth when they differ:
    with no halo, every band after a row with a cut), and frees the rows' sums as bands are
    done: with bands of one row and rows it does not read (no bin to filter in them or next
    to them), its redo file and summary are the plain pass's."""
    from pfm_dask import _area_rows, _writer_area
    from pfm_dask.filters._area import _POST_SKIP, _SKIP
    from pfm_dask.pfm._area_sums import AreaSums

    out = tmp_path / "out.pfm"
    _load(lines, out, monkeypatch, early=False)
    cfg = LoadConfig(bin_size_m=25.0, area_filter=True, cellstd=1.0)
    f = pfm.open_pfm(out, "r+")
    try:
        touched = np.zeros(f.width * f.height, dtype=bool)
        for bidx, _ in f.raw_records_with_data([(0, touched.size)]):
            touched[bidx] = True
        sums = AreaSums(tmp_path / "sums.bin", touched.size)
        tr = _tiles.TileRecompute(f, touched, tile=4)
        tr.sum_for_filter(sums, skip=int(_SKIP), post_skip=int(_POST_SKIP),
                          null_depth=float(cfg.null_depth))
        tr.last[tr.tiles_of(np.flatnonzero(touched))] = 0
        tr._run(np.flatnonzero(tr.last >= 0))
        assert tr.sums_ok
        rows = touched.reshape(f.height, f.width).copy()
        # rows not read: 6-10 (the blocks start on odd rows after them), then 22-23, the
        # first of a block and the last of the one after, which ahead was read already
        rows[5:12] = False
        rows[21:25] = False
        rows[40:45] = False
        monkeypatch.setattr(_writer_area, "_SUM_ROWS_BYTES", 1)     # bands of 1 row
        monkeypatch.setattr(_writer_area, "AREA_HALO_ROWS", halo)
        monkeypatch.setattr(_area_rows, "FIRST_ROOM", room)   # 2: bands with more cuts grow
        calls = []
        real = _area_rows.RowBands.band

        def band(self, *a):
            calls.append(1)
            return real(self, *a)

        monkeypatch.setattr(_area_rows.RowBands, "band", band)
        dropped = []
        drop = _recompute_kernel.NdxView.drop_pages

        def drop_pages(self, soundings=None):
            dropped.append(soundings)
            return drop(self, soundings)

        monkeypatch.setattr(_recompute_kernel.NdxView, "drop_pages", drop_pages)
        got = _writer_area.run_area_filter_sums(f, rows.reshape(-1), cfg, tmp_path / "a.redo",
                                                sums, threads=threads)
        # the .ndx map's pages are let go by every sounding of the rows filtered, not by the
        # few walked (each fault maps 64 kB around it: counting those let RSS reach 2.5 GB)
        n_dropped = sum(d for d in dropped if d is not None)
        needed = _writer_area._needed_rows(rows)
        n_rows = sum(int(f.read_bin_records(y, y + 1, 0, f.width)["num_soundings"].sum())
                     for y in np.flatnonzero(needed).tolist())
        n_bands = len(list(_writer_area._sum_bands(_writer_area._needed_rows(rows), f.width)))
        want = _writer_area.run_area_filter(f, rows.reshape(-1), cfg, tmp_path / "b.redo", 1)
        sums.close()
    finally:
        f.close()
    assert got is not None and got[2] > 0
    assert n_dropped >= n_rows      # (halo rows count in each band that runs them)
    # bands run again from the true state: only when they ran from a guess, and always when
    # that guess was the pre-filter statistics of a row with a cut
    if threads == 1:
        assert len(calls) == n_bands
    if halo == 0 and threads > 1:
        assert len(calls) > n_bands + 5
    assert got[0] == want[0] and got[0]["cut"] > 100
    assert {k: v for k, v in got[1].items()} == want[1]
    assert (tmp_path / "a.redo").read_bytes() == (tmp_path / "b.redo").read_bytes()


def test_sums_freed_by_a_band_still_read_the_same(tmp_path):
    """A band lets the map's pages of rows no band reads again go (``AreaSums.free``); the
    file keeps them (a band redone from the true state, or the chain-reading filter after a
    broken chain, reads them again), partial pages at the ends included."""
    from pfm_dask.pfm._area_sums import SUM_DTYPE, AreaSums

    n = 5000
    sums = AreaSums(tmp_path / "sums.bin", n)
    try:
        want = np.zeros(n, SUM_DTYPE)
        want["avg"] = np.arange(n) * 0.5
        want["n_all"] = np.arange(n) % 7
        sums.write(np.arange(100, n), want[100:])
        want[:100] = 0                      # never written: a hole, read as zeros
        table = sums.map()
        assert np.array_equal(table, want)
        sums.free(3, 4000)
        sums.free(0, 0)
        assert np.array_equal(table, want)
        del table
    finally:
        sums.close()
    assert not (tmp_path / "sums.bin").exists()


def test_a_recompute_from_running_values_is_the_walks(lines, tmp_path, monkeypatch):
    """The area filter hands the recompute of the bins it cut their running values, summed
    from the soundings it holds with the cut bits set (``_recompute_kernel._bin_steps``):
    the records and results are those of the recompute walking the chains once the cuts are
    written, with REFERENCE, DELETED and invalid soundings and zero depths among them."""
    from pfm_dask import validity as V

    out = tmp_path / "out.pfm"
    _load(lines, out, monkeypatch, early=False)
    f = pfm.open_pfm(out, "r+")
    try:
        bidx, raw = next(iter(f.raw_records_with_data([(0, f.width * f.height)])))
        bidx, raw = bidx[:400], np.ascontiguousarray(raw[:400])
        view = _recompute_kernel.NdxView(f)
        snd = _recompute_kernel.band_soundings(view, raw, bidx % f.width)
        z, v = snd["depth"].copy(), snd["validity"].copy()
        ro, sl, start = snd["record_offset"].copy(), snd["slot"].copy(), snd["start"]
        view.close()
        rng = np.random.default_rng(5)
        # validity the recompute treats apart, written before; then the cuts
        marks = rng.choice([0, V.REFERENCE, V.DELETED, V.FILTER_INVAL, V.MANUALLY_INVAL],
                           z.size, p=[0.85, 0.04, 0.04, 0.04, 0.03])
        v = (v | marks).astype(np.uint32)
        f.set_validity(ro, sl, v)
        cut_bits = int(V.FILTER_INVAL | V.MODIFIED)
        cut = (rng.random(z.size) < 0.2).astype(np.uint8)
        bp = _recompute.BandRecompute(f, None, fresh=True)
        args = _recompute.running_args(f)
        R = _recompute_kernel
        pre_f, pre_i = np.empty((bidx.size, 7)), np.empty((bidx.size, 4), np.int64)
        for g in range(bidx.size):
            a, b = int(start[g]), int(start[g + 1])
            R._bin_steps(z[a:b], v[a:b], cut[a:b], np.uint32(cut_bits), b - a, *args,
                         pre_f, pre_i, g)
        f.set_validity(ro[cut == 1], sl[cut == 1], v[cut == 1] | cut_bits)
        f.flush()
        view = R.NdxView(f)
        bp.view = view
        got = bp.kernel(bidx, raw, (pre_f, pre_i))
        want = bp.kernel(bidx, raw)
        view.close()
    finally:
        f.close()
    assert got is not None and want is not None
    assert np.array_equal(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        assert np.array_equal(a, b)
    assert np.count_nonzero(pre_i[:, 3] & 1) > 0     # bins with a REFERENCE sounding
