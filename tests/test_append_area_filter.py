"""``--append`` against one load of all the files (issue 20; docs/usage.md, "Adding to a PFM").

Without the area filter an append gives the same PFM content as one load of all the files.
With ``--area-filter`` it does not, and the docs say exactly how: the append filters only the
bins it put soundings in, so bins it did not touch keep the earlier load's flags, no sounding
the earlier filter cut is restored, and only the filter's flags (FILTER_INVAL, MODIFIED) can
differ; the soundings themselves are the same.

References: the dumps of the three PFMs compared with each other sounding by sounding, keyed
by (file, ping, beam), which the synthetic survey makes unique; no load's report is used.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pfm_dask import pfm, pipeline, synth
from pfm_dask.config import LoadConfig
from pfm_dask.pfm import validity as V

DOCS = Path(__file__).resolve().parents[1] / "docs" / "usage.md"
KEY = ("file", "ping", "beam")
SAME = ("line", "bin_x", "bin_y", "x", "y", "depth", "horizontal_error", "vertical_error")


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    root = tmp_path_factory.mktemp("append_af")
    synth.generate(root / "s", files=3, pings=60, beams=64, seed=8)
    ar = json.loads((root / "s" / "survey.json").read_text())["area"]
    mbr = (ar["south"] - 0.001, ar["west"] - 0.001, ar["north"] + 0.001, ar["east"] + 0.001)
    return root, sorted((root / "s").glob("*.gsf")), mbr


def _soundings(path: Path) -> dict:
    pfm.dump(path, soundings=Path(str(path) + ".s.parquet"), bins=Path(str(path) + ".b.parquet"))
    t = pq.read_table(Path(str(path) + ".s.parquet"))
    cols = {k: t.column(k).to_numpy() for k in t.column_names}
    order = np.lexsort([cols[k] for k in reversed(KEY)])
    out = {k: v[order] for k, v in cols.items()}
    keys = np.stack([out[k] for k in KEY], axis=1)
    assert len(np.unique(keys, axis=0)) == len(keys)   # (file, ping, beam) is an identity
    return out


def _loads(survey, tmp_path, area_filter: bool):
    root, files, mbr = survey
    cfg = LoadConfig(bin_size_m=40.0, mbr=mbr, area_filter=area_filter)
    one, first, app = tmp_path / "one.pfm", tmp_path / "first.pfm", tmp_path / "app.pfm"
    assert pipeline.run_load([str(f) for f in files], one, cfg, mode="serial").exit_code == 0
    assert pipeline.run_load([str(files[0])], first, cfg, mode="serial").exit_code == 0
    assert pipeline.run_load([str(files[0])], app, cfg, mode="serial").exit_code == 0
    res = pipeline.run_load([str(f) for f in files], app, cfg, mode="serial", append=True)
    assert res.exit_code == 0 and res.skipped_files == [str(files[0])], res.summary()
    return one, first, app


def test_without_the_area_filter_an_append_is_one_load(survey, tmp_path):
    one, _, app = _loads(survey, tmp_path, False)
    a, b = _soundings(one), _soundings(app)
    for k in a:
        assert np.array_equal(a[k], b[k]), k
    bins_one = pq.read_table(Path(str(one) + ".b.parquet"))
    assert bins_one.equals(pq.read_table(Path(str(app) + ".b.parquet")))


def test_with_the_area_filter_only_the_filter_flags_differ_as_documented(survey, tmp_path):
    one, first, app = _loads(survey, tmp_path, True)
    a, b, f0 = _soundings(one), _soundings(app), _soundings(first)
    for k in (*KEY, *SAME):                       # the same soundings, where they were
        assert np.array_equal(a[k], b[k]), k
    diff = a["validity"] ^ b["validity"]
    assert diff.any()                             # the docs' caveat is real on this survey
    assert not np.any(diff & ~(V.FILTER_INVAL | V.MODIFIED))
    # bins the append put no sounding in keep the first load's flags exactly
    width = int(max(a["bin_x"].max(), f0["bin_x"].max())) + 1
    touched = np.unique((b["bin_y"] * width + b["bin_x"])[b["file"] > 0])
    in_first = b["file"] == 0
    untouched = in_first & ~np.isin(b["bin_y"] * width + b["bin_x"], touched)
    assert untouched.any()
    first_validity = f0["validity"]               # file 0 only, same (file, ping, beam) order
    assert np.array_equal(b["validity"][untouched],
                          first_validity[untouched[in_first]])
    # no sounding the first load's filter cut is restored by the append
    cut_first = (first_validity & V.FILTER_INVAL) != 0
    assert cut_first.any()
    assert np.all((b["validity"][in_first][cut_first] & V.FILTER_INVAL) != 0)


def test_the_docs_say_what_an_append_with_the_area_filter_changes():
    text = DOCS.read_text()
    para = text[text.index("**Adding to a PFM.**"):]
    para = para[:para.index("```")]
    assert "--area-filter" in para and re.search(r"did not touch", para), para
