"""The suite's own machinery (tests/conftest.py): the units measured longest start first on pytest-xdist's workers, and
a test's subprocesses run this checkout's code."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import conftest
from conftest import SHARED_WORKER, UNIT_SECONDS, longest_first


def test_the_measured_units_start_first_longest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """b (30 s), then the group of g1 and g2 (4 + 11 = 15 s: a group weighs what its files do), then a (5 s); the units
    never measured (x, y) after them, in the order xdist gave them."""
    monkeypatch.setattr(conftest, "UNIT_SECONDS", {"a.py": 5.0, "b.py": 30.0, "g1.py": 4.0, "g2.py": 11.0})
    units = ["tests/x.py", "tests/a.py", "g1.py + g2.py", "tests/b.py", "tests/y.py"]
    assert longest_first(units) == ["tests/b.py", "g1.py + g2.py", "tests/a.py", "tests/x.py", "tests/y.py"]


def test_every_measured_unit_is_a_test_file() -> None:
    """A file renamed or removed leaves no figure behind (it would order nothing)."""
    here = {path.name for path in Path(__file__).parent.glob("test_*.py")}
    assert set(UNIT_SECONDS) <= here, sorted(set(UNIT_SECONDS) - here)
    assert {name for group in SHARED_WORKER for name in group} <= here


def test_the_xdist_internals_the_scheduler_overrides_are_still_there() -> None:
    """conftest's SharedFiles overrides two private methods of pytest-xdist's LoadScopeScheduling (3.8) and rebuilds
    its private ``workqueue`` (an OrderedDict of unit -> nodes) before the first unit is handed out: an xdist that
    renamed them would silently stop grouping files or ordering the units longest first. This fails loudly instead."""
    from xdist.scheduler import LoadFileScheduling  # noqa: PLC0415
    from xdist.scheduler.loadscope import LoadScopeScheduling  # noqa: PLC0415

    assert issubclass(LoadFileScheduling, LoadScopeScheduling)
    assert list(inspect.signature(LoadFileScheduling._split_scope).parameters) == ["self", "nodeid"]
    assert list(inspect.signature(LoadFileScheduling._assign_work_unit).parameters) == ["self", "node"]
    assert "OrderedDict()" in next(line for line in inspect.getsource(LoadScopeScheduling.__init__).splitlines()
                                   if "self.workqueue" in line)
    assert "self.workqueue" in inspect.getsource(LoadScopeScheduling._assign_work_unit)
    source = inspect.getsource(LoadScopeScheduling)  # both still called by the class itself
    assert "self._split_scope(nodeid)" in source and "self._assign_work_unit(node)" in source


def test_a_subprocess_imports_this_checkouts_meshplan() -> None:
    """conftest's pytest_configure puts this checkout's src first on PYTHONPATH, so ``python -m meshplan.cli`` started
    by a test runs this checkout's code even where the interpreter's editable install points at another checkout."""
    out = subprocess.run([sys.executable, "-c", "import meshplan; print(meshplan.__file__)"], capture_output=True,
                         text=True, check=True, cwd="/").stdout.strip()
    assert Path(out).resolve().is_relative_to(Path(__file__).resolve().parents[1] / "src"), out
