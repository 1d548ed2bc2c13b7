"""Public names defined in two or more modules of meshplan (issue 45: 82 of them; at most 20 wanted). A public name
is module level and has no leading underscore: a function, a class or an assigned constant (imports and
re-exports do not count: they name the one definition). Every duplicate still allowed is listed in ALLOWED with its
modules; a new one fails, and so does an entry no longer duplicated (drop it, and lower LIMIT). LIMIT caps the list:
lower it to 20 as the duplicates go.

    python tests/test_duplicate_names.py        # prints every duplicate: name, then its modules
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "meshplan"
LIMIT = 18  # 83 when the test was written (85 before the research code left); 64 after configs, sweep, measure, ranges;
# 62 after the engines shared one physics
# 41 after the report's serving twins, build, run, render, options, KINDS, SYSTEM_COLORS
# 20 after autoshard, trace, steady and the report's private helpers
# 19 after the commands' modules lost their unused COMMANDS lists (cli/main.py's table registers them)
# 18 after the tensor layouts' names became their registry's (specs/layouts.py)


def defined(tree: ast.Module) -> set[str]:
    """The public names a module's top level defines (inside top-level ``if`` / ``try`` blocks too)."""
    found: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                found.add(node.name)
            elif isinstance(node, ast.Assign):
                found.update(n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(node.orelse)
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                visit(getattr(node, "finalbody", []))

    visit(tree.body)
    return {n for n in found if not n.startswith("_")}


def module_of(path: Path, root: Path = SRC) -> str:
    """``src/meshplan/cli/options.py`` → ``cli.options``; a package's ``__init__.py`` → the package."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def duplicates(files: list[Path], root: Path = SRC) -> dict[str, tuple[str, ...]]:
    """Public name → the modules defining it, for the names two or more of ``files`` define."""
    where: dict[str, list[str]] = {}
    for path in files:
        for name in defined(ast.parse(path.read_text())):
            where.setdefault(name, []).append(module_of(path, root))
    return {n: tuple(sorted(m)) for n, m in sorted(where.items()) if len(m) > 1}


def listing(dups: dict[str, tuple[str, ...]]) -> str:
    return "\n".join(f"{name}: {', '.join(modules)}" for name, modules in dups.items())


ALLOWED = {  # name: the modules (under meshplan) defining it
    "AXES": ("cli.options", "search.best", "specs.supports"),
    "DEFAULT": ("serve.engine", "specs.efficiency", "specs.stack"),
    "MEMORY": ("serve.check", "step.assemble"),
    "Memory": ("cost.model_states", "serve.memory"),
    "Part": ("search.evaluate", "serve.weighed"),
    "RECOMPUTE": ("specs.plan", "specs.supports"),
    "RECOMPUTE_MODULES": ("cost.recompute", "specs.plan"),
    "SCHEDULES": ("search.explore", "specs.plan"),
    "SEARCH_ONLY": ("cli.serve", "cli.shard"),
    "Settings": ("calibrate.settings", "step.grid"),
    "activation_bytes": ("memory", "serve.memory"),
    "collective": ("cost.blocks", "cost.decode"),
    "estimate": ("cli.estimate", "estimate"),
    "gemm": ("cost.blocks", "cost.decode"),
    "main": ("cli.check", "cli.main"),
    "norm": ("cost.blocks", "cost.decode"),
    "qkv_ops": ("cost.attention", "serve.ops"),
    "search": ("search.run", "serve.search"),
}


@pytest.fixture(scope="module")
def found() -> dict[str, tuple[str, ...]]:
    """The duplicates of src/meshplan, read once for the tests that ask (not as the file is collected, which every
    pytest-xdist worker does: a second and a half of parsing)."""
    return duplicates(sorted(SRC.rglob("*.py")))


def test_no_new_duplicate_public_names(found):
    """A name defined again (a new name, or an allowed one in a module more) is a fork of one concept: import the
    definition that exists, or give the new one a name of its own."""
    new = {n: m for n, m in found.items() if not set(m) <= set(ALLOWED.get(n, ()))}
    assert not new, f"public names newly defined in two or more modules:\n{listing(new)}"


def test_the_allowed_list_holds_only_current_duplicates(found):
    """The list shrinks as the duplicates go: an entry no longer duplicated is removed (then lower LIMIT)."""
    gone = {n: m for n, m in ALLOWED.items() if n not in found}
    assert not gone, f"no longer duplicated, remove from ALLOWED (and lower LIMIT):\n{listing(gone)}"


def test_at_most_limit_duplicates():
    assert len(ALLOWED) <= LIMIT, f"{len(ALLOWED)} duplicate public names, at most {LIMIT}:\n{listing(ALLOWED)}"


def test_a_planted_duplicate_is_found(tmp_path):
    """The count reads real definitions: a function, a class and a constant written in two files are three
    duplicates; an import of one of them, an underscored name and a nested function are not."""
    (tmp_path / "a.py").write_text("X = 1\ndef f():\n    def inner(): pass\nclass C: pass\n_p = 0\n")
    (tmp_path / "b.py").write_text("from a import f\nif True:\n    X: int = 2\ndef inner(): pass\n"
                                   "try:\n    class C: pass\nexcept ImportError:\n    pass\n_p = 1\n")
    found = duplicates([tmp_path / "a.py", tmp_path / "b.py"], root=tmp_path)
    assert found == {"C": ("a", "b"), "X": ("a", "b")}


if __name__ == "__main__":
    FOUND = duplicates(sorted(SRC.rglob("*.py")))
    print(listing(FOUND))
    print(f"{len(FOUND)} public names defined in two or more modules of src/meshplan")
