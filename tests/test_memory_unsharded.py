"""Two stack behaviours that move a training run's model states (memory.optimizer_bytes, model_states): gradients
accumulated unsharded between FSDP2's syncs (Stack.accumulate_unsharded) and a model trained in bf16 without an fp32
master copy (Stack.master_weights), as KempnerForge runs (issue 79: its 13B and 70B runs read 47-80 % light); their
time: tests/test_unsharded_time.py."""

from __future__ import annotations

import pytest

from meshplan.cost.params import StageParams
from meshplan.estimate import estimate
from meshplan.memory import model_states, optimizer_bytes
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

EIGHT_B = StageParams(dense=8e9, expert=0.0)
FSDP = load_stack("pytorch-fsdp")
NO_SYNC = FSDP.with_(accumulate_unsharded=True)


def test_without_sync_the_gradients_stay_whole_in_the_reduce_dtype_until_the_last_micro_batch():
    # ZeRO-3 over dp 8, 4 micro-batches: 4 x 8e9 = 32 GB of fp32 gradients a GPU, not 4 x 8e9 / 8 = 4 GB
    plan = Plan(dp=8, zero=3, micro_batch=1, global_batch=32, grad_bytes=4)
    assert model_states(EIGHT_B, plan, FSDP)[1] == pytest.approx(4e9)
    assert model_states(EIGHT_B, plan, NO_SYNC)[1] == pytest.approx(32e9)
    # one micro-batch a step: the sync runs on it, nothing is accumulated
    one = Plan(dp=8, zero=3, micro_batch=4, global_batch=32, grad_bytes=4)
    assert model_states(EIGHT_B, one, NO_SYNC) == model_states(EIGHT_B, one, FSDP)
    # ZeRO 0 and 1 keep the whole gradient anyway; the weights and the optimizer state stay sharded at ZeRO-3
    for zero in (0, 1):
        z = Plan(dp=8, zero=zero, micro_batch=1, global_batch=32)
        assert model_states(EIGHT_B, z, NO_SYNC) == model_states(EIGHT_B, z, FSDP)
    assert model_states(EIGHT_B, plan, NO_SYNC)[::2] == model_states(EIGHT_B, plan, FSDP)[::2]


def test_without_a_master_copy_adam_keeps_bf16_moments_and_bf16_gradients():
    bf16 = FSDP.with_(master_weights=False)
    # Adam: 4 + 4 + 4 = 12 with the fp32 master; m and v in bf16 without it: 2 + 2 = 4; the gradient 2 bytes
    assert optimizer_bytes(Plan(grad_bytes=4), FSDP) == (12, 4)
    assert optimizer_bytes(Plan(grad_bytes=4), bf16) == (4, 2)
    assert optimizer_bytes(Plan(optimizer="sgd-momentum"), bf16) == (2, 2)  # the momentum buffer
    # one GPU, no sharding: 2 + 2 + 4 = 8 bytes a parameter, not 2 + 4 + 12 = 18
    assert sum(model_states(EIGHT_B, Plan(zero=0), bf16)) == pytest.approx(64e9)
    assert sum(model_states(EIGHT_B, Plan(zero=0, grad_bytes=4), FSDP)) == pytest.approx(144e9)


def test_the_behaviours_move_the_memory():
    # their step time: tests/test_unsharded_time.py
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(32)
    plan = Plan(dp=8, tp=4, zero=3, micro_batch=1, global_batch=32, recompute="full")
    base = estimate(model, cluster, plan, FSDP)
    for stack in (NO_SYNC, FSDP.with_(master_weights=False)):
        assert estimate(model, cluster, plan, stack).peak_memory != base.peak_memory
    # the whole gradient of a tp-4 shard: 4 bytes x 70.6e9 / 4 (and the shard of dp 8 no longer counted)
    grown = estimate(model, cluster, plan, NO_SYNC).memory["grads"] - base.memory["grads"]
    assert grown == pytest.approx(4 * model.params() / 4 * (1 - 1 / 8), rel=0.01)
