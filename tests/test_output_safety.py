"""Nothing at the output path is destroyed, and ``--resume``/``--append`` never ignore their
arguments (issue 18, items 1-4).

A load removes or overwrites only what its own journal proves to be this load's unfinished
output; everything else is refused with exit 2 before a byte changes. An append marks
itself in the journal before it writes, ``--resume`` compares its inputs and settings with
the journal whatever the phase, the printed resume command works from any directory, and
an append whose files cannot fit the PFM's fields is refused before it starts.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from pfm_dask import journal as J
from pfm_dask import pfm, synth
from pfm_dask.inputs import expand_inputs

from .test_resume import pfm_cli, resume_command_in


# ------------------------------------------------------------------ helpers
def tree_digest(*paths: Path) -> dict:
    """Every file under ``paths`` with its bytes' digest (and the paths that exist)."""
    out = {}
    for root in paths:
        if root.is_file():
            out[str(root)] = hashlib.sha256(root.read_bytes()).hexdigest()
        elif root.is_dir():
            out[str(root)] = "dir"
            for p in sorted(root.rglob("*")):
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def pfm_state(out: Path) -> dict:
    return tree_digest(out, Path(str(out) + ".data"))


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """A 4-line survey split in two days (2 files each), and an area holding all of it."""
    root = tmp_path_factory.mktemp("days")
    synth.generate(root / "all", files=4, pings=30, beams=64, seed=3)
    files = expand_inputs([root / "all"])
    d1, d2 = root / "day1", root / "day2"
    d1.mkdir()
    d2.mkdir()
    for i, f in enumerate(files):
        (d1 if i < 2 else d2).joinpath(f.name).symlink_to(f)
    area = json.loads((root / "all" / "survey.json").read_text())["area"]
    pad = 0.001
    mbr = [area["south"] - pad, area["west"] - pad, area["north"] + pad, area["east"] + pad]
    return d1, d2, [str(x) for x in mbr]


def load(*args, cwd=None, env=None):
    return pfm_cli("load", *args, env=env) if cwd is None else _in(cwd, "load", *args, env=env)


def _in(cwd: Path, *args, env=None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "pfm_dask.cli", *map(str, args)],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=300, cwd=cwd, start_new_session=True)


def soundings(out: Path) -> int:
    return int(pfm.info(out)["counts"]["soundings"])


# ------------------------------------------------------------------ 1. nothing not ours is touched
@pytest.mark.parametrize("flags", [["--resume"], []], ids=["resume", "plain"])
def test_output_that_is_not_ours_is_refused_untouched(days, tmp_path, flags):
    d1, _, mbr = days
    gsf = tmp_path / "precious.gsf"
    gsf.write_bytes(next(d1.iterdir()).read_bytes())
    analysis = tmp_path / "analysis.data"
    analysis.mkdir()
    (analysis / "results.csv").write_text("depth\n12.5\n")
    a_dir = tmp_path / "somewhere"
    a_dir.mkdir()
    (a_dir / "notes.txt").write_text("keep me")
    before = tree_digest(tmp_path)
    for target, found in ((gsf, "not a PFM handle"), (tmp_path / "analysis", "no pfm-dask load"),
                          (a_dir, "a directory")):
        r = load(d1, "-o", target, "--serial", "-q", "--bin-size", "25", *flags)
        assert r.returncode == 2, (target, r.returncode, r.stderr)
        assert str(target) in r.stderr and found in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert tree_digest(tmp_path) == before


def test_a_pfm_without_our_journal_is_never_removed_by_resume(days, tmp_path):
    """A PFM made by another tool (or whose journal is gone), given to ``--resume`` with
    inputs: refused, every byte kept (the old rule deleted an 'empty-looking' one)."""
    d1, _, _ = days
    from pfm_dask.bins import BinGrid

    other = tmp_path / "abe.pfm"
    pfm.create(other, BinGrid.from_mbr(0, 0, 0.01, 0.01, bin_size_m=100)).close()
    before = pfm_state(other)
    r = load(d1, "-o", other, "--serial", "-q", "--resume")
    assert r.returncode == 2, r.stderr
    assert "no load journal" in r.stderr
    assert pfm_state(other) == before


