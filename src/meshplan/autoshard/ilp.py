"""The intra-operator integer program (Alpa, Zheng et al. 2022, OSDI, §4.2, its equations (1)-(3)), solved by HiGHS
through ``scipy.optimize.milp``.

    minimise   Σ_v s_v·(c_v + d_v) + Σ_(u,v) e_uv·R_uv          (compute c, in-node moves d, resharding R)
    subject to s_v ∈ {0,1}^|S_v|, Σ s_v = 1                     (one strategy per node)
               e_uv ∈ [0,1]^(|S_u|·|S_v|), Σ_b e_uv[a,b] = s_u[a], Σ_a e_uv[a,b] = s_v[b]
               Σ_v s_v·M_v^(p) <= memory limit   at each constrained point p (memory.py)

Alpa linearises s_u^T R_uv s_v with edge variables e_uv = s_u s_v^T; the marginal equalities make e integral once
the s are, so e is continuous here, and the program's LP relaxation is tight enough that HiGHS usually closes it
at the root. Node costs c_v are weighted by the node's count in the full model (blocks.py) and by the micro-batches
per step; per-step costs (gradient reductions, the optimizer) once. Every cost is in seconds, so the objective is
the step time of the plan with no overlap of communication and compute (as in Alpa's and autoparallel's
objectives). ``passes`` weighs the forward and the backward pass's costs (1, 1 by default): solve.py's search for a
host-bound step, which the weights' Lagrangian makes of max(GPU, host) per pass.
"""

from __future__ import annotations

import hashlib
import time
import warnings
from dataclasses import dataclass
from importlib.util import find_spec
from typing import Any

import numpy as np

from meshplan.autoshard.highs import Names, catch_up, deferred, keep_round, kept_round, relax
from meshplan.autoshard.matrix import Csc, constraints, edge_rows, spans
from meshplan.autoshard.problem import Edge, Problem
from meshplan.autoshard.reduce import MEMO, Pairwise, digest, expand_choice, known_digest, reduce, restrict, same
from meshplan.autoshard.trace_cache import cache_dir
from meshplan.errors import MissingDependency
from meshplan.xp import unique_rows

MIP_GAP = 1e-3  # branch and bound stops within 0.1 % of the optimum (far inside the model's own error)


@dataclass(frozen=True, kw_only=True)
class Solution:
    choice: dict[int, int]  # template node -> strategy index
    objective: float  # seconds per step
    status: str  # "optimal", "infeasible", "time limit" …
    seconds: float  # HiGHS wall time
    variables: int
    constraints: int


PASSES = (1.0, 1.0)  # the forward and the backward pass's weights: the step's own time


def node_costs(problem: Problem, micro_batches: int, penalty: dict[int, np.ndarray] | None = None,
               passes: tuple[float, float] = PASSES) -> dict[int, np.ndarray]:
    """Each template node's weighted cost per strategy, with its self-edges (a node whose twins feed each other,
    e.g. block i's residual into block i+1's: only the diagonal can be chosen); ``passes`` weighs the forward and
    the backward pass's seconds."""
    costs = {}
    w, host = np.asarray(passes), (1.0 - np.asarray(passes)) * problem.host_dispatch  # a pass's host time weighs 1 - w
    for key, node in problem.nodes.items():
        per_pass = node.time.sum(axis=1) + node.comm.sum(axis=1) if passes == PASSES else (node.time + node.comm) @ w
        if passes != PASSES:
            per_pass = per_pass + node.calls @ host  # the host's calls of the node's collectives
        c = problem.weight[key] * micro_batches * per_pass
        if key in problem.optimizer:
            c = c + problem.weight[key] * problem.optimizer[key]
        costs[key] = c
    for (u, v), edge in problem.edges.items():
        if u == v:
            moves = edge.fwd + edge.bwd if passes == PASSES else _weighed(edge, passes, problem.host_dispatch)
            costs[u] = costs[u] + np.diag(micro_batches * moves + edge.step)
    for key, extra in (penalty or {}).items():
        costs[key] = costs[key] + extra
    return costs


