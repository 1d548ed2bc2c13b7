"""The peak memory as a maximum over the step's phases (step/memory.Phases): the model states, what the whole step
keeps, and the larger of the loss phase's transients and the layer phase's (recompute, ZeRO-3 / TP buffers), never
their sum; the caching allocator's reserved peak (Estimate.reserved_memory) with both; and a token embedding kept whole
on every TP rank (Stack.replicated_embedding, KempnerForge's); the units FSDP2 leaves gathered (Stack.gathered_ends,
torchtitan's root unit through both phases, its last block into the loss phase). Issue 79: KempnerForge's 175B read
+15 % with the sum."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.cost.params import StageParams, layer_params, stage_params
from meshplan.estimate import estimate
from meshplan.memory import Memory, buffer_memory, model_state_memory, model_states
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.memory import Ends, Phases, activation_memory, gathered_ends, memory_at_peak
from meshplan.step.units import unit_costs

TITAN = load_stack("torchtitan")
KF = load_stack("pytorch-fsdp").with_(fsdp="fsdp2", accumulate_unsharded=True, master_weights=False,
                                       cross_entropy="gathered_bf16", replicated_embedding=True)
MODEL = load_model("llama3-8b")
PLANS = [  # (plan, stack): FSDP2 alone, FSDP2 with TP, a Megatron pipeline, selective recompute
    (Plan(dp=8, zero=3, micro_batch=1, global_batch=16, recompute="full"), TITAN),
    (Plan(dp=2, tp=4, sequence_parallel=True, zero=3, micro_batch=2, global_batch=8, recompute="full"), KF),
    (Plan(dp=2, tp=2, pp=2, sequence_parallel=True, micro_batch=1, global_batch=8), load_stack("megatron-core")),
    (Plan(dp=8, zero=3, micro_batch=1, global_batch=8, recompute="selective"), TITAN),
]


def _peak(model, plan, stack):
    return estimate(model, load_system("h100").cluster(plan.dp * plan.tp * plan.pp), plan, stack)


def test_phases_by_hand():
    # kept 10, loss phase 6, layer phase 3 + buffers 2: the loss phase binds, 16 not 21; the buffers are not held then
    loss_binds = Phases(kept=10.0, loss=6.0, working=3.0)
    assert loss_binds.peak(2.0) == 16.0 and loss_binds.stranded(2.0) == 5.0
    assert memory_at_peak((1.0, 2.0, 3.0), loss_binds, 2.0) == Memory(1.0, 2.0, 3.0, 16.0, 0.0, 5.0)
    # a smaller loss: the layer phase binds, with its buffers
    layer_binds = Phases(kept=10.0, loss=4.0, working=3.0)
    assert layer_binds.peak(2.0) == 15.0
    assert memory_at_peak((1.0, 2.0, 3.0), layer_binds, 2.0) == Memory(1.0, 2.0, 3.0, 13.0, 2.0, 4.0)
    assert memory_at_peak((1.0, 2.0, 3.0), layer_binds, 2.0).total == 21.0  # 6 of states + the peak's 15
    # FSDP2's gathered root (1) is held through both phases; its last block (2) joins the loss phase (4 + 2 > 3 + 2):
    # it binds, both ends read as buffers. The block is one of the layer phase's buffers too, so the reserved peak
    # holds it once: 10 + 1 + 4 + 3 + 2 = 20 = 17 + 3
    ends = Ends(root=1.0, block=2.0)
    assert layer_binds.peak(2.0, ends) == 17.0 and layer_binds.stranded(2.0, ends) == 3.0
    assert memory_at_peak((1.0, 2.0, 3.0), layer_binds, 2.0, ends) == Memory(1.0, 2.0, 3.0, 14.0, 3.0, 3.0)
    # a smaller block (4 + 0.5 < 3 + 2): the layer phase binds, with the root beside its buffers; reserved 20 again
    ends = Ends(root=1.0, block=0.5)
    assert layer_binds.peak(2.0, ends) == 16.0 and layer_binds.stranded(2.0, ends) == 4.0
    assert memory_at_peak((1.0, 2.0, 3.0), layer_binds, 2.0, ends) == Memory(1.0, 2.0, 3.0, 13.0, 3.0, 4.0)
    # a rank without the loss holds neither
    without = Phases(kept=10.0, loss=0.0, working=3.0)
    assert without.peak(2.0, Ends(7.0, 7.0)) == 15.0 and without.stranded(2.0, Ends(7.0, 7.0)) == 0.0
    # the loss's hole (1.5) is reserved beyond the peak where the loss phase binds, 5 + 1.5; where the layer phase
    # binds it is not added (Phases.stranded: a choice, the loss's 4 already stranded whole); the peak never holds it
    assert loss_binds._replace(hole=1.5).stranded(2.0) == 6.5 and loss_binds._replace(hole=1.5).peak(2.0) == 16.0
    assert layer_binds._replace(hole=1.5).stranded(2.0) == 4.0 and layer_binds._replace(hole=1.5).peak(2.0) == 15.0


def test_an_8b_fsdp_step_by_hand():
    # Llama 3 8B (h 4096, V 128256, 32 layers), one micro-batch of 8192 tokens, FSDP2 over 8 GPUs, full recompute,
    # torchtitan's loss: F.cross_entropy on fp32 logits in eager autograd
    t, h, v = 8192, 4096, 128256
    plan, cluster = PLANS[0][0], load_system("h100").cluster(8)
    plan = replace(plan, global_batch=8)
    est = estimate(MODEL, cluster, plan, TITAN)
    units = unit_costs(MODEL, cluster, plan, TITAN)
    states = est.memory["weights"] + est.memory["grads"] + est.memory["optimizer"]
    # 16 bytes a parameter over 8 GPUs, 8.03 G parameters: FSDP2's fp32 shard is the master, no bf16 shard
    # (specs/fsdp_modes.FsdpMode.sharded_master)
    assert states == pytest.approx(16.060e9, rel=1e-3)
    kept = 32 * t * h * 2  # each recomputed layer's bf16 input: 2.15 GB
    # the loss phase: the saved fp32 logits and the head's fp32 input (4·T·V + 4·T·h), the loss backward's two fp32
    # tensors beside them (8·T·V): 12.74 GB
    loss = 4 * t * v + 4 * t * h + 8 * t * v
    assert units.head_saved + 8 * t * v == pytest.approx(loss)
    # the layer phase: the recomputed layer's activations (1.14 GB) and ZeRO-3's buffers of 218 M parameters a
    # layer, 2 + 2 bytes gathered (in use, prefetched) + 2 autograd's + 4 the fp32 reduce-scatter input: 2.18 GB
    layer = units.layer_saved + 10 * layer_params(MODEL, plan).dense
    assert layer == pytest.approx(3.323e9, rel=1e-3)
    # FSDP2's root unit (the embedding and the head, V·h each, the final norm: 2.10 GB) held through both phases, and
    # the last block (0.44 GB) beside the logits, gathered in bf16 (torchtitan's reshard_after_forward,
    # Stack.gathered_ends): 2.54 GB
    root, block = 2 * (2 * v * h + h), 2 * 218_112_000
    assert gathered_ends(MODEL, plan, TITAN) == Ends(root, block) and root + block == 2_537_578_496
    assert est.peak_memory == pytest.approx(states + kept + root + loss + block)  # 33.49 GB: 2.10 + max(13.18, 3.32)
    assert est.peak_memory == pytest.approx(33.488e9, rel=1e-3)
    # the layer phase's blocks cached, less the last block's: it is one of them, reserved once; and the bf16 logits'
    # block the loss cannot reuse (2·T·V = 2.10 GB) less the rerun layer's free tail (step/memory.logits_hole)
    hole = 2 * t * v - units.layer_saved
    assert est.reserved_memory == pytest.approx(est.peak_memory + layer - block + hole)
    assert est.reserved_memory == pytest.approx(states + kept + root + loss + layer + hole)
    assert est.memory["activations"] == pytest.approx(kept + loss) and est.memory["buffers"] == root + block


@pytest.mark.parametrize("index", range(len(PLANS)))
def test_the_peak_is_the_larger_phase_never_below_either_nor_above_their_sum(index):
    plan, stack = PLANS[index]
    est = _peak(MODEL, plan, stack)
    cluster = load_system("h100").cluster(plan.dp * plan.tp * plan.pp)
    phases = activation_memory(MODEL, plan, stack, unit_costs(MODEL, cluster, plan, stack))
    buffers, gathered = buffer_memory(MODEL, plan), gathered_ends(MODEL, plan, stack)
    ends = []
    for states, rank in zip(model_state_memory(MODEL, plan, stack), phases, strict=True):
        base, loss = sum(states) + rank.kept + rank.on_loss_rank(gathered.root), rank.loss_phase(gathered)
        peak = sum(states) + rank.peak(buffers, gathered)
        assert peak >= base + loss and peak >= base + rank.working + buffers  # never below either phase
        assert peak == pytest.approx(base + max(loss, rank.working + buffers))
        # the allocator's reserved: both phases, the last block once (one of the layer phase's buffers)
        # and, where the loss phase binds, the block its requests cannot reuse (step/memory.logits_hole)
        hole = rank.hole if loss > rank.working + buffers else 0.0
        ends.append((peak, base + rank.loss + rank.working + buffers + hole))
    assert est.rank_memory == pytest.approx(tuple(peak for peak, _ in ends))
    assert est.peak_memory == pytest.approx(max(peak for peak, _ in ends))
    assert est.reserved_memory == pytest.approx(max(both for _, both in ends))
    assert est.reserved_memory >= est.peak_memory


@pytest.mark.parametrize("index", range(len(PLANS)))
def test_the_peak_grows_with_the_sequence_the_micro_batch_and_the_vocabulary(index):
    plan, stack = PLANS[index]
    base = _peak(MODEL, plan, stack).peak_memory
    for seq in (4096, 2048):
        assert _peak(replace(MODEL, seq_length=seq), plan, stack).peak_memory <= base
    assert _peak(replace(MODEL, vocab_size=2 * MODEL.vocab_size), plan, stack).peak_memory >= base
    assert _peak(replace(MODEL, vocab_size=MODEL.vocab_size // 4), plan, stack).peak_memory <= base
    bigger = replace(plan, micro_batch=2 * plan.micro_batch, global_batch=2 * plan.global_batch)
    assert _peak(MODEL, bigger, stack).peak_memory >= base


def test_a_replicated_embedding_holds_the_whole_table_on_each_tp_rank():
    plan = Plan(dp=2, tp=4, sequence_parallel=True, zero=3, micro_batch=1, global_batch=8, grad_bytes=4)
    first = stage_params(MODEL, plan, True)
    assert first.embedding == pytest.approx(128256 * 4096 / 4)
    whole, split = KF, KF.with_(replicated_embedding=False)
    grown = [a - b for a, b in zip(model_states(first, plan, whole), model_states(first, plan, split), strict=True)]
    table = 128256 * 4096 * (1 - 1 / 4)  # the three quarters a vocabulary-parallel rank does not hold
    assert grown == pytest.approx([2 * table / 2, 4 * table, 4 * table / 2])  # bf16 weights, fp32 whole grads, m + v
    # nothing moves at tp 1, nor for a stage without the embedding, nor the step time
    one = replace(plan, tp=1, sequence_parallel=False)
    assert model_states(stage_params(MODEL, one, True), one, whole) == model_states(
        stage_params(MODEL, one, True), one, split)
    assert StageParams(1.0, 0.0).embedding == 0.0
    cluster = load_system("h100").cluster(8)
    assert estimate(MODEL, cluster, plan, whole).step_time == estimate(MODEL, cluster, plan, split).step_time
    assert estimate(MODEL, cluster, plan, whole).peak_memory > estimate(MODEL, cluster, plan, split).peak_memory


def test_the_gathered_ends_are_torchtitans_zero3_root_and_last_block_only():
    # Llama 3 8B, tp 2 over dp 4: the vocabulary matrices and the block split 2-ways, the final norm whole; bf16
    plan = Plan(dp=4, tp=2, sequence_parallel=True, zero=3, micro_batch=1, global_batch=8)
    h, v = 4096, 128256
    ends = gathered_ends(MODEL, plan, TITAN)
    assert ends == pytest.approx((2 * (2 * v * h / 2 + h), 2 * layer_params(MODEL, plan).dense))
    # none where the weights are whole already (ZeRO 2, DDP; a shard group of one), nor for a stack that reshards them
    for whole in (replace(plan, zero=2), replace(plan, zero=0), replace(plan, dp=1, global_batch=2)):
        assert gathered_ends(MODEL, whole, TITAN) == (0.0, 0.0)
    assert gathered_ends(MODEL, plan, TITAN.with_(gathered_ends=False)) == (0.0, 0.0)
    assert gathered_ends(MODEL, plan, KF) == (0.0, 0.0)
    cluster = load_system("h100").cluster(8)
    with_ends, without = (estimate(MODEL, cluster, plan, s) for s in (TITAN, TITAN.with_(gathered_ends=False)))
    assert with_ends.step_time == without.step_time
    assert without.peak_memory < with_ends.peak_memory <= without.peak_memory + sum(ends)
    # the reserved peak gains the root alone: the last block is among the layer phase's cached buffers already
    assert with_ends.reserved_memory == pytest.approx(without.reserved_memory + ends.root)


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size"])
def test_the_gathered_ends_grow_with_the_vocabulary_and_the_width(field):
    plan, cluster = PLANS[0][0], load_system("h100").cluster(8)
    last = (0.0, 0.0)
    for scale in (0.5, 1.0, 2.0):
        model = replace(MODEL, **{field: int(getattr(MODEL, field) * scale)})
        now = (sum(gathered_ends(model, plan, TITAN)), estimate(model, cluster, plan, TITAN).peak_memory)
        assert now[0] > last[0] and now[1] > last[1]
        last = now
