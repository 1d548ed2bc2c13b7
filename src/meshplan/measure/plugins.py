"""The research package's parts check-step uses, found through the ``meshplan.research`` entry point group: the
model zoo (``zoo``: name -> a model whose ``build()`` returns the module and its inputs) and the learned residual
(``learned``: ``apply_learned(result, profiles)``, the replay prediction corrected). They live in
meshplan_research, beside meshplan in its source tree (pyproject.toml registers them), which the core never
imports (tests/test_imports.py): without it, check-step runs MODULE:FACTORY models and says in one line how to get
the zoo and ``--learned``.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from meshplan.errors import MeshplanError, MissingDependency

GROUP = "meshplan.research"
INSTALL = ("pip install -e '.[learn]' in a meshplan source checkout, which installs meshplan_research beside "
           "meshplan and registers it")


class MissingResearch(MissingDependency):
    """The research package (or its registration, after an install that predates it) is missing."""

    def __init__(self, what: str) -> None:
        MeshplanError.__init__(self, f"{what} lives in the research package meshplan_research, which is not "
                                     f"installed: run  {INSTALL}")


def research(name: str) -> Any | None:
    """The object the research package registers as ``name`` in GROUP, or None when none is installed."""
    for entry in entry_points(group=GROUP):
        if entry.name == name:
            return entry.load()
    return None


def zoo_models() -> dict[str, Any]:
    """The model zoo by name; empty without the research package."""
    return research("zoo") or {}


def learned_residual() -> Any:
    """check-step ``--learned``: the research package's ``apply_learned(result, profiles)``
    (meshplan_research.learned), or MissingResearch."""
    apply = research("learned")
    if apply is None:
        raise MissingResearch("check-step --learned (the learned residual predictor)")
    return apply
