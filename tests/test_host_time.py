"""The host as a resource (step/passes.py, ``host_times``): a pass takes at least the host's time to issue its
kernels, ``launches`` × ``stack.host_dispatch``; a CUDA-graphed stack issues one graph per group and pass; and the
kernels each record stands for (cost/eager.py's aten sequences)."""

from __future__ import annotations

import pytest

from meshplan.comm import Collective
from meshplan.cost.eager import EAGER, eager_kernels
from meshplan.cost.records import OpCost
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.passes import host_times, launches, pass_times

US = 1e-6
OPS = [OpCost("norm", "fwd", "memory", 0.0, 1e3),
       OpCost("qkv", "fwd", "gemm", 1e6, 1e3),
       OpCost("view", "fwd", "memory"),  # no work: no kernel
       OpCost("tp_out", "fwd", "collective", nbytes=1e3, collective=Collective("all_reduce", 1e3, "tp", 8)),
       OpCost("norm/eager", "bwd_x", "memory", 0.0, 1e3, kernels=12)]
TIMES = [1 * US, 2 * US, 0.0, 4 * US, 3 * US]  # GPU seconds of each


def test_launches_count_kernels_and_collective_calls():
    # a fused kernel 1, a view 0, an NCCL call over 8 ranks 1, an eager RMSNorm backward's 12 extra aten kernels
    assert [float(launches(op)) for op in OPS] == [1.0, 1.0, 0.0, 1.0, 12.0]
    one_rank = OpCost("ar", "fwd", "collective", nbytes=1e3, collective=Collective("all_reduce", 1e3, "tp", 1))
    assert float(launches(one_rank)) == 0.0  # no call over a group of one


def test_a_host_bound_pass_takes_the_hosts_time():
    stack = Stack(host_dispatch=10 * US)
    assert host_times(OPS, Plan(), stack, "none") == pytest.approx({"f": 3 * 10 * US, "b": 12 * 10 * US})
    t = pass_times(OPS, TIMES, Plan(), stack, "none")
    # forward: GPU 1 + 2 us of kernels and 4 us of exposed all-reduce = 7 us < host 3 x 10 = 30 us: 23 us idle;
    # backward: GPU 3 us < host 12 x 10 = 120 us: 117 us idle. The idle time is its own component, the forward's
    # share counted with the forward pass
    assert (t.fwd, t.tp, t.bwd) == pytest.approx((3 * US, 4 * US, 3 * US))
    assert t.host == pytest.approx((23 + 117) * US) and t.total == pytest.approx(150 * US)
    assert t.passes().t_f == pytest.approx(30 * US) and t.passes().k_f == pytest.approx(3 * US)
    # full recompute launches the forward's 3 kernels again in the backward pass
    assert host_times(OPS, Plan(), stack, "full")["b"] == pytest.approx(15 * 10 * US)


def test_without_host_cost_or_when_gpu_bound_nothing_moves():
    plain = pass_times(OPS, TIMES, Plan(), Stack(), "none")
    assert (plain.fwd, plain.bwd, plain.host) == pytest.approx((3 * US, 3 * US, 0.0))
    slow_gpu = [t * 1000 for t in TIMES]
    bound = pass_times(OPS, slow_gpu, Plan(), Stack(host_dispatch=10 * US), "none")
    assert (bound.fwd, bound.bwd, bound.host) == pytest.approx((3000 * US, 3000 * US, 0.0))


def test_a_cuda_graphed_stack_launches_one_graph_per_pass():
    graphed = Stack(host_dispatch=10 * US, cuda_graphs=True)
    assert host_times(OPS, Plan(), graphed, "none") == pytest.approx({"f": 10 * US, "b": 10 * US})
    t = pass_times(OPS, TIMES, Plan(), graphed, "none")
    assert t.host == pytest.approx((10 - 7 + 10 - 3) * US) and t.total == pytest.approx(20 * US)


def test_eager_sequences_count_their_aten_kernels():
    # RMSNorm forward: to fp32, pow, mean, mul rsqrt, type_as, mul weight = 6 kernels, less the fused norm counted
    assert len(EAGER["rmsnorm"]["fwd"]) == 7 and eager_kernels("rmsnorm", "fwd") == 5
    assert eager_kernels("layernorm", "fwd") == 0  # F.layer_norm: one native kernel, as fused


def test_stack_presets_state_their_host_cost():
    # eager PyTorch stacks 15 us per kernel, Megatron-Core family 12 us; Megatron-Bridge captures CUDA graphs
    for name in ("deepspeed", "pytorch-fsdp", "torchtitan", "llm-foundry"):
        assert load_stack(name).host_dispatch == 15e-6 and not load_stack(name).cuda_graphs, name
    for name in ("megatron-core", "nemo", "megatron-bridge"):
        assert load_stack(name).host_dispatch == 12e-6, name
    assert load_stack("megatron-bridge").cuda_graphs and not load_stack("megatron-core").cuda_graphs
