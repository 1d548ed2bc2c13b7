"""step/channels.py: the data-parallel collectives and the offload copies share each pass with the layers' own
traffic."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.estimate import estimate
from meshplan.specs.hardware import build_cluster, load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.step.channels import Collectives, Offload, Passes, pass_channels, step_channels, zero_counts
from meshplan.step.passes import hide

SD = 0.189


def test_one_pass_with_data_parallel_traffic_shows_its_arithmetic():
    # T = 10 s with H = 1 s of layer traffic hidden (T' = 10 - 0.189 = 9.811), K = 8 s of kernels, D = 12 s of DP
    # traffic: the pass lasts max(T', D) = 12 s plus the slowdown of 0.189 s for each second of compute that any
    # traffic overlaps, max(H, min(H + D, K)) = 8 s: X = 12 + 1.512 = 13.512 s, 3.512 s more than T
    dp, moved = pass_channels(10.0, 8.0, 1.0, 12.0, 0.0, 1.0, SD, True)
    assert moved == 0.0
    assert dp == pytest.approx((12 - 9.811) + SD * (8 - 1))
    assert dp == pytest.approx(3.512)
    # not overlapped: the collective runs after the pass, whole
    assert pass_channels(10.0, 8.0, 1.0, 12.0, 0.0, 1.0, SD, False) == (12.0, 0.0)


def test_a_single_channel_is_the_old_hide_rule():
    """With no layer traffic (H = 0, T = K) one channel costs what step.passes.hide charged before."""
    for d, k in ((3.0, 5.0), (5.0, 3.0), (0.5, 0.5)):
        assert pass_channels(k, k, 0.0, d, 0.0, 1.0, SD, True)[0] == pytest.approx(hide(d, k, SD))


def test_channels_on_different_links_run_at_the_same_time():
    """DP traffic (NIC) and offload copies (host link) beside one pass: the pass takes the longer of them, not the
    sum of their exposures (the old rule: hide(D, K) + max(0, O - s·K) = 2 + 2 = 4 s beyond K = 10 s)."""
    dp, moved = pass_channels(10.0, 10.0, 0.0, 12.0, 12.0, 1.0, SD, True)
    assert dp == pytest.approx(2 + SD * 10)  # the DP traffic alone: 2 s exposed, 10 s of compute slowed
    assert moved == 0.0  # the copies fit beside it on their own link
    # the copies may run only beside the offloaded half of the pass: their link is busy 12 + 0.5·10 = 17 s
    dp, moved = pass_channels(10.0, 10.0, 0.0, 12.0, 12.0, 0.5, SD, True)
    assert moved == pytest.approx(17 - 12)


def test_step_channels_count_each_zero_stage_s_passes():
    p = Passes(t_f=1.0, t_b=2.0, k_f=1.0, k_b=2.0, h_f=0.0, h_b=0.0)
    c = Collectives(all_reduce=5.0, gather=3.0, scatter=4.0)
    out = step_channels(p, 4, c, (0, 1, 2, 3), Offload(), SD, True)
    # ZeRO-0: one all-reduce beside the last backward: (5 - 2) + 0.189·2
    assert out[0] == (pytest.approx(3 + SD * 2), 0.0)
    # ZeRO-1: the gather beside the first forward, the reduce-scatter beside the last backward
    assert out[1][0] == pytest.approx((3 - 1 + SD * 1) + (4 - 2 + SD * 2))
    # ZeRO-2: the reduce-scatter beside each of the 4 backward passes
    assert out[2][0] == pytest.approx((3 - 1 + SD * 1) + 4 * (4 - 2 + SD * 2))
    # ZeRO-3: gather beside each forward, gather + scatter beside each backward
    assert out[3][0] == pytest.approx(4 * ((3 - 1 + SD * 1) + (7 - 2 + SD * 2)))


def test_the_per_op_table_counts_the_traffic_the_step_prices():
    """zero_counts (the per-op table's rows) reads the same ZERO_TRAFFIC as step_channels: with m = 4 micro-batches,
    ZeRO-2 reduce-scatters beside each of the 4 backwards and gathers once; ZeRO-3 gathers beside 4 forwards and 4
    backwards (8) and reduce-scatters beside the 4 backwards."""
    assert zero_counts(0, 4) == {"all_reduce": 1}
    assert zero_counts(1, 4) == {"scatter": 1, "gather": 1}
    assert zero_counts(2, 4) == {"scatter": 4, "gather": 1}
    assert zero_counts(3, 4) == {"gather": 8, "scatter": 4}
    # the step, with the collectives all exposed (no pass time, not overlapped): Σ count · seconds
    p, c = Passes(0.0, 0.0, 0.0, 0.0, 0.0, 0.0), Collectives(all_reduce=5.0, gather=3.0, scatter=4.0)
    priced = step_channels(p, 4, c, (0, 1, 2, 3), Offload(), SD, False)
    for zero in (0, 1, 2, 3):
        assert priced[zero][0] == sum(n * getattr(c, kind) for kind, n in zero_counts(zero, 4).items())


def _scaled(system: str, k: float = 1.0, **net: float):
    s = load_system(system)
    acc = replace(s.accelerator, peak_flops={p: v * k for p, v in s.accelerator.peak_flops.items()})
    return lambda n: build_cluster(s.name, acc, replace(s.network, **net), n)


@pytest.mark.parametrize("k", [2.0, 10.0])
def test_faster_gpus_never_lengthen_the_issue_34_step(k):
    """Issue 34's repro: ZeRO-3 with activation offload on 128 H800s read 12.05 s, 13.30 s with twice the FLOP/s
    (every overlapped channel was exposed at once as compute shrank). Now more FLOP/s is never slower."""
    model = load_model("llama3-8b")
    plan = Plan(dp=16, tp=8, global_batch=512, zero=3, recompute="none", offload_activations=True, precision="fp16",
                sequence_parallel=True, grad_bytes=4)
    base = estimate(model, _scaled("h800")(128), plan)
    faster = estimate(model, _scaled("h800", k)(128), plan)
    assert faster.step_time <= base.step_time
    assert faster.breakdown["compute"] < base.breakdown["compute"]


def test_slower_network_never_shortens_a_step():
    model = load_model("llama3-8b")
    plan = Plan(dp=16, tp=8, global_batch=512, zero=3, offload_activations=True, sequence_parallel=True)
    times = [estimate(model, _scaled("h100", nic_latency=lat)(128), plan).step_time for lat in (5e-6, 5e-5, 5e-4)]
    assert times == sorted(times)


def test_the_dp_groups_split_once_price_as_each_collective_alone():
    """dp_collectives prices a group's collectives from one split over the tiers (price.priced_on): each the same
    number, bit for bit, as collective_time splitting the group itself, for a batch's arrays and a plan's numbers,
    under NCCL and MPICH; a call for another group is priced as collective_time prices it."""
    import numpy as np  # noqa: PLC0415

    from meshplan.collectives.groups import axis_layout  # noqa: PLC0415
    from meshplan.collectives.price import LIBRARIES, collective_time, priced_on  # noqa: PLC0415
    from meshplan.search.batch import PlanBatch  # noqa: PLC0415
    from meshplan.specs.efficiency import DEFAULT  # noqa: PLC0415

    cluster = load_system("h100").cluster(1024)
    plans = [Plan(dp=dp, tp=tp, pp=pp, cp=cp, placement=placement)
             for dp, tp, pp, cp in ((128, 8, 1, 1), (32, 4, 8, 1), (16, 8, 4, 2), (256, 2, 2, 1))
             for placement in (("tp", "cp", "pp", "dp"), ("tp", "dp", "cp", "pp"))]
    for plan in (PlanBatch.of(plans), *plans):
        group, layout = plan.dp * plan.cp, axis_layout(plan, "dp")
        for name, library in LIBRARIES.items():
            price = priced_on(group, layout, cluster, DEFAULT, library)
            for kind in ("all_reduce", "all_gather", "reduce_scatter", "broadcast"):
                for nbytes in (2e9, 1e6 + 0 * plan.dp):
                    alone = collective_time(kind, nbytes, group, layout, cluster, DEFAULT, library)
                    assert np.array_equal(price(kind, nbytes, group), alone), (name, kind)
            other = plan.tp * 1
            assert np.array_equal(price("all_gather", 1e6, other), collective_time(
                "all_gather", 1e6, other, layout, cluster, DEFAULT, library))
