"""One Case evaluated: meshplan's estimate of its step time, converted to the quantity the source measured (exact for
a time or a throughput; through the source's FLOP formula, flops.py, for TFLOP/s and MFU), and the signed error.

Signed error = predicted / measured − 1 of the measured metric. For a time (``iteration_time_s``) a positive
error means meshplan predicts a slower step; for a throughput (tokens/s, TFLOP/s, MFU) a faster one.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan_validation.case import Case
from meshplan_validation.flops import BASES, megatron_model_flops, unwindowed
from meshplan_validation.measurement import PERCENT_OF_PEAK
from meshplan_validation.result import RunResult
from meshplan_validation.selection import in_fit_set
from meshplan_validation.skip import Skip

if TYPE_CHECKING:
    from meshplan.estimate import Estimate


def predicted_metric(case: Case, step_time: float) -> float:
    """The prediction on the measured basis, from meshplan's step time."""
    plan, model, n = case.plan, case.model, case.cluster.num_gpus
    tokens = plan.global_batch * model.seq_length
    if case.metric == "iteration_time_s":
        return step_time
    if case.metric == "tokens_per_s_per_gpu":
        return tokens / step_time / n
    if case.metric == "tokens_per_s_total":
        return tokens / step_time
    flops = BASES.get(case.basis, megatron_model_flops)(model, plan.global_batch)
    if case.metric == "hfu_pct" and case.basis != "eq3":  # hardware FLOPs: the recomputed forward too
        from meshplan.cost.flops import recompute_flops_per_token

        flops = flops + recompute_flops_per_token(unwindowed(model), plan, case.stack) * tokens
    if case.metric in PERCENT_OF_PEAK:
        return 100.0 * flops / step_time / n / case.cluster.accelerator.half_flops
    return flops / step_time / n / 1e12


def peak_read(est: Estimate, counter: str) -> float:
    """The peak memory of ``est`` that ``counter`` reads (sources.SourceDefaults.memory_peak): "allocated"
    (torch.cuda.max_memory_allocated: Estimate.peak_memory), "reserved" (the caching allocator's reserved peak:
    Estimate.reserved_memory) or "device" (nvidia-smi's reading of the process: Estimate.device_memory)."""
    if counter == "device":
        return est.device_memory
    return est.reserved_memory if counter == "reserved" else est.peak_memory


def evaluate_case(case: Case, eff: Efficiency = DEFAULT) -> RunResult:
    """The case's estimate against its measurement: predicted and measured metric, error, step time and its
    breakdown, peak memory (and its error where measured) and whether it fits."""
    from meshplan.estimate import estimate  # noqa: PLC0415  (estimate imports the whole cost model)

    est = estimate(case.model, case.cluster, case.plan, case.stack, case.efficiency(eff))
    predicted = predicted_metric(case, est.step_time)
    peak = peak_read(est, case.memory_peak)  # the peak it measured
    result = RunResult(id=case.id, group=case.group, metric=case.metric, predicted=predicted,
                       measured=case.measured, error=predicted / case.measured - 1, assumptions=case.assumptions,
                       step_time=est.step_time, breakdown=dict(est.breakdown), memory_predicted=peak,
                       memory_capacity=case.cluster.accelerator.hbm_bytes, fits=est.fits,
                       in_fit_set=in_fit_set(case.id))
    if case.measured_memory:
        result.memory_measured = case.measured_memory
        result.memory_error = peak / case.measured_memory - 1
    return result


def with_band(result: RunResult, case: Case) -> RunResult:
    """``result`` with the band meshplan quotes for the case's plan (specs/bands.py)."""
    from meshplan.specs.bands import training_band  # noqa: PLC0415

    b = training_band(case.model, case.cluster, case.plan, case.stack)
    return replace(result, band=b.half_width, band_coverage=b.coverage, band_note=b.note)


def evaluated(case: Case, eff: Efficiency) -> RunResult:
    """evaluate_case, where a mapped plan the estimate cannot price (sizes past its arithmetic) is a Skip."""
    try:
        result = evaluate_case(case, eff)
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise Skip(f"estimate failed on the record's model and plan ({type(exc).__name__}: {exc})") from exc
    if result.error is None or not math.isfinite(result.error):
        raise Skip(f"prediction of {case.metric} not finite ({result.predicted!r}; measured {case.measured!r})")
    return result
