"""The RL search's result (rl/search.py's RLSearchResult) as the one shape the reports render (ranked.Ranked): the best
plans' columns as the terminal prints them, the rejected layouts and pairings by reason, the page's lead; and the rows
both the terminal and the HTML page show of the best plan of each set-up side by side (its phases with their pools,
its memory per phase). Pure formatting: the numbers come from rl/."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from meshplan.report.fold import Col, Listing
from meshplan.report.ranked import Lead, Ranked, rejected_listing
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.rl.estimate import RLEstimate
    from meshplan.rl.search import RLSearchResult

PHASE_NAMES = {  # each phase in the reports' words, in the order an iteration runs them (rl/timeline.py)
    "offload": "trainer state to host", "wake": "engine wakes", "sync": "weight transfer", "rollout": "rollout",
    "sleep": "engine sleeps", "reload": "trainer state back", "reward": "reward model", "old_log_prob":
    "old log-probs", "ref_load": "reference load", "reference": "reference log-probs", "critic_values":
    "critic values", "critic_update": "critic update", "actor_update": "policy update"}
POOL_NAMES = {"all": "all GPUs", "rollout": "rollout pool", "train": "training pool"}
ROLLOUT_MARK = {"simulated": "", "closed form": "*", "steady state": "~"}
RL_HEADERS = {
    "#": "rank: the shortest iteration first (on the job's GPUs also the most samples per second per GPU); ≈: within "
         "#1's ranking band",
    "set-up": "colocated: every phase on every GPU in turn; split: a rollout and a training pool, the rollout "
              "--staleness steps ahead; async: split pools with streaming rollouts (partial responses kept across "
              "weight updates)",
    "GPUs": "N shared: every GPU takes every phase; NR+MT: N rollout and M training GPUs",
    "trainer": "dp·tp·pp·cp data-, tensor-, pipeline-, context-parallel sizes, epN expert parallel, mN micro-batch, zN "
               "ZeRO stage, +oo the optimizer step on the host",
    "engine": "tp·pp·dpa per instance (dpa: data-parallel attention groups), epN expert parallel, xN instances, bN the "
              "most running sequences per instance (max_num_seqs)",
    "offload": "the trainer state held in host memory during the rollout (colocated): none, optimizer (and "
               "gradients), all",
    "iteration": "predicted time per iteration ± its error band (training's and serving's bands weighted by the "
                 "phases' time)",
    "samples/s/GPU": "trained samples (prompt × response) per second per GPU",
    "tokens/s/GPU": "trained tokens (prompt and response) per second per GPU",
    "rollout": "the rollout phase: simulated by the engine's scheduler; * in closed form (a screened plan); ~ the "
               "steady state (streaming)",
    "memory": "memory per GPU in the phase that needs the most",
    "reason": "why layouts or pairings were rejected",
    "count": "how many for that reason",
    "for example": "one of them",
}
RL_UNITS = ("units", "k M = 10^3 10^6; KiB MiB GiB = 2^10 2^20 2^30 bytes; ms = milliseconds")


def trainer_text(e: RLEstimate) -> str:
    t = e.update.plan
    ep = f" ep{t.ep}" if t.ep > 1 else ""
    return f"{t.dp}·{t.tp}·{t.pp}·{t.cp}{ep} m{t.micro_batch} z{t.zero}{'+oo' if t.offload_optimizer else ''}"


def engine_text(e: RLEstimate) -> str:
    g = e.plan.engine
    return f"{g.tp}·{g.pp}·{g.dpa}" + (f" ep{g.ep}" if g.ep > 1 else "") + f" x{g.replicas} b{g.batch}"


def pools_text(e: RLEstimate) -> str:
    p = e.plan
    return f"{p.train_gpus} shared" if p.way.shared else f"{p.rollout_gpus}R+{p.train_gpus}T"


def rl_cells(e: RLEstimate) -> dict[str, str]:
    """One plan's row of the best plans' table, by column (RL_HEADERS)."""
    return {"set-up": e.plan.setup, "GPUs": pools_text(e), "trainer": trainer_text(e), "engine": engine_text(e),
            "offload": e.plan.offload if e.plan.way.shared else "-",
            "iteration": f"{fmt_time(e.iteration_time)} ±{e.error_band:.0%}",
            "samples/s/GPU": f"{e.samples_per_s_per_gpu:.3g}", "tokens/s/GPU": fmt_count(e.tokens_per_s_per_gpu),
            "rollout": fmt_time(e.phases.get("rollout", 0.0)) + ROLLOUT_MARK[e.rollout.method],
            "memory": fmt_bytes(e.peak_memory)}


def best_rl_plans(result: RLSearchResult) -> Listing:
    """The best plans' table, each header with its meaning."""
    job, acc = result.job, result.system.accelerator
    title = (f"best RL plans: {result.model.name} on {result.gpus} x {acc.name}, {job.describe()}, "
             f"{result.space.stack.name} + {result.space.engine.name}")
    columns: dict[str, list[str]] = defaultdict(list)
    for e in result.plans:
        for k, v in rl_cells(e).items():
            columns[k].append(v)
    key = Col("#", [f"{i}{'≈' if same and i > 1 else ''}" for i, same in enumerate(result.equivalent, 1)],
              meaning=RL_HEADERS["#"])
    cols = tuple(Col(h, c, "left" if h in ("set-up", "GPUs", "trainer", "engine", "offload") else "right",
                     meaning=RL_HEADERS[h]) for h, c in columns.items())
    return Listing(title, key, cols, ("iteration", "samples/s/GPU", "rollout", "memory"), (RL_UNITS,))


