"""Two-chunk pipeline schedules (zero_bubble_v.py): ZB-V's V-shaped table against Qi et al.'s bubble and memory,
Chimera's closed form against Li & Hoefler's Table 1, and both in the estimate, the check and the frameworks."""

from __future__ import annotations

import pytest

from bad_input_helpers import estimate as estimate_args
from bad_input_helpers import fails
from meshplan.estimate import estimate
from meshplan.memory import embedding_in_flight, in_flight_chunks
from meshplan.pipeline.forms import published_chimera, published_zb_v
from meshplan.pipeline.zero_bubble_v import build_zb_v, simulate_routes, v_route
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack

GRID = [(p, m) for p in (2, 3, 4, 5, 8) for m in (2 * p, 2 * p + 1, 3 * p)]


def _span_bubble(pp: int, m: int, f: float, b: float, w: float) -> tuple[float, object]:
    """The table's bubble: the longest rank's span (first start to last end) beyond the busiest rank's work (the
    parallelogram of back-to-back steps, Qi et al. §5's post-validation), with its timeline."""
    line = simulate_routes(build_zb_v(pp, m), v_route(pp), f, b, w)
    span = max(e[-1] - s[0] for s, e in zip(line.starts, line.ends, strict=True))
    return span - max(line.busy), line


def test_zb_v_table_runs_every_pass_of_both_chunks_once_in_a_v():
    # p = 2, m = 4: rank 0 runs 2(p - 0) - 1 = 3 chunk-0 forwards, then p rounds of chunk 1's F, B, W ...
    table = build_zb_v(2, 4)
    assert " ".join(map(str, table[0][:6])) == "0F0 0F1 0F2 0F0.1 0B0.1 0W0.1"
    for pp, m in GRID:
        for row in build_zb_v(pp, m):
            assert sorted((a.kind, a.chunk, a.micro) for a in row) == sorted(
                (k, c, j) for k in "FBW" for c in (0, 1) for j in range(m))
    assert v_route(3)(0) == [(0, 0), (1, 0), (2, 0), (2, 1), (1, 1), (0, 1)]  # rank 0 holds the first and the last


@pytest.mark.parametrize(("pp", "m"), GRID)
def test_zb_v_reproduces_the_paper_s_bubble(pp, m):
    """Qi et al. 2024 §6: ZB-V's bubble is (p - 1)·(T_F + T_B - 2·T_W) with whole-rank times (two chunks each), zero
    when T_F = T_B = T_W; its table reads it wherever T_F ≥ T_B = T_W (the estimate's split, T_B = T_W = half the
    backward), and (p - 1)·(T_B - T_F)/2 where the input gradient is the longer (the paper's scheduler adapts its
    order there; the fixed table does not)."""
    for f, b in ((1.0, 1.0), (1.5, 1.0), (2.0, 1.0), (1.0, 0.5), (1.0, 0.8)):  # per chunk, T_B = T_W
        bubble, _ = _span_bubble(pp, m, f, b, b)
        assert bubble == pytest.approx(published_zb_v(pp, 2 * f, 2 * b, 2 * b), abs=1e-9)
    assert _span_bubble(pp, m, 1.0, 1.0, 1.0)[0] == pytest.approx(0.0, abs=1e-9)
    for f, b in ((1.0, 1.5), (0.7, 1.0)):
        assert _span_bubble(pp, m, f, b, b)[0] == pytest.approx((pp - 1) * (b - f), abs=1e-9)


@pytest.mark.parametrize(("pp", "m"), GRID)
def test_zb_v_keeps_1f1b_s_activation_memory(pp, m):
    """The paper's ZB-V row: p micro-batches of a whole stage at the peak, 1F1B's rank 0: 2p half-stage chunks on
    every rank, what memory.in_flight_chunks prices."""
    _, line = _span_bubble(pp, m, 1.0, 1.0, 1.0)
    assert line.max_in_flight == (2 * pp,) * pp
    plan = Plan(pp=pp, vpp=2, schedule="zb-v", global_batch=m)
    assert in_flight_chunks(plan) == in_flight_chunks(plan, last=True) == 2 * pp
    # the embedding (rank 0's chunk 0): 2p forwards before its first input gradient
    first_b = next(i for i, a in enumerate(build_zb_v(pp, m)[0]) if a.kind == "B" and a.chunk == 0)
    assert sum(a.kind == "F" and a.chunk == 0 for a in build_zb_v(pp, m)[0][:first_b]) == embedding_in_flight(plan)


@pytest.mark.parametrize("pp", [2, 4, 8, 16])
@pytest.mark.parametrize("m", [16, 32, 64])
def test_chimera_bubble_is_table_1_s_ratio(pp, m):
    """Li & Hoefler 2021 Table 1: Chimera's bubble ratio (D - 2)/(2N + D - 2) with D = p stages and N = m
    micro-batches; a rank's work per step is 1F1B's m·(T_F + T_B)."""
    f, b = 1.0, 2.0
    bubble = published_chimera(pp, f, b, 0.0)
    assert bubble / (bubble + m * (f + b)) == pytest.approx((pp - 2) / (2 * m + pp - 2))
    assert bubble == pytest.approx((pp - 1) * (f + b) * (pp / 2 - 1) / (pp - 1))  # 1F1B's at a (p/2 - 1)/(p - 1) share


