"""One self-contained HTML report of a search: it opens offline, from a file, with nothing else.

The charts are matplotlib SVGs written into the page (text drawn as paths, so no fonts are needed; every
SVG's ids prefixed so that several can share one document), the tables are plain HTML, the styling one
inline stylesheet. There is no JavaScript, no web font, no external image: no ``src`` or ``href`` points
outside the file. A report with a few plans, a pipeline timeline of a few thousand blocks and the scaling
curves weighs 0.3–1 MB.

Sections: summary, best plans, step-time breakdown, memory per GPU vs HBM, pipeline timeline of the best
plan's schedule, per-op roofline with the most expensive ops, strong scaling (from sweep rows), rejected plans.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshplan.files import write_text
from meshplan.report.text import mesh_text, op_totals, tier_axes, tier_headers
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from meshplan.estimate import Estimate
    from meshplan.search.run import SearchResult

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --accent: #4C72B0; --bg: #ffffff; --soft: #f5f7fa; }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
       font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif; }
main { max-width: 1180px; margin: 0 auto; padding: 28px 24px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 19px; margin: 40px 0 10px; padding-bottom: 6px; border-bottom: 1px solid var(--line); }
p.lead, p.note, figcaption { color: var(--muted); }
p.note { font-size: 13px; }
nav { margin: 14px 0 6px; font-size: 14px; }
nav a { color: var(--accent); margin-right: 14px; text-decoration: none; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 18px 0 4px; }
.card { background: var(--soft); border: 1px solid var(--line); border-radius: 8px; padding: 10px 16px;
        min-width: 150px; }
.card .k { font-size: 12px; color: var(--muted); text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 21px; font-weight: 600; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 4px; min-width: 420px; }
th, td { padding: 5px 9px; border-bottom: 1px solid var(--line); text-align: right; white-space: nowrap; }
th { background: var(--soft); font-weight: 600; }
td.l, th.l { text-align: left; }
tr.best td { background: #eef3fb; font-weight: 600; }
.scroll { overflow-x: auto; }
figure.chart { margin: 14px 0 6px; }
figure.chart svg { display: block; max-width: 100%; height: auto; }
code { background: var(--soft); padding: 1px 5px; border-radius: 4px; font-size: 13px; }
footer { margin-top: 48px; font-size: 12px; color: var(--muted); }
"""


# ---- SVG handling ------------------------------------------------------------------------------------------------
_REF = re.compile(r'(\bid="|url\(#|href="#)([^")]+)')


def inline_svg(svg: str, prefix: str) -> str:
    """A matplotlib SVG document as an element to write into HTML: no XML prolog, DOCTYPE or metadata, and
    every id (and every reference to one) prefixed with ``prefix`` so that ids stay unique in the page."""
    start = svg.find("<svg")
    svg = svg[start:] if start >= 0 else svg
    svg = re.sub(r"<metadata>.*?</metadata>\s*", "", svg, flags=re.S)
    ids = set(re.findall(r'\bid="([^"]+)"', svg))

    def rename(m: re.Match[str]) -> str:
        return m.group(1) + (f"{prefix}-{m.group(2)}" if m.group(2) in ids else m.group(2))

    return _REF.sub(rename, svg).strip()


