"""The Python glue of each zoo model's training step measured on this machine's CPU (measure/glue.py), written to
data/measured/<date>-cpu-glue.json for benchmarks/docs/measured_gpu_doc.py, which adds it to the committed GPU run's
host timeline (the GPU records predate the glue's measurement).

    python benchmarks/measure/cpu_glue.py                    # the whole zoo: about a minute on a quiet 2-core host

Each model runs the step check-step runs (forward, the trace's loss, backward, AdamW, zero_grad) on one thread,
with the optimizer's foreach implementation, which torch.optim picks for CUDA tensors (command.optimizer_factory)
and so the one the GPU run's step called; three warm-up steps, then the median of seven watched steps, glibc
keeping freed memory as check-step does on a CPU (check.keep_freed_memory: otherwise the frees between ops return
memory to the system, host work a GPU's caching allocator does not do, and the glue varies by ±40 % from step to
step; with it ±10 %).
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def measure(models: list[str], foreach: bool = True) -> dict:
    import torch

    from meshplan.calibrate.bench import device_info
    from meshplan.measure.check import keep_freed_memory
    from meshplan.measure.glue import measure_glue
    from meshplan.measure.step import make_step
    from meshplan_research.zoo import ZOO

    torch.set_num_threads(1)
    keep_freed_memory()
    out = {}
    for name in models:
        torch.manual_seed(0)
        model, inputs = ZOO[name].build()
        optimizer = torch.optim.AdamW(list(model.parameters()), lr=1e-4, foreach=foreach)
        step = make_step(model, inputs, optimizer)
        for _ in range(3):
            step()
        glue = measure_glue(step, repeats=7)
        out[name] = {k: float(f"{v:.5g}") for k, v in glue.to_dict().items()}
        print(f"{name:10s} glue {glue.seconds * 1e3:6.2f} ms, {glue.op_calls} op calls, {glue.empty_calls} "
              f"empty, mode {glue.op_overhead * 1e6:.2f} / {glue.empty_overhead * 1e6:.2f} us", flush=True)
    return {"machine": device_info("cpu")["name"], "cores": __import__("os").cpu_count(), "threads": 1,
            "torch": torch.__version__, "python": platform.python_version(),
            "date": datetime.date.today().isoformat(), "optimizer": "adamw " + ("foreach" if foreach else "for-loop"),
            "models": out}


def main(argv: list[str] | None = None) -> int:
    from meshplan_research.zoo import ZOO

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--out", default=None)
    parser.add_argument("--for-loop", action="store_true", help="AdamW's for-loop implementation (what torch.optim "
                        "picks for CPU tensors: the CPU run's step) rather than foreach (the GPU run's)")
    args = parser.parse_args(argv)
    data = measure([m for m in args.models.split(",") if m], foreach=not args.for_loop)
    path = Path(args.out) if args.out else ROOT / "data" / "measured" / f"{data['date']}-cpu-glue.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
