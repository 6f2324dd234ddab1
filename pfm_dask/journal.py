"""Crash safety of a load: the journal, the undo log, atomic publishing (no Dask here).

A load builds straight into its final names and is marked incomplete until its
final check passes. Beside the PFM parts, ``X.pfm.data/`` holds:

``load.json``
    written once at the start: the command line and the resume command, the
    inputs with size and mtime, the settings, the piece plan.
``journal.json``
    the last checkpoint: epoch, phase, the durable watermark (the next piece
    ``seq`` to write), the sizes of the parts, and the writer's state (per-file
    counts, line trackers). Published atomically (:func:`atomic_write`).
``undo.log``, ``undo.log.b``
    pre-images of the in-place overwrites made since the last checkpoint
    (bin records and chain tail records), each entry fsynced before its
    overwrite is issued (:class:`~pfm_dask.undo.UndoLog`); while a checkpoint is being made
    durable behind the writer, the next interval's entries go to the other file.
``touched.log``
    the bins that received soundings, each once, appended as int64; the
    checkpoint records its length (:class:`TouchedLog`).
``filter-redo.bin``
    the area filter's result, (record offset, slot, validity) per changed
    sounding: applying it is idempotent.
``lock``
    an ``flock`` held by the process that writes the PFM.

Resume = apply the undo log in reverse, truncate ``.ndx``/``.ctl``/``.lin``
and ``touched.log`` to the checkpoint sizes, restore the writer's state, and
go on from the watermark. docs/reliability.md has the whole story.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shlex
import socket
import time
from pathlib import Path

import numpy as np

from ._faults import crash_point  # noqa: F401  (re-exported: the journal's crash points)
from ._fileio import pwrite_all
from .errors import ConfigError, LoadError
from .undo import UNDO_ALT_SUFFIX, UndoLog

__all__ = [
    "PHASES",
    "JOURNAL_NAME",
    "atomic_write",
    "fsync_path",
    "fsync_dir",
    "read_journal",
    "read_static",
    "journal_paths",
    "UndoLog",
    "Int64Log",
    "TouchedLog",
    "PfmLock",
    "lock_holder",
    "resume_command",
    "mark_append",
    "config_to_dict",
    "config_from_dict",
    "content_differences",
    "is_disk_full",
    "disk_full_error",
    "crash_point",
]

#: The phases of a load, in order. Only ``complete`` means the PFM is valid.
#: ``append-pending``: an append has marked itself but not yet changed a byte of the PFM.
PHASES = ("append-pending", "loading", "loaded", "area-filter", "filtered", "recompute", "check",
          "complete")

JOURNAL_NAME = "journal.json"
STATIC_NAME = "load.json"
UNDO_NAME = "undo.log"
TOUCHED_NAME = "touched.log"
REDO_NAME = "filter-redo.bin"
SUMS_NAME = "area-sums.bin"
LOCK_NAME = "lock"
FORMAT = 1

_DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}


# ---------------------------------------------------------------- publishing
def fsync_path(path: str | os.PathLike) -> None:
    """fsync a file by name (fsync reaches the file's dirty pages through any descriptor)."""
    fd = os.open(os.fspath(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory, so that a rename or a new name inside it is durable."""
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data, name=None) -> None:
    mv = memoryview(data).cast("B")
    done = 0
    while done < len(mv):
        try:
            n = os.write(fd, mv[done:])
        except OSError as exc:
            if exc.filename is None and name is not None:
                exc.filename = os.fspath(name)
            raise
        if n <= 0:
            raise OSError(errno.EIO, "short write")
        done += n


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace ``path`` with ``data`` all at once: tmp in the same dir, fsync, rename, fsync dir."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            _write_all(fd, data, tmp)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def journal_paths(pfm_path: str | os.PathLike) -> dict:
    """The journal's files for the PFM whose handle is ``pfm_path``."""
    data = Path(os.fspath(pfm_path) + ".data")
    return {"data": data, "journal": data / JOURNAL_NAME, "static": data / STATIC_NAME,
            "undo": data / UNDO_NAME, "undo_alt": data / (UNDO_NAME + UNDO_ALT_SUFFIX),
            "touched": data / TOUCHED_NAME,
            "redo": data / REDO_NAME, "sums": data / SUMS_NAME, "lock": data / LOCK_NAME}


def _read_json(path: Path) -> dict | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise LoadError(f"cannot read the load journal: {err.strerror}", path=path) from err
    try:
        out = json.loads(raw)
    except ValueError as err:
        raise LoadError(f"the load journal is not valid JSON ({err})", path=path) from err
    if not isinstance(out, dict) or out.get("format") != FORMAT:
        raise LoadError("the load journal has an unknown format", path=path)
    return out


def read_journal(pfm_path: str | os.PathLike) -> dict | None:
    """The last checkpoint of the load that writes ``pfm_path``, or None if it has no journal."""
    return _read_json(journal_paths(pfm_path)["journal"])


def read_static(pfm_path: str | os.PathLike) -> dict | None:
    """The load's ``load.json`` (command, inputs, settings, plan), or None."""
    return _read_json(journal_paths(pfm_path)["static"])


def mark_append(pfm_path: str | os.PathLike, given: list[str], cfg: dict,
                resume_cmd: str) -> None:
    """Record, before an append changes anything, that it is under way (phase
    ``append-pending``): a resume then finishes it instead of finding a complete PFM.

    The previous checkpoint's epoch and result are kept; the PFM's own parts are untouched
    until the writer's first checkpoint replaces this state.
    """
    paths = journal_paths(pfm_path)
    try:
        old = read_journal(pfm_path) or {}
    except LoadError:
        old = {}
    state = {**old, "format": FORMAT, "phase": "append-pending",
             "pending_append": {"given": list(given), "cfg": cfg},
             "resume_command": resume_cmd, "time": time.time()}
    state.setdefault("epoch", 0)
    atomic_write(paths["journal"], json.dumps(state).encode())


class Int64Log:
    """A file of int64 values appended in order (``size`` bytes so far), fsynced on demand."""

    def __init__(self, path: str | os.PathLike, *, size: int | None = None):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if size is not None:
            os.ftruncate(self.fd, int(size))
        self.size = os.fstat(self.fd).st_size
        self.seconds = 0.0

    def read(self) -> np.ndarray:
        n = self.size // 8
        raw = os.pread(self.fd, n * 8, 0)
        return np.frombuffer(raw, dtype="<i8").astype(np.int64)

    def append(self, values: np.ndarray) -> bytes:
        """Append ``values`` (any shape, as int64 in C order); returns the bytes written."""
        if values.size == 0:
            return b""
        t0 = time.perf_counter()
        data = np.ascontiguousarray(values, dtype="<i8").tobytes()
        pwrite_all(self.fd, data, self.size)
        self.size += len(data)
        self.seconds += time.perf_counter() - t0
        return data

    def sync(self) -> None:
        os.fsync(self.fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class TouchedLog(Int64Log):
    """The bins that received soundings, each appended once (int64), durable at checkpoints."""


# ---------------------------------------------------------------- lock
def _try_flock(fd: int, op: int) -> bool:
    """``flock(fd, op | LOCK_NB)``: True when taken, False when another process holds it."""
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return True
    except OSError as err:
        if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        return False


def _holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it (``pid N on HOST``), or ``unknown``."""
    return os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "unknown"


class PfmLock:
    """An exclusive ``flock`` on ``X.pfm.data/lock``: one writer per PFM at a time.

    A writer whose process died releases it at once (the kernel drops the lock);
    a writer still running (an orphaned worker finishing a write) is waited for
    up to ``wait`` seconds, then the resume is refused.
    """

    def __init__(self, path: str | os.PathLike, *, wait: float = 60.0):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.time() + wait
        while not _try_flock(self.fd, fcntl.LOCK_EX):
            if time.time() >= deadline:
                holder = _holder(self.fd)
                os.close(self.fd)
                raise LoadError(f"another process is writing this PFM ({holder}); "
                                "wait for it to end, or stop it, then try again", path=self.path)
            time.sleep(0.2)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            finally:
                os.close(self.fd)
                self.fd = None


def lock_holder(pfm_path: str | os.PathLike) -> str | None:
    """Who holds the PFM's lock now (``pid N on HOST``, or ``unknown``): a load is writing it;
    None when no one does. Looks only: never creates the lock file, never keeps the lock."""
    try:
        fd = os.open(journal_paths(pfm_path)["lock"], os.O_RDONLY)
    except OSError:
        return None
    try:
        if not _try_flock(fd, fcntl.LOCK_SH):
            return _holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def remove_scratch(pfm_path: str | os.PathLike) -> bool:
    """Delete a finished load's scratch files (undo, touched, redo, lock) if no one holds the
    lock; a load killed right after it was marked complete leaves them. True if removed."""
    paths = journal_paths(pfm_path)
    if not paths["lock"].exists():
        return False
    try:
        lock = PfmLock(paths["lock"], wait=0.0)
    except LoadError:
        return False
    try:
        for key in ("undo", "undo_alt", "touched", "redo"):
            try:
                os.unlink(paths[key])
            except OSError:
                pass
        os.unlink(paths["lock"])
    finally:
        lock.release()
    return True


# ---------------------------------------------------------------- helpers
def resume_command(output: str | os.PathLike, options: list[str] | None = None) -> str:
    """The command that continues the load writing ``output``, valid from any directory.

    Inputs and content settings are left out: a resume takes them from the journal.
    ``options`` are the run options to keep (``--workers 4``, ``--scheduler ADDR``), with
    any path in them already absolute.
    """
    return shlex.join(["pfm-dask", "load", "-o", os.path.abspath(os.fspath(output)),
                       *(options or []), "--resume"])


def config_to_dict(cfg) -> dict:
    """A :class:`~pfm_dask.config.LoadConfig` as plain JSON values."""
    return json.loads(json.dumps(cfg.to_dict()))


def config_from_dict(d: dict):
    """The inverse of :func:`config_to_dict` (:meth:`~pfm_dask.config.LoadConfig.from_dict`)."""
    from .config import LoadConfig

    return LoadConfig.from_dict(d)


def content_differences(a: dict, b: dict) -> list[str]:
    """Names of the settings that decide the content and differ between two config dicts
    (the fields whose metadata says ``content``: pfm_dask.config)."""
    from .config import LoadConfig

    return LoadConfig.content_differences(a, b)


def is_disk_full(err: BaseException) -> bool:
    """True for the out-of-space errors: ENOSPC, EFBIG (file size limit), EDQUOT."""
    while err is not None:
        if isinstance(err, OSError) and err.errno in _DISK_FULL:
            return True
        err = err.__cause__ or err.__context__
    return False


def disk_full_error(err: BaseException, where: str | os.PathLike, resume: str) -> LoadError:
    """The user's message for a full disk: which file, why, and how to continue."""
    e = err
    while e is not None and not (isinstance(e, OSError) and e.errno in _DISK_FULL):
        e = e.__cause__ or e.__context__
    name = getattr(e, "filename", None) or os.fspath(where)
    why = {errno.EFBIG: "the file size limit was reached (disk full for this process)",
           errno.EDQUOT: "the disk quota is exhausted"}.get(getattr(e, "errno", None),
                                                            "the disk is full")
    return LoadError(f"writing failed: {why} ({getattr(e, 'strerror', None) or e}). The PFM is "
                     f"incomplete and marked so; make room, then continue with: {resume}",
                     path=name)


def check_inputs(static: dict) -> list[str]:
    """Inputs of a journaled load that changed since it started (vanished files are allowed)."""
    changed = []
    for rec in static.get("inputs", []):
        try:
            st = os.stat(rec["path"])
        except OSError:
            continue
        if rec.get("size") is None:
            continue
        if st.st_size != rec["size"] or st.st_mtime_ns != rec["mtime_ns"]:
            changed.append(rec["path"])
    return changed


def input_record(path: str) -> dict:
    """Size and mtime of an input, to notice on resume that it changed."""
    try:
        st = os.stat(path)
        return {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
    except OSError:
        return {"path": str(path), "size": None, "mtime_ns": None}


def no_journal_error(output) -> ConfigError:
    return ConfigError("this PFM has no load journal to resume (it was not written by pfm-dask, "
                       "or its load died before its first checkpoint); nothing was changed. To "
                       "add files to it use --append; to start again, remove it yourself",
                       path=output)
