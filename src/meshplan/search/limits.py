"""What a space must satisfy before any plan is built: at most ``Space.max_plans`` plans (counted without building
them), and shared settings that some plan can take."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from meshplan.errors import SpecError
from meshplan.search.combos import Combo, valid_combos
from meshplan.search.placements import PLACEMENTS, distinct_placements
from meshplan.search.space import Space
from meshplan.specs.check import settings_problems
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import DENSE_AXES


def plan_count(combos: list[Combo], cluster: Cluster, space: Space) -> int:
    """The plans of these size combinations, counted before any is built: per combination its micro-batch ×
    interleaving × expert options × distinct placements × the categorical grid. The search evaluates all of them
    but the interleaved ones whose micro-batches pp does not divide, which it rejects."""
    per = np.array([c.unplaced for c in combos], dtype=np.int64)
    if not (space.all_placements and combos):
        return int(per.sum())
    sizes = np.array([[getattr(c, a) for a in DENSE_AXES] for c in combos], dtype=np.int64)
    placements = np.array([len(p) for p in distinct_placements(sizes, cluster.mesh_shape)], dtype=np.int64)
    return int(per @ placements)


def check_space(model: ModelSpec, cluster: Cluster, space: Space, combos: list[Combo] | None = None) -> None:
    """Raise SpecError if ``space`` holds more than ``space.max_plans`` plans (counted only when every placement
    differing could exceed it: counting the distinct placements costs about what building them does), or if its
    shared settings no plan can take (a precision the GPU lacks: every plan would be invalid). ``search`` checks it
    on its size ``combos``; a sweep checks every point before any runs."""
    if combos is None:
        try:
            hash((model, cluster, space))
        except TypeError:  # a field that cannot be hashed: checked again each time
            return _check(model, cluster, space, valid_combos(model, cluster, space)[0])
        return _passed(model, cluster, space)
    return _check(model, cluster, space, combos)


@lru_cache(maxsize=16)
def _passed(model: ModelSpec, cluster: Cluster, space: Space) -> None:
    """``check_space`` on the space's own size combinations, remembered where it passes (an error is raised again
    each time): the report checks its GPU count before its search and again among its scaling counts
    (sweep.param_points), about 5 ms each for Llama-3-70B on 256 H100."""
    _check(model, cluster, space, valid_combos(model, cluster, space)[0])


def _check(model: ModelSpec, cluster: Cluster, space: Space, combos: list[Combo]) -> None:
    shared = {k: v for k, v in space.settings.items() if k not in ("recompute_layers", "offload_layers")}  # per setting
    problems = settings_problems(model, cluster, shared, space.stack)
    if space.stack.overlap_ep and "full" in space.recompute:
        problems.append("overlap_ep (Megatron-Core's combined 1F1B) cannot run full recompute: search recompute "
                        "none, selective")
    if space.stack.overlap_ep and model.mtp_layers > 1:
        problems.append(f"overlap_ep (Megatron-Core's combined 1F1B) needs at most one MTP layer "
                        f"(mtp_layers={model.mtp_layers})")
    if problems:
        raise SpecError("; ".join(problems))
    limit = space.max_plans
    if not limit or sum(c.unplaced for c in combos) * len(PLACEMENTS) <= limit:
        return
    count = plan_count(combos, cluster, space)
    if count > limit:
        raise SpecError(f"the search space of {model.name} on {cluster.num_gpus} GPUs holds {count:,} plans, more than "
                        f"max-plans={limit:,}: narrow it (--no-offload, --placements default; plan also --zero, "
                        "--recompute, --sp, --max-micro-batch) or raise --max-plans")
