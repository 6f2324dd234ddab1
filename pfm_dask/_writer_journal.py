"""The writer's crash safety: its journal, checkpoints and resume (no Dask here).

:class:`WriterJournal` is mixed into :class:`~pfm_dask.writer.PfmWriter`: it starts the
journal of a new load (lock, ``load.json``, undo and touched logs), publishes checkpoints
(flush and fsync the parts, write ``journal.json``, start a new undo interval) and, on
resume, rolls the PFM back to the last checkpoint and restores the writer's state from it;
at the end it closes the PFM durably, which the writer runs beside its check (:class:`Beside`:
a job on a thread of its own). The files and their format are :mod:`pfm_dask.journal`'s;
docs/reliability.md tells the whole story.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import numpy as np

from . import journal as J
from . import pfm
from ._faults import crash_point
from .errors import LoadError
from .lines import LineTracker

__all__ = ["WriterJournal", "Beside"]


class WriterJournal:
    """Journal, checkpoints and resume of a :class:`~pfm_dask.writer.PfmWriter` (a mixin)."""

    def _start_journal(self, static: dict, *, checkpoint: bool = True) -> None:
        """Lock the PFM, write ``load.json`` and (``checkpoint``) the first checkpoint, before
        any input is added. A new PFM leaves it to the caller, after the inputs are listed: a
        kill before then finds ``load.json`` without a checkpoint and starts the load again."""
        self._flock = J.PfmLock(self._jp["lock"], wait=5.0)
        try:
            old = J.read_journal(self.path)  # an append onto a finished load: keep counting
        except LoadError:
            old = None
        self._epoch = int(old["epoch"]) if old else 0
        if self._static is None:      # (a new PFM wrote it when it claimed its path)
            self._write_static(static)
        self._touched_log = J.TouchedLog(self._jp["touched"], size=0)
        self._undo = J.UndoLog(self._jp["undo"])
        # the new names (handle, data directory) must outlive a crash too
        J.fsync_path(self.path)
        J.fsync_dir(self.path.parent)
        if checkpoint:
            self._checkpoint()
        self.pfm.undo = self._undo

    def _write_static(self, static: dict) -> None:
        """Write ``load.json``: the load's facts, and the proof that the output is this load's
        (a new PFM writes it in its data directory before any other file, so that a kill
        at any moment leaves an output a rerun knows for its own)."""
        self._static = dict(static, format=J.FORMAT, pfm=str(self.path), n_pieces=self.n_pieces,
                            append=self.append)
        self.resume_command = static.get("resume_command") or self.resume_command
        J.atomic_write(self._jp["static"], json.dumps(self._static).encode())

    def _part_paths(self) -> dict:
        stem = os.path.join(str(self.path) + ".data", self.path.name)
        return {"bin": stem + ".bin", "ndx": stem + ".ndx", "ctl": stem + ".ctl",
                "lin": stem + ".lin", "cvg": stem + ".cvg"}

    def _state(self) -> dict:
        parts = self._part_paths()
        sizes = {"ndx": int(self.pfm.ndx_size), "ctl": os.path.getsize(parts["ctl"]),
                 "lin": os.path.getsize(parts["lin"]), "bin": os.path.getsize(parts["bin"])}
        nums = self.file_numbers
        return {
            "format": J.FORMAT, "epoch": self._epoch, "phase": self.jphase,
            "watermark": self._next, "n_pieces": self.n_pieces, "sizes": sizes,
            "group_bytes": self.group_bytes,
            "touched_size": self._touched_log.size,
            "file_numbers": nums,
            "per_file": None if nums is None else [self.per_file[n] for n in nums],
            "lines": {str(f): {"prev_heading": t.prev_heading, "names": t.names,
                               "numbers": self._file_lines.get(f, [])}
                      for f, t in self._trackers.items()},
            "counters": {"soundings_written": self.soundings_written,
                         "bytes_written": self.bytes_written,
                         "pieces_written": self.pieces_written, "files_done": self.files_done},
            "area_filter": self._filter_stats, "redo": self._redo, "check": self._check,
            "result": self._result, "resume_command": self.resume_command,
            "pid": os.getpid(), "host": socket.gethostname(), "time": time.time(),
        }

    def _checkpoint(self, phase: str | None = None, *, behind: bool = False,
                    before_writes: bool = False) -> None:
        """Make everything written so far durable and publish it as the new checkpoint.

        ``behind`` (the periodic checkpoints while loading): the state is taken and the next
        undo interval started now, in the undo log's other file, but the fsyncs and the
        publishing run on a thread of their own while the writer goes on; until the
        checkpoint is published, the previous interval's pre-images stay in place, so a crash
        meanwhile rolls back to the previous checkpoint through both intervals' entries. One
        such checkpoint is in flight at a time; every other checkpoint waits for it first.

        ``before_writes`` (a new load's first checkpoint): the fsyncs and the publishing run
        on a thread of their own while the pieces are prepared, and the writer's first write
        waits for them (:meth:`_before_writing`): on disk the same
        order as a checkpoint made in place, nothing written before it is published.
        """
        if not self._journal_on:
            if phase:
                self.jphase = phase
            return
        self._join_checkpoint()
        t0 = time.perf_counter()
        if phase:
            self.jphase = phase
        if not self.pfm.closed:
            self.pfm.flush()
        dirty, self._dirty = self._dirty, False
        self._epoch += 1
        state = json.dumps(self._state()).encode()
        limits = {"bin": os.path.getsize(self._part_paths()["bin"]), "ndx": int(self.pfm.ndx_size)}
        parts = list(self._part_paths().values()) if dirty else []
        phase_now = self.jphase
        if before_writes:
            self._undo.begin(self._epoch, limits)
            self._writes_wait = True
            self._ckpt_error = None
            self._ckpt_thread = threading.Thread(
                target=self._publish_first, args=(parts, state, phase_now),
                name="pfm-checkpoint", daemon=True)
            self._ckpt_thread.start()
        elif behind:
            self._undo.begin(self._epoch, limits, keep_previous=True)
            self._ckpt_error = None
            self.timings["journal_checkpoint_behind"] += 0.0   # the key exists before the thread
            self._ckpt_thread = threading.Thread(
                target=self._publish_behind, args=(parts, state, phase_now),
                name="pfm-checkpoint", daemon=True)
            self._ckpt_thread.start()
        else:
            self._publish(parts, state, phase_now)
            self._undo.begin(self._epoch, limits)
        self._last_ckpt = time.monotonic()
        self._ckpt_at = (self.jphase, self._next)
        self.timings["journal_checkpoint"] += time.perf_counter() - t0
        self.checkpoints += 1

    def _publish(self, parts: list, state: bytes, phase: str, behind: bool = False) -> None:
        """fsync ``parts`` and the touched log, then publish ``state`` as ``journal.json``."""
        for p in parts:
            J.fsync_path(p)
        if parts:
            self._touched_log.sync()
        if behind:
            crash_point("checkpoint-behind")    # durable, not yet published; the writer goes on
        J.atomic_write(self._jp["journal"], state)
        crash_point("checkpoint")
        crash_point(f"checkpoint-{phase}")

    def _publish_behind(self, parts: list, state: bytes, phase: str) -> None:
        t0 = time.perf_counter()
        try:
            self._publish(parts, state, phase, behind=True)
        except BaseException as err:  # noqa: BLE001 - raised by the next _join_checkpoint
            self._ckpt_error = err
        self.timings["journal_checkpoint_behind"] += time.perf_counter() - t0

    def _publish_first(self, parts: list, state: bytes, phase: str) -> None:
        try:
            self._publish(parts, state, phase)
        except BaseException as err:  # noqa: BLE001 - raised by the next _join_checkpoint
            self._ckpt_error = err

    def _before_writing(self) -> None:
        """Wait for the first checkpoint of a new load (``before_writes``), once: called before
        the writer's first write to the PFM."""
        if self._writes_wait:
            t0 = time.perf_counter()
            self._writes_wait = False
            self._join_checkpoint()
            self.timings["journal_checkpoint"] += time.perf_counter() - t0

    def _join_checkpoint(self) -> None:
        """Wait for the checkpoint being published behind the writer, if any; raise its error."""
        th = getattr(self, "_ckpt_thread", None)
        if th is None:
            return
        th.join()
        self._ckpt_thread = None
        err, self._ckpt_error = self._ckpt_error, None
        if err is not None:
            raise err

    def _final_step_redone(self) -> bool:
        """Whether the final step may skip its phase checkpoints: a new PFM (not an append)
        without the area filter. A crash in it then resumes from the last checkpoint of the
        loading phase: the rollback puts back every record written since (their pre-images
        are in that interval's undo log), the pieces after its watermark are written again,
        and the final step runs whole. A bin the crashed recompute rewrote and no such piece
        touches keeps the statistics that recompute gave it, and the recompute gives them
        again (it is idempotent: a crash in a recompute that had its own checkpoint reran it
        over such bins just the same; ``tests/test_resume.py``). The parts are fsynced once,
        beside the check, instead of at every phase (each fsynced the ``.bin``; the first,
        on a long load, the ``.ndx`` written since the last checkpoint: 0.4-0.5 s)."""
        return self._journal_on and not self.append and not self.cfg.area_filter

    def _resume(self) -> None:
        """Roll the PFM back to the last checkpoint and take up the writer's state from it."""
        static = J.read_static(self.path)
        if static is None or J.read_journal(self.path) is None:
            raise J.no_journal_error(self.path)
        self._flock = J.PfmLock(self._jp["lock"])
        state = J.read_journal(self.path)  # again, now that no one else writes
        self._static = static
        self.resume_command = static.get("resume_command") or self.resume_command
        if self.cfg is None:
            self.cfg = J.config_from_dict(static["cfg"])
        self.append = bool(static.get("append"))
        self.n_pieces = int(static["n_pieces"])
        self.group_bytes = int(state.get("group_bytes") or self.default_group_bytes(self.cfg))
        parts = self._part_paths()
        self._undo = J.UndoLog(self._jp["undo"])
        rolled = self._undo.rollback(int(state["epoch"]), parts)
        # the entries just put back are spent: empty both files before this process publishes
        # a checkpoint of its own, whose epoch may be one the dead run had already begun an
        # interval under (a checkpoint made behind it); a kill in between must not apply them
        self._undo.begin(int(state["epoch"]), {})
        sizes = state["sizes"]
        for part in ("ndx", "ctl", "lin"):
            if os.path.getsize(parts[part]) != sizes[part]:
                os.truncate(parts[part], sizes[part])
            J.fsync_path(parts[part])
        self._touched_log = J.TouchedLog(self._jp["touched"], size=int(state["touched_size"]))
        self.pfm = pfm.open_pfm(self.path, "r+")
        if self.threads is not None:
            self.pfm.pack_threads = self.threads
        self.grid = self.pfm.grid
        self.touched = np.zeros(self.pfm.grid.width * self.pfm.grid.height, dtype=bool)
        self.touched[self._touched_log.read()] = True
        self._epoch = int(state["epoch"])
        self.jphase = state["phase"]
        self._next = int(state["watermark"])
        for k, v in state["counters"].items():
            setattr(self, k, v)
        self._filter_stats = state.get("area_filter")
        self._redo = state.get("redo")
        inputs = [r["path"] for r in static["inputs"]]
        if state.get("file_numbers") is None:  # died before the inputs were listed
            self._add_files(inputs)
        else:
            self.file_numbers = [int(n) for n in state["file_numbers"]]
            self.files = inputs
            self.per_file = {n: rec for n, rec in zip(self.file_numbers, state["per_file"])}
        for f, t in state.get("lines", {}).items():
            fnum = int(f)
            tr = LineTracker(self.per_file[fnum]["path"])
            tr.prev_heading = t["prev_heading"]
            tr.names = list(t["names"])
            self._trackers[fnum] = tr
            self._file_lines[fnum] = [int(x) for x in t["numbers"]]
        self.resumed_from = {"phase": state["phase"], "watermark": self._next,
                             "epoch": self._epoch, "undo_bytes": rolled}
        self._checkpoint()  # the rolled-back state, now under this process's name
        if self.jphase == "loading":
            self.pfm.undo = self._undo

    def _close_journal(self, *, remove: bool = False) -> None:
        """Close the journal's files and release the lock; ``remove`` deletes the scratch files."""
        th = getattr(self, "_ckpt_thread", None)
        if th is not None:      # a checkpoint still being published: let it end first
            th.join()
            self._ckpt_thread = None
        for obj in (self._undo, self._touched_log):
            if obj is not None:
                try:
                    obj.close()
                except OSError:
                    pass
        if remove:
            for key in ("undo", "undo_alt", "touched", "redo", "sums"):
                try:
                    os.unlink(self._jp[key])
                except OSError:
                    pass
        if self._flock is not None:
            if remove:
                try:
                    os.unlink(self._jp["lock"])
                except OSError:
                    pass
            self._flock.release()
            self._flock = None

    def _disk_full(self, err: BaseException) -> LoadError:
        return J.disk_full_error(err, str(self.path) + ".data", self.resume_command)

    def journal_cost(self) -> dict:
        """Seconds the crash safety cost this writer: checkpoints, undo log, touched log."""
        undo = self._undo.seconds if self._undo is not None else 0.0
        tl = self._touched_log.seconds if self._touched_log is not None else 0.0
        ck = self.timings.get("journal_checkpoint", 0.0)
        behind = self.timings.get("journal_checkpoint_behind", 0.0)
        return {"seconds": ck + undo + tl, "checkpoint_seconds": ck, "undo_seconds": undo,
                "touched_seconds": tl, "checkpoints": self.checkpoints,
                # the fsyncs and publishing of checkpoints made behind the writer (own thread)
                "checkpoint_behind_seconds": behind,
                # the undo log's fsyncs on the store's write-behind thread (not the writer's)
                "undo_fsync_behind_seconds": (self._undo.fsync_seconds_behind
                                              if self._undo is not None else 0.0),
                "undo_bytes": self._undo.bytes_saved if self._undo is not None else 0}

    def _close_durable(self) -> None:
        """Close the PFM, fsyncing every part (and the touched-bins log) with the journal on."""
        t_close = time.perf_counter()
        self.pfm.close(durable=self._journal_on)  # fsyncs every part
        if self._journal_on:
            self._touched_log.sync()
            self._dirty = False         # every part is durable now
            self.timings["journal_checkpoint"] += time.perf_counter() - t_close


class Beside:
    """``fn()`` on a thread of its own; :meth:`join` waits for it and raises what it raised."""

    def __init__(self, fn):
        self._error: BaseException | None = None

        def run():
            try:
                fn()
            except BaseException as exc:  # noqa: BLE001 - raised again by join()
                self._error = exc

        self._thread = threading.Thread(target=run, name="pfm-sync", daemon=True)
        self._thread.start()

    def join(self) -> None:
        self._thread.join()
        if self._error is not None:
            raise self._error
