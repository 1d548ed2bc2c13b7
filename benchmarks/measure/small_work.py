"""The small-work regime, reported apart from the accuracy summaries (issue 46, item 6): small models, small batches,
single nodes and batch-1 decode, where fixed costs (kernel launch, host dispatch, collective latency, engine overhead)
are a large share of a step.

Training (docs/ACCURACY.md, section "Small-work regime"): the dev set of data/validation/small_work.jsonl, and the
published runs of data/validation/published_runs.jsonl that ran on one node (num_gpus ≤ 8), which the summaries above
that section already count (their scopes do not change). Serving (docs/ACCURACY_INFERENCE.md, same section name): the
dev set of data/serving/small_work.jsonl and the published serving runs held at batch 1.

Each dev-set record carries its side of the split (``split``: fit / check; data/validation/README.md and
data/serving/README.md give the rule): physical constants may be fitted on the fit side, per stack; the check side
judges them. benchmarks/docs/accuracy.py and benchmarks/docs/accuracy_inference.py call ``training_section`` and
``serving_section``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshplan_validation.records import read_runs
from meshplan_validation.result import RunResult
from meshplan_validation.selection import in_fit_set
from meshplan_validation.serving_eval import ServingResult
from meshplan_validation.serving_eval import results as serving_results
from meshplan_validation.validate import run_validation
from small_work_common import STATS_HEAD, num, pct, stats, stats_row
from small_work_sweeps import sweep_section
from small_work_vtrain import vtrain_section  # vTrain's released runs (issue 79), apart: no fit on them

ROOT = Path(__file__).resolve().parents[2]
TRAINING = ROOT / "data" / "validation" / "small_work.jsonl"
SERVING = ROOT / "data" / "serving" / "small_work.jsonl"
ONE_NODE = 8  # GPUs: a published training run on at most this many GPUs belongs to the regime


# ---- training -------------------------------------------------------------------------------------------------
def one_node(records: Sequence[dict[str, Any]]) -> set[str]:
    """Ids of the published runs on one node (num_gpus ≤ 8)."""
    return {str(r["id"]) for r in records
            if isinstance((r.get("hardware") or {}).get("num_gpus"), int) and r["hardware"]["num_gpus"] <= ONE_NODE}


def training_results(path: Path = TRAINING) -> tuple[list[dict[str, Any]], list[RunResult]]:
    records = read_runs(path)
    return records, run_validation(records)


def _pairs(results: Sequence[RunResult]) -> list[tuple[str, float]]:
    return [(r.metric, r.error) for r in results if not r.skipped and r.error is not None]


def training_summary(dev: Sequence[RunResult], published: Sequence[RunResult]) -> dict[str, Any]:
    """The regime's figures (accuracy_summary.json's ``small_work``)."""
    return {"dev_set": stats(_pairs(dev)), "dev_set_fit": stats(_pairs([r for r in dev if in_fit_set(r.id)])),
            "dev_set_check": stats(_pairs([r for r in dev if not in_fit_set(r.id)])),
            "published_one_node": stats(_pairs(published)), "all": stats(_pairs([*dev, *published])),
            "skipped": sum(1 for r in [*dev, *published] if r.skipped)}


def _training_rows(results: Sequence[RunResult], by_id: dict[str, dict[str, Any]]) -> list[str]:
    rows = ["| run | stack | GPUs | half | measured | meshplan | metric | error |",
            "|---|---|---:|---|---:|---:|---|---:|"]
    for r in sorted(results, key=lambda r: r.id):
        rec = by_id[r.id]
        stack = str(rec.get("framework") or "")[:48]
        gpus = (rec.get("hardware") or {}).get("num_gpus")
        half = "fit" if in_fit_set(r.id) else "check"
        if r.skipped:
            rows.append(f"| {r.id} | {stack} | {gpus} | {half} | | | skipped | {r.skipped[:80]} |")
            continue
        rows.append(f"| {r.id} | {stack} | {gpus} | {half} | {num(r.measured)} | {num(r.predicted)} | {r.metric} | "
                    f"{pct(r.error, True)} |")
    return rows


def training_section(results: Sequence[RunResult], records: Sequence[dict[str, Any]],
                     vtrain_oos: Sequence[tuple[str, float]] = ()) -> tuple[list[str], dict[str, Any]]:
    """The ACCURACY.md section and the summary's ``small_work`` entry; ``results`` / ``records`` are the published
    runs' (the one-node ones are picked from them); ``vtrain_oos`` vTrain's (metric, error) out of source."""
    dev_records, dev = training_results()
    ids = one_node(records)
    published = [r for r in results if r.id in ids]
    summary = training_summary(dev, published)
    by_id = {str(r["id"]): r for r in [*records, *dev_records]}
    out = ["", "## Small-work regime", "",
           "Small models, small batches, single nodes: where a step is many small kernels and fixed costs (launch, "
           "host dispatch, collective latency) weigh most (issue 46). Reported apart; the summaries above keep their "
           f"runs. Two sets: the dev set of `data/validation/small_work.jsonl` ({len(dev_records)} runs from sources "
           "the published runs do not hold; data/validation/README.md, \"Small work\", says where each comes from and "
           "which were left out), and the published runs above that ran on one node (≤ 8 GPUs), counted again here. "
           "Half: the run's side of the fixed split (`selection.in_fit_set`; the dev-set records carry it as `split`): "
           "physical constants may be fitted per stack on the fit half only. Too fast: the share of runs predicted "
           "faster than measured (a shorter step, a higher throughput).", "", *STATS_HEAD,
           stats_row("dev set", summary["dev_set"]), stats_row("dev set, fit half", summary["dev_set_fit"]),
           stats_row("dev set, check half", summary["dev_set_check"]),
           stats_row("published runs on one node", summary["published_one_node"]),
           stats_row("all of the regime", summary["all"]), "", "### The dev set", "",
           *_training_rows(dev, by_id), "", "### Published runs on one node", "",
           *_training_rows(published, by_id)]
    sweep_lines, summary["sweeps"] = sweep_section([*dev_records, *records], [*dev, *published])
    vtrain_lines, summary["vtrain"] = vtrain_section(oos=vtrain_oos)
    return [*out, *sweep_lines, *vtrain_lines], summary


# ---- serving --------------------------------------------------------------------------------------------------
def batch_one(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The published serving runs held at a stated batch of 1."""
    return [r for r in records if (r.get("workload") or {}).get("batch_size") == 1]


