"""The trust panel: how far a plan's predicted step time may be from the real one, the published runs that say so, and
what the estimate assumed.

- The error band (``Estimate.band``, presets/error_bands.json): from the out-of-source |predicted / measured − 1| of
  the measured runs of the plan's regime, widened to hold for a source not yet measured (specs/regime.py,
  specs/bands.py), and how many runs of how many sources it rests on.
- The nearest runs: presets/validation_runs.json, which benchmarks/docs/accuracy.py writes from the validation layer
  (benchmarks/measure/validation_runs.py) and tests/test_docs.py keeps current, so that the core reads the runs as
  packaged data and never imports meshplan_validation. Runs of the same GPU generation and model class come first, then
  by how far their parallel shape is (``distance``).
- The assumptions: what the estimate takes as given for this plan (``assumptions``), each with where it lives.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from meshplan.files import PRESETS
from meshplan.specs.layouts import layout_of
from meshplan.specs.stack import OVERLAP_FLAGS
from meshplan.units import fmt_bytes

if TYPE_CHECKING:
    from meshplan.estimate import Estimate

NEAREST = 5


@lru_cache(maxsize=4)
def packaged(name: str) -> Any:
    """A file of measured errors that the validation layer writes under presets/ and the trust notes of both
    reports read as packaged data (validation_runs.json, serving_errors.json)."""
    return json.loads((PRESETS / name).read_text())


def runs() -> list[dict[str, Any]]:
    """The evaluated published runs (presets/validation_runs.json), one dict each."""
    data = packaged("validation_runs.json")
    return [dict(zip(data["fields"], row, strict=True)) for row in data["runs"]]


def _log2(a: float, b: float) -> float:
    return abs(math.log2(max(a, 1) / max(b, 1)))


def distance(est: Estimate, run: dict[str, Any], params_b: float | None = None) -> float:
    """How far a run's parallel shape is from the plan's: |log2| ratios of the tensor (tp·tp2), pipeline, context and
    expert sizes, plus half those of the GPU count and the parameter count (``params_b``, billions: the model's
    when not given; ``nearest`` counts it once for all runs)."""
    size = est.model.params() / 1e9 if params_b is None else params_b
    return _distance(_shape(est, size), run)


def _shape(est: Estimate, params_b: float) -> tuple[float, ...]:
    """What ``distance`` reads of a plan: tp·tp2, pp, cp, ep, the GPU count and the parameters (billions)."""
    p = est.plan
    return p.tp * p.tp2, p.pp, p.cp, p.ep, est.cluster.num_gpus, params_b


def _distance(shape: tuple[float, ...], run: dict[str, Any]) -> float:
    tp, pp, cp, ep, gpus, size = shape
    return (_log2(tp, run["tp"] * run["tp2"]) + _log2(pp, run["pp"]) + _log2(cp, run["cp"]) + _log2(ep, run["ep"])
            + 0.5 * _log2(gpus, run["gpus"]) + 0.5 * _log2(size, run["params_b"]))


def nearest(est: Estimate, k: int = NEAREST) -> list[dict[str, Any]]:
    """The ``k`` runs nearest the plan: same GPU generation, model class and GEMM precision first (issue 48: fp8 runs
    stood as evidence for a bf16 plan), then by ``distance``; each with ``same_generation``, ``same_class``,
    ``same_precision`` and ``distance``."""
    arch, size = est.cluster.accelerator.architecture or "unstated", est.model.params() / 1e9
    found = _nearest(arch, est.model.is_moe, _precision(est.plan.precision), _shape(est, size), k)
    return [dict(r) for r in found]


@lru_cache(maxsize=256)  # the report's plans share shapes (they differ in ZeRO, recompute, micro-batch ...)
def _nearest(arch: str, moe: bool, precision: str, shape: tuple[float, ...], k: int) -> tuple[dict[str, Any], ...]:
    every, columns = _columns()  # sorted by keys alone (the index keeps equal keys in order), a dict for the k first
    # ``_distance`` of every run, its |log2| ratios looked up per distinct value of each column (the same numbers)
    tp, pp, cp, ep, gpus, size = ({v: _log2(x, v) for v in set(col)}
                                  for x, col in zip(shape, columns[3:9], strict=True))
    keys = sorted((a != arch, m != moe, p != precision,
                   tp[t] + pp[q] + cp[c] + ep[e] + 0.5 * gpus[g] + 0.5 * size[b], i_d, i)
                  for i, (a, m, p, t, q, c, e, g, b, i_d) in enumerate(zip(*columns, strict=True)))
    return tuple(every[i] | {"same_generation": not g, "same_class": not c, "same_precision": not p, "distance": d}
                 for g, c, p, d, _, i in keys[:k])


@lru_cache(maxsize=1)
def _columns() -> tuple[list[dict[str, Any]], tuple[tuple[Any, ...], ...]]:
    """The runs, and the columns ``_nearest`` sorts them by: architecture, moe, precision family, then what
    ``_distance`` reads (tp·tp2, pp, cp, ep, GPUs, parameters in billions), then the id."""
    every = runs()
    rows = [(r["architecture"], r["moe"], _precision(r["precision"]), r["tp"] * r["tp2"], r["pp"], r["cp"], r["ep"],
             r["gpus"], r["params_b"], r["id"]) for r in every]
    return every, tuple(zip(*rows, strict=True)) if rows else ((),) * 10


def _precision(name: str) -> str:
    """The GEMMs' number format family: fp16 and bf16 are one (16-bit), fp8 and mxfp8 one (8-bit)."""
    return {"fp16": "16-bit", "bf16": "16-bit", "fp8": "8-bit", "mxfp8": "8-bit"}.get(name, name)


