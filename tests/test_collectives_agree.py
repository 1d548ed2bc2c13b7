"""One dispatcher for every engine (issue 82): training (step/passes.time_ops and the data-parallel channels), serving
(serve/iteration.op_seconds) and the sharding planner (autoshard/mesh.DeviceMesh.collective) price the same
collective alike, because all of them ask collectives/price.py, which picks the model by one rule.

The same collective: one kind of the same bytes over the same ranks of the same mesh, at the same link efficiency.
Where the engines differ by design the test says how: a serving engine runs its own tensor-parallel all-reduce where
the accelerator's cost is measured (price.SERVING), so its all-reduce is NCCL's or the measured kernel's, whichever
is slower (allreduce.nvlink_all_reduce), never faster than training's.
"""

from __future__ import annotations

import numpy as np
import pytest

import meshplan.collectives.price as price
from meshplan.autoshard.mesh import device_mesh
from meshplan.collectives.allreduce import tp_all_reduce
from meshplan.collectives.comm import Collective, split_group
from meshplan.collectives.groups import axis_layout
from meshplan.collectives.price import LIBRARIES, SERVING, collective_seconds, collective_time, split_seconds
from meshplan.cost.blocks import collective
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.iteration import op_seconds
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.plan import Plan
from meshplan.step.passes import time_ops

EFF = SERVE_DEFAULT  # one efficiency for all three engines (a ServeEfficiency is an Efficiency)
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")
SIZES = (8.0, 65536.0, 16e6, 1e9)
# (system, GPUs): H100 nodes of 8 behind InfiniBand, A100 nodes (their engines' all-reduce measured), a GB200 NVL72
SYSTEMS = (("h100", 32), ("a100", 16), ("gb200", 144))


def training(kind: str, nbytes: float, axis: str, plan: Plan, cluster) -> float:
    op = collective("x", "fwd", kind, nbytes, axis, getattr(plan, axis))
    return float(time_ops([op], cluster, plan, EFF)[0])


def serving(kind: str, nbytes: float, axis: str, group: int, stride: int, cluster) -> float:
    op = collective("x", "serve", kind, nbytes, axis, group)
    return float(op_seconds(op, cluster, Quant(), EFF, {axis: stride}))


@pytest.mark.parametrize(("system", "gpus"), SYSTEMS)
@pytest.mark.parametrize("kind", KINDS)
def test_training_serving_and_the_sharding_planner_price_a_collective_alike(system, gpus, kind):
    """Along each dimension of the planner's mesh (one per tier: the NVLink domain at stride 1, the network across
    it), a collective of each size costs the planner what it costs training (its data-parallel axis laid over the
    same ranks) and serving (the same group and stride)."""
    cluster = load_system(system).cluster(gpus)
    mesh = device_mesh(cluster, eff=EFF)
    assert len(mesh.dims) == 2  # the test spans both tiers
    for dim, d in enumerate(mesh.dims):
        plan = Plan(tp=d.stride, dp=d.size) if d.stride > 1 else Plan(tp=1, dp=d.size, placement=("dp", "tp", "cp",
                                                                                                    "pp", "tp2"))
        for nbytes in SIZES:
            planner = mesh.collective(kind, nbytes, dim)
            assert training(kind, nbytes, "dp", plan, cluster) == pytest.approx(planner, rel=1e-12)
            if kind != "all_reduce":  # serving's all-reduce may run the engines' kernels (next test)
                assert serving(kind, nbytes, "dp", d.size, d.stride, cluster) == pytest.approx(planner, rel=1e-12)


