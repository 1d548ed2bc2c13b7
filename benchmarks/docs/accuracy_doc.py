"""docs/ACCURACY.md as text, from the runs' results and their summaries (benchmarks/docs/accuracy.py writes it; the
analyses it quotes are in accuracy_analysis.py)."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from accuracy_analysis import (
    CALCULON,
    NO_CAUSE,
    ROOT,
    TARGETS,
    UNITS,
    explain,
    gpu_family,
    met,
    num,
    pct,
    pct2,
    recompute_hfu,
    release_floor,
    same_1t,
)
from meshplan.estimate import estimate
from meshplan.specs.architectures import MATMUL
from meshplan.specs.efficiency import DEFAULT, FITTED, Efficiency
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import evaluate_case
from meshplan_validation.record_fields import fill_from_siblings
from meshplan_validation.records import clean_record, read_runs
from meshplan_validation.render import fit_check_markdown
from meshplan_validation.result import RunResult
from meshplan_validation.sources import GENERIC, SOURCES
from meshplan_validation.summary import summaries
from meshplan_validation.validate import run_validation
from out_of_source_doc import section


# ---- the document -------------------------------------------------------------------------------------------
def summary_row(name: str, s: dict[str, Any]) -> str:
    return (f"| {name} | {s['evaluated']} | {s['skipped']} | {pct(s['median_abs_error'])} | "
            f"{pct(s['mean_abs_error'])} | {pct(s['p90_abs_error'])} | {pct(s['max_abs_error'])} | "
            f"{pct(s['mean_signed_error'], True)} |")


def target_rows(scope: str, s: dict[str, Any]) -> list[str]:
    """The median and p90 target rows of the summary table for one set of runs."""
    return [f"| median \\|error\\|, {scope} | ≤ {pct(TARGETS['median_abs_error'])} | {pct2(s['median_abs_error'])} | "
            f"{met(s['median_abs_error'] <= TARGETS['median_abs_error'])} |",
            f"| p90 \\|error\\|, {scope} | ≤ {pct(TARGETS['p90_abs_error'])} | {pct(s['p90_abs_error'])} | "
            f"{met(s['p90_abs_error'] <= TARGETS['p90_abs_error'])} |"]


def complete_note(results: list[RunResult], by_id: dict[str, dict[str, Any]]) -> list[str]:
    """What a complete configuration is, and which records fall short of one and for want of what."""
    short: dict[str, Counter] = {}
    for r in results:
        for setting in r.unstated:
            short.setdefault(r.group, Counter())[setting] += 1
    listed = "; ".join(f"{g}: " + ", ".join(f"{k} ({n})" for k, n in c.most_common()) for g, c in sorted(
        short.items()))
    evaluated = [r for r in results if r.complete and not r.skipped]
    made_of = ", ".join(f"{g} {n}" for g, n in Counter(r.group for r in evaluated).most_common())
    chosen = [by_id[r.id] for r in evaluated]
    other = summaries(run_validation(read_runs(ROOT / "benchmarks/data/independent_runs.jsonl")))["complete"]
    gpus = sorted({str((rec.get("hardware") or {}).get("gpu")) for rec in chosen})
    moe = sum(1 for rec in chosen if (rec.get("model") or {}).get("arch") == "moe")
    return ["The median and p90 accuracy targets are set on \"runs with complete configurations\". A record has one "
            "when "
            "it states every training setting its step time depends on that the data set's README says a source may "
            "leave out: the parallel layout (tp and pp, or a ZeRO / FSDP setting for a run that is data-parallel "
            "only), the micro-batch and global batch, activation recompute and precision "
            "(`meshplan_validation.records.unstated_settings`, judged on the record as published). "
            "The other runs are evaluated "
            "too, with the defaults of their stack and release (each run lists them), and are in every other row "
            f"here. Unstated, by group (runs): {listed}. The complete ones come from few sources ({made_of}), "
            f"{moe or 'none'} of them MoE, on these GPUs (as the records name them): {'; '.join(gpus)}. For other "
            "GPUs and for MoE the all-runs rows and the groups below are the measure. Nor does the target carry over "
            "to other sources: of the runs of docs/INDEPENDENT.md, the "
            f"{other['evaluated']} with complete configurations read a median of {pct(other['median_abs_error'])} "
            f"and a p90 of {pct(other['p90_abs_error'])}."]


def _kernel_checks() -> Any:
    """benchmarks/measure/kernel_checks.py (importable whether this runs as a script or is loaded)."""
    here = str(Path(__file__).resolve().parents[1] / "measure")
    if here not in sys.path:
        sys.path.insert(0, here)
    import kernel_checks  # noqa: PLC0415

    return kernel_checks


def constants_table(eff: Efficiency) -> list[str]:
    fitted = set(FITTED)
    lines = ["| constant | value | fitted? |", "|---|---:|---|"]
    for f in fields(eff):
        value = getattr(eff, f.name)
        shown = (f"{value:.3f}" if abs(value) >= 1e-3 else f"{value:.3g}") if isinstance(value, float) else str(value)
        lines.append(f"| `{f.name}` | {shown} | {'yes (fit half)' if f.name in fitted else 'no (documented)'} |")
    lines += ["", "Best-shape GEMM efficiency (MAMF) per silicon configuration (carried by the hardware presets as "
              "`matmul_bf16` / `matmul_fp8` / `matmul_watts`; `architectures.MATMUL` is the fallback for accelerators "
              "defined without them):", "",
              "| dense 16-bit peak | SMs | BF16 | FP8 | measured at | source |", "|---:|---:|---:|---:|---:|---|"]
    lines += [f"| {e.half_peak / 1e12:.0f} TFLOP/s | {e.num_sms} | {e.bf16:.3f} | {e.fp8:.3f} | {e.watts:.0f} W | "
              f"{e.source} |" for e in MATMUL]
    return lines


def schedule_gap(mem: list[RunResult], plain: str = "torchtitan_h100_202412_t5_0",
                 interleaved: str = "torchtitan_h100_202412_t5_1") -> str:
    """How far below the 1F1B 405B run meshplan puts the interleaved one, beside the measured gap."""
    runs = {r.id: r for r in mem}
    if plain not in runs or interleaved not in runs:
        return "the two 405B schedules are not both in the data"
    a, b = runs[plain], runs[interleaved]
    predicted = (a.memory_predicted - b.memory_predicted) / 2**30
    measured = (a.memory_measured - b.memory_measured) / 2**30
    return f"meshplan puts it {predicted:.1f} GiB below the 1F1B run, where {measured:.1f} GiB less was measured"


def unfused_reading(results: list[RunResult], records: list[dict[str, Any]], name: str) -> str:
    """The BF16 runs of a model with learnable attention sinks read again with the unfused kernel (Stack.flash_attention
    off): their error range and how many of them would then not fit (the reading before the fused kernel's)."""
    by_id = {str(r["id"]): r for r in records}
    again = []
    for r in results:
        rec = by_id[r.id]
        if r.error is None or name not in str((rec.get("model") or {}).get("name", "")).lower() \
                or str(rec.get("precision", "")).lower() != "bf16":
            continue
        case = map_run(fill_from_siblings(clean_record(rec), records))
        again.append(evaluate_case(replace(case, stack=case.stack.with_(flash_attention=False))))
    if not again:
        return ""
    errs = [x.error for x in again]
    spill = sum(1 for x in again if not x.fits)
    return (f"read with it, its {len(again)} BF16 runs come within {pct(min(errs), True)} … {pct(max(errs), True)}, "
            f"{spill} of them at more memory than the GPU has")


def ssd_share(rec: dict[str, Any], records: list[dict[str, Any]]) -> float:
    """The SSD scan's share (``mamba/ssd*`` ops) of a hybrid run's predicted step."""
    case = map_run(fill_from_siblings(clean_record(rec), records), hybrid=True)
    est = estimate(case.model, case.cluster, case.plan, case.stack, case.efficiency(DEFAULT))
    return sum(o.total_seconds for o in est.ops if o.name.startswith("mamba/ssd")) / est.step_time


def hybrid_section(results: list[RunResult], hybrid: list[RunResult], records: list[dict[str, Any]]) -> list[str]:
    """The runs compared apart (``case.compared_apart``: hybrid Mamba models with a latent MoE), compared with
    ``meshplan validate --hybrid`` but kept out of every summary above: the runs ``results`` skipped as such."""
    skipped = {r.id for r in results if "hybrid Mamba-2 model" in r.skipped}
    runs = [r for r in hybrid if r.error is not None and r.id in skipped]
    if not runs:
        return []
    errors = np.array([r.error for r in runs])
    by_id = {rec["id"]: rec for rec in records}
    share = max(ssd_share(by_id[r.id], records) for r in runs)
    nano = [r.error for r in results if r.error is not None and "Nemotron-3-Nano" in r.id]
    by_gpu: dict[str, list[float]] = {}
    for r in runs:
        by_gpu.setdefault(gpu_family(by_id[r.id]), []).append(r.error)
    spans = ", ".join(f"{gpu} {pct(min(e), True)} … {pct(max(e), True)}" for gpu, e in sorted(by_gpu.items()))
    out = ["", "## Runs compared apart: Nemotron 3 Super", "",
           "meshplan costs hybrid Mamba-2 / attention / MoE models block by block (`ModelSpec.layer_pattern`, presets "
           "`nemotron-3-nano` and `nemotron-3-super`): the SSD scan at the streaming rate mamba_ssm's Triton kernels "
           "were measured at on an H100, per SM (`Efficiency.ssd`, `benchmarks/measure/kernel_checks.py`), the "
           "backward's re-run of the forward's chunk states, and the recipes' module recompute "
           "(`Plan.recompute_modules`; Megatron-Bridge's Nano H100 recipe recomputes `moe`, `layernorm`, `core_attn` "
           "and `moe_act`) and multi-token prediction (Super: two depths of one shared attention + latent-MoE layer). "
           f"With them the {len(nano)} Nemotron 3 Nano runs are in the summaries above, within "
           f"{pct(max(abs(e) for e in nano))}. "
           "The runs of the model with a latent MoE, Nemotron 3 Super, are not "
           "(`meshplan_validation.case.compared_apart`): with "
           "every setting its recipes document modelled they read "
           f"{spans} (signed, a positive error a faster prediction; median {pct(float(np.median(errors)), True)}), "
           "fast on both platforms, the NVL72 racks most; its recipes dispatch with HybridEP "
           "(`meshplan_validation.recipes_dispatch`), which sends a token once to each of the 8 DGX B200 servers "
           "its expert-parallel group of 64 crosses that holds one of its experts, and once to each GPU of a server "
           "or rack that does (`collectives/dispatch.py`). Not modelled: the last 14 layers its NVFP4 recipe keeps "
           "in BF16, the MTP layer's "
           "BF16, the router's fp32 GEMM. None of these would close a gap of this size on the GB200 runs, and the SSD "
           f"scan, at most {pct(share)} of a predicted step, would have to run several times slower than its H100 "
           "rate per SM: the cause is not found. "
           "`meshplan validate --hybrid` compares them:", "", "| run | predicted tokens/s/GPU | measured | error |",
           "|---|---:|---:|---:|"]
    out += [f"| {r.id} | {num(r.predicted)} | {num(r.measured)} | {pct(r.error, True)} |" for r in runs]
    return out


def write_doc(results: list[RunResult], summary: dict[str, Any], kor: dict[str, Any], records: list[dict[str, Any]],
              data: Path, hybrid: list[RunResult] = ()) -> str:
    by_id = {r["id"]: r for r in records}
    ov, co, ev = summary["overall"], summary["complete"], [r for r in results if not r.skipped]
    n_total = len(results)
    n_sup = sum(1 for r in results if by_id[r.id].get("superseded") and not r.skipped)
    mem = [r for r in ev if r.memory_error is not None]
    mem_abs = np.array([abs(r.memory_error) for r in mem])
    over25 = [r for r in ev if abs(r.error) > 0.25]
    sinks = unfused_reading(ev, records, "gpt-oss")
    reasons = {r.id: explain(r, by_id[r.id], records, (ev, by_id), sinks) for r in over25}  # reused below
    unexplained = [r for r in over25 if NO_CAUSE in reasons[r.id]]
    out = ["# Accuracy against published training runs", "",
           "Generated by `python benchmarks/docs/accuracy.py` from "
           f"`{data.relative_to(ROOT) if data.is_relative_to(ROOT) else data}` "
           f"({n_total} records). Do not edit by hand: the numbers are the ones the script prints, and "
           "`tests/test_published.py` fails if a change makes them worse (it reads `docs/accuracy_summary.json`).",
           "", "Error = predicted / measured − 1 in the metric the source measured (iteration time, tokens/s, or "
           "TFLOP/s and MFU converted with the source's own FLOP formula; see `meshplan_validation/flops.py`). "
           "For a time "
           "a positive error means meshplan predicts a slower step; for a throughput, a faster one.", "",
           *section("training"),
           "## In sample: the published runs", "",
           "The rest of this document prices the published runs with the shipped constants, as every estimate does.",
           "", "| | target | reached | met |", "|---|---:|---:|:---:|",
           *target_rows(f"runs with complete configurations ({co['evaluated']} of {ov['evaluated']}: the targets' "
                        "scope)", co),
           *target_rows(f"all {ov['evaluated']} evaluated runs", ov),
           f"| runs beyond 25 % | 0 without a documented reason | {len(over25)} ({len(unexplained)} without a "
           f"documented reason; see below) | {met(not unexplained)} |",
           f"| Korthikanti 2022 iteration times, mean / max | ≤ {pct(TARGETS['korthikanti_mean'])} / "
           f"{pct(TARGETS['korthikanti_max'])} | {pct2(kor['mean_abs_error'])} / "
           f"{pct2(kor['max_abs_error'])} | {met(kor['mean_abs_error'] <= TARGETS['korthikanti_mean'])} / "
           f"{met(kor['max_abs_error'] <= TARGETS['korthikanti_max'])} |",
           f"| torchtitan peak memory, median / max \\|error\\| | ≤ {100 * TARGETS['memory']:.0f}% | "
           f"{pct(float(np.median(mem_abs)) if mem_abs.size else None)} / "
           f"{pct(float(mem_abs.max()) if mem_abs.size else None)} | "
           f"{met(bool(mem_abs.size) and float(mem_abs.max()) <= TARGETS['memory'])} |",
           f"| runs evaluated | ≥ {100 * TARGETS['evaluated_fraction']:.0f} % | {ov['evaluated']} of {n_total} "
           f"({100 * ov['evaluated'] / n_total:.0f} %), "
           f"{n_sup} of them superseded records (older software, same configurations: evaluated, not fitted) | "
           f"{met(ov['evaluated'] >= TARGETS['evaluated_fraction'] * n_total)} |",
           "", "| set | evaluated | skipped | median | mean | p90 | max | mean signed |",
           "|---|---:|---:|---:|---:|---:|---:|---:|",
           summary_row("overall", ov), summary_row("complete configurations", co),
           summary_row("in sample (fit half: CRC-32 of id even)", summary["in_sample"]),
           summary_row("out of sample (the other half)", summary["out_of_sample"]), "",
           *complete_note(results, by_id), "",
           "The fit half and the held-out half are fixed by `meshplan_validation.selection.in_fit_set`; "
           "only the two constants "
           "marked *fitted* below were fitted, on the fit half, by `benchmarks/measure/fit_efficiency.py` (each source "
           "group weighted equally), on the dense runs; the MoE runs fit nothing. "
           "Same-configuration records of successive Megatron-Bridge releases fall on both sides, so the held-out "
           "half is not independent of the fit half across releases; the held-out set from other sources and GPUs "
           "is the real test.", "",
           "![predicted vs measured](accuracy.png)", "", "## By source", "",
           "| group | evaluated | skipped | median | mean | p90 | max | mean signed |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    out += [summary_row(g, s) for g, s in summary["groups"].items()]
    out += release_floor(ev, by_id)
    out += ["", "## Korthikanti et al. 2022 (Table 5) beside Calculon", "",
            "The eight iteration times of Korthikanti et al. 2022 Table 5 (A100 80 GB, tp = 8, full recompute vs "
            "sequence parallelism + selective recompute), the configurations Calculon's validation uses "
            f"({CALCULON['source']}: micro-batch 4 / 1 / 1 / 1, interleaving 1 / 3 / 3 / 1).", "",
            "| run | measured | meshplan | error |", "|---|---:|---:|---:|"]
    out += [f"| {x['id']} | {x['measured_s']:.2f} s | {x['predicted_s']:.2f} s | {pct(x['error'], True)} |"
            for x in kor["runs"]]
    out += ["", "| | mean \\|error\\| | max \\|error\\| | constants fitted on these runs? |", "|---|---:|---:|---|",
            f"| meshplan | {pct(kor['mean_abs_error'])} | {pct(kor['max_abs_error'])} | no: three global constants "
            "fitted on half of all 428 runs |",
            f"| Calculon (Isaev et al. 2023) | {pct(CALCULON['mean'])} | {pct(CALCULON['max'])} | yes: its A100 "
            "efficiency curves were tuned on these runs |", "",
            "Calculon's repository publishes the measured times and the execution files of these runs but not its "
            "per-run predictions (its `llm-validation` command computes and prints them), so only its aggregate "
            "figures are compared here; no Calculon code was used or copied."]
    out += same_1t(results)
    out += recompute_hfu(results, records)
    out += ["",
            "## Peak memory (torchtitan, \"max reserved\")", "", "| run | predicted | measured | error |",
            "|---|---:|---:|---:|"]
    out += [f"| {r.id} | {r.memory_predicted / 2**30:.1f} GiB | {r.memory_measured / 2**30:.1f} GiB | "
            f"{pct(r.memory_error, True)} |" for r in mem]
    out += ["", "meshplan counts model states, saved activations (Korthikanti et al. 2022), the transient "
            "cross-entropy workspace of the loss implementation (torchtitan: eager `F.cross_entropy`, whose backward "
            "holds the saved fp32 log-probabilities and two fp32 gradients of the logits, 12 bytes per logit, "
            "and 16 with tensor parallelism, where DTensor's loss_parallel computes both gradients in one eager "
            "expression with three fp32 temporaries; `Stack.cross_entropy`) and the collective buffers. PyTorch's "
            "caching-allocator reserve and fragmentation and, under full recompute, the gradient working set of the "
            "layer in backward are not modelled.", "",
            "The source takes the maximum over all GPUs (its footnote 1: \"different PP ranks can have different peak "
            "memory usages\"), as meshplan's peak does. On the pipeline-parallel runs (405B, 3D and 4D) that is the "
            "last stage: their runtime, the torch.distributed.pipelining of the benchmark's PyTorch (torch "
            "1963fc8, December 2024), keeps every micro-batch's stage output until the step ends, on the last stage "
            "the fp32 logits (1.95 GiB per micro-batch of 32k tokens here), and allocates receive buffers for every "
            "micro-batch up front (`Stack.pipeline_runtime = \"torch\"`, `memory.pipeline_runtime_memory`; "
            "pytorch/pytorch#153383 later kept the outputs of the last stage only). torchtitan's FSDP2 frees a model "
            "chunk's unsharded gradients once the chunk's last backward has reduced them, so the interleaved run's "
            "last rank, which backpropagates its two chunks one after the other, holds half of them "
            "(`memory.chunk_gradient_share`) while it keeps more chunks' activations in flight: "
            f"{schedule_gap(mem)}.", ""]
    out += fit_check_markdown(results)
    out += ["", "## The efficiency model and its constants", "",
            "See `src/meshplan/specs/efficiency.py` for the physics and the source of every constant.", ""]
    out += constants_table(DEFAULT)
    out += ["", "Kernel-level checks against published benchmarks the model was not fitted on "
            "(`benchmarks/measure/kernel_checks.py`):", ""]
    out += _kernel_checks().table()
    out += ["", "## Assumptions per source", "",
            "Where a source is silent, the run is evaluated with its framework's documented defaults; each run "
            "also lists its own assumptions (`meshplan validate --json`).", ""]
    out += [f"- **{s.name}** (`{s.match}`): {s.why}." for s in SOURCES]
    out += [f"- **{GENERIC.name}** (any other source): {GENERIC.why}."]
    worst = sorted(ev, key=lambda r: -abs(r.error))
    worst = worst[:max(len(over25), 25)]
    out += ["", "## The worst runs, explained", "",
            "Every evaluated run beyond 25 % is in this list, with what is known of its cause.", "",
            "| run | error | why |", "|---|---:|---|"]
    out += [f"| {r.id} | {pct(r.error, True)} | "
            f"{reasons.get(r.id) or explain(r, by_id[r.id], records, (ev, by_id), sinks)} |" for r in worst]
    out += hybrid_section(results, list(hybrid), records)
    out += ["", "## Every run", "",
            "| run | group | half | metric | predicted | measured | error | memory error |",
            "|---|---|---|---|---:|---:|---:|---:|"]
    for r in results:
        half = "fit" if r.in_fit_set else "held-out"
        if r.skipped:
            out.append(f"| {r.id} | {r.group} | {half} | skipped | | | | {r.skipped} |")
        else:
            out.append(f"| {r.id} | {r.group} | {half} | {UNITS[r.metric]} | {num(r.predicted)} | "
                       f"{num(r.measured)} | {pct(r.error, True)} | {pct(r.memory_error, True)} |")
    return "\n".join(out) + "\n"
