"""KempnerForge's stack behaviours in time, as memory.model_states prices them in memory
(tests/test_memory_unsharded.py): gradients accumulated whole between FSDP2's syncs and reduced once per update
(Stack.accumulate_unsharded: channels.zero_traffic, cost/fsdp.accumulation_bytes), the optimizer's step and the
checkpoint without an fp32 master copy (Stack.master_weights: channels.step_bytes, goodput.saved_state_bytes), and
F.cross_entropy on bf16 logits gathered to every TP rank (Stack.cross_entropy = "gathered_bf16": cost/embed_head.py,
memory.loss_workspace)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt
from draws import draw_kept
from meshplan.cost.embed_head import head_ops
from meshplan.cost.fsdp import accumulation_bytes
from meshplan.cost.params import StageParams, stage_params
from meshplan.derived.goodput import checkpoint_bytes
from meshplan.estimate import estimate
from meshplan.memory import loss_workspace
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.channels import ZERO_TRAFFIC, dp_collectives, step_bytes, zero_counts, zero_traffic
from meshplan.step.stages import cadence
from test_properties import rates, with_rate

FSDP = load_stack("pytorch-fsdp")
NO_SYNC = FSDP.with_(accumulate_unsharded=True)
KEMPNERFORGE = NO_SYNC.with_(master_weights=False, cross_entropy="gathered_bf16")
EIGHT_B = StageParams(dense=8e9, expert=0.0)


def test_without_sync_the_gradients_are_reduce_scattered_beside_the_last_backward_alone():
    # 4 micro-batches: ZeRO-3 gathers twice a micro-batch as before (8) but reduce-scatters once, not 4 times;
    # ZeRO-2 then runs ZeRO-1's traffic; stages 0 and 1 reduce once already
    assert zero_counts(3, 4, once=True) == {"gather": 8, "scatter": 1}
    assert zero_counts(2, 4, once=True) == zero_counts(1, 4) == {"scatter": 1, "gather": 1}
    assert zero_traffic(2, once=True) == ZERO_TRAFFIC[1]
    for zero in (0, 1):
        assert zero_traffic(zero, once=True) == ZERO_TRAFFIC[zero]
    # the rows of the estimate count them so: 70B, tp 4 x dp 8, 4 micro-batches
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(32)
    plan = Plan(dp=8, tp=4, zero=3, micro_batch=1, global_batch=32, recompute="full")

    def count(stack, name):
        return sum(r.count for r in estimate(model, cluster, plan, stack).ops if r.name == name)

    assert (count(FSDP, "dp/grad_reduce_scatter"), count(NO_SYNC, "dp/grad_reduce_scatter")) == (4, 1)
    assert count(FSDP, "dp/param_all_gather") == count(NO_SYNC, "dp/param_all_gather") == 8


def test_the_accumulation_of_whole_gradients_adds_its_bytes():
    # m = 8, fp32 reduction (g = 4) of bf16 gradients (a = 2): the first cast 2 + 4, seven adds of 2 + 4 + 4, the last
    # copy from the fp32 sum 4 + 4, against eight copies of 2 + 4: 6 + 70 + 8 - 48 = 36 bytes a parameter
    plan = Plan(dp=8, zero=3, micro_batch=1, global_batch=64, grad_bytes=4)
    assert plan.grad_accum == 8 and accumulation_bytes(plan, NO_SYNC) == 6 + 7 * 10 + 8 - 8 * 6 == 36
    # bf16 reduction: no cast (autograd accumulates .grad itself), 7 adds of 6, the copy 2 + 2: 42 + 4 - 32 = 14
    assert accumulation_bytes(replace(plan, grad_bytes=2), NO_SYNC) == 7 * 6 + 4 - 8 * 4 == 14
    # nothing to add: one micro-batch (it syncs), ZeRO 0 / 1 (no per-micro-batch reduction), no FSDP, no flag
    assert accumulation_bytes(Plan(dp=8, zero=3, micro_batch=8, global_batch=64), NO_SYNC) == 0.0
    assert accumulation_bytes(replace(plan, zero=1), NO_SYNC) == 0.0
    assert accumulation_bytes(plan, NO_SYNC.with_(fsdp="none")) == accumulation_bytes(plan, FSDP) == 0.0
    # its row: 36 bytes x the rank's 70.6e9 / 4 parameters per update
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(32)
    big = Plan(dp=8, tp=4, zero=3, micro_batch=1, global_batch=64, recompute="full")
    (row,) = [r for r in estimate(model, cluster, big, NO_SYNC).ops if r.name == "fsdp/grad_accumulate"]
    params = stage_params(model, big, True).total
    assert row.nbytes == pytest.approx(36 * params, rel=1e-6) and row.count == 1
    assert not [r for r in estimate(model, cluster, big, FSDP).ops if r.name == "fsdp/grad_accumulate"]


def test_without_a_master_copy_the_step_and_the_checkpoint_move_bf16_state():
    plan = Plan(grad_bytes=4)
    bf16 = FSDP.with_(master_weights=False)
    # Adam with the fp32 master: read the fp32 gradient 4, read and write master + m + v 2 x 12, write the weight 2
    assert step_bytes(plan, FSDP) == step_bytes(plan) == 4 + 24 + 2 == 30
    # without: read the bf16 gradient 2, read and write the bf16 m and v 2 x 4 and the bf16 weight 2 x 2
    assert step_bytes(plan, bf16) == 2 + 8 + 4 == 14
    assert step_bytes(Plan(optimizer="sgd"), bf16) == 2 + 0 + 4  # the weight is its own master
    model = load_model("llama3-8b")
    assert checkpoint_bytes(model, plan, FSDP) == checkpoint_bytes(model, plan) == model.params() * (2 + 12)
    assert checkpoint_bytes(model, plan, bf16) == model.params() * (2 + 4)
    # the estimate's optimizer row: 14 / 30 of the bytes
    cluster = load_system("h100").cluster(8)
    one = Plan(dp=8, zero=3, micro_batch=1, global_batch=8)

    def moved(stack):
        return next(r.nbytes for r in estimate(model, cluster, one, stack).ops if r.name == "optimizer/adam")

    assert moved(bf16) / moved(FSDP) == pytest.approx(14 / 30, rel=1e-6)


def test_the_gathered_loss_runs_over_the_whole_vocabulary_on_every_tp_rank():
    """gathered_bf16 (KempnerForge): log_softmax over the bf16 logits (3 reads + a write: 8 bytes a logit), the
    logits and log-probabilities kept (4), backward a zero fill and log_softmax's backward (10), two bf16 gradients
    at the peak (4); every TP rank over all T·V logits, which it gathers (T·V·2 bytes), where the vocabulary-parallel
    loss runs over V/t with three all-reduces of T fp32 values."""
    model, tokens, vocab = gpt(), 2048, 51200
    stack = FSDP.with_(cross_entropy="gathered_bf16")
    for tp in (1, 4):
        plan = Plan(tp=tp, sequence_parallel=tp > 1)
        ops = {(o.name, o.phase): o for o in head_ops(model, plan, stack)}
        fwd, bwd = ops["head/loss", "fwd"], ops["head/loss", "bwd_x"]
        assert (fwd.nbytes, fwd.saved, bwd.nbytes) == (8 * tokens * vocab, 4 * tokens * vocab, 10 * tokens * vocab)
        gather = ops["head/logits_gather", "fwd"].collective
        assert (gather.kind, gather.nbytes, gather.group) == ("all_gather", 2 * tokens * vocab, tp)
        assert ("head/loss_tp", "fwd") not in ops
        assert loss_workspace(model, plan, stack) == 4 * tokens * vocab
    fused = {o.name: o for o in head_ops(model, Plan(tp=4, sequence_parallel=True), FSDP.with_(cross_entropy="fused"))
             if o.phase == "fwd"}
    assert fused["head/loss"].nbytes == 10 * tokens * vocab / 4 and "head/logits_gather" not in fused


def test_kempnerforges_profile_runs_the_gathered_bf16_loss_and_both_behaviours():
    from meshplan_validation.sources import source_defaults

    stack = source_defaults({"framework": "KempnerForge (PyTorch FSDP2 + TP, torch.compile)"}).stack
    assert (stack.cross_entropy, stack.accumulate_unsharded, stack.master_weights) == ("gathered_bf16", True, False)


@pytest.fixture(scope="module")
def kempnerforge_triples() -> list:
    """Seeded random triples under KempnerForge's behaviours (FSDP2 over the drawn stack, where it shards)."""
    out = [(model, cluster, plan, stack.with_(accumulate_unsharded=True, master_weights=False)) for
           model, cluster, plan, stack in draw_kept(79, 60, lambda m, c, plan, stack: stack.fsdp != "none"
                                                    and plan.zero >= 2)]
    assert sum(p.grad_accum > 1 for _, _, p, _ in out) >= 40 and sum(p.tp > 1 for _, _, p, _ in out) >= 15
    return out


