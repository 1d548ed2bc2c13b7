"""Replay: each op signature of a traced step run on real tensors of its shapes, strides and dtypes, on the
device and at the thread count of the step (the step's own ops as the calibration's microbenchmarks).

Conditions as in the training step, for the data and for the instructions:
- Data: each op finds its data as far down the memory hierarchy as in the step, by its reuse distance (reuse.py:
  the bytes the step touches between the last use of the op's inputs and the op). A signature cycles through
  enough copies of its inputs to span that distance (at most ``cap_bytes``), and each copy's result is held
  until the copy comes round again, so every call reads inputs and writes into memory that the calls before
  pushed that far out of the caches (rotating buffers, as "cold cache" benchmarks do: NVIDIA nvbench, Triton's
  do_bench).
- Instructions: in the step an op follows other ops, not itself, and finds the dispatcher's and its kernel's
  code and branch history partly evicted (oneDNN's JIT-compiled convolutions most). Replay takes the signatures
  in step order in windows of ``window`` neighbours and calls them round-robin, ``passes`` times, timing each
  call alone (the clock's own cost subtracted); the median counts.
benchmarks/measure/conditions.py compares these choices with the ops timed inside the step (profile.py); on this
project's 2-core CPU host (2026-11-25, one thread, load 2.9) replayed / in-step time came to 0.92 for GPT-2 and
0.66 for ConvNeXt with each signature in a loop of its own (data at its reuse distance), 1.20 and 1.07 with every
op once in step order (data and instructions as cold as they get), 1.04 and 0.78 in windows of 4, 1.17 and 0.90
in windows of 16 (the data then colder than in the step for GPT-2). The cap bounds the copies' memory.

Values: floating inputs are uniform in [0.5, 1.5) (no zero, negative or denormal operand: sqrt, log and
division stay on their fast path); integer inputs are indices, uniform in [0, d) with d the smallest dimension
of the call's other tensors (an index into any of them is then valid: embedding rows, loss targets, gather
and scatter positions), except a grouped GEMM's ``offs``, an even split of its rows (balanced routing); booleans
are fair coins. A call whose arguments include something that cannot be rebuilt (``{"opaque": …}``) is not
replayed.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from meshplan.measure.signature import Signature
from meshplan.measure.timing import Clock, median, quiet_profiler
from meshplan.trace.graph import TensorInfo
from meshplan.units import MiB

# what a call rebuilt on real tensors may raise (a kernel refusing synthetic values, an argument it cannot take)
_FAILURES = (RuntimeError, ValueError, TypeError, IndexError, AttributeError, NotImplementedError)


@dataclass(frozen=True, kw_only=True)
class ReplaySettings:
    """Windows of ``window`` neighbouring signatures, ``passes`` calls of each (the median counts); inputs
    cycled through copies spanning the op's reuse distance, at most ``cap_bytes`` and ``passes`` copies."""

    window: int = 4
    passes: int = 9
    cap_bytes: int = 64 * MiB


def cache_bytes(device: str) -> int:
    """The last private cache level: a CPU core's L2 (Linux sysfs), a GPU's L2 (torch.cuda); 2 MiB if unknown."""
    if device == "cuda":
        import torch

        return int(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 2 * MiB) or 2 * MiB)
    best = 0
    for index in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{index}/"
        try:
            with open(base + "level") as f:
                level = int(f.read())
            with open(base + "size") as f:
                text = f.read().strip()
        except (OSError, ValueError):
            continue
        size = int(text[:-1]) * (1024 if text.endswith("K") else MiB) if text[-1] in "KM" else int(text)
        if level == 2:
            best = max(best, size)
    return best or 2 * MiB


def resolve(target: str) -> Any:
    """``"aten.addmm.default"`` → torch.ops.aten.addmm.default."""
    import torch

    namespace, name, overload = target.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), name), overload)


