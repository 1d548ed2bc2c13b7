"""Rules of pipeline layouts the check of a plan (specs/check.py) applies beyond each schedule's own refusals
(meshplan.pipeline.rules, through its registry): an uneven first stage's layer count and the per-rank settings."""

from __future__ import annotations

from meshplan.pipeline.registry import REGISTRY, schedule_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import RECOMPUTE, SCHEDULES, Plan


def check_first_stage(model: ModelSpec, plan: Plan) -> list[str]:
    """An uneven first stage: with a pipeline, leaving the other ranks at least one layer per model chunk."""
    first, last = plan.first_stage_layers, plan.last_stage_layers
    if not isinstance(first, int) or isinstance(first, bool) or first < 0 or not first:
        return []
    if plan.pp == 1:
        return [f"first_stage_layers={first} needs pp > 1 (a pipeline whose first stage it sizes)"]
    rest, ranks = model.num_layers - first - (last or 0), (plan.pp - 1 - (last > 0)) * plan.vpp
    if rest < ranks or (ranks == 0 and rest != 0):
        return [f"first_stage_layers={first} leaves {rest} of num_layers={model.num_layers} for the other "
                f"{ranks} model chunks (each needs at least one layer; with pp=2 and last_stage_layers the two "
                f"must sum to num_layers)"]
    # a middle rank holding more layers than the first: every rank priced apart (step/ranks.py), as far as it models
    middle = -(-rest // (ranks // plan.vpp)) if ranks else 0
    if plan.pp > 2 and middle > first and (problem := _apart_problem(plan)):
        return [f"first_stage_layers={first} leaves the middle pipeline ranks {middle} layers each, more than the "
                f"first: {problem}"]
    return []


def check_stage_layers(model: ModelSpec, plan: Plan) -> list[str]:
    """Per-rank layer counts (Plan.stage_layers, Megatron-Core's pipeline_model_parallel_layout, which asserts that
    its decoder layers sum to num_layers and that every (rank, chunk) has a place): one count per pipeline rank, each at
    least one layer per model chunk and a multiple of vpp, summing to the layers, on a plan whose ranks can be priced
    apart, and not beside the first / last stage counts (Megatron-Core refuses the layout with them:
    TransformerConfig.__post_init__, 'pipeline_model_parallel_layout cannot be set with other pipeline layout
    arguments')."""
    layers = plan.stage_layers
    if not layers:
        return []
    if not isinstance(layers, tuple) or any(not isinstance(n, int) or isinstance(n, bool) for n in layers):
        return [f"stage_layers={layers!r} must list a layer count per pipeline rank"]
    shown = ",".join(map(str, layers))
    if plan.pp == 1 or len(layers) != plan.pp:
        return [f"stage_layers={shown} needs one count per pipeline rank (pp={plan.pp} > 1)"]
    reasons = []
    if min(layers) < plan.vpp or any(n % plan.vpp for n in layers):
        reasons.append(f"stage_layers={shown}: each rank needs a positive multiple of vpp={plan.vpp} layers (one or "
                       "more per model chunk)")
    if sum(layers) != model.num_layers:
        reasons.append(f"stage_layers={shown} sums to {sum(layers)}, not num_layers={model.num_layers}")
    if plan.first_stage_layers or plan.last_stage_layers:
        reasons.append(f"stage_layers={shown} gives every rank its count: first_stage_layers and last_stage_layers "
                       "must be 0 beside it")
    if schedule_of(plan.schedule).even_stages:
        reasons.append(f"schedule={plan.schedule} runs even stages: stage_layers must be left out")
    elif problem := _apart_problem(plan):
        reasons.append(f"stage_layers: {problem}")
    return reasons


def _apart_problem(plan: Plan) -> str:
    """Why the ranks of ``plan`` cannot be priced apart (step/ranks.py), "" if they can: DualPipe's ranks hold two
    stages each, the asynchronous schedules' weight versions and offloaded weights are priced for the end ranks only."""
    if plan.schedule in SCHEDULES and not schedule_of(plan.schedule).priced_apart:
        others = " and ".join(s.name for s in REGISTRY.values() if s.flushes and not s.priced_apart)  # DualPipe
        return f"ranks priced apart need a synchronous schedule other than {others} (got {plan.schedule})"
    if plan.offload_weights:
        return "ranks priced apart need the weights on the GPU (offload_weights is priced for the end ranks only)"
    return ""


def check_stage_settings(model: ModelSpec, plan: Plan) -> list[str]:
    """Per-rank recompute and offload (Plan.stage_recompute, Plan.stage_offload): one entry per pipeline rank, each
    a known setting, on a plan whose ranks can be priced apart."""
    recompute, offload = plan.stage_recompute, plan.stage_offload
    if not recompute and not offload:
        return []
    reasons = []
    for name, value in (("stage_recompute", recompute), ("stage_offload", offload)):
        if value and (not isinstance(value, tuple) or len(value) != plan.pp):
            reasons.append(f"{name}={_shown(value)} needs one entry per pipeline rank (pp={plan.pp})")
    bad = [e for e in recompute if not (isinstance(e, str) and (e in RECOMPUTE or e.isdigit()))]
    if bad:
        reasons.append(f"stage_recompute entry {bad[0]!r} must be none, selective, full or a layer count 0-"
                       f"{model.num_layers}")
    if any(not isinstance(e, int) or isinstance(e, bool) or e < 0 for e in offload):
        reasons.append(f"stage_offload={_shown(offload)} must list non-negative layer counts")
    if plan.pp == 1:
        reasons.append("stage_recompute / stage_offload need pp > 1 (a pipeline whose ranks they set)")
    elif problem := _apart_problem(plan):
        reasons.append(f"stage_recompute / stage_offload: {problem}")
    return reasons


def _shown(value: object) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else repr(value)
