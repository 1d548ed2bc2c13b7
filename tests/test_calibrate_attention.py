"""Calibrated attention: scaled_dot_product_attention timed on CPU, the fit t = t0 + FLOPs / F recovering a known
rate, the rate written to a hardware TOML and read back, and the roofline pricing flash attention from it.

Synthetic numbers are H100-like: causal attention forward at F = 400 TFLOP/s (FlashAttention-2 class: 0.4 of the
989 TFLOP/s bf16 peak) with t0 = 12 us per kernel, on FlashAttention-2's benchmark grid (16k tokens, hidden 2048).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import gpt
from meshplan.calibrate import to_toml, write_system
from meshplan.calibrate.fit import fit_attention
from meshplan.calibrate.records import AttentionSample
from meshplan.calibrate.settings import attention_shapes, settings_for
from meshplan.cli import main
from meshplan.cost.layers import dense_layer
from meshplan.errors import SpecError
from meshplan.estimate import estimate
from meshplan.roofline import memory_time, op_time, work_time
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system, system_names
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from test_calibrate import synthetic

RATE, T0 = 400e12, 12e-6
GRID = attention_shapes(16384, 2048, (512, 1024, 2048, 4096, 8192, 16384))


def close(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel)


def samples(rate: float = RATE, t0: float = T0) -> tuple[AttentionSample, ...]:
    return tuple(AttentionSample(batch=b, heads=a, seq=s, head_dim=d, precision="bf16",
                                 seconds=t0 + 2 * b * a * s * s * d / rate) for b, a, s, d in GRID)


def calibrated(tmp_path, **changes) -> str:
    return str(write_system(replace(synthetic(), attention_samples=samples(), **changes), tmp_path / "node.toml"))


# ---- FLOPs and fit --------------------------------------------------------------------------------------------
def test_sample_flops_are_the_cost_models():
    """The benchmark counts FLOPs as cost/attention.py counts the flash kernel's forward: the causal half of
    2·T·s·A·(d + d); b = 2, A = 16, s = 2048, d = 64: 2 · 2 · 16 · 2048² · 64 = 17,179,869,184."""
    sample = AttentionSample(batch=2, heads=16, seq=2048, head_dim=64, precision="bf16", seconds=1.0)
    fwd = next(o for o in dense_layer(gpt(), Plan(micro_batch=2, global_batch=2), Stack())
               if o.name == "attn/core" and o.phase == "fwd")
    assert sample.flops == fwd.flops == 2 * 2 * 16 * 2048**2 * 64 == 17_179_869_184


def test_fit_recovers_the_rate_and_overhead():
    """t = 12 us + FLOPs / 400 TFLOP/s on every shape; 1 x 32 x 16384 x 64: 2 · 32 · 16384² · 64 = 1.0995e12 FLOP
    in 12 us + 2.7488 ms = 2.7608 ms → 398.3 TFLOP/s, the best (tied with 1 x 16 x 16384 x 128: 32 · 64 = 16 · 128
    heads x head_dim, the same FLOPs); 32 x 32 x 512 x 64: 3.436e10 FLOP in 12 us + 85.9 us → 351.0 TFLOP/s."""
    fit = fit_attention(samples())
    assert close(fit.rate, RATE) and close(fit.overhead, T0) and close(fit.r2, 1.0) and fit.points == 12
    assert fit.best_shape == (1, 32, 16384, 64)
    assert close(fit.best, 2 * 32 * 16384**2 * 64 / (T0 + 2 * 32 * 16384**2 * 64 / RATE))  # 398.3e12
    small = fit.shapes[0]
    assert small[:4] == (32, 32, 512, 64) and close(small[4], 3.436e10 / (T0 + 3.436e10 / RATE), 1e-3)
    assert fit_attention(()) is None
    with pytest.raises(SpecError, match="one precision"):
        fit_attention((*samples()[:2], replace(samples()[2], precision="fp32")))


def test_scaled_dot_product_attention_runs_on_cpu():
    pytest.importorskip("torch")
    from meshplan.calibrate.bench import bench_attention, threads_of

    settings = replace(settings_for("cpu", True), attention_shapes=((2, 2, 64, 64), (1, 2, 128, 128)),
                       warmup=0, iters=1, repeats=1, threads=1)
    with threads_of(settings):
        measured = bench_attention(settings, "cpu")
    # 2·2·2·64²·64 = 2,097,152 and 2·1·2·128²·128 = 8,388,608 FLOP, at bf16 (the 16-bit precision calibrated)
    assert [s.flops for s in measured] == [2_097_152, 8_388_608]
    assert all(s.precision == "bf16" and s.seconds > 0 for s in measured)
    fit = fit_attention(measured)
    assert fit.rate > 0 and fit.overhead >= 0 and fit.best == max(s.flops / s.seconds for s in measured)
    for shapes, message in ((((1, 2, 64, 64), (2, 1, 64, 64)), "two shapes of different FLOPs"),
                            (((1, 2, 64),), "four positive integers"), (((1, 0, 64, 64),), "four positive")):
        with pytest.raises(SpecError, match=message):  # 1·2·64²·64 = 2·1·64²·64: one size, no line to fit
            replace(settings, attention_shapes=shapes)
    fp32 = bench_attention(replace(settings, precisions=("fp32",), attention_shapes=((1, 1, 32, 64), (1, 1, 64, 64))),
                           "cpu")
    assert [s.precision for s in fp32] == ["fp32", "fp32"] and all(s.seconds > 0 for s in fp32)


# ---- the TOML -------------------------------------------------------------------------------------------------
def test_toml_round_trips_the_attention_rate(tmp_path):
    acc = load_system(calibrated(tmp_path)).accelerator
    assert close(acc.attention_flops, RATE) and close(acc.attention_overhead, T0)  # not derated: used as measured
    bare = to_toml(synthetic())  # no attention measured: no field, the model keeps its efficiency constant
    assert "attention_" not in bare
    (tmp_path / "bare.toml").write_text(bare)
    assert load_system(str(tmp_path / "bare.toml")).accelerator.attention_flops == 0.0
    # a noisy fit (R² < 0.9) writes the best rate measured and no intercept, as the GEMMs do
    noisy = tuple(replace(s, seconds=s.seconds * (3.0 if i % 2 else 1.0)) for i, s in enumerate(samples()))
    text = to_toml(replace(synthetic(), attention_samples=noisy))
    best = fit_attention(noisy).best
    assert f"attention_flops = {best!r}" in text and "attention_overhead = 0.0" in text


def test_presets_carry_no_measured_attention():
    assert all(load_system(name).accelerator.attention_flops == 0.0 for name in system_names())


# ---- pricing --------------------------------------------------------------------------------------------------
def test_estimate_prices_flash_attention_at_the_measured_rate(tmp_path):
    """gpt(): b = 1, A = 16, s = 2048, d = 64. Forward 2 · 16 · 2048² · 64 = 8.59e9 FLOP: 8.59e9 / 400e12 = 21.47 us
    of math beside 5.89 us of traffic (its 16.8 MB at the H100's streaming rate), whose p-norm (roofline.work_time,
    p = 3.5) is 21.47 · (1 + (5.89 / 21.47)^3.5)^(1/3.5) = 21.54 us: 12 + 21.54 = 33.54 us; backward 2.5 × the FLOPs
    at 0.8 × the rate (efficiency.attention_bwd): 12 + 67.11 us, its traffic beside it."""
    system = load_system(calibrated(tmp_path))
    est = estimate(gpt(), system.cluster(8), Plan(dp=8, global_batch=8))
    rows = {r.phase: r for r in est.ops if r.name == "attn/core"}
    flops = 2 * 16 * 2048**2 * 64
    acc = system.accelerator
    ops = {o.phase: o for o in dense_layer(gpt(), Plan(dp=8, global_batch=8), Stack()) if o.name == "attn/core"}
    fwd = work_time(flops / RATE, memory_time(ops["fwd"], acc, DEFAULT), DEFAULT)
    assert fwd == pytest.approx(21.54e-6, abs=0.01e-6)
    assert rows["fwd"].flops == flops and close(rows["fwd"].seconds, T0 + fwd)  # 33.54 us
    bwd = work_time(2.5 * flops / (RATE * DEFAULT.attention_bwd), memory_time(ops["bwd_x"], acc, DEFAULT), DEFAULT)
    assert close(rows["bwd_x"].seconds, T0 + bwd)  # 79.1 us
    # the same file without the two fields: every other op is timed as before, attention from the efficiency model
    text = "".join(line for line in Path(calibrated(tmp_path)).read_text().splitlines(True)
                   if not line.startswith("attention_"))
    (tmp_path / "bare.toml").write_text(text)
    bare = estimate(gpt(), load_system(str(tmp_path / "bare.toml")).cluster(8), Plan(dp=8, global_batch=8))
    others = [(r.name, r.phase, r.seconds) for r in est.ops if r.kind != "attention"]
    assert others == [(r.name, r.phase, r.seconds) for r in bare.ops if r.kind != "attention"]
    assert bare.step_time != est.step_time


def test_fp8_kernels_and_unfused_attention():
    """FP8 attention at the 16-bit rate measured × cuDNN's FP8 speed-up; unfused attention is still its GEMMs."""
    acc = replace(load_system("h100").accelerator, attention_flops=RATE)
    fp8 = [o for o in dense_layer(gpt(), Plan(), Stack(attention_kernel="fp8")) if o.name == "attn/core"]
    math_time = fp8[0].flops / (RATE * DEFAULT.fp8_attention_fwd)
    traffic = memory_time(fp8[0], acc, DEFAULT)
    assert close(op_time(fp8[0], acc, "bf16", DEFAULT), work_time(math_time, traffic, DEFAULT))
    unfused = [o for o in dense_layer(gpt(), Plan(), Stack(flash_attention=False)) if o.kind == "attention"]
    h100 = load_system("h100").accelerator
    assert all(op_time(o, acc, "bf16", DEFAULT) == op_time(o, h100, "bf16", DEFAULT) for o in unfused)


