"""NCCL's protocol model inside tier 0 (protocols.py), by hand: the steps and bandwidth shares of each collective,
RCCL's own tuner on an MI300X node, and how a calibrated tier 0 keeps the α calibrate fitted (calibrate/system.py
writes nccl_protocols = false)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.calibrate import to_toml, write_system
from meshplan.collectives.allreduce import tp_all_reduce
from meshplan.collectives.price import collective_time
from meshplan.collectives.protocols import library, nccl_steps, nccl_time, protocol_times
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.units import KiB
from test_calibrate import close, synthetic


def test_each_collective_at_nccls_steps_and_shares():
    """8 ranks at 100 GB/s of bus bandwidth (NCCL v2.12.12-1 tuning.cc): (LL, LL128, Simple) of 8 KB."""
    n, bw = 8e3, 100e9
    assert [nccl_steps(k, 8) for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce")] == [
        14, 7, 7, 8, 8]
    # all-reduce: LL 3.6 + 14·0.47 µs + 1.75·n / 25 GB/s; LL128 10 + 14·1.9 µs + 1.75·n / 92 GB/s; Simple 8.4 + 14·3.4
    ll, ll128, simple = protocol_times("all_reduce", n, 8, bw)
    assert ll == pytest.approx(10.18e-6 + 0.56e-6) and ll128 == pytest.approx(36.6e-6 + 1.75 * n / 92e9)
    assert simple == pytest.approx(56e-6 + 0.14e-6) and nccl_time("all_reduce", n, 8, bw) == ll
    # all-gather: 7 steps, LL at a third of the bus bandwidth on one node: 3.6 + 3.29 µs + 0.875·n / 33.3 GB/s
    assert protocol_times("all_gather", n, 8, bw)[0] == pytest.approx(6.89e-6 + 0.875 * n * 3 / bw)
    # broadcast: 8 steps of the whole message (bus factor 1), LL at a third; reduce at a quarter
    assert protocol_times("broadcast", n, 8, bw)[0] == pytest.approx(7.36e-6 + 3 * n / bw)
    assert protocol_times("reduce", n, 8, bw)[0] == pytest.approx(7.36e-6 + 4 * n / bw)
    assert nccl_time("all_reduce", n, 1, bw) == 0.0  # a group of one
    with pytest.raises(ValueError, match="all_to_all"):
        nccl_steps("all_to_all", 8)


def test_an_mi300x_node_runs_rccls_tuner_and_an_h100_node_ncclss():
    """RCCL's tuning_model_5 for 8 x MI300X (ROCm/rccl tuning.cc): ring LL 12 µs + 0.8 µs a step at 0.08 of the bus,
    Simple 17 µs + 2.1 µs a step at the whole bus, no LL128. 8 ranks, 8 KB, 100 GB/s of bus bandwidth."""
    n, bw = 8e3, 100e9
    assert [library(a) for a in ("cdna3", "hopper", "cdna4", "")] == ["rccl-gfx942", "nccl", "nccl", "nccl"]
    ll, simple = protocol_times("all_reduce", n, 8, bw, tuner="rccl-gfx942")
    assert ll == pytest.approx(12e-6 + 14 * 0.8e-6 + 1.75 * n / (0.08 * bw))
    assert simple == pytest.approx(17e-6 + 14 * 2.1e-6 + 1.75 * n / bw)
    # 12 + 11.2 + 1.75 µs
    assert nccl_time("all_reduce", n, 8, bw, tuner="rccl-gfx942") == ll == pytest.approx(24.95e-6)
    # the same tuner for every kind (no one-node LL refinement of NCCL's): an all-gather's 7 steps at 0.08
    assert protocol_times("all_gather", n, 8, bw, tuner="rccl-gfx942")[0] == pytest.approx(
        12e-6 + 7 * 0.8e-6 + 0.875 * n / (0.08 * bw))
    # decode's all-reduces on the presets: an MI300X tp-8 all-reduce of 8 KB costs RCCL's 23 µs or more, more than
    # twice NCCL's model of the same ring; an H100's keeps NCCL's protocols under the engines' measured kernel
    mi, h = load_system("mi300x").cluster(8), load_system("h100").cluster(8)
    t_mi = tp_all_reduce(8192, 8, [8], mi, DEFAULT, custom=False)
    assert t_mi >= 12e-6 + 14 * 0.8e-6 and t_mi > 2 * nccl_time("all_reduce", 8192, 8, 448e9)
    assert tp_all_reduce(8192, 8, [8], h, DEFAULT, custom=False) < 12e-6
    # more bytes never take less time, on either tuner
    sizes = [2.0 ** k for k in range(6, 31)]
    for tuner in ("nccl", "rccl-gfx942"):
        times = [nccl_time("all_reduce", x, 8, bw, tuner=tuner) for x in sizes]
        assert all(b >= a for a, b in zip(times, times[1:], strict=False))


def test_a_calibrated_tier_0_keeps_its_fitted_alpha_where_a_preset_takes_nccls_protocols(tmp_path):
    """calibrate writes nccl_protocols = false with the α it fitted inside dimension 0 (calibrate/system.py), and the
    loaded cluster prices tier 0's collectives at that α (protocols.py): an 8-rank all-reduce of 4 KiB reads
    2·7·3 µs + 1.75 · 4096 / 360 GB/s = 42.02 µs, the measured line, not NCCL's LL (3.6 + 14·0.47 µs + 4 · 1.75 · 4096
    / 360 GB/s = 10.26 µs); the h100 preset, whose 3 µs is no measurement, takes NCCL's protocols."""
    text = to_toml(synthetic())
    assert "nccl_protocols = false" in text
    cluster = load_system(str(write_system(synthetic(), tmp_path / "node.toml"))).cluster(64)
    assert not cluster.nccl_protocols and close(cluster.tiers[0].latency, 3e-6)
    n = 4 * KiB
    fitted = 2 * 7 * 3e-6 + 1.75 * n / 360e9
    assert close(float(collective_time("all_reduce", n, 8, 1, cluster)), fitted)
    assert close(float(collective_time("all_gather", n, 8, 1, cluster)), 7 * 3e-6 + 0.875 * n / 360e9)
    # the same link with NCCL's constants (a preset): LL wins at 4 KiB
    preset = replace(cluster, nccl_protocols=True)
    assert close(float(collective_time("all_reduce", n, 8, 1, preset)), 3.6e-6 + 14 * 0.47e-6 + 4 * 1.75 * n / 360e9)
    assert load_system("h100").cluster(8).nccl_protocols
    # a slower calibrated α per step slows every tier-0 collective it prices
    slow = replace(cluster, tiers=(replace(cluster.tiers[0], latency=6e-6), cluster.tiers[1]))
    assert float(collective_time("all_reduce", n, 8, 1, slow)) > fitted
