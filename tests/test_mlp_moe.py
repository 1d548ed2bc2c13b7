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


MIXTRAL = dict(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
               num_experts=8, moe_topk=2, moe_ffn_hidden_size=2048, mlp="swiglu", norm="rmsnorm")


def _records(ops, name):
    return {o.phase: o.nbytes for o in ops if o.name == name}


def test_the_permutation_as_each_code_runs_it():
    """T = 2048 tokens (b 1, s 2048), k = 2, tp = 1: Tg = 2048 tokens, R = 4096 routed rows of h = 1024, a = 2, f = 4
    (cost/moe_permute.py): fused 2R / R + Tg forward; the unfused Megatron-Core order (Tg + R), (3Tg + 3R) forward,
    (3Tg + R), (Tg + 7R) backward; transformers' sort_gather R·(a + 4f) + Tg·(2f + a) forward and
    Tg·(a + f) + R·(12f + 2a) backward for the unpermutation."""
    model, plan = ModelSpec(**MIXTRAL), Plan(micro_batch=1)
    tg, r, h, a = 2048, 4096, 1024, ACT_BYTES
    fused = moe_layer(model, plan, Stack())
    assert _records(fused, "moe/permute")["fwd"] == a * 2 * r * h
    assert _records(fused, "moe/unpermute")["fwd"] == a * (r + tg) * h
    eager = moe_layer(model, plan, Stack(moe_permute="gather_scatter"))
    assert _records(eager, "moe/permute") == {"fwd": a * (tg + r) * h, "bwd_x": a * (3 * tg + r) * h}
    assert _records(eager, "moe/unpermute") == {"fwd": a * (3 * tg + 3 * r) * h, "bwd_x": a * (tg + 7 * r) * h}
    hf = moe_layer(model, plan, Stack(moe_permute="sort_gather"))
    assert _records(hf, "moe/unpermute") == {"fwd": (r * (2 + 16) + tg * (8 + 2)) * h,
                                             "bwd_x": (tg * (2 + 4) + r * (48 + 4)) * h}


def test_the_all_gather_dispatcher_moves_the_tokens_once_each_way():
    """tp = etp = 8, ep = 1, sequence parallel: the all-to-all dispatcher all-gathers the k = 2 routed rows of the
    T/t tokens of each rank (k·T·h·a over etp), the all-gather dispatcher the tokens (T·h·a over etp·ep): half the
    bytes; its permutation then runs on the gathered T tokens, R = k·T rows, on every rank."""
    model = ModelSpec(**MIXTRAL)
    plan = Plan(tp=8, sequence_parallel=True, micro_batch=1)
    t, k, h, a = 2048, 2, 1024, ACT_BYTES
    alltoall = moe_layer(model, plan, Stack())
    allgather = moe_layer(model, plan, Stack(moe_dispatcher="allgather"))
    gathered = [o for o in alltoall if o.name == "moe/etp_gather" and o.phase == "fwd"][0]
    assert gathered.nbytes == k * t * h * a
    dispatch = [o for o in allgather if o.name == "moe/dispatch" and o.phase == "fwd"][0]
    assert (dispatch.collective.kind, dispatch.nbytes, dispatch.collective.group) == ("all_gather", t * h * a, 8)
    assert not [o for o in allgather if o.name.startswith("moe/etp_")]
    assert _records(allgather, "moe/permute")["fwd"] == a * 2 * (k * t) * h  # fused: 2R, R = k·T
    assert _records(alltoall, "moe/permute")["fwd"] == a * 2 * (k * t // 8) * h  # R = k·T/t
