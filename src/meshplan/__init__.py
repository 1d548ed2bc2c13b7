"""meshplan: how fast will this model train on this hardware, will it fit, and which parallel plan is best."""

import sys as _sys

if _sys.argv and _sys.argv[0].endswith("/meshplan"):  # the console script: a Ctrl-C while it imports is one line
    _sys.excepthook = lambda kind, value, tb: (_sys.stderr.write("meshplan: aborted\n"), _sys.exit(130)) \
        if issubclass(kind, KeyboardInterrupt) else _sys.__excepthook__(kind, value, tb)
import meshplan.interrupt  # noqa: E402,F401  (then the full handling: meshplan/interrupt.py)
from meshplan.errors import MeshplanError, PlanError, SpecError
from meshplan.specs.check import check
from meshplan.specs.hardware import Accelerator, Cluster, System, Tier, load_system
from meshplan.specs.hf_config import from_hf_config
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan

__all__ = [
    "Accelerator",
    "Cluster",
    "MeshplanError",
    "ModelSpec",
    "Plan",
    "PlanError",
    "SpecError",
    "System",
    "Tier",
    "check",
    "from_hf_config",
    "load_model",
    "load_system",
]
__version__ = "0.1.0"