def _weighed(edge: Edge, passes: tuple[float, float], host_dispatch: float) -> np.ndarray:
    """An edge's moves per micro-batch with the passes weighed: w·GPU + (1 − w)·host per pass, the host's time its
    collectives' calls (problem.host_seconds)."""
    host = host_dispatch * ((1.0 - passes[0]) * edge.calls[0] + (1.0 - passes[1]) * edge.calls[1])
    return passes[0] * edge.fwd + passes[1] * edge.bwd + host


def pairwise(problem: Problem, micro_batches: int, memory_rows: list[tuple[dict[int, np.ndarray], float]],
             allowed: dict[int, set[int]] | None = None, penalty: dict[int, np.ndarray] | None = None,
             passes: tuple[float, float] = PASSES) -> Pairwise:
    """The program in pairwise form (reduce.py), ``allowed`` applied; a node's bytes in each memory row keep it
    from elimination and enter the dominance test."""
    base, weighed = _weighed_program(problem, micro_batches, passes)
    costs, edges = dict(base), dict(weighed)  # new dicts over the kept arrays (reduce.py replaces, never writes them)
    for key, extra in (penalty or {}).items():  # as node_costs adds it
        costs[key] = costs[key] + extra
    memory: dict[int, np.ndarray] = {}
    for key in problem.nodes:
        columns = [coef[key] for coef, _ in memory_rows if key in coef and np.any(coef[key])]
        if columns:
            memory[key] = np.stack(columns, axis=1)
    pw = Pairwise(costs=costs, edges=edges, memory=memory,
                  ids={k: np.arange(node.size) for k, node in problem.nodes.items()})
    for key, keep in (allowed or {}).items():
        restrict(pw, key, np.array(sorted(keep), dtype=int))
    return pw


def _weighed_program(problem: Problem, micro_batches: int, passes: tuple[float, float]
                     ) -> tuple[dict[int, np.ndarray], dict[tuple[int, int], np.ndarray]]:
    """``pairwise``'s node costs (no penalty) and edge matrices, computed once per (micro-batches, passes) of a
    problem (Problem.weighed): a plan's rounds differ only in the penalty and the memory rows."""
    hit = problem.weighed.get(key := (micro_batches, passes))
    if hit is not None:
        return hit
    edges: dict[tuple[int, int], np.ndarray] = {}
    for (u, v), e in problem.edges.items():
        if u == v:
            continue
        m = micro_batches * (e.fwd + e.bwd if passes == PASSES else _weighed(e, passes, problem.host_dispatch)) + e.step
        pair, m = ((u, v), m) if u < v else ((v, u), m.T)
        edges[pair] = edges[pair] + m if pair in edges else m
    hit = problem.weighed[key] = (node_costs(problem, micro_batches, None, passes), edges)
    return hit


def solve(problem: Problem, micro_batches: int, memory_rows: list[tuple[dict[int, np.ndarray], float]],
          allowed: dict[int, set[int]] | None = None, time_limit: float = 60.0,
          penalty: dict[int, np.ndarray] | None = None, passes: tuple[float, float] = PASSES) -> Solution:
    """The program above, reduced first (reduce.py); ``memory_rows``: (coefficients per node strategy, limit in
    bytes) per point; ``allowed``: the strategies a node may take (a plan fixed in part, e.g. Megatron-LM's);
    ``penalty``: seconds added to node strategies (solve.py's Lagrangian price of memory); ``passes``: the forward
    and the backward pass's weights (solve.py's host-bound search)."""
    if find_spec("scipy") is None:  # imported only where HiGHS' bindings do not answer (highs.py)
        raise MissingDependency("scipy", "solve")
    started = time.perf_counter()
    args = (problem, micro_batches, memory_rows, allowed, time_limit, penalty, passes)
    path, answer = kept_round(_round_key(*args)) if cache_dir() is not None else (None, None)
    if answer is not None:  # this round solved before: its answer, its solve deferred (highs.kept_round)
        deferred(lambda: _solve(*args, started))
        return Solution(choice={int(k): int(a) for k, a in answer["choice"]}, objective=answer["objective"],
                        status=answer["status"], seconds=time.perf_counter() - started,
                        variables=answer["variables"], constraints=answer["constraints"])
    catch_up()
    sol = _solve(*args, started)
    if sol.status == "optimal":
        keep_round(path, {"choice": sorted(sol.choice.items()), "objective": sol.objective, "status": sol.status,
                    "variables": sol.variables, "constraints": sol.constraints})
    return sol


