"""The sharding planner's LP relaxation through HiGHS' own bindings (autoshard/highs.py) gives what
``scipy.optimize.linprog`` gave before it: the same vertex and objective on random programs of ilp.py's form, and the
same plans (objective, every node's strategy, price) of traced Llama-style graphs, memory priced in several rounds."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from meshplan import load_model
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system

torch = pytest.importorskip("torch")
scipy_optimize = pytest.importorskip("scipy.optimize")
from scipy.sparse import csr_matrix  # noqa: E402

from meshplan.autoshard import highs, ilp  # noqa: E402
from meshplan.autoshard.blocks import find_blocks  # noqa: E402
from meshplan.autoshard.dataflow import flow  # noqa: E402
from meshplan.autoshard.mesh import device_mesh  # noqa: E402
from meshplan.autoshard.problem import build_problem  # noqa: E402
from meshplan.autoshard.solve import plan  # noqa: E402
from meshplan.autoshard.torch_models import build_preset  # noqa: E402
from meshplan.trace import trace_module  # noqa: E402


def _linprog(c, matrix, lo, hi):
    eq = lo == hi
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Unrecognized options detected")
        return scipy_optimize.linprog(c, A_eq=matrix[eq], b_eq=lo[eq], A_ub=matrix[~eq] if (~eq).any() else None,
                                      b_ub=hi[~eq] if (~eq).any() else None, bounds=(0, 1), method="highs",
                                      options={"presolve": False, "threads": 1})


def _pairwise_lp(rng: np.random.Generator, memory: bool):
    """ilp.py's program of a random pairwise problem: one strategy per node, edge marginals, and (``memory``) one
    memory row whose limit the cheapest plan exceeds."""
    sizes = rng.integers(2, 6, 5)
    off = np.concatenate(([0], np.cumsum(sizes)))
    pairs = [p for p in itertools.combinations(range(5), 2) if rng.random() < 0.6]
    rows, lo, hi, cols, c = [], [], [], int(off[-1]), list(rng.choice([0.0, 1.0, 2.0, 3.5], int(off[-1])))
    for k in range(5):
        rows.append({j: 1.0 for j in range(off[k], off[k + 1])})
        lo.append(1.0)
        hi.append(1.0)
    for u, v in pairs:
        start, su, sv = cols, int(sizes[u]), int(sizes[v])
        c += list(rng.choice([0.0, 0.5, 2.0], su * sv))
        cols += su * sv
        for a in range(su):
            rows.append({**{start + a * sv + b: 1.0 for b in range(sv)}, off[u] + a: -1.0})
        for b in range(sv):
            rows.append({**{start + a * sv + b: 1.0 for a in range(su)}, off[v] + b: -1.0})
        lo += [0.0] * (su + sv)
        hi += [0.0] * (su + sv)
    if memory:
        rows.append({j: float(rng.integers(1, 4)) for j in range(off[-1])})
        lo.append(-np.inf)
        hi.append(7.0)
    dense = np.zeros((len(rows), cols))
    for r, entries in enumerate(rows):
        for j, v in entries.items():
            dense[r, j] = v
    return np.array(c), csr_matrix(dense), np.array(lo), np.array(hi)


@pytest.mark.parametrize("memory", [False, True])
def test_the_relaxation_is_linprogs_vertex(memory):
    """200 random programs: HiGHS through its bindings returns linprog's x and objective bit for bit (the same
    model, options and iterations), or None where linprog reports another status than optimal."""
    rng = np.random.default_rng(7 + memory)
    for _ in range(100):
        c, matrix, lo, hi = _pairwise_lp(rng, memory)
        mine, theirs = highs.relax(c, matrix, lo, hi), _linprog(c, matrix, lo, hi)
        if theirs.status != 0:
            assert mine is None
            continue
        assert mine is not None
        assert np.array_equal(mine.x, theirs.x)
        assert mine.fun == theirs.fun


TINY = replace(load_model("llama3-8b"), name="tiny", num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2,
               head_dim=16, ffn_hidden_size=128, vocab_size=256, seq_length=32)


@pytest.fixture(scope="module")
def traced():
    return trace_module(build_preset(TINY, 2), [((16, 32), "int64")], param_dtype="bfloat16")


@pytest.fixture(scope="module")
def planned(traced):
    """The problem on ``gpus`` H100s, its limit (0.6 of the unconstrained plan's peak) and the cold plan under it,
    made once per mesh for the module: each test asks before it patches anything (plan is a pure function of the
    problem; each plan starts its own warm-start scope, highs.warm_starts, and the cache is off, conftest.py)."""
    @cache
    def made(gpus: int) -> tuple:
        blocks = find_blocks(traced, layers=4)
        problem = build_problem(flow(traced, blocks.block_of), blocks, device_mesh(load_system("h100").cluster(gpus)),
                                DEFAULT)
        limit = 0.6 * plan(problem, 1e15).memory.peak
        return problem, limit, plan(problem, limit)
    return made


@pytest.mark.parametrize("gpus", [16, 64])
def test_plans_are_those_linprog_found(planned, gpus, monkeypatch):
    """A 2-layer trace of a 4-layer Llama on 16 and 64 H100s, under a memory limit that the unconstrained plan
    exceeds (the Lagrangian's rounds and their LPs): the plan, its objective and price are linprog's."""
    problem, limit, fast = planned(gpus)
    objectives = [ilp.solve(problem, 1, []).objective]
    monkeypatch.setattr(highs, "_bindings", lambda: None)  # linprog answers every relaxation
    slow = plan(problem, limit)
    objectives.append(ilp.solve(problem, 1, []).objective)
    assert fast.rounds > 1 and fast.rounds == slow.rounds
    assert fast.choice == slow.choice
    assert fast.price == slow.price
    assert fast.memory.peak == slow.memory.peak and np.array_equal(fast.memory.timeline, slow.memory.timeline)
    assert objectives[0] == objectives[1]


@pytest.mark.parametrize("memory", [False, True])
def test_a_warm_start_reaches_the_cold_optimum(memory):
    """Inside ``warm_starts`` a program with the constraints of one solved before starts from its optimal basis
    (the Lagrangian's rounds: only the costs move): on 200 random programs, each solved again with other costs, the
    optimum's value is the cold start's, the vertex feasible; outside the scope nothing is kept."""
    rng = np.random.default_rng(11 + memory)
    reused = 0
    for _ in range(100):
        c, matrix, lo, hi = _pairwise_lp(rng, memory)
        other = c + rng.choice([0.0, 0.25, 1.5], len(c))
        cold = highs.relax(other, matrix, lo, hi)
        with highs.warm_starts():
            first = highs.relax(c, matrix, lo, hi)
            kept = dict(highs._BASES.get() or {})
            warm = highs.relax(other, matrix, lo, hi)
        if cold is None:
            continue
        assert first is not None and warm is not None and len(kept) == 1
        reused += 1
        assert warm.fun == pytest.approx(cold.fun, rel=1e-12, abs=1e-12)
        row = matrix @ warm.x
        assert np.all(row >= lo - 1e-9) and np.all(row <= hi + 1e-9)
        assert np.all(warm.x >= -1e-9) and np.all(warm.x <= 1 + 1e-9)
    assert reused > 50 and highs._BASES.get() is None


@pytest.mark.parametrize("memory", [False, True])
def test_entries_give_scipys_columns(memory):
    """A program handed over as entries (highs.Coo; ilp.py's own is built column-wise, matrix.constraints, and
    test_autoshard_reduce checks it against these arrays): the column-wise arrays HiGHS reads are scipy's
    canonical CSC of the same matrix, inequality rows first as linprog orders them, so the model is the same to the
    bit and so is the vertex."""
    rng = np.random.default_rng(5 + memory)
    for _ in range(30):
        c, matrix, lo, hi = _pairwise_lp(rng, memory)
        coo = matrix.tocoo()
        order = rng.permutation(coo.nnz)  # entries in any order
        entries = highs.Coo(rows=coo.row[order], cols=coo.col[order], vals=coo.data[order], shape=matrix.shape)
        eq = lo == hi
        for mine, theirs in zip(highs._columns(entries, eq), highs._columns(matrix, eq), strict=True):
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)
        a, b = highs.relax(c, entries, lo, hi), highs.relax(c, matrix, lo, hi)
        assert (a is None) == (b is None)
        if a is not None and b is not None:
            assert np.array_equal(a.x, b.x) and a.fun == b.fun


def test_the_bindings_load_without_scipy_optimize():
    """highs.py loads HiGHS' bindings from SciPy's file without running scipy.optimize's package (about half a
    second of imports); scipy.optimize imported afterwards uses the same module, and linprog still answers."""
    import subprocess
    import sys

    code = ("import sys\nfrom meshplan.autoshard import highs\ncore = highs._bindings()\n"
            "assert core is not None and 'scipy.optimize' not in sys.modules and 'scipy.sparse' not in sys.modules\n"
            "from scipy.optimize import linprog\nfrom scipy.optimize._highspy import _core\nassert _core is core\n"
            "r = linprog([1.0, 2.0], A_eq=[[1.0, 1.0]], b_eq=[1.0], bounds=(0, 1), method='highs')\n"
            "assert r.status == 0 and list(r.x) == [1.0, 0.0]\nprint('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def _counted(made, iterations: list):
    """A stand-in for HiGHS' own object that appends its simplex iterations to ``iterations`` after each run."""

    class Counted:
        def __init__(self):
            self.inner = made()

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def run(self):
            status = self.inner.run()
            iterations.append(self.inner.getInfo().simplex_iteration_count)
            return status

    return Counted


@pytest.mark.parametrize("gpus", [16, 64])
def test_rounds_carried_by_name_reach_the_cold_optimum(planned, gpus, monkeypatch):
    """The 4-layer Llama under a memory limit (the Lagrangian's rounds, whose programs keep different strategies):
    rounds that start from the last round's basis carried by name (highs._carried) end at the objective of a cold
    start to HiGHS' own tolerance (1e-7 on a reduced cost, the costs of order 1: ilp._unit; 2.5e-9 apart here since
    reduce.py's Goldstein sweep shapes the programs), at the same plan, and take fewer simplex iterations in all."""
    problem, limit, _ = planned(gpus)
    seen: dict[str, list] = {"objective": [], "carried": [], "iterations": []}
    solve_ilp, carried, bindings = ilp.solve, highs._carried, highs._bindings()
    made = bindings._Highs

    Counted = _counted(made, seen["iterations"])

    monkeypatch.setattr("meshplan.autoshard.solve.solve_ilp",
                        lambda *a, **k: seen["objective"].append(solve_ilp(*a, **k)) or seen["objective"][-1])
    monkeypatch.setattr(highs, "_carried", lambda *a: seen["carried"].append(1) or carried(*a))
    monkeypatch.setattr(bindings, "_Highs", Counted)
    warm = plan(problem, limit)
    runs = {k: list(v) for k, v in seen.items()}
    for v in seen.values():
        v.clear()
    monkeypatch.setattr(ilp, "names", lambda *a: None)  # no names: each new program starts cold
    cold = plan(problem, limit)
    assert runs["carried"] and not seen["carried"]
    assert warm.choice == cold.choice and warm.price == cold.price and warm.rounds == cold.rounds
    for a, b in zip(runs["objective"], seen["objective"], strict=True):
        assert a.objective == pytest.approx(b.objective, rel=1e-7)
    assert sum(runs["iterations"]) < sum(seen["iterations"])


def test_costs_go_to_highs_scaled_by_a_power_of_two():
    """ilp._unit: a program's largest cost brought up to about 1 (HiGHS' absolute tolerance then relative to it),
    larger ones left alone, every cost's mantissa kept so the objective divides back exactly."""
    rng = np.random.default_rng(3)
    for top in (1e-6, 3e-4, 0.9, 21.0, 7e5):
        c = rng.uniform(0, top, 50)
        unit = ilp._unit(c)
        assert np.log2(unit) == round(np.log2(unit))
        biggest = np.abs(c * unit).max()
        assert (2**-0.5 <= biggest <= 2**0.5) if top < 1 else unit == 1.0
        assert np.array_equal((c * unit) / unit, c)
    assert ilp._unit(np.zeros(3)) == 1.0


def test_a_pinned_plan_starts_from_the_plans_first_round(planned, monkeypatch):
    """as_written.py's second plan (a few parameters pinned) starts its first round from the plan's first round's
    basis (Sharding.basis, by name): the same plan and objectives as a plan that starts cold."""
    from meshplan.autoshard.solve import replicated_choice

    problem, limit, found = planned(16)
    assert found.basis is not None
    params = [k for k, node in sorted(problem.nodes.items()) if node.kind == "param"][:3]
    pinned = {k: {replicated_choice(problem)[k]} for k in params}
    starts: list = []
    carried = highs._carried
    monkeypatch.setattr(highs, "_carried", lambda h, last, *a: starts.append(last) or carried(h, last, *a))
    seeded = plan(problem, limit, allowed=pinned, start=found.basis)
    assert starts and starts[0] is found.basis
    cold = plan(problem, limit, allowed=pinned)
    assert seeded.choice == cold.choice and seeded.price == cold.price and seeded.rounds == cold.rounds
    assert seeded.choice != found.choice


def test_a_program_solved_before_starts_at_its_optimum(planned, tmp_path, monkeypatch):
    """A plan's programs' optimal bases and rounds' answers kept on disk (highs._solved_path, highs.kept_round,
    MESHPLAN_CACHE): planned again, each round's answer is read back and nothing is solved; where a round's answer is
    not kept, the rounds read before it are solved first (highs.catch_up) and each round's program starts at its own
    optimal basis, HiGHS ending there without an iteration, at the same vertex (the same objectives, every round's, and
    the same plan); a record of another size, or none, is a cold start as before; ``MESHPLAN_CACHE=off`` keeps
    nothing."""
    problem, limit, cold = planned(16)  # the cache is off under tests (conftest.py)
    assert cold.rounds > 2
    seen: dict[str, list] = {"objective": [], "iterations": []}
    solve_ilp, bindings = ilp.solve, highs._bindings()
    made = bindings._Highs

    Counted = _counted(made, seen["iterations"])

    def solved(*a, **k):
        sol = solve_ilp(*a, **k)
        seen["objective"].append(sol.objective)
        return sol

    monkeypatch.setattr("meshplan.autoshard.solve.solve_ilp", solved)
    monkeypatch.setattr(bindings, "_Highs", Counted)
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    runs = []
    for _ in range(2):
        found = plan(problem, limit)
        runs.append((found, list(seen["objective"]), list(seen["iterations"])))
        for v in seen.values():
            v.clear()
    (first, first_objectives, first_iterations), (again, objectives, iterations) = runs
    kept = sorted((tmp_path / "bases").glob("*.basis"))
    answers = sorted((tmp_path / "bases").glob("*.round"), key=lambda p: p.stat().st_mtime_ns)  # in the rounds' order
    assert len(kept) == len(answers) == cold.rounds and sum(first_iterations) > 0
    assert iterations == [] and objectives == first_objectives  # every round's answer read back: nothing solved
    answers[-1].unlink()  # the last round not kept: the rounds before it solved first, each from its optimal basis
    caught = plan(problem, limit)
    assert seen["iterations"] == [0] * cold.rounds and seen["objective"] == first_objectives
    for v in seen.values():
        v.clear()
    for path in answers:  # no answer kept (the last one's written again), the bases are: each round solved again
        path.unlink()  # without an iteration
    runs.append((plan(problem, limit), list(seen["objective"]), list(seen["iterations"])))
    assert runs[-1][1] == first_objectives and runs[-1][2] == [0] * cold.rounds  # to the bit: the same vertices
    for found in (first, again, caught, runs[-1][0]):
        assert found.choice == cold.choice and found.price == cold.price and found.rounds == cold.rounds
    for path in answers:  # solved again, not read
        path.unlink()
    kept[0].write_bytes(b"\x01\x00")  # not this program's size: a cold start, and the record written over
    assert plan(problem, limit).choice == cold.choice and kept[0].stat().st_size > 2
    monkeypatch.setenv("MESHPLAN_CACHE", "off")
    assert highs._solved_dir() is None


def test_a_plan_read_back_starts_its_pinned_plan_alike(planned, tmp_path, monkeypatch):
    """A plan whose rounds were all read back (highs.kept_round) has solved no first round: its basis is solved when
    a pinned plan (as_written.py's) first needs it (highs.first_basis), and that plan is the one that starts from a
    plan solved cold."""
    from meshplan.autoshard.solve import replicated_choice

    problem, limit, cold = planned(16)
    params = [k for k, node in sorted(problem.nodes.items()) if node.kind == "param"][:3]
    pinned = {k: {replicated_choice(problem)[k]} for k in params}
    seeded = plan(problem, limit, allowed=pinned, start=cold.basis)
    monkeypatch.setenv("MESHPLAN_CACHE", str(tmp_path))
    plan(problem, limit)
    read = plan(problem, limit)  # every round read back
    assert read.choice == cold.choice and callable(read.basis)
    again = plan(problem, limit, allowed=pinned, start=read.basis)
    assert again.choice == seeded.choice and again.price == seeded.price and again.rounds == seeded.rounds
