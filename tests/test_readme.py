"""The README stays a true front door: its accuracy table reads the generated summaries, its commands parse, its
Python example runs, its tour names every package, its test command is the one CI runs (where a skip not marked
``gpu`` fails), and what the tests import optionally is in the `dev` extra that command installs. docs/USAGE.md's
commands and Python example are held to the same."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from meshplan.cli.main import cli

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_LINES = 150  # a newcomer reads it in five minutes; the rest lives in docs/


def text(path: Path = README) -> str:
    return path.read_text(encoding="utf-8")


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text(path), re.S)


def pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def test_accuracy_figures_are_the_generated_summaries():
    """The in-sample figure of the published runs with complete configurations, from docs/accuracy_summary.json
    (benchmarks/docs/accuracy.py): regenerating it without updating the README fails."""
    complete = json.loads((DOCS / "accuracy_summary.json").read_text())["complete"]
    said = (f"{complete['evaluated']} runs, {100 * complete['median_abs_error']:.1f} / "
            f"{100 * complete['p90_abs_error']:.1f} % in sample")
    assert said in " ".join(text().split()), said


def test_out_of_source_table_is_the_generated_one():
    """The README's out-of-source rows, rebuilt from docs/out_of_source.json (benchmarks/docs/out_of_source_doc.py)."""
    import sys  # noqa: PLC0415

    sys.path.insert(0, str(ROOT / "benchmarks" / "docs"))
    import out_of_source_doc  # noqa: PLC0415

    for row in out_of_source_doc.readme_rows():
        assert row in text(), row


def test_the_readme_test_command_is_what_ci_runs():
    """The quick start's second command, run by .ci/run with skips turned into failures (tests/conftest.py)."""
    quick = blocks(README, "bash")[0].strip().splitlines()
    assert len(quick) == 2, quick
    assert "[dev]" in text(ROOT / ".ci" / "install-extras.sh") and "bash .ci/install-extras.sh" in quick[1]
    ci = text(ROOT / ".ci" / "run").splitlines()
    (line,) = [n for n, row in enumerate(ci) if row.startswith(quick[1])]
    assert ci[line] in (quick[1], quick[1] + " || exit 1")  # set -e ignores a failure inside an && list
    assert "export MESHPLAN_NO_SKIPS=1" in ci[:line]


