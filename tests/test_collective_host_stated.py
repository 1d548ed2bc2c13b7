"""A stack can state that its host issues no collective call (issue 79, review22's rank22 item 0): ``collective_host``
0 with ``collective_host_stated`` prices each collective call at 0 host seconds, where an unstated 0 prices it at a
kernel's ``host_dispatch`` (HostCost.per_call). vTrain's profile states none, as its source says
(meshplan_validation/source_vtrain.py: VIA-Research/vTrain f8dda847 src/predictor.py ``_add_tp_communication`` adds
each layer's TP all-reduces as CommNodes of its nccl-tests table, so its CUPTI trace holds no collective call). Every
preset leaves the flag off, so no other estimate moves."""

from __future__ import annotations

import pytest

from meshplan.cost.layers import dense_layer
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.host_cost import HostCost
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack, stack_names
from meshplan.step.host import host_times
from meshplan_validation.source_vtrain import VTRAIN_STACK
from meshplan_validation.sources import VTRAIN

US = 1e-6
# vTrain's smallest released GPT (data/validation/vtrain_single_node_dev.jsonl: 12 layers, hidden 1024, 16 heads,
# sequence 2048, GPT-2's vocabulary)
GPT_1024 = ModelSpec(name="gpt-12x1024", num_layers=12, hidden_size=1024, num_heads=16, ffn_hidden_size=4096,
                     vocab_size=50257, seq_length=2048, mlp="gelu", norm="layernorm", position_embedding="learned",
                     max_position_embeddings=2048, qkv_bias=True, linear_bias=True)


def _plan(tp: int, pp: int = 1) -> Plan:
    return Plan(tp=tp, pp=pp, dp=8 // (tp * pp), micro_batch=2, global_batch=64, sequence_parallel=False)


def test_a_stated_zero_is_no_host_time_and_an_unstated_one_a_kernel_s():
    assert HostCost(per_kernel=38.4 * US, per_collective=0.0).per_call(collective=True) == 0.0
    assert HostCost(per_kernel=38.4 * US).per_call(collective=True) == 38.4 * US
    assert HostCost(per_kernel=38.4 * US, per_collective=0.0).per_call(collective=False) == 38.4 * US
    assert Stack(host_dispatch=38.4 * US).host.per_call(collective=True) == 38.4 * US
    assert Stack(host_dispatch=38.4 * US, collective_host_stated=True).host.per_call(collective=True) == 0.0
    # a price above 0 is stated with or without the flag
    for flag in (False, True):
        stack = Stack(host_dispatch=38.4 * US, collective_host=14.5 * US, collective_host_stated=flag)
        assert stack.host.per_call(collective=True) == 14.5 * US


def test_vtrain_states_no_host_time_per_collective_call():
    assert VTRAIN.stack is VTRAIN_STACK
    assert (VTRAIN_STACK.collective_host, VTRAIN_STACK.collective_host_stated) == (0.0, True)
    assert VTRAIN_STACK.host.per_call(collective=True) == 0.0
    assert VTRAIN_STACK.host.per_call(collective=False) == VTRAIN_STACK.host_dispatch == 38.4e-6


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_a_vtrain_layer_s_host_time_drops_by_its_four_all_reduce_calls(tp):
    """One layer, one micro-batch, no recompute: 2 TP all-reduces a pass (the attention's and the MLP's output
    forward, their inputs' gradients backward), each a kernel's 38.4 us when unstated and 0 as vTrain states it:
    forward and backward each 2 x 38.4 = 76.8 us less, the layer 4 x 38.4 = 153.6 us less; at tp 1 nothing."""
    plan = _plan(tp)
    ops = dense_layer(GPT_1024, plan, VTRAIN_STACK)
    stated = host_times(ops, plan, VTRAIN_STACK.host, "none")
    unstated = host_times(ops, plan, VTRAIN_STACK.with_(collective_host_stated=False).host, "none")
    assert ((unstated["f"] - stated["f"]) / US, (unstated["b"] - stated["b"]) / US) == pytest.approx((76.8, 76.8))
    one = _plan(1)
    ops1 = dense_layer(GPT_1024, one, VTRAIN_STACK)
    alone = host_times(ops1, one, VTRAIN_STACK.host, "none")
    assert alone == host_times(ops1, one, VTRAIN_STACK.with_(collective_host_stated=False).host, "none")


@pytest.mark.parametrize("name", stack_names())
def test_no_preset_states_a_zero_so_its_collective_calls_cost_what_they_did(name):
    """The default is unchanged: every preset leaves the flag off, and its collective call costs its collective_host
    where that is above 0, else its host_dispatch (the pricing before the flag)."""
    stack = load_stack(name)
    assert not stack.collective_host_stated
    assert stack.host.per_call(collective=True) == (stack.collective_host or stack.host_dispatch)


@pytest.mark.parametrize(("tp", "pp"), [(1, 1), (2, 1), (4, 1), (2, 2), (8, 1)])
def test_the_step_is_monotone_in_the_stated_price_of_a_call(tp, pp):
    """Monotone: from a stated 0 up to a kernel's price (and past it) the step never shortens; a stated 0 never
    exceeds the unstated 0's step (a kernel's price per call); at tp 1 (no TP collective) the price does not matter."""
    cluster = load_system("a100").cluster(8)
    plan = _plan(tp, pp)
    steps = [estimate(GPT_1024, cluster, plan, VTRAIN_STACK.with_(collective_host=c * US)).step_time
             for c in (0.0, 5.0, 14.5, 38.4, 100.0)]
    assert all(b >= a - 1e-12 for a, b in zip(steps, steps[1:], strict=False))
    unstated = estimate(GPT_1024, cluster, plan, VTRAIN_STACK.with_(collective_host_stated=False)).step_time
    assert steps[0] <= unstated + 1e-12
    assert unstated == pytest.approx(steps[3], rel=1e-12)  # unstated: the 38.4 us of a kernel
    if tp == 1:
        assert steps[0] == pytest.approx(steps[-1], rel=1e-12)
