"""The validation layer reads top to bottom: each module of meshplan_validation imports only the modules above it
in LAYERS (so no cycles), every module is placed, and no module of the layer but patterns.py compiles a regular
expression of its own (the patterns that read a record's fields live in one module)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parents[1] / "src" / "meshplan_validation"
# data-flow order: the records and what they say, the sources' and recipes' knowledge, the mapping onto meshplan,
# the FLOP bases and the measured quantity, the case, its evaluation; the published serving runs (trtllm-bench's own
# engine settings, their mapping onto meshplan's serving model, their evaluation, their results as runs); the
# summaries, the output, the command
LAYERS = ("skip", "patterns", "records", "record_fields", "recipes", "source_vtrain", "source_megatron_jan2021",
          "source_automodel", "source_internevo", "sources", "robust_loss",  # the fits' loss, which refit imports
          "provenance", "fitted", "untuned_bound", "refit", "recipes_dispatch", "recipes_off", "recipes_remat",
          "layouts", "map_model", "map_system", "map_layout",
          "map_training", "map_kernels", "map_plan", "flops", "measurement", "case", "selection", "result",
          "evaluate", "loso_training", "trtllm_bench", "serving_map", "serving_eval", "loso_serving", "serving_runs",
          "rl_eval", "summary", "render",
          "validate", "command")


def imported(path: Path) -> set[str]:
    """The meshplan_validation modules a file imports, at the top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == "meshplan_validation":
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("meshplan_validation."):
            names.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            names |= {a.name.split(".")[1] for a in node.names if a.name.startswith("meshplan_validation.")}
    return names


def test_every_module_is_placed():
    assert {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"} == set(LAYERS)


def test_each_module_imports_only_modules_above_it():
    for i, name in enumerate(LAYERS):
        later = imported(PACKAGE / f"{name}.py") - set(LAYERS[:i])
        assert not later, f"{name} imports {sorted(later)}, which stand at or below it in LAYERS"


def test_only_patterns_compiles_regular_expressions():
    for path in PACKAGE.glob("*.py"):
        compiled = [node.lineno for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "compile" and getattr(node.func.value, "id", "") == "re"]
        assert path.stem == "patterns" or not compiled, f"{path.name} compiles patterns at lines {compiled}"
