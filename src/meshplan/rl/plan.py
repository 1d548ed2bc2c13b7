"""RLPlan: how an RL job is placed: the set-up (setups.py), the trainer's parallel layout on its pool (a training
``Plan``, its global batch the optimizer step's mini-batch), the rollout engine's layout on its pool (a ``ServePlan``:
tp, pp, dpa, ep, replicas filling the pool, ``batch`` the engine's limit of running sequences per instance, vLLM's
max_num_seqs), and the switches colocation needs.

- ``offload``: the trainer's state held in host memory while the engine generates (colocated only; OFFLOADS):
  ``none``; ``optimizer``: the optimizer state and the gradients (verl's ``optimizer_offload``, Megatron's
  ``grad_offload``); ``all``: the weights too (verl's ``param_offload``, OpenRLHF's ``--deepspeed_enable_sleep``).
- ``sleep_level``: what the engine frees while the trainer works (colocated; vLLM's sleep mode): 1 moves its weights
  to host memory and frees the KV cache, 2 drops both (verl's level from vLLM 0.8.5; the next weight transfer
  rewrites them).
- ``gpu_memory_utilization``: the engine's share of each GPU's memory (vLLM's gpu_memory_utilization; verl's rollout
  default 0.5); 0: what the engine preset says (split pools) or what the trainer's resident state leaves
  (colocated, estimate.py).
- ``sync``: how weights reach the engine (sync.SYNC_METHODS); "": the set-up's own.
- ``forward_micro_batch``: sequences per micro-batch of the log-probability and value passes (verl's
  log_prob_micro_batch_size_per_gpu); 0: the trainer's micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import check_types
from meshplan.rl.setups import Setup, setup
from meshplan.serve.plan import ServePlan
from meshplan.specs.plan import Plan

OFFLOADS: dict[str, tuple[str, ...]] = {  # the trainer's memory parts held on the host during the rollout
    "none": (),
    "optimizer": ("grads", "optimizer"),
    "all": ("weights", "grads", "optimizer"),
}
SLEEP_LEVELS = (1, 2)


@dataclass(frozen=True, kw_only=True)
class RLPlan:
    """One placement of an RL job (module docstring)."""

    setup: str
    trainer: Plan
    engine: ServePlan
    train_gpus: int
    rollout_gpus: int
    offload: str = "none"
    sleep_level: int = 2
    gpu_memory_utilization: float = 0.0
    sync: str = ""
    forward_micro_batch: int = 0
    storage_bandwidth: float = field(default=40e9, metadata={"help": "per node: DGX SuperPOD H100 reference "
                                                                     "architecture, storage fabric: 'read data at "
                                                                     "over 40 GBps' with GPUDirect Storage"})

    def __post_init__(self) -> None:
        check_types(self, "rl plan: ")
        ranges.check_spec(self, "rl plan: ")
        way = setup(self.setup)
        if self.offload not in OFFLOADS:
            raise SpecError(f"rl plan: offload={self.offload!r} must be one of {', '.join(OFFLOADS)}")
        if self.sleep_level not in SLEEP_LEVELS:
            raise SpecError(f"rl plan: sleep_level={self.sleep_level} must be 1 (weights to host) or 2 (dropped)")
        if way.shared and self.train_gpus != self.rollout_gpus:
            raise SpecError(f"rl plan: {self.setup} puts rollout and training on the same GPUs: train_gpus="
                            f"{self.train_gpus} must equal rollout_gpus={self.rollout_gpus}")
        if not way.shared and self.offload != "none":
            raise SpecError(f"rl plan: offload={self.offload} frees memory for a colocated engine; the {self.setup} "
                            "set-up gives the engine its own GPUs")
        if self.trainer.num_gpus != self.train_gpus:
            raise SpecError(f"rl plan: the trainer's layout takes {self.trainer.num_gpus} GPUs, its pool "
                            f"{self.train_gpus}")
        if self.engine.num_gpus > self.rollout_gpus:
            raise SpecError(f"rl plan: the engine's {self.engine.describe()} takes {self.engine.num_gpus} GPUs, more "
                            f"than its pool's {self.rollout_gpus}")
        if self.engine.prefill_replicas:
            raise SpecError("rl plan: a rollout engine runs prefill and decode together (prefill_replicas=0)")

    @property
    def way(self) -> Setup:
        return setup(self.setup)

    @property
    def num_gpus(self) -> int:
        """GPUs of the job: one pool colocated, the two pools side by side otherwise."""
        return self.train_gpus if self.way.shared else self.train_gpus + self.rollout_gpus

    @property
    def sync_method(self) -> str:
        return self.sync or self.way.sync

    def describe(self) -> str:
        t = self.trainer
        axes = "·".join(str(v) for v in (t.dp, t.tp, t.pp, t.cp)) + (f" ep={t.ep}" if t.ep > 1 else "")
        pools = (f"{self.train_gpus} GPUs" if self.way.shared
                 else f"{self.rollout_gpus} rollout + {self.train_gpus} train GPUs")
        return (f"{self.setup} ({pools}): trainer dp·tp·pp·cp {axes} mbs={t.micro_batch}; "
                f"engine {self.engine.describe()}")

    def with_(self, **changes: Any) -> RLPlan:
        return replace(self, **changes)
