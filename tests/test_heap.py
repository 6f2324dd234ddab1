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


_CODE_SCRIPT = textwrap.dedent("""
    import numpy as np
    from pfm_dask import _task_kernels as K
    from pfm_dask.heap import release_code_pages

    def llvm_rss():
        kb, on = 0, False
        for line in open("/proc/self/smaps"):
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                on = line.rstrip().endswith("libllvmlite.so")
            elif on and head[0] == "Rss:":
                kb += int(head[1])
        return kb * 1024

    in_order = K.kernel("in_order")        # numba and LLVM set up, a kernel linked
    before = llvm_rss()
    release_code_pages()
    after = llvm_rss()
    ok = in_order(np.array([1, 1, 2], np.uint32), np.array([3, 4, 1], np.uint16))
    print(before, after, ok)
""")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc only")
def test_code_generator_pages_leave_the_resident_set():
    """The tens of MB of LLVM's library a kernel load reads in leave the resident set when
    released (whether other processes map them or not), and the kernels still run."""
    out = subprocess.run([sys.executable, "-c", _CODE_SCRIPT], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                        "HOME": str(Path.home())}, check=True)
    before, after, ok = out.stdout.split()
    assert int(before) > 20 << 20 and int(after) < 4 << 20 and ok == "True"


_LIBS_SCRIPT = textwrap.dedent("""
    import mmap, os, sys
    import numpy as np, pyarrow as pa
    from pfm_dask.heap import release_code_pages

    def rss(match):
        kb, on = 0, False
        for line in open("/proc/self/smaps"):
            head = line.split()
            if "-" in head[0] and not head[0].endswith(":"):
                on = match(line.rstrip())
            elif on and head[0] == "Rss:":
                kb += int(head[1])
        return kb * 1024

    arrow = lambda line: "/libarrow." in line
    data = open(sys.argv[1], "rb")
    m = mmap.mmap(data.fileno(), 0, access=mmap.ACCESS_READ)
    sum(m[i] for i in range(0, len(m), 4096))          # a data file's pages, read
    mapped = lambda line: line.endswith(os.path.basename(sys.argv[1]))
    before, data_before = rss(arrow), rss(mapped)
    release_code_pages()
    after, data_after = rss(arrow), rss(mapped)
    ok = pa.array(np.arange(5)).sum().as_py() == 10      # Arrow still runs
    print(before, after, data_before, data_after, ok)
""")


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="Linux /proc only")
def test_arrow_library_pages_leave_the_resident_set_but_data_files_stay(tmp_path):
    """Arrow's library pages, read at import, leave the resident set and Arrow still runs;
    a mapped file that is not a shared library (here named like one, ``x.so.gsf``) is never
    taken: its range may be unmapped and reused while the libraries' ranges are kept."""
    data = tmp_path / "survey.so.gsf"
    data.write_bytes(b"\1" * (4 << 20))
    out = subprocess.run([sys.executable, "-c", _LIBS_SCRIPT, str(data)], capture_output=True,
                         text=True, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                                  "HOME": str(Path.home())}, check=True)
    before, after, data_before, data_after, ok = out.stdout.split()
    assert int(before) > 4 << 20 and int(after) < int(before) // 2 and ok == "True"
    assert int(data_before) >= 4 << 20 and int(data_after) == int(data_before)


def test_the_threads_layout_shares_one_heap_only_while_its_cluster_is_open(monkeypatch):
    """The embedded cluster's threads layout limits glibc's arenas (``M_ARENA_MAX``) while it
    runs and gives the process its default back when the last such cluster closes: a library
    caller's later threads get heaps of their own again."""
    import os

    from pfm_dask import heap
    from pfm_dask.cluster_local import make_local_cluster

    calls = []
    monkeypatch.setitem(heap._LIBC, "mallopt", lambda param, value: calls.append((param, value)) or 1)
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    with make_local_cluster(1, layout="threads") as outer:
        with make_local_cluster(1, layout="threads"):
            pass
        assert calls == [(heap._M_ARENA_MAX, 1)], "set once, kept while a cluster is open"
        assert outer.status.name == "running"
    assert calls == [(heap._M_ARENA_MAX, 1), (heap._M_ARENA_MAX, 8 * (os.cpu_count() or 1))]
    monkeypatch.setenv("MALLOC_ARENA_MAX", "3")    # the user's own setting comes back
    with make_local_cluster(1, layout="threads"):
        pass
    assert calls[-1] == (heap._M_ARENA_MAX, 3)
