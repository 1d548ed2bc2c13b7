"""Every ``tests/...`` path that a docstring or comment of the sources or the benchmark scripts names is a file of
this repository (issue 82: two docstrings cited tests that did not exist). A path into another project's tree (vLLM's
``tests/v1/...``, cited as that project's) is named with its project on the same line and is left out. Likewise every
``benchmarks/...`` path that the sources, tests, scripts, CI, README, pyproject and hand-written or generated documents
name (issue 82 split benchmarks/ into measure/ and docs/: a path left at the old place is found here); the session
logs and notes of data/measured/ and docs/HISTORY.md keep the paths of their day."""

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


SCRIPT = re.compile(r"(?<![\w/])benchmarks/[A-Za-z0-9_/]+\.(?:py|sh|json|jsonl|md)\b")
# other projects' benchmarks: vLLM's scripts (serve/load/ cites vllm-project/vllm's benchmarks/serve.py and
# benchmark_dataset.py), torchtitan's published Llama 3 runs (the validation records' source)
OTHER_PROJECTS = ("benchmarks/serve.py", "benchmarks/benchmark_dataset.py",
                  "benchmarks/llama3_h100_202412_torchtitan.md")


def named_scripts() -> list[tuple[str, int, str]]:
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "src").rglob("*.toml"), *(ROOT / "src").rglob("*.json"),
             *(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.sh"),
             *(p for p in (ROOT / "docs").glob("*.md") if p.name != "HISTORY.md"), *(ROOT / "data").glob("*/README.md"),
             ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run"]
    out = []
    for path in sorted(set(files) - {Path(__file__).resolve()}):  # not the planted path below
        for n, line in enumerate(path.read_text().splitlines(), 1):
            out += [(str(path.relative_to(ROOT)), n, m) for m in SCRIPT.findall(line) if m not in OTHER_PROJECTS]
    return out


def test_every_named_benchmark_path_exists():
    found = named_scripts()
    assert len(found) > 300  # the pattern finds the scripts named across the tree
    dead = [f"{where}:{n} names {path}" for where, n, path in found if not (ROOT / path).is_file()]
    assert not dead, "\n".join(dead)


def test_a_moved_script_is_found():
    assert SCRIPT.findall("run benchmarks/speed_guard.py, then benchmarks/measure/speed_guard.py") == [
        "benchmarks/speed_guard.py", "benchmarks/measure/speed_guard.py"]
    assert not (ROOT / "benchmarks/speed_guard.py").exists()
