"""vLLM V0's scheduler, block by block, on a static batch that overflows its KV cache (issue 79), priced with
meshplan's per-iteration costs; and a sweep of the KV-cache pool: is the batch's wall time monotone in memory?

The scheduler as vllm-project/vllm vllm/core/scheduler.py and core/block_manager_v1.py of the v0.5 / v0.6.0-0.6.1
line (the engines of LLM-Inference-Bench's vLLM runs: presets/engines/vllm-v0.toml, vllm-v0.6-rocm.toml):

- ``_schedule_default``: when nothing is swapped, waiting groups are scheduled first (``_schedule_prefills``), and an
  iteration that scheduled a prompt runs no decode; otherwise ``_schedule_running`` decodes the running groups.
- ``_schedule_prefills``: the head of the waiting queue is admitted while ``can_allocate`` says OK (block_manager_v1:
  its ⌈len / block_size⌉ blocks leave at least ``watermark_blocks`` = int(0.01 · num_gpu_blocks) free) and the
  ``SchedulingBudget`` holds it (max_num_batched_tokens prompt tokens, max_num_seqs sequences counting the running
  ones); it stops at the first that does not fit (LATER), FCFS.
- ``_schedule_running``: the running queue sorted by arrival (``fcfs`` policy); for each group, oldest first, while
  ``can_append_slots`` fails (v1: fewer free blocks than the group's running sequences, one each) the newest group
  (``running_queue.pop()``) is preempted, or the group itself when it is the last; ``_preempt`` of a one-sequence
  group is RECOMPUTE: its blocks freed, its output kept (sequence.py ``reset_state_for_recompute``) and the group put
  back at the head of the waiting queue (``self.waiting.extendleft(preempted)``: the oldest preempted first); on its
  return prompt and output are prefilled again, in one prefill that samples its next token. ``append_slots`` takes
  a new block when the sequence's tokens pass its last one's.
- a sequence that has its O tokens is freed after the iteration that sampled the last (``free_finished_seq_groups``).

The model of one iteration: a prefill of k prompts of n tokens in all, ``Setting.time(0, n, k)``; a decode of d
sequences, ``Setting.time(d)`` (serve/metrics.py), both the static batch's own costs. Nothing here is fitted.

Run (about a minute):
    PYTHONPATH=src:. python benchmarks/measure/vllm_v0_static_sim.py
"""

from __future__ import annotations

import argparse
import math
from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT
from meshplan.serve.memory import memory
from meshplan.serve.metrics import Setting, instance, static_capacity
from meshplan_validation.serving_eval import setting
from meshplan_validation.serving_map import case_of

WATERMARK = 0.01  # CacheConfig / BlockSpaceManagerV1 watermark default


@dataclass(frozen=True)
class Batch:
    """A static batch of B prompts of I tokens, O out, on a pool of ``blocks`` blocks of ``block_size`` tokens."""

    batch: int
    input_len: int
    output_len: int
    blocks: int
    block_size: int = 16
    max_batched_tokens: int = 8192
    max_seqs: int = 256


@dataclass(frozen=True)
class Trace:
    """The iterations the scheduler ran: decode batch sizes, and prefills as (tokens, prompts)."""

    decodes: list[int]
    prefills: list[tuple[int, int]]
    preemptions: int
    recomputed_tokens: int


