"""Intra-operator planning of one traced step on one mesh: the integer program under the memory limit, and the
price of the plan it returns.

Memory is linear in the strategy variables at each point of the step (memory.py). It is priced in the objective
by default (``plan``: a Lagrangian relaxation, the price bisected until the plan's exact liveness peak fits), or
constrained (``exact``): linear constraints at the unsharded peak and the end of the forward pass first, then, while
a solution's exact peak exceeds the limit, at that peak too (a cutting-plane loop). Either way the returned plan's
peak is the exact liveness of the sharded graph. A plan that cannot fit is a result with its reason.

The step: m micro-batches of forward and backward compute, each with its moves (activations and parameters),
then once per step the gradient reductions and the optimizer, one after another (no overlap of communication with
compute; docs/AUTOSHARD.md says where meshplan's estimate overlaps and what that changes). Each pass takes at least
the host's time to issue it (problem.host_seconds, step/host.py's max(GPU, host)): its kernels, which no strategy
changes, and a call for each collective the plan inserts. The integer program minimises the GPU's time; where a pass
is host-bound its GPU time is free up to the host's and its collectives cost the host, so the plan is then searched
again with the pass weighed (``plan_for_host``): the Lagrangian of max(G, H) = max over w in [0, 1] of
w·G + (1 − w)·H, its weight bisected on whether the plan's GPU time exceeds the host's, and the fastest plan that
fits kept.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from meshplan.autoshard.highs import first_basis, warm_starts
from meshplan.autoshard.ilp import PASSES
from meshplan.autoshard.ilp import solve as solve_ilp
from meshplan.autoshard.memory import Accounting, DeviceMemory
from meshplan.autoshard.problem import Problem, host_seconds
from meshplan.trace.liveness import peak_memory
from meshplan.units import fmt_over


@dataclass(frozen=True, kw_only=True)
class Price:
    """Seconds of a plan: per micro-batch forward and backward (compute, and moves), per step the rest."""

    compute_fwd: float
    compute_bwd: float
    comm_fwd: float
    comm_bwd: float
    grad_sync: float  # gradient reductions, once per step
    optimizer: float
    host_fwd: float = 0.0  # the host's seconds to launch the pass's kernels (problem.host_seconds)
    host_bwd: float = 0.0

    @property
    def fwd(self) -> float:
        """The forward pass: its kernels and moves, or the host's launches where those take longer."""
        return max(self.compute_fwd + self.comm_fwd, self.host_fwd)

    @property
    def bwd(self) -> float:
        return max(self.compute_bwd + self.comm_bwd, self.host_bwd)

    def step(self, micro_batches: int) -> float:
        return micro_batches * (self.fwd + self.bwd) + self.grad_sync + self.optimizer


@dataclass(frozen=True, kw_only=True)
class Sharding:
    """One intra-operator plan: a strategy per template node, its price and its memory per device."""

    problem: Problem = field(repr=False)
    choice: dict[int, int] = field(repr=False)
    micro_batches: int
    status: str  # optimal | time limit | infeasible
    price: Price | None
    memory: DeviceMemory | None
    memory_limit: float
    solver_seconds: float
    rounds: int
    variables: int
    constraints: int
    # the optimal basis by name of its first round (memory unpriced, highs.py): where a plan of the same problem with
    # a few strategies pinned starts (as_written.py)
    basis: Any = field(default=None, repr=False, compare=False)

    @property
    def fits(self) -> bool:
        return self.price is not None and self.memory is not None and self.memory.peak <= self.memory_limit

    @property
    def step_time(self) -> float:
        return self.price.step(self.micro_batches) if self.price is not None else float("inf")

    @property
    def reason(self) -> str:
        if self.fits:
            return ""
        if self.memory is None:
            return f"no plan fits {self.memory_limit / 2**30:.1f} GiB per device ({self.status})"
        return f"memory {fmt_over(self.memory.peak, self.memory_limit)} per device"


def price(problem: Problem, choice: dict[int, int]) -> Price:
    """The plan's seconds by part (module docstring)."""
    cf = cb = mf = mb = grad = opt = 0.0
    for key, node in problem.nodes.items():
        a, w = choice[key], problem.weight[key]
        cf += w * node.time[a, 0]
        cb += w * node.time[a, 1]
        mf += w * node.comm[a, 0]
        mb += w * node.comm[a, 1]
        if key in problem.optimizer:
            opt += w * float(problem.optimizer[key][a])
    for (u, v), edge in problem.edges.items():
        a, b = choice[u], choice[v]
        mf += float(edge.fwd[a, b])
        mb += float(edge.bwd[a, b])
        grad += float(edge.step[a, b])
    hf, hb = host_seconds(problem, choice=choice)
    return Price(compute_fwd=cf, compute_bwd=cb, comm_fwd=mf, comm_bwd=mb, grad_sync=grad, optimizer=opt,
                 host_fwd=hf, host_bwd=hb)


