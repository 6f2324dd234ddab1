"""GeoTIFF read back through GDAL (rasterio) equals the surface; the XYZ equals ``dump --bins``.

References: the bin records of the PFMs (through the store and through
``pfm.dump``'s Parquet), hand-worked statistics, and bin-centre positions
computed here from the header geometry.
"""

from __future__ import annotations

import csv
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pfm_dask import export as EX
from pfm_dask import pfm as P
from pfm_dask.cli import app
from pfm_dask.errors import ConfigError

from .test_export_bag import (build_hand_pfm, build_survey_pfm, gdal_locations, grid_of,
                              hand_expected, reference_surface, run_memory_probe, shared_big)



@pytest.fixture
def rio():
    """rasterio (GDAL): writes the GeoTIFF and reads it back; GeoTIFF tests skip without it."""
    return pytest.importorskip("rasterio", reason="GeoTIFF export needs rasterio (pfm-dask[geotiff])")


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    return build_hand_pfm(tmp_path_factory.mktemp("tif_hand"))


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    return build_survey_pfm(tmp_path_factory.mktemp("tif_survey"))


def _read(path):
    import rasterio

    with rasterio.open(path) as ds:
        return ds, [ds.read(i) for i in range(1, ds.count + 1)], list(ds.descriptions)


# ---------------------------------------------------------------------------
# GeoTIFF


@pytest.mark.parametrize("surface", EX.SURFACES)
def test_geotiff_equals_the_surface(rio, survey, tmp_path, surface):
    out = tmp_path / "s.tif"
    res = EX.write_geotiff(survey, out, surface=surface, memory=1 << 20)
    assert res["tiles_read"] > 1
    g = grid_of(survey)
    ds, bands, desc = _read(out)
    assert ds.driver == "GTiff" and (ds.width, ds.height) == (g.width, g.height)
    assert ds.crs.to_epsg() == 4326
    t = ds.transform
    assert np.allclose((t.c, t.a, t.b, t.f, t.d, t.e),
                       (g.min_x, g.x_bin, 0, g.max_y, 0, -g.y_bin), rtol=0, atol=1e-12)
    assert np.isnan(ds.nodata) and len(bands) == 3
    assert desc[0].startswith("depth (m, positive down)") and surface in desc[0]
    z, std = reference_surface(survey, surface)
    surf, count, sd = (b[::-1] for b in bands)        # north-up file, PFM rows from the south
    assert np.array_equal(np.isnan(surf), np.isnan(z))
    assert np.array_equal(surf[~np.isnan(z)], z[~np.isnan(z)])
    with P.open_pfm(survey) as f:
        nv = f.read_bin_records(0, f.height)["num_valid"].reshape(f.height, f.width)
    assert np.array_equal(count, nv.astype(np.float32))
    assert np.array_equal(np.isnan(sd), np.isnan(std))
    assert np.array_equal(sd[~np.isnan(std)], std[~np.isnan(std)])


def test_geotiff_hand_values_and_layer_choice(rio, hand, tmp_path):
    out = tmp_path / "h.tif"
    EX.write_geotiff(hand, out, surface="max_filtered", layers=("std", "surface"))
    ds, (sd, surf), desc = _read(out)
    assert ds.count == 2 and desc[0].startswith("std") and desc[1].startswith("depth")
    want = hand_expected("max_filtered")
    for r in range(5):
        for c in range(7):
            val, std, _, _ = want.get((c, r), (np.nan, np.nan, 0, 0))
            got = surf[4 - r, c]
            if np.isnan(val):
                assert np.isnan(got)
            else:
                assert got == pytest.approx(val, abs=0.005 + 1e-6)
            if np.isnan(std):
                assert np.isnan(sd[4 - r, c])
            else:
                assert sd[4 - r, c] == pytest.approx(std, abs=0.005)


def test_geotiff_through_gdal_bin(rio, hand, tmp_path):
    out = tmp_path / "h.tif"
    EX.write_geotiff(hand, out, layers=("surface",))
    # (col 0, row 0) holds 10.5; GDAL line 4 is PFM row 0; (col 3, row 1) holds 41
    vals = gdal_locations(out, 1, [(0, 4), (3, 3), (5, 2)])
    assert vals[0] == pytest.approx(10.5, abs=1e-4) and vals[1] == pytest.approx(41.0, abs=1e-4)
    assert np.isnan(vals[2])


def test_bad_layers_are_refused(rio, hand, tmp_path):
    for layers in (("surface", "depth"), (), ("count", "count")):
        with pytest.raises(ConfigError, match="layers"):
            EX.write_geotiff(hand, tmp_path / "x.tif", layers=layers)
    assert not (tmp_path / "x.tif").exists()


# ---------------------------------------------------------------------------
# XYZ


