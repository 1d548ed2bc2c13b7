"""The data flow is the architecture: every module imports only from the layers at or before its own, no two modules
import each other (directly or round a cycle), and the core never imports the validation layer nor the research
package (meshplan_research: the learned predictor, the model zoo, MLP-Mixer), which sit beside each other above it.

Layers, in data-flow order (a module's layer is that of the first name under ``meshplan`` it lives in):
base values → pipeline schedules (their tables, simulators and closed forms over per-rank times: pure arithmetic) →
specs → the frameworks' config formats (configs) → collectives on the mesh → per-op cost → memory and op time → step
(its passes and the channels beside them) → estimate (and what is derived from it: derived/) → serving (serve) → search
and sweeps → reinforcement learning (rl: both searches composed) → trace and calibrate → sharding planner → measure
(predict, then run a step) → report → command line → validation and research.
Imports inside functions and under ``TYPE_CHECKING`` count as imports.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LAYERS = [
    ("errors", "units", "xp", "kept", "fields", "files", "ranges", "interrupt", "captured"),
    ("pipeline",),
    ("specs",),
    ("configs",),
    ("collectives",),
    ("cost",),
    ("memory", "roofline"),
    ("step",),
    ("estimate", "derived"),
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


@cache
def import_statements(path: Path) -> tuple[ast.Import | ast.ImportFrom, ...]:
    """The import statements of ``path``, anywhere in its file, in ``ast.walk``'s order: each file parsed once per
    process for the checks that read them (the import graph, the private names, the scripts' imports; a full parse
    of src is a second or two), and only these nodes kept."""
    tree = ast.parse(path.read_text())
    return tuple(node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom))


def imports(module: str) -> set[str]:
    """The modules of meshplan / meshplan_validation / meshplan_research that ``module`` imports, anywhere in its
    file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in import_statements(path):
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


@cache
def graph() -> dict[str, set[str]]:
    """Each module's imports (``imports``): read when a test first asks (a second or two of parsing), not as the file
    is collected, which every pytest-xdist worker does."""
    return {m: imports(m) for m in MODULES}


def __getattr__(name: str) -> object:
    """``GRAPH``, the import graph, read on first use (benchmarks/docs/architecture_doc.py reads it by that name)."""
    if name == "GRAPH":
        return graph()
    raise AttributeError(name)


def test_every_module_has_a_layer():
    assert all(layer(m) is not None for m in MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_follow_the_data_flow(module):
    if layer(module) < 0:
        return
    upward = sorted(f"{m} (layer {layer(m)})" for m in graph()[module] if layer(m) > layer(module))
    assert not upward, f"{module} (layer {layer(module)}) imports from later layers: {', '.join(upward)}"


CORE = [m for m in MODULES if m.startswith("meshplan.") or m == "meshplan"]


@pytest.mark.parametrize("package", OUTSIDE)
def test_the_core_never_imports_the_packages_beside_it(package):
    leaks = [(m, i) for m in CORE for i in graph()[m] if i.split(".")[0] == package]
    assert not leaks, f"the core imports {package}: {leaks}"


def test_the_packages_beside_the_core_do_not_import_each_other():
    leaks = [(m, i) for m in MODULES for i in graph()[m]
             if m.split(".")[0] in OUTSIDE and i.split(".")[0] in OUTSIDE and i.split(".")[0] != m.split(".")[0]]
    assert not leaks


def test_the_research_package_is_read():
    """The checks above see the research package: its learned predictor imports its features and the core's
    records (at run time), and no module of the core names it."""
    assert {"meshplan_research.features", "meshplan.measure.records"} <= graph()["meshplan_research.learned"]
    assert "meshplan.measure.learned" not in MODULES and "meshplan.measure.zoo" not in MODULES


def test_no_import_cycles():
    """Depth-first search for a back edge among the modules (packages' __init__ re-exports included)."""
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_layers_are_checked_on_something():
    """The test reads the real tree: the core has dozens of modules and the estimator imports from the specs."""
    assert len(MODULES) > 40 and "meshplan.specs.plan" in graph()["meshplan.estimate"]


def private_imports(module: str) -> list[str]:
    """The names starting with one underscore that ``module`` imports from another module of meshplan /
    meshplan_validation / meshplan_research (``from meshplan.x import _helper``): a private name is its module's
    own."""
    found = []
    for node in import_statements(MODULES[module]):
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
    """The top level of meshplan holds the entry points and the few modules every layer uses (issue 82: at most 15:
    the bounded memo, kept.py, took the place of device_memory.py, now in step/ beside the step's other memory);
    each concern with more than one module is a folder."""
    top = sorted(p.stem for p in (SRC / "meshplan").glob("*.py") if p.stem != "__init__")
    assert len(top) <= 15, top


# ---- benchmarks/ (issue 82): measurements and document generators in two folders, no circle -----------------------
# benchmarks/measure/ times, measures, fits or prices something and prints it or writes data/; benchmarks/docs/ writes
# docs/*.md (a generator) or renders a part of one for the generator that imports it (a section). A script puts the
# folders it imports from on sys.path and imports another script by its file name, so an import of another script is
# one whose first name is a script's file name (unique across both folders).
BENCHMARKS = SRC.parent / "benchmarks"
FOLDERS = ("measure", "docs")
SCRIPTS = {p.stem: p for folder in FOLDERS for p in sorted((BENCHMARKS / folder).glob("*.py"))}
TEST_NAMES = {"tests", *(p.stem for p in (SRC.parent / "tests").glob("*.py"))}  # test_x, conftest, helpers
# A measurement importing a document, each with its reason (kept only while the import is there).
MEASUREMENT_EXCEPTIONS = {
    ("fit_ridge", "gemm_rows_doc"): "fits Efficiency.ridge on the GEMMs priced exactly as docs/GEMM_GPU.md prices them "
                                    "(gemm_rows_doc.predicted), so that the fit and the document cannot differ",
    ("host_dispatch", "measured"): "measured.py both measures (data/measured/*.jsonl.gz) and renders docs/MEASURED.md; "
                                   "host_dispatch takes only its data files' naming (machine_slug)",
}


def top_names(path: Path) -> set[str]:
    """The first name of every absolute import in ``path``, anywhere in the file."""
    found = set()
    for node in import_statements(path):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


@cache
def bench_graph() -> dict[str, set[str]]:
    """Which scripts each script imports (read on first use, as ``graph``)."""
    return {s: {n for n in top_names(p) if n in SCRIPTS and n != s} for s, p in SCRIPTS.items()}


def code_strings(path: Path) -> list[str]:
    """The string constants of ``path`` that are not docstrings (what the code uses, not what it says) nor in a
    statement that sets sys.path (which names the folders beside the script, benchmarks/docs/ among them)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    docs |= {id(c) for n in ast.walk(tree) if isinstance(n, ast.Expr | ast.Assign)
             and ast.unparse(n).startswith("sys.path") for c in ast.walk(n)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs]


def writes_docs(path: Path) -> bool:
    """The script's code names a path under docs/ (``ROOT / "docs" / ...`` or ``"docs/..."``): a document generator."""
    return any(s == "docs" or s.startswith("docs/") for s in code_strings(path))


MEASUREMENTS = {s for s, p in SCRIPTS.items() if p.parent.name == "measure"}
DOCUMENTS = {s for s, p in SCRIPTS.items() if p.parent.name == "docs"}


@cache
def generators() -> set[str]:
    """The documents that write under docs/ (read on first use, as ``graph``)."""
    return {s for s in DOCUMENTS if writes_docs(SCRIPTS[s])}


def sections() -> set[str]:
    """The documents that render a part of a document for the generator that imports them, and write nothing."""
    return DOCUMENTS - generators()


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (its nodes, the first repeated at the end) found by depth-first search, or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m] & graph.keys()):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        state[m] = 2
        path.pop()
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m))), None)


