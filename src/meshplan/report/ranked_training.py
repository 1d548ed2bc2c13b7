"""The training search's result (search/run.py's SearchResult) as the one shape the reports render (ranked.Ranked):
the best plans' columns as the terminal prints them (dp·tp·pp·cp, the axes on each mesh tier, step time with its
error band, tokens/s, MFU, memory, days and cost on a token budget), the rejected plans by reason, and the page's
lead. Pure formatting: the numbers come from the Estimates.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from meshplan.derived.goodput import Goodput, Reliability, plan_goodput
from meshplan.pipeline.registry import schedule_of
from meshplan.report import terms
from meshplan.report.fold import Col, Listing
from meshplan.report.ranked import Lead, Ranked, rejected_listing
from meshplan.report.tiers import mesh_text, tier_axes, tier_blocks, tier_headers
from meshplan.specs.layouts import layout_of
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.estimate import Estimate
    from meshplan.search.run import SearchResult

METRICS = ("step", "tokens/s", "MFU", "memory", "days", "cost")  # the columns a folded table keeps first


def training_cost(est: Estimate, tokens: float | None, price: float | None, rel: Reliability | None = None
                  ) -> dict[str, float]:
    """Days to train on ``tokens`` tokens and the cost at ``price`` per GPU-hour; with ``rel`` (--mtbf), the goodput
    and the days with failures, checkpoints and restarts (derived/goodput.py)."""
    found = expected(est, rel)
    if found is not None and found.stalls:  # no progress: no finite time or cost (failures_text says why)
        return {"goodput": 0.0}
    out: dict[str, float] = {} if found is None else {"goodput": found.goodput,
                                                       "expected_step_time_s": est.step_time * found.factor}
    if not tokens:
        return out
    days = tokens / est.tokens_per_s / 86400 * (1.0 if found is None else found.factor)
    out |= {"days": days, "gpu_hours": days * 24 * est.cluster.num_gpus}
    if price is not None:
        out["cost"] = out["gpu_hours"] * price
    return out


def band_text(est: Estimate) -> str:
    """`` ±7%`` when the estimate carries an error band (the relative half-width of its step time), else ""."""
    band = getattr(est, "error_band", None)
    if band is None:
        return ""
    return f" ±{band:.0%}" if band >= 0.01 else f" ±{band:.1%}"


def band_entry(ests: Sequence[Estimate]) -> list[tuple[str, str]]:
    """The legend's entry for the rows' error band, read from the rows themselves (``band_text``): ``±9%`` where
    every row shows ±9 % (the legend once said ±7 % beside ±9 % rows), ``±N%`` where they differ; none without."""
    shown = sorted({band_text(e).strip() for e in ests} - {""})
    if not shown:
        return []
    return [(shown[0] if len(shown) == 1 else "±N%", terms.BAND[1])]


def step_text(est: Estimate) -> str:
    return fmt_time(est.step_time) + band_text(est)


def expected(est: Estimate, rel: Reliability | None) -> Goodput | None:
    """The plan's failure accounting under ``rel`` (derived/goodput.py), None without one."""
    return None if rel is None else plan_goodput(est, rel)


def failures_text(est: Estimate, rel: Reliability) -> str:
    """One paragraph on the plan's failure accounting (derived/goodput.py), every assumption named."""
    g = plan_goodput(est, rel)
    if g.recovery == "replica":
        return (f"with failures (one interruption per {rel.mtbf_gpu_hours:,.0f} GPU-hours, --mtbf): on "
                f"{est.cluster.num_gpus:,} GPUs one every {fmt_time(g.job_mtbf_s)}, each taking one of the "
                f"{est.plan.dp} replicas out for its restart ({fmt_time(rel.restart_s)}, assumed) and its heal from a "
                f"peer ({fmt_time(g.heal_s)}) while the others train on (TorchFT); goodput {g.goodput:.1%}: a step "
                f"takes {fmt_time(est.step_time * g.factor)} on average")
    return (f"with failures (one interruption per {rel.mtbf_gpu_hours:,.0f} GPU-hours, --mtbf): on "
            f"{est.cluster.num_gpus:,} GPUs one every {fmt_time(g.job_mtbf_s)}; a checkpoint of "
            f"{fmt_bytes(g.checkpoint_bytes)} takes {fmt_time(g.checkpoint_s)} at "
            f"{rel.checkpoint_bandwidth / 1e9:,.0f} GB/s, written every {fmt_time(g.interval_s)} of work (Daly 2006); "
            f"a restart takes {fmt_time(g.restart_s)} (an assumed {fmt_time(rel.restart_s)}, then reading the "
            "checkpoint back); " + (
                f"goodput 0: the job makes no progress (interrupted every {fmt_time(g.job_mtbf_s)}, far sooner than "
                f"it restarts in {fmt_time(g.restart_s)}): fewer GPUs, a larger --mtbf or faster restarts"
                if g.stalls else
                f"goodput {g.goodput:.1%}: a step takes {fmt_time(est.step_time * g.factor)} on average"))


