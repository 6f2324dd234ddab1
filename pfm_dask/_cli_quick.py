"""The quick commands of the command line, without typer: ``info`` and ``gsf-info`` as
:mod:`pfm_dask.cli` answers them directly and as its typer commands (:mod:`pfm_dask._cli_app`)
run them, and the printing of a result that every command shares."""

from __future__ import annotations

import json
import sys
from pathlib import Path

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3


def _echo(text: str, err: bool = False) -> None:
    """One line on standard output (or error), flushed, as ``typer.echo`` writes it."""
    stream = sys.stderr if err else sys.stdout
    if stream is not None:
        stream.write(text + "\n")
        stream.flush()


def _emit(obj, as_json: bool) -> None:
    """Print a result as JSON, or as indented ``key: value`` lines for people."""
    _echo(json.dumps(obj, indent=2, default=str) if as_json else _human(obj))


def _human(obj, indent: int = 0) -> str:
    pad = "  " * indent
    if isinstance(obj, dict):
        lines = []
        for k, v in obj.items():
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{k}:")
                lines.append(_human(v, indent + 1))
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
        return "\n".join(lines)
    if isinstance(obj, list):
        if all(not isinstance(v, (dict, list)) for v in obj):
            return f"{pad}" + ", ".join(_scalar(v) for v in obj)
        return "\n".join(
            f"{pad}- " + _human(v, indent + 1).lstrip() for v in obj)
    return f"{pad}{_scalar(obj)}"


def _scalar(v) -> str:
    if isinstance(v, float):
        return f"{v:.9g}"
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10000:
        return f"{v:,}"
    return str(v)


def run_info(pfm_file: Path, as_json: bool, force: bool) -> int:
    """``pfm-dask info``: geometry, bit widths and counts of a PFM; the exit code."""
    from . import pfm
    from .errors import ConfigError, PfmDaskError
    from .pfm_guard import refuse_unusable

    try:
        for w in refuse_unusable(pfm_file, force=force):
            _echo(f"pfm-dask: warning: {w}", err=True)
        result = pfm.info(pfm_file)
    except PfmDaskError as err:
        _echo(f"pfm-dask: error: {err}", err=True)
        return EXIT_USAGE if isinstance(err, ConfigError) else EXIT_FAILURE
    _emit(result, as_json)
    return EXIT_OK


def run_gsf_info(files: list[Path], as_json: bool) -> int:
    """``pfm-dask gsf-info``: version, counts and extents of GSF files; the exit code."""
    from . import gsf
    from .errors import PfmDaskError

    results, failed = [], False
    for f in files:
        try:
            results.append(gsf.info(f))
        except PfmDaskError as err:
            failed = True
            results.append({"path": str(f), "error": str(err)})
            if not as_json:
                _echo(f"pfm-dask: error: {err}", err=True)
    if as_json:
        _emit(results if len(results) != 1 else results[0], True)
    else:
        for r in results:
            if "error" not in r:
                _emit(r, False)
                _echo("")
    return EXIT_FAILURE if failed else EXIT_OK
