"""The ``pfm-dask`` command line (typer).

Options are parsed here and handed to the library; nothing imports this module.
Every :class:`~pfm_dask.errors.PfmDaskError` becomes a one-line message and
exit code 1.

Exit codes (all commands):

* 0 — success;
* 1 — failure (nothing usable was produced, or ``check`` found problems);
* 2 — bad usage (unknown option, missing argument);
* 3 — ``load`` completed with problems: some input was damaged; the report names it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Optional

import typer

from .errors import PfmDaskError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_PROBLEMS = 3

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Load GSF multibeam files into a PFM v7 bin file, on Dask.",
)


def _emit(obj, as_json: bool) -> None:
    """Print a result as JSON, or as indented ``key: value`` lines for people."""
    if as_json:
        typer.echo(json.dumps(obj, indent=2, default=str))
        return
    typer.echo(_human(obj))


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


def _fail(err: Exception) -> None:
    typer.echo(f"pfm-dask: error: {err}", err=True)
    raise typer.Exit(EXIT_FAILURE)


@app.command("gsf-info")
def gsf_info(
    files: List[Path] = typer.Argument(..., exists=False, help="GSF files"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
):
    """Version, record counts, pings, beams, time and position extent of GSF files."""
    from . import gsf

    results, failed = [], False
    for f in files:
        try:
            results.append(gsf.info(f))
        except PfmDaskError as err:
            failed = True
            results.append({"path": str(f), "error": str(err)})
            if not as_json:
                typer.echo(f"pfm-dask: error: {err}", err=True)
    if as_json:
        _emit(results if len(results) != 1 else results[0], True)
    else:
        for r in results:
            if "error" not in r:
                _emit(r, False)
                typer.echo("")
    raise typer.Exit(EXIT_FAILURE if failed else EXIT_OK)


@app.command()
def synth(
    outdir: Path = typer.Argument(..., help="directory to write the survey into"),
    files: int = typer.Option(8, "--files", help="number of GSF files (survey lines)"),
    pings: int = typer.Option(200, "--pings", help="pings per file"),
    beams: int = typer.Option(432, "--beams", help="beams per ping (EM302: 432)"),
    seed: int = typer.Option(0, "--seed", help="random seed; the same seed gives the same bytes"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
):
    """Write a synthetic EM302-like survey of GSF files, with a truth file of planted spikes."""
    from . import synth as _synth

    try:
        summary = _synth.generate(outdir, files=files, pings=pings, beams=beams, seed=seed)
    except PfmDaskError as err:
        _fail(err)
    _emit(summary, as_json)


@app.command()
def info(
    pfm_file: Path = typer.Argument(..., help="the .pfm handle file"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
):
    """Geometry, bit widths and counts of a PFM file."""
    from . import pfm

    try:
        result = pfm.info(pfm_file)
    except PfmDaskError as err:
        _fail(err)
    _emit(result, as_json)


@app.command()
def dump(
    pfm_file: Path = typer.Argument(..., help="the .pfm handle file"),
    soundings: Optional[Path] = typer.Option(None, "--soundings", help="Parquet file for the soundings"),
    bins: Optional[Path] = typer.Option(None, "--bins", help="Parquet file for the bins with data"),
):
    """Write the whole content of a PFM as Parquet (soundings and/or bins)."""
    from . import pfm

    if soundings is None and bins is None:
        typer.echo("pfm-dask: error: give --soundings and/or --bins", err=True)
        raise typer.Exit(EXIT_USAGE)
    try:
        result = pfm.dump(pfm_file, soundings=soundings, bins=bins)
    except PfmDaskError as err:
        _fail(err)
    _emit(result, False)


@app.command()
def check(
    pfm_file: Path = typer.Argument(..., help="the .pfm handle file"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
):
    """Full validity check of a PFM: exit 0 when sound, 1 with a list of problems otherwise."""
    from . import pfm

    try:
        problems = pfm.check(pfm_file)
    except PfmDaskError as err:
        _fail(err)
    if as_json:
        _emit({"path": str(pfm_file), "sound": not problems,
               "problems": [str(p) for p in problems]}, True)
    elif problems:
        typer.echo(f"{pfm_file}: {len(problems)} problem(s)")
        for p in problems:
            typer.echo(f"  - {p}")
    else:
        typer.echo(f"{pfm_file}: sound")
    raise typer.Exit(EXIT_FAILURE if problems else EXIT_OK)


@app.command()
def demo(
    outdir: Path = typer.Argument(Path("demo-out"), help="working directory for the demo"),
    files: int = typer.Option(8, "--files"),
    pings: int = typer.Option(200, "--pings"),
    seed: int = typer.Option(0, "--seed"),
):
    """The README's first command: make a synthetic survey and run the main job on it."""
    from . import synth as _synth

    survey = Path(outdir) / "survey"
    try:
        summary = _synth.generate(survey, files=files, pings=pings, beams=432, seed=seed)
    except PfmDaskError as err:
        _fail(err)
    typer.echo(f"synthetic survey in {survey}")
    _emit(summary, False)


def main() -> None:  # console-script entry point
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
