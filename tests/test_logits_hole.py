"""The eager loss on upcast logits reserves 14 bytes a logit where 12 are live (step/memory.logits_hole): the 16-bit
logits' 2N block, freed beside the upcast, cannot serve the backward's fp32 requests (c10/cuda/CUDACachingAllocator.cpp
get_free_block: a cached block serves a request only when at least as large), less the layer phase's free tail the
new pages of torchtitan's expandable segments merge with (none under a per-op policy, one layer's recomputed
activations at most under full recompute). torchtitan's loop: pytorch/torchtitan train.py:131-138, 301-308 @9dec370."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.estimate import estimate
from meshplan.memory import buffer_memory
from meshplan.specs.hardware import load_system
from meshplan.specs.model_extras import head_vocab
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.memory import activation_memory, gathered_ends, logits_hole
from meshplan.step.units import unit_costs

LLAMA = load_model("llama3-8b")
TITAN = load_stack("torchtitan")
H100 = load_system("h100").cluster(8)
OP_SAC = Plan(dp=8, micro_batch=2, global_batch=16, zero=3, recompute="selective", recompute_modules=("op_sac",))
FULL = replace(OP_SAC, micro_batch=1, global_batch=8, recompute="full")


def test_two_bytes_a_logit_under_a_per_op_policy():
    """2 x 8192 tokens x 128,256 logits (N = 2.10 G) x 2 bytes = 3.91 GiB: the eager 8B run at FSDP 8 read 82.4 GiB
    reserved, 12 bytes a logit alone left it 5.7 GiB short."""
    n = 2 * 8192 * head_vocab(LLAMA)
    assert logits_hole(LLAMA, OP_SAC, TITAN, 0.0) == 2 * n
    assert 2 * n / 2**30 == pytest.approx(3.914, abs=1e-3)


def test_full_recompute_absorbs_the_free_tail_of_one_layer():
    """Under full recompute the free tail is the rerun layer's activations (``layer_saved``), at most 2N: at 32,768
    tokens 2N = 7.83 GiB less 4.25 GiB; a larger layer leaves no hole."""
    plan = replace(FULL, micro_batch=1)
    two_n = 32768 * head_vocab(LLAMA) * 2
    seq = replace(LLAMA, seq_length=32768)
    layer = 4.25 * 2**30
    assert logits_hole(seq, plan, TITAN, layer) == pytest.approx(two_n - layer)
    assert logits_hole(seq, plan, TITAN, 2 * two_n) == 0.0


def test_only_the_upcast_eager_loss_over_whole_logits_leaves_it():
    """The fused vocabulary-parallel loss writes its gradient over the saved softmax (no upcast block); under
    loss_parallel (tp > 1) the sequence differs and is not priced."""
    assert logits_hole(LLAMA, OP_SAC, replace(TITAN, cross_entropy="fused"), 0.0) == 0.0
    assert logits_hole(LLAMA, replace(OP_SAC, tp=2, dp=4), TITAN, 0.0) == 0.0


def test_only_the_loop_and_allocator_read_leave_it():
    """The hole is torchtitan's loop's (``del pred`` before the backward) under its launch script's expandable
    segments (Stack.expandable_segments): the deepspeed and pytorch-fsdp presets run the same upcast eager loss in
    loops of their own that no source here reads, so their hole is none; with the flag set they would price
    torchtitan's 2N."""
    assert load_stack("torchtitan").expandable_segments
    for name in ("deepspeed", "pytorch-fsdp"):
        stack = load_stack(name)
        assert stack.loss.hole == 2 and not stack.expandable_segments
        assert logits_hole(LLAMA, FULL, stack, 0.0) == 0.0
        n = 8192 * head_vocab(LLAMA)
        assert logits_hole(LLAMA, FULL, stack.with_(expandable_segments=True), 0.0) == 2 * n
    assert logits_hole(LLAMA, FULL, TITAN.with_(expandable_segments=False), 0.0) == 0.0


def test_the_reserved_peak_holds_it_and_the_allocated_peak_does_not():
    """Where the loss phase binds (torchtitan's 8B: 23.7 GiB of loss transients against the layer phase's few),
    the stranded bytes, reserved less allocated, grow by the hole exactly; the allocated peak is unchanged."""
    u = unit_costs(LLAMA, H100, OP_SAC, TITAN)
    phases = activation_memory(LLAMA, OP_SAC, TITAN, u)[0]
    buffers, ends = buffer_memory(LLAMA, OP_SAC), gathered_ends(LLAMA, OP_SAC, TITAN)
    plain = phases._replace(hole=0.0)
    assert phases.hole == logits_hole(LLAMA, OP_SAC, TITAN, u.layer_saved) > 0
    assert phases.peak(buffers, ends) == plain.peak(buffers, ends)
    assert phases.stranded(buffers, ends) - plain.stranded(buffers, ends) == pytest.approx(phases.hole)
    est = estimate(LLAMA, H100, OP_SAC, TITAN)
    assert est.reserved_memory - est.peak_memory == pytest.approx(phases.stranded(buffers, ends))
