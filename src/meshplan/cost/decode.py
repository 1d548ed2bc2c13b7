"""Inference's own per-op records, forward only, on one GPU of one attention group in one iteration (phase
``"serve"``): what an iteration runs (``Shape``), the forward records of a GEMM, a memory-bound stream, a collective
and a pre-norm at the byte sizes of a quantisation scheme, and the ops that only inference runs: the new tokens'
KV-cache write, attention over the prompts past a cached prefix, decode attention over the cache (FlashDecoding / paged
attention), MLA in its absorbed form. serve/ops.py and serve/moe.py compose them with the training forward's shapes
(cost/shapes.py); a prefill of whole prompts gives the training forward pass's FLOPs (tests/test_engines_agree.py).

Symbols: R rows (tokens) a GPU's GEMMs see in the iteration = D + P, D decoding sequences (one token each, each
attending to c cached tokens), P prompt tokens of n prompts that already hold p tokens each in the cache (0: whole
prompts; chunked prefill: the later chunks), t tensor-parallel size, the rest as records.py (H, F, A, K, d, V, E, k,
Fe). Byte sizes: w the weights' (quantised), a an activation a GEMM reads (its input, quantised with the weights in
W8A8 / W4A4; the quantisation is fused into the kernel before it, as vLLM's and TensorRT-LLM's fused norm-quant and
activation-quant kernels do), 2 for everything else, b the KV cache's (serve/precision.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.cost import blocks
from meshplan.cost.attention import head_dims, window_keys
from meshplan.cost.blocks import elementwise
from meshplan.cost.kv_cache import kept_tokens, kv_heads_per_gpu, layer_token_bytes, window_share
from meshplan.cost.records import ACT_BYTES, OpCost
from meshplan.cost.shapes import kv_up_shape
from meshplan.specs.model import ModelSpec
from meshplan.xp import Num, maximum

PHASE = "serve"


@dataclass(frozen=True, slots=True)
class Shape:
    """What one GPU of one attention group runs in one iteration (module glossary); scalars or arrays alike."""

    tp: Num
    dpa: Num
    ep: Num
    decode: Num  # D
    context: Num  # c
    prefill: Num  # P
    prompts: Num  # n
    prefix: Num  # p
    w_bytes: Num
    a_bytes: Num
    kv_bytes: Num
    absorb: bool = True
    gather: bool = False  # MoE under data-parallel attention by all-gather / reduce-scatter (engine.moe_comm)
    # MoE dispatch and combine of an iteration with prompt tokens forwarded through each node (engine.moe_comm deepep)
    forwarded: bool = False
    per_query_head: bool = False  # decode attention reads a KV head once per query head (engine.kv_per_query_head)
    # rows a captured decode graph runs beyond D (engine.graph_padding): dummy sequences that pass through every GEMM
    # and per-token op and attend to no cache
    padded: Num = 0.0
    # GEMMs of at most ``skinny_rows`` rows run at ``skinny_rate`` of the modelled rate (engine.skinny_gemm_rows)
    skinny_rows: Num = 0.0
    skinny_rate: Num = 1.0
    engine_all_reduce: bool = True  # the engine's own tensor-parallel all-reduce kernel, else the GPU's library's

    @property
    def rows(self) -> Num:
        return self.decode + self.prefill + self.padded


_NO_GROUP = 1e-30  # the divisor when no expert is touched (m = 0 too): below any expected count of touched experts


def gemm(name: str, m: Num, k: Num, n: Num, w: Num, a: Num, groups: Num = 1.0, weights: Num | None = None
         ) -> OpCost:
    """(m×k)·(k×n): reads its input (a bytes) and ``weights`` k·n·groups elements (w bytes), writes 16-bit
    output; ``groups`` GEMMs of m/groups rows each (a grouped GEMM: the touched experts; none when no token
    arrives, m = 0, whose rows per group are 0, not 0/0)."""
    elems = k * n * groups if weights is None else weights
    return OpCost(name, PHASE, "gemm", 2.0 * m * k * n, a * m * k + w * elems + ACT_BYTES * m * n,
                  m=m / maximum(groups, _NO_GROUP), n=n, k=k, groups=groups)


def sixteen_bit(op: OpCost) -> OpCost:
    """A GEMM kept in 16 bits whatever the scheme (the router, the LM head): priced at the 16-bit rate."""
    return replace(op, variant="bf16")


def stream(name: str, nbytes: Num, flops: Num = 0.0) -> OpCost:
    return OpCost(name, PHASE, "memory", flops, nbytes)


def collective(name: str, kind: str, nbytes: Num, axis: str, group: Num) -> OpCost:
    """A collective of an inference iteration: training's record (cost/blocks.collective) in phase ``serve``."""
    return blocks.collective(name, PHASE, kind, nbytes, axis, group)


def forward(ops: list[OpCost]) -> OpCost:
    """The forward record of a training op (cost/blocks.py: its first), as inference runs it."""
    return replace(ops[0], phase=PHASE)


def activation(name: str, rows: Num, width_in: Num, ffn: Num) -> OpCost:
    """The MLP's activation over ``rows`` rows, fc1's output of ``width_in`` in, ``ffn`` out: the training forward's
    element-wise record (cost/blocks.elementwise, 8 FLOPs an input element, as mlp_moe.mlp_gemms has it)."""
    return forward(elementwise(name, rows * width_in, rows * ffn, 8.0))


def norm(name: str, model: ModelSpec, sh: Shape) -> OpCost:
    """A pre-norm with the residual add before it in one kernel, as inference engines fuse them (vLLM's
    fused_add_rms_norm: reads the block's output and the residual, writes the new residual and the normalised
    input): 4 elements a row element, 8 FLOPs. Training keeps them two records (cost/blocks.norm and residual: 5
    element reads and writes), its backward needing the norm's input."""
    return stream(name, 4 * ACT_BYTES * sh.rows * model.hidden_size, 8.0 * sh.rows * model.hidden_size)


