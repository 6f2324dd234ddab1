"""Kernel compilation made visible (issue 20): a Dask load warms every kernel it uses on each
worker before its work, a load in this process reads each kernel on its first use; both say
"compiling kernels (first run only)" when numba really compiles, report compile time apart
from the write, say an unusable cache once, and ``pfm-dask warmup`` fills the cache for batch
jobs and says where it is.

A real first run compiles for minutes on a shared machine, so the compilations seen here are
those of a tiny kernel module added to the warm-up (numba's own ``numba:compile`` events); the
package's kernels come from the cache the suite has already filled.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pfm_dask import cluster as cluster_mod, kernel_cache, pipeline, synth, warmup
from pfm_dask.cli import app
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def survey(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("warm")
    synth.generate(root, files=2, pings=24, beams=40, seed=3)
    return root


@pytest.fixture
def cold_module(tmp_path, monkeypatch):
    """A kernel module that numba must compile (no cache), added to the warm-up's modules."""
    name = f"cold_kernels_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent("""
        import numba

        def _k_twice(x):
            return 2 * x

        def load_kernels():
            numba.njit(_k_twice)(3)
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    real = kernel_cache.kernel_modules
    monkeypatch.setattr(kernel_cache, "kernel_modules", lambda: [*real(), name])
    return name


def test_compile_watch_counts_compilations_not_cache_loads(tmp_path):
    """A cached kernel compiles in the first process and loads in the second: numba's events."""
    (tmp_path / "kmod.py").write_text("def f(x):\n    return x + 1\n")
    code = textwrap.dedent("""
        import numba, sys
        sys.path.insert(0, sys.argv[1])
        import kmod
        from pfm_dask.kernel_cache import CompileWatch
        said = []
        with CompileWatch(lambda: said.append(1)) as w:
            numba.njit(cache=True)(kmod.f)(1)
            numba.njit(cache=True)(kmod.f)(2)
        print(w.compiled, len(said), w.seconds > 0)
        """)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env,
                           capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert [r.stdout.split() for r in runs] == [["1", "1", "True"], ["0", "0", "False"]], runs


def test_a_cache_folder_numba_cannot_use_is_named(tmp_path):
    """NUMBA_CACHE_DIR under a regular file: the problem names the folder and where numba
    caches instead (or that it cannot)."""
    (tmp_path / "file").write_text("")
    code = "from pfm_dask.kernel_cache import cache_location; print(repr(cache_location()))"
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "file" / "cache"),
           "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    folder, problem = eval(r.stdout)
    assert problem and str(tmp_path / "file" / "cache") in problem, r
    assert (folder is None and "every process compiles" in problem) or \
        (folder in problem and "cached in" in problem), problem


@pytest.mark.parametrize("set_dir", [True, False], ids=["NUMBA_CACHE_DIR", "none set"])
def test_when_numba_can_cache_nowhere_the_problem_says_so(monkeypatch, tmp_path, set_dir):
    from numba.core import caching

    def cannot(*a, **kw):
        raise RuntimeError("cannot cache function '_probe': no locator available")

    monkeypatch.setattr(caching, "FunctionCache", cannot)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    (tmp_path / "file").write_text("")
    wanted = str(tmp_path / "file" / "cache")
    if set_dir:
        monkeypatch.setenv("NUMBA_CACHE_DIR", wanted)
    folder, problem = kernel_cache.cache_location()
    assert folder is None and "every process compiles them again" in problem, problem
    assert (wanted if set_dir else "no writable folder") in problem


def test_the_cache_pfm_dask_chose_has_no_problem():
    folder, problem = kernel_cache.cache_location()
    assert problem is None and folder == os.environ["NUMBA_CACHE_DIR"]


def test_warm_compiles_every_kernel_a_load_uses(survey, tmp_path):
    """In a fresh process, after warm() for a load's settings, the load itself gives no numba
    function a new compiled version (swath filter, area filter and polygon on)."""
    files = expand_inputs([survey])
    g = pipeline.area_from_scans([pipeline.prescan_file(f) for f in files],
                                 LoadConfig(bin_size_m=25.0))
    poly = ((g.min_y, g.min_x), (g.max_y, g.min_x), (g.max_y, g.max_x), (g.min_y, g.max_x))
    code = textwrap.dedent(f"""
        import gc, sys
        from numba.core.dispatcher import Dispatcher
        from pfm_dask import pipeline, warmup
        from pfm_dask.config import LoadConfig, SwathFilterConfig
        from pfm_dask.inputs import expand_inputs
        cfg = LoadConfig(bin_size_m=25.0, swath=SwathFilterConfig(enabled=True, window_pings=7),
                         area_filter=True, polygon={poly!r})
        warmup.warm_here(print, cfg)
        def versions():
            return {{id(d): (d.py_func.__qualname__, len(d.overloads))
                    for d in gc.get_objects() if isinstance(d, Dispatcher)}}
        before = versions()
        pipeline.run_load(expand_inputs([{str(survey)!r}]), {str(tmp_path / 'w.pfm')!r}, cfg,
                          mode="serial")
        after = versions()
        print("NEW", sorted(name for k, (name, n) in after.items()
                            if n > before.get(k, (name, 0))[1]))
        """)
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "NEW []" in r.stdout, r.stdout


