"""``bench_load`` counts the CPU of every process of a run, the worker processes included.

The speedup it reports is bounded by how much more CPU a Dask run spends than ``--serial``; a
count that missed the embedded cluster's workers would make that comparison meaningless.
"""

from __future__ import annotations

import os

import pytest

from benchmarks import bench_load
from pfm_dask import synth
from pfm_dask.config import LoadConfig
from pfm_dask.inputs import expand_inputs


def _times(user, system, c_user, c_system):
    return os.times_result((user, system, c_user, c_system, 0.0))


def test_cpu_seconds_splits_driver_and_workers():
    got = bench_load.cpu_seconds(_times(1.0, 0.5, 10.0, 2.0), _times(3.5, 1.0, 40.0, 6.5))
    assert got == pytest.approx({"driver_user": 2.5, "driver_sys": 0.5, "workers_user": 30.0,
                                 "workers_sys": 4.5, "total": 37.5})


@pytest.fixture(scope="module")
def tiny_survey(tmp_path_factory):
    out = tmp_path_factory.mktemp("survey")
    synth.generate(out, files=3, pings=40, beams=64, seed=5)
    return expand_inputs([out])


@pytest.fixture(scope="module")
def serial_survey(tmp_path_factory):
    """Enough pings for a ``--serial`` run to spend several of ``os.times()``' 10 ms ticks of
    user CPU (40 pings a file took 40 ms, and once counted none)."""
    out = tmp_path_factory.mktemp("serial-survey")
    synth.generate(out, files=3, pings=400, beams=64, seed=5)
    return expand_inputs([out])


def test_serial_run_spends_cpu_in_this_process_only(serial_survey, tmp_path):
    one = bench_load.run_once(serial_survey, "serial", 1, LoadConfig(bin_size_m=25.0), "serial",
                              work=tmp_path)
    cpu = one["cpu_s"]
    assert cpu["driver_user"] > 0
    assert cpu["workers_user"] == 0 and cpu["workers_sys"] == 0
    assert one["cores_busy"] == pytest.approx(cpu["total"] / one["wall_s"])


def test_dask_run_counts_the_worker_processes(tiny_survey, tmp_path):
    """The embedded cluster's ``processes`` layout (its default runs in this process)."""
    one = bench_load.run_once(tiny_survey, "processes", 1, LoadConfig(bin_size_m=25.0), "dask",
                              work=tmp_path)
    cpu = one["cpu_s"]
    # the worker process imported numpy, pyarrow and the kernels and decoded every file:
    # far more than a tick, and only there (the driver never decodes in this mode)
    assert cpu["workers_user"] > 0.2
    assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"))


def test_two_serial_halves_load_every_sounding_in_two_processes(tiny_survey, tmp_path):
    """The ceiling mode: alternate files in two processes, the halves' soundings adding up
    to the serial run's, both processes' CPU counted and none of it in this one."""
    cfg = LoadConfig(bin_size_m=25.0)
    serial = bench_load.run_once(tiny_survey, "serial", 1, cfg, "serial", work=tmp_path)
    halves = bench_load.run_halves(tiny_survey, cfg, "halves", work=tmp_path)
    assert halves["files"] == [2, 1]
    assert halves["soundings_loaded"] == serial["soundings_loaded"]
    assert len(halves["halves_wall_s"]) == 2
    assert halves["wall_s"] >= max(halves["halves_wall_s"])
    cpu = halves["cpu_s"]
    assert cpu["workers_user"] > 0 and cpu["driver_user"] == 0
    assert cpu["total"] == pytest.approx(cpu["workers_user"] + cpu["workers_sys"])
    for i in (0, 1):  # each half wrote a sound PFM of its own
        assert (tmp_path / f"halves-{i}.pfm").exists()


def test_a_failing_half_stops_the_benchmark(tmp_path):
    """A half whose load fails is reported, not timed (no ceiling from a broken run)."""
    missing = [str(tmp_path / "nope-1.gsf"), str(tmp_path / "nope-2.gsf")]
    with pytest.raises(SystemExit, match="two_serial_halves failed"):
        bench_load.run_halves(missing, LoadConfig(bin_size_m=25.0), "bad", work=tmp_path)
