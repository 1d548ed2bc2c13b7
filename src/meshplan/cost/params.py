"""Parameters on one GPU before ZeRO sharding: which layers each pipeline rank holds, one layer of each kind
split over the tensor- and expert-parallel ranks, LoRA adapters, multi-token-prediction layers, and a stage's
total (``stage_params``, with the embedding and the LM head on the end stages).

Symbols: L layers, p pipeline stages, v chunks per stage, t the tensor-parallel ranks (tp, or tp·tp2 on a SUMMA
grid), ep·etp the ranks that split the routed experts, H hidden size, V vocabulary, r the LoRA rank.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from meshplan.cost.shapes import fc1_width, kv_up_shape, qkv_shapes
from meshplan.pipeline.registry import one_chunk, schedule_of
from meshplan.specs.layouts import layout_of
from meshplan.specs.mixer_params import attention_spec
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import edge_layer_params, head_vocab, kept_extra_params
from meshplan.specs.plan import Plan
from meshplan.xp import Num, minimum, recent, where


@dataclass(frozen=True, slots=True)
class StageParams:
    """Parameters held by one GPU of a pipeline stage before ZeRO sharding."""

    dense: Num  # replicated across the dp·cp ranks
    expert: Num  # replicated across the expert-data-parallel ranks
    adapters: Num = 0.0  # LoRA adapter parameters (plan.finetune = "lora"), replicated across the dp·cp ranks
    embedding: Num = 0.0  # of ``dense``, the token embedding's vocabulary-parallel share V·h/tp (end_params)

    @property
    def total(self) -> Num:
        return self.dense + self.expert


def _uneven(plan: Plan) -> Num:
    """An uneven last stage applies: ``plan.last_stage_layers`` set and a pipeline to set it on (a search batch
    may hold pp = 1 rows beside pipelined ones; its answer kept as ``layers_on_stage``'s)."""
    if type(plan) is Plan:
        return (plan.last_stage_layers > 0) & (plan.pp > 1)
    return recent(_UNEVEN, (plan.last_stage_layers, plan.pp), lambda: (plan.last_stage_layers > 0) & (plan.pp > 1))


def any_uneven(plan: Plan) -> bool:
    """Whether any plan (of a search batch) has an uneven last stage: only then is the last rank priced apart. The
    one reduction over a batch's rows here: step/grid._batch_params prices a batch on its distinct rows, exact only
    while every reduction is one the distinct rows answer alike (an any() or a max(), not a sum or a count)."""
    return bool(np.any(_uneven(plan)))


def _uneven_first(plan: Plan) -> Num:
    """An uneven first stage applies: ``plan.first_stage_layers`` set (a scalar even in a search batch) and a
    pipeline to set it on."""
    return (plan.first_stage_layers > 0) & (plan.pp > 1)


# layers_on_stage's last answers, newest first, with the model and plan objects themselves (held, so that their ids
# are not reused): the search asks the same batch's question a thousand times a search (DeepSeek-V3 on 2,048 GPUs:
# 1,798 calls, 1,509 of them one of the last four)
_STAGE_ANSWERS: list[tuple[tuple[object, ...], Num]] = []
_UNEVEN: list[tuple[tuple[object, ...], Num]] = []  # _uneven's of a batch, likewise


def layers_on_stage(model: ModelSpec, plan: Plan) -> Num:
    """Layers on every middle pipeline rank (and the first one without an uneven first stage): ⌈L / p⌉, or with an
    uneven last stage (``plan.last_stage_layers`` = l) and first stage (``plan.first_stage_layers`` = f, Megatron-Core
    decoder_first_pipeline_num_layers) the other ranks' even split of the rest, ⌈(L − l·u − f·w) / (p − u − w)⌉
    (u, w = 1 where each applies; with p = 2 and both set no middle rank is left: the divisor is kept at 1).
    Remembered for the last four (model, plan) objects; an array answer is read-only (a caller cannot change a kept
    one)."""
    # a batch's by the columns it reads (the batches of a search's settings share them: with_settings), a plan's by it
    key = (model, plan) if type(plan) is Plan else (model, plan.pp, plan.last_stage_layers, plan.first_stage_layers,
                                                    plan.stage_layers)
    return recent(_STAGE_ANSWERS, key, lambda: _layers_on_stage(model, plan))


def _layers_on_stage(model: ModelSpec, plan: Plan) -> Num:
    if plan.stage_layers and plan.pp > 1:  # per-rank counts (one plan): the heaviest middle rank's, or of the two
        return max(plan.stage_layers[1:-1] or plan.stage_layers)
    uneven, first = _uneven(plan), _uneven_first(plan)
    ranks = plan.pp - uneven - first
    ranks = ranks + (ranks == 0)
    return -(-(model.num_layers - plan.last_stage_layers * uneven - plan.first_stage_layers * first) // ranks)


def layers_on_first(model: ModelSpec, plan: Plan) -> Num:
    """Layers on the first pipeline rank: ``plan.stage_layers``' first, ``plan.first_stage_layers``, or those of the
    middle ranks."""
    if plan.stage_layers and plan.pp > 1:
        return plan.stage_layers[0]
    return _batch_kept(_FIRST_ANSWERS, model, plan, (), lambda: where(_uneven_first(plan), plan.first_stage_layers,
                                                                       layers_on_stage(model, plan)))


def layers_on_last(model: ModelSpec, plan: Plan) -> Num:
    """Layers on the last pipeline rank: ``plan.stage_layers``' last, ``plan.last_stage_layers``, or those of the
    others (``layers_on_stage``)."""
    if plan.stage_layers and plan.pp > 1:
        return plan.stage_layers[-1]
    return _batch_kept(_LAST_ANSWERS, model, plan, (), lambda: where(_uneven(plan), plan.last_stage_layers,
                                                                      layers_on_stage(model, plan)))


def layers_on_rank(model: ModelSpec, plan: Plan, rank: int) -> Num:
    """Layers on pipeline rank ``rank`` (r ≥ 1 the last's where it is the last, of each plan of a batch): the
    first's, the last's or a middle rank's (``plan.stage_layers``: its own)."""
    if plan.stage_layers and plan.pp > 1:
        return plan.stage_layers[rank]
    if rank == 0:
        return layers_on_first(model, plan)
    return _batch_kept(_RANK_ANSWERS, model, plan, (rank,), lambda: where(
        plan.pp - 1 == rank, layers_on_last(model, plan), layers_on_stage(model, plan)))


# layers_on_first's, layers_on_last's and layers_on_rank's answers for a batch, kept as layers_on_stage's (by the
# columns they read: the memory pass and the step of a chunk ask each again per setting and rank, DeepSeek-V3's
# search 4,500 times, each a where() over the batch)
_FIRST_ANSWERS: list[tuple[tuple[object, ...], Num]] = []
_LAST_ANSWERS: list[tuple[tuple[object, ...], Num]] = []
_RANK_ANSWERS: list[tuple[tuple[object, ...], Num]] = []


def _batch_kept(answers: list[tuple[tuple[object, ...], Num]], model: ModelSpec, plan: Plan, extra: tuple[int, ...],
                compute: Callable[[], Num]) -> Num:
    """``compute()``, kept in ``answers`` for a batch by the identities of the columns the layer counts read and
    ``extra``; a plan's computed each time (cheap: Python numbers)."""
    if type(plan) is Plan:
        return compute()
    key = (model, plan.pp, plan.last_stage_layers, plan.first_stage_layers, plan.stage_layers, *extra)
    return recent(answers, key, compute)


def middle_or_first(plan: Plan, middle: Num, first: Num) -> Num:
    """A middle pipeline rank's value where there is one (p > 2), else the first rank's (of each plan of a batch)."""
    if np.ndim(plan.pp) == 0:
        return middle if plan.pp > 2 else first
    return np.where(plan.pp > 2, middle, first)


@lru_cache(maxsize=256)
def moe_fraction(model: ModelSpec) -> float:
    """Share of layers that are MoE (layers of each kind are assumed spread evenly over the stages)."""
    return model.num_moe_layers / model.num_layers


@lru_cache(maxsize=256)
def kind_fractions(model: ModelSpec) -> dict[str, float]:
    """Share of the layers of each kind (``ModelSpec.block_counts``): {"dense": 1 - f, "moe": f}, or a hybrid's
    blocks; each kind's layers are assumed spread evenly over the stages."""
    return {kind: n / model.num_layers for kind, n in model.block_counts.items()}


@dataclass(frozen=True, slots=True)
class LayerWeights:
    """Parameters of one layer of a kind on one GPU, by how they are placed and stored (``layer_weights``)."""

    split: Num  # block linears split over the tensor-parallel ranks (and their biases, the Mamba mixer's rest)
    whole: Num  # block linears every tensor-parallel rank keeps whole: MLA's down-projections
    kept: Num  # norms and the router: whole on every rank; serving keeps them in 16 bits (serve/memory.py)
    expert: Num  # the routed experts on this GPU

    @property
    def total(self) -> Num:
        return self.split + self.whole + self.kept + self.expert


def mla_down_params(model: ModelSpec) -> int:
    """MLA's down-projections, H·r_q (when the query is compressed) and H·(r_kv + d_R): one attention block's linears
    that no tensor-parallel rank splits. Megatron-Core builds linear_q_down_proj and linear_kv_down_proj as
    ``backend.linear()`` (megatron/core/models/gpt/gpt_layer_specs.py), a TELinear that
    megatron/core/transformer/multi_latent_attention.py (MLASelfAttention.__init__) builds with
    parallel_mode="duplicated"; vLLM's vllm/model_executor/models/deepseek_v2.py (DeepseekV2MLAAttention) makes
    q_a_proj and kv_a_proj_with_mqa ReplicatedLinear (fused_qkv_a_proj: disable_tp) and SGLang likewise. DeepSeek
    Sparse Attention's indexer (``ModelSpec.indexer_params``) is whole on every rank too (cost/dsa.py)."""
    if not model.is_mla:
        return 0
    down = model.hidden_size * (model.q_lora_rank + model.kv_lora_rank + model.qk_rope_head_dim)
    return down + model.indexer_params()  # DSA's indexer: Megatron-Core DSAIndexer's linears are "duplicated"


def kept_params(model: ModelSpec, kind: str) -> int:
    """Parameters of one layer of ``kind`` every tensor-parallel rank keeps whole besides MLA's down-projections:
    its pre-norms (Transformer Engine's LayerNormLinear holds the whole norm weight beside its column shard; vLLM's
    RMSNorm is not split), MLA's latent norms (q_a_layernorm, kv_a_layernorm: over the replicated latents) and a MoE
    layer's router with its bias (Megatron-Core TopKRouter's weight is a plain E×H parameter; vLLM's gate a
    ReplicatedLinear)."""
    norms = 2 if kind == "dense" or (kind == "moe" and not model.is_hybrid) else model.block_norms
    kept = norms * model.norm_params(model.hidden_size)
    if model.is_mla and kind in ("dense", "moe", "attention", "window", "parallel") and not (
            kind == "moe" and model.is_hybrid):
        kept += model.q_lora_rank + model.kv_lora_rank
    if kind == "moe":
        kept += model.hidden_size * model.num_experts + (model.num_experts if model.router_bias else 0)
    return kept + kept_extra_params(model, kind)


def layer_weights(model: ModelSpec, kind: str, tp: Num, expert_ways: Num, kv_heads: Num | None = None
                  ) -> LayerWeights:
    """One layer of ``kind`` (``ModelSpec.block_counts``) on one GPU, the one placement of weights training
    (``kind_params``) and serving (serve/memory.weight_bytes) share: attention, dense MLPs, shared experts, latent
    projections and Mamba mixers (Megatron's by heads and groups) split ``tp`` ways; MLA's down-projections, the
    norms and the router whole on every rank (``mla_down_params``, ``kept_params``); the routed experts split
    ``expert_ways`` ways (training: ep·etp; serving: ep, or tp when ep = 1). ``kv_heads``: the KV heads a rank
    keeps when not K/t (an inference engine keeps a whole head past K ranks, vLLM's QKVParallelLinear
    num_kv_head_replicas = t / K; Megatron-Core refuses t > K, attention.py divide(num_query_groups, tp)): the key
    and value projections then hold kv_heads / K of theirs on the rank instead of 1/t."""
    experts = model.num_experts * model.expert_params() if kind == "moe" else 0
    has_attention = kind in ("dense", "attention", "window", "parallel") or (kind == "moe" and not model.is_hybrid)
    whole = mla_down_params(attention_spec(model, kind)) if has_attention else 0  # a "W" block: no DSA indexer
    kept = kept_params(model, kind)
    split = (model.block_params(kind) - experts - whole - kept) / tp
    if kv_heads is not None and has_attention and not model.is_mla:
        kv = (model.kv_dim + model.v_dim) * (model.hidden_size + model.qkv_bias)  # the K and V projections, biases
        split = split + kv * (kv_heads / model.num_kv_heads - 1 / tp)
    return LayerWeights(split=split, whole=whole + 0 * tp, kept=kept + 0 * tp,
                        expert=experts / expert_ways if experts else 0.0 * expert_ways)


def kind_params(model: ModelSpec, plan: Plan, kind: str) -> StageParams:
    """Parameters of one layer of ``kind`` on one GPU (``layer_weights``, the routed experts over ep·etp). A SUMMA
    grid (summa.py) or a tp2d grid (tp2d.py) splits every weight of the block over its t = tp·tp2 ranks, the norms
    with the features (tp2d: h over tp, replicated over tp2; counted as split over t, a norm's h weights being
    negligible beside the block's). A batch's kept for the same objects a while (``_KINDS``): the three ranks'
    parameters (step/grid.rank_params) ask 7-8 times for a model's 2 kinds (each end's and the middle's average of
    the other layers and its MoE layer), each time a dozen array operations over the batch; the kept answer's arrays
    read-only (no caller may change what the next one reads)."""
    if type(plan) is Plan:
        return _kind_params(model, plan, kind)
    return recent(_KINDS, (model, plan, kind), lambda: _frozen(_kind_params(model, plan, kind)))


_KINDS: list[tuple[tuple[object, ...], StageParams]] = []  # ``kind_params``' last answers for batches (xp.recent)


def _frozen(params: StageParams) -> StageParams:
    """``params`` with its arrays read-only: each its own array (``base`` None), or a copy where it is a view of
    another (a plan's column returned as it is), whose owner must stay writeable for its other readers."""
    owned = {name: value if value.base is None else value.copy()
             for name in StageParams.__slots__ if isinstance(value := getattr(params, name), np.ndarray)}
    for value in owned.values():
        value.flags.writeable = False
    return replace(params, **owned) if owned else params


def _kind_params(model: ModelSpec, plan: Plan, kind: str) -> StageParams:
    t = plan.tp * plan.tp2
    w = layer_weights(model, kind, t, plan.ep * plan.etp)
    dense = w.split + w.whole + w.kept
    if layout_of(plan.tensor_layout).grid:
        dense = (model.block_params(kind) - (w.expert * plan.ep * plan.etp)) / t
    return StageParams(dense=dense, expert=w.expert)


def layer_params(model: ModelSpec, plan: Plan) -> StageParams:
    """Average parameters per layer on one GPU: ``kind_params`` weighted by each kind's share of the layers."""
    parts = [(f, kind_params(model, plan, kind)) for kind, f in kind_fractions(model).items()]
    return StageParams(dense=sum(f * p.dense for f, p in parts), expert=sum(f * p.expert for f, p in parts))


def moe_layers_on_stage(model: ModelSpec, plan: Plan, first: bool) -> Num:
    """MoE layers on the first or the last pipeline rank. The first k layers are dense (DeepSeek-V3's
    first_k_dense_replace = 3) and sit in the first rank's first model chunk, min(k, L / (p·v)) of them; after
    them one layer in moe_layer_freq is MoE. The last rank holds the model's last layers, past the dense ones.
    One stage (p = 1) holds all of them. (Timing keeps the model-wide share, ``moe_fraction``.)"""
    layers = layers_on_first(model, plan) if first else layers_on_last(model, plan)
    if not model.is_moe:
        return 0 * layers
    if model.is_hybrid:  # E blocks spread through the pattern: the stage's share
        return where(plan.pp == 1, model.num_moe_layers, layers * moe_fraction(model))
    dense_first = minimum(model.first_k_dense_layers, layers / plan.vpp) if first else 0
    on_stage = (layers - dense_first) / model.moe_layer_freq
    return where(plan.pp == 1, model.num_moe_layers, minimum(on_stage, model.num_moe_layers))


def other_layer_params(model: ModelSpec, plan: Plan) -> Num:
    """Average parameters on one GPU of a layer that is not MoE: a dense layer, or the mean of a hybrid's Mamba,
    attention and MLP blocks."""
    parts = [(n, kind_params(model, plan, kind).dense) for kind, n in model.block_counts.items() if kind != "moe"]
    count = sum(n for n, _ in parts)
    return sum(n * p for n, p in parts) / count if count else 0.0


def qkv_linears(model: ModelSpec) -> list[tuple[int, int]]:
    """(k, n) of the query / key / value projections, as attention.attention_block builds them: one fused QKV linear, or
    MLA's q_down / q_up (or a single q) and kv_down / kv_up (DeepSeek-V2 §2.1): shapes.py's, unsplit."""
    linears = [(int(k), int(n)) for _, k, n in qkv_shapes(model, 1)]
    if model.is_mla:
        k, n = kv_up_shape(model, 1)
        linears.append((int(k), int(n)))
    return linears


def adapter_params(model: ModelSpec, plan: Plan) -> float:
    """LoRA parameters per layer on one GPU: r·(k + n)/t for each targeted linear W (k×n): the QKV projections
    (``qkv_linears``), and with ``plan.lora_targets = "all"`` also the attention output and the dense MLP's fc1
    (gate + up) and fc2 (the linears lora.LORA_PREFIXES adapts; the TP shards split the adapters with their base
    weights, a small overcount for the replicated halves)."""
    if plan.finetune != "lora":
        return 0.0
    h, f = model.hidden_size, model.ffn_hidden_size
    fc1 = int(fc1_width(model, f))
    qkv = sum(k + n for k, n in qkv_linears(model))
    rest = (model.attn_out_dim + h) + (1 - moe_fraction(model)) * ((h + fc1) + (f + h))
    return plan.lora_rank * (qkv + rest * (plan.lora_targets == "all")) / (plan.tp * plan.tp2)


def trainable(params: StageParams, plan: Plan) -> StageParams:
    """The parameters that get gradients and optimizer state: all of them, or under LoRA the adapters only."""
    if plan.finetune == "lora":
        return StageParams(dense=params.adapters, expert=0.0, adapters=params.adapters)
    return params


def middle_params(model: ModelSpec, plan: Plan, rank: int | None = None) -> StageParams:
    """A middle pipeline rank (neither end) of one plan: its layers only (``layers_on_stage``, or rank ``rank``'s
    own), MoE ones at the model-wide share past the dense first layers (on the first rank), LoRA adapters."""
    layers = layers_on_stage(model, plan) if rank is None else layers_on_rank(model, plan, rank)
    moe_layers = layers * moe_fraction(model) if model.is_hybrid else (
        minimum(layers / model.moe_layer_freq, model.num_moe_layers) if model.is_moe else 0)
    adapters = adapter_params(model, plan) * layers
    dense = other_layer_params(model, plan) * (layers - moe_layers) + kind_params(model, plan, "moe").dense * moe_layers
    return StageParams(dense=dense + adapters, expert=kind_params(model, plan, "moe").expert * moe_layers,
                       adapters=adapters)


def stage_params(model: ModelSpec, plan: Plan, first: bool) -> StageParams:
    """The first (embedding) or last (final norm + LM head) stage: its layers (``kind_params``), its own parameters
    (``end_params``), the MTP layers on the last, LoRA adapters. ZB-V's V puts the embedding, the head and the MTP
    layers on the first rank; Chimera's end ranks hold the first and the last stage each (zero_bubble_v.py)."""
    layers = layers_on_first(model, plan) if first else layers_on_last(model, plan)
    moe_layers = moe_layers_on_stage(model, plan, first)
    other = other_layer_params(model, plan)
    moe_layer = kind_params(model, plan, "moe")
    if schedule_of(plan.schedule).mirrored:  # Chimera: each rank holds stage r of one replica and p − 1 − r of the
        one, two = (stage_params(model, replace(plan, schedule=one_chunk()), end) for end in (True, False))  # other
        return StageParams(one.dense + two.dense, one.expert + two.expert, one.adapters + two.adapters,  # ends
                           one.embedding + two.embedding)
    single = plan.pp == 1
    extra = end_params(model, plan.tp, single, first)
    mtp = mtp_params(model, plan)
    on_stage = single if first else 1  # the MTP layers sit on the last stage
    table = 1 if first else single  # the token embedding's stage (end_params)
    if not schedule_of(plan.schedule).head_last:  # ZB-V's V: the first rank holds the first and the last chunk
        extra = end_params(model, plan.tp, 1, True) if first else 0.0
        on_stage = table = 1 if first else 0
    adapters = adapter_params(model, plan) * layers
    dense = other * (layers - moe_layers) + moe_layer.dense * moe_layers
    return StageParams(dense=dense + extra + on_stage * mtp.dense + adapters,
                       expert=moe_layer.expert * moe_layers + on_stage * mtp.expert, adapters=adapters,
                       embedding=table * model.vocab_size * model.hidden_size / plan.tp)


def end_params(model: ModelSpec, tp: Num, single: Num, first: bool) -> Num:
    """The first (embedding) or last (final norm + LM head) stage's own parameters on one GPU; ``single``: one stage
    holds both (p = 1). A tied LM head keeps its own copy on the last stage when p > 1 (Megatron). Only the
    vocabulary matrices are split over the tensor-parallel ranks (VocabParallelEmbedding, the column-parallel output
    layer; vLLM's VocabParallelEmbedding and ParallelLMHead); a learned position table and the norms are copied on
    every rank (Megatron-LM's LanguageModelEmbedding keeps its position_embeddings a plain torch.nn.Embedding)."""
    word = model.vocab_size * model.hidden_size
    head_matrix = 0 if model.tied_embeddings else head_vocab(model) * model.hidden_size  # Moshi's: V_head < V
    # the first and last layers' own weights beyond their kind's (model_extras.edge_layer_params), whole
    embed = word / tp + (model.embedding_params() - word) + edge_layer_params(model, 0, last=False)
    head = head_matrix / tp + (model.head_params() - head_matrix) + edge_layer_params(model, model.num_layers - 1,
                                                                                      first=False)
    if model.tied_embeddings:
        head = head + (word / tp) * (1 - single)
    return embed + head * single if first else head + embed * single


def mtp_params(model: ModelSpec, plan: Plan) -> StageParams:
    """The multi-token-prediction layers on one GPU of the last stage (``ModelSpec.mtp_params``): their blocks split
    as the model's are (``kind_params``), eh_proj t-ways, the three norms copied; with p > 1 the last stage also
    holds a copy of the vocabulary-parallel embedding for the MTP lookup (Megatron-Core builds the embedding on
    the stage that runs MTP and keeps the copies in sync like a tied head; a tied model's last stage has that copy
    already)."""
    if not model.mtp_layers:
        return StageParams(dense=0.0, expert=0.0)
    copies = 1 if model.mtp_shared else model.mtp_layers
    blocks = [kind_params(model, plan, kind) for kind in model.mtp_kinds]
    h = model.hidden_size
    own = 3 * model.norm_params(h) + 2 * h * h / (plan.tp * plan.tp2) + sum(b.dense for b in blocks)
    embedding = model.vocab_size * h / plan.tp * (plan.pp > 1) * (not model.tied_embeddings)
    return StageParams(dense=copies * own + embedding, expert=copies * sum(b.expert for b in blocks))
