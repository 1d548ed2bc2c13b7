"""DeepEP's and HybridEP's exchange inside one NVLink domain (collectives/dispatch.py forwarded_time, nvlink_rate):
one copy a rank its experts hit, at the slower of the link and the backend's own measured kernel rate (Blackwell's
README rows; Hopper's link-bound), and an EP 64 group of GB300s inside its rack. Split from tests/test_dispatch.py."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.collectives.dispatch import forwarded_time, rank_copies
from meshplan.collectives.price import collective_time
from meshplan.specs.hardware import load_system
from test_dispatch import H100, SENT, E, K, a2a


def test_inside_one_node_forwarding_sends_one_copy_a_rank():
    """EP8 on one node: no network. The plain all-to-all sends 7/8 of its 470 MB of copies over NVLink at 360 GB/s;
    DeepEP and HybridEP send a token once to each of the 5.29 ranks its 8 experts hit (32 experts a rank), 7/8 of them
    other GPUs: 470 MB x 5.29/8 x 7/8 / 360 GB/s, 0.662 of the plain time beside the same 7 x 3 us of latency
    on Hopper both run at the link, 360 x 8/7 = 411 GB/s of rows: their kernels' rates (HybridEP 544, DeepEP 391 at
    Megatron-Core's 20 SMs) are Blackwell measurements, and DeepEP's README reads Hopper's 8 ranks link-bound (H800,
    24 SMs). On a B200 node DeepEP's 391 would bind below that link (0.696 of the plain time)."""
    cluster = H100.cluster(8)
    latency = 7 * 3e-6
    plain = collective_time("all_to_all", SENT, 8, 1, cluster)
    assert plain == pytest.approx(SENT * 7 / 8 / 360e9 + latency)
    for backend in ("hybridep", "deepep"):
        forwarded = forwarded_time(a2a(8, E, backend), 1, cluster)
        assert forwarded == pytest.approx(SENT * rank_copies(E, K, 32) / 8 / (360e9 * 8 / 7) + latency)
        assert (forwarded - latency) / (plain - latency) == pytest.approx(0.662, abs=1e-3)
    assert rank_copies(E, K, 32) / 8 * 360e9 * 8 / 7 / 391e9 == pytest.approx(0.696, abs=1e-3)


def test_deepeps_h800_intranode_rows_are_link_bound_as_priced():
    """DeepEP's README (@ 3b1045d, "Normal kernels"): H800 (NVLink ~160 GB/s), EP 8, 24 SMs, DeepSeek-V3's shapes:
    FP8 dispatch 153 and BF16 combine 158 GB/s of received rows (tests/test_intranode.py's nvl_recv_bytes), the
    link's, "Bottleneck bandwidth (NVLink)". meshplan prices Hopper's exchange at its link, 200 x 0.8 = 160 GB/s of
    which 7/8 of the rows go to another GPU: 160 x 8/7 = 182.9 GB/s of rows, 1.19 / 1.16 x the README's (meshplan
    too fast here by the link's priced reach, not by a kernel cap)."""
    cluster = load_system("h800").cluster(8)
    forwarded = forwarded_time(a2a(8, E, "deepep"), 1, cluster) - 7 * cluster.tiers[0].latency
    rows = SENT * rank_copies(E, K, 32) / K
    assert rows / forwarded == pytest.approx(160e9 * 8 / 7)
    assert rows / forwarded / 153e9 == pytest.approx(1.195, abs=1e-3)
    assert rows / forwarded / 158e9 == pytest.approx(1.157, abs=1e-3)


