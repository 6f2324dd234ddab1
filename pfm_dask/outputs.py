"""The output path and the resume/append policy of a load (no Dask here).

Before a load touches anything it classifies what is at ``X.pfm`` and ``X.pfm.data``
(:func:`_inspect_output`): a load removes or overwrites only what its own journal proves to be
its unfinished output, and refuses everything else. ``--resume`` is planned here
(:func:`_plan_resume`): the journal's inputs and settings against the ones given, whatever the
phase; an append is checked against the PFM's fixed fields before it starts
(:func:`check_append_fits`). docs/reliability.md tells the rules.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from . import journal as J
from .bins import BinGrid
from .config import LoadConfig
from .errors import ConfigError, LoadError

__all__ = ["check_append_fits", "Complete"]


@dataclass
class Complete:
    """What :func:`_plan_resume` returns for a finished load that matches its journal."""

    state: dict


def _existing(output: Path, append: bool) -> tuple[BinGrid | None, list[str]]:
    """For ``--append``: the PFM's grid and the input files already in its ``.ctl``."""
    if not append:
        return None, []
    from . import pfm

    with pfm.open_pfm(output, "r") as f:
        return f.grid, [x.path for x in f.files()]


def check_append_fits(output: Path, scans: list[dict], cfg: LoadConfig) -> None:
    """Refuse an append whose inputs cannot fit the existing PFM's fixed fields (file, line,
    ping and beam numbers, the depth range), naming the field, its limit and the file.

    Limits that depend on where soundings fall (soundings per bin, lines beyond one per
    file) can only be met while loading.
    """
    from . import pfm

    with pfm.open_pfm(output, "r") as f:
        h = f.header
        n_files, n_lines = len(f.files()), len(f.lines())
        lim = {"file": f.max_file_number, "line": f.max_line_number,
               "ping": f.max_ping_number, "beam": f.max_beam_number}
        lo, hi = -float(h.depth_offset), float(f.null_depth) - 1.0
    def refuse(field_, key, limit, why, path=None):
        raise ConfigError(f"cannot append: {why}, but this PFM's {field_} field holds at most "
                          f"{limit:,} ({key} = {int(limit).bit_length()}); nothing was written. "
                          "Load these files into a new PFM instead", path=path or output)
    usable = [s for s in scans if not s.get("error")]
    last_file = n_files + len(scans) - 1
    if scans and last_file > lim["file"]:
        refuse("file number", "[FILE NUMBER BITS]", lim["file"],
               f"{len(scans)} more input files need file number {last_file:,}", scans[-1]["path"])
    with_pings = sum(1 for s in usable if s.get("n_pings"))
    if with_pings and n_lines + with_pings - 1 > lim["line"]:
        refuse("line number", "[LINE NUMBER BITS]", lim["line"],
               f"{with_pings} more files need at least line number {n_lines + with_pings - 1:,}")
    for s in usable:
        if s.get("n_pings", 0) > lim["ping"]:
            refuse("ping number", "[PING NUMBER BITS]", lim["ping"],
                   f"the file has {s['n_pings']:,} pings", s["path"])
        if s.get("max_beams", 0) > lim["beam"]:
            refuse("beam number", "[BEAM NUMBER BITS]", lim["beam"],
                   f"the file has pings of {s['max_beams']:,} beams", s["path"])
    if cfg.min_depth < lo - 1e-6 or cfg.max_depth > hi + 1e-3:
        raise ConfigError(f"cannot append: the depth range {cfg.min_depth:g} .. {cfg.max_depth:g} "
                          f"m is wider than this PFM's ({lo:g} .. {hi:g} m, its DEPTH OFFSET and "
                          f"NULL DEPTH); give --min-depth {lo:g} --max-depth {hi:g} or a range "
                          "inside it. Nothing was written", path=output)


def _unfinished(output: Path) -> dict | None:
    """The journal of the load writing ``output`` if that load has not completed."""
    try:
        state = J.read_journal(output)
    except LoadError:
        return {"phase": "unknown (journal unreadable)"}
    if state is not None and state.get("phase") != "complete":
        return state
    return None


def _refuse_busy(output: Path) -> None:
    """Refuse an output that another load is writing now (it holds the PFM's lock): its
    journal reads as unfinished, and neither resuming nor removing it is for this load."""
    holder = J.lock_holder(output)
    if holder is not None:
        raise ConfigError(f"another load is writing this PFM now ({holder}); nothing was "
                          "changed: wait for it to end, or name another output", path=output)


