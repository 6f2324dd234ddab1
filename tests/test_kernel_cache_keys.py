"""numba's on-disk cache and kernels that call compiled helpers of another module.

numba keys a cached kernel by its own source file (its stamp) and bytecode; a helper it calls
from another module is compiled into the cached entry. These tests edit such a helper in a
copy of the package and check, in fresh processes sharing one cache folder, that the kernel
is compiled again rather than loaded stale from the cache; and that a warm start loads every
kernel of the package from the cache without numba's compiler registries.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# group_pass (pfm/_recompute.py) steps through each sounding with _step (pfm/_recompute_kernel.py)
_GROUP_SUM = textwrap.dedent("""
    import numpy as np
    from pfm_dask.pfm._recompute import _group_pass
    res = _group_pass(np.array([1.0, 2.0, 4.0]), np.zeros(3, np.int64), np.array([0]),
                      np.array([3]), 1e30, 0, 0)
    print(res["sum_f"][0])
    """)


def _package_copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "pfm_dask", tree / "pfm_dask",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tree


def _run(tree: Path, cache: Path, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree), "NUMBA_CACHE_DIR": str(cache)}
    r = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip()


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def test_a_helper_edited_in_another_module_recompiles_the_kernel(tmp_path):
    tree, cache = _package_copy(tmp_path), tmp_path / "cache"
    assert float(_run(tree, cache, _GROUP_SUM)) == 7.0
    assert float(_run(tree, cache, _GROUP_SUM)) == 7.0     # from the cache
    # the helper now adds one more per filtered sounding; the kernel's own file is unchanged
    _edit(tree / "pfm_dask" / "pfm" / "_recompute_kernel.py", "    s_f += zf\n",
          "    s_f += zf + 1.0\n")
    assert float(_run(tree, cache, _GROUP_SUM)) == 10.0


def test_a_kernel_is_keyed_by_the_files_of_the_helpers_it_calls():
    """The files behind each kernel's cache key: its own, and those of the compiled helpers and
    intrinsics it calls from other modules (names, module attributes, closures)."""
    from pfm_dask._numeric import _helper_files
    from pfm_dask.filters import _swath_kernel
    from pfm_dask.pfm import _recompute, _recompute_kernel

    def rel(fn):
        _recompute._kernel("group_pass"), _recompute_kernel._kernel("recompute_records")
        return [str(Path(p).relative_to(REPO / "pfm_dask")) for p in _helper_files(fn)]

    assert rel(_recompute._k_group_pass) == ["pfm/_recompute.py", "pfm/_recompute_kernel.py"]
    assert rel(_recompute_kernel._k_recompute_records) == ["pfm/_bitpack_kernels.py",
                                                          "pfm/_recompute_kernel.py"]
    assert rel(_swath_kernel._k_score_file) == ["filters/_simd.py", "filters/_swath_kernel.py"]


_WARM = textwrap.dedent("""
    import sys
    from pfm_dask import kernel_cache
    res = kernel_cache.warm()
    print(res.compiled, "numba.np.arraymath" in sys.modules)
    """)


def test_a_warm_start_loads_every_kernel_without_the_compiler_registries():
    """Once the cache holds them, a fresh process loads (and links) every kernel of the package
    without numba's typing and lowering registries (``numba.np.arraymath`` is one)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, "-c", _WARM], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=900) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-3000:]
    assert runs[1].stdout.split() == ["0", "False"], runs[1].stdout
