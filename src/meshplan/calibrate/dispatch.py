"""The host's cost per eager PyTorch call: tiny ops called back to back, so that the work is next to nothing and
the time per call is the host's (Python binding, dispatcher, allocator, kernel launch).

Timed as PyTorch's own dispatcher-overhead benchmarks do (pytorch/benchmarks/overhead/; the operator
micro-benchmark of pytorch/pytorch PR #32194 reads torch.split at 3.3 µs on CPU and CUDA alike: host-bound, flat in
size): ``calls`` back-to-back calls, then one device synchronisation, the median of ``repeats`` such runs per call.
On a GPU the calls are issued asynchronously and the kernels of these sizes finish before the next is issued, so
the wall clock per call is the host's. On a CPU the clock is the calling thread's CPU time (time.thread_time,
CLOCK_THREAD_CPUTIME_ID), the quantity itself, "seconds of host CPU per call", and blind to the time other
processes take the core: on this project's 2-core host at load 3.3 the wall clock read layer_norm at 2.1 µs in one
run and 7.3 µs in the next. Each op is timed at growing sizes and fitted t = t₀ + work / rate
(fit.fit_dispatch): t₀ is the fixed part written as a stack's ``host_dispatch``, whatever the work adds is the
rate's. Ops, with autograd off (measure/host.py times autograd's recording and engine apart):

    add         torch.add(x, y, out=z) on n fp32 elements            work: 12·n bytes (STREAM's Add)
    layer_norm  F.layer_norm over rows of min(n, 256) fp32            work: 8·n bytes (read x, write y)
    linear      F.linear(x, w, b), x 1×k, w k×k, k = √n               work: 2·k² FLOPs
    module      the same linear as an nn.Linear(k, k) module call     its t₀ − linear's: nn.Module.__call__

NVIDIA's dgxc-benchmarking microbenchmarks/cpu_overhead reads 11.3-17.7 µs per tiny eager GEMM on its GPU hosts;
TransformerEngine issue #2053 reads 13.5 µs of host time per torch Linear on an H100 DGX (Xeon 8480C) and 33-37 µs
on Grace (fixed_costs research notes, section 3.1).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from meshplan.calibrate.bench import require_torch, synchronizer
from meshplan.calibrate.records import DispatchSample
from meshplan.calibrate.settings import Settings

NORM_WIDTH = 256  # the layer norm's row width (fewer elements: one row of all of them)


def _time_calls(fn: Callable[[], object], sync: Callable[[], None], calls: int, repeats: int,
               clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call: the median over ``repeats`` of (``calls`` calls, then sync) / calls by ``clock``, after one
    warm run."""
    for _ in range(calls):
        fn()
    sync()
    runs = []
    for _ in range(repeats):
        start = clock()
        for _ in range(calls):
            fn()
        sync()
        runs.append((clock() - start) / calls)
    return statistics.median(runs)


def _calls(torch: Any, n: int, dev: Any) -> list[tuple[str, float, Callable[[], object]]]:
    """(op, work, call) for each op of the module docstring at size n (elements)."""
    functional = torch.nn.functional
    x, y, z = (torch.randn(n, device=dev) for _ in range(3))
    width = min(n, NORM_WIDTH)
    rows = torch.randn(max(1, n // width), width, device=dev)
    k = max(1, math.isqrt(n))
    linear = torch.nn.Linear(k, k).to(dev)
    a, w, b = torch.randn(1, k, device=dev), linear.weight.detach(), linear.bias.detach()
    return [
        ("add", 12.0 * n, lambda: torch.add(x, y, out=z)),
        ("layer_norm", 8.0 * rows.numel(), lambda: functional.layer_norm(rows, (width,))),
        ("linear", 2.0 * k * k, lambda: functional.linear(a, w, b)),
        ("module", 2.0 * k * k, lambda: linear(a)),
    ]


def bench_dispatch(settings: Settings, device: str) -> list[DispatchSample]:
    """Every op of the module docstring at every size of ``settings.dispatch_sizes`` (elements), autograd off."""
    torch = require_torch()
    dev = torch.device(device)
    sync = synchronizer(device)
    clock = time.thread_time if device == "cpu" else time.perf_counter  # the module docstring
    samples = []
    with torch.no_grad():
        for n in settings.dispatch_sizes:
            for op, work, call in _calls(torch, n, dev):
                seconds = _time_calls(call, sync, settings.dispatch_calls, settings.repeats, clock)
                samples.append(DispatchSample(op=op, work=work, seconds=seconds))
    return samples
