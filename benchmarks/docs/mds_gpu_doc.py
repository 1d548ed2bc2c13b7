"""docs/SMALL_WORK_GPU.md's sections on Megatron-DeepSpeed measured on a lent H200
(benchmarks/measure/small_work_mds.py, benchmarks/measure/host_profile_gpu.py): what DeepSpeed's BF16_Optimizer adds per
micro-batch, and where the host's time per layer goes. Rendered by benchmarks/docs/small_work_gpu_doc.py from the
committed files; nothing here needs a GPU."""

from __future__ import annotations

import json
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "data" / "measured" / "gpu"
ROWS = DATA / "2026-11-27-nvidia-h200-small-work-mds.json"
PROFILE = DATA / "2026-11-27-nvidia-h200-host-profile.json"


def accumulate_per_layer(rows: list[dict]) -> dict[tuple[int, int], tuple[float, float]]:
    """(width, batch) → (eager s per layer, the same pass with the BF16_Optimizer's per-micro-batch work, s per
    layer): each the two depths' difference over the layers between (small_work_gpu_pricing.per_layer)."""
    import small_work_gpu_pricing as pricing

    plain = pricing.per_layer(rows, lambda r: r["eager_s"])
    accumulated = pricing.per_layer(rows, lambda r: r["bf16_accumulate_s"])
    return {key: (plain[key], accumulated[key]) for key in plain}


def priced_per_layer(rows: list[dict]) -> dict[tuple[int, int], tuple[float, float]]:
    """(width, batch) → meshplan's (eager, with the BF16_Optimizer's accumulation) seconds per layer of the rows:
    small_work_gpu_pricing's "mds" stack (no wrapper), and the same under the preset's own wrapper (bf16 weights, the
    pipeline engine at ZeRO 0: BF16_Optimizer, cost/wrapper_work.py)."""
    from dataclasses import replace

    import small_work_gpu_pricing as pricing

    plain = pricing.stacks()["mds"][1]
    wrapped = replace(plain, optimizer_wrapper="deepspeed-pipeline")
    priced = [r | {"eager_s": pricing.predicted(r, plain, "NVIDIA H200"),
                   "bf16_accumulate_s": pricing.predicted(r, wrapped, "NVIDIA H200")} for r in rows]
    return accumulate_per_layer(priced)


def accumulate_section() -> list[str]:
    rows = json.loads(ROWS.read_text())["stacks"]["mds"]["rows"]
    priced = priced_per_layer(rows)
    measured = accumulate_per_layer(rows)
    lines = ["## DeepSpeed's BF16_Optimizer, per micro-batch (run D)", "",
             "Each Megatron-DeepSpeed row timed again with what DeepSpeed 0.19.8's engine does around a "
             "BF16_Optimizer's micro-batch (small_work_mds.py `ds_bf16_accumulate`: the bf16 gradients zeroed by one "
             "`_foreach_zero_`, then each cast to fp32 and added into its fp32 gradient in a Python loop). Per layer "
             "(12 parameter tensors, 24 launched kernels), the two depths' difference:", "",
             "| width | batch | eager (ms) | with the accumulation (ms) | added (ms) | meshplan eager | meshplan with "
             "it | meshplan added |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (w, b), (plain, acc) in sorted(measured.items()):
        p_plain, p_acc = priced[(w, b)]
        lines.append(f"| {w} | {b} | {plain * 1e3:.3f} | {acc * 1e3:.3f} | {(acc - plain) * 1e3:+.3f} | "
                     f"{p_plain * 1e3:.3f} | {p_acc * 1e3:.3f} | {(p_acc - p_plain) * 1e3:+.3f} |")
    negative = sum(acc < plain for plain, acc in measured.values())
    return lines + ["", "meshplan prices it as cost/wrapper_work.py says: two launches a tensor at the stack's host "
                    "cost per launch, 20 bytes a parameter, in the backward pass of the layer (so that it hides where "
                    "the GPU sets the pace), wherever the wrapper DeepSpeed picks for the plan's ZeRO stage is "
                    "BF16_Optimizer (the search prices each key's units with and without it and picks per stage: "
                    "step/units.Units.wrapped). The measured difference is of two medians of a noisy host "
                    f"({negative} of the rows read negative); data/measured/2026-11-27-bf16-microbatch-host-ops.md "
                    "counts its calls on a CPU.", ""]


def per_layer(run: dict, key: str) -> float:
    lo, hi = run["rows"][0], run["rows"][-1]
    return (hi[key] - lo[key]) / (hi["layers"] - lo["layers"])


def profile_section(top: int = 12) -> list[str]:
    runs = json.loads(PROFILE.read_text())["runs"]
    lines = ["## Megatron-DeepSpeed's host, profiled", "",
             "benchmarks/measure/host_profile_gpu.py on fresh H200 machines "
             "(data/measured/gpu/2026-11-27-nvidia-h200-host-profile.json): the forward without autograd, the forward "
             "and the backward at width 1024, timed apart, per layer (the 2- and 6-layer models' difference over 4 "
             "layers). Lent machines' hosts differ: the same host-bound row took up to 1.5 times as long on one as on "
             "another (the file's repeated rows), so the host's figures here are each one machine's.", "",
             "| run | forward, no autograd (ms) | forward (ms) | backward (ms) |", "|---|---:|---:|---:|"]
    for name, run in runs.items():
        if "rows" in run and "forward_s" in run["rows"][0]:
            lines.append(f"| {name} | " + " | ".join(f"{per_layer(run, k) * 1e3:.3f}" for k in
                                                       ("forward_nograd_s", "forward_s", "backward_s")) + " |")
    run = runs["mds-b1 (fourth call, with cProfile)"]
    lo, hi = ({t["function"]: t for t in r["python_profile"]} for r in run["rows"])
    layers = run["rows"][-1]["layers"] - run["rows"][0]["layers"]
    own = sorted(((t["own_us"] - lo.get(f, {}).get("own_us", 0.0)) / layers, f, (t["calls"] - lo.get(f, {}).get(
        "calls", 0.0)) / layers) for f, t in hi.items())[::-1]
    lines += ["", f"Where one forward and backward's host time goes per layer (cProfile, which slows each call it "
              f"counts; Python functions and the C calls they make, by own time, the {top} largest of "
              f"{sum(o for o, _, _ in own):,.0f} µs in the 40 it kept):", "",
              "| function | calls per layer | own µs per layer |", "|---|---:|---:|"]
    lines += [f"| `{f}` | {c:.1f} | {o:.0f} |" for o, f, c in own[:top]]
    rt = [r["forward_profile"]["cuda_runtime"].get("cudaStreamSynchronize", {"calls": 0, "self_cpu_us": 0.0})
          for r in runs["mds-b1 (third call)"]["rows"]]
    n, us = ((b[k] - a[k]) / layers for a, b in [rt] for k in ("calls", "self_cpu_us"))
    return lines + ["", f"No synchronisation stands out: torch.profiler counts {n:.0f} cudaStreamSynchronize a "
                    f"layer's forward, {us:.0f} µs of host time in all (the `torch.tensor(0.0, device=...)` copies of "
                    "its MoE-loss and MLP-bias placeholders). The time is spread over the module code's calls, its "
                    "GEMM calls (`matmul` from the autograd Functions) the largest.", ""]