def kv_write(model: ModelSpec, sh: Shape) -> OpCost:
    """The new tokens' cache write: each of the R rows' keys and values (MLA: its latent) at the cache's precision,
    read at 16 bits (layer_token_bytes)."""
    return stream("attn/kv_write", sh.rows * (layer_token_bytes(model, sh.tp, sh.kv_bytes)
                                              + layer_token_bytes(model, sh.tp, ACT_BYTES)))


def decode_attention(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """D queries against their c cached tokens (the windowed layers' share: at most the window): every cached key
    and value read once per sequence (paged / FlashDecoding kernels share a KV head's read among its A/K query
    heads), FLOPs 2·D·c·A/t·(d_qk + d_v). A kernel with one thread block per query head (FasterTransformer's masked
    multi-head attention, ``sh.per_query_head``) reads each KV head once per query head of its group: ``repeat`` =
    A/K reads of the same bytes, the repeats served by the L2 cache (iteration.op_seconds)."""
    if model.is_mla:
        return mla_decode(model, sh)
    heads, (d_qk, d_v) = model.num_heads / sh.tp, head_dims(model)
    keys = kept_tokens(model, sh.context)
    cached = sh.decode * keys * layer_token_bytes(model, sh.tp, sh.kv_bytes)
    q_out = ACT_BYTES * sh.decode * heads * (d_qk + d_v)
    reads = heads / kv_heads_per_gpu(model, sh.tp) if sh.per_query_head else 1.0
    return [OpCost("attn/decode", PHASE, "attention", 2.0 * sh.decode * keys * heads * (d_qk + d_v), cached + q_out,
                   m=sh.decode * heads, n=maximum(keys, 1.0), k=d_qk, variant="flash", repeat=reads)]


def mla_decode(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """MLA in decode. Absorbed (DeepSeek-V2 §2.1.2; FlashMLA): q_nope·W_UK per head into the latent space (A/t
    batched GEMMs nope → d_c), an MQA over the cached latent with queries of d_c + d_R and values of d_c, then
    W_UV per head (d_c → d_v): the cache is read once for all heads. Not absorbed: the cached latents of every
    sequence are up-projected to keys and values (kv_up over D·c rows) and attended as standard heads."""
    heads, dc, dr = model.num_heads / sh.tp, model.kv_lora_rank, model.qk_rope_head_dim
    nope, dv, D, c = model.qk_nope_head_dim, model.v_head_dim, sh.decode, sh.context
    cached = D * c * (dc + dr) * sh.kv_bytes
    if sh.absorb:
        return [gemm("attn/q_absorb", D * heads, nope, dc, sh.w_bytes, ACT_BYTES, groups=heads),
                OpCost("attn/decode", PHASE, "attention", 2.0 * D * c * heads * (2 * dc + dr),
                       cached + ACT_BYTES * D * heads * (2 * dc + dr), m=D * heads, n=maximum(c, 1.0), k=dc + dr,
                       variant="flash"),
                gemm("attn/v_absorb", D * heads, dc, dv, sh.w_bytes, ACT_BYTES, groups=heads)]
    up = gemm("attn/kv_up", D * c, *kv_up_shape(model, sh.tp), sh.w_bytes, sh.kv_bytes)
    d_qk = nope + dr
    return [up, OpCost("attn/decode", PHASE, "attention", 2.0 * D * c * heads * (d_qk + dv),
                       ACT_BYTES * D * c * heads * (d_qk + dv) + ACT_BYTES * D * heads * (d_qk + dv),
                       m=D * heads, n=maximum(c, 1.0), k=d_qk, variant="flash")]


def prefill_attention(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """P prompt tokens of n prompts, each chunk of P/n tokens attending causally to its p cached tokens and itself:
    FLOPs 2·P·(p + P/(2n))·A/t·(d_qk + d_v) (p = 0: the training forward's causal half, FlashAttention skipping the
    masked blocks; a windowed layer's queries see cost/attention.window_keys on average, the training forward's
    ModelSpec.window_keys() for whole prompts); bytes its q, k, v and output and the cached prefix. MLA prefills in
    the standard form (vLLM's MLA prefill path): kv_up over the chunk's and the prefix's latents."""
    heads, (d_qk, d_v) = model.num_heads / sh.tp, head_dims(model)
    P, n, p = sh.prefill, maximum(sh.prompts, 1), sh.prefix  # no prompts: P = 0, no FLOPs
    keys = p + P / (2 * n)  # the average query's keys
    if model.sliding_window:  # the windowed layers' share: each query's min(i + 1, w) keys, averaged over its chunk
        share = window_share(model)
        keys = (1 - share) * keys + share * window_keys(model.sliding_window, p, maximum(P / n, 1.0))
    kv_heads = heads if model.is_mla else kv_heads_per_gpu(model, sh.tp)
    own = ACT_BYTES * P * (heads * (d_qk + d_v) + kv_heads * (d_qk + d_v))
    cached = n * p * layer_token_bytes(model, sh.tp, sh.kv_bytes)
    ops = [OpCost("attn/prefill", PHASE, "attention", 2.0 * P * keys * heads * (d_qk + d_v), own + cached,
                  m=P * heads, n=maximum(p + P / n, 1.0), k=d_qk, variant="flash_causal")]
    if model.is_mla:
        ops.insert(0, gemm("attn/kv_up", P + n * p, *kv_up_shape(model, sh.tp), sh.w_bytes, sh.a_bytes))
    return ops
