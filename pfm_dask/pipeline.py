"""The load: GSF files → Dask tasks → one pinned writer actor → PFM. Its driver, and serial mode.

Shape (docs/usage.md has the user's view, docs/design.md the reasons):

1. **Pre-scan** (one Dask task per file, :func:`~pfm_dask.planning.prescan_file`):
   framing, ping and beam counts, damage, and an extent from a sample of pings.
   The area defaults to the union of the extents.
2. **Plan** (:mod:`pfm_dask.planning`): one piece per file; a file much larger
   than the rest is split into ping ranges, so no piece is larger than a
   fraction of the backlog.
3. **Writer**: a :class:`~pfm_dask.writer.PfmWriter` created as an actor on
   the worker that holds the ``disk`` resource.
4. **Pieces**: tasks restricted to the ``compute`` resource (any worker on a
   cluster where no worker declares it) decode and bin a piece (:func:`~pfm_dask.soundings.prepare_piece`) and hand it straight to
   the actor, which only buffers it; tasks never wait for their turn (that
   deadlocks: docs/design.md). The *driver* holds the window: it submits a
   piece only while the estimated bytes in flight plus the writer's backlog
   stay under ``max_backlog_bytes``.
5. **Final step** on the writer: area filter, recompute, header, check; the
   report (:mod:`pfm_dask.report`) is built from its result.

What runs on the workers (the writer actor, the piece task) is :mod:`pfm_dask.pipeline_tasks`.

``--serial`` runs the same stages in one process without Dask: the baseline
for speedups, and the reference the Dask runs must match byte for byte in the
dump.

Crash safety (docs/reliability.md): the writer keeps a journal beside the PFM;
``resume=True`` continues an interrupted load from its last checkpoint, in any
mode, and submits only the pieces past the writer's watermark. A lost writer
actor stops the load at once with the resume command.
"""

from __future__ import annotations

import logging
import os
import queue
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


from .bins import BinGrid
from .config import LoadConfig, RunOptions
from . import gsf
from . import journal as J
from .auto_area import position_problems
from .backlog import hold_bytes
from .errors import ConfigError, LoadError, PfmDaskError
from .head_start import HeadStart
from .heap import release_code_pages
from .pfm import THREADS as FINAL_THREADS
from .pieces import Piece
from .soundings import prepare_piece
from .outputs import (Complete, _dedupe, _existing, _given, _inspect_output, _new_files,
                      _plan_resume, _refuse_busy, _refuse_foreign, _refuse_unfinished, _unfinished,
                      check_append_fits)
# planning and the report have modules of their own; the names callers use stay importable here
# (a test patching MAX_GRID_BINS patches it in pfm_dask.planning, where it is read)
from .planning import (SMALL_LOAD_BYTES, SMALL_LOAD_BYTES_SWATH, _estimate_bytes,
                       _strict_check, area_from_scans, auto_mode, grid_sanity, plan_pieces,
                       prescan_file)
from .report import LoadResult, _finalise, write_report
from .writer import PfmWriter
from . import pipeline_tasks as tasks
from .pipeline_tasks import STATUS_TOPIC as _STATUS_TOPIC, WriterActor, _piece_task, _summaries
from .warmup import LOAD_KERNELS, KernelWatch, warm_workers
from .progress import follow, relay

__all__ = ["prescan_file", "area_from_scans", "plan_pieces", "run_load", "LoadResult",
           "auto_mode", "SMALL_LOAD_BYTES", "SMALL_LOAD_BYTES_SWATH"]

log = logging.getLogger("pfm_dask")

_SLOTS_EVERY = 2.0  # seconds between two looks at the cluster's compute slots


