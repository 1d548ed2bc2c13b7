"""GEMMs whose leading dimensions are not 16-byte multiples run at ``Efficiency.unaligned_gemm`` of the aligned rate
(specs/alignment.py), and stacks that pad the vocabulary (``Stack.vocab_multiple``, Megatron-LM's 128 x tp)
compute the padded, aligned output layer: the arithmetic of each, the constant's derivation from nanoGPT's padded
vocabulary (benchmarks/measure/unaligned_gemm.py), and a traced model's alignment read from its tensors' strides."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import rates_only
from meshplan.cost.blocks import gemm
from meshplan.cost.embed_head import head_ops
from meshplan.cost.records import OpCost, alignment, dims
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.roofline import compute_time
from meshplan.specs.alignment import unaligned_factor
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_extras import vocab_shard
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.trace.capture import trace_module
from meshplan.trace.cost import op_costs


def test_alignment_is_the_largest_power_of_two_dividing_every_size_up_to_32():
    """768 = 2^8 * 3 and 50304 = 2^7 * 393: 32 (the cap); 50257 is odd: 1; 50264 = 2^3 * 6283: 8; a shard of an
    uneven split (50257 / 2 = 25128.5): 1. Arrays (the search's plans side by side) give the same, element-wise."""
    assert alignment(768, 50304) == 32.0
    assert alignment(768, 50257) == 1.0
    assert alignment(768, 50264) == 8.0
    assert alignment(768, 50257 / 2) == 1.0
    sizes = np.array([50304.0, 50257.0, 50264.0, 25128.5])
    assert list(alignment(768.0, sizes)) == [32.0, 1.0, 8.0, 1.0]


def test_alignment_of_arrays_is_each_elements_own():
    """The array path (lowest set bit of each whole size) against the definition, element by element: the largest
    p in 1, 2, 4, 8, 16, 32 with size % p == 0, 1 for a fraction, an infinity or NaN; 0 divides by every p."""
    rng = np.random.default_rng(7)
    sizes = np.concatenate([rng.integers(0, 2**20, 400).astype(float), rng.integers(1, 4096, 100) / 2.0,
                            rng.integers(1, 1000, 50) * 1024.0, [0.0, 1.0, 2.0**40, 2.0**63, np.inf, np.nan]])
    other = rng.permutation(sizes)

    def by_definition(x: float) -> float:
        return max(p for p in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0) if np.isfinite(x) and x % p == 0) if (
            np.isfinite(x) and x == np.floor(x)) else 1.0

    got = alignment(sizes, other, 768.0)
    want = [min(by_definition(a), by_definition(b), 32.0) for a, b in zip(sizes, other, strict=True)]
    assert list(got) == want
    assert alignment(sizes[:5], 512).tolist() == [alignment(float(x), 512) for x in sizes[:5]]



def test_alignment_of_whole_arrays_takes_the_lowest_set_bit_and_keeps_the_general_answer():
    """An array of whole sizes below 2^62 (the search's) takes the short path, the lowest set bit of n | 32: 0 reads 32,
    a negative size its magnitude's, 2^62 - 1024 (a multiple of 1024) 32. It gives what the definition and the general
    path give (the same arrays with one NaN appended force the general path: their answers agree element by element,
    bit for bit, with the same type)."""
    rng = np.random.default_rng(11)
    sizes = np.concatenate([rng.integers(-2**20, 2**20, 400).astype(float), rng.integers(1, 1000, 50) * 1024.0,
                            [0.0, -0.0, 1.0, -48.0, 96.0, 2.0**53, 2.0**53 + 2.0, 2.0**62 - 1024.0]])
    other = rng.permutation(sizes)
    short = alignment(sizes, other, 768)
    general = alignment(np.append(sizes, np.nan), np.append(other, 1.0), 768)[:-1]
    assert type(short) is np.ndarray and short.dtype == general.dtype == np.float64
    assert short.tobytes() == general.tobytes()
    assert list(alignment(np.array([0.0, -48.0, 2.0**62 - 1024.0, 24.0, 7.0]))) == [32.0, 16.0, 32.0, 8.0, 1.0]
    assert alignment(np.asarray(48.0), 64) == alignment(48, 64) == 16.0

def test_a_gemm_record_carries_its_weights_dims_alignment_in_every_pass_never_the_token_count():
    """Row-major activations: the leading dimensions of every pass are the weight's k and n, not the m tokens
    (1,001 tokens here, odd, leave the GEMM aligned)."""
    d = dims(load_model("gpt2"), Plan(), Stack())
    assert {op.align for op in gemm("x", 1001, 768, 50304, d)} == {32.0}
    assert {op.align for op in gemm("x", 1024, 768, 50257, d)} == {1.0}


