"""Recording benchmark results: one JSON per benchmark with machine facts, PNG plots, a table.

Every benchmark ends with :func:`write_results`, so results from different machines and days can
be compared: the JSON says how many cores, how much memory and which library versions produced
the numbers.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import sys
from pathlib import Path
from typing import Callable, Mapping

__all__ = ["RESULTS_DIR", "DATA_DIR", "machine_facts", "write_results", "format_table"]

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"     #: where ``<name>.json`` and plots go
DATA_DIR = BENCH_DIR / "_data"          #: cached generated inputs (git-ignored)


def cached_survey(out: Path, files: int, pings: int, beams: int, seed: int) -> dict | None:
    """``survey.json`` of a complete cached synthetic survey made with these parameters, else
    None (missing, other parameters, or a file missing or of another size: regenerate)."""
    try:
        meta = json.loads((Path(out) / "survey.json").read_text())
    except (OSError, ValueError):
        return None
    p = meta.get("parameters", {})
    if (p.get("files"), p.get("pings"), p.get("beams"), p.get("seed")) != (files, pings, beams, seed):
        return None
    for f in meta.get("files", []):
        path = Path(out) / f["name"]
        if not path.is_file() or path.stat().st_size != f["bytes"]:
            return None
    return meta


def remove_pfm(out: str | os.PathLike) -> None:
    """Remove the PFM whose handle file is ``out`` (and its ``.data`` directory), if there."""
    out = Path(out)
    shutil.rmtree(str(out) + ".data", ignore_errors=True)
    out.unlink(missing_ok=True)


def machine_facts() -> dict:
    """Cores, memory, CPU, OS and the versions of the libraries that decide our speed."""
    facts = {
        "date_utc": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or None,
        "logical_cores": os.cpu_count(),
    }
    try:
        facts["usable_cores"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        facts["usable_cores"] = os.cpu_count()
    try:
        import psutil

        facts["physical_cores"] = psutil.cpu_count(logical=False)
        vm = psutil.virtual_memory()
        facts["memory_bytes"] = vm.total
        # the same replay ran twice as long once with the page cache full of earlier outputs
        # (docs/performance.md, the ceiling): what was free and cached when the run ended
        facts["memory_free_bytes"] = vm.free
        facts["page_cache_bytes"] = getattr(vm, "cached", None)
        facts["load_average_1m"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    except ImportError:  # pragma: no cover - psutil is a dependency
        pass
    for mod in ("numpy", "pyarrow", "dask", "distributed", "gsfpy", "matplotlib"):
        facts[f"{mod}_version"] = _version(mod)
    for var in ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        if os.environ.get(var):
            facts[f"env_{var}"] = os.environ[var]
    return facts


def _version(mod: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:  # noqa: BLE001 - absent or unusual packaging: just not reported
        return None


def write_results(name: str, results: Mapping, *,
                  plots: Mapping[str, Callable] | None = None,
                  results_dir: str | os.PathLike | None = None, quiet: bool = False) -> Path:
    """Write ``<results_dir>/<name>.json`` and one PNG per plot; print a short table.

    ``results`` must be JSON-serialisable (numpy scalars are converted). Each entry of
    ``plots`` maps a short plot name to a function ``draw(ax)`` that draws on a matplotlib
    ``Axes``; the figure is saved as ``<name>_<plot>.png`` (Agg backend, no display needed).
    Returns the JSON path.
    """
    out = Path(results_dir) if results_dir is not None else RESULTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, "machine": machine_facts(), "results": _plain(dict(results))}
    png = {}
    for plot_name, draw in (plots or {}).items():
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        try:
            draw(ax)
            fig.tight_layout()
            path = out / f"{name}_{plot_name}.png"
            fig.savefig(path, dpi=110)
            png[plot_name] = path.name
        finally:
            plt.close(fig)
    if png:
        doc["plots"] = png
    path = out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    if not quiet:
        print(format_table(name, doc["results"]))
        print(f"results: {path}" + (f" (+ {len(png)} plot{'s' if len(png) != 1 else ''})" if png else ""))
    return path


def format_table(title: str, results: Mapping) -> str:
    """The scalar entries of ``results`` (nested dicts flattened with dots) as aligned lines."""
    rows = list(_flatten(results))
    width = max((len(k) for k, _ in rows), default=0)
    lines = [title, "-" * max(len(title), 20)]
    lines += [f"{k.ljust(width)}  {_fmt(v)}" for k, v in rows]
    return "\n".join(lines)


def _flatten(d: Mapping, prefix: str = ""):
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            yield from _flatten(v, key + ".")
        elif isinstance(v, (list, tuple)):
            if len(v) <= 6 and all(not isinstance(x, (Mapping, list, tuple)) for x in v):
                yield key, ", ".join(_fmt(x) for x in v)
        else:
            yield key, v


def _fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and (abs(v) >= 1e6 or abs(v) < 1e-3):
            return f"{v:.4g}"
        return f"{v:,.3f}".rstrip("0").rstrip(".") if abs(v) < 1e6 else f"{v:.4g}"
    return str(v)


def _plain(obj):
    """JSON-ready copy: numpy scalars/arrays → Python numbers/lists, paths → strings."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return obj.tolist()
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


if __name__ == "__main__":  # pragma: no cover
    json.dump(machine_facts(), sys.stdout, indent=2)
    print()
