"""Alpa's inter-operator pass (Zheng et al. 2022, OSDI, §5.2, its Algorithm 1): slice the layers into pipeline
stages and the cluster into sub-meshes, each stage on its own sub-mesh shape, by dynamic programming.

Symbols: L identical layers (blocks.py) between the ops before them (embedding: the first stage's) and after them
(final norm, head, loss: the last stage's); G GPUs; B micro-batches; an *option* o is a sub-mesh of n_o GPUs with its
intra-operator plan, priced per micro-batch as t_o per layer, plus pre_o on the first stage and post_o on the last;
a stage running c layers on option o takes

    t = c·t_o + [first]·pre_o + [last]·post_o,

holds c·(state_o + s·saved_o) + base_o bytes per GPU with s micro-batches in flight (1F1B keeps p − i on stage i of
p: the stages from it to the last), and must fit the memory limit. Alpa's recurrence, for a bound t_max on every
stage (s stages left, ℓ layers left, d GPUs left):

    F(0, 0, 0) = 0;   F(s, ℓ, d) = min over o, c ≤ ℓ with t ≤ t_max and within memory of t + F(s − 1, ℓ − c, d − n_o)

and T* = min over t_max, s ≤ min(B, L) of F(s, L, G) + (B − 1)·t_max (the 1F1B latency Σ t_i + (B − 1)·max t_i,
Alpa's eq. (2)). The t_max are the distinct stage times, in increasing order (Algorithm 1, line 2); a bound whose
B·t_max already exceeds the best T* found cannot do better (Σ t_i ≥ t_max), which ends the loop (Alpa's early
stop). The layers being identical, F runs over layer counts and the stages' order only matters through the
first / last extras, the micro-batches in flight and where a sub-mesh may sit.

Sub-meshes (Alpa: (1, 2^k) inside a node and (n, M) whole nodes, covering the cluster exactly): here the sizes
aligned to the cluster's tiers (``sizes``): divisors of the innermost tier (the NVLink domain) and, for each tier
above, a divisor of its size times one block of the tier below (1, 2, 4, 8, 16, 32, 64 GPUs on 8 x 8 H100; Alpa also
tries n nodes for n not dividing the node count, which a batch split in powers of two seldom uses). Stages are
placed in order on consecutive ranks, each aligned to its size (``fits_at``: a stage of n GPUs starts at a multiple
of n), so a sub-mesh's collectives run on the links its shape says, and the stages cover the G GPUs exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import numpy as np

from meshplan.specs.hardware import Cluster

INF = float("inf")


@dataclass(frozen=True, kw_only=True)
class Option:
    """One way to run a stage: ``devices`` GPUs as the sub-mesh ``shape`` with an intra-operator plan (module
    docstring's symbols), seconds per micro-batch, bytes per GPU."""

    devices: int
    shape: tuple[int, ...]
    layer: float
    pre: float
    post: float
    state: float
    saved: float
    base: float
    key: int = 0  # the caller's index of the plan behind it


@dataclass(frozen=True, kw_only=True)
class Slicing:
    """Stages in order: (option, layers) each, and the DP's latency Σ t_i + (B − 1)·max t_i."""

    stages: tuple[tuple[Option, int], ...]
    latency: float

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(o.devices for o, _ in self.stages)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(c for _, c in self.stages)


def sizes(cluster: Cluster) -> dict[int, tuple[int, ...]]:
    """Sub-mesh sizes aligned to the tiers and their mesh shapes, outermost dimension first (module docstring)."""
    tiers = [t.size for t in cluster.tiers]
    found: dict[int, tuple[int, ...]] = {}
    block: tuple[int, ...] = ()
    for size in tiers:
        for k in range(1, size + 1):
            if size % k == 0 and (k > 1 or not block):
                shape = tuple(s for s in (k, *block) if s > 1) or (1,)
                found.setdefault(k * prod(block), shape)
        block = (size, *block)
    return {n: found[n] for n in sorted(found) if n <= cluster.num_gpus}


def fits_at(offset: int, devices: int) -> bool:
    """A stage of ``devices`` GPUs may start at rank ``offset``: aligned to its own size (module docstring)."""
    return offset % devices == 0


def tmax_candidates(options: list[Option], layers: int) -> np.ndarray:
    """Every stage time a (option, layer count, first, last) can take, sorted (Algorithm 1's t_max)."""
    found = set()
    for o in options:
        for c in range(1, layers + 1):
            for first in (0, 1):
                for last in (0, 1):
                    if (c < layers) != (first and last):  # only a stage of every layer is first and last
                        found.add(c * o.layer + first * o.pre + last * o.post)
    return np.array(sorted(found))


def _stage_tables(options: list[Option], layers: int, stages: int, limit: float) -> np.ndarray:
    """Per (in-flight s, option, layers c, layers left ℓ): the stage's time (inf where it does not fit)."""
    lv = np.arange(layers + 1)
    time = np.full((stages + 1, len(options), layers + 1, layers + 1), INF)
    for j, o in enumerate(options):
        for c in range(1, layers + 1):
            first, last = lv == layers, lv == c
            t = c * o.layer + first * o.pre + last * o.post
            t = np.where(lv >= c, t, INF)
            for s in range(1, stages + 1):
                mem = o.base + c * (o.state + s * o.saved)
                time[s, j, c] = t if mem <= limit else INF
    return time


def _dp(time: np.ndarray, options: list[Option], gpus: int, layers: int, stages: int, t_max: float
        ) -> tuple[list[float], list]:
    """F(s, L, G) for s = 1..stages under ``t_max`` (module docstring), with each table's choices."""
    f = np.full((layers + 1, gpus + 1), INF)
    f[0, 0] = 0.0
    best, choices = [INF], []
    aligned = [np.array([fits_at(gpus - d, o.devices) for d in range(o.devices, gpus + 1)]) for o in options]
    for s in range(1, stages + 1):
        g = np.full_like(f, INF)
        pick = np.full(f.shape + (2,), -1, dtype=int)
        for j, o in enumerate(options):
            n = o.devices
            if n > gpus:
                continue
            for c in range(1, layers + 1):
                if c * o.layer > t_max:  # a stage's time grows with its layers
                    break
                t = time[s, j, c]
                t = np.where(t <= t_max, t, INF)
                cand = t[c:, None] + f[:layers + 1 - c, :gpus + 1 - n]
                cand[:, ~aligned[j]] = INF
                better = cand < g[c:, n:]
                g[c:, n:] = np.where(better, cand, g[c:, n:])
                pick[c:, n:][better] = (j, c)
        f = g
        choices.append(pick)
        best.append(float(f[layers, gpus]))
    return best, choices


def _walk(choices: list, options: list[Option], s: int, layers: int, gpus: int) -> tuple[tuple[Option, int], ...]:
    """The stages of the table's optimum with s stages, first to last."""
    out, left, d = [], layers, gpus
    for t in reversed(range(s)):
        j, c = choices[t][left, d]
        out.append((options[j], int(c)))
        left, d = left - c, d - options[j].devices
    return tuple(out)


EPSILON = 0.005  # t_max steps of at least 0.5 % (Alpa §5.2's ε): T* within (B − 1)·ε·t_max of the optimum


def slice_stages(options: list[Option], layers: int, gpus: int, micro_batches: int, limit: float
                 ) -> dict[int, Slicing]:
    """The best slicing for each number of stages p = 2 … min(B, L) found (module docstring: Algorithm 1,
    minimising Σ t_i + (B − 1)·max t_i, from the smallest feasible t_max up, in steps of at least ``EPSILON``,
    until the early stop), keyed by p."""
    stages = min(micro_batches, layers)
    if stages < 2 or not options:
        return {}
    time = _stage_tables(options, layers, stages, limit)
    candidates = tmax_candidates(options, layers)

    def run(t_max: float) -> tuple[list[float], list]:
        return _dp(time, options, gpus, layers, stages, float(t_max))

    low, high = 0, len(candidates)  # the smallest t_max with a pipeline (feasibility grows with t_max)
    while low < high:
        mid = (low + high) // 2
        if any(np.isfinite(t) for t in run(candidates[mid])[0][2:]):
            high = mid
        else:
            low = mid + 1
    best: dict[int, Slicing] = {}
    overall, last = INF, -INF
    for t_max in candidates[low:]:
        if micro_batches * t_max >= overall:
            break
        if t_max < last * (1 + EPSILON):
            continue
        last = t_max
        totals, choices = run(t_max)
        for s in range(2, stages + 1):
            if np.isfinite(totals[s]):
                found = _walk(choices, options, s, layers, gpus)
                latency = _latency(found, layers, micro_batches)
                if latency < (best[s].latency if s in best else INF):
                    best[s] = Slicing(stages=found, latency=latency)
                    overall = min(overall, latency)
    return best


def _latency(stages: tuple[tuple[Option, int], ...], layers: int, micro_batches: int) -> float:
    """Σ t_i + (B − 1)·max t_i of a slicing, at its own slowest stage."""
    times = [c * o.layer + (i == 0) * o.pre + (i == len(stages) - 1) * o.post for i, (o, c) in enumerate(stages)]
    return sum(times) + (micro_batches - 1) * max(times)
