"""Every byte of an inference GPU: weights, the KV cache, one layer's activations, the engine's workspace, and
what fits: the sequences the KV-cache pool holds at a context length (seed 004, "Lifetime for Inference Process":
weights live through the whole process; a layer's activations only until the next layer starts, so one layer's
worth is ever live).

Weights per GPU: training's placement (cost/params.layer_weights, end_params): the attention blocks, dense MLPs and
shared experts split t ways (MLA's down-projections, the norms and the router copied on every rank), the routed
experts split ep ways (whole experts) or t ways (ep = 1), the layers p ways; the vocabulary embedding and LM head t
ways, on the first and last stage. Block linears are stored in the scheme's weight format (precision.py);
embeddings, head, norms and router in 16 bits.

Budget (engine.py): with ``memory_basis = "total"`` the engine takes u·HBM (vLLM: "the current vLLM instance can
use total_gpu_memory x gpu_memory_utilization", gpu_memory_utilization = 0.9 by default, EngineArgs) and gives the
KV cache what the weights, the activations' profiled peak and the non-torch memory leave; with ``"free"`` it gives
the KV cache u × what is free after them (TensorRT-LLM KvCacheConfig.free_gpu_memory_fraction = 0.9).
A hybrid model's sequence also holds its Mamba layers' recurrent state, a fixed size whatever its context
(``state_bytes``).
Activations: the profiling pass runs ``max_batched_tokens`` rows, so the peak is the widest op's input and output
at that many rows beside the residual stream (two 16-bit copies), plus the sampler's fp32 logits of max_seqs rows.
The widths are the op records' (cost/shapes.py): the attention's input projections, fc1 beside the activation's
output, the routed experts' top-k copies of the same.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.cost.kv_cache import kv_heads_per_gpu, sequence_bytes
from meshplan.cost.params import end_params, layer_weights, qkv_linears
from meshplan.cost.records import ACT_BYTES
from meshplan.cost.shapes import fc1_width
from meshplan.serve.engine import Engine
from meshplan.serve.plan import PlanColumns
from meshplan.serve.precision import Quant
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import head_vocab
from meshplan.xp import Num, maximum


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU (scalars or arrays): the parts, the KV-cache pool, and what the batch asks of it."""

    weights: Num
    activations: Num
    workspace: Num
    kv_pool: Num  # what the engine gives the KV cache
    kv_used: Num  # what the batch's sequences occupy in it
    sequence: Num  # one sequence's pages on this GPU
    capacity: Num  # usable HBM (the engine's share)

    @property
    def total(self) -> Num:
        return self.weights + self.activations + self.workspace + self.kv_used

    @property
    def fits(self) -> Num:
        return (self.kv_used <= self.kv_pool) & (self.kv_pool > 0)

    def max_sequences(self, dpa: Num = 1) -> Num:
        """Sequences an instance holds at this context: ⌊pool / one sequence's pages⌋ per attention group."""
        return np.floor(np.maximum(self.kv_pool, 0.0) / self.sequence) * dpa


def weight_bytes(model: ModelSpec, tp: Num, pp: Num, ep: Num, quant: Quant) -> Num:
    """Weights on one GPU of the busiest (last) stage: L/p layers of each kind placed as training places them
    (cost/params.layer_weights; the routed experts over ep GPUs, or t when ep = 1; a whole KV head per rank past K
    ranks, as the KV cache keeps it: cost/kv_cache.kv_heads_per_gpu), block linears in the scheme's
    weight format, norms and router in 16 bits; the stage's own parameters (cost/params.end_params: the LM head, the
    embedding too when p = 1) in 16 bits. The multi-token-prediction layers are not loaded (vLLM loads them only as
    a speculative-decoding draft model)."""
    w = quant.weight_bytes
    spread = np.where(np.asarray(ep) > 1, ep, tp)
    layers: Num = 0.0
    for kind, n in model.block_counts.items():
        part = layer_weights(model, kind, tp, spread, kv_heads_per_gpu(model, tp))
        layers = layers + n * ((part.split + part.whole + part.expert) * w + part.kept * ACT_BYTES)
    return layers / pp + end_params(model, tp, np.asarray(pp) == 1, first=False) * ACT_BYTES


def state_bytes(model: ModelSpec, tp: Num) -> Num:
    """One sequence's recurrent state on one GPU of a hybrid model: per Mamba-2 layer the n_h·P·N SSM state and the
    (k − 1)·conv-channel conv state, split t ways as the heads are, in 16 bits (vLLM's mamba_ssm_cache_dtype and
    mamba_cache_dtype "auto": the model's dtype); fixed whatever the context, held from admission to the end."""
    layers = model.block_counts.get("mamba", 0)
    per_layer = model.mamba_heads * model.mamba_head_dim * model.mamba_state + \
        (model.mamba_conv - 1) * model.mamba_conv_dim
    return layers * per_layer * ACT_BYTES / np.asarray(tp, dtype=float)


def attention_width(model: ModelSpec) -> Num:
    """The widest output of the attention block's input projections on one unsplit GPU, as training's and serving's
    op records shape them (cost/params.qkv_linears over cost/shapes.py: the fused QKV projection; MLA's query and
    key-value up-projections)."""
    return max(n for _, n in qkv_linears(model))


def activation_bytes(model: ModelSpec, tp: Num, engine: Engine) -> Num:
    """Peak activations of one layer at the engine's max_batched_tokens rows (module docstring)."""
    rows, h, t = engine.max_batched_tokens, model.hidden_size, tp
    widest = max(attention_width(model), fc1_width(model, model.ffn_hidden_size) + model.ffn_hidden_size)
    if model.is_moe:
        ffn = model.moe_ffn_hidden_size
        widest = max(widest, model.moe_topk * (h + fc1_width(model, ffn) + ffn))
    if model.block_counts.get("mamba"):  # in_proj's z, x·B·C and dt
        widest = max(widest, model.mamba_inner + model.mamba_conv_dim + model.mamba_heads)
    stream = 2 * rows * h * ACT_BYTES
    logits = engine.max_seqs * head_vocab(model) / t * 4
    return stream + rows * (h + widest / t) * ACT_BYTES + logits


def kv_pool(capacity: float, used: Num, engine: Engine) -> Num:
    """What the engine gives the KV cache (module docstring), 0 when the rest does not fit."""
    if engine.mode("memory_basis").of_total:
        return maximum(engine.memory_utilization * capacity - used, 0.0)
    return engine.memory_utilization * maximum(capacity - used, 0.0)


def memory(model: ModelSpec, hbm: float, plan_cols: PlanColumns, quant: Quant, engine: Engine,
           context: Num) -> Memory:
    """The memory of one GPU of an instance (``plan_cols``: tp, pp, ep, dpa, batch as scalars or arrays) whose
    ``batch`` sequences hold ``context`` tokens each on average, in whole pages."""
    tp, pp, ep, dpa, batch = (plan_cols[k] for k in ("tp", "pp", "ep", "dpa", "batch"))
    weights = weight_bytes(model, tp, pp, ep, quant)
    acts = activation_bytes(model, tp, engine)
    fixed = weights + acts + engine.workspace
    pool = kv_pool(hbm, fixed, engine)
    one = (sequence_bytes(model, context, quant.kv_bytes, tp, engine.block_size) + state_bytes(model, tp)) / pp
    used = batch / dpa * one
    share = engine.memory_utilization * hbm if engine.mode("memory_basis").of_total else hbm
    return Memory(weights=weights, activations=acts, workspace=engine.workspace + 0 * tp, kv_pool=pool, kv_used=used,
                  sequence=one, capacity=share)
