"""docs/MEASURED_GPU.md from the zoo run check-step made on a lent GPU (data/measured/gpu/*-zoo.jsonl.gz, written by
``benchmarks/docs/measured.py --device cuda``): predicted against measured per model and per op class, and where the
step's time goes. No GPU needed: every figure comes from the committed step and op records (measure/records.py).

    python benchmarks/docs/measured_gpu_doc.py                       # the newest data/measured/gpu/*-zoo.jsonl.gz
    python benchmarks/docs/measured_gpu_doc.py --data FILE --doc OUT

Stored figures are reported as the run wrote them. The peak memory is also re-predicted from the stored records:
the run's predicted peak plus the cuBLAS / cuBLASLt workspaces (measure/blas_workspace.py) that check-step adds
on a GPU since (the term is added to every branch of the peak's max, so stored + term is exactly what check-step
predicts now). tests/test_docs.py renders the committed file again and compares.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))

from meshplan.measure.blas_workspace import calls_of_records, capability_of, resident_workspace  # noqa: E402
from meshplan.measure.records import read_profiles  # noqa: E402
from meshplan.units import fmt_bytes, fmt_count  # noqa: E402

DOC = ROOT / "docs" / "MEASURED_GPU.md"
DATA = ROOT / "data" / "measured" / "gpu"
MiB = 2**20


def newest_data() -> Path:
    files = sorted(DATA.glob("*-zoo.jsonl.gz"))
    if not files:
        raise SystemExit(f"no *-zoo.jsonl.gz under {DATA}")
    return files[-1]


def _pct(x: float) -> str:
    return f"{x:+.1%}"


def _ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def capability(step: dict[str, Any]) -> tuple[int, int]:
    """The GPU's compute capability: the machine record's (check-step writes it since the workspace term), else
    from its name."""
    text = step["machine"].get("capability")
    if text:
        major, minor = text.split(".")
        return int(major), int(minor)
    cap = capability_of(step["machine"]["name"])
    if cap is None:
        raise SystemExit(f"{step['machine']['name']}: compute capability unknown (no 'capability' in the record)")
    return cap


def by_model(records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    ops: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        if r["record"] == "op":
            ops.setdefault(r["model"], []).append(r)
    return [(s, ops.get(s["model"], [])) for s in records if s["record"] == "step"]


def peak_rows(models: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]]) -> tuple[list[str], list[float],
                                                                                      list[float]]:
    """The per-model table of step time and peak memory; the peak errors before and after the workspace term."""
    lines = ["| model | params | aten ops | kernels | step predicted (ms) | measured (ms) | error | peak predicted "
             "without workspaces | + BLAS workspaces | peak measured | error without | error with | unexplained |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    before, after = [], []
    for s, ops in models:
        term = resident_workspace(calls_of_records(ops), capability(s))
        pred, meas = s["predicted_peak_bytes"], s["measured_peak_bytes"]
        if "capability" in s["machine"]:  # check-step wrote it with the term already in its prediction
            pred -= term
        before.append(pred / meas - 1)
        after.append((pred + term) / meas - 1)
        lines.append(f"| {s['model']} | {fmt_count(s['params'])} | {s['ops']} | {s['kernels']} | "
                     f"{_ms(s['predicted_s'])} | {_ms(s['measured_s'])} | "
                     f"{_pct(s['predicted_s'] / s['measured_s'] - 1)} | {fmt_bytes(pred)} | {term / MiB:.0f} MiB | "
                     f"{fmt_bytes(meas)} | {_pct(before[-1])} | "
                     f"{_pct(after[-1])} | {(meas - pred - term) / MiB:.2f} MiB |")
    return lines, before, after


def class_rows(models: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]]) -> list[str]:
    """Per op class over every model: replayed (each op alone, synchronised) against the same ops timed inside the
    step (profile.py, synchronised per op)."""
    acc: dict[str, list[float]] = {}
    for _, ops in models:
        for r in ops:
            if r["measured_s"] is None:
                continue
            a = acc.setdefault(r["cls"], [0.0, 0.0, 0.0, 0.0])
            a[0] += 1
            a[1] += r["launches"]
            a[2] += r["replay_s"]
            a[3] += r["measured_s"]
    lines = ["| op class | ops | kernels | replayed (ms) | in step (ms) | in step / replayed | replayed per op (µs) "
             "| in step per op (µs) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for cls, (n, k, rep, meas) in sorted(acc.items(), key=lambda kv: -kv[1][3]):
        lines.append(f"| {cls} | {n:.0f} | {k:.0f} | {_ms(rep)} | {_ms(meas)} | {meas / rep:.2f} | "
                     f"{rep / n * 1e6:.1f} | {meas / n * 1e6:.1f} |")
    return lines


def timelines(step: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, float]:
    """The step's time split by what the records hold (seconds): hostbound.py's split, with the host time of ops
    that launch no kernel (views) kept apart."""
    d = step["host_costs"]["dispatch"]
    launched = [r for r in ops if r["launches"]]
    out = {"measured": step["measured_s"], "replayed": sum(r["replay_s"] for r in ops), "host": step["host_s"],
           "dispatch": d * sum(r["launches"] for r in launched),
           "views": sum(r["replay_s"] for r in ops if not r["launches"]),
           "gpu": sum(max(r["replay_s"] - d * r["launches"], 0.0) for r in launched)}
    out["host_line"] = out["host"] + out["dispatch"] + out["views"]
    out["unexplained"] = out["measured"] - max(out["host_line"], out["gpu"])
    if step.get("host_cpu_s"):  # measured since step.py records it: the host's own timeline, not a model of it
        out["host_cpu"] = statistics.median(step["host_cpu_s"])
    return out


def timeline_rows(models: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]]) -> tuple[list[str], list[float]]:
    cpu = any(s.get("host_cpu_s") for s, _ in models)
    lines = ["| model | measured | Σ replayed (the prediction) | autograd + engine + modules | dispatch × kernels | "
             "views (replayed) | host timeline | GPU timeline | unexplained host time | per op (µs) |"
             + (" host CPU time measured |" if cpu else ""), "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
             + ("---:|" if cpu else "")]
    shares = []
    for s, ops in models:
        t = timelines(s, ops)
        shares.append(t["unexplained"] / t["measured"])
        lines.append(f"| {s['model']} | {_ms(t['measured'])} | {_ms(t['replayed'])} | {_ms(t['host'])} | "
                     f"{_ms(t['dispatch'])} | {_ms(t['views'])} | {_ms(t['host_line'])} | {_ms(t['gpu'])} | "
                     f"{_ms(t['unexplained'])} | {t['unexplained'] / len(ops) * 1e6:.1f} |"
                     + ((f" {_ms(t['host_cpu'])} |" if "host_cpu" in t else " – |") if cpu else ""))
    return lines, shares


def python_rows(models: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]], calls: dict[str, Any],
                ) -> tuple[list[str], list[float]]:
    """The unexplained host time against the Python calls of each model's step (benchmarks/measure/python_calls.py), and
    the step if the host paid a cost per Python call fitted on the other models (least squares through zero)."""
    rows = [(s, timelines(s, ops), calls["models"][s["model"]]["call"]) for s, ops in models
            if s["model"] in calls["models"]]
    lines = ["| model | Python calls per step | unexplained per call (µs) | per call, fitted on the others (µs) | "
             "step with it (ms) | error | stored error |", "|---|---:|---:|---:|---:|---:|---:|"]
    errors = []
    for s, t, n in rows:
        others = [(u["unexplained"], m) for r, u, m in rows if r is not s]
        per_call = sum(g * m for g, m in others) / sum(m * m for _, m in others)
        step = max(t["host_line"] + per_call * n, t["gpu"])
        errors.append(step / t["measured"] - 1)
        lines.append(f"| {s['model']} | {n} | {t['unexplained'] / n * 1e6:.2f} | {per_call * 1e6:.2f} | {_ms(step)} | "
                     f"{_pct(errors[-1])} | {_pct(s['predicted_s'] / s['measured_s'] - 1)} |")
    return lines, errors


def _summary(errors: list[float]) -> str:
    a = sorted(abs(e) for e in errors)
    return f"median |error| {statistics.median(a):.1%}, largest {a[-1]:.1%}"


def python_section(models: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]], calls: dict[str, Any] | None,
                   ) -> list[str]:
    if not calls:
        return []
    table, errors = python_rows(models, calls)
    per = sorted((timelines(s, ops)["unexplained"] / calls["models"][s["model"]]["call"], s["model"])
                 for s, ops in models if s["model"] in calls["models"])
    (low, _), (high, _), (worst, outlier) = per[0], per[-2], per[-1]
    return [
        "## The missing host time follows the step's Python calls",
        "",
        f"Python function calls per step counted on a CPU (`{calls['made_by']}`: `sys.setprofile`, PyTorch "
        f"{calls['torch']}, transformers {calls['transformers']}; the GPU run had PyTorch "
        f"{models[0][0]['machine']['torch']}), against the unexplained host time above. Each model's step is then "
        "predicted with a host cost per Python call fitted on the other models (leave one out), added to the host's "
        "timeline:",
        "",
        *table,
        "",
        f"With it: {_summary(errors)} (stored: {_summary([s['predicted_s'] / s['measured_s'] - 1 for s, _ in models])}"
        f"). The unexplained time comes to {low * 1e6:.1f} to {high * 1e6:.1f} µs per Python call on all models "
        f"but {outlier} ({worst * 1e6:.1f} µs: not explained here). "
        "A figure fitted on the data it is judged on is a diagnosis, not a prediction: check-step does not use it "
        "(the step record's `host_cpu_s` measures the host's timeline on the next GPU run instead).",
        "",
    ]


def glue_section(models: Sequence[tuple[dict[str, Any], list[dict[str, Any]]]], glue: dict[str, Any] | None,
                 ) -> list[str]:
    """The GPU prediction with the step's Python glue (measure/glue.py) measured on a CPU host and added to the
    host's timeline as predict.py now does: max(GPU, host + glue − module calls × module)."""
    if not glue and not any(s.get("glue") for s, _ in models):
        return []
    glue = glue or {"models": {}}
    rows = ["| model | measured (ms) | stored prediction | error | GPU timeline | host timeline | glue | "
            "glue − module calls | predicted with the glue | error |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    errors = []
    for s, ops in models:
        g = s.get("glue") or glue["models"].get(s["model"])  # the run's own host's glue where it measured it
        if g is None:
            continue
        t = timelines(s, ops)
        extra = max(g["glue_s"] - s["module_calls"] * s["host_costs"]["module"], 0.0)
        pred = max(t["gpu"], t["host_line"] + extra)
        errors.append(pred / s["measured_s"] - 1)
        rows.append(f"| {s['model']} | {_ms(s['measured_s'])} | {_ms(s['predicted_s'])} | "
                    f"{_pct(s['predicted_s'] / s['measured_s'] - 1)} | {_ms(t['gpu'])} | {_ms(t['host_line'])} | "
                    f"{_ms(g['glue_s'])} | {_ms(extra)} | {_ms(pred)} | {_pct(errors[-1])} |")
    stored = [s["predicted_s"] / s["measured_s"] - 1 for s, _ in models
              if s.get("glue") or s["model"] in glue["models"]]
    own = all(s.get("glue") for s, _ in models)
    where = ("This run's records hold the glue its own host measured (the GPU machine's Xeon, PyTorch "
             "2.11.0+cu130), and its stored prediction already adds it: the columns agree." if own else
             "The GPU records above predate it, so the glue here was measured on another machine's CPU: "
             f"{glue.get('machine')}, {glue.get('cores')} cores, one thread, PyTorch {glue.get('torch')}, on "
             f"{glue.get('date')} (`benchmarks/measure/cpu_glue.py`, AdamW foreach as torch.optim picks on a GPU); the "
             "GPU run's host was a Xeon of 16 vCPUs, PyTorch 2.11.0+cu130.")
    return [
        "## The step's Python glue, measured on " + ("the GPU's host" if own else "a CPU host"),
        "",
        "check-step measures the host time the step's own Python spends between its top-level torch calls "
        "(measure/glue.py: a `TorchFunctionMode` notes the gaps between calls and the calls that reach no aten op, "
        "then takes out its own cost per call, measured on loops of known glue) and adds it to the host's timeline, "
        f"less the module calls host.py already prices (predict.py). {where} Nothing is fitted to the GPU's steps. "
        "The timelines are the section above's (ms).",
        "",
        *rows,
        "",
        f"With the glue: {_summary(errors)} (stored: {_summary(stored)})."
        + ("" if own else " The next GPU run stores the glue its own host measured (`glue` in the step record) "
                          "and predicts with it."),
    ]


def render(records: list[dict[str, Any]], data: Path | str, calls: dict[str, Any] | None = None,
           glue: dict[str, Any] | None = None) -> str:
    models = by_model(records)
    if not models:
        raise SystemExit(f"{data}: no step records")
    first = models[0][0]
    mach, cap = first["machine"], capability(first)
    peaks, before, after = peak_rows(models)
    steps = [s["predicted_s"] / s["measured_s"] - 1 for s, _ in models]
    timeline, shares = timeline_rows(models)
    bound = sum(t["host_line"] >= t["gpu"] for t in (timelines(s, ops) for s, ops in models))
    host = first["host_costs"]
    lines = [
        "# Measured on a GPU: check-step's prediction against the real step",
        "",
        f"Generated by `python benchmarks/docs/measured_gpu_doc.py` from `{Path(data).as_posix()}` (do not edit by "
        "hand). The data file is `benchmarks/docs/measured.py --device cuda` run on a lent GPU "
        "(data/measured/gpu/README.md); every figure below comes from its step and op records, so no GPU is needed to "
        "render it. The CPU's run: [MEASURED.md](MEASURED.md); the method: [MEASURE.md](MEASURE.md).",
        "",
        f"Machine: {mach['name']} (compute capability {cap[0]}.{cap[1]}), host with {mach['cores']} vCPUs, "
        f"PyTorch {mach['torch']}, Python {mach['python']}; measured on {first['date']}, {len(models)} models of "
        "`meshplan_research.zoo`, one training step each (forward, backward, AdamW), the wall clock after a "
        f"device synchronisation, median of {statistics.median(len(s['steps_s']) for s, _ in models):.0f} "
        "steps.",
        "",
        "## Per model",
        "",
        "Step time and kernels as the run stored them. Peak memory: the prediction without the cuBLAS workspaces "
        "(as runs before the term stored it), the cuBLAS / cuBLASLt workspaces check-step now adds on a GPU "
        "(measure/blas_workspace.py, recomputed from the op records: one "
        "cuBLAS workspace per thread that runs a GEMM, the caller's and the autograd engine's device thread, plus "
        "cuBLASLt's for a Linear with a bias), and the measured `torch.cuda.max_memory_allocated`.",
        "",
        *peaks,
        "",
        f"Step time: {_summary(steps)}, every model too fast. Peak memory without the workspaces "
        f"{_summary(before)}; with the workspace term {_summary(after)}. What is left (the last column) is whole "
        "MiB on the models without a "
        "biased Linear (LLaMA, Mistral, T5: 2 to 4 MiB) and under 1 MiB on GPT-2, ResNet-50 and ConvNeXt: blocks the "
        "caching allocator hands out larger than asked (a cached block is not split when less than 1 MiB would "
        "remain, c10/cuda/CUDACachingAllocator.cpp `should_split`, and max_memory_allocated counts the block) "
        "or tensors the trace does not see; not modelled.",
        "",
        "## Per op class, all models together",
        "",
        "Each op replayed alone (replay.py: a synchronisation before and after, so its time is the host's issue "
        "plus the GPU's latency and kernel) against the same op timed inside the real step (profile.py, also "
        "synchronised per op). Ops that launch no kernel (views) are host work only.",
        "",
        *class_rows(models),
        "",
        "## Where the step's time goes",
        "",
        ("The stored prediction is max(GPU timeline, host timeline + glue) (predict.py; the glue below). "
         if all(st.get("glue") for st, _ in models) else
         "The stored prediction (check-step before the glue, below) is max(Σ replayed, host) with host = "
         "autograd + engine + modules + dispatch × kernels; Σ replayed always wins. ")
        + "Split as measure/hostbound.py does (ms): the host's timeline = autograd + engine + modules (host.py) + "
        f"dispatch per kernel ({host['dispatch'] * 1e6:.1f} µs, a `torch.ops` call on this host) + the replayed "
        "time of the ops that launch no kernel; the GPU's = Σ (replayed − dispatch) over the ops that launch one "
        "(an upper bound: it still holds the synchronisation's round trip). Unexplained: measured − the longer of "
        "the two.",
        "",
        *timeline,
        "",
        f"The host's timeline is the longer on {bound} of {len(models)} models, and the step still spends "
        f"{min(shares):.0%} to {max(shares):.0%} of its measured time in host work no record holds. Σ replayed "
        "reads closer to the measured step only because it adds, op after op, the host's issue and the GPU's "
        "latency that a real step overlaps: taken as the GPU's timeline it counts the host's dispatch twice "
        "(predict.py against hostbound.py). The op records locate part of the missing host time: inside the step "
        "an op takes 1.3 to 2.8 times its replayed time (the table above; views 2.8 times), though the kernels "
        "are the same: the host's path through the Python binding, the dispatcher and the CUDA driver runs cold "
        "there, after the model's own Python, where replay calls each op again and again from a warm loop (part "
        "of the ratio is the timing mode's own: profile.py). The rest is Python between ops (the modules' "
        "forward bodies beyond `nn.Module.__call__`, which host.py prices at "
        f"{host['module'] * 1e6:.2f} µs a call; the optimizer's per-parameter lists; `zero_grad`): on a CPU it hides "
        "in the kernels' time (MEASURED.md), on this GPU it is the share above. No microbenchmark of one op "
        "sees it; check-step now records each timed step's host CPU time before its final synchronisation "
        "(step.py, `host_cpu_s` in the step record), so that the next GPU run measures the host's timeline itself "
        "(a last column of this table when the data file holds it).",
        "",
        *python_section(models, calls),
        *([""] + glue_section(models, glue) if glue else []),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="the GPU zoo data file (default: the newest "
                        "under data/measured/gpu)")
    parser.add_argument("--doc", default=str(DOC))
    args = parser.parse_args(argv)
    data = Path(args.data) if args.data else newest_data()
    data = (data if data.is_absolute() else ROOT / data).resolve()
    found = sorted(data.parent.glob("*-python-calls.json"))
    calls = json.loads(found[-1].read_text()) if found else None
    glues = sorted((ROOT / "data" / "measured").glob("*-cpu-glue.json"))  # benchmarks/measure/cpu_glue.py
    glue = json.loads(glues[-1].read_text()) if glues else None
    text = render(read_profiles(data), data.relative_to(ROOT) if data.is_relative_to(ROOT) else data, calls, glue)
    Path(args.doc).write_text(text)
    print(f"wrote {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
