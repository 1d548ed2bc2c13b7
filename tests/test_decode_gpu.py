"""Decode steps measured on a lent H200 and H100 (data/measured/gpu/*-decode.json, benchmarks/measure/decode_gpu.py) and
what they gave meshplan: the engine kernels (Engine.decode_layer_kernels, serve/iteration.extra_kernel_time: the
gpt-fast preset's count is the profile's, each kernel beyond the op list's costs the accelerator's kernel_overhead), the
compiled step they price, and each kernel's measured fixed time against the presets'."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from meshplan.cost.decode import Shape, gemm
from meshplan.errors import SpecError
from meshplan.roofline import compute_time, memory_time, op_time, work_time
from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.engine import engine_from_dict, load_engine
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.iteration import extra_kernel_time, layer_kernels
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system, system_names
from meshplan.specs.model_load import load_model

ROOT = Path(__file__).resolve().parents[1]


def _doc():
    spec = importlib.util.spec_from_file_location("decode_gpu_doc", ROOT / "benchmarks" / "docs" / "decode_gpu_doc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


doc = _doc()
DATA = doc.of_gpu("h200")
ROWS = doc.rows(DATA)
H100_DATA = doc.of_gpu("h100")
LLAMA = load_model("llama2-7b")
H200 = load_system("h200").cluster(1)


def _shape(batch: float, context: float = 256.0) -> Shape:
    return Shape(tp=1, dpa=1, ep=1, decode=batch, context=context, prefill=0.0, prompts=0.0, prefix=0.0, w_bytes=2,
                 a_bytes=2, kv_bytes=2)


def test_the_gpt_fast_preset_counts_the_profiled_kernels():
    """The compiled step at batch 1 launched 460 kernels: 4 outside the 32 layers (the head's GEMM, the final
    RMSNorm, the argmax and the graph's copy of its input: the kernels run once a step, less the first layer's
    norms, into which Inductor fused the embedding), (460 - 4) / 32 = 14.25 a layer, the preset's figure."""
    kernels = ROWS[(1, 256)]["compiled_kernels"]
    total = sum(k["count"] for k in kernels)
    assert total == 460
    outside = [k["name"] for k in kernels if k["count"] == 1 and "embedding" not in k["name"]]
    assert len(outside) == 4 and any("argmax" in name for name in outside)
    assert (total - len(outside)) / 32 == load_engine("gpt-fast").decode_layer_kernels == 14.25


def test_an_extra_kernel_costs_the_accelerators_kernel_overhead():
    """Llama's decode layer is 9 ops of one kernel each (norm, QKV, cache write, attention, out, norm, fc1, act,
    fc2), and at batch 1 the out and fc2 GEMMs split k (32 output tiles of 16 x 128 on 132 SMs: test below), each
    with its reduction kernel: 11. gpt-fast's layer launches 14.25: 3.25 more, each 2.4 us on the H200 preset, over 32
    layers = 249.6 us a step. At batch 128 no GEMM splits: 9."""
    acc = H200.accelerator
    assert layer_kernels(LLAMA, _shape(1.0), acc) == 11.0
    assert layer_kernels(LLAMA, _shape(128.0), acc) == 9.0
    assert acc.kernel_overhead == pytest.approx(2.4e-6)
    extra = extra_kernel_time(LLAMA, H200, _shape(1.0), load_engine("gpt-fast"))
    assert extra == pytest.approx(3.25 * 2.4e-6 * 32)
    assert extra_kernel_time(LLAMA, H200, _shape(1.0), load_engine("generic")) == 0.0
    fewer = engine_from_dict({"decode_layer_kernels": 4.0}, "test")  # fewer than the op list's: nothing taken off
    assert extra_kernel_time(LLAMA, H200, _shape(1.0), fewer) == 0.0


