"""A load killed (SIGKILL, a real process) at any phase resumes to the same PFM as an
uninterrupted run; the journal's pieces (undo log, atomic publish) on their own.

The reference is an uninterrupted ``--serial`` run of the same command. "The same PFM" is
checked three ways: the Parquet dumps are equal, the ``.ndx``, ``.cvg``, ``.lin`` and the bin
records are byte-identical, and the header differs at most in its creation date.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pfm_dask import journal as J
from pfm_dask import undo as U
from pfm_dask import pfm, pipeline
from pfm_dask.config import LoadConfig
from pfm_dask.errors import ConfigError
from pfm_dask.inputs import expand_inputs

#: the options of every load in these tests (the area filter, so its phases are covered too)
LOAD_OPTS = ["--bin-size", "25", "--area-filter", "--two-sided", "--cellstd", "1.5", "-q"]


# ------------------------------------------------------------------ helpers (shared)
def pfm_cli(*args, env: dict | None = None, timeout: float = 300, preexec_fn=None,
            module: str = "pfm_dask.cli"):
    """Run ``pfm-dask ARGS`` in a new process (a new session, so a group kill stays inside);
    ``module``: another that runs it (``tests.tiles_waiting_cli``)."""
    return subprocess.run([sys.executable, "-m", module, *map(str, args)],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, start_new_session=True, preexec_fn=preexec_fn)


def resume_command_in(text: str) -> list[str]:
    """The resume command a message names (``... continue ... with: CMD`` or in backticks)."""
    m = re.search(r"`(pfm-dask [^`]*--resume)`", text) or re.search(
        r"(pfm-dask load .*--resume)", text)
    assert m, f"no resume command in: {text}"
    import shlex

    args = shlex.split(m.group(1))
    assert args[0] == "pfm-dask"
    return args[1:]


def dump_tables(pfm_path: Path, tmp: Path):
    tmp.mkdir(parents=True, exist_ok=True)
    s, b = tmp / (Path(pfm_path).name + "-s.parquet"), tmp / (Path(pfm_path).name + "-b.parquet")
    pfm.dump(pfm_path, soundings=s, bins=b)
    return pq.read_table(s), pq.read_table(b)


def _parts(p: Path) -> dict:
    stem = Path(str(p) + ".data") / p.name
    return {ext: Path(str(stem) + ext) for ext in (".bin", ".ndx", ".cvg", ".lin", ".ctl")}


def assert_same_pfm(got: Path, want: Path, tmp: Path, *, bytes_too: bool = True) -> None:
    """Equal dumps, and (``bytes_too``) byte-identical parts but for the header date."""
    gs, gb = dump_tables(got, tmp / "got")
    ws, wb = dump_tables(want, tmp / "want")
    assert gs.num_rows == ws.num_rows and gs.equals(ws), "soundings differ"
    assert gb.equals(wb), "bins differ"
    assert pfm.check(got) == [], pfm.check(got)
    if not bytes_too:
        return
    g, w = _parts(Path(got)), _parts(Path(want))
    for ext in (".ndx", ".cvg", ".lin"):
        assert g[ext].read_bytes() == w[ext].read_bytes(), ext
    # .ctl: the input lines (the first five name the PFM's own parts)
    assert g[".ctl"].read_text().splitlines()[5:] == w[".ctl"].read_text().splitlines()[5:]
    with pfm.open_pfm(got) as fg, pfm.open_pfm(want) as fw:
        hs = fg.bin_header_size
        hg, hw = vars(fg.header).copy(), vars(fw.header).copy()
    for h in (hg, hw):
        h.pop("date", None)
        h.pop("unknown", None)
    assert hg == hw
    assert g[".bin"].read_bytes()[hs:] == w[".bin"].read_bytes()[hs:], "bin records differ"


def report_counts(res) -> list[dict]:
    return [{k: v for k, v in f.items() if k != "path"} for f in res.files]


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def rsurvey(tmp_path_factory) -> Path:
    """A small synthetic survey: 4 files, so a load has 4 pieces."""
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("rsurvey")
    synth.generate(out, files=4, pings=30, beams=64, seed=3)
    return out


def _reference_load(rsurvey, tmp_path_factory, env=None):
    out = tmp_path_factory.mktemp("reference") / "ref.pfm"
    r = pfm_cli("load", rsurvey, "-o", out, "--serial", "--json", *LOAD_OPTS, env=env)
    assert r.returncode == 0, r.stderr
    import json

    return out, json.loads(r.stdout)


@pytest.fixture(scope="session")
def reference(rsurvey, tmp_path_factory):
    """An uninterrupted serial load with LOAD_OPTS: (pfm path, its load report)."""
    return _reference_load(rsurvey, tmp_path_factory)


@pytest.fixture(scope="session")
def reference_piece_groups(rsurvey, tmp_path_factory):
    """The same, each piece written as a group of its own (``PIECE_GROUPS``)."""
    return _reference_load(rsurvey, tmp_path_factory, env=PIECE_GROUPS)


def crash_load(survey: Path, out: Path, point: str, *extra, scope: str | None = None,
               env: dict | None = None):
    """Run a load that SIGKILLs itself at ``point`` (journal.crash_point); check it died so."""
    env = {"PFM_DASK_CRASH_AT": point, **(env or {})}
    if scope:
        env["PFM_DASK_CRASH_SCOPE"] = scope
    r = pfm_cli("load", survey, "-o", out, *LOAD_OPTS, *extra, env=env)
    return r


# ------------------------------------------------------------------ unit: the journal's pieces
def test_undo_log_puts_back_the_pre_images_and_ignores_a_torn_tail(tmp_path):
    part = tmp_path / "part.bin"
    original = bytes(range(256)) * 64
    part.write_bytes(original)
    undo = J.UndoLog(tmp_path / "undo.log")
    undo.begin(7, {"bin": 10000})
    fd = os.open(part, os.O_RDWR)
    edits = [(100, b"A" * 50), (120, b"B" * 300), (9990, b"C" * 100), (12000, b"D" * 10)]
    for off, data in edits:  # overlapping edits, one past the checkpoint size
        undo.save("bin", off, os.pread(fd, len(data), off))
        undo.commit()
        os.pwrite(fd, data, off)
    os.close(fd)
    assert part.read_bytes() != original
    # a torn entry at the end (its overwrite never happened) is ignored
    with open(tmp_path / "undo.log", "ab") as fh:
        fh.write(b"UNDO\x07\x00")
    # entries of an older epoch are ignored: nothing to undo for epoch 8
    assert undo.rollback(8, {"bin": str(part)}) == 0
    undo.rollback(7, {"bin": str(part)})
    got = part.read_bytes()
    # the checkpoint size was 10000: bytes from there on are cut by the resume's truncation
    assert got[:10000] == original[:10000]
    undo.close()


def test_undo_log_rolls_back_through_an_interval_begun_before_its_checkpoint_was_durable(tmp_path):
    """A checkpoint made durable behind the writer: the next interval starts in the log's other
    file while the previous one's entries stay. A crash before the checkpoint is published
    rolls back to the one before through both intervals; one after it, through the new only."""
    part = tmp_path / "part.bin"
    state0 = bytes(range(256)) * 8
    part.write_bytes(state0)
    undo = J.UndoLog(tmp_path / "undo.log")
    undo.begin(4, {"bin": len(state0)})
    fd = os.open(part, os.O_RDWR)

    def edit(off, data):
        undo.save("bin", off, os.pread(fd, len(data), off))
        undo.commit()
        os.pwrite(fd, data, off)

    edit(10, b"A" * 100)
    edit(500, b"B" * 20)
    state1 = part.read_bytes()                    # checkpoint 5 taken here, published later
    undo.begin(5, {"bin": len(state0)}, keep_previous=True)
    assert (tmp_path / ("undo.log" + J.UNDO_ALT_SUFFIX)).exists()
    edit(50, b"C" * 100)                          # overlaps an edit of interval 4
    edit(1500, b"D" * 10)
    os.close(fd)
    # crash before checkpoint 5 was published: back to checkpoint 4
    undo.rollback(4, {"bin": str(part)})
    assert part.read_bytes() == state0
    # had it been published: back to checkpoint 5 (interval 4's entries are older: ignored)
    fd = os.open(part, os.O_RDWR)
    os.pwrite(fd, state1, 0)
    edit(50, b"C" * 100)
    os.close(fd)
    undo.rollback(5, {"bin": str(part)})
    assert part.read_bytes() == state1
    # a plain begin empties both files
    undo.begin(6, {"bin": len(state0)})
    assert undo.rollback(4, {"bin": str(part)}) == 0
    undo.close()


def test_undo_log_records_put_back_zero_and_data_records(tmp_path):
    size = 13
    part = tmp_path / "bins"
    rng = np.random.default_rng(0)
    recs = rng.integers(0, 256, (40, size), dtype="uint8")
    recs[[0, 1, 2, 7, 20, 21]] = 0                       # never-written records
    original = bytes(100) + recs.tobytes()
    part.write_bytes(original)
    undo = J.UndoLog(tmp_path / "undo.log")
    undo.begin(3, {"bin": 100 + 35 * size})              # records 35.. are past the checkpoint
    fd = os.open(part, os.O_RDWR)
    for touched in ([0, 1, 2, 3, 7, 8, 30, 36], [2, 3, 4, 20, 21, 22, 39]):
        off = [100 + i * size for i in touched]
        pre = np.frombuffer(b"".join(os.pread(fd, size, o) for o in off),
                            dtype="uint8").reshape(-1, size)
        undo.save_records("bin", off, size, pre)
        undo.commit()
        for o in off:
            os.pwrite(fd, b"\xee" * size, o)
    os.close(fd)
    assert os.path.getsize(tmp_path / "undo.log") < 14 * size + 200  # zero records: no bytes
    undo.rollback(3, {"bin": str(part)})
    assert part.read_bytes()[:100 + 35 * size] == original[:100 + 35 * size]
    undo.close()


def test_undo_log_keeps_zero_pre_images_as_lengths(tmp_path):
    part = tmp_path / "p"
    part.write_bytes(bytes(4096))
    undo = J.UndoLog(tmp_path / "u")
    undo.begin(1, {"bin": 4096})
    undo.save("bin", 1000, bytes(2000))
    undo.commit()
    assert os.path.getsize(tmp_path / "u") < 100
    part.write_bytes(b"\xff" * 4096)
    undo.rollback(1, {"bin": str(part)})
    assert part.read_bytes() == b"\xff" * 1000 + bytes(2000) + b"\xff" * 1096
    undo.close()


def test_undo_log_puts_back_tails_filled_and_linked_since_the_checkpoint(tmp_path):
    """The store's in-place writes between two checkpoints (tails filled and linked, bin
    records rewritten) are all undone: after a rollback and the truncation of the .ndx the
    parts are the checkpoint's bytes exactly. Tails are logged as the bits to clear (16
    bytes each), a tail with bits set past its soundings (another writer's) whole."""
    from .pfm.test_store import make_soundings, small_grid

    rng = np.random.default_rng(11)
    path = str(tmp_path / "u.pfm")
    stem = Path(path + ".data") / "u.pfm"
    parts = {k: str(stem) + "." + k for k in ("bin", "ndx")}
    with pfm.create(path, small_grid(9, 7), max_files=8, max_lines=64) as f:
        bins = np.arange(0, 63, 2)
        f.add_sorted(**make_soundings(rng, bins, rng.integers(1, 9, bins.size)))
        f.add_sorted(**make_soundings(rng, bins[::3], rng.integers(1, 4, bins[::3].size)))
        f.flush()
        # another writer's tails: a bit set in the free slots of some bins' last records
        recs = f.read_bin_records(0, f.height)
        L = f.record_length
        odd = [b for b in bins if recs["num_soundings"][b] % L][:3]
        assert odd
        for b in odd:
            at = int(recs["tail"][b]) + (int(recs["num_soundings"][b]) % L * f._single_bits) // 8 + 1
            os.pwrite(f._fds["ndx"], bytes([os.pread(f._fds["ndx"], 1, at)[0] | 1]), at)
        before = {k: Path(v).read_bytes() for k, v in parts.items()}
        undo = J.UndoLog(tmp_path / "undo.log")
        undo.begin(1, {"bin": len(before["bin"]), "ndx": len(before["ndx"])})
        f.undo = undo
        more = np.union1d(np.sort(rng.choice(bins, 20, replace=False)), odd)
        f.add_sorted(**make_soundings(rng, more, rng.integers(1, 15, more.size)))
        f.flush()
    kinds = {(e[0], e[3]) for e in undo.entries(1)}     # (kind flag, part)
    assert (U._CLEARED, "ndx") in kinds and (U._RECORDS, "ndx") in kinds, kinds
    undo.rollback(1, parts)
    undo.close()
    os.truncate(parts["ndx"], len(before["ndx"]))
    for k, v in parts.items():
        assert Path(v).read_bytes() == before[k], k


def _logged_records(undo, epoch):
    """(part, record offset) of every record an epoch's undo entries put back, in log order."""
    import struct

    out = []
    for flag, pos, stored, part, off, n in undo.entries(epoch):
        body = os.pread(undo.fd, stored, pos)
        (size,) = struct.unpack_from("<I", body)
        if flag == U._CLEARED:
            table = np.frombuffer(body, dtype="<i8", offset=4).reshape(-1, 2)
            out += [(part, int(o)) for o in table[:, 0]]
            continue
        assert flag == U._RECORDS
        at = 4
        for _ in range(2):
            (k,) = struct.unpack_from("<I", body, at)
            runs = np.frombuffer(body, dtype="<i8", count=2 * k, offset=at + 4).reshape(k, 2)
            at += 4 + 16 * k
            out += [(part, int(a) + j * size) for a, c in runs.tolist() for j in range(c)]
    return out


def test_undo_log_keeps_one_pre_image_per_record_per_interval(tmp_path):
    """Several groups between two checkpoints rewrite the same bin and tail records: the log
    keeps each record's first pre-image only (the one a rollback leaves), and the rollback
    still gives the checkpoint's bytes exactly. A new interval starts afresh."""
    from .pfm.test_store import make_soundings, small_grid

    rng = np.random.default_rng(5)
    path = str(tmp_path / "o.pfm")
    stem = Path(path + ".data") / "o.pfm"
    parts = {k: str(stem) + "." + k for k in ("bin", "ndx")}
    with pfm.create(path, small_grid(9, 7), max_files=8, max_lines=64) as f:
        bins = np.arange(0, 63, 3)
        f.add_sorted(**make_soundings(rng, bins, rng.integers(1, 9, bins.size)))
        f.flush()
        before = {k: Path(v).read_bytes() for k, v in parts.items()}
        undo = J.UndoLog(tmp_path / "undo.log")
        undo.begin(1, {"bin": len(before["bin"]), "ndx": len(before["ndx"])})
        f.undo = undo
        for _ in range(4):     # the same bins again and again, a few soundings each time
            some = np.sort(rng.choice(bins, 15, replace=False))
            f.add_sorted(**make_soundings(rng, some, rng.integers(1, 4, some.size)))
        f.flush()
        logged = _logged_records(undo, 1)
        assert logged and len(logged) == len(set(logged)), "a record logged twice"
        assert {p for p, _ in logged} == {"bin", "ndx"}
        undo.rollback(1, parts)
        os.truncate(parts["ndx"], len(before["ndx"]))
        for k, v in parts.items():
            assert Path(v).read_bytes() == before[k], k
        # a new interval logs the records again
        undo.begin(2, {"bin": len(before["bin"]), "ndx": len(before["ndx"])})
        f.add_sorted(**make_soundings(rng, bins[:5], np.full(5, 2)))
        f.flush()
        assert {o for p, o in _logged_records(undo, 2) if p == "bin"} == {
            f.bin_header_size + int(b) * f.bin_record_size for b in bins[:5]}
    undo.close()


def test_undo_commit_on_the_write_behind_thread_runs_before_the_overwrites(tmp_path, monkeypatch):
    """The store queues the undo log's fsync on its write-behind thread ahead of the overwrites:
    it runs before them, once per commit, and a commit with nothing new saved queues nothing."""
    from pfm_dask.pfm._io import BackgroundWriter

    events = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    undo = J.UndoLog(tmp_path / "undo.log")
    undo.begin(1, {"bin": 4096})
    events.clear()
    w = BackgroundWriter()
    try:
        undo.save("bin", 0, b"\x01" * 16)
        undo.commit_in(w.run)
        w.run(lambda: events.append("overwrite"))
        undo.commit_in(w.run)                     # nothing saved since: nothing queued
        w.drain()
    finally:
        w.close()
        undo.close()
    assert events == ["fsync", "overwrite"]


def test_atomic_write_leaves_old_or_new_never_a_mix(tmp_path):
    p = tmp_path / "j.json"
    J.atomic_write(p, b"old")
    J.atomic_write(p, b"new content")
    assert p.read_bytes() == b"new content"
    assert not (tmp_path / "j.json.tmp").exists()


# ------------------------------------------------------------------ kill, then resume
# (crash point, extra options): every phase of a load, and a kill between a piece's
# in-place writes and the next checkpoint (checkpoints after every group of pieces; with
# PIECE_GROUPS every piece is a group of its own: the undo log must put back bin and tail
# records the last piece rewrote; without, this tiny survey is one group).
# (benchmarks/chaos.py kills at random moments, many more times.)
PIECE_GROUPS = {"PFM_DASK_GROUP_BYTES": "1"}
CRASHES = [
    ("piece:3", ["--checkpoint-seconds", "0"]),
    ("piece:3/groups-of-one", ["--checkpoint-seconds", "0"]),
    # killed while a checkpoint is made durable behind the writer, which has begun the next
    # group: its in-place writes are in the undo log's other file
    ("checkpoint-behind:2/groups-of-one", ["--checkpoint-seconds", "0"]),
    ("area-filter-row:3", []),
    ("area-filter-apply", []),
    ("recompute-write", []),
    # killed in the final check while its parts are fsynced beside it (_writer_journal.Beside): the
    # journal still says "recompute", and the resume recomputes and checks again
    ("final-check", ["--checkpoint-seconds", "0"]),
    ("checkpoint-complete", []),
]


@pytest.mark.parametrize("point,extra", CRASHES, ids=[c[0] for c in CRASHES])
def test_killed_load_resumes_to_the_uninterrupted_result(rsurvey, request, tmp_path,
                                                         point, extra):
    point, _, variant = point.partition("/")
    env = PIECE_GROUPS if variant == "groups-of-one" else None
    ref, ref_report = request.getfixturevalue("reference_piece_groups" if env else "reference")
    out = tmp_path / "out.pfm"
    r = crash_load(rsurvey, out, point, "--serial", *extra, env=env)
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    state = J.read_journal(out)
    assert state is not None
    if point == "checkpoint-complete":
        assert state["phase"] == "complete"
    else:
        assert state["phase"] != "complete"
        assert any("incomplete" in str(p) for p in pfm.check(out))
    res = pipeline.run_load([], out, None, mode="serial", resume=True)
    assert res.exit_code == 0, res.summary()
    assert_same_pfm(out, ref, tmp_path)
    if point != "checkpoint-complete":
        assert res.resumed_from["phase"] == state["phase"]
        assert report_counts(res) == [{k: v for k, v in f.items() if k != "path"}
                                      for f in ref_report["files"]]
        assert res.area_filter == ref_report["area_filter"]
    # the scratch files are gone, the journal says complete
    data = Path(str(out) + ".data")
    assert J.read_journal(out)["phase"] == "complete"
    assert not (data / "undo.log").exists() and not (data / "lock").exists()
    assert not (data / ("undo.log" + J.UNDO_ALT_SUFFIX)).exists()


def test_a_short_load_killed_in_its_check_resumes_to_the_uninterrupted_result(rsurvey,
                                                                              tmp_path):
    """A short new load (no area filter) takes no phase checkpoints after its first and
    fsyncs its parts beside its final check (_writer_journal.Beside): killed in the check, the
    journal still says ``loading`` and a resume loads it again to the same bytes."""
    opts = ["--bin-size", "25", "--serial", "-q"]
    ref = tmp_path / "ref.pfm"
    r = pfm_cli("load", rsurvey, "-o", ref, *opts)
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out.pfm"
    r = pfm_cli("load", rsurvey, "-o", out, *opts, env={"PFM_DASK_CRASH_AT": "final-check"})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    assert J.read_journal(out)["phase"] == "loading"
    res = pipeline.run_load([], out, None, mode="serial", resume=True)
    assert res.exit_code == 0, res.summary()
    assert_same_pfm(out, ref, tmp_path)
    assert J.read_journal(out)["phase"] == "complete"


def test_partial_output_is_refused_naming_the_resume_command_which_works(rsurvey, reference,
                                                                          tmp_path):
    ref, _ = reference
    out = tmp_path / "part.pfm"
    r = crash_load(rsurvey, out, "piece:2", "--serial")
    assert r.returncode == -signal.SIGKILL
    # check: exit 1, incomplete, with the command
    c = pfm_cli("check", out)
    assert c.returncode == 1
    assert "incomplete" in c.stdout and "--resume" in c.stdout
    # the same command again without --resume: refused, naming the resume command
    again = pfm_cli("load", rsurvey, "-o", out, "--serial", *LOAD_OPTS)
    assert again.returncode == 2
    assert "unfinished load" in again.stderr
    cmd = resume_command_in(again.stderr)
    # the run options, not the inputs or settings (the journal has those); absolute paths
    assert "--serial" in cmd and "--area-filter" not in cmd and str(rsurvey) not in cmd
    assert cmd[cmd.index("-o") + 1] == str(out.resolve())
    done = pfm_cli(*cmd)
    assert done.returncode == 0, done.stderr
    assert "resumed from phase loading" in done.stdout
    assert_same_pfm(out, ref, tmp_path)
    # a resume of a finished load does nothing and succeeds
    again = pfm_cli(*cmd)
    assert again.returncode == 0 and "already complete" in again.stdout


def test_resume_refuses_other_inputs_other_settings_and_changed_inputs(rsurvey, tmp_path):
    import shutil

    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs

    survey = tmp_path / "s"
    shutil.copytree(rsurvey, survey)
    out = tmp_path / "o.pfm"
    r = crash_load(survey, out, "piece:2", "--serial")
    assert r.returncode == -signal.SIGKILL
    files = [str(p) for p in expand_inputs([survey])]
    with pytest.raises(ConfigError, match="inputs differ"):
        pipeline.run_load(files[:2], out, None, mode="serial", resume=True)
    with pytest.raises(ConfigError, match="bin_size_m"):
        pipeline.run_load(files, out, LoadConfig(bin_size_m=10.0, area_filter=True,
                                                 deep_only=False, cellstd=1.5),
                          mode="serial", resume=True)
    with open(files[1], "ab") as fh:
        fh.write(b"\0" * 8)
    with pytest.raises(ConfigError, match="changed since the load started"):
        pipeline.run_load([], out, None, mode="serial", resume=True)


def test_a_journal_written_by_the_previous_version_still_resumes(rsurvey, reference, tmp_path):
    """The previous version kept ``max_window`` and ``batch_pings`` in the journal's settings
    (``load.json``); a load it left unfinished resumes, with or without the content options
    given again (which are compared with the journal's)."""
    import json

    ref, _ = reference
    for again in ([], LOAD_OPTS):
        out = tmp_path / f"old{len(again)}.pfm"
        r = crash_load(rsurvey, out, "piece:2", "--serial")
        assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
        static_path = J.journal_paths(out)["static"]
        static = json.loads(static_path.read_text())
        static["cfg"].update(max_window=16, batch_pings=2000)
        static_path.write_text(json.dumps(static))
        done = pfm_cli("load", "-o", out, "--resume", "--serial", *again)
        assert done.returncode == 0, done.stderr
        assert_same_pfm(out, ref, tmp_path / out.stem)


def test_resume_with_nothing_to_resume(rsurvey, tmp_path):
    out = tmp_path / "none.pfm"
    with pytest.raises(ConfigError, match="nothing to resume"):
        pipeline.run_load([], out, None, mode="serial", resume=True)
    # with its inputs, a resume of a load that never started simply starts it
    from pfm_dask.inputs import expand_inputs

    res = pipeline.run_load(expand_inputs([rsurvey]), out, None, mode="serial", resume=True)
    assert res.exit_code == 0
    # a PFM that is not a pfm-dask load in progress is not touched
    other = tmp_path / "other.pfm"
    from pfm_dask.bins import BinGrid

    pfm.create(other, BinGrid.from_mbr(0, 0, 0.01, 0.01, bin_size_m=100)).close()
    (Path(str(other) + ".data") / "other.pfm.lin").write_text("a line\n")
    with pytest.raises(ConfigError, match="no load journal"):
        pipeline.run_load([], other, None, mode="serial", resume=True)


def test_resume_refuses_a_damaged_area_filter_redo_file(rsurvey, tmp_path):
    """Killed while applying the area filter's result: a resume re-applies it from the redo
    file, which is verified whole (read in chunks) before anything is written from it."""
    from pfm_dask.errors import LoadError

    out = tmp_path / "out.pfm"
    r = crash_load(rsurvey, out, "area-filter-apply", "--serial")
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr)
    redo = J.journal_paths(out)["redo"]
    raw = bytearray(redo.read_bytes())
    assert len(raw) % 24 == 0 and raw
    raw[len(raw) // 2] ^= 0xFF
    redo.write_bytes(bytes(raw))
    with pytest.raises(LoadError, match="checksum"):
        pipeline.run_load([], out, None, mode="serial", resume=True)


def test_a_long_load_fsyncs_its_parts_beside_its_final_check(rsurvey, tmp_path, monkeypatch):
    """Every load, short or long, makes its parts durable (the recompute rewrote the .bin) on
    a thread of its own while its final check reads them (_writer_journal.Beside); the journal
    says "complete" only once both are done (a new load without the area filter: "loading"
    meanwhile; with it, "filtered", or "area-filter" while "filtered" is still being made
    durable beside the recompute)."""
    import threading

    from pfm_dask import writer as W

    seen = []
    real = W.PfmWriter._close_durable

    def close(self):
        seen.append((threading.current_thread().name, J.read_journal(self.path)["phase"]))
        real(self)

    monkeypatch.setattr(W.PfmWriter, "_close_durable", close)
    for area, phases in ((False, {"loading"}), (True, {"area-filter", "filtered"})):
        seen.clear()
        out = tmp_path / f"long-{area}.pfm"
        res = pipeline.run_load(expand_inputs([rsurvey]), out,
                                LoadConfig(bin_size_m=25.0, area_filter=area),
                                mode="serial", checkpoint_seconds=0, quiet=True)
        assert res.exit_code == 0, res.summary()
        assert len(seen) == 1 and seen[0][0] == "pfm-sync" and seen[0][1] in phases, seen
        assert J.read_journal(out)["phase"] == "complete"


def test_a_long_load_failing_in_its_final_step_redoes_it_from_its_last_checkpoint(
        rsurvey, tmp_path, monkeypatch):
    """A new load without the area filter takes no checkpoint in its final step
    (PfmWriter._final_step_redone): failing there after its recompute rewrote every bin, it
    resumes from the last checkpoint of its loading phase (here after 2 of 4 pieces), writes
    the pieces after it again over records the recompute had rewritten, and ends with the
    bytes of an uninterrupted load."""
    from pfm_dask import _writer_journal, writer as W

    monkeypatch.setenv("PFM_DASK_GROUP_BYTES", "1")
    cfg = LoadConfig(bin_size_m=25.0)
    paths = expand_inputs([rsurvey])
    ref = tmp_path / "ref.pfm"
    assert pipeline.run_load(paths, ref, cfg, mode="serial", quiet=True).exit_code == 0

    real_ckpt = _writer_journal.WriterJournal._checkpoint

    def checkpoints_up_to_piece_2(self, phase=None, **kw):
        if kw.get("behind") and self._next > 2:
            return
        return real_ckpt(self, phase, **kw)

    real_recompute = W.pfm.recompute
    real_tiles = W._tiles.TileRecompute.finish

    def recompute_then_fail(*a, **kw):
        real_recompute(*a, **kw)           # every bin's statistics rewritten, then a failure
        raise OSError("the disk went away")

    def tiles_then_fail(*a, **kw):         # the same when tiles were recomputed while loading
        real_tiles(*a, **kw)
        raise OSError("the disk went away")

    monkeypatch.setattr(_writer_journal.WriterJournal, "_checkpoint", checkpoints_up_to_piece_2)
    monkeypatch.setattr(W.pfm, "recompute", recompute_then_fail)
    monkeypatch.setattr(W._tiles.TileRecompute, "finish", tiles_then_fail)
    out = tmp_path / "out.pfm"
    try:
        res = pipeline.run_load(paths, out, cfg, mode="serial", checkpoint_seconds=0, quiet=True)
        assert res.exit_code != 0
    except OSError:
        pass
    state = J.read_journal(out)
    assert (state["phase"], state["watermark"]) == ("loading", 2)
    monkeypatch.undo()
    monkeypatch.setenv("PFM_DASK_GROUP_BYTES", "1")
    res = pipeline.run_load([], out, None, mode="serial", resume=True, quiet=True)
    assert res.exit_code == 0, res.summary()
    assert res.resumed_from["phase"] == "loading"
    assert_same_pfm(out, ref, tmp_path)