def test_our_load_killed_before_its_first_checkpoint_is_restarted(days, tmp_path):
    """load.json proves the output is this load's; with no checkpoint there is nothing to
    continue, so ``--resume`` removes exactly its files and starts again; a foreign file in
    its data folder makes it refuse instead."""
    d1, _, mbr = days
    out = tmp_path / "o.pfm"
    r = load(d1, "-o", out, "--serial", "-q", "--bin-size", "25", "--mbr", *mbr,
             env={"PFM_DASK_CRASH_AT": "checkpoint"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    J.journal_paths(out)["journal"].unlink()       # as if killed just before the checkpoint
    stray = Path(str(out) + ".data") / "my-notes.txt"
    stray.write_text("mine")
    before = pfm_state(out)
    r = load(d1, "-o", out, "--serial", "-q", "--bin-size", "25", "--mbr", *mbr, "--resume")
    assert r.returncode == 2 and "my-notes.txt" in r.stderr, r.stderr
    assert pfm_state(out) == before
    stray.unlink()
    r = load(d1, "-o", out, "--serial", "--bin-size", "25", "--mbr", *mbr, "--resume")
    assert r.returncode == 0, r.stderr
    assert "starting the load again" in r.stderr
    assert pfm.check(out) == []


def test_our_load_killed_as_it_claims_the_path_is_restarted(days, tmp_path):
    """A new load writes its load.json in the data folder it has just made, before the PFM's
    handle or parts: killed right there (chaos found a kill in this window refused as "no
    load journal"), ``--resume`` knows the output for its own and starts again; so it does
    for a folder holding only a load's scratch files (killed while writing load.json), and
    still refuses one that holds anything else, untouched."""
    d1, _, mbr = days
    out = tmp_path / "o.pfm"
    opts = ["--serial", "-q", "--bin-size", "25", "--mbr", *mbr]
    r = load(d1, "-o", out, *opts, env={"PFM_DASK_CRASH_AT": "claimed"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    data = Path(str(out) + ".data")
    assert not out.exists() and (data / "load.json").exists()
    assert not any(p.name.startswith(out.name) for p in data.iterdir())   # no part yet
    r = load(d1, "-o", out, *opts, "--resume")
    assert r.returncode == 0, r.stderr
    assert pfm.check(out) == []
    ref = tmp_path / "ref.pfm"
    assert load(d1, "-o", ref, *opts).returncode == 0
    assert soundings(out) == soundings(ref)

    out2 = tmp_path / "o2.pfm"
    data2 = Path(str(out2) + ".data")
    data2.mkdir()
    (data2 / "lock").write_text("")
    (data2 / "load.json.tmp").write_text('{"format": ')          # torn mid-write
    r = load(d1, "-o", out2, *[o for o in opts if o != "-q"], "--resume")
    assert r.returncode == 0, r.stderr
    assert "starting the load again" in r.stderr and pfm.check(out2) == []

    out3 = tmp_path / "o3.pfm"
    data3 = Path(str(out3) + ".data")
    data3.mkdir()
    (data3 / "load.json.tmp").write_text("")
    (data3 / "survey-notes.txt").write_text("mine")
    before = pfm_state(out3)
    r = load(d1, "-o", out3, *opts, "--resume")
    assert r.returncode == 2 and "no pfm-dask load journal" in r.stderr, r.stderr
    assert pfm_state(out3) == before


# ------------------------------------------------------------------ 2-3. append and resume
def test_append_killed_before_its_first_checkpoint_is_finished_by_the_printed_command(
        days, tmp_path):
    d1, d2, mbr = days
    whole, out = tmp_path / "whole.pfm", tmp_path / "s.pfm"
    opts = ["--serial", "-q", "--bin-size", "25", "--mbr", *mbr]
    assert load(d1, d2, "-o", whole, *opts).returncode == 0
    assert load(d1, "-o", out, *opts).returncode == 0
    r = load(d1, d2, "-o", out, *opts, "--append", env={"PFM_DASK_CRASH_AT": "append-marked"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert J.read_journal(out)["phase"] == "append-pending"
    # check names the unfinished append and the command
    c = pfm_cli("check", out)
    assert c.returncode == 1 and "append-pending" in c.stdout
    cmd = resume_command_in(c.stdout)
    # a plain append again is refused, naming the same command
    again = load(d1, d2, "-o", out, *opts, "--append")
    assert again.returncode == 2 and resume_command_in(again.stderr) == cmd
    # the job script's own command (inputs, --append, --resume) finishes it ...
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _in(elsewhere, *cmd)
    assert done.returncode == 0, done.stderr
    assert soundings(out) == soundings(whole)
    assert J.read_journal(out)["phase"] == "complete"
    # ... and run again it has nothing to do
    again = load(d1, d2, "-o", out, *opts, "--append", "--resume")
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr
    assert soundings(out) == soundings(whole)


def test_append_killed_after_it_started_writing_resumes_from_any_directory(days, tmp_path):
    d1, d2, mbr = days
    whole, out = tmp_path / "whole.pfm", tmp_path / "s.pfm"
    opts = ["--serial", "-q", "--bin-size", "25", "--mbr", *mbr]
    assert load(d1, d2, "-o", whole, *opts).returncode == 0
    assert load(d1, "-o", out, *opts).returncode == 0
    # relative paths in the command that died; the printed command must not depend on them
    r = _in(tmp_path, "load", os.path.relpath(d1, tmp_path), os.path.relpath(d2, tmp_path),
            "-o", "s.pfm", *opts, "--append", "--checkpoint-seconds", "0",
            env={"PFM_DASK_CRASH_AT": "piece:1"})
    assert r.returncode == -signal.SIGKILL, r.stderr
    c = pfm_cli("check", out)
    cmd = resume_command_in(c.stdout)
    assert str(out) in cmd and "--serial" in cmd
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _in(elsewhere, *cmd)
    assert done.returncode == 0, done.stderr
    assert "resumed from phase loading" in done.stdout
    assert soundings(out) == soundings(whole)
    assert pfm.check(out) == []
    # the job script's command (its inputs, --append, --resume) also works, from anywhere
    again = _in(elsewhere, "load", d1, d2, "-o", out, *opts, "--append", "--resume")
    assert again.returncode == 0 and "already complete" in again.stdout, again.stderr


def test_resume_of_a_finished_pfm_compares_inputs_and_settings(days, tmp_path):
    d1, d2, mbr = days
    out = tmp_path / "s.pfm"
    opts = ["--serial", "-q", "--mbr", *mbr]
    assert load(d1, "-o", out, *opts, "--bin-size", "25").returncode == 0
    before = pfm_state(out)
    other = load(d2, "-o", out, *opts, "--bin-size", "25", "--resume")
    assert other.returncode == 2 and "inputs differ" in other.stderr, other.stderr
    size = load(d1, "-o", out, *opts, "--bin-size", "10", "--resume")
    assert size.returncode == 2 and "bin_size_m" in size.stderr, size.stderr
    assert pfm_state(out) == before
    same = load(d1, "-o", out, *opts, "--bin-size", "25", "--resume")
    assert same.returncode == 0 and "already complete" in same.stdout
    bare = pfm_cli("load", "-o", out, "--resume", "-q")
    assert bare.returncode == 0 and "already complete" in bare.stdout


# ------------------------------------------------------------------ 4. an append that cannot fit
def test_append_that_cannot_fit_is_refused_before_it_starts(tmp_path):
    from pfm_dask import pipeline
    from pfm_dask.config import LoadConfig

    narrow, wide = tmp_path / "narrow", tmp_path / "wide"
    synth.generate(narrow, files=1, pings=20, beams=400, seed=1)
    synth.generate(wide, files=1, pings=20, beams=600, seed=2)
    area = json.loads((narrow / "survey.json").read_text())["area"]
    cfg = LoadConfig(bin_size_m=50.0, mbr=(area["south"] - 0.05, area["west"] - 0.05,
                                           area["north"] + 0.05, area["east"] + 0.05))
    out = tmp_path / "nine.pfm"
    grid = pipeline.area_from_scans([], cfg)
    pfm.create(out, grid, max_beams=500, min_depth=cfg.min_depth,
               max_depth=cfg.max_depth).close()          # a 9-bit beam field, as ABE makes one
    with pfm.open_pfm(out) as f:
        assert f.header.beam_number_bits == 9
    assert pipeline.run_load(expand_inputs([narrow]), out, cfg, mode="serial",
                             append=True).check["sound"]
    before = pfm_state(out)
    wide_file = str(expand_inputs([wide])[0])
    r = load(wide_file, "-o", out, "--serial", "-q", "--append", "--bin-size", "50")
    assert r.returncode == 2, r.stderr
    for word in ("beam number", "511", "[BEAM NUMBER BITS]", wide_file, "nothing was written"):
        assert word in r.stderr, (word, r.stderr)
    assert pfm_state(out) == before
    more = tmp_path / "more"
    synth.generate(more, files=1, pings=20, beams=300, seed=4)
    deep = load(more, "-o", out, "--serial", "-q", "--append", "--max-depth", "20000")
    assert deep.returncode == 2 and "depth range" in deep.stderr, deep.stderr
    assert pfm_state(out) == before
    # the PFM is still appendable as it was
    ok = load(more, "-o", out, "--serial", "-q", "--append", "--bin-size", "50")
    assert ok.returncode == 0, ok.stderr
    assert pfm.check(out) == []
    with pfm.open_pfm(out) as f:
        assert len(f.files()) == 2
    assert np.isfinite(soundings(out))
