"""The C heap's free pages go back to the system when asked (pfm_dask.heap)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_SCRIPT = textwrap.dedent("""
    import numpy as np
    from pfm_dask.heap import release_free_heap

    def anon():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

    big = np.ones(20 << 20, np.uint8)
    del big               # glibc raises its mmap threshold: 1 MiB arrays now come from the heap
    arrs = [np.ones(1 << 20, np.uint8) for _ in range(150)]
    pin = np.ones(1 << 17)          # a live block above them: the heap's top cannot shrink
    del arrs
    kept = anon()
    release_free_heap()
    print(kept, anon())
""")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="Linux /proc only")
def test_freed_heap_memory_is_returned():
    """150 MiB of freed arrays stay resident in the heap until released, then leave it."""
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
                         check=True)
    kept, after = map(int, out.stdout.split())
    assert kept - after > 100 << 20
