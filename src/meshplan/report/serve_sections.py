"""The serving report's own sections (each a sections.Section with its template under templates/sections/serve_*):
throughput against TPOT and TTFT over the decode batch for the best configurations' shapes (serve/curves.py), memory
per GPU with the KV cache and the decode iteration by kind of op of the best configurations. The best and rejected
tables are the training report's (sections.py, from ranked_serving.py), the configuration space is serve_space.py,
the trust note serve_trust.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from meshplan.report import serve_charts as C
from meshplan.report.sections import Section, ranks, share_rows
from meshplan.serve.curves import Curve, curve
from meshplan.serve.plan import Workload
from meshplan.units import fmt_bytes, fmt_time

if TYPE_CHECKING:
    from meshplan.serve.estimate import ServeEstimate
    from meshplan.serve.search import ServeSearchResult

SHOWN = 5  # configurations in the memory and decode-step charts


def config_labels(plans: Sequence[ServeEstimate]) -> list[str]:
    """``#1 tp=2 x4 batch=128 fp8/fp8/fp8``: the rank and the configuration."""
    return ranks([e.plan.describe() for e in plans])


def curves(result: ServeSearchResult, count: int = 4) -> tuple[list[Curve], list[int]]:
    """Throughput against latency over the search's batches for the first ``count`` distinct shapes (the
    configuration with batch 1) among the best configurations, and each one's own batch."""
    seen, out, own = set(), [], []
    workload = Workload(input_len=result.space.input_len, output_len=result.space.output_len,
                        cached_len=result.space.cached_len)
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


def serving_memory_section(plans: Sequence[ServeEstimate]) -> Section:
    """Memory per GPU of the best configurations against HBM, and the first one's parts in a table."""
    shown = list(plans[:SHOWN])
    best, hbm = shown[0], shown[0].cluster.accelerator.hbm_bytes
    m = best.memory
    parts = C.memory_parts(best)
    allocated = sum(parts.values())
    table = share_rows(parts | {"KV-cache pool": float(m.kv_pool), "allocated by the engine": allocated}, hbm)
    seqs = (f"One sequence holds {fmt_bytes(float(m.sequence))} of KV cache per GPU at "
            f"{best.engine.resident(best.workload):,.0f} tokens (whole pages); the pool holds "
            f"{float(m.max_sequences(best.plan.dpa)):,.0f} such sequences per instance, the batch runs "
            f"{best.metrics.running:,.0f}.")
    caption = (f"Memory per GPU of the {len(shown)} best configurations against {fmt_bytes(hbm)} of HBM and the "
               "engine's share of it: the KV-cache pool is what the weights, one layer's activations and the "
               "workspace leave of that share; the batch fills part of it")
    return Section("memory", "Memory", "sections/memory.html.j2",
                   {"chart": "serve-memory", "caption": caption, "table": table,
                    "note": f"{seqs} Configuration #1 in detail:"},
                   {"serve-memory": C.serving_memory_chart(shown, config_labels(shown))})


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
                   {"serve-step": C.step_chart(shown, config_labels(shown))})
