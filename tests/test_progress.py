"""The load's progress display (issue 20): 80 columns, ends at 100 %, shows the final step's
phases, plain log lines every five seconds off a terminal and with --json, no ``(0/s)``."""

from __future__ import annotations

import io
import json
import re
import time

import pytest
from typer.testing import CliRunner

from pfm_dask import cluster as cluster_mod, synth
from pfm_dask.cli import app
from pfm_dask.progress import WIDTH, Progress, follow, live_lines, plain_line


def status(**kw) -> dict:
    st = {"phase": "loading", "watermark": 0, "pieces_total": 40, "files_done": 0,
          "files_total": 8, "soundings_written": 0, "soundings_per_second": 0.0,
          "backlog_batches": 0, "backlog_bytes": 0, "elapsed": 0.0}
    st.update(kw)
    return st


HUGE = status(watermark=987_654, pieces_total=1_234_567, files_done=123_456,
              files_total=234_567, soundings_written=98_765_432_109_876,
              soundings_per_second=123_456_789.0, backlog_batches=12_345,
              backlog_bytes=987 * 2**30, elapsed=123 * 3600 + 59)


@pytest.mark.parametrize("st", [
    status(), HUGE, {**HUGE, "phase": "area filter"}, {**HUGE, "phase": "recompute"},
    {**HUGE, "phase": "check"}, {**HUGE, "phase": "done"}, {**HUGE, "phase": "aborted"}],
    ids=["start", "huge", "area filter", "recompute", "check", "done", "aborted"])
def test_live_lines_fit_80_columns(st):
    lines = live_lines(st, {"loading", "area filter"})
    assert len(lines) == 2 and all(len(ln) <= WIDTH for ln in lines), lines
    # nothing cut off at 80 columns: the last field of each line is whole
    assert re.search(r"files [0-9.,]+( k)?/[0-9.,]+( k)?$", lines[0]), lines[0]
    assert re.search(r"(elapsed|left)$", lines[1]), lines[1]


def test_live_lines_name_the_final_steps_and_end_at_100():
    first, second = live_lines(status(phase="recompute", watermark=40), {"loading", "area filter"})
    assert first.startswith("recompute") and "100%" in first
    assert "area filter > [recompute] > check" in second
    first, second = live_lines(status(phase="check", watermark=40), {"loading", "recompute"})
    assert "final step: recompute > [check]" in second
    first, _ = live_lines(status(phase="done", watermark=40, files_done=8))
    assert first.startswith("done") and "100%" in first and "files 8/8" in first


def test_no_rate_before_one_is_measured():
    for text in (plain_line(status()), *live_lines(status())):
        assert "/s" not in text, text
    assert "(12,345/s)" in plain_line(status(soundings_per_second=12_345.4))
    assert "12,345/s" in live_lines(status(soundings_per_second=12_345.4))[1]


def test_plain_lines_every_five_seconds_at_each_phase_and_at_the_end():
    now = [0.0]
    out = io.StringIO()
    prog = Progress(True, True, stream=out, clock=lambda: now[0])
    for i in range(40):                  # a status every half second for 20 s
        prog(status(watermark=i, elapsed=now[0], soundings_written=1000 * i))
        now[0] += 0.5
    for phase in ("area filter", "recompute", "check"):
        prog(status(phase=phase, watermark=40, elapsed=now[0]))
    prog.close(status(phase="done", watermark=40, files_done=8, elapsed=now[0]))
    lines = out.getvalue().splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["loading"] * 4 + [
        "area filter", "recompute", "check", "done"], lines
    assert lines[-1].startswith("done: 100%  files 8/8  pieces 40/40"), lines[-1]


def test_a_live_display_ends_on_the_final_status_within_80_columns():
    out = io.StringIO()
    prog = Progress(True, False, stream=out, live=True)
    prog(HUGE)
    prog.close({**HUGE, "phase": "done", "watermark": HUGE["pieces_total"]})
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines and all(len(ln) <= WIDTH for ln in lines), lines
    assert lines[-2].startswith("done") and "100%" in lines[-2], lines