def span(t: TensorInfo) -> int:
    """Elements a strided tensor spans in its storage (offset included)."""
    if any(s == 0 for s in t.shape):
        return t.offset
    strides = t.stride or _contiguous(t.shape)
    return t.offset + 1 + sum((s - 1) * abs(st) for s, st in zip(t.shape, strides, strict=True))


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def make_base(t: TensorInfo, device: Any, bound: int) -> Any:
    """A real 1-d storage for ``t`` (its span) filled as the module docstring says."""
    import torch

    dtype = getattr(torch, t.dtype)
    base = torch.empty(max(span(t), 1), dtype=dtype, device=device)
    if dtype.is_floating_point:
        base.uniform_(0.5, 1.5)
    elif dtype == torch.bool:
        base.copy_(torch.rand(base.shape, device=device) < 0.5)
    elif dtype.is_complex:
        base.fill_(1.0)
    else:
        base.random_(0, max(1, bound))
    return base


def view_of(base: Any, t: TensorInfo) -> Any:
    return base.as_strided(t.shape, t.stride or _contiguous(t.shape), t.offset)


def _decode(value: Any, tensors: list[Any], device: Any) -> Any:
    import torch

    if isinstance(value, list):
        return [_decode(v, tensors, device) for v in value]
    if isinstance(value, dict):
        if "tensor" in value and len(value) == 1:
            return tensors[value["tensor"]]
        if "dtype" in value and len(value) == 1:
            return getattr(torch, value["dtype"])
        if "device" in value and len(value) == 1:
            return device
        if "layout" in value and len(value) == 1:
            return getattr(torch, value["layout"])
        if "memory_format" in value and len(value) == 1:
            return getattr(torch, value["memory_format"])
        if "float" in value and len(value) == 1:
            return float(value["float"])
        return {k: _decode(v, tensors, device) for k, v in value.items()}
    return value


def build_calls(sig: Signature, device: Any, copies: int) -> list[Callable[[], Any]]:
    """``copies`` closures that each run ``sig`` on their own copy of the inputs."""
    func = resolve(sig.target)
    floats = [d for t in sig.inputs if t.dtype.startswith(("float", "bfloat")) for d in t.shape]
    bound = min(floats) if floats else min((d for t in sig.inputs for d in t.shape), default=1)
    bases = [make_base(t, device, bound) for t in sig.inputs]
    args, kwargs = json.loads(sig.call)
    _balanced_offsets(func, args, sig.inputs, bases)
    calls: list[Callable[[], Any]] = []
    for c in range(copies):
        tensors = [view_of(b if c == 0 else b.clone(), t) for b, t in zip(bases, sig.inputs, strict=True)]
        a = _decode(args, tensors, device)
        k = {name: _decode(v, tensors, device) for name, v in kwargs.items()}
        calls.append(partial(func, *a, **k))
    return calls


def _balanced_offsets(func: Any, args: list, inputs: tuple[TensorInfo, ...], bases: list) -> None:
    """A grouped GEMM's ``offs`` (the cumulative row counts of its groups, MoE's tokens per expert) as an even
    split: random indices would make ragged, even unordered groups. Routing taken as balanced, as meshplan's MoE
    costs take it (cost/mlp_moe.py); the real step's router may load some experts more."""
    names = [a.name for a in func._schema.arguments]
    refs = {name: a["tensor"] for name, a in zip(names, args, strict=False) if isinstance(a, dict) and "tensor" in a}
    if "offs" not in refs or "self" not in refs or "mat2" not in refs:
        return
    a, b = inputs[refs["self"]].shape, inputs[refs["mat2"]].shape
    total = a[0] if len(a) == 2 and len(b) == 3 else a[1] if len(a) == len(b) == 2 else b[-1]
    offs = bases[refs["offs"]]
    groups = offs.numel()
    for i in range(groups):
        offs[i] = round((i + 1) * total / groups)


