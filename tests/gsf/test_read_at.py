"""``GsfFile.read_at``: a sample of pings in one pass equals reading each ping alone."""

import numpy as np
import pyarrow as pa
import pytest

from pfm_dask import gsf, synth


def _one_by_one(f, picks):
    tables = [f.read(i, i + 1) for i in picks]
    return pa.concat_tables(tables) if tables else None


def test_real_samples_read_at_equals_single_reads(gsf_sample):
    with gsf.GsfFile(gsf_sample, strict=False) as f:
        n = f.n_pings
        if n == 0:
            pytest.skip("sample has no pings")
        picks = sorted({0, n // 3, n // 2, n - 1})
        got = f.read_at(picks)
    with gsf.GsfFile(gsf_sample, strict=False) as g:      # fresh file: no state remembered
        want = _one_by_one(g, picks)
    assert got.equals(want)


def test_read_at_stops_at_damage_like_single_reads(tmp_path):
    synth.generate(tmp_path, files=1, pings=30, beams=16, seed=4)
    path = next(tmp_path.glob("*.gsf"))
    data = path.read_bytes()
    cut = tmp_path / "cut.gsf"
    cut.write_bytes(data[: int(len(data) * 0.6)])          # truncated inside a ping
    with gsf.GsfFile(cut, strict=False) as f:
        picks = list(range(0, f.n_pings + 5, 4))
        got = f.read_at(picks)
        damage = [d.offset for d in f.damage]
    with gsf.GsfFile(cut, strict=False) as g:
        want = _one_by_one(g, [p for p in picks if p < g.n_pings])
        assert [d.offset for d in g.damage] == damage
    assert got.num_rows > 0 and got.equals(want)


def test_read_at_rejects_unsorted_pings(tmp_path):
    synth.generate(tmp_path, files=1, pings=5, beams=8, seed=1)
    with gsf.GsfFile(next(tmp_path.glob("*.gsf"))) as f:
        with pytest.raises(ValueError):
            f.read_at([3, 1])
        assert f.read_at([]).num_rows == 0
        assert np.array_equal(f.read_at([4]).column("ping").to_numpy(), np.full(8, 5))