def test_follow_polls_until_the_body_ends():
    seen = []
    with follow(lambda: {"phase": "recompute"}, seen.append, every=0.05):
        time.sleep(0.3)
    n = len(seen)
    time.sleep(0.15)
    assert n >= 2 and len(seen) == n


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    root = tmp_path_factory.mktemp("prog")
    synth.generate(root, files=2, pings=20, beams=32, seed=2)
    return root


def test_a_load_logs_its_final_phases_and_ends_at_100(survey, tmp_path, monkeypatch):
    """--json (and any run off a terminal): plain lines on stderr for the area filter, the
    recompute and the check (slowed here to outlast the half-second poll), and a last line at
    100 %; the report alone on stdout."""
    from pfm_dask import pfm, writer

    for name in ("recompute", "check"):
        real = getattr(pfm, name)

        def slow(*a, _real=real, **kw):
            time.sleep(1.2)
            return _real(*a, **kw)

        monkeypatch.setattr(writer.pfm, name, slow)
    r = CliRunner().invoke(app, ["load", str(survey), "-o", str(tmp_path / "p.pfm"), "--serial",
                                 "--bin-size", "25", "--area-filter", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["check"]["sound"]
    phases = [ln.split(":")[0] for ln in r.stderr.splitlines() if re.match(r"^[a-z ]+: \d+%", ln)]
    assert phases[0] == "loading" and phases[-1] == "done", r.stderr
    assert {"recompute", "check"} <= set(phases), r.stderr
    last = [ln for ln in r.stderr.splitlines() if ln.startswith("done: ")][-1]
    assert last.startswith("done: 100%  files 2/2"), last


def test_a_dask_load_relays_the_final_phases(survey, tmp_path, monkeypatch):
    """On Dask the writer actor is busy finishing: its published statuses reach the progress,
    and the last one given is the finished load's."""
    from distributed import Client

    from pfm_dask import pfm, pipeline, writer
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs

    real = pfm.recompute

    def slow(*a, **kw):
        time.sleep(1.5)
        return real(*a, **kw)

    monkeypatch.setattr(writer.pfm, "recompute", slow)
    seen: list[dict] = []
    with cluster_mod.make_local_cluster(2, processes=False) as cluster, Client(cluster) as client:
        res = pipeline.run_load(expand_inputs([survey]), tmp_path / "d.pfm",
                                LoadConfig(bin_size_m=25.0), mode="scheduler", client=client,
                                progress=seen.append)
    assert res.exit_code == 0
    assert "recompute" in [st.get("phase") for st in seen]
    assert seen[-1]["phase"] == "done" and seen[-1]["watermark"] == seen[-1]["pieces_total"]


def test_two_dask_loads_at_once_each_relay_only_their_own_writer(survey, tmp_path, monkeypatch):
    """The writers' statuses go out on one topic of the whole cluster: two loads finishing at
    once on one scheduler (two clients, as two drivers) must each show only their own."""
    import threading

    from distributed import Client

    from pfm_dask import pfm, pipeline, writer
    from pfm_dask.config import LoadConfig
    from pfm_dask.inputs import expand_inputs

    real = pfm.recompute

    def slow(*a, **kw):
        time.sleep(1.5)
        return real(*a, **kw)

    monkeypatch.setattr(writer.pfm, "recompute", slow)
    outs = [tmp_path / "a.pfm", tmp_path / "b.pfm"]
    seen: dict = {str(out): [] for out in outs}
    codes: dict = {}
    with cluster_mod.make_local_cluster(2, processes=False) as cluster:
        def load(out) -> None:
            with Client(cluster) as client:
                codes[str(out)] = pipeline.run_load(
                    expand_inputs([survey]), out, LoadConfig(bin_size_m=25.0), mode="scheduler",
                    client=client, progress=seen[str(out)].append).exit_code

        threads = [threading.Thread(target=load, args=(out,)) for out in outs]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert codes == {str(out): 0 for out in outs}
    for out, statuses in seen.items():
        published = [st["pfm"] for st in statuses if "pfm" in st]
        assert published and set(published) == {out}, (out, set(published))
