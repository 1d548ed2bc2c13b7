"""Vectorised scoring: the step time and the memory of a batch of plans under every setting of the space's grid
(recompute × ZeRO × optimizer offload × activation offload) at once, with NumPy.

The step and the memory are ``estimate()``'s own composition (step.assemble.compose, step.memory_grid.compose_memory)
under the whole grid, each part computed once for the settings it changes with, in float32 (ranking only: the search
re-estimates its winners in float64).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from meshplan.search.batch import PlanBatch
from meshplan.search.space import Space
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.step.assemble import compose
from meshplan.step.grid import Settings, some_settings
from meshplan.step.memory_grid import compose_memory
from meshplan.step.units import Saved, Units


def grid_times(model: ModelSpec, cluster: Cluster, batch: PlanBatch, units: dict[str, Units], space: Space,
               eff: Efficiency, wanted: np.ndarray | None = None) -> np.ndarray:
    """Step time of every settings combination of a chunk, shape (recompute, zero, offload opt, offload act, plan):
    the step as estimate() composes it (step.assemble.compose, each part computed once for the settings it changes
    with, and ``EndSteps.total``), in float32 (ranking only; the winners are re-estimated in float64). With
    ``wanted`` (a bool per setting, the grid's shape), only the recompute modes and activation-offload settings
    of a wanted setting are composed (compose's loops over those two axes), the others' times NaN: each setting's
    step is its own arithmetic, the same numbers whichever others are composed beside it."""
    out = np.empty((len(space.recompute), len(space.zero), len(space.offload_optimizer),
                    len(space.offload_activations), len(batch)), dtype=np.float32)
    rcs, oas = np.arange(len(space.recompute)), np.arange(len(space.offload_activations))
    grid: Settings = space
    if wanted is not None:
        rcs, oas = np.flatnonzero(wanted.any(axis=(1, 2, 3))), np.flatnonzero(wanted.any(axis=(0, 1, 2)))
        if len(rcs) < len(space.recompute) or len(oas) < len(space.offload_activations):
            out.fill(np.nan)
            grid = some_settings(space, rcs, oas)
    for (r, z, o, a), step in compose(model, cluster, batch, units, grid, space.stack, eff, np.float32):
        step.total(out=out[rcs[r], z, o, oas[a]])
    return out


def grid_memory(model: ModelSpec, batch: PlanBatch, units: Mapping[str, Units | Saved], space: Space,
                grid: Settings | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Peak HBM and host (offload) bytes of every settings combination, shape (recompute, zero, offload opt,
    offload act, plan): estimate()'s memory (step.memory_grid.compose_memory) under the whole grid (or ``grid``, some
    of its settings), in float32. Memory does not depend on the placement, so the search calls this once per size
    combination, not per placement."""
    memory = compose_memory(model, batch, units, space if grid is None else grid, space.stack)
    return memory.peak(np.float32), memory.host(np.float32)
