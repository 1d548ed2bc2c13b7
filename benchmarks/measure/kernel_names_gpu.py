"""Which CUDA kernels each aten op of a small GPT's training layer launches (issue 46, item 2): the evidence behind
benchmarks/measure/eager_kernels.py's ``CUDA_EXTRA`` and cost/eager.py's kernel counts. Run where a GPU is lent:

    python benchmarks/measure/kernel_names_gpu.py data/measured/gpu/<date>-<gpu>-kernel-names.json

For each ``--stack`` of benchmarks/measure/small_work_gpu.py (the plain-PyTorch GPT and Megatron-Core's local-spec GPT,
its wheel importable) at width 1024, micro-batch 1, seq 1024, and two depths (2 and 6 layers: their difference over 4 is
one layer, free of the embedding and the head), one forward and one backward pass after 3 warm-up steps under
torch.profiler; each CUDA kernel is counted under the chain of CPU ops that launched it (the innermost op first,
through its ``cpu_parent``s: the aten op, its caller, the autograd node). Memsets and memcpys are listed too (small_
work_gpu.py's kernel count leaves them out). Then SDPA's backward under each backend (flash, cuDNN, efficient) on
one 16-head 1024 x 64 causal attention, its kernels by aten op. The committed file (2026-11-26, H200) came from a
compact copy of these functions run inline on the device machine, its two outputs joined under a ``source`` line.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WIDTH, BATCH, DEPTHS = 1024, 1, (2, 6)


def _chains(prof) -> collections.Counter:  # type: ignore[no-untyped-def]
    """Kernel count per "op < caller < ... || kernel" of one profile."""
    counts: collections.Counter = collections.Counter()
    for evt in prof.events():
        if not str(evt.device_type).endswith("CPU"):
            continue
        for kernel in evt.kernels:
            chain, node = [], evt
            while node is not None:
                chain.append(node.name)
                node = node.cpu_parent
            counts[" < ".join(chain) + " || " + kernel.name[:150]] += 1
    return counts


def _passes(torch, model, tokens, labels) -> dict:  # type: ignore[no-untyped-def]
    """One forward and one backward pass of ``model`` profiled apart, after 3 warm-up steps."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        model(tokens, labels).backward()
    torch.cuda.synchronize()
    out, held = {}, []
    for phase in ("fwd", "bwd"):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            if phase == "fwd":
                held.append(model(tokens, labels))
            else:
                held.pop().backward()
            torch.cuda.synchronize()
        chains = _chains(prof)
        out[phase] = {"kernels": sum(chains.values()), "by_chain": dict(sorted(chains.items()))}
    return out


def layer_passes(torch) -> dict:  # type: ignore[no-untyped-def]
    """{"<stack> <layers> <fwd|bwd>": {"kernels": n, "by_chain": {...}}} of small_work_gpu.py's GPTs."""
    import small_work_gpu as gpu

    out = {}
    for stack in ("pytorch", "megatron"):
        gpu.STACK["name"] = stack
        for layers in DEPTHS:
            torch.manual_seed(0)
            model = gpu.build(torch, WIDTH, layers, gpu.SEQ)
            tokens, labels = (torch.randint(0, gpu.VOCAB, (BATCH, gpu.SEQ), device="cuda") for _ in range(2))
            for phase, found in _passes(torch, model, tokens, labels).items():
                out[f"{stack} {layers} {phase}"] = found
    return out


def sdpa_backward(torch) -> dict:  # type: ignore[no-untyped-def]
    """{backend: [[aten op, kernel], ...]} of one SDPA backward pass per backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    out = {}
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        q, k, v = (torch.randn(1, 16, 1024, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        with sdpa_kernel(backend):
            for _ in range(3):
                torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            grad = torch.ones_like(o)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                o.backward(grad)
                torch.cuda.synchronize()
        out[backend.name] = [[e.name, kern.name[:150]] for e in prof.events() if str(e.device_type).endswith("CPU")
                             for kern in e.kernels]
    return out


def main(argv: list[str] | None = None) -> int:
    import torch

    path = Path((argv or sys.argv[1:])[0])
    data = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(),
            "width": WIDTH, "batch": BATCH, "passes": layer_passes(torch), "sdpa_backward": sdpa_backward(torch)}
    path.write_text(json.dumps(data, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