def start_points(problem: Problem) -> list[int]:
    """The unsharded liveness peak and the end of the forward pass."""
    trace = problem.flow.trace
    return sorted({peak_memory(trace).index, trace.forward_end})


@contextmanager
def collector_paused(frozen: bool = False) -> Iterator[None]:
    """Python's cyclic garbage collector off while the planner builds and solves its programs (on again after, where it
    was): they make tens of thousands of long-lived containers (the reductions' memos, the programs' arrays and
    tuples) and next to no cyclic garbage, so its collections only passed over them again and again (Llama-3-8B on
    64 H100s, a first request: about 200 collections, 2-3 % of the process's CPU, 0.5 kB collected). ``frozen``: for
    a process that ends with the answer (the console script), what is alive is frozen (gc.freeze) before the collector
    is on again, so that its next collection does not pass over it all once more (the first request's collections:
    0.050 -> 0.003 s)."""
    held = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if frozen:
            gc.freeze()
        if held:
            gc.enable()


LAGRANGE_STEPS = 5  # bisection steps on the price of memory (a log-scale bracket of 10^6 to within a factor 1.5)
HOST_STEPS = 3  # bisection steps on a host-bound pass's weight (to 1/8)
HOST_LAGRANGE_STEPS = 1  # and on the price of memory for each weight tried (its plan fits; a coarser price of memory)


def plan(problem: Problem, memory_limit: float, micro_batches: int = 1, allowed: dict[int, set[int]] | None = None,
         accounting: Accounting | None = None, exact: bool = False, time_limit: float = 60.0,
         start: Any = None) -> Sharding:
    """The fastest plan under ``memory_limit`` bytes per device.

    Memory is priced, not constrained, by default (a Lagrangian relaxation, Fisher 1981, "The Lagrangian relaxation
    method for solving integer programming problems"): each program minimises time + λ·bytes at the constrained
    points, which keeps it a pairwise program whose LP relaxation is integral (ilp.py), and λ is bisected to the
    smallest price at which the plan's own liveness peak fits. The plan returned fits; it is optimal when λ = 0
    suffices and otherwise within the relaxation's duality gap. ``exact``: the memory constraints go into the
    program itself (branch and bound; minutes on large graphs) with the cutting-plane loop of the module docstring.
    Where a pass of that plan is host-bound, the passes are weighed and the plan fitted again (``plan_for_host``).
    ``start``: the first round's basis by name (another plan's ``basis``, highs.warm_starts)."""
    accounting = accounting or Accounting(problem)

    def fitted(passes: tuple[float, float], steps: int = HOST_LAGRANGE_STEPS) -> Sharding:
        return _fitted(problem, memory_limit, micro_batches, allowed, accounting, exact, time_limit, passes, steps)
    with warm_starts(start):  # the rounds of this plan start from each other's bases (highs.py)
        found = plan_for_host(fitted(PASSES, LAGRANGE_STEPS), fitted)
        basis = first_basis(start)
    return replace(found, basis=basis)


def _fitted(problem: Problem, memory_limit: float, micro_batches: int, allowed: dict[int, set[int]] | None,
            accounting: Accounting, exact: bool, time_limit: float, passes: tuple[float, float],
            steps: int = LAGRANGE_STEPS) -> Sharding:
    """``plan``'s fitting under memory with the passes weighed ``passes`` (ilp.py), the price of memory bisected
    ``steps`` times."""
    free = solve_ilp(problem, micro_batches, [], allowed=allowed, time_limit=time_limit, passes=passes)
    spent, rounds = free.seconds, 1
    if not free.choice:
        return _result(problem, free, micro_batches, memory_limit, spent, rounds)
    memory = accounting.evaluate(free.choice)
    if memory.peak <= memory_limit:
        return _result(problem, free, micro_batches, memory_limit, spent, rounds, memory)
    points = sorted(set(start_points(problem)) | {memory.index})
    if exact:
        return _exact(problem, memory_limit, micro_batches, allowed, accounting, points, time_limit, passes)
    rows = {p: accounting.row(p) for p in points}
    scale = max(free.objective, 1e-12) / memory_limit  # seconds per byte: the step's time over the limit
    low, high, best, best_memory = scale * 1e-3, scale * 1e3, None, None
    for price_per_byte in (scale, high):  # a price of memory that fits, or none does (memory nearly alone counts)
        sol = solve_ilp(problem, micro_batches, [], allowed=allowed, penalty=_penalty(rows, price_per_byte),
                        passes=passes)
        spent, rounds = spent + sol.seconds, rounds + 1
        mem = accounting.evaluate(sol.choice) if sol.choice else None
        if mem is not None and mem.peak <= memory_limit:
            best, best_memory, high = sol, mem, price_per_byte
            break
        low = price_per_byte
        if mem is not None and mem.index not in rows:
            rows[mem.index] = accounting.row(mem.index)
    if best is None:
        return Sharding(problem=problem, choice={}, micro_batches=micro_batches, status="infeasible", price=None,
                        memory=None, memory_limit=memory_limit, solver_seconds=spent, rounds=rounds,
                        variables=free.variables, constraints=free.constraints)
    for _ in range(steps):  # the cheapest price that still fits, bisected on a log scale
        mid = (low * high) ** 0.5
        sol = solve_ilp(problem, micro_batches, [], allowed=allowed, penalty=_penalty(rows, mid), passes=passes)
        spent, rounds = spent + sol.seconds, rounds + 1
        mem = accounting.evaluate(sol.choice)
        if mem.peak <= memory_limit:
            high, best, best_memory = mid, sol, mem
        else:
            low = mid
            if mem.index not in rows:
                rows[mem.index] = accounting.row(mem.index)
    return _result(problem, best, micro_batches, memory_limit, spent, rounds, best_memory)


