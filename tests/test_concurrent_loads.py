"""Two hydrographers, one shared Dask scheduler: two ``pfm-dask load --scheduler`` driver
processes (two Clients) at the same time.

To different outputs, each PFM is its own load's: byte-identical to the same inputs loaded
``--serial`` (an independent reference: no Dask) and sound. To the same output, exactly one
load writes it; the other is refused (exit 2, one line naming the path) and leaves the
winner's PFM whole: byte-identical to the winner's serial reference, never a mix.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pfm_dask import pipeline
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

from .test_resume import assert_same_pfm, pfm_cli

TREE = Path(__file__).resolve().parents[1]
OPTS = ["--bin-size", "25", "-q"]


@pytest.fixture(scope="module")
def surveys(tmp_path_factory) -> dict:
    """Two small synthetic surveys in different places: {name: folder}."""
    from pfm_dask import synth

    root = tmp_path_factory.mktemp("concurrent")
    out = {}
    for name, seed, lon in (("north", 4, -123.0), ("south", 5, -122.9)):
        out[name] = root / name
        synth.generate(out[name], files=4, pings=300, beams=128, seed=seed, longitude=lon)
    return out


@pytest.fixture(scope="module")
def references(surveys, tmp_path_factory) -> dict:
    """Each survey loaded ``--serial`` (no Dask): {name: PFM path}."""
    root = tmp_path_factory.mktemp("concurrent-ref")
    refs = {}
    for name, folder in surveys.items():
        refs[name] = root / f"{name}.pfm"
        res = pipeline.run_load(expand_inputs([folder]), refs[name], LoadConfig(bin_size_m=25.0),
                                mode="serial")
        assert res.exit_code == 0
    return refs


@pytest.fixture(scope="module")
def scheduler():
    """A cluster of worker processes (one also holds ``disk``, both ``compute``): its address."""
    from distributed import Client

    from pfm_dask.cluster import make_local_cluster

    with make_local_cluster(2, layout="processes") as cluster, Client(cluster) as client:
        client.wait_for_workers(2, timeout=60)
        yield cluster.scheduler_address


def _start(folder: Path, out: Path, address: str) -> subprocess.Popen:
    """A driver process: ``pfm-dask load FOLDER -o OUT --scheduler ADDRESS`` from /tmp."""
    env = {**os.environ, "PYTHONPATH": str(TREE)}
    return subprocess.Popen([sys.executable, "-m", "pfm_dask.cli", "load", str(folder), "-o",
                             str(out), *OPTS, "--scheduler", address], cwd="/tmp", env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _both(*procs: subprocess.Popen) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of each process, once all have ended."""
    outputs = [p.communicate(timeout=120) for p in procs]
    return [(p.returncode, *o) for p, o in zip(procs, outputs)]


def _report(out: Path) -> dict:
    return json.loads((Path(str(out) + ".data") / "load-report.json").read_text())


def _span(out: Path) -> tuple[float, float]:
    """When the load of ``out`` planned (``load.json``) and when it completed (its journal)."""
    data = Path(str(out) + ".data")
    return (json.loads((data / "load.json").read_text())["created"],
            json.loads((data / "journal.json").read_text())["time"])


def _error_line(stderr: str, out: Path) -> str:
    """The one ``pfm-dask: error:`` line, which names ``out``; no traceback."""
    errors = [ln for ln in stderr.splitlines() if ln.startswith("pfm-dask: error:")]
    assert len(errors) == 1 and str(out) in errors[0] and "Traceback" not in stderr, stderr
    return errors[0]


@pytest.mark.cluster
def test_two_drivers_load_two_outputs_at_once(scheduler, surveys, references, tmp_path):
    outs = {name: tmp_path / f"{name}.pfm" for name in surveys}
    procs = {name: _start(surveys[name], outs[name], scheduler) for name in surveys}
    results = dict(zip(procs, _both(*procs.values())))
    for name, (rc, _, err) in results.items():
        assert rc == 0, f"{name}: {err}"
    for name, out in outs.items():
        report = _report(out)
        assert report["pfm"] == str(out)
        assert report["check"]["sound"], report["check"]
        assert [Path(f["path"]).parent for f in report["files"]] == [surveys[name]] * 4
        assert_same_pfm(out, references[name], tmp_path / f"cmp-{name}")
    spans = [_span(out) for out in outs.values()]
    assert max(a for a, _ in spans) < min(b for _, b in spans), f"not at once: {spans}"


@pytest.mark.cluster
def test_two_drivers_to_one_output_one_wins_the_other_is_refused(scheduler, surveys,
                                                                 references, tmp_path):
    out = tmp_path / "same.pfm"
    procs = {name: _start(surveys[name], out, scheduler) for name in surveys}
    results = dict(zip(procs, _both(*procs.values())))
    codes = sorted(rc for rc, _, _ in results.values())
    assert codes == [0, 2], {n: (rc, err) for n, (rc, _, err) in results.items()}
    winner = next(n for n, (rc, _, _) in results.items() if rc == 0)
    _, _, refused = next(r for r in results.values() if r[0] == 2)
    _error_line(refused, out)
    report = _report(out)
    assert report["pfm"] == str(out)
    assert [Path(f["path"]).parent for f in report["files"]] == [surveys[winner]] * 4
    assert_same_pfm(out, references[winner], tmp_path / "cmp")


def test_a_load_to_an_output_another_load_is_writing_is_refused_at_once(surveys, references,
                                                                          tmp_path):
    """The second driver starts once the first one's writer holds the PFM (paused after its
    first piece): it must not call that load "unfinished", offer to resume or remove it, or
    wait; it is refused at once, and the first load ends as its serial reference."""
    out = tmp_path / "busy.pfm"
    started, go, result = threading.Event(), threading.Event(), {}

    def pause(status: dict) -> None:
        started.set()
        go.wait(60)

    def first() -> None:
        result["res"] = pipeline.run_load(expand_inputs([surveys["north"]]), out,
                                          LoadConfig(bin_size_m=25.0), mode="serial",
                                          progress=pause)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert started.wait(60)
        for extra in ([], ["--append"]):
            r = pfm_cli("load", surveys["south"], "-o", out, *OPTS, "--serial", *extra,
                        timeout=60)
            assert r.returncode == 2, r.stderr
            line = _error_line(r.stderr, out)
            assert "another load is writing" in line and "remove" not in line, line
    finally:
        go.set()
        thread.join(120)
    assert result["res"].exit_code == 0
    assert_same_pfm(out, references["north"], tmp_path / "cmp")
