"""Memory of a load by behaviour: what waits for the writer is bounded by the settings, and the
writer lets go of a piece once it is written."""

from __future__ import annotations

import gc
import time
import weakref

import pytest

from pfm_dask import pfm, pipeline
from pfm_dask.backlog import HOLD_GROUPS, HOLD_PIECES, hold_bytes
from pfm_dask.planning import _estimate_bytes
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs
from pfm_dask.soundings import prepare_piece
from pfm_dask.writer import PfmWriter


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("bsurvey")
    synth.generate(out, files=4, pings=60, beams=128, seed=11)
    return out


def test_hold_is_two_groups_and_two_pieces_within_the_backlog():
    """The hold follows the settings and the plan only, never over --max-backlog."""
    g, p = 32 << 20, 30 << 20
    assert hold_bytes(512 << 20, g, p) == HOLD_GROUPS * g + HOLD_PIECES * p < 512 << 20
    assert hold_bytes(512 << 20, 256 << 20, p) == 512 << 20
    assert hold_bytes(1 << 20, 0, 0) >= 1


def test_written_pieces_leave_the_writer(survey, tmp_path):
    """Pieces handed over out of order wait in the reorder buffer; once written, the writer
    holds no reference to them (their Arrow batches are freed) and counts no bytes for them."""
    paths = expand_inputs([survey])
    cfg = LoadConfig(bin_size_m=25.0, split_pings=20, max_backlog_bytes=1 << 20)
    scans = [pipeline.prescan_file(p) for p in paths]
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    assert len(pieces) >= 8
    w = PfmWriter(tmp_path / "b.pfm", grid, cfg, paths, len(pieces), checkpoint_seconds=0)
    try:
        refs, held = [], 0
        for p in reversed(pieces):         # the last first: nothing can be written until seq 0
            prepared = prepare_piece(p, grid, cfg)
            refs.append(weakref.ref(prepared))
            held += prepared.nbytes
            assert w.put(prepared)
            del prepared
            assert w.write_ready() == 0 or p.seq == 0
        assert w.watermark == len(pieces)
        gc.collect()
        assert [r for r in refs if r() is not None] == []
        st = w.status()
        assert st["backlog_bytes"] == 0 and st["backlog_batches"] == 0
        assert w.peak_backlog_bytes == held
        assert w.finish()["check"]["sound"]
    finally:
        w.abort()


def _slowed(write_group, seconds: float):
    """``write_group`` taking ``seconds`` more per piece: producers outpace the writer."""
    def slow(self, group):
        time.sleep(seconds * len(group))
        return write_group(self, group)
    return slow


@pytest.mark.cluster
def test_a_slow_writer_holds_two_groups_and_two_pieces(survey, tmp_path, monkeypatch):
    """Producers outpace a slow writer: the pieces waiting in its process stay within the hold
    (two groups and two pieces), under --max-backlog, and the bytes are the serial load's."""
    from distributed import Client

    from pfm_dask.cluster import make_local_cluster

    real = PfmWriter._write_group
    monkeypatch.setattr(PfmWriter, "_write_group", _slowed(real, 0.1))
    limit = 4 << 20
    cfg = LoadConfig(bin_size_m=25.0, split_pings=6, max_backlog_bytes=limit)
    paths = expand_inputs([survey])
    pieces = pipeline.plan_pieces([pipeline.prescan_file(p) for p in paths], cfg)
    hold = hold_bytes(limit, PfmWriter.default_group_bytes(cfg),
                      max(_estimate_bytes(p) for p in pieces))
    # groups are a quarter of the backlog (PfmWriter.default_group_bytes): two groups and two
    # pieces stay below it
    assert hold < limit
    with make_local_cluster(2, processes=False) as cluster, Client(cluster) as client:
        res = pipeline.run_load(expand_inputs([survey]), tmp_path / "slow.pfm", cfg,
                                mode="scheduler", client=client)
    assert res.exit_code == 0
    assert 0 < res.peak_backlog_bytes <= hold
    monkeypatch.setattr(PfmWriter, "_write_group", real)
    ser = pipeline.run_load(expand_inputs([survey]), tmp_path / "ser.pfm", cfg, mode="serial")
    assert ser.exit_code == 0
    with pfm.open_pfm(tmp_path / "ser.pfm") as f:
        skip = {".ndx": 0, ".bin": f.bin_header_size}     # the .bin header names the file
    for part, at in skip.items():
        a = (tmp_path / "slow.pfm.data" / ("slow.pfm" + part)).read_bytes()
        b = (tmp_path / "ser.pfm.data" / ("ser.pfm" + part)).read_bytes()
        assert len(a) == len(b) and a[at:] == b[at:]


def test_serial_load_keeps_one_decode_buffer_and_none_in_the_final_step(survey, tmp_path,
                                                                        monkeypatch):
    """A --serial load decodes on one thread: at most one recycled decode buffer while it reads
    its pieces, none once the final step runs, nor the writer's packing buffers; the limit is
    given back afterwards."""
    from pfm_dask.gsf import _decode

    monkeypatch.setattr(_decode, "_POOL_MIN_BYTES", 0)      # pool the small survey's buffers
    seen, final = [], []
    real_prepare, real_recompute = pipeline.prepare_piece, pfm.recompute

    def prepare(*a, **k):
        out = real_prepare(*a, **k)
        seen.append(len(_decode._POOL))
        return out

    def recompute(pfm_file, *a, **k):
        final.append((len(_decode._POOL), getattr(pfm_file, "_chunk_pool", None)))
        return real_recompute(pfm_file, *a, **k)

    monkeypatch.setattr(pipeline, "prepare_piece", prepare)
    monkeypatch.setattr(pfm, "recompute", recompute)
    before = _decode._POOL_SIZE
    cfg = LoadConfig(bin_size_m=25.0, split_pings=20)
    res = pipeline.run_load(expand_inputs([survey]), tmp_path / "s.pfm", cfg, mode="serial")
    assert res.exit_code == 0
    assert len(seen) >= 8 and max(seen) == 1
    assert final == [(0, None)]
    assert _decode._POOL_SIZE == before


def test_pieces_hand_their_bins_over_in_four_bytes(survey):
    """A prepared piece's bin index is 4 bytes a sounding (the groups waiting for the writer
    hold 4 bytes a sounding less than with 8), while the groups still count 8, so that they,
    and the output's bytes, stay those of a wide index."""
    paths = expand_inputs([survey])
    cfg = LoadConfig(bin_size_m=25.0)
    scans = [pipeline.prescan_file(p) for p in paths]
    grid = pipeline.area_from_scans(scans, cfg)
    piece = pipeline.plan_pieces(scans, cfg)[0]
    prepared = prepare_piece(piece, grid, cfg)
    bins = prepared.batch.column("bin_index")
    n = prepared.batch.num_rows
    assert n > 0 and bins.type.byte_width == 4
    assert bins.buffers()[1].size < 8 * n          # no wide copy kept beside it
    assert prepared.nbytes == prepared.batch.nbytes + 4 * n + prepared.pings.nbytes
