"""ServePlan and Workload: how a model is served on a cluster, and what it is asked to do.

An instance is one copy of the model on tp·pp·dpa GPUs: tensor parallelism ``tp`` inside each attention group,
``pp`` pipeline stages, and for a mixture of experts ``dpa`` attention groups side by side (data-parallel
attention, each with its own sequences) whose MoE layers run over all tp·dpa GPUs of a stage: expert-parallel
(``ep`` = tp·dpa, each GPU E/ep whole experts; wide EP when that spans nodes, DeepSeek-V3 §3.4) or tensor-parallel
(``ep`` = 1, every expert split tp ways: vLLM without --enable-expert-parallel). ``replicas`` instances serve
side by side (data parallelism). Disaggregated serving (Zhong et al. 2024, "DistServe", §3; Patel et al. 2024,
"Splitwise", §4) gives ``prefill_replicas`` further instances of the same shape the prompts only, and ships each
prompt's KV cache to a decode instance; 0 co-locates prefill and decode in every instance.

``batch`` is the decode batch: the sequences an instance keeps in flight (the concurrency a benchmark sets, or
what its memory and the engine's max_seqs admit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, TypedDict

from meshplan import ranges
from meshplan.errors import SpecError
from meshplan.fields import check_types
from meshplan.serve.precision import Quant
from meshplan.xp import Num


class PlanColumns(TypedDict):
    """A ServePlan's sizes as the serving formulas take them: each a number (one plan) or an array (many: the search,
    a curve's batches)."""

    tp: Num
    pp: Num
    dpa: Num
    ep: Num
    batch: Num
    replicas: Num
    prefill_replicas: Num


@dataclass(frozen=True, kw_only=True)
class ServePlan:
    """One serving configuration (module docstring)."""

    tp: int = 1
    pp: int = 1
    dpa: int = 1
    ep: int = 1
    batch: int = 1
    replicas: int = 1
    prefill_replicas: int = 0
    quant: Quant = field(default_factory=Quant)

    def __post_init__(self) -> None:
        check_types(self, "serve plan: ")
        ranges.check_spec(self, "serve plan: ")
        if not isinstance(self.quant, Quant):
            raise SpecError(f"serve plan: quant={self.quant!r} must be a Quant")
        if self.ep not in (1, self.tp * self.dpa):
            raise SpecError(f"serve plan: ep={self.ep} must be 1 (experts split tp ways) or tp·dpa = "
                            f"{self.tp * self.dpa} (expert parallel over the stage)")
        if self.dpa > 1 and self.ep == 1:
            raise SpecError(f"serve plan: dpa={self.dpa} (data-parallel attention) needs expert parallelism "
                            f"ep = tp·dpa = {self.tp * self.dpa}")

    @property
    def instance_gpus(self) -> int:
        return self.tp * self.pp * self.dpa

    @property
    def num_gpus(self) -> int:
        return self.instance_gpus * (self.replicas + self.prefill_replicas)

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    def describe(self) -> str:
        axes = [f"tp={self.tp}"] + [f"{k}={v}" for k, v in (("pp", self.pp), ("dpa", self.dpa), ("ep", self.ep))
                                    if v > 1]
        pools = (f"{self.prefill_replicas}P+{self.replicas}D" if self.disaggregated else f"x{self.replicas}")
        return f"{' '.join(axes)} {pools} batch={self.batch} {self.quant.label}"

    def with_(self, **changes: Any) -> ServePlan:
        return replace(self, **changes)


def cached_tokens(prompt: int, hit: float, block_size: int) -> int:
    """Prompt tokens an engine finds in its prefix cache when a share ``hit`` of each prompt was seen before: whole
    KV pages of at most prompt − 1 tokens (vLLM V1's KVCacheManager.get_computed_blocks: "max_cache_hit_length =
    request.num_tokens - 1", hits counted in full blocks), so the prefill computes at least the last token."""
    return int(min(hit * prompt, prompt - 1) // block_size * block_size)


def cached_note(cached: int) -> str:
    """" (N cached)" after a prompt length in a title, or nothing."""
    return f" ({cached:,} cached)" if cached else ""


@dataclass(frozen=True, kw_only=True)
class Workload:
    """Requests of ``input_len`` prompt tokens and ``output_len`` generated tokens. ``static``: one batch served
    start to end (prefill together, then decode together; a latency table's fixed batch), instead of the steady
    state of continuous batching. ``cached_len``: the prompt tokens each request finds in the engine's prefix cache
    (a shared system prompt, an earlier turn, a benchmark that repeats its prompts), whose KV the prefill reads
    instead of computing; at least the last prompt token is computed (vLLM V1's KVCacheManager caps a hit at
    num_tokens − 1). Its pages are counted as each sequence's own (memory.py): a prefix that many requests share
    holds them once in the engine, so the memory is conservative there."""

    input_len: int
    output_len: int
    static: bool = False
    cached_len: int = 0

    def __post_init__(self) -> None:
        check_types(self, "workload: ")
        ranges.check_spec(self, "workload: ")
        if self.cached_len >= self.input_len:
            raise SpecError(f"workload: cached_len={self.cached_len:,} must be below input_len={self.input_len:,} "
                            "(a prefill computes at least the prompt's last token)")

    @property
    def fresh_len(self) -> int:
        """Prompt tokens a prefill computes: I − cached."""
        return self.input_len - self.cached_len

    @property
    def decode_context(self) -> float:
        """Mean context a decoding sequence attends to: I + O/2 in steady state (each sequence is equally likely to
        be at any of its O steps), I + (O − 1)/2 for a static batch (the mean over its steps 0 … O − 1)."""
        return self.input_len + ((self.output_len - 1) / 2 if self.static else self.output_len / 2)

    @property
    def resident_context(self) -> float:
        """Mean tokens a running sequence holds in the KV cache (its pages): the same mean context."""
        return self.decode_context
