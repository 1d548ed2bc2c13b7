"""A static batch that overflows its KV cache (issue 79): where more KV memory never slows it, in nature and in
meshplan (data/measured/2026-12-01-vllm-v0-static-overflow-not-monotone.md).

Nature here is vLLM V0's scheduler (benchmarks/measure/vllm_v0_static_sim.py: vllm/core/scheduler.py and
core/block_manager_v1.py of v0.5-0.6.1, block by block). It is NOT monotone in memory while the batch overflows:

- it admits a prompt while the prompt's own pages fit (``can_allocate``), with no look-ahead to its last token, so one
  more block can admit a prompt the pool cannot carry: it is preempted and prefilled again (one more iteration);
- a larger pool preempts later, so each preempted sequence is recomputed longer (more prompt + output tokens).

What holds, in the scheduler (where a decode row costs less than prefilling a whole prompt) and in meshplan's waves
(serve/metrics.py ``_static``): a pool that holds the whole batch to its last token is never slower than any smaller
pool, so more KV memory never slows a static batch that the larger memory holds."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
from benchmarks.measure.vllm_v0_static_sim import Batch, Trace, simulate

from meshplan.serve.engine import engine_names, load_engine
from meshplan.serve.metrics import Setting, instance, static_capacity
from meshplan.serve.plan import Workload
from meshplan.serve.space import QUANTS
from meshplan.specs.hardware import load_system, system_names
from meshplan.specs.model_load import load_model
from test_serve_properties import servable_models

DRAWS = 24
SCALES = np.geomspace(0.3, 4.0, 12)  # the accelerator's HBM, times the preset's


def affine(t: Trace, fixed: float, row: float, token: float) -> float:
    """Seconds of a trace at ``fixed`` per iteration, ``row`` per decoded sequence, ``token`` per prefilled token."""
    return fixed * (len(t.decodes) + len(t.prefills)) + row * sum(t.decodes) + token * sum(n for n, _ in t.prefills)


def test_one_more_block_admits_a_prompt_the_pool_cannot_carry_and_slows_the_batch():
    # 6 prompts of 5 tokens, 3 out, blocks of one token: each sequence ends holding 5 + 3 - 1 = 7 (the last token is
    # sampled, never cached). 14 blocks admit two prompts (10 blocks; a third's 5 do not fit the 4 left), which run to
    # their end in 7 + 7 = 14: three rounds of a prefill of 2 and two decodes of 2, 9 iterations.
    at14 = simulate(Batch(6, 5, 3, 14, block_size=1))
    assert at14 == Trace(decodes=[2] * 6, prefills=[(10, 2)] * 3, preemptions=0, recomputed_tokens=0)
    # 15 blocks admit three (15 blocks, none left): the first decode finds no free block and preempts the newest,
    # which has sampled one token, so it comes back as 5 + 1 = 6 tokens prefilled again beside the fourth prompt.
    at15 = simulate(Batch(6, 5, 3, 15, block_size=1))
    assert at15 == Trace(decodes=[2, 2, 2, 2, 2, 1], prefills=[(15, 3), (11, 2), (5, 1), (5, 1)], preemptions=1,
                         recomputed_tokens=6)
    # 10 iterations for 9, 36 prefilled tokens for 30, one decode row fewer: slower whenever an iteration's fixed
    # cost and 6 prefilled tokens outweigh one decode row (1 + 6 * 0.1 > 0.5 here).
    assert affine(at15, 1.0, 0.5, 0.1) - affine(at14, 1.0, 0.5, 0.1) == pytest.approx(1.0 + 6 * 0.1 - 0.5)
    # the pool that holds all six to their end, 6 * 7 = 42 blocks (int(0.01 * 42) = 0 watermark): one prefill of
    # the six, two decodes of six, 3 iterations, the fewest.
    assert simulate(Batch(6, 5, 3, 42, block_size=1)) == Trace(decodes=[6, 6], prefills=[(30, 6)], preemptions=0,
                                                                 recomputed_tokens=0)


def test_a_larger_pool_preempts_later_and_recomputes_longer_sequences():
    # H100 Llama-2-7B, batch 64 of 2048 + 2048 (LLM-Inference-Bench's run, block_size 16): 8052 and 8163 blocks run
    # the same 4094 decode iterations and 30 prefills, but the larger pool preempts once more and later, so 3358 more
    # tokens are prefilled again: slower at any cost where a prefilled token is not free.
    small, large = (simulate(Batch(64, 2048, 2048, n)) for n in (8052, 8163))
    assert (len(small.decodes), len(small.prefills), len(large.decodes), len(large.prefills)) == (4094, 30, 4094, 30)
    assert (small.preemptions, large.preemptions) == (31, 32)
    assert (small.recomputed_tokens, large.recomputed_tokens) == (88018, 91376)
    assert sum(small.decodes) - sum(large.decodes) == 1


def test_in_the_scheduler_a_pool_that_holds_the_batch_is_never_slower_than_a_smaller_one():
    """Random small batches, every smaller pool, an affine cost whose decode row is cheaper than one prompt's prefill
    (I + 1 tokens): with a dearer row, preempting turns decode rows into a cheaper prefill and the property fails."""
    rng = random.Random(3)
    for _ in range(30):
        b, i, o, size = rng.randint(2, 12), rng.randint(1, 24), rng.randint(2, 24), rng.choice((1, 2, 16))
        fixed, token = rng.random(), rng.random()
        row = rng.random() * token * (i + 1)
        pages = -(-(i + o) // size)
        holds = b * pages + int(0.011 * b * pages) + 1  # every sequence's pages to its end, above the watermark
        whole = affine(simulate(Batch(b, i, o, holds, block_size=size)), fixed, row, token)
        for blocks in range(pages, holds):
            try:
                t = simulate(Batch(b, i, o, blocks, block_size=size))
            except ValueError:  # a sequence the pool never holds (AllocStatus.NEVER): not run
                continue
            assert affine(t, fixed, row, token) >= whole * (1 - 1e-12), (b, i, o, size, blocks)


def test_more_kv_memory_never_slows_a_static_batch_that_the_larger_memory_holds():
    """meshplan's static batch over seeded random (model, system, engine, precision, lengths, batch) draws, its HBM
    scaled 0.3-4x: the rate wherever the cache holds the batch is at least the rate at any HBM where it overflows."""
    rng = random.Random(7)
    models, systems, engines = servable_models(), sorted(system_names()), engine_names()
    checked = 0
    while checked < DRAWS:
        model = load_model(rng.choice(models))
        tp = rng.choice([t for t in (1, 2, 4, 8) if model.num_heads % t == 0])
        cluster = load_system(rng.choice(systems)).cluster(tp)
        cols = {"tp": tp, "pp": 1, "dpa": 1, "ep": 1, "batch": rng.choice((8, 32, 128, 256)), "replicas": 1,
                "prefill_replicas": 0}
        work = Workload(input_len=rng.choice((128, 1000, 4096)), output_len=rng.choice((16, 256, 2048)), static=True)
        s = Setting(model, cluster, cols, rng.choice(QUANTS), load_engine(rng.choice(engines)), work)
        rates, holds = [], []
        for f in SCALES:
            acc = cluster.accelerator
            at = replace(s, cluster=replace(cluster, accelerator=replace(acc, hbm_bytes=acc.hbm_bytes * f)))
            with np.errstate(all="ignore"):
                rates.append(float(np.asarray(instance(at).tokens_per_s)))
            holds.append(float(np.asarray(static_capacity(at))) >= cols["batch"])
        if all(holds) or not any(holds):
            continue
        checked += 1
        held = min(r for r, h in zip(rates, holds, strict=True) if h)
        assert all(r <= held * (1 + 1e-9) for r, h in zip(rates, holds, strict=True) if not h), (model.name, s)
