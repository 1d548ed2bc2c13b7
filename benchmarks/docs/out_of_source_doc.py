"""The out-of-source sections that lead docs/ACCURACY.md (training) and docs/ACCURACY_INFERENCE.md (serving), from the
committed docs/out_of_source.json (benchmarks/docs/out_of_source.py) and src/meshplan/presets/error_bands.json
(benchmarks/docs/error_bands.py): errors with every fitted constant refitted without the run's source first, in-sample
beside them; the registry of fitted constants with each one's leave-one-source-out effect; the bands by regime with
the share of each regime's runs they hold out of source. Also the figures accuracy_summary.json records of them.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from meshplan_validation.fitted import NO_PREDICTION

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "out_of_source.json"
BANDS = ROOT / "src" / "meshplan" / "presets" / "error_bands.json"
FILES = {"published": "published training runs (data/validation/published_runs.jsonl)",
         "small_work": "small-work training runs (data/validation/small_work.jsonl)",
         "vtrain": "vTrain's single-node sweep, released half (data/validation/vtrain_single_node_dev.jsonl)",
         "independent": "independent training runs (benchmarks/data/independent_runs.jsonl)"}
SERVING_FILES = {"published": "published serving runs (data/serving/published_serving.jsonl)",
                 "small_work": "small-work serving runs (data/serving/small_work.jsonl)",
                 "argonne": "Argonne LLM-Inference-Bench, released half (data/serving/llm_inference_bench_dev.jsonl)",
                 "dstack": "dstack's vLLM runs on 8x MI300X (data/serving/dstack_mi300x.jsonl)"}


def load() -> tuple[dict[str, Any], dict[str, Any]]:
    return json.loads(DATA.read_text()), json.loads(BANDS.read_text())["tables"]


def pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f} %"


def stats(errors: list[float]) -> dict[str, Any]:
    a = np.abs(np.asarray(errors, float))
    if not a.size:
        return {"runs": 0, "median": None, "p90": None}
    return {"runs": int(a.size), "median": float(np.median(a)), "p90": float(np.percentile(a, 90))}


def rows_of(data: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    """The priced observations of ``kind``; serving: each run's headline throughput or, without one, its first
    latency (serving_runs.primary's rule), so a run counts once, and only the runs whose layout their source states,
    as the in-sample headline (accuracy_inference.py) and the bands (error_bands.py) count them."""
    out = [r for r in data["runs"] if r["kind"] == kind and r.get("oos_error") is not None
           and r.get("layout_stated", True)]
    if kind == "training":
        return out
    by_run: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in out:
        by_run[r["file"] + "/" + r["id"]].append(r)
    order = ("itl_ms", "tpot_ms", "e2e_latency_ms", "ttft_ms")
    chosen = []
    for runs in by_run.values():
        head = [r for r in runs if r.get("headline")]
        chosen += head[:1] or sorted(runs, key=lambda r: order.index(r["metric"]) if r["metric"] in order else 9)[:1]
    return chosen


def summary(data: dict[str, Any], kind: str) -> dict[str, Any]:
    """Per file and over all files: out-of-source and in-sample median / p90 |error|."""
    rows = rows_of(data, kind)
    files = FILES if kind == "training" else SERVING_FILES
    out: dict[str, Any] = {}
    for name in [*files, "all"]:
        chosen = [r for r in rows if name in ("all", r["file"])]
        out[name] = {"out_of_source": stats([r["oos_error"] for r in chosen]),
                     "in_sample": stats([r["error"] for r in chosen])}
    return out


def headline(data: dict[str, Any], kind: str) -> list[str]:
    """The leading table: out of source first, in sample beside it."""
    files = FILES if kind == "training" else SERVING_FILES
    s = summary(data, kind)
    lines = ["| runs | evaluated | out of source: median \\|error\\| | p90 | in sample: median | p90 |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, what in [*files.items(), ("all", f"every {kind} run")]:
        o, i = s[name]["out_of_source"], s[name]["in_sample"]
        lines.append(f"| {what} | {o['runs']} | {pct(o['median'])} | {pct(o['p90'])} | {pct(i['median'])} | "
                     f"{pct(i['p90'])} |")
    return lines


def by_source(data: dict[str, Any], kind: str) -> list[str]:
    rows = rows_of(data, kind)
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["source"]].append(r)
    lines = ["| source | runs | out of source: median | p90 | in sample: median | p90 |",
             "|---|---:|---:|---:|---:|---:|"]
    for source, runs in sorted(by.items()):
        o, i = stats([r["oos_error"] for r in runs]), stats([r["error"] for r in runs])
        lines.append(f"| {source} | {o['runs']} | {pct(o['median'])} | {pct(o['p90'])} | {pct(i['median'])} | "
                     f"{pct(i['p90'])} |")
    return lines


def registry(data: dict[str, Any], domain: str) -> list[str]:
    """The registry's constants of ``domain``: value, data, and what leaving each of its sources out does."""
    refitted = data["refitted"].get(domain, {})
    rows = rows_of(data, domain)
    elsewhere = data["refitted"].get("elsewhere", {})
    lines = ["| constant | value | fitted on | refitted without each of its sources | its sources' runs: in sample "
             "→ out of source (median / p90) | the other sources' runs it moves: as shipped → at its prior (median / "
             "p90) |", "|---|---:|---|---|---|---|"]
    for f in (r for r in data["registry"] if r["domain"] == domain):
        values = [v[_field(f["name"])] for s, v in refitted.items() if s in f["sources"] and _field(f["name"]) in v]
        moved = f"{_num(min(values))} – {_num(max(values))}" if values else "not a prediction's input" if (
            f["name"] in NO_PREDICTION) else "its value (no other source)"
        theirs = [r for r in rows if r["source"] in f["sources"]]
        i, o = stats([r["error"] for r in theirs]), stats([r["oos_error"] for r in theirs])
        effect = (f"{pct(i['median'])} / {pct(i['p90'])} → {pct(o['median'])} / {pct(o['p90'])} ({o['runs']} runs)"
                  if theirs and f["name"] not in NO_PREDICTION else "-")
        other = elsewhere.get(f["name"], {})
        earned = "-" if not other.get("runs") else (
            f"{_pair(stats(other['shipped']))} → {_pair(stats(other['prior']))} ({other['runs']} runs)")
        lines.append(f"| {f['name']} ({f['where']}) | {_num(f['value'])} {f['unit']} | {f['data']}; sources: "
                     f"{', '.join(f['sources'])} ({f['script']}) | {moved} | {effect} | {earned} |")
    return lines


def _field(name: str) -> str:
    """The key a refit records a registry constant under."""
    return {"trtllm iteration_overhead": "trtllm", "lmdeploy iteration_overhead": "lmdeploy"}.get(name, name)


def _num(x: float) -> str:
    return f"{x:.4g}"


def bands_table(data: dict[str, Any], tables: dict[str, Any], table: str,
                held: dict[tuple[str, int], bool]) -> list[str]:
    """Each whole regime of ``table`` with 20 or more runs: its runs, sources, the band it quotes, the share of its
    runs' out-of-source errors within it, its median |error|, the band over it (issue 79's sharpness: at most 2.5);
    and the share inside the band quoted when every table is built without the run's source (``held``:
    benchmarks/docs/error_bands.py held_out), what a source not yet measured should expect."""
    import error_bands  # noqa: PLC0415  (beside this script)
    from meshplan.specs.bands import band, key_of  # noqa: PLC0415

    t = tables[table]
    rows = error_bands.rows_of(data)[table]
    err = error_bands.error_of(table)
    by: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for i, r in enumerate(rows):  # ``held`` is by the row's index in ``rows``
        by[key_of(r["regime"], t["axes"])].append((i, r))
    lines = ["| regime | runs | sources | band | within it | median \\|error\\| | band / median | within a band built "
             "without the run's source |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for key, indexed in sorted(by.items(), key=lambda kv: -len(kv[1])):
        if len(indexed) < min(20, t["min_runs"]):
            continue
        runs = [r for _, r in indexed]
        quoted = np.array([band(table, r["regime"]).half_width for r in runs])
        errors = np.abs([r[err] for r in runs])
        strict = np.mean([held.get((table, i), False) for i, _ in indexed])
        lines.append(f"| {key} | {len(runs)} | {len({r['source'] for r in runs})} | ±{pct(float(np.median(quoted)))} "
                     f"| {pct(float(np.mean(errors <= quoted)))} | {pct(float(np.median(errors)))} "
                     f"| {np.median(quoted) / np.median(errors):.2f} | {pct(float(strict))} |")
    return lines


def bands_by_family(data: dict[str, Any], names: list[str], held: dict[tuple[str, int], bool]) -> list[str]:
    """The share of runs inside the band quoted when every table is built without the run's source, per table and
    per family (GPU and framework or engine) with 20 or more runs (error_bands.coverage)."""
    import error_bands  # noqa: PLC0415  (beside this script)

    lines = ["| quantity | family | runs | within a band built without the run's source |", "|---|---|---:|---:|"]
    for name, by in error_bands.coverage(data, held).items():
        if name in names:
            lines += [f"| {name} | {k or 'every run'} | {n} | {pct(share)} |"
                      for k, (n, share) in by.items() if n >= 20]
    return lines


def section(kind: str) -> list[str]:
    """The leading section of docs/ACCURACY.md (``kind`` training) or docs/ACCURACY_INFERENCE.md (serving)."""
    data, tables = load()
    n = len(data["registry"])
    mine = [f for f in data["registry"] if f["domain"] == kind]
    lines = ["## Out of source first", "",
             f"meshplan holds {n} constants that were fitted on, or chosen from, measured runs "
             "(`meshplan_validation/fitted.py`, the registry below); everything else is a datasheet figure or a "
             "measurement with its source. Each run here is priced twice: *out of source*, with every such constant "
             "refitted without the run's source (one paper, one framework's table, one benchmark suite: "
             "`meshplan_validation/provenance.py`; the refit is the shipped fit's objective over the fit runs of the "
             "other sources, `meshplan_validation/refit.py`), and *in sample*, with the shipped constants. The "
             "out-of-source error is what a user of a source meshplan has never seen should expect; "
             "`python benchmarks/docs/out_of_source.py` writes both (docs/out_of_source.json).", "",
             *headline(data, kind), "", "By source:", "", *by_source(data, kind), "",
             f"### The {len(mine)} constants fitted on {kind} runs", "",
             "Each with the values it takes when each of its sources is left out, and what that does to the errors "
             "of those sources' runs (a constant whose only source is left out falls to its prior, the value the "
             "model takes with no data, or, where another source's runs price it too, is refitted on those: "
             "`loso_serving.ALTERNATE`); and, where it prices runs of sources it was not fitted on, those runs' "
             "errors as shipped and at its prior: a constant earns its place out of source where the shipped value "
             "reads them better.", "",
             *registry(data, kind), "", "### The error bands", "", *bands_text(data, tables, kind)]
    return lines


def bands_text(data: dict[str, Any], tables: dict[str, Any], kind: str) -> list[str]:
    """The error bands' subsection: what a band is, its regimes, and how it holds for a source left out."""
    import error_bands  # noqa: PLC0415  (beside this script)

    times = tables["training" if kind == "training" else "serving/throughput"]["new_source"]  # error_bands.domain
    lines = ["Every estimate quotes the band of its regime (`meshplan/specs/regime.py`: the GPU and its host, the "
             "stack or engine, the model kind, the scale, the work per kernel, for serving the batch), built for a "
             "source meshplan has not seen (`benchmarks/docs/error_bands.py`, `meshplan/specs/bands.py`): the "
             "conformal 80 % quantile of the out-of-source |errors| of the measured runs of that regime, times "
             f"{times['seen']:.2f}, at most 2.5 times the regime's median |error| and never below that quantile; "
             f"where no measured run is like the plan, the widest neighbouring band times {times['unseen']:.2f}. The "
             f"two multipliers are the conformal {100 * error_bands.SOURCE_COVERAGE:.0f} % quantile, over the "
             f"{kind} sources (each source's runs of one GPU and "
             "framework or engine, in one table), of the 80 % quantile of their runs' |error| over the band quoted "
             "them when their source was left out (Dunn, Wasserman & Ramdas 2023, sources as the exchangeable groups; "
             "Barber et al. 2021's CV+, the sources as folds). Each regime with 20 or more runs, the share of its runs "
             "inside the band it quotes (tests/test_bands.py holds it at 80 % or more and the band at most 2.5 times "
             "the regime's median |error|), and the share inside the band quoted when every table is built without "
             "the run's source, the honest reading for a new source:", ""]
    held = error_bands.held_out(error_bands.rows_of(data))["inside"]
    names = ["training", "memory"] if kind == "training" else [f"serving/{m}" for m in ("throughput", "ttft", "tpot",
                                                                                          "e2e")]
    for table in names:
        lines += [f"{tables[table]['what']}:", "", *bands_table(data, tables, table, held), ""]
    return [*lines, "By family, built without the run's source (tests/test_bands.py holds each at 80 % or more but "
            "those it lists, with their reasons):", "", *bands_by_family(data, names, held), ""]


README_LABELS = {("training", "published"): "training: published runs", ("training", "small_work"):
                 "training: small-work runs, one node", ("training", "vtrain"): "training: vTrain's single-node sweep "
                 "(released half)", ("training", "independent"): "training: independent runs from other sources",
                 ("training", "all"): "every training run", ("serving", "published"): "serving: published runs",
                 ("serving", "small_work"): "serving: small-work runs", ("serving", "argonne"): "serving: Argonne "
                 "LLM-Inference-Bench, vLLM (released half)", ("serving", "all"): "every serving run"}


def readme_rows() -> list[str]:
    """The README's out-of-source table rows (tests/test_readme.py rebuilds them)."""
    data = load()[0]
    out = []
    for kind in ("training", "serving"):
        s = summary(data, kind)
        for (k, name), label in README_LABELS.items():
            if k == kind:
                o, i = s[name]["out_of_source"], s[name]["in_sample"]
                out.append(f"| {label} | {o['runs']} | {_pair(o)} | {_pair(i)} |")
    return out


def _pair(s: dict[str, Any]) -> str:
    return f"{100 * s['median']:.1f} / {100 * s['p90']:.1f} %"
