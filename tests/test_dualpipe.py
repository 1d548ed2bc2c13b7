"""DualPipe's action table (dualpipe.py) against DeepSeek-V3's Table 2 and Figure 5: its order, its validity, its
bubble, its memory, and the closed form the estimate prices."""

from __future__ import annotations

import random

import pytest

from meshplan.memory import in_flight_chunks
from meshplan.pipeline.dualpipe import build_dualpipe, dualpipe_pairs, dualpipe_route, simulate_dualpipe
from meshplan.pipeline.forms import RankTimes, published_dualpipe
from meshplan.pipeline.registry import schedule_of
from meshplan.pipeline.tables import format_table
from meshplan.specs.plan import Plan
from meshplan.step.passes import PassTimes
from split_table_helpers import assert_table_valid, assert_timeline_respects_dependencies

GRID = [(p, m) for p in (2, 4, 8, 16) for m in (2 * p, 2 * p + 2, 3 * p)]


def split_bubble(schedule: str, pp: int, first: PassTimes, last: PassTimes, middle: PassTimes, m: int = 0) -> float:
    """What the estimate prices from the ranks' passes (step/stages.stage_bubble): the schedule record's form."""
    ends = [(t.passes().t_f, t.passes().t_b, t.total) for t in (first, last, middle)]
    return schedule_of(schedule).bubble(RankTimes.of_ends(pp, *ends), 1, m)


def test_rank_rows_follow_the_library_s_eight_steps():
    """p = 4, m = 8: micro-batches 0-3 go down (chunk 0), 4-7 up (chunk 1, printed .1). Rank 0 (h = 0, near = down):
    1. 2·(2 - 0 - 1) = 2 down forwards F0 F1; 2. h + 1 = 1 pair F2 F4.1; 3. 1 round B4.1 (W deferred), W4.1, F5.1;
    4. m/2 - p + h + 1 = 1 round of the pairs (F3 & B5.1) and (F6.1 & B0), their W at once; 5. 1 round B6.1 W6.1,
    (F7.1 & B1); 6. 1 round B7.1 whole, B2 W deferred; 7. W2, B3 deferred; 8. W3. Rank 3 (h = 0, near = up) is
    rank 0 mirrored; ranks 1 and 2 (h = 1, the middle) start with 2 pairs and no lone forwards."""
    rows = format_table(build_dualpipe(4, 8)).splitlines()
    assert rows[0] == ("0F0 0F1 0F2 0F4.1 0B4.1 0W4.1 0F5.1 0F3 0B5.1 0W5.1 0F6.1 0B0 0W0 0B6.1 0W6.1 0F7.1 0B1 0W1 "
                       "0B7.1 0W7.1 0B2 0W2 0B3 0W3")
    assert rows[3].startswith("3F4.1 3F5.1 3F6.1 3F0 3B0 3W0 3F1")
    assert rows[1].startswith("1F0 1F4.1 1F1 1F5.1") and rows[2].startswith("2F4.1 2F0 2F5.1 2F1")
    pairs = dualpipe_pairs(4, 8)
    # rank 0: step 4's two pairs and step 5's one; the middle ranks run their first step-4 pair one after the other
    assert sorted(str(f) for f in pairs if f.stage == 0) == ["0F3", "0F6.1", "0F7.1"]
    assert sum(f.stage == 1 for f in pairs) == 2 * 2 - 1  # h = 1: step 4's m/2 - p + 2 = 2 rounds, step 5 none
    for f, b in pairs.items():  # a pair: a forward, then the other direction's backward on the same rank
        row = build_dualpipe(4, 8)[f.stage]
        assert row[row.index(f) + 1] == b and b.kind == "B" and b.chunk != f.chunk


@pytest.mark.parametrize(("pp", "m"), GRID)
def test_every_pass_once_in_order_and_dependencies_kept(pp, m):
    table, route = build_dualpipe(pp, m), dualpipe_route(pp, m)
    assert_table_valid(table, route, m, "FBW")
    for f, b, hop in ((1.0, 1.0, 0.0), (1.3, 0.6, 0.05), (0.7, 1.1, 0.2)):
        assert_timeline_respects_dependencies(table, route, simulate_dualpipe(pp, m, f, b, b, hop), hop)


