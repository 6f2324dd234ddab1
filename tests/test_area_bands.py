"""The writer's area filter in bands on several threads gives the plain pass's bytes.

Each band of rows starts a few rows early from a guess (the pre-filter statistics of the row
above) and is kept only when the guess reaches, bit for bit, the state the band before left;
otherwise it is filtered again from that state (docs/filters.md, "Bands"). The reference here
is the filter run over the rows in order, each read on its own from the unfiltered PFM: the
redo file (every cut sounding's record, slot and new validity, in row order) and the summary
must be the same bytes for every thread count, band size and halo, on a synthetic survey and
on each real GSF sample, deep-only and two-sided.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pfm_dask import _writer_area as A
from pfm_dask import pfm, pipeline
from pfm_dask.config import LoadConfig
from pfm_dask.filters import AreaFilter, RowSoundings


def _reference(f, touched, cfg) -> tuple[bytes, dict]:
    """The plain pass: rows 0 .. H-1 in order, each read alone; redo records in row order."""
    g = f.grid
    t = touched.reshape(g.height, g.width)
    rt = t.any(axis=1)
    needed = rt.copy()
    needed[1:] |= rt[:-1]
    needed[:-1] |= rt[1:]
    filt = AreaFilter(g.width, g.height, bin_size_xy=g.bin_size_xy, cellstd=cfg.cellstd,
                      deep_only=cfg.deep_only, null_depth=cfg.null_depth)
    out = []

    def read_row(y):
        if not needed[y]:
            return None
        s = f.read_soundings(y, y + 1)
        return RowSoundings(col=s["col"], depth=s["depth"], validity=s["validity"].astype(np.uint32),
                            address=np.stack([s["record_offset"], s["slot"]], axis=1),
                            active=t[y])

    def write_row(y, r):
        if r.index.size:
            rec = np.empty((r.index.size, 3), dtype="<i8")
            rec[:, :2] = r.address
            rec[:, 2] = r.validity
            out.append(rec.tobytes())

    summary = filt.run(read_row, write_row).as_dict()
    return b"".join(out), summary


def _touched(f) -> np.ndarray:
    t = np.zeros(f.width * f.height, dtype=bool)
    for recs in f.bin_records_with_data(fields=("num_soundings",)):
        t[recs["bin_index"]] = recs["num_soundings"] > 0
    return t


#: (threads, soundings per band, halo rows): one band, and many of a few rows each
SETTINGS = [(1, 2_000_000, 2), (2, 2_000_000, 2), (2, 150, 0), (3, 150, 1), (2, 1500, 2),
            (3, 1500, 0)]


def _compare(pfm_path: Path, tmp_path: Path, cfg: LoadConfig, monkeypatch,
             settings=SETTINGS) -> int:
    """run_area_filter against the plain pass for every setting; returns the bands redone."""
    redone = []
    orig = A._filter_band

    def counting(f, filt, touched, needed, y0, y1, halo, above, view=None):
        out = orig(f, filt, touched, needed, y0, y1, halo, above, view)
        if halo is None and threads_now[0] > 1:
            redone.append((y0, y1))
        return out

    threads_now = [1]
    monkeypatch.setattr(A, "_filter_band", counting)
    with pfm.open_pfm(pfm_path) as f:
        touched = _touched(f)
        want, want_summary = _reference(f, touched, cfg)
        for threads, band, halo in settings:
            monkeypatch.setattr(A, "AREA_BAND_SOUNDINGS", band)
            monkeypatch.setattr(A, "AREA_HALO_ROWS", halo)
            threads_now[0] = threads
            redo = tmp_path / f"redo-{threads}-{band}-{halo}"
            summary, rec = A.run_area_filter(f, touched, cfg, redo, threads)
            got = redo.read_bytes()
            assert got == want, (threads, band, halo)
            assert {k: summary[k] for k in want_summary} == want_summary, (threads, band, halo)
            assert rec["count"] == summary["cut"] == len(want) // 24
    return len(redone)


@pytest.fixture(scope="module")
def synth_survey(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("bands")
    synth.generate(out, files=3, pings=120, beams=96, seed=7, spike_rate=5e-3)
    return sorted(out.glob("*.gsf"))


@pytest.mark.parametrize("deep_only", [True, False], ids=["deep", "two-sided"])
def test_bands_on_threads_give_the_plain_pass_on_synth(synth_survey, tmp_path, deep_only,
                                                       monkeypatch):
    cfg = LoadConfig(bin_size_m=25.0, cellstd=1.2, deep_only=deep_only)
    out = tmp_path / "s.pfm"
    assert pipeline.run_load(synth_survey, out, LoadConfig(bin_size_m=25.0),
                             mode="serial").exit_code == 0
    redone = _compare(out, tmp_path, cfg, monkeypatch)
    # with no halo the guess is the row above's pre-filter statistics: it misses where that
    # row had cuts, and those bands are redone (the path is exercised, and still exact)
    assert redone > 0


def test_bands_on_threads_give_the_plain_pass_on_real_samples(gsf_sample, tmp_path, monkeypatch):
    if "TN136" in gsf_sample.name:
        pytest.skip("the header-only sample has no soundings")
    size = 20.0 if "6_184" in gsf_sample.name else 2.0
    out = tmp_path / "r.pfm"
    assert pipeline.run_load([gsf_sample], out, LoadConfig(bin_size_m=size),
                             mode="serial").exit_code == 0
    for deep_only in (True, False):
        _compare(out, tmp_path, LoadConfig(bin_size_m=size, cellstd=1.2, deep_only=deep_only),
                 monkeypatch, [(2, 2_000_000, 2), (2, 4000, 0), (3, 20_000, 1)])


def test_band_from_the_true_state_equals_the_rows_in_order():
    """AreaFilter.band from the state iter_rows reaches gives iter_rows' rows and summary."""
    rng = np.random.default_rng(3)
    W, H = 40, 30
    rows = []
    for y in range(H):
        n = int(rng.integers(0, 400))
        col = rng.integers(0, W, n)
        z = 100 + 0.5 * col + rng.normal(0, 0.3, n) + np.where(rng.random(n) < 0.02, 8.0, 0.0)
        rows.append(RowSoundings(col=col, depth=z, validity=np.zeros(n, np.uint32)))
    f1 = AreaFilter(W, H, bin_size_xy=10.0, cellstd=1.5)
    whole = list(f1.iter_rows(lambda y: rows[y]))
    f2 = AreaFilter(W, H, bin_size_xy=10.0, cellstd=1.5)
    a = f2.band(lambda y: rows[y], 0, 13)
    b = f2.band(lambda y: rows[y], 13, H, a["post"])
    # from a guess 3 rows early, the boundary state is the true one here, and so are the rows
    c = f2.band(lambda y: rows[y], 10, H, f2.pre_stats(rows[9], 9), keep_from=13)
    assert c["boundary"].same(a["post"])
    for part in (b, c):
        got = a["results"] + part["results"]
        assert [r.row for r in got] == list(range(H))
        for r, e in zip(got, whole):
            np.testing.assert_array_equal(r.index, e.index)
            np.testing.assert_array_equal(r.validity, e.validity)
            assert (r.examined, r.good, r.bad) == (e.examined, e.good, e.bad)
    total = a["summary"]
    total.add(b["summary"])
    assert json.dumps(total.as_dict()) == json.dumps(f1.summary.as_dict())
    assert sum(len(r.index) for r in whole) > 0


