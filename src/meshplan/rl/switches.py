"""The switches colocation needs, and their transfer times over each GPU's host link (Cluster.host_bandwidth, the
PCIe link that ZeRO-Offload's copies use too):

- the trainer's offload (RLPlan.offload): before the rollout its optimizer state and gradients (``optimizer``), and
  its weights (``all``), go to host memory, and come back before the passes that need them: each byte out and back
  once per iteration (verl's ``offload_fsdp_optimizer`` / ``load_fsdp_optimizer`` and ``offload_megatron_*`` around
  ``generate_sequences``; OpenRLHF's DeepSpeed sleep; NeMo-RL's optimizer offload before refit);
- the engine's sleep and wake (RLPlan.sleep_level, vLLM's sleep mode): level 1 copies its weights to host memory when
  it sleeps and back when it wakes (``CuMemAllocator``'s offloaded tags); level 2 drops them (the weight transfer
  rewrites them after the wake), so only the KV cache's memory is mapped again; both free the KV cache, whose pages
  hold nothing worth keeping across an update.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.rl.plan import OFFLOADS, RLPlan
from meshplan.specs.hardware import Cluster


@dataclass(frozen=True)
class Switches:
    """Bytes per GPU moved each way and the seconds of each switch per iteration."""

    offloaded: float  # trainer bytes held on the host during the rollout
    offload: float  # seconds: the trainer's state to the host
    reload: float  # and back
    sleep: float  # the engine's weights to the host (level 1)
    wake: float  # and back


def switches(plan: RLPlan, pool: Cluster, trainer_memory: dict[str, float], engine_weights: float) -> Switches:
    """The switches of ``plan`` (module docstring); none outside the colocated set-up."""
    if not plan.way.shared:
        return Switches(0.0, 0.0, 0.0, 0.0, 0.0)
    moved = sum(trainer_memory.get(part, 0.0) for part in OFFLOADS[plan.offload])
    link = pool.host_bandwidth
    engine = engine_weights / link if plan.sleep_level == 1 else 0.0
    return Switches(offloaded=moved, offload=moved / link, reload=moved / link, sleep=engine, wake=engine)


def resident(plan: RLPlan, trainer_memory: dict[str, float]) -> dict[str, float]:
    """The trainer's bytes per GPU that stay in HBM while the engine generates (colocated): weights, gradients and
    optimizer state less what is offloaded; activations are freed after each pass."""
    held = ("weights", "grads", "optimizer")
    return {k: trainer_memory.get(k, 0.0) for k in held if k not in OFFLOADS[plan.offload]}
