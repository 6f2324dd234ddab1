"""The settings of a load, each default written once, in two frozen dataclasses.

* :class:`LoadConfig` — what decides the output PFM: the soundings it holds and their
  flags (``content``), and the piece plan, which decides where the records sit in the
  ``.bin`` and ``.ndx`` (``layout``; the same soundings either way).
* :class:`RunOptions` — how one run goes (``run``): workers, checkpoints, the driver's
  window, the progress display. None of them changes a byte of the PFM.

Each field's metadata says which it is (``decides``), the command-line option that sets it
and that option's help; the command line builds its options from them (pfm_dask.cli), and a
resume refuses a change only in ``content`` (the journal keeps the plan). Defaults are
pfmLoad's where pfmLoad has one (bin size 2 m, depths -10000 to 12000 m at 0.01 m, default
errors 1.5 m / 0.25 m, area filter off, deep side only, 2.4 standard deviations).

Defaults can be overridden in Dask's configuration under the ``pfm-dask`` key (a YAML file
in ``~/.config/dask/``, or ``DASK_PFM_DASK__WORKERS=4``-style variables), read by
:func:`configured`; the command line's own options come first (docs/usage.md).
"""

from __future__ import annotations

import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import Any, NamedTuple

from .errors import ConfigError

__all__ = ["LoadConfig", "RunOptions", "SwathFilterConfig", "Setting", "settings", "configured",
           "parse_size", "format_size", "DASK_KEY", "CONTENT", "LAYOUT", "RUN"]

#: what a field decides (its metadata ``decides``)
CONTENT = "content"  # the soundings and flags in the PFM: recorded, a resume must not change it
LAYOUT = "layout"    # the piece plan, so the records' places in .bin/.ndx: a resume keeps the journal's
RUN = "run"          # this run only: nothing in the PFM changes


def _setting(default: Any = None, decides: str = CONTENT, option: tuple[str, ...] = (),
             help: str = "", *, factory=None, size: bool = False):
    """A dataclass field with the metadata the command line and Dask's configuration read."""
    meta = {"decides": decides, "option": option, "help": help, "size": size}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# ------------------------------------------------------------------------------- sizes
