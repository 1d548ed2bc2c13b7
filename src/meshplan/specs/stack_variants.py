"""The registries of a stack's smaller families of variants: one record per variant of ``Stack.cross_entropy``,
``optimizer_wrapper``, ``projections``, ``expert_gemm``, ``fp8_scaling`` and (``STACK_CHOICES``) ``attention_kernel``,
``cp_comm``, ``moe_permute``, ``moe_dispatcher``, ``flex_backend`` and ``pipeline_runtime``, each holding everything
the cost model does differently under it; callers read the record (``stack.loss``, ``stack.wrapper``,
``stack.projection_mode``, ...) and never compare the variant's name (tests/test_pipeline_registry.py checks the core
for such comparisons). specs/fusion.py and specs/fsdp_modes.py are the larger families' registries; serve/engine.py
holds the engine's.

Cross-entropy (``Stack.cross_entropy``), the bytes per logit of this GPU's vocabulary shard (cost/embed_head.py
loss_ops, whose docstring cites each kernel; 16-bit logits are 2 bytes, fp32 4):

- ``fused``: Megatron's vocabulary-parallel loss (megatron/core/tensor_parallel/cross_entropy.py): reads the 16-bit
  logits and writes an fp32 softmax, which it keeps (2 + 2·4 bytes, 4 saved); backward reads it and writes the
  16-bit gradient (4 + 2).
- ``pytorch``: F.cross_entropy in eager autograd: the fused part priced as ``fused``, its extra eager kernels
  (cost/eager.py ``EAGER["cross_entropy"]``), fp32 logits and gradients (memory.py), and torchao's fp8 linears, which
  keep their 16-bit input (cost/casts.py).
- ``flash``: flash-attn's CrossEntropyLoss: reads the 16-bit logits twice and keeps them, with one fp32 log-sum-exp
  per token; backward re-reads them and writes the 16-bit gradient.
- ``fused_grad``: llm.c's fused_classifier: softmax, loss and gradient in one kernel that reads each row twice and
  writes the gradient over the logits (3·2 bytes); no backward kernel, no gradient of its own at the peak.
- ``vocab_parallel_eager``: Megatron's vocabulary-parallel loss as the eager fp32 ops Megatron-DeepSpeed runs it in:
  38 bytes in 6 kernels forward, 14 in 2 backward (cost/embed_head.py VOCAB_PARALLEL_EAGER).
- ``gathered_bf16``: F.cross_entropy on the 16-bit logits, not upcast, after the head's column-parallel output is
  all-gathered to every TP rank (KempnerForge, below): each rank runs the loss over the whole vocabulary.

Optimizer wrapper (``Stack.optimizer_wrapper``; cost/wrappers.py prices the wrappers DeepSpeed picks):

- ``stated``: the stack's own ``tensor_host`` and ``tensor_sharded``;
- ``deepspeed``: the wrapper DeepSpeed's engine picks per plan;
- ``deepspeed-pipeline``: the same under its pipeline engine (bf16 weights without ZeRO: BF16_Optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshplan.specs.pipeline_runtime import PIPELINE_RUNTIME_RECORDS, PipelineRuntime  # noqa: F401  (Stack reads it)


def _record(field: str, registry: dict[str, Any], name: str) -> Any:
    """Variant ``name`` of the stack's ``field`` from its registry; a KeyError naming the known ones otherwise."""
    if name not in registry:
        raise KeyError(f"{field} {name!r} is none of {', '.join(registry)}")
    return registry[name]