def test_a_split_k_gemm_runs_a_reduction_kernel():
    """cuBLAS ran a ``splitKreduce_kernel`` after each split-K GEMM of the profiled steps (2 a layer at batch 1 on both
    GPUs: 64 in 32 layers). A GEMM whose output has fewer tiles than the GPU has SMs splits k (specs/gemm_shape.py):
    a 4,096-wide output at one row is 4096 / 64 = 64 tiles of 16 x 64 on 132 SMs, split ⌊132 / 64⌋ = 2 ways; QKV's
    12,288 is 192 tiles, more than the SMs: no split; so is fc1's 22,016. The reduction costs the accelerator's
    kernel_overhead on top of the GEMM's gemm_overhead. Training's kernels follow the same rule with their 64- and
    128-row tiles (32 of 64 x 128 here: split); a GEMM of many rows fills the SMs and does not split."""
    kernels = ROWS[(1, 256)]["compiled_kernels"]
    assert sum(k["count"] for k in kernels if "splitKreduce" in k["name"]) == 64
    assert SERVE_DEFAULT.split_k_reductions(1, 4096, 4096, 132) == 1.0
    assert SERVE_DEFAULT.split_k_reductions(1, 12288, 4096, 132) == 0.0
    assert SERVE_DEFAULT.split_k_reductions(1, 22016, 4096, 132) == 0.0
    assert DEFAULT.split_k_reductions(1.0, 4096.0, 4096.0, 132) == 1.0
    assert DEFAULT.split_k_reductions(8192.0, 4096.0, 4096.0, 132) == 0.0
    acc = H200.accelerator
    wo = gemm("wo", 1, 4096, 4096, 2, 2)
    base = work_time(compute_time(wo, acc, "bf16", SERVE_DEFAULT), memory_time(wo, acc, SERVE_DEFAULT), SERVE_DEFAULT)
    assert op_time(wo, acc, "bf16", SERVE_DEFAULT) == pytest.approx(base + 3.1e-6 + 2.4e-6)
    big = gemm("wo", 8192, 4096, 4096, 2, 2)
    work = work_time(compute_time(big, acc, "bf16", DEFAULT), memory_time(big, acc, DEFAULT), DEFAULT)
    assert op_time(big, acc, "bf16", DEFAULT) - work == pytest.approx(3.1e-6)


def test_more_engine_kernels_never_shorten_a_step():
    plan = ServePlan(tp=1)
    work = Workload(input_len=5, output_len=200, static=True)
    tpots = [serve_estimate(LLAMA, H200, plan, work, engine_from_dict({"decode_layer_kernels": n}, "test")).metrics.tpot
             for n in (0.0, 9.0, 12.0, 20.0)]
    assert tpots[0] == tpots[1] < tpots[2] < tpots[3]
    est = serve_estimate(LLAMA, H200, plan, work, load_engine("gpt-fast"))
    assert est.breakdown["engine/kernels"] == pytest.approx(3.25 * 2.4e-6 * 32)


def test_the_presets_hold_the_measured_fixed_time_of_a_kernel():
    """Each profiled compiled step (H100 and H200, batches 1 and 32) gives a kernel's fixed time, the graph's gap
    included (decode_gpu_doc.fixed_costs): an Inductor, PyTorch or split-K reduction kernel's 2.34-2.52 us, a GEMM
    kernel's 2.28-3.58 us beyond its bytes at the streaming rate, the attention kernel's 2.96-8.03 us. The presets
    hold the means, rounded to 0.1 us (decode_gpu_doc.preset_fixed_costs): kernel_overhead 2.4 us, gemm_overhead
    3.1 us, on every built-in accelerator but AMD's CDNA 3 / 4 parts, whose kernel_overhead is vLLM's kernels' on an
    MI300X (3.9 us, benchmarks/measure/mi300x_kernels.py; hardware/h100.toml)."""
    fixed = [x for path in (H100_DATA, DATA) for x in doc.fixed_costs(path).values()]
    assert len(fixed) == 4
    for x in fixed:
        assert 2.3e-6 < x["other"] < 2.6e-6 and 2.2e-6 < x["gemm"] < 3.6e-6 and x["attention"] > 2.9e-6
        assert 0.4e-6 < x["gap"] < 0.8e-6
    mean = doc.preset_fixed_costs()
    assert mean == {"kernel_overhead": pytest.approx(2.4e-6), "gemm_overhead": pytest.approx(3.1e-6)}
    amd = {"mi300x", "mi325x", "mi355x"}
    for name in system_names():
        acc = load_system(name).accelerator
        other = 3.9e-6 if name in amd else 2.4e-6
        assert (acc.kernel_overhead, acc.gemm_overhead) == pytest.approx((other, 3.1e-6)), name


