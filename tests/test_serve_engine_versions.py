"""Serving engines by version (issue 46, item 4): a record's engine string picks its version's preset
(presets/engine_versions.toml); vLLM V0's sourced host time per iteration; decode CUDA graphs up to a captured batch
and the eager host floor beyond it; and the KV-cache capacity rule: a static batch the cache cannot hold runs in
waves (queued or preempted and recomputed), or is refused, never priced as if it fitted."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meshplan.serve import check
from meshplan.serve.engine import load_engine
from meshplan.serve.engine_version import parse_date, parse_version, preset_for
from meshplan.serve.estimate import plan_columns, serve_estimate
from meshplan.serve.metrics import Setting, arrivals, first_token_step, static_capacity
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.preemption import recompute_kept
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan_validation.serving_map import engine_of


@pytest.mark.parametrize(("text", "preset"), [
    ("vLLM 0.5.4", "vllm-v0.5"),
    ("vllm==0.4.2", "vllm-v0.5"),
    ("vllm==0.6.3.post1", "vllm-v0"),
    ("vLLM 0.7.3", "vllm-v0"),
    ("vLLM 0.8.0", "vllm"),
    ("vLLM v0.10 ROCm", "vllm"),
    ("vLLM 0.6.2 on ROCm 6.2", "vllm-v0"),
    ("vLLM v0.6.1 built for ROCm (git checkout v0.6.1, Dockerfile.rocm)", "vllm-v0.6-rocm"),
    ("vLLM 0.5.4 ROCm", "vllm-v0.5-rocm"),
    # no single version: the date's (the newest release out by the end of the period it names)
    ("vLLM, Oct 2024", "vllm-v0"),
    ("vLLM (September 2024)", "vllm-v0"),
    ("vLLM, Aug. 2024", "vllm-v0.5"),
    ("vLLM 2025-04", "vllm"),
    ("vLLM (version not stated: 'pip install vllm', Sept 2024; the 0.5.x-0.6.1 API), V0 engine", "vllm-v0"),
    ("vLLM ROCm, 2024-10-01", "vllm-v0"),
    ("vLLM ROCm, 2024-09-20", "vllm-v0.6-rocm"),
    ("vLLM V1", "vllm"),
    ("SGLang v0.4.1", "sglang"),
    ("TensorRT-LLM 0.14.0 (TensorRT engine) + Triton tensorrtllm_backend", "trtllm"),
    ("TensorRT-LLM (PyTorch backend, trtllm-bench)", "trtllm-pytorch"),
    ("trtllm 1.0 PyTorch", "trtllm-pytorch"),
    ("LMDeploy v0.1.0a1 (TurboMind engine), CUDA 11.8", "lmdeploy"),
    ("gpt-fast (PyTorch, torch.compile mode='reduce-overhead', CUDA graphs)", "gpt-fast"),
    ("DeepSpeed-FastGen 0.2", None),
])
def test_the_engine_string_picks_the_version_preset(text, preset):
    assert preset_for(text) == preset


def test_versions_parse_from_the_first_dotted_number():
    assert parse_version("vllm==0.6.3.post1") == (0, 6, 3)
    assert parse_version("vLLM v0.10 ROCm 6.4") == (0, 10)
    assert parse_version("vLLM V1") is None
    # a wildcard or a range states no single version; a date is none either
    assert parse_version("the 0.5.x-0.6.1 API") is None
    assert parse_version("vLLM 0.5 to 0.6") is None
    assert parse_version("vLLM 0.5.x, then vllm==0.6.3") == (0, 6, 3)
    assert parse_version("vLLM, 2024-10-15") is None


def test_a_date_reads_as_the_last_day_of_the_period_it_names():
    assert parse_date("vLLM, Sept 2024") == "2024-09-30"
    assert parse_date("vLLM (Feb. 2024)") == "2024-02-29"  # a leap year
    assert parse_date("measured 2024-10") == "2024-10-31"
    assert parse_date("2024-10-15 on MI300X") == "2024-10-15"
    assert parse_date("vLLM 0.6.3") is None


def test_a_record_date_picks_the_version_its_engine_string_does_not_state():
    # the releases: vLLM 0.6.0 on 2024-09-05, 0.8.0 (V1 by default) on 2025-03-18 (engine_versions.toml, PyPI)
    assert preset_for("vLLM", "2024-10") == "vllm-v0"  # October 2024: 0.6.3, V0, not the V1 of an unversioned string
    assert preset_for("vLLM", "2024-08-31") == "vllm-v0.5"
    assert preset_for("vLLM", "2025-03-18") == "vllm"
    assert preset_for("vLLM") == "vllm"  # no version and no date: the unversioned row
    assert preset_for("vLLM 0.5.4", "2025-06") == "vllm-v0.5"  # a stated version outranks any date
    assert preset_for("vLLM (Oct 2024)", "2025-06") == "vllm-v0"  # the string's own date outranks the record's
    assert engine_of({"engine": "vLLM (version not stated)", "date": "2024-10"}).name == "vllm-v0"


def test_every_preset_of_the_table_loads():
    from meshplan.serve.engine_version import version_table

    for row in version_table():
        assert load_engine(row["preset"]).name == row["preset"]


def test_a_record_engine_string_gets_its_version_and_the_source_changes():
    # a vLLM 0.5 record: V0's engine loop, all of it exposed (tests/test_vllm_v0_host.py: measured in its code), not
    # the V1 preset; from 0.6 part of it runs beside the GPU
    engine = engine_of({"engine": "vLLM 0.5.4"})
    assert engine is not None and engine.name == "vllm-v0.5"
    assert engine.sequence_overhead > 0 and engine.hidden_sequence_overhead == 0
    assert engine_of({"engine": "vLLM 0.6.1"}).hidden_sequence_overhead > 0
    v1 = engine_of({"engine": "vLLM v0.10.0 on ROCm 6.4.1"})  # V1: a sixth of V0 0.6's host time per sequence
    assert v1.name == "vllm" and v1.sequence_overhead < load_engine("vllm-v0").sequence_overhead / 2
    # TensorRT-LLM 0.14's Triton backend: its preset (trtllm) with whole prompts beside the decodes (chunking off)
    old = engine_of({"engine": "TensorRT-LLM 0.14.0 (TensorRT engine)"})
    assert (old.name, old.prefill) == ("trtllm", "whole")
    assert engine_of({"engine": "Orca 1.0"}) is None


# ---- decode CUDA graphs ------------------------------------------------------------------------------------------


SHORT = Workload(input_len=128, output_len=128)


def _setting(engine, batch=1, workload=SHORT):
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(1)
    plan = ServePlan(batch=batch)
    return Setting(model, cluster, plan_columns(plan), plan.quant, engine, workload)


def test_a_decode_batch_beyond_the_captured_graphs_pays_the_eager_host_floor():
    """vLLM V0 captures decode graphs up to 256 sequences; at 257, eager, the host issues 32 layers x 0.15 ms =
    4.8 ms of kernels at tp 1 (no all-reduce to launch), and the GPU's step lasts at least that, or the async output
    processor's 21.4 us a sequence beside it; the iteration's GPU work after the forward pass, 1.115 ms
    (presets/engines/vllm-v0.toml: iteration_latency), on top of the GPU's part; then the engine loop's exposed
    0.323 ms + 58.2 us a sequence."""
    engine = load_engine("vllm-v0")
    assert engine.graph_max_batch == 256 and engine.eager_layer_overhead == pytest.approx(0.15e-3)
    assert engine.iteration_latency == pytest.approx(1.115e-3)
    s = _setting(engine)
    graphed, eager = float(s.time(256.0)), float(s.time(257.0))
    gpu = float(s.gpu_time(257.0, 0.0, 0.0, 0.0))
    assert eager == pytest.approx(max(max(gpu, 32 * 0.15e-3) + 1.115e-3, 257 * 21.4e-6) + 0.323e-3 + 257 * 58.2e-6)
    gpu256 = float(s.gpu_time(256.0, 0.0, 0.0, 0.0))
    assert graphed == pytest.approx(max(gpu256 + 1.115e-3, 256 * 21.4e-6) + 0.323e-3 + 256 * 58.2e-6)
    # graphs off: the eager floor at every batch, never faster
    bare = _setting(engine.with_(graph_max_batch=0))
    assert float(bare.time(8.0)) >= float(s.time(8.0))
    assert float(bare.time(8.0)) >= 32 * 0.15e-3 + 1.115e-3 + 0.323e-3 + 8 * 58.2e-6
    assert eager >= graphed


def test_an_eager_layer_under_tensor_parallelism_launches_its_two_all_reduces_too():
    """An eager vLLM V0 layer issues its 10 kernels at 15 us each, 0.15 ms, at every tp; under tensor parallelism its
    two all-reduces (RowParallelLinear.forward all-reduces only when tp_size > 1) at 15 us each more: at tp 2 an eager
    iteration of Llama 3 8B's 32 layers takes the host 32 x (0.15 + 0.03) = 5.76 ms to issue, at tp 1 32 x 0.15 =
    4.8 ms; a captured decode graph issues none, at any tp."""
    engine = load_engine("vllm-v0")
    assert engine.eager_layer_tp_overhead == pytest.approx(0.03e-3)
    assert float(engine.eager_time(257.0, 0.0, 32, 1.0, 1)) == pytest.approx(32 * 0.15e-3)
    assert float(engine.eager_time(257.0, 0.0, 32, 1.0, 2)) == pytest.approx(32 * 0.18e-3)
    assert float(engine.eager_time(64.0, 0.0, 32, 1.0, 8)) == 0.0  # a captured graph
    assert float(engine.eager_time(64.0, 1.0, 32, 1.0, 8)) == pytest.approx(32 * 0.18e-3)  # a prompt: eager
    tps = engine.eager_time(257.0, 0.0, 32, 1.0, np.array([1.0, 2.0, 4.0, 8.0]))
    assert list(np.round(tps * 1e6, 3)) == [4800.0, 5760.0, 5760.0, 5760.0]  # arrays of plans alike


# ---- the KV-cache capacity rule for static batches ---------------------------------------------------------------

LONG = Workload(input_len=8192, output_len=8192, static=True)


def _capacity(engine) -> float:
    return float(static_capacity(_setting(engine, 1, LONG)))


@pytest.mark.parametrize("name", ["vllm-v0.5", "trtllm", "lmdeploy"])
def test_a_static_batch_beyond_the_kv_cache_runs_in_waves(name):
    """Llama 3 8B on one H100, 8192 + 8192 tokens: C sequences fit to their last token; a batch of 2C + C/2 runs as
    two full waves of C and one of C/2 (a queueing engine), or more where a recompute engine loses the prefill of
    the prompts it admitted beyond C; never at the throughput of the batch as if it fitted."""
    engine = load_engine(name)
    cap = math.floor(_capacity(engine))
    assert cap >= 4
    half = cap // 2
    batch = 2 * cap + half
    s = _setting(engine, batch, LONG)
    got = serve_estimate(s.model, s.cluster, ServePlan(batch=batch), LONG, engine)
    assert got.fits  # it runs: waves, no memory refusal
    # a wave: its prompts to their first token (TurboMind's context step of 8,191 tokens each and the decode step that
    # samples it, metrics.first_token_step; the others' prefill of 8,192), then 8,191 decode steps
    wave = lambda n: float(first_token_step(s, float(n)) + 8191 * s.time(float(n)))  # noqa: E731
    whole = 2 * wave(cap) + wave(half)
    if engine.kv_overflow == "recompute_kept":  # vLLM V0: its scheduler's count, not waves (serve/preemption.py)
        shape = (s.workload.input_len, s.workload.output_len, float(s.engine.max_seqs))
        kept = float(recompute_kept(s.time, float(batch), static_capacity(s), shape, lambda n: first_token_step(s, n)))
        assert batch * 8192 / float(got.metrics.tokens_per_s) == pytest.approx(kept, rel=1e-9)
    elif engine.kv_overflow == "recompute":  # prompts admitted on their 8192-token pages: min(B, 2C), C of them lost
        assert whole < batch * 8192 / float(got.metrics.tokens_per_s)
    else:
        assert batch * 8192 / float(got.metrics.tokens_per_s) == pytest.approx(whole, rel=1e-9)
    as_if = batch * 8192 / (wave(batch))
    assert float(got.metrics.tokens_per_s) < as_if
    # the later waves wait: the mean request's TTFT is its wave's start (0, W, 2W) plus that wave's prefill
    prefill = lambda n: float(first_token_step(s, float(n)))  # noqa: E731
    ttft = (cap * wave(cap) + half * 2 * wave(cap) + 2 * cap * prefill(cap) + half * prefill(half)) / batch
    # the first wave's requests as they arrive: TurboMind's first alone, the others at the next step (LMDeploy's
    # benchmark, metrics.arrivals); the others' engines start them together (no change)
    ttft += cap * (float(arrivals(s, float(cap), prefill(cap))) - prefill(cap)) / batch
    assert float(got.metrics.ttft) == pytest.approx(ttft, rel=1e-9)
    assert float(got.metrics.ttft) > 10 * prefill(cap)
    assert float(got.metrics.tpot) == pytest.approx(float(s.time(float(cap))))


def test_a_batch_that_fits_is_priced_as_one_wave():
    engine = load_engine("vllm")
    s = _setting(engine, 4, LONG)
    m = serve_estimate(s.model, s.cluster, ServePlan(batch=4), LONG, engine).metrics
    e2e = float(s.time(0.0, 4 * 8192.0, 4.0, 0.0) + 8191 * s.time(4.0))
    assert float(m.e2e) == pytest.approx(e2e, rel=1e-12)
    assert float(m.tokens_per_s) == pytest.approx(4 * 8192 / e2e, rel=1e-12)


def test_an_engine_that_refuses_runs_no_batch_its_cache_cannot_hold():
    engine = load_engine("vllm").with_(kv_overflow="refuse")
    cap = math.floor(_capacity(engine))
    s = _setting(engine, cap + 1, LONG)
    got = serve_estimate(s.model, s.cluster, ServePlan(batch=cap + 1), LONG, engine)
    assert not got.fits and any(r.startswith(check.MEMORY) for r in got.reasons)
    assert got.timings()["output_tokens_per_s"] is None
    assert float(got.metrics.tokens_per_s) == 0.0 and math.isinf(float(got.metrics.ttft))
    assert serve_estimate(s.model, s.cluster, ServePlan(batch=cap), LONG, engine).fits


def test_no_wave_when_not_one_sequence_fits():
    """A 70B model at 16 bits on one H100: no KV pool at all, nothing runs whatever the engine does with overflow."""
    model, cluster = load_model("llama3-70b"), load_system("h100").cluster(1)
    got = serve_estimate(model, cluster, ServePlan(batch=8), LONG, load_engine("vllm"))
    assert not got.fits and float(got.metrics.tokens_per_s) == 0.0


def test_recompute_never_faster_than_queueing():
    queue, recompute = (load_engine("vllm").with_(kv_overflow=k) for k in ("queue", "recompute"))
    cap = math.floor(_capacity(queue))
    s = _setting(queue, 3 * cap, LONG)
    a = serve_estimate(s.model, s.cluster, ServePlan(batch=3 * cap), LONG, queue).metrics.tokens_per_s
    b = serve_estimate(s.model, s.cluster, ServePlan(batch=3 * cap), LONG, recompute).metrics.tokens_per_s
    assert b < a