@dataclass(frozen=True, kw_only=True, slots=True)
class Loss:
    """A cross-entropy kernel (module docstring): its work per logit of the rank's shard."""

    name: str
    # F.cross_entropy in eager autograd: its eager kernels' rows, fp32 logits kept by a pipeline runtime and its
    # gradient's fp32 tensors at the peak (memory.py), and fp8 linears that keep their 16-bit input (cost/casts.py)
    eager: bool
    fwd_flops: float  # FLOPs per logit, forward
    fwd_bytes: float  # HBM bytes per logit read + written, forward
    saved: float  # bytes per logit kept for the backward pass
    bwd_bytes: float  # HBM bytes per logit, backward; 0: no backward kernel (the forward wrote the gradient)
    # bytes per logit of the gradient the loss's backward holds beside the logits (memory.py); an eager loss holds
    # one fp32 tensor more under loss_parallel (tp > 1)
    grad_bytes: float
    saved_per_token: float = 0.0  # bytes per token kept besides (flash's fp32 log-sum-exp)
    fwd_kernels: float = 1.0  # kernels a forward pass launches
    bwd_flops: float = 2.0  # FLOPs per logit, backward
    bwd_kernels: float = 1.0
    # the head's logits all-gathered to every TP rank (the whole vocabulary on each), the loss run over all of them
    # there, no vocabulary-parallel reduction (cost/embed_head.py); false: over the rank's V/t shard
    gathered: bool = False
    # bytes per logit the loss leaves reserved and unusable at its peak: the 16-bit logits' block, freed with the
    # upcast beside it and then too small for the backward's fp32 requests (step/memory.logits_hole), where the
    # stack's loop frees them so under expandable segments (Stack.expandable_segments: torchtitan's)
    hole: float = 0.0

    def rank_vocab(self, vocab: Any, tp: Any) -> Any:
        """The vocabulary of the logits the loss runs over on one rank, of the whole (padded) ``vocab`` over ``tp``
        ranks: all of it where the logits are gathered, else V/t."""
        return vocab if self.gathered else vocab / tp


# vocab_parallel_eager: Megatron's vocabulary-parallel cross-entropy as Megatron-DeepSpeed runs it
# (microsoft/Megatron-DeepSpeed @ f4157bea, megatron/model/gpt_model.py post_language_model_processing:
# cross_entropy(output.float(), labels) unless --fp16-lm-cross-entropy; megatron/core/tensor_parallel/cross_entropy.py
# _VocabParallelCrossEntropy): each line one eager kernel over every logit of the rank, its HBM bytes per logit read +
# written (16-bit in, fp32 after the cast). Forward: the .float() upcast 2 + 4, torch.max 4, the out-of-place
# subtraction of the max 4 + 4, torch.exp(out=) 4 + 4, .sum 4, exp_logits.div_ 4 + 4 = 38 bytes in 6 kernels;
# backward: grad_input.mul_ 4 + 4 and autograd's cast of the fp32 gradient back to the 16-bit logits' dtype (the
# .float()'s backward) 4 + 2 = 14 bytes in 2 kernels. The kernels over one value per token (the target mask, the
# gathered target logit, log, the in-place target update) are neglected.
LOSSES: dict[str, Loss] = {loss.name: loss for loss in (
    Loss(name="fused", eager=False, fwd_flops=6.0, fwd_bytes=2 + 2 * 4, saved=4, bwd_bytes=4 + 2, grad_bytes=2),
    Loss(name="pytorch", eager=True, fwd_flops=6.0, fwd_bytes=2 + 2 * 4, saved=4, bwd_bytes=4 + 2, grad_bytes=2 * 4,
         hole=2),
    Loss(name="flash", eager=False, fwd_flops=6.0, fwd_bytes=2 * 2, saved=2, saved_per_token=4, bwd_bytes=2 * 2,
         grad_bytes=2),
    Loss(name="fused_grad", eager=False, fwd_flops=8.0, fwd_bytes=3 * 2, saved=2, bwd_flops=0.0, bwd_bytes=0,
         grad_bytes=0),
    Loss(name="vocab_parallel_eager", eager=False, fwd_flops=6.0,
         fwd_bytes=(2 + 4) + 4 + (4 + 4) + (4 + 4) + 4 + (4 + 4), saved=4, fwd_kernels=6.0, bwd_bytes=(4 + 4) + (4 + 2),
         bwd_kernels=2.0, grad_bytes=2),
    Loss(name="gathered_bf16", eager=False, gathered=True, fwd_flops=6.0, fwd_bytes=3 * 2 + 2, saved=2 + 2,
         fwd_kernels=2.0, bwd_bytes=2 + (2 + 2 + 2 + 2), bwd_kernels=2.0, grad_bytes=2 + 2),
)}
# gathered_bf16: KempnerForge (KempnerInstitute/KempnerForge @01b461a; the same at 3ad9d9a and 5666d0d): the training
# loop calls F.cross_entropy(logits.view(-1, V), labels) on the model's output (scripts/train.py:294-295 @01b461a;
# training/loss.py cross_entropy_loss, the default loss_fn, @5666d0d), bf16 since the model is cast to bf16
# (distributed/parallel.py:207-209), and keeps ``logits`` alive through the backward pass; under TP with sequence
# parallelism the output head is ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())
# (distributed/tensor_parallel.py:157-163 @01b461a, :166-173 @5666d0d): its V/t-wide output all-gathered to every
# rank, no loss_parallel. Per logit of the whole vocabulary, on each rank: forward log_softmax over a row too long for
# shared memory reads it three times and writes the 16-bit log-probabilities (cunn_SoftMaxForward: 3·2 + 2; nll_loss
# reads one per token, neglected); kept: the loop's logits and the log-probabilities log_softmax saves (2 + 2);
# backward nll_loss_backward's zero fill (2) and _log_softmax_backward_data (Σ grad, then read grad and out, write:
# 2 + 2 + 2 + 2); at the peak the two 16-bit gradients (2 + 2). Neglected: the V/t chunk of the gradient that
# redistributing Replicate -> Shard copies out (2/t read + 2/t written, no communication).
LOSS_NAMES = tuple(LOSSES)


