"""Speculative decoding as a plan choice (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative
Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with Speculative Sampling"): a draft
proposes k tokens per sequence, the target verifies them in one pass, and a sequence keeps the accepted prefix plus
the target's own next token: E = (1 − α^(k+1)) / (1 − α) tokens per step at a per-token acceptance rate α
(Leviathan et al. §3.1, eq. 1; k + 1 at α = 1).

The draft: a model of its own (a preset name), or multi-token-prediction heads (DeepSeek-V3 §2.2: one transformer
layer beside the shared embedding and LM head, run k times in sequence; vLLM's and SGLang's MTP drafts), priced as the
target with one layer (a MoE layer for a MoE model). Its price per draft step is serve's own iteration time of that
model (prices.py) without the engine's host time (one engine step drives the draft and the verification); its weights
and its KV cache take room from the target's KV pool (scheduler.py).

Per iteration (simulate.py): the decodes verify k + 1 tokens each, priced as the target's iteration with the k extra
rows of each sequence sampled (the LM head over them) and attending to the cache the sequence already reads
(prices.speculative_prices); each decode then advances E tokens on average (the expected count, not a draw).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.errors import SpecError
from meshplan.serve.engine import Engine
from meshplan.serve.load.prices import Prices, prices
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec

MAX_DRAFT = 16  # draft tokens per step: engines use 1-8 (vLLM num_speculative_tokens, SGLang speculative-num-steps)


@dataclass(frozen=True)
class Speculation:
    """k draft tokens per step at acceptance rate α, from ``draft`` (module docstring)."""

    tokens: int
    acceptance: float
    draft: ModelSpec
    label: str = "mtp"

    def __post_init__(self) -> None:
        if not 1 <= self.tokens <= MAX_DRAFT:
            raise SpecError(f"speculative={self.tokens} draft tokens must be from 1 to {MAX_DRAFT}")
        if not 0 <= self.acceptance <= 1:
            raise SpecError(f"speculative acceptance={self.acceptance} must be from 0 to 1")

    @property
    def per_step(self) -> float:
        """E, the tokens a sequence gains per verification step (module docstring)."""
        a, k = self.acceptance, self.tokens
        return float(k + 1) if a == 1 else (1 - a ** (k + 1)) / (1 - a)


def mtp_draft(model: ModelSpec) -> ModelSpec:
    """The target with one layer (a MoE one for a MoE model): the MTP module's price (module docstring)."""
    try:
        return replace(model, name=f"{model.name} MTP", num_layers=1, first_k_dense_layers=0, mtp_layers=0)
    except (SpecError, TypeError, ValueError) as exc:
        raise SpecError(f"speculative: {model.name} has no one-layer MTP draft meshplan can build ({exc})") from None


def parse_speculation(text: str, model: ModelSpec) -> Speculation:
    """``--speculative K:ALPHA[:DRAFT]``: k draft tokens, acceptance α, and a model preset (default: MTP)."""
    from meshplan.specs.model_load import load_model

    parts = text.split(":")
    try:
        tokens, acceptance = int(parts[0]), float(parts[1])
    except (IndexError, ValueError):
        raise SpecError(f"speculative={text!r} must be K:ALPHA[:DRAFT], e.g. 3:0.7 (MTP) or 4:0.6:llama3-8b") from None
    if len(parts) > 3:
        raise SpecError(f"speculative={text!r} must be K:ALPHA[:DRAFT]")
    if len(parts) == 3 and parts[2] != "mtp":
        return Speculation(tokens, acceptance, load_model(parts[2]), parts[2])
    return Speculation(tokens, acceptance, mtp_draft(model))


class SpeculativePrices:
    """An iteration's seconds with speculative decoding: the plain iteration (decodes and prompt chunk), plus what
    verifying k more rows per decode adds (the target's iteration with those rows sampled, less the plain decode),
    plus k draft steps over the decodes."""

    def __init__(self, plain: Prices, verify: Prices, draft: Prices, tokens: int) -> None:
        self.plain, self.verify, self.draft, self.tokens = plain, verify, draft, tokens
        self._knots: dict[float, list[float]] = {}

    def knots(self, decode: float) -> tuple[list[float], list[float]]:
        """As Prices.knots: the three grids share the context axis (one ``longest``), so their sum is linear
        between its points too."""
        if decode not in self._knots:
            self._knots[decode] = [self(decode, 0.0, c) for c in self.plain.c]
        return self.plain.c, self._knots[decode]

    def __call__(self, decode: float, prefill: float, context: float, prefix: float = 0.0) -> float:
        if not decode:
            return self.plain(decode, prefill, context, prefix)
        extra = self.verify(decode, decode * self.tokens, context) - self.plain(decode, 0.0, context)
        return self.plain(decode, prefill, context, prefix) + extra + self.tokens * self.draft(decode, 0.0, context)


def speculative_prices(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine, longest: int,
                       spec: Speculation) -> SpeculativePrices:
    """The three grids (prices.py) of SpeculativePrices: the target's plain and sampled-rows iterations, and the
    draft's decode step on one pipeline stage without the engine's host time."""
    quiet = engine.with_(iteration_overhead=0.0, sequence_overhead=0.0)
    return SpeculativePrices(prices(model, cluster, plan, engine, longest),
                             prices(model, cluster, plan, engine, longest, sampled=True),
                             prices(spec.draft, cluster, plan.with_(pp=1), quiet, longest), spec.tokens)
