"""The serving report's sections (each a sections.Section with its template under templates/sections/serve_*):
the best configurations as the terminal lists them (serve_text.py), throughput against TPOT and TTFT over the decode
batch for the best configurations' shapes (serve/curves.py), memory per GPU and the decode iteration by kind of op
of the best configurations. The configuration space is serve_space.py, the trust note serve_trust.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from meshplan.report import serve_charts as C
from meshplan.report.sections import Section
from meshplan.report.serve_text import HEADERS, cells
from meshplan.serve.curves import Curve, curve
from meshplan.serve.plan import Workload
from meshplan.units import fmt_bytes, fmt_time

if TYPE_CHECKING:
    from meshplan.serve.estimate import ServeEstimate
    from meshplan.serve.search import ServeSearchResult

SHOWN = 5  # configurations in the memory and decode-step charts


def labels(plans: Sequence[ServeEstimate]) -> list[str]:
    """``#1 tp=2 x4 batch=128 fp8/fp8/fp8``: the rank and the configuration."""
    return [f"#{i} {e.plan.describe()}" for i, e in enumerate(plans, 1)]


def plans_section(result: ServeSearchResult, price: float | None) -> Section:
    """The best configurations' table: the terminal's columns, each header explained in its tooltip."""
    rows = [cells(e, price) for e in result.plans]
    header = [h for h in (rows[0] if rows else {})]
    if not result.model.is_moe and "ep" in header:
        header.remove("ep")
    table = [[i, *(r[h] for h in header)] for i, r in enumerate(rows, 1)]
    s = result.space
    targets = [f"TTFT ≤ {fmt_time(s.ttft_slo)}"] * bool(s.ttft_slo) + [f"TPOT ≤ {fmt_time(s.tpot_slo)}"] * bool(
        s.tpot_slo)
    note = (f"Ranked by {'the lowest TPOT' if s.rank_by == 'latency' else 'output tokens/s of the deployment'}"
            f"{', under ' + ' and '.join(targets) if targets else ''}. Hover a column's name for what it means.")
    return Section("plans", "Best configurations", "sections/serve_plans.html.j2", {
        "header": ["#", *header], "titles": [HEADERS["#"], *(HEADERS.get(h, "") for h in header)], "rows": table,
        "left": [i + 1 for i, h in enumerate(header) if h in ("quant", "pools")], "note": note})


def curves(result: ServeSearchResult, count: int = 4) -> tuple[list[Curve], list[int]]:
    """Throughput against latency over the search's batches for the first ``count`` distinct shapes (the
    configuration with batch 1) among the best configurations, and each one's own batch."""
    seen, out, own = set(), [], []
    workload = Workload(input_len=result.space.input_len, output_len=result.space.output_len)
    for e in result.plans:
        shape = e.plan.with_(batch=1)
        if shape in seen:
            continue
        seen.add(shape)
        out.append(curve(result.model, result.cluster, e.plan, workload, result.space.engine, result.space.batches))
        own.append(e.plan.batch)
        if len(out) == count:
            break
    return out, own


def curves_section(result: ServeSearchResult) -> Section:
    """Output tokens/s per GPU against TPOT and against TTFT, one line per shape, the targets drawn."""
    lines, own = curves(result)
    rows = C.curve_rows(lines, own)
    s = result.space
    found = {"curve-tpot": C.curve_chart(rows, "tpot", s.tpot_slo, "Throughput per GPU against TPOT, over the batch"),
             "curve-ttft": C.curve_chart(rows, "ttft", s.ttft_slo, "Throughput per GPU against TTFT, over the batch")}
    return Section("curves", "Throughput vs latency", "sections/serve_curves.html.j2",
                   {"count": len(lines), "batches": f"{min(s.batches)}–{max(s.batches)}"}, found)


def memory_section(plans: Sequence[ServeEstimate]) -> Section:
    """Memory per GPU of the best configurations against HBM, and the first one's parts in a table."""
    shown = list(plans[:SHOWN])
    best, hbm = shown[0], shown[0].cluster.accelerator.hbm_bytes
    m = best.memory
    parts = C.memory_parts(best)
    table = [[k, fmt_bytes(v), f"{v / hbm:.1%}"] for k, v in parts.items()]
    allocated = sum(parts.values())
    table += [["KV-cache pool", fmt_bytes(float(m.kv_pool)), f"{float(m.kv_pool) / hbm:.1%}"],
              ["allocated by the engine", fmt_bytes(allocated), f"{allocated / hbm:.1%}"]]
    seqs = (f"One sequence holds {fmt_bytes(float(m.sequence))} of KV cache per GPU at "
            f"{best.engine.resident(best.workload):,.0f} tokens (whole pages); the pool holds "
            f"{float(m.max_sequences(best.plan.dpa)):,.0f} such sequences per instance, the batch runs "
            f"{best.metrics.running:,.0f}.")
    return Section("memory", "Memory", "sections/serve_memory.html.j2",
                   {"n": len(shown), "hbm": fmt_bytes(hbm), "table": table, "sequences": seqs},
                   {"serve-memory": C.memory_chart(shown, labels(shown))})


def step_section(plans: Sequence[ServeEstimate], top: int = 12) -> Section:
    """The decode iteration of the best configurations by kind of op, and the first one's costliest ops."""
    shown = list(plans[:SHOWN])
    best = shown[0]
    total = sum(best.breakdown.values())
    ops = sorted(((k, v) for k, v in best.breakdown.items() if v > 0), key=lambda kv: -kv[1])[:top]
    table = [[k, C.STEP_KINDS[best.kinds.get(k, "memory")][0], fmt_time(v), f"{v / total:.1%}"] for k, v in ops]
    kinds = C.step_kinds(best)
    lead = max(kinds, key=lambda k: kinds[k])
    note = (f"Plan #1 spends {kinds[lead] / total:.0%} of its decode iteration on {C.STEP_KINDS[lead][0]}. The "
            "iteration is the decode step at the running batch (every pipeline stage's micro-batch in turn); TPOT adds "
            "the prompts' share of the iterations (chunked prefill) or their stalls.")
    return Section("step", "Decode step", "sections/serve_step.html.j2",
                   {"n": len(shown), "table": table, "note": note},
                   {"serve-step": C.step_chart(shown, labels(shown))})
