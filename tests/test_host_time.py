"""The host as a resource (step/passes.py, ``host_times``): a pass takes at least the host's time to issue its
kernels, ``launches`` × ``stack.host_dispatch``; a CUDA-graphed stack issues one graph per group and pass; and the
kernels each record stands for (cost/eager.py's aten sequences)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.collectives.comm import Collective
from meshplan.cost.eager import EAGER, eager_kernels
from meshplan.cost.records import OpCost
from meshplan.errors import SpecError
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.host import host_times, launches, on_host
from meshplan.step.passes import pass_times

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
    assert host_times(OPS, Plan(), stack.host, "none") == pytest.approx({"f": 3 * 10 * US, "b": 12 * 10 * US})
    t = pass_times(OPS, TIMES, Plan(), stack, "none")
    # forward: GPU 1 + 2 us of kernels and 4 us of exposed all-reduce = 7 us < host 3 x 10 = 30 us: 23 us idle;
    # backward: GPU 3 us < host 12 x 10 = 120 us: 117 us idle. The idle time is its own component, the forward's
    # share counted with the forward pass
    assert (t.fwd, t.tp, t.bwd) == pytest.approx((3 * US, 4 * US, 3 * US))
    assert t.host == pytest.approx((23 + 117) * US) and t.total == pytest.approx(150 * US)
    assert t.passes().t_f == pytest.approx(30 * US) and t.passes().k_f == pytest.approx(3 * US)
    # full recompute launches the forward's 3 kernels again in the backward pass
    assert host_times(OPS, Plan(), stack.host, "full")["b"] == pytest.approx(15 * 10 * US)


def test_without_host_cost_or_when_gpu_bound_nothing_moves():
    plain = pass_times(OPS, TIMES, Plan(), Stack(), "none")
    assert (plain.fwd, plain.bwd, plain.host) == pytest.approx((3 * US, 3 * US, 0.0))
    slow_gpu = [t * 1000 for t in TIMES]
    bound = pass_times(OPS, slow_gpu, Plan(), Stack(host_dispatch=10 * US), "none")
    assert (bound.fwd, bound.bwd, bound.host) == pytest.approx((3000 * US, 3000 * US, 0.0))


def test_a_cuda_graphed_stack_launches_one_graph_per_pass():
    graphed = Stack(host_dispatch=10 * US, cuda_graphs=True)
    assert host_times(OPS, Plan(), graphed.host, "none") == pytest.approx({"f": 10 * US, "b": 10 * US})
    t = pass_times(OPS, TIMES, Plan(), graphed, "none")
    assert t.host == pytest.approx((10 - 7 + 10 - 3) * US) and t.total == pytest.approx(20 * US)


def test_eager_sequences_count_their_aten_kernels():
    # RMSNorm forward: to fp32, pow, mean, mul rsqrt, type_as, mul weight = 6 kernels, less the fused norm counted
    assert len(EAGER["rmsnorm"]["fwd"]) == 7 and eager_kernels("rmsnorm", "fwd") == 5
    assert eager_kernels("layernorm", "fwd") == 0  # F.layer_norm: one native kernel, as fused


def test_stack_presets_state_their_host_cost():
    # eager PyTorch stacks 25 us per kernel (measured on an H200 host: tests/test_small_work_gpu.py), Megatron-Core
    # family 12 us; Megatron-Bridge captures CUDA graphs
    for name in ("deepspeed", "pytorch-fsdp", "torchtitan", "llm-foundry"):
        assert load_stack(name).host_dispatch == 25e-6 and not load_stack(name).cuda_graphs, name
    for name in ("megatron-core", "nemo", "megatron-bridge"):
        assert load_stack(name).host_dispatch == 12e-6, name
    assert load_stack("megatron-bridge").cuda_graphs and not load_stack("megatron-core").cuda_graphs
    # Megatron-DeepSpeed's module code: Megatron-Core's 50 us a kernel scaled by its Python calls per kernel, 38.4 us
    # (tests/test_small_work_gpu.py derives it), a TP collective's call 14.5 us (one eager launching op)
    mds = load_stack("megatron-deepspeed")
    assert (mds.host_dispatch, mds.collective_host, mds.cuda_graphs) == (38.4e-6, 14.5e-6, False)


# a layer's forward as eager Megatron runs it at tp 2: norm and QKV, an exposed all-reduce, then a big GEMM
SEGMENTED = [OpCost("norm", "fwd", "memory", 0.0, 1e3, kernels=10),
             OpCost("ar", "fwd", "collective", nbytes=1e3, collective=Collective("all_reduce", 1e3, "tp", 2)),
             OpCost("fc", "fwd", "gemm", 1e9, 1e3)]
SEG_TIMES = [10 * US, 5 * US, 200 * US]


def test_pytorchs_nccl_calls_keep_the_hosts_lead():
    # ProcessGroupNCCL enqueues the all-reduce and returns: the host's lead carries past it, one max over the pass
    # (host 10 kernels + the call + the GEMM's launch = 120 us against 215 us of GPU): the GPU never waits
    t = pass_times(SEGMENTED, SEG_TIMES, Plan(), Stack(host_dispatch=10 * US), "none")
    assert t.host == 0.0 and t.total == pytest.approx(215 * US)
    # 25 us a kernel: host 300 us against 215 us of GPU, the GPU waits the difference
    t = pass_times(SEGMENTED, SEG_TIMES, Plan(), Stack(host_dispatch=25 * US), "none")
    assert t.host == pytest.approx(85 * US) and t.total == pytest.approx(300 * US)


def test_on_a_slower_host_a_stack_pays_its_host_costs_at_that_hosts_speed():
    # Cluster.python_host: GB200's Grace 2.75 x an x86 DGX host's time (TransformerEngine #2053): 10 us -> 27.5 us
    stack = Stack(host_dispatch=10 * US, compiled=True, region_host=0.2e-3)
    slow = on_host(stack, 2.75)
    assert slow.host_dispatch == pytest.approx(27.5 * US) and slow.region_host == pytest.approx(0.55e-3)
    assert on_host(stack, 1.0) is stack
    # a derived stack, not re-checked against the fields' ranges: 5 ms a kernel on a host 100x as slow
    assert on_host(Stack(host_dispatch=5e-3), 100.0).host_dispatch == pytest.approx(0.5)
    t = pass_times(SEGMENTED, SEG_TIMES, Plan(), slow, "none")
    assert t.host == pytest.approx((12 * 27.5 - 215) * US)  # 12 launches at 27.5 us against 215 us of GPU
    # the system's preset carries it into the step: the same plan on a DGX A100's host (1.34) is never faster
    from meshplan.estimate import estimate
    from meshplan.specs.hardware import load_system
    from meshplan.specs.model_load import load_model
    cluster = load_system("a100").cluster(8)
    plan = Plan(dp=4, tp=2, micro_batch=1, global_batch=64)
    at = {f: estimate(load_model("gpt2"), replace(cluster, python_host=f), plan, load_stack("megatron-deepspeed"))
          for f in (1.0, 1.34, 2.0)}
    assert cluster.python_host == 1.34 and at[1.0].step_time < at[1.34].step_time < at[2.0].step_time


def test_an_exposed_collective_drains_the_hosts_lead_where_the_host_waits_for_it():
    stack = Stack(host_dispatch=10 * US, blocking_collectives=True)
    t = pass_times(SEGMENTED, SEG_TIMES, Plan(), stack, "none")
    # segment 1: host 10 kernels + the all-reduce call = 110 us against 10 us of GPU, then the all-reduce's 5 us, which
    # the host waits out (it issues nothing meanwhile): 115 us against the GPU's 15, 100 us idle; segment 2 starts from
    # the empty queue the wait leaves: the GEMM is issued 10 us later and runs 200 us (step/host.queue_step), 10 us
    # idle. One max over the pass would find none (host 120 < GPU 215 us)
    assert t.host == pytest.approx(110 * US) and t.total == pytest.approx((215 + 110) * US)
    # hidden behind the GEMMs (--tp-comm-overlap) the all-reduce is no sync: one max over the pass
    hidden = [SEGMENTED[0], replace(SEGMENTED[1], overlap="tp"), SEGMENTED[2]]
    assert pass_times(hidden, SEG_TIMES, Plan(), stack.with_(overlap_tp=True), "none").host == 0.0
    # CUDA graphs launch the collective inside the graph: one launch, no segments, never slower than eager
    graphed = pass_times(SEGMENTED, SEG_TIMES, Plan(), stack.with_(cuda_graphs=True), "none")
    assert graphed.host == 0.0 and graphed.total <= t.total


def test_where_every_launch_blocks_the_host_and_the_gpu_take_turns():
    # CUDA_LAUNCH_BLOCKING=1: each launch returns once its kernel has run, so the host issues the next kernel only
    # after the GPU is through the last. The segmented forward: host 12 launches x 10 us = 120 us, GPU 215 us; they
    # add up, 335 us, where the async host hides behind the GEMM (215 us)
    blocked = Stack(host_dispatch=10 * US, blocking_launches=True, overlap_dp=False)
    t = pass_times(SEGMENTED, SEG_TIMES, Plan(), blocked, "none")
    assert t.host == pytest.approx(120 * US) and t.total == pytest.approx(335 * US)
    free = pass_times(SEGMENTED, SEG_TIMES, Plan(), Stack(host_dispatch=10 * US), "none")
    assert free.total == pytest.approx(215 * US)
    # a graph is one blocking launch: 10 us then the GPU's 215 us
    assert pass_times(SEGMENTED, SEG_TIMES, Plan(), blocked.with_(cuda_graphs=True), "none").total == pytest.approx(
        225 * US)
    # no stream runs beside another: a stack that claims an overlap with it is refused, naming the fields
    with pytest.raises(SpecError, match="blocking_launches=true .* overlap_dp=true"):
        Stack(blocking_launches=True)
    with pytest.raises(SpecError, match="overlap_tp=true"):
        Stack(blocking_launches=True, overlap_dp=False, overlap_tp=True)


def test_bigscience_ran_bloom_with_blocking_launches_and_its_host_time_adds_up():
    # validation maps BigScience's tr11 records (BLOOM) onto Megatron-DeepSpeed with CUDA_LAUNCH_BLOCKING=1, the tr11
    # README's workaround; Megatron-DeepSpeed as others ran it keeps asynchronous launches
    from meshplan_validation.sources import source_defaults
    bloom = source_defaults({"group": "bloom", "framework": "Megatron-DeepSpeed (BF16_Optimizer = ZeRO-1-like)"})
    assert bloom.stack.blocking_launches and bloom.stack.host_dispatch == 38.4e-6
    neox = source_defaults({"group": "neox", "framework": "GPT-NeoX (Megatron-DeepSpeed)"})
    assert not neox.stack.blocking_launches and neox.stack.name == "megatron-deepspeed"


@pytest.mark.parametrize("seed", range(20))
def test_segments_never_shorten_a_pass_and_more_host_never_helps(seed):
    rng = np.random.default_rng(seed)
    ops, times = [], []
    for i in range(12):
        if rng.random() < 0.3:
            ops.append(OpCost(f"ar{i}", "fwd" if i < 6 else "bwd_x", "collective", nbytes=1e3,
                              collective=Collective("all_reduce", 1e3, "tp", int(rng.choice([1, 2, 8])))))
        else:
            ops.append(OpCost(f"k{i}", "fwd" if i < 6 else "bwd_x", "gemm", 1e6, 1e3, kernels=int(rng.integers(1, 9))))
        times.append(float(rng.uniform(1, 100)) * US)
    host = float(rng.uniform(1, 30)) * US
    # half the seeds with a host that waits for each exposed collective (segments), half with PyTorch's async calls
    stack = Stack(host_dispatch=host, blocking_collectives=bool(seed % 2))
    t = pass_times(ops, times, Plan(), stack, "none")
    h = host_times(ops, Plan(), stack.host, "none")
    # at least the single max over each pass (nothing hides here: the GPU time is every op's)
    gpu = {ph: sum(x for o, x in zip(ops, times, strict=True) if (o.phase == "fwd") == (ph == "f")) for ph in "fb"}
    assert t.total >= max(h["f"], gpu["f"]) + max(h["b"], gpu["b"]) - 1e-15
    # a host that waits for its collectives never gains on one that does not
    waits = pass_times(ops, times, Plan(), stack.with_(blocking_collectives=True), "none").total
    assert waits >= pass_times(ops, times, Plan(), stack.with_(blocking_collectives=False), "none").total - 1e-15
    # more host cost, or a slower op, never shortens it; the graphed twin is never slower
    assert pass_times(ops, times, Plan(), stack.with_(host_dispatch=1.5 * host), "none").total >= t.total - 1e-15
    slower = [x * (1.5 if i == seed % 12 else 1.0) for i, x in enumerate(times)]
    assert pass_times(ops, slower, Plan(), stack, "none").total >= t.total - 1e-15
    assert pass_times(ops, times, Plan(), stack.with_(cuda_graphs=True), "none").total <= t.total + 1e-15
    # launches that block never gain on asynchronous ones, and keep the properties above
    blocked = stack.with_(blocking_launches=True, overlap_dp=False)
    b = pass_times(ops, times, Plan(), blocked, "none").total
    assert b >= t.total - 1e-15
    assert pass_times(ops, times, Plan(), blocked.with_(host_dispatch=1.5 * host), "none").total >= b - 1e-15
    assert pass_times(ops, slower, Plan(), blocked, "none").total >= b - 1e-15
    assert pass_times(ops, times, Plan(), blocked.with_(cuda_graphs=True), "none").total <= b + 1e-15


def test_blocking_launches_beside_an_overlap_is_one_line_from_every_door(tmp_path, capsys):
    """An option, a stack TOML and the Python API refuse it alike, in one line naming the flags (exit 2)."""
    from meshplan.cli import main

    run = ["estimate", "--model", "gpt2", "--system", "h100", "--gpus", "8"]

    def one_line(args: list[str]) -> str:
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        return err[0]

    line = one_line([*run, "--framework", "megatron-core", "--blocking-launches"])
    assert "stack megatron-core: blocking_launches=true" in line and "(--no-overlap-pp)" in line
    toml = tmp_path / "stack.toml"
    toml.write_text('name = "mine"\nblocking_launches = true\n')
    assert "stack mine: blocking_launches=true" in one_line([*run, "--framework", str(toml)])
    assert main([*run, "--framework", "megatron-deepspeed", "--blocking-launches"]) == 0  # no overlap: priced
