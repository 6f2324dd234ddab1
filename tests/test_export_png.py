"""PNG quick-looks: size and content of the picture, block means against a slow reference,
memory on a 9-million-bin grid, and ``load --png`` / ``export --png`` on the command line."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from typer.testing import CliRunner

from pfm_dask import export as EX
from pfm_dask import pfm as P
from pfm_dask.cli import app

from .test_export_bag import build_hand_pfm, build_survey_pfm, run_memory_probe, shared_big

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    return build_survey_pfm(tmp_path_factory.mktemp("png_survey"))


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    return build_hand_pfm(tmp_path_factory.mktemp("png_hand"))


def _image(path) -> np.ndarray:
    from matplotlib.image import imread

    with open(path, "rb") as fh:
        assert fh.read(8) == PNG_MAGIC
    return imread(path)


def _colours(a: np.ndarray) -> int:
    q = np.round(a[..., :3] * 255).astype(np.int64)
    return np.unique(q[..., 0] * 65536 + q[..., 1] * 256 + q[..., 2]).size


def test_quicklook_size_and_content(survey, tmp_path):
    out = tmp_path / "q.png"
    res = EX.write_png(survey, out)
    img = _image(out)
    h, w = img.shape[:2]
    assert [w, h] == res["pixels"] and w >= 600 and h >= 300
    # counts in the title are the PFM's
    with P.open_pfm(survey) as f:
        b = f.read_bin_records(0, f.height)
    assert res["soundings"] == int(b["num_soundings"].sum())
    assert res["valid_soundings"] == int(b["num_valid"].sum())
    assert res["bins_with_surface"] == int((b["num_valid"] > 0).sum())
    # a picture, not a blank page: many colours, and each panel has its own coloured area
    assert _colours(img) > 500
    rgb = img[..., :3]
    inked = np.any(np.abs(rgb - 1.0) > 0.02, axis=-1)
    assert 0.2 < inked.mean() < 0.95
    halves = (img[: h // 2], img[h // 2:]) if res["pixels"][0] > res["pixels"][1] * 1.2 else \
        (img[:, : w // 2], img[:, w // 2:])
    for half in halves:
        assert _colours(half) > 150


def test_block_means_against_a_slow_reference(survey):
    factor = 3
    with P.open_pfm(survey) as f:
        red = EX.block_reduce_surface(f, "avg_filtered", 512 * 100, factor)   # column pieces
        b = f.read_bin_records(0, f.height)
        H, W, null = f.height, f.width, np.float32(f.null_depth)
    z = b["avg_filtered"].reshape(H, W)
    nv = b["num_valid"].reshape(H, W)
    has = (nv > 0) & (z < null)
    bh, bw = -(-H // factor), -(-W // factor)
    assert red["depth"].shape == red["count"].shape == (bh, bw)
    for br in range(bh):
        for bc in range(bw):
            blk = np.s_[br * factor:(br + 1) * factor, bc * factor:(bc + 1) * factor]
            zz = z[blk][has[blk]].astype(np.float32).astype(np.float64)
            if zz.size:
                assert red["depth"][br, bc] == pytest.approx(zz.mean(), rel=1e-12, abs=1e-9)
            else:
                assert np.isnan(red["depth"][br, bc])
            assert red["count"][br, bc] == pytest.approx(nv[blk].mean(), rel=1e-12)


def test_big_grid_is_drawn_reduced_within_budget(tmp_path_factory, hand, tmp_path):
    path, cells = shared_big(tmp_path_factory)
    budget = 8 << 20
    with P.open_pfm(path) as f:
        tracemalloc.start()
        red = EX.block_reduce_surface(f, "avg_filtered", budget, 6)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    acc = 4 * 500 * 500 * 8                  # the four block accumulators of a 500 x 500 image
    assert peak < 2 * budget + 2 * acc, peak
    assert red["depth"].shape == (500, 500)
    assert np.count_nonzero(~np.isnan(red["depth"])) == len(cells)
    for b, zz in cells.items():
        r, c = divmod(b, 3000)
        assert red["depth"][r // 6, c // 6] == pytest.approx(zz, abs=0.005)
    # the whole drawing in a fresh process: its peak grows by the image, not by the grid
    m = run_memory_probe("png", path, tmp_path / "big.png", budget, hand)
    assert m["result"]["reduction"] == 3 and m["result"]["image_bins"] == [1000, 1000]
    assert m["rss_growth"] < 256 << 20, m       # reading every bin record at once: ~3.7 GB


def test_cli_load_png(tmp_path):
    from pfm_dask import synth

    synth.generate(tmp_path / "s", files=2, pings=30, beams=64, seed=3)
    out, png = tmp_path / "l.pfm", tmp_path / "l.png"
    r = CliRunner().invoke(app, ["load", str(tmp_path / "s"), "-o", str(out), "--bin-size", "25",
                                 "--serial", "-q", "--png", str(png)])
    assert r.exit_code == 0, r.output
    img = _image(png)
    assert img.shape[1] >= 600 and _colours(img) > 100


def test_cli_export_png(hand, tmp_path):
    png = tmp_path / "h.png"
    r = CliRunner().invoke(app, ["export", hand, "--png", str(png), "--surface", "avg", "--json"])
    assert r.exit_code == 0, r.output
    img = _image(png)
    assert img.shape[0] > 100 and _colours(img) > 20
