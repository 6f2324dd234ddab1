"""The task's compiled path (``soundings.prepare_piece``) against the numpy path it replaced
(``tests/prepare_reference.py``): the same soundings, bytes, pings and counts, column for
column, on synthetic chunks full of edge cases, on GSF files cut into pieces, and on the real
samples."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from pfm_dask import gsf, pipeline, soundings
from pfm_dask.config import LoadConfig, SwathFilterConfig
from pfm_dask.gsf import SOUNDING_SCHEMA
from pfm_dask.pfm._grid import BinGrid
from pfm_dask.pieces import empty_counts

from . import prepare_reference as ref

_FLAGS = np.array([0, 0, 0, 0x01, 0x05, 0x09, 0x0D, 0x10, 0x21, 0x41, 0x81, 0x06, 0x07, 0x22,
                   0x42, 0x82, 0xFF, 0x02], dtype=np.uint8)


def _chunk(seed: int, n_pings: int = 60, first_ping: int = 11):
    """Decoded columns as :meth:`GsfFile.read_columns` gives them, with every edge case the
    screening knows: one-beam pings, null and edited beams, pings without beam flags (or
    along-track distances, errors, nominal depths, depths), ignored pings, null and NaN
    positions, zero depths and depths that are zero as a float only, depths outside the limits;
    and the same as an Arrow table (the reference's input)."""
    rng = np.random.default_rng(seed)
    beams = rng.choice([1, 1, 2, 5, 16, 33], size=n_pings)
    n = int(beams.sum())
    per = lambda v: np.repeat(v, beams)  # noqa: E731 - one ping value to its beams
    cols = {
        "ping": per(np.arange(first_ping, first_ping + n_pings, dtype=np.uint32)),
        "beam": np.concatenate([np.arange(1, b + 1) for b in beams]).astype(np.uint16),
        "time_sec": per(1_600_000_000 + np.arange(n_pings, dtype=np.int64)),
        "time_nsec": per(rng.integers(0, 10**9, n_pings).astype(np.int32)),
        "heading": per(rng.uniform(0, 360, n_pings)),
    }
    cols["time"] = cols["time_sec"] + cols["time_nsec"] * 1e-9
    lat = rng.uniform(36.0, 36.02, n_pings)
    lon = rng.uniform(-123.02, -123.0, n_pings)
    bad = rng.choice(n_pings, 6, replace=False)
    lat[bad[0]], lon[bad[1]] = 91.0, 181.0
    lat[bad[2]], lon[bad[3]] = np.nan, np.inf
    lat[bad[4]] = 89.99999      # far outside the grid, still a usable ping
    cols["latitude"], cols["longitude"] = per(lat), per(lon)
    pflags = rng.choice(np.array([0, 0, 0, 1, 2, 3, 0x100], dtype=np.uint16), n_pings)
    cols["ping_flags"] = per(pflags)
    depth = rng.uniform(-20, 300, n)
    depth[rng.random(n) < 0.05] = 0.0
    depth[rng.random(n) < 0.03] = 1e-50           # 0 as a C float
    depth[rng.random(n) < 0.02] = np.float32(10.0)  # on a limit
    cols["depth"] = depth
    cols["nominal_depth"] = depth * 1.01
    cols["across_track"] = rng.uniform(-4000, 4000, n)
    cols["along_track"] = rng.uniform(-60, 60, n)
    cols["beam_flags"] = rng.choice(_FLAGS, n)
    cols["horizontal_error"] = rng.uniform(0, 5, n)
    cols["vertical_error"] = rng.uniform(0, 1, n)
    valid = {}
    for name, share in (("depth", 0.05), ("nominal_depth", 0.3), ("across_track", 0.05),
                        ("along_track", 0.3), ("beam_flags", 0.15), ("horizontal_error", 0.3),
                        ("vertical_error", 0.3)):
        lacks = per(rng.random(n_pings) < share)    # whole pings lack an array
        valid[name] = ~lacks
        cols[name] = np.where(lacks, np.nan if name != "beam_flags" else 0,
                              cols[name]).astype(cols[name].dtype)
    cols["_valid"] = valid
    arrays = []
    for f in SOUNDING_SCHEMA:
        v = cols[f.name]
        mask = ~valid[f.name] if f.name in valid else None
        arrays.append(pa.array(v.astype(f.type.to_pandas_dtype()), type=f.type, mask=mask))
    table = pa.Table.from_arrays(arrays, schema=SOUNDING_SCHEMA)
    cols = {k: (np.ascontiguousarray(v.astype(SOUNDING_SCHEMA.field(k).type.to_pandas_dtype()))
                if k != "_valid" else v) for k, v in cols.items()}
    first = np.concatenate([[0], np.cumsum(beams)[:-1]])   # ping-header columns: once per ping
    for name in ("time", "time_sec", "time_nsec", "latitude", "longitude", "heading",
                 "ping_flags"):
        cols[name] = np.ascontiguousarray(cols[name][first])
    cols["n_beams"] = beams.astype(np.int64)
    return cols, table


_GRIDS = {
    "mbr": lambda: BinGrid.from_mbr(36.0, -123.015, 36.015, -122.99, bin_size_m=25.0),
    "polygon": lambda: BinGrid.from_polygon(
        np.array([[36.0, -123.03], [36.03, -123.0], [36.0, -122.97], [35.99, -123.0]]),
        bin_size_m=10.0),
}
_CONFIGS = {
    "plain": LoadConfig(bin_size_m=25.0),
    "limits": LoadConfig(bin_size_m=25.0, min_depth=10.0, max_depth=200.0),
    "nominal": LoadConfig(bin_size_m=25.0, use_nominal_depth=True, max_depth=150.0),
    "errors": LoadConfig(bin_size_m=25.0, default_horizontal_error=2.5,
                         default_vertical_error=0.75),
    "swath": LoadConfig(bin_size_m=25.0, min_depth=10.0,
                        swath=SwathFilterConfig(enabled=True, window_pings=3, window_beams=3)),
}


def _assert_chunk_equal(got: dict, want: dict):
    for part in ("soundings", "pings"):
        assert list(got[part]) == list(want[part])
        for name, w in want[part].items():
            g = np.asarray(got[part][name])
            w = np.asarray(w)
            assert g.dtype == w.dtype, (part, name)
            assert g.tobytes() == w.tobytes(), (part, name)


@pytest.mark.parametrize("config", list(_CONFIGS))
@pytest.mark.parametrize("grid_kind", list(_GRIDS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunk_equals_numpy_path(seed, grid_kind, config):
    cols, table = _chunk(seed)
    grid, cfg = _GRIDS[grid_kind](), _CONFIGS[config]
    ping = cols["ping"]
    for start, stop in ((0, 10**9), (int(ping[0]) + 2, int(ping[-1]) - 3)):  # halo pings
        c_got, c_want = empty_counts(), empty_counts()
        got = soundings._place_chunk(cols, start, stop, grid, cfg, c_got)
        want = ref._place_chunk(table, start, stop, grid, cfg, c_want)
        _assert_chunk_equal(got, want)
        assert c_got == c_want
        b = want["soundings"]["bin_index"]   # the box of rows and columns of the bins
        rows, cols_ = b // grid.width, b % grid.width
        assert got["box"].tolist() == [rows.min(), rows.max(), cols_.min(), cols_.max()]
        assert c_want["loaded"] and c_want["outside_area"] and c_want["ping_skipped"]
        assert c_want["beam_rejected"] and c_want["invalid_by_gsf_flags"]
        assert c_want["depth_out_of_range"] or config in ("plain", "errors")


def test_empty_chunk():
    cols, table = _chunk(3)
    sl = slice(0, 0)
    cols0 = {k: (v[sl] if k != "_valid" else {n: m[sl] for n, m in v.items()})
             for k, v in cols.items()}
    grid, cfg = _GRIDS["mbr"](), _CONFIGS["swath"]
    c_got, c_want = empty_counts(), empty_counts()
    _assert_chunk_equal(soundings._place_chunk(cols0, 0, 10, grid, cfg, c_got),
                        ref._place_chunk(table.slice(0, 0), 0, 10, grid, cfg, c_want))
    assert c_got == c_want


@pytest.mark.parametrize("span", [100, 70_000, 3_000_000_000])
def test_bin_order_is_lexsort(span):
    rng = np.random.default_rng(span)
    n = 5000
    bins = rng.integers(7, 7 + span, n).astype(np.int64)
    bins[rng.random(n) < 0.3] = bins[0]            # ties keep their (ping, beam) order
    ping = np.sort(rng.integers(1, 400, n)).astype(np.uint32)
    beam = rng.integers(1, 50, n).astype(np.uint16)
    order = np.lexsort((beam, ping))
    ping, beam = ping[order], beam[order]           # (ping, beam) order, as decoded
    want = np.lexsort((beam, ping, bins))
    np.testing.assert_array_equal(soundings._bin_order(bins, ping, beam), want)
    # out of order: still lexsort's order
    rev = slice(None, None, -1)
    b2, p2, m2 = bins[rev].copy(), ping[rev].copy(), beam[rev].copy()
    np.testing.assert_array_equal(soundings._bin_order(b2, p2, m2), np.lexsort((m2, p2, b2)))


def _assert_piece_equal(a, b):
    assert a.batch.schema == b.batch.schema and a.batch.num_rows == b.batch.num_rows
    for name in a.batch.schema.names:
        assert (a.batch.column(name).to_numpy().tobytes()
                == b.batch.column(name).to_numpy().tobytes()), name
    assert a.pings.equals(b.pings)
    assert a.counts == b.counts and a.damage == b.damage


def _pieces_equal(files, cfg):
    scans = [pipeline.prescan_file(str(f)) for f in files]
    if not any(s.get("extent") for s in scans):
        pytest.skip("no readable position")
    grid = pipeline.area_from_scans(scans, cfg)
    pieces = pipeline.plan_pieces(scans, cfg)
    for p in pieces:
        _assert_piece_equal(soundings.prepare_piece(p, grid, cfg),
                            ref.prepare_piece_reference(p, grid, cfg))
    return pieces


def _edge_case_file(path):
    """A GSF file of pings with and without the optional arrays, one-beam pings, ignored pings,
    null beams and depths outside the limits."""
    rng = np.random.default_rng(5)
    with gsf.GsfWriter(path) as w:
        for k, optional in enumerate((True, False, True)):
            P, B = 40, 24
            depth = rng.uniform(20, 120, (P, B))
            depth[:, 3] = 500.0
            flags = rng.choice(_FLAGS, (P, B))
            kw = dict(time_sec=1_600_000_000 + 100 * k + np.arange(P), time_nsec=0,
                      latitude=36.0 + 0.001 * np.arange(P), longitude=-123.0 + 0.0001 * k,
                      heading=rng.uniform(0, 360, P), depth=depth,
                      across_track=np.linspace(-300, 300, B)[None, :].repeat(P, 0),
                      along_track=rng.uniform(-5, 5, (P, B)), beam_flags=flags,
                      ping_flags=rng.choice(np.array([0, 0, 0, 1], dtype=np.uint16), P),
                      number_beams=rng.choice([1, 1, B, B, B, 7], P))
            if optional:
                kw.update(horizontal_error=rng.uniform(0, 3, (P, B)),
                          vertical_error=rng.uniform(0, 1, (P, B)), nominal_depth=depth * 0.99)
            else:
                kw["along_track"] = None
            w.write_pings(**kw)


@pytest.mark.parametrize("swath", [False, True], ids=["plain", "swath-filter"])
def test_gsf_pieces_equal_numpy_path(tmp_path, swath):
    from pfm_dask import synth

    synth.generate(tmp_path, files=2, pings=150, beams=64, seed=4)
    _edge_case_file(tmp_path / "edge.gsf")
    files = sorted(tmp_path.glob("*.gsf"))
    cfg = LoadConfig(bin_size_m=20.0, split_pings=37, max_depth=400.0,
                     swath=SwathFilterConfig(enabled=swath))
    assert len(_pieces_equal(files, cfg)) > len(files)     # pieces start inside files
    _pieces_equal(files, LoadConfig(bin_size_m=5.0, use_nominal_depth=True, min_depth=30.0,
                                    swath=SwathFilterConfig(enabled=swath)))


@pytest.mark.parametrize("swath", [False, True], ids=["plain", "swath-filter"])
def test_real_sample_equals_numpy_path(gsf_sample, swath):
    cfg = LoadConfig(bin_size_m=10.0, split_pings=41, swath=SwathFilterConfig(enabled=swath))
    _pieces_equal([gsf_sample], cfg)


def test_counting_sort_and_stable_sort_both_equal_numpy_path(tmp_path, monkeypatch):
    """A piece is sorted by counting when its bins fit a small box of the grid, else by numpy's
    stable sort: both give the numpy path's bytes (each path checked to have run)."""
    from pfm_dask import synth

    synth.generate(tmp_path, files=1, pings=150, beams=64, seed=6)
    files = sorted(tmp_path.glob("*.gsf"))
    cfg = LoadConfig(bin_size_m=20.0, split_pings=37)
    used = []
    counting = soundings._counting_sort

    def spy(parts, width):
        out = counting(parts, width)
        used.append(out is not None)
        return out

    monkeypatch.setattr(soundings, "_counting_sort", spy)
    _pieces_equal(files, cfg)
    assert used and all(used)
    used.clear()
    monkeypatch.setattr(soundings, "_BOX_PER_SOUNDING", 0)
    monkeypatch.setattr(soundings, "_BOX_SLACK", 0)
    _pieces_equal(files, cfg)
    assert used and not any(used)
