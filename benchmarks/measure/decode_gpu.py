"""Decode steps of a Llama-shaped model measured on a GPU (issue 46, items 3 and 4): how long one token step takes
when the host issues every kernel (eager PyTorch), when the step is replayed from one CUDA graph (what vLLM and
SGLang do up to their capture sizes), and when it is compiled as gpt-fast compiles it (torch.compile,
mode="reduce-overhead": Inductor's fused kernels replayed as CUDA graphs), with the weight GEMMs alone beside them.
Run where a GPU is lent; writes one dated JSON file that benchmarks/docs/decode_gpu_doc.py sets against meshplan's
serving estimate (docs/DECODE_GPU.md).

    python benchmarks/measure/decode_gpu.py --out data/measured/gpu/<date>-nvidia-h200-decode.json

The model is written here from the structure gpt-fast's README and blog describe (pytorch-labs/gpt-fast model.py:
a static KV cache written in place with index_copy, a fused QKV projection, rotary embeddings, SDPA over the whole
static cache under a boolean mask, RMSNorm, a SwiGLU MLP of three projections, an untied LM head, greedy sampling);
bf16 weights drawn at random (timing does not depend on their values). Shapes (``--shape``): Llama 2 7B (32 layers of
width 4,096, 32 heads of 128, MLP 11,008, vocabulary 32,000) or Llama 2 70B (80 of 8,192, 64 query and 8 KV heads,
MLP 28,672). The cache holds ``--cache`` positions and every step reads all of
them (the mask hides the unwritten ones), as gpt-fast's does, so the work of a step is known exactly.

For each batch b:
    eager      wall clock per step over ``steps`` steps after ``warmup``, the host issuing each kernel; and the
               issuing thread's CPU time per step (the host's work, when the GPU is ahead it waits on the host)
    graph      the same step captured once as a CUDA graph (torch.cuda.CUDAGraph) and replayed: the GPU's time with
               no host between kernels
    compiled   (``--compiled`` batches) torch.compile(mode="reduce-overhead", fullgraph=True) of the step, gpt-fast's
               decode_one_token, with its kernels profiled; and the same Inductor kernels launched one by one
               (torch.compile's default mode: no CUDA graphs), time and kernels
    kernels    one eager step under torch.profiler: each kernel's name, count and summed duration

and the GEMMs alone (``gemms``): each weight matrix of a layer and the LM head at m = b rows, 20 in a row replayed
from a CUDA graph (time per GEMM, and the bytes it must read: the weights plus the activations), beside a 2 GiB
device copy (the streaming rate those bytes could move at).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import small_work_gpu  # noqa: E402  (the same folder: its timing helper)

DEVICE = os.environ.get("DECODE_DEVICE", "cuda")  # cpu: a smoke test of this script on a machine without a GPU
SHAPES = {"llama2-7b": {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "head_dim": 128, "ffn": 11008,
                        "vocab": 32000},
          "llama2-70b": {"layers": 80, "hidden": 8192, "heads": 64, "kv_heads": 8, "head_dim": 128, "ffn": 28672,
                         "vocab": 32000}}


def _sync(torch) -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def build(torch, shape: dict, batch: int, cache: int):
    """The decode step, a module ``step(tokens [b, 1], pos [1]) -> next tokens [b]`` whose weights and KV cache are
    buffers (static addresses, which CUDA-graph replay needs and gpt-fast's modules have; module docstring)."""
    F = torch.nn.functional
    h, a, kv, d, f = shape["hidden"], shape["heads"], shape["kv_heads"], shape["head_dim"], shape["ffn"]
    dt = torch.bfloat16 if DEVICE == "cuda" else torch.float32

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for name, size in {"wqkv": ((a + 2 * kv) * d, h), "wo": (h, a * d), "w1": (f, h), "w3": (f, h),
                               "w2": (h, f)}.items():
                self.register_buffer(name, torch.randn(*size, device=DEVICE, dtype=dt) * 0.02)
            for name in ("norm1", "norm2"):
                self.register_buffer(name, torch.ones(h, device=DEVICE, dtype=dt))
            for name in ("k", "v"):
                self.register_buffer(name, torch.zeros(batch, kv, cache, d, device=DEVICE, dtype=dt))

        def forward(self, x, pos, m, rope):
            q, k, v = F.linear(rms(x, self.norm1), self.wqkv).split([a * d, kv * d, kv * d], dim=-1)
            q, k = rotary(q.view(batch, 1, a, d), rope), rotary(k.view(batch, 1, kv, d), rope)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.view(batch, 1, kv, d).transpose(1, 2)
            self.k.index_copy_(2, pos, k)
            self.v.index_copy_(2, pos, v)
            y = F.scaled_dot_product_attention(q, self.k, self.v, attn_mask=m, enable_gqa=kv != a)
            x = x + F.linear(y.transpose(1, 2).reshape(batch, 1, a * d), self.wo)
            z = rms(x, self.norm2)
            return x + F.linear(F.silu(F.linear(z, self.w1)) * F.linear(z, self.w3), self.w2)

    def rms(x, weight):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * weight

    def rotary(x, r):  # x [b, 1, heads, d], r [1, 1, 1, d/2, 2]
        xs = x.float().reshape(*x.shape[:-1], -1, 2)
        out = torch.stack([xs[..., 0] * r[..., 0] - xs[..., 1] * r[..., 1],
                           xs[..., 1] * r[..., 0] + xs[..., 0] * r[..., 1]], -1)
        return out.flatten(3).type_as(x)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Layer() for _ in range(shape["layers"]))
            self.register_buffer("embed", torch.randn(shape["vocab"], h, device=DEVICE, dtype=dt) * 0.02)
            self.register_buffer("head", torch.randn(shape["vocab"], h, device=DEVICE, dtype=dt) * 0.02)
            self.register_buffer("norm", torch.ones(h, device=DEVICE, dtype=dt))
            freqs = 1.0 / 10000 ** (torch.arange(0, d, 2, device=DEVICE).float() / d)
            angles = torch.outer(torch.arange(cache, device=DEVICE).float(), freqs)
            self.register_buffer("rope", torch.stack([angles.cos(), angles.sin()], dim=-1))  # [cache, d/2, 2]
            self.register_buffer("mask", torch.tril(torch.ones(cache, cache, dtype=torch.bool, device=DEVICE)))

        def forward(self, tokens, pos):
            x = F.embedding(tokens, self.embed)  # [b, 1, h]
            m, r = self.mask[pos].view(1, 1, 1, cache), self.rope[pos].view(1, 1, 1, d // 2, 2)
            for layer in self.layers:
                x = layer(x, pos, m, r)
            return F.linear(rms(x, self.norm), self.head)[:, -1].argmax(dim=-1)

    return Decoder()


def _timed(torch, fn, steps: int, warmup: int) -> tuple[float, float]:
    """(wall seconds, issuing thread's CPU seconds) per call: medians over ``steps`` after ``warmup``
    (small_work_gpu's timing, on this script's device)."""
    small_work_gpu.DEVICE = DEVICE
    return small_work_gpu._median_pass(torch, fn, steps, warmup)


def _run_of(torch, fn, repeat: int, steps: int, warmup: int) -> float:
    """Seconds per call of ``fn`` when ``repeat`` calls run back to back (one sync per run), median over runs."""
    def many():
        for _ in range(repeat):
            fn()
    wall, _ = _timed(torch, many, steps, warmup)
    return wall / repeat


def _graph(torch, fn):
    """``fn`` captured as one CUDA graph; returns its replay (CPU: ``fn`` itself)."""
    if DEVICE != "cuda":
        return fn
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def kernels(torch, fn, runtime: bool = False) -> list[dict]:
    """One call of ``fn`` under torch.profiler: per kernel name, its count and summed microseconds (``runtime``:
    the CUDA runtime calls the host made instead, cudaLaunchKernel or cudaGraphLaunch)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
    with profile(activities=acts) as prof:
        fn()
        _sync(torch)
    out: dict[str, list[float]] = {}
    for evt in prof.events():
        gpu = str(getattr(evt, "device_type", "")).endswith("CUDA")
        wanted = evt.name.startswith("cu") and "Launch" in evt.name if runtime else gpu and "Memcpy" not in evt.name
        if wanted:
            row = out.setdefault(evt.name[:160], [0, 0.0])
            row[0] += 1
            row[1] += evt.time_range.elapsed_us()
    return [{"name": k, "count": c, "us": round(us, 2)} for k, (c, us) in sorted(out.items(), key=lambda kv: -kv[1][1])]


def measure_batch(torch, shape: dict, batch: int, cache: int, steps: int, warmup: int, compiled: bool) -> dict:
    step = build(torch, shape, batch, cache)
    tokens = torch.zeros(batch, 1, dtype=torch.long, device=DEVICE)
    pos = torch.tensor([cache // 2], device=DEVICE)
    with torch.no_grad():
        wall, host = _timed(torch, lambda: step(tokens, pos), steps, warmup)
        row = {"batch": batch, "cache": cache, "eager_s": wall, "eager_host_s": host}
        replay = _graph(torch, lambda: step(tokens, pos))
        row["graph_s"] = _run_of(torch, replay, 10, steps, warmup)
        row["kernels"] = kernels(torch, lambda: step(tokens, pos))
    if compiled:
        start = time.perf_counter()
        fast = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        with torch.no_grad():
            for _ in range(3):
                fast(tokens, pos)
            _sync(torch)
            row["compile_s"] = time.perf_counter() - start
            row["compiled_s"] = _run_of(torch, lambda: fast(tokens, pos), 10, steps, warmup)
            launched = kernels(torch, lambda: fast(tokens, pos), runtime=True)
            row["compiled_kernels"] = kernels(torch, lambda: fast(tokens, pos))
        row["compiled_graph_launches"] = sum(r["count"] for r in launched if r["name"].startswith("cudaGraphLaunch"))
        row["compiled_kernel_launches"] = sum(r["count"] for r in launched if "LaunchKernel" in r["name"])
        torch._dynamo.reset()  # Inductor's kernels again, launched one by one (mode "default": no CUDA graphs)
        inductor = torch.compile(step, fullgraph=True)
        with torch.no_grad():
            row["inductor_s"] = _run_of(torch, lambda: inductor(tokens, pos), 10, steps, warmup)
            row["inductor_kernels"] = kernels(torch, lambda: inductor(tokens, pos))
        torch._dynamo.reset()
    return row


def gemms(torch, shape: dict, batches: tuple[int, ...], steps: int) -> list[dict]:
    """Each weight GEMM of a layer and the head at m = b rows, 20 in a row from a CUDA graph (module docstring)."""
    F = torch.nn.functional
    h, a, kv, d, f = shape["hidden"], shape["heads"], shape["kv_heads"], shape["head_dim"], shape["ffn"]
    dt = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    mats = {"wqkv": ((a + 2 * kv) * d, h), "wo": (h, a * d), "w1": (f, h), "w2": (h, f), "head": (shape["vocab"], h)}
    out = []
    for name, (n, k) in mats.items():
        weight = torch.randn(n, k, device=DEVICE, dtype=dt)
        for b in batches:
            x = torch.randn(b, k, device=DEVICE, dtype=dt)
            with torch.no_grad():
                replay = _graph(torch, lambda x=x, weight=weight: [F.linear(x, weight) for _ in range(20)])
                seconds = _run_of(torch, replay, 5, steps, 3) / 20
            nbytes = (n * k + b * (n + k)) * weight.element_size()
            out.append({"gemm": name, "m": b, "n": n, "k": k, "s": seconds, "bytes": nbytes,
                        "bytes_per_s": nbytes / seconds})
    return out


def copy_rate(torch, steps: int) -> dict:
    """A 2 GiB device-to-device copy: bytes read and written per second."""
    n = 2**30 if DEVICE == "cuda" else 2**22
    src, dst = torch.empty(n, dtype=torch.uint8, device=DEVICE), torch.empty(n, dtype=torch.uint8, device=DEVICE)
    seconds = _run_of(torch, lambda: dst.copy_(src), 5, steps, 3)
    return {"bytes": 2 * n, "s": seconds, "bytes_per_s": 2 * n / seconds}


def machine(torch) -> dict:
    """small_work_gpu's record of the machine, with the GPU's L2 bytes (a weight that fits may be read from there
    when its GEMM repeats)."""
    small_work_gpu.DEVICE = DEVICE
    base = small_work_gpu.machine(torch)
    return base | ({"l2_bytes": torch.cuda.get_device_properties(0).L2_cache_size} if DEVICE == "cuda" else {})


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--batches", type=_ints, default=(1, 8, 32, 128))
    ap.add_argument("--compiled", type=_ints, default=(1,), help="batches also run under torch.compile")
    ap.add_argument("--cache", type=int, default=256, help="static KV-cache positions, all read every step")
    ap.add_argument("--long", type=_ints, default=(1, 32), help="batches run again with a cache of --long-cache")
    ap.add_argument("--long-cache", type=int, default=2048)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama2-7b")
    ap.add_argument("--layers", type=int, help="layers of the decode rows (default: the shape's)")
    ap.add_argument("--gemm-only", action="store_true", help="the GEMMs and the copy alone, no decode rows")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args(argv)
    import torch

    shape = SHAPES[args.shape] | ({"layers": args.layers} if args.layers else {})
    if DEVICE != "cuda":  # a smoke test: a narrow model
        shape |= {"hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64, "ffn": 512, "vocab": 1000}
    result = {"machine": machine(torch), "shape": shape, "rows": [], "gemms": [], "copy": copy_rate(torch, args.steps)}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save():
        args.out.write_text(json.dumps(result, indent=1) + "\n")

    result["gemms"] = gemms(torch, shape, args.batches, args.steps)
    save()
    runs = [(b, args.cache, b in args.compiled) for b in args.batches]
    runs = [] if args.gemm_only else runs + [(b, args.long_cache, False) for b in args.long]
    for b, cache, compiled in runs:
        row = measure_batch(torch, shape, b, cache, args.steps, args.warmup, compiled)
        result["rows"].append(row)
        save()
        tail = f" compiled {row['compiled_s'] * 1e3:.3f} ms" if "compiled_s" in row else ""
        print(f"batch {b}, cache {cache}: eager {row['eager_s'] * 1e3:.3f} ms (host {row['eager_host_s'] * 1e3:.3f}), "
              f"graph {row['graph_s'] * 1e3:.3f} ms{tail}", flush=True)
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
    assert all(math.isfinite(r["graph_s"]) for r in result["rows"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
