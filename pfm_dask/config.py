"""The settings of a load, resolved once into a frozen dataclass.

Defaults are pfmLoad's where pfmLoad has one (bin size 2 m, depths -10000 to
12000 m at 0.01 m, default errors 1.5 m / 0.25 m, area filter off, deep side
only, 2.4 standard deviations). Every other module takes a :class:`LoadConfig`
rather than reading options or the environment itself.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace

from .errors import ConfigError

__all__ = ["LoadConfig", "SwathFilterConfig", "parse_size"]

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "ki": 2**10, "kib": 2**10,
          "m": 10**6, "mb": 10**6, "mi": 2**20, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gi": 2**30, "gib": 2**30,
          "t": 10**12, "tb": 10**12, "ti": 2**40, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """``"512MiB"``, ``"2GB"``, ``"1e6"``-free plain integers → bytes."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    unit = (m.group(2) or "").lower() if m else None
    if not m or unit not in _UNITS:
        raise ConfigError(f"cannot read size {text!r}: expected e.g. 512MiB, 2GB or 1000000")
    return int(float(m.group(1)) * _UNITS[unit])


@dataclass(frozen=True)
class SwathFilterConfig:
    """Parameters of the per-file swath filter (docs/filters.md)."""

    enabled: bool = False
    window_pings: int = 5
    window_beams: int = 9
    threshold: float | None = None  # None: the filter's own default

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


@dataclass(frozen=True)
class LoadConfig:
    """Everything that decides the content of the output PFM, plus run limits."""

    bin_size_m: float | None = 2.0
    bin_size_deg: tuple[float, float] | None = None  # (x, y) degree bins instead of metres
    mbr: tuple[float, float, float, float] | None = None  # south, west, north, east
    polygon: tuple[tuple[float, float], ...] | None = None  # (lat, lon) points
    min_depth: float = -10000.0
    max_depth: float = 12000.0
    precision: float = 0.01
    default_horizontal_error: float = 1.5
    default_vertical_error: float = 0.25
    use_nominal_depth: bool = False
    swath: SwathFilterConfig = field(default_factory=SwathFilterConfig)
    area_filter: bool = False
    cellstd: float = 2.4
    deep_only: bool = True
    # Run limits (they do not change the output).
    max_backlog_bytes: int = 512 * 2**20
    max_window: int = 16
    split_pings: int = 20000  # files with more pings are split into ranges of this size
    # the last pieces of a load are cut in two, in every mode, so that the workers run out
    # of work together (the plan, so the PFM's bytes, does not depend on the worker count)
    tail_pieces: int = 4
    batch_pings: int = 2000  # pings decoded at a time inside a task

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
        if self.max_window < 1:
            raise ConfigError("the window must hold at least one file")
        if not _positive(self.cellstd):
            raise ConfigError(f"--cellstd must be > 0, got {self.cellstd}")
        for option, value in (("--horizontal-error", self.default_horizontal_error),
                              ("--vertical-error", self.default_vertical_error)):
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"{option} must be a number of metres >= 0, got {value}")

    @property
    def null_depth(self) -> float:
        return self.max_depth + 1.0

    def with_area(self, mbr=None, polygon=None) -> "LoadConfig":
        return replace(self, mbr=mbr if mbr is not None else self.mbr,
                       polygon=polygon if polygon is not None else self.polygon)

    def to_dict(self) -> dict:
        return asdict(self)
