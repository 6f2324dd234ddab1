"""``check`` on files edited by ABE (issue 20): pfmEdit3D never rewrites the header's summary
extrema and the PFM library's append updates them only from the bins it touched, so such a
summary no longer matches the bins. A stale but well-formed summary is a warning (exit 0), an
error only with ``--strict``; a summary that could never have been right stays an error.

References: the bins' own values read back with ``dump`` and the chosen bins' counts made by
adding soundings by hand; the header edited through ``write_header`` as those tools leave it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pfm_dask import pfm as P
from pfm_dask.cli import app
from pfm_dask.pfm import recompute

from .pfm.test_recompute import build_pfm


def _check(path, *extra):
    return CliRunner().invoke(app, ["check", os.fspath(path), *extra])


def _bins(path, tmp_path):
    P.dump(path, bins=tmp_path / "b.parquet")
    t = pq.read_table(tmp_path / "b.parquet")
    return {k: t.column(k).to_numpy() for k in t.column_names}


@pytest.fixture
def tied(tmp_path):
    """A recomputed PFM whose maximum bin count is reached by two bins (the heavy bin, then a
    later one filled by hand to the same count); the header names the first, as pfmLoader."""
    path, grid, _ = build_pfm(tmp_path, seed=11, batches=1, heavy=25, do_recompute=False)
    with P.open_pfm(path, "r+") as f:
        cnt = f.read_bin_records(0, f.height)["num_soundings"]
        heavy = int(np.argmax(cnt))
        later = heavy + 2 * f.width            # two rows north: later in raster order
        need = int(cnt[heavy] - cnt[later])
        assert need > 0
        col, row = later % f.width, later // f.width
        lat = grid.min_y + (row + np.linspace(0.2, 0.8, need)) * grid.y_bin
        lon = grid.min_x + (col + np.linspace(0.2, 0.8, need)) * grid.x_bin
        a = grid.assign(lat, lon)
        assert (a.bin_index == later).all()
        k = np.arange(need)
        f.add_sorted(a.bin_index, k % 3, k % 4, 6000 + k, 1 + k, np.full(need, 118.0),
                     a.x_off, a.y_off, np.zeros(need, dtype=np.int64), np.full(need, 1.0),
                     np.full(need, 0.5))
        f.write_header(**recompute(f))
        h = f.header
        assert tuple(h.max_count_coord) == (heavy % f.width, heavy // f.width)
    return path, (col, row)


def test_a_sound_file_has_no_warning(tied):
    path, _ = tied
    r = _check(path)
    assert r.exit_code == 0 and "warning" not in r.output, r.output


def test_a_max_bin_count_tying_at_an_earlier_bin_is_a_warning_unless_strict(tied, tmp_path):
    path, later = tied
    b = _bins(path, tmp_path)
    top = b["num_soundings"].max()
    at = sorted(zip(b["bin_y"][b["num_soundings"] == top], b["bin_x"][b["num_soundings"] == top]))
    assert len(at) == 2 and at[1] == (later[1], later[0])        # a tie, later in raster order
    with P.open_pfm(path, "r+") as f:   # as the library's append leaves it
        f.write_header(max_count_coord=later)
    r = _check(path)
    assert r.exit_code == 0, r.output
    assert "sound (1 warning(s))" in r.output and "warning: header summary" in r.output
    assert "[MAXIMUM BIN COUNT] is at" in r.output
    assert _check(path, "--strict").exit_code == 1
    j = json.loads(_check(path, "--json").output)
    assert j["sound"] is True and j["problems"] == [] and len(j["warnings"]) == 1


def test_stale_filtered_depth_extremes_are_a_warning_unless_strict(tied, tmp_path):
    path, _ = tied
    b = _bins(path, tmp_path)
    true_max = float(b["max_filtered"][(b["validity"] & P.validity.DATA) != 0].max())
    with P.open_pfm(path, "r+") as f:   # pfmEdit3D invalidated the deepest: header not rewritten
        f.write_header(max_filtered_depth=round(true_max + 0.5, 2))
    r = _check(path)
    assert r.exit_code == 0, r.output
    assert f"[MAX FILTERED DEPTH] = {round(true_max + 0.5, 2):g} but the bins give" in r.output
    s = _check(path, "--strict")
    assert s.exit_code == 1 and "[MAX FILTERED DEPTH]" in s.output


@pytest.mark.parametrize("bad", [{"max_filtered_depth": 1.0e7},            # past NULL DEPTH
                                 {"min_depth": 130.0, "max_depth": 110.0},  # min above max
                                 {"max_count_coord": (10_000, 0)}])         # off the grid
def test_a_summary_that_could_never_be_right_is_an_error(tied, bad):
    path, _ = tied
    with P.open_pfm(path, "r+") as f:
        f.write_header(**bad)
    r = _check(path)
    assert r.exit_code == 1 and "header:" in r.output, r.output
