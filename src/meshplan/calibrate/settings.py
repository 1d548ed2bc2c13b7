"""What to measure: shapes, sizes and repetitions of a calibration run, and the checks on its arguments.

Torch-free, so that bad input is reported before PyTorch is imported (or found missing). ``quick`` sizes are
small enough for a CPU test in seconds; the full ones reach the sizes where GPUs and links hit their
asymptotes (nccl-tests sweeps 8 B … 8 GiB; GEMMs up to 16384² reach MAMF, ml-engineering's mamf-finder).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from meshplan.calibrate.records import DIST_KINDS
from meshplan.errors import SpecError
from meshplan.units import KiB, MiB


@dataclass(frozen=True, kw_only=True)
class Settings:
    """Shapes and sizes to time; each point is ``warmup`` calls, then the median of ``repeats`` × ``iters``."""

    gemm_shapes: tuple[tuple[int, int, int], ...]  # (m, n, k)
    precisions: tuple[str, ...]  # fp32, bf16, fp16
    memory_sizes: tuple[int, ...]  # bytes of one fp32 input tensor
    comm_sizes: tuple[int, ...]  # bytes, comm.py's n
    pair_sizes: tuple[int, ...]  # bytes of one ping-pong message
    kinds: tuple[str, ...] = DIST_KINDS
    warmup: int = 2
    iters: int = 5
    repeats: int = 3
    timeout: float = 300.0  # seconds a rank waits for its peers before the run fails
    threads: int | None = None  # intra-op threads of the GEMM and memory benchmarks (None: PyTorch's default)
    cold_bytes: int = 8 * MiB  # memory kernels cycle through copies of their tensors adding up to this much
    # causal scaled_dot_product_attention shapes (batch, heads, seq, head_dim), timed at the 16-bit precision
    attention_shapes: tuple[tuple[int, int, int, int], ...] = ()
    # host dispatch (dispatch.py): tensor sizes in elements, calls timed back to back per run
    dispatch_sizes: tuple[int, ...] = (1, 256, 4096, 65536)
    dispatch_calls: int = 1000

    def __post_init__(self) -> None:
        if len(set(self.dispatch_sizes)) < 2 or min(self.dispatch_sizes) < 1:
            raise SpecError(f"dispatch_sizes={self.dispatch_sizes!r} needs two distinct positive sizes to fit t0")
        if isinstance(self.dispatch_calls, bool) or not isinstance(self.dispatch_calls, int) or not (
                1 <= self.dispatch_calls <= 10**6):
            raise SpecError(f"dispatch_calls={self.dispatch_calls!r} must be an integer from 1 to 1,000,000")
        for name in ("warmup", "iters", "repeats"):
            if getattr(self, name) < (0 if name == "warmup" else 1):
                raise SpecError(f"{name}={getattr(self, name)!r} is too small")
        unknown = set(self.kinds) - set(DIST_KINDS)
        if unknown:
            raise SpecError(f"kinds: {sorted(unknown)[0]!r} must be one of {', '.join(DIST_KINDS)}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or not 1 <= self.threads <= 1024):
            raise SpecError(f"threads={self.threads!r} must be an integer from 1 to 1024")
        for name in ("comm_sizes", "pair_sizes"):
            if len(set(getattr(self, name))) < 2:
                raise SpecError(f"{name}={getattr(self, name)!r} needs two distinct sizes to fit α and β")
        for shape in self.attention_shapes:
            if len(shape) != 4 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in shape):
                raise SpecError(f"attention_shapes: {shape!r} must be four positive integers (batch, heads, seq, "
                                "head_dim)")
        if self.attention_shapes and len({b * a * s * s * d for b, a, s, d in self.attention_shapes}) < 2:
            raise SpecError(f"attention_shapes={self.attention_shapes!r} needs two shapes of different FLOPs to fit "
                            "t0 and F")


def settings_for(device: str, quick: bool) -> Settings:
    """The default grid for ``device`` (``cpu`` or ``cuda``)."""
    gpu = device == "cuda"
    if quick:
        return Settings(gemm_shapes=((64, 64, 64), (128, 128, 128), (256, 256, 256), (256, 128, 512)),
                        precisions=("bf16", "fp32"), memory_sizes=(256 * KiB, 1 * MiB, 4 * MiB),
                        comm_sizes=(4 * KiB, 64 * KiB, 1 * MiB), pair_sizes=(4 * KiB, 1 * MiB),
                        warmup=1, iters=3, repeats=3, timeout=120.0, dispatch_sizes=(1, 256, 4096),
                        dispatch_calls=200,
                        attention_shapes=attention_shapes(512, 256, (128, 256, 512)))
    squares = (1024, 2048, 4096, 8192, 16384) if gpu else (128, 256, 512, 1024, 2048)
    shapes = tuple((s, s, s) for s in squares)
    if gpu:  # training-like: tokens × hidden × {hidden, FFN}
        shapes += ((16384, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336), (8192, 1024, 8192))
    top = 1024 * MiB if gpu else 256 * MiB
    comm_top = 256 * MiB if gpu else 64 * MiB
    attention = (attention_shapes(16384, 2048, _powers(512, 16384, 2)) if gpu
                 else attention_shapes(2048, 512, _powers(256, 2048, 2)))
    return Settings(gemm_shapes=shapes, precisions=("bf16", "fp16", "fp32") if gpu else ("bf16", "fp32"),
                    memory_sizes=_powers(1 * MiB, top, 4), comm_sizes=_powers(4 * KiB, comm_top, 4),
                    pair_sizes=(4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB), warmup=3, iters=10 if gpu else 5, repeats=5,
                    attention_shapes=attention)


def attention_shapes(tokens: int, hidden: int, seqs: tuple[int, ...]) -> tuple[tuple[int, int, int, int], ...]:
    """FlashAttention-2's benchmark grid (Dao 2023, §4.1: sequence lengths 512 … 16k at a batch that keeps 16k tokens,
    hidden 2048 as 32 heads of 64 or 16 of 128), scaled to ``tokens`` and ``hidden``: (batch, heads, seq, head_dim)
    for each sequence length and head dimension 64 and 128."""
    return tuple((max(1, tokens // s), hidden // d, s, d) for d in (64, 128) for s in seqs)


def _powers(lo: int, hi: int, step: int) -> tuple[int, ...]:
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= step
    return tuple(sizes)


# Local ranks a calibration starts on this host: a 72-GPU NVLink domain spans 18 hosts of 4, and the largest
# single hosts have 8 (DGX / HGX) or 16 GPUs; 64 leaves room for oversubscribed CPU ranks in tests.
MAX_LOCAL_RANKS = 64


def parse_mesh(text: str | None, world_size: int | None = None) -> tuple[int, ...] | None:
    """``"2x4"`` (innermost first, as hardware.py's tiers) → (2, 4), checked against ``world_size`` when given;
    None → None."""
    check_world_size(world_size)
    if text is None:
        return None
    parts = re.split(r"[x×,*]", text.strip().lower())
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise SpecError(f"mesh={text!r} must be sizes like 2x4 (innermost first)") from None
    if not shape or min(shape) < 1:
        raise SpecError(f"mesh={text!r} must be positive sizes like 2x4")
    product = 1
    for s in shape:
        product *= s
    if world_size is not None and product != world_size:
        raise SpecError(f"mesh={text!r} = {product} ranks does not equal world-size={world_size}")
    if product > MAX_LOCAL_RANKS:
        raise SpecError(f"mesh={text!r} = {product} ranks is more than the {MAX_LOCAL_RANKS} local ranks one "
                        "host runs")
    return shape


def check_world_size(world_size: int | None) -> None:
    """``world_size`` local ranks (processes on this host) are a positive number no larger than one host runs."""
    if world_size is None:
        return
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise SpecError(f"world-size={world_size!r} must be a positive integer")
    if world_size > MAX_LOCAL_RANKS:
        raise SpecError(f"world-size={world_size} is more than the {MAX_LOCAL_RANKS} local ranks one host runs "
                        "(calibrate times the links of one host; run it on each kind of node)")


def settings_for_trace(trace: Any, base: Settings, *, gemms: int = 12, sizes: int = 8) -> Settings:
    """``base`` with its GEMM shapes, memory-bound sizes and collective sizes taken from a traced step (issue 38:
    microbenchmarks shaped like the model's own ops): the ``gemms`` distinct (m, n, k) with the most FLOPs in all,
    up to ``sizes`` of the memory-bound ops' largest-input bytes, and up to ``sizes`` of the parameter gradients'
    bytes (what a data-parallel step all-reduces), each spread from the smallest to the largest."""
    flops: dict[tuple[int, int, int], float] = {}
    for op in trace.ops:
        if op.kind == "gemm" and op.m >= 1 and op.n >= 1 and op.k >= 1:
            key = (round(op.m), round(op.n), round(op.k))
            flops[key] = flops.get(key, 0.0) + op.flops
    shapes = tuple(sorted(sorted(flops, key=lambda k: -flops[k])[:gemms])) or base.gemm_shapes
    memory = {int(max(t.nbytes for t in op.inputs)) for op in trace.ops
              if op.kind == "memory" and op.inputs and max(t.nbytes for t in op.inputs) >= 4 * KiB}
    grads = {s.nbytes for s in trace.storages.values() if s.role == "grad" and s.nbytes >= 64}
    return replace(base, gemm_shapes=shapes, memory_sizes=_spread(memory, sizes) or base.memory_sizes,
                   comm_sizes=_spread(grads, sizes) if len(grads) >= 2 else base.comm_sizes)


def _spread(values: set[int], count: int) -> tuple[int, ...]:
    """Up to ``count`` of ``values``, geometrically spread from the smallest to the largest."""
    ordered = sorted(values)
    if len(ordered) <= count:
        return tuple(ordered)
    lo, hi = math.log(ordered[0]), math.log(ordered[-1])
    picks = {min(ordered, key=partial(_log_distance, t=lo + (hi - lo) * i / (count - 1))) for i in range(count)}
    return tuple(sorted(picks))


def _log_distance(v: float, t: float) -> float:
    return abs(math.log(v) - t)
