"""A calibrated 3-D mesh keeps every tier, and the fits' intercepts become the kernels' fixed overheads
(calibrate/system.py): synthetic records of a 2x2x2 mesh with a known α and bus bandwidth per dimension → system TOML
→ load_system → a Cluster whose tiers reproduce every record through comm.py; a negative or noisy intercept is
clipped to 0."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conftest import gpt, rates_only
from meshplan.calibrate import GemmSample, MemorySample, to_toml, write_system
from meshplan.calibrate.records import DIST_KINDS
from meshplan.collectives.price import collective_time
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from spaces import EVERY_PLAN
from test_calibrate import SIZES, collective_samples, synthetic

# per mesh dimension: (bus bandwidth, α per step): NVLink-like, a leaf, a slow spine
LINKS = {0: (200e9, 2e-6), 1: (40e9, 6e-6), 2: (8e9, 12e-6)}


def cube():
    """Records of a 2x2x2 mesh: every collective along every dimension at t = steps·α_d + f·n / busbw_d, plus NCCL's
    base latency beyond dimension 0 (test_calibrate.collective_samples)."""
    dist = [s for kind in DIST_KINDS for d, (bw, a) in LINKS.items() for s in collective_samples(kind, d, 2, bw, a)]
    return replace(synthetic(world=8, mesh=(2, 2, 2)), collective_samples=tuple(dist))


def test_a_2x2x2_calibration_round_trips_with_three_tiers(tmp_path):
    cal = cube()
    text = to_toml(cal)
    assert text.count("[[network.tiers]]") == 3 and 'size = "rest"' in text and "nic_bandwidth" not in text
    system = load_system(str(write_system(cal, tmp_path / "cube.toml")))
    cluster = system.cluster(8)
    assert cluster.mesh_shape == (2, 2, 2) and [t.name for t in cluster.tiers] == ["dim0", "dim1", "dim2"]
    for i, tier in enumerate(cluster.tiers):
        bandwidth, alpha = LINKS[i]
        # written as busbw / derating (0.8 for tier 0, 0.9 beyond), derated back by the model: 200, 40, 8 GB/s
        assert math.isclose(tier.bandwidth * DEFAULT.link(i), bandwidth, rel_tol=1e-9)
        assert math.isclose(tier.latency, alpha, rel_tol=1e-9)
    assert math.isclose(cluster.accelerator.nvlink_bandwidth, 200e9 / DEFAULT.nvlink, rel_tol=1e-9)  # tier 0's
    # a larger job grows the outermost dimension: 32 GPUs are 2 x 2 x 8
    assert system.cluster(32).mesh_shape == (2, 2, 8)


def test_the_loaded_mesh_reproduces_every_record():
    """comm.collective_time on the loaded cluster, for each record's collective along its dimension (a group of 2 at
    stride 2^d), gives the record's time: e.g. an all-reduce of 1 GiB along dimension 2 takes NCCL's 8.4 µs base
    latency + 2 · 12 µs + 2^30 / 8e9 = 134.2 ms."""
    cal = cube()
    cluster = load_system_text(to_toml(cal)).cluster(8)
    for s in cal.collective_samples:
        t = collective_time(s.kind, s.nbytes, 2, 2**s.dim, cluster, DEFAULT)
        assert math.isclose(t, s.seconds, rel_tol=1e-9), (s.kind, s.dim, s.nbytes)
    one = next(s for s in cal.collective_samples if (s.kind, s.dim, s.nbytes) == ("all_reduce", 2, SIZES[-1]))
    assert math.isclose(one.seconds, 8.4e-6 + 2 * 12e-6 + 2**30 / 8e9)


def load_system_text(text: str):
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "cal.toml"
        path.write_text(text)
        return load_system(str(path))


def test_a_calibrated_cube_searches_and_re_estimates():
    """The 3-tier calibrated system with its fitted overheads (8 µs per GEMM, 4 µs per other kernel): the search's
    top plan re-estimates to the same step time, and the overheads lengthen it."""
    system = load_system_text(to_toml(cube()))
    cluster = system.cluster(8)
    model = gpt(layers=2, hidden=512, heads=8, seq=512)
    result = search(model, cluster, Space(**EVERY_PLAN, global_batch=16), top_k=3, workers=1)
    top = result.plans[0]
    assert estimate(model, cluster, top.plan, top.stack).step_time == top.step_time
    bare = replace(cluster, accelerator=replace(cluster.accelerator, gemm_overhead=0.0, kernel_overhead=0.0))
    assert estimate(model, bare, top.plan, top.stack).step_time < top.step_time


def test_a_negative_or_noisy_intercept_is_clipped_to_zero():
    # large GEMMs only: t = −2 µs + 2mnk / 700e12 (positive times, a negative intercept); copies t = −1 µs + bytes / BW
    shapes = (4096, 8192, 16384)
    gemm = [GemmSample(m=s, n=s, k=s, precision="bf16", seconds=-2e-6 + 2 * s**3 / 700e12) for s in shapes]
    memory = [MemorySample(op="copy", nbytes=2 * n, seconds=-1e-6 + 2 * n / 2.8e12) for n in SIZES[3:]]
    cal = replace(synthetic(), gemm_samples=tuple(gemm), memory_samples=tuple(memory))
    text = to_toml(cal)
    # the fits are non-negative least squares (fit.nnls): the intercept is held at 0, never negative
    assert "gemm_overhead = 0.0  # bf16 GEMM fit intercept held at 0 by the non-negative fit" in text
    assert "kernel_overhead = 0.0  # copy fit intercept held at 0 by the non-negative fit" in text
    acc = load_system_text(text).accelerator
    best = 2 * 4096**3 / (-2e-6 + 2 * 4096**3 / 700e12)  # the best measured rate (at 4096³: 707 TFLOP/s) stands
    assert acc.gemm_overhead == 0.0 == acc.kernel_overhead and math.isclose(acc.peak_flops["bf16"], best)
    # a fit whose R² is below GOOD_FIT (0.9): its intercept is noise, not used
    noisy = [MemorySample(op="copy", nbytes=n, seconds=t) for n, t in ((1e6, 5e-3), (2e6, 1e-3), (4e6, 6e-3))]
    text = to_toml(replace(cal, memory_samples=tuple(noisy)))
    assert "kernel_overhead = 0.0  # copy fit R²" in text and "its intercept is noise, not used" in text


@pytest.mark.parametrize("dims", [(2, 2), (8,)])
def test_one_or_two_dimensions_keep_the_two_tier_form(dims):
    world = math.prod(dims)
    dist = [s for kind in DIST_KINDS for d, size in enumerate(dims) for s in collective_samples(kind, d, size,
                                                                                              *LINKS[d])]
    text = to_toml(replace(synthetic(), world_size=world, mesh=dims, collective_samples=tuple(dist)))
    assert "[[network.tiers]]" not in text and f"nvlink_domain = {dims[0]}" in text
    assert load_system_text(text).cluster(world).mesh_shape == (dims[0], world // dims[0])


def test_an_estimate_pays_each_kernels_overhead():
    """One GPU, no parallelism: nothing overlaps a kernel, so the step grows by exactly t0 per kernel it runs:
    gemm_overhead × (GEMM and attention kernels) + kernel_overhead × (the others, and the reduction after each GEMM
    whose output has fewer tiles than SMs and splits k: specs/gemm_shape.py), counted from the per-op table: a whole
    number of reductions, at most one a GEMM."""
    h100 = replace(load_system("h100").cluster(1), accelerator=rates_only("h100"))  # t0 = 0 to start from
    model, plan = gpt(layers=2, hidden=512, heads=8, seq=512), Plan(global_batch=4, micro_batch=2, recompute="none")
    base = estimate(model, h100, plan, Stack())  # the generic stack: no host time to hide the kernels' t0 behind
    slow = replace(h100, accelerator=replace(h100.accelerator, gemm_overhead=10e-6, kernel_overhead=3e-6))
    est = estimate(model, slow, plan, Stack())
    ops = [r for r in base.ops if r.phase != "step" and r.kind != "collective" and (r.flops > 0 or r.nbytes > 0)]
    tensor = sum(r.count for r in ops if r.kind in ("gemm", "attention"))
    other = sum(r.count for r in ops if r.kind not in ("gemm", "attention"))
    gemms = sum(r.count for r in ops if r.kind == "gemm")
    assert tensor > 0 and other > 0
    reductions = (est.step_time - base.step_time - 10e-6 * tensor - 3e-6 * other) / 3e-6
    assert abs(reductions - round(reductions)) < 1e-6 and 0 < round(reductions) <= gemms


def test_an_intercept_past_physics_is_not_a_fixed_cost():
    """Issue 48: a 15.1 ms per-kernel overhead passed on R² 0.964. GEMMs of 2048³ … 8192³ on a slow device timed as
    t = 15 ms + 2mnk / 1 TFLOP/s: a perfect line (R² 1), but 15 ms is 15× calibrate's bound on a fixed cost per call
    (fit.MAX_DISPATCH, 1 ms): held at 0, and the GEMMs run at the best rate measured."""
    shapes = (2048, 4096, 8192)
    gemm = [GemmSample(m=s, n=s, k=s, precision="bf16", seconds=15e-3 + 2 * s**3 / 1e12) for s in shapes]
    text = to_toml(replace(synthetic(), gemm_samples=tuple(gemm)))
    assert "gemm_overhead = 0.0  # bf16 GEMM fit intercept t0 = 1.5e+04 us is not below 1000 us" in text
    # a small fixed cost on fast kernels stays: 8 us beside kernels of 25 us and more
    fast = [GemmSample(m=s, n=s, k=s, precision="bf16", seconds=8e-6 + 2 * s**3 / 700e12) for s in (2048, 4096, 8192)]
    assert load_system_text(to_toml(replace(synthetic(), gemm_samples=tuple(fast)))).accelerator.gemm_overhead == \
        pytest.approx(8e-6)
