"""Chimera's action table (chimera.py) against Li & Hoefler's Figure 3, Table 1 and §3.5: its order, its validity,
its bubble (and the best any order reaches, by an integer program), its memory, and the closed form priced."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from meshplan.memory import in_flight_chunks
from meshplan.pipeline.chimera import build_chimera, chimera_route, chimera_slots, simulate_chimera
from meshplan.pipeline.forms import RankTimes, published_chimera
from meshplan.pipeline.registry import schedule_of
from meshplan.pipeline.tables import format_table
from meshplan.specs.plan import Plan
from meshplan.step.passes import PassTimes
from split_table_helpers import assert_table_valid, assert_timeline_respects_dependencies

GRID = [(d, n) for d in (2, 4, 6, 8) for n in (d, 2 * d, 3 * d)]


def split_bubble(schedule: str, pp: int, first: PassTimes, last: PassTimes, middle: PassTimes, m: int = 0) -> float:
    """What the estimate prices from the ranks' passes (step/stages.stage_bubble): the schedule record's form."""
    ends = [(t.passes().t_f, t.passes().t_b, t.total) for t in (first, last, middle)]
    return schedule_of(schedule).bubble(RankTimes.of_ends(pp, *ends), 1, m)


def test_figure_3_table():
    """D = N = 4: micro-batches 0, 1 down, 2, 3 up (printed .1). Worker 0 holds down stage 0 and up stage 3: down
    micro-batch i's F at slot 2i + 0 and B at 2i + 7; up i's (2, 3) F at 2i + 3, B at 2i + 4: F0@0 F1@2 F2.1@3
    B2.1@4 F3.1@5 B3.1@6 B0@7 B1@9."""
    assert format_table(build_chimera(4, 4)).splitlines() == [
        "0F0 0F1 0F2.1 0B2.1 0F3.1 0B3.1 0B0 0B1",
        "1F0 1F2.1 1F1 1F3.1 1B2.1 1B0 1B3.1 1B1",
        "2F2.1 2F0 2F3.1 2F1 2B0 2B2.1 2B1 2B3.1",
        "3F2.1 3F3.1 3F0 3B0 3F1 3B1 3B2.1 3B3.1",
    ]
    assert [t for t, _ in chimera_slots(4, 4)[0]] == [0, 2, 3, 4, 5, 6, 7, 9]


@pytest.mark.parametrize(("d", "n"), GRID)
def test_merge_has_no_conflict_every_pass_once_and_dependencies_kept(d, n):
    """§3.1: with D even no two actions of a worker share a slot, concatenated units included."""
    for row in chimera_slots(d, n):
        assert len({t for t, _ in row}) == len(row) == 2 * n
    table, route = build_chimera(d, n), chimera_route(d)
    assert_table_valid(table, route, n, "FB")
    for f, b, hop in ((1.0, 1.0, 0.0), (1.0, 2.0, 0.1)):
        assert_timeline_respects_dependencies(table, route, simulate_chimera(d, n, f, b, hop), hop)


@pytest.mark.parametrize("d", [4, 8])
@pytest.mark.parametrize("units", [1, 2])
def test_bubble_ratio_is_table_1_s_in_unit_slots(d, units):
    """Table 1: bubble ratio (D - 2)/(2N + D - 2) in the unit slots it counts (T_F = T_B = 1): every worker runs
    2N slots and idles D - 2; D = N = 4 (Figure 3): 2 of 10. It is forms.published_chimera's (p/2 - 1)·(T_F + T_B), what
    the estimate prices (step/stages.stage_bubble on equal ranks)."""
    n = units * d
    line = simulate_chimera(d, n, 1.0, 1.0)
    assert line.busy == (2.0 * n,) * d
    assert line.step_time == pytest.approx(2 * n + d - 2)
    assert line.idle_fraction == pytest.approx((d - 2) / (2 * n + d - 2))
    rank = PassTimes(fwd=1.0, bwd=1.0)
    assert line.bubble_time == pytest.approx(published_chimera(d, 1.0, 1.0, 0.0)) == pytest.approx(
        split_bubble("chimera", d, rank, rank, rank, n))


@pytest.mark.parametrize(("d", "n"), [(4, 4), (4, 8), (8, 8), (8, 16), (4, 12)])
def test_a_longer_backward_adds_what_section_3_5_calls_intermediate_bubbles(d, n):
    """With T_B ≠ T_F the table's bubble is (D/2 - 1)·((T_F + T_B) + (2K - 1)·|T_B - T_F|), K = N/D units: Table 1's
    (D/2 - 1)·(T_F + T_B) and (2K - 1)·|T_B - T_F| more per half-pipeline: at D = N = 4, F = 1, B = 2 (Figure 3's
    proportions), 1·(3 + 1) = 4 units, not 3."""
    k = n // d
    for f, b in ((1.0, 2.0), (1.0, 3.0), (2.0, 1.0), (1.0, 1.5)):
        want = (d / 2 - 1) * ((f + b) + (2 * k - 1) * abs(b - f))
        assert simulate_chimera(d, n, f, b).bubble_time == pytest.approx(want)
        rank = PassTimes(fwd=f, bwd=b)  # what the estimate prices: the table's form, on equal ranks
        assert split_bubble("chimera", d, rank, rank, rank, n) == pytest.approx(want)


def _best_step(d: int, n: int, f: float, b: float) -> float:
    """The shortest step of any per-worker order of Chimera's actions (its routes, no hop): a disjunctive integer
    program, start times and one 0/1 order per pair of actions on a worker, solved by HiGHS (meshplan[solve])."""
    optimize = pytest.importorskip("scipy.optimize")
    ops = [(j, s, kind) for j in range(n) for s in range(d) for kind in "FB"]
    at = {op: i for i, op in enumerate(ops)}
    route = chimera_route(d)
    worker = [route(j)[s][0] for j, s, _ in ops]
    dur = [f if kind == "F" else b for *_, kind in ops]
    pairs = [(x, y) for x, y in itertools.combinations(range(len(ops)), 2) if worker[x] == worker[y]]
    size, big, rows, low = len(ops) + 1 + len(pairs), 10 * n * (f + b) * d, [], []

    def need(terms: list[tuple[int, float]], bound: float) -> None:
        row = np.zeros(size)
        for i, c in terms:
            row[i] += c
        rows.append(row)
        low.append(bound)

    for (j, s, kind), i in at.items():
        if kind == "F" and s:
            need([(i, 1), (at[(j, s - 1, "F")], -1)], f)
        if kind == "B":
            need([(i, 1), (at[(j, s + 1, "B")] if s < d - 1 else at[(j, s, "F")], -1)], b if s < d - 1 else f)
        need([(len(ops), 1), (i, -1)], dur[i])  # the step ends after every action
    for p, (x, y) in enumerate(pairs):  # x before y, or y before x
        need([(y, 1), (x, -1), (len(ops) + 1 + p, -big)], dur[x] - big)
        need([(x, 1), (y, -1), (len(ops) + 1 + p, big)], dur[y])
    cost = np.zeros(size)
    cost[len(ops)] = 1
    integral = np.r_[np.zeros(len(ops) + 1), np.ones(len(pairs))]
    upper = np.r_[np.full(len(ops) + 1, np.inf), np.ones(len(pairs))]
    res = optimize.milp(cost, constraints=optimize.LinearConstraint(np.array(rows), low, np.inf),
                        integrality=integral, bounds=optimize.Bounds(np.zeros(size), upper))
    assert res.success
    return float(res.fun)


def test_no_order_reaches_3_units_at_figure_3_s_proportions():
    """D = N = 4, F = 1, B = 2: 12 units of work per worker; the best step over every order of every worker is 16
    (bubble 4, the table's), so Table 1's 3 units at B = 2F are out of reach of this dependency graph; with F = B
    the best is the table's 8 + 2."""
    assert _best_step(4, 4, 1.0, 2.0) == pytest.approx(16.0, abs=1e-6) == simulate_chimera(4, 4, 1.0, 2.0).step_time
    assert _best_step(4, 4, 1.0, 1.0) == pytest.approx(10.0, abs=1e-6) == simulate_chimera(4, 4, 1.0, 1.0).step_time


@pytest.mark.parametrize(("d", "n"), GRID)
def test_activation_memory_is_table_1_s_range(d, n):
    """Worker w holds min(D/2, D - w) down and min(D/2, w + 1) up micro-batches between F and B at its peak (the
    slots' order does not depend on the times): D/2 + 1 at the end workers, D in the middle, Table 1's
    [(D/2 + 1)·M_a, D·M_a]; the estimate prices every rank at D (memory.in_flight_chunks), the table's peak."""
    line = simulate_chimera(d, n, 1.0, 2.0)
    assert line.max_in_flight == tuple(min(d // 2, d - w) + min(d // 2, w + 1) for w in range(d))
    assert min(line.max_in_flight) == d // 2 + 1 and max(line.max_in_flight) == d
    assert in_flight_chunks(Plan(pp=d, schedule="chimera", global_batch=n)) == max(line.max_in_flight)


@pytest.mark.parametrize(("d", "n"), [(3, 6), (4, 6), (4, 2), (0, 4)])
def test_shapes_refused(d, n):
    with pytest.raises(ValueError, match="Chimera needs|must be a positive integer"):
        build_chimera(d, n)
