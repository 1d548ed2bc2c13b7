"""The serving metrics (serve/metrics.py, estimate.py): the identities of each regime, continuous batching against a
static batch, disaggregation, and how throughput and latency move with the batch."""

from __future__ import annotations

import pytest

from meshplan.errors import SpecError
from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.estimate import plan_columns, serve_estimate
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload, cached_tokens
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

LLAMA8 = load_model("llama3-8b")
H100 = load_system("h100")


def est(plan: ServePlan, workload: Workload, engine: Engine | None = None, gpus: int = 8, model=LLAMA8):
    return serve_estimate(model, H100.cluster(gpus), plan, workload, engine or Engine())


def test_end_to_end_is_the_first_token_then_the_other_tokens():
    for workload in (Workload(input_len=512, output_len=128), Workload(input_len=512, output_len=128, static=True)):
        m = est(ServePlan(batch=32), workload).metrics
        assert m.e2e == pytest.approx(m.ttft + 127 * m.tpot)  # TTFT + (O - 1) · TPOT


def test_a_static_batch_serves_its_tokens_over_its_whole_time():
    m = est(ServePlan(batch=16), Workload(input_len=1024, output_len=256, static=True)).metrics
    assert m.tokens_per_s == pytest.approx(16 * 256 / m.e2e)  # B · O / e2e
    assert m.requests_per_s == pytest.approx(16 / m.e2e)


def test_continuous_throughput_is_the_sequences_in_flight_over_the_token_step():
    """The instance's token step pays every prompt that enters, B/O per step; one request's TPOT only the prompts of
    the other B − 1 sequences' successors (its own enters after it leaves): step = decode + (TPOT − decode)·B/(B − 1),
    and throughput = B / step."""
    m = est(ServePlan(batch=64, replicas=4), Workload(input_len=256, output_len=512)).metrics
    step = m.decode_step + (m.tpot - m.decode_step) * 64 / 63
    assert m.tpot > m.decode_step
    assert m.instance_tokens_per_s == pytest.approx(64 / step)
    assert m.tokens_per_s == pytest.approx(4 * m.instance_tokens_per_s)  # four replicas
    assert m.requests_per_s == pytest.approx(m.tokens_per_s / 512)


def test_chunked_prefill_adds_the_prompts_share_to_the_decode_step():
    """Sarathi-Serve: B·I/O prompt tokens ride along per iteration on average; TPOT lies between the pure decode step
    and a step that carries a full chunk, and closer to the decode step the longer the outputs."""
    short = est(ServePlan(batch=64), Workload(input_len=2048, output_len=64)).metrics
    long = est(ServePlan(batch=64), Workload(input_len=2048, output_len=2048)).metrics
    assert short.tpot > short.decode_step and long.tpot > long.decode_step
    assert short.tpot / short.decode_step > long.tpot / long.decode_step


def test_separate_prefill_stalls_the_decoding_batch():
    workload = Workload(input_len=2048, output_len=256)
    chunked = est(ServePlan(batch=64), workload, Engine(prefill="chunked")).metrics
    separate = est(ServePlan(batch=64), workload, Engine(prefill="separate")).metrics
    assert separate.tpot > separate.decode_step == pytest.approx(chunked.decode_step)


def test_whole_prompts_beside_the_decodes_are_chunked_prefill_rounded_to_whole_prompts():
    """TensorRT-LLM's in-flight batching with context chunking off (Engine.prefill = "whole"): a prompt that fits the
    budget runs whole beside the decodes, as a chunk of it would (2,048 ≤ 8,192 − 64: the same prices), and its TTFT is
    one iteration; one of 6,000 tokens fits the 8,192 − 64 budget once, where chunked prefill packs 8,128 tokens an
    iteration: its steady state reads no faster. Both are cheaper than prompts in iterations of their own."""
    workload = Workload(input_len=2048, output_len=256)
    chunked = est(ServePlan(batch=64), workload, Engine(prefill="chunked")).metrics
    whole = est(ServePlan(batch=64), workload, Engine(prefill="whole")).metrics
    separate = est(ServePlan(batch=64), workload, Engine(prefill="separate")).metrics
    assert (whole.tpot, whole.ttft) == (pytest.approx(chunked.tpot), pytest.approx(chunked.ttft))
    assert whole.tpot < separate.tpot
    long = Workload(input_len=6000, output_len=64)
    chunked = est(ServePlan(batch=256), long, Engine(prefill="chunked")).metrics
    whole = est(ServePlan(batch=256), long, Engine(prefill="whole")).metrics
    assert whole.tokens_per_s <= chunked.tokens_per_s * (1 + 1e-12)


