"""The element-wise kernels' fusion (``Stack.fusion``): one record per way a stack launches what is not a GEMM, each
holding everything the cost model does differently under it; callers read the record (``stack.fusion_mode``) and
never compare the fusion's name (tests/test_pipeline_registry.py checks the core for such comparisons).

- ``fused``: Megatron-Core's and Transformer Engine's fused modules (megatron/core/fusions/, TE's LayerNormLinear),
  or torch.compile: cost/'s own counts, one kernel per record.
- ``eager``: eager PyTorch, one kernel per aten op (cost/eager.py's EAGER_KERNELS rows).
- ``jit``: Megatron-LM's module code of 2020-22, which Megatron-DeepSpeed runs: eager PyTorch with its own fused
  softmax and LayerNorm kernels and TorchScript-fused bias-GeLU and bias-dropout-add (cost/eager.py jit_rows).
- ``eager-te``: eager PyTorch whose norms are Transformer Engine's RMSNorm module, one fused kernel each way, as NeMo
  AutoModel's own models build them with backend.rms_norm "te" (components/moe/utils.py initialize_rms_norm_module
  @01926a5c: transformer_engine.pytorch RMSNorm); every other element-wise op as ``eager``, the experts' biases
  added per local expert (components/moe/layers.py GroupedExpertsDeepEP._apply_bias).
- ``fused-eager-act``: ``fused``, but the MLP's activation runs as the model code's eager PyTorch ops (any MLP kind:
  cost/eager.py EAGER[model.mlp], nothing more for GeLU's one kernel each way), as
  NeMo 2 builds Nemotron (NemotronConfig.activation_func = nemo/collections/llm/fn/activation.py squared_relu,
  ``torch.pow(F.relu(x), 2)`` with its ``@torch.jit.script`` commented out, @ v2.2.0 and v2.3.0, the 25.02 and 25.04
  containers; bias_activation_fusion left at Megatron-Core's False, whose MLP fuses only GeLU and SwiGLU). NeMo 1's
  copy (nemo/collections/nlp/modules/common/megatron/utils.py @ v2.0.0) and Megatron-Core's
  (megatron/core/activations.py) are under ``@jit_fuser`` (torch.compile): one kernel each way, ``fused``.
- ``eager-apex``: InternEvo's module code (InternLM/InternEvo @c628a8c87411, internlm/model/modeling_internlm.py
  PackedFlashBaseLayer1D): eager PyTorch (its SwiGLU ``F.silu(w1_o) * w3_o``, model/utils.py Silu; its residual adds),
  its norms apex's MixedFusedRMSNorm, one library kernel each way (model/utils.py try_import_RMSNorm), run on an fp32
  upcast of the bf16 residual (``self.norm1(_residual.float())``: a cast kernel each way, and the norm reading and
  its input gradient written in fp32: cost/eager.py EAGER["norm_upcast"]), its RoPE flash-attn's rotary kernel in
  place on q and k (model/modules/embedding.py ApplyRotaryEmbQKV_: rotary_emb.apply_rotary, one kernel each way
  per tensor: EAGER["rope_flash"]) instead of torchtitan's complex multiply.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class Fusion:
    """How a stack launches its element-wise work (module docstring)."""

    name: str
    # Megatron-Core's / Transformer Engine's fused modules (or torch.compile's fusion): cost/'s own counts, TE's
    # module cost per linear launch (cost/mlp_moe.py), Megatron-Core's unfused YaRN RoPE and its per-expert MoE
    # activation pieces, torchtitan's [compile] enable (configs/torchtitan.py)
    fused: bool
    # cost/eager.py's EAGER_KERNELS rows count its kernels (eager_rows)
    counted: bool
    # one kernel per aten op: the records' eager extras (Dims.eager) and the unfused attention's softmax as torch ops
    per_op: bool
    # Megatron-LM's 2020-22 module code: its fusions' rows (jit_rows), its softmax kernel within JIT_SOFTMAX_MAX_SEQ
    jit: bool
    # the hybrid models' layers (Mamba, Gated DeltaNet: layer_pattern) are costed under it (no eager rows of theirs)
    hybrid: bool
    # the layer norms one library kernel each way, as a fused stack counts them, under an otherwise eager stack: no
    # decomposed norm rows (cost/eager.py eager_layer, eager_rows)
    library_norm: bool = False
    # the MLPs' activation (dense, shared and routed experts) as the model code's eager ops, EAGER[model.mlp] (a
    # squared ReLU: relu then pow, and autograd's four backward kernels), under an otherwise fused stack
    # (cost/mlp_moe.py model_code_activation)
    eager_activation: bool = False
    # the experts' biases added by a Python loop per local expert over the rows split by tokens_per_expert, then
    # concatenated, on fc1 and fc2 both: NeMo AutoModel's GroupedExpertsDeepEP._apply_bias (cost/mlp_moe.py
    # looped_expert_biases)
    expert_bias_loop: bool = False
    # the EAGER row an eager layer's RoPE runs as (cost/eager.py eager_layer)
    rope: str = "rope"
    # the norms run on an fp32 upcast of the 16-bit residual (EAGER["norm_upcast"], per norm)
    norm_upcast: bool = False


FUSIONS: dict[str, Fusion] = {f.name: f for f in (
    Fusion(name="fused", fused=True, counted=False, per_op=False, jit=False, hybrid=True),
    Fusion(name="eager", fused=False, counted=True, per_op=True, jit=False, hybrid=False),
    Fusion(name="jit", fused=False, counted=True, per_op=False, jit=True, hybrid=False),
    Fusion(name="eager-te", fused=False, counted=True, per_op=True, jit=False, hybrid=False, library_norm=True,
           expert_bias_loop=True),
    Fusion(name="fused-eager-act", fused=True, counted=False, per_op=False, jit=False, hybrid=False,
           eager_activation=True),
    Fusion(name="eager-apex", fused=False, counted=True, per_op=True, jit=False, hybrid=False, library_norm=True,
           rope="rope_flash", norm_upcast=True),
)}
FUSION_NAMES = tuple(FUSIONS)


def fusion_of(name: str) -> Fusion:
    """The record of fusion ``name``; a KeyError naming the known ones otherwise."""
    if name not in FUSIONS:
        raise KeyError(f"fusion {name!r} is none of {', '.join(FUSION_NAMES)}")
    return FUSIONS[name]


def hybrid_names() -> tuple[str, ...]:
    """The fusions under which hybrid models are costed (specs/check.py's refusal names them)."""
    return tuple(f.name for f in FUSIONS.values() if f.hybrid)