_SIZE_RE = re.compile(r"^([0-9]*\.?[0-9]*(?:e[+-]?[0-9]+)?)([a-z]*)$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1}
for _i, _p in enumerate("kmgtp", start=1):
    _UNITS.update({_p: 10 ** (3 * _i), _p + "b": 10 ** (3 * _i),
                   _p + "i": 2 ** (10 * _i), _p + "ib": 2 ** (10 * _i)})


def parse_size(text: str | int | float) -> int:
    """``"512MiB"``, ``"2GB"``, ``"1e6"``, ``"5 kB"`` → bytes.

    The grammar of :func:`dask.utils.parse_bytes` (tests compare the two), written here
    because importing ``dask.utils`` imports Dask, which the quick commands and a serial
    load never do (about 0.3 s). Negative and non-finite sizes are refused.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    else:
        m = _SIZE_RE.match(str(text).replace(" ", ""))
        unit = m.group(2).lower() if m else None
        number = (m.group(1) or ("1" if unit else "")) if m else ""
        if not m or unit not in _UNITS or number in ("", "."):
            raise ConfigError(f"cannot read size {text!r}: expected e.g. 512MiB, 2GB or 1000000")
        value = float(number) * _UNITS[unit]
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"cannot read size {text!r}: expected a number of bytes >= 0")
    return int(value)


def format_size(n: int) -> str:
    """Bytes as the command line writes them: ``536870912`` → ``"512MiB"``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


# ------------------------------------------------------------------------ the classes
@dataclass(frozen=True)
class SwathFilterConfig:
    """Parameters of the per-file swath filter (docs/filters.md)."""

    enabled: bool = _setting(False, CONTENT, ("--swath-filter/--no-swath-filter",),
                             "run the per-file swath filter")
    window_pings: int = _setting(5, CONTENT, ("--swath-window-pings",),
                                 "swath filter window, pings")
    window_beams: int = _setting(9, CONTENT, ("--swath-window-beams",),
                                 "swath filter window, beams")
    threshold: float | None = _setting(None, CONTENT, ("--swath-threshold",),
                                       "swath filter threshold (robust sigmas)")  # None: its own

    def __post_init__(self):
        if self.enabled:
            _check_swath(self)


#: the swath filter's parameter names as the command line spells them
_SWATH_OPTIONS = {"window_pings": "--swath-window-pings", "window_beams": "--swath-window-beams",
                  "threshold": "--swath-threshold"}


def _check_swath(sw: SwathFilterConfig) -> None:
    """The swath filter's own parameter rules, applied before a load rather than in every
    task (where a bad window failed each file); messages name the command-line options."""
    import inspect

    from .filters import _swath

    params = {k: v.default for k, v in inspect.signature(_swath.swath_filter).parameters.items()
              if v.default is not inspect.Parameter.empty}
    params.update(window_pings=sw.window_pings, window_beams=sw.window_beams)
    if sw.threshold is not None:
        params["threshold"] = sw.threshold
    names = inspect.signature(_swath._check_params).parameters
    try:
        _swath._check_params(**{k: params[k] for k in names})
    except ConfigError as err:
        reason = err.reason
        for name, option in _SWATH_OPTIONS.items():
            reason = reason.replace(name, option)
        raise ConfigError(f"swath filter: {reason}") from None


def _positive(value: float) -> bool:
    """A finite number above zero (False for NaN and infinities)."""
    return math.isfinite(value) and value > 0


#: LoadConfig fields earlier versions wrote into a journal's ``cfg`` and this one no longer has
#: (a journal written by them still resumes): ``max_window`` is a :class:`RunOptions` field now,
#: ``batch_pings`` was never read
_RETIRED = ("max_window", "batch_pings")


@dataclass(frozen=True)
class LoadConfig:
    """Everything that decides the output PFM: its content, and the piece plan (layout)."""

    bin_size_m: float | None = _setting(2.0, CONTENT, ("--bin-size",), "bin size in metres")
    bin_size_deg: tuple[float, float] | None = _setting(None)  # (x, y) degree bins instead of metres
    mbr: tuple[float, float, float, float] | None = _setting(
        None, CONTENT, ("--mbr",), "area as SOUTH WEST NORTH EAST degrees (default: the inputs' "
        "extent)")
    polygon: tuple[tuple[float, float], ...] | None = _setting(
        None, CONTENT, ("--polygon",), "area polygon file: 'lat, lon' per line")  # (lat, lon) points
    min_depth: float = _setting(-10000.0, CONTENT, ("--min-depth",),
                                "shallowest depth kept valid (m, + down)")
    max_depth: float = _setting(12000.0, CONTENT, ("--max-depth",), "deepest depth kept valid (m)")
    precision: float = _setting(0.01, CONTENT, ("--precision",), "depth precision (m)")
    default_horizontal_error: float = _setting(
        1.5, CONTENT, ("--horizontal-error",), "default horizontal error when GSF has none (m)")
    default_vertical_error: float = _setting(
        0.25, CONTENT, ("--vertical-error",), "default vertical error when GSF has none (m)")
    use_nominal_depth: bool = _setting(False, CONTENT, ("--nominal-depth",),
                                       "load nominal depth where present")
    swath: SwathFilterConfig = _setting(factory=SwathFilterConfig)
    area_filter: bool = _setting(False, CONTENT, ("--area-filter/--no-area-filter",),
                                 "run pfmLoader's area filter at the end")
    cellstd: float = _setting(2.4, CONTENT, ("--cellstd",), "area filter: standard deviations")
    deep_only: bool = _setting(True, CONTENT, ("--deep-only/--two-sided",),
                               "area filter: cut the deep side only")
    # The plan: pieces of at most a sixteenth of the backlog (estimated bytes), so the backlog
    # decides where a file is cut, and so the records' places in the .bin and .ndx (two
    # 600-ping EM302 files: 110 pieces at 1 MiB, 4 at 512 MiB; another .ndx, the same dump).
    # The driver's window also holds to it. A resume keeps the journal's plan. 512 MiB:
    # at 256 MiB the writer's smaller groups cost the 74-file load 27 % of its time for 20 MB
    # less peak memory (docs/performance.md, memory).
    max_backlog_bytes: int = _setting(512 * 2**20, LAYOUT, ("--max-backlog",),
                                      "bytes allowed to wait for the writer", size=True)
    split_pings: int = _setting(20000, LAYOUT)  # files with more pings are split into ranges of this size
    # the last pieces of a load are cut in two, in every mode, so that the workers run out
    # of work together (the plan, so the PFM's bytes, does not depend on the worker count)
    tail_pieces: int = _setting(4, LAYOUT)

    def __post_init__(self):
        if self.bin_size_deg is None and (self.bin_size_m is None
                                          or not _positive(self.bin_size_m)):
            raise ConfigError(f"--bin-size must be a positive number of metres, got "
                              f"{self.bin_size_m}")
        if self.bin_size_deg is not None and not all(map(_positive, self.bin_size_deg)):
            raise ConfigError(f"degree bin sizes must be > 0, got {self.bin_size_deg}")
        if not self.max_depth > self.min_depth:
            raise ConfigError(f"--max-depth ({self.max_depth}) must exceed --min-depth ({self.min_depth})")
        if not self.precision > 0:
            raise ConfigError(f"--precision must be > 0, got {self.precision}")
        if self.mbr is not None:
            s, w, n, e = self.mbr
            if not (-90 <= s < n <= 90):
                raise ConfigError(f"--mbr takes SOUTH WEST NORTH EAST: need -90 <= south < "
                                  f"north <= 90, got south={s} north={n}")
            if not (-180 <= w <= 360 and -180 <= e <= 360 and w != e):
                raise ConfigError(f"--mbr: bad west/east {w}/{e}")
        if self.max_backlog_bytes < 1 << 20:
            raise ConfigError("--max-backlog must be at least 1MiB")
        if not _positive(self.cellstd):
            raise ConfigError(f"--cellstd must be > 0, got {self.cellstd}")
        for option, value in (("--horizontal-error", self.default_horizontal_error),
                              ("--vertical-error", self.default_vertical_error)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{option} must be a number of metres >= 0, got {value}")

    @property
    def null_depth(self) -> float:
        return self.max_depth + 1.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "LoadConfig":
        """The inverse of :meth:`to_dict` (a journal's ``cfg``); fields earlier versions
        wrote and this one retired are dropped, so their journals still resume."""
        d = {k: v for k, v in d.items() if k not in _RETIRED}
        d["swath"] = SwathFilterConfig(**d.get("swath", {}))
        for k in ("mbr", "bin_size_deg"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        if d.get("polygon") is not None:
            d["polygon"] = tuple(tuple(p) for p in d["polygon"])
        return cls(**d)

    @classmethod
    def content_differences(cls, a: dict, b: dict) -> list[str]:
        """Names of the ``content`` fields that differ between two :meth:`to_dict` results
        (a layout field may differ: a resume keeps the journal's plan)."""
        names = sorted(f.name for f in fields(cls) if f.metadata.get("decides") == CONTENT)
        return [k for k in names if a.get(k) != b.get(k)]


@dataclass(frozen=True)
class RunOptions:
    """How one load runs; nothing here changes the output PFM (docs/usage.md)."""

    mode: str = _setting("local", RUN)  # serial, local, scheduler, cluster or auto (run_load)
    workers: int = _setting(2, RUN, ("--workers",), "embedded cluster: compute workers (threads by default)")
    scheduler: str | None = _setting(None, RUN, ("--scheduler",), "use an existing Dask scheduler")
    dashboard_address: str | None = _setting(
        None, RUN, ("--dashboard-address",), "where the dashboard of the cluster pfm-dask starts "
        "listens, HOST:PORT (default 127.0.0.1, any port; 0.0.0.0:8787 opens it to the network)")
    checkpoint_seconds: float = _setting(
        10.0, RUN, ("--checkpoint-seconds",),
        "seconds between the writer's checkpoints (0: after every piece)")
    strict: bool = _setting(False, RUN, ("--strict",),
                            "refuse to start if the pre-scan finds damaged input")
    force: bool = _setting(False, RUN, ("--force",),
                           "make a grid past the size limit (250,000,000 bins) anyway; "
                           "with --png, draw it even from a PFM failing the quick checks")
    final_threads: int | None = _setting(
        None, RUN, ("--final-threads",), "threads of the final step (area filter, recompute, "
        "check) with --serial (default: up to 4 of the machine's cores; 1: one thread)")
    quiet: bool = _setting(False, RUN, ("--quiet", "-q"), "no progress display")
    max_window: int = _setting(16, RUN)  # pieces in flight at most (and two per compute slot)
    journal: bool = _setting(True, RUN)  # False: no crash safety, only to measure its cost

    def __post_init__(self):
        if self.mode not in ("serial", "local", "scheduler", "cluster", "auto"):
            raise ConfigError(f"unknown mode {self.mode!r}")
        if not self.checkpoint_seconds >= 0 or self.checkpoint_seconds == float("inf"):
            raise ConfigError(f"--checkpoint-seconds must be a number of seconds >= 0, got "
                              f"{self.checkpoint_seconds}")
        if self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if self.final_threads is not None and self.final_threads < 1:
            raise ConfigError(f"--final-threads must be at least 1, got {self.final_threads}")
        if self.max_window < 1:
            raise ConfigError("the window must hold at least one file")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RunOptions":
        return cls(**d)


# ------------------------------------------------------------- options and Dask config
class Setting(NamedTuple):
    """One field that a command-line option (and Dask's configuration) can set."""

    path: str            # the field, dotted below LoadConfig: "swath.window_pings"
    owner: type          # LoadConfig or RunOptions
    option: tuple        # the option's flags: ("--bin-size",), ("--quiet", "-q")
    help: str
    decides: str         # CONTENT, LAYOUT or RUN
    default: Any
    size: bool           # a size in bytes, written "512MiB"

    @property
    def key(self) -> str:
        """Its name in Dask's configuration: the long option without dashes
        (``pfm-dask.max-backlog``; ``DASK_PFM_DASK__MAX_BACKLOG``)."""
        return self.option[0].split("/")[0].lstrip("-")

    @property
    def cli_default(self) -> Any:
        return format_size(self.default) if self.size else self.default


def _settings_of(cls: type, owner: type, prefix: str = "") -> list[Setting]:
    out = []
    for f in fields(cls):
        if f.name == "swath":
            out += _settings_of(SwathFilterConfig, owner, "swath.")
        elif f.metadata.get("option"):
            m = f.metadata
            out.append(Setting(prefix + f.name, owner, m["option"], m["help"], m["decides"],
                               f.default, m["size"]))
    return out


def settings() -> list[Setting]:
    """Every field an option sets, LoadConfig's then RunOptions'."""
    return _settings_of(LoadConfig, LoadConfig) + _settings_of(RunOptions, RunOptions)


def build(owner: type, values: dict[str, Any]):
    """``owner`` (LoadConfig or RunOptions) from ``{field path: value}``; unnamed fields keep
    their defaults, sizes may be written ``"512MiB"``."""
    sizes = {s.path for s in settings() if s.size}
    top: dict[str, Any] = {}
    swath: dict[str, Any] = {}
    for path, value in values.items():
        if path in sizes and value is not None:
            value = parse_size(value)
        if path.startswith("swath."):
            swath[path[len("swath."):]] = value
        else:
            top[path] = value
    if swath:
        top["swath"] = SwathFilterConfig(**swath)
    return owner(**top)


#: the key of pfm-dask's section in Dask's configuration
DASK_KEY = "pfm-dask"


def _yaml_folders() -> list[str]:
    """Where Dask looks for configuration files (dask.config.paths, and DASK_CONFIG)."""
    import site

    folders = [os.getenv("DASK_ROOT_CONFIG", "/etc/dask"), os.path.join(sys.prefix, "etc", "dask"),
               *[os.path.join(p, "etc", "dask") for p in getattr(site, "PREFIXES", [])],
               os.path.join(os.path.expanduser("~"), ".config", "dask")]
    if os.environ.get("DASK_CONFIG"):
        folders.append(os.environ["DASK_CONFIG"])
    return folders


def _may_be_configured() -> bool:
    """Whether Dask's configuration may set a pfm-dask default: a ``DASK_PFM_DASK__``
    variable, or a configuration file that names ``pfm-dask``. Looked at without importing
    Dask (0.3 s), which a serial load and the quick commands never do otherwise."""
    if any(k.upper().startswith("DASK_PFM_DASK__") for k in os.environ):
        return True
    for folder in _yaml_folders():
        try:
            names = [os.path.join(folder, n) for n in os.listdir(folder)] if os.path.isdir(
                folder) else [folder]
        except OSError:
            continue
        for name in names:
            if not name.endswith((".yaml", ".yml", ".json")):
                continue
            try:
                with open(name, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
            except OSError:
                continue
            if "pfm-dask" in text or "pfm_dask" in text:
                return True
    return False


def configured() -> dict[str, Any]:
    """``{setting key: value}`` set in Dask's configuration under ``pfm-dask`` (YAML files,
    ``DASK_PFM_DASK__…`` variables, ``dask.config.set``). Dask is imported only when it is
    already, or when a variable or file may set ours."""
    if "dask.config" not in sys.modules and not _may_be_configured():
        return {}
    import dask.config

    # registered as dask-jobqueue registers its own: dask.config.get("pfm-dask.workers") works
    dask.config.update_defaults({DASK_KEY: {s.key: s.cli_default for s in settings()}})
    section = dask.config.get(DASK_KEY, default=None) or {}
    if not isinstance(section, dict):
        raise ConfigError(f"{DASK_KEY} in Dask's configuration must be a mapping, got {section!r}")
    known = {s.key: s for s in settings()}
    out = {}
    for key, value in section.items():
        name = str(key).replace("_", "-").lower()
        if name not in known:
            raise ConfigError(f"{DASK_KEY}.{key} in Dask's configuration is not a setting; "
                              f"known: {', '.join(sorted(known))}")
        if value != known[name].cli_default:  # (the defaults registered above read as unset)
            out[name] = value
    return out


def defaults_yaml() -> str:
    """The packaged ``pfm-dask.yaml``: every setting's default under the ``pfm-dask`` key, in
    Dask's configuration format (a test checks the packaged file equals this text)."""
    import json

    lines = ["# pfm-dask's defaults, in Dask's configuration format. Copy the settings you",
             "# change into ~/.config/dask/pfm-dask.yaml, or set DASK_PFM_DASK__WORKERS=4-style",
             "# variables; options given on the command line come first (docs/usage.md).",
             "# Generated from pfm_dask.config (LoadConfig, RunOptions): do not edit here.",
             f"{DASK_KEY}:"]
    for s in settings():
        value = s.cli_default
        text = "null" if value is None else json.dumps(value)
        lines.append(f"  {s.key}: {text}  # {s.decides}: {s.help}")
    return "\n".join(lines) + "\n"
