"""The serving report's trust note: how far the serving model was from published serving runs on the GPU generation
it plans for, what that means for the best configuration's throughput, and what the estimate assumed.

The figures are presets/serving_errors.json, which benchmarks/docs/accuracy_inference.py writes beside
docs/ACCURACY_INFERENCE.md (benchmarks/measure/serving_errors.py) and tests/test_docs.py keeps current: the core reads
them as packaged data and never imports meshplan_validation. Errors are predicted / measured − 1 of each run's
throughput; a run's architecture is that of the system preset meshplan prices it on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshplan.report.sections import Section
from meshplan.report.trust import packaged
from meshplan.units import fmt_bytes, fmt_count, fmt_time

if TYPE_CHECKING:
    from meshplan.serve.estimate import ServeEstimate
    from meshplan.serve.search import ServeSearchResult

LATENCY_METRICS = {"ttft_ms": "time to first token (mean)", "itl_ms": "inter-token latency", "tpot_ms": "TPOT (mean)",
           "e2e_latency_ms": "end-to-end latency"}


def errors() -> dict[str, Any]:
    """presets/serving_errors.json (module docstring), read as the training trust panel reads its runs."""
    return packaged("serving_errors.json")


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _row(name: str, s: dict[str, Any]) -> list[str]:
    return [name, f"{s['runs']:,}", _pct(s["median"]), _pct(s["p90"]), f"{100 * s['bias']:+.1f} %"]


def headline(arch: str) -> tuple[str, dict[str, Any] | None]:
    """One sentence on the runs of ``arch`` (or of every architecture, when it has none), and its figures."""
    data = errors()
    entry = data["architectures"].get(arch)
    every = data["overall"]
    if not entry or not entry.get("runs"):
        return (f"No published serving run on {arch} GPUs was evaluated: across all {every['runs']:,} runs of the "
                f"other generations the throughput's median |error| is {_pct(every['median'])}, p90 "
                f"{_pct(every['p90'])}.", None)
    lean = "high" if entry["bias"] > 0 else "low"
    return (f"On {entry['name']} GPUs meshplan's serving model predicted the throughput of {entry['runs']:,} published "
            f"runs with a median |error| of {_pct(entry['median'])} and a p90 of {_pct(entry['p90'])} (the median run "
            f"reads {_pct(abs(entry['bias']))} {lean}); over every generation, {every['runs']:,} runs: median "
            f"{_pct(every['median'])}, p90 {_pct(every['p90'])}.", entry)


def likely(best: ServeEstimate, entry: dict[str, Any] | None) -> str:
    """The best configuration's throughput and what it would measure if the model erred on it as on nine in ten of
    the runs: error e = predicted / measured − 1 with |e| ≤ p90 puts the measurement in
    [p / (1 + p90), p / (1 − p90)]."""
    p = best.metrics.tokens_per_s
    band = (entry or errors()["overall"])["p90"]
    high = f"{fmt_count(p / (1 - band))}" if band < 1 else "unbounded"
    return (f"The best configuration's {fmt_count(p)} output tokens/s would measure between "
            f"{fmt_count(p / (1 + band))} and {high} if the model erred on it as on nine in ten of those runs.")


def host_terms(engine: Any) -> str:
    """The engine's host time per iteration in words: fixed, per sequence, per sequence beside the GPU's step, and the
    iteration's GPU work after the forward pass (Engine.iteration_latency)."""
    terms = [fmt_time(engine.iteration_overhead)] if engine.iteration_overhead else []
    if engine.sequence_overhead:
        terms.append(f"{fmt_time(engine.sequence_overhead)} a sequence")
    if engine.hidden_sequence_overhead:
        terms.append(f"{fmt_time(engine.hidden_sequence_overhead)} a sequence beside the GPU's step")
    if engine.iteration_latency:
        terms.append(f"{fmt_time(engine.iteration_latency)} of GPU work after the forward pass")
    return " + ".join(terms) or "none"


def engine_note(best_engine: Any) -> str:
    found = errors()["engines"].get(best_engine.name)
    host = host_terms(best_engine)
    if found:
        return (f"Published runs on the {best_engine.name} engine: {found['runs']:,}, median |error| "
                f"{_pct(found['median'])}, p90 {_pct(found['p90'])}; its host time per iteration: {host}.")
    return (f"No published run on the {best_engine.name} engine was evaluated: its host time per iteration ({host}) is "
            "checked against no published run.")


def serving_assumptions(result: ServeSearchResult, best: ServeEstimate | None) -> list[tuple[str, str]]:
    """(assumption, where it lives) for this search and its best configuration."""
    s, e, cluster = result.space, result.space.engine, result.cluster
    cache = (f"{s.cached_len} of its prompt tokens found in the prefix cache" if s.cached_len
             else "no prefix caching")
    out = [(f"continuous batching in steady state: every request {s.input_len} prompt and {s.output_len} output tokens "
            f"(means: no length distribution, no queueing before admission, {cache}, no speculative decoding)",
            "serve/metrics.py"),
           (f"the {e.describe()} engine: KV pages of {e.block_size} tokens, {e.memory_utilization:.0%} of the "
            f"{e.memory_basis} HBM, {e.prefill} prefill of up to {e.max_batched_tokens:,} tokens per iteration, "
            f"max_seqs {e.max_seqs:,}, workspace {fmt_bytes(e.workspace)}", f"presets/engines/{e.name}.toml"),
           ("kernel rates from meshplan's serving efficiency curves (a decode GEMM bound by its weights' bytes, decode "
            "attention streaming the KV cache), not measured on your GPUs", "serve/efficiency.py"),
           (f"collectives priced α + n·β with the {cluster.name} preset's links (NVLink "
            f"{fmt_bytes(cluster.accelerator.nvlink_bandwidth)}/s per GPU, domain of {cluster.nvlink_domain})",
            "collectives/comm.py")]
    if result.model.is_moe:
        out.append(("tokens routed uniformly over the experts (real routers load them unevenly: the fitted rate of "
                    "the MoE path absorbs the average)", "serve/moe.py, serve/efficiency.py"))
    if best is not None and best.plan.disaggregated:
        out.append(("the prompt's KV cache sent from a prefill to a decode instance once, over the network, before "
                    "the first token", "serve/metrics.py (kv_transfer)"))
    return out


def serving_trust_section(result: ServeSearchResult) -> Section:
    """The trust note (module docstring)."""
    arch = result.cluster.accelerator.architecture or "unstated"
    text, entry = headline(arch)
    best = result.plans[0] if result.plans else None
    sources = [_row(g, s) for g, s in (entry or {}).get("sources", {}).items()]
    latency = [_row(LATENCY_METRICS.get(m, m), s) for m, s in (entry or {}).get("latency", {}).items()]
    return Section("trust", "Trust", "sections/serve_trust.html.j2", {
        "headline": text, "likely": likely(best, entry) if best else "", "engine": engine_note(result.space.engine),
        "sources": sources, "latency": latency, "assumptions": serving_assumptions(result, best),
        "name": (entry or {}).get("name", arch)})