def _serving_pairs(rows: Sequence[ServingResult]) -> list[tuple[str, float]]:
    return [(r.metric, r.error) for r in rows if r.error is not None]


def _serving_rows(rows: Sequence[ServingResult]) -> list[str]:
    lines = ["| id | split | GPU | mode | metric | measured | predicted | error |",
             "|---|---|---|---|---|---:|---:|---:|"]
    for r in rows:
        if r.skipped:
            lines.append(f"| {r.id} | {r.split} | {r.gpu} | skipped: {r.skipped} | | | | |")
            continue
        predicted = "-" if r.predicted is None else f"{r.predicted:,.4g}"
        error = "-" if r.error is None else f"{100 * r.error:+.1f} %"
        lines.append(f"| {r.id} | {r.split} | {r.gpu} | {r.mode} | {r.metric} | {r.measured:,.4g} | {predicted} | "
                     f"{error} |")
    return lines


def serving_section(records: Sequence[dict[str, Any]], path: Path = SERVING) -> list[str]:
    """The ACCURACY_INFERENCE.md section: every metric of the dev set's runs and of the published batch-1 runs."""
    dev_records = read_runs(path)
    dev = serving_results(list(dev_records))
    published = serving_results(batch_one(records))
    groups = sorted({r.group for r in dev})
    lines = ["", "## Small-work regime", "",
             "Batch-1 decode and small prefills, where engine overhead, kernel launches and the TP all-reduce's "
             "latency weigh most (issue 46). Reported apart: the summaries above keep their runs. Two sets: the dev "
             f"set of `data/serving/small_work.jsonl` ({len(dev_records)} runs; data/serving/README.md, "
             "\"Small work\"), "
             "and the published runs above held at batch 1, counted again here. Every measured metric counts (a "
             "batch-1 run's tokens/s is one user's). Split: the dev set's fit / check rule of data/serving/README.md; "
             "physical constants may be fitted per stack on the fit side only. Too fast: predicted faster than "
             "measured (a higher throughput, a shorter latency).", "", *STATS_HEAD,
             stats_row("dev set", stats(_serving_pairs(dev))),
             stats_row("dev set, fit", stats(_serving_pairs([r for r in dev if r.split == "fit"]))),
             stats_row("dev set, check", stats(_serving_pairs([r for r in dev if r.split == "check"])))]
    lines += [stats_row(f"dev set, {g}", stats(_serving_pairs([r for r in dev if r.group == g]))) for g in groups]
    lines += [stats_row("published runs at batch 1", stats(_serving_pairs(published))),
              stats_row("all of the regime", stats(_serving_pairs([*dev, *published]))), "", "### The dev set", "",
              *_serving_rows(dev), "", "### Published runs at batch 1", "", *_serving_rows(published)]
    return lines


