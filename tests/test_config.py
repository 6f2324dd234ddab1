"""One source of configuration: every default is a field of ``LoadConfig`` or ``RunOptions``;
the command line's options and Dask's configuration (``pfm-dask`` key, ``DASK_PFM_DASK__…``
variables, YAML files) are read from those fields, and the command line comes first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pfm_dask import _cli_app as cli  # the typer commands (pfm_dask.cli runs them)
from pfm_dask.config import (CONTENT, LAYOUT, RUN, LoadConfig, RunOptions, defaults_yaml,
                             parse_size, settings)
from pfm_dask.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def captured(monkeypatch, tmp_path):
    """``pfm-dask load`` up to the load itself: the LoadConfig and RunOptions it would run."""
    seen = {}

    class _Res:
        exit_code = 0

    def fake_run_load(inputs, output, cfg, options, **kw):
        seen.update(cfg=cfg, options=options, **kw)
        return _Res()

    monkeypatch.setattr(cli, "_run_load", fake_run_load)
    (tmp_path / "a.gsf").write_bytes(b"")

    def run(*args):
        r = CliRunner().invoke(cli.app, ["load", str(tmp_path / "a.gsf"), "-o",
                                         str(tmp_path / "o.pfm"), *args])
        return r, seen
    return run


def test_the_command_lines_defaults_are_the_dataclasses(captured):
    r, seen = captured()
    assert r.exit_code == 0, r.output
    assert seen["cfg"] == LoadConfig()
    assert seen["options"] == RunOptions()   # the mode is set later, from --serial etc.
    assert seen["auto"] is True


def test_every_option_with_a_default_is_a_field_and_says_what_it_decides():
    load = next(c for c in cli.app.registered_commands if c.callback.__name__ == "load")
    import inspect

    params = inspect.signature(load.callback).parameters
    by_flag = {s.option[0]: s for s in settings()}
    for name, p in params.items():
        info = p.default
        flags = getattr(info, "param_decls", None) or ()
        if flags and flags[0] in by_flag:
            s = by_flag[flags[0]]
            assert info.default == s.cli_default and info.help == s.help, name
    assert len([s for s in settings() if s.owner is LoadConfig]) == 17
    for cls in (LoadConfig, RunOptions):
        for f in fields(cls):
            assert f.metadata.get("decides") in (CONTENT, LAYOUT, RUN), (cls, f.name)
    # what a resume may change: the run options and the layout (the journal keeps the plan)
    assert {f.name for f in fields(LoadConfig) if f.metadata["decides"] != CONTENT} == {
        "max_backlog_bytes", "split_pings", "tail_pieces"}
    assert all(f.metadata["decides"] == RUN for f in fields(RunOptions)
               if f.name != "max_backlog_bytes")


def test_the_content_options_are_the_content_fields(captured):
    """The options a resume refuses to change, and a printed resume command leaves out."""
    import typer

    load = typer.main.get_command(cli.app).commands["load"]
    ctx = load.make_context("load", ["x", "-o", "y"])
    assert sorted(cli._content_options(ctx)) == sorted((
        "mbr", "polygon", "bin_size", "min_depth", "max_depth", "precision", "swath_filter",
        "swath_pings", "swath_beams", "swath_threshold", "area_filter", "cellstd", "deep_only",
        "nominal", "herr", "verr"))


def test_dask_config_sets_defaults_and_the_command_line_comes_first(captured):
    dask = pytest.importorskip("dask")
    with dask.config.set({"pfm-dask.workers": 5, "pfm-dask.max-backlog": "1GiB",
                          "pfm-dask.bin_size": 10.0, "pfm-dask.area-filter": True}):
        r, seen = captured()
        assert r.exit_code == 0, r.output
        assert seen["options"].workers == 5 and seen["auto"] is True
        assert seen["cfg"].max_backlog_bytes == 2**30
        assert seen["cfg"].bin_size_m == 10.0 and seen["cfg"].area_filter
        r, seen = captured("--workers", "3", "--bin-size", "4", "--no-area-filter")
        assert r.exit_code == 0, r.output
        assert seen["options"].workers == 3 and seen["auto"] is False
        assert seen["cfg"].bin_size_m == 4.0 and not seen["cfg"].area_filter
        assert seen["cfg"].max_backlog_bytes == 2**30
        # registered as dask-jobqueue registers its defaults
        assert dask.config.get("pfm-dask.checkpoint-seconds") == 10.0


def test_dask_config_is_checked_like_the_command_line(captured):
    dask = pytest.importorskip("dask")
    with dask.config.set({"pfm-dask.workers": 0}):
        r, _ = captured()
        assert r.exit_code == 2 and "--workers must be at least 1" in r.output
    with dask.config.set({"pfm-dask.workers": "many"}):
        r, _ = captured()
        assert r.exit_code == 2 and "pfm-dask.workers in Dask's configuration" in r.output
    with dask.config.set({"pfm-dask.wrokers": 4}):
        r, _ = captured()
        assert r.exit_code == 2 and "pfm-dask.wrokers in Dask's configuration is not a " \
            "setting" in r.output


def _tiny_load(tmp_path: Path, env: dict, *args) -> tuple[subprocess.CompletedProcess, dict]:
    from pfm_dask import synth

    survey = tmp_path / "survey"
    if not survey.exists():
        synth.generate(survey, files=1, pings=20, beams=32, seed=2)
    out = tmp_path / f"o{len(list(tmp_path.glob('*.pfm')))}.pfm"
    code = ("import atexit, sys\n"
            "atexit.register(lambda: print('IMPORTED', 'dask' in sys.modules, file=sys.stderr))\n"
            "sys.argv[0] = 'pfm-dask'\nfrom pfm_dask.cli import main\nmain()\n")
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("DASK_")}
    r = subprocess.run([sys.executable, "-c", code, "load", str(survey), "-o", str(out),
                        "--serial", "-q", *args], capture_output=True, text=True, timeout=300,
                       env={**clean, "PYTHONPATH": str(ROOT), **env})
    static = json.loads((Path(str(out) + ".data") / "load.json").read_text()) \
        if r.returncode == 0 else {}
    return r, static


def test_environment_variables_and_yaml_files_set_defaults(tmp_path):
    """A real process: ``DASK_PFM_DASK__…`` variables, then a YAML file in ``DASK_CONFIG``;
    with neither, a serial load does not import Dask to look."""
    r, static = _tiny_load(tmp_path, {"DASK_PFM_DASK__MAX_BACKLOG": "2GiB",
                                      "DASK_PFM_DASK__BIN_SIZE": "30"})
    assert r.returncode == 0, r.stderr
    assert static["cfg"]["max_backlog_bytes"] == 2 * 2**30 and static["cfg"]["bin_size_m"] == 30
    r, static = _tiny_load(tmp_path, {"DASK_PFM_DASK__BIN_SIZE": "30"}, "--bin-size", "40")
    assert r.returncode == 0, r.stderr
    assert static["cfg"]["bin_size_m"] == 40
    folder = tmp_path / "dask-config"
    folder.mkdir()
    (folder / "site.yaml").write_text("pfm-dask:\n  cellstd: 1.7\n  checkpoint-seconds: 0\n")
    r, static = _tiny_load(tmp_path, {"DASK_CONFIG": str(folder)})
    assert r.returncode == 0, r.stderr
    assert static["cfg"]["cellstd"] == 1.7 and static["cfg"]["bin_size_m"] == 2.0
    r, static = _tiny_load(tmp_path, {"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "IMPORTED False" in r.stderr
    assert static["cfg"] == json.loads(json.dumps(LoadConfig().to_dict()))


def test_the_packaged_yaml_holds_the_dataclasses_defaults():
    packaged = (ROOT / "pfm_dask" / "pfm-dask.yaml").read_text()
    assert packaged == defaults_yaml(), "regenerate: python -c 'from pfm_dask.config import " \
        "defaults_yaml; print(defaults_yaml(), end=\"\")' > pfm_dask/pfm-dask.yaml"
    yaml = pytest.importorskip("yaml")
    section = yaml.safe_load(packaged)["pfm-dask"]
    for s in settings():
        assert section[s.key] == s.cli_default, s.key
    assert parse_size(section["max-backlog"]) == LoadConfig().max_backlog_bytes


SIZES = ["512MiB", "2GB", "1000", "1e6", "5 kB", "5.4kB", "1kiB", "100M", "1.5 GiB", "MB",
         "7b", "3KB", "1e3 MiB", " 12 gib ", "0", "2T", "1PiB", 123, 4.5]


@pytest.mark.parametrize("text", SIZES, ids=[str(s) for s in SIZES])
def test_parse_size_reads_sizes_as_dask_does(text):
    from dask.utils import parse_bytes

    assert parse_size(text) == parse_bytes(text)


@pytest.mark.parametrize("text", ["lots", "5 foos", "", "1.2.3MB", "MiBs", "-1MB", "inf", "nan"])
def test_parse_size_refuses_what_is_not_a_size(text):
    with pytest.raises(ConfigError, match="cannot read size"):
        parse_size(text)


def test_journal_config_round_trip_and_retired_fields():
    from pfm_dask import journal as J

    cfg = LoadConfig(bin_size_m=5.0, mbr=(1, 2, 3, 4), max_backlog_bytes=3 << 20)
    d = J.config_to_dict(cfg)
    assert J.config_from_dict(d) == cfg == LoadConfig.from_dict(d)
    old = {**d, "max_window": 16, "batch_pings": 2000}  # what the previous version wrote
    assert LoadConfig.from_dict(old) == cfg
    assert J.content_differences(d, old) == []
    assert J.content_differences(d, {**old, "max_backlog_bytes": 1 << 30}) == []
    assert J.content_differences(d, {**old, "cellstd": 2.0}) == ["cellstd"]
