"""Where the host's time goes in a small GPT's forward and backward on a GPU (issue 46, item 3): one code of
benchmarks/measure/small_work_gpu.py (``--stack``: plain PyTorch or Megatron-DeepSpeed's GPTModel, small_work_mds.py) at
one width and micro-batch and two depths. Per depth: the forward without autograd, the forward and the backward, each
timed apart (a synchronisation between; medians of ``--steps``), and one forward and one backward under
torch.profiler: the CPU ops by self time (the Python-level ``aten::`` calls, the CUDA runtime's calls such as
``cudaLaunchKernel`` and ``cudaStreamSynchronize``), summed by name. The depth difference is per layer; a host call
that waits for the GPU (a synchronisation, a pageable copy) shows as its self time.

    python benchmarks/measure/host_profile_gpu.py --stack mds --out data/measured/gpu/<date>-<gpu>-host-profile.json
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import small_work_gpu as sw  # noqa: E402


def _timed(torch, fn, steps: int) -> float:
    out = []
    for _ in range(steps):
        sw._sync(torch)
        start = time.perf_counter()
        fn()
        sw._sync(torch)
        out.append(time.perf_counter() - start)
    return statistics.median(out)


def _cpu_ops(torch, fn) -> dict:
    """One call of ``fn`` under torch.profiler: self CPU microseconds and calls per op name, the busiest 40, and the
    totals of the CUDA runtime's calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sw._sync(torch)
    self_us: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for evt in prof.key_averages():
        if evt.self_cpu_time_total > 0 or evt.count:
            self_us[evt.key] += evt.self_cpu_time_total
            calls[evt.key] += evt.count
    top = [{"op": k, "self_cpu_us": round(v, 1), "calls": calls[k]} for k, v in self_us.most_common(40)]
    runtime = {k: {"self_cpu_us": round(self_us[k], 1), "calls": calls[k]} for k in self_us if k.startswith("cuda")}
    return {"top": top, "cuda_runtime": runtime, "self_cpu_us_total": round(sum(self_us.values()), 1)}


def _python_profile(fn, steps: int) -> list[dict]:
    """``fn`` called ``steps`` times under cProfile: the 40 Python functions of most own time, per call of ``fn``."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        fn()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (primitive calls, calls, own s, cumulative s, callers)
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:40]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": calls / steps, "own_us": own / steps * 1e6,
             "cumulative_us": cum / steps * 1e6} for (f, line, name), (_, calls, own, cum, _) in rows]


def profile_depth(torch, width: int, batch: int, layers: int, steps: int, python_profile: bool = False) -> dict:
    torch.manual_seed(0)
    model = sw.build(torch, width, layers)
    tokens = torch.randint(0, sw.VOCAB, (batch, sw.SEQ), device=sw.DEVICE)
    labels = torch.randint(0, sw.VOCAB, (batch, sw.SEQ), device=sw.DEVICE)
    for _ in range(5):
        model(tokens, labels).backward()
    holder: list = []

    def nograd():
        with torch.no_grad():
            model(tokens, labels)

    row = {"width": width, "batch": batch, "layers": layers, "forward_nograd_s": _timed(torch, nograd, steps)}
    forward, backward = [], []
    for _ in range(steps):  # each forward's graph freed by its backward before the next
        forward.append(_timed(torch, lambda: holder.append(model(tokens, labels)), 1))
        backward.append(_timed(torch, lambda: holder.pop().backward(), 1))
    row["forward_s"], row["backward_s"] = statistics.median(forward), statistics.median(backward)
    if python_profile:
        row["python_profile"] = _python_profile(lambda: holder.pop().backward() if holder.append(
            model(tokens, labels)) is None else None, steps)
    row["forward_profile"] = _cpu_ops(torch, lambda: holder.append(model(tokens, labels)))
    row["backward_profile"] = _cpu_ops(torch, lambda: holder.pop().backward())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--stack", choices=("pytorch", "mds"), default="mds")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--depths", type=sw._ints, default=sw.DEPTHS)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--python", action="store_true", help="also a cProfile of the forward and backward passes")
    args = parser.parse_args(argv)
    sw.STACK["name"] = args.stack
    import torch

    data = sw.machine(torch) | {"stack": args.stack, "rows": []}
    for layers in args.depths:
        data["rows"].append(profile_depth(torch, args.width, args.batch, layers, args.steps, args.python))
        if sw.DEVICE == "cuda":
            torch.cuda.empty_cache()
        Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    lo, hi = data["rows"][0], data["rows"][-1]
    per = {k: (hi[k] - lo[k]) / (hi["layers"] - lo["layers"]) * 1e3 for k in ("forward_nograd_s", "forward_s",
                                                                               "backward_s")}
    print(json.dumps({"stack": args.stack, "ms_per_layer": per}), flush=True)
    for phase in ("forward_profile", "backward_profile"):
        a = {t["op"]: t for t in lo[phase]["top"]}
        less = [(t["op"], t["calls"] - a.get(t["op"], {}).get("calls", 0),
                 round(t["self_cpu_us"] - a.get(t["op"], {}).get("self_cpu_us", 0))) for t in hi[phase]["top"][:25]]
        print(phase, less, flush=True)
    if args.python:
        a = {t["function"]: t for t in lo["python_profile"]}
        print("python", [(t["function"], round(t["calls"] - a.get(t["function"], {}).get("calls", 0), 1),
                          round(t["own_us"] - a.get(t["function"], {}).get("own_us", 0))) for t in
                         hi["python_profile"][:30]], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
