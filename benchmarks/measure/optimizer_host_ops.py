"""The host's work per parameter tensor of an optimizer step, counted in the frameworks' own code (issue 46): the
derivation of the stack presets' ``tensor_host`` (specs/stack.py, step/host.step_host).

Every PyTorch dispatcher call of one steady-state optimizer step is counted (a TorchDispatchMode) over n = 50 and
n = 100 tiny parameters: the difference over 50 is the calls per parameter tensor, the rest is fixed per step. A call
that launches a kernel on a GPU costs the host an eager op's time, 11.3-17.7 us on a DGX H100 host (NVIDIA
dgxc-benchmarking microbenchmarks/cpu_overhead, "Kernel launch test"): 14.5 us, the middle, here; a call that only
makes a view, detaches or reads a CPU scalar (``KERNEL_FREE``) costs what it takes on this project's host, 0.3-0.9 us:
0.6 us. Python's own loop passes over the parameters (0.05-0.14 us each) are left out. Counted here, on CPU:
- torch.optim.AdamW, foreach (PyTorch's default on CUDA), fused and the per-parameter loop, with clip_grad_norm_;
- DeepSpeed's ZeRO-1/2 optimizer (deepspeed/runtime/zero/stage_1_and_2.py, bf16, overlap_comm off) and its
  BF16_Optimizer (stage 1 with fp32 gradient accumulation, as Megatron-DeepSpeed's bf16 runs take it), on DeepSpeed's
  CPU accelerator over gloo (world size 1: every tensor in the rank's partition), in a process of their own.
Megatron-LM's and Megatron-Core's optimizers need CUDA and apex to build; their counts, read and run with apex's
FusedAdam loop replicated, are in data/measured/2026-11-26-optimizer-host-ops.md with FSDP2's DTensor cost.

Run: python benchmarks/measure/optimizer_host_ops.py

``--microbatch`` counts instead what DeepSpeed's wrappers add to each micro-batch's backward pass (one that is not
the step's last), per parameter tensor: the engine's forward and backward against the same module's plain forward and
backward. BF16_Optimizer (ZeRO 1, fp32 gradients): after the backward (a post-backward hook in 0.19.8;
runtime/bf16_optimizer.py update_hp_grads, unless bf16.immediate_grad_update) every bf16 gradient is cast to fp32
and added into the fp32 gradient (data/measured/2026-11-27-bf16-microbatch-host-ops.md); the ZeRO optimizer at
stages 1 (bf16 gradients), 2 and 3 (bf16 or fp32): its gradient hooks (runtime/zero/stage_1_and_2.py, stage3.py)
(data/measured/2026-11-27-zero-microbatch-host-ops.md).
"""

from __future__ import annotations

import collections
import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

LAUNCH_S = 14.5e-6  # an eager op that launches a kernel, on a DGX H100 host (module docstring)
META_S = 0.6e-6  # a call that launches none (module docstring)
KERNEL_FREE = ("view", "detach", "slice", "alias", "expand", "as_strided", "_local_scalar_dense", "lift_fresh", "t",
               "select", "unsqueeze", "squeeze", "_reshape_alias", "_record_function_enter_new",
               "_record_function_exit")
SIZES = (50, 100)
# DeepSpeed on its CPU accelerator over gloo, world size 1; MASTER_PORT 0: the rank's TCPStore binds a free port (no
# other rank connects), so that children run side by side (two test runs, say) never share one
DS_ENV = {"DS_ACCELERATOR": "cpu", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "RANK": "0", "WORLD_SIZE": "1",
          "LOCAL_RANK": "0"}


