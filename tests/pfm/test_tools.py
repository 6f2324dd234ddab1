"""``dump`` and ``info`` against the known inputs a PFM was written from."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pfm_dask import pfm as P
from pfm_dask.cli import app
from pfm_dask.pfm import validity as V

from .test_recompute import F_NULL, build_pfm, decoded_depth, expected_bins

# Spelled out here on purpose: other tools compare PFMs through these names.
SOUNDING_COLS = ["file", "line", "ping", "beam", "bin_x", "bin_y", "x", "y", "depth",
                 "validity", "horizontal_error", "vertical_error"]
BIN_COLS = ["bin_x", "bin_y", "num_soundings", "num_valid", "std", "avg_filtered",
            "min_filtered", "max_filtered", "avg", "min", "max", "validity"]


@pytest.fixture(scope="module", params=[1, 2], ids=["one-batch", "two-batches"])
def written(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"tools{request.param}")
    path, grid, inputs = build_pfm(d, seed=21, batches=request.param, n=500, lat_fraction=0.8)
    return path, grid, inputs


def test_dump_soundings_equal_inputs(written, tmp_path):
    path, grid, inp = written
    out = P.dump(path, soundings=tmp_path / "s.parquet")
    t = pq.read_table(tmp_path / "s.parquet")
    assert t.column_names == SOUNDING_COLS
    n = inp["depth"].size
    assert out["soundings"] == n == t.num_rows
    c = {k: t.column(k).to_numpy() for k in SOUNDING_COLS}
    # sorted by (bin_y, bin_x), then chain order: the order the inputs were built in
    for k, src in (("file", "file"), ("line", "line"), ("ping", "ping"), ("beam", "beam"),
                   ("validity", "validity"), ("bin_x", "col"), ("bin_y", "row")):
        assert np.array_equal(c[k].astype(np.int64), inp[src].astype(np.int64)), k
    want_depth = np.array([decoded_depth(z) for z in inp["depth"]])
    assert np.array_equal(c["depth"], want_depth)
    # positions: within one offset quantum (1/4095 of a bin) of where they were put
    assert np.all(np.abs(c["x"] - inp["lon"]) <= grid.x_bin / 4095)
    assert np.all(np.abs(c["y"] - inp["lat"]) <= grid.y_bin / 4095)
    assert np.all(np.abs(c["horizontal_error"] - inp["herr"]) <= 0.005 + 1e-5)
    assert np.all(np.abs(c["vertical_error"] - inp["verr"]) <= 0.005 + 1e-5)


def test_dump_bins_equal_reference(written, tmp_path):
    path, grid, inp = written
    out = P.dump(path, bins=tmp_path / "b.parquet")
    t = pq.read_table(tmp_path / "b.parquet")
    assert t.column_names == BIN_COLS
    want = expected_bins(inp)
    assert out["bins"] == len(want) == t.num_rows
    c = {k: t.column(k).to_numpy() for k in BIN_COLS}
    b = c["bin_y"].astype(np.int64) * grid.width + c["bin_x"]
    assert list(b) == sorted(want)
    for i, bi in enumerate(b):
        w = want[int(bi)]
        assert c["num_soundings"][i] == w["num_soundings"]
        assert c["num_valid"][i] == w["num_valid"]
        assert c["validity"][i] == w["validity"]
        for k in ("avg_filtered", "min_filtered", "max_filtered", "avg", "min", "max"):
            assert abs(float(c[k][i]) - float(w[k])) <= 0.005 + 1e-4, (bi, k)
        assert abs(float(c["std"][i]) - float(w["std"])) <= 1e-6 + 1e-6 * float(w["std"])


def test_dump_streams_in_bands(written, tmp_path, monkeypatch):
    from pfm_dask.pfm import _info

    path, grid, inp = written
    P.dump(path, soundings=tmp_path / "a.parquet", bins=tmp_path / "ab.parquet")
    monkeypatch.setattr(_info, "_BAND_SOUNDINGS", 9)
    P.dump(path, soundings=tmp_path / "b.parquet", bins=tmp_path / "bb.parquet")
    assert pq.read_table(tmp_path / "a.parquet").equals(pq.read_table(tmp_path / "b.parquet"))
    assert pq.read_table(tmp_path / "ab.parquet").equals(pq.read_table(tmp_path / "bb.parquet"))
    assert pq.ParquetFile(tmp_path / "b.parquet").metadata.num_row_groups > 1


def test_info_counts(written):
    path, grid, inp = written
    want = expected_bins(inp)
    i = P.info(path)
    json.dumps(i)  # JSON-serialisable
    assert i["geometry"]["width"] == grid.width and i["geometry"]["height"] == grid.height
    assert i["geometry"]["x_bin_size_deg"] == grid.x_bin
    assert len(i["geometry"]["polygon"]) == 4
    c = i["counts"]
    assert c["bins"] == grid.width * grid.height
    assert c["soundings"] == inp["depth"].size
    assert c["bins_with_soundings"] == len(want)
    assert c["bins_with_data"] == sum(1 for w in want.values() if w["validity"] & V.DATA)
    assert c["valid_soundings"] == sum(w["num_valid"] for w in want.values())
    assert c["input_files"] == 3 and c["lines"] == 4 and c["deleted_files"] == 0
    assert i["depth"]["null_depth"] == F_NULL and i["depth"]["min_depth"] == -10.0
    assert abs(i["depth"]["precision"] - 0.01) < 1e-9
    assert i["bits"]["validity_bits"] == 23
    assert i["version"].startswith("PFM Software - PFM I/O library V7.00")
    counts = [w["num_soundings"] for w in want.values()]
    assert i["header_extrema"]["max_bin_count"] == max(counts) == i["bin_extrema"]["max_bin_count"]
    assert i["header_extrema"]["min_bin_count"] == min(counts)
    hdr, bins = i["header_extrema"], i["bin_extrema"]
    for k in ("min_depth", "max_depth", "min_filtered_depth", "max_filtered_depth"):
        assert abs(hdr[k] - bins[k]) <= 0.0051


def test_cli_info_and_dump(written, tmp_path):
    path, grid, inp = written
    r = CliRunner().invoke(app, ["info", path, "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["counts"]["soundings"] == inp["depth"].size
    r = CliRunner().invoke(app, ["info", path])
    assert r.exit_code == 0 and "soundings" in r.output
    s, b = tmp_path / "s.parquet", tmp_path / "b.parquet"
    r = CliRunner().invoke(app, ["dump", path, "--soundings", os.fspath(s), "--bins", os.fspath(b)])
    assert r.exit_code == 0, r.output
    assert pq.read_table(s).num_rows == inp["depth"].size
    r = CliRunner().invoke(app, ["dump", path])
    assert r.exit_code == 2


def test_info_on_missing_pfm(tmp_path):
    r = CliRunner().invoke(app, ["info", os.fspath(tmp_path / "none.pfm")])
    assert r.exit_code == 1 and "error" in r.output