def test_compiled_row_reader_gives_the_store_readers_soundings(synth_survey, tmp_path):
    """_read_rows' one compiled pass (band_soundings) against PfmFile.read_soundings."""
    from pfm_dask.pfm._recompute_kernel import NdxView

    out = tmp_path / "s.pfm"
    assert pipeline.run_load(synth_survey, out, LoadConfig(bin_size_m=25.0),
                             mode="serial").exit_code == 0
    with pfm.open_pfm(out) as f:
        view = NdxView(f)
        assert view.ok
        try:
            for r0, r1 in [(0, f.height), (3, 9), (f.height // 2, f.height // 2 + 1)]:
                got = A._read_rows(f, view, r0, r1)
                want = A._read_rows(f, None, r0, r1)
                assert got["cut"][-1] > 0
                for k in ("cut", "col", "depth", "validity", "record_offset", "slot"):
                    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
                assert got["depth"].dtype == want["depth"].dtype
                # each row's pre-filter statistics summed by the same pass: the filter's
                # own (_k_row_stats on the row's soundings), bit for bit
                filt = AreaFilter(f.width, f.height, bin_size_xy=f.grid.bin_size_xy)
                assert A._row_pre(want, 0, f.width) is None
                for i in range(r1 - r0):
                    sl = slice(got["cut"][i], got["cut"][i + 1])
                    row = RowSoundings(want["col"][sl], want["depth"][sl],
                                       want["validity"][sl].astype(np.uint32))
                    mine = A._row_pre(got, i, f.width)
                    assert filt.pre_stats(row, r0 + i).same(filt.pre_stats(
                        RowSoundings(row.col, row.depth, row.validity, pre=mine), r0 + i))
        finally:
            view.close()


def test_row_counts_equal_the_bin_records_counts(synth_survey, tmp_path):
    """The band planner's compiled count pass (_row_counts) against the soundings per row
    summed from the bin records the store reader decodes, over whole and partial blocks."""
    out = tmp_path / "s.pfm"
    assert pipeline.run_load(synth_survey, out, LoadConfig(bin_size_m=25.0),
                             mode="serial").exit_code == 0
    with pfm.open_pfm(out) as f:
        per_bin = np.zeros(f.width * f.height, np.int64)
        for recs in f.bin_records_with_data(fields=("num_soundings",)):
            per_bin[recs["bin_index"]] = recs["num_soundings"]
        want = per_bin.reshape(f.height, f.width).sum(axis=1)
        assert want.sum() > 0
        for r0, r1 in [(0, f.height), (2, 7), (f.height - 1, f.height)]:
            np.testing.assert_array_equal(A._row_counts(f, r0, r1), want[r0:r1])
