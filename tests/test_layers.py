"""The package's import layers (docs/design.md, "Layers"), checked on the source with ``ast``.

Every ``import`` in ``pfm_dask/`` counts, at module level or inside a function (a lazy import
is still a dependency), except those under ``if TYPE_CHECKING:``. Rules name modules by
``fnmatch`` patterns on dotted names (``pfm_dask.filters.*``), so they keep holding when a
module is split or moved inside its layer. A second set of tests imports a module in a fresh
interpreter and checks ``sys.modules``: what a module pulls in at run time, package
``__init__`` files included.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "pfm_dask"

# ---------------------------------------------------------------------------- module groups
#: The Dask layer: the driver, the cluster, the dashboard, TLS for the cluster, the workers'
#: kernel warm-up. Modules split
#: out of the pipeline that drive Dask take a ``pipeline`` prefix (``pfm_dask.pipeline_*``) or
#: live under ``pfm_dask.pipeline.*``.
DASK = ["pfm_dask.pipeline", "pfm_dask.pipeline.*", "pfm_dask.pipeline_*", "pfm_dask.cluster",
        "pfm_dask.cluster.*", "pfm_dask.cluster_*", "pfm_dask.dashboard", "pfm_dask.dashboard_*",
        "pfm_dask.security", "pfm_dask.warmup"]
#: The command line.
CLI = ["pfm_dask.cli", "pfm_dask.cli.*", "pfm_dask.cli_*", "pfm_dask._cli*", "pfm_dask._typer_plain"]
#: Settings: may read Dask's configuration (``dask.config``, ``dask.utils``), never drive Dask.
SETTINGS = ["pfm_dask.config", "pfm_dask.config.*", "pfm_dask.config_*"]
#: Plain numbers, the WGS-84 geodesic (the NGS routines the PFM library and pfmLoader share)
#: and the hand-off types everything else builds on; they import nothing above them.
BASE = ["pfm_dask", "pfm_dask.errors", "pfm_dask._numeric", "pfm_dask._arrays", "pfm_dask._simd",
        "pfm_dask.geodesy", "pfm_dask.validity", "pfm_dask.pieces", "pfm_dask._worker_signals",
        "pfm_dask._fileio", "pfm_dask._faults"]
#: The filters: flag rules, the swath filter, the area filter (numpy and numba over arrays).
FILTERS = ["pfm_dask.filters", "pfm_dask.filters.*", "pfm_dask._area", "pfm_dask._swath",
           "pfm_dask._swath_kernel"]
#: The codecs: GSF and PFM bytes (the PFM package owns the bin grid the format defines).
GSF = ["pfm_dask.gsf", "pfm_dask.gsf.*"]
PFM = ["pfm_dask.pfm", "pfm_dask.pfm.*"]
#: The writer and what it is made of.
WRITER = ["pfm_dask.writer", "pfm_dask.writer.*", "pfm_dask.writer_*", "pfm_dask.journal"]

#: Layers from the bottom up; a module imports only from its own layer and the ones below.
#: A module no pattern names is in the "work" layer (under the Dask layer).
LAYERS = [
    ("base", BASE),
    ("kernels and codecs", FILTERS + GSF + PFM + ["pfm_dask.bins"]),
    ("work", WRITER + SETTINGS + ["pfm_dask.*"]),
    ("dask", DASK),
    ("cli", CLI),
]

DASK_LIBS = ["dask", "dask.*", "distributed", "distributed.*"]
TYPER = ["typer", "typer.*", "click", "click.*"]


def _match(name: str, patterns) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


# ---------------------------------------------------------------------------- the import graph
def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _graph() -> dict[str, dict[str, int]]:
    """``{module: {imported name: line}}`` for every module of the package; names of the
    package's own modules are resolved (relative imports, ``from pkg import submodule``)."""
    files = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for mod, path in files.items():
        is_pkg = path.name == "__init__.py"
        here = mod if is_pkg else mod.rpartition(".")[0]
        out: dict[str, int] = {}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for a in node.names:
                    out.setdefault(a.name, node.lineno)
                continue
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:  # ``from pkg import submodule`` imports the submodule
                sub = f"{target}.{a.name}"
                out.setdefault(sub if sub in files else target, node.lineno)
        # importing a.b.c runs a/__init__ and a/b/__init__ too
        for name, line in list(out.items()):
            parts = name.split(".")
            for k in range(2, len(parts)):
                parent = ".".join(parts[:k])
                if parent in files and not mod.startswith(parent + ".") and parent != mod:
                    out.setdefault(parent, line)
        out.pop(mod, None)
        graph[mod] = out
    return graph


