"""DeepSpeed ZeRO-3's module hooks: the host's work per module and per parameter tensor every micro-batch, measured
on this CPU in DeepSpeed's own engine (issue 46, item 3: "the host side of dispatch is CPU work ... measured on the
machine at hand").

ZeRO-3 (runtime/zero/parameter_offload.py ``DeepSpeedZeRoOffload._register_deepspeed_module``, partitioned_param_
coordinator.py) hooks every module: before its forward it fetches the module's parameters (``fetch_sub_module``: all-
gather each partitioned tensor, record the trace, prefetch the next ones), after it releases them
(``release_sub_module``), and again around its backward. That is Python per module and per parameter tensor, every
micro-batch, whatever the tensors' sizes. Here a module of n children runs forward and backward, a micro-batch that is
not its step's last, through DeepSpeed 0.19.8's engine at ZeRO stage 3 (its CPU accelerator over gloo, world size 1,
bf16, ``overlap_comm`` off) and as the same bf16 module alone; the difference, fitted over n = 8 ... 64, is the engine's
cost per child, measured three times over (the constants are the medians). Three kinds of child: a GELU (a module
without parameters), a ``Linear(4, 4, bias=False)`` (one tensor) and a ``Linear(4, 4)`` (two). Their slopes give, by
least squares, the cost per module c_m and per parameter tensor c_t (GELU: c_m; weight only: c_m + c_t; weight and bias:
c_m + 2·c_t); the intercepts, what a micro-batch costs the engine beyond its modules. The CPU accelerator's own cost is
left out where it differs from CUDA's: it counts its devices with a subprocess (numactl), which ZeRO-3 asks once a
micro-batch; the count is asked once here.

Seconds on this CPU become seconds on the x86 DGX host the stacks' host constants refer to (Cluster.python_host = 1)
as benchmarks/measure/megatron_host_cpu.py scales them: by the plain-PyTorch GPT layer
(benchmarks/measure/small_work_gpu.py), timed here on CPU tensors before and after, in processes of their own (the
faster of the two), against its 1.15 ms a layer on the lent H200's host (the ``pytorch-fsdp`` and ``deepspeed`` presets'
25 µs a kernel × its 46 kernels, data/measured/gpu/, docs/SMALL_WORK_GPU.md).
cost/wrapper_work.py holds the results (``ZERO3_HOOKS``);
tests/test_wrapper_work.py checks them against the committed file. The lent H200 measured the same engine (run F of
docs/SMALL_WORK_GPU.md, benchmarks/measure/deepspeed_engine_gpu.py): ZeRO 3 took 7.8-13 ms more a GPT layer (7 modules,
12 tensors) a micro-batch than the plain loop.

Run (DeepSpeed 0.19.8 installed, pure Python, no ops built):
    python benchmarks/measure/deepspeed_hooks_cpu.py --out data/measured/2026-11-27-deepspeed-zero3-hooks-cpu.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from meshplan.specs.stack import load_stack

HERE = Path(__file__).resolve().parent
SIZES = (8, 16, 32, 64)
REPEATS = 3  # whole measurements, on the same engines; the constants are their medians
KINDS = ("free", "weight", "weight_bias")  # a child without parameters, with one tensor, with two
TENSORS = {"free": 0, "weight": 1, "weight_bias": 2}
PLAIN_LAYER_KERNELS = 46  # the plain GPT layer's CUDA kernels, forward and backward (docs/SMALL_WORK_GPU.md)
# s: that layer's host time on the H200's host, the preset's per-kernel cost it was measured as (module docstring)
PLAIN_LAYER_GPU_HOST = load_stack("pytorch-fsdp").host_dispatch * PLAIN_LAYER_KERNELS
DS_ENV = {"DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
          "MASTER_PORT": "29571"}


def _module(torch, kind: str, n: int):  # noqa: ANN001, ANN202
    """A Linear(4, 4) and n children of ``kind`` after it, summed: every child runs forward and backward."""
    class Chain(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first = torch.nn.Linear(4, 4)
            make = {"free": torch.nn.GELU, "weight": lambda: torch.nn.Linear(4, 4, bias=False),
                    "weight_bias": lambda: torch.nn.Linear(4, 4)}[kind]
            self.children_ = torch.nn.ModuleList([make() for _ in range(n)])

        def forward(self, x):  # noqa: ANN001, ANN202
            x = self.first(x)
            for child in self.children_:
                x = child(x)
            return x.float().sum()
    return Chain()


def _warm(fn) -> None:  # noqa: ANN001
    for _ in range(5):
        fn()


def _mean(fn, reps: int) -> float:  # noqa: ANN001
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares slope and intercept."""
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(slope), float(intercept)


