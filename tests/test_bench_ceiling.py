"""The ceiling benchmark: its replay writes what a load writes, and its ``--quick`` path runs.

No timing is asserted (the machine running the tests may be busy).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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
