"""The small structures some Hugging Face decoder families add to the standard layer, as fields ModelSpec inherits
(``ModelExtras``): each off by default (every preset's count and cost unchanged), each with its parameters here and
its work in cost/extras.py (training and serving). Sources, transformers 5.24's modeling files:

- ``final_norm`` false: no norm after the last layer (GPT-1, models/openai/modeling_openai.py: post-norm blocks, the
  LM head reads the last block's output).
- ``sub_norms``: BitNet b1.58's RMSNorms inside the blocks (models/bitnet/modeling_bitnet.py): ``attn_sub_norm`` over
  the attention output (A·d) before o_proj, ``ffn_sub_norm`` over act(gate)·up (F) before down_proj.
- ``act_params``: learned scalars of the MLP activation, per MLP (Apertus' xIELU, transformers/activations.py
  XIELUActivation: alpha_p and alpha_n, 2).
- ``moe_post_norm``: an H-wide RMSNorm on a MoE block's output, routed and shared experts summed (A.X-K1,
  models/axk1/modeling_axk1.py AXK1MoE.post_mlp_layernorm): H weights in each MoE layer.
- ``head_vocab_size``: an LM head over fewer tokens than the embedding holds (Moshi, models/moshi/modeling_moshi.py
  MoshiForCausalLM: embed_tokens V + 1 rows, the last a padding token; lm_head V): 0 means the embedding's V.
- ``last_out_bias``: a bias on the attention output of the last layer only (GPT-NeoX-Japanese,
  models/gpt_neox_japanese/modeling_gpt_neox_japanese.py: ``use_bias=layer_number == num_hidden_layers - 1``, its
  dense_bias added in bias_dropout_add): H weights, held by the last pipeline stage.
- ``first_norm_skipped``: the first layer has no attention pre-norm (ModernBERT-decoder, models/modernbert_decoder/
  modeling_modernbert_decoder.py ModernBertDecoderLayer: attn_norm is nn.Identity at layer 0, after the embedding's
  norm): one H-wide norm fewer, on the first pipeline stage.
- ``head_transform``: a prediction head between the final norm and the vocabulary projection (ModernBERT-decoder's
  ModernBertDecoderPredictionHead: dense H → H without bias, the activation, a norm): H·H + a norm's weights, kept
  whole on every tensor-parallel rank (the last stage's own parameters, as the final norm).
- ``attention_experts``: a mixture of attention heads (JetMoE's MoA, models/jetmoe/modeling_jetmoe.py JetMoeMoA):
  E_a experts, each a query projection H → K·d and an output projection K·d → H, k = A / K of them per token (the
  A = k·K query heads of ModelSpec share the K key/value heads of one kv_proj), a router H → E_a and a bias H on the
  output: the spec's q and o count k experts' (A·d each way); the other E_a − k experts' 2·H·K·d each, the router
  and the bias are these extras (the active count, per token, only the router and the bias).
- ``moe_out_bias``: a bias H on a MoE block's output (JetMoeMoE.bias): H weights in each MoE layer.
- ``per_layer_input`` d_p and ``per_layer_vocab`` V_p: per-layer embeddings (Gemma 4 and Gemma 3n, models/gemma4/
  modeling_gemma4.py Gemma4TextModel): a second lookup table V_p × L·d_p (``embed_tokens_per_layer``, an embedding's
  lookup, in embedding_params), a projection of the token embedding H → L·d_p (``per_layer_model_projection``) and an
  RMSNorm over each layer's d_p (``per_layer_projection_norm``), summed and scaled into one d_p input per layer, all
  three with the embedding (embedding_params: the first stage's; the projection counts as matmul parameters,
  cost/flops.py); in every layer a gate H → d_p (``per_layer_input_gate``), the
  activation, its product with the layer's input, a projection d_p → H (``per_layer_projection``) and an RMSNorm over
  H (``post_per_layer_input_norm``) added to the residual: 2·H·d_p + a norm, kept whole on every tensor-parallel rank.
- ``moe_score_before_experts``: a MoE layer weights each token's input to its routed experts by the router's score,
  and sums their outputs unweighted (Llama 4: transformers models/llama4/modeling_llama4.py Llama4TextMoe.forward,
  ``routed_in * router_scores`` before ``self.experts``; torchtitan v0.2.2 torchtitan/models/moe/moe.py MoEArgs
  ``score_before_experts: bool = True`` (line 31), which its Llama 4 flavours keep, llama4/__init__.py
  ``MoEArgs(num_experts=16)``), where by default the outputs are weighted after the experts (Mixtral, DeepSeek-V3;
  torchtitan's deepseek_v3 flavours ``score_before_experts=False``). No parameter and no FLOP moves (the product is
  a vector's either way); it decides whether the backward reads the experts' fc2 output (cost/recompute.py
  ``residual_only``). Set by the Llama 4 presets; a Hugging Face config does not say it (off).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ParamSpec, TypeVar

import numpy as np

from meshplan.errors import SpecError
from meshplan.xp import Num

_Spec = Any  # the ModelSpec (specs/model.py) that inherits ModelExtras; imported there, not here (no cycle)
_P = ParamSpec("_P")
R = TypeVar("R")


def per_spec(method: Callable[_P, R]) -> Callable[_P, R]:
    """A pure method of a frozen spec answered once per spec and arguments (kept in the spec's ``__dict__``, as a
    ``cached_property``; dataclasses.replace makes a new spec, which starts afresh): ModelSpec.block_params, which a
    search asks thousands of times for a handful of kinds."""
    name = f"_{method.__name__}_answers"

    @functools.wraps(method)
    def answered(*args: _P.args, **kwargs: _P.kwargs) -> R:
        known: dict[tuple, R] = args[0].__dict__.setdefault(name, {})
        key = (args[1:], tuple(kwargs.items()))
        if key not in known:
            known[key] = method(*args, **kwargs)
        return known[key]

    return answered


@dataclass(frozen=True, kw_only=True)
class ModelExtras:
    """The extra structures of the module docstring, all off by default."""

    final_norm: bool = True
    sub_norms: bool = False
    act_params: int = 0
    moe_post_norm: bool = False
    head_vocab_size: int = 0
    last_out_bias: bool = False
    first_norm_skipped: bool = False
    attention_experts: int = 0
    moe_out_bias: bool = False
    head_transform: bool = False
    per_layer_input: int = 0
    per_layer_vocab: int = 0
    moe_score_before_experts: bool = False


def head_vocab(spec: _Spec) -> int:
    """The LM head's vocabulary: ``head_vocab_size``, or the embedding's."""
    return int(spec.head_vocab_size or spec.vocab_size)


def vocab_shard(vocab: Num, tp: Num, multiple: int) -> Num:
    """The output layer's columns on each of ``tp`` ranks: V/t, or with the stack's padding (``vocab_multiple`` q,
    Megatron-LM's --make-vocab-size-divisible-by) the padded vocabulary ⌈V/(q·t)⌉·q·t over t, ⌈V/(q·t)⌉·q: the
    padded logits are computed and normalised like the others. The weights' memory counts the model's own rows
    (cost/params.py), under 128·t rows fewer; cost/embed_head.py prices the padded output layer."""
    shard = vocab / tp
    if multiple <= 1:
        return shard
    if type(shard) in (int, float):
        return float(math.ceil(shard / multiple - 1e-9) * multiple)
    return np.ceil(shard / multiple - 1e-9) * multiple


def padded_vocab(vocab: int, tp: int, multiple: int) -> int:
    """The whole vocabulary a framework builds with the padding of ``vocab_shard``: its shard times ``tp`` (``vocab``
    itself when ``multiple`` is 1 or it already divides)."""
    return round(float(vocab_shard(vocab, tp, multiple)) * tp) if multiple > 1 else vocab


def lm_head_params(spec: _Spec) -> int:
    """The LM head: V_head·H unless tied to the embedding, and its bias (V_head)."""
    v, h = head_vocab(spec), spec.hidden_size
    transform = h * h + spec.norm_params(h) if spec.head_transform else 0
    return (0 if spec.tied_embeddings else v * h) + (v if spec.head_bias else 0) + transform


def edge_layer_params(spec: _Spec, i: int, first: bool = True, last: bool = True) -> int:
    """What layer i holds beyond its kind's weights: the last layer's attention-output bias (+H), the first layer's
    missing pre-norm (−H, or −2H with a bias); ``first`` / ``last``: which of the two to count."""
    bias = spec.hidden_size if last and spec.last_out_bias and i == spec.num_layers - 1 else 0
    return bias - (spec.norm_params(spec.hidden_size) if first and spec.first_norm_skipped and i == 0 else 0)


def param_counts(spec: _Spec) -> tuple[int, int]:
    """(total, active) parameters: the embedding, the head and every layer (``active``: the top-k experts only);
    ModelSpec.params caches them per spec (a frozen spec's counts do not change; the search asks hundreds of times)."""
    ends = spec.embedding_params() + spec.head_params()
    total, active = (ends + sum(spec.layer_params(i, a) for i in range(spec.num_layers)) for a in (False, True))
    return total, active


def ple_layers(spec: _Spec) -> int:
    """The decoder layers that take a per-layer input: every layer, or a hybrid's attention blocks (full "*" and
    windowed "W": one each in a Gemma 4 layer)."""
    if spec.is_hybrid:
        return int(spec.layer_pattern.count("*") + spec.layer_pattern.count("W"))
    return int(spec.num_layers)


def ple_lookup_params(spec: _Spec) -> int:
    """The per-layer embeddings' table V_p·L·d_p (module docstring), an embedding lookup."""
    return spec.per_layer_vocab * ple_layers(spec) * spec.per_layer_input


def ple_embedding_params(spec: _Spec) -> int:
    """What the per-layer embeddings add beside the token embedding: the table, the projection and its norm."""
    return ple_lookup_params(spec) + ple_projection_params(spec)


def ple_projection_params(spec: _Spec) -> int:
    """The token embedding's projection to every layer's input, H·L·d_p, and its norm over d_p."""
    d = spec.per_layer_input
    return spec.hidden_size * ple_layers(spec) * d + spec.norm_params(d) if d else 0


def ple_layer_params(spec: _Spec) -> int:
    """A layer's gate H → d_p, its projection d_p → H and the norm over H after it."""
    d = spec.per_layer_input
    return 2 * spec.hidden_size * d + spec.norm_params(spec.hidden_size) if d else 0


def attention_extra_params(spec: _Spec, active: bool = False) -> int:
    """An attention block's extra weights: the sub-norm over A·d, a mixture of attention heads' idle experts
    2·(E_a − k)·H·K·d (not when ``active``), its router H·E_a and output bias H (the per-head output gate, its bias
    and differential attention's λ vectors are ModelSpec's own: attn_head_gate, gate_bias, diff_attention)."""
    total = spec.norm_params(spec.attn_out_dim) if spec.sub_norms else 0
    if spec.attention_experts:
        idle = 0 if active else (spec.attention_experts - moa_topk(spec)) * 2 * spec.hidden_size * spec.kv_dim
        total += idle + spec.hidden_size * (spec.attention_experts + 1)
    return total + ple_layer_params(spec)


def mlp_extra_params(spec: _Spec, ffn: int) -> int:
    """A dense MLP's (or an expert's) extra weights: the sub-norm over its width F, the activation's scalars."""
    return (spec.norm_params(ffn) if spec.sub_norms else 0) + spec.act_params


def moe_extra_params(spec: _Spec) -> int:
    """A MoE block's extra weights: the post-norm over H, the output bias H."""
    norm = spec.norm_params(spec.hidden_size) if spec.moe_post_norm else 0
    return norm + (spec.hidden_size if spec.moe_out_bias else 0)


def moa_topk(spec: _Spec) -> int:
    """The attention experts a token uses: k = A / K (each brings K query heads)."""
    return int(spec.num_heads // spec.num_kv_heads)


def kept_extra_params(spec: _Spec, kind: str) -> int:
    """Extra weights every tensor-parallel rank keeps whole in a layer of ``kind`` (cost/params.kept_params): the MoE
    post-norm and output bias (over the whole hidden state, as the pre-norms are), a dense MLP's activation scalars,
    the differential attention's λ vectors (every head uses them), the attention experts' router and output bias."""
    moe = moe_extra_params(spec) if kind == "moe" else 0
    attention = kind in ("dense", "attention") or (kind == "moe" and not spec.is_hybrid)
    lambdas = 4 * spec.head_dim if spec.diff_attention and attention else 0
    moa = spec.hidden_size * (spec.attention_experts + 1) if spec.attention_experts and attention else 0
    ple = ple_layer_params(spec) if attention or kind == "window" else 0
    return moe + lambdas + moa + ple + (spec.act_params if kind in ("dense", "mlp") else 0)


def extras_on(spec: _Spec) -> list[str]:
    """The extras ``spec`` has, named for a framework configuration that cannot build them (configs/)."""
    named = [("sub_norms", "BitNet sub-norms"), ("act_params", "learned activation scalars"),
             ("moe_post_norm", "a MoE post-norm"),
             ("head_vocab_size", "an LM head over another vocabulary than the embedding's"),
             ("last_out_bias", "an attention-output bias in the last layer only"),
             ("first_norm_skipped", "no pre-norm in the first layer"), ("head_transform", "a prediction head"),
             ("attention_experts", "a mixture of attention heads"), ("moe_out_bias", "a MoE output bias"),
             ("per_layer_input", "per-layer embeddings (Gemma's per-layer inputs)")]
    return [f"{what} ({name})" for name, what in named if getattr(spec, name)] + (
        [] if spec.final_norm else ["no final norm (final_norm=false)"])


def check_extras(spec: _Spec) -> None:
    """The extras only where their structure is modelled: the attention gates with standard attention (a gate bias
    on an output gate), sub-norms and activation scalars on dense MLPs (cost/extras.py prices a dense MLP's), the
    MoE post-norm with experts."""
    if spec.sub_norms and spec.is_mla:
        raise SpecError("sub_norms are modelled on standard attention, not MLA")
    if (spec.sub_norms or spec.act_params) and spec.is_moe:
        raise SpecError("sub_norms and act_params are modelled on dense MLPs, not on experts (num_experts > 0)")
    if spec.head_vocab_size and spec.tied_embeddings and spec.head_vocab_size != spec.vocab_size:
        raise SpecError(f"head_vocab_size={spec.head_vocab_size} differs from vocab_size={spec.vocab_size}: a tied "
                        "head is the embedding's matrix")
    if spec.last_out_bias and (spec.linear_bias or spec.out_bias):
        raise SpecError("last_out_bias=true with output-projection biases in every layer (linear_bias / out_bias)")
    if spec.first_norm_skipped and (spec.is_hybrid or not spec.layer_norms or not spec.norm_weights):
        raise SpecError("first_norm_skipped=true needs attention + MLP layers with weighted pre-norms")
    if spec.attention_experts and (spec.is_mla or spec.attention_experts < moa_topk(spec) or spec.attn_output_gate):
        raise SpecError(f"attention_experts={spec.attention_experts}: a mixture of attention heads needs standard "
                        f"attention without an output gate and at least num_heads / num_kv_heads = {moa_topk(spec)} "
                        "experts")
    if spec.moe_out_bias and not spec.is_moe:
        raise SpecError("moe_out_bias=true needs experts (num_experts > 0)")
    if spec.moe_post_norm and not spec.is_moe:
        raise SpecError("moe_post_norm=true needs experts (num_experts > 0)")
    if (spec.per_layer_input > 0) != (spec.per_layer_vocab > 0) or (
            spec.per_layer_input and spec.is_hybrid and set(spec.layer_pattern) - set("*W-")):
        raise SpecError(f"per_layer_input={spec.per_layer_input} and per_layer_vocab={spec.per_layer_vocab}: per-layer "
                        "embeddings need both, on attention layers (a hybrid's \"*\" and \"W\" blocks with MLPs)")
