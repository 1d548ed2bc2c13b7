"""Validate the RL composition against published RL runs and write docs/ACCURACY_RL.md: every run's measured phases
(the whole step, the rollout, the weight transfer) against meshplan's prediction of the plan the source states
(meshplan_validation/rl_eval.py), the median and p90 |error| per phase, per set-up and per source, and every run.

Error is predicted / measured − 1. Nothing is fitted on these runs: the training, serving and collectives models are
the ones docs/ACCURACY.md and docs/ACCURACY_INFERENCE.md judge, composed (meshplan/rl/).

Run: python benchmarks/docs/accuracy_rl.py [--out DIR]  (about a minute: each run's rollout is simulated)
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from meshplan_validation.rl_eval import DATA, PhaseResult, evaluate, read_records

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PHASE_WORDS = {"iteration": "whole step (iteration)", "rollout": "rollout (generation)", "sync": "weight transfer",
               "old_log_prob": "old log-probs", "reference": "reference log-probs", "actor_update": "policy update"}


def pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:.0f} %"


def signed(x: float) -> str:
    return "-" if math.isnan(x) else f"{100 * x:+.0f} %"


def stats(rows: Sequence[PhaseResult]) -> tuple[int, float, float, float]:
    """Runs, median and p90 of |error|, median signed error."""
    if not rows:
        return 0, math.nan, math.nan, math.nan
    errors = np.array([r.error for r in rows])
    return len(rows), float(np.median(abs(errors))), float(np.percentile(abs(errors), 90)), float(np.median(errors))


def summary(rows: Sequence[PhaseResult], key: Callable[[PhaseResult], str], title: str) -> list[str]:
    out = [f"| {title} | runs | median \\|error\\| | p90 \\|error\\| | median error |", "|---|---:|---:|---:|---:|"]
    for name in dict.fromkeys(key(r) for r in rows):
        n, median, p90, bias = stats([r for r in rows if key(r) == name])
        out.append(f"| {name} | {n} | {pct(median)} | {pct(p90)} | {signed(bias)} |")
    return out


def run_table(rows: Sequence[PhaseResult], records: dict[str, dict]) -> list[str]:
    out = ["| run | model | GPUs | set-up | phase | measured | predicted | error |",
           "|---|---|---:|---|---|---:|---:|---:|"]
    for r in rows:
        rec = records[r.id]
        model = rec["model"].get("preset") or rec["model"].get("name")
        gpus = f"{rec['hardware']['gpus']} {rec['hardware']['system'].upper()}"
        setup = rec["setup"] + (f" (k={rec['staleness']})" if rec["setup"] != "colocated" else "")
        out.append(f"| {r.id} | {model} | {gpus} | {setup} | {PHASE_WORDS[r.phase]} | {r.measured:,.2f} s | "
                   f"{r.predicted:,.2f} s | {signed(r.error)} |")
    return out


def _ratios(rows: Sequence[PhaseResult]) -> str:
    """measured / predicted over ``rows``, as a range."""
    r = sorted(x.measured / x.predicted for x in rows)
    return f"{r[0]:.1f}" if len(r) == 1 else f"{r[0]:.1f}-{r[-1]:.1f}"


def explained(rows: Sequence[PhaseResult]) -> list[str]:
    """The two findings, with their figures from ``rows``."""
    steps = [r for r in rows if r.phase == "iteration"]
    slow = sum(r.error < 0 for r in steps)
    _, _, _, bias = stats(steps)
    out = [f"- {slow} of {len(steps)} steps are predicted too fast, the median by {pct(-bias)}: the rollout, which "
           "takes most of each step, is priced by the serving model, whose throughput on the published serving runs "
           "is mostly too high (docs/ACCURACY_INFERENCE.md; issue 81's load tests: output tokens/s too high in 97 % "
           "of runs), and the frameworks' own work between the phases (Ray's data movement, the reward function on "
           "the host, the log-probabilities' logits) is not priced."]
    groups = {r.group for r in rows if r.phase == "sync"}
    times = "; ".join(f"`{g}` {_ratios([r for r in rows if r.phase == 'sync' and r.group == g])} times it"
                      for g in sorted(groups))
    out.append("- The weight transfer is priced from its bytes and its calls' latency, each tensor's host work in "
               f"the trainer and in vLLM's loader counted as five kernel launches; the published times are: {times}.")
    return out


def sources(records: Sequence[dict]) -> list[str]:
    seen: dict[str, dict] = {}
    for rec in records:
        seen.setdefault(rec["group"], rec)
    return [f"- `{g}` ({sum(r['group'] == g for r in records)} runs): {rec['source']}; <{rec['source_url']}>"
            for g, rec in seen.items()]


def document(rows: Sequence[PhaseResult], records: Sequence[dict]) -> str:
    by_id = {r["id"]: r for r in records}
    phase = summary(rows, lambda r: PHASE_WORDS[r.phase], "phase")
    setup = summary([r for r in rows if r.phase == "iteration"],
                    lambda r: by_id[r.id]["setup"], "set-up (whole step)")
    group = summary(rows, lambda r: f"{r.group} · {r.phase}", "source · phase")
    text = [
        "# Accuracy of the RL plans: published RL runs, phase by phase",
        "",
        "`python benchmarks/docs/accuracy_rl.py` writes this file: every run of `data/rl/published_rl.jsonl` (RL "
        "step-time breakdowns that others measured and published, with their GPUs, model, lengths, batch, layouts and "
        "set-up; `data/rl/README.md`) is priced by `meshplan.rl.rl_estimate` as its source states it, with the rollout "
        "simulated by the engine's scheduler, and each phase it measured is compared: error = predicted / measured "
        "− 1. No constant is fitted on these runs: the rollout is the serving model's (docs/ACCURACY_INFERENCE.md), "
        "the trainer's phases the training model's (docs/ACCURACY.md), the weight transfer the collectives model's, "
        "composed as meshplan/rl/ states.",
        "",
        f"{len(records)} published runs, {len(rows)} measured phases.",
        "",
        "## Each phase", "", *phase, "",
        "## The whole step by set-up", "", *setup, "",
        "## By source", "", *group, "",
        "## What the errors say",
        "",
        *explained(rows),
        "- NeMo RL's '1-step off' runs are priced as the split set-up with staleness 1 (each step still waits for "
        "its batch's groups, the rollout's tail included); its '8-step off' run as the asynchronous one (a stream, "
        "at the engine's steady rate).",
        "- The trainer's own phases (old log-probs, reference, update) are not validated apart: no source found "
        "states them together with the lengths that set them (verl's recipes print them without the mean response "
        "length; data/rl/README.md, 'Looked at and left out'). They count in the whole step.",
        "",
        "## Sources", "", *sources(records), "",
        "## Every run", "", *run_table(rows, by_id), "",
    ]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    out = DOCS
    if "--out" in args:
        i = args.index("--out")
        out = Path(args[i + 1])
    records = read_records(DATA)
    rows = [r for rec in records for r in evaluate(rec)]
    out.mkdir(parents=True, exist_ok=True)
    (out / "ACCURACY_RL.md").write_text(document(rows, records))
    print("\n".join(summary(rows, lambda r: PHASE_WORDS[r.phase], "phase")))


if __name__ == "__main__":
    main()
