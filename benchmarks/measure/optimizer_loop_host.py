"""The host time of Megatron's fp16 optimizer wrapper per parameter tensor, in the order the step runs it (issue 79;
data/measured/2026-11-28-mds-optimizer-order.md, meshplan_validation/sources.py MDS_FP16_TENSOR): the loops replayed
with plain PyTorch calls of the same kinds, on a GPT's parameter shapes, so that the per-op prices of the count
(14.5 us a kernel-launching op, after dgxc-benchmarking's 11.3-17.7 us per eager op of a model) can be checked
against a bare loop's.

- ``queued``: before the step's first synchronisation, per tensor an attribute test, the cast of an fp16 gradient
  (a view of one flat buffer) to a new fp32 tensor set as the master parameter's ``.grad``, the model parameter's
  ``.grad`` cleared, and the master gradient's ``.data`` collected;
- ``after``: the norm's filter (two attribute reads), its ``grad.type()`` string check and ``detach()``, three
  ``.data`` reads and a pass (FusedAdam's lists), two ``.data`` reads and a ``copy_`` back into the fp16 weight (the
  copy loop that the ``overflow_buf`` test sends it down), and two ``.grad = None`` passes (zero_grad).

Each loop is timed at n and 2n tensors (the least of ``--repeats``), per tensor = (t(2n) - t(n)) / n, with a
synchronisation before each timing and none inside it: host issue time only (on a GPU the kernels are tiny and the
queue never fills). On a CPU the "launches" are CPU kernels: the dispatcher's and allocator's part of a launch,
without cudaLaunchKernel; run it there at a tiny --width (8), where the CPU's own copies cost nothing.

Run: python benchmarks/measure/optimizer_loop_host.py [--device cuda] [--width 8] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any


def layer_shapes(width: int) -> list[tuple[int, ...]]:
    """A GPT layer's parameter tensors (Megatron's order: LayerNorm, QKV, projection, LayerNorm, fc1, fc2, with
    biases): 12 tensors."""
    h = width
    return [(h,), (h,), (3 * h, h), (3 * h,), (h, h), (h,), (h,), (h,), (4 * h, h), (4 * h,), (h, 4 * h), (h,)]


def build(torch: Any, n: int, width: int, device: str) -> list[SimpleNamespace]:
    """n parameter pairs: an fp16 model parameter whose main_grad views one flat fp16 buffer, its fp32 master."""
    shapes = [layer_shapes(width)[i % 12] for i in range(n)]
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    buffer = torch.zeros(sum(sizes), dtype=torch.float16, device=device)
    pairs, at = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        model = torch.nn.Parameter(torch.zeros(shape, dtype=torch.float16, device=device))
        model.main_grad = buffer[at:at + size].view(shape)
        model.shared = False
        at += size
        pairs.append(SimpleNamespace(model=model, main=torch.nn.Parameter(model.detach().clone().float())))
    return pairs


def queued(pairs: list[SimpleNamespace]) -> None:
    for p in pairs:
        if hasattr(p.model, "main_grad"):
            p.main.grad = p.model.main_grad.float()
        p.model.grad = None
    [p.main.grad.data for p in pairs if p.main.grad is not None]


def after(pairs: list[SimpleNamespace], torch: Any) -> None:
    params = [p.main for p in pairs]
    [q.grad for q in params if q.grad is not None and not getattr(q, "shared", False)
     and getattr(q, "tensor_model_parallel", True)]
    [q.grad.detach() for q in params if q.grad is not None and q.grad.type() != "torch.HalfTensor"]
    [(q.grad.data, q.data, q.data) for q in params if q.grad is not None]
    model, main = [p.model.data for p in pairs], [p.main.data for p in pairs]
    for m, w in zip(main, model, strict=True):
        w.copy_(m)
    for p in pairs:
        p.model.grad = None
    for p in pairs:
        p.main.grad = None


def per_tensor(torch: Any, device: str, n: int, width: int, repeats: int) -> dict[str, float]:
    """Host microseconds a tensor of each loop: (t(2n) - t(n)) / n, each t the least of ``repeats``."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    out: dict[str, float] = {}
    for name in ("queued", "after"):
        best = {}
        for k in (n, 2 * n):
            pairs, times = build(torch, k, width, device), []
            for _ in range(repeats):
                queued(pairs)  # every loop finds the gradients it expects
                sync()
                t = time.perf_counter()
                queued(pairs) if name == "queued" else after(pairs, torch)
                times.append(time.perf_counter() - t)
            best[k] = min(times)
        out[name] = (best[2 * n] - best[n]) / n * 1e6
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tensors", type=int, default=144)  # a 12-layer GPT's layers
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)  # torchrun's OMP_NUM_THREADS=1
    result = {"device": args.device, "torch": torch.__version__, "python": platform.python_version(),
              "cpu": platform.processor() or platform.machine(), "tensors": args.tensors, "width": args.width,
              "us_per_tensor": per_tensor(torch, args.device, args.tensors, args.width, args.repeats),
              "counted_us": {"queued": 15.0, "after": 17.2}}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    sys.stdout.write(text + "\n")


if __name__ == "__main__":
    main()
