"""Goldstein's criterion in the sharding planner's reductions (autoshard/reduce.py) shrinks the program without moving
its optimum: on random pairwise programs the LP relaxation's optimum (which ilp.py solves) and the integer optimum
are those of the program it was applied to; on traced Llama-style graphs (several sizes of mesh, memory priced at
several rates, as the Lagrangian's rounds price it) the program HiGHS solves has fewer columns and the same
objective as without it."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from meshplan import load_model
from meshplan.autoshard import reduce as reductions
from meshplan.autoshard.reduce import Pairwise, _dominated, restrict

scipy_optimize = pytest.importorskip("scipy.optimize")

DRAWS = 200


def _program(rng: np.random.Generator) -> Pairwise:
    """5 nodes of 2-5 strategies, dense random edges (so that Goldstein's sum of worst changes drops some) and costs
    from a few values (ties)."""
    sizes = rng.integers(2, 6, 5)
    costs = {k: rng.choice([0.0, 1.0, 2.0, 4.0, 8.0], int(sizes[k])) for k in range(5)}
    edges = {(u, v): rng.choice([0.0, 0.25, 0.5, 1.0], (int(sizes[u]), int(sizes[v])))
             for u, v in itertools.combinations(range(5), 2) if rng.random() < 0.5}
    return Pairwise(costs=costs, edges=edges, memory={}, ids={k: np.arange(int(sizes[k])) for k in range(5)})


def _lp(pw: Pairwise) -> float:
    """The program's LP relaxation (ilp.py's: one strategy per node, each edge's marginals) by linprog."""
    keys = sorted(pw.costs)
    at = dict(zip(keys, np.cumsum([0] + [len(pw.costs[k]) for k in keys])[:-1], strict=True))
    n = sum(len(c) for c in pw.costs.values())
    c, rows, rhs = [*itertools.chain.from_iterable(pw.costs[k] for k in keys)], [], []
    for k in keys:
        rows.append({at[k] + a: 1.0 for a in range(len(pw.costs[k]))})
        rhs.append(1.0)
    for (u, v), m in pw.edges.items():
        start = n
        c += list(m.ravel())
        n += m.size
        for a in range(m.shape[0]):
            rows.append({**{start + a * m.shape[1] + b: 1.0 for b in range(m.shape[1])}, at[u] + a: -1.0})
            rhs.append(0.0)
        for b in range(m.shape[1]):
            rows.append({**{start + a * m.shape[1] + b: 1.0 for a in range(m.shape[0])}, at[v] + b: -1.0})
            rhs.append(0.0)
    dense = np.zeros((len(rows), n))
    for r, entries in enumerate(rows):
        for j, value in entries.items():
            dense[r, j] = value
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        found = scipy_optimize.linprog(np.array(c), A_eq=dense, b_eq=np.array(rhs), bounds=(0, 1), method="highs")
    assert found.status == 0
    return float(found.fun)


def _integer(pw: Pairwise) -> float:
    keys = sorted(pw.costs)
    return min(sum(float(pw.costs[k][a]) for k, a in zip(keys, pick, strict=True))
               + sum(float(m[pick[keys.index(u)], pick[keys.index(v)]]) for (u, v), m in pw.edges.items())
               for pick in itertools.product(*(range(len(pw.costs[k])) for k in keys)))


def test_goldstein_keeps_both_optima():
    """Each random program, Goldstein's criterion applied at every node in turn (as reduce.py's sweep does): some
    strategies go, and the LP relaxation's optimum and the integer optimum stay to 1e-12."""
    rng = np.random.default_rng(11)
    dropped = 0
    for _ in range(DRAWS):
        original = _program(rng)
        pw = Pairwise(costs=dict(original.costs), edges=dict(original.edges), memory={}, ids=dict(original.ids))
        around = pw.neighbours()
        for key in list(pw.costs):
            keep = _dominated(pw, key, around[key], strong=True)
            dropped += len(pw.costs[key]) - len(keep)
            restrict(pw, key, keep, around[key])
        assert _lp(pw) == pytest.approx(_lp(original), abs=1e-12)
        assert _integer(pw) == pytest.approx(_integer(original), abs=1e-12)
    assert dropped > DRAWS  # it does drop strategies here, not only plain dominance's


torch = pytest.importorskip("torch")

from meshplan.autoshard import ilp  # noqa: E402
from meshplan.autoshard.blocks import find_blocks  # noqa: E402
from meshplan.autoshard.dataflow import flow  # noqa: E402
from meshplan.autoshard.highs import Relaxed  # noqa: E402
from meshplan.autoshard.memory import Accounting  # noqa: E402
from meshplan.autoshard.mesh import device_mesh  # noqa: E402
from meshplan.autoshard.problem import build_problem  # noqa: E402
from meshplan.autoshard.solve import _penalty, price, start_points  # noqa: E402
from meshplan.autoshard.torch_models import build_preset  # noqa: E402
from meshplan.specs.efficiency import DEFAULT  # noqa: E402
from meshplan.specs.hardware import load_system  # noqa: E402
from meshplan.trace import trace_module  # noqa: E402

LLAMA = replace(load_model("llama3-8b"), name="tiny", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2,
                head_dim=16, ffn_hidden_size=128, vocab_size=256, seq_length=32)
WIDE = replace(LLAMA, name="wide", hidden_size=128, num_heads=8, num_kv_heads=8, ffn_hidden_size=512, vocab_size=512)


@cache
def _traced(spec):
    """A 2-layer trace's dataflow and blocks, once per model: the cases of two meshes share it (the trace is the
    model's alone; the mesh enters at build_problem)."""
    traced = trace_module(build_preset(spec, 2), [((16, 32), "int64")], param_dtype="bfloat16")
    blocks = find_blocks(traced, layers=4)
    return flow(traced, blocks.block_of), blocks


@pytest.mark.parametrize(("spec", "gpus"), [(LLAMA, 16), (LLAMA, 64), (WIDE, 8), (WIDE, 64)])
def test_the_shrunk_program_has_the_same_objective(spec, gpus, monkeypatch):
    """A 2-layer trace on H100s; memory unpriced, then priced at 0.1 to 1000 times the step's seconds per byte of the
    limit at the unsharded peak and the end of the forward pass (solve.py's rounds): ilp.solve's objective with
    Goldstein's sweep equals that without it (reduce.goldstein keeping every strategy) to HiGHS' own tolerance (1e-7
    on a reduced cost, costs of order 1: ilp._unit) where both LP relaxations are integral, and never exceeds it by
    more where branch and bound answers (within ilp.MIP_GAP of the optimum, either), on a program with fewer
    columns in all."""
    dataflow, blocks = _traced(spec)
    problem = build_problem(dataflow, blocks, device_mesh(load_system("h100").cluster(gpus)), DEFAULT)
    accounting = Accounting(problem)
    rows = {p: accounting.row(p) for p in start_points(problem)}
    first, integral = ilp._relaxation_first, []
    monkeypatch.setattr(ilp, "_relaxation_first",
                        lambda *a: integral.append(isinstance(found := first(*a), Relaxed)) or found)
    free = ilp.solve(problem, 1, [])  # memory unpriced: solve.plan's first round, which plan(problem, 1e15) returns
    scale = price(problem, free.choice).step(1) / accounting.evaluate(free.choice).peak
    penalties = [None] + [_penalty(rows, scale * f) for f in (0.1, 1.0, 10.0, 1000.0)]
    shrunk = [free] + [ilp.solve(problem, 1, [], penalty=p) for p in penalties[1:]]
    monkeypatch.setattr(reductions, "goldstein", lambda cost, rest, worst: np.arange(len(cost)))
    monkeypatch.setattr(reductions, "_KEPT", {})  # the strategies kept, remembered by profile: not the shrunk ones
    monkeypatch.setattr(reductions, "_SAME", {})  # nor by the arrays' identity
    whole = [ilp.solve(problem, 1, [], penalty=p) for p in penalties]
    lp = [a and b for a, b in zip(integral[:len(shrunk)], integral[len(shrunk):], strict=True)]
    for a, b, exact in zip(shrunk, whole, lp, strict=True):
        assert a.status == b.status == "optimal"
        if exact:
            assert a.objective == pytest.approx(b.objective, rel=1e-7)
        else:
            assert b.objective * (1 - ilp.MIP_GAP) <= a.objective <= b.objective * (1 + 1e-7)
    assert sum(lp) >= 3  # most rounds' relaxations are integral (ilp.py)
    assert sum(a.variables for a in shrunk) < sum(b.variables for b in whole)
