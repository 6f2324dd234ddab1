"""``benchmarks.real_gsf.survey``: bench_load's real-derived shape, lines of the EX1811 sample's
EM302 ping records side by side. Checked against the sample itself, read by the package's GSF
reader: each line holds the sample's soundings unchanged but for its longitude and time."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pfm_dask import gsf


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    from benchmarks import real_gsf
    from tests.conftest import SAMPLE_FILES, missing_sample

    hits = [p for p in SAMPLE_FILES if p.name == real_gsf.SAMPLE_NAME]
    if not hits:
        missing_sample(real_gsf.SAMPLE_NAME)
    out = real_gsf.survey(3, 2.0, data_dir=tmp_path_factory.mktemp("real-lines"), quiet=True)
    return hits[0], sorted(out.iterdir())


def _read(path):
    with gsf.GsfFile(path) as f:
        return f.read()


def test_lines_are_the_sample_moved_east_and_later(lines):
    from benchmarks import real_gsf

    sample, paths = lines
    assert [p.name for p in paths] == ["line_00.gsf", "line_01.gsf", "line_02.gsf"]
    ref = _read(sample)
    n = ref.num_rows
    for k, p in enumerate(paths):
        t = _read(p)
        assert t.num_rows >= n
        head = t.slice(0, n)     # the first repetition: the sample's pings as they were
        for col in ("depth", "across_track", "along_track", "beam_flags", "latitude"):
            a, b = head.column(col).to_numpy(zero_copy_only=False), ref.column(col).to_numpy(
                zero_copy_only=False)
            np.testing.assert_array_equal(a, b, err_msg=col)
        dlon = head.column("longitude").to_numpy() - ref.column("longitude").to_numpy()
        np.testing.assert_allclose(dlon, k * 0.035, atol=2e-7)
        dt = head.column("time_sec").to_numpy().astype(np.int64) - ref.column(
            "time_sec").to_numpy().astype(np.int64)
        assert (dt == k * real_gsf.LINE_HOURS * 3600).all()


def test_a_survey_is_built_once(lines, tmp_path):
    """A second call finds the lines (no rebuild), as bench_load's runs rely on."""
    from benchmarks import real_gsf

    _, paths = lines
    stamps = [p.stat().st_mtime_ns for p in paths]
    again = real_gsf.survey(3, 2.0, data_dir=paths[0].parent.parent, quiet=True)
    assert sorted(again.iterdir()) == paths
    assert [p.stat().st_mtime_ns for p in paths] == stamps


def test_results_list_the_real_shape(tmp_path):
    from benchmarks.report_md import _others

    (tmp_path / "bench_load_real.json").write_text(json.dumps({"results": {
        "speedup_2_workers": 1.2, "speedup_1_worker": 1.0, "files": 8, "gsf_bytes": 8.0e8}}))
    assert ("- `bench_load_real.json`: bench_load --shape real: 1.20x with 2 workers (1.00x "
            "with 1) on 8 real-derived EM302 lines of 100 MB, no filter") in _others(tmp_path)


def test_the_automatic_area_holds_every_sounding_of_a_long_real_derived_line(tmp_path):
    """A 101 MB line of the EM302 sample's pings (28,800 pings, the pre-scan decoding every
    600th) runs south-east while its repetitions step north, so its swath's corners lie
    between the sampled pings: with the automatic area none of its soundings is outside,
    and every beam lies inside the grid by the NGS geodesic (two per beam)."""
    from benchmarks import real_gsf
    from pfm_dask import pipeline
    from pfm_dask.config import LoadConfig
    from tests.conftest import missing_sample

    if real_gsf.find_sample() is None:
        missing_sample(real_gsf.SAMPLE_NAME)
    line = tmp_path / "line.gsf"
    real_gsf.build(line, mb=100.0)
    res = pipeline.run_load([str(line)], tmp_path / "l.pfm", LoadConfig(bin_size_m=50.0),
                            mode="serial")
    assert res.totals["outside_area"] == 0, res.summary()
    with gsf.GsfFile(line) as f:
        # the first and last repetitions: the south and north ends (each repetition
        # moves north only, so they also hold the east and west extremes)
        c = f.read_columns_at(list(range(50)) + list(range(f.n_pings - 50, f.n_pings)))
    lat, lon = gsf.beam_positions_reference(c["latitude"], c["longitude"], c["heading"],
                                            c["across_track"], c["along_track"])
    g = res.grid
    assert g["min_y"] <= lat.min() and lat.max() <= g["max_y"]
    assert g["min_x"] <= lon.min() and lon.max() <= g["max_x"]
