"""meshplan's public names (issue 82 item 5: ``__all__`` complete): every name in ``meshplan.__all__`` resolves to the
object its module defines, the API's four entry points are reachable (a model and a system by name, a training step
estimated, a serving step estimated), and every ``from meshplan import ...`` the documents show is in ``__all__``."""

from __future__ import annotations

import re
from importlib import import_module
from pathlib import Path

import meshplan

ROOT = Path(__file__).resolve().parents[1]


def test_every_public_name_resolves_to_its_modules_own():
    for name in meshplan.__all__:
        value = getattr(meshplan, name)
        assert value is getattr(import_module(meshplan._WHERE[name]), name), name
    assert set(meshplan.__all__) == set(meshplan._WHERE)


def test_the_entry_points_are_public():
    assert {"load_model", "load_system", "load_stack", "Plan", "Stack", "serve_estimate", "ServePlan",
            "Workload"} <= set(meshplan.__all__)
    from meshplan.estimate import estimate  # named after its module: imported from it (meshplan/__init__.py)
    from meshplan.search import search

    assert callable(estimate) and callable(search)


def test_what_the_documents_import_is_public():
    shown = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for names in re.findall(r"from meshplan import ([A-Za-z_, ]+)", path.read_text()):
            shown |= {n.strip() for n in names.split(",") if n.strip()}
    assert shown and shown <= set(meshplan.__all__), shown - set(meshplan.__all__)
