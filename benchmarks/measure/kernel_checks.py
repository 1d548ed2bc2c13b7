"""Kernel-level checks of the efficiency model against published benchmarks it was not fitted on.

The three fitted constants (``efficiency.FITTED``) come from whole training steps; these rows time single kernels
that someone else measured, so an error here is the efficiency model's own, without the rest of a step around it.

- Transformer Engine's GEMM profiling tutorial (NVIDIA/TransformerEngine docs/examples/gemm_profiling/
  gemm_profiling.rst, "Autocast vs Pre-quantized", B300 SXM6): the 12 GEMMs (forward, data and weight gradient of
  QKV, attention output, MLP up and down) of one layer of a 5B model, hidden 4096, FFN 16384 (GeLU), 32 heads,
  31 x 512 = 15,872 tokens, with pre-quantized operands: 13.102 ms in BF16 and 6.812 ms in FP8 (current scaling).
  (Its MXFP8 and NVFP4 times are where ``block_scaled`` and ``nvfp4_gemm`` come from, so they are not checks.)
- NVIDIA's cuDNN SDPA training benchmark on a GB200 and a GB300 the same day with the same cuDNN 9.26
  (NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results/dsv3/{gb200,gb300}/dsv3_20260724_*.csv):
  DeepSeek-V3's attention (128 heads, d_qk = 192, d_v = 128, causal, batch 2), the GB300's speedup over the GB200,
  geometric mean over 4k-32k keys. ``attention_exp_*`` (Blackwell Ultra's doubled exponential throughput) come from
  the same benchmark's Llama-3.1 heads (d = 128), so these rows check how the model moves them to another head
  dimension.
- mamba_ssm's Triton SSD forward (``_mamba_chunk_scan_combined_fwd``, five kernels) on an H100, 128 heads of 64,
  state 128, one group, chunk 256, fp16, batch 1 (vLLM PR #27299, cyang49's table from RishiAstra's
  ssm_benchmark.py): 1.2064e7, 1.2623e7 and 1.2924e7 tokens/s at 4,096, 8,192 and 16,384 tokens. ``Efficiency.ssd``
  is the 8,192-token row's streaming rate, so that row is its calibration (error 0 by construction, printed to show
  it) and the other two are checks of how the model scales with the length.
- A pure Mamba-2 model (d_model 2048, 48 layers, batch 4, 4,096 tokens, bf16; mamba_ssm's Mamba2 defaults: 64
  heads of 64, state 128, one group, chunk 256) trained on one A100, H200 and GB200 (state-spaces/mamba#904):
  102.5, 239.2 and 360.4 TFLOP/s. Its throughput ratios between GPUs check how the SSD kernels' rate moves from the
  H100 it was measured on: with the SM count (``Efficiency.ssd``, latency-bound) rather than the HBM bandwidth.

Run: python benchmarks/measure/kernel_checks.py
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshplan.cost.attention import core_attention
from meshplan.cost.layers import dense_layer
from meshplan.cost.mamba import ssd_ops
from meshplan.cost.records import dims
from meshplan.estimate import estimate
from meshplan.roofline import op_time
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import DEFAULT_FRAMEWORK, Stack, load_stack

TE_TUTORIAL = "Transformer Engine GEMM profiling tutorial, B300, pre-quantized"
TE_5B = ModelSpec(name="te-gemm-profiling-5b", num_layers=24, hidden_size=4096, num_heads=32, ffn_hidden_size=16384,
                  vocab_size=32000, seq_length=512, mlp="gelu")
TE_TOKENS_PER_GEMM = 31 * 512


CUDNN_BENCHMARK = "cuDNN SDPA benchmark, GB300 / GB200, cuDNN 9.26"
DSV3_KEYS = (4096, 8192, 16384, 32768)
# GB300 and GB200 TFLOP/s at DSV3_KEYS (dsv3_20260724_041345.csv / dsv3_20260724_041401.csv, causal, deterministic
# backward off): (kernel, pass) -> (GB300, GB200) per key length
DSV3_MEASURED = {
    ("bf16", "fwd"): ((1693, 1937, 2059, 2023), (1456, 1646, 1810, 1705)),
    ("bf16", "bwd"): ((1157, 1274, 1316, 1304), (1096, 1257, 1165, 1112)),
    ("fp8", "fwd"): ((2883, 3231, 3409, 3424), (2148, 2473, 2603, 2565)),
    ("fp8", "bwd"): ((2019, 2363, 2433, 2474), (1719, 2002, 2044, 1927)),
}


SSD_BENCHMARK = "mamba_ssm Triton SSD forward, H100 (vLLM PR #27299)"
SSD_MEASURED = {4096: 1.206409e7, 8192: 1.262327e7, 16384: 1.292440e7}  # tokens/s


def ssd_forward_seconds(tokens: int) -> float:
    """meshplan's time for the forward SSD kernels of the benchmark's shape on one H100."""
    model = ModelSpec(name="ssd-benchmark", num_layers=1, hidden_size=4096, num_heads=32, ffn_hidden_size=1,
                      vocab_size=1024, seq_length=tokens, layer_pattern="M", mamba_heads=128, mamba_head_dim=64,
                      mamba_state=128, mamba_groups=1, mamba_chunk=256, norm="rmsnorm", position_embedding="none")
    plan, acc = Plan(), load_system("h100").accelerator
    return sum(float(op_time(op, acc, "bf16", DEFAULT)) for op in ssd_ops(model, dims(model, plan, Stack()))
               if op.phase == "fwd")


MAMBA2_ISSUE = "pure Mamba-2 model, one GPU (state-spaces/mamba#904)"
MAMBA2_MEASURED = {"a100": 102.5, "h200": 239.2, "gb200": 360.4}  # TFLOP/s, one accounting for all three
MAMBA2 = ModelSpec(name="mamba2-d2048", num_layers=48, hidden_size=2048, num_heads=16, ffn_hidden_size=1,
                   vocab_size=50280, seq_length=4096, layer_pattern="M" * 48, mamba_heads=64, mamba_head_dim=64,
                   mamba_state=128, mamba_groups=1, mamba_chunk=256, norm="rmsnorm", position_embedding="none",
                   tied_embeddings=True)


def mamba2_tokens_per_second(system: str, bandwidth_bound: bool = False) -> float:
    """meshplan's training throughput of the issue's model on one GPU of ``system`` (batch 4, no recompute); with
    ``bandwidth_bound`` the SSD kernels' H100 rate carried as a share of HBM bandwidth instead of per SM (the
    alternative ``Efficiency.ssd`` is not)."""
    cluster = load_system(system).cluster(1, nvlink_domain=1)
    acc, eff = cluster.accelerator, DEFAULT
    if bandwidth_bound:  # the H100's share of its 3.35 TB/s, as bytes per second per SM of this GPU
        eff = DEFAULT.with_(ssd=DEFAULT.ssd * 132 / 3.35e12 * acc.hbm_bandwidth / acc.num_sms)
    plain = Plan(micro_batch=4, global_batch=4, zero=0, recompute="none", grad_bytes=2)  # no recompute, bf16 grads
    # the kernels' rates are the question, on three hosts (Grace's Python 2.75 x an x86 host's): the optimizer's
    # per-parameter host loops (Stack.tensor_host, a framework's wrapper's; the issue's script is not Megatron's) are
    # left out of the comparison
    stack = load_stack(DEFAULT_FRAMEWORK).with_(tensor_host=0.0)
    return float(estimate(MAMBA2, cluster, plain, stack, eff=eff).tokens_per_s)


@dataclass(frozen=True)
class Check:
    what: str
    source: str
    measured: float
    predicted: float
    unit: str = "s"  # "s": a time, printed in ms; "x": a speedup

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    def shown(self, value: float) -> str:
        return f"{value * 1e3:.2f} ms" if self.unit == "s" else f"{value:.3f}x"


def layer_gemm_seconds(system: str, precision: str) -> float:
    """The 12 GEMMs of one layer of the tutorial's 5B model (31 sequences of 512 tokens) on ``system``."""
    acc = load_system(system).accelerator
    plan = Plan(micro_batch=31, global_batch=31, precision=precision)
    return sum(float(op_time(op, acc, precision, DEFAULT)) for op in dense_layer(TE_5B, plan, Stack())
               if op.kind == "gemm")


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def dsv3_attention_speedup(kernel: str, phase: str) -> float:
    """meshplan's GB300 / GB200 speedup of DeepSeek-V3's fused attention (the benchmark's shape: batch 2, one GPU),
    geometric mean over DSV3_KEYS."""
    gb300, gb200 = load_system("gb300").accelerator, load_system("gb200").accelerator
    precision = "fp8" if kernel == "fp8" else "bf16"
    ratios = []
    for keys in DSV3_KEYS:
        model = load_model("deepseek-v3").with_seq_length(keys)
        plan = Plan(micro_batch=2, global_batch=2, precision=precision)
        stack = Stack(attention_kernel="fp8" if kernel == "fp8" else "fused")
        op = next(o for o in core_attention(model, plan, dims(model, plan, stack)) if o.phase.startswith(phase))
        ratios.append(float(op_time(op, gb200, precision, DEFAULT)) / float(op_time(op, gb300, precision, DEFAULT)))
    return geometric_mean(ratios)