# ------------------------------------------------------------------ serial
def _plan(scans: list[dict], job: "_Job") -> tuple[BinGrid, list[Piece]]:
    """The grid and the pieces; for an append, first prove that every input fits the PFM's
    fields, then mark the append in the journal: both before anything is written."""
    cfg, output, append = job.cfg, job.output, job.append
    existing_grid, existing = _existing(output, append)
    if append:
        check_append_fits(output, scans, cfg)
    grid = existing_grid if existing_grid is not None else area_from_scans(scans, cfg)
    job.input_problems = job.input_problems + position_problems(scans)
    if existing_grid is None:
        job.warnings = grid_sanity(grid, scans, cfg, force=job.options.force)
        for w in job.warnings:
            job.say(w)
    pieces = plan_pieces(scans, cfg, first_file_number=len(existing))
    log.info("plan: %d pieces from %d files on a grid of %d x %d bins", len(pieces),
             len(job.files), grid.width, grid.height)
    if append and job.options.journal:
        J.mark_append(output, job.given or _given(job.files), J.config_to_dict(cfg),
                      job.resume_cmd)
        J.crash_point("append-marked")
    return grid, pieces


@dataclass
class _Job:
    """One run of a load: what it loads where, its options, and a fresh load's journal facts
    or a resume's plan."""

    files: list = field(default_factory=list)
    output: Path | None = None
    cfg: LoadConfig | None = None
    append: bool = False
    options: RunOptions = field(default_factory=RunOptions)
    progress: Callable[[dict], None] | None = None
    resume: bool = False
    static: dict | None = None          # load.json of the load being resumed
    command: list | None = None         # the command line, for the resume command
    resume_cmd: str = ""
    input_problems: list = field(default_factory=list)
    given: list = field(default_factory=list)   # the inputs as given (absolute), for a resume
    warnings: list = field(default_factory=list)
    say: Callable[[str], None] = lambda message: None

    def pieces(self) -> list[Piece]:
        return [Piece(**d) for d in self.static["pieces"]]


def _static(job: _Job, pieces: list[Piece]) -> dict | None:
    """The facts of a new load that ``load.json`` keeps for a resume."""
    from dataclasses import asdict

    if not job.options.journal:
        return None
    return {"command": job.command, "resume_command": job.resume_cmd, "given": job.given,
            "inputs": [J.input_record(f) for f in job.files], "cfg": J.config_to_dict(job.cfg),
            "append": job.append, "pieces": [asdict(p) for p in pieces],
            "input_problems": job.input_problems, "created": time.time()}


def _run_serial(job: _Job, kernels: KernelWatch) -> LoadResult:
    files, output, cfg, append, progress = job.files, job.output, job.cfg, job.append, job.progress
    checkpoint_seconds = job.options.checkpoint_seconds
    t0 = time.perf_counter()
    if job.resume:
        scans: list[dict] = []
        t_scan = time.perf_counter()
        writer = PfmWriter(output, None, cfg, None, None, resume=True,
                           checkpoint_seconds=checkpoint_seconds, threads=1)
        pieces = [p for p in job.pieces() if p.seq >= writer.watermark]
    else:
        # two files at a time, on threads of their own (pfm_dask.head_start)
        head = HeadStart(files, append)
        try:
            scans = head.scans()
        finally:
            head.close()
        if job.options.strict:
            _strict_check(scans)
        t_scan = time.perf_counter()
        grid, pieces = _plan(scans, job)
        writer = PfmWriter(output, grid, cfg, files, len(pieces), append=append,
                           journal=_static(job, pieces),
                           checkpoint_seconds=checkpoint_seconds, threads=1)
    # one thread decodes: one recycled decode buffer, not one per thread of a Dask worker
    pool = gsf.keep_buffers(1)
    try:
        for i, p in enumerate(pieces):
            writer.put(prepare_piece(p, writer.pfm.grid, writer.cfg))
            if i == 0 and len(pieces) > 1:
                release_code_pages()     # the task's kernels are in (heap.py)
            writer.write_ready()
            if progress:
                progress(writer.status())
        t_load = time.perf_counter()
        gsf.keep_buffers(0)       # nothing left to decode: the buffer is the final step's
        # the final step on the machine's cores (--final-threads; the load above used one)
        writer.threads = job.options.final_threads or FINAL_THREADS
        with follow(writer.status, progress):
            rw = writer.finish()
        if progress:
            progress(writer.status())
    except BaseException:
        writer.abort()
        raise
    finally:
        gsf.keep_buffers(pool)
    t_end = time.perf_counter()
    timings = {"compile": kernels.compile_seconds, "kernels": kernels.seconds,
               "prescan": t_scan - t0, "load": t_load - t_scan,
               "final": t_end - t_load, "total": t_end - t0}
    return _finalise(rw, scans, "serial" + (" (resumed)" if job.resume else ""),
                     writer.pfm.grid, timings, 1, extra_problems=job.input_problems)


