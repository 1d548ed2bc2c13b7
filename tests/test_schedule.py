"""Pipeline schedules: tables are complete and deadlock-free; the simulator reproduces the papers' bubbles;
the closed forms equal the simulator.

Symbols as in pipeline/tables.py: p ranks, v chunks per rank, m micro-batches, t_f / t_b per chunk.
"""

from __future__ import annotations

import itertools

import pytest

from meshplan.pipeline.bubble import flow_bubble
from meshplan.pipeline.equal_ranks import bubble_fraction, bubble_time, in_flight, step_time
from meshplan.pipeline.forms import RankTimes
from meshplan.pipeline.registry import schedule_of
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.tables import Action, build, format_table, parse_action

# (schedule, p, m, v) covering every schedule, p = 1, m < p, m = p and m > p
CASES = [
    *(("gpipe", p, m, 1) for p, m in [(1, 1), (1, 4), (2, 1), (3, 5), (4, 4), (4, 8)]),
    *(("1f1b", p, m, 1) for p, m in [(1, 1), (1, 4), (2, 1), (3, 2), (3, 5), (4, 4), (4, 8)]),
    *(("interleaved", p, m, v) for p, m, v in [(1, 3, 2), (2, 2, 2), (2, 4, 3), (4, 4, 2), (4, 8, 2),
                                               (3, 9, 4)]),
]


def key(a: Action, p: int) -> tuple[str, int, int]:
    return a.kind, a.virtual_stage(p), a.micro


def index(table):
    """(kind, virtual stage, micro) → (rank, position in the rank's row)."""
    p = len(table)
    return {key(a, p): (r, i) for r, row in enumerate(table) for i, a in enumerate(row)}


# --- string form -------------------------------------------------------------------------------------


def test_action_string_round_trip():
    assert str(Action(2, "F", 0)) == "2F0"
    assert str(Action(0, "B", 3, chunk=1)) == "0B3.1"  # chunk shown only when > 0
    assert parse_action("2F0") == Action(2, "F", 0)
    assert parse_action("0B3.1") == Action(0, "B", 3, 1)
    for table in (build("1f1b", 4, 6), build("interleaved", 2, 4, 3)):
        for a in itertools.chain.from_iterable(table):
            assert parse_action(str(a)) == a


def test_format_table_1f1b_p4_m6_rank_order():
    # rank r: min(p − r − 1, m) = 3, 2, 1, 0 warm-up forwards, then F/B pairs, then the remaining B
    assert format_table(build("1f1b", 4, 6)).splitlines() == [
        "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5",
        "1F0 1F1 1F2 1B0 1F3 1B1 1F4 1B2 1F5 1B3 1B4 1B5",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5",
    ]


def test_gpipe_is_all_forwards_then_all_backwards():
    assert format_table(build("gpipe", 2, 3)).splitlines() == [
        "0F0 0F1 0F2 0B0 0B1 0B2",
        "1F0 1F1 1F2 1B0 1B1 1B2",
    ]


@pytest.mark.parametrize("bad", ["", "2X0", "F0", "2F", "2F0.", "-1F0", "2F0.1.2"])
def test_parse_action_rejects(bad):
    with pytest.raises(ValueError, match="action"):
        parse_action(bad)


def test_action_rejects_bad_fields():
    with pytest.raises(ValueError, match="kind"):
        Action(0, "W", 0)
    with pytest.raises(ValueError, match="micro"):
        Action(0, "F", -1)


# --- interleaved order matches Megatron-Core -----------------------------------------------------------


def test_interleaved_forward_order_is_megatron_schedule_table():
    # Megatron-Core get_schedule_table, its own example p = 2, N = 3, m = 5, v = 2:
    #   micro 0 1 2 0 1 2 3 4 3 4,  chunk 0 0 0 1 1 1 0 0 1 1
    row = build("interleaved", 2, 5, 2, group=3)[1]
    forwards = [(a.micro, a.chunk) for a in row if a.kind == "F"]
    assert forwards == list(zip([0, 1, 2, 0, 1, 2, 3, 4, 3, 4], [0, 0, 0, 1, 1, 1, 0, 0, 1, 1], strict=True))
    # backward k is the same micro-batch through chunk v − 1 − c
    backwards = [(a.micro, a.chunk) for a in row if a.kind == "B"]
    assert backwards == list(zip([0, 1, 2, 0, 1, 2, 3, 4, 3, 4], [1, 1, 1, 0, 0, 0, 1, 1, 0, 0], strict=True))


