"""The serving search as one self-contained HTML page (``meshplan serve ... --report serve.html``), on the training
report's page (page.py: the same templates, stylesheet and inlined Vega runtime; it opens offline, from a file):

- the lead: the workload, the engine and the targets, the best configuration's figures as cards;
- the best configurations as the terminal lists them (serve_sections.py);
- throughput per GPU against TPOT and against TTFT over the decode batch for the best configurations' shapes, the
  targets drawn as lines;
- the configuration space: every configuration the search weighed, throughput per GPU against a latency, coloured
  by a chosen axis, the rejected ones marked by reason (serve_space.py, serve.js);
- memory per GPU and the decode iteration by kind of op of the best configurations;
- the trust note: the serving model's error on published runs of the GPU generation (serve_trust.py);
- the rejected configurations by reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from meshplan.files import write_text
from meshplan.report import serve_sections as S
from meshplan.report.page import Lead, render_page
from meshplan.report.sections import rejected_section
from meshplan.report.serve_space import SAMPLE, space_section
from meshplan.report.serve_trust import trust_section
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.serve.search import ServeSearchResult

SCRIPTS = ("serve.js",)  # after report.js (templates/)


def render(result: ServeSearchResult, price: float | None = None, sample: int = SAMPLE) -> str:
    """The page of a serving search (module docstring); the configuration space needs ``search(..., keep=True)``.
    ``price``: per GPU-hour, for the cost of a million tokens; ``sample``: the most configurations drawn."""
    from meshplan import __version__

    sections = [S.plans_section(result, price)]
    if result.plans:
        sections.append(S.curves_section(result))
    if result.weighed is not None and len(result.weighed):
        sections.append(space_section(result, sample))
    if result.plans:
        sections += [S.memory_section(result.plans), S.step_section(result.plans)]
    sections += [trust_section(result), rejected_section(result, "configurations")]
    footer = (f"meshplan {__version__}: analytic serving estimate (roofline per op, α-β collectives, continuous "
              f"batching in steady state); search took {result.seconds:.2f} s.")
    model, cluster = result.model, result.cluster
    return render_page(f"serving {model.name} on {cluster.num_gpus} × {cluster.accelerator.name}",
                       lead(result, price), sections, footer, SCRIPTS)


def lead(result: ServeSearchResult, price: float | None) -> Lead:
    """The workload, engine, targets and counts in a line; the best configuration's figures as cards."""
    model, cluster, s = result.model, result.cluster, result.space
    targets = [f"TTFT ≤ {fmt_time(s.ttft_slo)}"] * bool(s.ttft_slo) + [f"TPOT ≤ {fmt_time(s.tpot_slo)}"] * bool(
        s.tpot_slo)
    text = (f"{fmt_count(model.params())} parameters; requests of {s.input_len:,} prompt and {s.output_len:,} output "
            f"tokens on the {s.engine.describe()} engine; {' and '.join(targets) if targets else 'no latency target'}; "
            f"{result.evaluated:,} configurations weighed, {result.feasible:,} fit in "
            f"{fmt_bytes(cluster.accelerator.hbm_bytes)} HBM and meet the targets.")
    heading = f"meshplan serving report: {model.name} on {cluster.num_gpus} × {cluster.accelerator.name}"
    if not result.plans:
        return Lead(heading=heading, text=text)
    best = result.plans[0]
    m = best.metrics
    cards = [("output tokens/s", fmt_count(m.tokens_per_s)), ("per GPU", fmt_count(best.tokens_per_s_per_gpu)),
             ("TTFT", fmt_time(m.ttft)), ("TPOT", fmt_time(m.tpot)), ("end-to-end", fmt_time(m.e2e)),
             ("memory per GPU", f"{fmt_bytes(float(best.memory.total))} / {fmt_bytes(cluster.accelerator.hbm_bytes)}")]
    cost = best.cost_per_million(price)
    if cost is not None:
        cards.append(("$ per M output tokens", f"{cost:,.3g}"))
    note = (f"on {best.plan.num_gpus} of the {cluster.num_gpus} GPUs, {m.running:,.0f} sequences in flight per "
            f"instance, {m.requests_per_s:,.3g} requests/s")
    return Lead(heading=heading, text=text, cards=cards, best=best.plan.describe(), best_note=note,
                best_label="best configuration")


def write(path: str | Path, result: ServeSearchResult, price: float | None = None) -> Path:
    """Write the page of ``result`` to ``path`` (UTF-8); return the path."""
    return write_text(path, render(result, price), "report")