def checks() -> list[Check]:
    gemms = [Check(f"5B layer, 12 GEMMs, {label}", TE_TUTORIAL, measured_ms * 1e-3, layer_gemm_seconds("b300", prec))
             for label, prec, measured_ms in (("BF16", "bf16", 13.102), ("FP8", "fp8", 6.812))]
    attention = [Check(f"DeepSeek-V3 attention {kernel.upper()} {phase}, GB300 speedup", CUDNN_BENCHMARK,
                       geometric_mean([a / b for a, b in zip(*DSV3_MEASURED[kernel, phase], strict=True)]),
                       dsv3_attention_speedup(kernel, phase), "x")
                 for kernel, phase in DSV3_MEASURED]
    ssd = [Check(f"Mamba-2 SSD forward, {tokens:,} tokens" + (" (calibration)" if tokens == 8192 else ""),
                 SSD_BENCHMARK, tokens / rate, ssd_forward_seconds(tokens))
           for tokens, rate in SSD_MEASURED.items()]
    ratios = [Check(f"Mamba-2 model, {b.upper()} / {a.upper()} throughput" + (" (SSD bandwidth-bound, not used)"
                                                                             if bound else ""), MAMBA2_ISSUE,
                    MAMBA2_MEASURED[b] / MAMBA2_MEASURED[a],
                    mamba2_tokens_per_second(b, bound) / mamba2_tokens_per_second(a, bound), "x")
              for bound in (False, True) for a, b in (("a100", "h200"), ("h200", "gb200"))]
    return gemms + attention + ssd + ratios


def table() -> list[str]:
    lines = ["| kernel | source | measured | meshplan | error |", "|---|---|---:|---:|---:|"]
    lines += [f"| {c.what} | {c.source} | {c.shown(c.measured)} | {c.shown(c.predicted)} | {c.error * 100:+.1f}% |"
              for c in checks()]
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