# -------------------------------------------------------------------- Dask
def _threads_on_host(client, address: str | None) -> int:
    """Threads of the cluster's workers on the host of the worker at ``address`` (the tasks
    that may compute beside the writer there)."""
    try:
        workers = client.scheduler_info(n_workers=-1).get("workers", {})
    except Exception:  # noqa: BLE001 - unknown: as if the cores were all taken
        return 1 << 20
    host = workers.get(address, {}).get("host")
    if host is None:
        return 1 << 20
    return sum(int(w.get("nthreads", 0)) for w in workers.values() if w.get("host") == host)


def _writer_groups_ready(status: dict, delivered: set, est: dict, group_bytes: int) -> int:
    """Whole groups (``PfmWriter.group_bytes``, or up to the last piece) among the pieces
    handed to the in-process writer from its watermark on, counted up to two: 1, it is writing
    one (or about to); 2, the next one waits behind it."""
    seq, acc, last, groups = status["watermark"], 0, status["pieces_total"] - 1, 0
    while seq in delivered and groups < 2:
        acc += est.get(seq, 0)
        if acc >= group_bytes or seq >= last:
            groups, acc = groups + 1, 0
        seq += 1
    return groups


def _finished_within(finished: queue.SimpleQueue, timeout: float) -> list:
    """The futures ``finished`` holds: waits up to ``timeout`` seconds for the first, then takes
    whatever else is there; an empty list when none finished meanwhile."""
    try:
        done = [finished.get(timeout=timeout)]
    except queue.Empty:
        return []
    while True:
        try:
            done.append(finished.get_nowait())
        except queue.Empty:
            return done


def _check_disk_worker(client) -> dict | None:
    """Refuse a cluster without a ``disk`` worker; return the resources the load's tasks ask
    for: ``{"compute": 1}`` when some worker declares ``compute`` (the work goes to those),
    None on an ordinary cluster of plain ``dask worker ADDRESS`` workers (any worker)."""
    info = client.scheduler_info(n_workers=-1)
    disk = [a for a, w in info["workers"].items() if w.get("resources", {}).get("disk", 0) >= 1]
    if not disk:
        raise ConfigError("no worker in this cluster has the 'disk' resource: start the worker "
                          "on the disk node with `dask worker SCHEDULER --resources disk=1`")
    compute = [a for a, w in info["workers"].items() if w.get("resources", {}).get("compute", 0) >= 1]
    return {"compute": 1} if compute else None


def _compute_slots(client, task_resources: dict | None) -> int:
    """Tasks the cluster can run at once: the ``compute`` resource summed over its workers
    (their threads when the tasks ask for no resource)."""
    try:
        info = client.scheduler_info(n_workers=-1)["workers"].values()
    except Exception:  # noqa: BLE001 - a slow answer must not stop a load: assume one slot
        return 1
    if task_resources is None:
        return max(1, int(sum(w.get("nthreads", 1) for w in info)))
    return max(1, int(sum(w.get("resources", {}).get("compute", 0) for w in info)))


