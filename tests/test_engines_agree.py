"""Training and serving price one physics (issue 45): for every model preset and several layouts they agree on the
weights per GPU (cost/params.layer_weights and end_params, which both call), the FLOPs per token of the forward pass
(a prefill of whole prompts runs training's forward GEMMs and attention, serve/ops.py against cost/), and the
tensor-parallel traffic per layer.

Where they differ by design the test says how much, by arithmetic:
- the router: Megatron-Core runs a MoE layer sequence-parallel when t > 1, so each rank routes T/t tokens
  (cost/mlp_moe.moe_block); an inference engine routes every token on every rank (vLLM's replicated gate): t times
  the FLOPs, 2·T·H·E against 2·T·H·E/t;
- MoE layers' tensor-parallel exchange: training all-gathers the k routed copies of each token over the etp group and
  reduce-scatters them back (k·T·H each way), serving all-reduces the combined output (T·H): compared on the
  attention block only;
- tp above the KV heads: vLLM keeps a whole KV head per rank (replicated K/t < 1), Megatron-Core refuses such a
  layout (attention.py: divide(num_query_groups, tp)) and training prices K/t of one: serving's weights hold the
  difference (``replicated_kv``), its FLOPs are left out;
- serving refuses latent-MoE models, encoders and hybrid blocks other than Mamba-2, attention, MLP and MoE
  (serve/check.servable): their weights are compared, their ops are not; a hybrid model's blocks are one per layer,
  each with one tensor-parallel all-reduce;
- the multi-token-prediction layers, which vLLM loads only as a speculative-decoding draft model, are left out of
  serving's weights.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from meshplan.collectives.comm import bus_factor
from meshplan.cost.decode import Shape
from meshplan.cost.layers import layer_kinds
from meshplan.cost.params import layer_weights, mtp_params, stage_params
from meshplan.errors import SpecError
from meshplan.serve.check import servable
from meshplan.serve.iteration import layer_ops
from meshplan.serve.memory import weight_bytes
from meshplan.serve.precision import Quant
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

TPS = (1, 2, 8)
RTOL = 1e-9


def layouts(model) -> list[tuple[int, int]]:
    """(tp, ep): tp that divides the heads; for MoE both tensor-parallel experts (ep 1) and ep = tp where it divides
    the experts."""
    out = []
    for tp in TPS:
        if model.num_heads % tp:
            continue
        out.append((tp, 1))
        if model.is_moe and tp > 1 and model.num_experts % tp == 0:
            out.append((tp, tp))
    return out


def training_plan(tp: int, ep: int, pp: int = 1, sp: bool = False) -> Plan:
    """The training plan whose routed experts are split as serving's (ep GPUs, or t with ep = 1)."""
    return Plan(tp=tp, pp=pp, ep=ep, etp=1 if ep > 1 else tp, micro_batch=1, sequence_parallel=sp)


def is_servable(model) -> bool:
    try:
        servable(model)
    except SpecError:
        return False
    return True


def prefill(model, tp: int, ep: int) -> Shape:
    """One whole prompt of the training sequence, in 16 bits: the training forward pass's rows."""
    return Shape(tp=tp, dpa=1, ep=ep, decode=0.0, context=0.0, prefill=float(model.seq_length), prompts=1.0,
                 prefix=0.0, w_bytes=2, a_bytes=2, kv_bytes=2)


def replicated_kv(model, tp: int) -> float:
    """What an inference engine's whole KV head per rank past K ranks adds to a layer on one GPU (module docstring):
    the K and V projections, 2·K·d·(H + bias), held 1/K on the rank instead of 1/t; 0 for t ≤ K and for MLA."""
    if model.is_mla or tp <= model.num_kv_heads:
        return 0.0
    return 2 * model.kv_dim * (model.hidden_size + model.qkv_bias) * (1 / model.num_kv_heads - 1 / tp)


@pytest.mark.parametrize("name", preset_names())
def test_weights_per_gpu_agree(name):
    """Serving's bf16 weights on one GPU of a single stage = 2 bytes × training's parameters on it, less the MTP
    layers, plus past K ranks the KV heads an engine replicates (``replicated_kv``: Qwen3 with K = 4 at t = 8 holds
    2·512·(2048 + 0)·(1/4 − 1/8) = 262,144 more per layer for the 30B); with two stages (models of one layer kind and
    an even layer count, which training splits as serving's average stage) the last stage: L/2 layers, the final norm
    and the LM head."""
    model = load_model(name)
    for tp, ep in layouts(model):
        plan = training_plan(tp, ep)
        trained = stage_params(model, plan, first=True).total - mtp_params(model, plan).total
        trained += replicated_kv(model, tp) * model.num_attention_layers
        assert float(weight_bytes(model, tp, 1, ep, Quant())) == pytest.approx(2 * trained, rel=RTOL), (tp, ep)
        if len(model.block_counts) == 1 and model.num_layers % 2 == 0 and not model.mtp_layers and not (
                replicated_kv(model, tp)):
            two = training_plan(tp, ep, pp=2)
            last = stage_params(model, two, first=False).total
            assert float(weight_bytes(model, tp, 2, ep, Quant())) == pytest.approx(2 * last, rel=RTOL), (tp, ep)


@pytest.mark.parametrize("name", preset_names())
def test_the_placement_keeps_every_parameter(name):
    """Over the t ranks that split a layer and the ways its experts are split, the placement holds each parameter once
    or whole on every rank: t·split + whole + kept + ways·expert = the layer's parameters (ModelSpec.block_params), for
    every kind of layer and t = 1, 2, 8."""
    model = load_model(name)
    for kind in model.block_counts:
        for tp in TPS:
            ways = tp * 2
            w = layer_weights(model, kind, tp, ways)
            assert tp * w.split + w.whole + w.kept + ways * w.expert == pytest.approx(model.block_params(kind),
                                                                                    rel=RTOL), (kind, tp)
            assert w.whole >= 0 and w.kept > 0 and w.split > 0


