"""Decode attention over a paged KV cache on a GPU: does reading it cost a fixed time per page on top of its bytes?
(data/measured/2026-11-29-vllm-v0-decode-attention-grid.md). Run where a GPU is lent; writes one dated JSON file:

    python benchmarks/measure/paged_kv_gpu.py --out data/measured/gpu/<date>-<gpu>-paged-kv.json

Argonne's H100 runs of vLLM V0 read the cache more slowly with fewer KV heads per GPU, at equal grids and bytes. A
fixed cost per 16-token page on top of the bytes at a streaming rate fits them: t = pages · t_page + bytes / BW. This
script measures that form directly. It holds the grid at B·H = 512 programs of one (sequence, head) each, as vLLM's
decode graph launches at 7B tp 1 / 2 / 4, batch 16 / 32 / 64. It then varies the KV heads in a page row, H = 32, 16,
8, 2, so that a page is 16·H·256 bytes, over contexts of 512-3,072 tokens.

Layouts:
- ``interleaved``: sequence b's page j is block j·B + b, the order vLLM's allocator hands out blocks to a batch
  growing in lockstep;
- ``contiguous``: a sequence's pages are consecutive blocks;
- ``contiguous`` at 256-token pages: the bytes with few pages.

Kernels:
- ``fa2``: vllm_flash_attn.flash_attn_with_kvcache (the kernel the runs used) where that package is installed, its
  block table 256 pages wide as vLLM's graph pads it (max_model_len 4,096 / 16);
- ``triton``: paged_kv_kernel.py, the same walk over the pages.

Each row is the median of ``reps`` CUDA-event timings after warm-ups (unaligned_gemm_gpu._time). Each (kernel, layout,
page) gets a least-squares fit of t_page and BW over its rows (``fit``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

D = 128
GRID = 512  # B·H programs
HEADS = (32, 16, 8, 2)
CONTEXTS = (512, 1024, 2048, 3072)
SETTINGS = (("interleaved", 16), ("contiguous", 16), ("contiguous", 256))
TABLE_WIDTH = 4096 // 16  # vLLM's decode graph pads the block table to max_model_len / block_size
DEVICE = "cuda"


def table(batch: int, pages: int, layout: str) -> np.ndarray:
    """Block ids [batch, pages]: sequence b's page j at j·batch + b (``interleaved``) or b·pages + j."""
    b, j = np.meshgrid(np.arange(batch), np.arange(pages), indexing="ij")
    return (j * batch + b if layout == "interleaved" else b * pages + j).astype(np.int32)


def traffic(batch: int, heads: int, context: int, page: int) -> tuple[int, int]:
    """(K and V pages read, bytes read) of one call: every page of every sequence, 2 bytes an element."""
    return 2 * batch * math.ceil(context / page), 2 * batch * context * heads * D * 2


def fit(rows: list[dict]) -> dict:
    """Least squares of seconds = pages · t_page + bytes / BW over ``rows``."""
    a = np.array([[r["pages"], r["bytes"]] for r in rows], dtype=float)
    sol, *_ = np.linalg.lstsq(a, np.array([r["seconds"] for r in rows]), rcond=None)
    return {"t_page_ns": float(sol[0] * 1e9), "bw_tb_s": float(1e-12 / sol[1]) if sol[1] > 0 else None,
            "rows": len(rows)}


def _fa2():
    try:
        from vllm_flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None
    return flash_attn_with_kvcache


def measure(torch, kernel: str, heads: int, context: int, layout: str, page: int, reps: int) -> dict:
    from paged_kv_kernel import run
    from unaligned_gemm_gpu import _time

    batch = GRID // heads
    pages = math.ceil(context / page)
    ids = table(batch, pages, layout)
    blocks = int(ids.max()) + 1
    k, v = (torch.randn(blocks, page, heads, D, device=DEVICE, dtype=torch.float16) for _ in range(2))
    q = torch.randn(batch, heads, D, device=DEVICE, dtype=torch.float16) / math.sqrt(D)
    width = max(TABLE_WIDTH * 16 // page, pages)
    padded = torch.zeros(batch, width, dtype=torch.int32, device=DEVICE)
    padded[:, :pages] = torch.from_numpy(ids).to(DEVICE)
    lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    if kernel == "fa2":
        fa2 = _fa2()
        q4 = q.unsqueeze(1)  # [B, 1, H, D]

        def call():
            fa2(q4, k, v, cache_seqlens=lens, block_table=padded, causal=True)
    else:
        def call():
            run(torch, q, k, v, padded, lens)
    seconds = _time(torch, call, reps)
    n_pages, n_bytes = traffic(batch, heads, context, page)
    return {"kernel": kernel, "heads": heads, "batch": batch, "context": context, "layout": layout, "page": page,
            "seconds": seconds, "pages": n_pages, "bytes": n_bytes, "tb_s": n_bytes / seconds / 1e12}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    import torch

    import small_work_gpu as sw

    kernels = (("fa2",) if _fa2() else ()) + ("triton",)
    out: dict = {"machine": sw.machine(torch), "method": __doc__.split("\n\n")[2].strip(), "kernels": kernels,
                 "rows": [], "fits": []}
    for kernel in kernels:
        for layout, page in SETTINGS:
            rows = []
            for heads in HEADS:
                for context in CONTEXTS:
                    try:
                        rows.append(measure(torch, kernel, heads, context, layout, page, args.reps))
                    except (RuntimeError, TypeError, ValueError) as err:  # refused (shape, API): said, not skipped
                        rows.append({"kernel": kernel, "heads": heads, "context": context, "layout": layout,
                                     "page": page, "error": str(err).splitlines()[0]})
                    print(json.dumps(rows[-1]), flush=True)
            out["rows"] += rows
            good = [r for r in rows if "seconds" in r]
            if len(good) >= 2:
                out["fits"].append({"kernel": kernel, "layout": layout, "page": page} | fit(good))
                print(json.dumps(out["fits"][-1]), flush=True)
            Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
