"""Where Megatron-Bridge's MoE runs on x86 8-GPU nodes (DGX B200, H100) read too fast against GB200 (issue 79).

Reads docs/out_of_source.json (each run's out-of-source predicted metric) beside data/validation/published_runs.jsonl
(the record's layout) and prints, for the Megatron-Bridge MoE runs measured in tokens/s per GPU:
- the step measured and the step priced out of source (tokens per step / (tokens/s per GPU x GPUs));
- the gap (measured - priced) per local expert, MoE layer on the rank and micro-batch (``per_expert_gap``): the time a
  mechanism priced per expert GEMM and micro-batch would have to supply; beside it the gap per token through the rank
  and MoE layer (a mechanism priced per token, as GPT-OSS-120B's own gap is: notes/reports/gptoss2.md);
- the same-GPU contrasts that separate the candidates: one model, one GPU, one ep, two micro-batch sizes (Qwen3-30B-A3B
  on B200 at mb 1 and 4) and dropless against 25.09's token-drop recipe (drop-and-pad: no tokens-per-expert sync,
  Megatron-Core token_dispatcher.py preprocess @ core_v0.16.1; whole layers CUDA-graphed by that release's perf_matrix
  cuda_graphs: true, Megatron-Bridge 684a686 scripts/performance/configs/qwen3/qwen3_30b_a3b_llm_pretrain.yaml).

    cd benchmarks/measure && PYTHONPATH=../../src python bridge_expert_gap.py --oos ../../docs/out_of_source.json
(or the file a fresh ``benchmarks/docs/out_of_source.py --out DIR`` wrote)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def step_seconds(tokens_per_step: float, tokens_per_s_per_gpu: float, gpus: int) -> float:
    """A step's seconds from a throughput in tokens/s per GPU."""
    return tokens_per_step / (tokens_per_s_per_gpu * gpus)


def per_expert_gap(measured: float, priced: float, local_experts: float, moe_layers: float,
                   microbatches: float) -> float:
    """Seconds of (measured - priced) step time per local expert, per MoE layer on the rank and per micro-batch."""
    return (measured - priced) / (local_experts * moe_layers * microbatches)


def layout(record: dict[str, Any]) -> dict[str, Any]:
    """The record as meshplan maps it: GPUs, micro-batches per rank, local experts, MoE layers per pipeline rank."""
    from meshplan_validation.case import map_run  # noqa: PLC0415  (the validation layer: only this script needs it)

    case = map_run(record)
    plan, model = case.plan, case.model
    return {"gpus": case.cluster.num_gpus, "tokens": plan.global_batch * model.seq_length, "mb": plan.micro_batch,
            "m": plan.global_batch / (plan.dp * plan.micro_batch), "local": model.num_experts / plan.ep,
            "moe_layers": model.num_moe_layers / plan.pp, "ep": plan.ep,
            "rank_tokens": plan.global_batch * model.seq_length / plan.dp}


def rows(oos: Path) -> list[dict[str, Any]]:
    """One row per Megatron-Bridge MoE run measured in tokens/s per GPU with an out-of-source prediction."""
    runs = {r["id"]: r for r in json.loads(oos.read_text())["runs"]}
    out = []
    for line in (ROOT / "data/validation/published_runs.jsonl").read_text().splitlines():
        record = json.loads(line)
        run = runs.get(record["id"])
        if not record["id"].startswith("mbridge_") or record["model"].get("arch") != "moe" or run is None \
                or run.get("oos_predicted") is None or run.get("metric") != "tokens_per_s_per_gpu":
            continue
        lay = layout(record)
        measured = step_seconds(lay["tokens"], run["measured"], lay["gpus"])
        priced = step_seconds(lay["tokens"], run["oos_predicted"], lay["gpus"])
        out.append({"id": record["id"], "model": record["model"]["name"], "gpu": record["hardware"]["gpu"],
                    "error": run["oos_error"], "measured": measured, "priced": priced,
                    "gap_us": 1e6 * per_expert_gap(measured, priced, lay["local"], lay["moe_layers"], lay["m"]),
                    "token_ns": 1e9 * (measured - priced) / (lay["rank_tokens"] * lay["moe_layers"]),
                    **lay})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--oos", type=Path, required=True,
                        help="an out_of_source.json (benchmarks/docs/out_of_source.py)")
    table = rows(parser.parse_args().oos)
    print(f"{'run':<62} {'mb':>2} {'ep':>3} {'E/ep':>4} {'L/pp':>5} {'m':>5} {'meas s':>7} {'priced':>7} "
          f"{'oos':>7} {'gap us/(E*L*m)':>14} {'ns/(token*L)':>12}")
    for r in sorted(table, key=lambda r: (r["model"], r["gpu"], r["id"])):
        print(f"{r['id'][7:69]:<62} {r['mb']:>2} {r['ep']:>3} {r['local']:>4.0f} {r['moe_layers']:>5.1f} "
              f"{r['m']:>5.0f} {r['measured']:>7.2f} {r['priced']:>7.2f} {100 * r['error']:>+6.1f}% "
              f"{r['gap_us']:>14.0f} {r['token_ns']:>12.0f}")
    groups: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
    for r in table:
        groups[(r["model"], r["gpu"])].append((r["gap_us"], r["token_ns"]))
    print("\nmedian gap per local expert, MoE layer and micro-batch (us) | per token and MoE layer on the rank (ns):")
    for (model, gpu), gaps in sorted(groups.items()):
        per_expert, per_token = (statistics.median(g[i] for g in gaps) for i in (0, 1))
        print(f"  {model:<18} {gpu:<6} n={len(gaps):>2}  {per_expert:>6.0f} | {per_token:>6.0f}")


if __name__ == "__main__":
    main()