@pytest.mark.parametrize("plan", [Plan(dp=8, global_batch=8),
                                  Plan(tp=2, cp=2, dp=2, global_batch=4, recompute="full"),
                                  Plan(pp=2, dp=4, global_batch=16, micro_batch=1)])
def test_a_faster_measured_attention_never_slows_a_step(plan):
    h100 = load_system("h100")
    times = []
    for rate in (1e12, 1e13, 1e14, 4e14, 1e15, 1e16):  # with a per-kernel t0 of 12 us
        system = replace(h100, accelerator=replace(h100.accelerator, attention_flops=rate, attention_overhead=T0))
        times.append(estimate(gpt(), system.cluster(8), plan).step_time)
    # equal up to rounding where the host bounds the step (step/host.py: its idle is S - G, added back to G)
    assert all(a >= b * (1 - 1e-12) for a, b in zip(times, times[1:], strict=False)) and times[0] > times[-1], times


def test_trace_prices_sdpa_at_the_measured_rate():
    torch = pytest.importorskip("torch")
    from meshplan.trace import time_traced_ops, trace_module

    class Core(torch.nn.Module):
        def forward(self, q, k, v):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

    shape = ((1, 4, 2048, 64), "bfloat16")
    tr = trace_module(Core(), [shape] * 3, backward=False)
    acc = replace(load_system("h100").accelerator, attention_flops=RATE, attention_overhead=T0)
    (timed,) = [t for t in time_traced_ops(tr, acc) if t.cost.kind == "attention"]
    flops = 2 * 4 * 2048**2 * 64  # 2,147,483,648: the causal half of flop_counter's count
    # compute-bound: 5.37 us of math against q, k, v and the output, 4 · 1 MiB, streamed in under 1.5 us, which
    # adds 0.01 us to it (roofline.work_time: 5.37 · (1 + (1.47 / 5.37)^3.5)^(1/3.5))
    traffic = memory_time(timed.cost, acc, DEFAULT)
    assert traffic < 1.5e-6 < flops / RATE
    assert timed.cost.flops == flops and close(timed.seconds, T0 + work_time(flops / RATE, traffic, DEFAULT))
    assert timed.seconds - T0 - flops / RATE < 0.02e-6  # 12 us + 5.37 us