def test_deepseek_v3_attention_per_gpu_at_tp8():
    """The disagreement issue 45 names: DeepSeek-V3 at tp = 8 keeps 36.6 M attention parameters per layer per GPU.
    q_down 7168·1536 = 11,010,048 and kv_down 7168·(512 + 64) = 4,128,768 whole (15,138,816), the latent norms
    1536 + 512 and the pre-norms 2·7168 whole (16,384), the rest of the attention block, 187,107,328 − 15,138,816 −
    2,048 = 171,966,464, split 8 ways: 21,495,808; in all 21,495,808 + 15,138,816 + 2,048 = 36,636,672 (training
    said 187,107,328 / 8 = 23,388,416), and the pre-norms' 14,336 besides."""
    ds = load_model("deepseek-v3")
    part = layer_weights(ds, "dense", 8, 8)
    attention = ds.attention_params()
    assert attention == 187_107_328
    mlp = ds.mlp_params(ds.ffn_hidden_size)
    assert part.whole == 15_138_816 and part.kept == 2_048 + 2 * 7168
    assert part.split == pytest.approx((attention - 15_138_816 - 2_048 + mlp) / 8)
    assert (attention - 15_138_816 - 2_048) / 8 + 15_138_816 + 2_048 == 36_636_672


def forward_flops(ops, training: bool) -> dict[str, float]:
    """GEMM and attention FLOPs by block ("attn/qkv", "mlp/fc1", ...): training's forward records, serving's all but
    those without FLOPs (decode's, with no sequence decoding); serving's attention over the prompts ("attn/prefill")
    is training's "attn/core"."""
    out: dict[str, float] = defaultdict(float)
    for op in ops:
        if op.kind in ("gemm", "attention") and op.flops and (not training or op.phase == "fwd"):
            key = "/".join(op.name.split("/")[:2]).replace("attn/prefill", "attn/core")
            out[key] += op.flops
    return out


def servable_layouts():
    for name in preset_names():
        model = load_model(name)
        if is_servable(model):
            for tp, ep in layouts(model):
                if model.is_mla or tp <= model.num_kv_heads:
                    yield pytest.param(name, tp, ep, id=f"{name}-tp{tp}-ep{ep}")


@pytest.mark.parametrize(("name", "tp", "ep"), list(servable_layouts()))
def test_forward_flops_per_token_agree(name, tp, ep):
    """Per GPU, per layer kind, per token of a whole-prompt prefill: every GEMM and the attention core as training's
    forward pass has them; the router t times training's (module docstring)."""
    model = load_model(name)
    trained = layer_kinds(model, training_plan(tp, ep), Stack())
    served = layer_ops(model, prefill(model, tp, ep))
    for kind in model.block_counts:
        a, b = forward_flops(trained[kind], True), forward_flops(served[kind], False)
        if "moe/router" in a:
            assert b.pop("moe/router") == pytest.approx(tp * a.pop("moe/router"), rel=RTOL)
        assert set(a) == set(b), (kind, sorted(set(a) ^ set(b)))
        for block in a:
            assert b[block] == pytest.approx(a[block], rel=RTOL), (kind, block, a[block], b[block])


def tp_bus_bytes(ops, training: bool, prefix: str = "") -> float:
    """Bytes on the tensor-parallel links of one forward pass: Σ n · busbw/algbw (comm.bus_factor) of its tp
    collectives (an all-reduce of n: 2(t − 1)/t · n, sequence parallelism's reduce-scatter and all-gather of n:
    (t − 1)/t · n each, the same)."""
    total = 0.0
    for op in ops:
        c = op.collective
        if c is None or c.axis != "tp" or not op.name.startswith(prefix) or (training and op.phase != "fwd"):
            continue
        total += c.nbytes * bus_factor(c.kind, c.group)
    return total


@pytest.mark.parametrize(("name", "tp", "ep"), [p for p in servable_layouts() if p.values[1] > 1])
def test_tensor_parallel_traffic_per_layer_agrees(name, tp, ep):
    """Two all-reduces of T·H·2 bytes per dense layer (after attention and after the MLP; Shoeybi et al. 2019,
    Fig. 3), 2 · 2(t − 1)/t · T·H·2 bus bytes, in training with or without sequence parallelism and in serving; a
    MoE layer's attention block one of them, a hybrid model's Mamba, attention or MLP block one (module docstring)."""
    model = load_model(name)
    served = layer_ops(model, prefill(model, tp, ep))
    expected = 2 * (tp - 1) / tp * model.seq_length * model.hidden_size * 2
    for sp in (False, True):
        trained = layer_kinds(model, training_plan(tp, ep, sp=sp), Stack())
        for kind in model.block_counts:
            if model.is_hybrid and kind == "moe":  # a hybrid MoE block has no attention block to compare
                continue
            prefix = "attn/" if kind == "moe" else ""
            a, b = tp_bus_bytes(trained[kind], True, prefix), tp_bus_bytes(served[kind], False, prefix)
            assert a == pytest.approx(b, rel=RTOL), (kind, sp, a, b)
            # one all-reduce per hybrid block (each layer one block) and per MoE layer's attention, two per dense layer
            once = model.is_hybrid or kind == "moe"
            assert b == pytest.approx(expected * (1 if once else 2), rel=RTOL), (kind, b, expected)
