"""The ``pfm-dask`` command line's typer commands (:mod:`pfm_dask.cli` runs them).

Options are parsed here and handed to the library; nothing but :mod:`pfm_dask.cli` imports
this module (which answers ``info`` and ``gsf-info`` without it: no typer at their start-up).
Every :class:`~pfm_dask.errors.PfmDaskError` becomes a one-line message: exit
code 2 for a :class:`~pfm_dask.errors.ConfigError` (a request refused before
anything was written), 1 for the others.

Exit codes (all commands):

* 0 — success;
* 1 — failure (nothing usable was produced, or ``check`` found problems);
* 2 — bad usage (unknown option, missing argument) or a refused request;
* 3 — ``load`` completed with problems: some input was damaged; the report names it;
* 130 — ``load`` interrupted by Ctrl-C (one line: what the PFM holds, the resume command).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import List, Optional, Tuple

import typer

from . import _typer_plain
from ._cli_options import (SETTINGS as _SETTINGS, content_options as _content_options,
                           given as _given, setting_option as _setting_option,
                           settings_values as _settings_values)
from ._cli_quick import (EXIT_FAILURE, EXIT_OK, EXIT_PROBLEMS, EXIT_USAGE, _emit,
                         run_gsf_info, run_info)
from .errors import PfmDaskError

_typer_plain.install()  # plain values without pydantic: 0.25 s less start-up for every command
app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Load GSF multibeam files into a PFM v7 bin file, on Dask.",
    # plain help: typer's rich panels put a "<bool>" placeholder on every flag
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(f"pfm-dask {__version__}")
        raise typer.Exit(EXIT_OK)


#: the format of pfm-dask's log lines on standard error (with -v or -q)
_LOG_FORMAT = "pfm-dask: %(levelname)s: %(message)s"


def _configure_logging(verbose: int, quiet: bool) -> None:
    """``-v``: the ``pfm_dask`` logger's INFO lines (the load's steps) on standard error,
    ``-vv`` its DEBUG lines too; ``-q``: errors only. Without either, Python's default (its
    warnings, as before). One handler, replaced when called again (in-process callers)."""
    import logging

    logger = logging.getLogger("pfm_dask")
    for h in [h for h in logger.handlers if getattr(h, "_pfm_dask_cli", False)]:
        logger.removeHandler(h)
    if not verbose and not quiet:
        logger.setLevel(logging.NOTSET)
        return
    level = logging.ERROR if quiet else logging.INFO if verbose == 1 else logging.DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(_LOG_FORMAT))
    handler._pfm_dask_cli = True
    logger.addHandler(handler)
    logger.setLevel(level)


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                help="more messages on stderr: -v the load's steps, -vv debugging"),
    quiet: bool = typer.Option(False, "--quiet", "-q",
                               help="only errors on stderr from pfm-dask's log"),
):
    """Load GSF multibeam files into a PFM v7 bin file, on Dask."""
    _configure_logging(verbose, quiet)


_FORCE_READ = "read an unfinished load or a PFM failing the structural checks anyway"


def _guard(path: Path, force: bool) -> None:
    """Refuse an unfinished or damaged PFM (exit 2) unless ``force`` (pfm_dask.pfm_guard)."""
    from .pfm_guard import refuse_unusable

    for w in refuse_unusable(path, force=force):
        typer.echo(f"pfm-dask: warning: {w}", err=True)


def _fail(err: Exception) -> None:
    """One line on stderr; exit 2 for a refused or invalid request, 1 for a failure."""
    from .errors import ConfigError

    typer.echo(f"pfm-dask: error: {err}", err=True)
    raise typer.Exit(EXIT_USAGE if isinstance(err, ConfigError) else EXIT_FAILURE)


@app.command("gsf-info")
def gsf_info(
    files: List[Path] = typer.Argument(..., exists=False, help="GSF files"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
):
    """Version, record counts, pings, beams, time and position extent of GSF files."""
    raise typer.Exit(run_gsf_info(files, as_json))


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
    force: bool = typer.Option(False, "--force", help=_FORCE_READ),
):
    """Geometry, bit widths and counts of a PFM file."""
    raise typer.Exit(run_info(pfm_file, as_json, force))


@app.command()
def dump(
    pfm_file: Path = typer.Argument(..., help="the .pfm handle file"),
    soundings: Optional[Path] = typer.Option(None, "--soundings", help="Parquet file for the soundings"),
    bins: Optional[Path] = typer.Option(None, "--bins", help="Parquet file for the bins with data"),
    force: bool = typer.Option(False, "--force", help=_FORCE_READ),
):
    """Write the whole content of a PFM as Parquet (soundings and/or bins)."""
    from . import pfm

    if soundings is None and bins is None:
        typer.echo("pfm-dask: error: give --soundings and/or --bins", err=True)
        raise typer.Exit(EXIT_USAGE)
    try:
        _guard(pfm_file, force)
        result = pfm.dump(pfm_file, soundings=soundings, bins=bins)
    except PfmDaskError as err:
        _fail(err)
    _emit(result, False)


@app.command()
def check(
    pfm_file: Path = typer.Argument(..., help="the .pfm handle file"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    strict: bool = typer.Option(False, "--strict", help="a stale header summary (as ABE's "
                                "editors leave it) is an error, not a warning"),
):
    """Full validity check of a PFM: exit 0 when sound, 1 with a list of problems otherwise."""
    from . import pfm
    from .pfm._summary import split_stale

    try:
        problems, warnings = split_stale(pfm.check(pfm_file), strict=strict)
    except PfmDaskError as err:
        _fail(err)
    if as_json:
        _emit({"path": str(pfm_file), "sound": not problems,
               "problems": [str(p) for p in problems],
               "warnings": [str(p) for p in warnings]}, True)
    elif problems:
        typer.echo(f"{pfm_file}: {len(problems)} problem(s)")
        for p in problems:
            typer.echo(f"  - {p}")
    else:
        typer.echo(f"{pfm_file}: sound" + (f" ({len(warnings)} warning(s))" if warnings else ""))
    if warnings and not as_json:
        for p in warnings:
            typer.echo(f"  - warning: {p}")
    raise typer.Exit(EXIT_FAILURE if problems else EXIT_OK)


# ------------------------------------------------------------------ pre-flight
# What would fail only after the work has started is refused before it, one line each
# (ConfigError: exit 2). These run before the load imports numba or Dask.

#: seconds the pre-flight waits for a ``--scheduler`` to accept a connection
SCHEDULER_PROBE_SECONDS = 5.0


def _need_module(module: str, what: str, dist: str, extra: str) -> None:
    """Refuse ``what`` when ``module`` is not installed (looked up, not imported)."""
    import importlib.util

    from .errors import ConfigError

    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(f"{what} needs {dist}, which is not installed: "
                          f"pip install 'pfm-dask[{extra}]' (or pip install {dist})")


def _check_output_folder(output: Path) -> None:
    """The folder that will hold ``output`` and ``output.data`` exists and can be written."""
    from .errors import ConfigError

    folder = output.absolute().parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise ConfigError(f"the output folder {folder} {what}: create it, or name another "
                          "-o", path=output)
    data = Path(str(output.absolute()) + ".data")
    for where in (folder, data):
        if where.is_dir() and not os.access(where, os.W_OK | os.X_OK):
            try:
                read_only = bool(os.statvfs(where).f_flag & os.ST_RDONLY)
            except OSError:
                read_only = False
            why = "a read-only file system" if read_only else "permission denied"
            raise ConfigError(f"cannot write in the output folder {where} ({why})", path=output)


def _probe_scheduler(address: str, timeout: float = SCHEDULER_PROBE_SECONDS) -> None:
    """A TCP connection to a ``tcp://`` or ``tls://`` scheduler within ``timeout`` seconds,
    so that a wrong address costs seconds and one line, not Dask's 30 s wait and traceback."""
    import socket

    from .errors import ConfigError

    scheme, sep, rest = address.partition("://")
    if not sep:
        scheme, rest = "tcp", address
    if scheme not in ("tcp", "tls"):
        return  # inproc://, ucx://...: Dask's own connect judges those
    host, port = rest.rstrip("/"), "8786"
    if host.startswith("["):                            # [IPv6]:port
        host, _, tail = host[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else port
    elif host.count(":") == 1:
        host, port = host.split(":")
    try:
        port_number = int(port)
    except ValueError:
        raise ConfigError(f"--scheduler {address}: cannot read the port {port!r}; write e.g. "
                          "tcp://head-node:8786") from None
    try:
        socket.create_connection((host, port_number), timeout=timeout).close()
    except socket.gaierror:
        why = f"unknown host {host!r}"
    except TimeoutError:
        why = f"no answer within {timeout:g} s"
    except OSError as err:
        why = (err.strerror or str(err)).lower()
    else:
        return
    raise ConfigError(f"--scheduler {address}: cannot reach it ({why}); start the scheduler "
                      "(docs/cluster.md) or check the address")


#: what a user may write after a flag believing it takes a value (``--serial true``)
_BOOL_WORDS = {"true", "false", "yes", "no", "on", "off", "1", "0", "t", "f", "y", "n"}


def _check_flag_values(ctx: typer.Context, inputs: list[str] | None) -> None:
    """Refuse ``--serial true``: a flag takes no value, and the word would silently become
    an input path (the command line as typed, ``sys.argv``, says where each word stood)."""
    from .errors import ConfigError

    flags = {o for p in ctx.command.params if getattr(p, "is_flag", False)
             for o in (*p.opts, *getattr(p, "secondary_opts", ()))}
    words = sys.argv[1:]
    given = set(inputs or ())
    for before, word in zip(words, words[1:]):
        if before in flags and word.lower() in _BOOL_WORDS and word in given:
            raise ConfigError(f"{before} is a flag and takes no value, so {word!r} would be "
                              f"read as an input file: write {before} alone (to load a file "
                              f"named {word}, write ./{word})")


def _preflight(output: Path, *, png: Path | None, scheduler: str | None,
               other_mode: bool) -> None:
    """Refuse, before any work, a load that would fail later for want of its output folder,
    matplotlib for ``--png``, or a reachable ``--scheduler`` (unless ``other_mode``: --serial
    or --cluster, which take precedence or refuse the combination)."""
    _check_output_folder(output)
    if png is not None:
        _need_module("matplotlib", "--png", "matplotlib", "plots")
    if scheduler and not other_mode:
        _probe_scheduler(scheduler)


def _cluster_profile(kind, config, *, serial, scheduler):
    """``--cluster``/``--cluster-config`` → a cluster profile, or None for the embedded cluster."""
    if kind is None and config is None:
        return None
    from .cluster import KINDS, load_profile
    from .errors import ConfigError

    if serial or scheduler:
        raise ConfigError("--cluster/--cluster-config cannot be combined with --serial or "
                          "--scheduler")
    if kind is not None and kind not in KINDS:
        raise ConfigError(f"--cluster must be one of {', '.join(KINDS)}, got {kind!r}")
    if config is None:
        if kind == "local":
            return None
        raise ConfigError(f"--cluster {kind} needs --cluster-config FILE: copy "
                          f"workflows/{kind}.yaml and edit it (docs/cluster.md)")
    profile = load_profile(config)
    if kind is not None and kind != profile.kind:
        raise ConfigError(f"--cluster {kind} does not match the profile's kind: {profile.kind}",
                          path=config)
    if profile.kind != "local":
        _need_module("dask_jobqueue", f"a {profile.kind} cluster", "dask-jobqueue", "cluster")
    return profile


def _exposure(mode, profile, dashboard_address, tls):
    """``--dashboard-address`` and ``--tls-*`` checked against the mode; the profile with them."""
    import dataclasses

    from .errors import ConfigError
    from .security import dashboard_address_problem, tls_files

    if dashboard_address is not None:
        if mode in ("serial", "scheduler"):
            raise ConfigError("--dashboard-address is for the cluster pfm-dask starts (--workers "
                              "or --cluster); with --scheduler the scheduler's own "
                              "--dashboard-address decides, and --serial has no dashboard")
        problem = dashboard_address_problem(dashboard_address)
        if problem:
            raise ConfigError(f"--dashboard-address {problem}")
        if profile is not None:
            profile = dataclasses.replace(profile, scheduler=dataclasses.replace(
                profile.scheduler, dashboard_address=dashboard_address))
    files = tls_files(*tls)
    if files is not None:
        if mode in ("serial", "local", "auto") or (profile is not None and profile.kind == "local"):
            raise ConfigError("--tls-ca-file/--tls-cert/--tls-key are for --scheduler and for "
                              "slurm or pbs profiles; the embedded cluster listens on 127.0.0.1 "
                              "only (docs/cluster.md, Security)")
        if profile is not None:
            profile = dataclasses.replace(profile, tls=files)
    return profile, files


def _run_load(inputs, output, cfg, options, *, serial, append, as_json, cluster=None,
              cluster_config=None, resume=False, resume_options=None, tls=(None, None, None),
              auto=False):
    """Run ``pipeline.run_load`` with the command line's mode, display and messages, and print
    its report; ``options``: the :class:`~pfm_dask.config.RunOptions` (mode set here)."""
    import dataclasses

    from . import pipeline
    from .inputs import expand_inputs
    from .progress import Progress

    scheduler = options.scheduler
    profile = _cluster_profile(cluster, cluster_config, serial=serial, scheduler=scheduler)
    # auto: no mode asked for (no --workers either): small inputs load in this process
    mode = ("serial" if serial else "scheduler" if scheduler else
            "cluster" if profile is not None else "auto" if auto else "local")
    options = dataclasses.replace(options, mode=mode)
    profile, tls_files = _exposure(mode, profile, options.dashboard_address, tls)
    input_problems: list[str] = []  # folders not searched, special files skipped
    files = (expand_inputs(inputs, keep_duplicates=True, problems=input_problems)  # the load
             if inputs else [])                                                  # reports repeats
    prog = Progress(not options.quiet, as_json)

    def dash(link):
        if not as_json and link:
            typer.echo(f"Dask dashboard: {link}", err=True)

    def note(message):
        if not options.quiet:
            typer.echo(f"pfm-dask: {message}", err=True)

    try:
        res = pipeline.run_load(files, output, cfg, options, append=append, resume=resume,
                                progress=prog, on_dashboard=dash, on_message=note,
                                cluster_profile=profile, security=tls_files,
                                command=list(sys.argv), resume_options=resume_options,
                                input_problems=input_problems)
    finally:
        prog.close()
    if as_json:
        typer.echo(json.dumps(res.to_dict(), indent=2, default=str))
    else:
        typer.echo(res.summary())
    return res


EXIT_INTERRUPTED = 130  # the shell's code for a command ended by Ctrl-C (128 + SIGINT)


#: Seconds before an interrupt that came inside LLVM's callbacks is raised again.
INTERRUPT_RETRY_S = 0.05


def _silence_cluster_logs() -> None:
    """Dask's and asyncio's loggers off: the cluster's shutdown after an interrupt logs
    cancelled tasks and closed connections."""
    import logging

    noisy = ("distributed", "asyncio", "tornado", "bokeh")
    # children too: Dask's logging config sets some levels of its own (tornado.application)
    for name in [*noisy, *list(logging.root.manager.loggerDict)]:
        if name.split(".")[0] in noisy:
            logging.getLogger(name).setLevel(logging.CRITICAL + 1)


def _in_llvm(frame) -> bool:
    """Whether the interrupted code runs in llvmlite, as when numba compiles a kernel and
    LLVM calls back into Python through ctypes: an exception raised in such a callback is
    printed and dropped, and LLVM then uses the result the callback never gave (a load
    stopped by Ctrl-C there died of SIGSEGV)."""
    while frame is not None:
        if "llvmlite" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _quiet_on_interrupt(signum, frame):
    """SIGINT handler of a load: silence the cluster's loggers, then interrupt; inside
    llvmlite, interrupt a moment later instead (the signal sent again while this handler is
    still the load's), so that a kernel being compiled finishes first."""
    import signal

    _silence_cluster_logs()
    if _in_llvm(frame):
        def again():
            if signal.getsignal(signum) is _quiet_on_interrupt:
                os.kill(os.getpid(), signum)
        threading.Timer(INTERRUPT_RETRY_S, again).start()
        return
    raise KeyboardInterrupt


def _interrupted(output: Path, resume_options: list[str]) -> str:
    """The one line after Ctrl-C: what the PFM holds now, and the command that continues."""
    from . import journal as J
    from .errors import LoadError

    try:
        state = J.read_journal(output)
    except LoadError:
        state = None
    if state is None:
        if not output.exists() and not Path(str(output) + ".data").exists():
            return f"interrupted before anything was written to {output}: run the command again"
        state = {}
    cmd = (state.get("resume_command") or J.resume_command(output, resume_options))
    if state.get("phase") == "complete":
        return f"interrupted after the load of {output} completed: nothing to resume"
    done, total = int(state.get("watermark", 0)), int(state.get("n_pieces", 0) or 0)
    return (f"interrupted: {output} holds {done:,} of {total:,} pieces (phase "
            f"{state.get('phase', 'unknown')}, kept up to its last checkpoint); continue with: "
            f"{cmd}")


# Options of `load` a printed resume command leaves out: the journal has the inputs and the
# content settings, and these only shape this one run's output or its start.
_NOT_RESUMED = ("inputs", "output", "resume", "append", "strict", "png", "as_json", "quiet",
                "verbose")
# Run options whose values are files: a resume command gives them as absolute paths.
_PATH_OPTIONS = ("cluster_config", "tls_ca_file", "tls_cert", "tls_key")


def _resume_options(ctx: typer.Context) -> list[str]:
    """The run options given on this command line (workers, scheduler, cluster...), as a resume
    command repeats them: paths made absolute, so the command works from any directory."""
    out: list[str] = []
    content = _content_options(ctx)
    for param in ctx.command.params:
        name = param.name
        if name in content or name in _NOT_RESUMED or not getattr(param, "opts", None):
            continue
        if not _given(ctx, name):
            continue
        value = ctx.params.get(name)
        if getattr(param, "is_flag", False):
            flags = param.opts if value else getattr(param, "secondary_opts", [])
            if flags:
                out.append(flags[0])
            continue
        if value is None:
            continue
        values = value if isinstance(value, (tuple, list)) else [value]
        for v in values:
            out.append(param.opts[0])
            out.append(os.path.abspath(v) if name in _PATH_OPTIONS else str(v))
    return out


@app.command()
def load(
    ctx: typer.Context,
    inputs: Optional[List[str]] = typer.Argument(
        None, help="GSF files, directories, globs or @list.txt (optional with --resume)"),
    output: Path = typer.Option(..., "--output", "-o", help="the PFM handle file to create"),
    mbr: Optional[Tuple[float, float, float, float]] = _setting_option(
        "mbr", metavar="SOUTH WEST NORTH EAST"),
    polygon: Optional[Path] = _setting_option("polygon"),
    bin_size: float = _setting_option("bin-size"),
    min_depth: float = _setting_option("min-depth"),
    max_depth: float = _setting_option("max-depth"),
    precision: float = _setting_option("precision"),
    swath_filter: bool = _setting_option("swath-filter"),
    swath_pings: int = _setting_option("swath-window-pings"),
    swath_beams: int = _setting_option("swath-window-beams"),
    swath_threshold: Optional[float] = _setting_option("swath-threshold"),
    area_filter: bool = _setting_option("area-filter"),
    cellstd: float = _setting_option("cellstd"),
    deep_only: bool = _setting_option("deep-only"),
    nominal: bool = _setting_option("nominal-depth"),
    herr: float = _setting_option("horizontal-error"),
    verr: float = _setting_option("vertical-error"),
    workers: int = _setting_option("workers"),
    scheduler: Optional[str] = _setting_option("scheduler"),
    serial: bool = typer.Option(False, "--serial", help="one process, no Dask (the baseline)"),
    cluster: Optional[str] = typer.Option(
        None, "--cluster", help="slurm, pbs or local: where the workers run (docs/cluster.md)"),
    cluster_config: Optional[Path] = typer.Option(
        None, "--cluster-config", help="cluster profile YAML (start from workflows/*.yaml)"),
    append: bool = typer.Option(False, "--append", help="add new files to an existing PFM"),
    max_backlog: str = _setting_option("max-backlog"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    quiet: bool = _setting_option("quiet"),
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, show_default=False,
                                help="the load's steps on stderr (as pfm-dask -v; -vv debugging)"),
    png: Optional[Path] = typer.Option(None, "--png", help="also draw a quick-look PNG of the loaded PFM"),
    resume: bool = typer.Option(
        False, "--resume", help="continue an interrupted load of OUTPUT from its last checkpoint "
        "(inputs and settings come from its journal; docs/reliability.md)"),
    strict: bool = _setting_option("strict"),
    checkpoint_seconds: float = _setting_option("checkpoint-seconds"),
    final_threads: Optional[int] = _setting_option("final-threads"),
    dashboard_address: Optional[str] = _setting_option("dashboard-address"),
    tls_ca_file: Optional[str] = typer.Option(
        None, "--tls-ca-file", help="TLS: the CA certificate (PEM) of a tls:// scheduler or a batch profile"),
    tls_cert: Optional[str] = typer.Option(None, "--tls-cert", help="TLS: this side's certificate (PEM)"),
    tls_key: Optional[str] = typer.Option(None, "--tls-key", help="TLS: its private key (PEM)"),
    force: bool = _setting_option("force"),
):
    """Load GSF files into a PFM: Dask workers decode and bin, one pinned writer writes."""
    from .config import LoadConfig, RunOptions, build
    from .inputs import read_polygon

    if verbose:
        _configure_logging(verbose, False)
    try:
        _check_flag_values(ctx, inputs)
    except PfmDaskError as err:
        _fail(err)
    if not inputs and not resume:
        typer.echo("pfm-dask: error: give the input files (or --resume to continue a load)",
                   err=True)
        raise typer.Exit(EXIT_USAGE)
    try:
        values = _settings_values(ctx)
        options = build(RunOptions, values[RunOptions])
        content = values[LoadConfig]
        content["mbr"] = tuple(content["mbr"]) if content["mbr"] else None
        content["polygon"] = read_polygon(content["polygon"]) if content["polygon"] else None
        cfg = build(LoadConfig, content)
        if resume and not any(_given(ctx, k) for k in _content_options(ctx)):
            cfg = None  # the journal's settings
        if options.scheduler:  # the certificates and the address's protocol, before connecting
            from .security import client_security, tls_files

            client_security(options.scheduler, tls_files(tls_ca_file, tls_cert, tls_key))
        _preflight(output, png=png, scheduler=options.scheduler,
                   other_mode=serial or cluster is not None or cluster_config is not None)
        import signal

        previous = (signal.signal(signal.SIGINT, _quiet_on_interrupt)
                    if threading.current_thread() is threading.main_thread() else None)
        try:
            res = _run_load(inputs, output, cfg, options, serial=serial, append=append,
                            as_json=as_json, cluster=cluster, cluster_config=cluster_config,
                            resume=resume, resume_options=_resume_options(ctx),
                            tls=(tls_ca_file, tls_cert, tls_key),
                            auto=not _given(ctx, "workers"))
        except KeyboardInterrupt:
            typer.echo(f"pfm-dask: {_interrupted(output, _resume_options(ctx))}", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        finally:
            if previous is not None:  # (an in-process caller keeps its own handler)
                signal.signal(signal.SIGINT, previous)
        if png is not None and res.exit_code in (EXIT_OK, EXIT_PROBLEMS):
            from .export import write_png

            _guard(output, force)
            drawn = write_png(output, png)
            typer.echo(f"quick-look: {drawn['path']}", err=True)
    except PfmDaskError as err:
        _fail(err)
    raise typer.Exit(res.exit_code)


@app.command()
def export(
    pfm_file: Path = typer.Argument(..., help="the .pfm handle file"),
    bag: Optional[Path] = typer.Option(None, "--bag", help="BAG 1.6 file (elevation positive up)"),
    geotiff: Optional[Path] = typer.Option(None, "--geotiff", help="GeoTIFF file (needs rasterio)"),
    xyz: Optional[Path] = typer.Option(None, "--xyz", help="CSV of lon,lat,depth per bin"),
    png: Optional[Path] = typer.Option(None, "--png", help="quick-look PNG (hillshade + density)"),
    surface: str = typer.Option("avg_filtered", "--surface",
                                help="avg_filtered | min_filtered | max_filtered | avg"),
    layers: Optional[List[str]] = typer.Option(
        None, "--layer", help="GeoTIFF band, repeatable: surface, count, std (default: all three)"),
    memory: str = typer.Option("256MiB", "--memory", help="memory budget of the export"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    force: bool = typer.Option(False, "--force", help=_FORCE_READ),
):
    """Surfaces to hand on: BAG, GeoTIFF, XYZ and a PNG quick-look (docs/products.md)."""
    from . import export as ex
    from .config import parse_size

    if not any((bag, geotiff, xyz, png)):
        typer.echo("pfm-dask: error: give at least one of --bag, --geotiff, --xyz, --png", err=True)
        raise typer.Exit(EXIT_USAGE)
    results = []
    try:
        if png is not None:
            _need_module("matplotlib", "--png", "matplotlib", "plots")
        _guard(pfm_file, force)
        budget = parse_size(memory)
        if bag is not None:
            results.append(ex.write_bag(pfm_file, bag, surface=surface, memory=budget))
        if geotiff is not None:
            results.append(ex.write_geotiff(pfm_file, geotiff, surface=surface, memory=budget,
                                            layers=tuple(layers) if layers else ex.LAYERS))
        if xyz is not None:
            results.append(ex.write_xyz(pfm_file, xyz, surface=surface, memory=budget))
        if png is not None:
            results.append(ex.write_png(pfm_file, png, surface=surface, memory=budget))
    except PfmDaskError as err:
        _fail(err)
    _emit(results if as_json else {r["path"]: r for r in results}, as_json)


@app.command("cluster-script")
def cluster_script(
    profile: Path = typer.Argument(..., help="cluster profile YAML (slurm or pbs)"),
    scheduler_address: Optional[str] = typer.Option(
        None, "--scheduler-address",
        help="address written into the scripts (default tcp://SCHEDULER:8786, tls:// with TLS)"),
):
    """Print the compute and disk-node job scripts a profile would submit; submits nothing."""
    from .cluster import load_profile, render_job_scripts

    try:
        prof = load_profile(profile)
        if prof.kind != "local":
            _need_module("dask_jobqueue", "cluster-script", "dask-jobqueue", "cluster")
        scripts = render_job_scripts(prof, scheduler_address)
    except PfmDaskError as err:
        _fail(err)
    for role, text in scripts.items():
        what = "as many as the cluster scales to" if role == "compute" else \
            "the one job on the disk node, where the writer runs"
        typer.echo(f"# ---- {role} job ({what})")
        typer.echo(text.rstrip("\n"))
        typer.echo("")


@app.command()
def warmup(as_json: bool = typer.Option(False, "--json", help="print JSON")):
    """Compile every numba kernel into numba's on-disk cache now and say where that is (for
    batch jobs: loads then start without compiling); exit 1 when nothing can be cached."""
    from .warmup import describe, warm_here

    res = warm_here(lambda m: typer.echo(f"pfm-dask: {m}", err=True), everything=True)
    typer.echo(json.dumps(res.to_dict(), indent=2) if as_json else describe(res))
    raise typer.Exit(EXIT_OK if res.cache else EXIT_FAILURE)


@app.command()
def demo(
    outdir: Path = typer.Argument(Path("demo-out"), help="working directory for the demo"),
    files: int = typer.Option(8, "--files"),
    pings: int = typer.Option(200, "--pings"),
    workers: int = typer.Option(_SETTINGS["workers"].default, "--workers"),
    seed: int = typer.Option(0, "--seed"),
):
    """The README's first command: a synthetic survey loaded on the embedded cluster, then checked."""
    from . import pfm
    from . import synth as _synth
    from .config import LoadConfig, RunOptions, SwathFilterConfig
    from .outputs import remove_earlier_load

    survey = Path(outdir) / "survey"
    out = Path(outdir) / "demo.pfm"
    try:
        # an earlier demo's load starts over; anything else at demo.pfm is refused, unchanged
        remove_earlier_load(out, survey)
        summary = _synth.generate(survey, files=files, pings=pings, beams=432, seed=seed)
        typer.echo(f"synthetic survey: {summary.get('files_written', files)} files in {survey}")
        # 25 m bins: the synthetic survey is deep water (800-2500 m), where 2 m bins would
        # make a grid of tens of millions of mostly empty bins.
        cfg = LoadConfig(bin_size_m=25.0, swath=SwathFilterConfig(enabled=True), area_filter=True)
        res = _run_load([str(survey)], out, cfg, RunOptions(workers=workers), serial=False,
                        append=False, as_json=False)
        problems = pfm.check(out)
    except PfmDaskError as err:
        _fail(err)
    typer.echo(f"pfm-dask check {out}: " + ("sound" if not problems else
                                             f"{len(problems)} problem(s)"))
    for p in problems:
        typer.echo(f"  - {p}")
    raise typer.Exit(EXIT_FAILURE if problems else res.exit_code)