@pytest.mark.parametrize(("system", "gpus"), SYSTEMS)
def test_the_tensor_parallel_all_reduce_is_one_model(system, gpus):
    """The tensor-parallel all-reduce inside the NVLink domain: training's (NCCL) equals the planner's along its
    NVLink dimension at the same group; serving's is at least it, equal where the accelerator's own kernel is not
    measured, and is allreduce.tp_all_reduce with the engines' kernels (the by-design difference)."""
    cluster = load_system(system).cluster(gpus)
    measured = cluster.accelerator.allreduce_bandwidth > 0
    for tp in (2, 8, 16, 72):
        if tp > cluster.nvlink_domain:
            continue
        mesh = device_mesh(cluster, shape=(gpus // tp, tp), eff=EFF)
        plan = Plan(tp=tp, dp=gpus // tp)
        for nbytes in SIZES:
            train = training("all_reduce", nbytes, "tp", plan, cluster)
            assert train == pytest.approx(mesh.collective("all_reduce", nbytes, 1), rel=1e-12), (tp, nbytes)
            serve = serving("all_reduce", nbytes, "tp", tp, 1, cluster)
            assert serve >= train * (1 - 1e-12)  # NCCL's GPUs (an AMD GPU's RCCL: test_protocols.py)
            if measured:  # the engines' kernel where it is slower than NCCL
                parts = split_group(cluster, tp, 1)
                assert serve == pytest.approx(float(tp_all_reduce(nbytes, tp, parts, cluster, EFF, custom=True)))
            else:
                assert serve == pytest.approx(train, rel=1e-12)


def test_a_forwarded_dispatch_costs_training_what_it_costs_serving():
    """A MoE dispatch that names its copies and routed experts (DeepEP's normal kernels, dispatch.py) is forwarded
    through each node whichever engine prices it: DeepSeek-V3's 8 of 256 experts over 32 H100s in 4 nodes."""
    cluster = load_system("h100").cluster(32)
    c = Collective("all_to_all", 1e8, "ep", 32, copies=8, experts=256.0)
    plain = Collective("all_to_all", 1e8, "ep", 32)
    plan = Plan(tp=1, dp=32, ep=32, etp=1)
    op = collective("moe/dispatch", "fwd", "all_to_all", 1e8, "ep", 32)
    forwarded = op.__class__(**{**{f: getattr(op, f) for f in op.__dataclass_fields__}, "collective": c})
    train = float(time_ops([forwarded], cluster, plan, EFF)[0])
    serve = float(op_seconds(forwarded, cluster, Quant(), EFF, {"ep": 1}))
    # serving's expert path (moe/experts, permute, dispatch, combine) runs at its fitted share (ServeEfficiency.experts)
    assert serve * EFF.experts == pytest.approx(train, rel=1e-12)
    # fewer crossings of the network than the plain all-to-all (2.71 against 6 per token: dispatch.py's example)
    assert train < float(collective_seconds(plain, 1, cluster, EFF))


def test_the_minimum_spanning_tree_is_the_library_s_not_the_engine_s():
    """An MST plan's collectives (Plan.collectives = "mst") are MPICH's choice per message wherever they are priced:
    training's layer collectives and its data-parallel channel both read ``LIBRARIES["mst"]``; a small broadcast
    over 8 ranks is the binomial tree's ⌈log2 8⌉ = 3 rounds, cheaper than NCCL's chain of 8 steps."""
    cluster = load_system("h100").cluster(32)
    plan = Plan(tp=1, dp=32, collectives="mst")
    c = Collective("broadcast", 8.0, "dp", 32)
    parts = split_group(cluster, 32, ((1, 1), (32, 1)))
    mst = float(split_seconds(c, parts, cluster, EFF, LIBRARIES["mst"]))
    assert training("broadcast", 8.0, "dp", plan, cluster) == pytest.approx(mst, rel=1e-12)
    assert mst < float(collective_time("broadcast", 8.0, 32, 1, cluster, EFF))
    assert SERVING.algorithm == "nccl"


def test_an_unknown_algorithm_is_refused():
    from meshplan.collectives.price import Library

    with pytest.raises(ValueError, match="'ring' is not one of nccl, mst"):
        Library(algorithm="ring")


def test_a_group_prices_each_distinct_collective_once_and_each_op_gets_its_own_answer(monkeypatch):
    """time_ops prices a collective its group repeats once (price.PricedOnce): the all-gather of the same 4 MiB over
    tp twice (as numbers, and again as two arrays of the same bits) and the reduce-scatter of the same bytes twice are
    priced once each, the all-gather of other bytes and of the same bytes over another axis on their own: 5 prices
    for 8 ops. Each op's time is the one split_seconds gives it alone, bit for bit."""
    cluster = load_system("h100").cluster(64)
    plan = Plan(tp=8, dp=8, cp=1)
    nb = 4.0 * 2**20
    ops = [collective("a", "fwd", "all_gather", nb, "tp", 8), collective("b", "bwd_x", "all_gather", nb, "tp", 8),
           collective("c", "bwd_x", "reduce_scatter", nb, "tp", 8),
           collective("d", "fwd", "all_gather", 2 * nb, "tp", 8), collective("e", "fwd", "all_gather", nb, "dp", 8),
           collective("f", "fwd", "reduce_scatter", nb, "tp", 8)]
    one, other = np.array([nb, 2 * nb, 3 * nb]), np.array([nb, 2 * nb, 3 * nb])
    ops += [collective("g", "fwd", "all_gather", one, "tp", 8), collective("h", "bwd_x", "all_gather", other, "tp", 8)]
    calls = []
    alone = price.split_seconds
    monkeypatch.setattr(price, "split_seconds", lambda c, *a: calls.append(c) or alone(c, *a))
    got = time_ops(ops, cluster, plan, EFF)
    assert len(calls) == 5  # a, c, d, e and g: b and f repeat a and c, h repeats g's bits
    shared = price.PricedOnce()  # one plan's groups share theirs (parts._timed): a second group of the same, none
    assert time_ops(ops[:4], cluster, plan, EFF, None, shared) == got[:4] and len(calls) == 8
    assert time_ops(ops[:4], cluster, plan, EFF, None, shared) == got[:4] and len(calls) == 8
    for op, t in zip(ops, got, strict=True):
        c = op.collective
        want = alone(c, split_group(cluster, c.group, axis_layout(plan, c.axis)), cluster, EFF)
        assert np.asarray(t).tobytes() == np.asarray(want).tobytes()
