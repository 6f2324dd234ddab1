"""A piece is decoded and placed in chunks of pings (memory): the soundings, their order, the
contributing pings, the counts and the damage must be those of one pass over the piece."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pfm_dask import pipeline, soundings
from pfm_dask.config import LoadConfig, SwathFilterConfig


def _prepared(files, cfg, chunk, monkeypatch):
    monkeypatch.setattr(soundings, "CHUNK_SOUNDINGS", chunk)
    scans = [pipeline.prescan_file(str(f)) for f in files]
    grid = pipeline.area_from_scans(scans, cfg)
    return [soundings.prepare_piece(p, grid, cfg) for p in pipeline.plan_pieces(scans, cfg)]


def _assert_same(chunked, whole):
    assert len(chunked) == len(whole)
    for a, b in zip(chunked, whole):
        assert a.batch.schema == b.batch.schema and a.pings.schema == b.pings.schema
        assert a.batch.num_rows == b.batch.num_rows
        for name in a.batch.schema.names:
            np.testing.assert_array_equal(a.batch.column(name).to_numpy(),
                                          b.batch.column(name).to_numpy(), err_msg=name)
        assert a.pings.equals(b.pings)
        assert a.counts == b.counts and a.damage == b.damage


@pytest.mark.parametrize("swath", [False, True], ids=["plain", "swath-filter"])
def test_real_sample_in_chunks_equals_one_pass(gsf_sample, swath, monkeypatch):
    cfg = LoadConfig(bin_size_m=10.0, split_pings=37,
                     swath=SwathFilterConfig(enabled=swath))
    scans = [pipeline.prescan_file(str(gsf_sample))]
    if not scans[0].get("extent"):
        pytest.skip("no readable position in this sample")
    whole = _prepared([gsf_sample], cfg, 1 << 40, monkeypatch)
    chunked = _prepared([gsf_sample], cfg, 1, monkeypatch)   # 16 pings a chunk
    _assert_same(chunked, whole)


def test_survey_and_damaged_file_in_chunks_equal_one_pass(tmp_path, monkeypatch):
    from pfm_dask import synth

    synth.generate(tmp_path, files=2, pings=120, beams=64, seed=11)
    files = sorted(Path(tmp_path).glob("*.gsf"))
    data = files[1].read_bytes()
    files[1].write_bytes(data[: len(data) * 2 // 3])   # cut inside a ping: damage
    cfg = LoadConfig(bin_size_m=25.0, swath=SwathFilterConfig(enabled=True))
    whole = _prepared(files, cfg, 1 << 40, monkeypatch)
    chunked = _prepared(files, cfg, 64 * 20, monkeypatch)   # 20 pings a chunk
    assert any(p.damage for p in whole)
    _assert_same(chunked, whole)