def test_a_backends_intra_node_kernel_rate_is_interpolated_in_log2_ranks():
    """HybridEP's GB200 points (16 SMs, BF16 dispatch / combine averaged): 8 ranks (550.10 + 538.44) / 2 = 544.27
    GB/s, 16 ranks (472.84 + 474.48) / 2 = 473.66; 12 ranks between them at log2(1.5) of the way; below 8 and above
    36 the nearest (64 ranks of an NVL72 rack: 444.115). DeepEP's one point, B200 8 ranks at Megatron-Core's 20 SMs
    (moe_deepep_num_sms), halfway between the 16- and 24-SM rows: ((348 + 494) / 2 + (302 + 420) / 2) / 2 = 391 GB/s,
    at every size. All are Blackwell's; on any other architecture (or an unstated one) no kernel rate binds."""
    from meshplan.collectives.dispatch import nvlink_rate

    def rate(ranks, backend):
        return nvlink_rate(ranks, backend, "blackwell")

    assert rate(8, "hybridep") == pytest.approx((550.10 + 538.44) / 2 * 1e9)
    assert rate(16, "hybridep") == pytest.approx((472.84 + 474.48) / 2 * 1e9)
    assert rate(12, "hybridep") == pytest.approx((544.27 + (473.66 - 544.27) * np.log2(1.5)) * 1e9)
    assert rate(64, "hybridep") == rate(36, "hybridep") == pytest.approx(444.115e9)
    assert rate(4, "hybridep") == rate(8, "hybridep")
    deepep = ((348 + 494) / 2 + (302 + 420) / 2) / 2 * 1e9  # 391 GB/s
    assert rate(8, "deepep") == rate(64, "deepep") == pytest.approx(deepep)
    assert list(rate(np.array([8.0, 64.0]), "hybridep")) == pytest.approx([544.27e9, 444.115e9])
    for backend in ("deepep", "hybridep", "hybridep-32sm"):
        assert nvlink_rate(8, backend, "hopper") == nvlink_rate(8, backend, "") == np.inf


def test_every_backends_nvlink_points_name_known_architectures():
    from meshplan.specs.architectures import ARCHITECTURES
    from meshplan.specs.stack_variants import STACK_CHOICES

    for record in STACK_CHOICES["flex_backend"].values():
        assert record.nvlink_on and set(record.nvlink_on) <= set(ARCHITECTURES), record.name


def test_ep64_on_gb300_stays_in_one_nvlink_domain_at_hybrideps_36_rank_rate():
    """Issue 79: 256 GB300s are 4 NVLink domains of 64 (the NVL72 rack, nvlink_domain 72, holds 64 of a 256-GPU job:
    meshplan_validation.map_system's largest divisor of the GPU count within one domain),
    so an EP 64 group never leaves its rack, which HybridEP runs as one node (csrc/hybrid_ep/config.cuh @ 94a9f8f:
    MAX_NUM_OF_RANKS_PER_NODE 72). The README measures up to 36 ranks; at 64 the 36-rank point holds (32 SMs: (479.02
    + 447.89) / 2 = 463.455 GB/s of rows), no network tier is crossed, and the time is the rows over that rate."""
    from meshplan.collectives.dispatch import nvlink_rate
    from meshplan_validation.map_system import map_cluster

    assert load_system("gb300").network.nvlink_domain == 72
    cluster, _ = map_cluster({"gpu": "GB300", "num_gpus": 256, "gpus_per_node": 4})
    assert cluster.mesh_shape == (64, 4)
    rows = SENT * rank_copies(E, K, E / 64) / K
    forwarded = forwarded_time(a2a(64, E, "hybridep-32sm"), 1, cluster)
    assert nvlink_rate(64, "hybridep-32sm", cluster.accelerator.architecture) == pytest.approx(463.455e9)
    assert forwarded == pytest.approx(rows / 463.455e9 + 63 * cluster.tiers[0].latency)


def test_inside_a_b200_node_the_backends_kernel_not_nvlink_sets_the_rate():
    """EP8 on one B200 node (NVLink 900 GB/s x 0.8 = 720): 5.29 rows a token over the 8 ranks, 7/8 of them on the
    link, would take 470 MB x 5.29/8 x 7/8 / 720 GB/s = 0.378 ms; HybridEP's kernels move the rows at 544.27 GB/s,
    470 MB x 5.29/8 / 544.27 GB/s = 0.572 ms, DeepEP's at 391 (20 SMs): 0.796 ms; the H100 node's link (360 GB/s,
    0.756 ms) is slower than HybridEP's kernels, which leaves it unchanged."""
    from meshplan.collectives.dispatch import nvlink_rate

    cluster = load_system("b200").cluster(8)
    latency = 7 * cluster.tiers[0].latency
    rows = SENT * rank_copies(E, K, 32) / 8
    assert rows * 7 / 8 / 720e9 == pytest.approx(0.378e-3, abs=1e-6)
    for backend, ms in (("hybridep", 0.572), ("deepep", 0.796)):
        forwarded = forwarded_time(a2a(8, E, backend), 1, cluster)
        assert forwarded == pytest.approx(rows / nvlink_rate(8, backend, "blackwell") + latency)
        assert forwarded - latency == pytest.approx(ms * 1e-3, abs=1e-6)
    h100 = forwarded_time(a2a(8, E, "hybridep"), 1, H100.cluster(8))
    assert h100 == pytest.approx(rows * 7 / 8 / 360e9 + 7 * 3e-6)
