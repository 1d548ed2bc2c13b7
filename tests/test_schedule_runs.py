"""A step whose training loop runs the pipeline schedule several times (Stack.schedule_batch; step/stages.schedule_runs:
NeMo AutoModel's benchmark loop calls schedule.step once per gradient-accumulation step): each run fills and drains
the pipeline and ends with the data-parallel reduction of its gradients, the next gathering the weights again; the
optimizer steps once. The arithmetic, the search's agreement, monotonicity, and the AutoModel records as mapped."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.cost.params import stage_params
from meshplan.search.batch import PlanBatch
from meshplan.search.scoring import grid_times
from meshplan.search.space import Space
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.assemble import step_costs
from meshplan.step.channels import dp_collectives
from meshplan.step.stages import schedule_runs
from meshplan.step.units import unit_costs

MODEL, CLUSTER = load_model("llama3-8b"), load_system("h100").cluster(64)
PLAN = Plan(dp=8, tp=2, pp=4, global_batch=64, sequence_parallel=True)  # m = 64 / 8 = 8 micro-batches of 1


def test_runs_are_the_steps_sequences_over_the_schedules_batch():
    """A data-parallel rank's m·b sequences over schedule_batch, rounded up, at least 1 and at most m (a micro-batch a
    run); 1 without the field, without a pipeline, and under a schedule that never flushes."""
    def runs(plan: Plan, batch: int) -> object:
        return schedule_runs(plan, Stack(schedule_batch=batch))

    assert [runs(PLAN, b) for b in (0, 100, 8, 4, 3, 1)] == [1, 1, 1, 2, 3, 8]  # 8 sequences: ⌈8/3⌉ = 3
    two = replace(PLAN, micro_batch=2, global_batch=128)  # m = 8 micro-batches of 2: 16 sequences
    assert [runs(two, b) for b in (4, 3, 1)] == [4, 6, 8]  # ⌈16/3⌉ = 6; at most m = 8
    assert runs(replace(PLAN, dp=32, pp=1), 1) == 1  # no pipeline: no schedule to run
    assert runs(replace(PLAN, schedule="pipedream-2bw"), 1) == 1  # never flushes
    batch = PlanBatch.of([PLAN, two, replace(PLAN, dp=32, pp=1)])
    assert schedule_runs(batch, Stack(schedule_batch=4)).tolist() == [2, 4, 1]


def test_two_runs_pay_two_bubbles_and_two_syncs():
    """llama3-8b, pp 4 (1F1B), m = 8, ZeRO-1 with the data-parallel traffic after the passes (overlap_dp false, so
    the sums are exact): schedule_batch 4 splits the step into two runs of 4 micro-batches. The flow-shop bubble does
    not read m (bubble.flow_bubble), so two runs pay it twice; each run gathers the weights beside its first forward
    and reduce-scatters the gradients after its last backward (ZeRO-1's traffic, channels.ZERO_TRAFFIC), so the
    data-parallel time doubles too; the passes themselves (m of each) and the optimizer step (once) do not move:
        t(2 runs) − t(1 run) = bubble + gather + scatter."""
    one_stack = Stack(overlap_dp=False)
    one = step_costs(MODEL, CLUSTER, PLAN, one_stack)
    two = step_costs(MODEL, CLUSTER, PLAN, one_stack.with_(schedule_batch=4))
    c = dp_collectives(MODEL, CLUSTER, PLAN, stage_params(MODEL, PLAN, bool(one.use_first)), DEFAULT, one_stack)
    assert one.breakdown["bubble"] > 0 and c.gather > 0 and c.scatter > 0
    assert two.breakdown["bubble"] == pytest.approx(2 * one.breakdown["bubble"], rel=1e-12)
    assert one.breakdown["dp"] == pytest.approx(c.gather + c.scatter, rel=1e-12)
    assert two.breakdown["dp"] == pytest.approx(2 * (c.gather + c.scatter), rel=1e-12)
    for part in ("compute", "recompute", "tp", "pp", "optimizer"):
        assert two.breakdown[part] == pytest.approx(one.breakdown[part], rel=1e-12), part
    assert float(two.step_time) - float(one.step_time) == pytest.approx(
        one.breakdown["bubble"] + c.gather + c.scatter, rel=1e-9)


def test_the_search_prices_the_runs_as_estimate_does():
    """The search's float32 grid (search/scoring.grid_times) of a plan under a stack of several runs is step_costs'
    step under each setting (step/assemble.compose prices both), and differs from the one-run stack's."""
    stack = Stack(schedule_batch=2)  # 4 runs of 2
    space = Space(global_batch=64, stack=stack, recompute=("selective",), offload_optimizer=(False,),
                  offload_activations=(False,))
    batch = PlanBatch.of([PLAN])
    units = {"selective": unit_costs(MODEL, CLUSTER, batch, stack, DEFAULT)}
    times = grid_times(MODEL, CLUSTER, batch, units, space, DEFAULT)
    for z, zero in enumerate(space.zero):
        one = step_costs(MODEL, CLUSTER, replace(PLAN, zero=zero), stack)
        assert times[0, z, 0, 0, 0] == pytest.approx(float(one.step_time), rel=1e-6), zero
        plain = step_costs(MODEL, CLUSTER, replace(PLAN, zero=zero), Stack())
        assert float(one.step_time) > float(plain.step_time), zero


@pytest.mark.parametrize("plan", [PLAN, replace(PLAN, vpp=2, schedule="interleaved"),
                                  replace(PLAN, zero=3, micro_batch=2, global_batch=128),
                                  replace(PLAN, tp=1, dp=16, pp=4, global_batch=256)])
def test_more_runs_never_shorten_the_step(plan):
    """Splitting the step into more runs of the schedule adds fills, drains and syncs and takes none away: the step
    is non-decreasing as schedule_batch falls (0: one run), under each overlap of the data-parallel traffic."""
    for overlap in (True, False):
        steps = [float(step_costs(MODEL, CLUSTER, plan, Stack(overlap_dp=overlap, schedule_batch=b)).step_time)
                 for b in (0, 64, 16, 8, 4, 2, 1)]
        assert all(np.diff(steps) >= -1e-12 * steps[0]), (overlap, steps)
        assert steps[-1] > steps[0]



def test_ranks_priced_apart_pay_the_runs_alike():
    """A plan whose ranks are priced one by one (per-rank layer counts: step/ranks.assemble_ranks) pays each run's
    bubble and data-parallel traffic as the end ranks' path does: the same step as the even split it equals."""
    from meshplan.estimate import estimate  # noqa: PLC0415

    stack = Stack(overlap_dp=False, schedule_batch=4)
    apart = estimate(MODEL, CLUSTER, replace(PLAN, stage_layers=(8, 8, 8, 8)), stack)
    ends = estimate(MODEL, CLUSTER, PLAN, stack)
    one = estimate(MODEL, CLUSTER, replace(PLAN, stage_layers=(8, 8, 8, 8)), Stack(overlap_dp=False))
    assert apart.breakdown["bubble"] == pytest.approx(2 * one.breakdown["bubble"], rel=1e-9)
    assert apart.breakdown["dp"] == pytest.approx(2 * one.breakdown["dp"], rel=1e-9)
    assert apart.step_time == pytest.approx(ends.step_time, rel=1e-9)


def test_automodels_pipelined_runs_are_read_as_their_configs_run_them():
    """The AutoModel MoE records that pipeline: schedule_batch 8 (the configs' local_batch_size) gives the table's
    GA column as runs (DeepSeek-V3 over 256 GPUs: 512 / 64 = 8 sequences a rank, one run; over 1024: 8192 / 256 =
    32, four; Kimi K2: 512 / 32 = 16, two), and the configs' layers_per_stage the model chunks: 61 layers at 2 a
    stage, ⌈61/2⌉ = 31 stages rounded down to 28 over pp 4, v 7; at 4, 16 stages, v 4; Kimi K2 at 2 over pp 8, 24
    stages, v 3 (not the table's VP 8, 8, 4). Qwen3-30B runs no pipeline: one run."""
    from meshplan_validation.case import map_run  # noqa: PLC0415
    from meshplan_validation.records import read_runs  # noqa: PLC0415

    runs = {r["id"]: r for r in read_runs("benchmarks/data/independent_runs.jsonl")
            if str(r["id"]).startswith("automodel-")}
    expected = {"automodel-deepseek-v3-671b-256": (7, 1), "automodel-deepseek-v3-671b-1024": (4, 4),
                "automodel-kimi-k2-256": (3, 2), "automodel-qwen3-moe-30b-8": (1, 1)}
    for rid, (chunks, passes) in expected.items():
        case = map_run(runs[rid])
        assert case.stack.schedule_batch == 8, rid
        assert case.plan.vpp == chunks, rid
        assert schedule_runs(case.plan, case.stack) == passes == (runs[rid]["parallel"]["grad_accum"]
                                                                  if case.plan.pp > 1 else 1), rid
