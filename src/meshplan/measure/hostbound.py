"""The host-bound regime of a check-step prediction: how much of the predicted step is the host's fixed cost per
launched kernel, and what pricing every op by its work alone (work / rate, no fixed cost: issue 46) predicts.

Where the host term enters check-step, once: replay.py times each op signature called from Python one call at a
time, so each replayed time already holds one dispatch (the Python binding, the dispatcher, the kernel's launch)
besides the op's work; host.py adds only what replay cannot see (autograd recording each forward op, the engine
running each backward node, nn.Module.__call__). On a CPU the step is their sum (predict.py: one thread of
execution); on a GPU it is max(kernels, host + dispatch × launches). This split takes ``host_dispatch`` (a stack's
field: calibrate's measured t₀ per eager call, calibrate/dispatch.py, or host.py's ``dispatch``, the same call
through ``torch.ops``) out of each replayed op and charges it per launch, so that nothing is counted twice:

    work     = Σ_ops max(kernel − host_dispatch · launches, 0)     what work / rate alone prices
    dispatch = host_dispatch · Σ_ops launches                      the host's fixed cost per kernel
    host     = autograd + engine + module calls (+ extra glue: GPU) host.py; glue.py (predict.py: not on a CPU)
    with     = work + dispatch + host           (CPU)              max(work, dispatch + host) (GPU)
    without  = work

A small model of many small ops (tests/test_host_dispatch.py: tiny Linear + LayerNorm layers at batch 1) is
host-bound: ``with`` is within the check-step tolerance of the measured step and ``without`` a fraction of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshplan.measure.predict import StepPrediction


@dataclass(frozen=True, kw_only=True)
class HostBound:
    """A predicted step split into its work, its per-kernel dispatch and the host's other work (seconds)."""

    host_dispatch: float  # seconds per launched kernel
    launches: int
    work: float
    dispatch: float
    host: float
    serial: bool

    @property
    def with_host(self) -> float:
        """The step with the host's costs: their sum on a CPU, the longer of the two timelines on a GPU."""
        if self.serial:
            return self.work + self.dispatch + self.host
        return max(self.work, self.dispatch + self.host)

    @property
    def without_host(self) -> float:
        """The step priced by work alone."""
        return self.work

    @property
    def host_share(self) -> float:
        """The share of ``with_host`` that is the host's (dispatch and its other work): above 1/2 is host-bound."""
        total = self.with_host
        return (self.dispatch + self.host) / total if total > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"host_dispatch_s": self.host_dispatch, "launches": self.launches, "work_s": self.work,
                "dispatch_s": self.dispatch, "host_s": self.host, "with_host_s": self.with_host,
                "without_host_s": self.without_host, "host_share": self.host_share}


def host_bound(prediction: StepPrediction, host_dispatch: float | None = None) -> HostBound:
    """The split of the module docstring; ``host_dispatch`` None: the prediction's own (host.py's ``dispatch``)."""
    d = prediction.host.dispatch if host_dispatch is None else host_dispatch
    launches = sum(p.launches for p in prediction.ops)
    serial = prediction.serial  # on a GPU the ops that launch nothing (views) are the host's, as predict.py has them
    work = sum(max(p.kernel - d * p.launches, 0.0) for p in prediction.ops if serial or p.launches)
    views = 0.0 if serial else sum(p.kernel for p in prediction.ops if not p.launches)
    return HostBound(host_dispatch=d, launches=launches, work=work, dispatch=d * launches,
                     host=prediction.host_seconds + (0.0 if serial else prediction.extra_glue + views),
                     serial=serial)
