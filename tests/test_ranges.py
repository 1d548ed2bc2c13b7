"""ranges.py: every numeric field's physical range is wide enough for everything real (presets, Hugging Face configs,
published runs) and narrow enough that no combination of in-range values prices to a NaN, an infinity or a float32
overflow in the search (the corners of the ranges, priced)."""

from __future__ import annotations

import itertools
import json
import math
import warnings
from dataclasses import fields, replace
from pathlib import Path

import pytest

from meshplan.estimate import estimate
from meshplan.ranges import MAX_PARAMS, MAX_STEP_TOKENS, RANGES, check_spec, numeric_fields, problem
from meshplan.search import Space, search
from meshplan.specs.hardware import Accelerator, Network, System, load_system, system_names
from meshplan.specs.mesh import TierSpec
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.plan import Plan
from published_helpers import validated

ROOT = Path(__file__).parents[1]
HF = sorted((ROOT / "tests" / "data" / "hf").glob("*/config.json"))
RUN_FILES = [ROOT / "benchmarks" / "data" / "independent_runs.jsonl",
             ROOT / "data" / "validation" / "published_runs.jsonl"]


def test_every_numeric_spec_field_has_a_range():
    """ModelSpec, Accelerator, Network and Plan: each field declared as a number has a row in RANGES (or is a
    choice, a flag of its kind checked elsewhere)."""
    for cls in (ModelSpec, Accelerator, Network, TierSpec, Plan):
        missing = [name for name in numeric_fields(cls) if name not in RANGES]
        assert not missing, (cls.__name__, missing)


def test_presets_and_hf_configs_are_inside_their_ranges():
    for name in preset_names():
        check_spec(load_model(name))
    for name in system_names():
        system = load_system(name)
        check_spec(system.accelerator)
        check_spec(system.network)
        for tier in system.network.tiers:
            check_spec(tier)
    for path in HF:
        check_spec(load_model(str(path)))
    assert len(HF) >= 9


@pytest.mark.parametrize("path", RUN_FILES, ids=["independent", "published"])
def test_no_published_run_is_out_of_range(path):
    if not path.exists():
        pytest.skip(f"{path} is not beside the repository")
    results = validated(path)
    assert not [r.skipped for r in results if r.skipped and "is outside" in r.skipped]


def test_a_value_outside_its_range_is_one_line_with_the_range():
    assert problem("nic_latency", 1.7e308) == "nic_latency=1.7e+308 s is outside 0 … 1 s"
    assert problem("tdp_watts", 0) is None  # 0: unknown
    assert problem("tdp_watts", 1e-320) == "tdp_watts=1e-320 W is outside 1 … 100,000 W (or 0: unknown)"
    assert problem("grad_bytes", 3) == "grad_bytes=3 must be 2 or 4 (bytes per gradient: bf16 or fp32)"
    assert problem("tp", 2**20) is None and problem("tp", 2**20 + 1) == "tp=1048577 is outside 1 … 1,048,576"


# ---- the corners ---------------------------------------------------------------------------------------------------
def corner_system(fast: bool, tiered: bool = False) -> System:
    """Every rate at the top (or the bottom) of its range, every latency and per-kernel overhead at the bottom (or
    the top); ``tiered``: the network as three tiers, the outermost at the most (or least) oversubscription that
    keeps its bandwidth in range."""
    h100 = load_system("h100")
    r = {name: RANGES[name].high if fast else RANGES[name].low for name in RANGES}
    latency = 0.0 if fast else RANGES["nic_latency"].high
    acc = replace(h100.accelerator, peak_flops={k: r["peak_flops"] for k in h100.accelerator.peak_flops},
                  hbm_bandwidth=r["hbm_bandwidth"], nvlink_bandwidth=r["nvlink_bandwidth"],
                  hbm_bytes=RANGES["hbm_bytes"].high, matmul_bf16=r["matmul_bf16"], matmul_fp8=r["matmul_fp8"],
                  exp_rate=r["exp_rate"], num_sms=r["num_sms"], gemm_overhead=0.0 if fast else 1.0,
                  kernel_overhead=0.0 if fast else RANGES["kernel_overhead"].high)
    net = replace(h100.network, nvlink_latency=latency, nic_latency=latency, nics_per_gpu=r["nics_per_gpu"],
                  nic_bandwidth=r["nic_bandwidth"], host_bandwidth=r["host_bandwidth"],
                  host_memory=RANGES["host_memory"].high)
    if tiered:  # 8 x 2 x the rest: 64 GPUs are 8 x 2 x 4
        low = RANGES["bandwidth"].low
        outer = dict(bandwidth=RANGES["bandwidth"].high, oversubscription=1.0) if fast else dict(
            bandwidth=low * RANGES["oversubscription"].high, oversubscription=RANGES["oversubscription"].high)
        net = Network(host_bandwidth=net.host_bandwidth, host_memory=net.host_memory, tiers=(
            TierSpec(name="nvlink", size=8, latency=latency),
            TierSpec(name="leaf", size=2, bandwidth=RANGES["bandwidth"].high if fast else low, latency=latency),
            TierSpec(name="spine", latency=latency, **outer)))
    return replace(h100, accelerator=acc, network=net)