def _refuse_unfinished(output: Path, state: dict) -> ConfigError:
    phase = state.get("phase")
    where = (f", {state.get('watermark', 0):,} of {state.get('n_pieces', 0):,} pieces written"
             if phase == "loading" else "")
    cmd = state.get("resume_command") or J.resume_command(output)
    if phase == "append-pending":
        return ConfigError(f"an append to {output} stopped before it wrote anything: finish it "
                           f"with `{cmd}`", path=output)
    static = J.read_static(output) or {}
    also = "" if static.get("append") else ", or remove it to start again"
    return ConfigError(f"output {output} is an unfinished {'append' if also == '' else 'load'} "
                       f"(stopped in phase {phase}{where}): continue it with `{cmd}`{also}",
                       path=output)


def _dedupe(files: list[str]) -> tuple[list[str], list[str]]:
    """Drop inputs that name a file already listed (by device and inode: hard links too);
    each is reported as a problem."""
    from .inputs import file_key

    seen: dict = {}
    out, problems = [], []
    for f in files:
        key = file_key(f)
        if key in seen:
            problems.append(f"{f}: listed more than once (the same file as {out[seen[key]]}); "
                            "loaded once")
            continue
        seen[key] = len(out)
        out.append(f)
    return out, problems


# ---------------------------------------------------------------- the output path
#: The files a load creates inside ``X.pfm.data/`` beside the PFM's parts: only these
#: (and the parts) are ever removed, and only for a load its own journal proves unfinished,
#: or (``pfm-dask demo``) proves a load of the demo's own survey.
_OWN_SCRATCH = ("load.json", "journal.json", "journal.json.tmp", "load.json.tmp", "undo.log",
                "undo.log.b", "touched.log", "filter-redo.bin", "area-sums.bin", "lock",
                "load-report.json",
                "load-report.json.tmp")
_PART_SUFFIXES = (".ctl", ".bin", ".ndx", ".lin", ".cvg")


@dataclass
class _Found:
    """What is at an output path before a load touches it (see :func:`_inspect_output`)."""

    kind: str                 # nothing | foreign | pfm | load
    what: str = ""            # for ``foreign``: what was found, in words
    journal: dict | None = None
    static: dict | None = None