def band_note(est: Estimate) -> str:
    """Where the plan's band comes from: the regime of measured runs, how many there are, the share of a source not
    yet measured it is built to hold, and the line that says so where no measured run is like the plan or where out
    of source it held for fewer (specs/bands.py)."""
    b = est.band
    where = b.basis or "every regime"
    text = (f"from the {b.runs} measured runs of {b.sources} source{'s' if b.sources != 1 else ''} like it ({where}), "
            f"each priced with the fitted constants refitted without its source, widened to hold {b.coverage:.0%} of "
            "the runs of a source not yet measured")
    return f"{text}; {b.note}" if b.note else text


def assumptions(est: Estimate, headroom: float) -> list[tuple[str, str]]:
    """(assumption, where it lives) for this estimate."""
    p, s, acc, m = est.plan, est.stack, est.cluster.accelerator, est.model
    overlaps = [f"{f}: {'yes' if getattr(s, f) else 'no'}" for f in OVERLAP_FLAGS]
    out = [(f"the {s.name} stack{f' {s.version}' if s.version else ''} runs the plan: its kernels and overlap "
            f"({', '.join(overlaps)})", f"presets/stacks/{s.name}.toml"),
           ("kernel times from meshplan's fitted efficiency curves, not measured on your GPUs (meshplan calibrate "
            "measures them)", "specs/efficiency.py"),
           (f"collectives priced α + n·β per link tier with the {est.cluster.name} preset's bandwidths "
            f"(NVLink {fmt_bytes(acc.nvlink_bandwidth)}/s per GPU, domain of {est.cluster.nvlink_domain})",
            "collectives/comm.py"),
           (f"{p.precision} GEMMs; MFU against the dense {p.precision} peak, {est.peak_flops_per_gpu / 1e12:.0f} "
            "TFLOP/s per GPU", f"presets/hardware ({acc.name})"),
           ("the training step only: no data loading, logging, checkpointing or evaluation", "estimate.py")]
    if headroom:
        out.append((f"{headroom:.0%} of HBM left free for what the memory model leaves out (allocator "
                    "fragmentation, the CUDA context): the model's largest peak-memory error", "search/space.py"))
    if m.is_moe:
        out.append(("tokens routed evenly over the experts", "cost/mlp_moe.py"))
    if p.pp > 1:
        out.append(("each kind of layer spread evenly over the pipeline stages; ranks simulated with their own "
                    "times", "cost/params.py, pipeline/bubble.py, pipeline/simulator.py"))
    if (assumed := layout_of(p.tensor_layout).assumption) is not None:
        out.append(assumed)
    if p.offload_optimizer or p.offload_activations:
        out.append((f"host copies at {fmt_bytes(est.cluster.host_bandwidth)}/s per GPU", "step/channels.py"))
    return out


def trust_rows(plans: Sequence[Any], headroom: float) -> list[dict[str, Any]]:
    """Per held plan (detail.Detailed), what its trust panel shows."""
    out = []
    for d in plans:
        e = d.est
        near = [[r["id"], r["gpu"], r["model"], r["gpus"],
                 "·".join(map(str, (f"{r['tp']}×{r['tp2']}" if r["tp2"] > 1 else r["tp"], r["pp"], r["cp"], r["ep"]))),
                 r["metric"].replace("_", " "), _num(r["measured"]), _num(r["predicted"]), f"{r['error']:+.1%}",
                 r["precision"],
                 ", ".join(x for x, on in (("generation", r["same_generation"]), ("class", r["same_class"]),
                                           ("precision", r["same_precision"])) if on) or "none"] for r in nearest(e)]
        out.append({"id": d.id, "label": f"{d.origin}: {e.plan.describe()}", "band": f"±{e.error_band:.1%}",
                    "step": e.step_time, "low": e.step_time * (1 - e.error_band),
                    "high": e.step_time * (1 + e.error_band), "band_note": band_note(e), "nearest": near,
                    "assumptions": assumptions(e, headroom)})
    return out


def _num(x: float) -> str:
    """4 significant digits, thousands grouped: 23,410 rather than 2.341e+04."""
    return f"{float(f'{x:.4g}'):,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