def test_disaggregated_decode_has_no_prefill_in_its_token_step():
    workload = Workload(input_len=4096, output_len=256)
    together = est(ServePlan(tp=2, batch=64, replicas=4), workload).metrics
    apart = est(ServePlan(tp=2, batch=64, replicas=2, prefill_replicas=2), workload).metrics
    assert apart.tpot == pytest.approx(apart.decode_step) and apart.tpot < together.tpot
    # the system serves what the smaller pool allows: at most the decode pool's B / TPOT per instance
    assert apart.tokens_per_s <= 2 * 64 / apart.tpot * (1 + 1e-12)


def test_a_larger_batch_serves_more_tokens_each_more_slowly():
    workload = Workload(input_len=512, output_len=512)
    rows = [est(ServePlan(batch=b), workload).metrics for b in (1, 4, 16, 64, 256)]
    assert all(a.tokens_per_s < b.tokens_per_s for a, b in zip(rows, rows[1:], strict=False))
    assert all(a.tpot < b.tpot for a, b in zip(rows, rows[1:], strict=False))


def test_pipeline_stages_do_not_shorten_the_token_step_of_one_sequence():
    """A sequence waits for its micro-batch to pass every stage: p·T_stage, never below one stage's layers."""
    workload = Workload(input_len=128, output_len=128)
    one = est(ServePlan(tp=1, batch=1), workload).metrics.tpot
    two = est(ServePlan(tp=1, pp=2, batch=2), workload).metrics.tpot
    assert two > 0.9 * one


def test_cost_per_million_tokens_is_the_price_of_the_gpus_over_the_tokens():
    e = est(ServePlan(tp=2, batch=32, replicas=4), Workload(input_len=512, output_len=512))
    # 2.5 $/GPU-hour · 8 GPUs / 3600 s / tokens/s · 1e6
    assert e.cost_per_million(2.5) == pytest.approx(2.5 * 8 / 3600 / e.metrics.tokens_per_s * 1e6)
    assert e.tokens_per_s_per_gpu == pytest.approx(e.metrics.tokens_per_s / 8)


def test_trtllm_reserves_each_sequence_its_whole_output():
    workload = Workload(input_len=128, output_len=2048)
    trt, vllm = load_engine("trtllm"), load_engine("vllm")
    assert trt.resident(workload) == 128 + 2048 and vllm.resident(workload) == 128 + 1024
    a = est(ServePlan(batch=1), workload, trt).memory
    b = est(ServePlan(batch=1), workload, vllm).memory
    assert a.sequence > b.sequence


def test_a_format_the_gpu_lacks_is_a_reason_not_a_price():
    a100 = load_system("a100").cluster(8)
    e = serve_estimate(LLAMA8, a100, ServePlan(batch=8, quant=Quant(weights="fp8", activations="fp8")),
                       Workload(input_len=128, output_len=128))
    assert not e.fits and any("tensor cores" in r for r in e.reasons)


def test_an_overlapped_host_time_hides_behind_the_gpu():
    """host_overlap (TensorRT-LLM's PyTorch backend, SGLang): an iteration takes max(GPU, host), not their sum."""
    workload = Workload(input_len=512, output_len=512)
    gpu = est(ServePlan(batch=64), workload).metrics.decode_step
    added = est(ServePlan(batch=64), workload, Engine(iteration_overhead=0.002)).metrics.decode_step
    hidden = est(ServePlan(batch=64), workload, Engine(iteration_overhead=0.002, host_overlap=True)).metrics.decode_step
    slow = est(ServePlan(batch=64), workload, Engine(iteration_overhead=1.0, host_overlap=True)).metrics.decode_step
    assert added == pytest.approx(gpu + 0.002)  # GPU + host
    assert hidden == pytest.approx(gpu) and gpu < 0.002 * 20  # 2 ms of host work behind a longer GPU step
    assert slow == pytest.approx(1.0)  # a host slower than the GPU sets the pace: max(GPU, 1 s) = 1 s


