"""Cluster profiles (YAML) → running clusters for a load: Slurm, PBS, or the embedded one.

A profile is one small YAML file (``workflows/slurm.yaml`` is a commented
example), parsed once into a frozen :class:`ClusterProfile`; every mistake is a
:class:`~pfm_dask.errors.ConfigError` naming the file and the key.

For ``slurm`` and ``pbs`` a load runs on two kinds of batch job
(docs/cluster.md has the user's view):

* **compute jobs**, a dask-jobqueue ``SLURMCluster``/``PBSCluster`` whose
  workers carry ``--resources compute=N`` (N = threads per worker process),
  scaled to a fixed number of jobs or adaptively between two bounds;
* **one disk-node job**, rendered with the same jobqueue ``Job`` class but its
  own queue and resources, ``--resources disk=1``, one process, one thread,
  never ``--lifetime``. It is submitted and cancelled here, outside the
  cluster's scaled spec, because ``SpecCluster.scale`` may drop any spec entry
  and with it the writer (docs/cluster.md, What runs where). Adaptive scaling never picks it
  either: :class:`_ComputeAdaptive` only closes workers of the spec, and the
  scheduler plugin of :mod:`pfm_dask.dashboard_plugin` keeps disk workers out of
  every downscaling.

The scheduler runs inside ``pfm-dask load`` (the jobs connect back to it), with
the ``pfm_dask.dashboard_plugin`` preload: the writer's plugin, and the dashboard with the
"PFM writer" page built at its first request. Leaving the
``with`` block, normally or on Ctrl-C, cancels every job this module submitted.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable

from .cluster_local import (LAYOUTS, LOCAL_DISK_WORKER, LOCAL_WORKER, PRELOAD,
                            local_worker_specs, make_local_cluster, worker_environment)
from .errors import ConfigError, LoadError
from .security import LOOPBACK, TlsFiles, dashboard_address_problem, scratch_folder, tls_files

__all__ = ["make_local_cluster", "worker_environment",
           "ClusterProfile", "ComputeJobs", "DiskJob", "SchedulerSettings", "KINDS",
           "load_profile", "render_job_scripts", "compute_job_kwargs", "disk_job_kwargs",
           "start_cluster", "PfmCluster", "local_worker_specs", "LOCAL_DISK_WORKER", "LOCAL_WORKER",
           "LAYOUTS"]

log = logging.getLogger("pfm_dask")

KINDS = ("slurm", "pbs", "local")
COMPUTE_JOB_NAME = "pfm-compute"
DISK_JOB_NAME = "pfm-disk"
_BATCH = {"slurm": ("sbatch", "scancel", "Slurm"), "pbs": ("qsub", "qdel", "PBS")}
# Worker options this module sets itself; a profile must not repeat them.
_RESERVED_ARGS = ("--nthreads", "--resources", "--nworkers", "--name", "--memory-limit")
BATCH_DASHBOARD = ":8787"
LOCAL_PROFILE_DASHBOARD = f"{LOOPBACK}:8787"


# ------------------------------------------------------------------ profile
@dataclass(frozen=True)
class SchedulerSettings:
    """Where the scheduler (inside ``pfm-dask load``) listens; jobs must reach it."""

    host: str | None = None
    interface: str | None = None
    port: int = 0
    dashboard_address: str | None = None  # default: BATCH_DASHBOARD or LOCAL_PROFILE_DASHBOARD

    def dashboard_for(self, kind: str) -> str:
        """The dashboard address: the profile's, else every interface for a batch scheduler
        (reached from the desktop through an SSH tunnel) and loopback for the embedded one."""
        if self.dashboard_address:
            return self.dashboard_address
        return LOCAL_PROFILE_DASHBOARD if kind == "local" else BATCH_DASHBOARD


@dataclass(frozen=True)
class ComputeJobs:
    """The compute jobs: what one job asks for, and how many jobs run."""

    queue: str | None = None
    account: str | None = None
    cores: int = 1
    processes: int = 1
    memory: str = "4GB"
    walltime: str | None = None
    resource_spec: str | None = None  # PBS ``-l`` line instead of select=1:ncpus=..:mem=..
    job_extra_directives: tuple[str, ...] = ()
    job_directives_skip: tuple[str, ...] = ()
    worker_extra_args: tuple[str, ...] = ()
    lifetime: str | None = None  # ``--lifetime`` (jobs end before walltime; adapt replaces them)
    lifetime_stagger: str = "5m"
    jobs: int | None = None  # a fixed number of jobs...
    minimum_jobs: int | None = None  # ...or adaptive between these bounds
    maximum_jobs: int | None = None

    @property
    def threads(self) -> int:
        """Threads per worker process, and so its ``compute`` resource."""
        return self.cores // self.processes

    @property
    def adaptive(self) -> bool:
        return self.maximum_jobs is not None


@dataclass(frozen=True)
class DiskJob:
    """The one job on the node with the fast disk, where the writer runs."""

    queue: str | None = None
    account: str | None = None
    cpus: int = 1  # CPUs reserved (the worker itself runs one thread)
    memory: str = "8GB"
    walltime: str | None = None
    resource_spec: str | None = None  # PBS ``-l`` line
    job_extra_directives: tuple[str, ...] = ()
    job_directives_skip: tuple[str, ...] = ()
    worker_extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterProfile:
    """A whole cluster profile; see ``workflows/*.yaml`` for every key, commented."""

    kind: str
    source: str | None = None
    workers: int = 2  # local only
    layout: str = "threads"  # local only: cluster_local.LAYOUTS
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    python: str | None = None  # default: the Python running pfm-dask
    job_script_prologue: tuple[str, ...] = ()
    interface: str | None = None  # workers' network interface
    log_directory: str | None = None
    local_directory: str | None = None
    death_timeout: float = 60.0
    wait_timeout: float = 1800.0  # for the disk worker and a first compute worker
    tls: TlsFiles | None = None  # Dask's TLS between scheduler, workers and client
    compute: ComputeJobs = field(default_factory=ComputeJobs)
    disk: DiskJob = field(default_factory=DiskJob)

    @classmethod
    def from_dict(cls, data: Any, source: str | os.PathLike | None = None) -> "ClusterProfile":
        """Check and convert a parsed YAML mapping; ``source`` names the file in errors."""
        return _Parser(source).profile(data)

    @classmethod
    def local(cls, workers: int = 2,
              dashboard_address: str = LOCAL_PROFILE_DASHBOARD) -> "ClusterProfile":
        return cls(kind="local", workers=workers,
                   scheduler=SchedulerSettings(dashboard_address=dashboard_address))


def load_profile(path: str | os.PathLike) -> ClusterProfile:
    """Read a cluster profile from a YAML file."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read the cluster profile: {err.strerror or err}",
                          path=p) from err
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"not valid YAML: {err}", path=p) from err
    return ClusterProfile.from_dict(data, source=p)


class _Parser:
    """Turns a YAML mapping into a profile, naming ``file: section.key`` in every error."""

    def __init__(self, source):
        self.source = os.fspath(source) if source is not None else None

    def fail(self, key: str, message: str):
        raise ConfigError(f"{key}: {message}", path=self.source)

    def section(self, data: Any, where: str, allowed: tuple[str, ...]) -> dict:
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.fail(where or "profile", f"must be a mapping of keys, got {type(data).__name__}")
        out = {}
        for k, v in data.items():
            if v is None:  # ``key:`` with nothing after it: as if not given
                continue
            norm = str(k).replace("-", "_")
            name = f"{where}.{k}" if where else str(k)
            if norm not in allowed:
                self.fail(name, "unknown key; known keys here: " + ", ".join(allowed))
            if norm in out:
                self.fail(name, "given twice (with '-' and '_')")
            out[norm] = (name, v)
        return out

    # value converters: (name, value) -> typed value
    def text(self, name, v):
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            self.fail(name, f"must be a string, got {v!r}")
        return str(v)

    def walltime(self, name, v):
        # YAML 1.1 reads an unquoted 30:00:00 as the base-60 integer 108000 (seconds).
        if isinstance(v, int) and not isinstance(v, bool):
            if v <= 0:
                self.fail(name, f"must be a positive duration like '30:00:00', got {v!r}")
            return f"{v // 3600:02d}:{v % 3600 // 60:02d}:{v % 60:02d}"
        return self.text(name, v)

    def positive_int(self, name, v, minimum: int = 1):
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            self.fail(name, f"must be an integer >= {minimum}, got {v!r}")
        return v

    def memory(self, name, v):
        from dask.utils import parse_bytes

        if isinstance(v, bool):
            self.fail(name, f"must be a size like '32GB', got {v!r}")
        try:
            n = parse_bytes(v)
        except (ValueError, TypeError):
            self.fail(name, f"must be a size like '32GB' or '512MiB', got {v!r}")
        if n <= 0:
            self.fail(name, f"must be > 0, got {v!r}")
        return str(v)

    def seconds(self, name, v):
        from dask.utils import parse_timedelta

        if isinstance(v, bool):
            self.fail(name, f"must be a duration like '30m', '2h' or 600 (seconds), got {v!r}")
        try:
            s = parse_timedelta(v, default="seconds")
        except (ValueError, TypeError, KeyError):
            self.fail(name, f"must be a duration like '30m', '2h' or 600 (seconds), got {v!r}")
        if s is None or s <= 0:
            self.fail(name, f"must be > 0, got {v!r}")
        return float(s)

    def strings(self, name, v):
        if not isinstance(v, (list, tuple)):
            self.fail(name, f"must be a list of strings, got {v!r}")
        for x in v:
            if isinstance(x, bool) or not isinstance(x, (str, int, float)):
                self.fail(name, f"must be a list of strings, got the item {x!r}")
        return tuple(str(x) for x in v)

    def worker_args(self, name, v, *, forbid_lifetime: bool):
        args = self.strings(name, v)
        words = [w for a in args for w in shlex.split(a)]
        for w in words:
            flag = w.split("=", 1)[0]
            if flag in _RESERVED_ARGS:
                self.fail(name, f"must not contain {flag}: pfm-dask sets it (threads come from "
                          "cores/processes, resources from the job's role)")
            if forbid_lifetime and flag.startswith("--lifetime"):
                self.fail(name, f"must not contain {flag}: a disk worker that retires takes the "
                          "writer with it (docs/cluster.md); give the disk job a longer walltime")
            if not forbid_lifetime and flag.startswith("--lifetime"):
                self.fail(name, f"use compute.lifetime instead of {flag} here")
        return tuple(words)

    def choice(self, name, v, options):
        if v not in options:
            self.fail(name, f"must be one of {', '.join(options)}, got {v!r}")
        return v

    # sections
    def profile(self, data) -> ClusterProfile:
        if data is None:
            self.fail("profile", "the file is empty")
        top = self.section(data, "", ("kind", "workers", "scheduler", "python",
                                      "job_script_prologue", "interface", "log_directory",
                                      "local_directory", "death_timeout", "wait_timeout",
                                      "tls", "compute", "disk", "layout"))
        if "kind" not in top:
            self.fail("kind", "missing: say which cluster this profile is for "
                      f"({', '.join(KINDS)})")
        kw: dict[str, Any] = {"kind": self.choice(*top["kind"], KINDS), "source": self.source}
        conv = {"workers": self.positive_int, "python": self.text,
                "job_script_prologue": self.strings, "interface": self.text,
                "log_directory": self.text, "local_directory": self.text,
                "death_timeout": self.seconds, "wait_timeout": self.seconds}
        for key, fn in conv.items():
            if key in top:
                kw[key] = fn(*top[key])
        if "layout" in top:
            kw["layout"] = self.choice(*top["layout"], LAYOUTS)
        if "scheduler" in top:
            kw["scheduler"] = self.scheduler(top["scheduler"][1], top["scheduler"][0])
        if "compute" in top:
            kw["compute"] = self.compute(top["compute"][1], top["compute"][0])
        if "disk" in top:
            kw["disk"] = self.disk(top["disk"][1], top["disk"][0])
        if "tls" in top:
            kw["tls"] = self.tls(top["tls"][1], top["tls"][0])
        prof = ClusterProfile(**kw)
        if prof.kind == "local":
            for key in ("host", "interface"):
                if getattr(prof.scheduler, key):
                    self.fail(f"scheduler.{key}", "a local cluster listens on 127.0.0.1 only; "
                              "this key is for slurm and pbs profiles (to open the dashboard, "
                              "set scheduler.dashboard_address)")
            if prof.tls is not None:
                self.fail("tls", "a local cluster listens on 127.0.0.1 only and does not use "
                          "TLS; this section is for slurm and pbs profiles")
        if prof.kind != "local" and "layout" in kw:
            self.fail("layout", "a local profile's key (how the embedded cluster runs its "
                      "workers); a batch profile's layout is its compute and disk sections")
        if prof.kind != "local" and kw.get("compute") is None:
            self.fail("compute", f"missing: a {prof.kind} profile needs a compute section "
                      "(queue, cores, memory, walltime, jobs or minimum_jobs/maximum_jobs)")
        if prof.kind != "local" and kw.get("disk") is None:
            self.fail("disk", f"missing: a {prof.kind} profile needs a disk section for the "
                      "writer's job (queue, cpus, memory, walltime)")
        for role in ("compute", "disk"):
            job = kw.get(role)
            if prof.kind != "local" and job is not None and job.walltime is None:
                self.fail(f"{role}.walltime", "missing: give the job's time limit, e.g. "
                          "'30:00:00' (dask-jobqueue would otherwise ask for 30 minutes"
                          + (", and the writer dies with its job)" if role == "disk" else ")"))
        return prof

    def scheduler(self, data, where) -> SchedulerSettings:
        sec = self.section(data, where, ("host", "interface", "port", "dashboard_address"))
        kw = {}
        for key in ("host", "interface", "dashboard_address"):
            if key in sec:
                kw[key] = self.text(*sec[key])
        problem = dashboard_address_problem(kw.get("dashboard_address", ":0"))
        if problem:
            self.fail(f"{where}.dashboard_address", problem)
        if "port" in sec:
            kw["port"] = self.positive_int(*sec["port"], minimum=0)
        if "host" in kw and "interface" in kw:
            self.fail(f"{where}.interface", "give either host or interface, not both")
        return SchedulerSettings(**kw)

    def tls(self, data, where) -> TlsFiles:
        sec = self.section(data, where, ("ca_file", "cert", "key"))
        vals = {k: self.text(*sec[k]) for k in ("ca_file", "cert", "key") if k in sec}
        for key in ("ca_file", "cert"):
            if key not in vals:
                self.fail(f"{where}.{key}", "missing: TLS needs the CA file and this side's "
                          "certificate (and its key, unless appended to the certificate)")
        return tls_files(vals["ca_file"], vals["cert"], vals.get("key"), source=self.source,
                         where=f"{where}.")

    def _job_common(self, sec) -> dict:
        kw = {}
        for key in ("queue", "account", "resource_spec"):
            if key in sec:
                kw[key] = self.text(*sec[key])
        if "memory" in sec:
            kw["memory"] = self.memory(*sec["memory"])
        if "walltime" in sec:
            kw["walltime"] = self.walltime(*sec["walltime"])
        for key in ("job_extra_directives", "job_directives_skip"):
            if key in sec:
                kw[key] = self.strings(*sec[key])
        return kw

    def compute(self, data, where) -> ComputeJobs:
        sec = self.section(data, where, tuple(f.name for f in fields(ComputeJobs)))
        kw = self._job_common(sec)
        for key in ("cores", "processes", "jobs", "minimum_jobs", "maximum_jobs"):
            if key in sec:
                kw[key] = self.positive_int(*sec[key])
        for key in ("lifetime", "lifetime_stagger"):
            if key in sec:
                self.seconds(*sec[key])  # dask worker must be able to read it
                kw[key] = self.text(*sec[key])
        if "worker_extra_args" in sec:
            kw["worker_extra_args"] = self.worker_args(*sec["worker_extra_args"],
                                                       forbid_lifetime=False)
        c = ComputeJobs(**kw)
        if c.cores % c.processes:
            self.fail(f"{where}.processes", f"must divide cores ({c.cores}) so that every "
                      f"worker process gets whole threads, got {c.processes}")
        if c.jobs is not None and (c.minimum_jobs is not None or c.maximum_jobs is not None):
            self.fail(f"{where}.jobs", "give either jobs (a fixed number) or "
                      "minimum_jobs/maximum_jobs (adaptive), not both")
        if c.minimum_jobs is not None and c.maximum_jobs is None:
            self.fail(f"{where}.maximum_jobs", "missing: adaptive scaling needs both "
                      "minimum_jobs and maximum_jobs")
        if c.adaptive and (c.minimum_jobs or 1) > c.maximum_jobs:
            self.fail(f"{where}.minimum_jobs", f"must not exceed maximum_jobs "
                      f"({c.maximum_jobs}), got {c.minimum_jobs}")
        if c.jobs is None and not c.adaptive:
            c = ComputeJobs(**{**kw, "jobs": 1})
        return c

    def disk(self, data, where) -> DiskJob:
        sec = self.section(data, where, tuple(f.name for f in fields(DiskJob)))
        kw = self._job_common(sec)
        if "cpus" in sec:
            kw["cpus"] = self.positive_int(*sec["cpus"])
        if "worker_extra_args" in sec:
            kw["worker_extra_args"] = self.worker_args(*sec["worker_extra_args"],
                                                       forbid_lifetime=True)
        return DiskJob(**kw)


# -------------------------------------------------------------- job options
def _jobqueue():
    """``dask_jobqueue``, keeping Ctrl-C a KeyboardInterrupt.

    Importing it (its ``runner`` module) replaces the SIGINT handler with
    ``sys.exit()``: Ctrl-C would end ``pfm-dask load`` with exit code 0 and
    no word of the jobs. Put the previous handler back.
    """
    import signal

    before = signal.getsignal(signal.SIGINT)
    import dask_jobqueue

    def from_jobqueue(h) -> bool:
        return getattr(h, "__module__", None) == "dask_jobqueue.runner"

    if (from_jobqueue(signal.getsignal(signal.SIGINT))
            and threading.current_thread() is threading.main_thread()):
        signal.signal(signal.SIGINT, signal.default_int_handler
                      if before is None or from_jobqueue(before) else before)
    return dask_jobqueue


def _job_class(kind: str):
    if kind == "slurm":
        return _jobqueue().SLURMCluster.job_cls
    if kind == "pbs":
        return _jobqueue().PBSCluster.job_cls
    raise ConfigError(f"a {kind!r} profile has no batch jobs")


def _cluster_class(kind: str):
    if kind == "slurm":
        return _jobqueue().SLURMCluster
    if kind == "pbs":
        return _jobqueue().PBSCluster
    raise ConfigError(f"a {kind!r} profile has no batch jobs")


def _expand(path: str | None) -> str | None:
    return None if path is None else os.path.expandvars(os.path.expanduser(path))


def _common_job_kwargs(p: ClusterProfile) -> dict:
    kw = {"python": p.python or sys.executable,
          "job_script_prologue": list(p.job_script_prologue),
          "interface": p.interface, "log_directory": _expand(p.log_directory),
          "local_directory": p.local_directory, "death_timeout": p.death_timeout,
          "shebang": "#!/usr/bin/env bash"}
    if p.tls is not None:  # workers get --protocol tls:// and --tls-ca-file/--tls-cert/--tls-key
        kw.update(protocol="tls://", security=p.tls.security())
    return kw


def compute_job_kwargs(p: ClusterProfile) -> dict:
    """Keyword arguments of the jobqueue cluster (and Job class) for the compute jobs."""
    c = p.compute
    extra = ["--resources", f"compute={c.threads}"]
    if c.lifetime:
        extra += ["--lifetime", c.lifetime, "--lifetime-stagger", c.lifetime_stagger]
    kw = {**_common_job_kwargs(p), "cores": c.cores, "processes": c.processes,
          "memory": c.memory, "queue": c.queue, "account": c.account, "walltime": c.walltime,
          "job_extra_directives": list(c.job_extra_directives),
          "job_directives_skip": list(c.job_directives_skip),
          "worker_extra_args": extra + list(c.worker_extra_args),
          "job_name": COMPUTE_JOB_NAME}
    if p.kind == "pbs" and c.resource_spec:
        kw["resource_spec"] = c.resource_spec
    return kw


def disk_job_kwargs(p: ClusterProfile) -> dict:
    """Keyword arguments of the jobqueue Job class for the disk-node job.

    One process with one thread (the writer has its own actor thread), ``cpus``
    reserved for the final step's work, ``disk=1``, no ``--lifetime``.
    """
    d = p.disk
    kw = {**_common_job_kwargs(p), "cores": 1, "processes": 1, "memory": d.memory,
          "queue": d.queue, "account": d.account, "walltime": d.walltime,
          "job_extra_directives": list(d.job_extra_directives),
          "job_directives_skip": list(d.job_directives_skip),
          "worker_extra_args": ["--resources", "disk=1"] + list(d.worker_extra_args),
          "job_name": DISK_JOB_NAME}
    if p.kind == "slurm":
        kw["job_cpu"] = d.cpus
    elif p.kind == "pbs":
        kw["resource_spec"] = d.resource_spec or f"select=1:ncpus={d.cpus}:mem={_pbs_mem(d.memory)}"
    return kw


def _pbs_mem(memory: str) -> str:
    from dask.utils import parse_bytes

    _jobqueue()
    from dask_jobqueue.pbs import pbs_format_bytes_ceil

    return pbs_format_bytes_ceil(parse_bytes(memory))


def render_job_scripts(profile: ClusterProfile,
                       scheduler_address: str | None = None) -> dict[str, str]:
    """The compute and disk-node job scripts as they would be submitted; nothing is submitted.

    Returns ``{"compute": script, "disk": script}``. ``scheduler_address`` defaults to
    ``tcp://SCHEDULER:8786`` (``tls://`` for a profile with TLS).
    """
    if profile.kind == "local":
        raise ConfigError("a local profile runs no batch jobs, so there is no job script",
                          path=profile.source)
    if scheduler_address is None:
        scheduler_address = ("tls" if profile.tls else "tcp") + "://SCHEDULER:8786"
    job_cls = _job_class(profile.kind)
    ckw, dkw = compute_job_kwargs(profile), disk_job_kwargs(profile)
    logdir = ckw["log_directory"]
    created = logdir is not None and not os.path.exists(logdir)
    try:  # jobqueue's Job creates the log directory: undo that for a mere rendering
        compute = job_cls(scheduler=scheduler_address, name=f"{COMPUTE_JOB_NAME}-0", **ckw)
        disk = job_cls(scheduler=scheduler_address, name=DISK_JOB_NAME, **dkw)
        return {"compute": compute.job_script(), "disk": disk.job_script()}
    finally:
        if created and os.path.isdir(logdir) and not os.listdir(logdir):
            os.rmdir(logdir)


# ------------------------------------------------------------ running them
def _compute_adaptive_class():
    from distributed.deploy.adaptive import Adaptive

    class _ComputeAdaptive(Adaptive):
        """Adaptive that sizes and retires only the workers of the cluster's own spec.

        The scheduler counts the disk worker (outside the spec) both in its
        target and in its closing count; it is taken off both, or one compute
        worker too many would stay, or go. The pfm-writer plugin (preloaded on
        our schedulers) keeps disk workers out of the scheduler's candidates,
        and names outside the plan are dropped from its answer as well.
        """

        async def _outside(self) -> int:
            plan = {str(n) for n in self.plan}
            ident = await self.scheduler.identity()
            return sum(1 for w in ident.get("workers", {}).values()
                       if str(w.get("name")) not in plan)

        async def target(self) -> int:
            return max(0, await super().target() - await self._outside())

        async def workers_to_close(self, target: int) -> list[str]:
            plan = {str(n) for n in self.plan}
            names = await self.scheduler.workers_to_close(
                target=target + await self._outside(), attribute="name",
                **self._workers_to_close_kwargs)
            return [n for n in names if str(n) in plan]

    return _ComputeAdaptive


class PfmCluster:
    """The cluster of one load: a client, the dashboard link, and the jobs to cancel at the end.

    Use as a context manager (:func:`start_cluster`); :meth:`wait_for_workers`
    returns once a disk worker and a compute worker are connected.
    """

    def __init__(self, profile: ClusterProfile, *, on_message: Callable[[str], None] | None = None):
        self.profile = profile
        self._say = on_message or (lambda m: log.info("%s", m))
        self.cluster = None
        self.client = None
        self.disk_job = None
        self._scratch = None  # the in-process scheduler's scratch folder (batch kinds)
        self._closed = False
        self._old_sigterm = None

    # -- lifecycle
    def __enter__(self) -> "PfmCluster":
        self._catch_sigterm()
        try:
            self.start()
        except BaseException as err:
            self._close(interrupted=isinstance(err, KeyboardInterrupt))
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._close(interrupted=exc_type is not None and issubclass(exc_type, KeyboardInterrupt))

    def start(self) -> None:
        from distributed import Client

        p = self.profile
        if p.kind == "local":
            self.cluster = make_local_cluster(p.workers, layout=p.layout,
                                              dashboard_address=p.scheduler.dashboard_for(p.kind))
            self.client = Client(self.cluster)
            return
        submit, _, system = _BATCH[p.kind]
        if shutil.which(submit) is None:
            raise ConfigError(f"{submit} is not on PATH: run pfm-dask on a {system} login node "
                              "(or use --cluster local, or --scheduler with hand-started "
                              "workers: docs/cluster.md)", path=p.source)
        self._scratch = scratch_folder()
        # the dashboard is built at its first request (pfm_dask.dashboard_plugin)
        sched = {"dashboard_address": p.scheduler.dashboard_for(p.kind), "dashboard": False,
                 "preload": [PRELOAD], "local_directory": self._scratch}
        if p.scheduler.host:
            sched["host"] = p.scheduler.host
        if p.scheduler.interface:
            sched["interface"] = p.scheduler.interface
        if p.scheduler.port:
            sched["port"] = p.scheduler.port
        cls = _cluster_class(p.kind)
        try:
            self.cluster = cls(name=COMPUTE_JOB_NAME, scheduler_options=sched,
                               silence_logs=logging.WARNING, **compute_job_kwargs(p))
        except (ValueError, TypeError) as err:
            raise ConfigError(f"dask-jobqueue refused the compute settings: {err}",
                              path=p.source) from err
        self.client = Client(self.cluster)
        self._submit_disk_job()
        c = p.compute
        if c.adaptive:
            self.cluster.adapt(Adaptive=_compute_adaptive_class(),
                               minimum_jobs=c.minimum_jobs or 1, maximum_jobs=c.maximum_jobs)
            how = f"adaptive, {c.minimum_jobs or 1} to {c.maximum_jobs} compute jobs"
        else:
            self.cluster.scale(jobs=c.jobs)
            how = f"{c.jobs} compute job(s)"
        self._say(f"{system}: submitted the disk-node job {self.disk_job.job_id} "
                  f"({DISK_JOB_NAME}); {how} ({COMPUTE_JOB_NAME}, {c.cores} cores, "
                  f"{c.processes} worker process(es) each)")

    def _submit_disk_job(self) -> None:
        p = self.profile
        job_cls = _job_class(p.kind)
        job = job_cls(scheduler=self.cluster.scheduler_address, name=DISK_JOB_NAME,
                      **disk_job_kwargs(p))
        try:
            self.cluster.sync(job.start)
        except RuntimeError as err:
            raise LoadError(f"could not submit the disk-node job: {err}", path=p.source) from err
        self.disk_job = job

    def wait_for_workers(self, timeout: float | None = None) -> None:
        """Block until a ``disk`` worker and a ``compute`` worker are connected."""
        timeout = self.profile.wait_timeout if timeout is None else timeout
        t0 = time.monotonic()
        told = False
        last_check = t0
        while True:
            info = self.client.scheduler_info(n_workers=-1)["workers"].values()
            disk = any(w.get("resources", {}).get("disk", 0) >= 1 for w in info)
            compute = any(w.get("resources", {}).get("compute", 0) >= 1 for w in info)
            if disk and compute:
                if told:
                    self._say(f"workers connected after {time.monotonic() - t0:.0f}s")
                return
            now = time.monotonic()
            missing = " and ".join(x for x, ok in (("the disk worker", disk),
                                                   ("a compute worker", compute)) if not ok)
            if not told and now - t0 > 2:
                told = True
                self._say(f"waiting for {missing} (jobs {self._job_list()}; giving up after "
                          f"{timeout:.0f}s)")
            if now - last_check > 5 and not disk and self.disk_job is not None:
                last_check = now
                self._check_disk_job_alive()
            if now - t0 > timeout:
                raise LoadError(f"{missing} did not connect within {timeout:.0f}s: are the jobs "
                                f"{self._job_list()} still queued? The job logs are in "
                                f"{self.profile.log_directory or 'the submit directory'}",
                                path=self.profile.source)
            time.sleep(0.5)

    def _check_disk_job_alive(self) -> None:
        """Fail fast when the disk-node job has ended (Slurm only; PBS waits for the timeout)."""
        if self.profile.kind != "slurm" or shutil.which("squeue") is None:
            return
        jid = self.disk_job.job_id
        out = subprocess.run(["squeue", "-h", "-j", str(jid), "-o", "%T"],
                             capture_output=True, text=True)
        if out.returncode == 0 and not out.stdout.strip():
            raise LoadError(f"the disk-node job {jid} ended before its worker connected; see "
                            f"its log in {self.profile.log_directory or 'the submit directory'}",
                            path=self.profile.source)

    # -- facts
    @property
    def dashboard_link(self) -> str | None:
        return getattr(self.client, "dashboard_link", None)

    def job_ids(self) -> dict:
        """``{"compute": [...], "disk": id}`` of the jobs submitted so far."""
        compute = []
        if self.cluster is not None and self.profile.kind != "local":
            compute = [j.job_id for j in list(self.cluster.workers.values())
                       if getattr(j, "job_id", None)]
        disk = self.disk_job.job_id if self.disk_job is not None else None
        return {"compute": compute, "disk": disk}

    def _job_list(self) -> str:
        ids = self.job_ids()
        parts = [f"{', '.join(map(str, ids['compute']))} (compute)"] if ids["compute"] else []
        if ids["disk"]:
            parts.append(f"{ids['disk']} (disk node)")
        return " and ".join(parts) or "none yet"

    def describe(self) -> str:
        p = self.profile
        if p.kind == "local":
            return f"local ({p.workers} workers)"
        return f"{p.kind} ({self._job_list()})"

    # -- shutdown
    def close(self) -> None:
        self._close(interrupted=False)

    def _catch_sigterm(self) -> None:
        """SIGTERM (``scancel``/``qdel`` of the driver's job, its walltime) acts as Ctrl-C, so
        the jobs are cancelled rather than left to time out."""
        import signal

        if threading.current_thread() is not threading.main_thread():
            return

        def on_term(signum, frame):
            raise KeyboardInterrupt("SIGTERM")

        self._old_sigterm = signal.signal(signal.SIGTERM, on_term)

    def _close(self, interrupted: bool) -> None:
        if self._closed:
            return
        self._closed = True
        if self._old_sigterm is not None:
            import signal

            signal.signal(signal.SIGTERM, self._old_sigterm)
            self._old_sigterm = None
        p = self.profile
        if p.kind != "local":
            what = self._job_list()
            system = _BATCH[p.kind][2]
            if interrupted:
                self._say(f"interrupted: cancelling {system} jobs {what}")
            else:
                log.info("cancelling %s jobs %s", system, what)
        if self.disk_job is not None and self.cluster is not None:
            try:
                self.cluster.sync(self.disk_job.close)
            except BaseException as err:  # noqa: BLE001 - keep closing the rest
                self._say(f"could not cancel the disk-node job {self.disk_job.job_id} ({err}): "
                          f"cancel it by hand ({_BATCH[p.kind][1]} {self.disk_job.job_id})")
        if self.client is not None:
            try:
                self.client.close()
            except BaseException:  # noqa: BLE001
                pass
        if self.cluster is not None:
            self.cluster.close()  # a jobqueue cluster cancels its jobs here
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        if interrupted and p.kind != "local":
            self._say("jobs cancelled")


def start_cluster(profile: ClusterProfile, *,
                  on_message: Callable[[str], None] | None = None) -> PfmCluster:
    """A :class:`PfmCluster` for ``profile``; start it with ``with``."""
    return PfmCluster(profile, on_message=on_message)
