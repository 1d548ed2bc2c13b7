"""Compare 1D, 2D SUMMA and 2D context tensor parallelism as in seed 003 (arXiv 2410.00273), and seed 001's 2D
weight-stationary tp_in x tp_out layout beside them; write
docs/STRATEGIES.md, its comparison with the paper's claims included: every figure in it is computed here.

Run: python benchmarks/docs/strategies.py [--out DIR]   (about 5 s on 2 cores: one search per strategy, system and size;
     --out DIR writes DIR/STRATEGIES.md instead: tests/test_docs.py compares a fresh copy with the committed one)

Strategies (each is the full meshplan search restricted to one layout):
- 1D: Megatron tensor parallelism with what real 1D implementations have: sequence parallelism and TP
  communication overlapped with the GEMMs (the stack's ``overlap_tp``); no context parallelism.
- 1D as in seed 003: no sequence parallelism and no TP overlap (the reference code's 1D).
- 2D SUMMA: the tp × tp2 grid with panelled, overlapped broadcasts; no extra context parallelism.
- 2D context: 1D tensor parallelism × context parallelism (cp > 1), K/V all-gathered as in seed 003.
- 2D tp2d: seed 001's weight-stationary tp_in × tp_out grid (cost/tp2d.py); not one of the paper's strategies, so
  shown beside them and compared apart (the paper's claims are tested on its own three).
Everything else (pipeline, interleaving, micro-batch, ZeRO, recompute, offload, placement on the mesh) is
searched for every strategy alike.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from meshplan.estimate import Estimate
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.stack import Stack
from meshplan.units import fmt_bytes

STRATEGIES = {  # each strategy's search space; "stack" holds how the software runs it (meshplan.specs.stack.Stack)
    "1D": {"layouts": ("1d",), "cp_max": 1, "stack": Stack(overlap_tp=True)},
    "1D (seed 003)": {"layouts": ("1d",), "cp_max": 1, "sequence_parallel": (False,)},
    "2D SUMMA": {"layouts": ("summa",), "cp_max": 1},
    "2D context": {"layouts": ("1d",), "cp_min": 2, "stack": Stack(overlap_tp=True, cp_comm="allgather")},
    "2D tp2d": {"layouts": ("tp2d",), "cp_max": 1},
}
PAPER_2D = ("2D SUMMA", "2D context")  # the paper's 2D strategies, which its claims (paper_section) are about
TP2D = "2D tp2d"
# what a strategy's space leaves to Space: every plan meshplan models (the generic stack: 2D layouts, context
# parallelism by all-gather), with no memory headroom, the fastest first (not Space's defaults, the command line's)
EVERY_PLAN = {"stack": Stack(), "headroom": 0.0, "prefer_simple": False}
SEED_1D = "1D (seed 003)"  # shown, not ranked
SYSTEMS = [(s, d) for s in ("a100", "h200", "b200") for d in (4, 8, 64)]
GENERATIONS = ("a100", "h200", "b200")  # oldest first
ONE_T = ("megatron-1t", (4096,), 4096)  # model, GPU counts, global batch
VIT = ("vit-era5", (1024, 4096, 16384), 4096)
DOCS = Path(__file__).resolve().parents[2] / "docs"
SMALL = 0.05  # a throughput margin below this reads as "not a large margin"


@dataclass
class Row:
    system: str
    domain: int
    gpus: int
    best: dict[str, Estimate | None]

    def winner(self, one_d: str = "1D") -> str:
        """The fastest strategy, with ``one_d`` ("1D" or the seed's 1D) standing for 1D."""
        fair = {k: v for k, v in self.best.items() if v is not None and k in (one_d, *PAPER_2D)}
        return min(fair, key=lambda k: fair[k].step_time) if fair else "-"

    def label(self, by_gpus: bool) -> str:
        return f"{self.system}/{self.domain}" + (f"/{self.gpus}" if by_gpus else "")

    def two_d(self) -> Estimate | None:
        """The fastest of the paper's 2D strategies' plans."""
        two = [e for k, e in self.best.items() if k in PAPER_2D and e is not None]
        return min(two, key=lambda e: e.step_time) if two else None

    def gain(self, one_d: str = "1D") -> float | None:
        """Throughput of the fastest 2D strategy over ``one_d``'s, minus 1 (negative: 1D is faster)."""
        one, two = self.best[one_d], self.two_d()
        return one.step_time / two.step_time - 1 if one and two else None

    def shortfall(self, name: str) -> float | None:
        """How much lower ``name``'s throughput is than the fastest strategy's (0: it is the fastest)."""
        est, fastest = self.best[name], self.best.get(self.winner())
        return 1 - fastest.step_time / est.step_time if est and fastest else None


def run(model_name: str, gpus: int, global_batch: int, system: str, domain: int) -> Row:
    model = load_model(model_name)
    cluster = load_system(system).cluster(gpus, nvlink_domain=domain)
    best = {}
    for name, options in STRATEGIES.items():  # serial (workers=1): main's pool runs one of these per core
        space = Space(global_batch=global_batch, **{**EVERY_PLAN, **options})
        result = search(model, cluster, space, top_k=1, workers=1)
        best[name] = result.plans[0] if result.plans else None
    return Row(system, domain, gpus, best)


def samples(est: Estimate | None) -> str:
    return f"{est.plan.global_batch / est.step_time:,.1f}" if est else "infeasible"


def plan_text(est: Estimate | None) -> str:
    if est is None:
        return "-"
    p = est.plan
    grid = {"summa": f"{p.tp}x{p.tp2}/nb{p.summa_panels}", "tp2d": f"tp2d {p.tp}x{p.tp2}"}.get(p.tensor_layout,
                                                                                          f"tp{p.tp}")
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


def wins(rows: list[Row], one_d: str = "1D") -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(r.winner(one_d), []).append(r)
    return out


def win_text(rows: list[Row], by_gpus: bool, one_d: str = "1D") -> str:
    return "; ".join(f"{k} {len(v)} ({', '.join(r.label(by_gpus) for r in v)})" for k, v in wins(rows, one_d).items())


def margin(rows: list[Row], by_gpus: bool) -> str:
    """The fastest 2D strategy's throughput over 1D's, per row (negative: 1D is faster)."""
    return ", ".join(f"{r.label(by_gpus)} {r.gain():+.1%}" for r in rows if r.gain() is not None)


def span(values: list[float]) -> str:
    return f"{min(values):+.1%} to {max(values):+.1%}" if values else "-"


def per_generation(rows: list[Row], one_d: str) -> dict[str, float]:
    """Per GPU generation, the best case for 2D: the largest gain over ``one_d`` among its rows."""
    out = {}
    for gen in GENERATIONS:
        gains = [r.gain(one_d) for r in rows if r.system == gen and r.gain(one_d) is not None]
        if gains:
            out[gen] = max(gains)
    return out


def generation_text(best: dict[str, float]) -> str:
    trend = "" if len(best) < 2 else " (smaller on the newest GPUs)" if best[GENERATIONS[-1]] < best[
        GENERATIONS[0]] else " (not smaller on the newest GPUs)"
    return ", ".join(f"{g} {v:+.1%}" for g, v in best.items()) + trend


def tp2d_text(rows: list[Row], by_gpus: bool) -> str:
    """Seed 001's tp2d against 1D and SUMMA, per row: its throughput over theirs, minus 1, and its plan."""
    def over(r: Row, name: str) -> str:
        one, two = r.best[name], r.best[TP2D]
        return f"{one.step_time / two.step_time - 1:+.1%}" if one and two else "-"
    beats = [r for r in rows if r.best[TP2D] and all(r.best[k] is None or r.best[k].step_time > r.best[TP2D].step_time
                                                     for k in ("1D", "2D SUMMA", "2D context"))]
    lines = [f"Seed 001's tp2d fastest of all four in {len(beats)} of {len(rows)} rows"
             + (f" ({', '.join(r.label(by_gpus) for r in beats)})" if beats else "") + "; its throughput over 1D's "
             "and SUMMA's, and its plan:", ""]
    lines += [f"- {r.label(by_gpus)}: vs 1D {over(r, '1D')}, vs SUMMA {over(r, '2D SUMMA')}; {plan_text(r.best[TP2D])}"
              for r in rows]
    return "\n".join(lines)


def model_title(name: str, gpus: tuple[int, ...], global_batch: int) -> str:
    m = load_model(name)
    where = f", {gpus[0]} GPUs" if len(gpus) == 1 else ""
    return (f"## {name} (seq {m.seq_length:,}, hidden {m.hidden_size:,}, {m.num_heads} heads, {m.num_layers} layers"
            f"{'' if m.causal else ', bidirectional'}){where}, global batch {global_batch}")


def verdict(share: int, total: int) -> str:
    return "Holds" if share == total else "Mostly holds" if 2 * share > total else "Does not hold"


def counts(rows: list[Row], one_d: str = "1D") -> str:
    return ", ".join(f"{k} {len(v)}" for k, v in wins(rows, one_d).items())


def claim_1t(rows: list[Row]) -> list[str]:
    """The paper: for GPT-3 1T the 2D strategies are fastest, though not by a large margin on newer GPUs."""
    n, two = len(rows), [r for r in rows if r.winner().startswith("2D")]
    gains = [g for r in rows if (g := r.gain()) is not None]
    seed = [g for r in rows if (g := r.gain(SEED_1D)) is not None]
    seed_two = sum(1 for r in rows if r.winner(SEED_1D).startswith("2D"))
    close = max(abs(g) for g in gains) < SMALL if gains else False
    return [
        f"1. *GPT-3 1T ({ONE_T[0]} here): the 2D strategies are the fastest, though not by a large margin on newer "
        f"GPUs.* **{verdict(len(two), n)} here**: a 2D strategy is the fastest on {len(two)} of {n} systems "
        f"({counts(rows)}). The fastest 2D strategy's throughput differs from 1D's by {span(gains)} (negative: "
        f"1D is faster); the best case for 2D per GPU generation is {generation_text(per_generation(rows, '1D'))}. "
        + (f"The margin is below {SMALL:.0%} either way on every system, so the strategies are close, as the "
           "paper's second half says." if close else
           f"The margin reaches {max(abs(g) for g in gains):.1%}, beyond {SMALL:.0%}, this document's reading "
           "of a small margin." if gains else ""),
        f"   Against the reference code's 1D (the `{SEED_1D}` column) instead, 2D is the fastest on {seed_two} of "
        f"{n} systems, by {span(seed)}; per generation at best {generation_text(per_generation(rows, SEED_1D))}. "
        + ("The paper's ranking is what its own 1D gives, not what 1D with sequence parallelism and overlapped TP "
           "communication gives." if seed_two > len(two) else "The reference's 1D does not change the ranking."),
    ]


def claim_vit(rows: list[Row]) -> list[str]:
    """The paper: for vit_era5, 2D parallelism is necessary."""
    n = len(rows)
    needed = [r for r in rows if r.best["1D"] is None]
    short = [s for r in rows if (s := r.shortfall("1D")) is not None]
    seed_fits = [r for r in rows if r.best[SEED_1D] is not None]
    seed_short = [s for r in rows if (s := r.shortfall(SEED_1D)) is not None]
    fits = (f"1D has no feasible plan in {len(needed)} of {n} rows ({', '.join(r.label(True) for r in needed)})"
            if needed else f"1D has a feasible plan in all {n} rows")
    return [
        f"2. *vit_era5 ({VIT[0]} here): 2D parallelism is necessary.* **{verdict(len(needed), n)} here**: {fits}"
        + (f"; where it fits, its throughput is at most {max(short):.1%} below the fastest strategy's "
           f"(median {sorted(short)[len(short) // 2]:.1%})" if short else "")
        + f". Winners: {counts(rows)}.",
        f"   The reference code's 1D fits in {len(seed_fits)} of {n} rows"
        + (f" and is {min(seed_short):.1%} to {max(seed_short):.1%} below the fastest strategy" if seed_short else "")
        + (": without sequence parallelism 1D is slower, not impossible." if len(seed_fits) == n else "."),
    ]


def paper_section(one_t: list[Row], vit: list[Row]) -> list[str]:
    seq = load_model(VIT[0]).seq_length
    return [
        "## Compared with the paper", "",
        "The paper (arXiv 2410.00273; seed 003 is its code's README) states two findings these tables test. "
        "Every figure below is computed by `benchmarks/docs/strategies.py` from the rows above.", "",
        *claim_1t(one_t), "", *claim_vit(vit), "",
        "Where the two models differ:", "",
        "- **1D is not handicapped here.** The reference code's 1D has neither sequence parallelism nor overlapped",
        "  TP communication and stores unsharded layer inputs, while its SUMMA path gets both. The "
        f"`{SEED_1D}`",
        "  column shows that 1D on meshplan's cost model; the `1D` column gives it what Megatron-LM has.",
        "- **Everything but the tensor layout is searched for every strategy alike**: interleaved pipelines",
        "  (the reference charges a (p-1)·t bubble with no interleaving), micro-batch, ZeRO stages, selective",
        "  recompute, offload, and which axis lands in the NVLink domain.",
        f"- **Long sequences** (vit_era5, {seq:,} tokens) make activations, not weights, the memory problem; 1D",
        "  with sequence parallelism shards them across its tensor-parallel group, so whether 2D is needed becomes",
        "  a question of communication volume, which the tables answer per system.",
        "- **Attention**: meshplan uses flash attention everywhere (non-causal for vit_era5) and the SUMMA layout",
        "  gathers K/V across tp2 like the reference's 2D strategy; the reference computes unfused logits for",
        "  its SUMMA attention.",
        "",
    ]


def document(one_t: list[Row], vit: list[Row]) -> str:
    lines = [
        "# 1D vs 2D tensor parallelism (seed 003)",
        "",
        f"Generated by `python benchmarks/docs/strategies.py` ({len(one_t) + len(vit)} x {len(STRATEGIES)} exhaustive "
        "searches). Each cell is",
        "the best feasible plan of the full meshplan search restricted to one strategy; throughput is samples",
        "(sequences) per second. Strategies:",
        "",
        "- **1D**: Megatron TP with sequence parallelism and TP communication overlapped with the GEMMs.",
        "- **1D (seed 003)**: the reference code's 1D: no sequence parallelism, no overlap (shown, not ranked).",
        "- **2D SUMMA**: tp x tp2 grid, SUMMA broadcasts in panels overlapped with compute (panel count searched).",
        "- **2D context**: 1D TP x context parallelism (cp > 1), K/V all-gathered as in seed 003.",
        "- **2D tp2d**: seed 001's weight-stationary tp_in x tp_out grid (`--layout tp2d`): h over tp, heads and FFN",
        "  over tp2, each linear's partial sums all-reduced over one axis forward and the other backward; the tp",
        "  ranks repeat the attention of their heads. Not one of the paper's strategies: the winner columns and",
        "  the claims below rank 1D, SUMMA and 2D context, and tp2d is compared after each table.",
        "",
        "All strategies share the rest of the space: pipeline and interleaving, micro-batch, ZeRO 0-3,",
        "recompute, offload and the placement of every axis on the NVLink / network mesh.",
        "",
        model_title(*ONE_T), "", *table(one_t, by_gpus=False), "",
        f"Winners: {win_text(one_t, False)}.", "",
        f"Fastest 2D over 1D, throughput: {margin(one_t, False)}.", "",
        tp2d_text(one_t, False), "",
        "Time breakdown of the winner:", "",
    ]
    lines += [f"- {r.system} NVLink {r.domain}, {r.winner()}: {breakdown(r.best[r.winner()])}"
              for r in one_t if r.best.get(r.winner()) is not None]
    lines += ["", model_title(*VIT), "", *table(vit, by_gpus=True), "",
              f"Winners: {win_text(vit, True)}.", "",
              f"Fastest 2D over 1D, throughput: {margin(vit, True)}.", "", tp2d_text(vit, True), ""]
    return "\n".join(lines + paper_section(one_t, vit))


def rows(case: tuple[str, tuple[int, ...], int], pool: ProcessPoolExecutor) -> list[Row]:
    """Every system x NVLink size x GPU count of ``case``, searched on ``pool``'s processes."""
    name, counts, global_batch = case
    jobs = [(name, gpus, global_batch, system, domain) for system, domain in SYSTEMS for gpus in counts]
    out = list(pool.map(run, *zip(*jobs, strict=True)))
    for r in out:
        print(f"{name} {r.system} NVLink {r.domain} {r.gpus} GPUs: {r.winner()}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DOCS, help="folder for STRATEGIES.md (default: docs/)")
    out = parser.parse_args(argv).out
    start = time.perf_counter()
    with ProcessPoolExecutor() as pool:  # one search per core at a time; the rows come back in order
        text = document(rows(ONE_T, pool), rows(VIT, pool))
    out.mkdir(parents=True, exist_ok=True)
    (out / "STRATEGIES.md").write_text(text)
    print(f"wrote {out / 'STRATEGIES.md'} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
