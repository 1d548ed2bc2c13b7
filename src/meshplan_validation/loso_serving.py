"""Leave-one-source-out errors of the serving runs (issue 79): each run priced with the serving constants of the
registry (fitted.py) refitted without the run's source, beside its in-sample error.

The shipped fit (benchmarks/measure/fit_inference.py) fits, on the fit half of data/serving/published_serving.jsonl, the
decode attention's share of the streaming rate (``kv_read``), the MoE path's rate (``experts``) and the host time per
iteration of TensorRT-LLM's and LMDeploy's engines, minimising the mean over source groups of the mean
min(|log(predicted / measured)|, 0.7) of each run's throughput and, where measured, its inter-token latency (the
PyTorch backend's host time per request is NVIDIA's measurement, not fitted: presets/engines/trtllm-pytorch.toml).
Here the same objective over the linearised predictions (refit.py), without the source, every constant free within
fit_inference.py's bounds, but one that none of the kept runs reads: that one takes its prior (fitted.py;
refit.Linear ``unmoved``); the refitted values are then priced exactly on the source's runs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan_validation.fitted import Fitted, by_name
from meshplan_validation.provenance import record_source
from meshplan_validation.refit import Coordinate, Linear
from meshplan_validation.robust_loss import SERVING as LOSS
from meshplan_validation.serving_eval import ServingResult, results
from meshplan_validation.serving_map import case_of

EFFICIENCY = (Coordinate("kv_read", (0.3, 1.0)), Coordinate("experts", (0.15, 1.0)))
ENGINES = {"trtllm": ("iteration_overhead", "trtllm iteration_overhead", (0.0, 10e-3), 0.5e-3),
           "lmdeploy": ("iteration_overhead", "lmdeploy iteration_overhead", (0.0, 10e-3), 0.5e-3)}
COORDS = EFFICIENCY + tuple(Coordinate(engine, bounds, log=False, step=step)
                            for engine, (_, _, bounds, step) in ENGINES.items())
# constants fitted on one source only: without it they fall to their priors (fitted.py), otherwise they keep their
# shipped values (no refit needed): (registry name, the engine presets that carry it, the field)
# vLLM's untuned ROCm builds (engine_versions.toml): over PyTorch >= 2.5 (hipBLASLt), and over 2.4 (rocBLAS)
ROCM = ("vllm-v0.5-rocm", "vllm-v0.6-rocm", "vllm-v0.6.2-rocm")
ROCBLAS = ("vllm-v0.6.2-rocm-rocblas",)
SINGLE = (("vLLM V0 iteration_latency", ("vllm-v0.5", "vllm-v0", *ROCM, *ROCBLAS), "iteration_latency"),
          ("vLLM ROCm skinny_gemm_rate", ROCM, "skinny_gemm_rate"),
          ("vLLM ROCm skinny_gemm_rate, rocBLAS", ROCBLAS, "skinny_gemm_rate"),
          ("vLLM ROCm kernel_gap", (*ROCM, *ROCBLAS), "kernel_gap"))
# A single-source constant that other sources' runs price too: without its own source it is refitted on the runs of
# every other source it prices (``alternate_fit``) rather than falling to its prior. vLLM V0's iteration latency
# (fitted on Argonne's H100 runs; its prior, 0.1 ms, is the floor the CPU measurement of the loop leaves out,
# fitted.py) also prices AMD's MI300X runs of vLLM 0.6.6 and 0.7.3 (data/serving/published_serving.jsonl, source
# amd_vllm) and dstack's of upstream vLLM 0.6.3 (data/serving/dstack_mi300x.jsonl): the same loop on another GPU, host,
# engine version and model. (registry name -> the fit's bounds: fit_llm_inference_bench.py BOUNDS)
ALTERNATE = {"vLLM V0 iteration_latency": (0.0, 4e-3)}
GRID, GOLDEN_ROUNDS = 16, 12  # 0.25 ms a cell, then 0.618**12 of two cells: 1.6 us
# a cluster field a trial may set on the hosts at python_host >= 2 (specs/regime.py SLOW_HOST): Grace's interpreter
# speed, a measurement since 2026-12-01 (hardware/gh200.toml), no longer in the registry: never refitted out of source
GRACE = "Grace interpreter_host"


def priced(records: list[dict[str, Any]], values: dict[str, float] | None = None) -> list[ServingResult]:
    """serving_eval.results at ``values`` (the shipped constants where a name is absent; a single-source constant of
    ``SINGLE`` by its registry name, the slow hosts' interpreter speed by ``GRACE``)."""
    values = values or {}
    eff = replace(SERVE_DEFAULT, **{c.name: values[c.name] for c in EFFICIENCY if c.name in values})
    engines: dict[str, dict[str, float]] = {engine: {field: values[engine]} for engine, (field, *_) in
                                            ENGINES.items() if engine in values}
    for name, presets, field in SINGLE:
        if name in values:
            for preset in presets:
                engines.setdefault(preset, {})[field] = values[name]
    hosts = {"interpreter_host": values[GRACE]} if GRACE in values else None
    return results(records, eff, engines, hosts)


def shipped() -> dict[str, float]:
    values = {c.name: float(getattr(SERVE_DEFAULT, c.name)) for c in EFFICIENCY}
    return values | {engine: by_name(name).value() for engine, (_, name, _, _) in ENGINES.items()}


def observed(r: ServingResult) -> bool:
    """An observation of the shipped fit's objective: a run's headline throughput, or its inter-token latency."""
    return r.predicted is not None and r.error is not None and r.error > -1 and (r.headline or r.metric == "itl_ms")


def linearised(records: list[dict[str, Any]]) -> Linear:
    """The fit runs' observations as linear functions of the serving constants (refit.Linear)."""
    values = shipped()
    base_results = priced(records, values)
    keep = [i for i, r in enumerate(base_results) if observed(r)]
    base = np.array([math.log(base_results[i].predicted or 1.0) for i in keep])
    jac = np.zeros((len(keep), len(COORDS)))
    for k, coord in enumerate(COORDS):
        moved = coord.stepped(values[coord.name])
        out = priced(records, values | {coord.name: moved})
        dx = coord.to_x(moved) - coord.to_x(values[coord.name])
        jac[:, k] = (np.array([math.log(out[i].predicted or 1.0) for i in keep]) - base) / dx
    chosen = [base_results[i] for i in keep]
    return Linear(coords=COORDS, x0=np.array([c.to_x(values[c.name]) for c in COORDS]), base=base,
                  measured=np.log([r.measured for r in chosen]), groups=np.array([r.group for r in chosen]),
                  sources=np.array([record_source({"group": r.group}) for r in chosen]), jacobian=jac, loss=LOSS)


def fit_sources() -> frozenset[str]:
    """The sources any serving constant of the registry was fitted on."""
    return frozenset().union(*(by_name(n).sources for n in ("kv_read", "experts")),
                             *(by_name(name).sources for _, name, _, _ in ENGINES.values()))


def prior_values(name: str) -> dict[str, float]:
    """The ``priced`` values that put the registry's serving constant ``name`` at its prior."""
    f = by_name(name)
    engine = next((e for e, (_, n, _, _) in ENGINES.items() if n == name), None)
    return {engine or name: f.prior}


def single_without(source: str, records: Sequence[dict[str, Any]] = ()) -> dict[str, float]:
    """The single-source constants where ``source`` is theirs (else nothing: shipped): refitted on the runs of the
    other sources in ``records`` where ``ALTERNATE`` allows and one of them prices it, else at their priors."""
    out = {}
    others = [r for r in records if record_source(r) != source]
    for name in (n for n, _, _ in SINGLE):
        if by_name(name).sources == {source}:
            fitted = alternate_fit(name, others) if name in ALTERNATE else None
            out[name] = by_name(name).prior if fitted is None else fitted
    return out


def judged(results: list[ServingResult]) -> list[ServingResult]:
    """Each run's observation that judges it: its headline throughput, or, for a run that measured no throughput
    and was not driven at an offered rate, the first metric it measured (benchmarks/docs/out_of_source.py)."""
    headed = {r.id for r in results if r.headline}
    out: list[ServingResult] = []
    seen: set[str] = set()
    for r in results:
        if r.error is not None and (r.headline or (r.id not in headed and r.id not in seen and r.mode != "rate")):
            out.append(r)
            seen.add(r.id)
    return out


def alternate_fit(name: str, records: list[dict[str, Any]]) -> float | None:
    """``name`` fitted on ``records``: the median |log(predicted / measured)| of the judged observations it moves
    (a run it does not price leaves the median alone), by golden-section search over ``ALTERNATE``'s bounds; None
    where it moves none."""
    lo, hi = ALTERNATE[name]
    moved = moving(name, reading(name, records), lo, hi)
    if not moved:
        return None

    def objective(x: float) -> float:
        return float(np.median([abs(math.log1p(r.error)) for r in judged(priced(moved, {name: x}))
                                if r.error is not None and r.error > -1]))

    return grid_golden(objective, lo, hi)


def moving(name: str, records: Sequence[dict[str, Any]], lo: float, hi: float) -> list[dict[str, Any]]:
    """The records whose judged observation ``name`` moves: priced at ``lo`` and at ``hi``, predicted apart."""
    ends = [{r.id: r for r in judged(priced(list(records), {name: x}))} for x in (lo, hi)]
    return [r for r in records if r["id"] in ends[0] and r["id"] in ends[1]
            and ends[0][r["id"]].predicted != ends[1][r["id"]].predicted]


def reading(name: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records that ``name`` (one of ``SINGLE`` or ``GRACE``) can move, without pricing them: ``priced`` writes a
    ``SINGLE`` constant only into its engine presets (``GRACE`` only into the slow hosts' cluster fields), and
    serving_eval.results swaps a case's engine only where its preset is one of those (its cluster only where
    python_host >= 2); every other record is priced from the same case at any value, so ``moving`` finds the same
    runs in these as in all. Whole ids, as ``judged`` picks an observation per id."""
    presets = next((p for n, p, _ in SINGLE if n == name), None)
    if presets is None and name != GRACE:
        return list(records)

    def reads(r: dict[str, Any]) -> bool:
        case = case_of(r)
        return not isinstance(case, str) and (case.engine.name in presets if presets is not None
                                              else case.cluster.python_host >= 2)
    ids = {r["id"] for r in records if reads(r)}
    return [r for r in records if r["id"] in ids]


def grid_golden(objective: Callable[[float], float], lo: float, hi: float) -> float:
    """The minimum of ``objective`` over [lo, hi]: a median over runs is not unimodal, so the best of ``GRID`` cells'
    ends, then ``GOLDEN_ROUNDS`` of golden-section search over the two cells beside it."""
    step = (hi - lo) / GRID
    best = min((lo + i * step for i in range(GRID + 1)), key=objective)
    a, b, ratio = max(lo, best - step), min(hi, best + step), (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = objective(c), objective(d)
    for _ in range(GOLDEN_ROUNDS):  # one new probe a round: the kept one is the next round's other
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = objective(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = objective(d)
    return (a + b) / 2


def owners() -> dict[str, Fitted]:
    """The registry's entry of each coordinate of the linearised fit (``COORDS``)."""
    return {c.name: by_name(c.name) for c in EFFICIENCY} | {
        engine: by_name(name) for engine, (_, name, _, _) in ENGINES.items()}


def refit_without(linear: Linear, source: str) -> dict[str, float]:
    """The serving constants refitted without ``source``; a constant not fitted on it keeps its shipped value, and one
    fitted on it that none of the kept runs reads (its only source, or the others' runs do not price it: refit.Linear
    ``unmoved``) falls to its prior."""
    fitted = owners()
    found = linear.refit(source, priors={k: f.prior for k, f in fitted.items()})
    values = shipped()
    return {k: (values[k] if source not in fitted[k].sources else fitted[k].prior
                if fitted[k].sources == {source} else found[k]) for k in values}