@pytest.fixture(scope="module")
def kempnerforge_steps(kempnerforge_triples) -> list[float]:
    """Each triple's step time under its own stack, which both tests below compare with: made once (estimate() is a
    pure function of its frozen arguments)."""
    return [estimate(*triple).step_time for triple in kempnerforge_triples]


def test_more_of_any_rate_never_lengthens_a_kempnerforge_step(kempnerforge_triples, kempnerforge_steps):
    worse = []
    for (model, cluster, plan, stack), own in zip(kempnerforge_triples, kempnerforge_steps, strict=True):
        for s in (stack, stack.with_(cross_entropy="gathered_bf16")):
            base = own if s is stack else estimate(model, cluster, plan, s).step_time
            for rate in rates(cluster):
                faster = estimate(model, with_rate(cluster, rate, 2.0, plan.precision), plan, s).step_time
                if faster > base * (1 + 1e-9):
                    worse.append(f"{model.name} {plan.describe()} {rate}: {base:.6g} -> {faster:.6g}")
    assert not worse, "; ".join(worse[:5])


def test_the_behaviours_save_no_more_than_the_work_they_drop(kempnerforge_triples, kempnerforge_steps):
    """Accumulating without sync saves at most the m − 1 reduce-scatters of each update it drops (it adds the
    accumulation); no master copy never slows a step (fewer bytes, nothing added); at dp = 1 (nothing to reduce)
    accumulating only adds work."""
    for (model, cluster, plan, stack), after in zip(kempnerforge_triples, kempnerforge_steps, strict=True):
        before = estimate(model, cluster, plan, stack.with_(accumulate_unsharded=False)).step_time
        m, updates = cadence(plan)
        dropped = max(dp_collectives(model, cluster, plan, stage_params(model, plan, first), DEFAULT).scatter
                      for first in (True, False)) * (m - 1) * updates
        assert after >= (before - dropped) * (1 - 1e-9), (model.name, plan.describe())
        master = estimate(model, cluster, plan, stack.with_(master_weights=True)).step_time
        assert after <= master * (1 + 1e-9), (model.name, plan.describe())
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    alone = Plan(dp=1, tp=8, zero=3, micro_batch=1, global_batch=4, sequence_parallel=True)
    assert estimate(model, cluster, alone, NO_SYNC).step_time > estimate(model, cluster, alone, FSDP).step_time