def count(fn: Callable[[], object]) -> collections.Counter:
    """The dispatcher calls ``fn`` makes, by op name."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.calls: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
            self.calls[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    mode = Counting()
    with mode:
        fn()
    return mode.calls


Step = tuple[Callable[[], object], Callable[[], object]]  # (prepare, step): the step alone is counted


def per_tensor(make: Callable[[int], Step]) -> dict[str, float]:
    """Calls per parameter tensor of the step ``make(n)`` returns (after its ``prepare``, not counted: the backward
    pass that leaves the gradients), from n = 50 and 100, after two warm steps."""
    counts = []
    for n in SIZES:
        prepare, step = make(n)
        for _ in range(2):
            prepare()
            step()
        prepare()
        counts.append(count(step))
    a, b = counts
    return {k: (b[k] - a[k]) / (SIZES[1] - SIZES[0]) for k in set(a) | set(b) if b[k] != a[k]}


def split(calls: dict[str, float]) -> tuple[float, float]:
    """(calls that launch a kernel, calls that do not) of a per-tensor count."""
    free = sum(v for k, v in calls.items() if k in KERNEL_FREE)
    return sum(calls.values()) - free, free


def price(calls: dict[str, float]) -> float:
    """Host seconds per parameter tensor on a DGX H100 host (module docstring)."""
    launching, free = split(calls)
    return launching * LAUNCH_S + free * META_S


def torch_counts() -> dict[str, dict[str, float]]:
    """torch.optim.AdamW's step and clip_grad_norm_, per implementation."""
    import torch

    def params(n: int) -> list:
        ps = [torch.nn.Parameter(torch.randn(4)) for _ in range(n)]
        for p in ps:
            p.grad = torch.randn(4)
        return ps

    def step(**kw: bool) -> Callable[[int], Step]:
        def make(n: int) -> Step:
            ps = params(n)
            opt = torch.optim.AdamW(ps, lr=1e-3, **kw)
            foreach = kw.get("foreach", kw.get("fused", False))

            def run() -> None:
                torch.nn.utils.clip_grad_norm_(ps, 1.0, foreach=foreach)
                opt.step()
            return (lambda: None), run  # the gradients stay: nothing to prepare
        return make

    return {"torch AdamW foreach + clip": per_tensor(step(foreach=True)),
            "torch AdamW fused + clip": per_tensor(step(fused=True)),
            "torch AdamW for-loop + clip": per_tensor(step(foreach=False))}


Setting = tuple[int, str | None, bool]  # ZeRO stage, gradient accumulation dtype (None: DeepSpeed's default), bf16


def deepspeed_batch(requests: list[list]) -> list:
    """What each request counts, all in one process of its own (DeepSpeed picks its accelerator and process group at
    import, and its optimizer check imports torch's compiler: seconds of CPU a process, paid once): ``["zero",
    [[stage, accumulation dtype or None, bf16], ...]]`` (deepspeed_counts), ``["microbatch", stage, grad_accum]``
    (microbatch_counts), ``["pipeline"]`` (pipeline_microbatch_counts)."""
    env = {**os.environ, **DS_ENV}
    out = subprocess.run([sys.executable, __file__, "--deepspeed-batch", json.dumps(requests)], env=env,
                         capture_output=True, text=True, timeout=600 * len(requests), check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def deepspeed_counts(settings: list[Setting]) -> list[tuple[str, dict[str, float]]]:
    """For each (ZeRO stage, gradient accumulation dtype, bf16 weights or fp32) the optimizer DeepSpeed wraps the
    step in and its calls per parameter tensor, in a process of their own (deepspeed_batch)."""
    (found,) = deepspeed_batch([["zero", [list(setting) for setting in settings]]])
    return [(one["optimizer"], one["calls"]) for one in found]


def deepspeed_on_cpu() -> Any:
    """DeepSpeed with its process group on this CPU (gloo), without its shared-memory all-reduce kernel: DeepSpeed
    compiles that C++ op the first time a process group starts on a machine (70 s of CPU here; every fresh CI machine)
    and uses it only for inference's all-reduce (deepspeed/comm/torch.py inference_all_reduce), which nothing counted
    here runs. The ops' compatibility is one dict that DeepSpeed lets its callers edit (deepspeed/ops/__init__.py)."""
    import deepspeed

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    return deepspeed


def _params_module(torch, n: int):  # noqa: ANN001, ANN202
    """A module of ``n`` tiny parameters whose forward touches each."""
    class Params(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(4)) for _ in range(n)])

        def forward(self) -> torch.Tensor:
            return sum((p * p).sum() for p in self.ps)
    return Params()


