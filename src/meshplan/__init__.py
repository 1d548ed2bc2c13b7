"""meshplan: how fast will this model train on this hardware, will it fit, and which parallel plan is best.

The public names are imported when first used (PEP 562's module ``__getattr__``), so that ``import meshplan.cli`` or
``import meshplan.errors`` does not load the specs, the checks and NumPy before a command needs them (start-up is part
of every answer: tests/test_startup.py counts the modules each command imports). The two entry points named after
their own modules are imported from them: ``from meshplan.estimate import estimate`` and ``from meshplan.search import
search`` (a package attribute named ``estimate`` or ``search`` is the submodule once it is imported).
"""

from __future__ import annotations

import sys as _sys
from importlib import import_module
from typing import TYPE_CHECKING, Any

if _sys.argv and _sys.argv[0].endswith("/meshplan"):  # the console script: a Ctrl-C while it imports is one line
    _sys.excepthook = lambda kind, value, tb: (_sys.stderr.write("meshplan: aborted\n"), _sys.exit(130)) \
        if issubclass(kind, KeyboardInterrupt) else _sys.__excepthook__(kind, value, tb)
import meshplan.interrupt  # noqa: E402,F401  (then the full handling: meshplan/interrupt.py)

if TYPE_CHECKING:  # what type checkers and editors see; at run time __getattr__ imports each on first use
    from meshplan.errors import MeshplanError, PlanError, SpecError
    from meshplan.serve.estimate import serve_estimate
    from meshplan.serve.plan import ServePlan, Workload
    from meshplan.specs.check import check
    from meshplan.specs.hardware import Accelerator, Cluster, System, Tier, load_system
    from meshplan.specs.hf.config import from_hf_config
    from meshplan.specs.model import ModelSpec
    from meshplan.specs.model_load import load_model
    from meshplan.specs.plan import Plan
    from meshplan.specs.stack import Stack, load_stack

# public name: the module it lives in
_WHERE = {
    "Accelerator": "meshplan.specs.hardware",
    "Cluster": "meshplan.specs.hardware",
    "MeshplanError": "meshplan.errors",
    "ModelSpec": "meshplan.specs.model",
    "Plan": "meshplan.specs.plan",
    "PlanError": "meshplan.errors",
    "ServePlan": "meshplan.serve.plan",
    "SpecError": "meshplan.errors",
    "Stack": "meshplan.specs.stack",
    "System": "meshplan.specs.hardware",
    "Tier": "meshplan.specs.hardware",
    "check": "meshplan.specs.check",
    "from_hf_config": "meshplan.specs.hf.config",
    "Workload": "meshplan.serve.plan",
    "load_model": "meshplan.specs.model_load",
    "load_stack": "meshplan.specs.stack",
    "load_system": "meshplan.specs.hardware",
    "serve_estimate": "meshplan.serve.estimate",
}
__all__ = [
    "Accelerator",
    "Cluster",
    "MeshplanError",
    "ModelSpec",
    "Plan",
    "PlanError",
    "ServePlan",
    "SpecError",
    "Stack",
    "System",
    "Tier",
    "check",
    "from_hf_config",
    "Workload",
    "load_model",
    "load_stack",
    "load_system",
    "serve_estimate",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (and kept here); any other name is no attribute, so
    that ``from meshplan import ranges`` imports the submodule as usual."""
    if name not in _WHERE:
        raise AttributeError(f"module 'meshplan' has no attribute {name!r}")
    value = getattr(import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
