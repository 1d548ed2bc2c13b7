"""Calibration: least-squares fits recover known α / β / F / BW exactly, mesh discovery finds planted tiers, a
calibration round-trips through a hardware TOML into the model, and a real (tiny) run works on CPU with gloo.

Synthetic numbers are H100-node-like: NVLink bus bandwidth 360 GB/s with α = 3 µs per step inside 8-GPU domains,
45 GB/s with α = 5 µs between them (efficiency.py: nccl-tests busbw; presets: NCCL's tuning-model latencies)."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace

import numpy as np
import pytest

from conftest import gpt
from meshplan.calibrate import (
    Calibration,
    CollectiveSample,
    GemmSample,
    MemorySample,
    PairSample,
    discover_mesh,
    fit_collectives,
    fit_gemm,
    fit_memory,
    linear_fit,
    pair_matrices,
    parse_mesh,
    to_toml,
    write_system,
)
from meshplan.calibrate.bench import require_torch
from meshplan.calibrate.collectives import mesh_groups, round_robin
from meshplan.calibrate.fit import summarize_dims
from meshplan.calibrate.records import DIST_KINDS
from meshplan.cli import main
from meshplan.collectives.comm import BASE_LATENCY_KINDS, SIMPLE_BASE, bus_factor, latency_steps
from meshplan.collectives.price import collective_time
from meshplan.errors import MissingDependency, SpecError
from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster, Tier, load_system
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack
from meshplan.units import GiB, KiB, MiB

SIZES = (4 * KiB, 64 * KiB, 1 * MiB, 16 * MiB, 256 * MiB, 1 * GiB)
NVLINK = (360e9, 3e-6)  # bus bandwidth, α per step
NETWORK = (45e9, 5e-6)


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel)


# ---- fits ---------------------------------------------------------------------------------------------------
def test_linear_fit_recovers_alpha_and_beta():
    alpha, beta = 5e-6, 1 / 50e9
    # 1 GiB: 5 µs + 2^30 / 50e9 = 5 µs + 21.47 ms; 4 KiB: 5 µs + 82 ns
    fit = linear_fit(SIZES, [alpha + n * beta for n in SIZES])
    assert close(fit.intercept, 5e-6) and close(fit.slope, 1 / 50e9) and close(fit.r2, 1.0)
    assert fit.points == 6


def test_linear_fit_rejects_one_size():
    with pytest.raises(SpecError, match="two distinct sizes"):
        linear_fit([4096, 4096], [1e-5, 1.1e-5])


def collective_samples(kind: str, dim: int, group: int, bandwidth: float, step: float) -> list[CollectiveSample]:
    """t = base + steps·α + f·n / busbw (comm.py's ring formulas; base: comm.base_latency beyond dimension 0)."""
    base = SIMPLE_BASE if dim > 0 and kind in BASE_LATENCY_KINDS else 0.0
    return [CollectiveSample(kind=kind, dim=dim, group=group, nbytes=n, seconds=base + latency_steps(kind, group) * step
                             + bus_factor(kind, group) * n / bandwidth) for n in SIZES]


def test_collective_fits_recover_busbw_and_alpha_per_dimension():
    samples = []
    for kind in DIST_KINDS:
        samples += collective_samples(kind, 0, 8, *NVLINK) + collective_samples(kind, 1, 2, *NETWORK)
    fits = fit_collectives(samples)
    assert [(f.dim, f.kind) for f in fits] == [(d, k) for d in (0, 1) for k in DIST_KINDS]
    for f in fits:
        bandwidth, step = NVLINK if f.dim == 0 else NETWORK
        assert close(f.bandwidth, bandwidth) and close(f.step_latency, step) and not f.bound
    all_reduce = fits[0]
    # ring all-reduce on 8 ranks: 2·(8−1) = 14 steps × 3 µs = 42 µs; f = 2·7/8 = 1.75
    assert close(all_reduce.latency, 42e-6)
    assert close(all_reduce.bandwidth, 360e9)
    tiers = summarize_dims(fits)
    assert [(t.dim, t.group) for t in tiers] == [(0, 8), (1, 2)]
    assert close(tiers[0].bandwidth, 360e9) and close(tiers[1].latency, 5e-6)


def test_fit_inverts_comm_py():
    """Times from price.collective_time on a calibrated cluster (tier 0 at its α, protocols.py): the fit returns it."""
    acc = load_system("h100").accelerator
    cluster = Cluster(name="t", accelerator=acc, num_gpus=16, nccl_protocols=False, tiers=(
        Tier(name="nvlink", size=8, bandwidth=NVLINK[0], latency=NVLINK[1]),
        Tier(name="network", size=2, bandwidth=NETWORK[0], latency=NETWORK[1])))
    ideal = Efficiency(nvlink=1.0, network=1.0)
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):  # (p2p in a group of 8 is a chain)
        inner = [CollectiveSample(kind=kind, dim=0, group=8, nbytes=n,
                                  seconds=float(collective_time(kind, n, 8, 1, cluster, ideal))) for n in SIZES]
        (fit,) = fit_collectives(inner)
        assert close(fit.bandwidth, NVLINK[0]) and close(fit.step_latency, NVLINK[1]), kind


