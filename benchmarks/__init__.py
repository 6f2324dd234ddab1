"""Benchmarks: each compares our code with a baseline measured in the same run.

Run one as a module, e.g. ``python -m benchmarks.bench_gsf [--quick]``. Results go to
``benchmarks/results/<name>.json`` (with machine facts) and PNG plots next to it
(:func:`benchmarks._report.write_results`). Generated inputs are cached in
``benchmarks/_data/`` (git-ignored).
"""
