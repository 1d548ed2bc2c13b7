"""The research package (src/meshplan_research: the model zoo, the learned residual, MLP-Mixer) joins check-step
through the ``meshplan.research`` entry points (meshplan.measure.plugins), never by an import from the core
(tests/test_imports.py); without it, a zoo name or ``--learned`` is one line and exit 2 that says how to get it."""

from __future__ import annotations

import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from meshplan.cli import main
from meshplan.measure import plugins

ROOT = Path(__file__).resolve().parents[1]
DECLARED = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][plugins.GROUP]


def test_pyproject_declares_the_zoo_and_the_learner():
    assert DECLARED == {"zoo": "meshplan_research.zoo:ZOO", "learned": "meshplan_research.learned:apply_learned"}


@pytest.mark.parametrize("name", sorted(DECLARED))
def test_each_declared_entry_point_loads(name):
    """What pyproject.toml names exists in the research package (loaded as the installed entry point would be)."""
    loaded = EntryPoint(name=name, value=DECLARED[name], group=plugins.GROUP).load()
    assert loaded is not None and (name != "zoo" or {"gpt2", "mlp-mixer"} <= set(loaded))


def test_the_installed_meshplan_registers_them():
    """The environment's install carries the entry points: an install older than the research package lacks them
    (then ``pip install -e .`` again registers them)."""
    from meshplan_research.learned import apply_learned
    from meshplan_research.zoo import ZOO

    assert plugins.research("zoo") is ZOO, "meshplan.research entry points missing: run  pip install -e ."
    assert plugins.learned_residual() is apply_learned and plugins.zoo_models() is ZOO


@pytest.fixture
def without_research(monkeypatch):
    """An install of meshplan without the research package: its entry point group is empty."""
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])


def test_without_it_the_zoo_is_empty_and_the_learner_refused(without_research):
    assert plugins.zoo_models() == {} and plugins.research("learned") is None
    with pytest.raises(plugins.MissingResearch, match=r"--learned .* meshplan_research, which is not installed"):
        plugins.learned_residual()


@pytest.mark.parametrize("args, what", [
    (["check-step", "tests/data/measure_model.py:make", "--learned"], "check-step --learned"),
    (["check-step", "gpt2", "--rounds", "2"], "model='gpt2' is not MODULE:FACTORY; the model zoo"),
])
def test_without_it_check_step_says_how_to_get_it_in_one_line(without_research, capsys, args, what):
    pytest.importorskip("torch")
    assert main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and what in err and "pip install -e '.[learn]'" in err