def plan_for_host(found: Sharding, fitted: Callable[[tuple[float, float]], Sharding]) -> Sharding:
    """``found``, or a faster plan that fits where a pass of it is host-bound (module docstring): ``fitted`` plans
    again under the same memory limit with the passes weighed (ilp.py). Each host-bound pass's weight w is bisected
    from 1: down while the plan's GPU time stays below the host's, up once it exceeds it (the sign of the
    Lagrangian's subgradient, G − H); a pass that is not host-bound keeps 1. Every plan tried is priced at its own
    step, so the plan returned is never slower than ``found``."""
    if found.price is None or not found.fits:
        return found
    p = found.price
    if p.host_fwd <= p.compute_fwd + p.comm_fwd and p.host_bwd <= p.compute_bwd + p.comm_bwd:
        return found
    best, spent, rounds = found, found.solver_seconds, found.rounds
    lo, hi, w = [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]
    for _ in range(HOST_STEPS):
        for i, (gpu, host) in enumerate(((p.compute_fwd + p.comm_fwd, p.host_fwd),
                                         (p.compute_bwd + p.comm_bwd, p.host_bwd))):
            lo[i], hi[i] = (lo[i], w[i]) if gpu < host else (w[i], hi[i])
            w[i] = (lo[i] + hi[i]) / 2
        tried = fitted((w[0], w[1]))
        spent, rounds = spent + tried.solver_seconds, rounds + tried.rounds
        if tried.price is None:
            break
        p = tried.price
        if tried.fits and tried.step_time < best.step_time:
            best = tried
    return replace(best, solver_seconds=spent, rounds=rounds)


def _penalty(rows: dict[int, dict[int, np.ndarray]], price_per_byte: float) -> dict[int, np.ndarray]:
    total: dict[int, np.ndarray] = {}
    for row in rows.values():
        for key, vec in row.items():
            total[key] = total.get(key, 0.0) + price_per_byte * vec
    return total


def _result(problem: Problem, sol, micro_batches: int, memory_limit: float, spent: float, rounds: int,
            memory: DeviceMemory | None = None) -> Sharding:
    return Sharding(problem=problem, choice=sol.choice, micro_batches=micro_batches, status=sol.status,
                    price=price(problem, sol.choice) if sol.choice else None, memory=memory,
                    memory_limit=memory_limit, solver_seconds=spent, rounds=rounds, variables=sol.variables,
                    constraints=sol.constraints)


def _exact(problem: Problem, memory_limit: float, micro_batches: int, allowed: dict[int, set[int]] | None,
           accounting: Accounting, points: list[int], time_limit: float, passes: tuple[float, float] = PASSES,
           rounds: int = 8) -> Sharding:
    """Memory as constraints of the program, with cutting planes (module docstring)."""
    rows = [(accounting.row(p), memory_limit) for p in points]
    spent = 0.0
    for r in range(1, rounds + 1):
        sol = solve_ilp(problem, micro_batches, rows, allowed=allowed, time_limit=time_limit, passes=passes)
        spent += sol.seconds
        if not sol.choice:
            return _result(problem, sol, micro_batches, memory_limit, spent, r)
        memory = accounting.evaluate(sol.choice)
        if memory.peak <= memory_limit * (1 + 1e-9) or memory.index in points:
            break
        points.append(memory.index)
        rows.append((accounting.row(memory.index), memory_limit))
    return _result(problem, sol, micro_batches, memory_limit, spent, r, memory)


def choose(problem: Problem, choice: dict[int, int]) -> dict[int, set[int]]:
    """``allowed`` that pins every node to ``choice`` (to price a given plan)."""
    return {k: {a} for k, a in choice.items() if k in problem.nodes and isinstance(a, (int, np.integer))}


def replicated_choice(problem: Problem) -> dict[int, int]:
    """Every tensor replicated on every device (each node's strategy that splits nothing): one device's step."""
    choice = {}
    for key, node in problem.nodes.items():
        if node.kind == "hub":
            choice[key] = next(a for a, p in enumerate(node.combos) if all(x == -1 for x in p))
        else:
            choice[key] = next(a for a, c in enumerate(node.combos) if all(x is None for x in c))
    return choice
