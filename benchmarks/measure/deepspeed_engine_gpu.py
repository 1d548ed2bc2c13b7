"""DeepSpeed's own engine training small GPTs on one GPU, under the ZeRO settings that make it pick different optimizer
wrappers (issue 46: the fixed costs per micro-batch; cost/wrapper_work.py, cost/wrappers.py). Run where a GPU is lent,
with DeepSpeed's pure-Python package importable (no ops built: the client optimizer is torch's fused AdamW); writes
one dated JSON file that benchmarks/docs/deepspeed_engine_doc.py compares with meshplan's estimates.

    python benchmarks/measure/deepspeed_engine_gpu.py --out data/measured/gpu/<date>-<gpu>-deepspeed-engine.json

The model is small_work_gpu.py's plain-PyTorch GPT (Megatron-DeepSpeed's GPT without its fused kernels), bf16
weights, wrapped by ``deepspeed.initialize`` with a DeepSpeed JSON config per setting:

    bf16-optimizer  ZeRO 1, gradients accumulated in fp32 ("data_types": {"grad_accum_dtype": "fp32"}): the engine
                    runs BF16_Optimizer (runtime/engine.py ``_do_optimizer_sanity_check``), which zeroes the bf16
                    gradients before each micro-batch's backward and adds each into its fp32 gradient after it
    zero1           ZeRO 1 with bf16 gradients: DeepSpeedZeroOptimizer, stage 1
    zero2           ZeRO 2 with fp32 gradient accumulation: DeepSpeedZeroOptimizer, stage 2
    zero2-overlap   the same with ``overlap_comm`` on (Hugging Face's DeepSpeed config templates set it)
    zero3           ZeRO 3 with fp32 gradient accumulation: DeepSpeedZeroOptimizer_Stage3
    torch           no DeepSpeed: the same loop in plain PyTorch (autograd accumulating the bf16 gradients, the norm
                    clipped and the fused AdamW stepped on the bf16 weights every ``--accum`` micro-batches), the
                    baseline the settings' own work is measured against

Each setting, width and depth gets a fresh engine; for each micro-batch b, optimizer steps of ``--accum`` micro-batches
(``engine(tokens)``, ``engine.backward(loss)``, ``engine.step()`` each, as DeepSpeed's training loops call them) are
timed whole, the median of ``--steps`` after ``--warmup``. The wrapper the engine picked is recorded by its class
name. Two depths, so that a layer's share is their difference over the layers between. ``--profile`` also profiles
one optimizer step of each row after its timing (host_profile_gpu.py's torch.profiler summary: CPU ops by self time
and the CUDA runtime's calls, synchronisations included; and cProfile's Python functions by own time, per step).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from small_work_gpu import HEAD_DIM, SEQ, VOCAB, gpt, machine  # noqa: E402

DEVICE = os.environ.get("SMALL_WORK_DEVICE", "cuda")  # cpu: a smoke test of this script on a machine without a GPU
SETTINGS = {
    "bf16-optimizer": {"zero_optimization": {"stage": 1}, "data_types": {"grad_accum_dtype": "fp32"}},
    "zero1": {"zero_optimization": {"stage": 1}},
    "zero2": {"zero_optimization": {"stage": 2}, "data_types": {"grad_accum_dtype": "fp32"}},
    "zero2-overlap": {"zero_optimization": {"stage": 2, "overlap_comm": True},
                      "data_types": {"grad_accum_dtype": "fp32"}},
    "zero3": {"zero_optimization": {"stage": 3}, "data_types": {"grad_accum_dtype": "fp32"}},
    "torch": {},
}


class PlainLoop:
    """The ``torch`` setting: DeepSpeed's calls over a plain PyTorch loop (the module docstring)."""

    def __init__(self, torch, model, optimizer, accum: int):
        self.torch, self.model, self.optimizer, self.accum, self.seen = torch, model, optimizer, accum, 0

    def __call__(self, tokens, labels):
        return self.model(tokens, labels)

    def backward(self, loss) -> None:
        (loss / self.accum).backward()

    def step(self) -> None:
        self.seen += 1
        if self.seen % self.accum == 0:
            self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def _sync(torch) -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def engine_for(torch, deepspeed, setting: str, width: int, layers: int, seq: int, micro: int, accum: int):
    """A DeepSpeed engine over the GPT of ``width`` and ``layers``, bf16, under ``setting``'s config."""
    model = gpt(torch, width, layers, seq, VOCAB).to(DEVICE, torch.bfloat16)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=DEVICE == "cuda")
    if setting == "torch":
        return PlainLoop(torch, model, optimizer, accum)
    config = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum,
              "bf16": {"enabled": True}, "gradient_clipping": 1.0, "steps_per_print": 10**9,
              "wall_clock_breakdown": False, **SETTINGS[setting]}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def time_steps(torch, engine, width: int, seq: int, micro: int, accum: int, steps: int, warmup: int) -> float:
    """The median seconds of an optimizer step of ``accum`` micro-batches."""
    tokens = torch.randint(0, VOCAB, (micro, seq), device=DEVICE)
    times = []
    for i in range(warmup + steps):
        _sync(torch)
        start = time.perf_counter()
        for _ in range(accum):
            loss = engine(tokens, tokens)
            engine.backward(loss)
            engine.step()
        _sync(torch)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def profiled(torch, engine, seq: int, micro: int, accum: int) -> dict:
    """One optimizer step of ``accum`` micro-batches under torch.profiler and under cProfile (host_profile_gpu.py)."""
    import host_profile_gpu as hp

    tokens = torch.randint(0, VOCAB, (micro, seq), device=DEVICE)

    def step() -> None:
        for _ in range(accum):
            loss = engine(tokens, tokens)
            engine.backward(loss)
            engine.step()

    return {"torch_profiler": hp._cpu_ops(torch, step), "python": hp._python_profile(step, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--settings", default="bf16-optimizer,zero1,zero2,torch")
    p.add_argument("--widths", default="1024,2048")
    p.add_argument("--depths", default="2,6")
    p.add_argument("--batches", default="1,4")
    p.add_argument("--accum", type=int, default=4)
    p.add_argument("--seq", type=int, default=SEQ)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--profile", action="store_true")
    a = p.parse_args(argv)
    import deepspeed
    import torch

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(k, v)
    deepspeed.init_distributed(dist_backend="nccl" if DEVICE == "cuda" else "gloo")
    rows: list[dict] = []
    head = {"source": f"benchmarks/measure/deepspeed_engine_gpu.py, {datetime.date.today().isoformat()}",
            "deepspeed": deepspeed.__version__, **machine(torch)}
    for setting in a.settings.split(","):
        for width in map(int, a.widths.split(",")):
            for layers in map(int, a.depths.split(",")):
                for micro in map(int, a.batches.split(",")):
                    engine = engine_for(torch, deepspeed, setting, width, layers, a.seq, micro, a.accum)
                    seconds = time_steps(torch, engine, width, a.seq, micro, a.accum, a.steps, a.warmup)
                    row = {"setting": setting, "wrapper": type(engine.optimizer).__name__, "width": width,
                           "heads": width // HEAD_DIM.get(width, 64), "layers": layers, "micro_batch": micro,
                           "accum": a.accum, "seq": a.seq, "step_s": seconds}
                    if a.profile:
                        row["profile"] = profiled(torch, engine, a.seq, micro, a.accum)
                    print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
                    rows.append(row)
                    Path(a.out).write_text(json.dumps(head | {"rows": rows}, indent=1) + "\n")  # kept if cut short
                    del engine
                    if DEVICE == "cuda":
                        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
