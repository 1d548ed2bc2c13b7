"""The memory of a plan (one plan, or a batch) under every setting of a grid (step/grid.py): each pipeline rank's
model states, activations and buffers, the peak the largest of them (``MemoryGrid.peak``), and what offload moves to
the host. ``estimate`` reads one plan's under its own settings (step/assemble.assemble); the search reads a batch's
under the space's grid, in float32 (search/scoring.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from meshplan.cost.params import middle_or_first
from meshplan.kept import Kept
from meshplan.memory import buffer_memory, model_states, resident_weights
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.grid import Settings, middle_may_bind, rank_params, with_settings
from meshplan.step.memory import Ends, Phases, activation_memory, gathered_ends, offloaded_activations
from meshplan.step.units import Saved, Units
from meshplan.xp import Num


@dataclass(frozen=True, slots=True)
class MemoryGrid:
    """Bytes per GPU of a plan (or a batch) under every setting of a grid, each part for the settings it changes
    with: model states per (ZeRO stage, optimizer offload, rank), activations per (recompute, activation offload,
    rank, Phases field: step/memory.Phases), buffers per ZeRO stage, and what offload moves to the host; the ranks
    (first, last, the middle rank 1 with the most micro-batches in flight of the middle ones) on an axis of 3 (2
    where no middle rank may bind). Held in float64; ``peak`` and ``host`` sum them in the caller's dtype (the
    search's: float32)."""

    weights: np.ndarray  # (Z, O, 3, ...)
    grads: np.ndarray
    optimizer: np.ndarray  # 0 where offloaded (memory.model_states)
    # (R, A, ranks, 4, ...): step.memory.Phases (kept, loss, working, hole) of each rank; ``peak`` reads the first
    # three, the hole being reserved, never allocated (Phases.stranded; estimate's reserved_memory, step/assemble)
    activations: np.ndarray
    buffers: np.ndarray  # (Z, ...)
    ends: np.ndarray  # (2, Z, ...): the units FSDP2 leaves gathered, root and last block (step.memory.Ends)
    host_optimizer: np.ndarray  # (Z, O, ...): the first rank's offloaded optimizer state (ZeRO-Offload) and weights
    host_activations: np.ndarray  # (R, A, ...): step.memory.offloaded_activations

    def peak(self, dtype: type = np.float64) -> np.ndarray:
        """Peak HBM bytes, shape (recompute, zero, offload opt, offload act, ...): the largest of the ranks'
        weights + grads + optimizer + what the step keeps (with the root unit FSDP2 left gathered) + the larger of the
        loss phase's transients (with the last block it left gathered) and the layer phase's with the buffers
        (step.memory.Phases.peak). The allocated peak, which estimate() reports as ``peak_memory`` from this same
        method and checks against the HBM (estimate.fits): the search ranks and refuses plans on what estimate()
        does. The reserved peak (``peak`` + Phases.stranded, with the loss's hole) only estimate() composes, from
        these arrays (step/assemble.assemble): the search never reads it."""
        states = (self.weights + self.grads + self.optimizer).astype(dtype, copy=False)
        acts: np.ndarray = self.activations.astype(dtype, copy=False)
        buffers: np.ndarray = self.buffers.astype(dtype, copy=False)[None, :, None, None]
        ends = Ends(*(e.astype(dtype, copy=False)[None, :, None, None] for e in self.ends))
        if not self.ends.view(np.uint64).any():  # +0.0 everywhere (no FSDP2 ends): the same sums, on fewer elements
            ends = Ends(dtype(0.0), dtype(0.0))

        def at(rank: int) -> np.ndarray:
            phases = Phases(*(acts[:, None, None, :, rank, i] for i in range(3)))
            return states[None, :, :, None, rank] + phases.peak(buffers, ends)

        peak = at(0)  # the first rank, or the last, or a middle one (middle_may_bind)
        for rank in range(1, self.weights.shape[2]):
            np.maximum(peak, at(rank), out=peak)
        return peak

    def host(self, dtype: type = np.float64) -> np.ndarray:
        """Host bytes offloaded per GPU, shaped as ``peak``."""
        return (self.host_optimizer.astype(dtype, copy=False)[None, :, :, None]
                + self.host_activations.astype(dtype, copy=False)[:, None, None])