def _figure_html(fig: Figure, key: str, caption: str) -> str:
    from meshplan.report.plots import svg_text

    svg = inline_svg(svg_text(fig), key)
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{html.escape(caption)}" ', 1)
    return (f'<figure class="chart" id="chart-{key}" data-chart="{key}">{svg}'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


# ---- tables ------------------------------------------------------------------------------------------------------
def _table(header: Sequence[str], rows: Sequence[Sequence[Any]], left: Sequence[int] = (0,),
           highlight_first: bool = False) -> str:
    def cell(tag: str, i: int, value: Any) -> str:
        cls = ' class="l"' if i in left else ""
        return f"<{tag}{cls}>{html.escape(str(value))}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = []
    for n, row in enumerate(rows):
        cls = ' class="best"' if highlight_first and n == 0 else ""
        body.append(f"<tr{cls}>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>'


def _plans_table(plans: Sequence[Estimate]) -> str:

    tiers = tier_headers(plans[0].cluster) if plans else ["in NVLink"]
    header = ["#", "dp·tp·pp·cp", "ep/etp", "vpp", "mbs", "zero", "recompute", "sp", "offload", "schedule",
              *tiers, "step", "tokens/s", "MFU", "memory"]
    rows = []
    for i, est in enumerate(plans, 1):
        p = est.plan
        tensor = f"{p.tp}x{p.tp2}" if p.tp2 > 1 else str(p.tp)
        off = "+".join(k for k, on in (("opt", p.offload_optimizer), ("act", p.offload_activations)) if on) or "-"
        rows.append([i, f"{p.dp}·{tensor}·{p.pp}·{p.cp}", f"{p.ep}/{p.etp}" if est.model.is_moe else "-", p.vpp,
                     p.micro_batch, p.zero, p.recompute, "on" if p.sequence_parallel else "-", off, p.schedule,
                     *tier_axes(est), fmt_time(est.step_time), fmt_count(est.tokens_per_s), f"{est.mfu:.1%}",
                     fmt_bytes(est.peak_memory)])
    return _table(header, rows, left=(1, 6, 8, 9, *range(10, 10 + len(tiers))), highlight_first=True)


def _breakdown_table(est: Estimate) -> str:
    rows = [[k, fmt_time(v), f"{v / est.step_time:.1%}"] for k, v in est.breakdown.items() if v > 0]
    rows.append(["step", fmt_time(est.step_time), "100%"])
    return _table(["component", "time", "share"], rows)


def _memory_table(est: Estimate) -> str:
    cap = est.cluster.accelerator.hbm_bytes
    rows = [[k, fmt_bytes(v), f"{v / cap:.1%}"] for k, v in est.memory.items() if v > 0]
    rows.append(["peak", fmt_bytes(est.peak_memory), f"{est.peak_memory / cap:.1%}"])
    return _table(["part", "bytes", "of HBM"], rows)


def _ops_table(est: Estimate, top: int = 12) -> str:
    rows = [[o.name, _fmt_flop(o.flops), fmt_bytes(o.nbytes), f"{o.flops / o.nbytes:.1f}" if o.nbytes and o.flops
             else "-", fmt_time(o.seconds), f"{o.share:.1%}", o.bound] for o in op_totals(est)[:top]]
    return _table(["op", "FLOP", "bytes (HBM or sent)", "FLOP/byte", "time per step", "share", "bound"], rows,
                  left=(0, 6))


def _fmt_flop(n: float) -> str:
    for unit, scale in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.3g}" if n else "-"


def _scaling_table(rows: Sequence[dict[str, Any]]) -> str:
    out = []
    for r in sorted(rows, key=lambda r: (str(r["system"]), r["nvlink_domain"], r["gpus"])):
        if not r.get("feasible"):
            out.append([r["system"], r["nvlink_domain"], r["gpus"], "no feasible plan", "", "", "", ""])
            continue
        out.append([r["system"], r["nvlink_domain"], r["gpus"], r["plan"], fmt_time(r["step_time_s"]),
                    fmt_count(r["tokens_per_s"]), f"{r['mfu']:.1%}", fmt_bytes(r["peak_memory_bytes"])])
    return _table(["system", "NVLink", "GPUs", "best plan", "step", "tokens/s", "MFU", "memory"], out,
                  left=(0, 3))


def _rejected_table(result: SearchResult) -> str:
    rows = [[reason, f"{count:,}", result.examples.get(reason, "")]
            for reason, count in sorted(result.rejected.items(), key=lambda kv: -kv[1])]
    return _table(["reason", "plans", "for example"], rows, left=(0, 2))


# ---- the page ----------------------------------------------------------------------------------------------------
def render(result: SearchResult, scaling_rows: Sequence[dict[str, Any]] | None = None, top: int = 5) -> str:
    """The report of one search (and, optionally, strong-scaling sweep rows) as one HTML string."""
    from meshplan import __version__

    model, cluster = result.model, result.cluster
    title = f"{model.name} on {cluster.num_gpus} × {cluster.accelerator.name}"
    plans = list(result.plans[:top])
    sections = _plan_sections(plans, cluster.accelerator.hbm_bytes) if plans else [(
        "plans", "Best plans", '<h2 id="plans">Best plans</h2><p><strong>No feasible plan.</strong> Every candidate '
        "was rejected; the reasons are below.</p>")]
    if scaling_rows:
        sections.append(_scaling_section(scaling_rows))
    sections.append(("rejected", "Rejected", f'<h2 id="rejected">Rejected plans ({result.rejected_total:,})</h2>'
                     + _rejected_table(result)))
    nav = "<nav>" + "".join(f'<a href="#{key}">{html.escape(name)}</a>' for key, name, _ in sections) + "</nav>"
    footer = (f"<footer>meshplan {__version__}: analytic estimate (roofline per op, α-β collectives, pipeline "
              "schedule simulation); search took "
              f"{result.seconds:.2f} s.</footer>")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>meshplan: {html.escape(title)}</title><style>{CSS}</style></head>\n<body><main>"
            + _lead(result, title, plans) + nav + "\n".join(body for _, _, body in sections) + footer
            + "</main></body></html>\n")