@pytest.fixture(scope="module")
def seventy():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    plan = Plan(tp=8, pp=4, dp=2, micro_batch=1, global_batch=64)
    out = {s: estimate(model, cluster, plan.with_(schedule=s, vpp=2 if s == "zb-v" else 1))
           for s in ("1f1b", "zb-h1", "zb-v")}
    unit = plan.with_(global_batch=8)  # m = p = 4: one Chimera unit, the only one priced (forward doubling is not)
    return out | {"chimera": estimate(model, cluster, unit.with_(schedule="chimera")),
                  "1f1b unit": estimate(model, cluster, unit)}


def test_estimate_zb_v_has_almost_no_bubble_and_the_head_on_the_first_rank(seventy):
    """With T_B = T_W = half a backward of about twice the forward, ZB-V's bubble is (p - 1)·max(T_F - T_B,
    (T_B - T_F)/2) of the ranks' passes: near 0 (480 us here against 1F1B's 0.82 s); the V puts the LM head and
    the embedding on the first rank, which holds 1F1B's first rank's activations (p whole stages) and the head's
    weights, gradients, optimizer state and logits besides."""
    one, v = seventy["1f1b"], seventy["zb-v"]
    assert v.breakdown["bubble"] < 0.01 * one.breakdown["bubble"]
    assert v.step_time < seventy["zb-h1"].step_time < one.step_time
    assert v.rank_memory[0] > one.rank_memory[0] + 2e9  # the head: 128k x 8192 / tp 8 = 134 M parameters x 18 bytes


def test_estimate_chimera_doubles_the_weights_and_prices_its_table_s_bubble(seventy):
    one, chimera = seventy["1f1b unit"], seventy["chimera"]
    # two replicas: each end rank holds the first and the last stage (embedding + head + 2·L/p layers)
    assert 1.9 < chimera.memory["weights"] / one.memory["weights"] < 2.1
    # its table's (p/2 - 1)·((T_F + T_B) + |T_B - T_F|) for one unit (chimera.py, Figure 3), T_B ≈ 2·T_F: 1·(3 + 1)·T_F
    # = 4·T_F against 1F1B's (p - 1)·(T_F + T_B) = 9·T_F at the same m = p = 4
    assert 0.4 < chimera.breakdown["bubble"] / one.breakdown["bubble"] < 0.5


@pytest.mark.parametrize(("plan", "message"), [
    (Plan(pp=4, vpp=1, schedule="zb-v", global_batch=16), "schedule=zb-v needs pp > 1 and vpp = 2"),
    (Plan(pp=4, vpp=2, schedule="zb-v", global_batch=6), "schedule=zb-v needs m >= 2*pp"),
    (Plan(pp=3, schedule="chimera", global_batch=6), "schedule=chimera needs an even pp"),
    (Plan(pp=4, schedule="chimera", global_batch=6), "schedule=chimera needs an even pp equal to"),
    (Plan(pp=4, schedule="chimera", global_batch=16), "forward doubling / backward halving (Li & Hoefler 2021 §3.5)"),
    (Plan(pp=4, schedule="chimera", global_batch=8, last_stage_layers=2), "runs even stages"),
])
def test_two_chunk_schedule_checks(plan, message):
    assert any(message in r for r in check(load_model("llama3-8b"), None, plan))


def test_cli_estimate_zb_v_and_chimera(capsys):
    from meshplan.cli import main
    assert main(estimate_args("llama3-8b", "h100", "--pp", "2", "--vpp", "2", "--schedule", "zb-v",
                              "--global-batch", "16")) == 0
    assert "zb-v" in capsys.readouterr().out
    line = fails(estimate_args("llama3-8b", "h100", "--pp", "2", "--schedule", "chimera", "--global-batch", "12"),
                 capsys)
    assert "schedule=chimera needs an even pp equal to the number of micro-batches" in line


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan", "deepspeed", "nemo"])
def test_no_preset_runs_zb_v_or_chimera(framework):
    stack = load_stack(framework)
    for schedule in ("zb-v", "chimera"):
        assert f"schedule={schedule}" in stack.supports.problems(Plan(pp=2, schedule=schedule))
        assert Stack().supports.runs(Plan(pp=2, schedule=schedule))


def test_report_timelines_draw_the_two_direction_tables(seventy):
    """The report simulates Chimera's own table (chimera.py: both directions, two chunks a rank, backward whole) and
    ZB-V's, and its page gets their rows (detail.compact_timeline)."""
    from meshplan.report.detail import compact_timeline
    from meshplan.report.plots import pipeline_run
    run = pipeline_run(seventy["chimera"])  # p = m = 4: one unit of 2 down and 2 up
    assert run.schedule == "chimera" and run.vpp == 2
    assert {(a.kind, a.chunk) for a in run.table[0]} == {("F", 0), ("F", 1), ("B", 0), ("B", 1)}
    assert len(run.table[0]) == 2 * 4 and run.timeline.bubble_time > 0
    assert compact_timeline(run, merged=False)["rows"]
    assert pipeline_run(seventy["zb-v"]).schedule == "zb-v"
