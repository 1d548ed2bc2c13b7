"""Validate meshplan against the published runs and write docs/ACCURACY.md, docs/accuracy.png and
docs/accuracy_summary.json (the figures tests/test_published.py guards; --out DIR writes them to DIR instead).

Run: python benchmarks/docs/accuracy.py [path/to/published_runs.jsonl] [--out DIR]  (needs matplotlib: pip install
'.[plot]') accuracy.png records the SHA-256 of the points it plots (PNG text 'meshplan-inputs'): tests/test_docs.py
compares it with a fresh copy's, as pixels differ between matplotlib versions.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from meshplan_validation.records import runs_from_command_line
from meshplan_validation.render import finite
from meshplan_validation.result import RunResult
from meshplan_validation.selection import in_fit_set
from meshplan_validation.summary import summaries
from meshplan_validation.validate import run_validation

# its sections beside it, the measurements it renders
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "measure")]
import out_of_source_doc  # noqa: E402
import validation_runs  # noqa: E402
from accuracy_analysis import UNITS, korthikanti, pct, pct2  # noqa: E402
from accuracy_doc import write_doc  # noqa: E402
from small_work import training_section  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "data" / "validation" / "published_runs.jsonl"
DOCS = ROOT / "docs"
RUNS = ROOT / "src" / "meshplan" / "presets" / "validation_runs.json"  # read by the report's trust panel



# ---- plot ---------------------------------------------------------------------------------------------------
def plot(results: list[RunResult], path: Path) -> None:
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    ev = [r for r in results if not r.skipped]
    fig, ax = plt.subplots(figsize=(8, 7.5))
    markers = {"iteration_time_s": "o", "tokens_per_s_per_gpu": "s", "tokens_per_s_total": "D",
               "model_tflops_per_gpu": "^", "tflops_per_gpu": "v", "mfu_pct": "P", "hfu_pct": "X", "pct_of_peak": "*"}
    for metric, marker in markers.items():
        for fit, color in ((True, "tab:blue"), (False, "tab:orange")):
            pts = [(r.measured, r.predicted) for r in ev if r.metric == metric and r.in_fit_set == fit]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.scatter(xs, ys, s=16, marker=marker, color=color, alpha=0.7,
                           label=f"{UNITS[metric]} ({'fit half' if fit else 'held-out half'})")
    lo = min(min(r.measured, r.predicted) for r in ev) / 2
    hi = max(max(r.measured, r.predicted) for r in ev) * 2
    line = np.geomspace(lo, hi, 50)
    ax.plot(line, line, "k-", lw=1)
    ax.fill_between(line, line * 0.9, line * 1.1, color="green", alpha=0.15, label="±10 %")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured (in the source's own metric)")
    ax.set_ylabel("predicted by meshplan (same metric)")
    ax.set_title(f"meshplan vs {len(ev)} published training runs")
    ax.legend(fontsize=7, loc="upper left", ncol=2)
    ax.grid(True, which="both", alpha=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"meshplan-inputs": plotted_digest(ev)})
    plt.close(fig)


def plotted_digest(ev: list[RunResult]) -> str:
    """SHA-256 of what the picture plots: each evaluated run's id, metric, half, measured and predicted values."""
    import hashlib

    points = [(r.id, r.metric, r.in_fit_set, r.measured, r.predicted) for r in ev]
    return hashlib.sha256(json.dumps(points).encode()).hexdigest()


def out_option() -> Path:
    """``--out DIR`` (default docs/), taken off the command line before records.runs_from_command_line reads the
    runs file from what is left."""
    args = sys.argv[1:]
    if "--out" not in args[:-1]:
        return DOCS
    at = args.index("--out")
    del sys.argv[at + 1:at + 3]
    return Path(args[at + 1])


def compared_apart(records: list[dict], results: list[RunResult]) -> list[RunResult]:
    """``run_validation(records, hybrid=True)``'s results of the runs ``results`` skipped as compared apart
    (case.HYBRID_SKIP; accuracy_doc.hybrid_section reads those alone), in the file's order: the groups that hold them
    validated again (run_validation's ``group``: each record still takes unstated settings from the whole file's
    siblings), not the whole file a second time (5 groups of 84 runs of 428, for 14); the whole file if one has no
    group."""
    apart = {r.id for r in results if "hybrid Mamba-2 model" in r.skipped}
    groups = sorted({r.group for r in results if r.id in apart})
    parts = [run_validation(records, hybrid=True)] if "" in groups else [
        run_validation(records, group=group, hybrid=True) for group in groups]
    again = {r.id: r for part in parts for r in part}
    return [again[r.id] for r in results if r.id in again]


def main() -> None:
    out = out_option()
    data, records = runs_from_command_line(DATA, __doc__)
    results = run_validation(records)
    summary = summaries(results)
    kor = korthikanti(results)
    mem = [abs(r.memory_error) for r in results if r.memory_error is not None]
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "accuracy.png")
    hybrid = compared_apart(records, results)
    vtrain_oos = [(r["metric"], r["oos_error"]) for r in out_of_source_doc.load()[0]["runs"]
                  if r["source"] == "vtrain" and r["oos_error"] is not None]
    small, small_summary = training_section(results, records, vtrain_oos)  # the small-work regime, reported apart
    (out / "ACCURACY.md").write_text(write_doc(results, summary, kor, records, data, hybrid).rstrip("\n") + "\n"
                                     + "\n".join(small) + "\n")
    machine = {"records": len(records), "overall": summary["overall"], "complete": summary["complete"],
               "in_sample": summary["in_sample"],
               "out_of_sample": summary["out_of_sample"], "groups": summary["groups"],
               "korthikanti": {k: kor[k] for k in ("mean_abs_error", "max_abs_error")},
               "memory": {"median_abs_error": float(np.median(mem)) if mem else None,
                          "max_abs_error": float(max(mem)) if mem else None, "evaluated": len(mem)},
               "fit_half": sum(1 for r in results if in_fit_set(r.id)), "small_work": small_summary,
               "out_of_source": out_of_source_doc.summary(out_of_source_doc.load()[0], "training")}
    (out / "accuracy_summary.json").write_text(json.dumps(finite(machine), indent=1) + "\n")
    validation_runs.write(results, records, RUNS if out == DOCS else out / RUNS.name)
    ov = summary["overall"]
    print(f"evaluated {ov['evaluated']}, skipped {ov['skipped']}: median {pct2(ov['median_abs_error'])}, "
          f"mean {pct(ov['mean_abs_error'])}, p90 {pct(ov['p90_abs_error'])}, max {pct(ov['max_abs_error'])}")
    for name in ("complete", "in_sample", "out_of_sample"):
        s = summary[name]
        print(f"{name:>14}: median {pct(s['median_abs_error'])}, p90 {pct(s['p90_abs_error'])}, "
              f"max {pct(s['max_abs_error'])} ({s['evaluated']} runs)")
    print(f"Korthikanti 2022: mean {pct(kor['mean_abs_error'])}, max {pct(kor['max_abs_error'])}; "
          f"memory median {pct(machine['memory']['median_abs_error'])}; "
          f"{ov['not_fitting']} measured runs predicted not to fit")
    print(f"wrote {out / 'ACCURACY.md'}, {out / 'accuracy.png'}, {out / 'accuracy_summary.json'}")


if __name__ == "__main__":
    main()
