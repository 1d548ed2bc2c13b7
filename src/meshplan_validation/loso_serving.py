"""Leave-one-source-out errors of the serving runs (issue 79): each run priced with the serving constants of the
registry (fitted.py) refitted without the run's source, beside its in-sample error.

The shipped fit (benchmarks/measure/fit_inference.py) fits, on the fit half of data/serving/published_serving.jsonl, the
decode attention's share of the streaming rate (``kv_read``), the MoE path's rate (``experts``) and the host time per
iteration of TensorRT-LLM's and LMDeploy's engines (and, per sequence, of TensorRT-LLM's PyTorch backend), minimising
the mean over source groups of the mean min(|log(predicted / measured)|, 0.7) of each run's throughput and, where
measured, its inter-token latency. Here the same objective over the linearised predictions (refit.py), without the
source, every constant free within fit_inference.py's bounds; the refitted values are then priced exactly on the
source's runs.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan_validation.fitted import by_name
from meshplan_validation.provenance import record_source
from meshplan_validation.refit import Coordinate, Linear
from meshplan_validation.serving_eval import ServingResult, results

CAP = 0.7  # fit_inference.py's clip
EFFICIENCY = (Coordinate("kv_read", (0.3, 1.0)), Coordinate("experts", (0.15, 1.0)))
ENGINES = {"trtllm": ("iteration_overhead", "trtllm iteration_overhead", (0.0, 10e-3), 0.5e-3),
           "lmdeploy": ("iteration_overhead", "lmdeploy iteration_overhead", (0.0, 10e-3), 0.5e-3),
           "trtllm-pytorch": ("sequence_overhead", "trtllm-pytorch sequence_overhead", (0.0, 50e-6), 5e-6)}
COORDS = EFFICIENCY + tuple(Coordinate(engine, bounds, log=False, step=step)
                            for engine, (_, _, bounds, step) in ENGINES.items())
# constants fitted on one source only: without it they fall to their priors (fitted.py), otherwise they keep their
# shipped values (no refit needed): (registry name, the engine presets that carry it, the field)
ROCM = ("vllm-v0.5-rocm", "vllm-v0.6-rocm", "vllm-v0.6.2-rocm")  # vLLM's untuned ROCm builds (engine_versions.toml)
SINGLE = (("vLLM V0 iteration_latency", ("vllm-v0.5", "vllm-v0", *ROCM), "iteration_latency"),
          ("vLLM ROCm skinny_gemm_rate", ROCM, "skinny_gemm_rate"),
          ("vLLM ROCm kernel_gap", ROCM, "kernel_gap"))
GRACE = "Grace interpreter_host"  # a cluster field: the hosts at python_host >= 2 (specs/regime.py SLOW_HOST)


def priced(records: list[dict[str, Any]], values: dict[str, float] | None = None) -> list[ServingResult]:
    """serving_eval.results at ``values`` (the shipped constants where a name is absent; a single-source constant of
    ``SINGLE`` or ``GRACE`` by its registry name)."""
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
                  sources=np.array([record_source({"group": r.group}) for r in chosen]), jacobian=jac, cap=CAP)


def fit_sources() -> frozenset[str]:
    """The sources any serving constant of the registry was fitted on."""
    return frozenset().union(*(by_name(n).sources for n in ("kv_read", "experts")),
                             *(by_name(name).sources for _, name, _, _ in ENGINES.values()))


def prior_values(name: str) -> dict[str, float]:
    """The ``priced`` values that put the registry's serving constant ``name`` at its prior."""
    f = by_name(name)
    engine = next((e for e, (_, n, _, _) in ENGINES.items() if n == name), None)
    return {engine or name: f.prior}


def single_without(source: str) -> dict[str, float]:
    """The single-source constants at their priors where ``source`` is theirs (else nothing: shipped)."""
    return {name: by_name(name).prior for name in (*(n for n, _, _ in SINGLE), GRACE)
            if by_name(name).sources == {source}}


def refit_without(linear: Linear, source: str) -> dict[str, float]:
    """The serving constants refitted without ``source``; a constant not fitted on it keeps its shipped value."""
    found = linear.refit(source)
    values = shipped()
    owners = {c.name: by_name(c.name) for c in EFFICIENCY} | {
        engine: by_name(name) for engine, (_, name, _, _) in ENGINES.items()}
    return {k: (values[k] if source not in owners[k].sources else owners[k].prior
                if owners[k].sources == {source} else found[k]) for k in values}