GRAPH = _graph()


@dataclass(frozen=True)
class Rule:
    """Modules matching ``importers`` (and not ``except_``) import nothing matching ``forbidden``."""

    name: str
    why: str
    importers: tuple
    forbidden: tuple
    except_: tuple = ()

    def breaches(self) -> list[str]:
        out = []
        for mod, imported in sorted(GRAPH.items()):
            if not _match(mod, self.importers) or _match(mod, self.except_):
                continue
            for name, line in sorted(imported.items()):
                if _match(name, self.forbidden):
                    out.append(f"{mod} (line {line}) imports {name}")
        return out


def _R(name, why, importers, forbidden, except_=()):
    return Rule(name, why, tuple(importers), tuple(forbidden), tuple(except_))


RULES = [
    _R("dask-only-in-dask-layer",
       "only the Dask modules (pipeline, cluster, dashboard, security) import distributed or dask; "
       "settings may read dask.config",
       ["pfm_dask", "pfm_dask.*"], ["distributed", "distributed.*", "dask", "dask.*"],
       except_=DASK + SETTINGS),
    _R("settings-read-dask-config-only",
       "settings read Dask's configuration but never start or talk to a cluster",
       SETTINGS, ["distributed", "distributed.*"]),
    _R("typer-only-in-cli",
       "only the command line imports typer (or click)",
       ["pfm_dask", "pfm_dask.*"], TYPER, except_=CLI),
    _R("pfm-knows-no-loader",
       "the PFM codec is the format alone: no GSF, no bins module, no filters, no writer "
       "(the grid geometry the format defines lives in pfm)",
       PFM, ["pfm_dask.bins", "pfm_dask.gsf", "pfm_dask.gsf.*", "pfm_dask.soundings",
             "pfm_dask.pieces"] + FILTERS + WRITER + DASK + CLI + SETTINGS),
    _R("gsf-knows-no-pfm",
       "the GSF codec knows no PFM, no bins, no filters",
       GSF, PFM + FILTERS + WRITER + DASK + CLI + SETTINGS + ["pfm_dask.bins", "pfm_dask.soundings"]),
    _R("filters-need-no-codec",
       "the filters work on arrays and validity bits: no GSF decoder, no PFM package, no writer",
       FILTERS, GSF + PFM + WRITER + DASK + CLI + ["pfm_dask.soundings", "pfm_dask.bins"]),
    _R("writer-needs-no-gsf",
       "the writer takes hand-off types (pfm_dask.pieces), never the GSF decoder or the task code",
       WRITER, GSF + DASK + CLI + ["pfm_dask.soundings"]),
    _R("cluster-does-not-import-pipeline",
       "the cluster (and its local-cluster factory) sits under the driver: cluster -> pipeline "
       "would make an import cycle",
       ["pfm_dask.cluster", "pfm_dask.cluster.*"], ["pfm_dask.pipeline", "pfm_dask.pipeline.*",
                                                     "pfm_dask.pipeline_*"]),
]

#: Rules the code still breaks, with the reason; removed as the code is mended.
KNOWN_BREACHES = {
}


def _xfail(name: str):
    reason = KNOWN_BREACHES.get(name)
    return [pytest.mark.xfail(reason=reason, strict=False)] if reason else []


@pytest.mark.parametrize("rule", [pytest.param(r, id=r.name, marks=_xfail(r.name)) for r in RULES])
def test_import_rule(rule: Rule):
    breaches = rule.breaches()
    assert not breaches, f"{rule.why}:\n  " + "\n  ".join(breaches)