def cross_entropy_of(name: str) -> Loss:
    """The record of cross-entropy ``name``; a KeyError naming the known ones otherwise."""
    return _record("cross_entropy", LOSSES, name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Wrapper:
    """An optimizer wrapper setting (module docstring)."""

    name: str
    per_plan: bool  # DeepSpeed's engine picks the wrapper per plan (cost/wrappers.py); false: the stack states it
    pipeline_engine: bool  # under DeepSpeed's pipeline engine (its BF16_Optimizer without ZeRO)


WRAPPERS: dict[str, Wrapper] = {w.name: w for w in (
    Wrapper(name="stated", per_plan=False, pipeline_engine=False),
    Wrapper(name="deepspeed", per_plan=True, pipeline_engine=False),
    Wrapper(name="deepspeed-pipeline", per_plan=True, pipeline_engine=True),
)}
WRAPPER_NAMES = tuple(WRAPPERS)
STATED = WRAPPER_NAMES[0]  # the wrapper a stack states (``--tensor-host`` alone selects it: cli/options.py)


def wrapper_of(name: str) -> Wrapper:
    """The record of optimizer wrapper ``name``; a KeyError naming the known ones otherwise."""
    return _record("optimizer_wrapper", WRAPPERS, name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Projections:
    """How a stack runs the projections of one input into several outputs (Q, K, V; gate and up), ``Stack.projections``:

    - ``fused``: one GEMM each, split inside the kernels that read it (Megatron-Core);
    - ``split``: one GEMM each, split by torch.split / chunk, whose backward concatenates the gradients;
    - ``separate``: a GEMM each (Hugging Face's q_proj, k_proj, v_proj, gate_proj, up_proj): autograd sums their input
      gradients."""

    name: str
    # a GEMM and a weight tensor per output (cost/blocks.projections, cost/tensors.py, the eager kernels' rows)
    separate: bool
    concat_grads: bool  # autograd's SplitWithSizesBackward concatenates the outputs' gradients (cost/blocks.py)
    on_grids: bool  # the 2D layouts (summa, tp2d) are costed with them (specs/check.py, search/combos.py)


PROJECTION_MODES: dict[str, Projections] = {p.name: p for p in (
    Projections(name="fused", separate=False, concat_grads=False, on_grids=True),
    Projections(name="split", separate=False, concat_grads=True, on_grids=False),
    Projections(name="separate", separate=True, concat_grads=False, on_grids=False),
)}
PROJECTION_NAMES = tuple(PROJECTION_MODES)


def projections_of(name: str) -> Projections:
    """The record of projections ``name``; a KeyError naming the known ones otherwise."""
    return _record("projections", PROJECTION_MODES, name)


@dataclass(frozen=True, kw_only=True, slots=True)
class ExpertGemm:
    """How a stack launches the MoE experts' GEMMs (``Stack.expert_gemm``): ``per_expert``, one GEMM per local expert
    launched by the host after the tokens-per-expert sync (Megatron-Core's SequentialMLP), or ``grouped``, one kernel
    for all of them (Transformer Engine's GroupedLinear; Megatron's --moe-grouped-gemm)."""

    name: str
    # one grouped kernel: no per-expert host launches or bias kernels (cost/mlp_moe.py), Megatron's moe_act recompute
    # and --moe-grouped-gemm / NeMo's moe_grouped_gemm (configs/)
    grouped: bool


EXPERT_GEMMS: dict[str, ExpertGemm] = {g.name: g for g in (
    ExpertGemm(name="per_expert", grouped=False),
    ExpertGemm(name="grouped", grouped=True),
)}
EXPERT_GEMM_NAMES = tuple(EXPERT_GEMMS)


def expert_gemm_of(name: str) -> ExpertGemm:
    """The record of expert GEMM ``name``; a KeyError naming the known ones otherwise."""
    return _record("expert_gemm", EXPERT_GEMMS, name)


@dataclass(frozen=True, kw_only=True, slots=True)
class Fp8Scaling:
    """Where an fp8 cast takes its scale (``Stack.fp8_scaling``): ``delayed``, from the amax history (Transformer
    Engine's DelayedScaling, its default), or ``current``, from the tensor itself (TE's Float8CurrentScaling,
    torchao's float8): one more read of the 16-bit tensor before each cast (cost/casts.py)."""

    name: str
    # the scale from the tensor's own amax: the cast reads its input twice (cost/casts.py); torchao's only scaling
    # (configs/torchtitan.py); a choice beyond the default, which needs an fp8 plan (cli/estimate.py,
    # configs/megatron.py)
    current: bool


FP8_SCALINGS: dict[str, Fp8Scaling] = {s.name: s for s in (
    Fp8Scaling(name="delayed", current=False),
    Fp8Scaling(name="current", current=True),
)}
FP8_SCALING_NAMES = tuple(FP8_SCALINGS)


def fp8_scaling_of(name: str) -> Fp8Scaling:
    """The record of fp8 scaling ``name``; a KeyError naming the known ones otherwise."""
    return _record("fp8_scaling", FP8_SCALINGS, name)



def _named(*records: Any) -> dict[str, Any]:
    return {r.name: r for r in records}


@dataclass(frozen=True, kw_only=True, slots=True)
class AttentionKernel:
    """The flash kernel family (``Stack.attention_kernel``): fused (cuDNN / FlashAttention-3 class), fa2
    (FlashAttention-2 class) or fp8 (cuDNN's FP8 attention)."""

    name: str
    # fp8 plans only (specs/check.py); Transformer Engine's, no Megatron-LM argument (configs/megatron.py)
    fp8: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class CpComm:
    """The context-parallel K/V exchange (``Stack.cp_comm``): ring (p2p steps) or allgather."""

    name: str
    ring: bool = False  # one flash call per ring step, each over s / cp keys (cost/attention.py); else one all-gather


@dataclass(frozen=True, kw_only=True, slots=True)
class MoePermute:
    """The MoE token permutation (``Stack.moe_permute``; cost/moe_permute.py): fused (Transformer Engine's kernels),
    gather_scatter (Megatron-Core's moe_utils in eager PyTorch) or sort_gather (transformers' grouped_mm experts)."""

    name: str
    fused: bool = False  # TE's permute / unpermute kernels; the experts' activation Megatron-Core's (cost/mlp_moe.py)
    fp32_unpermute: bool = False  # the unpermute's fp32 weighting, inverse permutation and sum over k


@dataclass(frozen=True, kw_only=True, slots=True)
class MoeDispatcher:
    """The MoE token exchange (``Stack.moe_dispatcher``): alltoall, allgather (Megatron-Core
    --moe-token-dispatcher-type allgather) or flex (--moe-token-dispatcher-type flex with
    --moe-flex-dispatcher-backend deepep or hybridep: DeepEP's normal kernels or NVIDIA's HybridEP, which send a token
    once to each other node that holds one of its experts and fan it out over NVLink there; deepseek-ai/DeepEP
    README, Megatron-Core megatron/core/transformer/moe/fused_a2a.py)."""

    name: str
    gathers_tokens: bool = False  # all-gather the tokens over etp x ep, permute locally (cost/moe_permute.py)
    forwards: bool = False  # a token crosses each tier beyond the node once per node it hits (collectives/dispatch.py)


@dataclass(frozen=True, kw_only=True, slots=True)
class FlexBackend:
    """The flex dispatcher's backend (``Stack.flex_backend``: Megatron-Core --moe-flex-dispatcher-backend): its
    measured cross-node rates, which collectives/dispatch.py prices the forwarded traffic at. ``kernel``: (nodes,
    logical bytes/s) where the kernel, not its NIC, set the rate (a rate in absolute bytes/s, every node a token hits
    counted, its own included, on the ``source``'s GPUs and SM count); ``nic``: (nodes, share of the NIC peak) where
    the NIC bound (the cap a kernel point meets on a slower NIC); ``nvlink``: (ranks, logical bytes/s) of its
    intra-node kernels inside one NVLink domain, every rank a token hits counted once, its own included (a kernel
    limit in absolute bytes/s, as ``kernel``), measured on ``nvlink_on``'s GPU architectures only (elsewhere the
    link prices the exchange); ``argument``: its --moe-flex-dispatcher-backend value; ``num_sms``: the
    --moe-hybridep-num-sms it runs (0: not HybridEP's)."""

    name: str
    argument: str
    num_sms: int = 0
    kernel: tuple[tuple[float, float], ...]
    nic: tuple[tuple[float, float], ...]
    source: str
    nvlink: tuple[tuple[float, float], ...] = ()
    nvlink_on: tuple[str, ...] = ()  # the architectures (architectures.ARCHITECTURES) ``nvlink`` was measured on
    # pads each local expert's rows to the fp8 / fp4 GEMMs' alignment inside its dispatch (hybrid_ep_dispatch's
    # pad_multiple, Megatron-LM core_v0.16.1 token_dispatcher.py _HybridEPManager:1042-1047), so TEGroupedMLP's
    # Fp8Padding finds every count aligned and copies nothing (cost/moe_permute.py fp8_padding)
    pads_for_quantization: bool = False


# Megatron-Core's moe_hybridep_num_sms default (megatron/core/transformer/transformer_config.py @ core_v0.17.0:
# "moe_hybridep_num_sms: int = 16"), the --moe-hybridep-num-sms a config that sets none runs
HYBRIDEP_DEFAULT_SMS = 16


# a Stack field -> its variants' records, in its choices' order (the first is its default)
STACK_CHOICES: dict[str, dict[str, Any]] = {
    "attention_kernel": _named(AttentionKernel(name="fused"), AttentionKernel(name="fa2"),
                               AttentionKernel(name="fp8", fp8=True)),
    "cp_comm": _named(CpComm(name="ring", ring=True), CpComm(name="allgather")),
    "moe_permute": _named(MoePermute(name="fused", fused=True), MoePermute(name="gather_scatter"),
                          MoePermute(name="sort_gather", fp32_unpermute=True)),
    "moe_dispatcher": _named(MoeDispatcher(name="alltoall"), MoeDispatcher(name="allgather", gathers_tokens=True),
                             MoeDispatcher(name="flex", forwards=True)),
    "flex_backend": _named(
        # H800 + CX7 400 Gb/s (~50 GB/s), 24 SMs, DeepSeek-V3's shapes (4096 tokens, hidden 7168, top-8 of 256 in 4
        # node groups), dispatch / combine averaged: EP 16 (2 nodes) 43 / 43 GB/s logical, half of it on the NIC
        # (21.5 GB/s, 0.43), where a NIC-bound kernel would read ~87: the kernel's limit; EP 32 and 64 58 / 57 and
        # 51 / 50 GB/s, of which the NIC carries 3/4 and 3.5/4: 0.863 and 0.884 of it, NCCL's 0.90 nearly: the NIC's
        # inside one node at its 20 SMs (Megatron-Core moe_deepep_num_sms = 20 @ core_v0.16.1, DeepEP's Buffer.num_sms;
        # Bridge sets none; AutoModel sets 20 itself, Automodel@01926a5c nemo_automodel/components/moe/megatron/
        # fused_a2a.py:27, DEEP_EP_SM_NUMS default 20): B200, 8 ranks, Torch API BF16 dispatch / combine 348 / 302
        # GB/s at 16 SMs, 494 / 420 at 24, halfway 391 logical (README_Hybrid-EP.md @ 94a9f8f), a Blackwell kernel
        # rate; on Hopper DeepEP's README measures H800's 8 ranks link-bound at 24 SMs (153 / 158 GB/s of its ~160),
        # no kernel cap, so there the link binds; across nodes only 24 SMs measured (held)
        FlexBackend(name="deepep", argument="deepep", kernel=((2.0, 43e9),),
                    nic=((4.0, 0.863), (8.0, 0.884)), nvlink=((8.0, 391e9),), nvlink_on=("blackwell",),
                    source="deepseek-ai/DeepEP README.md, DeepEP/tests/test_internode.py @ 3b1045d (num_sms = 24; "
                           "lines 39-43, 158-173); README_Hybrid-EP.md @ 94a9f8f B200 table (16, 24 SMs)"),
        # H100 + 400 Gb/s, Megatron-Core's 16 SMs (moe_hybridep_num_sms), 4096 tokens, hidden 7168, top-8 of 8
        # experts a rank, uniform: Torch API (what Megatron-Core calls) BF16 dispatch / combine 54.47 / 53.35,
        # 47.36 / 52.53 and 41.24 / 46.57 GB/s logical over 16, 32 and 64 ranks (2, 4, 8 nodes), 0.54, 0.75 and
        # 0.77 of the NIC: below the 0.864 and 0.873 its kernels alone reach over 4 and 8 nodes (Kernel Only BF16
        # 57.69 / 57.46 and 49.97 / 49.77 GB/s: 3/4 and 7/8 of it on the NIC), the NIC's; 16-bit rows, as
        # meshplan prices the dispatch (cost/mlp_moe.py)
        # inside one NVLink domain: GB200, 16 SMs, Torch API BF16 dispatch / combine 550.10 / 538.44, 472.84 /
        # 474.48, 441.89 / 444.40, 485.50 / 423.19 and 469.96 / 418.27 GB/s logical over 8, 16, 24, 32 and 36 ranks
        # (received rows, one a token and rank, the rank's own included: DeepEP/tests/test_hybrid_ep.py nvl_recv_bytes);
        # B200's 8 ranks read 535.94 / 530.86, the same; 7/8 of 544 on NVLink is 0.53 of its 900 GB/s
        FlexBackend(name="hybridep", argument="hybridep", num_sms=HYBRIDEP_DEFAULT_SMS,
                    kernel=((2.0, 53.91e9), (4.0, 49.945e9), (8.0, 43.905e9)),
                    nic=((4.0, 0.8636), (8.0, 0.8727)), pads_for_quantization=True,
                    nvlink=((8.0, 544.27e9), (16.0, 473.66e9), (24.0, 443.145e9), (32.0, 454.345e9),
                            (36.0, 444.115e9)), nvlink_on=("blackwell",),
                    source="deepseek-ai/DeepEP branch hybrid-ep @ 94a9f8f docs/README_Hybrid-EP.md (H100 table), "
                           "DeepEP/tests/test_hybrid_ep.py, DeepEP/tests/utils.py count_rdma_send_from_routing_map "
                           "(the sender's own node counted)"),
        # what Megatron-Bridge's performance recipes run: its harness sets moe_hybridep_num_sms = 32 wherever the
        # backend is hybridep (scripts/performance/utils/helpers.py:113 @ v0.2.0, utils/overrides.py:69 @ v0.3.0,
        # :71 @ v0.4.0, :75 @ v0.5.1, :89 @ v0.6.0; v0.6.0 src/megatron/bridge/perf_recipes/_common.py:87).
        # Inside one NVLink domain: GB200, 32 SMs, Torch API BF16 dispatch / combine 545.71 / 568.94, 523.48 /
        # 521.55, 507.32 / 483.76, 484.22 / 464.54 and 479.02 / 447.89 GB/s logical over 8, 16, 24, 32 and 36 ranks
        # (README_Hybrid-EP.md @ 94a9f8f, GB200 table). Across nodes the README measures H100 at 4, 8, 16 SMs only,
        # and 8 reach 16's (BF16 Torch API 57.74 / 56.96 against 54.47 / 53.35 GB/s over 16 ranks, 41.46 / 47.68
        # against 41.24 / 46.57 over 64): the NIC binds, so the 16-SM points hold at 32 (the nearest, no faster)
        FlexBackend(name="hybridep-32sm", argument="hybridep", num_sms=32,
                    kernel=((2.0, 53.91e9), (4.0, 49.945e9), (8.0, 43.905e9)),
                    nic=((4.0, 0.8636), (8.0, 0.8727)), pads_for_quantization=True,
                    nvlink=((8.0, 557.325e9), (16.0, 522.515e9), (24.0, 495.54e9), (32.0, 474.38e9),
                            (36.0, 463.455e9)), nvlink_on=("blackwell",),
                    source="deepseek-ai/DeepEP branch hybrid-ep @ 94a9f8f docs/README_Hybrid-EP.md (GB200 table, "
                           "32 SMs; H100 table, 16 SMs), NVIDIA-NeMo/Megatron-Bridge scripts/performance/utils/"
                           "overrides.py @ v0.3.0-v0.6.0 (moe_hybridep_num_sms = 32)")),
    "pipeline_runtime": _named(*PIPELINE_RUNTIME_RECORDS),
}


def flex_backend_of(argument: str, num_sms: Any = None) -> str:
    """The ``flex_backend`` variant a config's --moe-flex-dispatcher-backend ``argument`` runs with
    --moe-hybridep-num-sms ``num_sms`` (None: unset, Megatron-Core's default): of that argument's variants, the one
    measured nearest that SM count; ``argument`` itself where no variant runs it (the caller's check refuses it)."""
    records = [r for r in STACK_CHOICES["flex_backend"].values() if r.argument == argument]
    sms = int(num_sms) if str(num_sms).isdigit() else HYBRIDEP_DEFAULT_SMS
    return min(records, key=lambda r: abs(r.num_sms - sms)).name if records else argument


def choice_of(field: str, name: str) -> Any:
    """The record of variant ``name`` of the stack's ``field`` (a ``STACK_CHOICES`` key); a KeyError naming the known
    ones otherwise."""
    return _record(field, STACK_CHOICES[field], name)


def names_of(field: str) -> tuple[str, ...]:
    """The variants of the stack's ``field`` (a ``STACK_CHOICES`` key), its default first: the field's choices."""
    return tuple(STACK_CHOICES[field])

# the values of --moe-flex-dispatcher-backend, the configs' readers' check (configs/megatron.py, nemo.py)
FLEX_ARGUMENTS = tuple(dict.fromkeys(r.argument for r in STACK_CHOICES["flex_backend"].values()))
