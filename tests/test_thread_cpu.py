"""``benchmarks.thread_cpu``: each thread's CPU split at the end of the load phase."""

from __future__ import annotations

import threading
import time

import pytest

from benchmarks.thread_cpu import attribute, sample


def test_attribute_splits_each_thread_at_the_boundary():
    samples = [
        (0.0, {"main#1": (1.0, 0.5), "thread-cpu-sampler#9": (0.0, 0.0)}),
        (1.0, {"main#1": (3.0, 1.0), "pfm-writer#2": (0.5, 0.25)}),       # writer starts
        (2.0, {"main#1": (4.0, 1.0), "pfm-writer#2": (2.0, 0.5),
               "thread-cpu-sampler#9": (0.5, 0.5)}),
        (3.0, {"main#1": (6.0, 1.5), "pfm-band#3": (1.0, 0.0)}),          # writer gone
    ]
    rows = attribute(samples, t_split=2.0)
    assert rows["main#1"] == pytest.approx([3.0, 0.5, 2.0, 0.5])
    # counted up to its last sample, from zero since it started after the first
    assert rows["pfm-writer#2"] == pytest.approx([2.0, 0.5, 0.0, 0.0])
    assert rows["pfm-band#3"] == pytest.approx([0.0, 0.0, 1.0, 0.0])
    assert not any(k.startswith("thread-cpu-sampler") for k in rows)
    assert attribute([], 1.0) == {}


def test_sample_sees_a_busy_thread_by_name():
    done = threading.Event()

    def spin():
        x = 0
        while not done.is_set():
            x += 1

    th = threading.Thread(target=spin, name="busy-one")
    th.start()
    try:
        time.sleep(0.3)
        snap = sample()
    finally:
        done.set()
        th.join()
    busy = [v for k, v in snap.items() if k.startswith("busy-one#")]
    assert busy and sum(busy[0]) > 0.05
    # the thread is gone now: sampling must not fail on it, and must not name it
    assert not any(k.startswith("busy-one#") for k in sample())