def _layer(mod: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        if _match(mod, patterns):
            return i
    raise AssertionError(f"{mod} is in no layer")


@pytest.mark.parametrize("layer", [pytest.param(i, id=name) for i, (name, _) in enumerate(LAYERS)])
def test_layers_are_one_way(layer: int):
    """A module imports package modules of its own layer and those below, never above."""
    bad = []
    for mod, imported in sorted(GRAPH.items()):
        if _layer(mod) != layer:
            continue
        for name, line in sorted(imported.items()):
            if name.split(".")[0] == "pfm_dask" and name in GRAPH and _layer(name) > layer:
                bad.append(f"{mod} (line {line}) imports {name} ({LAYERS[_layer(name)][0]} layer)")
    assert not bad, "imports that go up a layer:\n  " + "\n  ".join(bad)


def _cycles() -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), package ``__init__`` edges
    to and from its own submodules left out (a package re-exporting its parts is no cycle)."""
    def related(a: str, b: str) -> bool:
        return a.startswith(b + ".") or b.startswith(a + ".")

    edges = {m: [n for n in imp if n in GRAPH and not related(m, n)] for m, imp in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = _cycles()
    assert not cycles, "modules that import each other: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_every_rule_names_real_modules():
    """Each group pattern matches a module of the package, so a rename cannot silently empty a
    rule (new modules a pattern anticipates, e.g. ``pfm_dask.pipeline_*``, are allowed to be
    absent)."""
    for group in (DASK, CLI, SETTINGS, FILTERS, GSF, PFM, WRITER):
        assert any(_match(m, group) for m in GRAPH), group


def test_graph_sees_relative_and_lazy_imports():
    """The ast walk resolves relative imports and finds imports inside functions."""
    assert "pfm_dask.errors" in GRAPH["pfm_dask.gsf._reader"]
    assert "numba" in GRAPH["pfm_dask._numeric"]  # imported inside njit_cached


# ---------------------------------------------------------------------------- at run time
def _loaded(module: str) -> set[str]:
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(PKG.parent))
    return set(json.loads(out.stdout.splitlines()[-1]))


#: (module imported, patterns that must not be in sys.modules afterwards, xfail reason or None)
RUNTIME = [
    ("pfm_dask.pfm", DASK_LIBS + TYPER + ["pfm_dask.gsf*", "pfm_dask.filters*", "pfm_dask._area",
                                          "pfm_dask._swath*", "pfm_dask.writer*", "pfm_dask.bins",
                                          "pfm_dask.soundings", "pfm_dask.pieces", "numba"], None),
    ("pfm_dask.gsf", DASK_LIBS + TYPER + ["pfm_dask.pfm", "pfm_dask.pfm.*", "pfm_dask.filters*",
                                          "pfm_dask.writer*", "numba"], None),
    ("pfm_dask.filters", DASK_LIBS + TYPER + ["pfm_dask.gsf", "pfm_dask.gsf.*", "pfm_dask.pfm",
                                              "pfm_dask.pfm.*", "pfm_dask.writer*", "numba"], None),
    ("pfm_dask.writer", DASK_LIBS + TYPER + ["pfm_dask.gsf", "pfm_dask.gsf.*", "pfm_dask.soundings",
                                             "numba"], None),
    ("pfm_dask.soundings", DASK_LIBS + TYPER + ["numba"], None),
    ("pfm_dask.pieces", DASK_LIBS + TYPER + ["numba", "pfm_dask.gsf", "pfm_dask.gsf.*", "pfm_dask.pfm",
                                             "pfm_dask.pfm.*", "pfm_dask.filters*"], None),
]


@pytest.mark.parametrize(
    "module,forbidden",
    [pytest.param(m, f, id=m, marks=[pytest.mark.xfail(reason=r, strict=False)] if r else [])
     for m, f, r in RUNTIME])
def test_import_loads_only_its_layer(module: str, forbidden: list[str]):
    """Importing a codec, the filters or the writer loads neither Dask nor typer nor numba (numba
    is imported when a kernel first runs), nor the parts of the package above it."""
    loaded = _loaded(module)
    bad = sorted(m for m in loaded if _match(m, forbidden))
    assert not bad, f"import {module} loads {bad}"
