"""The data flow is the architecture: every module imports only from the layers at or before its own, no two modules
import each other (directly or round a cycle), and the core never imports the validation layer nor the research
package (meshplan_research: the learned predictor, the model zoo, MLP-Mixer), which sit beside each other above it.

Layers, in data-flow order (a module's layer is that of the first name under ``meshplan`` it lives in):
base values → pipeline schedules (their tables, simulators and closed forms over per-rank times: pure arithmetic) →
specs → the frameworks' config formats (configs) → collectives on the mesh → per-op cost → memory and op time → overlap
channels → step → estimate → serving (serve) → search and sweeps → reinforcement learning (rl: both searches
composed) → trace and
calibrate → sharding planner → measure (predict, then run a step) → report → command line → validation and research.
Imports inside functions and under ``TYPE_CHECKING`` count as imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = [
    ("errors", "units", "xp", "fields", "files", "ranges", "interrupt", "captured"),
    ("pipeline",),
    ("specs",),
    ("configs",),
    ("collectives",),
    ("cost",),
    ("memory", "roofline"),
    ("channels",),
    ("step",),
    ("estimate", "goodput", "mixed", "energy"),
    ("serve",),
    ("search",),
    ("rl",),
    ("trace", "calibrate"),
    ("autoshard",),
    ("measure",),
    ("report",),
    ("cli",),
]
VALIDATION = len(LAYERS)  # the packages meshplan_validation and meshplan_research, above the whole core
OUTSIDE = ("meshplan_validation", "meshplan_research")  # the packages beside the core, which it never imports


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def layer(module: str) -> int:
    """The layer of a module of meshplan, meshplan_validation or meshplan_research (the package ``meshplan``
    itself: -1, the public API, which re-exports from every layer and is imported by none of them)."""
    if module.split(".")[0] in OUTSIDE:
        return VALIDATION
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    for rank, names in enumerate(LAYERS):
        if parts[1] in names:
            return rank
    raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")


def imports(module: str) -> set[str]:
    """The modules of meshplan / meshplan_validation / meshplan_research that ``module`` imports, anywhere in its
    file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] in ("meshplan", *OUTSIDE) and n != module}
    return found


GRAPH = {m: imports(m) for m in MODULES}


def test_every_module_has_a_layer():
    assert all(layer(m) is not None for m in MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_data_flow(module):
    if layer(module) < 0:
        return
    upward = sorted(f"{m} (layer {layer(m)})" for m in GRAPH[module] if layer(m) > layer(module))
    assert not upward, f"{module} (layer {layer(module)}) imports from later layers: {', '.join(upward)}"


CORE = [m for m in MODULES if m.startswith("meshplan.") or m == "meshplan"]


@pytest.mark.parametrize("package", OUTSIDE)
def test_the_core_never_imports_the_packages_beside_it(package):
    leaks = [(m, i) for m in CORE for i in GRAPH[m] if i.split(".")[0] == package]
    assert not leaks, f"the core imports {package}: {leaks}"


def test_the_packages_beside_the_core_do_not_import_each_other():
    leaks = [(m, i) for m in MODULES for i in GRAPH[m]
             if m.split(".")[0] in OUTSIDE and i.split(".")[0] in OUTSIDE and i.split(".")[0] != m.split(".")[0]]
    assert not leaks


def test_the_research_package_is_read():
    """The checks above see the research package: its learned predictor imports its features and the core's
    records (at run time), and no module of the core names it."""
    assert {"meshplan_research.features", "meshplan.measure.records"} <= GRAPH["meshplan_research.learned"]
    assert "meshplan.measure.learned" not in MODULES and "meshplan.measure.zoo" not in MODULES


def test_no_import_cycles():
    """Depth-first search for a back edge among the modules (packages' __init__ re-exports included)."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(GRAPH[m] & GRAPH.keys()):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = 2
        path.pop()
        return None

    for m in sorted(GRAPH):
        if m not in state and (cycle := visit(m)):
            pytest.fail("import cycle: " + " -> ".join(cycle))


def test_the_layers_are_checked_on_something():
    """The test reads the real tree: the core has dozens of modules and the estimator imports from the specs."""
    assert len(MODULES) > 40 and "meshplan.specs.plan" in GRAPH["meshplan.estimate"]


def private_imports(module: str) -> list[str]:
    """The names starting with one underscore that ``module`` imports from another module of meshplan /
    meshplan_validation / meshplan_research (``from meshplan.x import _helper``): a private name is its module's
    own."""
    found = []
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("meshplan", *OUTSIDE):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_names():
    leaks = {m: private_imports(m) for m in MODULES if private_imports(m)}
    assert not leaks, f"private names imported across modules (make them public or move them): {leaks}"


def test_a_private_import_is_noticed(tmp_path, monkeypatch):
    """The check above reads real import statements: a planted one is found."""
    planted = tmp_path / "planted.py"
    planted.write_text("from meshplan.report.text import _hidden, public\n")
    monkeypatch.setitem(MODULES, "meshplan.planted", planted)
    assert private_imports("meshplan.planted") == ["meshplan.report.text._hidden"]


def test_the_top_level_holds_few_modules():
    """The top level of meshplan holds the entry points and the few modules every layer uses (issue 82: at most 15);
    each concern with more than one module is a folder."""
    top = sorted(p.stem for p in (SRC / "meshplan").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 15, top