def copies(sig: Signature, distance: float, settings: ReplaySettings) -> int:
    """Copies of the inputs to cycle through so that they span ``distance`` bytes (capped)."""
    footprint = sum(span(t) * t.itemsize for t in sig.inputs)
    reach = min(max(distance, 0.0), settings.cap_bytes)
    return max(1, min(settings.passes, math.ceil(reach / max(footprint, 1))))


def _clock_overhead(clock: Clock) -> float:
    runs = []
    for _ in range(21):
        start = clock.now()
        runs.append(clock.now() - start)
    return sorted(runs)[10]


def replay_all(sigs: list[Signature], clock: Clock, settings: ReplaySettings, device: Any = "cpu",
               distances: Sequence[float] = ()) -> dict[str, float]:
    """signature key → seconds per call (NaN: not replayed), by the windowed protocol of the module docstring;
    ``distances``: each op's reuse distance (reuse.py), a signature takes the median of its ops'."""
    out = {s.key: math.nan for s in sigs}
    overhead = _clock_overhead(clock)
    for w in range(0, len(sigs), settings.window):
        window = []
        for s in sigs[w:w + settings.window]:
            d = sorted(distances[i] for i in s.indices) if distances else [0.0]
            if s.replayable:
                try:
                    window.append((s.key, build_calls(s, device, copies(s, d[len(d) // 2], settings))))
                except _FAILURES:
                    continue
        samples: dict[str, list[float]] = {key: [] for key, _ in window}
        held: dict[tuple[str, int], Any] = {}
        for p in range(settings.passes + 1):  # pass 0 warms up
            for key, calls in list(window):
                try:
                    start = clock.now()
                    result = calls[p % len(calls)]()
                    elapsed = clock.now() - start
                    held[(key, p % len(calls))] = result  # outputs of a copy freed when it comes round again
                except _FAILURES:
                    window.remove((key, calls))
                    samples.pop(key, None)
                    continue
                if p:
                    samples[key].append(max(0.0, elapsed - overhead))
        for key, v in samples.items():
            if v:
                out[key] = median(v)
    return out


def workspaces(sigs: list[Signature], device: Any = "cpu") -> dict[str, int]:
    """signature key → bytes a call allocates and frees inside itself (im2col buffers of a convolution's
    backward, a GEMM's packing), beyond what it returns: one call each, watched by the allocator (CUDA's peak
    counter; on a CPU, the profiler's allocation events inside a ``record_function`` window per call)."""
    calls: dict[str, Callable[[], Any]] = {}
    for s in sigs:
        if s.replayable:
            try:
                calls[s.key] = build_calls(s, device, 1)[0]
            except _FAILURES:
                continue
    out: dict[str, int] = {}
    if device == "cuda":
        import torch

        for key, call in calls.items():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            result = _safe(call)
            torch.cuda.synchronize()
            out[key] = max(0, torch.cuda.max_memory_allocated() - torch.cuda.memory_allocated())
            del result
        return out
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile, record_function

    with quiet_profiler(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for i, call in enumerate(calls.values()):
            with record_function(f"meshplan-ws-{i}"):
                result = _safe(call)
            del result
    windows, allocs = {}, []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        if e.tag == _EventType.Allocation:
            allocs.append((e.start_time_ns, e.extra_fields.alloc_size))
        elif e.name.startswith("meshplan-ws-"):
            windows[int(e.name.rsplit("-", 1)[1])] = (e.start_time_ns, e.end_time_ns)
        stack.extend(e.children)
    allocs.sort()
    for i, key in enumerate(calls):
        start, end = windows.get(i, (0, -1))
        live = peak = 0
        for t, size in allocs:
            if start <= t <= end:
                live += size
                peak = max(peak, live)
        out[key] = max(0, peak - live)  # what it still holds at the end is its result
    return out


def _safe(call: Callable[[], Any]) -> Any:
    try:
        return call()
    except _FAILURES:
        return None

