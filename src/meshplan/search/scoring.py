"""Vectorised scoring: the step time and the memory of a batch of plans under every setting of the space's grid
(recompute × ZeRO × optimizer offload × activation offload) at once, with NumPy.

The step is ``estimate()``'s own composition (step.assemble.compose) under the whole grid; the memory the same
functions as ``estimate()``, on arrays, each part computed for the settings it changes with. The step times are
float32 (ranking only: the search re-estimates its winners in float64).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.cost.params import stage_params
from meshplan.memory import buffer_memory, model_states
from meshplan.search.batch import PlanBatch
from meshplan.search.space import Space
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.step.assemble import compose
from meshplan.step.memory import activation_memory, offloaded_activations
from meshplan.step.units import Units


def grid_times(model: ModelSpec, cluster: Cluster, batch: PlanBatch, units: dict[str, Units], space: Space,
               eff: Efficiency) -> np.ndarray:
    """Step time of every settings combination of a chunk, shape (recompute, zero, offload opt, offload act, plan):
    the step as estimate() composes it (step.assemble.compose, each part computed once for the settings it changes
    with, and ``EndSteps.total``), in float32 (ranking only; the winners are re-estimated in float64)."""
    out = np.empty((len(space.recompute), len(space.zero), len(space.offload_optimizer),
                    len(space.offload_activations), len(batch)), dtype=np.float32)
    for index, step in compose(model, cluster, batch, units, space, space.stack, eff, np.float32):
        step.total(out=out[index])
    return out


def grid_memory(model: ModelSpec, batch: PlanBatch, units: dict[str, Units], space: Space
                ) -> tuple[np.ndarray, np.ndarray]:
    """Peak HBM and host (offload) bytes of every settings combination, shape (recompute, zero, offload opt,
    offload act, plan). Memory does not depend on the placement, so the search calls this once per size
    combination, not per placement."""
    rcs, zeros = space.recompute, space.zero
    oos, oas = space.offload_optimizer, space.offload_activations
    n = len(batch)
    with_rc = {rc: replace(batch, recompute=rc) for rc in rcs}
    ends = (stage_params(model, batch, True), stage_params(model, batch, False))
    # model states per ZeRO stage and end; an offloaded optimizer state leaves the GPU for the host
    # (memory.offloaded_optimizer: the first rank's optimizer bytes)
    kept = {z: [model_states(end, replace(batch, zero=z, offload_optimizer=False), space.stack, last)
                for end, last in zip(ends, (False, True), strict=True)] for z in zeros}
    states = np.array([[[_vec(w + g + (0.0 if oo else o), n) for w, g, o in kept[z]] for oo in oos]
                       for z in zeros])  # (Z, O, 2, n)
    acts = np.array([[[_vec(a, n) for a in activation_memory(model, replace(with_rc[rc], offload_activations=oa),
                                                              space.stack, units[rc])] for oa in oas]
                      for rc in rcs])  # (R, A, 2, n)
    buffers = np.array([_vec(buffer_memory(model, replace(batch, zero=z)), n) for z in zeros])  # (Z, n)
    host_opt = np.array([[_vec(kept[z][0][2] if oo else 0.0, n) for oo in oos] for z in zeros])  # (Z, O, n)
    host_act = np.array([[_vec(offloaded_activations(model, replace(with_rc[rc], offload_activations=oa),
                                                     units[rc]), n) for oa in oas] for rc in rcs])  # (R, A, n)
    peak = states[None, :, :, None, 0] + acts[:, None, None, :, 0]  # (R, Z, O, A, n): the first rank
    np.maximum(peak, states[None, :, :, None, 1] + acts[:, None, None, :, 1], out=peak)  # or the last
    peak += buffers[None, :, None, None]
    return peak, host_opt[None, :, :, None] + host_act[:, None, None]


def _vec(x: object, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float32), (n,))
