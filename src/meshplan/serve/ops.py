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
from meshplan.cost.mamba import activation_product
from meshplan.cost.records import ACT_BYTES, FP32, OpCost
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


def mamba_ops(model: ModelSpec, sh: Shape) -> list[OpCost]:
    """A Mamba-2 block (Dao & Gu 2024) in an iteration, its heads and groups split t ways as training splits them
    (cost/mamba.mamba_block): pre-norm, in_proj (z, x·B·C, dt), the causal conv1d, the scan, the gated norm, out_proj
    and the tensor-parallel all-reduce. The prompts' tokens run the chunked SSD scan's forward kernels (the same
    records as training's, cost/mamba.activation_product, forward only: chunk states, C·Bᵀ, chunk scan, the states
    through HBM); a decoding sequence's token instead reads and writes its recurrent state, the n_h·P·N SSM state
    and the (k − 1)·conv-channel conv state, in the state cache's 16 bits (vLLM's mamba_ssm_cache_dtype "auto": the
    model's dtype), about 6 FLOPs per state element (h = exp(Δ·A)·h + Δ·B·x, y = C·h) (vLLM's
    selective_state_update kernel)."""
    t, a, rows = sh.tp, ACT_BYTES, sh.rows
    heads, groups, inner, conv = (model.mamba_heads / t, model.mamba_groups / t, model.mamba_inner / t,
                                  model.mamba_conv_dim / t)
    q, n, p, k = model.mamba_chunk, model.mamba_state, model.mamba_head_dim, model.mamba_conv
    ops = [norm("mamba/norm", model, sh),
           gemm("mamba/in_proj", rows, model.hidden_size, inner + conv + heads, sh.w_bytes, sh.a_bytes),
           stream("mamba/conv1d", 2 * a * rows * conv + 2 * a * sh.decode * (k - 1) * conv,
                  (2.0 * k + 4) * rows * conv)]
    chunks, tokens = sh.prefill / q, sh.prefill
    x, bc = tokens * heads * p * a, tokens * groups * n * a
    cb = chunks * groups * q * q * FP32
    ops += [activation_product("mamba/ssd_state", n, q, p, chunks * heads, bc + x)[0],
            activation_product("mamba/ssd_cb", q, n, q, chunks * groups, 2 * bc + cb)[0],
            activation_product("mamba/ssd_scan", q, q + n, p, chunks * heads, cb + bc + 2 * x)[0],
            stream("mamba/ssd_states", 12.0 * chunks * heads * n * p)]
    state = sh.decode * heads * p * n
    reads = sh.decode * (2 * groups * n + 2 * heads * p) * a  # B, C, x in and y out per decoding token
    ops.append(stream("mamba/state_update", 2 * a * state + reads, 6.0 * state))
    ops += [stream("mamba/gated_norm", 3 * a * rows * inner, 8.0 * rows * inner),
            gemm("mamba/out_proj", rows, inner, model.hidden_size, sh.w_bytes, sh.a_bytes),
            collective("mamba/tp", "all_reduce", rows * model.hidden_size * ACT_BYTES, "tp", t)]
    return ops


def hybrid_ops(model: ModelSpec, sh: Shape) -> dict[str, list[OpCost]]:
    """One block of each kind a hybrid model's ``layer_pattern`` has, each a layer of its own (model.py): attention
    alone, a dense MLP alone (its own pre-norm), Mamba-2; MoE blocks are serve/moe.py's (the caller adds them)."""
    builders = {"attention": attention_ops, "mlp": dense_ops, "mamba": mamba_ops}
    return {kind: builders[kind](model, sh) for kind in model.block_counts if kind in builders}
