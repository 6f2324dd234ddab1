"""BAG export read back through GDAL (rasterio's GDAL and Debian's gdal-bin) and hyo2.bag.

References: hand-worked bin statistics of a PFM built sounding by sounding,
and the bin records of a synthetic-survey PFM read through the store; GDAL
and h5py read the BAG independently of the writer. The PFM builders here are
shared with the GeoTIFF and PNG tests.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from pfm_dask import export as EX
from pfm_dask import pfm as P
from pfm_dask.bins import BinGrid
from pfm_dask.cli import app
from pfm_dask.errors import ConfigError
from pfm_dask.pfm import validity as V

NS = {"gmi": "http://www.isotc211.org/2005/gmi", "gmd": "http://www.isotc211.org/2005/gmd",
      "gco": "http://www.isotc211.org/2005/gco", "gml": "http://www.opengis.net/gml/3.2",
      "bag": "http://www.opennavsurf.org/schema/bag"}
NULL = 1.0e6

# ---------------------------------------------------------------------------
# PFM builders (shared with test_export_geotiff.py and test_export_png.py)

#: The hand-built PFM: (col, row) -> list of (depth, validity). 7 x 5 bins of 0.001 degree.
HAND_BINS = {
    (0, 0): [(10.00, 0), (10.50, 0), (11.00, 0)],          # 3 valid: avg 10.5, std 0.5
    (1, 0): [(20.00, 0)],                                   # 1 valid: no spread
    (2, 0): [(30.00, V.MANUALLY_INVAL), (31.00, V.MANUALLY_INVAL)],  # none valid; avg 30.5
    (3, 1): [(40.00, 0), (42.00, 0), (100.00, V.FILTER_INVAL)],       # avg_filtered 41, avg 60.67
    (6, 4): [(5.25, 0), (5.75, 0)],                         # north-east corner
    (0, 4): [(7.00, 0), (7.00, 0)],                         # north-west corner, zero spread
}
HAND_FILES = ["/survey/line_a.gsf", "/survey/line_b & <c>.gsf"]


def hand_expected(surface: str) -> dict:
    """Hand-worked surface, std (NaN below 2 valid) and counts per (col, row) of HAND_BINS."""
    out = {}
    for key, snd in HAND_BINS.items():
        z = np.array([d for d, _ in snd])
        ok = np.array([v & V.INVAL == 0 for _, v in snd])
        val = {"avg_filtered": z[ok].mean() if ok.any() else np.nan,
               "min_filtered": z[ok].min() if ok.any() else np.nan,
               "max_filtered": z[ok].max() if ok.any() else np.nan,
               "avg": z.mean()}[surface]
        std = z[ok].std(ddof=1) if ok.sum() >= 2 else np.nan
        out[key] = (val, std, int(ok.sum()), len(snd))
    return out


def build_hand_pfm(d: Path, name: str = "hand.pfm") -> str:
    """Write the HAND_BINS PFM (two input files, one line)."""
    grid = BinGrid.from_mbr(10.0, 20.0, 10.0049, 20.0069, x_bin_deg=0.001, y_bin_deg=0.001)
    assert (grid.width, grid.height) == (7, 5)
    path = os.fspath(d / name)
    f = P.create(path, grid)
    f.add_files(HAND_FILES)
    f.add_lines(["a-1"])
    rows = []
    for (c, r), snd in HAND_BINS.items():
        for k, (z, v) in enumerate(snd):
            lat = grid.min_y + (r + 0.25 + 0.1 * k) * grid.y_bin
            lon = grid.min_x + (c + 0.3 + 0.1 * k) * grid.x_bin
            rows.append((lat, lon, z, v, k))
    lat, lon, z, v, k = (np.array(x) for x in zip(*rows))
    a = grid.assign(lat, lon)
    assert a.inside.all()
    o = np.argsort(a.bin_index, kind="stable")
    n = o.size
    f.add_sorted(a.bin_index[o], np.zeros(n, np.int64), np.zeros(n, np.int64), np.arange(n),
                 k[o], z[o], a.x_off[o], a.y_off[o], v[o].astype(np.int64),
                 np.full(n, 1.0), np.full(n, 0.5))
    f.write_header(**P.recompute(f))
    f.close()
    return path


def build_big_pfm(d: Path, n: int = 3000) -> tuple[str, dict]:
    """An n x n grid (9 million bins for 3000) with a few soundings; returns (path, {bin: depth})."""
    step = 0.0001
    grid = BinGrid.from_mbr(10.0, 20.0, 10.0 + n * step - 1e-7, 20.0 + n * step - 1e-7,
                            x_bin_deg=step, y_bin_deg=step)
    assert (grid.width, grid.height) == (n, n)
    path = os.fspath(d / "big.pfm")
    f = P.create(path, grid)
    f.add_files(["/big/one.gsf"])
    f.add_lines(["one"])
    cells = [(0, 0), (n - 1, 0), (0, n - 1), (n - 1, n - 1), (n // 2, n // 3), (17, 2 * n // 3)]
    lat = np.array([grid.min_y + (r + 0.5) * step for c, r in cells])
    lon = np.array([grid.min_x + (c + 0.5) * step for c, r in cells])
    z = np.array([100.0 + 7.25 * i for i in range(len(cells))])
    a = grid.assign(lat, lon)
    assert a.inside.all()
    o = np.argsort(a.bin_index, kind="stable")
    m = o.size
    f.add_sorted(a.bin_index[o], np.zeros(m, np.int64), np.zeros(m, np.int64), np.arange(m),
                 np.zeros(m, np.int64), z[o], a.x_off[o], a.y_off[o], np.zeros(m, np.int64),
                 np.full(m, 1.0), np.full(m, 0.5))
    f.write_header(**P.recompute(f))
    f.close()
    return path, {int(b): float(zz) for b, zz in zip(a.bin_index, z)}


def build_survey_pfm(d: Path) -> str:
    """A small synthetic survey loaded serially (2 files, 25 m bins)."""
    from pfm_dask import pipeline, synth
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs

    survey = d / "survey"
    synth.generate(survey, files=2, pings=60, beams=128, seed=11)
    out = d / "survey.pfm"
    res = pipeline.run_load(expand_inputs([str(survey)]), out, LoadConfig(bin_size_m=25.0),
                            mode="serial")
    assert res.exit_code == 0
    return os.fspath(out)


def bins_2d(path: str, field: str) -> np.ndarray:
    """A bin field as a (rows, cols) array, row 0 the southmost (the PFM's own order)."""
    with P.open_pfm(path) as f:
        b = f.read_bin_records(0, f.height)
        return b[field].reshape(f.height, f.width)


def reference_surface(path: str, surface: str) -> tuple[np.ndarray, np.ndarray]:
    """Surface and std from the bin records by the documented null rules (NaN = null)."""
    with P.open_pfm(path) as f:
        b = f.read_bin_records(0, f.height)
        shape = (f.height, f.width)
        null = np.float32(f.null_depth)
    z = b[surface].astype(np.float32)
    has = (z < null) & (b["num_soundings"] > 0)
    if surface != "avg":
        has &= b["num_valid"] > 0
    z = np.where(has, z, np.nan).reshape(shape)
    std = np.where(b["num_valid"] >= 2, b["std"], np.nan).astype(np.float32).reshape(shape)
    return z, std


def grid_of(path: str) -> BinGrid:
    with P.open_pfm(path) as f:
        return f.grid


# ---------------------------------------------------------------------------
# GDAL access: rasterio (GDAL in the wheel) and gdal-bin's command-line tools


def _gdal_cli(tool: str) -> str | None:
    return shutil.which(tool)


def gdal_read_rasterio(path):
    """(driver, (width, height), geotransform, [band arrays north-first], nodata, crs wkt)."""
    rasterio = pytest.importorskip("rasterio", reason="rasterio (GDAL wheel) not installed")
    with rasterio.open(path) as ds:
        t = ds.transform
        return (ds.driver, (ds.width, ds.height), (t.c, t.a, t.b, t.f, t.d, t.e),
                [ds.read(i) for i in range(1, ds.count + 1)], ds.nodatavals, ds.crs.to_wkt())


def gdalinfo_json(path) -> dict:
    exe = _gdal_cli("gdalinfo")
    if exe is None:
        pytest.skip("gdal-bin is not installed (CI installs it in .ci/run)")
    r = subprocess.run([exe, "-json", os.fspath(path)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def gdal_locations(path, band: int, pixels) -> list[float]:
    """Values at (pixel, line) pairs through ``gdallocationinfo -valonly`` (one call)."""
    exe = _gdal_cli("gdallocationinfo")
    if exe is None:
        pytest.skip("gdal-bin is not installed (CI installs it in .ci/run)")
    text = "".join(f"{p} {q}\n" for p, q in pixels)
    r = subprocess.run([exe, "-valonly", "-b", str(band), os.fspath(path)], input=text,
                       capture_output=True, text=True, check=True)
    return [float(x) for x in r.stdout.split()]


# ---------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    d = tmp_path_factory.mktemp("bag_hand")
    return build_hand_pfm(d)


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    return build_survey_pfm(tmp_path_factory.mktemp("bag_survey"))


@pytest.fixture(scope="module")
def survey_bag(survey, tmp_path_factory):
    out = tmp_path_factory.mktemp("bag_out") / "survey.bag"
    summary = EX.write_bag(survey, out, memory=1 << 20)   # small budget: many bands
    assert summary["tiles_read"] > 1
    return out, summary


# ---------------------------------------------------------------------------
# values


@pytest.mark.parametrize("surface", EX.SURFACES)
def test_hand_pfm_bag_values_are_the_hand_worked_statistics(hand, tmp_path, surface):
    out = tmp_path / "h.bag"
    EX.write_bag(hand, out, surface=surface)
    with h5py.File(out, "r") as h:
        elev = h["BAG_root/elevation"][()]
        unc = h["BAG_root/uncertainty"][()]
    assert elev.shape == (5, 7) and elev.dtype == np.float32
    want = hand_expected(surface)
    for r in range(5):
        for c in range(7):
            val, std, nv, ns = want.get((c, r), (np.nan, np.nan, 0, 0))
            if np.isnan(val):
                assert elev[r, c] == NULL and unc[r, c] == NULL, (c, r)
                continue
            assert abs(elev[r, c] - (-val)) <= 0.005 + 1e-6, (c, r, elev[r, c], val)
            if np.isnan(std):
                assert unc[r, c] == NULL, (c, r)
            else:
                assert abs(unc[r, c] - std) <= 0.005, (c, r, unc[r, c], std)


def test_survey_bag_through_rasterio_gdal(survey, survey_bag):
    out, _ = survey_bag
    driver, size, gt, bands, nodata, wkt = gdal_read_rasterio(out)
    g = grid_of(survey)
    assert driver == "BAG"
    assert size == (g.width, g.height)
    want_gt = (g.min_x, g.x_bin, 0.0, g.max_y, 0.0, -g.y_bin)
    assert np.allclose(gt, want_gt, rtol=0, atol=1e-9), (gt, want_gt)
    assert "4326" in wkt or "WGS 84" in wkt
    assert nodata[0] == NULL
    z, std = reference_surface(survey, "avg_filtered")
    elev = bands[0][::-1]            # GDAL rows go north to south
    unc = bands[1][::-1]
    has = ~np.isnan(z)
    assert has.sum() > 100 and (~has).sum() > 100      # both kinds of bins are there
    assert np.array_equal(elev[has], -z[has])
    assert np.all(elev[~has] == NULL)
    s = ~np.isnan(std) & has
    assert np.array_equal(unc[s], std[s])
    assert np.all(unc[~s] == NULL)


def test_survey_bag_through_gdal_bin(survey, survey_bag):
    out, _ = survey_bag
    info = gdalinfo_json(out)
    g = grid_of(survey)
    assert info["driverShortName"] == "BAG"
    assert info["size"] == [g.width, g.height]
    assert np.allclose(info["geoTransform"], [g.min_x, g.x_bin, 0.0, g.max_y, 0.0, -g.y_bin],
                       rtol=0, atol=1e-9)
    assert len(info["bands"]) >= 2 and info["bands"][0]["noDataValue"] == NULL
    # sampled bins: every corner, and random bins with and without a surface
    z, std = reference_surface(survey, "avg_filtered")
    rng = np.random.default_rng(5)
    has = np.argwhere(~np.isnan(z))
    empty = np.argwhere(np.isnan(z))
    pick = np.concatenate([has[rng.choice(len(has), 25, replace=False)],
                           empty[rng.choice(len(empty), 10, replace=False)],
                           [[0, 0], [0, g.width - 1], [g.height - 1, 0], [g.height - 1, g.width - 1]]])
    pixels = [(int(c), g.height - 1 - int(r)) for r, c in pick]
    ev = gdal_locations(out, 1, pixels)
    uv = gdal_locations(out, 2, pixels)
    for (r, c), e, u in zip(pick, ev, uv):
        if np.isnan(z[r, c]):
            assert e == NULL and u == NULL
        else:
            assert e == pytest.approx(-float(z[r, c]), abs=1e-4)
            want_u = NULL if np.isnan(std[r, c]) else float(std[r, c])
            assert u == pytest.approx(want_u, abs=1e-4)


def test_geographic_corners_are_cell_centres(hand, tmp_path):
    out = tmp_path / "h.bag"
    EX.write_bag(hand, out)
    g = grid_of(hand)
    with h5py.File(out, "r") as h:
        root = ET.fromstring(h["BAG_root/metadata"][()].tobytes())
    text = root.find(".//gmd:MD_Georectified/gmd:cornerPoints/gml:Point/gml:coordinates", NS).text
    (llx, lly), (urx, ury) = (tuple(float(v) for v in p.split(",")) for p in text.split())
    assert llx == pytest.approx(20.0005, abs=1e-12) and lly == pytest.approx(10.0005, abs=1e-12)
    assert urx == pytest.approx(20.0065, abs=1e-12) and ury == pytest.approx(10.0045, abs=1e-12)
    assert root.find(".//gmd:MD_Georectified/gmd:pointInPixel/gmd:MD_PixelOrientationCode",
                     NS).text == "center"
    driver, size, gt, _, _, _ = gdal_read_rasterio(out)
    assert size == (7, 5)
    assert np.allclose(gt, (g.min_x, g.x_bin, 0, g.max_y, 0, -g.y_bin), rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------
# structure and metadata


def test_bag_structure(survey, survey_bag):
    out, summary = survey_bag
    with h5py.File(out, "r") as h:
        root = h["BAG_root"]
        assert root.attrs["Bag Version"].decode().startswith("1.6.")
        md = root["metadata"]
        assert md.dtype == np.dtype("S1") and md.ndim == 1 and md.maxshape == (None,)
        for name, label in (("elevation", "Elevation"), ("uncertainty", "Uncertainty")):
            ds = root[name]
            assert ds.dtype == np.dtype("<f4") and ds.chunks is not None
            assert ds.compression == "gzip" and ds.fillvalue == NULL
            a = ds[()]
            real = a[a != NULL]
            assert ds.attrs[f"Minimum {label} Value"] == real.min()
            assert ds.attrs[f"Maximum {label} Value"] == real.max()
            if name == "elevation":
                assert summary["min_elevation"] == real.min()
                assert summary["max_elevation"] == real.max()
                assert summary["bins_with_surface"] == real.size
        tl = root["tracking_list"]
        assert tl.dtype.names == ("row", "col", "depth", "uncertainty", "track_code", "list_series")
        assert [tl.dtype.fields[k][0] for k in tl.dtype.names] == [
            np.dtype("<u4"), np.dtype("<u4"), np.dtype("<f4"), np.dtype("<f4"), np.dtype("u1"),
            np.dtype("<i2")]
        assert tl.shape == (0,) and tl.maxshape == (None,)
        assert tl.attrs["Tracking List Length"] == 0


def test_bag_metadata_content(survey, survey_bag):
    out, _ = survey_bag
    g = grid_of(survey)
    with P.open_pfm(survey) as f:
        files = [x.path for x in f.files() if not x.deleted]
    with h5py.File(out, "r") as h:
        xml = h["BAG_root/metadata"][()].tobytes()
    root = ET.fromstring(xml)
    assert root.tag == "{%s}MI_Metadata" % NS["gmi"]
    dims = root.findall(".//gmd:MD_Georectified/gmd:axisDimensionProperties/gmd:MD_Dimension", NS)
    got = {d.find("gmd:dimensionName/gmd:MD_DimensionNameTypeCode", NS).text:
           (int(d.find("gmd:dimensionSize/gco:Integer", NS).text),
            float(d.find("gmd:resolution/gco:Measure", NS).text)) for d in dims}
    assert got == {"row": (g.height, g.y_bin), "column": (g.width, g.x_bin)}
    codes = [e.text for e in root.findall(
        "gmd:referenceSystemInfo/gmd:MD_ReferenceSystem/gmd:referenceSystemIdentifier/"
        "gmd:RS_Identifier/gmd:code/gco:CharacterString", NS)]
    assert len(codes) == 2 and 'AUTHORITY["EPSG","4326"]' in codes[0] and codes[1].startswith("VERT_CS")
    today = dt.datetime.now(dt.timezone.utc).date()
    stamp = dt.date.fromisoformat(root.find("gmd:dateStamp/gco:Date", NS).text)
    assert abs((stamp - today).days) <= 1
    assert root.find(".//bag:verticalUncertaintyType/bag:BAG_VertUncertCode", NS).text == "rawStdDev"
    sources = [e.text for e in root.findall(
        ".//gmd:LI_Lineage//gmd:LI_Source/gmd:sourceCitation/gmd:CI_Citation/gmd:title/"
        "gco:CharacterString", NS)]
    assert sources == files and len(files) == 2
    bbox = root.find(".//gmd:EX_GeographicBoundingBox", NS)
    vals = {k: float(bbox.find(f"gmd:{k}/gco:Decimal", NS).text) for k in (
        "westBoundLongitude", "eastBoundLongitude", "southBoundLatitude", "northBoundLatitude")}
    assert vals == {"westBoundLongitude": g.min_x, "eastBoundLongitude": g.max_x,
                    "southBoundLatitude": g.min_y, "northBoundLatitude": g.max_y}


def test_metadata_escapes_file_names(hand, tmp_path):
    out = tmp_path / "h.bag"
    EX.write_bag(hand, out)
    with h5py.File(out, "r") as h:
        root = ET.fromstring(h["BAG_root/metadata"][()].tobytes())
    titles = [e.text for e in root.findall(".//gmd:LI_Source//gmd:title/gco:CharacterString", NS)]
    assert titles == HAND_FILES


# ---------------------------------------------------------------------------
# hyo2.bag's validation (its XSD + schematron of the BAG metadata profile)


def _hyo2_bagfile(monkeypatch):
    """hyo2.bag's BAGFile, importable without GDAL's Python bindings.

    hyo2.bag imports ``osgeo`` and ``hyo2.abc2`` at module level but the checks
    used here never call them, so stand-ins are put in ``sys.modules`` for the
    import (and removed afterwards by monkeypatch). Skips when hyo2.bag or
    lxml is not installed.
    """
    pytest.importorskip("lxml", reason="lxml not installed (hyo2.bag validation)")
    try:
        from hyo2.bag.bag import BAGFile  # noqa: F401  (a full install)
        return BAGFile
    except ImportError:
        pass
    import importlib.util

    try:
        spec = importlib.util.find_spec("hyo2.bag")
    except ImportError:
        spec = None
    if spec is None:
        pytest.skip("hyo2.bag is not installed")
    for name in ("osgeo", "osgeo.osr", "osgeo.gdal", "osgeo.ogr", "hyo2.abc2", "hyo2.abc2.lib",
                 "hyo2.abc2.lib.gdal_aux"):
        if name not in sys.modules:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    if not hasattr(sys.modules["hyo2.abc2.lib.gdal_aux"], "GdalAux"):
        sys.modules["hyo2.abc2.lib.gdal_aux"].GdalAux = type("GdalAux", (), {})
    from hyo2.bag.bag import BAGFile

    return BAGFile


def test_hyo2_bag_validation(survey_bag, hand, tmp_path, monkeypatch):
    BAGFile = _hyo2_bagfile(monkeypatch)
    hand_bag = tmp_path / "h.bag"
    EX.write_bag(hand, hand_bag)
    for path in (survey_bag[0], hand_bag):
        b = BAGFile(os.fspath(path))
        try:
            assert b.has_bag_root() and b.has_bag_version() and b.has_metadata()
            assert b.has_elevation() and b.has_uncertainty() and b.has_tracking_list()
            assert b.has_valid_row_in_tracking_list() and b.has_valid_col_in_tracking_list()
            xml = b["BAG_root/metadata"][()].tobytes()   # its metadata() uses ndarray.tostring
            assert b.validate_metadata(xml_string=xml), [str(e) for e in b.meta_errors]
            # the validator is live: a profile rule broken on purpose is caught
            broken = xml.replace(b"rawStdDev</bag:BAG_VertUncertCode>", b"x</bag:BAG_VertUncertCode>")
            broken = broken.replace(b"<gmd:topicCategory><gmd:MD_TopicCategoryCode>elevation",
                                    b"<gmd:topicCategory><gmd:MD_TopicCategoryCode>oceans")
            assert not b.validate_metadata(xml_string=broken)
            lo, hi = b.elevation_min_max()
            assert lo <= hi < 0
        finally:
            b.close()


# ---------------------------------------------------------------------------
# memory bound, options, command line


def test_band_plan():
    assert EX.plan_tiles(10, 7, 10 * 512 * 3) == [(0, 3, 0, 10), (3, 6, 0, 10), (6, 7, 0, 10)]
    # rounded to whole chunks when several fit
    assert EX.plan_tiles(10, 250, 10 * 512 * 130, row_multiple=100)[0] == (0, 100, 0, 10)
    # north first, aligned on the north edge
    assert EX.plan_tiles(10, 7, 10 * 512 * 3, from_north=True) == [
        (4, 7, 0, 10), (1, 4, 0, 10), (0, 1, 0, 10)]
    # a row over budget is cut into pieces of columns, in raster order
    t = EX.plan_tiles(1000, 2, 512 * 300)
    assert t[:4] == [(0, 1, 0, 300), (0, 1, 300, 600), (0, 1, 600, 900), (0, 1, 900, 1000)]
    assert len(t) == 8
    with pytest.raises(ConfigError):
        EX.plan_tiles(10, 10, 0)


def test_column_pieces_give_the_same_bag(survey, tmp_path):
    a, b = tmp_path / "a.bag", tmp_path / "b.bag"
    EX.write_bag(survey, a)
    with P.open_pfm(survey) as f:
        w = f.width
    EX.write_bag(survey, b, memory=512 * (w // 3))        # a row does not fit: column pieces
    with h5py.File(a, "r") as ha, h5py.File(b, "r") as hb:
        for k in ("elevation", "uncertainty"):
            assert np.array_equal(ha["BAG_root"][k][()], hb["BAG_root"][k][()])


_MEMORY_PROBE = r"""
import json, resource, sys, tracemalloc
import numpy as np
from pfm_dask import export as EX
kind, pfm, out, budget, small = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
fn = {"bag": EX.write_bag, "geotiff": EX.write_geotiff, "xyz": EX.write_xyz,
      "png": EX.write_png}[kind]
fn(small, out + ".warm", memory=budget)               # imports, on a tiny PFM
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
tracemalloc.start()
res = fn(pfm, out, memory=budget)
peak_py = tracemalloc.get_traced_memory()[1]
tracemalloc.stop()
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"rss_growth": peak - base, "traced_peak": peak_py, "result": res}))
"""


def run_memory_probe(kind: str, pfm_path: str, out: Path, budget: int, small: str) -> dict:
    """Export in a fresh process: growth of its peak RSS over the peak after a warm-up
    export of the tiny PFM ``small``, and tracemalloc's peak (numpy and Python objects)."""
    r = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, kind, pfm_path, os.fspath(out),
                        str(budget), small], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def shared_big(tmp_path_factory) -> tuple[str, dict]:
    """The 3000 x 3000 PFM of :func:`build_big_pfm`, built once per test session."""
    d = tmp_path_factory.getbasetemp() / "export_big"
    done = d / "cells.json"
    if not done.exists():
        d.mkdir(exist_ok=True)
        path, cells = build_big_pfm(d)
        done.write_text(json.dumps({"path": path, "cells": cells}))
    got = json.loads(done.read_text())
    return got["path"], {int(k): v for k, v in got["cells"].items()}


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    return shared_big(tmp_path_factory)


def test_bag_of_a_9_million_bin_grid_stays_within_budget(big, hand, tmp_path):
    path, cells = big
    budget = 8 << 20
    # one float32 layer of this grid is 36 MB; reading all its bin records at once ~3.7 GB
    m = run_memory_probe("bag", path, tmp_path / "big.bag", budget, hand)
    assert m["traced_peak"] < 2 * budget, m
    # RSS adds a fixed ~15 MiB (HDF5 chunk caches, deflate buffers), not a share of the grid
    assert m["rss_growth"] < 2 * budget + (24 << 20), m
    assert m["result"]["tiles_read"] > 100
    with h5py.File(tmp_path / "big.bag", "r") as h:
        e = h["BAG_root/elevation"]
        assert e.shape == (3000, 3000)
        for b, z in cells.items():
            r, c = divmod(b, 3000)
            assert e[r, c] == pytest.approx(-z, abs=0.005)
        assert np.all(e[1500:1510, :] == NULL)
        assert e.attrs["Minimum Elevation Value"] == pytest.approx(-max(cells.values()), abs=0.005)


def test_unknown_surface_is_refused(hand, tmp_path):
    with pytest.raises(ConfigError, match="avg_filtered"):
        EX.write_bag(hand, tmp_path / "x.bag", surface="median")
    assert not (tmp_path / "x.bag").exists()


def test_cli_export_bag(hand, tmp_path):
    out = tmp_path / "c.bag"
    r = CliRunner().invoke(app, ["export", hand, "--bag", str(out), "--surface", "min_filtered",
                                 "--json"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.output)
    assert res[0]["path"] == str(out) and res[0]["surface"] == "min_filtered"
    with h5py.File(out, "r") as h:
        assert h["BAG_root/elevation"][0, 0] == pytest.approx(-10.0, abs=1e-6)
    r = CliRunner().invoke(app, ["export", hand])
    assert r.exit_code == 2
    r = CliRunner().invoke(app, ["export", hand, "--bag", str(out), "--surface", "nope"])
    assert r.exit_code == 2 and "unknown surface" in r.output
