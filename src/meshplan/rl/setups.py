"""How an RL job shares its GPUs: a registry of set-ups, each a record of what differs (DESIGN.md example 16).

- ``colocated``: every phase on every GPU, one after the other (verl's hybrid engine, HybridFlow, Sheng et al. 2025,
  §5; OpenRLHF's ``--colocate_all_models``; NeMo-RL's ``generation.colocated.enabled``). The engine sleeps while the
  trainer works (vLLM's sleep mode: level 1 moves the weights to host memory, level 2 drops them, both free the KV
  cache; verl third_party/vllm sets level 2 from vLLM 0.8.5) and the trainer's optimizer state (and gradients, and
  weights) may wait in host memory while the engine generates (verl's ``param_offload`` / ``optimizer_offload``,
  OpenRLHF's ``--deepspeed_enable_sleep``). Weights move inside each GPU (sync.py ``local``).
- ``split``: a rollout pool and a training pool (verl's one-step-off-policy recipe, docs/advance/one_step_off.md;
  NeMo-RL's non-colocated generation; OpenRLHF's separate vLLM engines). With ``RLJob.staleness`` k ≥ 1 the rollout
  of step i + k runs beside the update of step i, so the iteration takes the longer pool's time and the weight
  transfer (which pauses both: the engine cannot generate while its weights change); with k = 0 the pools take
  turns. Weights cross between the pools by NCCL broadcast (sync.py ``broadcast``).
- ``async``: split pools whose engines never drain: streaming rollouts with partial responses carried across weight
  updates (AReaL, Fu et al. 2025, §4; verl's fully-async policy with partial_rollout; slime's async training): the
  rollout runs at the engine's steady-state rate (no tail), the trainer consumes samples as they arrive.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import SpecError


@dataclass(frozen=True)
class Setup:
    """One way of sharing the GPUs (module docstring)."""

    name: str
    shared: bool  # rollout and training take turns on the same GPUs
    overlapped: bool  # the pools work at once (staleness k >= 1); False: they take turns
    streaming: bool  # engines never drain: the steady-state rate, partial rollouts across updates
    sync: str  # the weight transfer it uses (sync.SYNC_METHODS)
    source: str


SETUPS: dict[str, Setup] = {s.name: s for s in (
    Setup("colocated", shared=True, overlapped=False, streaming=False, sync="local",
          source="HybridFlow (Sheng et al. 2025) §5; verl hybrid_engine; OpenRLHF --colocate_all_models"),
    Setup("split", shared=False, overlapped=True, streaming=False, sync="broadcast",
          source="verl docs/advance/one_step_off.md; NeMo-RL non-colocated generation; OpenRLHF vLLM engines"),
    Setup("async", shared=False, overlapped=True, streaming=True, sync="broadcast",
          source="AReaL (Fu et al. 2025) §4; verl docs/advance/fully_async.md (partial_rollout)"),
)}


def setup(name: str) -> Setup:
    found = SETUPS.get(name)
    if found is None:
        raise SpecError(f"setup={name!r} must be one of {', '.join(SETUPS)}")
    return found
