"""docs/ARCHITECTURE.md: meshplan's layers in data-flow order, generated from the import-order test's own list and its
own reading of the imports (LAYERS, OUTSIDE, MODULES, GRAPH and layer() of tests/test_imports.py, imported by path):

    python benchmarks/docs/architecture_doc.py          # writes docs/ARCHITECTURE.md

It shows a picture of the layers (a text stack with the layers each one imports from, and a mermaid graph of the
import edges between layers, transitively reduced), then each layer: its packages and modules, their line counts and
the first sentence of each one's docstring, the layers it imports from and is imported by. The section between the
two hand-written markers is kept as the committed document has it; the rest is generated. tests/test_docs.py writes
the document again and compares, so a new module, a moved one, a changed docstring or a new import between layers
makes the committed document stale.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import sys
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
TEST = ROOT / "tests" / "test_imports.py"
BEGIN = "<!-- hand-written: benchmarks/docs/architecture_doc.py keeps this section as it is -->"
END = "<!-- end of the hand-written section -->"
PLACEHOLDER = "(Prose written by hand goes here: why the layers are in this order, what each one owns.)"
LONGEST = 200  # characters of a docstring's first sentence quoted in a table
SHORTEST = 40  # a first sentence shorter than this is quoted with the next one
# Line counts to two significant figures: exact ones would make this document stale at almost every commit (any edit
# of any module), rounded ones move when a package grows or shrinks by about a hundredth of its size.
SIGNIFICANT = 2


@cache
def import_test() -> ModuleType:
    """tests/test_imports.py as a module: its LAYERS and its reading of every module's imports (read once: its GRAPH
    parses every source, about 2.5 s, and tests/test_docs.py asks twice)."""
    spec = importlib.util.spec_from_file_location("architecture_import_order", TEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One package or module under src/meshplan (or a package beside the core), as a row of its layer's table."""

    name: str  # "specs/", "errors.py", "meshplan_validation/", "specs/hf/" (a package inside a package)
    layer: int
    modules: int
    lines: int
    summary: str
    nested: bool = False


