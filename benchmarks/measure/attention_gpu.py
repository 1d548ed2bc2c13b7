"""Flash attention measured on a GPU: PyTorch SDPA's cuDNN and FlashAttention-2 backends, forward and backward, over
head dimension, sequence length and the causal mask, at a fixed token count and width, the shapes a training step's
``attn/core`` records price (efficiency.py, "Attention"). Run where a GPU is lent; writes one dated JSON file that
tests/test_attention_gpu.py reads (no GPU at test time).

    python benchmarks/measure/attention_gpu.py --out data/measured/gpu/<date>-<gpu>-attention.json

Each row: backend (cudnn | flash), head dim d, keys T, batch B = TOKENS / T, heads h = WIDTH / d, causal; the forward
alone (no autograd graph) and the forward + backward (``out.backward(grad)``), each the median of ``reps`` CUDA-event
timings after warm-ups (unaligned_gemm_gpu._time; the data file's run took 3); the backward is their difference. FLOPs
as meshplan counts them: forward 4·B·h·T²·d, halved under the causal mask; backward 2.5 × the forward.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import small_work_gpu as sw  # noqa: E402  (the machine description)
from unaligned_gemm_gpu import _time  # noqa: E402  (CUDA-event medians)

TOKENS = 16384
WIDTH = 2048
HEAD_DIMS = (64, 128)
KEYS = (512, 1024, 2048, 4096, 8192, 16384)


def measure(torch, backend, d: int, keys: int, causal: bool, reps: int) -> dict:
    from torch.nn.attention import sdpa_kernel

    batch, heads = TOKENS // keys, WIDTH // d
    q, k, v = (torch.randn(batch, heads, keys, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad = torch.randn(batch, heads, keys, d, device="cuda", dtype=torch.bfloat16)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def forward():
        with torch.no_grad():
            sdpa(q, k, v, is_causal=causal)

    def both():
        sdpa(q, k, v, is_causal=causal).backward(grad)

    with sdpa_kernel([backend]):
        fwd = _time(torch, forward, reps)
        total = _time(torch, both, reps)
    flops = 4.0 * batch * heads * keys * keys * d * (0.5 if causal else 1.0)
    return {"d": d, "keys": keys, "batch": batch, "heads": heads, "causal": causal, "fwd_s": fwd,
            "bwd_s": total - fwd, "fwd_flops": flops, "bwd_flops": 2.5 * flops,
            "fwd_tflops": flops / fwd / 1e12, "bwd_tflops": 2.5 * flops / (total - fwd) / 1e12}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args(argv)
    import torch
    from torch.nn.attention import SDPBackend

    out = {"machine": sw.machine(torch) | {"cudnn": torch.backends.cudnn.version()},
           "method": __doc__.split("\n\n")[2].strip(), "tokens": TOKENS, "width": WIDTH, "rows": []}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        for d in HEAD_DIMS:
            for keys in KEYS:
                for causal in (True, False):
                    try:
                        row = measure(torch, backend, d, keys, causal, args.reps)
                    except RuntimeError as err:  # a backend that refuses the shape: said, not skipped silently
                        row = {"d": d, "keys": keys, "causal": causal, "error": str(err).splitlines()[0]}
                    out["rows"].append({"backend": name} | row)
                    print(json.dumps(out["rows"][-1]), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