def test_the_benchmark_scripts_import_no_circle():
    cycle = find_cycle(bench_graph())
    assert cycle is None, "benchmarks/ import cycle: " + " -> ".join(cycle or [])


def test_a_circle_is_named():
    """The search above finds a planted circle and names it in order."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_benchmark_script_imports_the_tests():
    leaks = {s: sorted(top_names(p) & TEST_NAMES) for s, p in SCRIPTS.items() if top_names(p) & TEST_NAMES}
    assert not leaks, f"benchmark scripts importing from tests/: {leaks}"


def test_no_measurement_imports_a_document():
    found = {(m, d) for m in MEASUREMENTS for d in bench_graph()[m] & DOCUMENTS}
    assert found <= MEASUREMENT_EXCEPTIONS.keys(), f"measurements importing documents: {sorted(found)}"
    stale = MEASUREMENT_EXCEPTIONS.keys() - found
    assert not stale, f"exceptions no longer needed: {stale}"


def test_every_script_is_in_its_folder():
    """No script is left loose in benchmarks/ nor in a third folder, no two share a file name (they import each other
    by it); no measurement names a docs/ path in its code (a measurement writing a document belongs in docs/)."""
    assert not list(BENCHMARKS.glob("*.py"))
    assert {p.parent.name for p in BENCHMARKS.rglob("*.py")} == set(FOLDERS)
    assert len(SCRIPTS) == len(list(BENCHMARKS.rglob("*.py")))
    assert not {s for s in MEASUREMENTS if writes_docs(SCRIPTS[s])}


def test_the_classification_reads_the_scripts():
    """Every section of docs/ is imported by a generator and names no docs/ path itself; every ``*_doc`` script is a
    document; the split holds both kinds in numbers (the generators of docs/ACCURACY.md and docs/SPEED.md among the
    documents, the timed search and the GPU runs among the measurements)."""
    for section in sections():
        assert any(section in bench_graph()[g] for g in generators()), f"{section}: imported by no generator"
    assert {"accuracy_doc", "autoshard_doc", "measured_doc", "deepspeed_engine_doc", "mds_gpu_doc"} <= sections()
    assert {s for s in SCRIPTS if s.endswith("_doc")} <= DOCUMENTS
    assert {"accuracy", "speed_doc", "small_work_gpu_doc"} <= generators()
    assert {"search_speed", "small_work_gpu", "small_work", "small_work_common"} <= MEASUREMENTS
    assert len(generators()) >= 10 and len(MEASUREMENTS) >= 40