def microbatch_counts(stage: int = 1, grad_accum: str = "fp32") -> dict[str, Any]:
    """The calls per parameter tensor and micro-batch beyond the module's own (module docstring) of the wrapper
    DeepSpeed runs for bf16 weights at ZeRO ``stage`` with gradients accumulated in ``grad_accum`` (stage 1, fp32:
    BF16_Optimizer; stage 2: the ZeRO optimizer), in a process of its own (deepspeed_batch)."""
    (found,) = deepspeed_batch([["microbatch", stage, grad_accum]])
    return found


def _microbatch_found(torch, deepspeed, stage: int, grad_accum: str) -> dict[str, Any]:  # noqa: ANN001
    cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 8, "steps_per_print": 10**9,
           "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
           "zero_optimization": {"stage": stage, "overlap_comm": False, "contiguous_gradients": True},
           "bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": grad_accum}}
    found: dict[str, Any] = {}

    def engine(n: int) -> Step:
        model, *_ = deepspeed.initialize(model=_params_module(torch, n), config=cfg)
        found["optimizer"] = type(model.optimizer).__name__
        return (lambda: None), (lambda: model.backward(model()))

    def plain(n: int) -> Step:
        model = _params_module(torch, n).to(torch.bfloat16)
        return (lambda: None), (lambda: model().backward())

    with_engine, alone = per_tensor(engine), per_tensor(plain)
    found["engine"], found["plain"] = with_engine, alone
    found["extra"] = {k: with_engine.get(k, 0.0) - alone.get(k, 0.0) for k in sorted(set(with_engine) | set(alone))
                      if with_engine.get(k, 0.0) != alone.get(k, 0.0)}
    return found


def pipeline_microbatch_counts() -> dict[str, Any]:
    """The calls per parameter tensor and micro-batch beyond the module's own of the wrapper DeepSpeed's pipeline
    engine runs for bf16 weights without ZeRO, with bf16 gradient accumulation (BF16_Optimizer, as Megatron-DeepSpeed's
    bf16 runs at ZeRO 0 take it), in a process of its own (deepspeed_batch): the pipeline engine runs micro-batches
    only inside ``train_batch``, so a micro-batch is a step of two less a step of one."""
    (found,) = deepspeed_batch([["pipeline"]])
    return found


def _pipeline_found(torch, deepspeed) -> dict[str, Any]:  # noqa: ANN001
    from deepspeed.pipe import PipelineModule
    found: dict[str, Any] = {}

    class Stage(torch.nn.Module):  # the params module as a pipeline stage: its input passes through
        def __init__(self, n: int) -> None:
            super().__init__()
            self.inner = _params_module(torch, n)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.inner()

    def engine(n: int, steps: int) -> Step:
        cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": steps, "steps_per_print": 10**9,
               "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
               "zero_optimization": {"stage": 0}, "bf16": {"enabled": True},
               "data_types": {"grad_accum_dtype": "bf16"}}
        module = PipelineModule(layers=[Stage(n)], num_stages=1, loss_fn=lambda out, _: out.sum())
        model, *_ = deepspeed.initialize(model=module, config=cfg, model_parameters=list(module.parameters()))
        found["optimizer"] = type(model.optimizer).__name__
        batches = iter([(torch.zeros(1, dtype=torch.bfloat16), torch.zeros(1))] * 100)
        return (lambda: None), (lambda: model.train_batch(batches))

    def plain(n: int) -> Step:
        model = _params_module(torch, n).to(torch.bfloat16)
        return (lambda: None), (lambda: model().backward())

    two, one, alone = per_tensor(lambda n: engine(n, 2)), per_tensor(lambda n: engine(n, 1)), per_tensor(plain)
    micro = {k: two.get(k, 0.0) - one.get(k, 0.0) for k in set(two) | set(one)}
    found["extra"] = {k: micro.get(k, 0.0) - alone.get(k, 0.0) for k in sorted(set(micro) | set(alone))
                      if micro.get(k, 0.0) != alone.get(k, 0.0)}
    return found