def test_the_batch_tuner_rounds_the_kv_capacity_down_its_table():
    """TensorRT-LLM's DynamicBatchTuner (dynamicBatchTuner.cpp; its unit test's cases): the first (limit, batch) with
    capacity < limit, else the capacity floored to 512 when within 128 of it; never more than the capacity."""
    tuned = load_engine("trtllm").with_(batch_table=((144, 128), (336, 256), (672, 512), (832, 768), (1280, 1024),
                                                     (1664, 1536)))
    cases = {143: 128, 335: 256, 671: 512, 831: 768, 1279: 1024, 1663: 1536, 2049: 2048, 1665: 1665, 100: 100}
    assert {c: tuned.runtime_batch(c) for c in cases} == cases  # 2049 < 2048 + 128: 2048; 100 < 128: the capacity
    assert load_engine("trtllm").runtime_batch(700.0) == 700.0  # no table: no tuning


def test_a_batch_table_is_read_from_toml_and_checked(tmp_path):
    from meshplan.errors import SpecError

    good = tmp_path / "tuned.toml"
    good.write_text('name = "tuned"\nbatch_table = [[144, 128], [336, 256]]\n')
    assert load_engine(str(good)).batch_table == ((144, 128), (336, 256))
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nbatch_table = [[336, 256], [144, 128]]\n')
    with pytest.raises(SpecError, match="ascending limits"):
        load_engine(str(bad))


def test_attention_groups_that_schedule_their_own_prompts_wait_for_the_one_with_a_chunk():
    """DeepSeek-V3 on 8 H200s, 8 attention groups of 128 sequences, 1,024 in and 2,048 out: each group takes a
    1,024-token chunk in 64 / 1,024 of its iterations (B·I/O = 128 · 1024 / 2048 = 64 tokens per step), of which one
    request meets f = 127/128 of that (the others' prompts, not its own successor's). Taken in the same iterations
    (dp_balance) its mean step is f·mixed + (1 − f)·decode; each on its own, 1 − (1 − f)^8 = 40.1 % of the
    iterations carry a chunk somewhere, 8f / 0.401 = 1.24 on average, and the step is
    0.401·(mixed − (1 − 1.24 / 8)·shared) + 0.599·decode, shared being what the extra chunks add to the experts."""
    from meshplan.serve.metrics import Setting, instance

    model, cluster = load_model("deepseek-v3"), load_system("h200").cluster(8)
    workload = Workload(input_len=1024, output_len=2048)
    cols = {"tp": 1, "pp": 1, "dpa": 8, "ep": 8, "batch": 1024, "replicas": 1, "prefill_replicas": 0}
    quant = Quant(weights="fp8", activations="fp8", kv_cache="fp8")
    balanced = Setting(model, cluster, cols, quant, Engine(dp_balance=True), workload)
    alone = Setting(model, cluster, cols, quant, Engine(), workload)
    f, mixed_at = 64 / 1024 * 127 / 128, (128, 1024, 1.0, 0.0)  # one request meets the other 127's prompts
    decode, mixed = alone.time(128), alone.time(*mixed_at)
    assert instance(balanced).tpot == pytest.approx(f * mixed + (1 - f) * decode)
    somewhere = 1 - (1 - f) ** 8
    assert somewhere == pytest.approx(0.401, abs=1e-3)
    shared = alone.expert_time(*mixed_at) - alone.expert_time(128)
    assert 0 < shared < mixed - decode
    chunks = 8 * f / somewhere
    expected = somewhere * (mixed - (1 - chunks / 8) * shared) + (1 - somewhere) * decode
    assert instance(alone).tpot == pytest.approx(expected)
    assert instance(alone).tpot > 1.1 * instance(balanced).tpot
    one = {**cols, "dpa": 1, "ep": 1, "batch": 128}  # one group: nobody to wait for
    assert instance(Setting(model, cluster, one, quant, Engine(), workload)).tpot == pytest.approx(
        instance(Setting(model, cluster, one, quant, Engine(dp_balance=True), workload)).tpot)