def _register_dashboard(client) -> None:
    """The writer's gauges, JSON route and page data on whatever scheduler runs the load."""
    try:
        from .dashboard_plugin import PfmWriterPlugin

        client.register_plugin(PfmWriterPlugin())
    except Exception as err:  # noqa: BLE001 - monitoring must not stop a load
        log.warning("the writer's progress will not show on the dashboard: %s", err)


def _actor_lost(err: BaseException) -> bool:
    """True when ``err`` says the worker holding the writer actor died (docs/reliability.md):
    "Worker holding Actor was lost" (the scheduler), "Unable to contact Actor's worker"
    (a proxy in a task or the driver), or a closed connection to it."""
    text = f"{type(err).__name__}: {err}"
    return ("Actor" in text and ("lost" in text or "contact" in text)) or type(err).__name__ in (
        "CommClosedError", "StreamClosedError")


#: seconds between two looks at the writer's actor while a finished task's result is fetched
_RESULT_EVERY = 1.0


def _task_summary(fut, actor_fut, every: float = _RESULT_EVERY) -> dict:
    """A finished piece task's summary, fetched from the worker that ran it, or the writer's
    loss raised. When that worker died with the writer (a disk worker that also computes),
    Dask reschedules the task, whose rerun can wait minutes on the dead writer's address: a
    plain ``result()`` hung the driver there."""
    while True:
        try:
            return fut.result(timeout=every)
        except TimeoutError:
            if actor_fut.status == "error":
                raise RuntimeError("Worker holding Actor was lost") from None