def test_an_unaligned_gemm_takes_its_flops_at_unaligned_gemm_of_the_aligned_rate():
    """A 1024 x 768 x 50257 GEMM against 1024 x 768 x 50264: the same 393 column tiles of 128 (tile quantization prices
    the tiles, not the FLOPs in them), so the same time at one rate, and the unaligned one takes 1 / unaligned_gemm =
    1 / 0.385 as long on an A100 (mma.sync), 1 / unaligned_gemm_async = 1 / 0.170 on an H100 (asynchronous MMA).
    Under an fp8 plan 50264 is 8 one-byte elements, unaligned for fp8, so the GEMM runs in 16 bits (Transformer Engine
    refuses such fp8 GEMMs), where it is aligned: the bf16 time; 50257 runs in 16 bits unaligned; 50272 (16 x 3142)
    runs in fp8."""
    d = dims(load_model("gpt2"), Plan(), Stack())
    odd, even, wide = (gemm("x", 1024, 768, n, d)[0] for n in (50257, 50264, 50272))
    for gpu, constant in (("a100", DEFAULT.unaligned_gemm), ("h100", DEFAULT.unaligned_gemm_async)):
        acc = rates_only(gpu)
        ratio = float(compute_time(odd, acc, "bf16", DEFAULT) / compute_time(even, acc, "bf16", DEFAULT))
        assert ratio == pytest.approx(1 / constant, rel=1e-12)
    assert (DEFAULT.unaligned_gemm, DEFAULT.unaligned_gemm_async) == pytest.approx((0.385, 0.170))
    acc = rates_only("h100")
    bf16 = float(compute_time(even, acc, "bf16", DEFAULT))
    assert float(compute_time(even, acc, "fp8", DEFAULT)) == pytest.approx(bf16, rel=1e-12)
    assert float(compute_time(odd, acc, "fp8", DEFAULT)) == pytest.approx(bf16 / DEFAULT.unaligned_gemm_async,
                                                                          rel=1e-12)
    fp8 = float(compute_time(wide, acc, "fp8", DEFAULT))
    assert fp8 == pytest.approx(float(compute_time(wide, acc, "bf16", DEFAULT)) * acc.flops("bf16")
                                * DEFAULT.mamf(acc, "bf16") / (acc.flops("fp8") * DEFAULT.mamf(acc, "fp8")), rel=1e-12)
    # an output layer kept in 16 bits under an fp8 plan (variant "bf16") is judged by its 2-byte operands
    head16 = replace(even, variant="bf16")
    assert float(compute_time(head16, acc, "fp8", DEFAULT)) == pytest.approx(bf16, rel=1e-12)


def test_a_leading_dimension_of_4_or_8_bytes_runs_at_the_wide_gain_times_the_odd_rate():
    """50258 (2 x 25129: 4 bytes) and 50260 (4 x 12565: 8 bytes) against 50264 (16 bytes), all 393 tiles: on an H100
    1 / (0.170 x 1.92) = 1 / 0.326 as long; on an A100 0.385 x 1.92 = 0.74 of the aligned rate."""
    d = dims(load_model("gpt2"), Plan(), Stack())
    two, four, even = (gemm("x", 1024, 768, n, d)[0] for n in (50258, 50260, 50264))
    for gpu, low in (("h100", DEFAULT.unaligned_gemm_async), ("a100", DEFAULT.unaligned_gemm)):
        acc = rates_only(gpu)
        aligned = float(compute_time(even, acc, "bf16", DEFAULT))
        for op in (two, four):
            assert float(compute_time(op, acc, "bf16", DEFAULT)) == pytest.approx(
                aligned / (low * DEFAULT.unaligned_wide_gain), rel=1e-12)
    assert DEFAULT.unaligned_gemm_async * DEFAULT.unaligned_wide_gain == pytest.approx(0.326)
    # the gain never lifts a GEMM above the aligned rate
    assert float(unaligned_factor(4.0, rates_only("a100"), replace(DEFAULT, unaligned_wide_gain=5.0))) == 1.0


def test_more_alignment_never_slows_a_gemm():
    for gpu in ("a100", "h100"):
        acc = rates_only(gpu)
        op = OpCost("x", "fwd", "gemm", 2e12, 1e9, m=4096, n=4096, k=4096)
        times = [float(compute_time(replace(op, align=a), acc, "bf16", DEFAULT))
                 for a in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0)]
        assert times == sorted(times, reverse=True)


