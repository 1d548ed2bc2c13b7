"""vLLM V0's scheduler on a static batch that overflows its KV cache (issue 79), in closed form: the decode steps,
their batches and the recomputed tokens, counted as the scheduler runs them, for arrays of candidates alike.

The scheduler (vllm-project/vllm vllm/core/scheduler.py, core/block_manager_v1.py, v0.5 to v0.6.1; replayed block by
block in benchmarks/measure/vllm_v0_static_sim.py, data/measured/2026-12-01-vllm-v0-static-overflow-not-monotone.md):
``_schedule_prefills`` admits prompts while their prompt pages fit (``can_allocate``), no look-ahead to the last
token; ``_schedule_running`` preempts the newest while a running sequence finds no free block (``can_append_slots``,
``running_queue.pop()``); ``_preempt_by_recompute`` keeps the output (sequence.py ``reset_state_for_recompute``) and
``self.waiting.extendleft`` puts the preempted back at the head of the queue, prompt and output prefilled again when
the oldest finish. So the batch is not run in waves of whole sequences: the pool stays full, and a preempted
sequence comes back with its progress kept.

Fluid limit (sequences as a continuum, the pool P = C·(I + O) tokens, C = ``static_capacity``):

- the first admission takes A = min(B, P / I, max_num_seqs) prompts; they decode together for t₀ = P / A − I steps,
  then the newest are preempted so that n(t) = P / (I + t) run at step t, down to C at the last, O − 1: the oldest
  run O − 1 decode steps, with A·t₀ + P·ln((I + O − 1) / (I + t₀)) decode rows;
- the j-th preempted holds P / j tokens when it goes: P·ln(A / C) tokens recomputed in all;
- the rest of the B·(O − 1) rows, R, run after the oldest finish. A full pool runs R_f = A_f·t₀f + P·ln(...) rows
  in O − 1 steps (A_f = min(P / I, max_num_seqs)). Where every prompt was admitted and R fits one full pool, the
  rest lasts the longest remaining run, O − 1 − t₀ (the first preempted, its output kept); otherwise whole runs of
  O − 1 steps, ⌈R / R_f⌉ (a prompt admitted after the oldest finish still decodes O − 1 steps), each full pool but
  the last recomputing P·ln(A_f / C) tokens; the rest's batch is its rows over its steps.

Against the block-by-block replay at meshplan's costs, on Argonne's 15 overflowing static runs: wall time within
3.3 % (decode steps within 4 %, except −6 % where B ≥ 3.9·C); on synthetic batches of B ≥ 3.9·C it counts up to
14 % fewer steps (tests/test_static_preemption.py). pre21's fluid cycles, the same first admission, restarted
every preempted sequence as a whole one (data/measured/2026-11-30-vllm-v0-preemption-unpriced.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.xp import Num


def _rows(pool: Num, admitted: Num, inp: int, out: int) -> tuple[Num, Num]:
    """Decode rows of ``admitted`` sequences sharing a ``pool`` of tokens over O − 1 steps (the newest preempted
    once the pool is full), and the step t₀ at which it fills."""
    t0 = np.clip(pool / admitted - inp, 0.0, out - 1.0)
    return admitted * t0 + pool * np.log((inp + out - 1.0) / (inp + t0)), t0


@dataclass(frozen=True)
class Overflowed:
    """The scheduler's counts for a static batch (module docstring), element-wise: the first admission and its
    steps at the full batch, the oldest's tail, the steps after the oldest finish, the recomputed tokens and
    sequences."""

    admitted: Num  # A: prompts the first admission takes
    full_steps: Num  # t₀: decode steps of all A
    tail_steps: Num  # O − 1 − t₀: steps of the oldest once the newest are preempted
    tail_rows: Num  # decode rows in those steps
    rest_steps: Num  # steps after the oldest finish
    rest_rows: Num  # decode rows in those steps
    recomputed_tokens: Num
    recomputed: Num  # sequences prefilled again

    @property
    def steps(self) -> Num:
        """Decode steps in all."""
        return self.full_steps + self.tail_steps + self.rest_steps


def schedule(batch: Num, cap: Num, inp: int, out: int, max_seqs: float) -> Overflowed:
    """The counts of ``batch`` sequences of ``inp`` + ``out`` tokens on a pool that holds ``cap`` of them to their last
    token, P = cap·(I + O) tokens (module docstring)."""
    b, c = np.asarray(batch, dtype=float), np.maximum(np.asarray(cap, dtype=float), 1e-9)
    pool = c * (inp + out)
    full = np.maximum(np.minimum(pool / inp, max_seqs), c)
    admitted = np.maximum(np.minimum(b, full), c)
    rows, t0 = _rows(pool, admitted, inp, out)
    need = b * (out - 1.0)
    rows = np.minimum(rows, need)
    rest = np.maximum(need - rows, 0.0)
    full_rows, _ = _rows(pool, full, inp, out)
    longest = np.where(b > admitted, out - 1.0, out - 1.0 - t0)
    # full pools' worth of rows left after the oldest finish (none where one output token leaves no decode row)
    more = np.where(full_rows > 0, rest / np.where(full_rows > 0, full_rows, 1.0), 0.0)
    pools = np.where((b > admitted) | (more > 1), np.ceil(more - 1e-9), more)  # whole runs of O - 1: see above
    steps = np.where(rest > 0, np.maximum(longest, (out - 1.0) * pools), 0.0)
    again = np.maximum(more - 1.0, 0.0)  # full pools after the first that preempt in turn
    tokens = pool * (np.log(admitted / c) + again * np.log(full / c))
    return Overflowed(admitted=admitted, full_steps=t0, tail_steps=out - 1.0 - t0, tail_rows=rows - admitted * t0,
                      rest_steps=steps, rest_rows=rest, recomputed_tokens=tokens,
                      recomputed=admitted - c + again * (full - c))


def recompute_kept(time: Callable[..., Num], batch: Num, cap: Num, shape: tuple[int, int, float],
                   prompts: Callable[[Num], Num]) -> Num:
    """Seconds of a static batch of ``batch`` sequences on a pool that holds ``cap`` of them to their last token
    (``schedule``; ``shape``: the input and output lengths and the engine's max_num_seqs): fresh prefills
    (``prompts``: n prompts to their first token), recomputed prefills (one prefill of the recomputed tokens) and
    decode steps at their mean batches, element-wise; ``time``: an iteration's seconds (metrics.Setting.time)."""
    k = schedule(batch, cap, *shape)
    b = np.asarray(batch, dtype=float)

    def steps(n: Num, rows: Num) -> Num:  # n steps of rows / n sequences each
        return np.where(n > 0, n * time(np.where(n > 0, rows / np.maximum(n, 1e-9), 1.0)), 0.0)

    with np.errstate(divide="ignore", invalid="ignore"):
        decode = k.full_steps * time(k.admitted) + steps(k.tail_steps, k.tail_rows) + steps(k.rest_steps,
                                                                                               k.rest_rows)
        again = time(0.0, np.maximum(k.recomputed_tokens, 1.0), np.maximum(k.recomputed, 1.0), 0.0)
        recompute = np.where(k.recomputed_tokens > 0, again, 0.0)
    fresh = prompts(k.admitted) + np.where(b > k.admitted, prompts(np.maximum(b - k.admitted, 1.0)), 0.0)
    return fresh + recompute + decode
