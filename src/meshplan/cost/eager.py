"""Eager PyTorch (``stack.fusion = "eager"``) and PyTorch's cross-entropy (``stack.cross_entropy = "pytorch"``):
the extra traffic of the unfused aten op sequences, counted kernel by kernel in ``EAGER``, what they add to one layer
(``eager_layer``), and the kernels each record of an eager layer launches, counted by PyTorch itself
(``EAGER_KERNELS``, ``eager_kernel_counts``); Megatron-LM's module code with its own fusions (``stack.fusion =
"jit"``) launches the measured Megatron layer less what those fusions merge (``jit_rows``)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.records import Dims, OpCost
from meshplan.cost.shapes import fc1_width, qkv_width
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, floor_div, where

# Bytes per element that each unfused aten kernel reads (r) and writes (w), bf16 = 2, fp32 = 4, in the order
# eager autograd runs them. A fused stack (Megatron / Transformer Engine kernels, torch.compile) does the same
# math in the passes the other cost modules already count; eager PyTorch pays these on top.
EAGER: dict[str, dict[str, tuple[tuple[str, int, int], ...]]] = {
    # RMSNorm as torchtitan (models/norms.py) and HF LlamaRMSNorm write it, less the fused norm counted in norm():
    # (x.float() * rsqrt(x.float().pow(2).mean(-1) + eps)).type_as(x) * weight; per-row scalars neglected
    "rmsnorm": {
        "fwd": (("to fp32", 2, 4), ("pow", 4, 4), ("mean", 4, 0), ("mul rsqrt", 4, 4), ("type_as", 4, 2),
                ("mul weight", 2, 2), ("fused norm", -2, -2)),
        # mul weight: dx = g·w and dw = Σ g·x̂ (product, then the reduction); type_as; mul rsqrt: dx = g·r and
        # dr = Σ g·x; mean: expand; pow_backward = g · 2 · x.pow(1) (three kernels); the two paths to x added;
        # the fp32 upcast's backward
        "bwd_x": (("mul weight dx", 2, 2), ("mul weight dw", 4, 2), ("sum dw", 2, 0), ("type_as", 2, 4),
                  ("mul rsqrt dx", 4, 4), ("mul rsqrt dr", 8, 4), ("sum dr", 4, 0), ("mean expand", 0, 4),
                  ("pow(x, 1)", 4, 4), ("mul 2", 4, 4), ("mul g", 8, 4), ("add paths", 8, 4), ("to bf16", 4, 2),
                  ("fused norm", -4, -2)),
    },
    # F.layer_norm is one native kernel each way in eager mode too: nothing extra
    "layernorm": {"fwd": (), "bwd_x": ()},
    # rotary embedding as torchtitan's apply_rotary_emb (complex multiply on fp32 views), per element of q and k
    "rope": {"fwd": (("to fp32", 2, 4), ("complex mul", 4, 4), ("type_as", 4, 2)),
             "bwd_x": (("to fp32", 2, 4), ("complex mul", 4, 4), ("to bf16", 4, 2))},
    # flash-attn's rotary kernel (csrc/rotary apply_rotary, InternEvo's ApplyRotaryEmbQKV_ @c628a8c87411) in place on
    # q's and k's two halves, per element each way: read, write (its [s, d/2] cos and sin neglected)
    "rope_flash": {"fwd": (("apply_rotary", 2, 2),), "bwd_x": (("apply_rotary", 2, 2),)},
    # a library norm run on x.float() of a 16-bit x (InternEvo's norm1(_residual.float())), per element beyond the
    # norm counted in norm(): the upcast, the norm's read of fp32 (both ways) and its fp32 input gradient, whose cast
    # back to 16 bits is the upcast's backward
    "norm_upcast": {"fwd": (("to fp32", 2, 4), ("norm reads fp32", 2, 0)),
                    "bwd_x": (("norm reads fp32", 2, 0), ("norm writes fp32", 0, 2), ("to bf16", 4, 2))},
    # Megatron-Core's unfused RoPE (rope_utils._apply_rotary_pos_emb_bshd @ core_v0.16.1), per element of q or k in
    # bf16: t * cos, rotate_half's neg of one half and its cat, * sin, the add, the cat with the empty unrotated
    # part; backward the two products' gradients, the neg's, the chunk's (a cat), the two paths to t added and the
    # full-width slice's (zeros, then the copy into it). Its cos and sin of the [s, d] angles are neglected.
    "rope_megatron": {"fwd": (("mul cos", 2, 2), ("neg half", 1, 1), ("cat rotated", 2, 2), ("mul sin", 2, 2),
                              ("add", 4, 2), ("cat pass", 2, 2)),
                      "bwd_x": (("mul sin", 2, 2), ("neg half", 1, 1), ("cat chunks", 2, 2), ("mul cos", 2, 2),
                                ("add paths", 4, 2), ("slice zeros", 0, 2), ("slice copy", 2, 2))},
    # SwiGLU: silu(gate) * up as two kernels, per element of the FFN width, beyond the one fused kernel counted
    # in mlp_gemms (fwd r 4 w 2, bwd r 8 w 2): silu (r 2 w 2) + mul (r 4 w 2); backward two muls and silu's
    "swiglu": {"fwd": (("silu", 2, 2), ("mul", 4, 2), ("fused act", -4, -2)),
               "bwd_x": (("mul dgate", 4, 2), ("mul dup", 4, 2), ("silu backward", 4, 2), ("fused act", -8, -2))},
    "gelu": {"fwd": (), "bwd_x": ()},  # one kernel each way, as counted in mlp_gemms
    # squared ReLU (Nemotron-H): relu then square, two kernels where mlp_gemms counts one fused act (fwd r 2 w 2, bwd
    # r 4 w 2): HF transformers' ReLUSquaredActivation is relu(x) then torch.square, which aten runs as pow(x, 2)
    # (UnaryOps.cpp); backward pow_backward = g * (2 * x.pow(1)) (FunctionsManual.cpp: three kernels, as in rmsnorm
    # above) and relu's threshold_backward(g, result)
    "relu2": {"fwd": (("relu", 2, 2), ("square", 2, 2), ("fused act", -2, -2)),
              "bwd_x": (("pow(x, 1)", 2, 2), ("mul 2", 2, 2), ("mul g", 4, 2), ("threshold_backward", 4, 2),
                        ("fused act", -4, -2))},
    # a linear's bias gradient: autograd of addmm reduces the output gradient in a kernel of its own
    "bias": {"fwd": (), "bwd_w": (("sum", 2, 0),)},
    # GQA's repeat_kv (torchtitan, HF): K and V copied to every query head (expand + reshape), per element of
    # the copy (the read of the n_rep times smaller source neglected); its backward sums the copies back
    "repeat_kv": {"fwd": (("copy", 0, 2),), "bwd_x": (("sum", 2, 0),)},
    # F.cross_entropy(logits.float()) beyond the fused loss counted in head_ops (fwd r 2 w 8, bwd r 4 w 2), per
    # logit: the upcast; log_softmax reads a row too long for shared memory three times (max, Σexp, write:
    # cunn_SoftMaxForward); backward: nll_loss_backward's zero fill, log_softmax_backward (Σ grad, then r grad
    # and out, w), the upcast's backward
    "cross_entropy": {"fwd": (("to fp32", 2, 4), ("log_softmax", 12, 4), ("fused loss", -2, -8)),
                      "bwd_x": (("zero fill", 0, 4), ("log_softmax backward", 12, 4), ("to bf16", 4, 2),
                                ("fused loss", -4, -2))},
}


def eager_bytes(kind: str, phase: str) -> int:
    """Extra HBM bytes per element of an eager op sequence in one pass (``EAGER``)."""
    return sum(r + w for _, r, w in EAGER[kind].get(phase, ()))


def eager_kernels(kind: str, phase: str) -> int:
    """Extra kernels an eager op sequence launches in one pass (``EAGER``): its aten kernels less the fused kernel
    its base record already counts (the "fused ..." rows, negative bytes)."""
    rows = EAGER[kind].get(phase, ())
    return sum(1 for _, r, w in rows if r >= 0 and w >= 0) - sum(1 for _, r, w in rows if r < 0 or w < 0)


def eager_op(name: str, kind: str, elems: Num, tensors: int = 1) -> list[OpCost]:
    """The extra memory-bound traffic of ``EAGER[kind]`` over ``elems`` elements of ``tensors`` tensors, one record
    per pass, standing for its extra kernels (``eager_kernels``; each sequence once per tensor)."""
    return [OpCost(f"{name}/eager", phase, "memory", 0.0, per_elem * elems,
                   kernels=tensors * max(1, eager_kernels(kind, phase)))
            for phase in ("fwd", "bwd_x", "bwd_w") if (per_elem := eager_bytes(kind, phase))]


def eager_norm(name: str, model: ModelSpec, elems: Num, stack: Stack) -> list[OpCost]:
    """An eager stack's norm over ``elems`` elements as its aten ops (``EAGER[model.norm]``), or nothing beyond the
    fused norm already counted where the stack's norms are a library's kernel (``Fusion.library_norm``: Transformer
    Engine's RMSNorm module, one kernel each way)."""
    return [] if stack.fusion_mode.library_norm else eager_op(name, model.norm, elems)


def eager_layer(model: ModelSpec, plan: Plan, d: Dims, moe: bool = False) -> list[OpCost]:
    """What eager PyTorch adds to one layer: decomposed norms, rotary embedding, GQA copies, two-kernel SwiGLU,
    bias gradients (``EAGER``). MoE experts are run by fused grouped kernels in every stack modelled here."""
    if not d.eager:
        return []
    h, t, T = model.hidden_size, d.tp, d.tokens
    heads, kv_heads = model.num_heads / t, model.num_kv_heads / t
    ops = eager_norm("attn/norm", model, d.tokens_sp * h, d.stack) + eager_norm("mlp/norm", model, d.tokens_sp * h,
                                                                               d.stack)
    if d.stack.fusion_mode.norm_upcast:  # the two norms' fp32 upcasts (EAGER["norm_upcast"])
        ops += eager_op("attn/norm/upcast", "norm_upcast", d.tokens_sp * h) + eager_op(
            "mlp/norm/upcast", "norm_upcast", d.tokens_sp * h)
    if model.position_embedding == "rope" and not model.is_mla:  # its RoPE's row (Fusion.rope): q and k
        ops += eager_op("attn/rope", d.stack.fusion_mode.rope, T * (heads + kv_heads) * model.head_dim)
    if model.num_kv_heads < model.num_heads and not model.is_mla:
        ops += eager_op("attn/repeat_kv", "repeat_kv", 2 * T * heads * model.head_dim)
    if model.qkv_bias and not model.is_mla:  # the bias of the fused projection's whole output
        ops += eager_op("attn/qkv_bias", "bias", T * qkv_width(model, t))
    if model.linear_bias:  # a row-parallel linear adds its bias after the reduction: on the Tsp rows a GPU keeps
        ops += eager_op("attn/out_bias", "bias", d.tokens_sp * h)
    if not moe:
        ops += eager_op("mlp/act", model.mlp, T * model.ffn_hidden_size / t)
        if model.linear_bias:
            width_in = fc1_width(model, model.ffn_hidden_size)
            # one reduction per bias vector: fc2's, and fc1's (gate and up apart when their linears are separate)
            biases = 1 + (2 if model.gated and d.stack.projection_mode.separate else 1)
            ops += eager_op("mlp/bias", "bias", T * width_in / t + d.tokens_sp * h, biases)
    return ops


# Kernels (forward, input gradient, weight gradient, gradient accumulation) that each record of an eager layer
# launches on a GPU, counted by benchmarks/measure/eager_kernels.py with PyTorch 2.13's TorchDispatchMode over reference
# layers in bf16 (tests/test_eager_kernels.py recounts them): one per aten op that reaches the dispatcher, less views
# and allocations, plus the kernels beyond the first of the few aten ops that launch several on a GPU (its CUDA_EXTRA,
# from the kernel names torch.profiler recorded on an H200, data/measured/gpu/2026-11-26-nvidia-h200-kernel-names.json):
# LayerNorm's backward 2 (the input gradient; GammaBetaBackward, the weight and bias gradients' reduction), softmax's
# backward 2 (SoftMax.cu's grad * output, then the softmax kernel), SDPA's flash backward 3 (dot(o, do), the main
# kernel, the fp32 dq's cast). The layers: "gpt", Megatron-Core 0.16.1's GPT layer with the local spec, fusions off
# (the module code measured on the H200: matmul then ``+ bias`` in the QKV linear, baddbmm, the softmax in fp32 between
# two casts with an in-place masked_fill_, dropout, bmm, the context made contiguous, bias-dropout-add, bias-GeLU);
# "gpt-no-dropout", the same at dropout 0 (no kernel: ATen's dropout returns its input); "sdpa", the plain-PyTorch GPT
# layer measured beside it (nn.Linear with bias, its QKV unbound into SDPA: backward the flash kernel's 3, the stack of
# the q, k, v gradients and the copy of that stack back into the projection's layout); "llama", torchtitan's Llama
# layer (models/llama/model.py: eager RMSNorm, separate wq / wk / wv, complex-multiply RoPE, repeat_kv, SDPA, wo,
# SwiGLU). Per layer these are what the H200 ran (data/measured/gpu/*small-work*.json): "gpt-no-dropout" 20 forward,
# 21 + 10 + 12 = 43 backward; "sdpa" 10 and 14 + 10 + 12 = 36. A bias gradient (its sum) is the record that adds the
# bias (the bias-dropout-add, the bias-GeLU; the linear in "sdpa"); the residual fork's gradient sum is the residual's.
# Accumulation: one add per parameter into the gradient of the former micro-batches (AccumulateGrad; Megatron's
# main_grad hooks add the same one kernel every micro-batch), paid where the gradients stay whole on the GPU (no FSDP:
# FSDP reduce-scatters each micro-batch's gradient and accumulates the shard, cost/fsdp.py).
EAGER_KERNELS: dict[str, dict[str, tuple[int, int, int, int]]] = {
    "gpt": {"attn/core": (8, 13, 0, 0), "attn/norm": (1, 1, 1, 2), "attn/out": (1, 1, 1, 1), "attn/qkv": (2, 1, 2, 2),
            "attn/residual": (3, 2, 1, 1), "mlp/act": (2, 1, 1, 1), "mlp/fc1": (1, 1, 1, 1), "mlp/fc2": (1, 1, 1, 1),
            "mlp/norm": (1, 1, 1, 2), "mlp/residual": (3, 2, 1, 1)},
    "gpt-no-dropout": {"attn/core": (7, 12, 0, 0), "attn/norm": (1, 1, 1, 2), "attn/out": (1, 1, 1, 1),
                       "attn/qkv": (2, 1, 2, 2), "attn/residual": (2, 1, 1, 1), "mlp/act": (2, 1, 1, 1),
                       "mlp/fc1": (1, 1, 1, 1), "mlp/fc2": (1, 1, 1, 1), "mlp/norm": (1, 1, 1, 2),
                       "mlp/residual": (2, 1, 1, 1)},
    "sdpa": {"attn/core": (1, 5, 0, 0), "attn/norm": (1, 1, 1, 2), "attn/out": (1, 1, 2, 2), "attn/qkv": (1, 1, 2, 2),
             "attn/residual": (1, 1, 0, 0), "mlp/act": (1, 1, 0, 0), "mlp/fc1": (1, 1, 2, 2), "mlp/fc2": (1, 1, 2, 2),
             "mlp/norm": (1, 1, 1, 2), "mlp/residual": (1, 1, 0, 0)},
    "llama": {"attn/core": (1, 3, 0, 0), "attn/norm": (8, 15, 1, 1), "attn/out": (1, 1, 1, 1), "attn/qkv": (3, 5, 3, 3),
              "attn/repeat_kv": (2, 2, 0, 0), "attn/residual": (1, 1, 0, 0), "attn/rope": (6, 8, 0, 0),
              "mlp/act": (2, 3, 0, 0), "mlp/fc1": (2, 3, 2, 2), "mlp/fc2": (1, 1, 1, 1), "mlp/norm": (8, 15, 1, 1),
              "mlp/residual": (1, 1, 0, 0)},
}
# Megatron-LM's module code of 2020-22 (``stack.fusion = "jit"``; megatron/model/transformer.py, which
# Megatron-DeepSpeed and GPT-NeoX carry) is the "gpt" layer's code with its default fusions on (megatron/arguments.py:
# masked_softmax_fusion, bias_gelu_fusion, bias_dropout_fusion; NVIDIA/Megatron-LM 453414dac8, 2021-06-30), each kernel
# still issued from eager PyTorch. Per row, what they change in the measured count (forward, input gradient, weight
# gradient, accumulation): the scale-mask-softmax kernel (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h:
# one kernel each way) for the fp32 casts, masked_fill_ and softmax (forward 4 -> 1; backward the casts' 2 and
# masked_fill's and softmax's 2 -> 1: masked_fill's clone is a device copy, no kernel counted), where the kernel runs:
# keys up to JIT_SOFTMAX_MAX_SEQ (fused_softmax.py's custom_kernel_constraint, 16 < sk <= 2048 at 453414dac8;
# Megatron-DeepSpeed f4157bea allows 4096) and a micro-batch whose b·heads per rank the kernel's blocks divide
# (``fused_softmax_runs``);
# TorchScript's bias_gelu (fused_bias_gelu.py, under the legacy fuser that transformer.py selects, or nvFuser below
# PyTorch 2.2: Megatron-DeepSpeed's initialize.py; newer PyTorch runs these functions unfused, fusion "eager" then) for
# the bias add and GeLU (forward 2 -> 1; backward bias_gelu_back's one kernel and the bias's sum, as measured);
# bias_dropout_add_fused_train for the bias add, dropout and residual add (forward -> 1; backward as measured: dropout's
# mask product, the residual fork's sum, the bias's sum), which draws its mask at dropout 0 too (the scripted function
# calls native_dropout, which unlike eager dropout does not return its input at p = 0: the dropout rows of the residuals
# stand at any dropout); Megatron's LayerNorm (fused_layer_norm.py, layer_norm_cuda_kernel.cu: cuApplyLayerNorm forward;
# backward cuComputeGradInput, cuComputePartGradGammaBeta and cuComputeGradGammaBeta, one weight-gradient kernel more
# than ATen's; apex's persistent FastLayerNorm, which later releases pick for some widths, launches 2). The accumulation
# stays one add per parameter and micro-batch, as the measured rows count it (a first micro-batch after
# zero_grad(set_to_none=True) launches none: not modelled). Per layer 59 kernels with dropout (15 forward, 20 + 12 + 12
# backward), 57 without.
JIT_DELTA: dict[str, tuple[int, int, int, int]] = {"attn/core": (-3, -4, 0, 0), "mlp/act": (-1, 0, 0, 0),
                                                   "attn/norm": (0, 0, 1, 0), "mlp/norm": (0, 0, 1, 0)}
JIT_ONE_FORWARD = ("attn/residual", "mlp/residual")  # bias-dropout-add: one fused kernel forward
JIT_SOFTMAX_MAX_SEQ = 2048  # the longest key sequence Megatron-LM's fused softmax kernel takes (comment above)


SOFTMAX_THREADS = 128  # threads per block of the scale-mask-softmax kernels (scaled_masked_softmax.h)
WARP = 32


def softmax_batch_per_block(keys: int) -> int:
    """Rows of b·heads one block of Megatron's scale-mask-softmax kernel takes: get_batch_per_block of
    megatron/fused_kernels/scaled_masked_softmax.h (microsoft/Megatron-DeepSpeed 4822c87e; NVIDIA/Megatron-LM alike):
    the keys' next power of two p, a warp of min(p, 32) threads, 2 rows a warp for p <= 128 else 1, 128 threads a
    block: 4 rows at 1,024 keys, 8 at 128."""
    p = 1 << max(0, int(keys - 1).bit_length())
    return (SOFTMAX_THREADS // min(p, WARP)) * (2 if p <= 128 else 1)


def fused_softmax_runs(model: ModelSpec, micro_batch: Num, tp: Num) -> Num:
    """1 where Megatron's FusedScaleMaskSoftmax runs its kernel for a micro-batch of ``micro_batch`` sequences over
    ``tp`` ranks, 0 where it falls back to forward_torch_softmax: is_kernel_available of megatron/model/
    fused_softmax.py (Megatron-DeepSpeed 4822c87e, as Megatron-LM 453414dac8) takes 16 < sk <= JIT_SOFTMAX_MAX_SEQ,
    sq and sk multiples of 4, b·np a multiple of 4 (np the heads per rank) and, under a causal mask, of the kernel's
    rows per block (``softmax_batch_per_block``; a padding mask needs sq a multiple of it). At 16 heads over tp 8
    and micro-batch 1, b·np = 2: the torch path."""
    s = model.seq_length
    if not (16 < s <= JIT_SOFTMAX_MAX_SEQ and s % 4 == 0):
        return 0
    rows = softmax_batch_per_block(s)
    batches = micro_batch * floor_div(model.num_heads, tp)
    if model.causal:
        return 1 * ((batches % 4 == 0) & (batches % rows == 0))
    return 1 * ((batches % 4 == 0) & (s % rows == 0))


def softmax_unfused(model: ModelSpec, stack: Stack, micro_batch: Num, tp: Num) -> Num:
    """1 where Megatron's unfused attention runs its softmax as eager PyTorch ops (``torch_softmax``, or under "jit"
    where its kernel does not take the micro-batch: ``fused_softmax_runs``), else 0."""
    if torch_softmax(model, stack):
        return 1
    if not stack.fusion_mode.jit or stack.flash_attention or stack.compiled or model.norm != "layernorm":
        return 0
    return 1 - fused_softmax_runs(model, micro_batch, tp)


def torch_softmax(model: ModelSpec, stack: Stack) -> bool:
    """Whether Megatron's unfused attention runs its softmax as eager PyTorch ops (FusedScaleMaskSoftmax's
    forward_torch_softmax with softmax_in_fp32: a cast to fp32, masked_fill_, softmax, a cast back) instead of its
    scale-mask-softmax kernel: the "gpt" rows' module code (a LayerNorm model, no flash kernel, not compiled) under
    fusion "eager", and under "jit" past the kernel's JIT_SOFTMAX_MAX_SEQ keys, as ``eager_layer`` counts its
    kernels (cost/attention.unfused_score_traffic prices its bytes)."""
    if stack.flash_attention or stack.compiled or model.norm != "layernorm":
        return False
    return stack.fusion_mode.per_op or (stack.fusion_mode.jit and model.seq_length > JIT_SOFTMAX_MAX_SEQ)


def jit_rows(model: ModelSpec, fused: bool = True) -> dict[str, tuple[int, int, int, int]]:
    """The "gpt" rows of ``EAGER_KERNELS`` as Megatron-LM's fused module code launches them for ``model``
    (``JIT_DELTA``; the residuals' dropout rows at any dropout; the softmax unfused beyond JIT_SOFTMAX_MAX_SEQ, or
    where ``fused`` is false: a micro-batch its kernel does not take)."""
    rows = EAGER_KERNELS["gpt" if model.dropout else "gpt-no-dropout"]
    rows = {**rows, **{r: EAGER_KERNELS["gpt"][r] for r in JIT_ONE_FORWARD}}
    fused_softmax = fused and model.seq_length <= JIT_SOFTMAX_MAX_SEQ
    out = {}
    for r, counts in rows.items():
        delta = JIT_DELTA.get(r, (0, 0, 0, 0)) if (r != "attn/core" or fused_softmax) else (0, 0, 0, 0)
        moved = tuple(c + d for c, d in zip(counts, delta, strict=True))
        out[r] = (1, *moved[1:]) if r in JIT_ONE_FORWARD else moved
    return out  # type: ignore[return-value]


# A fused stack (``stack.fusion = "fused"``) keeps cost/'s own counts, one kernel per record: Megatron-Core fuses
# what the eager rows count apart (megatron/core/fusions/: fused_layer_norm.py, fused_softmax.py's scale-mask-softmax,
# fused_bias_gelu.py / fused_bias_swiglu.py, fused_bias_dropout.py's bias-dropout-add), Transformer Engine's
# LayerNormLinear folds the norm into the linear, and TransformerConfig.gradient_accumulation_fusion makes the weight-
# gradient GEMM accumulate into main_grad (no add of its own). A CUDA-graphed stack launches one graph per layer and
# pass whatever its kernels (step/host.py).
# the extra records of ``eager_layer`` whose kernels a row counts, besides its own ``<row>/eager`` (the bias gradients:
# counted with the bias-dropout-add and the bias-GeLU), when all of those rows apply
_COUNTED_IN = {"attn/qkv_bias/eager": ("attn/qkv",), "attn/out_bias/eager": ("attn/residual",),
               "mlp/bias/eager": ("mlp/act", "mlp/residual")}
_PHASES = ("fwd", "bwd_x", "bwd_w")


def eager_rows(model: ModelSpec, stack: Stack, fused: bool = True) -> dict[str, tuple[int, int, int]]:
    """The rows of ``EAGER_KERNELS`` that count this model's records under an eager stack: the reference layer of its
    norm and code (RMSNorm: "llama", its SDPA core where the stack runs flash attention; LayerNorm: Megatron's module
    code where the attention is Megatron's unfused one, "gpt" or at dropout 0 "gpt-no-dropout", else plain PyTorch's
    QKV linear and SDPA core ("sdpa"), the flash kernel alone where the layer keeps Megatron's bias-dropout-add or
    the stack splits the QKV projection with torch.split, whose concatenation is a record of its own), less
    the rows whose layer differs from the model's (another activation; fused or separate projections, a QKV bias; a
    bias-dropout-add where the linears have no bias, or, in plain PyTorch, a plain residual add); per row (forward,
    input-gradient, weight-gradient kernels), the accumulation counted with the weight gradient unless FSDP
    accumulates the shards (``stack.fsdp``). Under Megatron-LM's fused module code (``stack.fusion = "jit"``) the
    "gpt" rows as its fusions launch them (``jit_rows``); a jit stack has no RMSNorm layer (cost/'s counts stand)."""
    counted = stack.fusion_mode.counted or stack.compiled  # torch.compile: eager's count, measured
    style = {"layernorm": "gpt", "rmsnorm": "llama"}.get(model.norm) if counted else None
    jit = stack.fusion_mode.jit and not stack.compiled
    if style is None or (jit and style == "llama"):  # Megatron-LM 2020-22 has no RMSNorm layer: cost/'s own counts
        return {}
    llama = style == "llama"
    megatron = not llama and not stack.flash_attention  # Megatron's unfused attention: its module code
    bias_dropout_add = model.dropout and model.linear_bias
    reference = "llama" if llama else "gpt" if model.dropout else "gpt-no-dropout"
    rows = jit_rows(model, fused) if jit else EAGER_KERNELS[reference]
    if not (llama or megatron):  # the flash kernel alone where a record of its own concatenates the q, k, v gradients
        alone = bias_dropout_add or stack.qkv_concat or stack.projection_mode.concat_grads  # attention.qkv_concat
        core = EAGER_KERNELS["llama" if alone else "sdpa"]["attn/core"]
        rows = {**rows, "attn/qkv": EAGER_KERNELS["sdpa"]["attn/qkv"], "attn/core": core}
    drop = {"attn/core"} if llama and not stack.flash_attention else set()
    if llama and (r := stack.fusion_mode.rope) != "rope":  # another RoPE than torchtitan's measured one: its row's
        rows = {**rows, "attn/rope": (2 * eager_kernels(r, "fwd"), 2 * eager_kernels(r, "bwd_x"), 0, 0)}  # q and k
    if stack.fusion_mode.library_norm:  # the norms a library's kernel each way: cost/'s own count, as a fused stack's
        drop |= {"attn/norm", "mlp/norm"}
    if model.mlp != ("swiglu" if llama else "gelu"):
        drop.add("mlp/act")
    if stack.projection_mode.separate != llama or model.qkv_bias == llama:
        drop |= {"attn/qkv", "mlp/fc1"} if llama else {"attn/qkv"}
    if (not model.linear_bias if megatron else bias_dropout_add == llama or model.dropout != model.linear_bias):
        drop |= {"attn/residual", "mlp/residual", "mlp/act"}
    whole = not stack.fsdp_mode.shards
    kept = {r: (f, x, w + acc * whole) for r, (f, x, w, acc) in rows.items() if r not in drop}
    return _biases_accumulated(kept, rows, drop, model, whole and not llama)


# the reference GPT layer counts a bias's accumulation with the row that adds the bias (the bias-dropout-add, the
# bias-GeLU); a layer with biases but without those rows (no dropout: the linear adds its own bias) still accumulates
# each bias gradient, one add per bias per micro-batch (AccumulateGrad): counted with the linear that owns the bias
_BIAS_OWNER = {"attn/residual": "attn/out", "mlp/residual": "mlp/fc2", "mlp/act": "mlp/fc1"}


def _biases_accumulated(kept: dict[str, tuple[int, int, int]], rows: dict[str, tuple[int, int, int, int]],
                        drop: set[str], model: ModelSpec, whole: bool) -> dict[str, tuple[int, int, int]]:
    """``kept`` with the accumulation kernels of the dropped bias rows (``_BIAS_OWNER``) moved to their linears, for a
    model with linear biases whose gradients stay whole (measured: a plain-PyTorch GPT layer without dropout launches
    36 backward kernels on an H200, 12 of them the AccumulateGrad adds of its 12 parameters; data/measured/gpu/)."""
    if not (whole and model.linear_bias):
        return kept
    for row, owner in _BIAS_OWNER.items():
        if row in drop and row in rows and owner in kept:
            f, x, w = kept[owner]
            kept[owner] = (f, x, w + rows[row][3])
    return kept


def _group(name: str, rows: dict[str, tuple[int, int, int]]) -> str | None:
    """The row of ``eager_rows`` a record belongs to: its own name, its base's (``.../eager``), the projection it is
    part of (``attn/qkv/q``), or a row that counts it (``_COUNTED_IN``)."""
    for row in rows:
        if name == row or name.startswith(row + "/"):
            return row
    of = _COUNTED_IN.get(name, ())
    return of[0] if of and all(r in rows for r in of) else None


def eager_kernel_counts(ops: list[OpCost], model: ModelSpec, stack: Stack, unfused: Num = 0) -> list[OpCost]:
    """An eager layer's records with the kernels PyTorch counts for them (``eager_rows``): per row and pass, the
    kernels of the row's records (``_group``) are made the row's count, the difference added to (or taken from) its
    first records in that pass; a pass the row has no record of counts with its input-gradient records. The record
    counts of cost/ and the extra records of ``eager_layer`` stand, only their sum moves to what PyTorch launches.
    ``unfused``: 1 where Megatron's fused softmax does not take the micro-batch (``softmax_unfused``), per plan."""
    if getattr(unfused, "ndim", 0):  # a batch of plans: each its own softmax path
        fused, torch = _counted(ops, model, stack, True), _counted(ops, model, stack, False)
        return [f if f is t or _same(f.kernels, t.kernels) else
                replace(f, kernels=where(unfused == 1, t.kernels, f.kernels))
                for f, t in zip(fused, torch, strict=True)]
    return _counted(ops, model, stack, not int(unfused))


def _same(a: Num, b: Num) -> bool:
    return type(a) in (int, float) and type(b) in (int, float) and a == b


def _counted(ops: list[OpCost], model: ModelSpec, stack: Stack, fused: bool) -> list[OpCost]:
    """``eager_kernel_counts`` for one softmax path."""
    rows = eager_rows(model, stack, fused)
    if not rows:
        return ops
    groups = [_group(op.name, rows) for op in ops]
    want: dict[tuple[str, str], int] = {}
    for r, counts in rows.items():
        phases = {op.phase for op, g in zip(ops, groups, strict=True) if g == r}
        for phase, n in zip(_PHASES, counts, strict=True):
            to = phase if phase in phases else "bwd_x" if phase != "fwd" and "bwd_x" in phases else None
            if to is not None:
                want[(r, to)] = want.get((r, to), 0) + n
    kernels = [op.kernels for op in ops]
    for (r, phase), n in want.items():
        idx = [i for i, (op, g) in enumerate(zip(ops, groups, strict=True)) if g == r and op.phase == phase]
        diff = n - sum(kernels[i] for i in idx)
        if diff > 0:
            kernels[idx[0]] = kernels[idx[0]] + diff
        for i in idx if diff < 0 else ():
            take = min(kernels[i], -diff)
            kernels[i], diff = kernels[i] - take, diff + take
    return [op if k is op.kernels else replace(op, kernels=k) for op, k in zip(ops, kernels, strict=True)]
