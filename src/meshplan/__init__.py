"""meshplan: how fast will this model train on this hardware, will it fit, and which parallel plan is best."""

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