def test_latency_bound_series_reports_a_lower_bound():
    # every size takes 1 ms: no slope; busbw ≥ the best n·f / t = 1 GiB · 1 / 1 ms
    samples = [CollectiveSample(kind="p2p", dim=0, group=2, nbytes=n, seconds=1e-3) for n in SIZES]
    (fit,) = fit_collectives(samples)
    assert fit.bound and close(fit.bandwidth, GiB / 1e-3)


def test_gemm_fit_recovers_rate_overhead_and_efficiency():
    rate, t0 = 700e12, 8e-6
    shapes = [(1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (16384, 4096, 4096)]
    samples = [GemmSample(m=m, n=n, k=k, precision="bf16", seconds=t0 + 2 * m * n * k / rate) for m, n, k in shapes]
    (fit,) = fit_gemm(samples, {"bf16": 989e12})
    assert close(fit.rate, 700e12) and close(fit.overhead, 8e-6)
    # best: 8192³: 2·8192³ = 1.0995e12 FLOP in 8 µs + 1.5708 ms = 1.5788 ms → 696.5 TFLOP/s
    best = 2 * 8192**3 / (8e-6 + 2 * 8192**3 / 700e12)
    assert fit.best_shape == (8192, 8192, 8192) and close(fit.best, best)
    assert close(fit.efficiency, best / 989e12)  # 0.7042
    small = fit.shape_efficiency()[0]  # 1024³: 2.147e9 FLOP in 8 µs + 3.07 µs → 194 TFLOP/s, 19.6 %
    assert close(small[3], 2 * 1024**3 / (8e-6 + 2 * 1024**3 / 700e12) / 989e12)


def test_memory_fit_recovers_bandwidth():
    bandwidth, t0 = 2.8e12, 4e-6
    samples = [MemorySample(op=op, nbytes=f * n, seconds=t0 + f * n / bandwidth)
               for op, f in (("add", 3), ("copy", 2)) for n in SIZES]
    fits = fit_memory(samples)
    assert [f.op for f in fits] == ["copy", "add"]
    assert all(close(f.bandwidth, 2.8e12) and close(f.overhead, 4e-6) for f in fits)


# ---- mesh discovery -----------------------------------------------------------------------------------------
def two_domains(noise: float = 0.0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """16 ranks, two NVLink domains of 8: 400 GB/s inside, 50 GB/s across (× 1 ± noise)."""
    rng = np.random.default_rng(seed)
    domain = np.arange(16) // 8
    same = domain[:, None] == domain[None, :]
    bw = np.where(same, 400e9, 50e9) * (1 + noise * rng.uniform(-1, 1, (16, 16)))
    lat = np.where(same, 3e-6, 5e-6)
    return bw, lat


def test_two_domains_of_eight():
    guess = discover_mesh(*two_domains())
    assert guess.shape == (8, 2) and (guess.domain_size, guess.num_domains) == (8, 2)
    assert guess.domains == (tuple(range(8)), tuple(range(8, 16))) and guess.contiguous
    inner, outer = guess.tiers
    # pairs: inside 2 · C(8,2) = 56, across 8 · 8 = 64; 56 + 64 = C(16,2) = 120
    assert (inner.pairs, outer.pairs) == (56, 64)
    assert (inner.bandwidth, inner.latency, outer.bandwidth, outer.latency) == (400e9, 3e-6, 50e9, 5e-6)


def test_noise_within_tiers_does_not_split_them():
    # ±20 %: inside 320-480, across 40-60 GB/s; the only gap ≥ 2× is between the tiers (320 / 60 = 5.3)
    assert discover_mesh(two_domains(noise=0.2)[0]).shape == (8, 2)


def test_three_tiers():
    # 16 ranks: 4 GPUs per PCIe switch (100 GB/s), 2 switches per node (40 GB/s), 2 nodes (10 GB/s)
    r = np.arange(16)
    bw = np.where(r[:, None] // 4 == r[None, :] // 4, 100e9, np.where(r[:, None] // 8 == r[None, :] // 8, 40e9, 10e9))
    guess = discover_mesh(bw)
    assert guess.shape == (4, 2, 2) and math.prod(guess.shape) == 16
    assert [t.bandwidth for t in guess.tiers] == [100e9, 40e9, 10e9]


def test_uniform_and_unequal_groups_give_one_tier():
    assert discover_mesh(np.full((4, 4), 1e9)).shape == (4,)
    lopsided = np.full((8, 8), 10e9)
    lopsided[:5, :5] = 100e9  # a 5 + 3 split is no mesh: that cut is skipped
    assert discover_mesh(lopsided).shape == (8,)
    assert discover_mesh([[0.0]]).shape == (1,)


def test_scattered_domains_are_reordered():
    perm = np.random.default_rng(1).permutation(16)
    bw = two_domains()[0][np.ix_(perm, perm)]  # rank i is old rank perm[i]
    guess = discover_mesh(bw)
    assert guess.shape == (8, 2) and not guess.contiguous
    first = {int(i) for i in np.flatnonzero(perm < 8)}  # the new names of old ranks 0-7
    rest = set(range(16)) - first
    assert sorted(map(sorted, guess.domains)) == sorted([sorted(first), sorted(rest)])
    assert set(guess.order[:8]) in (first, rest) and sorted(guess.order) == list(range(16))


def test_pair_fits_feed_discovery():
    # per pair t = α + n / B: the ping-pong records of the two-domain machine, at two sizes each
    samples = []
    for i in range(16):
        for j in range(i + 1, 16):
            b, a = (400e9, 3e-6) if i // 8 == j // 8 else (50e9, 5e-6)
            samples += [PairSample(src=i, dst=j, nbytes=n, seconds=a + n / b) for n in (4 * KiB, 16 * MiB)]
    bw, lat = pair_matrices(samples, 16)
    assert close(bw[0, 7], 400e9) and close(bw[7, 8], 50e9) and close(lat[3, 12], 5e-6)
    assert discover_mesh(bw, lat).shape == (8, 2)
    with pytest.raises(SpecError, match=r"rank pair \(0, 1\)"):
        pair_matrices(samples[2:], 16)


def test_round_robin_and_mesh_groups():
    for world in (2, 3, 4, 5, 8):
        rounds = round_robin(world)
        pairs = [(a, b) for partners in rounds for a, b in partners.items() if a < b]
        assert sorted(pairs) == [(a, b) for a in range(world) for b in range(a + 1, world)]  # each pair once
        assert len(rounds) == world - 1 + world % 2
    assert mesh_groups((2, 2), (0, 1, 2, 3), 0) == [[0, 1], [2, 3]]
    assert mesh_groups((2, 2), (0, 1, 2, 3), 1) == [[0, 2], [1, 3]]
    assert mesh_groups((2, 3), (5, 4, 3, 2, 1, 0), 1) == [[5, 3, 1], [4, 2, 0]]


def test_parse_mesh():
    assert parse_mesh("2x4", 8) == (2, 4) and parse_mesh("8", None) == (8,) and parse_mesh(None, 4) is None
    for text, world, message in (("3x3", 4, "mesh='3x3' = 9 ranks does not equal world-size=4"),
                                 ("2xa", 4, "mesh='2xa' must be sizes like 2x4"),
                                 ("0x4", None, "mesh='0x4' must be positive"),
                                 ("2x2", 0, "world-size=0 must be a positive integer")):
        with pytest.raises(SpecError, match=message):
            parse_mesh(text, world)


# ---- a calibration as a hardware TOML -------------------------------------------------------------------------
def synthetic(world: int = 16, mesh: tuple[int, ...] = (8, 2)) -> Calibration:
    gemm = [GemmSample(m=s, n=s, k=s, precision=p, seconds=8e-6 + 2 * s**3 / rate)
            for p, rate in (("bf16", 700e12), ("fp32", 50e12)) for s in (1024, 4096, 8192)]
    memory = [MemorySample(op="copy", nbytes=2 * n, seconds=4e-6 + 2 * n / 2.8e12) for n in SIZES]
    dist = []
    for kind in DIST_KINDS:
        dist += collective_samples(kind, 0, mesh[0], *NVLINK) + collective_samples(kind, 1, mesh[1], *NETWORK)
    return Calibration(host="node0", date="2025-01-31", device="cuda", device_name="NVIDIA H100 80GB HBM3",
                       memory_bytes=81559 * MiB, num_sms=132, backend="nccl", world_size=world, mesh=mesh,
                       gemm_samples=tuple(gemm), memory_samples=tuple(memory), collective_samples=tuple(dist))


def test_toml_round_trip_reproduces_the_measurements(tmp_path):
    cal = synthetic()
    path = write_system(cal, tmp_path / "node.toml")
    system = load_system(str(path))
    assert system.source == "calibrated on node0 2025-01-31 by meshplan calibrate"
    cluster = system.cluster(64)
    acc, (nvlink, network) = cluster.accelerator, cluster.tiers
    assert (nvlink.size, network.size) == (8, 8)  # 64 GPUs = 8 domains of 8
    # the model derates the written figures by efficiency.py's factors and gets the measured ones back
    assert close(nvlink.bandwidth * DEFAULT.nvlink, 360e9) and close(nvlink.latency, 3e-6)
    assert close(network.bandwidth * DEFAULT.network, 45e9) and close(network.latency, 5e-6)
    assert close(acc.hbm_bandwidth * DEFAULT.memory, 2.8e12)  # 2.8e12 / 0.85 = 3.294e12 written
    # the fits' intercepts are the kernels' fixed overheads (t = t0 + 2mnk / F, t = t0 + bytes / BW), so the GEMM
    # rate written is the fit's asymptotic F, not the best measured (696 TFLOP/s at 8192³, which holds t0 once)
    assert close(acc.gemm_overhead, 8e-6) and close(acc.kernel_overhead, 4e-6)
    assert close(acc.peak_flops["bf16"], 700e12) and acc.matmul_bf16 == 1.0  # no datasheet: peak = MAMF
    assert close(acc.peak_flops["fp32"], 50e12)
    assert acc.hbm_bytes == 81559 * MiB and acc.num_sms == 132
    est = estimate(gpt(), cluster, Plan(dp=8, tp=8, global_batch=64, sequence_parallel=True))
    assert est.step_time > 0 and est.fits


def test_toml_with_a_base_keeps_the_datasheet(tmp_path):
    h100 = load_system("h100")
    cal = replace(synthetic(), peaks={"bf16": 989e12})
    (tmp_path / "node.toml").write_text(to_toml(cal, h100))
    acc = load_system(str(tmp_path / "node.toml")).accelerator
    assert acc.peak_flops == h100.accelerator.peak_flops and acc.tdp_watts == 700 == acc.matmul_watts
    assert close(acc.matmul_bf16, 700e12 / 989e12)  # the fit's F beside its t0: 700 / 989 = 0.708
    assert DEFAULT.clock(acc) == 1.0 and acc.matmul_fp8 == h100.accelerator.matmul_fp8


def test_single_domain_without_base(tmp_path):
    # one tier measured: the network tier repeats it (a job inside the domain never uses it)
    one = replace(synthetic(), world_size=8, mesh=(8,), collective_samples=tuple(
        s for kind in DIST_KINDS for s in collective_samples(kind, 0, 8, *NVLINK)))
    system = load_system(str(write_system(one, tmp_path / "one.toml")))
    assert system.cluster(8).mesh_shape == (8, 1) and system.network.nvlink_domain == 8
    lone = replace(one, world_size=1, mesh=(1,), collective_samples=())
    with pytest.raises(SpecError, match="measured no links"):
        to_toml(lone)
    with pytest.raises(SpecError, match="must end in .toml"):
        write_system(one, tmp_path / "one.json")
    with pytest.raises(SpecError, match="mesh=4x2 = 8 ranks does not equal world-size=16"):
        replace(one, world_size=16, mesh=(4, 2))


def test_to_dict_is_json():
    data = json.loads(json.dumps(synthetic().to_dict()))
    assert data["mesh"] == [8, 2] and len(data["links"]) == 2 * len(DIST_KINDS)
    assert math.isclose(data["tiers"][0]["bandwidth"], 360e9) and data["discovered"] is None


# ---- real runs on CPU with gloo ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured():
    pytest.importorskip("torch")
    from meshplan.calibrate import calibrate

    return calibrate(world_size=4, mesh=(2, 2), quick=True, device="cpu", base=load_system("h100"))


def test_real_microbenchmarks_on_cpu(measured, tmp_path):
    cal = measured
    assert (cal.backend, cal.world_size, cal.mesh) == ("gloo", 4, (2, 2))
    assert len(cal.gemm_samples) == 4 * 2 and all(s.seconds > 0 for s in cal.gemm_samples)  # 4 shapes × 2 precisions
    assert {f.precision for f in cal.gemm} == {"bf16", "fp32"} and cal.gemm[0].peak == 989e12
    assert {f.op for f in cal.memory} == {"copy", "add", "layernorm"} and all(f.best > 0 for f in cal.memory)
    # causal attention: 3 sequence lengths × head dimensions 64 and 128, at bf16 (settings.attention_shapes)
    assert len(cal.attention_samples) == 6 and cal.attention.precision == "bf16" and cal.attention.rate > 0
    # 2 dimensions × 5 collectives × 3 sizes; the fits: one per (dimension, collective)
    assert len(cal.collective_samples) == 2 * 5 * 3 and len(cal.links) == 2 * 5
    assert all(f.bandwidth > 0 and f.latency >= 0 for f in cal.links)
    assert len(cal.pair_samples) == 6 * 2  # C(4, 2) = 6 pairs × 2 sizes
    guess = cal.discovered
    assert math.prod(guess.shape) == 4 and sorted(guess.order) == [0, 1, 2, 3]
    system = load_system(str(write_system(cal, tmp_path / "cpu.toml", load_system("h100"))))
    assert system.cluster(4).mesh_shape == (2, 2)
    assert system.accelerator.attention_flops in (cal.attention.rate, cal.attention.best)
    # host dispatch: 4 calls (add, layer_norm, linear, nn.Linear module) × 3 sizes, one fit each (dispatch.py)
    assert len(cal.dispatch_samples) == 4 * 3 and [f.op for f in cal.dispatch][-1] == "module"


def test_real_discovery_with_an_odd_world():
    pytest.importorskip("torch")
    from meshplan.calibrate.collectives import measure_distributed
    from meshplan.calibrate.settings import settings_for

    result = measure_distributed(world_size=3, settings=settings_for("cpu", quick=True), device="cpu")
    assert math.prod(result.mesh) == 3 and sorted(result.order) == [0, 1, 2]
    assert len(result.pairs) == 3 * 2  # C(3, 2) = 3 pairs, one idle rank per round


def test_cli_calibrate_json_and_out(capsys, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "me.toml"
    stack = tmp_path / "me-stack.toml"
    code = main(["calibrate", "--quick", "--world-size", "2", "--json", "--out", str(out), "--stack-out", str(stack),
                 "--stack-base", "torchtitan"])
    stdout, err = capsys.readouterr()
    assert code == 0, err
    data = json.loads(stdout)
    assert data["world_size"] == 2 and math.prod(data["mesh"]) == 2 and data["backend"] == "gloo"
    assert math.prod(data["discovered"]["shape"]) == 2 and data["gemm"] and data["links"]
    assert load_system(str(out)).cluster(2).num_gpus == 2
    written = load_stack(str(stack))  # torchtitan's fields, host_dispatch the median t0 of the bare calls
    bare = sorted(f["overhead"] for f in data["dispatch"] if f["op"] != "module")
    assert written.host_dispatch == bare[1] and 0 < written.host_dispatch < 1e-3 and written.fusion == "eager"


@pytest.mark.parametrize(("args", "message"), [
    (["--mesh", "3x3", "--world-size", "4"], "mesh='3x3' = 9 ranks does not equal world-size=4"),
    (["--mesh", "2xa"], "mesh='2xa' must be sizes like 2x4"),
    (["--world-size", "0"], "world-size=0 must be a positive integer"),
    (["--quick", "--out", "me.json"], "out='me.json' must end in .toml"),
    (["--quick", "--out", "/nonexistent-dir/sys.toml"], "directory '/nonexistent-dir' does not exist"),
    (["--quick", "--base", "nosuch"], "base='nosuch' is not a preset"),
])
def test_cli_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code = main(["calibrate", *args])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_missing_torch_names_the_install_command(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch → ImportError
    with pytest.raises(MissingDependency, match=r"pip install 'meshplan\[torch\]'"):
        require_torch()
    assert main(["calibrate", "--quick"]) == 2
    assert "pip install 'meshplan[torch]'" in capsys.readouterr().err


def test_accelerator_needs_a_half_precision_gemm():
    cal = synthetic()
    cal = replace(cal, gemm_samples=tuple(s for s in cal.gemm_samples if s.precision == "fp32"))
    with pytest.raises(SpecError, match="no bf16 or fp16 GEMM"):
        to_toml(cal)


def test_settings_shaped_like_a_traced_step():
    """calibrate --model: the GEMM shapes, element-wise sizes and gradient sizes of the model's own step."""
    torch = pytest.importorskip("torch")
    from meshplan.calibrate.settings import Settings, settings_for, settings_for_trace
    from meshplan.trace import trace_module

    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    tr = trace_module(model, [((32, 64), "float32")])
    base = settings_for("cpu", quick=True)
    s = settings_for_trace(tr, base)
    # forward 32x256x64 and 32x64x256; backward adds the input and weight gradients' shapes
    assert (32, 256, 64) in s.gemm_shapes and (32, 64, 256) in s.gemm_shapes and len(s.gemm_shapes) <= 12
    # the GELU's input is 32 x 256 fp32 = 32 KiB
    assert 32 * 256 * 4 in s.memory_sizes
    # gradients: 64x256 and 256x64 weights (64 KiB each), biases of 256 and 64 (1 KiB, 256 B)
    assert set(s.comm_sizes) == {256 * 64 * 4, 256 * 4, 64 * 4}
    assert s.precisions == base.precisions and s.warmup == base.warmup
    with pytest.raises(SpecError, match="threads=0"):
        Settings(**{**base.__dict__, "threads": 0})
