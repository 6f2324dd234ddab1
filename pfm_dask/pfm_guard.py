"""Before a PFM is read for a product (``info``, ``dump``, ``export``, ``load --png``): is it
a finished load, and does it pass the fast structural checks?

An unfinished load (its journal beside the PFM in a phase other than
``complete``) holds a part of its soundings and statistics that were never
recomputed: anything drawn or exported from it looks fine and is wrong. A PFM
that fails the fast checks (handle, ``.ctl``, ``.lin``, header, file sizes,
coverage header: :func:`pfm_dask.pfm.check` with ``bins=False``, a few reads)
gives garbage or a traceback. Both are refused in one line naming the way
out (the resume command, ``pfm-dask check``), unless ``force``; ``pfm-dask
check`` itself is never guarded (it is how one looks at such a file).
"""

from __future__ import annotations

import os

from . import journal as J
from .errors import ConfigError, LoadError, PfmFormatError

__all__ = ["refuse_unusable"]


def _unfinished(path) -> str | None:
    """Why the pfm-dask load writing ``path`` is not finished, with its resume command."""
    try:
        state = J.read_journal(path)
    except LoadError:
        return "its load journal is unreadable, so the load that writes it may not have finished"
    if state is None or state.get("phase") == "complete":
        return None
    phase = state.get("phase")
    done = (f", {state.get('watermark', 0):,} of {state.get('n_pieces', 0):,} pieces written"
            if phase == "loading" else "")
    cmd = state.get("resume_command") or J.resume_command(path)
    return f"it is an unfinished load (stopped in phase {phase}{done}): finish it with `{cmd}`"


def refuse_unusable(path, *, force: bool = False) -> list[str]:
    """Raise :class:`ConfigError` (exit 2) when the PFM at ``path`` is an unfinished load or
    fails the fast structural checks; with ``force``, return those reasons as warnings and
    let the caller read it as it is. A path with no PFM at all is left to the reader."""
    from .pfm import check

    reasons = []
    why = _unfinished(path)
    if why:
        reasons.append(why)
    try:
        problems = check(path, journal=False, bins=False)
    except PfmFormatError as err:
        if not (os.path.exists(path) or os.path.isdir(os.fspath(path) + ".data")):
            return []       # nothing there: the reader says so
        problems = [err]
    if problems:
        more = f" (and {len(problems) - 1:,} more)" if len(problems) > 1 else ""
        reasons.append(f"it fails the structural checks: {problems[0]}{more}; "
                       f"`pfm-dask check {path}` lists them")
    if reasons and not force:
        raise ConfigError("; ".join(reasons) + "; give --force to read it as it is",
                          path=path)
    return [f"{path}: read as it is (--force): {r}" for r in reasons]
