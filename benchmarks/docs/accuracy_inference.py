"""Validate the serving model against the published serving runs and write docs/ACCURACY_INFERENCE.md: every run's
predicted metrics against the measured ones, the median and p90 |error| per source and per GPU generation, on the fit
half, the check half and the held-back source (data/serving/README.md, "The split"). Prints the summary table.
Writes src/meshplan/presets/serving_errors.json too: the figures per GPU architecture for the serving report
(serving_errors.py). Beside them, LLM-Inference-Bench's released half (data/serving/llm_inference_bench_dev.jsonl),
out of source first (inference_bench_dev.py); it stays out of serving_errors.json, whose figures are the published
runs'.

Error is predicted / measured − 1 in the metric the source measured. A run's headline is its throughput (output, total
or per-GPU tokens/s, requests/s; a prefill pool's input tokens/s), unless an offered request rate set it (then its
latencies are what it tells). The constants fitted on the fit half (benchmarks/measure/fit_inference.py) are read from
meshplan/serve/efficiency.py and the engine presets, as every prediction reads them.

Run: python benchmarks/docs/accuracy_inference.py [path/to/published_serving.jsonl] [--out DIR]  (about a minute)
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import load_engine
from meshplan_validation.serving_eval import LATENCY, ServingResult, results

# its section beside it, the measurements it renders
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "measure")]
import serving_errors  # noqa: E402
from inference_bench_dev import markdown_section as bench_section  # noqa: E402
from out_of_source_doc import section  # noqa: E402
from serve_load_published import markdown_section as load_section  # noqa: E402
from small_work import serving_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "serving" / "published_serving.jsonl"
DOCS = ROOT / "docs"
PACKAGED = ROOT / "src" / "meshplan" / "presets" / "serving_errors.json"  # the serving report's trust note reads it
FITTED_ENGINES = ("trtllm", "lmdeploy")
SPLITS = (("fit half", "fit"), ("check half", "check"), ("held-back source", "holdout"))


def pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{100 * x:.1f} %"


def stats(rows: Sequence[ServingResult]) -> tuple[int, float, float]:
    errors = np.array([abs(r.error) for r in rows if r.error is not None])
    if not errors.size:
        return 0, math.nan, math.nan
    return int(errors.size), float(np.median(errors)), float(np.percentile(errors, 90))


def summary_rows(rows: Sequence[ServingResult], key: Callable[[ServingResult], str]) -> list[str]:
    out = []
    for name in sorted({key(r) for r in rows}):
        n, median, p90 = stats([r for r in rows if key(r) == name])
        out.append(f"| {name} | {n} | {pct(median)} | {pct(p90)} |")
    return out


def headline_section(res: list[ServingResult]) -> list[str]:
    every = [r for r in res if r.headline and r.error is not None]
    head = [r for r in every if r.layout_stated]
    unstated = [r for r in every if not r.layout_stated]
    n, median, p90 = stats(head)
    lines = ["## Throughput (each run's headline metric)", "",
             "| runs | evaluated | median \\|error\\| | p90 \\|error\\| |", "|---|---:|---:|---:|",
             f"| all | {n} | {pct(median)} | {pct(p90)} |"]
    for label, split in SPLITS:
        n, median, p90 = stats([r for r in head if r.split == split])
        lines.append(f"| {label} | {n} | {pct(median)} | {pct(p90)} |")
    if unstated:  # evaluated (meshplan validate counts them) but kept apart: a layout the source does not state
        n, median, p90 = stats(unstated)
        lines.append(f"| MoE layout unstated (its EP size; attention DP as stated), not in the rows above | {n} | "
                     f"{pct(median)} | {pct(p90)} |")
    generations = sorted({r.generation for r in head})
    lines += ["", f"{len(generations)} GPU generations: {', '.join(generations)}.", "",
              "Per source (group):", "", "| group | runs | median \\|error\\| | p90 \\|error\\| |",
              "|---|---:|---:|---:|", *summary_rows(head, lambda r: r.group), "",
              "Per GPU generation:", "", "| generation | runs | median \\|error\\| | p90 \\|error\\| |",
              "|---|---:|---:|---:|", *summary_rows(head, lambda r: r.generation), "",
              "Per source and GPU generation:", "",
              "| group / generation | runs | median \\|error\\| | p90 \\|error\\| |",
              "|---|---:|---:|---:|", *summary_rows(head, lambda r: f"{r.group} / {r.generation}")]
    return lines


def latency_section(res: list[ServingResult]) -> list[str]:
    rows = [r for r in res if r.metric in LATENCY and r.error is not None]
    return ["", "## Latencies", "",
            "Time to first token (mean), inter-token latency (TensorRT-LLM: mean; LMDeploy: the median of each token's "
            "latency) and end-to-end latency, where the source measured them.", "",
            "| group / metric | runs | median \\|error\\| | p90 \\|error\\| |", "|---|---:|---:|---:|",
            *summary_rows(rows, lambda r: f"{r.group} / {r.metric}")]


def constants_section() -> list[str]:
    lines = ["", "## Fitted constants", "",
             "Fitted once on the fit half by `python benchmarks/measure/fit_inference.py` (every source group weighted "
             "the same) and read from the code; nothing is tuned per run, per source or per GPU:", "",
             f"- `kv_read` = {SERVE_DEFAULT.kv_read:g}: the decode attention kernels' share of the streaming rate "
             "(meshplan/serve/efficiency.py);",
             f"- `experts` = {SERVE_DEFAULT.experts:g}: the MoE path's rate against dense GEMMs and uniform "
             "collectives (same file), held at its first fit (`fit_inference.py --hold experts`): fitted again it "
             "runs to 1.0, pulled by the fit half's single-run MoE groups, and the check half's objective rises by "
             "two thirds (docs/SERVING.md);"]
    for name in FITTED_ENGINES:
        e = load_engine(name)
        lines.append(f"- `iteration_overhead` of the {name} engine = {1e3 * e.iteration_overhead:.3g} ms "
                     f"(presets/engines/{name}.toml).")
    v0, rocm = load_engine("vllm-v0"), load_engine("vllm-v0.6-rocm")
    lines += ["", "Fitted by `python benchmarks/measure/fit_llm_inference_bench.py` on LLM-Inference-Bench's released "
              "half (not on the published runs above; each read out of source in the section on it):", "",
              f"- `iteration_latency` of vLLM V0 = {1e3 * v0.iteration_latency:.3g} ms "
              "(presets/engines/vllm-v0*.toml): the engine's time per iteration beyond its CPU-measured host loop, "
              "on the H100 runs of Llama 2 7B at tp 1;",
              f"- `skinny_gemm_rate` = {rocm.skinny_gemm_rate:.3g} and `kernel_gap` = {1e6 * rocm.kernel_gap:.3g} us "
              "of vLLM's ROCm build of 2024 (presets/engines/vllm-v0.6-rocm.toml, vllm-v0.5-rocm.toml): its untuned "
              "GEMMs' rate at decode's rows, the GPU's idle time per kernel, on the MI300X runs."]
    per_request = 1e6 * load_engine("trtllm-pytorch").sequence_overhead
    return lines + ["", f"Not fitted: TensorRT-LLM's PyTorch backend spends {per_request:.3g} us of "
                    "host time per request in flight per iteration on an x86 host (its 45.11 ms per iteration at 1,536 "
                    "requests per rank on GB200, TensorRT-LLM PR #10273, over Grace's 2.75x Python time), behind its "
                    "overlap scheduler; vLLM's host loops are measured in their own code (benchmarks/measure/"
                    "vllm_v0_host_cpu.py, vllm_v1_host_cpu.py); SGLang's keeps a host time of 0: no fit run "
                    "constrains it."]


def skipped_section(res: list[ServingResult]) -> list[str]:
    counts = Counter(r.skipped for r in res if r.skipped)
    lines = ["", "## Runs not evaluated", "", "| reason | runs |", "|---|---:|"]
    return lines + [f"| {reason} | {n} |" for reason, n in counts.most_common()]


def every_run(res: list[ServingResult]) -> list[str]:
    lines = ["", "## Every run", "", "Headline metrics are marked **bold**. Batch: the sequences in flight meshplan "
             "priced (stated, the largest the engine admits, or the one that serves the offered rate).", "",
             "| id | split | GPU | mode | batch | metric | measured | predicted | error |",
             "|---|---|---|---|---:|---|---:|---:|---:|"]
    for r in res:
        if r.skipped:
            lines.append(f"| {r.id} | {r.split} | {r.gpu} | skipped: {r.skipped} | | | | | |")
            continue
        metric = f"**{r.metric}**" if r.headline else r.metric
        predicted = "-" if r.predicted is None else f"{r.predicted:,.4g}"
        error = "-" if r.error is None else f"{100 * r.error:+.1f} %"
        lines.append(f"| {r.id} | {r.split} | {r.gpu} | {r.mode} | {r.batch:,.0f} | {metric} | {r.measured:,.4g} | "
                     f"{predicted} | {error} |")
    return lines


def document(res: list[ServingResult], path: Path, records: list[dict], bench: list[str]) -> str:
    intro = ["# Accuracy of the serving model", "",
             "Generated by `python benchmarks/docs/accuracy_inference.py` from "
             f"`{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}` (data/serving/README.md describes "
             "the runs, their sources and the split); tests/test_docs.py checks that it is current. Error = "
             "predicted / measured − 1 in the metric the source measured. What the model is: docs/SERVING.md.", ""]
    return "\n".join(intro + section("serving") + ["## In sample: the published serving runs", ""]
                     + headline_section(res) + bench + latency_section(res) + load_section()
                     + constants_section()
                     + skipped_section(res) + every_run(res) + serving_section(records)) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    out = DOCS
    if "--out" in args:
        i = args.index("--out")
        out = Path(args[i + 1])
        del args[i:i + 2]
    path = Path(args[0]) if args else DATA
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    res = results(records)
    bench = bench_section()  # the released half priced once: the document's section and the printed summary
    text = document(res, path, records, bench)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ACCURACY_INFERENCE.md").write_text(text)
    serving_errors.write(res, PACKAGED if out == DOCS else out / PACKAGED.name)
    print("\n".join(headline_section(res)[:8]))
    print("\n".join(bench[bench.index("Out of source:"):][:5]))
    print("\n".join(latency_section(res)[5:]))


if __name__ == "__main__":
    main()
