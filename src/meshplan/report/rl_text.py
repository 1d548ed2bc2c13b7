"""The RL search's tables for the terminal (rich): the best plans ranked, the best plan of each set-up side by side
(its phases with their pools and seconds, its memory per GPU in each phase), and what was rejected. Pure formatting:
the numbers come from rl/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from meshplan.rl.estimate import RLEstimate
    from meshplan.rl.search import RLSearchResult

PHASE_NAMES = {  # what each phase is, in the tables' words
    "offload": "trainer state to host", "wake": "engine wakes", "sync": "weight transfer", "rollout": "rollout",
    "sleep": "engine sleeps", "reload": "trainer state back", "reward": "reward model", "old_log_prob":
    "old log-probs", "ref_load": "reference load", "reference": "reference log-probs", "critic_values":
    "critic values", "critic_update": "critic update", "actor_update": "policy update"}
ORDER = tuple(PHASE_NAMES)
ROLLOUT_MARK = {"simulated": "", "closed form": "*", "steady state": "~"}


def trainer_text(e: RLEstimate) -> str:
    t = e.update.plan
    ep = f" ep{t.ep}" if t.ep > 1 else ""
    off = "+oo" if t.offload_optimizer else ""
    return f"{t.dp}·{t.tp}·{t.pp}·{t.cp}{ep} m{t.micro_batch} z{t.zero}{off}"


def engine_text(e: RLEstimate) -> str:
    g = e.plan.engine
    axes = f"{g.tp}·{g.pp}·{g.dpa}" + (f" ep{g.ep}" if g.ep > 1 else "")
    return f"{axes} x{g.replicas} b{g.batch}"


def pools_text(e: RLEstimate) -> str:
    p = e.plan
    return f"{p.train_gpus} shared" if p.way.shared else f"{p.rollout_gpus}R+{p.train_gpus}T"


def ranked_table(result: RLSearchResult) -> Table:
    from rich.table import Table

    job, acc = result.job, result.system.accelerator
    table = Table(title=f"best RL plans: {result.model.name} on {result.gpus} x {acc.name}, {job.describe()}, "
                        f"{result.space.stack.name} + {result.space.engine.name}", title_justify="left")
    for col in ("#", "set-up", "GPUs", "trainer", "engine", "offload", "iteration", "samples/s/GPU",
                "tokens/s/GPU", "rollout", "memory"):
        table.add_column(col, justify="right" if col in ("#", "iteration", "samples/s/GPU", "tokens/s/GPU",
                                                          "rollout", "memory") else "left")
    for i, (e, same) in enumerate(zip(result.plans, result.equivalent, strict=True), 1):
        table.add_row(f"{i}{'≈' if same and i > 1 else ''}", e.plan.setup, pools_text(e), trainer_text(e),
                      engine_text(e), e.plan.offload if e.plan.way.shared else "-",
                      f"{fmt_time(e.iteration_time)} ±{e.error_band:.0%}", f"{e.samples_per_s_per_gpu:.3g}",
                      fmt_count(e.tokens_per_s_per_gpu),
                      fmt_time(e.phases.get("rollout", 0.0)) + ROLLOUT_MARK[e.rollout.method],
                      fmt_bytes(e.peak_memory))
    return table


def phases_table(best: dict[str, RLEstimate]) -> Table:
    """The best plan of each set-up side by side: each phase's seconds per iteration and its pool."""
    from rich.table import Table

    table = Table(title="the best plan of each set-up, phase by phase (seconds per iteration; R rollout pool, "
                        "T training pool, A all GPUs)", title_justify="left")
    table.add_column("phase")
    for name in best:
        table.add_column(name, justify="right")
    for phase in ORDER:
        if not any(phase in e.phases for e in best.values()):
            continue
        cells = []
        for e in best.values():
            pools = {s.pool for s in e.segments if s.phase == phase}
            tag = "/".join(sorted(p[0].upper() for p in pools))
            cells.append(f"{fmt_time(e.phases[phase])} {tag}" if phase in e.phases else "-")
        table.add_row(PHASE_NAMES[phase], *cells)
    table.add_row("iteration", *(f"{fmt_time(e.iteration_time)} ±{e.error_band:.0%}" for e in best.values()))
    table.add_row("samples/s per GPU", *(f"{e.samples_per_s_per_gpu:.3g}" for e in best.values()))
    table.add_row("rollout tail", *(f"{e.rollout.tail_share:.0%} of it" for e in best.values()))
    return table


def memory_table(best: dict[str, RLEstimate]) -> Table:
    """Memory per GPU in each phase of the best plans, with each one's largest part."""
    from rich.table import Table

    table = Table(title="memory per GPU by phase and pool (A all GPUs, R rollout, T training; the largest part)",
                  title_justify="left")
    table.add_column("phase")
    for name in best:
        table.add_column(name, justify="right")
    rows: dict[str, dict[str, list[str]]] = {p: {} for p in ORDER}
    for name, e in best.items():
        for m in e.memory:
            top = max(m.parts.items(), key=lambda kv: kv[1])[0] if m.parts else ""
            rows[m.phase].setdefault(name, []).append(f"{fmt_bytes(m.total)} {m.pool[0].upper()} ({top})")
    for phase, cells in rows.items():
        if cells:
            table.add_row(PHASE_NAMES[phase], *("\n".join(cells.get(n, ["-"])) for n in best))
    table.add_row("HBM", *(fmt_bytes(e.cluster.accelerator.hbm_bytes) for e in best.values()))
    return table


def rejected_table(result: RLSearchResult, limit: int = 8) -> Table:
    from rich.table import Table

    table = Table(title=f"rejected: {sum(result.rejected.values()):,} layouts and pairings ({result.evaluated} "
                        f"pairings priced, {result.seconds:.1f} s)", title_justify="left")
    for col in ("reason", "count", "example"):
        table.add_column(col, justify="right" if col == "count" else "left")
    for reason, count in sorted(result.rejected.items(), key=lambda kv: -kv[1])[:limit]:
        table.add_row(reason, f"{count:,}", result.examples.get(reason, "")[:120])
    return table


LEGEND = ("legend: set-up: colocated (every phase on every GPU in turn), split (a rollout and a training pool, the "
          "rollout one step ahead), async (split pools, streaming rollouts); GPUs: NR+MT rollout and training pools; "
          "trainer: data·tensor·pipeline·context parallel, ep expert parallel, m micro-batch, z ZeRO stage, +oo "
          "optimizer step on the host; engine: tp·pp·dpa per instance x instances, b running sequences at most per "
          "instance; offload: trainer state in host "
          "memory during the rollout; iteration ±: the error band (training's and serving's, weighted by the phases' "
          "time); ≈: within #1's ranking band; rollout: simulated (the engine's scheduler), * closed form (a "
          "screened plan), ~ steady state (streaming); memory: the phase with the most per GPU")


def print_rl(result: RLSearchResult, console: Console | None = None, as_json: bool = False) -> None:
    """The search's tables (module docstring), or its JSON."""
    if as_json:
        import json

        print(json.dumps(result.to_dict()))
        return
    if console is None:
        from meshplan.report.text import terminal_console

        console = terminal_console()
    if not result.plans:
        console.print(f"no RL plan fits: {result.evaluated} pairings priced")
        console.print(rejected_table(result))
        return
    console.print(ranked_table(result))
    console.print(LEGEND, style="dim")
    console.print(phases_table(result.best))
    console.print(memory_table(result.best))
    if result.rejected:
        console.print(rejected_table(result))
