"""Energy of a training step and per token (issue 84 item 3), from each GPU's power at its utilisation.

A GPU draws about its power limit while its kernels run: the GEMMs that fill a training step hold Hopper and Blackwell
parts at their limit (efficiency.py prices the clock a limit allows, f = (P_cap / P_rated)^(1/3), with the MAMF
measured at the rated power), and its idle draw while it waits on a collective, a pipeline neighbour or the host.
Between the two, power is linear in the share of time busy (the form of Fan, Weber and Barroso 2007, "Power
provisioning for a warehouse-sized computer", ISCA, §3: P = P_idle + (P_busy − P_idle)·u, which node measurements of
H100 training follow: Newkirk et al. 2025, arXiv 2506.14551, power tracks the step's computational intensity, at
most 76 % of an HGX H100 node's 10.2 kW rating):

    P_gpu = P_idle + (P_limit − P_idle) · u,   u = (compute + recompute + optimizer) / t_step   (the busiest rank's)
    E_step = N · P_gpu · t_step,   E_token = E_step / (global batch · sequence)

P_limit is the accelerator's tdp_watts (its datasheet TDP, or a --power-cap share: specs/power.py), P_idle its measured
idle draw (Accelerator.idle_watts, else specs/power.IDLE_SHARE of the limit). Every rank is priced as the busiest one
(a lighter pipeline rank waits longer at idle): an upper bound, like taking the limit as the busy draw (an HGX H100
node training near full utilisation drew 8.4 of its rated 10.2 kW: Latif et al. 2024, arXiv 2412.08602). The GPUs'
energy only: hosts, NICs, switches and cooling (a datacenter's PUE) come beside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshplan.specs.power import idle_watts

if TYPE_CHECKING:  # the serving report prints energy without importing the training step's assembly
    from meshplan.estimate import Estimate

BUSY = ("compute", "recompute", "optimizer")  # the breakdown's parts that run the GPU's kernels


@dataclass(frozen=True)
class Energy:
    """Per GPU its power busy, idle and on average over the step; the step's and a token's energy, whole job."""

    busy_watts: float
    idle_watts: float
    busy_share: float
    gpu_watts: float
    step_joules: float
    token_joules: float

    def as_dict(self) -> dict[str, float]:
        return {"busy_watts": self.busy_watts, "idle_watts": self.idle_watts, "busy_share": self.busy_share,
                "gpu_watts": self.gpu_watts, "step_joules": self.step_joules, "token_joules": self.token_joules}

    def text(self) -> str:
        return (f"{self.step_joules / 1e3:,.1f} kJ a step, {self.token_joules:.3g} J a token (each GPU "
                f"{self.gpu_watts:,.0f} W: its limit {self.busy_watts:,.0f} W busy {self.busy_share:.0%} of the step, "
                f"{self.idle_watts:,.0f} W idle; GPUs only)")


def step_energy(est: Estimate) -> Energy | None:
    """The energy of ``est``'s step (module docstring), None where its GPU states no power limit."""
    acc = est.cluster.accelerator
    limit = float(acc.tdp_watts or acc.matmul_watts)
    if not limit:
        return None
    idle = min(idle_watts(acc), limit)
    share = min(1.0, sum(est.breakdown.get(k, 0.0) for k in BUSY) / est.step_time) if est.step_time else 0.0
    watts = idle + (limit - idle) * share
    joules = watts * est.cluster.num_gpus * est.step_time
    return Energy(limit, idle, share, watts, joules, joules / est.tokens_per_step)
