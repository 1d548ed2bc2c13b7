"""The request-level simulation (meshplan/serve/load/) against the published serving runs that state a request
rate: TensorRT-LLM 0.14's "Online Serving Measurements" (data/serving/published_serving.jsonl, group
``trtllm_serving_v0.14``: Llama 3.1 8B / 70B on H100 and H200, TP 1 or 4, 500 requests of 467/256, 467/16 or 202/214
tokens offered at QPS 2-32 and all at once; the page prints mean TTFT, mean ITL, req/s and output tokens/s, no
percentile). Each run as serving_map.case_of reads it (engine preset of its version, Triton's separate prefill, the
plan at the engine's largest batch as serving_eval.largest_batch finds it); arrivals Poisson at the stated rate
(the page does not state the process: an assumption), or all 500 at once for QPS = INF; each metric the mean over
seeds 0-4 (one 500-request sample's mean gap strays by 1/sqrt(500) = 4.5 % from 1/rate).

Printed: per run, measured vs simulated, and per metric the median and p90 of |simulated / measured − 1|, beside the
validation's prediction (serving_eval.predict: the same simulation for a run offered a rate, the burst's
queue for one offered all at once) for the same runs.

Then the load tests that print percentiles (data/serving/load_tests.jsonl: SGLang v0.3.0 and vLLM v0.6.0 at 4 and 8
ShareGPT requests/s; GPUStack's performance lab, vLLM 0.10-0.11, SGLang 0.5 and TensorRT-LLM 1.x on A100, H100 and
H200 with every request at once or 4 clients), each statistic the source printed (mean, p50, p90, p95, p99 of TTFT,
TPOT, ITL, E2E, and output tokens/s) against the simulation's: benchmarks/measure/load_tests_percentiles.py says how
each workload is rebuilt.

Run: python benchmarks/measure/serve_load_published.py [--check]   (--check: the check split only)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from meshplan.serve.load.lengths import Lengths
from meshplan.serve.load.run import load_instance, repeated
from meshplan_validation.serving_eval import TRANSIENT_SEEDS, largest_batch, predict
from meshplan_validation.serving_map import case_of

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the module beside this script
from load_tests_percentiles import Compared, compared, ordered, summary  # noqa: E402

DATA = Path(__file__).resolve().parents[2] / "data" / "serving" / "published_serving.jsonl"
GROUP = "trtllm_serving_v0.14"
METRICS = ("ttft_ms", "itl_ms", "requests_per_s", "output_tokens_per_s")
SEEDS = TRANSIENT_SEEDS


def records(check_only: bool = False) -> list[dict]:
    rows = [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]
    return [r for r in rows if r["group"] == GROUP and (not check_only or r.get("split") == "check")]


def simulated(record: dict) -> dict[str, float] | None:
    """The run's metrics from the simulation (serve/load/run.repeated: the validation's own recipe), or None when
    serving_map skips it. A run offered a rate is the validation's prediction itself: serving_eval.predict prices it
    by this recipe (its _transient: the same instance, rate, requests, lengths and seeds) and keeps it (memoised), so
    it is not simulated twice; a run offered all at once (QPS = INF), which predict prices as a burst's queue, is
    simulated here."""
    case = case_of(record)
    if isinstance(case, str):
        return None
    w = record["workload"]
    if case.mode == "rate" and w.get("request_rate") and w.get("num_requests"):
        metrics = predict(case)[0]
        return {m: metrics[m] for m in METRICS}
    inp, out = case.workload.input_len, case.workload.output_len
    plan = case.plan.with_(batch=int(largest_batch(case)))
    built = load_instance(case.model, case.cluster, plan, case.engine, inp + out)
    rate = w.get("request_rate") or np.inf  # QPS = INF: every request at once, one draw (nothing is random)
    r = repeated(built, rate, w["num_requests"], Lengths("fixed", inp, out), SEEDS if rate < np.inf else SEEDS[:1])
    return {"ttft_ms": 1e3 * r.mean["ttft"], "itl_ms": 1e3 * r.mean["itl"], "requests_per_s": r.requests_per_s,
            "output_tokens_per_s": r.output_tokens_per_s}


def steady(record: dict) -> dict[str, float] | None:
    case = case_of(record)
    return None if isinstance(case, str) else predict(case)[0]


def errors(rows: list[dict]) -> dict[str, dict[str, list[float]]]:
    """Per model ("simulated", "steady") and metric, the runs' predicted / measured − 1; each run printed."""
    out: dict[str, dict[str, list[float]]] = {"simulated": {m: [] for m in METRICS},
                                              "steady": {m: [] for m in METRICS}}
    print(f"{'run':<52}" + "".join(f"{m:>24}" for m in METRICS))
    for r in rows:
        sim, ss = simulated(r), steady(r)
        if sim is None or ss is None:
            continue
        cells = []
        for m in METRICS:
            measured = r["measured"].get(m)
            if not isinstance(measured, (int, float)) or not measured:
                cells.append(f"{'-':>24}")
                continue
            out["simulated"][m].append(sim[m] / measured - 1)
            out["steady"][m].append(ss[m] / measured - 1)
            cells.append(f"{measured:>9.4g} {sim[m]:>6.4g} {ss[m]:>6.4g}")
        print(f"{r['id'].removeprefix('trtllm014srv_'):<52}" + "".join(cells))
    return out