# ---- fixed costs per layer (issue 46) ---------------------------------------------------------------------------
def gpt_1_3b() -> Any:
    """A 1.3 B GPT as Megatron-DeepSpeed's examples configure it (24 layers, hidden 2048, 16 heads, FFN 4h, GPT-2
    vocabulary, sequence 1024; LayerNorm, biases, dropout, learned positions)."""
    from meshplan.specs.model import ModelSpec
    return ModelSpec(name="gpt-1.3b", num_layers=24, hidden_size=2048, num_heads=16, ffn_hidden_size=8192,
                     vocab_size=50257, seq_length=1024, mlp="gelu", norm="layernorm", position_embedding="learned",
                     max_position_embeddings=1024, tied_embeddings=True, qkv_bias=True, linear_bias=True, dropout=True)


def megatron_deepspeed() -> Any:
    """Megatron-DeepSpeed's stack preset (presets/stacks/megatron-deepspeed.toml), the one validation prices its
    records with (meshplan_validation.sources): Megatron-LM's module code with its fused softmax, LayerNorm and
    TorchScript fusions, each kernel issued from eager PyTorch (cost/eager.py's "jit" count), 50 us of host time a
    kernel, unfused softmax attention, no overlap."""
    from meshplan.specs.stack import load_stack
    return load_stack("megatron-deepspeed")


def layer_times(tp: int, micro_batch: int) -> tuple[float, float]:
    """Seconds per layer per micro-batch of the 1.3 B GPT on one 8 x A100 node (dp = 8 / tp, no sequence
    parallelism, no recompute) and the GPU's wait on the host in them."""
    from meshplan.specs.hardware import load_system
    from meshplan.specs.plan import Plan
    from meshplan.step.units import unit_costs
    plan = Plan(tp=tp, dp=8 // tp, micro_batch=micro_batch, global_batch=micro_batch * (8 // tp),
                sequence_parallel=False, recompute="none")
    layer = unit_costs(gpt_1_3b(), load_system("a100").cluster(8), plan, megatron_deepspeed()).layer
    return float(layer.total), float(layer.host)


def fixed_costs(batches: Sequence[int] = (1, 2, 4, 8)) -> list[dict[str, float]]:
    """Per tp: the time per layer per micro-batch at each micro-batch, and the issue's fit a + b·batch over them (a:
    the fixed ms per layer per micro-batch, b: per sample)."""
    rows = []
    for tp in (1, 2, 4, 8):
        times = [layer_times(tp, b) for b in batches]
        slope, fixed = np.polyfit(np.array(batches, dtype=float), np.array([t for t, _ in times]), 1)
        rows.append({"tp": tp, **{f"mb{b}": t for b, (t, _) in zip(batches, times, strict=True)},
                     **{f"host_mb{b}": h for b, (_, h) in zip(batches, times, strict=True)},
                     "fixed": float(fixed), "per_sample": float(slope)})
    return rows


def main() -> None:
    print("1.3 B GPT (24 x 2048, 16 heads, seq 1024) on 8 x A100, eager Megatron-DeepSpeed: ms per layer per "
          "micro-batch (of it the GPU's wait on the host), and the fit a + b*batch over micro-batches 1-8")
    print("tp | mb 1 | mb 2 | mb 4 | mb 8 | a (fixed) | b (per sample)")
    for r in fixed_costs():
        cells = " | ".join(f"{1e3 * r[f'mb{b}']:.3f} ({1e3 * r[f'host_mb{b}']:.3f})" for b in (1, 2, 4, 8))
        print(f"{r['tp']} | {cells} | {1e3 * r['fixed']:.3f} | {1e3 * r['per_sample']:.3f}")


if __name__ == "__main__":
    main()
