"""Model-state memory under ZeRO (Rajbhandari et al. 2020, Fig. 1) and activations in flight."""

from __future__ import annotations

import pytest

from conftest import gpt
from meshplan.memory import StageParams, in_flight_chunks, model_states
from meshplan.plan import Plan

PSI = 1_000_000_000


@pytest.mark.parametrize("n", [1, 8, 64])
def test_zero_stages_closed_forms(n):
    params = StageParams(dense=PSI, expert=0.0)

    def total(zero):
        return sum(model_states(params, Plan(dp=n, zero=zero, grad_bytes=2)))

    assert total(0) == pytest.approx(16 * PSI)
    assert total(1) == pytest.approx(4 * PSI + 12 * PSI / n)
    assert total(2) == pytest.approx(2 * PSI + 14 * PSI / n)
    assert total(3) == pytest.approx(16 * PSI / n)


def test_zero3_memory_per_gpu_falls_as_dp_grows():
    params = StageParams(dense=PSI, expert=0.0)
    totals = [sum(model_states(params, Plan(dp=d, zero=3))) for d in (1, 2, 4, 8, 16)]
    assert totals == sorted(totals, reverse=True) and totals[-1] < totals[0]


def test_expert_weights_shard_over_ep_times_etp_data_parallel_group():
    # dp=8, ep=4, etp=1, tp=1: expert-data-parallel = 8/4 = 2 ranks share each expert's optimizer state
    params = StageParams(dense=0.0, expert=PSI)
    _, _, opt = model_states(params, Plan(dp=8, ep=4, etp=1, zero=1))
    assert opt == pytest.approx(12 * PSI / 2)


def test_offloaded_optimizer_leaves_no_state_on_gpu():
    _, _, opt = model_states(StageParams(dense=PSI, expert=0.0), Plan(offload_optimizer=True))
    assert opt == 0


def test_in_flight_micro_batches_per_schedule():
    # 1F1B: min(p, m) on rank 0; GPipe: m; interleaved: 2(p-1) + (v-1)p + 1 chunks
    assert in_flight_chunks(Plan(pp=4, global_batch=16)) == 4
    assert in_flight_chunks(Plan(pp=4, global_batch=2)) == 2
    assert in_flight_chunks(Plan(pp=4, global_batch=16, schedule="gpipe")) == 16
    assert in_flight_chunks(Plan(pp=4, vpp=2, global_batch=16, schedule="interleaved")) == 2 * 3 + 4 + 1
    assert in_flight_chunks(Plan(pp=4, global_batch=16), last=True) == 1


def test_in_flight_matches_the_simulator():
    from meshplan.schedule import build, simulate

    for schedule, pp, m, vpp in (("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1), ("interleaved", 4, 8, 2)):
        timeline = simulate(build(schedule, pp, m, vpp), 1.0, 2.0)
        plan = Plan(pp=pp, vpp=vpp, global_batch=m, schedule=schedule)
        assert timeline.max_in_flight[0] == in_flight_chunks(plan)
        assert timeline.max_in_flight[-1] == in_flight_chunks(plan, last=True)


def test_full_recompute_keeps_only_layer_inputs():
    from meshplan.estimate import step_costs
    from meshplan.hardware import load_system

    model = gpt(layers=8, vocab=1024)  # a small head, so the layers dominate
    c = load_system("h100").cluster(1)
    none = step_costs(model, c, Plan(recompute="none"))
    full = step_costs(model, c, Plan(recompute="full"))
    assert full.memory["activations"] < none.memory["activations"] / 4
