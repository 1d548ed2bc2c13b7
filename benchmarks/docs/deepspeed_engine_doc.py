"""docs/SMALL_WORK_GPU.md's section on DeepSpeed's own engine measured on a lent H200
(benchmarks/measure/deepspeed_engine_gpu.py, data/measured/gpu/2026-11-27c-nvidia-h200-deepspeed-engine.json): whole
optimizer steps under the ZeRO settings whose optimizer wrappers differ, against meshplan's estimate of each.
Rendered by benchmarks/docs/small_work_gpu_doc.py from the committed file; nothing here needs a GPU."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from functools import cache
from pathlib import Path

from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack

DATA = Path(__file__).resolve().parents[2] / "data" / "measured" / "gpu"
FILE = DATA / "2026-11-27c-nvidia-h200-deepspeed-engine.json"
# each setting's plan: its ZeRO stage and gradient bytes (deepspeed_engine_gpu.SETTINGS: "data_types.grad_accum_dtype")
SETTINGS = {"bf16-optimizer": (1, 4), "zero1": (1, 2), "zero2": (2, 4), "zero2-overlap": (2, 4), "zero3": (3, 4),
            "torch": (0, 2)}


@cache
def stack_of(setting: str) -> Stack:
    """The preset a user names for the run, with the attention kernel the run's SDPA took (as the plain-PyTorch rows
    are priced: small_work_gpu_pricing's "pytorch" stack)."""
    import small_work_gpu_pricing as pricing

    eager = pricing.stacks()["pytorch"][1]
    return eager if setting == "torch" else replace(load_stack("deepspeed"), attention_kernel=eager.attention_kernel)


def priced(row: dict, gpu: str) -> float:
    """meshplan's step of the row: one GPU, its ZeRO stage and gradient bytes, ``accum`` micro-batches."""
    import small_work_gpu_pricing as pricing

    zero, grad_bytes = SETTINGS[row["setting"]]
    plan = Plan(micro_batch=row["micro_batch"], global_batch=row["micro_batch"] * row["accum"], zero=zero,
                grad_bytes=grad_bytes, recompute="none")
    model = pricing.model_of(row | {"batch": row["micro_batch"]})
    return estimate(model, load_system(pricing.SYSTEM[gpu]).cluster(1), plan, stack_of(row["setting"])).step_time


def per_layer(rows: list[dict], step: str) -> dict[tuple[str, int, int, int], float]:
    """(setting, width, micro-batch, micro-batches a step) → seconds per layer per micro-batch: the two depths'
    difference over the layers between and the micro-batches of a step (the optimizer step's share included)."""
    by: dict[tuple[str, int, int, int], dict[int, float]] = {}
    for r in rows:
        by.setdefault((r["setting"], r["width"], r["micro_batch"], r["accum"]), {})[r["layers"]] = r[step]
    return {key: (t[max(t)] - t[min(t)]) / (max(t) - min(t)) / key[3] for key, t in by.items() if len(t) > 1}


def split(rows: list[dict], step: str) -> dict[str, tuple[float, float, float, float]]:
    """setting → (per step, per micro-batch) seconds of a layer and of the rest (L = 0), from steps of 1 and 8
    micro-batches at two depths: t(L, m) = S0 + S1·L + m·(M0 + M1·L), solved exactly."""
    t = {(r["setting"], r["layers"], r["accum"]): r[step] for r in rows}
    out = {}
    for setting in dict.fromkeys(r["setting"] for r in rows):
        (lo, hi), (m1, m8) = sorted({k[1] for k in t if k[0] == setting}), (1, 8)
        layer = {m: (t[setting, hi, m] - t[setting, lo, m]) / (hi - lo) for m in (m1, m8)}
        rest = {m: t[setting, lo, m] - lo * layer[m] for m in (m1, m8)}
        per_mb = (layer[m8] - layer[m1]) / (m8 - m1), (rest[m8] - rest[m1]) / (m8 - m1)
        out[setting] = (layer[m1] - per_mb[0], per_mb[0], rest[m1] - per_mb[1], per_mb[1])
    return out