def compose_memory(model: ModelSpec, plan: Plan, units: Mapping[str, Units | Saved], grid: Settings,
                   stack: Stack) -> MemoryGrid:
    """The memory of ``plan`` (one plan, or a batch) under every setting of ``grid`` (``MemoryGrid``): memory.py's
    model states, buffers and offloaded optimizer state, step/memory.py's activations and offloaded activations."""
    shape, rcs, oas = np.shape(plan.dp), grid.recompute, grid.offload_activations
    n = 3 if middle_may_bind(model, stack, plan) else 2
    if type(plan) is Plan:  # one plan's states, kept for its other recompute and activation-offload settings
        key = (id(model), id(stack), n, tuple(grid.zero), tuple(grid.offload_optimizer),
               with_settings(plan, recompute="none", offload_activations=False))
        side = _KEPT.answer(key, (model, stack), _frozen, model, plan, grid, stack, n)
    else:
        side = _states(model, plan, grid, stack, n)
    settled = {(rc, oa): with_settings(plan, recompute=rc, offload_activations=oa) for rc in rcs for oa in oas}
    acts = _array([[[[_arr(x, shape) for x in a]
                     for a in activation_memory(model, settled[rc, oa], stack, units[rc], n == 3)] for oa in oas]
                   for rc in rcs])
    weights, grads, optimizer, buffers, ends, host_optimizer = side
    return MemoryGrid(weights, grads, optimizer, acts, buffers, ends, host_optimizer,
                      _array([[_arr(offloaded_activations(model, settled[rc, oa], units[rc], n == 3), shape)
                               for oa in oas] for rc in rcs]))


def _arr(x: Num, shape: tuple[int, ...]) -> Num:
    """Each plan's value (one plan: the value itself, a float or a NumPy scalar)."""
    return np.broadcast_to(np.asarray(x, dtype=np.float64), shape) if shape else x


def _states(model: ModelSpec, plan: Plan, grid: Settings, stack: Stack, n: int) -> tuple[np.ndarray, ...]:
    """``compose_memory``'s parts that no recompute or activation-offload setting changes (the search prices a
    batch's once for its whole grid): weights, grads, optimizer, buffers, ends, host_optimizer."""
    shape, zeros, oos = np.shape(plan.dp), grid.zero, grid.offload_optimizer
    ends = rank_params(model, plan)[:n]
    # each (ZeRO stage, optimizer offload): an offloaded optimizer state leaves the GPU for the host, the first rank's
    # (memory.offloaded_optimizer, the states kept without offload), and the wrapper DeepSpeed picks, which sets the
    # gradients a rank keeps (memory.lp_gradients), may differ with it
    settings = [(z, oo) for z in zeros for oo in sorted({False, *oos})]
    kept: dict[tuple[int, bool], list[tuple[Num, ...]]] = {
        (z, oo): [model_states(end, with_settings(plan, zero=z, offload_optimizer=oo), stack, last)
                  for end, last in zip(ends, (False, True, False)[:n], strict=True)] for z, oo in settings}
    if n == 3:  # no middle rank (p ≤ 2): the first's states in its row
        kept = {key: [*k[:2], tuple(middle_or_first(plan, x, y) for x, y in zip(k[2], k[0], strict=True))]
                for key, k in kept.items()}
    if plan.offload_weights:  # the weights' resident share on the GPU, the rest in host memory (memory.py; a middle
        resident = [resident_weights(model, plan, last) for last in (False, True, False)[:n]]  # rank: the first's
        kept = {key: [(w * share, g, o) for (w, g, o), share in zip(k, resident, strict=True)]
                for key, k in kept.items()}
        host_weights = {z: kept[z, False][0][0] * (1 - resident[0]) / resident[0] for z in zeros}
    states = [_array([[[_arr(end[i], shape) for end in kept[z, oo]] for oo in oos] for z in zeros]) for i in range(3)]
    buffers = _array([_arr(buffer_memory(model, with_settings(plan, zero=z)), shape) for z in zeros])
    gathered = _array([[_arr(e, shape) for e in gathered_ends(model, with_settings(plan, zero=z), stack)]
                       for z in zeros])
    hosted = {z: host_weights[z] if plan.offload_weights else 0.0 for z in zeros}
    return (*states, buffers, np.moveaxis(gathered, 1, 0),
            _array([[_arr((kept[z, False][0][2] if oo else 0.0) + hosted[z], shape) for oo in oos] for z in zeros]))


def _frozen(model: ModelSpec, plan: Plan, grid: Settings, stack: Stack, n: int) -> tuple[np.ndarray, ...]:
    """``_states``, read-only (kept: no caller may change what the next one reads)."""
    out = _states(model, plan, grid, stack, n)
    for a in out:
        a.flags.writeable = False
    return out


# one plan's ``_states``, by the identities of its model and stack, its ranks priced, the grid's ZeRO stages and
# optimizer offloads, and the plan without its recompute and activation offload, which they do not read: a space's
# plans that differ in those alone (issue 83)
_KEPT: Kept[tuple[np.ndarray, ...]] = Kept(64)


def _array(nested: list) -> np.ndarray:
    return np.array(nested, dtype=np.float64)
