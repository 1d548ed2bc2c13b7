"""Split-backward pipeline schedules (zero_bubble.py): ZB-H1's action table and simulator, DualPipe's closed forms,
the estimate and the search with them."""

from __future__ import annotations

import random

import pytest

from bad_input_helpers import estimate as estimate_args
from bad_input_helpers import fails
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.pipeline import forms
from meshplan.pipeline.names import SPLIT
from meshplan.pipeline.registry import REGISTRY, schedule_of
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.tables import build, format_table
from meshplan.pipeline.zero_bubble import build_zb_h1, simulate_split
from meshplan.search import Space, search
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from spaces import EVERY_PLAN


def test_zb_h1_table_defers_rank_r_weight_gradients_by_r():
    # 1F1B's F/B order (warm-up p - r - 1 forwards, then F and B alternately); rank r's W of micro-batch k right after
    # its (k + r + 1)-th B, the last r of them at the end (filling the drain)
    table = build_zb_h1(4, 6)
    assert format_table(table).splitlines() == [
        "0F0 0F1 0F2 0F3 0B0 0W0 0F4 0B1 0W1 0F5 0B2 0W2 0B3 0W3 0B4 0W4 0B5 0W5",
        "1F0 1F1 1F2 1B0 1F3 1B1 1W0 1F4 1B2 1W1 1F5 1B3 1W2 1B4 1W3 1B5 1W4 1W5",
        "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2W0 2F4 2B3 2W1 2F5 2B4 2W2 2B5 2W3 2W4 2W5",
        "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3W0 3F4 3B4 3W1 3F5 3B5 3W2 3W3 3W4 3W5",
    ]
    for row in table:  # each F, B, W of every micro-batch once, W after its B
        assert sorted((a.kind, a.micro) for a in row) == sorted((k, j) for k in "FBW" for j in range(6))
        assert all(row.index(next(b for b in row if b.kind == "B" and b.micro == a.micro)) < i
                   for i, a in enumerate(row) if a.kind == "W")


@pytest.mark.parametrize(("pp", "m"), [(2, 2), (4, 4), (4, 8), (8, 8), (8, 16)])
def test_zb_h1_bubble_is_a_third_of_1f1b_with_equal_passes(pp, m):
    """T_F = T_B = T_W = 1, m >= p: ZB-H1's bubble (p - 1)·(1 + 1 - 1) = p - 1 against 1F1B's (p - 1)·(1 + 2) (Qi et
    al. 2023 §3.1); the simulator and the closed form agree."""
    zb = simulate_split(build_zb_h1(pp, m), 1.0, 1.0, 1.0)
    one = simulate(build("1f1b", pp, m), 1.0, 2.0)
    assert zb.bubble_time == pytest.approx(pp - 1) == pytest.approx(schedule_of("zb-h1").published(pp, 1.0, 1.0, 1.0))
    assert one.bubble_time == pytest.approx(3 * (pp - 1))
    # the same peak over the ranks as 1F1B: p micro-batches (rank 0), counting W residues whole
    assert max(zb.max_in_flight) == max(one.max_in_flight) == min(pp, m)


def test_zb_h1_is_never_slower_than_1f1b_on_random_ranks():
    """Property: on ranks of random F, B and W times (1F1B's backward = B + W) and any m, ZB-H1's step is at most
    1F1B's, and its peak in flight over the ranks is 1F1B's."""
    rng = random.Random(50)
    for _ in range(200):
        pp, m = rng.randint(2, 8), rng.randint(1, 20)
        f, b, w = ([rng.uniform(0.2, 2.0) for _ in range(pp)] for _ in range(3))
        hop = rng.choice([0.0, 0.05])
        zb = simulate_split(build_zb_h1(pp, m), f, b, w, t_p2p=hop)
        one = simulate(build("1f1b", pp, m), f, [x + y for x, y in zip(b, w, strict=True)], t_p2p=hop)
        assert zb.step_time <= one.step_time + 1e-9, (pp, m)
        assert max(zb.max_in_flight) == max(one.max_in_flight) == min(pp, m)


