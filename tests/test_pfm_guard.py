"""Unfinished or damaged PFMs (issue 20): ``info``, ``dump``, ``export`` and ``load --png``
refuse an unfinished load (naming its resume command) and a PFM failing the fast structural
checks, in one line with exit 2, unless ``--force``; ``dump`` of a chain with a cycle never
gives a sounding twice.

References: a load killed at a known point (journal.crash_point), damage made by editing
bytes at places computed by hand (tests/pfm/test_check helpers), and the soundings each
identified by (file, line, ping, beam), which no two stored soundings share.
"""

from __future__ import annotations

import os
import shutil
import signal

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pfm_dask import pfm as P
from pfm_dask.cli import app

from .pfm.test_check import BinFile, get_continuation, set_continuation
from .pfm.test_recompute import build_pfm
from .test_resume import crash_load, pfm_cli, rsurvey  # noqa: F401  (fixture)


def _commands(pfm, tmp_path):
    return {"info": ["info", pfm],
            "dump": ["dump", pfm, "--soundings", tmp_path / "d.parquet"],
            "export": ["export", pfm, "--xyz", tmp_path / "e.csv"]}


def test_an_unfinished_load_is_refused_with_its_resume_command_unless_forced(rsurvey,  # noqa: F811
                                                                             tmp_path):
    out = tmp_path / "part.pfm"
    r = crash_load(rsurvey, out, "piece:2", "--serial")
    assert r.returncode == -signal.SIGKILL
    for name, args in _commands(out, tmp_path).items():
        r = pfm_cli(*args)
        assert r.returncode == 2, (name, r.stdout, r.stderr)
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and "unfinished load" in line, (name, line)
        assert "--resume" in line and str(out.resolve()) in line and "--force" in line
        assert not any((tmp_path / f).exists() for f in ("d.parquet", "e.csv"))
    for name, args in _commands(out, tmp_path).items():
        forced = pfm_cli(*args, "--force")
        assert forced.returncode == 0, (name, forced.stderr)
        assert "warning" in forced.stderr and "unfinished load" in forced.stderr


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    d = tmp_path_factory.mktemp("guard")
    path, _, _ = build_pfm(d, seed=11, batches=1, heavy=25, lat_fraction=0.7)
    return path


def _copy(src, d) -> str:
    os.makedirs(d, exist_ok=True)
    dst = os.path.join(d, os.path.basename(src))
    shutil.copy(src, dst)
    shutil.copytree(src + ".data", dst + ".data")
    return dst


def test_a_pfm_failing_the_structural_checks_is_refused_unless_forced(loaded, tmp_path):
    bad = _copy(loaded, tmp_path / "bad")
    ndx = f"{bad}.data/{os.path.basename(bad)}.ndx"
    with open(ndx, "r+b") as fh:   # a torn tail: not a whole number of physical records
        fh.truncate(os.path.getsize(ndx) - 10)
    for name, args in _commands(bad, tmp_path).items():
        r = CliRunner().invoke(app, [str(a) for a in args])
        assert r.exit_code == 2, (name, r.output)
        line = r.stderr.strip()
        assert len(line.splitlines()) == 1 and "structural checks" in line, (name, line)
        assert ".ndx" in line and "pfm-dask check" in line
    # the sound original passes: nothing said
    r = CliRunner().invoke(app, ["info", str(loaded)])
    assert r.exit_code == 0 and "warning" not in r.stderr


def test_load_png_is_not_drawn_from_a_pfm_failing_the_checks(tmp_path, monkeypatch):
    from pfm_dask import synth

    synth.generate(tmp_path / "s", files=1, pings=20, beams=16, seed=2)
    real = P.check

    def damaged(path, **kw):       # the load's PFM as seen by the quick checks afterwards
        if kw.get("bins") is False:
            return [P.Problem(".ndx", "byte 7", "a made-up problem")]
        return real(path, **kw)

    monkeypatch.setattr(P, "check", damaged)
    png = tmp_path / "q.png"
    args = ["load", str(tmp_path / "s"), "-o", str(tmp_path / "q.pfm"), "--serial", "-q",
            "--bin-size", "25", "--png", str(png)]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 2 and "a made-up problem" in r.stderr and not png.exists(), r.output
    r = CliRunner().invoke(app, [*args[:-2], "-o", str(tmp_path / "r.pfm"), "--png", str(png),
                                 "--force"])
    assert r.exit_code == 0 and png.exists(), r.output


def test_dump_of_a_chain_with_a_cycle_gives_no_sounding_twice(loaded, tmp_path):
    cyc = _copy(loaded, tmp_path / "cyc")
    bf = BinFile(cyc)
    c, r = bf.bins_with(min_count=3 * bf.h.record_length + 1)[0]
    head = bf.get(c, r, "head")
    second = get_continuation(cyc, bf.h, head)
    set_continuation(cyc, bf.h, second, head)   # record 2 points back to record 1
    assert any("cycle" in p.what for p in P.check(cyc))
    out = P.dump(cyc, soundings=tmp_path / "s.parquet")
    t = pq.read_table(tmp_path / "s.parquet")
    keys = list(zip(*(t.column(k).to_pylist() for k in ("file", "line", "ping", "beam"))))
    assert len(keys) == len(set(keys)) == out["soundings"]
    assert out["repeated_soundings_dropped"] > 0
    # the sound original: every stored sounding once, nothing dropped
    whole = P.dump(loaded, soundings=tmp_path / "w.parquet")
    assert "repeated_soundings_dropped" not in whole
    assert whole["soundings"] == pq.read_metadata(tmp_path / "w.parquet").num_rows