def simulate(b: Batch) -> Trace:
    """The scheduler's iterations for one static batch (module docstring), to the last sequence's last token."""
    size, total = b.block_size, b.blocks
    mark = int(WATERMARK * total)
    gen = [0] * b.batch  # tokens each sequence has sampled
    held = [0] * b.batch  # blocks each holds
    waiting: deque[int] = deque(range(b.batch))
    running: list[int] = []
    free = total
    decodes: list[int] = []
    prefills: list[tuple[int, int]] = []
    preemptions = recomputed = 0
    prompt_limit = b.max_batched_tokens  # min(max_model_len, max_num_batched_tokens)
    while waiting or running:
        admitted: list[int] = []
        tokens = 0
        while waiting:  # _schedule_prefills
            i = waiting[0]
            n = b.input_len + gen[i]
            if n > prompt_limit:
                raise ValueError(f"sequence of {n} tokens above the prompt limit {prompt_limit}")
            need = -(-n // size)
            if total - need < mark:
                raise ValueError("a sequence the cache can never hold (AllocStatus.NEVER)")
            if free - need < mark:
                break  # AllocStatus.LATER
            if tokens + n > b.max_batched_tokens or len(running) + len(admitted) + 1 > b.max_seqs:
                break
            waiting.popleft()
            free -= need
            held[i] = need
            tokens += n
            if gen[i]:
                recomputed += n
            admitted.append(i)
        if admitted:
            prefills.append((tokens, len(admitted)))
            running += admitted
            stepped = admitted
        else:  # _schedule_running
            queue = deque(sorted(running))
            stepped, preempted = [], []
            while queue:
                i = queue.popleft()
                victim = -1
                while free < 1:  # can_append_slots (v1): a free block per running sequence
                    victim = queue.pop() if queue else i
                    free += held[victim]
                    held[victim] = 0
                    preempted.append(victim)
                    preemptions += 1
                    if victim == i:
                        break
                if victim == i:
                    break
                if -(-(b.input_len + gen[i]) // size) > held[i]:  # append_slots: the token's slot
                    held[i] += 1
                    free -= 1
                stepped.append(i)
            waiting.extendleft(preempted)
            running = stepped
            decodes.append(len(stepped))
        for i in stepped:
            gen[i] += 1
            if gen[i] == b.output_len:
                free += held[i]
                held[i] = 0
        running = [i for i in running if gen[i] < b.output_len]
    return Trace(decodes, prefills, preemptions, recomputed)


def wall_time(s: Setting, t: Trace) -> float:
    """Seconds of the trace's iterations at meshplan's per-iteration costs (module docstring)."""
    d = np.bincount(np.asarray(t.decodes, dtype=int), minlength=2).astype(float)
    sizes = np.flatnonzero(d)
    with np.errstate(all="ignore"):
        decode = float(np.sum(d[sizes] * np.asarray(s.time(sizes.astype(float)), dtype=float))) if len(sizes) else 0.0
        if not t.prefills:
            return decode
        p = np.asarray(t.prefills, dtype=float)
        prefill = np.asarray(s.time(0.0, p[:, 0], p[:, 1], 0.0), dtype=float)
    return decode + float(np.sum(prefill))


def pool_blocks(s: Setting) -> int:
    """The KV-cache pool of the setting's accelerator, in blocks (serve/memory.py)."""
    e = s.engine
    mem = memory(s.model, s.cluster.accelerator.hbm_bytes, s.cols, s.quant, e, e.block_size)
    return int(np.floor(float(mem.kv_pool) / float(mem.sequence)))


def with_hbm(s: Setting, scale: float) -> Setting:
    """The setting on an accelerator of ``scale`` times the HBM."""
    acc = s.cluster.accelerator
    return replace(s, cluster=replace(s.cluster, accelerator=replace(acc, hbm_bytes=acc.hbm_bytes * scale)))


def batch_of(s: Setting) -> Batch:
    w, e = s.workload, s.engine
    return Batch(int(s.micro_batch), w.input_len, w.output_len, pool_blocks(s), e.block_size,
                 int(e.max_batched_tokens), int(e.max_seqs))


def rate(s: Setting) -> tuple[float, float, int]:
    """(simulated, meshplan's) output tokens/s of the static batch, and the pool's blocks."""
    b = batch_of(s)
    try:
        sim = b.batch * b.output_len / wall_time(s, simulate(b))
    except ValueError:  # a sequence the pool never holds: vLLM ignores it, meshplan does not run the batch
        sim = 0.0
    return sim, float(np.asarray(instance(s).tokens_per_s)), b.blocks


def drops(xs: list[float]) -> tuple[int, float]:
    """How often a larger memory is slower than the best at a smaller one, and by at most what share."""
    best, n, worst = -math.inf, 0, 0.0
    for x in xs:
        if x < best * (1 - 1e-12):
            n += 1
            worst = max(worst, 1 - x / best)
        best = max(best, x)
    return n, worst


def overflowing() -> list[tuple[str, Setting, float]]:
    """The Argonne static runs whose batch overflows the KV cache (C < B), as priced (serving_eval.setting), with
    their measured output tokens/s (the CSV's total tokens/s · O / (I + O))."""
    from benchmarks.measure.argonne_worst_fifth import records  # noqa: PLC0415 (a script's helper)

    out = []
    for rid, rec in sorted(records().items()):
        case = case_of(rec)
        if isinstance(case, str) or case.mode != "static":
            continue
        s = setting(case, case.plan.batch, SERVE_DEFAULT)
        if float(static_capacity(s)) < float(s.micro_batch):
            w = s.workload
            out.append((rid, s, rec["measured"]["total_tokens_per_s"] * w.output_len / (w.input_len + w.output_len)))
    return out


def affine(b: Batch, fixed: float, row: float, token: float) -> float:
    """Seconds of the trace at an affine cost: ``fixed`` per iteration, ``row`` per decoded sequence, ``token`` per
    prefilled token (no tile or graph staircase: the scheduler's own effect)."""
    t = simulate(b)
    return fixed * (len(t.decodes) + len(t.prefills)) + row * sum(t.decodes) + token * sum(n for n, _ in t.prefills)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=57, help="HBM scales from 0.6x to 2x")
    args = parser.parse_args()
    scales = np.linspace(0.6, 2.0, args.points)
    print("run | C | blocks | measured tok/s | simulated (error) | waves (error) | HBM 0.6-2x: drops below the best at "
          "a smaller HBM, simulated / waves (count, largest) | fitting batch fastest (simulated / waves)")
    for rid, s, measured in overflowing():
        sim, mp, blocks = rate(s)
        swept = [rate(with_hbm(s, float(f))) for f in scales]
        ns, ws = drops([r[0] for r in swept])
        nm, wm = drops([r[1] for r in swept])
        fits = [float(static_capacity(with_hbm(s, float(f)))) >= float(s.micro_batch) for f in scales]
        top = [min((r[k] for r, f in zip(swept, fits, strict=True) if f), default=math.nan) for k in (0, 1)]
        low = [max((r[k] for r, f in zip(swept, fits, strict=True) if not f), default=math.nan) for k in (0, 1)]
        fastest = " / ".join(str(a >= b) if a == a else "never fits" for a, b in zip(top, low, strict=True))
        cap = float(static_capacity(s))
        print(f"{rid.removeprefix('llminfbench_vllm_')} | {cap:.0f} | {blocks} | {measured:.1f} | "
              f"{sim:.1f} ({100 * (sim / measured - 1):+.1f} %) | {mp:.1f} ({100 * (mp / measured - 1):+.1f} %) | "
              f"{ns}, {100 * ws:.2f} % / {nm}, {100 * wm:.2f} % | {fastest}")


if __name__ == "__main__":
    main()
