"""The exception tree. Exceptions are for bad input only; an infeasible plan is a result, not an error.

    MeshplanError
    ├── SpecError        a model, accelerator, cluster or preset is malformed or unknown
    ├── PlanError        a parallel plan violates a constraint (the message lists every violation)
    └── MissingDependency an optional extra (torch, matplotlib, ray) is not installed; says how to install it

The CLI prints ``str(error)`` as one line and exits with status 2.
"""

from __future__ import annotations


class MeshplanError(Exception):
    """Base class of every error meshplan raises on purpose."""


class SpecError(MeshplanError):
    """A model / hardware / preset specification is invalid: the message names the field and the value."""


class PlanError(MeshplanError):
    """A plan is invalid for the model and cluster: the message lists each violated constraint."""

    def __init__(self, reasons: list[str] | tuple[str, ...]):
        self.reasons = tuple(reasons)
        super().__init__("; ".join(self.reasons))


class MissingDependency(MeshplanError):
    """An optional dependency is missing."""

    def __init__(self, package: str, extra: str):
        super().__init__(f"{package} is not installed: run  pip install 'meshplan[{extra}]'")