def test_a_serial_load_says_compiling_and_reports_compile_apart(survey, tmp_path, cold_module,
                                                               monkeypatch):
    """In this process a kernel is made ready on its first use: one that compiles midway (the
    cold module's, during the planning) is said once and timed apart."""
    import importlib

    cold, real = importlib.import_module(cold_module), pipeline._plan

    def plan_that_compiles(*a, **kw):
        cold.load_kernels()
        return real(*a, **kw)

    monkeypatch.setattr(pipeline, "_plan", plan_that_compiles)
    r = CliRunner().invoke(app, ["load", str(survey), "-o", str(tmp_path / "s.pfm"),
                                 "--bin-size", "25", "--serial", "--json"])
    assert r.exit_code == 0, r.output
    assert r.stderr.count("pfm-dask: compiling kernels (first run only") == 1, r.stderr
    timings = json.loads(r.stdout)["timings"]
    assert timings["compile"] > 0 and timings["kernels"] >= timings["compile"]
    assert "write" in timings


def test_a_load_in_this_process_makes_ready_only_the_kernels_it_runs(survey, tmp_path):
    """A fresh process loading without filters reads no area-filter or swath kernel, and not
    every bit-packing kernel; the report's ``kernels`` counts the ones it read."""
    code = textwrap.dedent(f"""
        import gc, sys
        from pfm_dask import pipeline
        from pfm_dask._numeric import CompiledKernels
        from pfm_dask.config import LoadConfig
        from pfm_dask.inputs import expand_inputs
        res = pipeline.run_load(expand_inputs([{str(survey)!r}]), {str(tmp_path / 'k.pfm')!r},
                                LoadConfig(bin_size_m=25.0), mode="serial")
        assert res.exit_code == 0 and res.timings["kernels"] > 0, res.timings
        for reg in gc.get_objects():
            if isinstance(reg, CompiledKernels):
                print(reg._namespace["__name__"], len(reg.compiled), len(reg._signatures(
                    __import__("numba").types)))
        print("SWATH", "pfm_dask.filters._swath_kernel" in sys.modules)
        """)
    r = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines())
    loaded = {m: tuple(map(int, v.split())) for m, v in lines.items() if m != "SWATH"}
    assert lines["SWATH"] == "False"
    assert loaded.get("pfm_dask.filters._area", (0, 0))[0] == 0, loaded
    assert 0 < loaded["pfm_dask.pfm._bitpack_kernels"][0] < loaded["pfm_dask.pfm._bitpack_kernels"][1]
    assert loaded["pfm_dask.gsf._kernels"][0] > 0


def dask_load(survey: Path, out: Path, workers: int):
    """A load on an embedded cluster of in-process workers (patches apply to them): the
    report and the lines said."""
    from distributed import Client

    said: list[str] = []
    with cluster_mod.make_local_cluster(workers, processes=False) as cluster, \
            Client(cluster) as client:
        res = pipeline.run_load(expand_inputs([survey]), out, LoadConfig(bin_size_m=25.0),
                                mode="scheduler", client=client, on_message=said.append)
    return res, said


def test_a_dask_load_warms_each_worker_and_says_compiling_once(survey, tmp_path, cold_module):
    """Two in-process workers each compile the module; the line comes once, through the
    scheduler's events, and the report has the compile time."""
    res, said = dask_load(survey, tmp_path / "d.pfm", workers=2)
    assert res.exit_code == 0
    assert [m for m in said if m.startswith("compiling kernels")] == [warmup.COMPILING], said
    assert res.timings["compile"] > 0 and res.timings["kernels"] >= res.timings["compile"]


def test_a_compilation_in_the_driver_is_said_too(survey, tmp_path, monkeypatch):
    """The driver's planning (the grid's geodesy) may compile where the workers' cache is not
    the driver's: the same line, once."""
    import numba

    real = pipeline._plan

    def plan_that_compiles(*a, **kw):
        numba.njit(lambda x: x + 1)(1)
        return real(*a, **kw)

    monkeypatch.setattr(pipeline, "_plan", plan_that_compiles)
    res, said = dask_load(survey, tmp_path / "p.pfm", workers=1)
    assert res.exit_code == 0
    assert [m for m in said if m.startswith("compiling kernels")] == [warmup.COMPILING], said


def test_an_unusable_cache_is_said_once_per_load(survey, tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_cache, "cache_location",
                        lambda: (None, "numba cannot cache the kernels (test)"))
    said = []
    res = pipeline.run_load(expand_inputs([survey]), tmp_path / "u.pfm",
                            LoadConfig(bin_size_m=25.0), mode="serial", on_message=said.append)
    assert res.exit_code == 0
    assert said.count("numba cannot cache the kernels (test)") == 1, said


def test_warmup_command_fills_the_cache_and_says_where(cold_module):
    """The cold module compiles every time (plain njit); so may some of the package's own
    kernels, in a checkout whose cache does not hold them yet (numba keys it by source path)."""
    r = CliRunner().invoke(app, ["warmup"])
    assert r.exit_code == 0, r.output
    assert re.match(r"compiled (1 kernel|\d+ kernels) in ", r.stdout), r.stdout
    assert os.environ["NUMBA_CACHE_DIR"] in r.stdout
    assert "compiling kernels (first run only" in r.stderr
    r = CliRunner().invoke(app, ["warmup", "--json"])
    out = json.loads(r.stdout)
    assert out["compiled"] >= 1 and out["compile_seconds"] > 0
    assert out["cache"] == os.environ["NUMBA_CACHE_DIR"] and out["cache_problem"] is None
    assert cold_module in out["modules"] and "pfm_dask.gsf._kernels" in out["modules"]


def test_warmup_command_fails_when_nothing_can_be_cached(monkeypatch):
    monkeypatch.setattr(kernel_cache, "cache_location",
                        lambda: (None, "numba cannot cache the kernels (test)"))
    r = CliRunner().invoke(app, ["warmup"])
    assert r.exit_code == 1
    assert "numba cannot cache the kernels (test)" in r.stderr
    assert "cache: nowhere" in r.stdout