@pytest.mark.parametrize(("pp", "m"), GRID)
def test_bubble_against_table_2_with_equal_passes(pp, m):
    """DeepSeek-V3 Table 2: (PP/2 - 1)·(F&B + B - 3W), its caption's B a full backward chunk (T_B + T_W) and F&B the
    overlapped pair (F + B): with T_F = T_B = T_W = 1, (p/2 - 1)·(3 + 2 - 3) = 2·(p/2 - 1) (6 at Figure 5's p = 8),
    against 1F1B's (p - 1)·3. The library's order as dualpipe.py builds it idles half that, p/2 - 1 (its step: m·3
    of work on every rank plus that bubble). With T_F > T_B = T_W its pairs wait for their later input:
    (p/2 - 1)·(2·T_F - T_B); at or under Table 2's (p/2 - 1)·(T_F + T_B) wherever T_F <= 2·T_B."""
    line = simulate_dualpipe(pp, m, 1.0, 1.0, 1.0)
    assert line.busy == (3.0 * m,) * pp
    assert line.bubble_time == pytest.approx(pp / 2 - 1)
    assert published_dualpipe(pp, 1, 1, 1) == pytest.approx(2 * (pp / 2 - 1))
    for f, b in ((2.0, 1.0), (1.0, 0.5), (1.5, 1.2)):
        line = simulate_dualpipe(pp, m, f, b, b)
        assert line.bubble_time == pytest.approx((pp / 2 - 1) * (2 * f - b))
    for f, b in ((2.0, 1.0), (1.5, 1.2), (1.0, 2.0), (1.0, 1.5)):
        assert simulate_dualpipe(pp, m, f, b, b).bubble_time <= published_dualpipe(pp, f, b, b) + 1e-9


def test_figure_5_shape():
    """Figure 5: 8 ranks, 20 micro-batches (10 each way): 3 units of bubble with F = B = W = 1 on every rank, the
    step 20·3 + 3 = 63."""
    line = simulate_dualpipe(8, 20, 1.0, 1.0, 1.0)
    assert line.step_time == pytest.approx(63.0)
    assert all(s[0] >= 0 and e[-1] <= 63.0 for s, e in zip(line.starts, line.ends, strict=True))


@pytest.mark.parametrize(("pp", "m"), GRID)
def test_memory_is_table_2_s(pp, m):
    """Table 2: PP + 1 micro-batches of activations and 2x parameters per rank. The table's every rank peaks at
    p + 1 (micro-batch, chunk) pairs between F and W (each a whole stage's: one chunk is a stage), what
    memory.in_flight_chunks prices; each rank runs two chunks, the two stages its record's weight_copies counts."""
    line = simulate_dualpipe(pp, m, 1.0, 1.0, 1.0)
    assert line.max_in_flight == (pp + 1,) * pp
    assert in_flight_chunks(Plan(pp=pp, schedule="dualpipe", global_batch=m)) == pp + 1
    assert all({a.chunk for a in row} == {0, 1} for row in build_dualpipe(pp, m))
    assert schedule_of("dualpipe").weight_copies == 2


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
def test_the_estimate_prices_table_2(pp):
    """The estimate prices step/stages.stage_bubble on the ranks' passes, T_B = T_W = half the backward: with
    forward 1 and backward 2 on every rank, Table 2's (p/2 - 1)·(1 + 1) (its published form at 1, 1, 1), twice the
    library order's bubble at F = B = W = 1."""
    rank = PassTimes(fwd=1.0, bwd=2.0)
    priced = split_bubble("dualpipe", pp, rank, rank, rank)
    assert priced == pytest.approx(published_dualpipe(pp, 1.0, 1.0, 1.0)) == pytest.approx(2 * (pp / 2 - 1))
    assert priced == pytest.approx(2 * simulate_dualpipe(pp, 4 * pp, 1.0, 1.0, 1.0).bubble_time)


def test_random_pass_times_never_deadlock_and_bound_the_step():
    """Property: on random pass times and hops the table runs to the end, at least every rank's work and at most
    the work plus (p - 1) hops and p times each pass of one micro-batch."""
    rng = random.Random(50)
    for _ in range(60):
        pp = rng.choice((2, 4, 6, 8))
        m = 2 * pp + 2 * rng.randint(0, 4)
        f, b, w, hop = rng.uniform(0.2, 2), rng.uniform(0.2, 2), rng.uniform(0.1, 1), rng.choice((0.0, 0.05))
        line = simulate_dualpipe(pp, m, f, b, w, hop)
        assert m * (f + b + w) - 1e-9 <= line.step_time <= m * (f + b + w) + pp * (f + b + w + 2 * hop)


@pytest.mark.parametrize(("pp", "m"), [(3, 12), (4, 6), (4, 7), (0, 4)])
def test_shapes_the_library_refuses(pp, m):
    with pytest.raises(ValueError, match="DualPipe needs|must be a positive integer"):
        build_dualpipe(pp, m)
