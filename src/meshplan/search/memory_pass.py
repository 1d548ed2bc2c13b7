"""The memory pass of a schedule group: the peak HBM and host bytes of every setting of its size combinations (one
plan each: memory does not depend on the placement) and which the stack's framework refuses, computed once for the
group and read by each block of the branch and bound (search/evaluate.py), whatever order the blocks take.

It reads the size combinations, the space's settings grid and the saved activations of the units (``Saved``), not
the kernel times: a stack switch that changes only the time of some kernels, as the MoE expert GEMMs' (per expert or
grouped, search/variants.py), leaves it unchanged unless it changes what a kernel saves (the per-expert path's
clamped GLU keeps more, cost/mlp_moe.grouped_mlp_eager). Searches with the same jobs are evaluated job by job in one
task (search/workers.py), and a group's pass is reused by the next search when their spaces differ at most in the
expert GEMMs and the saved activations it read are equal (``GroupMemory.reusable``), else computed again.

Each element is computed by the same element-wise arithmetic whichever chunk holds it (step/memory_grid.py: a
batch's middle rank, when it has one, equals the first rank of a plan without one), so the pass in chunks of the
natural order gives the bytes a block in the bound's order would, bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from meshplan.search.batch import PlanBatch
from meshplan.search.refused import grid_refusals
from meshplan.search.scoring import grid_memory
from meshplan.search.space import Space
from meshplan.specs.model import ModelSpec
from meshplan.specs.refusals import REFUSALS, Refusal
from meshplan.step.units import Saved


@dataclass(frozen=True)
class GroupMemory:
    """Size combinations × settings of one schedule group (the combinations on the first axis, then the grid's
    shape): peak HBM and host bytes (float32, scoring.grid_memory), and the refusal that refuses each setting first
    (0: the framework runs it, i + 1: ``rules[i]``); ``saved``: the group's saved activations the pass read. The
    combinations come first so that a block in the bound's order reads whole rows (``at``): a gather along the last
    axis of a (settings × combinations) array read element by element, six times slower."""

    peak: np.ndarray
    host: np.ndarray
    refused: np.ndarray
    rules: tuple[Refusal, ...]
    saved: dict[str, Saved]
    space: Space
    seen: frozenset[int]  # the codes of the rules that refuse some plan of the group (the others: none of a block)

    def at(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[tuple[Refusal, np.ndarray]]]:
        """The peak, the host bytes and the refusals (each rule that refuses some plan there, with its plans: as
        refused.grid_refusals gives them) of the combinations ``rows``."""
        code = _settings_first(self.refused, rows)
        hits = [(rule, hit) for i, rule in enumerate(self.rules)
                if i + 1 in self.seen and (hit := code == i + 1).any()]
        return _settings_first(self.peak, rows), _settings_first(self.host, rows), hits

    def reusable(self, space: Space, saved: dict[str, Saved]) -> bool:
        """Whether the same group searched in ``space``, whose units save ``saved``, has this memory: the space is
        this one but for the expert GEMMs (module docstring), the saved activations are equal."""
        if replace(space, stack=space.stack.with_(expert_gemm=self.space.stack.expert_gemm)) != self.space:
            return False
        return saved.keys() == self.saved.keys() and all(
            np.array_equal(getattr(a, f), getattr(self.saved[rc], f))
            for rc, a in saved.items() for f in ("layer_saved", "embed_saved", "head_saved", "layer_working"))


def group_memory(model: ModelSpec, space: Space, pool: PlanBatch, saved: Callable[[np.ndarray], dict[str, Saved]],
                 chunk: int) -> GroupMemory:
    """The memory pass of the size combinations ``pool`` (one plan each), in chunks of ``chunk`` combinations
    (bounded temporaries); ``saved(rows)``: the saved activations of those rows."""
    shape = (len(pool), *(len(g) for g in space.grid))
    peak, host = np.empty(shape, dtype=np.float32), np.empty(shape, dtype=np.float32)
    refused = np.zeros(shape, dtype=np.uint8)
    rules = tuple(REFUSALS[name] for name in space.stack.supports.refuses)
    code = {rule.name: i + 1 for i, rule in enumerate(rules)}
    seen: set[int] = set()
    for rows in _chunks(len(pool), chunk):
        index = np.arange(rows.start, rows.stop)
        sized = pool.select(index)
        block_peak, block_host = grid_memory(model, sized, saved(index), space)
        peak[rows], host[rows] = np.moveaxis(block_peak, -1, 0), np.moveaxis(block_host, -1, 0)
        block_code = np.zeros(block_peak.shape, dtype=np.uint8)
        for rule, hit in grid_refusals(model, sized, space):
            block_code[hit] = code[rule.name]
            seen.add(code[rule.name])
        refused[rows] = np.moveaxis(block_code, -1, 0)
    return GroupMemory(peak, host, refused, rules, saved(np.arange(len(pool))), space, frozenset(seen))


def _settings_first(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The combinations ``rows`` of ``a`` (combinations × settings), settings × combinations and C-ordered (the
    readers reshape it): whole rows gathered, then one transposing copy."""
    return np.ascontiguousarray(np.moveaxis(np.take(a, rows, axis=0), 0, -1))


def _chunks(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(n, start + size))