def test_megatron_pads_the_vocabulary_to_128_per_rank():
    """Megatron-LM: V padded to a multiple of 128 x tp, so each rank holds ceil(V / (128 t)) * 128 columns: 50257 at
    tp 1 -> 50304 (393 * 128), at tp 2 -> 197 * 128 = 25216 a rank (50432 in all), at tp 8 -> 50 * 128 = 6400; a
    stack that does not pad keeps V / t; the search's tp side by side gives the same."""
    assert vocab_shard(50257, 1, 128) == 50304
    assert vocab_shard(50257, 2, 128) == 25216
    assert vocab_shard(50257, 8, 128) == 6400
    assert vocab_shard(50304, 1, 128) == 50304  # already a multiple
    assert vocab_shard(50257, 2, 1) == 50257 / 2
    assert list(vocab_shard(50257.0, np.array([1.0, 2.0, 8.0]), 128)) == [50304, 25216, 6400]
    gpt2 = load_model("gpt2")
    for stack, n in ((load_stack("megatron-core"), 50304.0), (Stack(), 50257.0)):
        logits = [op for op in head_ops(gpt2, Plan(), stack) if op.name == "head/logits"]
        assert {op.n if op.phase != "bwd_x" else op.k for op in logits} == {n}
        assert {op.align for op in logits} == ({32.0} if n == 50304.0 else {1.0})


def test_vocab_multiple_is_a_checked_stack_field():
    with pytest.raises(SpecError, match="vocab_multiple"):
        Stack(vocab_multiple=0)
    assert load_stack("megatron-core").vocab_multiple == 128
    assert load_stack("torchtitan").vocab_multiple == 1


def test_gpt2_trains_faster_with_megatrons_padded_vocabulary_than_unpadded():
    """The same plan of GPT-2 (50257) on one A100, the generic stack with and without Megatron's padding: the padded
    head computes 47 more columns, in the same 393 column tiles, at the aligned rate: its GEMMs take about
    unaligned_gemm of the unpadded head's time (the passes' other dims and depths move it under 1 %), and the step
    is shorter."""
    gpt2, cluster, plan = load_model("gpt2"), load_system("a100").cluster(1), Plan(micro_batch=8, global_batch=8)
    plain = estimate(gpt2, cluster, plan, Stack())
    padded = estimate(gpt2, cluster, plan, Stack(vocab_multiple=128))
    assert padded.step_time < plain.step_time
    head = {e.stack.vocab_multiple: sum(op.seconds * op.count for op in e.ops if op.name == "head/logits")
            for e in (plain, padded)}
    assert head[1] / head[128] == pytest.approx(1 / DEFAULT.unaligned_gemm, rel=0.01)