def _read_xyz(path):
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["longitude", "latitude", "depth"]
    return rows[1:]


def test_xyz_equals_the_dump(survey, tmp_path):
    out = tmp_path / "s.csv"
    res = EX.write_xyz(survey, out, memory=1 << 20)
    P.dump(survey, bins=tmp_path / "b.parquet")
    b = pq.read_table(tmp_path / "b.parquet").to_pydict()
    keep = np.asarray(b["num_valid"]) > 0                # the default surface: valid soundings
    bx, by = np.asarray(b["bin_x"])[keep], np.asarray(b["bin_y"])[keep]
    want = np.asarray(b["avg_filtered"], dtype=np.float32)[keep]
    info = P.info(survey)["geometry"]
    lon = info["min_x"] + (bx + 0.5) * info["x_bin_size_deg"]
    lat = info["min_y"] + (by + 0.5) * info["y_bin_size_deg"]
    rows = _read_xyz(out)
    assert res["points"] == len(rows) == keep.sum() > 100
    got = np.array(rows, dtype=np.float64)
    assert np.all(np.abs(got[:, 0] - lon) <= 0.5e-9 + 1e-12)       # same order as the dump
    assert np.all(np.abs(got[:, 1] - lat) <= 0.5e-9 + 1e-12)
    # depths are printed at the PFM's precision (0.01 m): the decimal the stored code stands
    # for; the dump's float32 (decoded as the library does, (code / scale) - offset in float32)
    # is within 0.001 m of it, so rounding the dump gives the same decimal
    assert all(len(r[2].split(".")[1]) == 2 for r in rows)
    assert np.array_equal([r[2] for r in rows], [f"{v:.2f}" for v in want.astype(np.float64)])
    assert np.all(np.abs(got[:, 2] - want) <= 0.001)


def test_xyz_hand_values(hand, tmp_path):
    out = tmp_path / "h.csv"
    EX.write_xyz(hand, out, surface="avg")
    rows = _read_xyz(out)
    g = grid_of(hand)
    want = hand_expected("avg")
    order = sorted(want, key=lambda cr: (cr[1], cr[0]))                 # raster order
    assert [(round((float(x) - g.min_x) / g.x_bin - 0.5), round((float(y) - g.min_y) / g.y_bin - 0.5))
            for x, y, _ in rows] == order
    for (x, y, z), key in zip(rows, order):
        assert float(z) == pytest.approx(round(want[key][0], 2), abs=1e-9)
    assert rows[order.index((3, 1))][2] == "60.67"


# ---------------------------------------------------------------------------
# memory bound and command line


@pytest.mark.parametrize("kind", ["geotiff", "xyz"])
def test_big_grid_stays_within_budget(tmp_path_factory, hand, tmp_path, kind):
    if kind == "geotiff":
        rasterio = pytest.importorskip("rasterio", reason="GeoTIFF export needs rasterio")
    path, cells = shared_big(tmp_path_factory)
    budget = 8 << 20
    out = tmp_path / ("big.tif" if kind == "geotiff" else "big.csv")
    m = run_memory_probe(kind, path, out, budget, hand)
    assert m["traced_peak"] < 2 * budget, m
    # GDAL's block cache (GDAL_CACHEMAX, a quarter of the budget with an 8 MiB floor) and
    # libraries add a fixed amount, not a share of the 9-million-bin grid
    assert m["rss_growth"] < 2 * budget + (24 << 20), m
    if kind == "geotiff":
        with rasterio.open(out) as ds:
            a = ds.read(1)
        assert a.shape == (3000, 3000)
        for b, z in cells.items():
            r, c = divmod(b, 3000)
            assert a[2999 - r, c] == pytest.approx(z, abs=0.005)
        assert np.count_nonzero(~np.isnan(a)) == len(cells)
    else:
        rows = _read_xyz(out)
        assert sorted(float(z) for _, _, z in rows) == pytest.approx(sorted(cells.values()), abs=0.005)


def test_cli_export_geotiff_and_xyz(rio, hand, tmp_path):
    tif, xyz = tmp_path / "c.tif", tmp_path / "c.csv"
    r = CliRunner().invoke(app, ["export", hand, "--geotiff", str(tif), "--layer", "count",
                                 "--xyz", str(xyz), "--memory", "1MiB"])
    assert r.exit_code == 0, r.output
    with rio.open(tif) as ds:
        assert ds.count == 1 and ds.read(1)[4, 0] == 3.0
    assert len(_read_xyz(xyz)) == 5
    r = CliRunner().invoke(app, ["export", hand, "--xyz", str(xyz), "--memory", "lots"])
    assert r.exit_code == 2 and "cannot read size" in r.output
    assert os.path.exists(xyz)
