"""Stragglers: GPUs that run slower than the rest (thermal or power throttling, a degraded part, a noisy host), as a
distribution of the per-GPU slowdown (issue 84 item 3). A synchronous step waits for its slowest GPU at every
collective and pipeline send, so the job runs at the pace of the slowest of its N GPUs: the expected maximum of N
draws. Production traces put this high: fail-slows delayed the average job of a 10,000-GPU cluster 1.34x (Wu et al.
2024, "FALCON", arXiv 2410.12588, §3); ByteDance's five-month trace of LLM jobs (Lin et al., OSDI '25, "Understanding
Stragglers in Large Model Training Using What-if Analysis") finds stragglers in a sizeable share of its jobs.

Two forms of the distribution:

- ``P%:S``: a share p of the GPUs runs S times slower, the rest at full speed. The slowest of N is slow unless none is:
  pace = 1 + (S − 1)·(1 − (1 − p)^N).
- ``lognormal:σ``: every GPU's slowdown is e^{σZ}, Z standard normal (manufacturing and thermal spread); the pace is
  E[max of N], computed from the distribution of the maximum, F^N, by integrating 1 − F(x)^N above 1 (a GPU faster
  than nominal does not speed the step past its own rate: the pace is at least 1).

The slowdown stretches a GPU's kernels (its SMs' clock), not its links: ``slowed`` divides the accelerator's peak
rates by the pace, so a plan whose step is mostly communication loses less than a compute-bound one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshplan.errors import SpecError
from meshplan.specs.hardware import Cluster

FORMS = ("share", "lognormal")


@dataclass(frozen=True, kw_only=True)
class Stragglers:
    """The per-GPU slowdown distribution (module docstring): ``form`` "share" (``share`` p of the GPUs ``slowdown``
    times slower) or "lognormal" (``sigma``)."""

    form: str
    share: float = 0.0
    slowdown: float = 1.0
    sigma: float = 0.0

    def __post_init__(self) -> None:
        if self.form not in FORMS:
            raise SpecError(f"stragglers form={self.form!r} must be one of {', '.join(FORMS)}")
        if not (0 <= self.share <= 1 and 1 <= self.slowdown <= 100 and 0 <= self.sigma <= 2):
            raise SpecError(f"stragglers share={self.share:g} (0-1), slowdown={self.slowdown:g} (1-100) and "
                            f"sigma={self.sigma:g} (0-2) out of range")

    def pace(self, gpus: int) -> float:
        """The expected slowdown of the slowest of ``gpus`` GPUs (module docstring)."""
        if self.form == "share":
            return 1.0 + (self.slowdown - 1.0) * -math.expm1(gpus * math.log1p(-self.share)) if self.share < 1 else \
                self.slowdown
        if self.sigma == 0:
            return 1.0
        # E[max(1, X_max)] = 1 + ∫_1^∞ (1 − F(x)^N) dx, F the lognormal CDF; x = e^{σz}, dx = σ e^{σz} dz
        steps, top = 4000, 9.0
        total = 0.0
        for i in range(steps):
            z = (i + 0.5) * top / steps
            cdf = 0.5 * (1 + math.erf(z / math.sqrt(2)))
            total += -math.expm1(gpus * math.log(cdf)) * self.sigma * math.exp(self.sigma * z) * top / steps
        return 1.0 + total

    def describe(self) -> str:
        if self.form == "share":
            return f"{100 * self.share:g} % of the GPUs {self.slowdown:g}x slower"
        return f"per-GPU slowdown lognormal, sigma {self.sigma:g}"


def parse_stragglers(text: str) -> Stragglers:
    """``P%:S`` (e.g. ``1%:1.3``) or ``lognormal:σ`` (e.g. ``lognormal:0.02``)."""
    head, _, tail = text.strip().partition(":")
    try:
        if head.lower() == "lognormal":
            return Stragglers(form="lognormal", sigma=float(tail))
        if head.endswith("%"):
            return Stragglers(form="share", share=float(head[:-1]) / 100, slowdown=float(tail))
    except ValueError:
        pass
    raise SpecError(f"stragglers={text!r} must be P%:S (a share P of the GPUs S times slower, e.g. 1%:1.3) or "
                    "lognormal:SIGMA (e.g. lognormal:0.02)")


def slowed(cluster: Cluster, pace: float) -> Cluster:
    """``cluster`` with its GPUs' kernels ``pace`` times slower (peak FLOP/s, HBM and measured attention rates)."""
    if pace == 1.0:
        return cluster
    acc = cluster.accelerator
    slow = replace(acc, peak_flops={k: v / pace for k, v in acc.peak_flops.items()},
                   hbm_bandwidth=acc.hbm_bandwidth / pace, attention_flops=acc.attention_flops / pace)
    return replace(cluster, accelerator=slow)