def test_the_constant_is_what_nanogpts_padded_vocabulary_gives():
    """benchmarks/measure/unaligned_gemm.py: r = H / (H + 0.25 T) from meshplan's own aligned step of nanoGPT's bench.py
    (T) and its output-layer GEMMs (H); the constant in efficiency.py is that value to three digits, and the output
    layer then takes about 40 % of the unaligned step, as the commit (77e7e04c) says."""
    path = Path(__file__).parents[1] / "benchmarks" / "measure" / "unaligned_gemm.py"
    spec = importlib.util.spec_from_file_location("unaligned_gemm", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rate, step, head, _, share = module.derive()
    assert rate == pytest.approx(head / (head + 0.25 * step), rel=1e-12)
    assert DEFAULT.unaligned_gemm == pytest.approx(rate, abs=0.0015)
    assert 0.35 < share < 0.45  # the commit: "about 40% of latency" in the last layer


def test_the_asynchronous_mma_constants_are_the_h200_measurement():
    """data/measured/gpu/2026-11-26-nvidia-h200-unaligned-gemm.json (benchmarks/measure/unaligned_gemm.py ``h200``): the
    10 odd shapes' rate ratios (5 shapes, 2 calls) lie within 0.15-0.19 and their median is unaligned_gemm_async; the 3
    of 4- and 8-byte dims lie within 0.30-0.35, their median over it unaligned_wide_gain. The H200 ran the 2-byte
    GEMMs with Turing-era align1 kernels (its profile's kernel names) and the aligned ones with Hopper's."""
    path = Path(__file__).parents[1] / "benchmarks" / "measure" / "unaligned_gemm.py"
    spec = importlib.util.spec_from_file_location("unaligned_gemm", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    odd, wide = module.h200()
    assert len(odd) == 10 and len(wide) == 3
    assert all(0.15 < r < 0.19 for r in odd) and all(0.30 < r < 0.35 for r in wide)
    assert DEFAULT.unaligned_gemm_async == pytest.approx(float(np.median(odd)), abs=0.0015)
    assert DEFAULT.unaligned_wide_gain == pytest.approx(float(np.median(wide) / np.median(odd)), rel=0.01)
    unaligned = next(p for p in json.loads(module.H200.read_text())["profile"] if p["vocab"] == 50257)
    assert any("align1" in k["kernel"] and "cutlass_75" in k["kernel"] for k in unaligned["kernels"][:3])


def test_a_traced_linear_reads_its_alignment_from_its_tensors():
    """nn.Linear(768, 50257): the forward addmm's weight and output lead with 50257 elements, odd; 50304: aligned."""
    for width, align in ((50257, 1.0), (50304, 32.0)):
        traced = trace_module(torch.nn.Linear(768, width), [torch.randn(64, 768)])
        forward = [c for c in op_costs(traced) if c.kind == "gemm" and c.phase == "fwd"]
        assert [c.align for c in forward] == [align]


def test_the_moe_router_stays_in_16_bits_under_an_fp8_plan():
    """Megatron-Core's router GEMM (RouterGatingLinearFunction) runs on the 16-bit input, never in fp8, so an 8-expert
    router's 8 columns are 16 bytes, aligned, and at the 16-bit rate, as serving's router (serve/moe.py)."""
    from meshplan.cost.mlp_moe import moe_block

    model = load_model("mixtral-8x7b")
    plan = Plan(dp=8, ep=8, precision="fp8", global_batch=8)
    router = [op for op in moe_block(model, plan, dims(model, plan, Stack())) if op.name == "moe/router"]
    assert len(router) == 3 and {op.variant for op in router} == {"bf16"}


def test_the_h200s_eager_gpt2_step_slows_as_predicted_without_the_padded_vocabulary():
    """The H200's eager GPT-2 iteration (12 x 1024 tokens, fused AdamW; unaligned_gemm_gpu.py ``steps``) took 55.3 ms
    with 50,257 tokens of vocabulary against 35.7 ms with 50,304, both calls: 1.55x. meshplan's estimate under
    ``--framework pytorch-fsdp`` on one GPU moves by the same factor within 5 %; its aligned step itself reads about
    13 % long (docs/SMALL_WORK_GPU.md keeps the regime's errors)."""
    calls = json.loads((Path(__file__).parents[1] / "data" / "measured" / "gpu" /
                        "2026-11-26-nvidia-h200-unaligned-gemm.json").read_text())["calls"]
    wall = {v: np.median([r["wall_s"] for c in calls for r in c["eager"] if r["vocab"] == v]) for v in (50257, 50304)}
    measured = wall[50257] / wall[50304]
    assert 1.5 < measured < 1.6
    stack, cluster = load_stack("pytorch-fsdp").with_(fsdp="none"), load_system("h200").cluster(1)
    plan = Plan(micro_batch=12, global_batch=12, zero=0, recompute="none", precision="bf16", optimizer="adamw")
    step = {v: estimate(replace(load_model("gpt2"), vocab_size=v, dropout=False), cluster, plan, stack).step_time
            for v in (50257, 50304)}
    assert step[50257] / step[50304] == pytest.approx(measured, rel=0.05)


def test_a_traced_convolution_reads_its_alignment_from_its_channels_not_the_images_strides():
    """cuDNN runs convolutions on the tensor cores in NHWC, channels innermost: a 64 -> 64 convolution of a 7 x 7 image
    (rows 7 elements apart) is aligned; a stem of 3 input channels is not, forward and weight gradient alike; a
    depthwise one (groups = channels: cuDNN's direct kernels, not a tensor-core GEMM) takes no alignment rule."""
    for conv, shape, align in ((torch.nn.Conv2d(64, 64, 3, padding=1), (8, 64, 7, 7), 32.0),
                               (torch.nn.Conv2d(3, 64, 7, stride=2), (8, 3, 32, 32), 1.0),
                               (torch.nn.Conv2d(64, 64, 7, padding=3, groups=64), (8, 64, 7, 7), 32.0)):
        traced = trace_module(conv, [torch.randn(*shape)])
        convs = [c for c in op_costs(traced) if c.kind == "gemm"]
        assert convs and {c.align for c in convs} == {align}