def test_the_compiled_step_is_priced_within_six_percent():
    """meshplan's compiled decode step (the gpt-fast preset, each kernel at the measured fixed time) is within 6 % of
    the measured one at every batch on both GPUs (in sample: the fixed times come from these profiles), and the
    engine's kernels beyond the op list's are 3-8 % of it (more at 32 rows, where cuBLAS still split two GEMMs and
    meshplan's 64-wide tiles no longer do: their reductions are among the profile's kernels the op list lacks)."""
    for path, cluster in ((DATA, H200), (H100_DATA, doc.cluster_of(H100_DATA))):
        for (batch, cache), row in doc.rows(path).items():
            if "compiled_s" not in row:
                continue
            parts = doc.predicted(LLAMA, cluster, batch, cache)
            with_kernels = sum(parts.values())
            without = with_kernels - parts["engine/kernels"]
            assert abs(with_kernels / row["compiled_s"] - 1) < 0.06, (path.name, batch)
            assert 0.03 < (with_kernels - without) / row["compiled_s"] < 0.08


def test_meshplans_weight_gemms_are_near_the_measured_ones():
    """The decode GEMMs of both shapes at 1-128 rows (5 matrices: 4 batches in the first call, 3 in the second, 4
    of the 70B shape, 2 in the third: 65 timings). The 4,096 x 4,096 weight (33.5 MB) fits in the H200's 60 MB L2, so
    its repeats may hit there: left out (56 left). meshplan's time is within 30 % of each other one, and at one row
    the measured line t = t0 + bytes / B over the 9 other matrices streams at 4.2-4.5 TB/s (of 4.8 on the
    datasheet) after 3-8 us."""
    table = doc.gemm_rows(DATA, H200)
    assert len(table) == 5 * (4 + 3 + 4 + 2)
    assert [g["k"] for g in table if g["in_l2"]] == [4096] * (4 + 3 + 2)
    table = [g for g in table if not g["in_l2"]]
    assert all(abs(g["predicted_s"] / g["s"] - 1) < 0.3 for g in table)
    ones = doc.one_row(table)
    assert len(ones) == 9
    t0, rate = doc.line_fit(ones)
    assert 3e-6 < t0 < 8e-6 and 4.2e12 < rate < 4.5e12


def test_the_h100_launches_the_same_kernels():
    """On an H100 (one call: batches 1, 32, 128; compiled at 1 and 32) the compiled step launched the same 460
    kernels at batch 1 as on the H200: the preset's 14.25 a layer holds on a second GPU."""
    rows = doc.rows(H100_DATA)
    assert sum(k["count"] for k in rows[(1, 256)]["compiled_kernels"]) == 460


def test_the_eager_step_is_the_hosts():
    """Eager, the wall time is the issuing thread's (within 2 %), at 10-30 us of host time per kernel (both GPUs)."""
    for row in [*ROWS.values(), *doc.rows(H100_DATA).values()]:
        assert row["eager_host_s"] == pytest.approx(row["eager_s"], rel=0.02)
        per_kernel = row["eager_host_s"] / sum(k["count"] for k in row["kernels"])
        assert 10e-6 < per_kernel < 30e-6


def test_a_bad_kernel_count_is_one_clear_line():
    with pytest.raises(SpecError, match="decode_layer_kernels"):
        engine_from_dict({"decode_layer_kernels": -1.0}, "engine x.toml")
