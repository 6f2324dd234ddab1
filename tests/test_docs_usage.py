"""docs/usage.md covers every command and option of the CLI, the README's tables list every
command, every docs page and every top-level module (issue 20), and docs/design.md lists every
module (issue 22): introspected, so a new option, page or module that is not documented fails
here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from pfm_dask.cli import app

REPO = Path(__file__).resolve().parent.parent
USAGE = (REPO / "docs" / "usage.md").read_text()
README = (REPO / "README.md").read_text()
COMMANDS = typer.main.get_command(app)


def _commands() -> list[str]:
    return sorted(COMMANDS.commands)


def _options() -> list[tuple[str, str]]:
    out = []
    for name, cmd in sorted(COMMANDS.commands.items()):
        for param in cmd.params:
            if param.param_type_name == "option":
                for opt in [*param.opts, *param.secondary_opts]:
                    if opt.startswith("--"):
                        out.append((name, opt))
    return out


def section(command: str) -> str:
    """docs/usage.md's section on ``command``: from its heading to the next heading of the
    same or a higher level ("" when it has none)."""
    lines = USAGE.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(#+) .*`pfm-dask " + re.escape(command) + r"[ `]", line)
        if m:
            level = len(m.group(1))
            end = next((j for j in range(i + 1, len(lines))
                        if re.match(r"^#{1,%d} " % level, lines[j])), len(lines))
            return "\n".join(lines[i:end])
    return ""


@pytest.mark.parametrize("command", _commands())
def test_usage_has_a_section_on_every_command(command):
    assert section(command), f"docs/usage.md has no heading for `pfm-dask {command}`"


@pytest.mark.parametrize("command, option", _options(),
                         ids=[f"{c} {o}" for c, o in _options()])
def test_usage_documents_every_option_in_its_command_section(command, option):
    assert re.search(re.escape(option) + r"(?![\w-])", section(command)), \
        f"docs/usage.md's section on `pfm-dask {command}` does not mention {option}"


@pytest.mark.parametrize("command", _commands())
def test_readme_lists_every_command(command):
    table = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    assert f"`pfm-dask {command}" in table, f"README's command table lacks {command}"


@pytest.mark.parametrize("page", sorted(p.name for p in (REPO / "docs").glob("*.md")))
def test_readme_links_every_docs_page(page):
    table = README.split("## Documentation", 1)[1].split("\n## ", 1)[0]
    assert f"docs/{page}" in table, f"README's documentation table lacks docs/{page}"


def _top_level() -> list[str]:
    pkg = REPO / "pfm_dask"
    mods = [f"pfm_dask/{p.name}" for p in pkg.glob("*.py") if p.name != "__init__.py"]
    subs = [f"pfm_dask/{p.name}/" for p in pkg.iterdir()
            if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(mods + subs)


@pytest.mark.parametrize("path", _top_level())
def test_readme_layout_lists_every_module(path):
    table = README.split("## Layout", 1)[1].split("\n## ", 1)[0]
    assert f"`{path}`" in table, f"README's layout table lacks {path}"


def _every_module() -> list[str]:
    pkg = REPO / "pfm_dask"
    return sorted(p.relative_to(pkg).as_posix() for p in pkg.rglob("*.py")
                  if p.name != "__init__.py" and "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _every_module())
def test_design_page_lists_every_module(path):
    """docs/design.md's module table names every module of the package, sub-packages too."""
    design = (REPO / "docs" / "design.md").read_text()
    table = design.split("## Modules", 1)[1].split("\n## ", 1)[0]
    assert f"| `{path}` |" in table, f"docs/design.md's module table lacks {path}"


def test_design_page_covers_the_journal():
    """The design page has a section on the journal: phases, checkpoints, undo log, faults."""
    design = (REPO / "docs" / "design.md").read_text()
    section = design.split("## The journal", 1)[1].split("\n## ", 1)[0]
    for word in ("Phases", "Checkpoints", "Undo log", "_faults.py", "docs/reliability.md"):
        assert word in section, word


#: The research notes kept outside the repository. Spelled in parts so this file does not cite them.
_OUTSIDE_NOTES = re.compile(r"\b(?:" + "|".join(("PFM", "DASK", "FORMAT", "STYLE")) + r")_NOTES\b")


def test_no_citation_of_notes_outside_the_repository():
    """Code, tests and docs cite docs/ pages, never the research notes a reader does not have."""
    hits = []
    for top in ("pfm_dask", "tests", "benchmarks", "docs"):
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix in (".py", ".md", ".yaml", ".toml", ".txt") and path.is_file():
                for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if _OUTSIDE_NOTES.search(line):
                        hits.append(f"{path.relative_to(REPO)}:{n}")
    for n, line in enumerate(README.splitlines(), 1):
        if _OUTSIDE_NOTES.search(line):
            hits.append(f"README.md:{n}")
    assert not hits, hits
