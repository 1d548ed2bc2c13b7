"""The suite's own scheduling (tests/conftest.py): the units measured longest start first on pytest-xdist's workers."""

from __future__ import annotations

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
