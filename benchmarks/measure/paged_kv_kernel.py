"""A paged-KV decode attention kernel in Triton, the proxy that benchmarks/measure/paged_kv_gpu.py times beside
vLLM's own FlashAttention-2 kernel (vllm_flash_attn.flash_attn_with_kvcache) where that is installed.

One program per (sequence, KV head), as FlashAttention-2's split-KV kernel runs one CTA per (sequence, head) when
its grid is not split (vllm-project/flash-attention v2.6.1 csrc/flash_attn/src/flash_fwd_launch_template.h:104). It
walks the sequence's keys in tiles of TILE = 128 tokens (FA2's kBlockN at head dimension 128, :166). Each row's page
comes from the block table, and the row is read from the vLLM flash layout [blocks, PAGE, heads, D] (vLLM v0.6.1
FlashAttentionBackend.get_kv_cache_shape), with an online softmax over the tiles. The query is one token per
sequence and per head (MHA). Imported only where triton is; TRITON_INTERPRET=1 runs it on a CPU
(tests/test_paged_kv_gpu.py).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def paged_decode(q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, table_stride, page_stride, row_stride, heads,
                 PAGE: tl.constexpr, TILE: tl.constexpr, D: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, D)
    r = tl.arange(0, TILE)
    q = tl.load(q_ptr + (b * heads + h) * D + d).to(tl.float32)
    n = tl.load(lens_ptr + b)
    m_i = tl.zeros([1], tl.float32) - float("inf")
    l_i = tl.zeros([1], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for start in range(0, n, TILE):
        tok = start + r
        valid = tok < n
        page = tl.load(table_ptr + b * table_stride + tok // PAGE, mask=valid, other=0)
        base = page.to(tl.int64) * page_stride + (tok % PAGE) * row_stride + h * D
        k = tl.load(k_ptr + base[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(k * q[None, :], 1), float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        p = tl.exp(s - m_new)
        alpha = tl.exp(m_i - m_new)
        v = tl.load(v_ptr + base[:, None] + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, 0)
        l_i = l_i * alpha + tl.sum(p, 0)
        m_i = m_new
    tl.store(out_ptr + (b * heads + h) * D + d, acc / l_i)


def run(torch, q, k_cache, v_cache, table, lens, tile: int = 128):
    """Launch ``paged_decode``: q [B, H, D] (scaled), caches [blocks, PAGE, H, D], table [B, width] int32, lens [B]
    int32; returns [B, H, D] in fp32."""
    batch, heads, dim = q.shape
    out = torch.empty(batch, heads, dim, dtype=torch.float32, device=q.device)
    page = k_cache.shape[1]
    paged_decode[(batch, heads)](q, k_cache, v_cache, table, lens, out, table.stride(0), k_cache.stride(0),
                                 k_cache.stride(1), heads, PAGE=page, TILE=tile, D=dim)
    return out