def test_interleaved_warmup_p4_m8_v2():
    # Narayanan et al. 2021 Fig. 4 setting. Warm-up w = 2·(p − r − 1) + (v − 1)·p:
    # rank 0: 2·3 + 1·4 = 10 forwards; rank 3: 2·0 + 4 = 4 forwards; then pairs (forward k + w, backward k),
    # the first backward being micro-batch 0 through the last chunk
    table = build("interleaved", 4, 8, 2)
    assert " ".join(map(str, table[0][:12])) == "0F0 0F1 0F2 0F3 0F0.1 0F1.1 0F2.1 0F3.1 0F4 0F5 0F6 0B0.1"
    assert " ".join(map(str, table[3][:6])) == "3F0 3F1 3F2 3F3 3F0.1 3B0.1"


# --- every table is complete, on the right ranks, and deadlock-free ---------------------------------


@pytest.mark.parametrize(("schedule", "p", "m", "v"), CASES)
def test_each_stage_micro_has_one_forward_and_one_backward_on_its_rank(schedule, p, m, v):
    table = build(schedule, p, m, v)
    assert len(table) == p
    where = index(table)
    assert len(where) == sum(map(len, table)) == 2 * p * v * m  # no duplicates, nothing missing
    for kind, s, j in itertools.product("FB", range(p * v), range(m)):
        rank, _ = where[kind, s, j]
        assert rank == s % p  # virtual stage s = c·p + r lives on rank s mod p
    for r, row in enumerate(table):
        assert all(a.stage == r and a.chunk == a.virtual_stage(p) // p for a in row)


@pytest.mark.parametrize(("schedule", "p", "m", "v"), CASES)
def test_simulated_order_respects_dependencies(schedule, p, m, v):
    table = build(schedule, p, m, v)
    tl = simulate(table, 1.0, 2.0, t_p2p=0.25)
    where = index(table)

    def span(kind, s, j):
        r, i = where[kind, s, j]
        return tl.starts[r][i], tl.ends[r][i]

    last = p * v - 1
    for s, j in itertools.product(range(p * v), range(m)):
        f_start, f_end = span("F", s, j)
        b_start, b_end = span("B", s, j)
        assert f_end == f_start + 1.0 and b_end == b_start + 2.0
        if s > 0:
            assert f_start >= span("F", s - 1, j)[1]
        assert b_start >= (f_end if s == last else span("B", s + 1, j)[1])
    for r, row in enumerate(table):  # one action at a time per rank, in table order
        for i in range(1, len(row)):
            assert tl.starts[r][i] >= tl.ends[r][i - 1]


def test_deadlock_is_detected():
    # rank 1 (the last stage) lists B0 before F0: B(1, 0) waits for F(1, 0), which waits behind it
    table = (tuple(map(parse_action, ["0F0", "0B0"])), tuple(map(parse_action, ["1B0", "1F0"])))
    with pytest.raises(ValueError, match="deadlock"):
        simulate(table, 1.0, 2.0)
    # across ranks: rank 0 waits for B(1, 0), rank 1 first wants F(1, 1) which rank 0 has not sent
    table = (tuple(map(parse_action, ["0F0", "0B0", "0F1", "0B1"])),
             tuple(map(parse_action, ["1F1", "1B1", "1F0", "1B0"])))
    with pytest.raises(ValueError, match="deadlock"):
        simulate(table, 1.0, 2.0)


def test_malformed_tables_are_rejected():
    good = build("1f1b", 2, 2)
    with pytest.raises(ValueError, match="expected"):  # an action missing
        simulate((good[0][:-1], good[1]), 1.0, 2.0)
    with pytest.raises(ValueError, match="twice"):
        simulate((good[0][:-1] + good[0][:1], good[1]), 1.0, 2.0)
    with pytest.raises(ValueError, match="names rank"):
        simulate((good[1], good[0]), 1.0, 2.0)
    with pytest.raises(ValueError, match="no ranks"):
        simulate((), 1.0, 2.0)


# --- the papers' numbers --------------------------------------------------------------------------


@pytest.mark.parametrize(("p", "m"), [(2, 1), (2, 4), (4, 8), (4, 3), (8, 16), (6, 32)])
def test_1f1b_step_time_and_bubble(p, m):
    tf, tb = 1.0, 2.0
    tl = simulate(build("1f1b", p, m), tf, tb)
    # (m + p − 1)·(t_f + t_b); p = 4, m = 8: (8 + 4 − 1)·3 = 33
    assert tl.step_time == pytest.approx((m + p - 1) * (tf + tb))
    assert tl.ideal_time == pytest.approx(m * (tf + tb))  # every rank busy m·(t_f + t_b)
    assert tl.bubble_time == pytest.approx((p - 1) * (tf + tb))
    assert tl.bubble_fraction == pytest.approx((p - 1) / m)  # of ideal compute; 3/8 for p = 4, m = 8
    assert tl.idle_fraction == pytest.approx((p - 1) / (m + p - 1))  # of the step; 3/11


@pytest.mark.parametrize(("p", "m", "v"), [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 16, 4),
                                           (3, 6, 3), (8, 16, 2), (8, 8, 4)])