def _round_key(problem: Problem, micro_batches: int, memory_rows: list[tuple[dict[int, np.ndarray], float]],
               allowed: dict[int, set[int]] | None, time_limit: float, penalty: dict[int, np.ndarray] | None,
               passes: tuple[float, float]) -> bytes:
    """A digest of everything ``pairwise`` and the solve read: the weighed program (by identity first), the penalty,
    the memory rows, ``allowed``, the nodes and the limits."""
    base, weighed = _weighed_program(problem, micro_batches, passes)
    h = hashlib.sha256(repr((micro_batches, passes, time_limit, sorted(problem.nodes), [lim for _, lim in memory_rows],
                             sorted((k, sorted(v)) for k, v in (allowed or {}).items()))).encode())
    for part in (same(("keyed",), (base,), _keyed), same(("keyed",), (weighed,), _keyed), _keyed(penalty or {}),
                 *(_keyed(coef) for coef, _ in memory_rows)):
        h.update(part)
    return h.digest()


def _keyed(arrays: dict) -> bytes:
    return b"".join(repr(k).encode() + digest(np.asarray(arrays[k], dtype=float)) for k in sorted(arrays))


def _solve(problem: Problem, micro_batches: int, memory_rows: list[tuple[dict[int, np.ndarray], float]],
           allowed: dict[int, set[int]] | None, time_limit: float, penalty: dict[int, np.ndarray] | None,
           passes: tuple[float, float], started: float) -> Solution:
    """``solve`` itself."""
    pw = reduce(pairwise(problem, micro_batches, memory_rows, allowed, penalty, passes))
    keys = sorted(pw.costs)
    offset, n = {}, 0
    for k in keys:
        offset[k] = n
        n += len(pw.costs[k])
    if not keys:  # the reduction decided every op (a one-op chain): nothing is left to solve
        return Solution(choice=expand_choice(pw, {}), objective=pw.constant, status="optimal",
                        seconds=time.perf_counter() - started, variables=0, constraints=0)
    edges = [(key, *same(("classes",), (m,), _classes)) for key, m in sorted(pw.edges.items())]  # by identity first
    c_parts = [pw.costs[k] for k in keys]
    e_offset = []
    for _, m, _, _ in edges:
        e_offset.append(n)
        c_parts.append(m.ravel())
        n += m.size
    matrix, lo, hi = constraints(pw, keys, offset, edges, e_offset, n, memory_rows)
    integrality = np.zeros(n)
    integrality[:e_offset[0] if e_offset else n] = 1
    c = np.concatenate(c_parts) if c_parts else np.zeros(0)
    unit = _unit(c)  # the costs HiGHS sees, scaled by a power of two (its tolerances are absolute)
    pairs = edge_rows(matrix, e_offset[0] if e_offset else n)  # each edge variable's two marginal rows
    named = names(pw, sorted(problem.nodes), keys, edges, len(memory_rows), pairs)
    result = _relaxation_first(c * unit, integrality, matrix, lo, hi, time_limit, named)
    status = {0: "optimal", 1: "time limit", 2: "infeasible", 3: "unbounded"}.get(result.status, "failed")
    if result.status == 1 and result.x is None:
        status = "time limit, no plan"
    choice = {}
    if result.x is not None:
        reduced = {k: int(np.argmax(result.x[offset[k]:offset[k] + len(pw.costs[k])])) for k in keys}
        choice = expand_choice(pw, reduced)
    objective = float(result.fun) / unit + pw.constant if result.x is not None else float("inf")
    return Solution(choice=choice, objective=objective, status=status, seconds=time.perf_counter() - started,
                    variables=n, constraints=len(lo))


