"""A power cap (issue 84 item 3): watts each GPU may draw, or a node's or a rack's budget shared by its GPUs. A GPU
capped below the power its peak is rated at holds its tensor clock lower: efficiency.Efficiency.clock prices that,
f = (P_cap / P_rated)^(1/3) (dynamic power ∝ f·V², V ∝ f; checked there against the H100 NVL's 835 of the SXM's 989
TFLOP/s at 400 of 700 W), so a cap is the accelerator's power limit (Accelerator.tdp_watts) lowered to the GPU's share.

``--power-cap 500W`` caps each GPU; ``5.6kW/8`` shares 5.6 kW among 8 GPUs (a DGX H100 node's GPUs: 8 x 700 W = 5.6 kW
at their limit), ``40kW/32`` a rack's budget among its 32 GPUs. The budget is the GPUs' (the hosts, NICs and fans draw
beside it: an 8-GPU H100 HGX node is rated 10.2 kW and drew at most 8.4 kW training, Latif et al. 2024, "Empirical
Measurements of AI Training Power Demand on a GPU-Accelerated Node", arXiv 2412.08602).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from meshplan.errors import SpecError
from meshplan.specs.hardware import Cluster

# compiled by re on first use (its own cache): a plan with no power cap compiles none (start-up, issue 83)
_CAP = r"^\s*([0-9.]+)\s*(k?)w?\s*(?:/\s*(\d+))?\s*$"


@dataclass(frozen=True)
class PowerCap:
    """``watts`` shared by ``gpus`` GPUs."""

    watts: float
    gpus: int = 1

    @property
    def per_gpu(self) -> float:
        return self.watts / self.gpus

    def describe(self) -> str:
        each = f"{self.per_gpu:,.0f} W per GPU"
        return each if self.gpus == 1 else f"{self.watts / 1000:g} kW shared by {self.gpus} GPUs: {each}"


def parse_power_cap(text: str) -> PowerCap:
    """``500W``, ``5.6kW/8`` (module docstring)."""
    match = re.match(_CAP, text, re.IGNORECASE)
    if not match:
        raise SpecError(f"power-cap={text!r} must be watts per GPU (500W) or a budget shared by N GPUs (5.6kW/8)")
    watts = float(match.group(1)) * (1000 if match.group(2) else 1)
    gpus = int(match.group(3) or 1)
    if gpus < 1 or not 10 <= watts / gpus <= 10_000:
        raise SpecError(f"power-cap={text!r}: {watts / max(gpus, 1):,.0f} W per GPU must be from 10 to 10,000 W")
    return PowerCap(watts, gpus)


def capped(cluster: Cluster, cap: PowerCap) -> Cluster:
    """``cluster`` with each GPU's power limit at most the cap's share; refused below its idle draw."""
    acc = cluster.accelerator
    limit = acc.tdp_watts or acc.matmul_watts
    if not limit:
        raise SpecError(f"power-cap: {acc.name} states no power limit (tdp_watts) to cap")
    idle = idle_watts(acc)
    if cap.per_gpu <= idle:
        raise SpecError(f"power-cap: {cap.per_gpu:,.0f} W per GPU is not above {acc.name}'s idle draw of "
                        f"{idle:,.0f} W")
    if cap.per_gpu >= limit:
        return cluster
    return replace(cluster, accelerator=replace(acc, tdp_watts=cap.per_gpu))


# An idle GPU's draw over its TDP where no idle reading is stated: an idle H100 SXM (0 % utilisation, P0) reads 69 W of
# 700 W in nvidia-smi (huggingface/diffusers tests/quantization/torchao/README.md); the A100 SXM 80 GB's 62 W of 400 W
# (Accelerator.idle_watts in the presets) would make it 15 %: the lower is taken, an energy floor
IDLE_SHARE = 69 / 700


def idle_watts(acc: object) -> float:
    """A GPU's draw while it waits (no kernel running): its preset's measured idle_watts, else IDLE_SHARE of its
    power limit."""
    stated = float(getattr(acc, "idle_watts", 0.0) or 0.0)
    limit = float(getattr(acc, "tdp_watts", 0.0) or getattr(acc, "matmul_watts", 0.0) or 0.0)
    return stated if stated else IDLE_SHARE * limit