@pytest.mark.parametrize(("tf", "tb"), [(1.0, 2.0), (1.0, 1.0), (2.0, 1.0)])
def test_interleaved_bubble_is_1_over_v_of_1f1b(p, m, v, tf, tb):
    # per-chunk times: a rank's stage of t_f·v is split into v chunks of t_f
    tl = simulate(build("interleaved", p, m, v), tf, tb)
    # step = (v·m + p − 1)·(t_f + t_b); p = 4, m = 8, v = 2, (1, 2): (16 + 3)·3 = 57, ideal 48, bubble 9
    assert tl.step_time == pytest.approx((v * m + p - 1) * (tf + tb))
    assert tl.bubble_fraction == pytest.approx((p - 1) / (v * m))  # 9/48 = 3/16 = (4 − 1)/(2·8)
    # the same model without chunks (stage time v·t) has v times the bubble
    plain = simulate(build("1f1b", p, m), v * tf, v * tb)
    assert plain.ideal_time == pytest.approx(tl.ideal_time)
    assert plain.bubble_time == pytest.approx(v * tl.bubble_time)


@pytest.mark.parametrize(("p", "m"), [(1, 3), (2, 2), (4, 8), (4, 3), (5, 12)])
def test_gpipe_same_time_as_1f1b_but_holds_all_micro_batches(p, m):
    gpipe = simulate(build("gpipe", p, m), 1.0, 2.0)
    one_f_one_b = simulate(build("1f1b", p, m), 1.0, 2.0)
    assert gpipe.step_time == pytest.approx(one_f_one_b.step_time)  # both (m + p − 1)·3
    assert gpipe.max_in_flight == (m,) * p  # all m activations live before the first backward
    # 1F1B: rank r holds min(p − r, m); p = 4, m = 8: 4, 3, 2, 1
    assert one_f_one_b.max_in_flight == tuple(min(p - r, m) for r in range(p))


def test_interleaved_in_flight_in_chunk_units():
    # w + 1 with w = 2·(p − r − 1) + (v − 1)·p; p = 4, v = 2, m = 8:
    # rank 0: 2·3 + 4 + 1 = 11, rank 1: 2·2 + 4 + 1 = 9, rank 2: 7, rank 3: 5 (each unit 1/v of a stage)
    tl = simulate(build("interleaved", 4, 8, 2), 1.0, 2.0)
    assert tl.max_in_flight == (11, 9, 7, 5)
    assert [in_flight("interleaved", 4, 8, 2, r) for r in range(4)] == [11, 9, 7, 5]
    # capped at v·m = 2·4 = 8 when m = p = 4: rank 0 runs every forward first (2·3 + 4 = 10 ≥ 8)
    assert in_flight("interleaved", 4, 4, 2, 0) == 8


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_single_rank_has_no_bubble(schedule):
    v = 2 if schedule == "interleaved" else 1
    tl = simulate(build(schedule, 1, 6, v), 1.0, 2.0, t_p2p=5.0)  # p2p never crosses a rank
    assert tl.step_time == pytest.approx(v * 6 * 3.0)  # v·m·(t_f + t_b)
    assert tl.bubble_time == pytest.approx(0.0)
    assert tl.bubble_fraction == pytest.approx(0.0)


# --- closed forms equal the simulator -------------------------------------------------------------


def grid():
    for p, m in itertools.product(range(1, 6), range(1, 10)):
        yield "gpipe", p, m, 1, None
        yield "1f1b", p, m, 1, None
        for v, n in itertools.product((2, 3), range(p, m + 1)):
            if m % n == 0 or m % n >= p:  # Megatron-Core's condition on the last group
                yield "interleaved", p, m, v, n


@pytest.mark.parametrize(("tf", "tb"), [(1.0, 2.0), (1.5, 1.5), (3.0, 1.0)])
def test_closed_forms_equal_the_simulator(tf, tb):
    checked = 0
    for schedule, p, m, v, n in grid():
        tl = simulate(build(schedule, p, m, v, group=n), tf, tb)
        label = (schedule, p, m, v, n)
        assert tl.step_time == pytest.approx(step_time(schedule, p, m, v, tf, tb, group=n)), label
        bubble = bubble_time(schedule, p, m, v, tf, tb, group=n)
        assert tl.bubble_time == pytest.approx(bubble, abs=1e-9), label
        assert tl.bubble_fraction == pytest.approx(bubble_fraction(schedule, p, m, v, group=n)), label
        assert tl.max_in_flight == tuple(in_flight(schedule, p, m, v, r, group=n) for r in range(p)), label
        checked += 1
    assert checked > 200


