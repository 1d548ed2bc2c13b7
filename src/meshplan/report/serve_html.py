"""The serving search as one self-contained HTML page (``meshplan serve ... --report out.html``): summary cards, the
best configurations, throughput against TPOT over batch sizes for the best shapes (serve/curves.py), the best
configuration's memory and decode step by op, and the rejected configurations. Like the training report
(html.py) it opens offline: charts are matplotlib SVGs written into the page (text as paths), one inline
stylesheet, no script, nothing fetched. Kept in its own module, with its own styles, so that it stands apart from
the training report's templates."""

from __future__ import annotations

import html
import io
import re
from pathlib import Path

from meshplan.errors import MissingDependency
from meshplan.files import write_text
from meshplan.serve.curves import Curve, curve
from meshplan.serve.estimate import ServeEstimate
from meshplan.serve.plan import Workload
from meshplan.serve.search import ServeSearchResult
from meshplan.units import fmt_bytes, fmt_count, fmt_time

STYLE = """
body { margin: 0; font: 15px/1.5 system-ui, sans-serif; color: #1d2330; }
main { max-width: 1100px; margin: 0 auto; padding: 24px; }
h2 { font-size: 19px; margin-top: 34px; border-bottom: 1px solid #d9dde5; padding-bottom: 4px; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { background: #f5f7fa; border: 1px solid #d9dde5; border-radius: 8px; padding: 8px 14px; min-width: 140px; }
.card .k { font-size: 12px; color: #5b6475; text-transform: uppercase; }
.card .v { font-size: 20px; font-weight: 600; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 4px 8px; border-bottom: 1px solid #d9dde5; text-align: right; white-space: nowrap; }
th { background: #f5f7fa; } td.l, th.l { text-align: left; }
p.note { color: #5b6475; font-size: 13px; }
svg { max-width: 100%; height: auto; }
"""
COLUMNS = ("#", "configuration", "tokens/s", "per GPU", "TTFT", "TPOT", "e2e", "memory", "$/Mtok")


def _svg(fig, key: str) -> str:
    buf = io.StringIO()
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": "meshplan", "svg.fonttype": "path"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text[text.find("<svg"):], flags=re.S)
    ids = set(re.findall(r'\bid="([^"]+)"', text))
    return re.sub(r'(\bid="|url\(#|href="#)([^")]+)',
                  lambda m: m.group(1) + (f"{key}-{m.group(2)}" if m.group(2) in ids else m.group(2)), text)


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise MissingDependency("matplotlib", "plot") from None
    return Figure(figsize=(width, height), layout="constrained")


def curves(result: ServeSearchResult, count: int = 4) -> list[Curve]:
    """Throughput against TPOT for the distinct shapes among the best configurations."""
    seen, out = set(), []
    workload = Workload(input_len=result.space.input_len, output_len=result.space.output_len)
    for e in result.plans:
        shape = e.plan.with_(batch=1)
        if shape in seen:
            continue
        seen.add(shape)
        out.append(curve(result.model, result.cluster, e.plan, workload, result.space.engine, result.space.batches))
        if len(out) == count:
            break
    return out