def huge_model() -> ModelSpec:
    """About MAX_PARAMS parameters: 12 · h² per layer at h = 2^19 is 3.3e12; 300 layers is 9.9e14."""
    h = 2**19
    model = ModelSpec(name="huge", num_layers=300, hidden_size=h, num_heads=4096, ffn_hidden_size=4 * h,
                      vocab_size=2**20, seq_length=2**20)
    assert 0.5 * MAX_PARAMS < model.params() <= MAX_PARAMS
    return model


def tiny_model() -> ModelSpec:
    return ModelSpec(name="tiny", num_layers=1, hidden_size=1, num_heads=1, ffn_hidden_size=1, vocab_size=1,
                     seq_length=1)


def finite_everywhere(data) -> bool:
    if isinstance(data, dict):
        return all(finite_everywhere(v) for v in data.values())
    if isinstance(data, list):
        return all(finite_everywhere(v) for v in data)
    return not isinstance(data, float) or math.isfinite(data)


@pytest.mark.parametrize(("fast", "big", "tiered"), list(itertools.product((False, True), repeat=3)))
def test_the_corners_price_to_finite_numbers(fast, big, tiered):
    """The slowest hardware with the largest model and step (times near 1e34 s), the fastest with the smallest
    (near 1e-20 s), on two tiers and on three: estimate and the float32 search stay finite and raise no overflow
    warning."""
    system = corner_system(fast, tiered)
    model = huge_model() if big else tiny_model()
    gpus = 64
    cluster = system.cluster(gpus)
    batch = MAX_STEP_TOKENS // model.seq_length if big else 64
    plans = [Plan(dp=64, global_batch=batch, micro_batch=batch // 64),
             Plan(dp=8 if big else 64, tp=8 if big else 1, global_batch=batch, micro_batch=1, zero=3,
                  offload_optimizer=True,
                  offload_activations=True, recompute="full", precision="fp8")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NumPy overflow or invalid-value warning fails the test
        for plan in plans:
            est = estimate(model, cluster, plan)
            data = est.to_dict()
            assert finite_everywhere(data) and est.step_time > 0, (fast, big, plan.describe())
            json.dumps(data, allow_nan=False)
        result = search(model, cluster, Space(global_batch=batch, zero=(1, 3), recompute=("full",),
                                              max_micro_batch=1, all_placements=False), top_k=3, workers=1)
        assert all(math.isfinite(e.step_time) and e.step_time > 0 for e in result.plans)
        assert result.evaluated > 0


def test_each_spec_rejects_the_value_just_past_its_range():
    """One field at a time, just past its bound, in a preset: a SpecError naming the field (not an arithmetic
    error later)."""
    from meshplan.errors import SpecError

    acc = load_system("h100").accelerator
    for f in fields(Accelerator):
        if f.name not in RANGES or f.name == "peak_flops":
            continue
        r = RANGES[f.name]
        bad = r.high * 10 if isinstance(r.high, float) or r.high > 1 else r.high + 1
        with pytest.raises(SpecError, match=rf"{f.name}="):
            replace(acc, **{f.name: type(getattr(acc, f.name))(bad)})
