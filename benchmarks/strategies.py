"""Compare 1D, 2D SUMMA and 2D context tensor parallelism as in seed 003 (arXiv 2410.00273); write
docs/STRATEGIES.md.

Run: python benchmarks/strategies.py   (a few minutes: one exhaustive search per strategy, system and size)

Strategies (each is the full meshplan search restricted to one layout):
- 1D: Megatron tensor parallelism with what real 1D implementations have: sequence parallelism and TP
  communication overlapped with the GEMMs (``overlap_tp``); no context parallelism.
- 1D as in seed 003: no sequence parallelism and no TP overlap (the reference code's 1D).
- 2D SUMMA: the tp × tp2 grid with panelled, overlapped broadcasts; no extra context parallelism.
- 2D context: 1D tensor parallelism × context parallelism (cp > 1), K/V all-gathered as in seed 003.
Everything else (pipeline, interleaving, micro-batch, ZeRO, recompute, offload, placement on the mesh) is
searched for every strategy alike.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from meshplan.estimate import Estimate
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.units import fmt_bytes

STRATEGIES = {
    "1D": {"layouts": ("1d",), "cp_max": 1, "overlap_tp": True},
    "1D (seed 003)": {"layouts": ("1d",), "cp_max": 1, "sequence_parallel": (False,)},
    "2D SUMMA": {"layouts": ("summa",), "cp_max": 1},
    "2D context": {"layouts": ("1d",), "cp_min": 2, "overlap_tp": True, "cp_comm": "allgather"},
}
SYSTEMS = [(s, d) for s in ("a100", "h200", "b200") for d in (4, 8, 64)]
OUT = Path(__file__).resolve().parents[1] / "docs" / "STRATEGIES.md"


@dataclass
class Row:
    system: str
    domain: int
    gpus: int
    best: dict[str, Estimate | None]

    def winner(self) -> str:
        fair = {k: v for k, v in self.best.items() if v is not None and k != "1D (seed 003)"}
        return min(fair, key=lambda k: fair[k].step_time) if fair else "-"


def run(model_name: str, gpus: int, global_batch: int, system: str, domain: int) -> Row:
    model = load_model(model_name)
    cluster = load_system(system).cluster(gpus, nvlink_domain=domain)
    best = {}
    for name, options in STRATEGIES.items():
        result = search(model, cluster, Space(global_batch=global_batch, **options), top_k=1)
        best[name] = result.plans[0] if result.plans else None
    return Row(system, domain, gpus, best)


def samples(est: Estimate | None) -> str:
    return f"{est.plan.global_batch / est.step_time:,.1f}" if est else "infeasible"


def plan_text(est: Estimate | None) -> str:
    if est is None:
        return "-"
    p = est.plan
    grid = f"{p.tp}x{p.tp2}/nb{p.summa_panels}" if p.tensor_layout == "summa" else f"tp{p.tp}"
    extra = f" cp{p.cp}" if p.cp > 1 else ""
    off = "".join(f" offload-{k}" for k, on in (("opt", p.offload_optimizer), ("act", p.offload_activations)) if on)
    return f"{grid}{extra} pp{p.pp} dp{p.dp} v{p.vpp} mbs{p.micro_batch} z{p.zero} {p.recompute}{off}"


def table(rows: list[Row], by_gpus: bool) -> list[str]:
    names = list(STRATEGIES)
    head = ["system", "NVLink"] + (["GPUs"] if by_gpus else []) + [f"{n} samples/s" for n in names] + [
        "winner", "winner's plan"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r.system, str(r.domain)] + ([str(r.gpus)] if by_gpus else []) + [samples(r.best[n]) for n in names]
        win = r.winner()
        cells += [win, plan_text(r.best.get(win))]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def breakdown(est: Estimate) -> str:
    parts = ", ".join(f"{k} {v / est.step_time:.0%}" for k, v in est.breakdown.items() if v / est.step_time >= 0.01)
    return f"{parts}; memory {fmt_bytes(est.peak_memory)}"


def main() -> None:
    start = time.perf_counter()
    one_t = []
    for system, domain in SYSTEMS:
        one_t.append(run("megatron-1t", 4096, 4096, system, domain))
        print(f"megatron-1t {system} NVLink {domain}: {one_t[-1].winner()}", file=sys.stderr)
    vit = []
    for system, domain in SYSTEMS:
        for gpus in (1024, 4096, 16384):
            vit.append(run("vit-era5", gpus, 4096, system, domain))
            print(f"vit-era5 {system} NVLink {domain} {gpus} GPUs: {vit[-1].winner()}", file=sys.stderr)
    seconds = time.perf_counter() - start
    write(one_t, vit, seconds)
    print(f"wrote {OUT} in {seconds:.0f} s")


def wins(rows: list[Row]) -> dict[str, int]:
    count: dict[str, int] = {}
    for r in rows:
        count[r.winner()] = count.get(r.winner(), 0) + 1
    return count


def margin(rows: list[Row]) -> str:
    """How much faster the fastest 2D strategy is than 1D, per row (negative: slower)."""
    out = []
    for r in rows:
        one = r.best["1D"]
        two = [e for k, e in r.best.items() if k.startswith("2D") and e is not None]
        if one and two:
            out.append(f"{r.system}/{r.domain}" + (f"/{r.gpus}" if r.gpus != 4096 else "") +
                       f" {one.step_time / min(e.step_time for e in two) - 1:+.0%}")
    return ", ".join(out)


def write(one_t: list[Row], vit: list[Row], seconds: float) -> None:
    lines = [
        "# 1D vs 2D tensor parallelism (seed 003)",
        "",
        "Generated by `python benchmarks/strategies.py` (it took "
        f"{seconds:.0f} s for {len(one_t) + len(vit)} x {len(STRATEGIES)} exhaustive searches). Each cell is",
        "the best feasible plan of the full meshplan search restricted to one strategy; throughput is samples",
        "(sequences) per second. Strategies:",
        "",
        "- **1D**: Megatron TP with sequence parallelism and TP communication overlapped with the GEMMs.",
        "- **1D (seed 003)**: the reference code's 1D: no sequence parallelism, no overlap (shown, not ranked).",
        "- **2D SUMMA**: tp x tp2 grid, SUMMA broadcasts in panels overlapped with compute (panel count searched).",
        "- **2D context**: 1D TP x context parallelism (cp > 1), K/V all-gathered as in seed 003.",
        "",
        "All strategies share the rest of the space: pipeline and interleaving, micro-batch, ZeRO 0-3,",
        "recompute, offload and the placement of every axis on the NVLink / network mesh.",
        "",
        "## Megatron-1T (seq 2048, hidden 25,600, 160 heads, 128 layers), 4096 GPUs, global batch 4096",
        "",
        *table(one_t, by_gpus=False),
        "",
        f"Winners: {wins(one_t)}. 2D vs 1D (fastest 2D over 1D step time): {margin(one_t)}.",
        "",
        "Time breakdown of the winner:",
        "",
    ]
    for r in one_t:
        win = r.best[r.winner()]
        if win is not None:
            lines.append(f"- {r.system} NVLink {r.domain}, {r.winner()}: {breakdown(win)}")
    lines += ["", "## vit_era5 (seq 64,800, hidden 12,288, 64 heads, 48 layers, bidirectional), global batch 4096",
              "", *table(vit, by_gpus=True), "",
              f"Winners: {wins(vit)}. 2D vs 1D: {margin(vit)}.", ""]
    lines += [
        "## Compared with the paper",
        "",
        "The paper (arXiv 2410.00273) finds the 2D strategies fastest for GPT-3 1T, by a small margin on newer",
        "GPUs, and 2D parallelism necessary for vit_era5. The tables above are meshplan's answer to the same",
        "question, and it differs where the two models differ:",
        "",
        "- **1D is not handicapped here.** The reference code's 1D has neither sequence parallelism nor overlapped",
        "  TP communication and stores unsharded layer inputs, while its SUMMA path gets both. The `1D (seed 003)`",
        "  column shows that 1D on meshplan's cost model; the `1D` column gives it what Megatron-LM has.",
        "- **Context parallelism and everything around it is searched for all strategies**: interleaved",
        "  pipelines (the reference charges a (p-1)·t bubble with no interleaving), ZeRO stages, selective",
        "  recompute, offload, and which axis lands in the NVLink domain.",
        "- **Long sequences** (vit_era5, 64,800 tokens) make activations, not weights, the memory problem; 1D",
        "  with sequence parallelism and context parallelism shards them as well as a 2D grid does, so 'necessary'",
        "  becomes a question of communication volume, which the tables answer per system.",
        "- **Attention**: meshplan uses flash attention everywhere (non-causal for vit_era5) and the SUMMA layout",
        "  gathers K/V across tp2 like the reference's 2D strategy; the reference computes unfused logits for",
        "  its SUMMA attention.",
        "",
    ]
    OUT.write_text("\n".join(lines))


if __name__ == "__main__":
    main()