# extra (forward, backward) seconds of an end rank over a middle rank's (1, 2): the embedding's on the first, the
# LM head's on the last; none, one heavier forward, one heavier backward, both heavier
EXTRAS = [(0.0, 0.0), (0.25, 0.5), (0.5, 0.25), (1.0, 2.0), (0.0, 1.0), (1.0, 0.0), (2.0, 3.0)]


def _ranks(p, embed, head):
    """Per-rank forward and backward seconds of one micro-batch (whole ranks): middle ranks (1, 2), the ends more."""
    if p == 1:
        return [1.0 + embed[0] + head[0]], [2.0 + embed[1] + head[1]]
    return [1.0 + embed[0]] + [1.0] * (p - 2) + [1.0 + head[0]], [2.0 + embed[1]] + [2.0] * (p - 2) + [2.0 + head[1]]


def test_flow_bubble_equals_the_simulator_where_it_claims_to():
    """bubble.flow_bubble, the estimator's and the search's bubble: ((p − 2)·t_middle + t_other_end)/v from whole
    ranks' times, against the simulator fed per-chunk times (rank time / v). Exact on equal ranks and whenever the
    last rank is the busiest in both passes, for GPipe, 1F1B and interleaved; GPipe also with the first the busiest;
    1F1B and interleaved with the first the busiest: the simulator's bubble is smaller (an upper bound). E.g. p = 4,
    1F1B, head (1, 2): ranks of 3, 3, 3, 6 s, bubble (2·3 + 3)/1 = 9 s whatever m."""
    exact = bounded = 0
    for schedule, p, m, v, n in grid():
        for embed, head in itertools.product(EXTRAS, EXTRAS):
            fwd, bwd = _ranks(p, embed, head)
            tl = simulate(build(schedule, p, m, v, group=n), [f / v for f in fwd], [b / v for b in bwd])
            total = [f + b for f, b in zip(fwd, bwd, strict=True)]
            middle = total[1] if p > 2 else 0.0  # no middle rank: its weight p − 2 is 0
            closed = flow_bubble(p, v, total[0], total[-1], middle)
            last_busiest = head[0] >= embed[0] and head[1] >= embed[1]
            first_busiest = head[0] <= embed[0] and head[1] <= embed[1]
            label = (schedule, p, m, v, n, embed, head)
            if p == 1 or last_busiest or (first_busiest and schedule == "gpipe"):
                assert tl.bubble_time == pytest.approx(closed, rel=1e-12, abs=1e-12), label
                exact += 1
            elif first_busiest:
                assert tl.bubble_time <= closed + 1e-12, label
                bounded += 1
    assert exact > 5000 and bounded > 2000
    # the docstring's case: 1F1B, p = 4, ranks 3, 3, 3, 6 s: m·6 + 9
    tl = simulate(build("1f1b", 4, 8), [1.0, 1.0, 1.0, 2.0], [2.0, 2.0, 2.0, 4.0])
    assert (tl.step_time, tl.bubble_time, flow_bubble(4, 1, 3.0, 6.0, 3.0)) == (8 * 6.0 + 9.0, 9.0, 9.0)


def test_the_bubble_of_the_asynchronous_schedules_is_zero():
    # their records' bubble (forms.none): no flush, no bubble per step, on any ranks
    ranks = RankTimes.of_ends(4, (1.0, 2.0, 3.0), (2.0, 4.0, 6.0), (1.0, 2.0, 3.0))
    for schedule in ("pipedream", "pipedream-2bw"):
        assert schedule_of(schedule).bubble(ranks, 1, 8) == bubble_time(schedule, 4, 8, 1, 1.0, 2.0) == 0.0


# --- unequal stages and p2p -----------------------------------------------------------------------


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_unequal_stages_are_bounded_by_the_slowest(schedule):
    tf, tb, m = [1.0, 3.0, 1.0, 2.0], [2.0, 6.0, 2.0, 4.0], 8
    tl = simulate(build(schedule, 4, m), tf, tb)
    assert tl.busy == (24.0, 72.0, 24.0, 48.0)  # m·(t_f + t_b) per rank: 8·3, 8·9, 8·3, 8·6
    assert tl.step_time >= m * 9.0  # ≥ m × the slowest stage = 72
    # GPipe is two flow shops of m identical jobs: Σt + (m − 1)·max t each way
    # forward 7 + 7·3 = 28, backward 14 + 7·6 = 56 → 84; 1F1B is never slower
    gpipe = simulate(build("gpipe", 4, m), tf, tb).step_time
    assert gpipe == pytest.approx(84.0)
    assert tl.step_time <= gpipe