def cost_columns(tokens: float | None, price: float | None, rel: Reliability | None = None) -> list[str]:
    return (["goodput"] if rel is not None else []) + (
        (["days"] + (["cost"] if price is not None else [])) if tokens else [])


def metric_cells(est: Estimate, tokens: float | None, price: float | None, rel: Reliability | None = None
                 ) -> dict[str, str]:
    """A plan's figures as the tables print them: step (with its band), tokens/s, MFU, memory, goodput, days, cost."""
    out = {"step": step_text(est), "tokens/s": fmt_count(est.tokens_per_s), "MFU": f"{est.mfu:.1%}",
           "memory": fmt_bytes(est.peak_memory)}
    cost = training_cost(est, tokens, price, rel)
    cells = [f"{cost['goodput']:.1%}"] if "goodput" in cost else []
    cells += [f"{cost['days']:.1f}" if "days" in cost else "never"] if tokens else []
    cells += [f"${cost['cost']:,.0f}" if "cost" in cost else "never"] if tokens and price is not None else []
    return out | dict(zip(cost_columns(tokens, price, rel), cells, strict=True))


def prefers_simple(result) -> bool:
    return bool(getattr(getattr(result, "space", None), "prefer_simple", False))


def simplest_leads(result) -> bool:
    """Whether the simplest plan of the band leads (``Space.simplest_leads``), not the fastest."""
    return prefers_simple(result) and bool(getattr(result.space, "simplest_leads", False))


def _layout(p) -> str:
    tp = layout_of(p.tensor_layout).cell.format(tp=p.tp, tp2=p.tp2)
    return f"{p.dp}·{tp}·{p.pp}·{p.cp}"


SHORT = {"none": "-", "selective": "sel"}  # per-rank recompute entries in the recompute column


def run_lengths(values: tuple[int, ...]) -> str:
    """Counts per pipeline rank, a run of k equal ones as N×k: 3,4,4,4,3 -> 3,4×3,3."""
    out: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        out.append(f"{values[i]}×{j - i}" if j - i > 2 else ",".join([str(values[i])] * (j - i)))
        i = j
    return ",".join(out)


def _plan_cells(result) -> dict[str, list[str]]:
    """The best plans' layout columns (before their figures), one cell per plan, in the wide table's order."""
    ests = result.plans
    cells: dict[str, list[str]] = defaultdict(list)
    # a schedule column where a plan runs an asynchronous or a split-backward (zero_bubble.py) pipeline
    asynchronous = any(schedule_of(e.plan.schedule).opt_in and e.plan.pp > 1 for e in ests)
    uneven = any(e.plan.last_stage_layers for e in ests)
    uneven_first = any(e.plan.first_stage_layers for e in ests)
    per_rank = any(e.plan.stage_layers for e in ests)
    for est in ests:
        p = est.plan
        cells["dp·tp·pp·cp"].append(_layout(p))
        if result.model.is_moe:
            cells["ep/etp"].append(f"{p.ep}/{p.etp}")
        cells["vpp"].append(str(p.vpp))
        if uneven_first:
            cells["first"].append(str(p.first_stage_layers or "-"))
        if uneven:
            cells["last"].append(str(p.last_stage_layers or "-"))
        if per_rank:
            cells["layers"].append(run_lengths(p.stage_layers) or "-")
        if asynchronous:
            cells["schedule"].append(p.schedule if p.pp > 1 else "-")
        cells["mbs"].append(str(p.micro_batch))
        cells["zero"].append(str(p.zero))
        layers = f" {p.recompute_layers}" if p.recompute == "full" and p.recompute_layers else ""
        cells["recompute"].append(",".join(SHORT.get(e, e) for e in p.stage_recompute) or p.recompute + layers)
        cells["sp"].append("on" if p.sequence_parallel else "-")
        act = "act " + ",".join(map(str, p.stage_offload)) if p.stage_offload else "act"
        cells["offload"].append("+".join(k for k, on in (("opt", p.offload_optimizer),
                                                         (act, p.offload_activations or p.stage_offload)) if on) or "-")
        for header, axes in zip(tier_headers(est.cluster), tier_axes(est), strict=True):
            cells[header].append(axes)
    return cells


