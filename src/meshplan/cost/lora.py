"""LoRA fine-tuning (Hu et al. 2021): the base weights' gradients dropped, the adapters' GEMMs added."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.blocks import gemm
from meshplan.cost.records import Dims, OpCost
from meshplan.specs.plan import Plan

# The GEMMs that carry adapters, by name prefix, per ``Plan.lora_targets``: "all" the attention and dense-MLP
# linears (Megatron-Bridge / NeMo 2 default), "qkv" the query/key/value projections (attn/qkv; MLA's attn/q*,
# attn/kv*), NeMo 1.x's default.
LORA_PREFIXES = {"all": ("attn/", "mlp/"), "qkv": ("attn/q", "attn/kv")}


def lora(ops: list[OpCost], plan: Plan, d: Dims) -> list[OpCost]:
    """LoRA fine-tuning (Hu et al. 2021): frozen base weights need no weight gradient, so every base GEMM's
    ``bwd_w`` (and the embedding's gradient scatter-add) is dropped; the input gradient still flows. Each
    targeted linear W (k×n) gains a rank-r path x·A·B (A: k×r, B: r×n) with all three passes, run in bf16
    (outside the fp8 region); A re-reads the base GEMM's saved input, B saves its m×r input."""
    if plan.finetune != "lora":
        return ops
    r, targets = plan.lora_rank, LORA_PREFIXES[plan.lora_targets]
    out: list[OpCost] = []
    for op in ops:
        if op.phase == "bwd_w" and op.kind in ("gemm", "memory"):
            continue
        out.append(op)
        if op.kind == "gemm" and op.phase == "fwd" and op.name.startswith(targets):
            rows = op.m * op.groups
            out += [replace(a, variant="bf16") for a in gemm(op.name + "/lora_a", rows, op.k, r, d, saved=0.0)
                    + gemm(op.name + "/lora_b", rows, r, op.n, d)]
    return out
