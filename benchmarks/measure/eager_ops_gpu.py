"""Eager PyTorch's memory-bound training ops measured on a GPU, each alone, over sizes: the kernels a transformer layer
runs besides its GEMMs and attention (norms, activations, residual adds, bias gradients, layout copies, the loss), to
set each family's sustained bandwidth against the HBM rate meshplan streams them at (efficiency.py ``memory``). Run
where a GPU is lent; writes one dated JSON file.

    python benchmarks/measure/eager_ops_gpu.py --out data/measured/gpu/<date>-<gpu>-eager-ops.json

Each row: op, tokens T, width H, the forward alone (no autograd graph) and forward + backward (a random gradient;
``backward`` is their difference), each the median of 20 CUDA-event timings after warm-ups
(unaligned_gemm_gpu._time), and ``bytes``: the tensors the op must read and write at least, forward and backward, in
their dtypes (bf16 activations, fp32 statistics and logits), from which the sustained bandwidth follows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import small_work_gpu as sw  # noqa: E402  (the machine description)
from unaligned_gemm_gpu import _time  # noqa: E402  (CUDA-event medians)

SIZES = [(t, h) for h in (1024, 4096) for t in (2048, 8192, 32768)]
VOCAB = 32000


def _ops(torch, t: int, h: int) -> dict:
    """op -> (forward function of its inputs, its inputs, (forward bytes, backward bytes))."""
    F, bf = torch.nn.functional, torch.bfloat16

    def act(*shape, grad=True, dtype=bf):
        return torch.randn(*shape, device="cuda", dtype=dtype, requires_grad=grad)

    x, w, b = act(t, h), act(h), act(h)
    e = 2 * t * h  # one bf16 activation's bytes

    def hf_rms(a, weight):  # transformers' LlamaRMSNorm, eager
        v = a.float()
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6)
        return weight * v.to(bf)

    heads = h // 128
    return {
        "layer_norm": (lambda a, g, c: F.layer_norm(a, (h,), g, c), (x, w, b), (2 * e, 3 * e)),
        "rms_norm_hf": (hf_rms, (x, w), (2 * e, 3 * e)),
        "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), (act(t, 4 * h),), (8 * e, 12 * e)),
        "silu_mul": (lambda a, c: F.silu(a) * c, (act(t, 4 * h), act(t, 4 * h)), (12 * e, 16 * e)),
        "residual_add": (lambda a, c: a + c, (x, act(t, h)), (3 * e, 3 * e)),
        "bias_add": (lambda a, c: a + c, (act(t, 4 * h), act(4 * h)), (8 * e, 4 * e)),
        "transpose_copy": (lambda a: a.view(t // 1024, 1024, heads, 128).transpose(1, 2).contiguous(), (x,),
                           (2 * e, 2 * e)),
        "cross_entropy_fp32": (lambda a, y: F.cross_entropy(a.float(), y), (act(t, VOCAB),
                               torch.randint(0, VOCAB, (t,), device="cuda")),
                               (2 * t * VOCAB * 3, 2 * t * VOCAB * 4)),
    }


def measure(torch, t: int, h: int) -> list[dict]:
    rows = []
    for name, (fn, inputs, (fwd_bytes, bwd_bytes)) in _ops(torch, t, h).items():
        def forward(fn=fn, inputs=inputs):
            with torch.no_grad():
                fn(*inputs)

        out = fn(*inputs)
        grad = torch.randn_like(out) if out.dim() else torch.ones_like(out)

        def both(fn=fn, inputs=inputs, grad=grad):
            for tensor in inputs:
                tensor.grad = None
            fn(*inputs).backward(grad)

        fwd, total = _time(torch, forward, 20), _time(torch, both, 20)
        rows.append({"op": name, "tokens": t, "width": h, "fwd_s": fwd, "bwd_s": total - fwd, "fwd_bytes": fwd_bytes,
                     "bwd_bytes": bwd_bytes, "fwd_tb_s": fwd_bytes / fwd / 1e12,
                     "bwd_tb_s": bwd_bytes / max(total - fwd, 1e-9) / 1e12})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch

    out = {"machine": sw.machine(torch), "method": __doc__.split("\n\n", 2)[2].strip(), "rows": []}
    for t, h in SIZES:
        out["rows"] += measure(torch, t, h)
        torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
