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


def test_serial_run_spends_cpu_in_this_process_only(tiny_survey, tmp_path):
    one = bench_load.run_once(tiny_survey, "serial", 1, LoadConfig(bin_size_m=25.0), "serial",
                              work=tmp_path)
    cpu = one["cpu_s"]
    assert cpu["driver_user"] > 0
    assert cpu["workers_user"] == 0 and cpu["workers_sys"] == 0
    assert one["cores_busy"] == pytest.approx(cpu["total"] / one["wall_s"])


def test_dask_run_counts_the_worker_processes(tiny_survey, tmp_path):
    one = bench_load.run_once(tiny_survey, "local", 1, LoadConfig(bin_size_m=25.0), "dask",
                              work=tmp_path)
    cpu = one["cpu_s"]
    # the worker process imported numpy, pyarrow and the kernels and decoded every file:
    # far more than a tick, and only there (the driver never decodes in this mode)
    assert cpu["workers_user"] > 0.2
    assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"))
