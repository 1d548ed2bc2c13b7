"""A static batch whose first request runs alone (Engine.static_first_alone, serve/metrics.py ``arrivals``): TurboMind
v0.1's idle engine blocks in RequestQueue::dequeue until the first request of LMDeploy's profile_generation.py
threads arrives and takes it alone (InternLM/lmdeploy v0.1.0a1 src/turbomind/models/llama/Request.h; the threads
start one after another, benchmark/profile_generation.py @ 3e391df); the others, issued while its iteration runs,
enter at the next one (LlamaBatch::InternalThreadEntry dequeues once an iteration). The mean time to first token:
(S1 + (B - 1)·(S1 + context(B - 1) + T(B))) / B, S1 the first request's own context step and decode step (issue 79).
In a static batch more sequences or a longer prompt never shorten that mean."""

from __future__ import annotations

import random

import numpy as np
import pytest

from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.estimate import plan_columns, serve_estimate
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model

A100 = load_system("a100")
DRAWS = 40
RTOL = 1e-9


def test_the_first_request_alone_then_the_others_after_its_iteration():
    """Llama 2 7B on one A100, B = 16 prompts of 128 tokens: the first one's context step (127 tokens) and decode step
    alone, S1 = T(0, 127, 1) + T(1); the other 15 wait for it, then their context step (15 × 127 tokens) and the decode
    step of all 16: mean TTFT = (S1 + 15·(S1 + T(0, 1905, 15) + T(16))) / 16."""
    assert load_engine("lmdeploy").static_first_alone and not load_engine("vllm").static_first_alone
    model, engine = load_model("llama2-7b"), load_engine("lmdeploy")
    plan, workload = ServePlan(batch=16), Workload(input_len=128, output_len=128, static=True)
    setting = Setting(model, A100.cluster(1), plan_columns(plan), plan.quant, engine, workload)
    alone = float(setting.time(0.0, 127, 1) + setting.time(1))
    group = alone + float(setting.time(0.0, 15 * 127, 15) + setting.time(16))
    m = serve_estimate(model, A100.cluster(1), plan, workload, engine).metrics
    assert m.ttft == pytest.approx((alone + 15 * group) / 16)
    together = serve_estimate(model, A100.cluster(1), plan, workload, engine.with_(static_first_alone=False)).metrics
    assert together.ttft == pytest.approx(float(setting.time(0.0, 16 * 127, 16) + setting.time(16)))
    assert m.ttft > together.ttft  # the others wait for the first's iteration
    assert m.tpot == pytest.approx(together.tpot)  # the decode step is the batch's either way
    one = serve_estimate(model, A100.cluster(1), ServePlan(batch=1), workload, engine).metrics
    assert one.ttft == pytest.approx(alone)  # a batch of one is its first request


def priced(model: ModelSpec, tp: int, batch: int, prompt: int, out: int) -> tuple[float, float]:
    """TurboMind v0.1's mean TTFT and decode step for a static batch of ``batch`` prompts on ``tp`` A100s."""
    w = Workload(input_len=prompt, output_len=out, static=True)
    m = serve_estimate(model, A100.cluster(tp), ServePlan(tp=tp, batch=batch), w, load_engine("lmdeploy")).metrics
    return float(m.ttft), float(m.tpot)


def test_more_sequences_or_a_longer_prompt_never_shorten_the_mean_first_token():
    """Random draws over models, tensor parallelism, batch and lengths (the KV cache overflowing into waves at the
    larger ones): one more sequence, or a longer prompt, never shortens the mean TTFT."""
    rng = random.Random(79)
    for _ in range(DRAWS):
        model = load_model(rng.choice(("llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b")))
        tp = rng.choice((1, 2, 4, 8))
        b, inp, out = rng.randint(1, 96), rng.choice((1, 2, 128, 512, 2048)), rng.choice((1, 128, 2048))

        (base, step), (more, more_step) = priced(model, tp, b, inp, out), priced(model, tp, b + 1, inp, out)
        where = f"{model.name} tp {tp} B {b} {inp} x {out}"
        # the decode step itself is not monotone in B at some sizes (e.g. Llama 2 13B at tp 8: T(33) < T(32) by
        # 0.5 %, the GEMMs' shapes), and the mean TTFT holds one: it falls by no more than the step does
        if np.isfinite(base):
            assert more >= base * (1 - RTOL) + min(0.0, more_step - step), where
        assert priced(model, tp, b, inp + rng.randint(1, 512), out)[0] >= base * (1 - RTOL), where


def test_an_engine_that_starts_the_batch_together_is_unchanged():
    """Without the flag the batch's prompts enter together: TTFT = the first-token step of all B."""
    model, plan = load_model("llama3-8b"), ServePlan(batch=8)
    workload = Workload(input_len=512, output_len=64, static=True)
    engine = Engine(last_prompt_token_decoded=True)
    setting = Setting(model, A100.cluster(1), plan_columns(plan), plan.quant, engine, workload)
    m = serve_estimate(model, A100.cluster(1), plan, workload, engine).metrics
    assert m.ttft == pytest.approx(float(setting.time(0.0, 8 * 511, 8) + setting.time(8)))
