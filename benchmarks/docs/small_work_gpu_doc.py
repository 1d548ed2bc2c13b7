"""docs/SMALL_WORK_GPU.md: the small-work training regime measured on a lent GPU against meshplan's estimate
(issue 46, items 3 and 6), rendered from the committed data files without a GPU:

    python benchmarks/docs/small_work_gpu_doc.py            # writes docs/SMALL_WORK_GPU.md

The data: data/measured/gpu/*-small-work.json (the plain-PyTorch GPT) and *-small-work-megatron.json (the same GPT
built by Megatron-Core, with the plain one again in that call), made by benchmarks/measure/small_work_gpu.py; the GPT
and what each timing means are in that script's docstring. meshplan prices the same model (its ModelSpec below) on its
preset of the GPU, one GPU, micro-batch = global batch = b, ZeRO 0, no recompute, under the stack preset nearest to
each code (STACKS), and its CUDA-graphed twin against the graphed measurement. The optimizer is measured apart and
left out on both sides (the measured AdamW runs on bf16 weights without fp32 master copies, which no preset models).
tests/test_docs.py renders it again and compares.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.host import launches
from meshplan.step.units import timed_parts

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "measure")]
import deepspeed_engine_doc  # noqa: E402  (the same folder: sections of the document from other runs)
import mds_gpu_doc  # noqa: E402
from small_work_gpu_pricing import SYSTEM, model_of, per_layer, predicted, stacks  # noqa: E402  (benchmarks/measure/)

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "measured" / "gpu"
DOC = ROOT / "docs" / "SMALL_WORK_GPU.md"


def launches_per_layer(row: dict, stack: Stack, gpu: str, tp: int = 1) -> tuple[float, float]:
    """Kernels meshplan has the host issue per layer, forward and backward (step/host.py's count), at tensor
    parallelism ``tp`` without sequence parallelism (as the measured layers ran)."""
    plan = Plan(tp=tp, micro_batch=row["batch"], global_batch=row["batch"], zero=0, recompute="none",
                sequence_parallel=False)
    parts = timed_parts(model_of(row), load_system(SYSTEM[gpu]).cluster(tp), plan, stack, DEFAULT)
    ops = parts.ops[next(k for k in parts.ops if k not in ("embed", "head", "mtp", "p2p"))]
    fwd = sum(float(launches(op)) for op in ops if op.phase == "fwd")
    return fwd, sum(float(launches(op)) for op in ops) - fwd


def fit(points: dict[int, float]) -> tuple[float, float]:
    """Least squares t = a + s·b over the batches (the issue's form): (a, s)."""
    b = np.array(sorted(points), dtype=float)
    s, a = np.polyfit(b, [points[int(x)] for x in b], 1)
    return float(a), float(s)


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3f}"


def pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def runs() -> list[tuple[str, str, dict]]:
    """(run, code, data) of every committed measurement: one per stack of each file, the run named by its file's
    place in date order (RUNS: ``A`` the first file)."""
    out = []
    for i, path in enumerate(sorted(DATA.glob("*-small-work*.json"))):
        data = json.loads(path.read_text())
        for code, part in (data["stacks"].items() if "stacks" in data else [("pytorch", data)]):
            out.append((chr(ord("A") + i), code, part | {"file": path.name}))
    return out


def passes_section(found: list[tuple[str, str, dict]]) -> list[str]:
    lines = ["## One step's forward and backward passes", "",
             "Measured: the median wall clock of 10 passes (forward, loss, backward; no optimizer), eagerly and "
             "replayed from CUDA graphs (the GPU's time with no host between kernels). meshplan: its step less the "
             "optimizer, under the code's stack preset and its CUDA-graphed twin (`cuda_graphs = true`). Run: the "
             "file's calls (RUNS below).", "",
             "| run | code | width | layers | batch | measured | meshplan | error | graphed | meshplan graphed | "
             "error |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    summary = []
    for name, code, data in found:
        stack = stacks()[code][1]
        errs, gerrs = [], []
        for r in data["rows"]:
            p = predicted(r, stack, data["gpu"])
            err = p / r["eager_s"] - 1
            errs.append(err)
            g = r.get("graphed_s")
            pg = predicted(r, replace(stack, cuda_graphs=True), data["gpu"]) if g else None
            gerr = pg / g - 1 if g and pg else None
            if gerr is not None:
                gerrs.append(gerr)
            lines.append(f"| {name} | {code} | {r['width']} | {r['layers']} | {r['batch']} | {ms(r['eager_s'])} | "
                         f"{ms(p)} | {pct(err)} | {ms(g)} | {ms(pg)} | {pct(gerr) if gerr is not None else '-'} |")
        summary.append(f"- {code}, run {name}: eager median |error| {100 * float(np.median(np.abs(errs))):.1f} %, "
                       f"{sum(e < 0 for e in errs)} of {len(errs)} too fast"
                       + (f"; CUDA-graphed median |error| {100 * float(np.median(np.abs(gerrs))):.1f} %" if gerrs
                          else "; no CUDA-graphed timing (graph capture failed: the file says why)"))
    return lines + ["", "Times in ms.", "", *summary, ""]


def layer_section(found: list[tuple[str, str, dict]]) -> list[str]:
    lines = ["## Per layer and micro-batch: the fixed cost a and the work s", "",
             "Each depth's time less the other's, over the layers between (the embedding and the head cancel), fitted "
             "over the micro-batch b as a + s·b by least squares: the issue's own form (its held-out eager "
             "Megatron-DeepSpeed runs on A100: a = 1.7-2.3 ms at tp 1).", "",
             "| run | code | width | measured a | measured s | meshplan a | meshplan s | graphed a | graphed s | "
             "meshplan graphed a | meshplan graphed s |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, code, data in found:
        stack = stacks()[code][1]
        rows = data["rows"]
        pred: dict = {(r["width"], r["layers"], r["batch"]): predicted(r, stack, data["gpu"]) for r in rows}
        graph_twin = replace(stack, cuda_graphs=True)
        pred_g: dict = {(r["width"], r["layers"], r["batch"]): predicted(r, graph_twin, data["gpu"]) for r in rows}
        measured = per_layer(rows, lambda r: r["eager_s"])
        model = per_layer(rows, lambda r, p=pred: p[(r["width"], r["layers"], r["batch"])])
        graphed = per_layer(rows, lambda r: r.get("graphed_s") or float("nan"))
        model_g = per_layer(rows, lambda r, p=pred_g: p[(r["width"], r["layers"], r["batch"])])
        for w in sorted({w for w, _ in measured}):
            cells = []
            for table in (measured, model, graphed, model_g):
                a, s = fit({b: t for (ww, b), t in table.items() if ww == w})
                cells += ["-", "-"] if np.isnan(a) else [ms(a), ms(s)]
            lines.append(f"| {name} | {code} | {w} | " + " | ".join(cells) + " |")
    return lines + ["", "ms per layer (a) and ms per layer per sequence (s).", ""]


def host_section(found: list[tuple[str, str, dict]]) -> list[str]:
    lines = ["## The host per kernel", "",
             "The forward and the backward pass timed apart at micro-batch 1 (`phases`: host-bound, the GPU busy a "
             "fraction of the time), per layer (the depths' difference), with the CUDA kernels PyTorch's profiler "
             "counted; meshplan's kernels per layer (step/host.py's count for the stack) and the stack's "
             "`host_dispatch` per kernel.", "",
             "| run | code | width | kernels fwd / bwd | meshplan fwd / bwd | host per kernel fwd / bwd (µs) | "
             "GPU busy (ms) | preset host_dispatch (µs) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, code, data in found:
        stack = stacks()[code][1]
        by = {(p["width"], p["layers"], p["batch"]): p for p in data.get("phases", [])}
        for w in sorted({k[0] for k in by}):
            depths = sorted({d for (ww, d, b) in by if ww == w and b == 1})
            if len(depths) < 2:
                continue
            lo, hi = by[(w, depths[0], 1)], by[(w, depths[-1], 1)]
            n = depths[-1] - depths[0]
            kf = (hi["forward"]["kernels"] - lo["forward"]["kernels"]) / n
            kb = (hi["backward"]["kernels"] - lo["backward"]["kernels"]) / n
            tf, tb = (hi["forward_s"] - lo["forward_s"]) / n, (hi["backward_s"] - lo["backward_s"]) / n
            busy = (hi["forward"]["kernel_busy_s"] + hi["backward"]["kernel_busy_s"] - lo["forward"]["kernel_busy_s"]
                    - lo["backward"]["kernel_busy_s"]) / n
            mf, mb = launches_per_layer(hi, stack, data["gpu"])
            lines.append(f"| {name} | {code} | {w} | {kf:.0f} / {kb:.0f} | {mf:.0f} / {mb:.0f} | "
                         f"{tf / kf * 1e6:.1f} / {tb / kb * 1e6:.1f} | {ms(busy)} | {stack.host_dispatch * 1e6:.0f} |")
    return lines + [""]


def floors_section(found: list[tuple[str, str, dict]]) -> list[str]:
    lines = ["## Floors", ""]
    for name, code, data in found:
        if "floors" in data:
            f = data["floors"]
            lines.append(f"- run {name} ({code}): {f['kernels']:,} tiny adds issued eagerly "
                         f"{f['eager_per_kernel_s'] * 1e6:.2f} µs each (the host's), replayed from one CUDA graph "
                         f"{f['graph_per_kernel_s'] * 1e6:.2f} µs each (the GPU's own launch and ramp)" + (
                             f"; calibrate's dispatch fit {data['dispatch']['host_dispatch_s'] * 1e6:.2f} µs per eager "
                             "call" if "dispatch" in data else "") + ".")
        if "host_costs" in data:
            h = data["host_costs"]
            lines.append(f"- run {name} ({code}), check-step's host "
                         "microbenchmarks: " + ", ".join(f"{k} {v * 1e6:.2f} µs" for k, v in h.items()) + ".")
    return lines + [""]


def breakdown_section() -> list[str]:
    """Eager iterations on the H200 by kernel family beside meshplan's ops (benchmarks/measure/breakdown_gpu.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "measure"))
    import breakdown_gpu as bg

    return ["## Where an iteration's time goes", "",
            "Eager training iterations on the H200 (PyTorch 2.11, bf16 weights, fused AdamW), their CUDA kernels "
            "profiled and summed by family, beside meshplan's ops under `--framework pytorch-fsdp` on one GPU "
            "(benchmarks/measure/breakdown_gpu.py: GPT-2 from "
            "data/measured/gpu/2026-11-26-nvidia-h200-unaligned-gemm.json, Hugging Face Llama shapes from "
            "2026-11-26-nvidia-h200-llama-profile.json). Each cell is measured / meshplan; the preset prices SDPA as "
            "cuDNN's kernels, which PyTorch 2.11 ran here, and the last column as FlashAttention-2, which releases "
            "before 2.11 run on Hopper. The iterations agree better than their families: the fitted `gemm` and "
            "`attention` rates (efficiency.py, fitted on whole published steps) carry time the kernels themselves do "
            "not take on one GPU, while the memory-bound rest (norms, activations, rotary embeddings, layout copies, "
            "the loss) takes longer than meshplan's ops; meshplan's optimizer time is mostly the host's "
            "(optimizer/host), which the GPU's kernels do not show.", "",
            *bg.table(), ""]


def render() -> str:
    found = runs()
    first = found[0][2]
    head = [
        "# Small work on a GPU: measured against meshplan", "",
        "Generated by `python benchmarks/docs/small_work_gpu_doc.py` from the committed files of data/measured/gpu/ "
        "(do not edit by hand; tests/test_docs.py renders it again). What was run and how: "
        "benchmarks/measure/small_work_gpu.py's docstring and data/measured/gpu/README.md.", "",
        f"Machine: {first['gpu']}, PyTorch {first['torch']} (CUDA {first.get('cuda', '-')}), host {first['cpu']} with "
        f"{first['cores']} cores, measured {first['date']}. meshplan prices each run on its `{SYSTEM[first['gpu']]}` "
        "preset. Codes and the stack each is priced under:", ""]
    head += [f"- {code}: {text}, host_dispatch {stack.host_dispatch * 1e6:.0f} µs per kernel"
             + (f", a compiled region (a layer) {stack.region_host * 1e3:.2f} ms a pass, its kernels counted as "
                "eager PyTorch's (specs/stack.py's TORCH_COMPILE_REGION_HOST)" if stack.compiled else "")
             for code, (text, stack) in stacks().items()]
    head += ["", "RUNS: " + "; ".join(sorted({f"{run} = {data['file']}" for run, _, data in found})) + "."]
    return "\n".join(head + ["", *passes_section(found), *layer_section(found), *host_section(found),
                             *mds_gpu_doc.accumulate_section(), *deepspeed_engine_doc.section(),
                             *mds_gpu_doc.profile_section(),
                             *floors_section(found), *breakdown_section()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--doc", default=str(DOC))
    args = parser.parse_args(argv)
    Path(args.doc).write_text(render())
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
