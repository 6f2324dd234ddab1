"""How ``pfm-dask load`` reads its settings: typer options made from the fields of
:class:`~pfm_dask.config.LoadConfig` and :class:`~pfm_dask.config.RunOptions` (flags, default
and help written once there), and each value taken from the command line, else Dask's
configuration (``pfm-dask`` key), else the field's default. Imports neither Dask nor numba.
"""

from __future__ import annotations

import typer

from .config import settings

__all__ = ["SETTINGS", "setting_option", "setting_of", "given", "content_options",
           "settings_values"]

#: the settings options set (LoadConfig's and RunOptions' fields), by their Dask config key
SETTINGS = {s.key: s for s in settings()}


def setting_option(key: str, **extra):
    """The typer option of a setting: its flags, default and help as pfm_dask.config writes them
    once (only typer's own extras, such as a metavar, are given here)."""
    s = SETTINGS[key]
    return typer.Option(s.cli_default, *s.option, help=s.help, **extra)


def setting_of(param):
    """The setting a ``load`` parameter sets, or None (``--output``, ``--serial``...)."""
    opts = getattr(param, "opts", None)
    return SETTINGS.get(opts[0].lstrip("-")) if opts else None


def given(ctx: typer.Context, name: str) -> bool:
    """True when ``name`` was given on the command line (by name: typer may vendor its own
    click, whose ParameterSource is another enum)."""
    return getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"


def content_options(ctx: typer.Context) -> list[str]:
    """The parameters of ``load`` that decide the content of the PFM (a resume must not change
    them): the fields pfm_dask.config marks ``content``."""
    from .config import CONTENT

    return [p.name for p in ctx.command.params
            if (s := setting_of(p)) is not None and s.decides == CONTENT]


def settings_values(ctx: typer.Context) -> dict:
    """``{LoadConfig or RunOptions: {field path: value}}`` of ``load``: an option given on the
    command line, else its value in Dask's configuration (``pfm-dask.KEY``), else its default."""
    from .config import DASK_KEY, configured
    from .errors import ConfigError

    dask_values = configured()
    out: dict = {}
    for param in ctx.command.params:
        s = setting_of(param)
        if s is None:
            continue
        value = ctx.params.get(param.name)
        if not given(ctx, param.name) and s.key in dask_values:
            try:
                value = param.process_value(ctx, dask_values[s.key])
            except Exception as err:  # noqa: BLE001 - click's BadParameter, or a type's own
                raise ConfigError(f"{DASK_KEY}.{s.key} in Dask's configuration: "
                                  f"{getattr(err, 'message', err)}") from None
        out.setdefault(s.owner, {})[s.path] = value
    return out