def _lead(result: SearchResult, title: str, plans: list[Estimate]) -> str:
    """The title, one line on the model and the search, and the best plan's figures as cards."""
    model, cluster = result.model, result.cluster
    acc, mesh = cluster.accelerator, mesh_text(cluster, " × ")
    parts = [f"<h1>meshplan report: {html.escape(title)}</h1>",
             f'<p class="lead">{fmt_count(model.params())} parameters, sequence {model.seq_length}, global batch '
             f"{result.space.global_batch} sequences ({fmt_count(result.space.global_batch * model.seq_length)} "
             f"tokens); mesh {mesh} (NVLink domain {cluster.nvlink_domain}); {result.evaluated:,} plans "
             f"evaluated, {result.feasible:,} fit in {fmt_bytes(acc.hbm_bytes)} HBM.</p>"]
    if not plans:
        return "".join(parts)
    best = plans[0]
    cards = [("step time", fmt_time(best.step_time)), ("tokens/s", fmt_count(best.tokens_per_s)),
             ("MFU", f"{best.mfu:.1%}"), ("model TFLOP/s per GPU", f"{best.tflops_per_gpu:.0f}"),
             ("memory per GPU", f"{fmt_bytes(best.peak_memory)} / {fmt_bytes(acc.hbm_bytes)}")]
    parts.append('<div class="cards">' + "".join(
        f'<div class="card"><div class="k">{html.escape(k)}</div><div class="v">{html.escape(v)}</div></div>'
        for k, v in cards) + "</div>")
    parts.append(f'<p class="note">best plan: <code>{html.escape(best.plan.describe())}</code> '
                 f"schedule {best.plan.schedule}, precision {best.plan.precision}</p>")
    return "".join(parts)


def _plan_sections(plans: list[Estimate], hbm: float) -> list[tuple[str, str, str]]:
    """(anchor, name, HTML) of the sections on the best plans: table, step time, memory, pipeline, roofline."""
    from meshplan.report import plots

    best, n = plans[0], len(plans)
    run = plots.pipeline_run(best)
    note = ("" if best.plan.pp > 1 else
            '<p class="note">The best plan has no pipeline parallelism (pp = 1): one rank, no bubble.</p>')
    return [
        ("plans", "Best plans", '<h2 id="plans">Best plans</h2>' + _plans_table(plans)
         + f'<p class="note">Step times within ±{best.error_band:.1%} of each other (the error band of comparable '
           "published runs: same GPU generation, dense or MoE) cannot be told apart by the model; among those, the "
           "simplest and lightest plan is listed first.</p>"),
        ("time", "Step time", '<h2 id="time">Step time breakdown</h2>'
         + _figure_html(plots.breakdown_figure(plans), "breakdown", f"Step time of the {n} best plans by component")
         + '<p class="note">Exposed time per component on the busiest pipeline rank: communication '
           "hidden behind compute is not counted; the bubble is the pipeline's idle time.</p>"
         + _breakdown_table(best)),
        ("memory", "Memory", '<h2 id="memory">Memory per GPU vs HBM</h2>'
         + _figure_html(plots.memory_figure(plans), "memory",
                        f"Memory per GPU of the {n} best plans against {fmt_bytes(hbm)} HBM")
         + _memory_table(best)),
        ("pipeline", "Pipeline", '<h2 id="pipeline">Pipeline timeline</h2>'
         + _figure_html(plots.timeline_figure(best, run), "timeline",
                        f"{run.schedule} schedule simulated per rank: pp={run.pp}, vpp={run.vpp}, "
                        f"{run.micro_batches} micro-batches, bubble {run.timeline.idle_fraction:.1%}")
         + note
         + f'<p class="note">Per micro-batch and model chunk: forward {_per_rank(run.t_fwd)}, backward '
           f"{_per_rank(run.t_bwd)} (exposed communication included), from the estimate; the schedule "
           "simulator places them under the pipeline's dependencies.</p>"),
        ("roofline", "Roofline", '<h2 id="roofline">Per-op roofline</h2>'
         + _figure_html(plots.roofline_figure(best), "roofline",
                        "Arithmetic intensity vs achieved FLOP/s of every op of the best plan")
         + _ops_table(best)),
    ]


def _scaling_section(scaling_rows: Sequence[dict[str, Any]]) -> tuple[str, str, str]:
    """Strong scaling: the sweep's picture (with more than one GPU count) and its table."""
    from meshplan.report import sweep_plots

    rows = [r for r in scaling_rows if (r.get("param") or "none") == "none"]
    chart = ""
    if len({r["gpus"] for r in rows}) > 1:
        chart = _figure_html(sweep_plots.scaling_figure(rows), "scaling", "Best-plan throughput and MFU vs GPU count")
    return "scaling", "Scaling", '<h2 id="scaling">Strong scaling</h2>' + chart + _scaling_table(rows)


def write(path: str | Path, result: SearchResult, scaling_rows: Sequence[dict[str, Any]] | None = None,
          top: int = 5) -> Path:
    """Write the report of ``result`` to ``path`` (UTF-8); return the path."""
    return write_text(path, render(result, scaling_rows, top), "output")


def _per_rank(times: tuple[float, ...]) -> str:
    """One time, or the first, middle and last ranks' when they differ (embedding, LM head)."""
    if len(set(times)) == 1:
        return fmt_time(times[0])
    middle = f"{fmt_time(times[1])} middle ranks, " if len(times) > 2 else ""
    return f"{fmt_time(times[0])} first rank, {middle}{fmt_time(times[-1])} last rank"
