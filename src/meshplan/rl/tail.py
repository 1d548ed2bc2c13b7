"""A quick rollout: the thinning batch in closed form, the search's screen before the simulation (rollout.py).

One instance gets n = N / R of the responses (R instances) and holds at most C of them at once: its running limit
(``ServePlan.batch``, the engine's max_num_seqs per attention group), or what its KV cache holds at a sequence's mean
resident context (I + Ō/2 tokens), whichever is less (serve/load/scheduler.py's figures). Priced with the
simulation's own iteration prices (serve/load/prices.py: serve's step model on a grid):

- refill: while more than C responses wait, the engine runs full: the first n − C responses' tokens at C per
  iteration, each iteration priced at C decodes at the mean context, with the prompt chunks that refill it (C / Ō
  prompts per iteration on average);
- drain: the last min(n, C) responses, whose lengths are the job's distribution, end one by one: at token step k
  the running sequences are those longer than k, r(k) = #{L ≥ k}, each priced at r(k) decodes at context I + k: the
  tail, which the longest response ends;
- the prompts of the first wave prefilled in the engine's token budget per iteration.

It omits preemption (the simulation has it) and the refill's lumpiness; the search ranks pairings by it and then
simulates the best of each set-up.
"""

from __future__ import annotations

import math

import numpy as np

from meshplan.rl.job import RLJob
from meshplan.rl.rollout import Rollout, steady_rate
from meshplan.serve.engine import Engine
from meshplan.serve.load.prices import Prices, prices
from meshplan.serve.load.scheduler import scheduler
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


def drain(price: Prices, lengths: np.ndarray, input_len: int) -> float:
    """Seconds for a wave of ``lengths`` responses to end, token step by token step (module docstring): the steps
    grouped where the running count r(k) stays the same, each group priced at its middle context."""
    longest = int(lengths.max())
    running = len(lengths) - np.searchsorted(np.sort(lengths), np.arange(longest), side="right")  # #{L > k}
    starts = np.r_[0, np.flatnonzero(np.diff(running)) + 1]
    ends = np.r_[starts[1:], longest]
    return float(sum((e - b) * price(float(running[b]), 0.0, input_len + (b + e) / 2)
                     for b, e in zip(starts, ends, strict=True)))


def screened(model: ModelSpec, pool: Cluster, plan: ServePlan, engine: Engine, job: RLJob, lengths: np.ndarray,
             memo: dict | None = None) -> Rollout:
    """The quick rollout of ``lengths`` on ``plan``'s instances (module docstring)."""
    memo = {} if memo is None else memo
    key = ("prices", plan, pool.num_gpus, engine)
    if key not in memo:
        memo[key] = prices(model, pool, plan, engine, job.input_len + int(lengths.max()))
    price = memo[key]
    hit = (job.samples_per_prompt - 1) / job.samples_per_prompt
    sched = scheduler(model, pool, plan, engine, hit)
    mean = float(lengths.mean())
    steady = steady_rate(model, pool, plan, engine, job)
    fits_kv = sched.kv_tokens / max(job.input_len + mean / 2, 1.0)
    capacity = int(max(1, min(sched.max_seqs, fits_kv)))
    if sched.kv_tokens < job.input_len + int(lengths.max()):
        return Rollout(float("inf"), int(lengths.sum()), int(lengths.max()), 0.0, steady, method="closed form",
                       reasons=(f"a response of {job.input_len + int(lengths.max()):,} tokens exceeds the KV cache of "
                                f"one instance ({plan.describe()})",))
    n = math.ceil(len(lengths) / plan.replicas)
    fresh = job.input_len - sched.cached(job.input_len)
    share = np.sort(lengths)[::plan.replicas][:n]
    wave = min(n, capacity)
    prefill = math.ceil(wave * fresh / sched.budget) * price(0.0, float(sched.budget), float(job.input_len))
    last = share[-wave:]  # the responses still running when the queue empties: the long ones outlast the others
    refill_tokens = float(share.sum() - last.sum())
    refill = refill_tokens / wave * price(float(wave), wave / mean * fresh, job.input_len + mean / 2)
    tail = drain(price, last, job.input_len)
    seconds = prefill + refill + tail
    tokens = int(lengths.sum())
    return Rollout(seconds=seconds, tokens=tokens, longest=int(lengths.max()), tokens_per_s=tokens / seconds,
                   steady_tokens_per_s=steady, method="closed form")