def first_sentence(path: Path) -> str:
    """The first sentence of a file's docstring (its first paragraph, cut after LONGEST characters)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    if not paragraph:
        return "(no docstring)"
    ends = [m.start() + 1 for m in re.finditer(r"\.(?=\s+[A-Z(`])", paragraph)] + [len(paragraph)]
    sentence = paragraph[: next(e for e in ends if e >= SHORTEST)]  # "Units." alone says little: the next one too
    if len(sentence) > LONGEST:
        sentence = sentence[:LONGEST].rsplit(" ", 1)[0] + " …"
    return sentence.replace("|", "\\|")


def rounded(lines: int) -> str:
    """A line count to SIGNIFICANT figures, with thousands separators: 34, 250, 1,100, 49,000."""
    return f"{round(lines, -max(0, len(str(lines)) - SIGNIFICANT)):,}"


def entry_key(module: str, outside: tuple[str, ...]) -> str:
    """The row a module counts in: its first name under meshplan, or its package beside the core."""
    parts = module.split(".")
    return parts[0] if parts[0] in outside else parts[1]


def entries(test: ModuleType) -> list[Entry]:
    """Every package and module of the core (and each package beside it) with its line count, in layer order;
    a package inside a package (specs/hf/, serve/load/) also gets its own row under its parent."""
    rows: dict[str, list[str]] = {}
    for module in sorted(test.MODULES):
        if module != "meshplan":
            rows.setdefault(entry_key(module, test.OUTSIDE), []).append(module)
    out = []
    for key, modules in rows.items():
        paths = [test.MODULES[m] for m in modules]
        package = paths[0].name == "__init__.py"
        out.append(Entry(name=f"{key}/" if package else f"{key}.py", layer=test.layer(modules[0]),
                         modules=len(paths), lines=sum(len(p.read_text().splitlines()) for p in paths),
                         summary=first_sentence(paths[0])))
        for init in sorted(p for p in paths[1:] if p.name == "__init__.py"):
            inner = [p for p in paths if init.parent in p.parents]
            out.append(Entry(name=init.parent.relative_to(paths[0].parent.parent).as_posix() + "/",
                             layer=out[-1].layer, modules=len(inner), nested=True,
                             lines=sum(len(p.read_text().splitlines()) for p in inner), summary=first_sentence(init)))
    return sorted(out, key=lambda e: e.layer)


def layer_edges(test: ModuleType) -> Counter[tuple[int, int]]:
    """(importing layer, imported layer) -> how many module-to-module imports cross from one to the other (the public
    API, the package ``meshplan`` itself, is left out: it re-exports from every layer and none imports it)."""
    edges: Counter[tuple[int, int]] = Counter()
    for module, imported in test.GRAPH.items():
        if module not in test.MODULES or test.layer(module) < 0:
            continue
        for other in imported & test.MODULES.keys():
            if test.layer(other) >= 0 and test.layer(other) != test.layer(module):
                edges[test.layer(module), test.layer(other)] += 1
    return edges


def reduce(edges: set[tuple[int, int]]) -> set[tuple[int, int]]:
    """The transitive reduction of an acyclic graph: an edge a -> b is left out when b is reached from a another way."""
    after: dict[int, set[int]] = {}
    for a, b in edges:
        after.setdefault(a, set()).add(b)

    def reach(start: int, skip: tuple[int, int]) -> set[int]:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            for nxt in after.get(node, ()):
                if (node, nxt) != skip and nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    return {(a, b) for a, b in edges if b not in reach(a, (a, b))}


def layer_title(test: ModuleType, rank: int) -> str:
    names = test.LAYERS[rank] if rank < len(test.LAYERS) else test.OUTSIDE
    return ", ".join(names)


def stack(test: ModuleType, rows: list[Entry], edges: Counter[tuple[int, int]]) -> list[str]:
    """The text picture: one line a layer, base first, with its size and the layers it imports from."""
    ranks = sorted({e.layer for e in rows})
    width = max(len(" ".join(test.LAYERS[r] if r < len(test.LAYERS) else test.OUTSIDE)) for r in ranks)
    lines = ["```", f"{'layer':>5}  {'packages and modules':<{width}}  {'files':>5}  {'lines':>6}  imports from layers"]
    for i, rank in enumerate(ranks):
        names = " ".join(test.LAYERS[rank] if rank < len(test.LAYERS) else test.OUTSIDE)
        own = [e for e in rows if e.layer == rank and not e.nested]
        uses = " ".join(str(b) for a, b in sorted(edges) if a == rank) or "-"
        lines.append(f"{rank:>5}  {names:<{width}}  {sum(e.modules for e in own):>5}  "
                     f"{rounded(sum(e.lines for e in own)):>6}  {uses}")
        if i + 1 < len(ranks):
            lines.append(f"{'│':>5}")
    return [*lines, "```"]


def mermaid(test: ModuleType, edges: Counter[tuple[int, int]]) -> list[str]:
    """The layers as a mermaid graph: an arrow from A to B where B imports A and reaches A no other way."""
    ranks = sorted({r for edge in edges for r in edge})
    lines = ["```mermaid", "flowchart TB"]
    lines += [f'  L{r}["{r} · {layer_title(test, r)}"]' for r in ranks]
    lines += [f"  L{b} --> L{a}" for a, b in sorted(reduce(set(edges)), key=lambda e: (e[1], e[0]))]
    return [*lines, "```"]


def layer_section(test: ModuleType, rank: int, rows: list[Entry], edges: Counter[tuple[int, int]]) -> list[str]:
    """One layer: what imports what, then a table of its packages and modules."""
    uses = ", ".join(f"{b} ({n})" for (a, b), n in sorted(edges.items()) if a == rank)
    used = ", ".join(f"{a} ({n})" for (a, b), n in sorted(edges.items()) if b == rank)
    lines = [f"### {rank} · {layer_title(test, rank)}", "",
             f"Imports from {f'layers {uses}' if uses else 'no other layer'}; imported by "
             f"{f'layers {used}' if used else 'no other layer'} (in brackets: how many module-to-module imports).", "",
             "| package or module | files | lines | what it is (its docstring's first sentence) |",
             "|---|---:|---:|---|"]
    for e in (e for e in rows if e.layer == rank):
        name = f"↳ `{e.name}`" if e.nested else f"`{e.name}`"
        lines.append(f"| {name} | {e.modules} | {rounded(e.lines)} | {e.summary} |")
    return [*lines, ""]


def hand_written(path: Path) -> str:
    """The committed document's hand-written section, markers included (a placeholder before there is one)."""
    text = path.read_text() if path.is_file() else ""
    if BEGIN in text and END in text:
        return BEGIN + text.split(BEGIN, 1)[1].split(END, 1)[0] + END
    return f"{BEGIN}\n\n{PLACEHOLDER}\n\n{END}"


def render(test: ModuleType, prose: str) -> str:
    rows, edges = entries(test), layer_edges(test)
    core = [e for e in rows if e.layer < len(test.LAYERS) and not e.nested]
    ranks = sorted({e.layer for e in rows})
    lines = ["# Architecture", "",
             "Generated by `python benchmarks/docs/architecture_doc.py` from the layers tests/test_imports.py enforces "
             "(its `LAYERS`, in data-flow order) and its own reading of every module's imports; only the "
             "hand-written section below is kept as written. tests/test_docs.py checks that this file is current. "
             f"Line counts are rounded to {SIGNIFICANT} significant figures.", "",
             prose, "", "## The layers", "",
             f"`src/meshplan`: {sum(e.modules for e in core)} files, {rounded(sum(e.lines for e in core))} lines in "
             f"{len(test.LAYERS)} layers; the packages beside it ({', '.join(test.OUTSIDE)}) are layer "
             f"{len(test.LAYERS)}. A module imports only from its own layer and those before it (no cycles), and the "
             "core never imports the packages beside it. `meshplan/__init__.py`, the public API, stands outside the "
             "layers: it may name any of them and none imports it.", "",
             *stack(test, rows, edges), "",
             "The same layers as a graph: an arrow from A to B where B imports A directly and reaches A no other way "
             "(the transitive reduction of the imports between layers).", "",
             *mermaid(test, edges), "", "## Each layer", ""]
    for rank in ranks:
        lines += layer_section(test, rank, rows, edges)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", type=Path, default=DOC, help="where to write (default docs/ARCHITECTURE.md)")
    args = ap.parse_args(argv)
    args.doc.write_text(render(import_test(), hand_written(DOC)))
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