def load_tests() -> tuple[dict[tuple[str, str], np.ndarray], list[Compared]]:
    """Each load test printed (printed / simulated per statistic), and per (metric, statistic) the |error| p50 / p90
    and bias over them (load_tests_percentiles.py); returned per (metric, statistic), with the runs compared."""
    rows = compared()
    done = [c for c in rows if isinstance(c, Compared)]
    print(f"\nload tests (data/serving/load_tests.jsonl): {len(done)} of {len(rows)} runs simulated; "
          "each cell printed / simulated")
    for c in rows:
        if isinstance(c, str):
            print(c)
            continue
        cells = "  ".join(f"{m.removesuffix('_ms')[:6]} {st} {c.printed[(m, st)]:.4g}/{c.simulated[(m, st)]:.4g}"
                          for m, st in ordered(c.printed))
        print(f"{c.id:<58}{cells}")
    table = summary(done)
    for key in ordered(table):
        a = np.abs(table[key])
        print(f"{key[0]:<22}{key[1]:<6}{len(a):>4} runs  |err| p50 {np.median(a):>7.1%}  p90 "
              f"{np.percentile(a, 90):>7.1%}  bias {np.median(table[key]):>+7.1%}")
    return table, done


def by_source(rows: list[Compared]) -> list[str]:
    """The medians (and output tokens/s) per source group and engine: one markdown row each."""
    keys = (("ttft_ms", "p50"), ("tpot_ms", "p50"), ("itl_ms", "p50"), ("ttft_ms", "p99"), ("output_tokens_per_s",
                                                                                          "mean"))
    out = []
    for group, engine in sorted({(c.group, c.engine.split()[0]) for c in rows}):
        table = summary([c for c in rows if c.group == group and c.engine.split()[0] == engine])
        cells = [(f"{len(table[k])}: {np.median(np.abs(table[k])) * 100:.0f} % ({np.median(table[k]) * 100:+.0f} %)"
                  if k in table else "-") for k in keys]
        out.append(f"| {group} | {engine} | " + " | ".join(cells) + " |")
    return out


def _cells(errors: list[float]) -> str:
    e = np.asarray(errors)
    a = np.abs(e)
    return (f"{len(e)} | {np.median(a) * 100:.1f} % | {np.percentile(a, 90) * 100:.1f} % | {np.median(e) * 100:+.1f} %"
            if len(e) else "0 | - | - | -")


def markdown_section() -> list[str]:
    """docs/ACCURACY_INFERENCE.md's section (benchmarks/docs/accuracy_inference.py writes it): the same figures as
    main() prints, as two tables; the per-run lines are left to this script's own output."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        table, tests = errors(records()), load_tests()
    lines = ["## Under load (`serve --rate`, the request-level simulation)", "",
             f"`python benchmarks/measure/serve_load_published.py` runs each published run that states a request rate "
             f"through the simulator (serve/load/; {len(SEEDS)} seeds of Poisson arrivals, an assumption: the sources "
             "do not state the process). TensorRT-LLM 0.14's online serving runs (means; beside them the validation's "
             "prediction of the same runs, serving_eval.predict: the same simulation where a rate is offered):", "",
             r"| metric | runs | simulated p50 \|error\| | p90 | bias | validation p50 \|error\| | p90 | bias |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m in METRICS:
        steady_cells = _cells(table["steady"][m]).split(" | ", 1)[1]
        lines.append(f"| {m} | {_cells(table['simulated'][m])} | {steady_cells} |")
    tests, done = tests
    groups = sorted({c.group for c in done})
    lines += ["", f"The load tests that print percentiles (data/serving/load_tests.jsonl, {len(done)} runs from "
              f"{len(groups)} source groups: {', '.join(groups)}; benchmarks/measure/load_tests_percentiles.py says "
              "how each workload is rebuilt). Each statistic the source printed, simulated against printed; nothing is "
              "fitted on these runs:", "",
              r"| metric | statistic | runs | p50 \|error\| | p90 | bias |", "|---|---|---:|---:|---:|---:|"]
    lines += [f"| {m} | {st} | {_cells(list(tests[(m, st)]))} |" for m, st in ordered(tests)]
    lines += ["", r"By source and engine (runs: median \|error\| (median signed error)):", "",
              "| group | engine | TTFT p50 | TPOT p50 | ITL p50 | TTFT p99 | output tokens/s |",
              "|---|---|---|---|---|---|---|", *by_source(done)]
    return lines + [""]


def main() -> None:
    rows = records("--check" in sys.argv)
    print(f"{GROUP}: {len(rows)} runs; each cell: measured, simulated, validation's prediction")
    table = errors(rows)
    print(f"\n{'metric':<22}{'runs':>6}{'simulated |err| p50':>22}{'p90':>8}{'bias':>8}"
          f"{'valid. |err| p50':>20}{'p90':>8}{'bias':>8}")
    for m in METRICS:
        row = f"{m:<22}{len(table['simulated'][m]):>6}"
        for kind in ("simulated", "steady"):
            e = np.asarray(table[kind][m])
            if not len(e):
                row += f"{'-':>22}{'-':>8}{'-':>8}"
                continue
            a = np.abs(e)
            row += f"{np.median(a):>21.1%}{np.percentile(a, 90):>8.1%}{np.median(e):>+8.1%}"
        print(row)
    load_tests()


if __name__ == "__main__":
    main()