def test_times_per_virtual_stage():
    # p = 2, v = 2: 4 virtual stages; per-rank [1, 1] and per-virtual-stage [1, 1, 1, 1] agree
    table = build("interleaved", 2, 4, 2)
    assert simulate(table, [1.0, 1.0], [2.0, 2.0]) == simulate(table, [1.0] * 4, [2.0] * 4)
    # a slow last chunk (the LM head): busy of rank 1 = 4·(1 + 2) + 4·(3 + 6) = 48
    tl = simulate(table, [1.0, 1.0, 1.0, 3.0], [2.0, 2.0, 2.0, 6.0])
    assert tl.busy == (24.0, 48.0)
    assert tl.step_time >= 48.0
    with pytest.raises(ValueError, match="entries"):
        simulate(table, [1.0, 1.0, 1.0], 2.0)
    with pytest.raises(ValueError, match=">= 0"):
        simulate(table, -1.0, 2.0)


@pytest.mark.parametrize(("schedule", "p", "m", "v"), [("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1),
                                                       ("interleaved", 4, 8, 2)])
def test_p2p_latency_is_never_faster(schedule, p, m, v):
    table = build(schedule, p, m, v)
    times = [simulate(table, 1.0, 2.0, t_p2p=c).step_time for c in (0.0, 0.1, 0.5, 2.0)]
    assert times == sorted(times)
    # the first micro-batch alone crosses 2·(p − 1) links down and back
    assert times[-1] >= times[0] + 2 * (p - 1) * 2.0 - 1e-9


# --- bad arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "kwargs", "message"), [
    (("zb-v", 4, 8), {}, "must be one of"),
    (("1f1b", 0, 8), {}, "pp=0"),
    (("1f1b", 4, 0), {}, "micro_batches=0"),
    (("1f1b", 4, 8, 2), {}, "needs schedule='interleaved'"),
    (("interleaved", 4, 8, 1), {}, "vpp >= 2"),
    (("interleaved", 4, 6, 2), {}, "pp must divide"),  # 6 mod 4 = 2 < 4
    (("interleaved", 4, 6, 2), {"group": 3}, r"\[4, 6\]"),  # N < p
    (("interleaved", 2, 4, 2), {"group": 5}, r"\[2, 4\]"),  # N > m
    (("1f1b", 2, 4), {"group": 2}, "only"),
])
def test_bad_arguments_raise_value_error(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(*args, **kwargs)


def test_interleaved_general_m_with_a_group():
    # m = 6, p = 4 is not allowed with N = p, but is with N = 6 (one group) — and keeps (p − 1)/(v·m)
    tl = simulate(build("interleaved", 4, 6, 2, group=6), 1.0, 2.0)
    assert tl.bubble_fraction == pytest.approx(3 / 12)  # (4 − 1)/(2·6)
    with pytest.raises(ValueError, match="rank"):
        in_flight("1f1b", 4, 8, 1, 4)


def test_simulator_runs_a_long_pipeline():
    """64·512·2 = 65,536 actions (its speed: benchmarks/measure/estimate_speed.py): at least the m·(f + b) of a rank
    plus the (p − 1)·(f + b) of filling and draining, and the p2p hops on top."""
    tl = simulate(build("1f1b", 64, 512), 1.0, 2.0, t_p2p=0.01)
    assert tl.step_time >= (512 + 63) * 3.0


def test_sends_priced_per_boundary():
    """Stages on unequal sub-meshes send over different links: 3 stages, 1 micro-batch, forward 1 and backward 2 each,
    sends 0.5 then 0.25: 1 + 0.5 + 1 + 0.25 + 1 + 2 + 0.25 + 2 + 0.5 + 2 = 10.5; one value applies to every boundary."""
    table = build("1f1b", 3, 1)
    assert simulate(table, 1.0, 2.0, [0.5, 0.25]).step_time == pytest.approx(10.5)
    assert simulate(table, 1.0, 2.0, 0.5).step_time == simulate(table, 1.0, 2.0, [0.5, 0.5]).step_time
    with pytest.raises(ValueError, match="one per boundary"):
        simulate(table, 1.0, 2.0, [0.5])
