"""Memory per GPU in each phase of an RL iteration, by part, for each pool.

The engine (serve/memory.py) takes its share of the GPU when it wakes: its weights, its activations' profiled peak,
its workspace and the whole KV-cache pool (vLLM allocates the pool at start-up and after each wake, whatever the
batch uses). Asleep (colocated, while the trainer works) it keeps only its workspace (CUDA graphs, the context): its
weights went to the host (sleep level 1) or were dropped (level 2), its KV cache was freed.

The trainer (memory.py through estimate's breakdown: weights, gradients, optimizer state, activations, buffers) holds
its full footprint in the update; in the forward-only passes its weights, whatever of its gradients and optimizer
state is in HBM, and the pass's working set (trainer.py: the fp32 logits of a micro-batch and one layer's tensors);
the reference pass adds the reference's weights (a copy of the trainer's weight shard, loaded for the pass); the
weight transfer adds the engine's weights and the transfer bucket (verl's update_weights_bucket_megabytes, 2 GiB).
While the engine generates, a colocated trainer keeps what it does not offload (switches.resident).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.rl.switches import resident
from meshplan.serve.memory import Memory as EngineMemory

BUCKET = 2 * 2**30  # verl's checkpoint_engine.update_weights_bucket_megabytes default, 2048 MB
TRAINER_PHASES = ("reward", "old_log_prob", "reference", "critic_values", "critic_update", "actor_update")


@dataclass(frozen=True)
class PhaseMemory:
    """Bytes per GPU of one pool in one phase, by part."""

    phase: str
    pool: str  # all (colocated), rollout or train
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def engine_awake(mem: EngineMemory) -> dict[str, float]:
    """An awake engine's bytes per GPU: its weights, activations, workspace and the whole KV-cache pool."""
    return {"engine weights": float(mem.weights), "engine activations": float(mem.activations),
            "engine workspace": float(mem.workspace), "KV cache": max(float(mem.kv_pool), 0.0)}


def phase_memory(plan, trainer_memory: dict[str, float], engine_mem: EngineMemory, working: dict[str, float],
                 ran: set[str]) -> tuple[PhaseMemory, ...]:
    """Every phase's memory (module docstring); ``trainer_memory``: the update's parts (Estimate.memory),
    ``working``: each forward pass's working set (trainer.py), ``ran``: the phases the iteration runs."""
    shared = plan.way.shared
    train_pool, rollout_pool = ("all", "all") if shared else ("train", "rollout")
    asleep = {"engine workspace": float(engine_mem.workspace)} if shared else {}
    weights = {"trainer weights": trainer_memory.get("weights", 0.0)}
    held = {f"trainer {k}": v for k, v in resident(plan, trainer_memory).items()} if shared else {}
    rollout = PhaseMemory("rollout", rollout_pool, held | engine_awake(engine_mem))
    sync_parts = (weights | {"transfer bucket": float(BUCKET), "engine weights": float(engine_mem.weights)}
                  if shared else weights | {"transfer bucket": float(BUCKET)})
    out = [PhaseMemory("sync", train_pool, sync_parts | ({k: v for k, v in held.items() if k != "trainer weights"}
                                                         if shared else {}))]
    if not shared:
        out.append(PhaseMemory("sync", rollout_pool, {"engine weights": float(engine_mem.weights),
                                                     "transfer bucket": float(BUCKET)}))
    out.append(rollout)
    states = {f"trainer {k}": trainer_memory.get(k, 0.0) for k in ("weights", "grads", "optimizer")}
    for phase in (p for p in TRAINER_PHASES if p in ran):
        if phase in ("critic_update", "actor_update"):
            parts = {f"trainer {k}": v for k, v in trainer_memory.items()}
        else:
            parts = states | {"forward working set": working.get(phase, 0.0)}
            if phase == "reference":
                parts["reference weights"] = trainer_memory.get("weights", 0.0)
        out.append(PhaseMemory(phase, train_pool, parts | asleep))
    return tuple(out)