def test_dualpipe_closed_bubble():
    """DeepSeek-V3 Table 2: (p/2 - 1)·(F&B + B - 3·W), its caption's B the full backward (T_B + T_W) and F&B = T_F + B:
    p = 8, T = 1: 3·(3 + 2 - 3) = 6, against 1F1B's 7·3 = 21 and ZB-H1's 7."""
    assert forms.published_dualpipe(8, 1.0, 1.0, 1.0) == 6.0
    assert [s.name for s in REGISTRY.values() if s.published] == list(SPLIT)  # 1F1B's is equal_ranks.bubble_time
    with pytest.raises(ValueError, match="must be one of"):  # tables.build has no table for them
        build("zb-h1", 4, 8)


@pytest.fixture(scope="module")
def seventy():
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(64)
    plan = Plan(tp=8, pp=4, dp=2, micro_batch=1, global_batch=64)
    return model, cluster, {s: estimate(model, cluster, plan.with_(schedule=s)) for s in ("1f1b", "zb-h1", "dualpipe")}


def test_estimate_zb_h1_bubble_is_the_forward_flow_shop(seventy):
    """ZB-H1 prices (p - 1)·T_F (T_B = T_W) where 1F1B prices (p - 1)·(T_F + T_B + T_W): with the backward about twice
    the forward the bubble falls to about a third, the rest of the step unchanged; memory: rank 0 holds 1F1B's p."""
    _, _, est = seventy
    one, zb = est["1f1b"].breakdown["bubble"], est["zb-h1"].breakdown["bubble"]
    assert 0.25 < zb / one < 0.45
    assert est["1f1b"].step_time - one == pytest.approx(est["zb-h1"].step_time - zb, rel=1e-9)
    assert est["zb-h1"].step_time < est["1f1b"].step_time


def test_estimate_dualpipe_doubles_model_states_and_shrinks_the_bubble(seventy):
    _, _, est = seventy
    for part in ("weights", "grads", "optimizer"):
        assert est["dualpipe"].memory[part] == pytest.approx(2 * est["1f1b"].memory[part], rel=1e-4)  # peak rank
    # both stages' gradients reduced across data parallelism and stepped: twice 1F1B's (0.151 -> 0.303 s, 12 -> 24 ms)
    for part in ("dp", "optimizer"):
        assert est["dualpipe"].breakdown[part] == pytest.approx(2 * est["1f1b"].breakdown[part], rel=1e-3)
    # Table 2's (p/2 - 1)·(T_F + T_B) (T_B = T_W = half the backward, about T_F) against ZB-H1's (p - 1)·T_F at p = 4:
    # 1·2·T_F / (3·T_F) = 2/3 (0.185 against 0.277 s here)
    assert 0.6 < est["dualpipe"].breakdown["bubble"] / est["zb-h1"].breakdown["bubble"] < 0.75


def test_dualpipe_hides_the_expert_all_to_all():
    model, cluster = load_model("mixtral-8x7b"), load_system("h100").cluster(64)
    plan = Plan(tp=1, pp=4, dp=16, ep=8, micro_batch=1, global_batch=128)
    one, dual = (estimate(model, cluster, plan.with_(schedule=s)) for s in ("1f1b", "dualpipe"))
    assert one.breakdown["ep"] > 0 and dual.breakdown["ep"] < one.breakdown["ep"]


@pytest.mark.parametrize(("plan", "message"), [
    (Plan(pp=3, dp=1, schedule="dualpipe", global_batch=8), "schedule=dualpipe needs an even pp"),
    (Plan(pp=4, dp=1, schedule="dualpipe", global_batch=2), "even number of micro-batches m >= 2*pp"),
    (Plan(pp=2, vpp=2, schedule="zb-h1", global_batch=8), "needs pp > 1 and vpp = 1"),
    (Plan(pp=1, schedule="zb-h1"), "needs pp > 1"),
])
def test_split_schedule_checks(plan, message):
    assert any(message in r for r in check(load_model("llama3-8b"), None, plan))