def _unit(c: np.ndarray) -> float:
    """The power of two that brings the largest cost up to about 1 where it is smaller (1 otherwise). HiGHS' optimality
    tolerance is absolute (1e-7 on each reduced cost, HighsOptions.dual_feasibility_tolerance, set for costs of
    order 1), so on a program priced in seconds of a small model the simplex may stop at a vertex dearer than the
    optimum: 2e-5 of a 4-layer Llama's step of 1.3 ms, at another vertex from another start. Larger costs are left
    as they are (scaled down, the tolerance would loosen against them). A power of two changes no cost's mantissa,
    so the program is the same to the bit and its objective is divided back exactly."""
    top = float(np.abs(c).max()) if len(c) else 0.0
    return max(2.0 ** -round(np.log2(top)), 1.0) if top > 0 else 1.0


def _classes(m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An edge matrix with its equal rows and equal columns merged (strategies that place the moved tensors alike),
    and each strategy's merged row (of u) and column (of v). Edge variables over the classes, each class's marginal
    equal to the sum of its strategies' variables, give the same objective on every integral choice and the same LP
    optimum (a class's variable splits among its strategies in proportion), with fewer variables."""
    known = _CLASSES.get(tag := known_digest(m))  # most were hashed by reduce.py already
    if known is None:
        rows, row_of = unique_rows(m)
        cols, col_of = unique_rows(rows.T)
        known = _CLASSES[tag] = (cols.T, row_of, col_of)
        if len(_CLASSES) > MEMO:
            _CLASSES.clear()
    return known


_CLASSES: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # edge matrix digest -> its classes


def _relaxation_first(c: np.ndarray, integrality: np.ndarray, coo: Csc, lo: np.ndarray, hi: np.ndarray,
                      time_limit: float, named: Names | None = None) -> Any:
    """The LP relaxation first (HiGHS' dual simplex): Alpa's marginal constraints make it integral in most
    unconstrained programs, and then it is the optimum; otherwise branch and bound (``milp``)."""
    relaxed = relax(c, coo, lo, hi, named)  # linprog's own HiGHS run without its per-column wrapper (highs.py)
    if relaxed is not None and np.all(np.minimum(nodes := relaxed.x[integrality == 1], 1 - nodes) < 1e-7):
        return relaxed
    from scipy import optimize
    from scipy.optimize import Bounds, LinearConstraint

    matrix = coo.scipy()
    eq = lo == hi
    # presolve off: after reduce.py's reductions it only costs time; one thread: scipy runs HiGHS' serial dual simplex,
    # and HiGHS' pool of worker threads only waited (a third of the planner's wall time here, the same solutions).
    # "threads" is HiGHS' own option, which scipy passes to it verbatim, saying so in a warning
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unrecognized options detected", category=optimize.OptimizeWarning)
        relaxed = optimize.linprog(c, A_eq=matrix[eq], b_eq=lo[eq], A_ub=matrix[~eq] if (~eq).any() else None,
                                   b_ub=hi[~eq] if (~eq).any() else None, bounds=(0, 1), method="highs",
                                   options={"presolve": False, "threads": 1})
    if relaxed.status == 0:
        nodes = relaxed.x[integrality == 1]
        if np.all(np.minimum(nodes, 1 - nodes) < 1e-7):
            return relaxed
    if relaxed.status == 2:  # infeasible relaxation: no plan at all
        return relaxed
    return optimize.milp(c, integrality=integrality, bounds=Bounds(0, 1), constraints=LinearConstraint(matrix, lo, hi),
                         options={"time_limit": time_limit, "disp": False, "mip_rel_gap": MIP_GAP})


_FIELDS = (2, 14, 14, 16, 16)  # bits of a name: kind, node u, node v, strategy of u, strategy of v


def names(pw: Pairwise, every: list[int], keys: list[int], edges: list, memory: int, pairs: np.ndarray) -> Names | None:
    """A name for each column and row of the program that another round's program gives the same variable or
    constraint (highs.py's warm start by name): a node's strategy by its original index, an edge's class of rows
    (columns) by the first original strategy in it, a marginal row by its edge, side and class, a memory row by its
    place; a node by its place among ``every`` node of the problem. None where a node's place or a strategy index
    does not fit its field. Arrays for all edges at once, in ``matrix.constraints``' order of columns and rows;
    ``pairs``: each edge variable's two marginal rows (matrix.edge_rows)."""
    ids = [pw.ids[k] for k in keys]
    if len(every) >= 1 << _FIELDS[1] or max(int(x[-1]) for x in ids) >= 1 << _FIELDS[3]:
        return None
    place = {k: i for i, k in enumerate(every)}
    at = np.array([place[k] for k in keys])
    cols = [_name(0, np.repeat(at, [len(x) for x in ids]), 0, np.concatenate(ids), 0)]
    rows = [_name(0, at, 0, 0, 0)]
    if edges:
        u = np.array([place[key[0]] for key, *_ in edges])
        v = np.array([place[key[1]] for key, *_ in edges])
        su = np.array([m.shape[0] for _, m, _, _ in edges])
        sv = np.array([m.shape[1] for _, m, _, _ in edges])
        a = _firsts([pw.ids[key[0]] for key, *_ in edges], [e[2] for e in edges], su)
        b = _firsts([pw.ids[key[1]] for key, *_ in edges], [e[3] for e in edges], sv)
        first = np.cumsum(su + sv) - su - sv  # each edge's first marginal row
        marginal = np.empty(int((su + sv).sum()), dtype=np.int64)
        for side, size, arg in ((0, su, a), (1, sv, b)):
            e, j = spans(size)
            marginal[first[e] + side * su[e] + j] = _name(1 + side, u[e], v[e], arg * (1 - side), arg * side)
        rows.append(marginal)
        # an edge column's name: its u-marginal row's (kind 1, u, v, its row class's) with its v-marginal row's
        # column class (the name's last field)
        cols.append(marginal[pairs[:, 0] - len(keys)] | marginal[pairs[:, 1] - len(keys)] & (1 << _FIELDS[4]) - 1)
    rows.append(_name(3, np.arange(memory), 0, 0, 0))
    return Names(cols=np.concatenate(cols), rows=np.concatenate(rows))


def _firsts(ids: list[np.ndarray], class_of: list[np.ndarray], classes: np.ndarray) -> np.ndarray:
    """Each class's first original strategy, the classes of every edge one after another (a node's ``ids``
    ascend, so its first strategy in a class is its least)."""
    offset = np.repeat(np.cumsum(classes) - classes, [len(c) for c in class_of])
    where = np.concatenate(class_of) + offset
    first = np.full(int(classes.sum()), where.size)
    np.minimum.at(first, where, np.arange(where.size))
    return np.concatenate(ids)[first]


def _name(kind: int, u: Any, v: Any, a: Any, b: Any) -> np.ndarray:
    shift = np.cumsum((0,) + _FIELDS[::-1])[:-1][::-1]  # 60, 46, 32, 16, 0
    field = [np.asarray(x, dtype=np.int64) << int(s) for x, s in zip((kind, u, v, a, b), shift, strict=True)]
    return np.atleast_1d(field[0] | field[1] | field[2] | field[3] | field[4])