def _repeat(runs: dict, reps: int, rounds: int) -> dict:
    """One measurement: each configuration's fastest round, plain and through the engine, the three kinds' slopes and
    intercepts over n, and c_m, c_t and the per-micro-batch cost from them."""
    best = {key: [float("inf"), float("inf")] for key in runs}
    for _ in range(rounds):  # every configuration once a round, plain and engine in turn: drift hits all alike
        for key, (alone, wrapped) in runs.items():
            best[key][0] = min(best[key][0], _mean(alone, reps))
            best[key][1] = min(best[key][1], _mean(wrapped, reps))
    series = {}
    for kind in KINDS:
        extra = [best[kind, n][1] - best[kind, n][0] for n in SIZES]
        slope, intercept = _fit(list(map(float, SIZES)), extra)
        series[kind] = {"extra_s": dict(zip(map(str, SIZES), extra, strict=True)), "per_child_s": slope,
                        "intercept_s": intercept}
    # c_m and c_t by least squares over the three slopes: [1 0; 1 1; 1 2] · (c_m, c_t) = slopes
    c_t, c_m = _fit([float(TENSORS[k]) for k in KINDS], [series[k]["per_child_s"] for k in KINDS])
    # what a micro-batch costs beyond its modules: each intercept less its chain's own container and first Linear
    # (two modules, two tensors)
    fixed = sum(series[k]["intercept_s"] for k in KINDS) / len(KINDS) - (2 * c_m + 2 * c_t)
    return {"series": series, "module_s": c_m, "tensor_s": c_t, "microbatch_s": fixed}


def plain_layer_seconds() -> float:
    """The plain GPT layer's forward and backward on CPU tensors (benchmarks/measure/megatron_host_cpu.py), in a process
    of its own: DeepSpeed's import and its engines slow PyTorch's own calls in the process that holds them."""
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import megatron_host_cpu; "
            "print(megatron_host_cpu.measure('pytorch', 300)['ms_per_layer'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=600)
    return float(out.stdout.strip().splitlines()[-1]) * 1e-3


def measure(reps: int, rounds: int) -> dict:
    before = plain_layer_seconds()
    os.environ.update(DS_ENV)
    import logging

    import deepspeed
    import torch

    deepspeed.init_distributed(dist_backend="gloo")
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    # DeepSpeed's CPU accelerator counts its devices by running numactl in a subprocess (utils/numa.py
    # get_numa_cores), which ZeRO-3's gradient epilogue asks once a micro-batch (0.5 ms here); CUDA's is a cached
    # query: the count, asked once
    accelerator = deepspeed.accelerator.get_accelerator()
    devices = accelerator.device_count()
    accelerator.device_count = lambda: devices
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 10**6, "steps_per_print": 10**9,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": 3, "overlap_comm": False, "contiguous_gradients": True},
           "bf16": {"enabled": True}}
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    runs = {}  # (kind, n) -> (plain micro-batch, the engine's)
    for kind in KINDS:
        for n in SIZES:
            plain = _module(torch, kind, n).to(torch.bfloat16)
            engine, *_ = deepspeed.initialize(model=_module(torch, kind, n), config=cfg)
            runs[kind, n] = (lambda m=plain: m(x).backward(), lambda e=engine: e.backward(e(x)))
            _warm(runs[kind, n][0])
            _warm(runs[kind, n][1])
    repeats = [_repeat(runs, reps, rounds) for _ in range(REPEATS)]
    torch.distributed.destroy_process_group()
    # each constant the median of its repeats (this shared machine's load drifts between them)
    c_m, c_t, fixed = (statistics.median(r[key] for r in repeats) for key in ("module_s", "tensor_s", "microbatch_s"))
    # the plain layer before and after, the less disturbed of the two (this machine's other work only slows it)
    plain_layer = min(before, plain_layer_seconds())
    scale = PLAIN_LAYER_GPU_HOST / plain_layer
    return {"repeats": repeats, "module_s": c_m, "tensor_s": c_t, "microbatch_s": fixed,
            "plain_layer_s": plain_layer, "to_dgx_host": scale,
            "dgx_host": {"module_s": c_m * scale, "tensor_s": c_t * scale, "microbatch_s": fixed * scale},
            "deepspeed": deepspeed.__version__, "torch": torch.__version__}


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--reps", type=int, default=10)
    a.add_argument("--rounds", type=int, default=15)
    a.add_argument("--out", type=Path, default=None)
    args = a.parse_args()
    found = measure(args.reps, args.rounds)
    found = {"what": "DeepSpeed ZeRO-3's engine per micro-batch beyond the plain module: seconds per module, per "
                     "parameter tensor and per micro-batch on this CPU, and scaled to the DGX host",
             "made_by": "benchmarks/measure/deepspeed_hooks_cpu.py", "date": datetime.date.today().isoformat(),
             "host": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(), **found}
    print(f"ZeRO-3 per module {found['module_s'] * 1e6:.0f} us, per tensor {found['tensor_s'] * 1e6:.0f} us, "
          f"per micro-batch {found['microbatch_s'] * 1e6:.0f} us on this CPU (plain GPT layer "
          f"{found['plain_layer_s'] * 1e3:.3f} ms); on the DGX host x {found['to_dgx_host']:.2f}: "
          f"{found['dgx_host']['module_s'] * 1e6:.0f} / {found['dgx_host']['tensor_s'] * 1e6:.0f} / "
          f"{found['dgx_host']['microbatch_s'] * 1e6:.0f} us")
    if args.out:
        args.out.write_text(json.dumps(found, indent=1) + "\n")


if __name__ == "__main__":
    main()
