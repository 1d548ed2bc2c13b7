"""The MoE layer's per-op costs (cost/mlp_moe.py): expert FLOPs and the dispatch all-to-all."""

from __future__ import annotations

from meshplan.cost.layers import moe_layer
from meshplan.cost.records import ACT_BYTES
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def _flops(ops, phase=None, kind=None):
    return sum(o.flops for o in ops if (phase is None or o.phase == phase) and (kind is None or o.kind == kind))


def test_moe_expert_flops_scale_with_top_k_not_expert_count():
    base = dict(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                mlp="swiglu", norm="rmsnorm", moe_ffn_hidden_size=1024)
    few = ModelSpec(num_experts=8, moe_topk=2, **base)
    many = ModelSpec(num_experts=64, moe_topk=2, **base)
    expert = [o for o in moe_layer(few, Plan(), Stack()) if o.name.startswith("moe/experts") and o.kind == "gemm"]
    expert_many = [o for o in moe_layer(many, Plan(), Stack()) if o.name.startswith("moe/experts") and o.kind == "gemm"]
    assert _flops(expert) == _flops(expert_many)
    # top-2 SwiGLU experts: 3 GEMMs of 2·T·k·H·Fe, ×3 passes = 18·T·k·H·Fe
    assert _flops(expert) == 18 * 2048 * 2 * 1024 * 1024


def test_moe_dispatch_bytes():
    model = ModelSpec(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000, num_experts=8, moe_topk=2, moe_ffn_hidden_size=1024)
    ops = moe_layer(model, Plan(tp=2, dp=4, ep=4, sequence_parallel=True), Stack())
    dispatch = [o for o in ops if o.name == "moe/dispatch" and o.phase == "fwd"][0]
    # T/t tokens routed · k copies · h · 2 bytes = 1024 · 2 · 1024 · 2
    assert dispatch.nbytes == 1024 * 2 * 1024 * ACT_BYTES
    assert dispatch.collective.group == 4
