"""Stack.param_sync: ZeRO's updated weights sent back as one all-gather (the default) or as one broadcast per rank
(InternEvo's HybridZeroOptimizer.broadcast_params @c628a8c: step/param_sync.py), and the validation's reading of
InternEvo's ZeRO-1 records (meshplan_validation/source_internevo.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.collectives.price import collective_time
from meshplan.specs.hardware import load_system
from meshplan.specs.stack import Stack
from meshplan.step.param_sync import PARAM_SYNCS, weight_sync
from meshplan_validation.source_internevo import internevo_plan, internevo_sync

A100 = load_system("a100")


def alpha_beta(alpha: float, bandwidth: float):
    """A broadcast / all-gather priced as (g − 1)·α + n/B (comm.py's chain), for the arithmetic below."""
    return lambda kind, n, g: (g - 1) * alpha + n / bandwidth


def test_default_is_the_all_gather():
    assert Stack().param_sync == "all_gather"
    assert Stack.__dataclass_fields__["param_sync"].metadata["choices"] == PARAM_SYNCS
    price = alpha_beta(5e-6, 1e10)
    assert weight_sync("all_gather", 8e9, 4, price) == price("all_gather", 8e9, 4)


def test_shard_broadcasts_arithmetic():
    # g = 4 broadcasts of n/g = 2 GB, each (4 − 1)·5 µs + 2e9 / 1e10 = 0.200015 s, one after the other: 0.80006 s;
    # the latency term g·(g − 1)·α = 60 µs grows as g², the bytes g·(n/g)/B = n/B = 0.8 s as one broadcast of n
    price = alpha_beta(5e-6, 1e10)
    assert weight_sync("shard_broadcasts", 8e9, 4, price) == pytest.approx(4 * (3 * 5e-6 + 2e9 / 1e10))
    assert weight_sync("shard_broadcasts", 8e9, 4, price) == pytest.approx(0.80006)
    # g = 1: no other rank, nothing sent
    assert weight_sync("shard_broadcasts", 8e9, 1, lambda k, n, g: 0.0 if g == 1 else 1.0) == 0.0


@pytest.mark.parametrize("gpus", [16, 64, 256, 1024])
def test_shard_broadcasts_on_a_cluster(gpus):
    """g broadcasts of n/g each, priced by the one dispatcher (price.py), over the data-parallel group."""
    cluster = A100.cluster(gpus)
    n = 13.4e9  # InternLM-7B's bf16 weights

    def price(kind, nbytes, g):
        return collective_time(kind, nbytes, g, 1, cluster)

    t = weight_sync("shard_broadcasts", n, gpus, price)
    assert t == pytest.approx(gpus * collective_time("broadcast", n / gpus, gpus, 1, cluster))
    # never faster than the one all-gather it replaces: the same bytes leave each rank, and g calls' latency
    assert t >= collective_time("all_gather", n, gpus, 1, cluster)


@pytest.mark.parametrize("gpus", [16, 256])
def test_more_bandwidth_never_slows_it(gpus):
    cluster = A100.cluster(gpus)
    faster = replace(cluster, tiers=tuple(replace(t, bandwidth=t.bandwidth * 2) for t in cluster.tiers))
    slower_net = replace(cluster, tiers=tuple(replace(t, latency=t.latency * 2) for t in cluster.tiers))

    def on(c):
        return weight_sync("shard_broadcasts", 13.4e9, gpus, lambda k, nb, g: collective_time(k, nb, g, 1, c))

    assert on(faster) <= on(cluster) <= on(slower_net)


def test_internevo_every_zero1_group():
    """Every InternEvo ZeRO-1 record gets its gradient all-reduce and its broadcasts (source_internevo.py); the plan
    its ZeRO group, dp / zero1 instances (tests/test_zero_group.py prices them)."""
    whole = {"id": "internevo-7b-tgs-tp1-zall-64gpu", "parallel": {"zero_or_fsdp": "ZeRO-1 across all data-parallel "
             "ranks (zero1=-1, 'equivalent to Deepspeed Zero-1')"}}
    notes: list[str] = []
    synced = {"grad_sync": "all_reduce", "param_sync": "shard_broadcasts", "overlap_param_gather": False}
    assert internevo_sync(whole, 1, notes) == synced
    assert "broadcast_params" in notes[0]
    assert internevo_plan(whole, 64, 1, []) == {"distributed_optimizer_instances": 1, "grad_bytes": 2}
    node = {"id": "internevo-7b-nockpt-64gpu-mn4", "parallel": {"zero_or_fsdp": "ZeRO-1 (InternEvo hybrid ZeRO, "
            "zero1=8: optimizer states sharded within each 8-GPU node, replicated across nodes)"}}
    assert internevo_sync(node, 1, []) == synced
    assert internevo_plan(node, 64, 1, []) == {"distributed_optimizer_instances": 64 // 8, "grad_bytes": 2}
    assert internevo_sync(whole, 0, []) == {} and internevo_plan(whole, 64, 0, []) == {}
    assert internevo_sync({**whole, "id": "megatron-x"}, 1, []) == {}