def _run_dask(client, job: _Job, mode: str, head: HeadStart | None = None) -> LoadResult:
    """The load on ``client``'s cluster; ``mode`` names it in the report. ``head``: the
    pre-scan (and kernels) the embedded cluster's load started before its cluster was up;
    without it the pre-scan runs as tasks on the workers."""
    from distributed import wait

    files, output, cfg, append, progress = job.files, job.output, job.cfg, job.append, job.progress
    checkpoint_seconds = job.options.checkpoint_seconds
    t0 = time.perf_counter()
    _register_dashboard(client)
    task_res = _check_disk_worker(client)
    out_path = str(Path(output).resolve())
    # Every key this load submits is its own (tag): Dask takes a key for the task's identity,
    # and hands back what the scheduler still holds under it, another load's writer actor
    # or pre-scan included (a driver's earlier writer proxy lives until a full collection).
    tag = uuid.uuid4().hex[:8]
    warming = warm_workers(client, job.say, cfg, tag=tag)
    if job.resume:
        scans: list[dict] = []
        kernels = warming.result()
        t_scan = time.perf_counter()
        pieces = job.pieces()
        actor_fut = client.submit(WriterActor, out_path, None, cfg, None, None, False, None,
                                  True, checkpoint_seconds, actor=True,
                                  resources={"disk": 1}, pure=False,
                                  key=f"pfm-writer-resume-{tag}")
    else:
        if head is not None:
            scans = head.scans()
        else:
            scan_futs = client.map(prescan_file, files, exact_beams=append,
                                   key=[f"prescan-{tag}-{i}" for i in range(len(files))],
                                   resources=task_res, pure=False)
            scans = client.gather(scan_futs)
            del scan_futs
        if job.options.strict:
            _strict_check(scans)
        kernels = warming.result()
        if head is not None:  # the kernels this process loaded while the cluster started
            kernels = {k: max(v, head.kernel_seconds()[k]) for k, v in kernels.items()}
        t_scan = time.perf_counter()
        with warming.driver():
            grid, pieces = _plan(scans, job)
        static = _static(job, pieces)
        actor_fut = client.submit(WriterActor, out_path, grid, cfg, files, len(pieces), append,
                                  static, False, checkpoint_seconds, actor=True,
                                  resources={"disk": 1}, pure=False, key=f"pfm-writer-{tag}")
    try:
        writer = actor_fut.result()
        # The proxy is made again, here, for this load's client: an Actor binds to whatever
        # get_client() gives where it is unpickled (the process's default client: with two
        # clients in one process, the newest), and that client's closing cancelled it
        # mid-load ("Worker holding Actor was lost. Status: cancelled").
        from distributed.actor import Actor

        with client.as_current():
            writer = Actor(WriterActor, writer._address, writer.key)
        grid = writer.grid().result()
        cfg = writer.cfg().result()
        writer_addr = writer.where().result()
    except Exception as err:
        if _actor_lost(err) or type(err).__name__ == "KilledWorker":
            raise LoadError(f"the writer's worker died while opening the PFM ({err}); continue "
                            f"with: {job.resume_cmd}", path=out_path) from err
        raise
    log.info("writer actor on %s", writer_addr)
    writer.compute_threads(_threads_on_host(client, writer_addr)).result()
    # the tasks get the actor's address, not the actor: no dependency on the disk worker
    writer_ref = (WriterActor, writer._address, writer.key)
    # In the embedded cluster the actor is in this process: the driver asks it directly. Its
    # status, asked after every finished piece and every 0.25 s, through the actor was a
    # message to the worker and back on the event loop the tasks' and writer's threads share.
    here = tasks._local_writer(*writer_ref)
    writer_status = here.status if here is not None else lambda: writer.status().result()
    # With the writer here, the driver learns of finished tasks from their callbacks and asks
    # the writer directly: a ``wait`` every 0.05 s was a round trip through the event loop the
    # tasks' and the writer's threads share (its CPU and wake-ups taken from them).
    finished = queue.SimpleQueue() if here is not None else None
    if here is not None:
        _summaries[id(here)] = box = {}

    pending = list(reversed(pieces))
    in_flight: dict = {}
    delivered: set[int] = set()  # pieces whose task handed them to the writer
    est = {p.seq: _estimate_bytes(p) for p in pieces}
    status = writer_status()
    pending = [p for p in pending if p.seq >= status["watermark"]]
    last_progress = 0.0
    transfer = 0.0
    slots, slots_at = _compute_slots(client, task_res), time.monotonic()
    hold = hold_bytes(cfg.max_backlog_bytes, PfmWriter.default_group_bytes(cfg),
                      max(est.values(), default=0))
    try:
        while status["watermark"] < len(pieces):
            if status.get("error"):
                raise LoadError(f"the writer stopped: {status['error']}")
            if time.monotonic() - slots_at > _SLOTS_EVERY:  # adaptive clusters grow and shrink
                slots, slots_at = _compute_slots(client, task_res), time.monotonic()
            in_flight_bytes = sum(est[p.seq] for p in in_flight.values())
            # Dask places a task with a resource restriction on a worker as soon as it is
            # submitted, so a deep queue is a static split: a worker slowed by the writer
            # keeps its share while the others idle. At most one task waits per slot, so
            # the next piece goes to whichever worker frees first.
            window = min(job.options.max_window, 2 * slots)
            if here is not None and slots > 1:
                # The writer shares these cores. When it is behind (the group after the one
                # it writes is already whole), it is the slower side: one slot is its own and
                # the tasks run on the others. Otherwise the tasks are the slower side and
                # every slot computes, the writer taking its share of the cores beside them:
                # with a slot kept for it, a writer faster than one task sat idle between
                # groups while a core did nothing. No task waits in a queue here: a task is
                # submitted to this process in milliseconds, and a piece takes far longer.
                behind = _writer_groups_ready(status, delivered, est, here.writer.group_bytes)
                window = slots - 1 if behind >= 2 else slots
            while pending and len(in_flight) < window:
                nxt = pending[-1]
                room = hold - status["backlog_bytes"] - in_flight_bytes
                # Over budget: wait, unless nothing at all is in flight or waiting (a piece
                # larger than the budget must still go through, alone). Waiting cannot
                # deadlock: the piece the writer needs next is in flight or already buffered.
                if est[nxt.seq] > room and (in_flight or status["backlog_batches"]):
                    break
                pending.pop()
                fut = client.submit(_piece_task, nxt, grid, cfg, writer_ref,
                                    key=f"piece-{tag}-{nxt.seq:06d}", resources=task_res,
                                    pure=False, priority=-nxt.seq, retries=1)
                in_flight[fut] = nxt
                in_flight_bytes += est[nxt.seq]
                if finished is not None:
                    fut.add_done_callback(finished.put)
            if in_flight:
                if finished is not None:
                    done = _finished_within(finished, 0.05)
                else:
                    try:
                        done, _ = wait(list(in_flight), timeout=0.25,
                                       return_when="FIRST_COMPLETED")
                    except TimeoutError:  # nothing finished in this slice; poll the writer
                        done = ()
                for fut in done:
                    piece = in_flight.pop(fut)
                    if fut.status == "finished":
                        summary = box.pop(piece.seq, None) if here is not None else None
                        transfer += (summary or _task_summary(fut, actor_fut))["timings"]["transfer"]
                        delivered.add(piece.seq)
                    if fut.status == "error":
                        err = fut.exception()
                        if _actor_lost(err):  # the task could not reach the writer: it is gone
                            raise err
                        e = LoadError(f"task failed: {type(err).__name__}: {err}",
                                      path=piece.path).to_dict()
                        writer.skip(piece, e).result()
                    fut.release()
            else:
                time.sleep(0.05)
            if actor_fut.status == "error":  # the scheduler saw the disk worker die: no call
                raise RuntimeError("Worker holding Actor was lost")  # (it would wait 30 s)
            status = writer_status()
            now = time.perf_counter()
            if progress and now - last_progress > 0.5:
                last_progress = now
                progress(status)
        t_load = time.perf_counter()
        if actor_fut.status == "error":
            raise RuntimeError("Worker holding Actor was lost")
        with relay(client, _STATUS_TOPIC, progress, out_path):
            if here is not None:  # the writer is in this process: wait on its final step
                here.start_finish()
                rw = here.finished(wait=True)
            else:
                writer.start_finish().result()
                while (rw := writer.finished().result()) is None:
                    if actor_fut.status == "error":
                        raise RuntimeError("Worker holding Actor was lost")
                    time.sleep(0.1)
        if progress:
            progress(writer.status().result())
    except BaseException as err:
        for fut in in_flight:
            fut.cancel()
        if not _actor_lost(err):
            try:
                writer.abort().result(timeout=30)
            except Exception:  # noqa: BLE001 - the actor may be gone
                pass
        if isinstance(err, PfmDaskError) or not isinstance(err, Exception):
            raise
        if _actor_lost(err):
            raise LoadError(f"the writer's worker died ({type(err).__name__}: {err}). Dask does "
                            "not restart a writer, so the load stopped; the PFM is incomplete "
                            "and marked so, and everything up to its last checkpoint is kept. "
                            f"Continue with: {job.resume_cmd}", path=out_path) from err
        raise
    finally:
        if here is not None:  # summaries the driver will never take (cancelled tasks)
            _summaries.pop(id(here), None)
        # The writer actor goes now: its proxies here (``writer``, and every ``Actor`` a call
        # made) hold its key until a full garbage collection, and a finished writer keeps a
        # byte per bin of the grid on the disk worker. The key is this load's alone (tag).
        try:
            client.cancel([actor_fut])
        except Exception as err:  # noqa: BLE001 - a client going away: its keys go with it
            log.debug("writer actor not released: %s", err)
    t_end = time.perf_counter()
    timings = {**kernels, "prescan": t_scan - t0, "load": t_load - t_scan,
               "final": t_end - t_load, "total": t_end - t0}
    nworkers = len(client.scheduler_info(n_workers=-1)["workers"])
    dash = getattr(client, "dashboard_link", None)
    res = _finalise(rw, scans, mode + (" (resumed)" if job.resume else ""), grid, timings,
                    nworkers, dash, extra_problems=job.input_problems)
    res.timings["task_transfer"] = transfer
    res.writer_worker = writer_addr
    return res