def curve_figure(lines: list[Curve], slo: float):
    fig = _figure(8, 4.2)
    ax = fig.add_subplot()
    for c in lines:
        ok = c.fits
        ax.plot(c.tpot[ok] * 1e3, c.tokens_per_s_per_gpu[ok], marker="o", ms=3, label=c.label)
        for b, x, y in zip(c.batch[ok], c.tpot[ok] * 1e3, c.tokens_per_s_per_gpu[ok], strict=True):
            if b in (1, 8, 64, 512):
                ax.annotate(str(b), (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
    if slo:
        ax.axvline(slo * 1e3, color="#C44E52", ls="--", lw=1, label="TPOT target")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("TPOT (ms), batch sizes marked")
    ax.set_ylabel("output tokens/s per GPU")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=7)
    return fig


def bars_figure(values: dict[str, float], title: str, unit: str):
    fig = _figure(8, 0.3 * len(values) + 1.0)
    ax = fig.add_subplot()
    names = list(values)[::-1]
    ax.barh(names, [values[n] for n in names], color="#4C72B0")
    ax.set_xlabel(unit)
    ax.set_title(title, fontsize=10)
    return fig


def _row(i: int, e: ServeEstimate, price: float | None) -> str:
    m = e.metrics
    cost = e.cost_per_million(price)
    cells = [str(i), e.plan.describe(), fmt_count(m.tokens_per_s), fmt_count(e.tokens_per_s_per_gpu),
             fmt_time(m.ttft), fmt_time(m.tpot), fmt_time(m.e2e), fmt_bytes(float(e.memory.total)),
             f"${cost:,.3g}" if cost is not None else "-"]
    return "<tr>" + "".join(f'<td{" class=l" if j == 1 else ""}>{html.escape(c)}</td>'
                            for j, c in enumerate(cells)) + "</tr>"


def _table(head: tuple[str, ...], rows: list[str]) -> str:
    th = "".join(f'<th{" class=l" if h in ("configuration", "reason", "for example") else ""}>{html.escape(h)}</th>'
                 for h in head)
    return f"<table><tr>{th}</tr>{''.join(rows)}</table>"


def _best_sections(result: ServeSearchResult, price: float | None) -> list[str]:
    """Cards, the best configurations, the curves, the best one's memory and decode step."""
    best, s, parts = result.plans[0], result.space, []
    m = best.metrics
    cards = {"output tokens/s": fmt_count(m.tokens_per_s), "per GPU": fmt_count(best.tokens_per_s_per_gpu),
             "TTFT": fmt_time(m.ttft), "TPOT": fmt_time(m.tpot), "memory / GPU": fmt_bytes(float(best.memory.total))}
    if price is not None:
        cards["$ / M tokens"] = f"{best.cost_per_million(price):,.3g}"
    parts.append("<div class=cards>" + "".join(f"<div class=card><div class=k>{html.escape(k)}</div>"
                                               f"<div class=v>{html.escape(v)}</div></div>"
                                               for k, v in cards.items()) + "</div>")
    parts.append("<h2>Best configurations</h2>" + _table(COLUMNS, [_row(i, e, price)
                                                                for i, e in enumerate(result.plans, 1)]))
    parts.append("<h2>Throughput against latency</h2>" + _svg(curve_figure(curves(result), s.tpot_slo), "curve"))
    mem = best.memory
    gib = {"weights": mem.weights, "activations": mem.activations, "workspace": mem.workspace,
           "KV cache (batch)": mem.kv_used, "KV pool": mem.kv_pool}
    parts.append("<h2>Memory per GPU of the best</h2>" + _svg(bars_figure(
        {k: float(v) / 2**30 for k, v in gib.items()}, best.plan.describe(), "GiB"), "memory"))
    top = dict(sorted(best.breakdown.items(), key=lambda kv: -kv[1])[:12])
    parts.append("<h2>Decode step by op</h2>" + _svg(bars_figure(
        {k: v * 1e3 for k, v in top.items()}, "the best configuration's token step", "ms"), "step"))
    return parts


def serve_report(result: ServeSearchResult, price: float | None = None) -> str:
    """The page's HTML (module docstring)."""
    s, parts = result.space, []
    title = (f"Serving {result.model.name} on {result.cluster.num_gpus} x {result.cluster.accelerator.name}, "
             f"{s.input_len} in / {s.output_len} out")
    parts.append(f"<h1>{html.escape(title)}</h1><p class=note>engine {html.escape(s.engine.describe())}; "
                 f"{result.evaluated:,} configurations in {result.seconds:.2f} s, {result.feasible:,} feasible</p>")
    if result.plans:
        parts += _best_sections(result, price)
    rows = [f"<tr><td class=l>{html.escape(r)}</td><td>{n:,}</td><td class=l>{html.escape(result.examples.get(r, ''))}"
            f"</td></tr>" for r, n in sorted(result.rejected.items(), key=lambda kv: -kv[1])]
    parts.append("<h2>Rejected</h2>" + _table(("reason", "configs", "for example"), rows))
    return (f"<!DOCTYPE html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><main>{''.join(parts)}</main></body></html>\n")


def write_serve_report(result: ServeSearchResult, path: str | Path, price: float | None = None) -> Path:
    return write_text(path, serve_report(result, price), "report")