def _zero_found(torch, deepspeed, settings: list[Setting]) -> list[dict[str, Any]]:  # noqa: ANN001
    def counts(stage: int, grad_accum: str | None, bf16: bool) -> dict[str, Any]:
        def make(n: int) -> Step:
            cfg = {"train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0, "steps_per_print": 10**9,
                   "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
                   "zero_optimization": {"stage": stage, "overlap_comm": False, "contiguous_gradients": True},
                   "bf16": {"enabled": bf16}}
            if grad_accum:
                cfg["data_types"] = {"grad_accum_dtype": grad_accum}
            engine, *_ = deepspeed.initialize(model=_params_module(torch, n), config=cfg)
            return (lambda: engine.backward(engine())), engine.step

        return {"optimizer": type(make(2)[1].__self__.optimizer).__name__, "calls": per_tensor(make)}

    return [counts(*setting) for setting in settings]


def _batch_child(requests: list[list]) -> None:
    import torch

    deepspeed = deepspeed_on_cpu()
    kinds = {"zero": _zero_found, "microbatch": _microbatch_found, "pipeline": _pipeline_found}
    found = []
    for kind, *args in requests:
        # what is alive now is kept out of the collections BF16_Optimizer forces (utils.see_memory_usage, 4 a
        # wrapper), each of which walked every object torch's compiler had imported: 31 -> 12 s of CPU for 9 requests
        gc.freeze()
        found.append(kinds[kind](torch, deepspeed, *args))
    print(json.dumps(found))
    # a process that exits with gloo's group alive can abort in its threads' destructors (tests/torchtitan_cpu_train.py)
    torch.distributed.destroy_process_group()


def main() -> None:
    if "--microbatch" in sys.argv[1:]:
        settings = ((1, "fp32"), (1, "bf16"), (2, "bf16"), (2, "fp32"), (3, "bf16"), (3, "fp32"))
        *each, pipeline = deepspeed_batch([*(["microbatch", *setting] for setting in settings), ["pipeline"]])
        for (stage, grad_accum), found in zip(settings, each, strict=True):
            launching, free = split(found["extra"])
            print(f"DeepSpeed {found['optimizer']} (ZeRO-{stage}, {grad_accum} gradients) per micro-batch, per "
                  f"parameter tensor beyond the module's own: {json.dumps(found['extra'])}: {launching:.0f} "
                  f"launching, {free:.0f} other calls, {price(found['extra']) * 1e6:.1f} us (DGX H100 host)")
        launching, free = split(pipeline["extra"])
        print(f"DeepSpeed's pipeline engine, {pipeline['optimizer']} (ZeRO-0, bf16 gradients) per micro-batch, per "
              f"parameter tensor beyond the module's own: {json.dumps(pipeline['extra'])}: {launching:.0f} launching, "
              f"{free:.0f} other calls, {price(pipeline['extra']) * 1e6:.1f} us (DGX H100 host)")
        return
    rows = dict(torch_counts())
    settings: list[Setting] = [(2, None, True), (1, "fp32", True), (2, None, False)]
    for (stage, accumulate, bf16), (wrapper, calls) in zip(settings, deepspeed_counts(settings), strict=True):
        weights = ("bf16" if bf16 else "fp32") + (", fp32 accumulation" if accumulate else "")
        rows[f"DeepSpeed {wrapper} (ZeRO-{stage}, {weights})"] = calls
    print("configuration | kernel-launching calls | other calls | host us per tensor (DGX H100)")
    for name, calls in rows.items():
        launching, free = split(calls)
        print(f"{name} | {launching:.0f} | {free:.0f} | {price(calls) * 1e6:.1f}")


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--deepspeed-batch":
        _batch_child(json.loads(sys.argv[2]))
    else:
        main()
