"""Every ``tests/...`` path that a docstring or comment of the sources or the benchmark scripts names is a file of
this repository (issue 82: two docstrings cited tests that did not exist). A path into another project's tree (vLLM's
``tests/v1/...``, cited as that project's) is named with its project on the same line and is left out."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITED = re.compile(r"(?<![\w/])tests/[A-Za-z0-9_/]+\.py")
OTHERS = ("tests/v1/",)  # vLLM's tree (serve/launch_script.py cites vLLM's own proxy script)


def citations() -> list[tuple[str, int, str]]:
    out = []
    for path in sorted([*(ROOT / "src").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            out += [(str(path.relative_to(ROOT)), n, m) for m in CITED.findall(line) if not m.startswith(OTHERS)]
    return out


def test_every_cited_test_exists():
    found = citations()
    assert len(found) > 50  # the pattern finds the sources' citations
    dead = [f"{where}:{n} cites {path}" for where, n, path in found if not (ROOT / path).is_file()]
    assert not dead, "\n".join(dead)


def test_a_dead_citation_is_found(tmp_path):
    assert CITED.findall("checked by tests/test_nothing_here.py and tests/golden/generate.py") == [
        "tests/test_nothing_here.py", "tests/golden/generate.py"]
    assert not (ROOT / "tests/test_nothing_here.py").exists()
