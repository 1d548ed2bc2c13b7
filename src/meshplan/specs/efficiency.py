"""Efficiency: the fraction of a datasheet peak that real kernels and collectives sustain, from physics.

This is the one place where such factors live. Every factor is a function of the op's shape and the hardware,
built from a handful of constants; each constant says where it comes from. Two of them (``gemm`` and
``attention``, on the dense runs) were fitted once, on the fixed half of the published runs that
``meshplan_validation.selection.in_fit_set`` selects (CRC-32 of the run id even), by
``benchmarks/measure/fit_efficiency.py`` with every source group weighted equally; the other half is the out-of-sample
check (docs/ACCURACY.md). The rest are published measurements. Nothing is tuned per run, per source or per GPU.

Symbols: m×k·k×n a GEMM's shape, S the SM count, f the sustained clock as a fraction of the datasheet clock,
d the attention head dimension, s the key length, B_attn the attention kernel's block size.

GEMMs. The best a GPU sustains on its best GEMM shape is a measured property of the silicon, its clocks and
its power limit: the "maximum achievable matmul FLOPS" (MAMF; S. Bekman, ml-engineering, compute/accelerator
README, "Maximum Achievable Matmul FLOPS comparison table", brute-force shape search with PyTorch matmul):
BF16 86.9 % of peak on A100 SXM, 80.3 % on H100 SXM, 77.6 % on B200, 72.9 % on GB200; FP8 70.9 % on H100,
76.3 % on B200, 72.3 % on GB200 (``architectures.MATMUL``). It falls as peaks rise because the tensor cores cannot
hold the boost clock within the power limit (AMD, "Understanding Peak, Max-Achievable & Delivered FLOPs").
Training shapes then lose to tile and wave quantization (NVIDIA "Matrix Multiplication Background User's
Guide", Deep Learning Performance docs, §"Tile quantization" and §"Wave quantization"): cuBLAS computes C
in output tiles; a tile that sticks out of C does full work for partial output, and the tiles run in waves
of S (one tile per SM at a time), so the last, partial wave idles SMs; an output of fewer tiles than SMs is
split over k instead (split-K, s slices of k / s). The library picks, per shape, the kernel that wastes least
(specs/gemm_shape.py, written once for training and inference); for a tile t_m×t_n without a split:
    quantization(t) = m·n / (⌈⌈m/t_m⌉·⌈n/t_n⌉ / S⌉ · S · t_m · t_n)
    efficiency      = gemm · MAMF(precision) · f · max_t quantization(t) · k / (k + k_0)
``gemm`` (fitted: 0.87) is what a training step's GEMMs keep of the best-shape benchmark's rate beyond the tile,
wave and depth effects. An isolated benchmark of training-shaped GEMMs already shows it, so it is mostly the
library's kernel choice for real shapes against MAMF's search over shapes, not the heat or power of a long run:
Transformer Engine's GEMM profiling tutorial (B300, the 12 GEMMs of a layer of a 5B model over 15,872 tokens,
operands pre-quantized) measures 13.10 ms in BF16 and 6.81 ms in FP8 where this model, not fitted on it, gives
12.61 and 6.65 (tests/test_kernel_checks.py).
The k / (k + k_0) factor is the fixed per-tile cost (pipeline prologue, epilogue writing C) amortised over the
reduction. The roofline (roofline.py) separately caps a skinny GEMM by its HBM traffic. MXFP8 GEMMs (Blackwell's
block-scaled FP8: the kernel reads and applies one scale per 32 elements of every operand row and column) run at
``block_scaled`` × the per-tensor FP8 rate, as Transformer Engine's GEMM profiling measures (0.95 on a B300); NVFP4
GEMMs at ``nvfp4_gemm`` = 1.81 × that rate on the B300 (same measurement, FP4 peak 3 × FP8), elsewhere by Amdahl's
law (``nvfp4_speedup``: 1.51 × where the FP4 peak is 2 × FP8). Quantizing an operand to either block-scaled format
(an amax and a scale per block, row-wise and column-wise) takes ``block_scaled_cast`` = 1.8 × the time per byte of a
per-tensor cast (same measurement, autocast minus pre-quantized).

Alignment (``unaligned_gemm``, ``unaligned_gemm_async``, ``unaligned_wide_gain``): specs/alignment.py.

Attention (FlashAttention-2, Dao 2023, Fig. 4–5: forward 50–73 % of A100 peak, backward lower; FlashAttention-3, Shah
et al. 2024, abstract: 75 % of H100 peak forward at d = 128, FA2 only 35 % on H100): the softmax, exponentials and
rescaling per score element do not shrink with the head dimension, so efficiency ∝ d / (d + d_0), with d_0 measured
per kernel family in FA3's forward benchmark on an H100 (Shah et al. 2024, Fig. 5, 16k keys): FlashAttention-3 runs
d = 64 at 497 against 648 TFLOP/s at d = 128 (0.767×, ``attention_d0`` = 55.9), FlashAttention-2 at 324 against 370
(0.876×, ``attention_d0_fa2`` = 21.2), since (1 + d_0/128)·64/(64 + d_0) = r gives d_0 = 128(1 − r)/(2r − 1). The FA2
figure is an H100 measurement applied to FA2 on every GPU (A100 included), where FA2's own paper plots no d = 64 / 128
pair at equal sequence length. (Fitted, d_0 wandered from 32 to 51 along a flat valley of the objective.) A query tile
visits the key blocks its mask leaves it and takes, in keys of its loop, a + e + L_0: the a keys a query sees on average
(s/2 under the causal mask, s without it), e keys wasted in the blocks the mask cuts, which are computed whole (the
causal diagonal: B_attn/2; a sliding window of w keys, ``ModelSpec.sliding_window``, leaves the tile the blocks of its
band, a = ``ModelSpec.window_keys()``, whose two edges waste B_attn: the kernels skip the blocks outside it,
FlashAttention-2/3's window_size, FlexAttention's block mask, cuDNN's diagonal band that Transformer Engine sets from
window_size, cudnn-frontend PR #584 bounding the key loop by it), and a fixed prologue and epilogue (load Q; rescale and
write O and the log-sum-exp) worth L_0 keys per kernel call (cp calls when ring context parallelism splits the keys).
So the kernel keeps a/(a + e + L_0) of its long-sequence rate; ``attention_l0`` = 543 (cuDNN / FA3 class) and
``attention_l0_fa2`` = 281 are least-squares fits of that form to NVIDIA's cuDNN SDPA training benchmark on
a GB200 (cudnn-frontend benchmark/sdpa_benchmark_training, cuDNN 9.17 and PyTorch's FlashAttention-2, Llama-3.1-405B
heads, 4k-32k keys; benchmarks/measure/attention_l0.py), applied on every GPU as d_0 is. The backward pass (five GEMMs,
dS computed in fp32) runs at ``attention_bwd`` × the forward rate (FA2 Fig. 5 vs Fig. 4, FA3 Fig. 6 vs Fig. 5: ≈ 0.8).
The attention kernel's matmuls run on the same tensor cores under the same clock and power limits as the GEMMs, so its
rate is a fraction of the GPU's best-shape 16-bit GEMM rate (MAMF × sustained clock, as for GEMMs), not of the
datasheet peak: ``attention`` (fitted: 0.52 of that rate at d = 128, forward, long sequences, i.e. 0.42 of the H100's
and, with ``attention_on_sync``, 0.41 of the A100's) sits below the kernels' own benchmarks (FA3: 0.6–0.75 of peak;
FA2 on A100: 0.5–0.7) because in a training step the kernel also pays for the QKV layout transposes and the softmax
statistics around it (on an H200 the kernels alone run 1.62-1.89x the rate meshplan charges, within 17 % of each
other over head dimensions 64-128, 512-16k keys and the mask: tests/test_attention_gpu.py,
benchmarks/measure/attention_gpu.py; PyTorch's SDPA picks cuDNN there from 2.11, whose bundled cuDNN passes
sdp_utils.cpp's 9.15 gate for Hopper and Blackwell). A stack that runs FlashAttention-2-class kernels on Hopper or
Blackwell (``Stack.attention_kernel = "fa2"``) gets ``fa2_on_async`` = 0.50 of that at long sequences (PyTorch SDPA's
FA2 backend vs cuDNN on an H100, pytorch/pytorch#142132, measured at 4608 keys, where the two families' tile costs make
it 0.52). On Ampere (synchronous MMA only) every family runs FlashAttention-2-class kernels, with FA2's d_0 and L_0, at
``attention_on_sync`` = 0.90 of the share of MAMF that FlashAttention-3 reaches on Hopper (each paper's best forward:
FA2 73 % of A100 peak against its 86.9 % MAMF, FA3 75 % of H100 peak against 80.3 %). cuDNN's FP8 attention
(``"fp8"``) runs its forward 1.22 and its backward 1.05 times as fast as the bf16 kernel (``fp8_attention_fwd`` /
``_bwd``, NVIDIA's benchmark on a GB200). A fused kernel also waits on its softmax's exponentials, which run on the
special function units, not the tensor cores: Blackwell Ultra (B300, GB300) doubles their throughput
(``Accelerator.exp_rate`` = 2), so there it runs 1 / (1 − x + x/2) times as fast, x the exponentials' share of its
time (``attention_exp_fwd`` / ``_bwd`` and the FP8 kernel's ``attention_exp_fp8_fwd`` / ``_bwd``, from NVIDIA's paired
GB200 / GB300 benchmark; x shrinks as the head dimension, and with it the matmul work per score, grows).

Memory-bound kernels stream at ``memory`` × HBM peak (STREAM-like copies reach 85–93 % on A100/H100). Where a
kernel's math and traffic take about as long (the roofline's ridge point) it reaches neither roof: roofline.py takes
their p-norm, ``ridge`` = p measured on a lent H200's single decode GEMMs (benchmarks/measure/fit_ridge.py).

Collectives: NCCL bus bandwidth vs link peak, ``nvlink`` ≈ 0.80 (nccl-tests all_reduce_perf busbw of
~360–370 GB/s on an 8×H100 NVSwitch node without NVLS, of 450 GB/s per direction; ~230 GB/s of 300 on A100)
and ``network`` ≈ 0.90 (~45 GB/s on 400 Gb/s NDR, ~22–23 GB/s on 200 Gb/s HDR); latency α per step comes from
the presets (NCCL's tuning model), which is what makes small messages slow (comm.py, α + n/B).

Overlap: communication that runs concurrently with compute takes SMs (NCCL channels: 8–32 CTAs of ~132 SMs)
and HBM bandwidth from it, so the overlapped compute is slowed by ``overlap_slowdown`` × the overlapped
communication time (step/passes.py applies it wherever a collective is hidden): compute runs 18.9 % slower on average
(40 % at most) while communication overlaps it, measured in GPT and Llama training on A100, H100, MI250 and MI210
(Lee et al. 2025, "Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning",
arXiv 2507.03114). For scale, DeepSeek-V3 gives communication 20 of an H800's 132 SMs (15 %; arXiv 2412.19437
§3.5.1) and Calculon's H100 preset charges 15 % of the processor to NVLink communication.

Host-launched kernels (dropless MoE's per-expert path after its tokens-per-expert sync, flash-attn's varlen unpadding)
are priced at the stack's measured cost per kernel (HostCost.per_kernel; cost/mlp_moe.host_launched, roofline.op_time),
not here: until 2026-11-28 ``host_launch``, 40.5 us per expert GEMM fitted on the MoE runs, stood for a Transformer
Engine Linear's module cost per GEMM and the activation's uncounted launches (mlp_moe.TE_LINEAR, EXPERT_KERNELS).

Sustained clocks: a part capped below the power its datasheet peak is rated at runs slower. Dynamic power
∝ f·V² and V ∝ f near the top of the curve, so P ∝ f³ and f = (P_cap / P_rated)^(1/3) (check: H100 NVL,
400 W, is rated at 835 dense BF16 TFLOP/s vs the 700 W SXM5's 989: (400/700)^(1/3) = 0.83 vs 0.845).
The rated power is that of the part the MAMF was measured on (the preset's ``matmul_watts``), else the
accelerator's TDP (f = 1: a power-capped part states the power its MAMF was measured at). That is the draw of
a GEMM at the MAMF rate, which a training step's GEMMs are taken to draw too. Dynamic power is α·C·V²·f, with α
the switching activity, so a kernel whose tensor cores sustain only a fraction u of that rate draws about u of
it and is throttled only below u·P_rated: f = min(1, (P_cap / (u·P_rated))^(1/3)). roofline.py applies this to
flash attention, u = its efficiency as a fraction of the MAMF rate (0.26 for FlashAttention-2 on an H100,
0.52 for cuDNN), so a 500 W H100 throttles its GEMMs to 0.89 of the clock but not its attention.
The MAMF figures, and the rule for a GPU without one, are architectures.py's (``MATMUL``, ``matmul_rule``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import ClassVar

import numpy as np

from meshplan.specs.architectures import async_mma, matmul_rule
from meshplan.specs.gemm_shape import TILES, scalar_choice, tile_choice
from meshplan.xp import Num, minimum

# a flash-attention query tile's fixed cost in keys of its loop (Efficiency.attention_l0 / attention_l0_fa2)
ATTENTION_L0, ATTENTION_L0_FA2 = 543.0, 281.0


def exp_share(speedup: float) -> float:
    """The share x of a kernel's time spent on one unit whose throughput doubling sped it up ``speedup`` = s times:
    s = 1 / (1 - x/2), x = 2·(1 - 1/s)."""
    return 2 * (1 - 1 / speedup)


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """The constants of every efficiency factor (the module's docstring): two fitted, the rest documented (published
    or measured). (A docstring of its own: dataclasses otherwise writes one from ``inspect.signature``, a few ms of
    start-up.)"""

    # ---- fitted (benchmarks/measure/fit_efficiency.py, on the fit half of the published runs) ----------------------
    TILES: ClassVar[tuple[tuple[int, int], ...]] = TILES  # the GEMM kernels' output tiles (specs/gemm_shape.py)
    gemm: float = 0.8597  # a training step's GEMMs vs the best-shape benchmark (MAMF), quantization aside
    attention: float = 0.5260  # flash-attention forward at d = 128, long sequences, vs the bf16 GEMM ceiling (MAMF)
    # ---- documented, not fitted -------------------------------------------------------------------------
    overlap_slowdown: float = 0.189  # compute slowdown while communication overlaps it (Lee et al. 2025: 18.9 %)
    memory: float = 0.85  # streaming kernels vs HBM peak (STREAM-like copies: 85-93 % on A100 / H100)
    # the exponent of the p-norm that combines a kernel's math and HBM times near the ridge point (roofline.work_time):
    # measured on a lent H200's 945 single decode GEMMs (benchmarks/measure/fit_ridge.py), checked on an H100's
    ridge: float = 3.5
    gemm_k0: float = 64.0  # per-tile fixed cost, in units of reduction depth (one 64-deep k-block of CUTLASS)
    unaligned_gemm: float = 0.385  # leading dims not 16-byte multiples: specs/alignment.py
    unaligned_gemm_async: float = 0.170  # the same with asynchronous MMA: an H200's (specs/alignment.py)
    unaligned_wide_gain: float = 0.326 / 0.170  # 4- and 8-byte leading dims over odd ones: the H200's
    attention_bwd: float = 0.8  # backward / forward kernel rate (FA2 Fig. 4-5, FA3 Fig. 5-6)
    # head dimension at which the per-score softmax work equals the matmuls' (module docstring: FA3 Fig. 5, H100)
    attention_d0: float = 128 * (1 - 497 / 648) / (2 * 497 / 648 - 1)  # FlashAttention-3 / cuDNN class: 55.9
    attention_d0_fa2: float = 128 * (1 - 324 / 370) / (2 * 324 / 370 - 1)  # FlashAttention-2 class: 21.2
    attention_block: float = 128.0  # FlashAttention query/key block (FA2 and FA3 use 128 for d <= 128)
    # a query tile's fixed cost (prologue, epilogue) in keys of its loop, per kernel family:
    # benchmarks/measure/attention_l0.py fits it to NVIDIA's cuDNN SDPA training benchmark on a GB200 (cuDNN 9.17 and
    # PyTorch's FlashAttention-2, 4k-32k)
    attention_l0: float = ATTENTION_L0  # cuDNN / FlashAttention-3 class (rms residual 1.3 %)
    attention_l0_fa2: float = ATTENTION_L0_FA2  # FlashAttention-2 class (rms residual 0.4 %)
    # A FlashAttention-2-class kernel (``Stack.attention_kernel = "fa2"``: synchronous mma.sync tiles) on a GPU with
    # asynchronous warpgroup MMA (Hopper, Blackwell) runs at about half the rate of a kernel written for it: PyTorch
    # SDPA's FlashAttention-2 backend 329.5 TFLOP/s vs cuDNN 631.3 on an H100 (d = 128, 4608 keys without a mask,
    # forward, PyTorch nightly 2024-12-04, pytorch/pytorch#142132); FA3's Fig. 1 (Shah et al. 2024) shows the same
    # ratio at long sequences. The constant is that ratio at long sequences: the measured one over the two families'
    # tile factors at 4608 keys, (4608 + L0_fa2) / (4608 + L0) (``attention_l0`` / ``attention_l0_fa2`` above).
    # On Ampere FA2 is the native kernel (``attention_on_sync`` below).
    fa2_on_async: float = 329.483 / 631.338 * (4608 + ATTENTION_L0_FA2) / (4608 + ATTENTION_L0)
    # A GPU without asynchronous MMA (Ampere) runs its native attention kernel, FlashAttention-2 (synchronous mma.sync:
    # softmax and matmuls take turns), at a smaller share of its best GEMM rate than Hopper runs FlashAttention-3,
    # whose warp specialization overlaps them. Each paper's best forward as a share of the datasheet peak, over that
    # GPU's MAMF share (``architectures.MATMUL``): FA2 73 % of A100 peak (Dao 2023, abstract: "50-73% of the
    # theoretical maximum FLOPs/s on A100") / 86.9 %, against FA3 75 % of H100 peak (Shah et al. 2024, abstract:
    # "740 TFLOPs/s (75% utilization)") / 80.3 %: 0.840 / 0.934 = 0.90.
    attention_on_sync: float = (0.73 / 0.869) / (0.75 / 0.803)
    # cuDNN's FP8 attention (``Stack.attention_kernel = "fp8"``; Transformer Engine fp8_dot_product_attention) vs its
    # bf16 kernel on the same shapes: NVIDIA cudnn-frontend benchmark/sdpa_benchmark_training/artifacts/
    # sdpa_fp8_benchmark_results_NVIDIA_GB200.csv (commit d48a60eb, the run attention_l0.py fits; Llama-3.1-405B
    # heads, causal), geometric mean over 4k-32k keys of fp8 / bf16 TFLOP/s: forward 1663/1378, 1894/1583,
    # 2033/1673, 2124/1687 (1.22), backward 1088/1054, 1263/1211, 1373/1303, 1429/1311 (1.05: the backward keeps
    # dS and its GEMMs in 16 bits). Measured on a GB200 only; applied on every GPU with fp8 tensor cores.
    fp8_attention_fwd: float = (1663 / 1378 * 1894 / 1583 * 2033 / 1673 * 2124 / 1687) ** 0.25
    fp8_attention_bwd: float = (1088 / 1054 * 1263 / 1211 * 1373 / 1303 * 1429 / 1311) ** 0.25
    # The share of a fused attention kernel's time (cuDNN / FlashAttention-3 class) that waits on the softmax's
    # exponentials (MUFU.EX2 on the special function units) at head dimension 128, on a GPU of ``Accelerator.exp_rate``
    # 1. Blackwell Ultra doubles that unit's throughput over Blackwell (NVIDIA technical blog, "Making Softmax More
    # Efficient with NVIDIA Blackwell Ultra", 2026), so a kernel speeds up s = 1 / (1 - x/2) there and x = 2(1 - 1/s).
    # s from NVIDIA cudnn-frontend benchmark/sdpa_benchmark_training/results/llama3.1/gb200/llama3.1_20260724_040930.csv
    # and gb300/llama3.1_20260724_040919.csv (one cuDNN 9.26, the same day; Llama-3.1 heads: 64 query, 8 KV, d = 128,
    # causal), geometric mean over 4k-32k keys of GB300 / GB200 TFLOP/s: bf16 forward 1813/1407, 1991/1646, 2065/1728,
    # 2105/1569 (1.258: x = 0.41); backward 1254/1172, 1448/1344, 1516/1327, 1416/1202 (1.116: x = 0.21; five matmuls
    # per exponential instead of two); the FP8 kernel, whose faster matmuls leave the exponentials more of its time,
    # forward 2526/1781, 2893/2012, 3074/2112, 3134/2135 (1.445: x = 0.62), backward 1395/1178, 1777/1446, 2037/1633,
    # 2121/1670 (1.232: x = 0.38). Not fitted to training runs; checked on DeepSeek-V3's heads (d_qk = 192) by
    # benchmarks/measure/kernel_checks.py. These shares are those of cuDNN 9.26's kernels on a GB200: another cuDNN
    # release (or FlashAttention-4) balances matmuls and exponentials differently, and no second pair of measurements
    # was found.
    attention_exp_fwd: float = exp_share((1813 / 1407 * 1991 / 1646 * 2065 / 1728 * 2105 / 1569) ** 0.25)
    attention_exp_bwd: float = exp_share((1254 / 1172 * 1448 / 1344 * 1516 / 1327 * 1416 / 1202) ** 0.25)
    attention_exp_fp8_fwd: float = exp_share((2526 / 1781 * 2893 / 2012 * 3074 / 2112 * 3134 / 2135) ** 0.25)
    attention_exp_fp8_bwd: float = exp_share((1395 / 1178 * 1777 / 1446 * 2037 / 1633 * 2121 / 1670) ** 0.25)
    # mamba_ssm's Triton SSD kernels (Mamba-2's chunked scan: mamba.ssd_ops, ``variant="ssd"``) are bound by memory
    # latency, not by their math nor by HBM bandwidth: the forward's five kernels (``_mamba_chunk_scan_combined_fwd``)
    # on an H100, 128 heads of 64, state 128, one group, chunk 256, fp16, run at 1.2623e7 tokens/s at 8,192 tokens
    # (vLLM PR #27299, cyang49's table from RishiAstra's ssm_benchmark.py): 0.649 ms for the 830.5 MB of ssd_ops'
    # forward records, 1.28 TB/s, 38 % of the H100's 3.35 TB/s. A latency-bound kernel streams what its SMs keep in
    # flight per memory latency (Little's law), and DRAM latency hardly changes between GPU generations, so its rate
    # goes with the SM count, not the bandwidth: this is bytes per second per SM, 1.28 TB/s over the H100's 132 SMs.
    # The same rate gives the benchmark's 4,096- and 16,384-token rows within 5 %, and a pure Mamba-2 model's
    # measured GPU-to-GPU throughput ratios (state-spaces/mamba#904: H200 / A100 2.33, GB200 / H200 1.51) within
    # 3.1 and 10.4 %, where a bandwidth-bound rate is 13.7 and 31.2 % off (benchmarks/measure/kernel_checks.py).
    # Measured on an H100 only; capped at the streaming rate where a GPU has many SMs for its bandwidth
    # (roofline.memory_time). The four forward kernels' fixed time (the H100's gemm_overhead for the three chunk
    # products, its kernel_overhead for the state pass: roofline.overhead) is taken out of the measured 0.649 ms first
    # (1.8 % of it).
    ssd: float = 830.5e6 / (8192 / 1.262327e7 - (3 * 3.1e-6 + 2.4e-6)) / 132
    nvlink: float = 0.8  # NCCL bus bandwidth / NVLink peak (nccl-tests)
    network: float = 0.9  # NCCL bus bandwidth / NIC peak (nccl-tests over InfiniBand NDR/HDR)
    clock_exponent: float = 1 / 3  # P ∝ f³ (see the module docstring)
    # MXFP8 GEMMs (block-scaled: one E8M0 scale per 32 elements of each operand row / column, read and applied
    # inside the kernel) vs per-tensor-scaled FP8 on the same shapes: the 12 GEMMs per layer of a 24-layer 5B model
    # (15,872 tokens) take 171.9 ms in MXFP8 against 163.5 ms in FP8 current scaling, operands pre-quantized
    # (Transformer Engine docs, docs/examples/gemm_profiling/gemm_profiling.rst, B300).
    block_scaled: float = 163.5 / 171.9
    # NVFP4 GEMMs vs per-tensor FP8 on the same shapes: 90.3 ms against 163.5 ms (same tutorial, B300), 1.81x the FP8
    # rate where the FP4 peak is 3x (``nvfp4_peaks``, b300.toml 13.5 / 4.5); elsewhere by Amdahl (``nvfp4_speedup``).
    # B200 (1.51x): TensorRT-LLM's CUTLASS NVFP4 GEMM (flashinfer-ai/flashinfer#1979) 3,370 TFLOP/s at 1,024 x 7,168 x
    # 4,608 (1.51x: 3,590, 1.81x: 4,160); vLLM CUTLASS NVFP4 / FP8, 16,384 x 6,144 x 4,096 (vllm#20646, #19566) 1.53x
    nvfp4_gemm: float = 163.493 / 90.337
    nvfp4_peaks: float = 13.5 / 4.5  # b300.toml's dense FP4 / FP8 peaks (tests/test_low_precision.py holds them equal)
    # Quantizing to a block-scaled format (MXFP8, NVFP4: an amax and a scale per block, row-wise and column-wise)
    # takes this many times as long per byte as a per-tensor cast. Same tutorial, B300, autocast minus
    # pre-quantized GEMM time for the 24-layer model: MXFP8 215.6 - 171.9 = 43.7 ms, FP8 delayed scaling
    # 187.2 - 163.5 = 23.7 ms, 1.84x, for casts that casts.quantize_bytes charges 1.016x the bytes (read 2, write two
    # copies of 1 + 1/32 against 1). Assumed: the benchmark writes the same copies for both recipes (if per-tensor
    # FP8 wrote one copy on Blackwell and MXFP8 two, the slowdown per byte would be about 1.4). Applied to NVFP4 as
    # well: its 154.9 - 90.3 = 64.5 ms, over 1.3-1.5x the bytes of the delayed casts, gives 1.8-2.1
    block_scaled_cast: float = (215.608 - 171.869) / (187.246 - 163.493) / ((2 + 2 * (1 + 1 / 32)) / (2 + 2 * 1))

    # ---- GEMMs ----------------------------------------------------------------------------------------------
    def mamf(self, accelerator: object, precision: str) -> float:
        """Best-shape GEMM efficiency of this accelerator at this precision: the preset's ``matmul_bf16`` /
        ``matmul_fp8``, else ``matmul_rule`` by its architecture and peak; block-scaled formats times
        ``format_rate``."""
        low = precision in ("fp8", "mxfp8", "fp4")
        scaled = self.format_rate(accelerator, precision)
        given = float(getattr(accelerator, "matmul_fp8" if low else "matmul_bf16", 0.0) or 0.0)
        if given > 0:
            return given * scaled
        peaks = getattr(accelerator, "peak_flops", {}) or {}
        half = float(getattr(accelerator, "half_flops", 0.0))
        peak = float(peaks.get("fp8") or 2 * half) if low else half
        return _rule(str(getattr(accelerator, "architecture", "") or ""), peak, low) * scaled

    def format_rate(self, accelerator: object, precision: str) -> float:
        """A block-scaled format's GEMM rate as a fraction of (its peak × the FP8 MAMF): MXFP8 ``block_scaled``;
        NVFP4 ``nvfp4_speedup`` of the part's FP4 / FP8 peak ratio × the FP8 rate, as a fraction of the FP4 peak;
        1 for the rest."""
        if precision == "mxfp8":
            return self.block_scaled
        peaks = getattr(accelerator, "peak_flops", {}) or {}
        if precision == "fp4" and peaks.get("fp4") and peaks.get("fp8"):
            return self.nvfp4_speedup(peaks["fp4"] / peaks["fp8"]) * peaks["fp8"] / peaks["fp4"]  # never above 1
        return 1.0

    def nvfp4_speedup(self, ratio: float) -> float:
        """An NVFP4 GEMM's rate over the FP8 one's where the FP4 peak is r = ``ratio`` × the FP8 peak: the FP4 tensor
        cores shorten only their share a of the time (the rest: scale-factor loads, the epilogue, the pipeline's fill),
        1 / (1 − a + a/r), a = (1 − 1/1.81) / (1 − 1/3) = 0.67 from ``nvfp4_gemm`` at ``nvfp4_peaks``."""
        share = (1 - 1 / self.nvfp4_gemm) / (1 - 1 / self.nvfp4_peaks)
        return 1 / (1 - share + share / ratio)

    def gemm_efficiency(self, m: Num, n: Num, k: Num, num_sms: int = 132, groups: Num = 1.0) -> Num:
        """Shape efficiency of an (m×k)·(k×n) GEMM on ``num_sms`` SMs: ``gemm`` × quantization × depth, the kernel
        among ``TILES`` that wastes least, split over k where the output has fewer tiles than SMs (specs/gemm_shape.py).
        Multiply by ``mamf`` and ``clock`` for the fraction of the datasheet peak. ``groups`` such GEMMs run
        as one grouped GEMM: each pads its own tiles, and the tiles of all of them fill the waves together."""
        m, n, k, groups = _plain(m), _plain(n), _plain(k), _plain(groups)
        if (type(m) in _SCALAR and type(n) in _SCALAR and type(k) in _SCALAR
                and type(groups) in _SCALAR):  # one plan: plain floats, fast (the memo hashes them)
            value, depth, _ = scalar_choice(m, n, k, num_sms, groups, self.TILES, self.gemm_k0)  # type: ignore[arg-type]
            return self.gemm * min(value, 1.0) * depth / (depth + self.gemm_k0)
        best, slices, _ = tile_choice(m, n, k, num_sms, groups, self.TILES, self.gemm_k0)
        out = self.gemm * np.minimum(best, 1.0) * slices / (slices + self.gemm_k0)
        return float(out) if out.ndim == 0 else out

    def split_k_reductions(self, m: Num, n: Num, k: Num, num_sms: int = 132, groups: Num = 1.0) -> Num:
        """1 where the GEMM's kernel splits k (its partial sums then reduced by a kernel of their own:
        roofline.overhead prices its fixed time), else 0."""
        m, n, k, groups = _plain(m), _plain(n), _plain(k), _plain(groups)
        if type(m) in _SCALAR and type(n) in _SCALAR and type(k) in _SCALAR and type(groups) in _SCALAR:
            return float(scalar_choice(m, n, k, num_sms, groups, self.TILES, self.gemm_k0)[2] > 1.0)  # type: ignore[arg-type]
        out = (tile_choice(m, n, k, num_sms, groups, self.TILES, self.gemm_k0)[2] > 1.0).astype(float)
        return float(out) if out.ndim == 0 else out

    # ---- attention ------------------------------------------------------------------------------------------
    def attention_efficiency(self, head_dim: Num, keys: Num, backward: bool = False, causal: bool = True,
                             kernel: str = "fused", calls: Num = 1.0, window: Num = 0.0) -> Num:
        """Fraction of the 16-bit GEMM ceiling (MAMF × clock, not the datasheet peak) a flash-attention kernel
        sustains on its useful FLOPs (``kernel``: the ``Stack.attention_kernel`` family, which sets the head-dimension
        falloff and the tile's fixed cost; FP8 kernels are cuDNN's at ``fp8_attention_fwd`` / ``_bwd`` times its
        rate), when the work over ``keys`` keys runs as ``calls`` kernels over keys / calls each (ring context
        parallelism); roofline.py multiplies it by ``attention_kernel_factor`` and the 16-bit GEMM rate.

        ``window`` (< keys) is a causal sliding window. A query tile takes a + e + L_0 keys' time for the a it needs
        (module docstring)."""
        fa2 = kernel == "fa2"
        d0, l0 = (self.attention_d0_fa2, self.attention_l0_fa2) if fa2 else (self.attention_d0, self.attention_l0)
        shape = (1 + d0 / 128.0) * head_dim / (head_dim + d0)  # 1 at d = 128
        if causal and window:  # the band: a = w − w(w − 1)/2s keys a query sees, both edges cut
            useful, wasted = window - window * (window - 1) / (2.0 * keys), self.attention_block
        elif causal:  # the causal half, the diagonal blocks cut
            useful, wasted = keys / 2, self.attention_block / 2
        else:
            useful, wasted = keys, 0.0
        rate = self.attention * shape * useful / (useful + wasted + calls * l0) * (
            self.attention_bwd if backward else 1.0)
        if kernel == "fp8":
            return rate * (self.fp8_attention_bwd if backward else self.fp8_attention_fwd)
        return rate

    # ---- links and clocks -----------------------------------------------------------------------------------
    def link(self, tier: int) -> float:
        """NCCL bus bandwidth / link bandwidth of mesh tier ``tier`` (its index): tier 0 is the scale-up domain
        (NVLink), every tier beyond it a scale-out network (NICs and switches), whatever the tiers are named."""
        if isinstance(tier, str):  # it took a tier's name until N-tier meshes, whose names are the user's
            raise TypeError(f"Efficiency.link takes the tier's index (0: NVLink), not its name {tier!r}")
        return self.nvlink if tier == 0 else self.network

    def clock(self, accelerator: object, load: Num = 1.0) -> Num:
        """Sustained tensor clock / the clock of the measured part: (P_cap / (load·P_rated))^(1/3), at most 1. The
        rated power is the preset's ``matmul_watts``; a GPU that does not state it runs at its datasheet clock (its
        MAMF, measured or from ``matmul_rule``, already holds its own power limit)."""
        tdp = float(getattr(accelerator, "tdp_watts", 0.0) or 0.0)
        rated = float(getattr(accelerator, "matmul_watts", 0.0) or 0.0)
        if tdp <= 0 or rated <= 0:
            return 1.0
        if type(load) in _SCALAR:
            return min(1.0, (tdp / (rated * load)) ** self.clock_exponent)
        return minimum(1.0, (tdp / (rated * load)) ** self.clock_exponent)

    def exp_factor(self, accelerator: object, head_dim: Num, backward: bool = False, kernel: str = "fused") -> Num:
        """Rate of a fused attention kernel on a GPU whose exponentials run ``Accelerator.exp_rate`` = r times as fast
        as on the GPUs the other attention constants describe: 1 / (1 - x + x/r), with x the exponentials' share of
        the kernel's time (``attention_exp_*``) at d = 128, moved to head dimension d as if the non-exponential
        time per score grew with d while the exponentials per score do not: x_d = 128·x / (128·x + (1 - x)·d), d the
        query-key head dimension (d_qk; for MLA's d_qk = 192, d_v = 128 this matched NVIDIA's measured GB300 speed-ups
        better than the mean of d_qk and d_v, benchmarks/measure/kernel_checks.py). 1 for
        FlashAttention-2-class kernels, which do not wait on them (PyTorch's FlashAttention-2 backend runs at the
        same rate on a GB300 as on a GB200: 411 against 414 TFLOP/s at 8k keys, 440 against 438 at 32k, cudnn-frontend
        artifacts/sdpa_bf16_benchmark_results_NVIDIA_GB300.csv and ``_GB200.csv``)."""
        r = float(getattr(accelerator, "exp_rate", 1.0) or 1.0)
        if r == 1.0 or kernel == "fa2":
            return 1.0
        shares = {(False, False): self.attention_exp_fwd, (False, True): self.attention_exp_bwd,
                  (True, False): self.attention_exp_fp8_fwd, (True, True): self.attention_exp_fp8_bwd}
        x: Num = shares[(kernel == "fp8", backward)]
        x = 128.0 * x / (128.0 * x + (1 - x) * head_dim)
        return 1 / (1 - x + x / r)

    def attention_kernel_factor(self, accelerator: object, kernel: str = "fused") -> float:
        """Rate of the stack's attention kernel family (``Stack.attention_kernel``) on this GPU, relative to the
        ``attention`` rate: FlashAttention-2 on Hopper or Blackwell ``fa2_on_async``; on a GPU without asynchronous
        MMA (Ampere; measured there, applied to Ada and Volta alike), where FlashAttention-2-class kernels are the
        native ones, ``attention_on_sync`` for every family."""
        if not async_mma(accelerator):
            return self.attention_on_sync
        return self.fa2_on_async if kernel == "fa2" else 1.0

    def with_(self, **changes: float) -> Efficiency:
        return replace(self, **changes)


_SCALAR = (int, float)


def _plain(x: Num) -> Num:
    """A finite NumPy float64 as a plain float (the memoised scalar kernel choice, the same numbers as the array
    path's: tests/test_gemm_shape.py); anything else as it is."""
    return float(x) if type(x) is np.float64 and np.isfinite(x) else x


@lru_cache(maxsize=256)
def _rule(architecture: str, peak: float, low: bool) -> float:
    return matmul_rule(architecture, peak, low)


DEFAULT = Efficiency()
FITTED = ("gemm", "attention")  # the constants benchmarks/measure/fit_efficiency.py fits; the rest are measured
