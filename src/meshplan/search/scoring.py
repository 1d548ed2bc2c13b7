"""Vectorised scoring: the step time and the memory of a batch of plans under every setting of the space's grid
(recompute × ZeRO × optimizer offload × activation offload) at once, with NumPy.

The same functions as ``estimate()``, on arrays, each part computed for the settings it changes with. The step times
are float32 (ranking only: the search re-estimates its winners in float64).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from meshplan.bubble import flow_bubble
from meshplan.channels import Offload, Passes, dp_collectives, offload, optimizer_time, step_channels
from meshplan.cost.params import StageParams, stage_params
from meshplan.memory import buffer_memory, model_states
from meshplan.search.batch import PlanBatch
from meshplan.search.space import Space
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.step.memory import activation_memory, offloaded_activations
from meshplan.step.stages import cadence, stage_times
from meshplan.step.units import Units


def grid_times(model: ModelSpec, cluster: Cluster, batch: PlanBatch, units: dict[str, Units], space: Space,
               eff: Efficiency) -> np.ndarray:
    """Step time of every settings combination of a chunk, shape (recompute, zero, offload opt, offload act, plan):
    estimate.assemble's step on arrays, each part computed for the settings it changes with: per recompute mode the
    ranks' passes and the bubble, per offload setting the copies, the channels beside the passes for every ZeRO stage
    at once (channels.step_channels), per ZeRO stage and optimizer offload the optimizer step; the first and the last
    pipeline rank side by side on a leading axis of 2, the longer step taken. float32 (ranking only; the winners are
    re-estimated in float64)."""
    rcs, zeros = space.recompute, space.zero
    oos, oas = space.offload_optimizer, space.offload_activations
    n, m, sd = len(batch), batch.grad_accum, eff.overlap_slowdown
    per_update, updates = cadence(batch)  # PipeDream: an update (DP reduction, optimizer) per micro-batch
    ends = (stage_params(model, batch, True), stage_params(model, batch, False))
    params = StageParams(*(_pair(getattr(ends[0], f), getattr(ends[1], f), n, np.float64)
                           for f in StageParams.__slots__))
    collectives = dp_collectives(model, cluster, batch, params, eff)  # the same for every ZeRO stage
    opt = {(z, oo): optimizer_time(cluster, replace(batch, zero=z, offload_optimizer=oo), params, eff)
           for z in zeros for oo in oos}
    out = np.empty((len(rcs), len(zeros), len(oos), len(oas), n), dtype=np.float32)
    forward: dict = {}  # the forward passes do not change with the recompute mode: priced once without copies
    for r, rc in enumerate(rcs):
        plan = replace(batch, recompute=rc)
        first, last, middle = stage_times(model, plan, space.stack, units[rc])
        bubble = flow_bubble(plan.schedule, plan.pp, plan.vpp, first.total, last.total, middle.total)
        pf, pl = first.passes(), last.passes()
        passes = Passes(*(_pair(getattr(pf, f), getattr(pl, f), n) for f in Passes.__slots__))
        pipelined = m * _pair(first.total, last.total, n)
        for a, oa in enumerate(oas):
            copies = Offload()
            if oa:
                with_oa = replace(plan, offload_activations=True)
                one, two = (offload(model, cluster, with_oa, units[rc].layer_saved, last) for last in (False, True))
                copies = Offload(_pair(one.copy, two.copy, n), _pair(one.share, two.share, n))
            channels = step_channels(passes, per_update, collectives, zeros, copies, sd, space.stack.overlap_dp,
                                     forward)
            for z, zero in enumerate(zeros):
                dp, moved = (updates * x for x in channels[zero])
                base = pipelined + dp + moved
                for o, oo in enumerate(oos):
                    rank = base + updates * opt[zero, oo]
                    np.add(np.maximum(rank[0], rank[1]), bubble, out=out[r, z, o, a], casting="unsafe")
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


def _pair(first: object, last: object, n: int, dtype: type = np.float32) -> np.ndarray:
    """The first and the last rank's value of each plan, stacked: shape (2, n) (float32: the ranking's precision)."""
    out = np.empty((2, n), dtype=dtype)
    out[0], out[1] = first, last
    return out


def _vec(x: object, n: int) -> np.ndarray:
    return np.broadcast_to(np.asarray(x, dtype=np.float32), (n,))
