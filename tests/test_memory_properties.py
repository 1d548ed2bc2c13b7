"""Memory where nature is monotone (issue 48, item 6), over the property tests' seeded triples (draws.py):

- offloading activations never raises a rank's peak HBM: the offloaded layers' share leaves the GPU but for a
  double buffer of one layer's micro-batch, one buffer when a single one is offloaded (memory.activation_bytes);
- a higher ZeRO stage never raises the model states (weights + gradients + optimizer) per GPU at the same layout,
  and on a shard group of one (nothing to shard) ZeRO-2 and -3 are ZeRO-1 to the byte;
- a higher ZeRO stage raises the peak by no more than ZeRO-3's own transient window (the gathered weights of the
  layer in use and of the prefetched one, the gradients on their way to the reduce-scatter: FSDP2 holds these
  beside the shards, so a stage of one or two layers can be heavier under ZeRO-3 — the arithmetic is below) and the
  units a stack's FSDP2 leaves gathered under ZeRO-3 (step/memory.gathered_ends: torchtitan's root unit through the
  step, its last block into the loss phase), gathered copies ZeRO 0-2 never make since they hold every weight whole.
"""

from __future__ import annotations

import random
from dataclasses import replace
from functools import cache

from draws import draw_triple
from meshplan.estimate import estimate
from meshplan.memory import WEIGHT_BYTES, buffer_memory
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.refusals import refused
from meshplan.step.memory import gathered_ends

TRIPLES = 300


@cache
def triples() -> list:
    rng = random.Random(48)
    return [draw_triple(rng) for _ in range(TRIPLES)]


def _peak(model, cluster, plan, stack):
    return estimate(model, cluster, plan, stack) if not check(model, cluster, plan, stack) else None


def test_offloading_activations_never_raises_peak_hbm():
    checked = 0
    for model, cluster, plan, stack in triples():
        kept, offloaded = replace(plan, offload_activations=False), replace(plan, offload_activations=True)
        a, b = _peak(model, cluster, kept, stack), _peak(model, cluster, offloaded, stack)
        if a is None or b is None:
            continue
        checked += 1
        for ra, rb in zip(a.rank_memory, b.rank_memory, strict=True):
            assert rb <= ra * (1 + 1e-12), (model.name, plan)
    assert checked >= 200


def test_a_higher_zero_stage_never_raises_model_states_and_only_zero3_buffers_can_raise_the_peak():
    """Over the stages the stack's framework runs: one it refuses runs no optimizer wrapper to compare (DeepSpeed's
    bf16 weights with fp32 gradients without ZeRO raise "unsupported mix", specs/refusals.py)."""
    checked = 0
    for model, cluster, plan, stack in triples():
        ests = {z: None if refused(stack.supports.refuses, replace(plan, zero=z), model, stack)
                else _peak(model, cluster, replace(plan, zero=z), stack) for z in range(4)}
        for z in range(3):
            lo, hi = ests[z], ests[z + 1]
            if lo is None or hi is None:
                continue
            checked += 1
            states = [sum(e.memory[k] for k in ("weights", "grads", "optimizer")) for e in (lo, hi)]
            assert states[1] <= states[0] * (1 + 1e-12), (model.name, z, plan)
            zero3 = replace(plan, zero=3)
            window = buffer_memory(model, zero3) - buffer_memory(model, replace(plan, zero=2))
            allowed = window + sum(gathered_ends(model, zero3, stack)) if z == 2 else 0.0
            assert hi.peak_memory <= lo.peak_memory * (1 + 1e-12) + allowed, (model.name, z, plan)
    assert checked >= 500


def test_zero_on_a_shard_group_of_one_shards_nothing_and_adds_nothing():
    """Issue 48: ZeRO-3 at dp = 1 added 0.59 GiB of gather buffers while sharding nothing. Llama-3-8B on 8 H100s at
    tp 8: ZeRO-1, -2 and -3 are the same bytes."""
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(8)
    peaks = {z: estimate(model, cluster, Plan(dp=1, tp=8, global_batch=8, zero=z)).peak_memory for z in (1, 2, 3)}
    assert peaks[1] == peaks[2] == peaks[3]


def test_zero3_window_is_two_gathered_layers_and_the_gradients_in_transit():
    """Llama-3-8B, dp 8: a layer holds 4096 · (4096 + 2·1024 + 4096) = 41,943,040 attention + 3 · 4096 · 14336 =
    176,160,768 MLP + 2 · 4096 norm = 218,112,000 parameters; ZeRO-3's window is 2 layers × 2 B (in use and
    prefetched) + 2 B + 4 B (autograd's gradients and the fp32 reduce-scatter input) = 10 B a parameter."""
    from meshplan.cost.params import layer_params
    model = load_model("llama3-8b")
    plan = Plan(dp=8, global_batch=64, zero=3, grad_bytes=4)
    layer = layer_params(model, plan).total
    assert WEIGHT_BYTES == 2
    window = buffer_memory(model, plan) - buffer_memory(model, replace(plan, zero=2))
    assert layer == 218_112_000 and window == layer * (2 * 2 + 2 + 4)
    # one layer per stage: nothing to prefetch, one gathered layer
    one = replace(model, num_layers=2)
    plan2 = replace(plan, pp=2, dp=4)
    window1 = buffer_memory(one, plan2) - buffer_memory(one, replace(plan2, zero=2))
    assert window1 == layer_params(one, plan2).total * (2 + 2 + 4)