def test_two_batch_overlap_hides_the_dispatch_of_one_half_behind_the_other():
    """SGLang's TBO on DeepSeek-V3, 72 H100s in 72 attention groups of 256: the step is 2·max(C(128), M(128)) with M
    the dispatch and combine of a half and C the rest of its step; without it C(256) + M(256)."""
    from meshplan.serve.iteration import token_time
    from meshplan.serve.metrics import TRAFFIC, Setting

    model, cluster = load_model("deepseek-v3"), load_system("h100").cluster(72)
    cols = {"tp": 1, "pp": 1, "dpa": 72, "ep": 72, "batch": 72 * 256, "replicas": 1, "prefill_replicas": 0}
    quant, workload = Quant(weights="fp8", activations="fp8", kv_cache="fp8"), Workload(input_len=2000, output_len=1)
    tbo = Setting(model, cluster, cols, quant, load_engine("sglang").with_(two_batch_overlap=True), workload)
    plain = Setting(model, cluster, cols, quant, load_engine("sglang"), workload)
    half = tbo.shape(128, 0.0, 0.0, 0.0)
    step, traffic = (token_time(model, cluster, half, 1, quant, 0.0, tbo.eff, only) for only in ((), TRAFFIC))
    assert tbo.time(256) == pytest.approx(2 * max(step - traffic, traffic))
    assert plain.time(256) == pytest.approx(token_time(model, cluster, plain.shape(256, 0.0, 0.0, 0.0), 1, quant))
    assert tbo.time(256) < plain.time(256)  # 72 GPUs over 9 nodes: the dispatch crosses InfiniBand


def test_a_python_host_loop_runs_at_the_host_cpus_python_speed():
    """trtllm-pytorch: 10.7 µs per request in flight per iteration on an x86 host, 2.75x that on GB200's Grace
    (gb200.toml python_host): 2,048 requests take 2048 · 10.7 µs = 21.9 ms of host time on B200, 60.3 ms on GB200;
    behind the overlap scheduler an iteration lasts max(GPU, host). The C++ runtime's host time does not scale."""
    engine = load_engine("trtllm-pytorch")
    assert engine.host_in_python and engine.host_overlap
    b200, gb200 = load_system("b200").cluster(1), load_system("gb200").cluster(4)
    assert b200.python_host == 1.0 and gb200.python_host == 2.75
    assert engine.host_time(2048, 1, b200.python_host) == pytest.approx(2048 * 10.7e-6)
    assert engine.host_time(2048, 1, gb200.python_host) == pytest.approx(2.75 * 2048 * 10.7e-6)
    cpp = load_engine("trtllm")
    assert cpp.host_time(2048, 1, 2.75) == cpp.host_time(2048, 1, 1.0) == pytest.approx(cpp.iteration_overhead)
    from meshplan.serve.metrics import Setting

    model = load_model("qwen3-30b-a3b")
    cols = {"tp": 1, "pp": 1, "dpa": 1, "ep": 1, "batch": 2048, "replicas": 1, "prefill_replicas": 0}
    quant, workload = Quant(weights="fp4", activations="fp4"), Workload(input_len=128, output_len=128)
    on = {name: Setting(model, load_system(name).cluster(1), cols, quant, engine, workload)
          for name in ("b200", "gb200")}
    gpu = on["gb200"].gpu_time(2048, 0.0, 0.0, 0.0)
    assert on["gb200"].time(2048) == pytest.approx(max(gpu, 2.75 * 2048 * 10.7e-6))
    assert on["gb200"].time(2048) > on["b200"].time(2048)  # the same Blackwell GPU behind a slower host


def test_a_prefix_cache_hit_is_whole_pages_of_all_but_the_last_token():
    """vLLM V1 counts a hit in whole KV pages of at most I − 1 tokens: a prompt seen before, 128 tokens in pages of
    16, finds 112 (its last page is computed again); 2,048 finds 2,032; half of 2,048 finds 1,024; 100 tokens at a
    99.9 % hit find min(99.9, 99) = 99 → 96."""
    assert [cached_tokens(128, 1.0, 16), cached_tokens(2048, 1.0, 16), cached_tokens(2048, 0.5, 16),
            cached_tokens(100, 0.999, 16), cached_tokens(2048, 0.0, 16)] == [112, 2032, 1024, 96, 0]
    with pytest.raises(SpecError, match="cached_len=2,048 must be below input_len=2,048"):
        Workload(input_len=2048, output_len=1, cached_len=2048)


