"""Plain coercion of the command line's simple values, so that a command need not import pydantic.

The installed typer coerces every option value through a pydantic ``TypeAdapter`` built on the
option's first use: importing pydantic and building the adapters costs about 0.25 s, half of a
``pfm-dask info``. Our options are ``str``, ``Path``, ``int``, ``float`` and ``bool`` (and lists or
tuples of them) with no bounds, parsers or path checks; :func:`install` has typer convert those with
the type itself (paths through typer's own path checks), with pydantic's wording for a bad
number. Any other parameter, and a typer without these internals, keeps typer's own coercion.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import get_args, get_origin

__all__ = ["install"]

_PLAIN = (str, Path, int, float, bool)
_NUMBER_WORDS = {int: "a valid integer, unable to parse string as an integer",
                 float: "a valid number, unable to parse string as a number",
                 bool: "a valid boolean, unable to interpret input"}
_BOOLS = {"1": True, "true": True, "t": True, "yes": True, "y": True, "on": True,
          "0": False, "false": False, "f": False, "no": False, "n": False, "off": False,
          "": False}


def _leaves(annotation) -> tuple | None:
    """The element types of a plain annotation (``float``, ``List[str]``, ``Tuple[float, ...]``)."""
    origin = get_origin(annotation)
    if origin is None:
        return (annotation,) if annotation in _PLAIN else None
    if origin in (list, tuple):
        args = get_args(annotation)
        if args and Ellipsis not in args and all(a in _PLAIN for a in args):
            return args
    return None


def _is_plain(descriptor) -> bool:
    info = descriptor.parameter_info
    return (descriptor.file_annotation is None and _leaves(descriptor.annotation) is not None
            and getattr(info, "parser", None) is None and getattr(info, "min", None) is None
            and getattr(info, "max", None) is None and not getattr(info, "clamp", False)
            and getattr(info, "path_type", None) is None
            and not getattr(info, "resolve_path", False) and not getattr(info, "allow_dash", False))


def install() -> bool:
    """Route typer's coercion of plain parameters through :func:`_convert`; False if this
    typer has no such hook (its own coercion then stays, correct but slower to start)."""
    try:
        from typer import core
        from typer._click.exceptions import BadParameter
        from typer._coercion import RuntimeParam
        from typer._param_types import coerce_cli_path
    except ImportError:
        return False
    original = getattr(core, "build_runtime_param", None)
    if original is None or getattr(original, "plain_values", False):
        return original is not None

    def convert(kind, value, info, param, ctx):
        if kind is Path:
            return value if isinstance(value, Path) else Path(
                coerce_cli_path(value, info, path_type=None, param=param, ctx=ctx))
        if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
            return value
        try:
            if kind is bool:
                return _BOOLS[str(value).strip().lower()]
            return kind(value)
        except (TypeError, ValueError, KeyError):
            words = _NUMBER_WORDS.get(kind, f"a valid {kind.__name__}")
            raise BadParameter(f"Input should be {words}", ctx=ctx, param=param) from None

    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        """typer's runtime coercion for a plain annotation, without pydantic."""

        def _coerce_value(self, value, param, ctx):
            kinds = _leaves(self.annotation)
            info = self.parameter_info
            if get_origin(self.annotation) is None:
                return convert(kinds[0], value, info, param, ctx)
            if get_origin(self.annotation) is list:
                return [convert(kinds[0], v, info, param, ctx) for v in value]
            if len(value) != len(kinds):
                raise BadParameter(f"{len(kinds)} values are required, but {len(value)} given.",
                                   ctx=ctx, param=param)
            return tuple(convert(k, v, info, param, ctx) for k, v in zip(kinds, value))

    def build_runtime_param(descriptor):
        if _is_plain(descriptor):
            return PlainParam(parameter_info=descriptor.parameter_info,
                              annotation=descriptor.annotation)
        return original(descriptor)

    build_runtime_param.plain_values = True
    core.build_runtime_param = build_runtime_param
    return True