# ---- bad input ------------------------------------------------------------------------------------------------
def edited(tmp_path, **values: str) -> str:
    """The calibrated TOML with the named fields' lines set to ``values``."""
    rows = Path(calibrated(tmp_path)).read_text().splitlines(True)
    path = tmp_path / "edited.toml"
    path.write_text("".join(next((f"{k} = {v}\n" for k, v in values.items() if row.startswith(f"{k} =")), row)
                            for row in rows))
    return str(path)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("attention_flops", "-4e14",
     "attention_flops=-400000000000000.0 FLOP/s is outside 1e+06 … 1e+18 FLOP/s (or 0: not measured)"),
    ("attention_flops", "1e3", "attention_flops=1000.0 FLOP/s is outside 1e+06 … 1e+18 FLOP/s"),
    ("attention_overhead", "2.0", "attention_overhead=2.0 s is outside 0 … 1 s"),
    ("attention_flops", '"fast"', "attention_flops"),
])
def test_bad_values_are_one_line_and_exit_2(tmp_path, capsys, field, value, message):
    path = edited(tmp_path, **{field: value})
    with pytest.raises(SpecError, match=field):
        load_system(path)
    code = main(["estimate", "--model", "llama3-8b", "--system", path, "--gpus", "8"])
    _, err = capsys.readouterr()
    assert code == 2 and err.count("\n") == 1 and message in err and "Traceback" not in err, err


def test_units_read_as_the_other_fields(tmp_path):
    acc = load_system(edited(tmp_path, attention_flops='"400 TFLOP/s"', attention_overhead='"12 us"')).accelerator
    assert acc.attention_flops == 4e14 and close(acc.attention_overhead, 1.2e-5)
