"""An engine's scheduler as the simulation runs it: its policy (policy.py: what an iteration carries, admission and
preemption, read in the engine's source), the engine preset's sizes (engine.py: ``max_batched_tokens``, ``max_seqs``,
``block_size``, ``last_prompt_token_decoded``), sized for one instance of a plan, with its KV-cache capacity in tokens
from serve's memory model (memory.py) and the share of each prompt found in the prefix cache.

Per instance: ``max_seqs`` running sequences per attention group (check.SEQS: batch <= max_seqs·dpa) and
``max_batched_tokens`` per micro-batch lane (metrics._chunked: the budget of each of the pp·dpa lanes); the KV pool
of one GPU holds the tokens of its attention group's sequences, each token token_bytes/pp bytes on it
(cost/kv_cache.token_bytes over the stage's layers), sliding windows not discounted (a window model holds more).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.kv_cache import token_bytes
from meshplan.errors import SpecError
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.load.policy import Policy, policy_for
from meshplan.serve.load.speculation import Speculation
from meshplan.serve.memory import memory, state_bytes, weight_bytes
from meshplan.serve.plan import ServePlan, Workload, cached_tokens
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


@dataclass(frozen=True)
class Scheduler:
    """What one instance's scheduler may do in an iteration (module docstring)."""

    max_seqs: int  # running sequences
    budget: int  # tokens per iteration (decode tokens and prompt chunks)
    policy: Policy  # what an iteration carries, admission and preemption (policy.py)
    kv_tokens: int  # the KV cache's capacity in tokens
    block_size: int
    lanes: int  # pp·dpa micro-batches the running sequences spread over
    prefix_hit: float = 0.0  # share of each prompt already in the prefix cache
    step_tokens: float = 1.0  # tokens a decode gains per iteration (speculative decoding: E, speculation.py)
    draft_tokens: int = 0  # draft tokens each decode verifies beside its own (they take budget too)
    kv_received: bool = False  # a disaggregated decode instance: each prompt's KV cache arrives from a prefill one
    # the context step runs each prompt but its last token, which the next decode step runs and samples the first
    # output token from (Engine.last_prompt_token_decoded: TurboMind v0.1)
    last_token_decoded: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.prefix_hit <= 1:
            raise SpecError(f"prefix-hit={self.prefix_hit} must be from 0 to 1 (a share of each prompt)")

    def cached(self, prompt: int) -> int:
        """Prompt tokens found in the prefix cache: the hit share, in whole blocks, at least one token computed."""
        if self.kv_received:  # all but the last token's: that one runs as the first decode (disagg.py)
            return prompt - 1
        return cached_tokens(prompt, self.prefix_hit, self.block_size)


def scheduler(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine, prefix_hit: float = 0.0,
              spec: Speculation | None = None, policy: str | None = None) -> Scheduler:
    """The scheduler of one instance of ``plan`` (module docstring); with speculative decoding, the draft's weights
    (16-bit where the target's are, one copy on the last stage's GPUs) and its KV cache per token come out of the
    pool; ``policy``: a scheduler preset's name (None: the engine's, policy.policy_for)."""
    cols = plan_columns(plan.with_(replicas=1, prefill_replicas=0))
    mem = memory(model, cluster.accelerator.hbm_bytes, cols, plan.quant, engine, Workload(input_len=1,
                                                                                          output_len=1).decode_context)
    per_token = float(token_bytes(model, plan.quant.kv_bytes, plan.tp)) / plan.pp
    pool = max(float(mem.kv_pool), 0.0)
    if spec is not None:
        pool = max(pool - float(weight_bytes(spec.draft, plan.tp, 1, 1, plan.quant)), 0.0)
        per_token += float(token_bytes(spec.draft, plan.quant.kv_bytes, plan.tp))
    groups = plan.dpa
    lanes = plan.pp * plan.dpa
    rules = policy_for(engine, policy)
    seqs = min(plan.batch, engine.max_seqs * groups)
    # a hybrid model's sequences hold their recurrent state beside their tokens' KV: the most that run take theirs
    pool = max(pool - seqs / groups * float(state_bytes(model, plan.tp)) / plan.pp, 0.0)
    return Scheduler(max_seqs=seqs, budget=(rules.budget or engine.max_batched_tokens) * lanes, policy=rules,
                     kv_tokens=int(pool / per_token) * groups, block_size=engine.block_size, lanes=lanes,
                     prefix_hit=prefix_hit, step_tokens=spec.per_step if spec else 1.0,
                     draft_tokens=spec.tokens if spec else 0, last_token_decoded=engine.last_prompt_token_decoded)