def test_a_static_batch_prefills_only_the_tokens_past_its_cached_prefix():
    """B = 16 prompts of 2,048 tokens of which 2,032 are cached: the prefill computes 16 × 16 = 256 tokens, each
    prompt's 16 attending to its 2,032 cached ones (Setting.time(0, 256, 16, 2032)); the decode steps are the same."""
    plan, cached = ServePlan(batch=16), Workload(input_len=2048, output_len=64, static=True, cached_len=2032)
    cold = est(plan, Workload(input_len=2048, output_len=64, static=True)).metrics
    warm = est(plan, cached).metrics
    setting = Setting(LLAMA8, H100.cluster(8), plan_columns(plan), plan.quant, Engine(), cached)
    assert warm.ttft == pytest.approx(float(setting.time(0.0, 16 * 16, 16, 2032)))
    assert warm.tpot == pytest.approx(cold.tpot) and warm.ttft < cold.ttft / 20
    assert warm.e2e == pytest.approx(warm.ttft + 63 * warm.tpot)


@pytest.mark.parametrize("static", [False, True])
def test_more_of_the_prompt_in_the_cache_never_slows_a_request(static):
    """Property: a larger cached prefix never lengthens TTFT, TPOT or e2e, nor lowers throughput (continuous
    batching, chunked and whole-prompt engines, and a static batch)."""
    for engine in (Engine(), load_engine("vllm-v0")):
        last = None
        for cached in (0, 256, 1024, 2032):
            m = est(ServePlan(batch=32), Workload(input_len=2048, output_len=128, static=static, cached_len=cached),
                    engine).metrics
            if last is not None:
                assert m.ttft <= last.ttft * (1 + 1e-9) and m.tpot <= last.tpot * (1 + 1e-9)
                assert m.tokens_per_s >= last.tokens_per_s * (1 - 1e-9)
            last = m


def test_an_engine_that_decodes_the_last_prompt_token_pays_a_decode_step_before_the_first_token():
    """TurboMind v0.1 (Engine.last_prompt_token_decoded): a static batch of B = 8 prompts of 128 tokens runs a
    context step of 8 × 127 tokens, then the decode step of the 8 sequences that samples their first token: TTFT =
    T(0, 1016, 8) + T(8); then O − 1 = 63 more decode steps, so E2E = TTFT + 63 · T(8). A one-token prompt has no
    context step: its TTFT is one decode step."""
    assert load_engine("lmdeploy").last_prompt_token_decoded and not load_engine("trtllm").last_prompt_token_decoded
    plan, engine = ServePlan(batch=8), Engine(last_prompt_token_decoded=True)
    workload = Workload(input_len=128, output_len=64, static=True)
    m = est(plan, workload, engine).metrics
    setting = Setting(LLAMA8, H100.cluster(8), plan_columns(plan), plan.quant, engine, workload)
    context, decode = float(setting.time(0.0, 8 * 127, 8)), float(setting.time(8))
    assert m.ttft == pytest.approx(context + decode)
    assert m.tpot == pytest.approx(decode) and m.e2e == pytest.approx(context + 64 * decode)
    one = est(plan, Workload(input_len=1, output_len=64, static=True), engine).metrics
    assert one.ttft == pytest.approx(one.tpot)  # no context step: the first decode step samples the first token
    prefilled = est(plan, workload).metrics  # the prefill of all 128 tokens samples the first token
    assert prefilled.ttft == pytest.approx(float(setting.time(0.0, 8 * 128, 8)))


def test_decoding_the_last_prompt_token_waits_a_whole_decode_step_under_continuous_batching():
    """Whole-prompt iterations (prefill = separate): the prompts' context step leaves out their last tokens, and their
    first tokens come with the next whole decode step, not half of one on average."""
    workload = Workload(input_len=2048, output_len=256)
    plain = est(ServePlan(batch=64), workload, Engine(prefill="separate")).metrics
    turbomind = est(ServePlan(batch=64), workload, Engine(prefill="separate", last_prompt_token_decoded=True)).metrics
    assert turbomind.ttft > plain.ttft and turbomind.tpot <= plain.tpot
    assert turbomind.decode_step == pytest.approx(plain.decode_step)
