"""Inference's per-op costs (serve/ops.py, moe.py, iteration.py; cost/decode.py): a prefill of whole prompts has the
training forward pass's GEMM and attention FLOPs; a decode step takes at least the time to read the weights once; the
closed forms of decode attention, MLA's absorbed form, the touched experts and weight-only quantisation."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost.decode import Shape
from meshplan.cost.layers import layer_kinds
from meshplan.serve.iteration import layer_ops, stage_ops, token_time
from meshplan.serve.memory import weight_bytes
from meshplan.serve.moe import touched_experts
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

BF16 = Quant()


def shape(decode=0.0, context=0.0, prefill=0.0, prompts=0.0, tp=1, quant=BF16, ep=1, dpa=1, absorb=True):
    return Shape(tp=tp, dpa=dpa, ep=ep, decode=decode, context=context, prefill=prefill, prompts=prompts, prefix=0.0,
                 w_bytes=quant.weight_bytes, a_bytes=quant.act_bytes, kv_bytes=quant.kv_bytes, absorb=absorb)


def flops_by_name(ops) -> dict[str, float]:
    out: dict[str, float] = {}
    for op in ops:
        out[op.name] = out.get(op.name, 0.0) + op.flops
    return out


@pytest.mark.parametrize(("name", "tp"), [("llama3-8b", 1), ("llama3-70b", 4), ("mixtral-8x7b", 2),
                                          ("qwen3-30b-a3b", 1)])
def test_a_prefill_of_whole_prompts_is_the_training_forward_pass(name, tp):
    """Two independent methods: cost/'s training records (forward phase) and serve/'s, at 2 prompts of 1024."""
    model = load_model(name).with_seq_length(1024)
    train = layer_kinds(model, Plan(tp=tp, micro_batch=2), Stack())
    serve = layer_ops(model, shape(prefill=2048, prompts=2, tp=tp))
    for kind, ops in train.items():
        fwd = flops_by_name(op for op in ops if op.phase == "fwd" and op.kind in ("gemm", "attention"))
        ours = flops_by_name(op for op in serve[kind] if op.kind in ("gemm", "attention"))
        ours["attn/core"] = ours.pop("attn/prefill") + ours.pop("attn/decode")
        if "moe/router" in ours:  # Megatron-Core routes each rank's T/t sequence-parallel tokens; vLLM all T on each
            ours["moe/router"] /= tp
        for op_name, value in fwd.items():
            assert ours[op_name] == pytest.approx(value, rel=1e-12), (kind, op_name)


@pytest.mark.parametrize("system", ["a100", "h100", "h200", "b200", "mi300x"])
@pytest.mark.parametrize(("name", "tp"), [("llama3-8b", 1), ("llama3-70b", 8), ("mixtral-8x7b", 4),
                                          ("deepseek-v3", 8)])
@pytest.mark.parametrize("batch", [1, 32, 512])
def test_a_decode_step_takes_at_least_the_weights_over_the_hbm_bandwidth(system, name, tp, batch):
    model = load_model(name)
    cluster = load_system(system).cluster(8)
    quant = Quant(weights="fp8") if name == "deepseek-v3" else Quant()
    step = token_time(model, cluster, shape(decode=batch, context=1024, tp=tp, ep=tp, quant=quant), 1, quant)
    ops = [op for op, _ in stage_ops(model, shape(decode=batch, context=1024, tp=tp, ep=tp, quant=quant), 1)]
    assert ops  # the bound: every weight byte a decode step reads, at the datasheet bandwidth
    dense = weight_bytes(model, tp, 1, tp, quant)
    if model.is_moe:  # only the experts the batch touches are read
        share = touched_experts(model.num_experts, model.moe_topk, batch) / model.num_experts
        experts = model.num_moe_layers * model.num_experts * model.expert_params() * quant.weight_bytes / tp
        dense = dense - experts * (1 - share)
    assert step >= dense / cluster.accelerator.hbm_bandwidth


def test_decode_attention_reads_every_cached_token_once_per_sequence():
    llama = load_model("llama3-70b")  # 64 heads, 8 KV heads of 128; tp 8: 8 query heads, 1 KV head per GPU
    (op,) = [o for o in layer_ops(llama, shape(decode=16, context=4096, tp=8))["dense"] if o.name == "attn/decode"]
    assert op.flops == 2 * 16 * 4096 * 8 * (128 + 128)  # 2·D·c·A/t·(d + d)
    cached = 16 * 4096 * 2 * 1 * 128 * 2  # D·c·(K and V)·1 head·128·2 bytes
    assert op.nbytes == cached + 2 * 16 * 8 * 256  # and the queries in, the output out
    assert op.variant == "flash" and op.n == 4096


def test_mla_absorbed_reads_the_latent_once_for_all_heads():
    ds = load_model("deepseek-v3")  # 128 heads, d_c 512, d_R 64, nope 128, d_v 128
    absorbed = {o.name: o for o in layer_ops(ds, shape(decode=4, context=2048, tp=8))["moe"]}
    core = absorbed["attn/decode"]
    assert core.flops == 2 * 4 * 2048 * 16 * (2 * 512 + 64)  # scores over 576, values over 512, 16 heads per GPU
    assert core.nbytes - 2 * 4 * 16 * (2 * 512 + 64) == 4 * 2048 * 576 * 2  # the cache, once
    assert absorbed["attn/q_absorb"].flops == 2 * 4 * 16 * 128 * 512  # W_UK on the query
    expanded = {o.name: o for o in layer_ops(ds, shape(decode=4, context=2048, tp=8, absorb=False))["moe"]}
    assert expanded["attn/kv_up"].flops == 2 * 4 * 2048 * 512 * 16 * (128 + 128)  # every cached latent up-projected
    assert expanded["attn/kv_up"].flops > 100 * absorbed["attn/q_absorb"].flops


def test_touched_experts_under_uniform_top_k_routing():
    assert touched_experts(8, 2, 1) == 2  # one token: its k experts
    assert touched_experts(8, 2, 3) == pytest.approx(8 * (1 - 0.75**3)) == pytest.approx(4.625)
    assert touched_experts(256, 8, 1000) == pytest.approx(256, rel=1e-12)  # all, from a few hundred tokens
    assert touched_experts(256, 8, 150) > 0.99 * 256
    values = [touched_experts(64, 4, t) for t in range(1, 200)]
    assert all(a < b for a, b in zip(values, values[1:], strict=False))  # more tokens, more experts, at most E


def test_weight_only_quantisation_reads_fewer_bytes_and_computes_in_16_bits():
    llama = load_model("llama3-8b")
    h100 = load_system("h100").cluster(1)
    bf16, w4 = Quant(), Quant(weights="int4")
    fc1 = {q: next(o for o in layer_ops(llama, shape(decode=8, context=512, quant=q))["dense"]
                   if o.name == "mlp/fc1") for q in (bf16, w4)}
    assert fc1[bf16].flops == fc1[w4].flops
    weights = 4096 * 2 * 14336  # fc1's gate and up: 117 M elements
    assert fc1[bf16].nbytes - fc1[w4].nbytes == pytest.approx(weights * (2 - (0.5 + 2.5 / 128)))
    # decode at batch 8 is weight-bound: int4 cuts the weights' bytes by ~ 3.8x and the step by 2.2x (the kernels'
    # fixed time, 2.4-3.1 us each, the same in both); a prefill of 8k tokens is compute-bound and the dequantised
    # GEMMs run at the 16-bit rate: within 2 %
    dec = [token_time(llama, h100, shape(decode=8, context=512, quant=q), 1, q) for q in (bf16, w4)]
    pre = [token_time(llama, h100, shape(prefill=8192, prompts=8, quant=q), 1, q) for q in (bf16, w4)]
    assert 2.0 < dec[0] / dec[1] < 3.9
    assert pre[1] == pytest.approx(pre[0], rel=0.02)


def test_fp8_activations_compute_faster_where_the_gpu_has_fp8_and_nowhere_else():
    llama = load_model("llama3-8b")
    fp8 = Quant(weights="fp8", activations="fp8")
    h100, a100 = load_system("h100").cluster(1), load_system("a100").cluster(1)
    pre = [token_time(llama, h100, shape(prefill=8192, prompts=8, quant=q), 1, q) for q in (Quant(), fp8)]
    assert pre[1] < 0.75 * pre[0]
    from meshplan.serve.precision import compute_accelerator, gemm_precision

    assert gemm_precision(compute_accelerator(a100.accelerator, fp8), fp8) == ""  # refused: check.FORMAT
    int8 = Quant(weights="int8", activations="int8")  # Ampere's int8 tensor cores: twice the 16-bit rate
    assert compute_accelerator(a100.accelerator, int8).flops("fp8") == 2 * a100.accelerator.half_flops


def _inside(group: int, cluster) -> list[int]:
    """A group split over the tiers that stays inside tier 0 (comm.split_group's form)."""
    return [group] + [1] * (len(cluster.tiers) - 1)


def test_tp_all_reduce_is_nccls_fastest_ring_protocol():
    """NCCL tuning.cc on NVLink, 8 ranks, 14 steps: LL 3.6 + 14·0.47 = 10.18 µs + n·14/8 / (busbw/4); LL128 10 + 14·1.9
    = 36.6 µs + n·14/8 / (0.92 busbw); Simple 8.4 + 14·3.4 = 56 µs + n·14/8 / busbw; busbw = 450 GB/s · 0.8 = 360."""
    from meshplan.collectives.allreduce import tp_all_reduce
    from meshplan.collectives.protocols import nccl_time
    from meshplan.specs.efficiency import DEFAULT

    busbw = 360e9
    small = 16 * 1024  # one decode row of an 8,192-wide model: LL
    assert nccl_time("all_reduce", small, 8, busbw) == pytest.approx(10.18e-6 + small * 1.75 / 90e9)
    big = 256 * 2**20  # a quarter gigabyte: Simple
    assert nccl_time("all_reduce", big, 8, busbw) == pytest.approx(56e-6 + big * 1.75 / 360e9)
    h100 = load_system("h100").cluster(8)
    assert tp_all_reduce(small, 8, _inside(8, h100), h100, DEFAULT) == pytest.approx(
        nccl_time("all_reduce", small, 8, busbw))
    assert tp_all_reduce(small, 1, _inside(1, h100), h100, DEFAULT) == 0.0  # a group of one
    sizes = np.geomspace(1e3, 1e9, 25)
    times = nccl_time("all_reduce", sizes, 8, busbw)
    assert np.all(np.diff(times) > 0)  # more bytes never take less time


def test_tp_all_reduce_on_a100_is_its_measured_kernel():
    """a100.toml: 12.6 µs + 2(g − 1)/g · n / 49 GB/s measured up to 2 MiB (SGLang PR #2688's two-shot timings: 45.5 µs
    at 1 MiB on 4 GPUs). 1 MiB on 4: 12.6 + 1.5 · 1,048,576 / 49e9 s = 12.6 + 32.1 = 44.7 µs, above NCCL's LL128 21.4 +
    1.5 · 1,048,576 / (0.92 · 240e9) = 28.5 µs; past 2 MiB each protocol plus what the measurement added to it at
    2 MiB, the fastest: at 2 MiB the kernel takes 12.6 + 64.2 = 76.8 µs, LL128 21.4 + 14.25 = 35.65 µs, Simple
    (8.4 + 6 · 3.4 = 28.8) + 13.1 = 41.9 µs; at 8 MiB LL128 is 21.4 + 57.0 = 78.4 µs and Simple 28.8 + 52.4 = 81.2 µs,
    so LL128 with its excess gives 78.4 + 41.15 = 119.5 µs and Simple 81.2 + 34.9 = 116.1 µs: 116.1."""
    from meshplan.collectives.allreduce import custom_kernel, tp_all_reduce
    from meshplan.collectives.protocols import nccl_time, protocol_times
    from meshplan.specs.efficiency import DEFAULT

    a100 = load_system("a100").cluster(8)
    busbw = 300e9 * 0.8
    mib = 2**20
    assert tp_all_reduce(mib, 4, _inside(4, a100), a100, DEFAULT) == pytest.approx(12.6e-6 + 1.5 * mib / 49e9)
    assert tp_all_reduce(mib, 4, _inside(4, a100), a100, DEFAULT) == pytest.approx(44.7e-6, abs=0.1e-6)
    assert nccl_time("all_reduce", mib, 4, busbw) == pytest.approx(28.5e-6, abs=0.1e-6)
    _, ll128, simple = protocol_times("all_reduce", 8 * mib, 4, busbw)
    _, ll128_at, simple_at = protocol_times("all_reduce", 2 * mib, 4, busbw)
    kernel = custom_kernel(2 * mib, 4, 12.6e-6, 49e9)
    assert (kernel, ll128_at, simple_at) == pytest.approx((76.8e-6, 35.65e-6, 41.9e-6), abs=0.1e-6)
    assert (ll128, simple) == pytest.approx((78.4e-6, 81.2e-6), abs=0.1e-6)
    assert tp_all_reduce(8 * mib, 4, _inside(4, a100), a100, DEFAULT) == pytest.approx(simple + kernel - simple_at)
    assert tp_all_reduce(8 * mib, 4, _inside(4, a100), a100, DEFAULT) == pytest.approx(116.1e-6, abs=0.1e-6)
    sizes = np.geomspace(1e3, 1e9, 61)
    times = tp_all_reduce(sizes, 4, _inside(4, a100), a100, DEFAULT)
    assert np.all(np.diff(times) > 0)  # continuous past the measured 2 MiB: more bytes never take less time
    b200 = load_system("b200").cluster(8)  # no measurement: NCCL's protocols alone
    assert b200.accelerator.allreduce_bandwidth == 0.0
    assert tp_all_reduce(mib, 4, _inside(4, b200), b200, DEFAULT) == pytest.approx(
        nccl_time("all_reduce", mib, 4, 900e9 * 0.8))


def test_a_kernel_per_query_head_rereads_the_kv_head_from_l2():
    """Llama 2 70B at tp 4: 16 query heads and 2 KV heads per GPU, so FasterTransformer's per-query-head kernel reads
    each KV head 16 / 2 = 8 times. 64 sequences of 3,072 cached tokens, per layer 2 · 2 · 128 · 2 B = 1,024 B per
    token: 64 · 3,072 · 1,024 = 201 MB from HBM, 8 · 201 = 1.61 GB through L2 at 7.22 TB/s · 0.85 = 262 µs, against
    the once-read kernel's 201 MB / (2,039 GB/s · 0.85 · kv_read) ≈ 120 µs."""
    from meshplan.cost.decode import decode_attention
    from meshplan.serve.efficiency import SERVE_DEFAULT
    from meshplan.serve.engine import load_engine
    from meshplan.serve.iteration import cache_read_time

    model, a100 = load_model("llama2-70b"), load_system("a100").cluster(4)
    once = shape(decode=64, context=3072, tp=4)
    each = Shape(**{f: getattr(once, f) for f in once.__slots__} | {"per_query_head": True})
    op_once, op_each = decode_attention(model, once)[0], decode_attention(model, each)[0]
    assert op_once.repeat == 1.0 and op_each.repeat == 8.0 and op_each.nbytes == op_once.nbytes
    cached, queries = 64 * 3072 * 2 * 2 * 128 * 2, 2 * 64 * 16 * (128 + 128)  # and each query and output, 16 heads
    assert op_once.nbytes == cached + queries == 201_850_880
    acc = a100.accelerator
    t_once = cache_read_time(op_once, acc, "bf16", SERVE_DEFAULT)
    t_each = cache_read_time(op_each, acc, "bf16", SERVE_DEFAULT)
    assert t_each == pytest.approx(8 * op_each.nbytes / (7.22e12 * 0.85))
    assert t_each == pytest.approx(262e-6, rel=0.01) and t_once < 0.5 * t_each
    assert load_engine("lmdeploy").kv_per_query_head and not load_engine("trtllm").kv_per_query_head
    h100 = load_system("h100").cluster(4).accelerator  # no L2 bandwidth stated: the once-read roofline
    assert cache_read_time(op_each, h100, "bf16", SERVE_DEFAULT) == cache_read_time(op_once, h100, "bf16",
                                                                                    SERVE_DEFAULT)


def test_training_prices_its_tp_all_reduce_with_the_same_model_without_the_engines_kernel():
    """One TP all-reduce model (allreduce.tp_all_reduce) for training and serving: training runs NCCL, so on an A100
    (whose engines' kernel is measured: 12.6 us + 1.5 · n / 49 GB/s at 4 GPUs) its 1 MiB all-reduce is NCCL's
    fastest protocol, below the engines' measured 44.7 us; a group that leaves tier 0 (4 x 2 nodes) is comm.py's
    ring."""
    from meshplan.collectives.allreduce import tp_all_reduce
    from meshplan.collectives.comm import Collective, split_time
    from meshplan.collectives.protocols import nccl_time
    from meshplan.cost.records import OpCost
    from meshplan.specs.efficiency import DEFAULT
    from meshplan.specs.plan import Plan
    from meshplan.step.passes import time_ops

    a100 = load_system("a100").cluster(8)
    mib, busbw = 2.0**20, a100.tiers[0].bandwidth * DEFAULT.link(0)
    nccl = tp_all_reduce(mib, 4, _inside(4, a100), a100, DEFAULT, custom=False)
    assert nccl == pytest.approx(nccl_time("all_reduce", mib, 4, busbw)) and nccl < 44.7e-6
    op = OpCost("attn/tp", "fwd", "collective", nbytes=mib, collective=Collective("all_reduce", mib, "tp", 4))
    assert time_ops([op], a100, Plan(dp=2, tp=4, global_batch=8), DEFAULT) == [pytest.approx(nccl)]
    two_nodes = load_system("a100").cluster(16)
    parts = [4, 2] + [1] * (len(two_nodes.tiers) - 2)
    assert tp_all_reduce(mib, 8, parts, two_nodes, DEFAULT, custom=False) == pytest.approx(
        split_time("all_reduce", mib, 8, parts, two_nodes, DEFAULT))