def test_under_no_skips_only_a_gpu_test_may_skip(tmp_path):
    """tests/conftest.py with MESHPLAN_NO_SKIPS=1: a skip in a test, by a marker or at import fails; a test marked
    ``gpu`` still skips; an expected failure stays one."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a GPU\n")
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n"
        "def test_skip():\n    pytest.skip('no reason')\n\n"
        "@pytest.mark.skipif(True, reason='marker')\ndef test_marker():\n    pass\n\n"
        "@pytest.mark.gpu\ndef test_gpu():\n    pytest.skip('needs a GPU')\n\n"
        "@pytest.mark.xfail(reason='known')\ndef test_xfail():\n    assert False\n")
    (tmp_path / "test_import.py").write_text("import pytest\n\npytest.importorskip('no_such_module')\n")

    def run(*args: str, **env: str) -> str:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
                              cwd=tmp_path, capture_output=True, text=True, env={**os.environ, **env}).stdout

    assert run("test_skips.py", MESHPLAN_NO_SKIPS="0").splitlines()[-1].startswith("3 skipped, 1 xfailed in ")
    assert run("test_skips.py", MESHPLAN_NO_SKIPS="1").splitlines()[-1].startswith(
        "1 failed, 1 skipped, 1 xfailed, 1 error in ")  # the skipif fails in setup: an error
    assert run("test_import.py", MESHPLAN_NO_SKIPS="1").splitlines()[-1].startswith("1 error in ")
    # the suite runs over worker processes (pyproject.toml's addopts, pytest-xdist): the rule holds in them too
    assert run("test_skips.py", "-n", "2", MESHPLAN_NO_SKIPS="1").splitlines()[-1].startswith(
        "1 failed, 1 skipped, 1 xfailed, 1 error in ")


def test_dev_extra_holds_what_the_tests_import_optionally():
    """Every module a test skips without (pytest.importorskip) comes with `pip install '.[dev]'`."""
    extras = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]

    def requirements(extra: str) -> set[str]:  # distribution names, meshplan[a,b] expanded
        out = set()
        for spec in extras[extra]:
            name = re.match(r"[\w.-]+", spec).group(0).lower()
            inner = re.match(r"meshplan\[(.*?)\]", spec)
            out |= set().union(*(requirements(e.strip()) for e in inner.group(1).split(","))) if inner else {name}
        return out

    distribution = {"vl_convert": "vl-convert-python", "sklearn": "scikit-learn"}  # modules named otherwise
    imported = {distribution.get(m.split(".")[0], m.split(".")[0]) for f in (ROOT / "tests").glob("*.py")
                for m in re.findall(r"importorskip\(\s*\"([\w.]+)\"", text(f))}
    assert imported and imported <= requirements("dev"), imported - requirements("dev")


def commands(path: Path) -> list[list[str]]:
    """``meshplan ...`` lines of the bash blocks, comments and [optional] brackets dropped."""
    out = []
    for block in blocks(path, "bash"):
        for line in block.splitlines():
            line = line.split(" #")[0].replace("[", "").replace("]", "").strip()
            words = shlex.split(line)
            if words and words[0].endswith("meshplan"):
                out.append(words[1:])
    return out


@pytest.mark.parametrize("path", [README, DOCS / "USAGE.md"], ids=["README", "USAGE"])
def test_every_command_shown_parses(path, monkeypatch):
    """Each example's command exists and takes those options (parsed by the CLI, not run)."""
    monkeypatch.chdir(ROOT)
    shown = commands(path)
    assert len(shown) >= 5
    for args in shown:
        command = cli.commands[args[0]]
        command.make_context(args[0], args[1:])
    assert {a[0] for a in commands(README)} >= {"estimate", "plan", "report", "sweep", "validate"}


def test_every_option_named_in_prose_exists():
    """``--option`` anywhere in the README or docs/USAGE.md is an option of some command (or of a script shown)."""
    known = {o for c in cli.commands.values() for p in c.params for o in [*p.opts, *p.secondary_opts]}
    known |= {"--help", "--repeat"}  # click's own; benchmarks/measure/search_speed.py's
    for path in (README, DOCS / "USAGE.md"):
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text(path)))
        assert named <= known, (path.name, named - known)


@pytest.mark.parametrize("path", [README, DOCS / "USAGE.md"], ids=["README", "USAGE"])
def test_python_example_runs(path):
    (example,) = blocks(path, "python")
    namespace: dict = {}
    exec(compile(example, str(path), "exec"), namespace)  # the docs' own example
    assert namespace["est"].fits and namespace["best"].step_time <= namespace["est"].step_time


def test_tour_names_every_package():
    """Every subpackage and root module of src/meshplan, and the packages beside it (every other package under src/:
    meshplan_validation, meshplan_research), has its row in the tour."""
    tour = text().split("## A tour of the code")[1].split("\n## ")[0]
    src = ROOT / "src" / "meshplan"
    names = [f"`{p.name}/`" for p in src.iterdir() if (p / "__init__.py").is_file()]
    names += [f"`{p.stem}`" for p in src.glob("*.py") if p.stem != "__init__"]
    names += ["`presets/`"] + [f"`{p.parent.name}`" for p in (ROOT / "src").glob("*/__init__.py")
                               if p.parent.name != "meshplan"]
    assert "`meshplan_research`" in names
    assert not [n for n in names if n not in tour]


@pytest.mark.parametrize("path", [README, DOCS / "USAGE.md", DOCS / "HISTORY.md"], ids=lambda p: p.name)
def test_links_and_pictures_exist(path):
    for target in re.findall(r"\]\(([^)#:]+)\)", text(path)):
        assert (path.parent / target).exists(), (path.name, target)


def test_readme_is_a_front_door():
    """Short, and free of references that mean nothing to a reader (tracker numbers, internal code names)."""
    body = text()
    assert len(body.splitlines()) <= MAX_LINES
    assert not re.findall(r"\b(?:issue|item|seed)[ -]?\d+", body, re.I)