def _is_pfm_handle(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            first = fh.readline(200)
    except OSError:
        return False
    return b"PFM Handle File" in first


def _inspect_output(output: Path) -> _Found:
    """Classify what is at ``output`` and ``output.data`` without changing anything.

    ``load``: a PFM with a pfm-dask journal; ``pfm``: a PFM without one (made by ABE's
    tools, or before journals); ``foreign``: anything else (a directory, a file that is not
    a PFM handle, a ``.data`` folder that is not a PFM's).
    """
    data = Path(str(output) + ".data")
    if output.is_dir():
        return _Found("foreign", "a directory (-o names the PFM handle file to create, such as "
                                 f"{output / 'survey.pfm'})")
    if not output.exists() and not data.exists():
        if output.is_symlink():
            return _Found("foreign", "a dangling symbolic link")
        return _Found("nothing")
    if output.exists() and not _is_pfm_handle(output):
        return _Found("foreign", "a file that is not a PFM handle file (its first line lacks "
                                 "'PFM Handle File')")
    if data.exists() and not data.is_dir():
        return _Found("foreign", f"{data} is a file, not a PFM data folder")
    if not data.exists():
        return _Found("foreign", f"a PFM handle file whose data folder {data} is missing")
    try:
        journal = J.read_journal(output)
        static = J.read_static(output)
    except LoadError as err:
        return _Found("foreign", f"a PFM whose load journal cannot be read ({err.reason})")
    if not output.exists():
        # A new load claims the path by making the data folder and writes its load.json
        # there before any other file (writer.PfmWriter._create): killed before its handle,
        # it leaves its load.json (or, killed while writing that, only its scratch files)
        if journal is None and (static is not None or _only_scratch(data)):
            return _Found("load", static=static)
        if static is None and journal is None:
            return _Found("foreign", f"a folder {data} that holds no pfm-dask load journal")
        return _Found("foreign", f"a load journal in {data} but no PFM handle file")
    if journal is None and static is None:
        return _Found("pfm")
    return _Found("load", journal=journal, static=static)


def _only_scratch(data: Path) -> bool:
    """Whether the folder ``data`` holds nothing but a load's scratch files (no PFM part)."""
    try:
        return all(p.name in _OWN_SCRATCH for p in data.iterdir())
    except OSError:
        return False


def _refuse_foreign(output: Path, found: _Found) -> ConfigError:
    return ConfigError(f"refusing to write here: found {found.what}; nothing was changed. "
                       "Name a new output, or move that away yourself", path=output)


def _remove_own_unfinished(output: Path) -> None:
    """Delete a fresh load that its ``load.json`` proves ours and that died before its first
    checkpoint: the handle, the PFM's parts and our scratch files, nothing else."""
    remove_load_files(output, "the unfinished load")


def remove_earlier_load(output: Path, inputs_in: Path) -> bool:
    """Delete the PFM at ``output`` when its own journal proves it a pfm-dask load of files
    inside the folder ``inputs_in`` (``pfm-dask demo`` starting over): the handle, the PFM's
    parts and the load's files, nothing else. Anything else there is refused
    (:class:`ConfigError`), unchanged. True if a load was removed, False if nothing was there."""
    found = _inspect_output(output)
    if found.kind == "nothing":
        return False
    folder = os.path.join(os.path.abspath(inputs_in), "")
    given = _journal_given(found.static or {}) if found.kind == "load" else []
    if not given or not all(os.path.abspath(f).startswith(folder) for f in given):
        what = found.what or ("a PFM without a pfm-dask journal" if found.kind == "pfm" else
                              f"a load of other inputs than those in {inputs_in}")
        raise ConfigError(f"refusing to remove {output}: found {what}; nothing was changed. "
                          "Move it away, or name another folder", path=output)
    remove_load_files(output, "the earlier load")
    return True


def remove_load_files(output: Path, what: str) -> None:
    """Delete a load's handle, PFM parts and scratch files, and its then empty data folder;
    refuse (before deleting anything) when the folder holds any other file. ``what`` names
    the load in the refusal."""
    data = Path(str(output) + ".data")
    names = set(_OWN_SCRATCH) | {output.name + s for s in _PART_SUFFIXES}
    others = sorted(p.name for p in data.iterdir() if p.name not in names)
    if others:
        raise ConfigError(f"refusing to remove {what} in {data}: it also holds "
                          f"files that are not the load's ({', '.join(others[:5])}); move them "
                          "away, or name a new output", path=output)
    for name in names:
        try:
            os.unlink(data / name)
        except FileNotFoundError:
            pass
    data.rmdir()
    output.unlink(missing_ok=True)    # a new PFM may die between its folder and its handle


def _given(files: list[str]) -> list[str]:
    """The inputs as a journal records them: deduplicated, absolute, in order."""
    return [os.path.abspath(f) for f in _dedupe(files)[0]]


def _journal_given(static: dict) -> list[str]:
    """The inputs the journaled load was given (older journals: the files it loaded)."""
    if static.get("given") is not None:
        return list(static["given"])
    return [os.path.abspath(r["path"]) for r in static.get("inputs", [])]


def _input_difference(given: list[str], recorded: list[str]) -> str:
    """Words for how two input lists differ (empty when equal)."""
    if given == recorded:
        return ""
    extra = [f for f in given if f not in set(recorded)]
    missing = [f for f in recorded if f not in set(given)]
    parts = []
    if extra:
        parts.append(f"{len(extra)} not in the journal (first: {extra[0]})")
    if missing:
        parts.append(f"{len(missing)} of the journal's not given (first: {missing[0]})")
    if not parts:
        parts.append("the same files in another order")
    return "; ".join(parts)


def _settings_difference(cfg: LoadConfig, recorded: dict) -> str:
    given = J.config_to_dict(cfg)
    diff = J.content_differences(given, recorded)
    return ", ".join(f"{k} {given.get(k)!r} (journal: {recorded.get(k)!r})" for k in diff)


def _refuse_mismatch(output: Path, what: str, inputs: str, settings: str) -> ConfigError:
    parts = ([f"inputs differ: {inputs}"] if inputs else []) + (
        [f"settings differ: {settings}"] if settings else [])
    return ConfigError(f"--resume continues {what} with the inputs and settings in its journal, "
                       f"and these differ ({'; '.join(parts)}). Give the same inputs and "
                       "options, or none at all (the journal has them)", path=output)


def _resume_job(files: list[str], output: Path, cfg: LoadConfig | None,
                job, static: dict) -> tuple[list[str], LoadConfig, bool]:
    """Check that a resume continues the same load; returns its files, settings and append flag."""
    job.static = job.static or static
    job.input_problems = list(static.get("input_problems") or [])
    journal_files = [r["path"] for r in static["inputs"]]
    _compare_with_journal(files, cfg, output, static, "the interrupted load")
    saved = J.config_from_dict(static["cfg"])
    if cfg is not None:  # the run's own layout settings (the window's backlog); the plan is kept
        from dataclasses import fields, replace

        from .config import CONTENT

        saved = replace(saved, **{f.name: getattr(cfg, f.name) for f in fields(cfg)
                                  if f.metadata.get("decides") != CONTENT})
    changed = J.check_inputs(static)
    if changed:
        raise ConfigError("input file(s) changed since the load started, so their soundings "
                          "in the PFM may not match them: " + ", ".join(changed)
                          + "; remove the PFM and load again", path=output)
    return journal_files, saved, bool(static.get("append"))


def _compare_with_journal(files: list[str], cfg: LoadConfig | None, output: Path,
                          recorded: dict, what: str) -> None:
    """Refuse a resume whose inputs or content settings differ from the journal's."""
    inputs = _input_difference(_given(files), _journal_given(recorded)) if files else ""
    settings = _settings_difference(cfg, recorded["cfg"]) if cfg is not None else ""
    if inputs or settings:
        raise _refuse_mismatch(output, what, inputs, settings)


def _new_files(files: list[str], output: Path) -> list[str]:
    """The inputs not yet in the PFM's ``.ctl`` (under any name: by device and inode)."""
    from .inputs import file_key

    _, existing = _existing(output, True)
    known = {os.path.abspath(p) for p in existing} | {file_key(p) for p in existing}
    return [f for f in files if os.path.abspath(f) not in known and file_key(f) not in known]


def _plan_resume(files, output: Path, cfg, append: bool, job, say):
    """Decide what ``--resume`` does here: returns (files, cfg, append, resume) for the run,
    or :class:`Complete` when there is nothing to do (``job``: the run's ``pipeline._Job``). Refuses (exit 2) anything that
    the journal does not prove to be this load, before touching a byte."""
    found = _inspect_output(output)
    if found.kind == "foreign":
        raise _refuse_foreign(output, found)
    if found.kind == "nothing":
        if append:
            raise ConfigError("--append needs an existing PFM", path=output)
        if not files:
            raise ConfigError(f"nothing to resume: {output} does not exist; start the load "
                              "without --resume", path=output)
        say(f"nothing to resume in {output}: starting the load")
        return files, cfg if cfg is not None else LoadConfig(), False, False
    if found.kind == "pfm":
        if append and files and _new_files(files, output):
            say(f"nothing to resume in {output}: starting the append")
            return files, _need_cfg(cfg), True, False
        raise J.no_journal_error(output)
    state, static = found.journal, found.static
    phase = (state or {}).get("phase")
    if state is None and static is None:
        # a data folder holding only a load's scratch files: a new load killed as it
        # claimed the path, before it wrote its load.json or any of the PFM
        if not files:
            raise J.no_journal_error(output)
        say(f"nothing to resume in {output} (stopped as it began): starting the load again")
        _remove_own_unfinished(output)
        return files, _need_cfg(cfg), False, False
    if state is None:
        # load.json without a checkpoint: a fresh load killed before its first checkpoint
        if static.get("append") or not files:
            raise J.no_journal_error(output)
        _compare_with_journal(files, cfg, output, static, "the interrupted load")
        say(f"nothing to resume in {output} (stopped before its first checkpoint): "
            "starting the load again")
        _remove_own_unfinished(output)
        return files, cfg if cfg is not None else J.config_from_dict(static["cfg"]), False, False
    if phase == "append-pending":
        pending = state["pending_append"]
        _compare_with_journal(files, cfg, output, pending, "the interrupted append")
        say(f"the append to {output} stopped before it wrote anything: starting it again")
        return (files or list(pending["given"]),
                cfg if cfg is not None else J.config_from_dict(pending["cfg"]), True, False)
    if phase == "complete":
        if append and files and _new_files(files, output):
            say(f"nothing to resume in {output}: starting the append")
            return files, _need_cfg(cfg), True, False
        if static is not None:
            _compare_with_journal(files, cfg, output, static, "the load")
        return Complete(state)
    if static is None:
        raise J.no_journal_error(output)
    files, cfg, append = _resume_job(files, output, cfg, job, static)
    return files, cfg, append, True


def _need_cfg(cfg: LoadConfig | None) -> LoadConfig:
    return cfg if cfg is not None else LoadConfig()