def _already_complete(output: Path, state: dict) -> LoadResult:
    """``--resume`` on a finished load: nothing to do; the report is the journal's."""
    from . import pfm

    rw = state.get("result") or {}
    J.remove_scratch(output)
    with pfm.open_pfm(output) as f:
        grid = f.grid
    rw.setdefault("pfm", str(output))
    rw.setdefault("files", [])
    rw.setdefault("check", state.get("check") or {"sound": True, "problems": []})
    static = J.read_static(output) or {}
    return _finalise(rw, [], "already complete (nothing to resume)", grid, {}, 0,
                     extra_problems=static.get("input_problems"))


def run_load(inputs: list[str], output: str | os.PathLike, cfg: LoadConfig | None,
             options: RunOptions | None = None, *, append: bool = False, resume: bool = False,
             progress: Callable[[dict], None] | None = None,
             on_dashboard: Callable[[str], None] | None = None,
             on_message: Callable[[str], None] | None = None, client=None,
             cluster_profile=None, security=None, command: list[str] | None = None,
             resume_options: list[str] | None = None, input_problems: list[str] | None = None,
             **option_values) -> LoadResult:
    """Run a whole load of ``inputs`` into ``output`` with the settings ``cfg`` and the run's
    :class:`~pfm_dask.config.RunOptions` (``options``; any of its fields may also be given by
    name: ``mode="serial"``, ``workers=4``, ``checkpoint_seconds=0``...).

    ``options.mode`` is ``serial``, ``local`` (embedded cluster), ``scheduler``, ``cluster``
    (Slurm, PBS or local jobs from a :class:`~pfm_dask.cluster.ClusterProfile`) or ``auto``:
    ``serial`` for inputs under :data:`SMALL_LOAD_BYTES` (:func:`auto_mode`, said in one line
    through ``on_message``), else ``local``.

    ``append``: add the inputs to the existing PFM at ``output``.
    ``resume``: continue the interrupted load writing ``output`` (its inputs and settings
    come from its journal; ``inputs`` and ``cfg`` may be empty/None, else must match).
    ``client``: an existing :class:`distributed.Client` to run on (any mode but serial).
    ``on_message``: where the cluster's notices go (jobs submitted, waiting, cancelled).
    ``security``: :class:`~pfm_dask.security.TlsFiles` for ``options.scheduler`` (default:
    Dask's configuration).
    ``command``: the command line (``sys.argv``), kept in ``load.json``.
    ``resume_options``: the run options the printed resume command repeats (absolute paths).
    ``input_problems``: what the input expansion skipped (folders it could not search, special
    files), reported with the load's problems.

    Nothing at ``output`` is removed or overwritten unless its own journal proves it is this
    load's unfinished output; anything else there is refused (:class:`ConfigError`).
    """
    from dataclasses import replace

    options = replace(options or RunOptions(), **option_values)
    mode, workers = options.mode, options.workers
    files = [str(f) for f in inputs or []]
    output = Path(output)
    skipped: list[str] = []
    job = _Job(command=command, resume_cmd=J.resume_command(output, resume_options),
               options=options, resume=resume, progress=progress)

    def say(message: str) -> None:
        if on_message:
            on_message(message)

    job.say = say

    if resume:
        planned = _plan_resume(files, output, cfg, append, job, say)
        if isinstance(planned, Complete):
            return _already_complete(output, planned.state)
        files, cfg, append, resume = planned
        job.resume = resume
        pending_ok = True           # a resume may start over an append that wrote nothing
    elif cfg is None:
        raise ConfigError("a load needs its settings (cfg)")
    else:
        pending_ok = False
    if not resume:
        found = _inspect_output(output)
        if found.kind != "nothing":
            _refuse_busy(output)
        if found.kind == "foreign":
            raise _refuse_foreign(output, found)
        unfinished = _unfinished(output) if found.kind == "load" else None
        if unfinished is not None and not (
                pending_ok and unfinished.get("phase") == "append-pending"):
            raise _refuse_unfinished(output, unfinished)
        if append:
            if found.kind == "nothing":
                raise ConfigError("--append needs an existing PFM", path=output)
            files, job.input_problems = _dedupe(files)
            job.given = _given(files)
            new = set(_new_files(files, output))
            skipped = [f for f in files if f not in new]
            files = [f for f in files if f in new]
            if not files:
                raise ConfigError("every input file is already in the PFM's .ctl; nothing to "
                                  "append", path=output)
        elif found.kind != "nothing":
            raise ConfigError(f"output {output} already exists: remove it, or add files to it "
                              "with --append", path=output)
        else:
            files, job.input_problems = _dedupe(files)
            job.given = _given(files)
        job.input_problems = list(input_problems or []) + job.input_problems
    if mode == "auto" and client is None:
        mode, size = auto_mode(files, cfg)
        if mode == "serial":
            say(f"{size / 2**20:.1f} MB of input: loading in this process, no cluster "
                "(--workers N starts one)")
    elif mode == "auto":
        mode = "local"
    job.files, job.output, job.cfg, job.append = files, output, cfg, append
    if mode == "serial":
        # each kernel loaded on its first use, or before on a thread: those of a new load
        ahead = () if (job.resume or append) else LOAD_KERNELS
        with KernelWatch(say, ahead) as kernels:
            res = _run_serial(job, kernels)
    elif client is not None:
        res = _run_dask(client, job, mode)
    else:
        from distributed import Client

        if mode == "cluster":
            from .cluster import start_cluster

            if cluster_profile is None:
                raise ConfigError("mode 'cluster' needs a cluster profile (--cluster-config)")
            t_start = time.perf_counter()
            with start_cluster(cluster_profile, on_message=on_message) as pc:
                if on_dashboard:
                    on_dashboard(pc.dashboard_link)
                pc.wait_for_workers()
                t_cluster = time.perf_counter() - t_start
                res = _run_dask(pc.client, job, pc.describe())
                res.timings["cluster_start"] = t_cluster
        elif mode == "scheduler":
            if not options.scheduler:
                raise ConfigError("--scheduler needs an address, e.g. tcp://host:8786")
            from .security import client_security

            address, sec = client_security(options.scheduler, security)
            with Client(address, timeout="30s", security=sec) as client:
                if on_dashboard:
                    on_dashboard(client.dashboard_link)
                res = _run_dask(client, job, "scheduler")
        else:
            from .cluster import make_local_cluster

            t_start = time.perf_counter()
            # the pre-scan and this process's kernels (the workers are its threads) while the
            # cluster starts (pfm_dask.head_start)
            head = None if job.resume else HeadStart(files, append, cfg=cfg, kernels=True,
                                                     say=say)
            if head is not None:
                job.say = head.say
            try:
                with make_local_cluster(workers, dashboard_address=options.dashboard_address) \
                        as cluster, Client(cluster) as client:
                    client.wait_for_workers(len(cluster.worker_spec), timeout=120)
                    t_cluster = time.perf_counter() - t_start
                    if on_dashboard:
                        on_dashboard(client.dashboard_link)
                    res = _run_dask(client, job, f"local ({workers} workers)", head)
                    res.timings["cluster_start"] = t_cluster
            finally:
                if head is not None:
                    head.close()
    res.skipped_files = skipped
    res.warnings = list(job.warnings)
    res.resume_command = job.resume_cmd
    write_report(res, Path(str(output) + ".data") / "load-report.json")
    return res