def section() -> list[str]:
    data = json.loads(FILE.read_text())
    lines = ["## DeepSpeed's engine, by ZeRO setting (run F)", "",
             "DeepSpeed 0.19.8's own engine (`deepspeed.initialize`, benchmarks/measure/deepspeed_engine_gpu.py) "
             "training the plain-PyTorch GPT on one H200, whole steps timed (the median of 5), under DeepSpeed configs "
             "whose optimizer wrappers or ZeRO stages differ, and the same loop in plain PyTorch (`torch`, from the "
             "second call on), over five calls (deepspeed_engine_gpu.py's settings; the data file says what each ran). "
             "meshplan prices each as `--framework deepspeed` (the plain loop as the `pytorch` rows "
             "above), the attention kernel the run's SDPA took, with the setting's ZeRO stage and gradient bytes: "
             + "; ".join(f"{s} ZeRO {z}, {g}-byte gradients" for s, (z, g) in SETTINGS.items()) + ". Each call ran "
             "on a fresh machine (data/measured/gpu/README.md).", "",
             "| call | setting | wrapper | width | layers | micro-batch | micro-batches a step | measured (ms) | "
             "meshplan (ms) | error |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    errors: dict[str, list[float]] = {}
    layers: list[str] = []
    parts: list[str] = []
    by_call = {c["call"]: [r | {"priced_s": priced(r, c["gpu"])} for r in c["rows"]] for c in data["calls"]}
    for call in data["calls"]:
        rows = by_call[call["call"]]
        for r in rows:
            err = r["priced_s"] / r["step_s"] - 1
            errors.setdefault(r["setting"], []).append(abs(err))
            lines.append(f"| {call['call']} | {r['setting']} | {r['wrapper']} | {r['width']} | {r['layers']} | "
                         f"{r['micro_batch']} | {r['accum']} | {r['step_s'] * 1e3:.2f} | {r['priced_s'] * 1e3:.2f} | "
                         f"{err * 100:+.1f} % |")
        measured, mine = per_layer(rows, "step_s"), per_layer(rows, "priced_s")
        layers += [f"| {call['call']} | {s} | {w} | {b} | {m} | {measured[s, w, b, m] * 1e3:.3f} | "
                   f"{mine[s, w, b, m] * 1e3:.3f} |" for (s, w, b, m) in sorted(measured)]
        if len({r["accum"] for r in rows}) > 1:
            them, us = split(rows, "step_s"), split(rows, "priced_s")
            parts += [f"| {s} | " + " | ".join(f"{a * 1e3:.2f} / {b * 1e3:.2f}" for a, b in zip(them[s], us[s],
                                                                                            strict=True)) + " |"
                      for s in them]
    summary = "; ".join(f"{s} {statistics.median(e) * 100:.0f} % (max {max(e) * 100:.0f} %)"
                        for s, e in errors.items())
    return lines + ["", f"Median |error| by setting: {summary}.", "",
                    "Per layer and micro-batch (the 6- and 2-layer steps' difference over 4 layers and the step's "
                    "micro-batches; the optimizer step's share of a layer included):", "",
                    "| call | setting | width | micro-batch | micro-batches a step | measured (ms) | meshplan (ms) |",
                    "|---:|---|---:|---:|---:|---:|---:|", *layers, "",
                    "What a step pays once and what each micro-batch pays, apart (the third call: width 1024, "
                    "micro-batch 1, steps of 1 and 8 micro-batches at 2 and 6 layers, t(L, m) = S0 + S1·L + "
                    "m·(M0 + M1·L) solved exactly; S1 holds a layer's optimizer step, M0 and S0 the embedding, the "
                    "head, the loop and the engine's own calls). Each cell measured / meshplan, ms; one machine's "
                    "medians of a host-bound loop, noisy to a few tenths of a millisecond a layer:", "",
                    "| setting | per layer per step S1 | per layer per micro-batch M1 | the rest per step S0 | "
                    "the rest per micro-batch M0 |", "|---|---:|---:|---:|---:|", *parts, "", *_reading(by_call), "",
                    *_profiles(data)]


def _reading(by_call: dict[int, list[dict]]) -> list[str]:
    """What the third call's split says of the ZeRO optimizer, its figures from the file (``by_call``: each call's
    rows with meshplan's step, ``priced_s``)."""
    them, us = split(by_call[3], "step_s"), split(by_call[3], "priced_s")
    m0 = [(them[s][3] - us[s][3]) * 1e3 for s in ("zero1", "zero2")]
    m1 = [(them[s][1] - them["torch"][1]) * 1e3 for s in ("zero2", "bf16-optimizer")]
    p1 = [(us[s][1] - us["torch"][1]) * 1e3 for s in ("zero2", "bf16-optimizer")]
    return [f"Per layer and micro-batch, ZeRO 2 took {m1[0]:.1f} ms and BF16_Optimizer {m1[1]:.1f} ms more than the "
            f"plain loop, against {p1[0]:.1f} and {p1[1]:.1f} ms priced: the work each wrapper does to every "
            "micro-batch's gradients (cost/wrapper_work.py; ZeRO 2's gradient hook copies each gradient into its "
            "reduction bucket and out to its partition, data/measured/2026-11-27-zero-microbatch-host-ops.md). "
            f"The ZeRO optimizer (stages 1 and 2) also pays {min(m0):.1f}-{max(m0):.1f} ms a micro-batch outside the "
            "layers beyond what meshplan prices, a cost the CPU counts do not show (at stage 1 nothing launches per "
            "micro-batch beyond the hook's Python): a lead, nothing fitted to it.", "", *_fifth(by_call)]


def _fifth(by_call: dict[int, list[dict]]) -> list[str]:
    """What the fifth call says of ZeRO 3 and of ZeRO 2 with overlap_comm, per layer and micro-batch beyond the plain
    loop's, measured and priced (medians over its widths and micro-batches)."""
    if 5 not in by_call:
        return []
    rows = by_call[5]
    them, us = per_layer(rows, "step_s"), per_layer(rows, "priced_s")

    def beyond(table: dict, setting: str) -> float:
        return statistics.median(t - table["torch", w, b, m] for (s, w, b, m), t in table.items() if s == setting) * 1e3

    three, overlap = (beyond(them, s) for s in ("zero3", "zero2-overlap"))
    p3, po = (beyond(us, s) for s in ("zero3", "zero2-overlap"))
    return [f"The fifth call: per layer and micro-batch, ZeRO 3 took {three:.1f} ms more than the plain loop (median), "
            f"against {p3:.1f} ms priced: its per-module parameter hooks (runtime/zero/parameter_offload.py, the "
            "fetch before each module's forward and backward and the release after), priced at what DeepSpeed's own "
            "engine costs this project's CPU per module and per parameter tensor, scaled to the DGX host by the plain "
            "layer (benchmarks/measure/deepspeed_hooks_cpu.py, "
            "data/measured/2026-11-27-deepspeed-zero3-hooks-cpu.json; cost/wrapper_work.py ZERO3_HOOKS), nothing "
            "fitted to this call. meshplan counts 9 modules a layer (its 6 parameter-holding modules and 3 containers: "
            "layer, attention, MLP, as transformers' layers have), this GPT 7 (one container); the rest of the gap "
            f"grows with the work, as if the hooks' events held the GPU back. ZeRO 2 with overlap_comm on took "
            f"{overlap:.1f} ms more, against {po:.1f} ms priced: under "
            "overlap_comm its "
            "bucket reduction synchronises the device (stage_1_and_2.py `allreduce_and_copy`, "
            "`_allreduce_noncontiguous_bucket_preserving_fp32`): a lead."]


LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
SYNCS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")


def _profiles(data: dict) -> list[str]:
    """The profiled step of each setting (the fourth call): the CUDA runtime's calls per micro-batch and the Python
    function beyond the model's code with the most own time."""
    rows = [r for c in data["calls"] for r in c["rows"] if "profile" in r]
    if not rows:
        return []
    lines = ["One step of 8 micro-batches per setting profiled (the fourth call: width 1024, 2 layers, micro-batch 1; "
             "torch.profiler's CUDA runtime calls per micro-batch, and cProfile's Python function of most own time "
             "beyond the model's code, in the step):", "",
             "| setting | step (ms) | kernel launches | device synchronisations | cudaMemcpyAsync | busiest "
             "Python function beyond the model's code (own ms a step) |", "|---|---:|---:|---:|---:|---|"]
    for r in rows:
        runtime, m = r["profile"]["torch_profiler"]["cuda_runtime"], r["accum"]

        def per(names: tuple[str, ...]) -> float:
            return sum(runtime.get(n, {}).get("calls", 0) for n in names) / m  # noqa: B023 (used at once)

        ours = [f for f in r["profile"]["python"] if f["function"].split(":")[0].endswith(".py")
                and not f["function"].startswith(("small_work_gpu", "deepspeed_engine_gpu", "module.py"))]
        top = max(ours, key=lambda f: f["own_us"], default=None)
        busiest = f"`{top['function']}` ({top['own_us'] / 1e3:.1f})" if top else "-"
        lines.append(f"| {r['setting']} | {r['step_s'] * 1e3:.1f} | {per(LAUNCHES):.0f} | {per(SYNCS):.2f} | "
                     f"{per(('cudaMemcpyAsync',)):.1f} | {busiest} |")
    return lines + ["", "DeepSpeed's engine synchronises the device twice a micro-batch: its throughput timer "
                    "(utils/timer.py `ThroughputTimer.start` in the engine's forward, `stop` in its step) calls "
                    "`synchronize()` whenever `timers.throughput.synchronized` is on, its default (utils/config.py), "
                    "and the engine starts it whenever it was given no training data loader of its own. meshplan "
                    "already prices each layer's passes as max(host, GPU) with no host running ahead across "
                    "micro-batches, so it prices no more for them.", ""]
