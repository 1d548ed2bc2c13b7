"""Per-op costs of inference: one iteration of one instance, on one GPU of one attention group, as the flat
``OpCost`` records the training model uses (cost/records.py), phase ``"serve"``, forward only: the composer of one
layer's attention block and dense MLP from the shared op library (symbols: cost/decode.py).

A prefill of whole prompts runs the training forward pass's ops: the same projection shapes (cost/shapes.py), the
same GEMM and attention FLOPs, FlashAttention's causal halving (tests/test_engines_agree.py checks every preset),
without what only training keeps. Inference adds the records of cost/decode.py: the KV-cache write of each new
token and, in decode, attention over the cache (a memory-bound kernel, FlashDecoding / paged attention), MLA in its
absorbed form (engine.mla_absorb), the experts a decode batch touches (moe.py), and logits only for the last position
of each sequence (iteration.edge_ops: vLLM's LogitsProcessor keeps the last token's hidden state).
"""

from __future__ import annotations

from meshplan.cost.decode import (
    Shape,
    activation,
    collective,
    decode_attention,
    gemm,
    kv_write,
    norm,
    prefill_attention,
    stream,
)
from meshplan.cost.kv_cache import kv_heads_per_gpu
from meshplan.cost.records import ACT_BYTES, OpCost
from meshplan.cost.shapes import fc1_width, qkv_shapes
from meshplan.specs.model import ModelSpec
from meshplan.xp import Num


def qkv_ops(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """The query, key and value projections (cost/shapes.qkv_shapes: the training forward's; an engine keeps a whole
    KV head per rank past K ranks) and the new tokens' cache write. In MLA's absorbed form the up-projection of the
    keys is applied to the query instead (decode.mla_decode); its prefill up-projects the latents
    (decode.prefill_attention)."""
    kv_heads = None if model.is_mla else kv_heads_per_gpu(model, sh.tp)
    ops = [gemm(name, sh.rows, k, n, sh.w_bytes, sh.a_bytes) for name, k, n in qkv_shapes(model, sh.tp, kv_heads)]
    return ops + [kv_write(model, sh)]


def attention_ops(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """One attention block: norm, projections, cache write, attention over the prompts and the cache, output
    projection, the tensor-parallel all-reduce (Shoeybi et al. 2019, Fig. 3)."""
    ops = [norm("attn/norm", model, sh), *qkv_ops(model, sh)]
    ops += prefill_attention(model, sh) + decode_attention(model, sh)
    if model.attn_output_gate:  # sigmoid(gate) * output: cost/attention.output_gate's forward record
        gated = sh.rows * model.gate_dim / sh.tp
        ops.append(stream("attn/out_gate", 3 * ACT_BYTES * gated, 5.0 * gated))
    ops.append(gemm("attn/out", sh.rows, model.attn_out_dim / sh.tp, model.hidden_size, sh.w_bytes, sh.a_bytes))
    ops.append(collective("attn/tp", "all_reduce", sh.rows * model.hidden_size * ACT_BYTES, "tp", sh.tp))
    return ops


def mlp_ops(model: ModelSpec, sh: Shape, ffn: Num, prefix: str = "mlp") -> list[OpCost]:
    """A dense MLP of width ``ffn`` split t ways: fc1 (gate and up), the activation, fc2."""
    width_in = fc1_width(model, ffn)
    R, h = sh.rows, model.hidden_size
    return [gemm(f"{prefix}/fc1", R, h, width_in, sh.w_bytes, sh.a_bytes),
            activation(f"{prefix}/act", R, width_in, ffn),
            gemm(f"{prefix}/fc2", R, ffn, h, sh.w_bytes, sh.a_bytes)]


def dense_ops(model: ModelSpec, sh: Shape) -> list[OpCost]:
    ops = [norm("mlp/norm", model, sh), *mlp_ops(model, sh, model.ffn_hidden_size / sh.tp)]
    return ops + [collective("mlp/tp", "all_reduce", sh.rows * model.hidden_size * ACT_BYTES, "tp", sh.tp)]
