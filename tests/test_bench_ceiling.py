"""The ceiling benchmark: its replay writes what a load writes, and its ``--quick`` path runs.

No timing is asserted (the machine running the tests may be busy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from pfm_dask import pipeline, synth
from pfm_dask.config import LoadConfig, SwathFilterConfig
from pfm_dask.inputs import expand_inputs

ROOT = Path(__file__).resolve().parent.parent


def _parts(pfm: Path) -> dict:
    data = Path(str(pfm) + ".data")
    out = {}
    for part in (".ndx", ".bin", ".lin"):
        b = (data / f"{pfm.name}{part}").read_bytes()
        out[part] = b[131072:] if part == ".bin" else b  # the .bin header holds the date
    return out


def test_replayed_pieces_make_the_serial_pfm(tmp_path):
    """Pieces recorded and replayed into a fresh writer give the bytes a --serial load
    writes (both filters on, so the area filter runs in the replay's final step too)."""
    from benchmarks.bench_ceiling import record, replay

    synth.generate(tmp_path / "gsf", files=3, pings=30, beams=64, seed=5)
    files = [str(p) for p in expand_inputs([tmp_path / "gsf"])]
    cfg = LoadConfig(bin_size_m=25.0, area_filter=True, swath=SwathFilterConfig(enabled=True))
    ser = pipeline.run_load(files, tmp_path / "serial.pfm", cfg, mode="serial")
    assert ser.exit_code == 0
    rec = record(files, cfg)
    assert len(rec["prepared"]) == len(rec["pieces"]) >= 3
    r = replay(rec, files, cfg, tmp_path / "replay.pfm", threads=2, keep=True)
    assert r["soundings_written"] == rec["soundings"] == ser.totals["loaded"]
    assert r["writer_busy_s"] > 0 and r["final_phases_s"]["area_filter"] > 0
    assert _parts(tmp_path / "replay.pfm") == _parts(tmp_path / "serial.pfm")


def test_quick_run_writes_results_and_markdown(tmp_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_ceiling", "--quick",
                           "--results-dir", str(tmp_path / "results"),
                           "--data-dir", str(tmp_path / "data"), "--work", str(tmp_path / "work")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((tmp_path / "results" / "bench_ceiling_quick.json").read_text())["results"]
    assert set(r["setups"]) == {"none", "swath", "area", "both"}
    assert r["disk"]["write_mb_per_s"] > 0
    for setup, cell in r["setups"].items():
        assert set(cell["replays"]) == {"1", "2"}, setup
        assert cell["ceiling_speedup"] > 0 and cell["serial_s"] > 0
        for rep in cell["replays"].values():
            assert rep["soundings_written"] == cell["soundings"] > 0
            assert 0 < rep["writer_busy_of_disk_write"]
    assert r["setups"]["none"]["serial_measured"]
    for cell in r["setups"].values():   # the disk's bound: the replay cannot beat it
        assert cell["disk_bound_speedup"] >= cell["disk_bound_with_final_speedup"] > 0
    from benchmarks.bench_ceiling import markdown

    md = markdown(tmp_path / "results", names=("bench_ceiling_quick",))
    assert "ceiling speedup" in md and "| swath and area filters |" in md
    assert "What the disk allows whatever the writer" in md
    assert "GB of page cache at the end" in md
    assert "taken back" not in md            # --quick measures no settled write
    rep = r["setups"]["none"]["replays"]["2"]
    # recorded (a quick replay may take less CPU than os.times counts: its ticks are 10 ms)
    assert rep["replay_user_s"] >= 0 and rep["replay_system_s"] >= 0
    assert "reported_mib_during_replay" in rep

    # a run on a VM that reports free pages: the writer against the write into taken-back pages
    path = tmp_path / "results" / "bench_ceiling_quick.json"
    doc = json.loads(path.read_text())
    doc["results"]["disk"]["write_settled_mb_per_s"] = 400.0
    for i, cell in enumerate(doc["results"]["setups"].values()):
        cell["replays"]["2"]["writer_busy_of_settled_write"] = 0.8 + 0.01 * i
    path.write_text(json.dumps(doc))
    md = markdown(tmp_path / "results", names=("bench_ceiling_quick",))
    assert "400 MB/s into pages the VM's host had taken back" in md
    assert "the writer's busy rate is 80-83 % of the latter" in md
    doc["results"]["disk"]["write_direct_mb_per_s"] = 2500.0
    path.write_text(json.dumps(doc))
    md = markdown(tmp_path / "results", names=("bench_ceiling_quick",))
    assert "past the page cache (`O_DIRECT`) 2,500 MB/s" in md


def test_disk_bound_is_serial_over_the_raw_write_of_the_pfm():
    """3,000 MB at 1,500 MB/s is 2 s: a 16 s `--serial` load can go at most 8x faster, 6.4x
    with a final step of 0.5 s."""
    from benchmarks.bench_ceiling import disk_bound

    cell = {"serial_s": 16.0, "ceiling_threads": 2,
            "replays": {"2": {"pfm_bytes": 3_000_000_000, "final_s": 0.5}}}
    disk_bound(cell, 1500.0)
    assert cell["disk_write_s"] == 2.0
    assert cell["disk_bound_speedup"] == 8.0
    assert abs(cell["disk_bound_with_final_speedup"] - 6.4) < 1e-12


def test_results_list_the_few_large_files_shape(tmp_path):
    """bench_load's second shape (few large files) gets its own line in RESULTS.md."""
    from benchmarks.report_md import _others

    (tmp_path / "bench_load_few_large.json").write_text(json.dumps({"results": {
        "speedup_2_workers": 1.62, "speedup_1_worker": 1.1, "files": 8, "gsf_bytes": 3.0e8}}))
    assert ("- `bench_load_few_large.json`: bench_load --shape few-large: 1.62x with 2 workers "
            "(1.10x with 1) on 8 files of 38 MB, no filter") in _others(tmp_path)


def test_settle_pages_waits_until_the_reported_count_stops(tmp_path, monkeypatch):
    """The count grows for a while (the host taking freed memory back), then stands still:
    the wait ends ``quiet_s`` after its last change, and at once on a machine without it."""
    import threading

    from benchmarks import disk

    count = tmp_path / "reported_kib"
    count.write_text("100\n")
    monkeypatch.setattr(disk, "REPORTED_KIB", count)
    assert disk.reported_kib() == 100

    def grow():
        for k in range(4):
            time.sleep(0.1)
            (tmp_path / "next").write_text(f"{200 + k}\n")
            os.replace(tmp_path / "next", count)
    th = threading.Thread(target=grow)
    th.start()
    waited = disk.settle_pages(quiet_s=0.5, timeout_s=10.0, poll_s=0.05)
    th.join()
    assert 0.8 <= waited < 5.0 and disk.reported_kib() == 203

    monkeypatch.setattr(disk, "REPORTED_KIB", tmp_path / "absent")
    assert disk.reported_kib() is None and disk.settle_pages() == 0.0


def test_disk_measures_the_settled_write_only_where_pages_are_reported(tmp_path, monkeypatch):
    from benchmarks import disk

    monkeypatch.setattr(disk, "REPORTED_KIB", tmp_path / "absent")
    plain = disk.sequential_bandwidth(tmp_path / "a", 1 << 20, runs=1)
    assert plain["write_mb_per_s"] > 0 and "write_settled_mb_per_s" not in plain

    count = tmp_path / "reported_kib"
    count.write_text("7\n")
    monkeypatch.setattr(disk, "REPORTED_KIB", count)
    monkeypatch.setattr(disk, "settle_pages", lambda: 0.0)
    got = disk.sequential_bandwidth(tmp_path / "b", 1 << 20, runs=1)
    assert got["write_settled_mb_per_s"] > 0 and got["reported_kib_during_write"] == 0
    assert not any((tmp_path / "b").iterdir())        # its file is gone
    assert "write_settled_mb_per_s" not in disk.sequential_bandwidth(tmp_path / "c", 1 << 20,
                                                                     runs=1, settled=False)


def test_disk_measures_a_write_past_the_page_cache(tmp_path):
    """The ``O_DIRECT`` write writes whole 4 KiB blocks of the size asked, from a page-aligned
    buffer; ``sequential_bandwidth`` reports its rate and leaves no file behind."""
    from benchmarks import disk

    got = disk._write_direct(tmp_path / "f", (1 << 20) + 1000)
    res = disk.sequential_bandwidth(tmp_path / "d", 1 << 20, runs=2, settled=False)
    assert not any((tmp_path / "d").iterdir())
    if got is None:      # a file system that refuses O_DIRECT: no figure, rather than a wrong one
        assert "write_direct_mb_per_s" not in res
        return
    t, n = got
    assert n == 1 << 20 and (tmp_path / "f").stat().st_size == 1 << 20 and t > 0
    assert res["write_direct_mb_per_s"] > 0 and len(res["write_direct_s"]) == 2
