"""vTrain's released single-node runs in the small-work regime (issue 79): data/validation/vtrain_single_node_dev.jsonl,
720 runs of four of the eight small GPTs vTrain measured (Megatron-DeepSpeed on one 8 x A100 node, tp 1-8, pp 1-4,
micro-batch 1-8, full recompute), reported apart in docs/ACCURACY.md's "Small-work regime": |error| overall, by
tensor-parallel size and by model (one choice is made with this set in view, its passes priced from an empty queue:
meshplan_validation/fitted.py; the out-of-source row prices them without it), and the sweeps
of equal work (benchmarks/measure/small_work_sweeps.py: per model, GPU count and global batch, the Spearman rank
correlation and the regret of meshplan's pick). ``python benchmarks/measure/small_work_vtrain.py`` prints the section.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshplan_validation.records import read_runs
from meshplan_validation.result import RunResult
from meshplan_validation.validate import run_validation
from small_work_common import STATS_HEAD, stats, stats_row
from small_work_sweeps import pooled, sweep_metrics, sweeps

ROOT = Path(__file__).resolve().parents[2]
VTRAIN = ROOT / "data" / "validation" / "vtrain_single_node_dev.jsonl"


def _stats_of(rows: Sequence[RunResult]) -> dict[str, Any]:
    return stats([(r.metric, r.error) for r in rows if not r.skipped and r.error is not None])


def vtrain_results(path: Path = VTRAIN) -> tuple[list[dict[str, Any]], list[RunResult]]:
    records = read_runs(path)
    return records, run_validation(records)


def by(records: Sequence[dict[str, Any]], results: Sequence[RunResult], key: Any) -> dict[Any, list[RunResult]]:
    """The results grouped by ``key(record)``."""
    rec = {str(r["id"]): r for r in records}
    out: dict[Any, list[RunResult]] = {}
    for r in results:
        out.setdefault(key(rec[r.id]), []).append(r)
    return dict(sorted(out.items()))


def vtrain_section(records: Sequence[dict[str, Any]] | None = None, results: Sequence[RunResult] | None = None,
                   oos: Sequence[tuple[str, float]] = ()) -> tuple[list[str], dict[str, Any]]:
    """The ACCURACY.md subsection and its summary entry; ``oos``: vTrain's (metric, error) out of source (the
    registry's choices made with them in view at their priors: benchmarks/docs/out_of_source.py's rows)."""
    if records is None or results is None:
        records, results = vtrain_results()
    tp = by(records, results, lambda r: r["parallel"]["tp"])
    model = by(records, results, lambda r: (r["model"]["num_layers"], r["model"]["hidden_size"]))
    metrics = [sweep_metrics(s) for s in sweeps(records, results)]
    summary = {"all": _stats_of(results), "out_of_source": stats(list(oos)),
               "by_tp": {str(k): _stats_of(v) for k, v in tp.items()},
               "by_model": {f"{k[0]}x{k[1]}": _stats_of(v) for k, v in model.items()}, "sweeps": pooled(metrics)}
    p = summary["sweeps"]
    out = ["", "### vTrain's single-node runs", "",
           f"`data/validation/vtrain_single_node_dev.jsonl`: {len(records)} runs released for issue 79 (four GPTs of "
           "12 or 20 layers, hidden 1024 or 2048, on one 8 x A100 node under Megatron-DeepSpeed; data/validation/"
           "README.md says where they come from). One choice is made with them in view (fitted.py \"vTrain passes "
           "from an empty queue\"): the first row prices them without it, out of source; the others with it, in "
           "sample. Their all-reduces are priced at their node's own nccl-tests rows, as vTrain's graph times them "
           "(data/measured/2026-11-29-vtrain-a100-allreduce.csv, Cluster.allreduce_table): a measurement of that "
           "machine, which no preset system carries, so an A100 estimate without such rows prices its all-reduces "
           "by NCCL's model. Sweeps: the runs of one model, GPU count and global batch "
           "(benchmarks/measure/small_work_sweeps.py).",
           "", *STATS_HEAD, stats_row("all, out of source", summary["out_of_source"]),
           stats_row("all", summary["all"])]
    out += [stats_row(f"tp {k}", s) for k, s in summary["by_tp"].items()]
    out += [stats_row(f"model {k}", s) for k, s in summary["by_model"].items()]
    out += ["", f"Sweeps: {p['sweeps']} of {p['runs']} runs; Spearman mean {p['mean_spearman']:.2f}, lowest "
            f"{p['min_spearman']:.2f}; regret (the measured time of meshplan's pick over the measured best, minus 1) "
            f"median {100 * p['median_regret']:.1f} %, largest {100 * p['max_regret']:.1f} %; picks within 10 % of the "
            f"best: {100 * p['within_10pct']:.0f} %."] if metrics else ["", "No sweep of equal work."]
    return out, summary


if __name__ == "__main__":
    print("\n".join(vtrain_section()[0]))
