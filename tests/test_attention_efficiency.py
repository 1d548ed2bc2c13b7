"""The attention kernel family as a plan setting and the measured attention efficiency the presets carry: each
family's rate against the GPU's best GEMM rate, head dimension and query tiles' fixed cost, ring context
parallelism, a power cap, Blackwell Ultra's faster exponentials, and FP8 attention."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt, plain_roofline, rates_only
from meshplan.cost.attention import core_attention
from meshplan.cost.layers import dense_layer
from meshplan.cost.records import dims
from meshplan.errors import SpecError
from meshplan.roofline import compute_time, op_time
from meshplan.specs.check import check
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def _attention_time(system: str, kernel: str) -> float:
    """Forward attention of a d = 128 model (2048 / 16 heads), where the kernel families share one rate."""
    acc = rates_only(system)  # the kernel rates, without the per-kernel fixed time
    op = next(o for o in dense_layer(gpt(hidden=2048), Plan(), Stack(attention_kernel=kernel))
              if o.kind == "attention" and o.phase == "fwd")
    return float(op_time(op, acc, "bf16", plain_roofline()))


def test_fa2_kernels_run_at_sdpa_fa2_over_cudnn_rate_on_hopper_only():
    """pytorch/pytorch#142132: SDPA's FA2 backend 329.483 TFLOP/s against cuDNN's 631.338 on one H100 (d = 128,
    4608 keys, no mask, forward): the model reproduces that ratio at that shape. On the A100, without asynchronous
    MMA, every family runs FlashAttention-2-class kernels (cuDNN's included: no TMA or warpgroup MMA to build
    Hopper's pipeline on), with FA2's rate, head-dimension falloff and tile cost alike: the families take one time.
    On the H100 at 2048 keys, causal, a tile visits 1024 keys on average and wastes 64 in the diagonal blocks, and its
    fixed cost is FA2's 281 keys or cuDNN's 543: (1024 + 64 + 281) / (1024 + 64 + 543)."""
    h100 = load_system("h100").accelerator

    def rate(kernel):
        return (DEFAULT.attention_efficiency(128, 4608, causal=False, kernel=kernel)
                * DEFAULT.attention_kernel_factor(h100, kernel))

    assert rate("fa2") / rate("fused") == pytest.approx(329.483 / 631.338)
    per_tile = (1024 + 64 + DEFAULT.attention_l0_fa2) / (1024 + 64 + DEFAULT.attention_l0)
    assert per_tile == pytest.approx(1369 / 1631)
    assert _attention_time("a100", "fa2") == pytest.approx(_attention_time("a100", "fused"))
    assert _attention_time("h100", "fa2") > _attention_time("h100", "fused")


def test_attention_runs_at_a_fraction_of_the_gpus_best_gemm_rate_not_of_its_datasheet_peak():
    # same head dimension and sequence: only the hardware differs. time ∝ 1 / (peak · clock · MAMF_bf16)
    def rate(system: str) -> float:
        acc = load_system(system).accelerator
        return acc.half_flops * DEFAULT.clock(acc) * DEFAULT.mamf(acc, "bf16")

    for a, b in (("h100", "gb200"), ("b200", "gb200")):
        assert _attention_time(a, "fused") / _attention_time(b, "fused") == pytest.approx(rate(b) / rate(a))
    # the A100's native kernel (FlashAttention-2) keeps a smaller share of that rate, attention_on_sync, with its own
    # tile cost: at 2048 keys (1024 + 64 + 281) against the H100's cuDNN (1024 + 64 + 543)
    per_tile = (1024 + 64 + DEFAULT.attention_l0_fa2) / (1024 + 64 + DEFAULT.attention_l0)
    assert _attention_time("a100", "fused") / _attention_time("h100", "fused") == pytest.approx(
        rate("h100") / rate("a100") / DEFAULT.attention_on_sync * per_tile)
    # GB200's datasheet peak is 11 % above B200's, its measured GEMM ceiling only 4 %: 1822 vs 1745 TFLOP/s
    assert _attention_time("b200", "fused") / _attention_time("gb200", "fused") == pytest.approx(1822 / 1745, rel=2e-3)


def test_ampere_runs_flash_attention_at_fa2s_share_of_its_gemm_ceiling():
    """FA2's abstract: 73 % of the A100's peak at best; FA3's: 75 % of the H100's. As shares of each GPU's best GEMM
    rate (MAMF 86.9 % and 80.3 % of peak): 0.73 / 0.869 = 0.840 against 0.75 / 0.803 = 0.934, a ratio of 0.899. It
    applies to every kernel family on the A100 and to none on Hopper or Blackwell."""
    assert DEFAULT.attention_on_sync == pytest.approx(0.840 / 0.934, abs=1e-3) == pytest.approx(0.899, abs=1e-3)
    a100, h100, b200 = (load_system(s).accelerator for s in ("a100", "h100", "b200"))
    assert DEFAULT.attention_kernel_factor(a100, "fa2") == DEFAULT.attention_kernel_factor(a100, "fused") == (
        DEFAULT.attention_on_sync)
    assert DEFAULT.attention_kernel_factor(h100, "fused") == DEFAULT.attention_kernel_factor(b200, "fused") == 1.0
    assert DEFAULT.attention_kernel_factor(h100, "fa2") == DEFAULT.fa2_on_async


@pytest.mark.parametrize(("kernel", "measured"), [("fused", 497 / 648), ("fa2", 324 / 370)])
def test_head_dimension_64_runs_at_the_measured_fraction_of_128(kernel, measured):
    """FA3's forward benchmark on an H100 (Shah et al. 2024, Fig. 5, 16k keys): FlashAttention-3 at d = 64 reaches
    497 TFLOP/s against 648 at d = 128, FlashAttention-2 324 against 370; d_0 reproduces both ratios."""
    def rate(d):
        return DEFAULT.attention_efficiency(d, 16384, causal=False, kernel=kernel)

    assert rate(64) / rate(128) == pytest.approx(measured)
    # the fitted constant is the d = 128 forward rate at long sequences: 16k keys keep 16384 / (16384 + L0) of it
    l0 = DEFAULT.attention_l0_fa2 if kernel == "fa2" else DEFAULT.attention_l0
    assert rate(128) == pytest.approx(DEFAULT.attention * 16384 / (16384 + l0))


def test_a_query_tiles_fixed_cost_slows_shorter_sequences():
    """cuDNN's query tiles pay L0 = 543 keys of fixed cost (benchmarks/measure/attention_l0.py, NVIDIA's benchmark on a
    GB200). At 8k keys with the causal mask a tile needs 4096 keys on average, wastes 64 more in the diagonal blocks
    (computed whole) and keeps 4096 / (4096 + 64 + 543) = 4096 / 4703 = 0.871 of its long-sequence rate. Against 32k
    keys (16384 / 16991) that is 0.903; the benchmark measured 0.942 forward and 0.898 backward. Without the mask a
    tile needs all 8192 keys and wastes none: 8192 / 8735."""
    r8, r32 = DEFAULT.attention_efficiency(128, 8192), DEFAULT.attention_efficiency(128, 32768)
    assert r8 == pytest.approx(DEFAULT.attention * 4096 / 4703)
    assert r8 / r32 == pytest.approx(0.903, abs=1e-3)
    assert DEFAULT.attention_efficiency(128, 8192, causal=False) == pytest.approx(DEFAULT.attention * 8192 / 8735)


def test_the_tile_fixed_costs_are_what_the_benchmark_fit_gives():
    """benchmarks/measure/attention_l0.py fits L0 to NVIDIA's cuDNN SDPA benchmark on a GB200; efficiency.py carries its
    output, as for golden values: a change to either side fails here."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "measure" / "attention_l0.py"
    spec = importlib.util.spec_from_file_location("attention_l0", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    (cudnn, fa2) = (script.fit(passes)[0] for passes in script.MEASURED.values())
    assert (cudnn, fa2) == (DEFAULT.attention_l0, DEFAULT.attention_l0_fa2) == (543.0, 281.0)


def test_ring_context_parallelism_splits_the_keys_a_tile_visits_per_call():
    """cp = 4 ring steps over 32k keys: a causal tile needs 32768 / 2 = 16384 keys over four kernel calls, each paying
    the fixed cost: 16384 / (16384 + 64 + 4 · 543) = 16384 / 18620 (the diagonal blocks' waste is the whole
    sequence's, 64 keys, once; the fixed cost is paid per call)."""
    ring = DEFAULT.attention_efficiency(128, 32768, calls=4)
    assert ring == pytest.approx(DEFAULT.attention * 16384 / 18620)
    assert ring < DEFAULT.attention_efficiency(128, 32768)


def test_a_power_cap_throttles_a_kernel_by_the_power_it_would_draw():
    """torchtitan's H100s run at 500 W against the 700 W the MAMF was measured at. A GEMM draws the rated power:
    f = (500 / 700)^(1/3) = 0.894. FlashAttention-2 on an H100 sustains 0.52 x 0.50 = 0.26 of the GEMM rate,
    so it would draw about 0.26 x 700 = 182 W and the cap does not touch it; cuDNN's (0.52 x 700 = 365 W) neither.
    At 300 W the cuDNN kernel is throttled to (300 / 365)^(1/3) = 0.937."""
    capped = load_system("h100-96gb").accelerator
    assert DEFAULT.clock(capped) == pytest.approx((500 / 700) ** (1 / 3)) == pytest.approx(0.894, abs=1e-3)
    fa2 = DEFAULT.attention * DEFAULT.fa2_on_async
    assert fa2 == pytest.approx(0.26, abs=0.005)
    assert DEFAULT.clock(capped, fa2) == DEFAULT.clock(capped, DEFAULT.attention) == 1.0
    assert DEFAULT.clock(replace(capped, tdp_watts=300), DEFAULT.attention) == pytest.approx(
        (300 / (700 * DEFAULT.attention)) ** (1 / 3))
    # same silicon at 700 W and at 500 W: attention takes as long on both (HBM aside), GEMMs 1 / 0.894 as long
    uncapped = replace(capped, tdp_watts=700)
    ops = dense_layer(gpt(hidden=2048), Plan(), Stack(attention_kernel="fa2"))
    attention = next(o for o in ops if o.kind == "attention" and o.phase == "fwd")
    gemm = next(o for o in ops if o.kind == "gemm")
    assert compute_time(attention, capped, "bf16", DEFAULT) == pytest.approx(
        compute_time(attention, uncapped, "bf16", DEFAULT))
    assert compute_time(gemm, capped, "bf16", DEFAULT) == pytest.approx(
        compute_time(gemm, uncapped, "bf16", DEFAULT) / DEFAULT.clock(capped))


def test_blackwell_ultras_exponentials_speed_up_fused_attention_as_cudnns_paired_benchmark_measured():
    """GB300 / GB200 with one cuDNN 9.26 (Llama-3.1 heads, d = 128), geometric mean over 4k-32k keys: bf16 forward
    1.258, backward 1.116; FP8 forward 1.445, backward 1.232. With the unit twice as fast, s = 1 / (1 - x/2):
    x = 2·(1 - 1/1.258) = 0.410 of the forward's time waits on exponentials, 0.208 of the backward's. At d = 192
    the matmuls per score grow 1.5x, so x = 128·0.410 / (128·0.410 + 0.590·192) = 0.317 and s = 1 / (1 - 0.158)."""
    gb300, gb200 = load_system("gb300").accelerator, load_system("gb200").accelerator
    assert DEFAULT.attention_exp_fwd == pytest.approx(2 * (1 - 1 / 1.2573), abs=1e-3)
    assert DEFAULT.attention_exp_bwd == pytest.approx(2 * (1 - 1 / 1.1160), abs=1e-3)
    for backward, kernel, s in ((False, "fused", 1.2573), (True, "fused", 1.1160), (False, "fp8", 1.4448),
                                (True, "fp8", 1.2322)):
        assert DEFAULT.exp_factor(gb300, 128, backward, kernel) == pytest.approx(s, abs=1e-3)
        assert DEFAULT.exp_factor(gb200, 128, backward, kernel) == 1.0  # exp_rate 1: Blackwell, Hopper, Ampere
    x = 128 * 0.4093 / (128 * 0.4093 + 0.5907 * 192)
    assert DEFAULT.exp_factor(gb300, 192) == pytest.approx(1 / (1 - x / 2), abs=1e-3)
    assert DEFAULT.exp_factor(gb300, 128, kernel="fa2") == 1.0  # FlashAttention-2 does not wait on them
    assert load_system("b300").accelerator.exp_rate == gb300.exp_rate == 2.0
    assert load_system("b200").accelerator.exp_rate == load_system("h100").accelerator.exp_rate == 1.0


def test_a_fused_attention_op_on_a_gb300_takes_the_gb200_time_over_the_exponential_speedup():
    model, plan = load_model("llama3-8b"), Plan(micro_batch=1, global_batch=1)
    gb300, gb200 = rates_only("gb300"), rates_only("gb200")
    for op in core_attention(model, plan, dims(model, plan, Stack())):
        plain = plain_roofline()  # the rates alone: the kernel's traffic beside its math is the ridge's
        ratio = float(op_time(op, gb200, "bf16", plain)) / float(op_time(op, gb300, "bf16", plain))
        assert ratio == pytest.approx(DEFAULT.exp_factor(gb300, 128, op.phase != "fwd"), rel=1e-9)


def test_fp8_attention_runs_at_cudnns_measured_fp8_over_bf16_rate():
    """NVIDIA's cuDNN SDPA benchmark on a GB200 (Llama-3.1-405B heads, causal), fp8 / bf16 TFLOP/s at 4k, 8k, 16k
    and 32k keys: forward 1663/1378, 1894/1583, 2033/1673, 2124/1687, geometric mean 1.219; backward 1088/1054,
    1263/1211, 1373/1303, 1429/1311, 1.055. The FP8 kernel is cuDNN's: its tile costs, times those ratios."""
    assert DEFAULT.fp8_attention_fwd == pytest.approx(1.219, abs=1e-3)
    assert DEFAULT.fp8_attention_bwd == pytest.approx(1.055, abs=1e-3)
    for backward, ratio in ((False, 1.219), (True, 1.055)):
        fp8 = DEFAULT.attention_efficiency(128, 8192, backward=backward, kernel="fp8")
        assert fp8 / DEFAULT.attention_efficiency(128, 8192, backward=backward) == pytest.approx(ratio, abs=1e-3)


def test_fp8_attention_needs_an_fp8_precision():
    fp8 = Stack(attention_kernel="fp8")
    assert any("attention_kernel=fp8 needs an fp8 precision" in r for r in check(gpt(), None, Plan(), fp8))
    assert not check(gpt(), None, Plan(precision="mxfp8"), fp8)


def test_unknown_attention_kernel_is_rejected():
    with pytest.raises(SpecError, match="attention_kernel='fa9' must be one of fused, fa2, fp8"):
        Stack(attention_kernel="fa9")
