"""torchtitan 0.2.2's per-op selective activation checkpointing on a MoE layer (cost/recompute.py per_op_saved):
its policy counts aten.mm calls only, force-recomputes the router gate's mm uncounted, never saves grouped experts
(aten._grouped_mm), counts the for-loop experts' w1, w3 and w2 call by call, and saves the all-to-alls' outputs."""

from __future__ import annotations

from dataclasses import fields, is_dataclass, replace

import numpy as np
import pytest

from meshplan.cost.layers import moe_layer
from meshplan.cost.recompute import per_op_kept, per_op_reruns, per_op_saved
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.step.passes import pass_times, time_ops

MIXTRAL = load_model("mixtral-8x7b")  # d 4096, 8 KV heads of 128 (1024), 32 heads, 8 experts of FFN 14336, top-2
LOOP = load_stack("torchtitan")  # expert_gemm per_expert: torchtitan's _run_experts_for_loop
GROUPED = replace(LOOP, expert_gemm="grouped")  # torchtitan's _run_experts_grouped_mm
OP_SAC = Plan(dp=8, micro_batch=1, global_batch=8, zero=3, recompute="selective", recompute_modules=("op_sac",))
T, K, H, F = 32768, 2, 4096, 14336  # tokens of one micro-batch (its sequence), top-k, width, expert FFN


def _gemms(ops, values):
    return {op.name: v for op, v in zip(ops, values, strict=True) if op.phase == "fwd" and op.kind == "gemm"}


def test_the_router_is_uncounted_and_the_for_loop_experts_alternate_by_expert():
    """wq (1st, saved), wk (2nd), wv (3rd, saved), wo (4th); the router gate's mm is force-recomputed before it is
    counted (job_config per_op_sac_force_recompute_mm_shapes_by_fqns = ["moe.router.gate"]); then expert e runs
    w1, w3, w2 as the (5+3e)-th, (6+3e)-th, (7+3e)-th mm: expert 0 saves w1 and w2, expert 1 saves w3, and so on, so
    of 8 experts 4 save each of w1, w3 and w2: half of fc1's record (w1 and w3) and half of fc2's are saved."""
    ops = moe_layer(MIXTRAL, OP_SAC, LOOP)
    assert _gemms(ops, per_op_saved(ops)) == {"attn/qkv/q": 1.0, "attn/qkv/k": 0.0, "attn/qkv/v": 1.0,
                                              "attn/out": 0.0, "moe/router": 0.0, "moe/experts/fc1": 0.5,
                                              "moe/experts/fc2": 0.5}
    assert _gemms(ops, per_op_reruns(ops))["moe/router"] == 1.0
    grouped = moe_layer(MIXTRAL, OP_SAC, GROUPED)
    assert _gemms(grouped, per_op_saved(grouped))["moe/experts/fc1"] == 0.0  # aten._grouped_mm: not in the list
    assert _gemms(grouped, per_op_saved(grouped))["moe/experts/fc2"] == 0.0
    assert _gemms(grouped, per_op_reruns(grouped))["moe/experts/fc2"] == 1.0