def test_cli_estimate_schedules(capsys):
    from meshplan.cli import main
    assert main(estimate_args("llama3-8b", "h100", "--pp", "2", "--schedule", "zb-h1", "--global-batch", "8")) == 0
    assert "zb-h1" in capsys.readouterr().out
    line = fails(estimate_args("llama3-8b", "h100", "--pp", "2", "--schedule", "dualpipe", "--global-batch", "4"),
                 capsys)
    assert "schedule=dualpipe needs an even pp and an even number of micro-batches m >= 2*pp" in line


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan", "deepspeed"])
def test_frameworks_without_split_backward_refuse_it(framework):
    stack = load_stack(framework)
    for schedule in SPLIT:
        assert f"schedule={schedule}" in stack.supports.problems(Plan(pp=2, schedule=schedule))
    with pytest.raises(SpecError, match="split_backward: framework"):
        Space(global_batch=16, stack=stack, split_backward=True)
    assert Stack().supports.runs(Plan(pp=2, schedule="dualpipe"))


def test_search_with_split_backward_is_never_slower_and_prices_as_estimate():
    model, cluster = load_model("llama3-8b").with_seq_length(2048), load_system("h100").cluster(16)
    base = Space(**EVERY_PLAN, global_batch=32, layouts=("1d",), zero=(1,), recompute=("none",), cp_max=1,
                 offload_optimizer=(False,), offload_activations=(False,), max_micro_batch=2, pinned=(("pp", (4,)),))
    plain = search(model, cluster, base, top_k=3)
    split = search(model, cluster, Space(**{**base.__dict__, "split_backward": True}), top_k=3)
    assert split.plans[0].step_time <= plain.plans[0].step_time
    assert split.evaluated > plain.evaluated
    assert split.plans[0].plan.schedule in SPLIT
    for e in split.plans:
        assert estimate(model, cluster, e.plan, base.stack).step_time == pytest.approx(e.step_time, rel=1e-6)


def test_report_timeline_of_a_zb_h1_plan_has_weight_gradient_blocks(seventy):
    from meshplan.report.plots import pipeline_run
    _, _, est = seventy
    run = pipeline_run(est["zb-h1"])
    assert run.schedule == "zb-h1" and {a.kind for a in run.table[0]} == {"F", "B", "W"}
    one = pipeline_run(est["1f1b"])
    assert run.timeline.bubble_time < one.timeline.bubble_time
    dual = pipeline_run(est["dualpipe"])  # m = 32 >= 2p: its own table, both directions (dualpipe.py)
    assert dual.schedule == "dualpipe" and {a.chunk for a in dual.table[0]} == {0, 1}
    assert {a.kind for a in dual.table[0]} == {"F", "B", "W"}


def test_cli_plan_split_backward_needs_a_framework_that_runs_it(capsys):
    line = fails(["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--framework", "megatron-core",
                  "--split-backward"], capsys)
    assert "split_backward: framework megatron-core runs the schedules 1f1b, interleaved" in line


@pytest.mark.parametrize(("name", "gpus", "plan"), [
    ("llama3-8b", 16, Plan(pp=2, dp=8, micro_batch=1, global_batch=16)),
    ("llama3-8b", 16, Plan(tp=2, pp=8, micro_batch=2, global_batch=4)),  # m = 2 < p
    ("mixtral-8x7b", 64, Plan(tp=2, pp=4, dp=8, ep=8, micro_batch=1, global_batch=64, recompute="full")),
    ("gpt3-175b", 128, Plan(tp=8, pp=16, micro_batch=1, global_batch=64, zero=1)),
])
def test_zb_h1_estimate_is_never_slower_and_keeps_the_first_ranks_memory(name, gpus, plan):
    """Property: ZB-H1 prices no more than 1F1B's step (its bubble is the forward's share of 1F1B's flow shop) and
    the first rank, which holds 1F1B's peak of min(p, m), the same bytes."""
    model, cluster = load_model(name), load_system("h100").cluster(gpus)
    one, zb = (estimate(model, cluster, plan.with_(schedule=s)) for s in ("1f1b", "zb-h1"))
    assert zb.step_time <= one.step_time
    assert zb.rank_memory[0] == pytest.approx(one.rank_memory[0], rel=1e-12)