def best_plans(result: SearchResult, tokens: float | None = None, price: float | None = None,
               rel: Reliability | None = None) -> Listing:
    """The best plans' table: the layout, the axes on each mesh tier and the figures, each header with its meaning;
    ``#`` marks with ≈ the plans the model cannot tell from the fastest."""
    space, blocks = result.space, tier_blocks(result.cluster)
    stack = [space.precision, space.stack.name] + ([space.stack.fsdp] if space.stack.fsdp_mode.shards else [])
    title = (f"best plans: {result.model.name} on {result.cluster.num_gpus} x {result.cluster.accelerator.name}, "
             f"seq {result.model.seq_length:,}, global batch {space.global_batch:,}, {', '.join(stack)}")
    cells = _plan_cells(result)
    for est in result.plans:
        for name, value in metric_cells(est, tokens, price, rel).items():
            cells[name].append(value)
    meanings = {"#": terms.RANK_SIMPLEST if simplest_leads(result) else terms.RANK_SIMPLE} \
        if prefers_simple(result) else {}
    meanings = {"#": terms.RANK_GOODPUT} if rel is not None else meanings
    left = ("recompute", "offload", *tier_headers(result.cluster))

    def meaning(h: str) -> str:
        return terms.entries([h], blocks=blocks, meanings=meanings, units=False)[0][1]

    same = getattr(result, "equivalent", ()) or (False,) * len(result.plans)  # SearchResult.equivalent
    equivalent = [i > 1 and bool(eq) for i, eq in enumerate(same, 1)]
    key = Col("#", [f"{i}≈" if eq else str(i) for i, eq in enumerate(equivalent, 1)], meaning=meaning("#"))
    cols = tuple(Col(h, cs, "left" if h in left else "right", meaning=meaning(h)) for h, cs in cells.items())
    used = {e.plan.tensor_layout for e in result.plans}
    notes = [terms.NONE] + [note for name, note in terms.LAYOUT_CELLS.items() if name in used]
    notes += band_entry(result.plans)
    notes += [terms.EQUIVALENT] if any(equivalent) else []
    return Listing(title, key, cols, ("dp·tp·pp·cp", *METRICS), (*notes, terms.UNITS))


def rejected_plans(result: SearchResult) -> Listing:
    """The rejected plans tallied by reason, with one example each, and the notations the reasons use."""
    return rejected_listing(result.rejected, result.examples, "plans", "plans", terms.HEADERS,
                            terms.reason_notes(list(result.rejected)))


def training_lead(result: SearchResult) -> Lead:
    """One line on the model and the search, and the best plan's figures as cards."""
    model, cluster = result.model, result.cluster
    acc, mesh = cluster.accelerator, mesh_text(cluster, " × ")
    text = (f"{fmt_count(model.params())} parameters, sequence {model.seq_length}, global batch "
            f"{result.space.global_batch} sequences ({fmt_count(result.space.global_batch * model.seq_length)} "
            f"tokens); mesh {mesh} (NVLink domain {cluster.nvlink_domain}); {result.evaluated:,} plans evaluated, "
            f"{result.feasible:,} fit in {fmt_bytes(acc.hbm_bytes)} HBM.")
    heading = f"meshplan report: {model.name} on {cluster.num_gpus} × {acc.name}"
    if not result.plans:
        return Lead(heading=heading, text=text)
    best = result.plans[0]
    cards = [("step time", f"{fmt_time(best.step_time)} ± {best.error_band:.0%}"),
             ("tokens/s", fmt_count(best.tokens_per_s)), ("MFU", f"{best.mfu:.1%}"),
             ("model TFLOP/s per GPU", f"{best.tflops_per_gpu:.0f}"),
             ("memory per GPU", f"{fmt_bytes(best.peak_memory)} / {fmt_bytes(acc.hbm_bytes)}")]
    return Lead(heading=heading, text=text, cards=cards, best=best.plan.describe(),
                best_note=f"schedule {best.plan.schedule}, precision {best.plan.precision}")


def from_training(result: SearchResult, tokens: float | None = None, price: float | None = None,
                  rel: Reliability | None = None) -> Ranked:
    """The training search's result as the reports' one shape (``tokens``, ``price``: the days and cost columns)."""
    from meshplan import __version__

    plans = result.plans
    band = plans[0].ranking_band if plans else None
    ranking = (f"Step times within ±{band:.1%} of each other (the error band of comparable published dense runs on "
               "the same GPU generation) cannot be told apart by the model; among those, the simplest and lightest "
               "plan is listed first. Hover a column's name for what it means.") if plans else ""
    metrics = tuple({"step_time_s": e.step_time, "tokens_per_s": e.tokens_per_s, "mfu": e.mfu,
                     "peak_memory_bytes": e.peak_memory} for e in plans)
    footer = (f"meshplan {__version__}: analytic estimate (roofline per op, α-β collectives, pipeline schedule "
              f"simulation); search took {result.seconds:.2f} s.")
    cluster = result.cluster
    return Ranked(noun="plans", page_title=f"{result.model.name} on {cluster.num_gpus} × {cluster.accelerator.name}",
                  table=best_plans(result, tokens, price, rel), rejected=rejected_plans(result),
                  rejected_total=result.rejected_total, evaluated=result.evaluated, feasible=result.feasible,
                  seconds=result.seconds, lead=training_lead(result),
                  footer=footer, ranking=ranking, band=band, metrics=metrics,
                  labels=tuple(e.plan.describe() for e in plans),
                  empty="No feasible plan.")