def test_one_layer_s_bytes_kept():
    """Per token, 16-bit: wq 4096 and wv 1024, the attention output 4096 with 32 heads' fp32 log-sum-exp (8,320
    bytes); the for-loop experts add half of the k·2F rows of w1 and w3 and half of the k·H rows of w2:
    (4096 + 1024)·2 + 8320 + k·F·2 + k/2·H·2 = 10,240 + 8,320 + 57,344 + 8,192 = 84,096 bytes (2.57 GiB a layer at
    32,768 tokens); grouped experts none: 18,560. With expert parallelism 4 both all-to-alls' outputs, k·H·2 each:
    32,768 bytes a token more. Compiled keeps the same (no shared experts: the experts' w2 output is the last
    GEMM's, which the scores' gradient reads)."""
    loop, grouped = moe_layer(MIXTRAL, OP_SAC, LOOP), moe_layer(MIXTRAL, OP_SAC, GROUPED)
    assert per_op_kept(loop) == T * 84096 == T * ((4096 + 1024) * 2 + 8320 + K * F * 2 + K // 2 * H * 2)
    assert per_op_kept(grouped) == T * 18560
    assert per_op_kept(loop, compiled=True) == per_op_kept(loop)
    ep4 = replace(OP_SAC, ep=4)
    assert per_op_kept(moe_layer(MIXTRAL, ep4, LOOP)) == T * (84096 + 2 * K * H * 2)
    assert per_op_kept(moe_layer(MIXTRAL, ep4, GROUPED)) == T * (18560 + 2 * K * H * 2)


def test_one_layer_s_flops_recomputed():
    """The GEMMs run again: wk 2·T·4096·1024, wo 2·T·4096·4096, the router 2·T·4096·8, and the experts' share of
    2·T·k·(4096·2F + F·4096): half for the for-loop (12.92 TFLOP), all for grouped (24.47 TFLOP); the backward's
    recompute time is the rerun records' times in those shares."""
    fixed = 2 * T * (4096 * 1024 + 4096 * 4096 + 4096 * 8)
    experts = 2 * T * K * (4096 * 2 * F + F * 4096)
    for stack, share in ((LOOP, 0.5), (GROUPED, 1.0)):
        ops = moe_layer(MIXTRAL, OP_SAC, stack)
        again = per_op_reruns(ops)
        gemms = sum(op.flops * r for op, r in zip(ops, again, strict=True) if op.kind == "gemm")
        assert gemms == fixed + share * experts
        times = time_ops(ops, load_system("h100").cluster(8), OP_SAC, DEFAULT)
        redo = pass_times(ops, times, OP_SAC, stack, "selective").recompute
        assert redo == pytest.approx(sum(t * r for t, r in zip(times, again, strict=True)))


def test_keeping_more_never_lowers_peak_memory():
    """The for-loop keeps 2 GiB a layer more than grouped experts (84,096 - 18,560 bytes a token): the peak is
    higher by that over at least 31 of its 32 layers (62 GiB: the peak's phase holds 31 layers' kept activations
    beside the working layer's), and no lower than grouped's under expert parallelism either."""
    h200 = load_system("h200").cluster(8)
    for ep in (1, 2):
        plan = replace(OP_SAC, ep=ep)
        loop, grouped = estimate(MIXTRAL, h200, plan, LOOP), estimate(MIXTRAL, h200, plan, GROUPED)
        assert loop.peak_memory >= grouped.peak_memory
    plan = OP_SAC
    more = estimate(MIXTRAL, h200, plan, LOOP).peak_memory - estimate(MIXTRAL, h200, plan, GROUPED).peak_memory
    assert 31 * T * (84096 - 18560) <= more <= 32 * T * (84096 - 18560)


def _batched(records):
    """One record whose numeric fields differing across ``records`` are arrays, one element each (the search's
    grid of plans)."""
    values = {}
    for f in fields(records[0]):
        column = [getattr(r, f.name) for r in records]
        if is_dataclass(column[0]):
            values[f.name] = _batched(column)
        elif type(column[0]) in (int, float) and len(set(column)) > 1:
            values[f.name] = np.array(column, dtype=float)
    return replace(records[0], **values)


def test_a_grid_of_expert_parallel_sizes_keeps_and_reruns_what_each_plan_does():
    """The search prices plans as arrays (xp.py): the layer's records batched over ep 1, 2, 4 and 8 keep and rerun,
    element by element, what each plan's records do alone (all-to-all outputs only where ep > 1)."""
    layers = [moe_layer(MIXTRAL, replace(OP_SAC, ep=ep), LOOP) for ep in (1, 2, 4, 8)]
    grid = [_batched(list(records)) for records in zip(*layers, strict=True)]
    assert list(per_op_kept(grid)) == [per_op_kept(ops) for ops in layers]
    alone = [per_op_reruns(ops) for ops in layers]
    for i, share in enumerate(per_op_reruns(grid)):
        assert list(np.broadcast_to(share, 4)) == [again[i] for again in alone]