def phase_rows(best: dict[str, RLEstimate]) -> list[list[str]]:
    """Per phase, each set-up's best plan's seconds and the pools it runs on (A all GPUs, R rollout, T training); then
    the iteration, samples per GPU and the rollout's tail."""
    rows = []
    for phase, name in PHASE_NAMES.items():
        if not any(phase in e.phases for e in best.values()):
            continue
        row = [name]
        for e in best.values():
            pools = "/".join(sorted({s.pool[0].upper() for s in e.segments if s.phase == phase}))
            row.append(f"{fmt_time(e.phases[phase])} {pools}" if phase in e.phases else "-")
        rows.append(row)
    rows.append(["iteration", *(f"{fmt_time(e.iteration_time)} ±{e.error_band:.0%}" for e in best.values())])
    rows.append(["samples/s per GPU", *(f"{e.samples_per_s_per_gpu:.3g}" for e in best.values())])
    rows.append(["rollout tail", *(f"{e.rollout.tail_share:.0%} of the rollout" for e in best.values())])
    return rows


def memory_rows(best: dict[str, RLEstimate]) -> list[list[str]]:
    """Per phase, each set-up's best plan's memory per GPU on each pool it runs on, with its largest part."""
    cells_of: dict[str, dict[str, list[str]]] = {p: {} for p in PHASE_NAMES}
    for name, e in best.items():
        for m in e.memory:
            top = max(m.parts.items(), key=lambda kv: kv[1])[0] if m.parts else ""
            cells_of[m.phase].setdefault(name, []).append(f"{fmt_bytes(m.total)} {m.pool[0].upper()} ({top})")
    rows = [[PHASE_NAMES[p], *("\n".join(c.get(n, ["-"])) for n in best)] for p, c in cells_of.items() if c]
    return rows + [["HBM", *(fmt_bytes(e.cluster.accelerator.hbm_bytes) for e in best.values())]]


def rl_lead(result: RLSearchResult) -> Lead:
    job, acc = result.job, result.system.accelerator
    text = (f"{fmt_count(result.model.params())} parameters; {job.describe()}; trainer {result.space.stack.name}, "
            f"engine {result.space.engine.describe()}; {result.evaluated:,} pairings of the training and serving "
            f"searches' layouts priced, {len(result.plans):,} listed.")
    heading = f"meshplan RL report: {result.model.name} on {result.gpus} × {acc.name}"
    if not result.plans:
        return Lead(heading=heading, text=text)
    best = result.plans[0]
    cards = [("iteration", f"{fmt_time(best.iteration_time)} ±{best.error_band:.0%}"),
             ("samples/s per GPU", f"{best.samples_per_s_per_gpu:.3g}"),
             ("rollout", fmt_time(best.phases.get("rollout", 0.0))),
             ("policy update", fmt_time(best.phases.get("actor_update", 0.0))),
             ("memory per GPU", f"{fmt_bytes(best.peak_memory)} / {fmt_bytes(acc.hbm_bytes)}")]
    return Lead(heading=heading, text=text, cards=cards, best=best.plan.describe(),
                best_note=f"the rollout's tail: {best.rollout.tail_share:.0%} of it", best_label="best plan")


def from_rl(result: RLSearchResult) -> Ranked:
    """The RL search's result as the reports' one shape."""
    from meshplan import __version__

    footer = (f"meshplan {__version__}: the rollout on the serving model (the engine's scheduler simulated), the "
              f"trainer on the training model, the weight transfer on the collectives model; search took "
              f"{result.seconds:.2f} s.")
    metrics = tuple({"iteration_s": e.iteration_time, "samples_per_s_per_gpu": e.samples_per_s_per_gpu,
                     "memory_bytes": e.peak_memory} for e in result.plans)
    return Ranked(noun="RL plans", page_title=f"RL post-training of {result.model.name} on {result.gpus} × "
                                              f"{result.system.accelerator.name}",
                  table=best_rl_plans(result),
                  rejected=rejected_listing(result.rejected, result.examples, "layouts and pairings", "count",
                                            RL_HEADERS, (RL_UNITS,)),
                  rejected_total=sum(result.rejected.values()), evaluated=result.evaluated,
                  feasible=len(result.plans), seconds=result.seconds, lead=rl_lead(result), footer=footer,
                  ranking="Ranked by the time per iteration; ≈ marks the plans within the first's ranking band. Hover "
                          "a column's name for what it means.",
                  metrics=metrics, band=result.plans[0].ranking_band if result.plans else None,
                  labels=tuple(e.plan.describe() for e in result.plans), empty="No RL plan fits.")
