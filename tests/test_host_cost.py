"""The host's cost of issuing work as its own small record (specs/host_cost.py, issue 82 deliverable 3): a stack's
``host`` carries exactly its host fields, with the preset's name, version and source, and step/host.py composes a
pass from that record alone."""

from __future__ import annotations

import pytest

from meshplan.cost.blocks import collective
from meshplan.cost.records import OpCost
from meshplan.cost.wrappers import DEEPSPEED_FP16, DEEPSPEED_ZERO_FP32
from meshplan.serve.engine import load_engine
from meshplan.specs.host_cost import EAGER_OP_HOST, HostCost
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.host import host_idle, host_times, per_launch

US = 1e-6


def test_a_stack_s_host_record_carries_its_host_fields_and_source():
    stack = load_stack("megatron-core")
    host = stack.host
    assert (host.per_kernel, host.per_region) == (stack.host_dispatch, stack.region_host)
    assert host.per_collective is None and stack.collective_host == 0.0  # unstated: a call costs a kernel's
    assert host.per_call(collective=True) == stack.host_dispatch
    assert (host.cuda_graphs, host.blocking_collectives, host.blocking_launches, host.hidden_tp) == (
        stack.cuda_graphs, stack.blocking_collectives, stack.blocking_launches, stack.overlap_tp)
    assert host.source.startswith("megatron-core") and len(host.source) > len("megatron-core")


def test_one_eager_op_has_one_price_that_stacks_and_engines_share():
    """specs/host_cost.py EAGER_OP_HOST (14.5 us, dgxc-benchmarking) is the one price of an eager launching op: a
    Megatron TP collective's call (megatron-deepspeed collective_host), DeepSpeed's FP16_Optimizer per tensor
    (14 x 14.5 + 6 x 0.6 = 206.6 us) and ZeRO's fp32 loop (2 x 14.5 + 7 x 0.6 = 33.2 us), and vLLM V0's input broadcast
    on a receiving worker, 2 dispatches a tensor (2 x 14.5 = 29 us)."""
    assert round(EAGER_OP_HOST / US, 9) == 14.5
    assert load_stack("megatron-deepspeed").collective_host == EAGER_OP_HOST
    assert (round(DEEPSPEED_FP16 / US, 9), round(DEEPSPEED_ZERO_FP32 / US, 9)) == (206.6, 33.2)
    for name in ("vllm-v0", "vllm-v0.5", "vllm-v0.5-rocm", "vllm-v0.6-rocm"):
        assert load_engine(name).tp_broadcast_dispatches * EAGER_OP_HOST == pytest.approx(29 * US)


def test_a_collective_call_costs_its_stated_price_else_a_kernel_s():
    assert HostCost(per_kernel=12 * US, per_collective=5 * US).per_call(collective=True) == 5 * US
    assert HostCost(per_kernel=12 * US).per_call(collective=True) == 12 * US
    assert HostCost(per_kernel=12 * US, per_collective=5 * US).per_call(collective=False) == 12 * US


def test_a_pass_is_composed_from_the_record_alone():
    """Three kernels and one exposed all-reduce over 2 ranks at 10 µs a launch: the host issues the pass in 4 × 10 =
    40 µs; against 25 µs of GPU time the GPU waits 15 µs, whichever stack object the record came from."""
    gemm = OpCost("g", "fwd", "gemm", flops=1e9, nbytes=1e6, kernels=3.0)
    ar = collective("ar", "fwd", "all_reduce", 1e6, "tp", 2)
    ops = [gemm, ar]
    host = Stack(host_dispatch=10 * US).host
    assert per_launch(ar, host) == 10 * US
    assert host_times(ops, Plan(), host, "none")["f"] == pytest.approx(40 * US)
    idle = host_idle(ops, [20 * US, 5 * US], Plan(), host, "none", {"f": 25 * US, "b": 0.0})
    assert idle["f"] == pytest.approx(15 * US)


def test_an_engine_s_host_record_prices_its_loop():
    """A serving engine's host costs are the same record (serve/engine.py Engine.host): vLLM V0's loop, at 1.5x an
    x86 host's Python speed for 10 running sequences over 2 stages, costs the record's per_iteration + per_sequence x
    10 x 2, scaled where the loop is Python; its hidden work per_sequence alike; an eager layer per_layer each."""
    from meshplan.serve.engine import load_engine

    engine = load_engine("vllm-v0")
    host = engine.host
    assert (host.per_iteration, host.per_sequence, host.hidden_per_sequence, host.per_layer, host.per_layer_tp) == (
        engine.iteration_overhead, engine.sequence_overhead, engine.hidden_sequence_overhead,
        engine.eager_layer_overhead, engine.eager_layer_tp_overhead)
    assert host.source.startswith("vllm") and host.per_sequence > 0
    scale = 1.5 if host.in_python else 1.0
    assert engine.host_time(10, 2, 1.5) == pytest.approx(scale * (host.per_iteration + host.per_sequence * 20))
    assert engine.hidden_time(10, 2, 1.5) == pytest.approx(scale * host.hidden_per_sequence * 20)
    assert float(engine.eager_time(10_000, 1, 4, 1.5)) == pytest.approx(scale * host.per_layer * 4)
    under_tp = scale * (host.per_layer + host.per_layer_tp) * 4  # tp 2: the layer's all-reduces' launches too
    assert float(engine.eager_time(10_000, 1, 4, 1.5, 2)) == pytest.approx(under_tp)
