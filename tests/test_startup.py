"""Start-up and the default mode: a small load runs in the driver's process (no cluster) and
writes what a cluster writes; the quick commands import neither Dask nor numba."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pfm_dask import pipeline
from pfm_dask.config import LoadConfig, SwathFilterConfig

# Runs the command line as the console script does, then says which heavy packages it imported.
_RUN_CLI = ("import atexit, sys\n"
            "atexit.register(lambda: print('IMPORTED', ' '.join(sorted(m for m in sys.modules "
            "if m.split('.')[0] in ('dask', 'distributed', 'numba', 'llvmlite', 'typer', 'click') "
            "or m == 'pyarrow.compute')), "
            "file=sys.stderr))\n"
            "sys.argv[0] = 'pfm-dask'\n"
            "from pfm_dask.cli import main\n"
            "main()\n")


def _cli(*args) -> tuple[subprocess.CompletedProcess, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", _RUN_CLI, *map(str, args)], capture_output=True,
                       text=True, timeout=300, env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("IMPORTED")]
    assert lines, r.stderr
    return r, set(lines[-1].split()[1:])


def _tops(modules: set[str]) -> set[str]:
    return {m.split(".")[0] for m in modules}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from pfm_dask import synth

    out = tmp_path_factory.mktemp("tiny")
    synth.generate(out, files=2, pings=50, beams=96, seed=5)
    return out


def _parts(out: Path) -> dict[str, bytes]:
    data = Path(str(out) + ".data")
    parts = {p: (data / f"{out.name}{p}").read_bytes() for p in (".ndx", ".bin", ".lin")}
    parts[".bin"] = parts[".bin"][131072:]  # the header holds the creation date
    return parts


@pytest.mark.cluster
def test_tiny_load_by_default_starts_no_cluster_and_writes_what_two_workers_write(tiny, tmp_path):
    auto, two = tmp_path / "auto.pfm", tmp_path / "two.pfm"
    r, imported = _cli("load", tiny, "-o", auto, "--bin-size", "25", "--area-filter")
    assert r.returncode == 0, r.stderr
    said = [ln for ln in r.stderr.splitlines() if "no cluster" in ln]
    assert len(said) == 1 and "MB of input: loading in this process" in said[0], r.stderr
    assert not _tops(imported) & {"dask", "distributed"}, imported
    assert "pyarrow.compute" not in imported, imported   # 0.07 CPU-s of a small load
    rep = json.loads((Path(str(auto) + ".data") / "load-report.json").read_text())
    assert rep["mode"] == "serial" and rep["check"]["sound"]

    r2, imported2 = _cli("load", tiny, "-o", two, "--bin-size", "25", "--area-filter",
                         "--workers", "2", "-q")
    assert r2.returncode == 0, r2.stderr
    assert "distributed" in _tops(imported2)
    rep2 = json.loads((Path(str(two) + ".data") / "load-report.json").read_text())
    assert rep2["mode"].startswith("local (2 workers)")
    assert _parts(auto) == _parts(two)


def _sized(tmp_path: Path, name: str, size: int) -> str:
    p = tmp_path / name
    with open(p, "wb") as fh:
        fh.truncate(size)  # sparse: only the size matters to the choice
    return str(p)


def test_auto_mode_is_serial_below_the_threshold_and_a_cluster_above(tmp_path):
    plain, swath = LoadConfig(), LoadConfig(swath=SwathFilterConfig(enabled=True))
    small = [_sized(tmp_path, f"s{i}.gsf", pipeline.SMALL_LOAD_BYTES_SWATH // 4) for i in range(3)]
    assert pipeline.auto_mode(small, plain) == ("serial", 3 * (pipeline.SMALL_LOAD_BYTES_SWATH // 4))
    assert pipeline.auto_mode(small, swath)[0] == "serial"
    small.append(_sized(tmp_path, "s3.gsf", pipeline.SMALL_LOAD_BYTES_SWATH // 4))
    assert pipeline.auto_mode(small, swath)[0] == "local"   # the swath filter parallelises
    assert pipeline.auto_mode(small, plain)[0] == "serial"
    big = [_sized(tmp_path, "big.gsf", pipeline.SMALL_LOAD_BYTES)]
    assert pipeline.auto_mode(big, plain)[0] == "local"
    # a missing file counts for nothing here (the pre-scan reports it, in any mode)
    assert pipeline.auto_mode([str(tmp_path / "missing.gsf")], plain) == ("serial", 0)


@pytest.fixture(scope="module")
def small_pfm(tiny, tmp_path_factory):
    out = tmp_path_factory.mktemp("small") / "small.pfm"
    from pfm_dask.inputs import expand_inputs

    res = pipeline.run_load(expand_inputs([tiny]), out, LoadConfig(bin_size_m=25.0), mode="serial")
    assert res.exit_code == 0, res.summary()
    return out


def test_cli_import_and_quick_commands_load_no_dask_numba_or_pydantic(tiny, small_pfm):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", "import sys, pfm_dask.cli; print(' '.join(sorted("
                        "{m.split('.')[0] for m in sys.modules})))"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert not set(r.stdout.split()) & {"dask", "distributed", "numba", "pydantic", "typer",
                                        "click"}
    gsf_file = sorted(Path(tiny).glob("*.gsf"))[0]
    for args in (["info", small_pfm], ["info", small_pfm, "--json"], ["--help"],
                 ["load", "--help"]):
        r, imported = _cli(*args)
        assert r.returncode == 0, (args, r.stderr)
        assert not _tops(imported) & {"dask", "distributed", "numba", "llvmlite"}, (args, imported)
        if args[0] == "info":  # answered without typer (pfm_dask.cli._quick)
            assert not _tops(imported) & {"typer", "click"}, (args, imported)
    # gsf-info frames and walks in Python (gsf._summary): neither numba nor Dask nor typer
    r, imported = _cli("gsf-info", gsf_file)
    assert r.returncode == 0, r.stderr
    assert not _tops(imported) & {"dask", "distributed", "numba", "llvmlite", "typer",
                                  "click"}, imported
    r, imported = _cli("check", small_pfm)
    assert r.returncode == 0 and "sound" in r.stdout, r.stderr
    assert not _tops(imported) & {"dask", "distributed"}, imported


# Runs gsf-info as the console script does, then prints every module it imported.
_RUN_GSF_INFO = ("import atexit, json, sys\n"
                 "atexit.register(lambda: print(json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
                 "sys.argv[0] = 'pfm-dask'\n"
                 "from pfm_dask.cli import main\n"
                 "main()\n")


def test_gsf_info_imports_neither_numba_nor_dask_nor_typer_nor_arrow(sample_by_name):
    """gsf-info of a real sample (EM302: 73,748 records, 50 pings) frames and walks the file
    in Python (gsf._summary), so its start-up is Python and numpy: no numba, no Dask, no
    typer, no Arrow."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    path = sample_by_name("EM302")
    r = subprocess.run([sys.executable, "-c", _RUN_GSF_INFO, "gsf-info", str(path), "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["path"], out["n_pings"], out["damage"]) == (str(path), 50, [])
    modules = set(json.loads(r.stderr.splitlines()[-1]))
    heavy = {m.split(".")[0] for m in modules} & {"numba", "llvmlite", "dask", "distributed",
                                                   "typer", "click", "pyarrow"}
    assert not heavy, sorted(heavy)
    assert "pfm_dask.gsf._summary" in modules


def test_quick_info_and_gsf_info_answer_as_typer_does(tiny, small_pfm, tmp_path):
    """info and gsf-info without typer (pfm_dask.cli._quick): the same output and exit code as
    the typer commands, for results and for errors; anything else still goes to typer."""
    from typer.testing import CliRunner

    from pfm_dask import cli
    from pfm_dask.cli import app

    gsf_files = [str(p) for p in sorted(Path(tiny).glob("*.gsf"))]
    bad = tmp_path / "bad.gsf"
    bad.write_bytes(b"\0" * 100)
    cases = [["info", str(small_pfm)], ["info", "--json", str(small_pfm)],
             ["info", str(small_pfm), "--force", "--json"], ["info", str(tmp_path / "none.pfm")],
             ["gsf-info", *gsf_files], ["gsf-info", gsf_files[0], "--json"],
             ["gsf-info", "--json", *gsf_files], ["gsf-info", str(bad), gsf_files[0]],
             ["gsf-info", "--json", str(bad)], ["--version"]]
    for args in cases:
        typer_run = CliRunner().invoke(app, args)
        r, imported = _cli(*args)
        assert not _tops(imported) & {"typer", "click"}, (args, imported)
        assert (r.returncode, r.stdout) == (typer_run.exit_code, typer_run.stdout), args
        assert [ln for ln in r.stderr.splitlines() if not ln.startswith("IMPORTED")] == [
            ln for ln in typer_run.stderr.splitlines()], args
        assert r.returncode == (1 if str(bad) in args or "none.pfm" in args[-1] else 0), args
    for argv in (["info"], ["info", "--help"], ["info", "-v", "x.pfm"], ["info", "a", "b"],
                 ["gsf-info"], ["gsf-info", "--", "x.gsf"], ["load", "x.gsf"], [],
                 ["--version", "info"]):
        assert cli._quick(argv) is None, argv


def test_info_reads_the_same_with_and_without_numba(small_pfm):
    """info reads bin records with numpy until numba is imported: same figures either way."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    outs = []
    for pre in ("", "import numba; "):
        code = (pre + "import sys; sys.argv[0] = 'pfm-dask'; from pfm_dask.cli import main; "
                "main()")
        r = subprocess.run([sys.executable, "-c", code, "info", str(small_pfm), "--json"],
                           capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 0, r.stderr
        outs.append(json.loads(r.stdout))
    assert outs[0] == outs[1]
    assert outs[0]["counts"]["soundings"] > 0


def test_a_load_of_few_bins_checks_the_bins_it_wrote(tiny, tmp_path, monkeypatch):
    """A new load over a fine grid (pfm._recompute.scattered) hands its final check the bins
    it wrote (check's ``only``), which are every bin with soundings; its verdict is the full
    check's, and a planted stale statistic in one of them fails it as the full check does."""
    from pfm_dask import pfm as P
    from pfm_dask.inputs import expand_inputs

    seen = []
    check = P.check

    def spy(path, **kw):
        seen.append(kw.get("only"))
        return check(path, **kw)

    monkeypatch.setattr(P, "check", spy)
    out = tmp_path / "fine.pfm"
    res = pipeline.run_load(expand_inputs([tiny]), out, LoadConfig(bin_size_m=2.0), mode="serial")
    assert res.exit_code == 0 and res.check["sound"], res.summary()
    assert len(seen) == 1 and seen[0] is not None
    with P.open_pfm(out) as f:
        recs = f.read_bin_records(0, f.height, fields=("num_soundings",))
        with_data = np.sort(recs["bin_index"][recs["num_soundings"] > 0])
        bs, hs, n_bins = f.bin_record_size, f.bin_header_size, f.width * f.height
    assert n_bins > 64 * with_data.size
    assert np.array_equal(np.sort(seen[0]), with_data)
    assert check(out) == []
    # a byte of the stats of a bin the load wrote, changed: both checks say the same
    b = int(with_data[with_data.size // 2])
    with open(Path(str(out) + ".data") / "fine.pfm.bin", "r+b") as fh:
        fh.seek(hs + b * bs + 4)
        byte = fh.read(1)[0]
        fh.seek(hs + b * bs + 4)
        fh.write(bytes([byte ^ 0x10]))
    full = check(out)
    assert full and check(out, only=seen[0]) == full


def test_the_console_scripts_load_ends_with_its_code_and_its_output(tiny, tmp_path):
    """A load's (and a check's) process ends without the interpreter's teardown
    (cli._exit_now): its exit handlers still run (the IMPORTED line), its output is all
    there, its exit code is the command's, and its PFM is the one an in-process load writes."""
    from pfm_dask.inputs import expand_inputs

    out = tmp_path / "cli.pfm"
    r, _ = _cli("load", tiny, "-o", out, "--bin-size", "25", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["check"]["sound"]
    ref = tmp_path / "ref.pfm"
    res = pipeline.run_load(expand_inputs([tiny]), ref, LoadConfig(bin_size_m=25.0), mode="serial")
    assert res.exit_code == 0
    assert _parts(out) == _parts(ref)
    r, _ = _cli("load", tmp_path / "missing.gsf", "-o", tmp_path / "m.pfm")
    assert r.returncode == 2 and "missing.gsf" in r.stderr, r.stderr
    # check ends the same way: its verdict printed, its exit code
    r, _ = _cli("check", out, "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["sound"] is True, (r.stdout, r.stderr)
    with (Path(str(out) + ".data") / "cli.pfm.ndx").open("ab") as fh:
        fh.write(b"\0" * 64)
    r, _ = _cli("check", out)
    assert r.returncode == 1 and ".ndx" in r.stdout, (r.stdout, r.stderr)


def test_a_load_collects_garbage_after_its_first_second_and_a_forked_child_at_once():
    """cli._collect_later: the collector off at first, on again after GC_AFTER_S (the
    survivors frozen), and on in a process forked meanwhile (it has no timer)."""
    code = ("import gc, os, sys, time\n"
            "from pfm_dask import cli\n"
            "cli.GC_AFTER_S = 0.2\n"
            "cli._collect_later()\n"
            "assert not gc.isenabled()\n"
            "r, w = os.pipe()\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.write(w, b'1' if gc.isenabled() else b'0')\n"
            "    os._exit(0)\n"
            "os.waitpid(pid, 0)\n"
            "assert os.read(r, 1) == b'1'\n"
            "time.sleep(1.0)\n"
            "assert gc.isenabled() and gc.get_freeze_count() > 0\n"
            "print('ok')\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=env)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_plain_values_keep_typer_checks_and_wording():
    """The command line's own coercion (no pydantic): numbers, tuples, lists and paths."""
    from typer.testing import CliRunner

    from pfm_dask.cli import app

    r = CliRunner().invoke(app, ["load", "x.gsf", "-o", "o.pfm", "--bin-size", "abc"])
    assert r.exit_code == 2 and "Input should be a valid number" in r.output
    r = CliRunner().invoke(app, ["load", "x.gsf", "-o", "o.pfm", "--workers", "2.5"])
    assert r.exit_code == 2 and "Input should be a valid integer" in r.output
    r = CliRunner().invoke(app, ["load", "x.gsf", "-o", "o.pfm", "--mbr", "1", "2", "3", "x"])
    assert r.exit_code == 2 and "--mbr" in r.output


def test_bench_startup_runs_and_records_the_floor(tmp_path):
    """benchmarks/bench_startup.py with one repeat of two cases (no timing asserted)."""
    from tests.conftest import SAMPLES_DIR, missing_sample

    sample = SAMPLES_DIR / "ukho-gsfpy__0059_20181102_212138_EX1811_MB_EM302.gsf.mb121"
    if not sample.is_file():
        missing_sample(sample.name)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_startup", "--repeats", "1",
                        "--sample", str(sample), "--only", "info (25 m PFM)", "gsf-info",
                        "--results-dir", str(tmp_path)],
                       cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "bench_startup.json").read_text())["results"]["ours"]
    assert set(res) == {"python -c pass", "info (25 m PFM)", "gsf-info"}
    assert res["info (25 m PFM)"]["exit_codes"] == [0]
    assert "numba" not in res["info (25 m PFM)"]["imported"]
    assert res["python -c pass"]["over_floor_x"] == 1.0


# A new in-process load (argv[3] "none": with LOAD_KERNELS emptied, nothing loaded ahead): the
# kernels it makes ready, in order, as (module, name), and how many times numba made a kernel.
_LOAD_ORDER = ("import sys\n"
               "from pfm_dask import _numeric, pipeline, warmup\n"
               "from pfm_dask.config import LoadConfig\n"
               "order, made = [], [0]\n"
               "call, njit = _numeric.CompiledKernels.__call__, _numeric.njit_cached\n"
               "def traced(self, name):\n"
               "    new = name not in self.compiled\n"
               "    k = call(self, name)\n"
               "    key = (self._namespace['__name__'], name)\n"
               "    if new and key not in order:  # two threads may both find it new\n"
               "        order.append(key)\n"
               "    return k\n"
               "def counted(fn, sig=None, **options):\n"
               "    made[0] += fn.__name__.startswith('_k_')\n"
               "    return njit(fn, sig, **options)\n"
               "_numeric.CompiledKernels.__call__ = traced\n"
               "_numeric.njit_cached = counted\n"
               "pipeline.LOAD_KERNELS = () if sys.argv[3] == 'none' else warmup.LOAD_KERNELS\n"
               "res = pipeline.run_load([sys.argv[1]], sys.argv[2], LoadConfig(), mode='serial')\n"
               "assert res.exit_code == 0, res\n"
               "print(repr((order, made[0])))\n")


def _load_order(src: Path, out: Path, ahead: str) -> list:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", _LOAD_ORDER, str(src), str(out), ahead],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    import ast

    return ast.literal_eval(r.stdout.strip().splitlines()[-1])


def test_the_kernels_loaded_ahead_are_those_a_new_load_calls_in_their_order(sample_by_name,
                                                                            tmp_path):
    """warmup.LOAD_KERNELS is what the default load of the real EX1811 sample calls, in the
    order of its first calls (a kernel missing from it is loaded on its first use, one too
    many is loaded for nothing, one out of order makes the load wait); loaded ahead on their
    thread, every kernel is still made ready once, and the PFM is the same."""
    from pfm_dask.warmup import LOAD_KERNELS

    src = sample_by_name("EX1811")
    plain, made = _load_order(src, tmp_path / "plain.pfm", "none")
    assert plain == [tuple(k) for k in LOAD_KERNELS] and made == len(plain)
    ahead, made = _load_order(src, tmp_path / "ahead.pfm", "ahead")
    assert set(ahead) == set(plain) and made == len(plain)
    parts = {p: _parts(tmp_path / p) for p in ("plain.pfm", "ahead.pfm")}
    assert parts["plain.pfm"] == parts["ahead.pfm"]


def test_kernels_loaded_ahead_stop_with_the_watch_and_leave_errors_to_the_call():
    """KernelWatch(ahead=...): its thread ends when the context is left (after the kernel it
    is loading), and a kernel it cannot load stops it without an error: the work's own call
    raises it there."""
    import threading

    from pfm_dask import kernel_cache
    from pfm_dask.warmup import KernelWatch

    from pfm_dask.pfm import _sparse

    with KernelWatch(lambda line: None, [("pfm_dask.pfm._sparse", "no_such_kernel"),
                                         ("pfm_dask.pfm._sparse", "nonzero_records")]) as watch:
        thread = watch._thread
    assert thread is not None and not thread.is_alive()
    with pytest.raises(KeyError):
        _sparse._kernel("no_such_kernel")
    stop = threading.Event()
    stop.set()
    kernel_cache.prefetch([("pfm_dask.no_such_module", "x")], stop)   # stopped: not tried
