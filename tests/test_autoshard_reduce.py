"""The sharding planner's exact reductions (autoshard/reduce.py) and the edge classes of its program (ilp._classes),
on random pairwise programs small enough to solve by enumeration: the reduced program's optimum, its choice read back,
is the original's; dominance keeps what the plain greedy rule keeps; the row classes are NumPy's own."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from meshplan.autoshard import highs
from meshplan.autoshard import reduce as reductions
from meshplan.autoshard.dominance import Rest, goldstein
from meshplan.autoshard.ilp import _classes
from meshplan.autoshard.ilp import names as ilp_names
from meshplan.autoshard.matrix import constraints as ilp_constraints
from meshplan.autoshard.matrix import edge_rows
from meshplan.autoshard.reduce import Pairwise, _dominated, expand_choice, reduce, restrict, same
from meshplan.xp import unique_rows

DRAWS = 300


def random_program(rng: np.random.Generator) -> Pairwise:
    """4-6 nodes of 2-4 strategies, random edges; costs from a few values so that ties and duplicates occur."""
    n = int(rng.integers(4, 7))
    sizes = rng.integers(2, 5, n)
    values = np.array([0.0, 0.5, 1.0, 2.0, 3.0])
    costs = {k: rng.choice(values, int(sizes[k])) for k in range(n)}
    edges = {(u, v): rng.choice(values, (int(sizes[u]), int(sizes[v])))
             for u, v in itertools.combinations(range(n), 2) if rng.random() < 0.5}
    memory = {k: rng.choice(values, (int(sizes[k]), 1)) for k in range(n) if rng.random() < 0.2}
    return Pairwise(costs=costs, edges=edges, memory=memory, ids={k: np.arange(int(sizes[k])) for k in range(n)})


def cost(pw: Pairwise, choice: dict[int, int]) -> float:
    return (sum(float(c[choice[k]]) for k, c in pw.costs.items())
            + sum(float(m[choice[u], choice[v]]) for (u, v), m in pw.edges.items()) + pw.constant)


def optimum(pw: Pairwise) -> float:
    keys = sorted(pw.costs)
    return min(cost(pw, dict(zip(keys, pick, strict=True)))
               for pick in itertools.product(*(range(len(pw.costs[k])) for k in keys)))


def copy(pw: Pairwise) -> Pairwise:
    return Pairwise(costs=dict(pw.costs), edges=dict(pw.edges), memory=dict(pw.memory), ids=dict(pw.ids))


@pytest.mark.parametrize("seed", range(3))
def test_the_reduced_program_has_the_original_optimum(seed):
    """Each of DRAWS programs: reduced, solved by enumeration and its choice read back (expand_choice), it costs the
    original's optimum."""
    rng = np.random.default_rng(seed)
    for _ in range(DRAWS // 3):
        original = random_program(rng)
        reduced = reduce(copy(original))
        keys = sorted(reduced.costs)
        best = min(itertools.product(*(range(len(reduced.costs[k])) for k in keys)),
                   key=lambda pick: cost(reduced, dict(zip(keys, pick, strict=True))), default=())
        choice = expand_choice(reduced, dict(zip(keys, best, strict=True)))
        assert cost(original, choice) == pytest.approx(optimum(original), abs=1e-12)


def greedy(profile: np.ndarray) -> np.ndarray:
    """Dominance as first written: in lexicographic order, keep each strategy no kept one beats."""
    kept: list[int] = []
    for a in np.lexsort(profile.T[::-1]):
        if not kept or not np.any(np.all(profile[kept] <= profile[a] + 1e-15, axis=1)):
            kept.append(int(a))
    return np.array(sorted(kept))


def test_dominance_keeps_what_the_greedy_rule_keeps():
    """_dominated decides from one array which strategy beats which; it keeps exactly what the strategy-by-strategy
    greedy rule keeps, ties and near-ties (1e-15) included."""
    rng = np.random.default_rng(7)
    for _ in range(DRAWS):
        pw = random_program(rng)
        for key in pw.costs:
            around = pw.neighbours()[key]
            parts = [pw.costs[key][:, None]] + [pw.matrix(key, v) for v in sorted(around)]
            if key in pw.memory:
                parts.append(pw.memory[key])
            profile = np.concatenate(parts, axis=1)
            if rng.random() < 0.3:  # nudge a value by less than the tolerance
                profile[0, 0] += 1e-16
                pw.costs[key] = profile[:, 0].copy()
            assert np.array_equal(_dominated(pw, key, around), greedy(profile))


def test_the_rests_rank_orders_a_profile_as_a_lexsort_of_it_whole():
    """Rest.order(cost) is np.lexsort of the whole profile [cost, rest] (its columns reversed): cost first, ties in
    the rest's lexicographic order, equal rows in index order; with duplicate rows, -0.0 beside 0.0, inf, and a NaN
    (sorted whole then)."""
    rng = np.random.default_rng(11)
    pool = np.array([0.0, -0.0, 0.5, 1.0, np.inf])
    for draw in range(DRAWS):
        rows, width = int(rng.integers(1, 12)), int(rng.integers(0, 5))
        rest = rng.choice(pool, (rows, width))
        rest = rest[rng.integers(0, rows, rows)]  # duplicate rows
        if draw % 10 == 0 and width:
            rest[int(rng.integers(rows)), int(rng.integers(width))] = np.nan
        cost = rng.choice(pool[:4], rows)
        whole = np.concatenate((cost[:, None], rest), axis=1)
        assert np.array_equal(Rest(rest, 0).order(cost), np.lexsort(whole.T[::-1]))


def test_goldstein_on_a_rest_is_goldstein_on_the_whole_profile():
    """goldstein(cost, Rest(...), worst) against the criterion written out on the whole profile: b beats a where
    c_b - c_a + the edges' worst changes <= 1e-15 and b holds no more bytes; the last in lexicographic order goes
    first where one still alive beats it."""
    rng = np.random.default_rng(5)
    values = np.array([0.0, 0.5, 1.0, 2.0])
    for _ in range(DRAWS):
        rows, held = int(rng.integers(2, 8)), int(rng.integers(0, 3))
        blocks = [rng.choice(values, (rows, int(rng.integers(1, 4)))) for _ in range(int(rng.integers(0, 3)))]
        cost, rest = rng.choice(values, rows), np.concatenate([np.zeros((rows, 0)), *blocks,
                                                               rng.choice(values, (rows, held))], axis=1)
        worst = [(b[None, :, :] - b[:, None, :]).max(axis=2) for b in blocks]  # [a, b]: max_j R[b, j] - R[a, j]
        gain = cost[None, :] - cost[:, None] + sum(worst, np.zeros((rows, rows)))
        beats = (gain <= 1e-15) & np.all(rest[None, :, rest.shape[1] - held:] <= rest[:, None, rest.shape[1] - held:]
                                         + 1e-15, axis=2)
        np.fill_diagonal(beats, False)
        alive = np.ones(rows, dtype=bool)
        for a in np.lexsort(np.concatenate((cost[:, None], rest), axis=1).T[::-1])[::-1]:
            alive[a] &= not (beats[a] & alive).any()
        assert np.array_equal(goldstein(cost, Rest(rest, held), worst), np.flatnonzero(alive))


def test_a_profile_whose_rest_was_met_compares_its_cost_only():
    """Node 0 priced again (a new cost array, its edge and bytes the same objects): its rest (reduce._REST) is the one
    made before, and what it keeps is what a reduction with every memo empty keeps."""
    edge = np.array([[1.0, 2.0], [1.0, 2.0], [0.0, 3.0]])
    pw = Pairwise(costs={0: np.array([1.0, 1.0, 2.0]), 1: np.array([0.0, 0.0])}, edges={(0, 1): edge},
                  memory={0: np.array([[2.0], [1.0], [1.0]])}, ids={0: np.arange(3), 1: np.arange(2)})
    reductions._REST.clear()
    assert _dominated(pw, 0, {1}).tolist() == [1, 2]  # 1 costs no more than 0 anywhere and holds less
    made = {k: v for k, v in reductions._REST.items() if v.columns.shape == (3, 3)}  # its rest: edge, bytes
    assert len(made) == 1
    for new_cost, keeps in (([0.5, 1.0, 2.0], [0, 1, 2]), ([3.0, 1.0, 0.0], [1, 2]), ([1.0, 1.0, 1.0], [1, 2])):
        again = copy(pw)
        again.costs[0] = np.array(new_cost)
        assert _dominated(again, 0, {1}).tolist() == keeps
        assert all(reductions._REST.get(k) is v for k, v in made.items())  # met again, not made again
        fresh = copy(again)
        fresh.costs[0], fresh.edges[(0, 1)], fresh.memory[0] = (a.copy() for a in (fresh.costs[0], edge, pw.memory[0]))
        saved = {m: dict(getattr(reductions, m)) for m in ("_KEPT", "_SAME", "_REST", "_PARTS")}
        for m in saved:
            getattr(reductions, m).clear()
        assert _dominated(fresh, 0, {1}).tolist() == keeps  # every memo empty: the same strategies kept
        for m, held in saved.items():
            getattr(reductions, m).update(held)


def test_the_row_classes_are_numpys_unique_rows():
    rng = np.random.default_rng(3)
    for _ in range(DRAWS):
        rows, cols = (int(x) for x in rng.integers(1, 30, 2))
        pool = rng.choice([0.0, 1e-9, 0.5, 2.0, np.inf], (int(rng.integers(1, 6)), cols))
        m = pool[rng.integers(0, len(pool), rows)] if rng.random() < 0.7 else rng.random((rows, cols))
        unique, inverse = np.unique(m, axis=0, return_inverse=True)
        got, got_inverse = unique_rows(m)
        assert np.array_equal(got, unique) and np.array_equal(got_inverse, np.ravel(inverse))
        classes, row_of, col_of = _classes(m)
        assert np.array_equal(classes[row_of][:, col_of], m)  # every entry is its classes' entry


def test_equal_kept_indices_are_one_object_so_the_edges_they_restrict_are_met_again():
    """Two profiles of node 0 that differ (its cost priced again, as a Lagrangian round does) but keep the same
    strategies give the same index object; the edge restricted by it is the same object too, so node 1's profile,
    whose arrays are unchanged, is met by identity (reduce.same) rather than hashed again."""
    edge = np.array([[1.0, 2.0], [1.0, 2.0], [3.0, 0.0]])  # node 0's strategies 0 and 1 are duplicates: 1 goes
    first = Pairwise(costs={0: np.array([1.0, 1.0, 2.0]), 1: np.array([0.0, 0.0])}, edges={(0, 1): edge}, memory={},
                     ids={0: np.arange(3), 1: np.arange(2)})
    again = copy(first)
    again.costs[0] = first.costs[0] + 0.5  # a new array, a new profile: kept by digest, not by identity
    keep, keep_again = _dominated(first, 0, {1}), _dominated(again, 0, {1})
    assert keep.tolist() == [0, 2] and keep_again is keep
    restrict(first, 0, keep, {1})
    restrict(again, 0, keep_again, {1})
    assert again.edges[(0, 1)] is first.edges[(0, 1)]
    assert _dominated(again, 1, {0}) is _dominated(first, 1, {0})


def test_an_equal_result_of_other_arguments_is_the_first_object():
    """reduce.same hands back the array made first where another computation gives an equal one (never written, so
    one object serves both), and leaves other results as they are."""
    a, b = np.array([1.0, 2.0]), np.array([0.5, 1.0])
    first = same(("test-add",), (a, a), np.add)
    second = same(("test-mul",), (b, np.array([4.0, 4.0])), np.multiply)
    assert second is first and first.tolist() == [2.0, 4.0]
    assert same(("test-pair",), (a,), lambda x: (x * 2, "tag")) == (first, "tag")


def test_the_programs_edge_rows_and_names_are_an_edge_by_edge_loops():
    """matrix.constraints' entries and ilp.names' edge columns, made for all edges at once (row class by row class, no
    division), are what a loop over each edge's classes writes: e[a, b]'s column in its u-row a and its v-row b, each
    strategy in its class's row with -1, each memory row's nonzero bytes (by original strategy); e[a, b] named by its
    nodes' places and its classes' first strategies. Column-wise as HiGHS reads it: the memory rows (the
    inequalities) moved first, each column's rows ascending, as a sort of the entries (Coo.csc) gives them."""
    rng = np.random.default_rng(11)
    for trial in range(20):
        pw = random_program(rng)
        pw.edges = {k: m[rng.integers(0, len(m), len(m))] for k, m in pw.edges.items()}  # repeated rows: classes
        if not pw.edges:
            continue
        keys = sorted(pw.costs)
        offset = dict(zip(keys, np.cumsum([0] + [len(pw.costs[k]) for k in keys[:-1]]).tolist(), strict=True))
        n = sum(len(c) for c in pw.costs.values())
        edges, e_offset = [(k, *_classes(m)) for k, m in sorted(pw.edges.items())], []
        for _, m, _, _ in edges:
            e_offset.append(n)
            n += m.size
        memory = [({k: rng.integers(0, 2, int(pw.ids[k].max()) + 1) * 8.0 for k in keys[::2]}, 100.0)
                  for _ in range(trial % 3)]  # 0, 1 or 2 rows, about half the bytes zero
        csc, lo, hi = ilp_constraints(pw, keys, offset, edges, e_offset, n, memory)
        coo = csc.coo()
        got = sorted(zip(coo.rows.tolist(), coo.cols.tolist(), coo.vals.tolist(), strict=True))
        want, r, named = [(k, offset[k] + a, 1.0) for k in keys for a in range(len(pw.costs[k]))], len(keys), []
        for ((u, v), m, row_of, col_of), at in zip(edges, e_offset, strict=True):
            su, sv = m.shape
            for a, b in itertools.product(range(su), range(sv)):
                want += [(r + a, at + a * sv + b, 1.0), (r + su + b, at + a * sv + b, 1.0)]
                named.append((u, v, min(i for i, c in enumerate(row_of) if c == a),
                              min(j for j, c in enumerate(col_of) if c == b)))
            want += [(r + c, offset[u] + i, -1.0) for i, c in enumerate(row_of)]
            want += [(r + su + c, offset[v] + j, -1.0) for j, c in enumerate(col_of)]
            r += su + sv
        for m, (coef, _) in enumerate(memory):
            want += [(r + m, offset[k] + a, float(vec[i])) for k, vec in coef.items() for a, i in enumerate(pw.ids[k])
                     if vec[i]]
        assert got == sorted(want)
        assert lo.tolist() == [1.0] * len(keys) + [0.0] * (r - len(keys)) + [-np.inf] * len(memory)
        assert hi.tolist() == [1.0] * len(keys) + [0.0] * (r - len(keys)) + [100.0] * len(memory)
        position = np.concatenate((len(memory) + np.arange(r), np.arange(len(memory))))  # linprog's: A_ub, A_eq
        sorted_ = highs.Coo(rows=coo.rows, cols=coo.cols, vals=coo.vals, shape=coo.shape).csc(position)
        for mine, theirs in zip(highs._columns(csc, lo == hi), sorted_, strict=True):
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs)
        names = ilp_names(pw, keys, keys, edges, len(memory), edge_rows(csc, e_offset[0]))
        assert names is not None
        edge_names = [(1 << 60) | u << 46 | v << 32 | a << 16 | b for u, v, a, b in named]  # ilp._FIELDS' bits
        assert names.cols[e_offset[0]:].tolist() == edge_names
