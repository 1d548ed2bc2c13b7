"""Single-device microbenchmarks with PyTorch: GEMMs over shapes and precisions, memory-bound kernels over sizes,
causal fused attention (``scaled_dot_product_attention``) over sequence lengths and head dimensions.

PyTorch is optional (``pip install 'meshplan[torch]'``); it is imported here, inside the functions. Times are
wall-clock around ``iters`` back-to-back calls with a device synchronisation at the end (so queued GPU kernels
count), the median of ``repeats`` such runs after ``warmup`` calls (the median resists a preempted run on a
shared host). Bytes moved by the memory-bound kernels follow STREAM's counting (McCalpin 1995): copy reads
and writes n elements (2n), add reads two and writes one (3n); the layernorm-like kernel reads x and writes y
(2n; its h weights and the per-row statistics are negligible), the minimum a fused kernel must move. Attention
FLOPs are the cost model's (records.AttentionSample: the causal half of the two batched GEMMs).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from meshplan.calibrate.records import AttentionSample, GemmSample, MemorySample
from meshplan.calibrate.settings import Settings
from meshplan.errors import MissingDependency, SpecError

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
LAYERNORM_WIDTH = 1024  # hidden size of the layernorm-like kernel's rows


def require_torch() -> Any:
    """``import torch``, or a MissingDependency that prints ``pip install 'meshplan[torch]'``."""
    try:
        import torch
    except ImportError:
        raise MissingDependency("torch", "torch") from None
    return torch


def resolve_device(requested: str = "auto") -> str:
    """``auto`` → ``cuda`` when PyTorch sees a GPU, else ``cpu``; ``cuda`` without a GPU is an error."""
    torch = require_torch()
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        why = (f"this PyTorch {torch.__version__} is a CPU-only build" if torch.version.cuda is None
               else "PyTorch sees no GPU (torch.cuda.is_available() is False)")
        raise SpecError(f"device='cuda' but {why}: use --device cpu (or auto)")
    if requested not in ("cpu", "cuda"):
        raise SpecError(f"device={requested!r} must be auto, cpu or cuda")
    return requested


def device_info(device: str) -> dict[str, Any]:
    """Name, memory capacity (bytes) and SM count (CPU: cores stand in for SMs) of device 0."""
    torch = require_torch()
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        return {"name": props.name, "memory_bytes": float(props.total_memory),
                "num_sms": int(props.multi_processor_count)}
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), name)
    except OSError:
        pass
    try:
        memory = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        memory = 0.0
    return {"name": f"{name} (CPU)", "memory_bytes": memory, "num_sms": os.cpu_count() or 1}


def synchronizer(device: str) -> Callable[[], None]:
    torch = require_torch()
    return torch.cuda.synchronize if device == "cuda" else (lambda: None)


def time_call(fn: Callable[[], object], sync: Callable[[], None], settings: Settings) -> float:
    """Seconds per call: median over ``repeats`` of (``iters`` calls, then sync) / iters, after ``warmup``."""
    for _ in range(settings.warmup):
        fn()
    sync()
    runs = []
    for _ in range(settings.repeats):
        start = time.perf_counter()
        for _ in range(settings.iters):
            fn()
        sync()
        runs.append((time.perf_counter() - start) / settings.iters)
    return statistics.median(runs)


def bench_gemm(settings: Settings, device: str) -> list[GemmSample]:
    """torch.matmul(a, b, out=c) for every (m, n, k) and precision; fp32 with TF32 off (the fp32 peak)."""
    torch = require_torch()
    dev = torch.device(device)
    sync = synchronizer(device)
    samples = []
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        for precision in settings.precisions:
            dtype = getattr(torch, DTYPES[precision])
            for m, n, k in settings.gemm_shapes:
                a = torch.randn(m, k, device=dev).to(dtype)
                b = torch.randn(k, n, device=dev).to(dtype)
                c = torch.empty(m, n, device=dev, dtype=dtype)
                seconds = time_call(partial(torch.matmul, a, b, out=c), sync, settings)
                samples.append(GemmSample(m=m, n=n, k=k, precision=precision, seconds=seconds))
                del a, b, c
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return samples


def attention_precision(settings: Settings) -> str:
    """The precision attention is timed at: the 16-bit one calibrated (roofline.py runs attention kernels at bf16),
    else the first calibrated."""
    return next((p for p in ("bf16", "fp16") if p in settings.precisions), settings.precisions[0])


def bench_attention(settings: Settings, device: str) -> list[AttentionSample]:
    """torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), forward, for every (batch,
    heads, seq, head_dim) of ``settings.attention_shapes``: PyTorch picks its kernel (CUDA: flash, memory-efficient
    or cuDNN; CPU: its flash-for-CPU or math path), as a model calling it would get. Timed as the GEMMs are."""
    torch = require_torch()
    dev = torch.device(device)
    sync = synchronizer(device)
    precision = attention_precision(settings)
    dtype = getattr(torch, DTYPES[precision])
    sdpa = torch.nn.functional.scaled_dot_product_attention
    samples = []
    with torch.no_grad():
        for batch, heads, seq, head_dim in settings.attention_shapes:
            q, k, v = (torch.randn(batch, heads, seq, head_dim, device=dev).to(dtype) for _ in range(3))
            seconds = time_call(partial(sdpa, q, k, v, is_causal=True), sync, settings)
            samples.append(AttentionSample(batch=batch, heads=heads, seq=seq, head_dim=head_dim,
                                           precision=precision, seconds=seconds))
            del q, k, v
    return samples


def bench_memory(settings: Settings, device: str) -> list[MemorySample]:
    """copy, add and a layernorm over fp32 tensors of each size; bytes as in the module docstring. Each kernel
    cycles through copies of its tensors adding up to ``settings.cold_bytes`` (at least), so that every size is
    read from the same level of the memory hierarchy, past the last private cache, as in a training step, rather
    than from L2 for small sizes and from memory for large ones (a fit across the two is no line: its R² was
    0.26–0.53 with negative intercepts on a CPU host, issue 38)."""
    torch = require_torch()
    dev = torch.device(device)
    sync = synchronizer(device)
    samples = []
    for size in settings.memory_sizes:
        n = max(1, size // 4)
        sets = [_memory_kernels(torch, n, dev) for _ in range(max(1, -(-settings.cold_bytes // (12 * n))))]
        for k, (op, nbytes, _) in enumerate(sets[0]):
            calls = [s[k][2] for s in sets]
            turn = [0]

            def cycle(calls=calls, turn=turn) -> object:
                turn[0] = (turn[0] + 1) % len(calls)
                return calls[turn[0]]()

            samples.append(MemorySample(op=op, nbytes=float(nbytes), seconds=time_call(cycle, sync, settings)))
    return samples


def _memory_kernels(torch: Any, n: int, dev: Any) -> list[tuple[str, int, Callable[[], object]]]:
    """(name, bytes moved, call) for copy, add and layernorm over n fp32 elements (3n fp32 of tensors)."""
    x, z, y = torch.randn(n, device=dev), torch.randn(n, device=dev), torch.empty(n, device=dev)
    width = LAYERNORM_WIDTH if n % LAYERNORM_WIDTH == 0 else n
    rows = x.view(-1, width)
    return [
        ("copy", 2 * 4 * n, lambda: y.copy_(x)),
        ("add", 3 * 4 * n, lambda: torch.add(x, z, out=y)),
        ("layernorm", 2 * 4 * n, lambda: torch.nn.functional.layer_norm(rows, (width,))),
    ]


def threads_of(settings: Settings) -> Any:
    """A context that pins PyTorch's intra-op threads to ``settings.threads`` (nothing when None)."""
    import contextlib

    torch = require_torch()

    @contextlib.contextmanager
    def pinned():
        before = torch.get_num_threads()
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)

    return pinned()
