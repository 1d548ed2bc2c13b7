"""Serving metrics from iteration times: time to first token (TTFT), time per output token (TPOT, the mean
inter-token latency), end-to-end latency, output tokens/s per instance, per GPU and in all, requests/s, in the
steady state of continuous batching, for scalars or arrays of configurations alike.

Each instance keeps B sequences in flight (plan.py); a sequence leaves after O tokens and a new one takes its place,
so on average B/O prompts of I tokens enter per iteration, B·I/O prompt tokens (the closed loop of a benchmark at
fixed concurrency; queueing before admission is not modelled). How they enter (engine.prefill):

- ``chunked`` (Sarathi-Serve, Agrawal et al. 2024, §4.1-4.3; vLLM V1, SGLang, TensorRT-LLM with chunked context): an
  iteration carries the decoding sequences and a chunk of prompt tokens, at most ``max_batched_tokens`` − D of them.
  A chunk holds one waiting prompt (or several when they are short), and a share f = (B·I/O) / chunk of the
  iterations carry one: TPOT = f·T(D + chunk) + (1 − f)·T(D). When the prompts need more than the budget, admission
  is what limits: the decode batch shrinks to the budget's B = budget·O/I. TTFT: the prompt's ⌈I / budget⌉
  iterations, plus half an iteration's wait.
- ``whole`` (TensorRT-LLM's in-flight batching with context chunking off: its microBatchScheduler puts the decodes,
  then whole prompts while they fit ``max_num_tokens``, in one iteration, NVIDIA/TensorRT-LLM
  cpp/tensorrt_llm/batch_manager/microBatchScheduler.cpp): as ``chunked``, the budget in whole prompts,
  ⌊budget / I⌋·I tokens, and a prompt's TTFT one iteration; a prompt above the budget is refused (check.PROMPT).
- ``separate`` (Orca's iteration-level scheduling with whole prompts, Yu et al. 2022; vLLM V0's default): prompts
  run in iterations of their own, m = ⌊budget / I⌋ at a time, stalling the B decoding sequences: each of them
  waits through B/m such iterations during its O tokens: TPOT = T(D) + (B/m)·T_prefill(m)/O.
- a static batch (``Workload.static``, FasterTransformer-style latency tables): B prompts prefilled together, then
  O − 1 decode steps: E2E = T_prefill(B) + (O − 1)·T(B). An engine whose context step leaves each prompt's last token
  to the decode step (``Engine.last_prompt_token_decoded``, TurboMind v0.1) samples the first tokens there: TTFT =
  T_context(B prompts of I − 1) + T(B), and O decode steps in all; one that runs the first request alone
  (``Engine.static_first_alone``, TurboMind v0.1 under LMDeploy's benchmark) starts the other B − 1 after it.
- disaggregated (DistServe, Zhong et al. 2024, §2.3 and §4; Splitwise, Patel et al. 2024, §4): prefill instances run
  the prompts (separate mode) and ship their KV cache to the decode instances, which only decode: TPOT = T(D) with
  no prefill in it; the system serves min(prefill capacity, decode capacity) requests/s; TTFT adds the KV transfer.
Throughput = sequences in flight / the mean token step (one token per sequence per step, every prompt paid); one
request's TPOT and TTFT meet the prompts of the other B − 1 only (its own successor enters after it leaves), and a
lone sequence (B = 1) finds the engine idle: no iteration in flight to wait for (``_others``). A prompt whose first
``cached_len`` tokens are in the prefix cache (plan.Workload, plan.cached_tokens) prefills only the rest, past that
prefix, in every regime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np

from meshplan.collectives.price import collective_time
from meshplan.cost.decode import Shape
from meshplan.cost.kv_cache import token_bytes
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.engine import Engine
from meshplan.serve.iteration import EXPERT_PATH, extra_kernel_time, gap_time, token_time
from meshplan.serve.memory import memory
from meshplan.serve.plan import PlanColumns, Workload
from meshplan.serve.precision import Quant
from meshplan.specs.hardware import Cluster
from meshplan.specs.host_cost import EAGER_OP_HOST
from meshplan.specs.model import ModelSpec
from meshplan.xp import Num, maximum, minimum, where

TRAFFIC = ("moe/dispatch", "moe/combine")  # what two-batch overlap hides behind the other half's work
N = TypeVar("N", bound=Num)  # float for one priced configuration (ServeEstimate), Num over arrays


@dataclass(frozen=True)
class Metrics(Generic[N]):
    """A deployment's latencies and throughputs, scalars or one per candidate."""

    ttft: N  # seconds
    tpot: N  # seconds per output token (mean inter-token latency)
    e2e: N  # seconds per request
    instance_tokens_per_s: N  # output tokens/s of one decode instance
    tokens_per_s: N  # output tokens/s of the whole deployment
    requests_per_s: N
    running: N  # sequences in flight per decode instance (after admission limits)
    decode_step: N  # a pure decode token step at the running batch


@dataclass(frozen=True)
class Setting:
    """What every iteration of one configuration shares (plan columns as scalars or arrays)."""

    model: ModelSpec
    cluster: Cluster
    cols: PlanColumns
    quant: Quant
    engine: Engine
    workload: Workload
    eff: ServeEfficiency = SERVE_DEFAULT

    def time(self, decode: Num, prefill: Num = 0.0, prompts: Num = 0.0, prefix: Num = 0.0) -> Num:
        """Seconds per token step of a micro-batch with ``decode`` sequences and ``prefill`` prompt tokens."""
        loop = self.engine.loop_speed(self.cluster)
        host = self.engine.host_time(decode + prompts, self.cols["pp"], loop)
        # eager kernels: the GPU runs each as the host issues it, so the step lasts at least the issuing (engine.py)
        layers = self.model.num_layers / self.cols["pp"]
        gpu = maximum(self.gpu_time(decode, prefill, prompts, prefix),
                      self.engine.eager_time(decode, prompts, layers, self.cluster.python_host, self.cols["tp"]))
        gpu = gpu + self.engine.iteration_latency  # the engine's GPU work after the forward pass (engine.py)
        gpu = gpu + self.broadcast_time(decode + prompts)  # the driver's input broadcast to the TP workers
        if self.engine.host.hidden_per_sequence:  # the host's work beside the GPU's step (engine.py)
            gpu = maximum(gpu, self.engine.hidden_time(decode + prompts, self.cols["pp"], loop))
        if self.engine.host.overlapped:  # the host's work hides behind the GPU's (engine.py)
            return maximum(gpu, host)
        return gpu + host

    def broadcast_time(self, sequences: Num) -> Num:
        """Seconds per iteration of the driver's input broadcast to the other tensor-parallel workers
        (``Engine.tp_broadcast_tensors``): per tensor an NCCL broadcast of a per-sequence int64 over the TP group
        (collectives/price.py, NCCL's latency over the group's hops) and the receiving worker's host time for it,
        ``Engine.tp_broadcast_dispatches`` eager dispatches at ``EAGER_OP_HOST`` each; before them, the wait for the
        last of the tp - 1 workers to look at the metadata queue: each looks every ``tp_broadcast_poll`` seconds at a
        phase of its own, uniform, and the latest of k such looks comes k / (k + 1) of an interval after the write on
        average; zero at tp 1."""
        n, poll = self.engine.tp_broadcast_tensors, self.engine.tp_broadcast_poll
        if not n and not poll:
            return 0.0
        tp = self.cols["tp"]
        speed = self.cluster.python_host if self.engine.host_in_python else 1.0
        one = collective_time("broadcast", 8.0 * maximum(sequences, 1.0), tp, 1, self.cluster, self.eff)
        host = self.engine.tp_broadcast_dispatches * EAGER_OP_HOST * speed
        wake = poll * (tp - 1) / tp  # the kernel's timer, not the host's Python: unscaled
        return where(tp > 1, n * (one + host) + wake, 0.0)

    def gpu_time(self, decode: Num, prefill: Num, prompts: Num, prefix: Num) -> Num:
        """The GPU's seconds for the step; with two-batch overlap (``Engine.two_batch_overlap``: SGLang's TBO after
        DeepSeek's inference system, deepseek-ai/profile-data) the batch runs as two halves on two streams, each
        half's expert dispatch and combine beside the other half's computation: 2·max(C(B/2), M(B/2)), M the
        dispatch and combine, C the rest (each half reads the weights again)."""
        sh = self.shape(decode, prefill, prompts, prefix)
        extra = extra_kernel_time(self.model, self.cluster, sh, self.engine, self.eff)  # its own kernels (engine.py)
        extra = extra + gap_time(self.model, self.cluster, sh, self.cols["pp"], self.engine, self.eff)  # their gaps
        if not self.engine.two_batch_overlap:
            return token_time(self.model, self.cluster, sh, self.cols["pp"], self.quant, 0.0, self.eff) + extra
        half = self.shape(decode / 2, prefill / 2, prompts / 2, prefix)
        step = token_time(self.model, self.cluster, half, self.cols["pp"], self.quant, 0.0, self.eff)
        traffic = token_time(self.model, self.cluster, half, self.cols["pp"], self.quant, 0.0, self.eff, TRAFFIC)
        return 2 * maximum(step - traffic, traffic) + 2 * extra  # each half launches every layer's kernels

    def expert_time(self, decode: Num, prefill: Num = 0.0, prompts: Num = 0.0, prefix: Num = 0.0) -> Num:
        """The seconds of ``time`` that the MoE layers' shared work takes: the experts and their token traffic,
        which process every attention group's tokens together (iteration.EXPERT_PATH)."""
        sh = self.shape(decode, prefill, prompts, prefix)
        return token_time(self.model, self.cluster, sh, self.cols["pp"], self.quant, 0.0, self.eff, EXPERT_PATH)

    def shape(self, decode: Num, prefill: Num, prompts: Num, prefix: Num) -> Shape:
        c, q = self.cols, self.quant
        return Shape(tp=c["tp"], dpa=c["dpa"], ep=c["ep"], decode=decode, context=self.workload.decode_context,
                     prefill=prefill, prompts=prompts, prefix=prefix, w_bytes=self.engine.streamed_weight_bytes(q),
                     a_bytes=q.act_bytes, kv_bytes=q.kv_bytes, absorb=self.engine.mla_absorb,
                     gather=self.engine.mode("moe_comm").gather, forwarded=self.engine.mode("moe_comm").forwarded,
                     per_query_head=self.engine.kv_per_query_head,
                     padded=self.engine.graph_padding(decode, prompts),
                     skinny_rows=self.engine.skinny_gemm_rows, skinny_rate=self.engine.skinny_gemm_rate,
                     engine_all_reduce=self.engine.engine_all_reduce)

    @property
    def micro_batch(self) -> Num:
        """Sequences per attention group per pipeline micro-batch: B / (p·dpa)."""
        return self.cols["batch"] / (self.cols["pp"] * self.cols["dpa"])

    @property
    def lanes(self) -> Num:
        """Micro-batches of an instance in flight at once: p stages × dpa attention groups."""
        return self.cols["pp"] * self.cols["dpa"]


@dataclass(frozen=True)
class Instance:
    """One instance's figures (no replica counts): co-located, and as one decode or prefill instance of a
    disaggregated deployment."""

    ttft: Num  # co-located
    tpot: Num
    running: Num  # sequences in flight
    tokens_per_s: Num  # output tokens/s of one co-located instance
    decode_step: Num  # a token step of pure decode at the batch (a disaggregated decode instance's TPOT)
    decode_tokens_per_s: Num  # one decode instance's output tokens/s
    prefill_requests_per_s: Num  # one prefill instance's prompts/s
    split_ttft: Num  # disaggregated: the prefill, the KV transfer, half a decode step


def instance(s: Setting) -> Instance:
    """The regime's per-instance figures (module docstring), at replicas = 1."""
    if s.workload.static:
        return _static(s)
    ttft, tpot, running, decode, step = _chunked(s) if s.engine.mode("prefill").mixed else _separate(s)
    m, prefill = _prefill_batch(s)
    if s.engine.last_prompt_token_decoded:  # a prefill instance runs its prompts to their first token
        prefill = prefill + s.time(m)
    full = decode if _same(running, s.micro_batch) else s.time(s.micro_batch)  # (element-wise: the same prices)
    return Instance(ttft=ttft, tpot=tpot, running=running * s.lanes, tokens_per_s=running * s.lanes / step,
                    decode_step=full, decode_tokens_per_s=s.micro_batch * s.lanes / full,
                    prefill_requests_per_s=m * s.lanes / prefill, split_ttft=prefill + kv_transfer(s) + full / 2)


def _same(a: Num, b: Num) -> bool:
    """Whether ``a`` and ``b`` are the same numbers in the same shape and type."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.all(a == b))


def deployment(one: Instance, replicas: Num, prefill_replicas: Num, output_len: int) -> Metrics[Num]:
    """``replicas`` co-located instances, or with ``prefill_replicas`` > 0 that many prefill instances feeding
    ``replicas`` decode instances: the system serves min(prefill, decode capacity) requests/s (a decode batch the
    prefill pool cannot keep full is the search's smaller batch)."""
    split = np.asarray(prefill_replicas) > 0
    co_total = one.tokens_per_s * replicas
    fed = one.prefill_requests_per_s * prefill_replicas * output_len  # tokens/s the prefill pool can start
    split_total = minimum(one.decode_tokens_per_s * replicas, fed)
    total = where(split, split_total, co_total)
    ttft, tpot = where(split, one.split_ttft, one.ttft), where(split, one.decode_step, one.tpot)
    per_instance = where(split, one.decode_tokens_per_s, one.tokens_per_s)
    running = where(split, one.decode_tokens_per_s * one.decode_step, one.running)  # B·lanes when split
    e2e = ttft + (output_len - 1) * tpot if output_len > 1 else ttft  # (no 0·∞ where a static batch cannot run)
    return Metrics(ttft=ttft, tpot=tpot, e2e=e2e, instance_tokens_per_s=per_instance,
                   tokens_per_s=total, requests_per_s=total / output_len, running=running,
                   decode_step=one.decode_step)


def metrics(s: Setting) -> Metrics[Num]:
    """The configuration's metrics: ``instance`` then ``deployment``."""
    return deployment(instance(s), s.cols["replicas"], s.cols["prefill_replicas"], s.workload.output_len)


def _others(s: Setting) -> tuple[Num, Num]:
    """What one request meets of the others in flight on its micro-batch lane (B sequences): the share of the lane's
    prompts that are not its own successor's, (B − 1)/B (a request decodes beside the prompts of the B − 1 others'
    successors; its own enters after it leaves), and whether an iteration is in flight when it arrives, min(B − 1,
    1): a lone sequence (B = 1) finds the engine idle, so its TTFT is its prefill and its TPOT the decode step, the
    request-level simulation's low-rate limit (serve/load/). The instance's throughput still pays every prompt."""
    b = np.maximum(np.asarray(s.micro_batch, dtype=float), 1.0)
    return 1 - 1 / b, np.minimum(b - 1, 1.0)


def _chunked(s: Setting) -> tuple[Num, Num, Num, Num, Num]:
    """Prompts of I − cached fresh tokens (Workload.fresh_len), each chunk past the cached prefix and the prompt's
    earlier chunks: TTFT, one request's TPOT (beside the others' prompts, ``_others``), the decoding sequences, the
    decode step and the instance's mean token step (beside every prompt: its throughput)."""
    inp, out, budget_tokens = s.workload.fresh_len, s.workload.output_len, s.engine.max_batched_tokens
    cached = s.workload.cached_len
    budget = maximum(budget_tokens - s.micro_batch, 1.0)
    if not s.engine.mode("prefill").chunked:  # whole prompts: as many as the budget holds, at least one
        budget = maximum(np.floor(budget / inp), 1.0) * inp
    running = minimum(s.micro_batch, budget * out / inp)  # admission-bound when the prompts need more than the budget
    need = running * inp / out  # prompt tokens per iteration
    chunk = minimum(budget, maximum(need, inp))
    share = minimum(chunk, inp)  # tokens of one prompt in a chunk
    carried = minimum(need / chunk, 1.0)  # the share of the iterations that carry a chunk
    decode = s.time(running)
    mixed_at = (running, chunk, chunk / share, cached + (inp - share) / 2)
    others, busy = _others(s)
    step, tpot = _with_chunks(s, (carried, carried * others), decode, mixed_at)
    first = minimum(inp, budget)
    ttft = np.ceil(inp / budget) * s.time(running * others, first, 1.0, cached + (inp - first) / 2) + busy * tpot / 2
    return ttft, tpot, running, decode, step


def _with_chunks(s: Setting, shares: tuple[Num, ...], decode: Num, mixed_at: tuple[Num, Num, Num, Num]
                 ) -> list[Num]:
    """The mean token step when a share ``carried`` of each attention group's iterations carries a prompt chunk, for
    each such share of ``shares`` (the mixed step priced once for them all).
    One group (dpa = 1, or groups that take their chunks in the same iterations: ``Engine.dp_balance``): that share
    of the steps is the mixed one. dpa = n groups that schedule their own prompts meet at every MoE layer, so an
    iteration lasts as long as its slowest group ("the iteration time is dominated by the slowest rank", TensorRT-LLM
    tech blog 10, "ADP Balance Strategy", whose balancing gained 1.33x on 8 GB200s): 1 − (1 − f)^n of the iterations
    carry a chunk somewhere, each with f·n / (1 − (1 − f)^n) chunks on average; the MoE layers' shared work
    (``Setting.expert_time``) grows with the chunks present, the rest of the step with the slowest group's."""
    mixed = s.time(*mixed_at)
    n = np.asarray(s.cols["dpa"], dtype=float)
    if s.engine.dp_balance or not np.any(n > 1):
        return [carried * mixed + (1 - carried) * decode for carried in shares]
    shared = s.expert_time(*mixed_at) - s.expert_time(mixed_at[0])
    out = []
    for carried in shares:
        somewhere = 1 - (1 - carried) ** n
        chunks = np.where(somewhere > 0, carried * n / np.maximum(somewhere, 1e-30), 1.0)
        out.append(somewhere * (mixed - (1 - chunks / n) * shared) + (1 - somewhere) * decode)
    return out


def _separate(s: Setting) -> tuple[Num, Num, Num, Num, Num]:
    """Prompts in iterations of their own (module docstring): as ``_chunked``'s five. Where the engine decodes each
    prompt's last token with the batch (``Engine.last_prompt_token_decoded``) the first token comes from the next
    whole decode step."""
    m, prefill = _prefill_batch(s, s.micro_batch / s.workload.output_len)
    decode = s.time(s.micro_batch)
    stalls = s.micro_batch / m * prefill / s.workload.output_len
    others, busy = _others(s)
    wait = decode if s.engine.last_prompt_token_decoded else busy * decode / 2
    return prefill + wait, decode + others * stalls, s.micro_batch, decode, decode + stalls


def _prefill_batch(s: Setting, waiting: Num | None = None) -> tuple[Num, Num]:
    """Prompts per prefill iteration and that iteration's time: as many as wait (a saturated prefill pool: the
    batch; co-located in steady state: the B/O that arrive per decode step), at least one, at most ⌊budget / I⌋
    (I: the fresh tokens, past each prompt's cached prefix)."""
    inp = s.workload.fresh_len
    waiting = s.micro_batch if waiting is None else waiting
    m = maximum(minimum(np.floor(s.engine.max_batched_tokens / inp), waiting), 1.0)
    return m, context_step(s, m)


def context_step(s: Setting, n: Num) -> Num:
    """The iteration that prefills ``n`` prompts' fresh tokens past their cached prefixes; for an engine that decodes
    each prompt's last token with the batch (``Engine.last_prompt_token_decoded``) all but that token, and nothing for
    a one-token prompt (TurboMind v0.1 runs no context step for it)."""
    fresh = s.workload.fresh_len - 1 if s.engine.last_prompt_token_decoded else s.workload.fresh_len
    return s.time(0.0, n * fresh, n, s.workload.cached_len) if fresh > 0 else 0.0 * n


def first_token_step(s: Setting, n: Num) -> Num:
    """``n`` prompts to their first output token in a static batch: the context step, and where the engine decodes
    each prompt's last token with the batch the decode step of the ``n`` sequences that samples it."""
    context = context_step(s, n)
    return context + s.time(n) if s.engine.last_prompt_token_decoded else context


def arrivals(s: Setting, n: Num, together: Num) -> Num:
    """The mean time to first token of ``n`` requests of a static batch that start together (``together``: their
    first-token step), or, where the engine runs the first alone (``Engine.static_first_alone``: TurboMind v0.1's
    idle engine takes the first request the benchmark's threads enqueue, InternLM/lmdeploy v0.1.0a1
    src/turbomind/models/llama/Request.h RequestQueue::dequeue, blocking while the batch is empty), its first-token
    step alone, S₁, and the other n − 1, issued while it runs, at the next iteration (LlamaBatch::InternalThreadEntry
    dequeues once an iteration): they wait for S₁ to end, then their context step and the decode step of all n:
    (S₁ + (n − 1)·(S₁ + context(n − 1) + T(n))) / n."""
    if not s.engine.static_first_alone:
        return together
    alone, rest = first_token_step(s, 1.0), np.maximum(np.asarray(n, dtype=float) - 1.0, 0.0)
    group = alone + context_step(s, np.maximum(rest, 1.0)) + s.time(n)
    return (alone + rest * group) / np.maximum(n, 1.0)


def static_capacity(s: Setting) -> Num:
    """Sequences per micro-batch whose KV cache holds to the last token of a static batch (I + O tokens each, in
    whole pages): the KV-cache pool over one such sequence's pages, per lane (memory.py)."""
    w = s.workload
    mem = memory(s.model, s.cluster.accelerator.hbm_bytes, s.cols, s.quant, s.engine, w.input_len + w.output_len)
    return mem.max_sequences(s.cols["dpa"]) / s.lanes


def static_runs(s: Setting) -> Num:
    """Whether a static batch runs at all: one sequence per lane fits to its last token (waves for the rest), or,
    for an engine that refuses a batch it cannot hold (Engine.kv_overflow = "refuse"), the whole batch fits."""
    need = s.micro_batch if s.engine.mode("kv_overflow").refuses else 1.0
    return np.asarray(static_capacity(s)) >= need


def _static(s: Setting) -> Instance:
    """B prompts prefilled together, then O − 1 decode steps; the batch's tokens over its whole time. A batch the KV
    cache cannot hold to its last token (``static_capacity`` C < B, engine.kv_overflow) runs as waves: ⌊B/C⌋ of C
    sequences and one of the rest, each prefilled and decoded to its end (a queueing engine admits the next only as
    one finishes; a recompute engine preempts the newest and prefills them again on their return: vLLM's
    PreemptionMode.RECOMPUTE, SGLang's retract_decode). A recompute engine also admits, per full wave, as many
    prompts as their prompt pages allow, ⌊pool / I⌋, and the prefill of those beyond C is lost: charged once more.
    vLLM V0 (kv_overflow "recompute_kept": the preempted keep their output) is priced as its scheduler runs the
    batch instead, not in waves (serve/preemption.py).
    TTFT is the mean request's (a later wave's wait for the earlier ones included; the first wave's as its requests
    arrive, ``arrivals``), TPOT the running wave's step.
    Neither the waves nor vLLM V0's own scheduler are monotone in KV memory while the batch overflows; a pool that
    holds the batch is never slower than a smaller one (tests/test_static_overflow_properties.py; data/measured/
    2026-12-01-vllm-v0-static-overflow-not-monotone.md). Below one sequence per lane, or short of the batch where the
    engine refuses, nothing runs: infinite time (serve_estimate gives the reason)."""
    inp, out, b = s.workload.input_len, s.workload.output_len, s.micro_batch
    cap, fits = static_capacity(s), static_runs(s)
    cap = np.maximum(np.floor(cap), 1.0)
    full = np.where(b > cap, np.floor(b / cap), 0.0)
    rest, first = b - full * cap, minimum(b, cap)

    def prompts(n: Num) -> Num:  # n prompts' fresh tokens past their cached prefixes, to their first token
        return first_token_step(s, n)

    decode, prefill = s.time(first), prompts(first)
    wave = where(full > 0, prefill + (out - 1) * decode, 0.0)  # a full wave: C sequences (first = C there)
    last = where(rest > 0, prompts(rest) + (out - 1) * s.time(rest), 0.0)
    whole: Num = full * wave + last
    if s.engine.mode("kv_overflow").keeps:  # vLLM V0's scheduler, output kept (serve/preemption.py)
        from meshplan.serve.preemption import recompute_kept  # noqa: PLC0415 (vLLM V0's batches only: start-up)

        shape = (s.workload.input_len, s.workload.output_len, float(s.engine.max_seqs))
        whole = where(full > 0, recompute_kept(s.time, b, static_capacity(s), shape, prompts), whole)
    elif s.engine.mode("kv_overflow").preempts:
        admitted = minimum(b, cap * (inp + out) / inp)  # prompt pages only: I tokens each (same pool)
        lost = np.floor(admitted) - cap
        whole = whole + where((full > 0) & (lost > 0), full * prompts(np.maximum(lost, 0.0)), 0.0)
    waiting = (cap * full * (full - 1) / 2 * wave + rest * full * wave + full * cap * prefill) / b
    arrive = arrivals(s, first, prefill)  # the first wave's mean first token: its requests' arrivals
    waiting = waiting + (arrive - prefill) * first / b
    ttft = where(fits, where(full > 0, waiting + where(rest > 0, rest * prompts(rest), 0.0) / b, arrive), np.inf)
    tpot = where(fits, decode, np.inf)
    rate = where(fits, b * s.lanes * out / whole, 0.0)
    return Instance(ttft=ttft, tpot=tpot, running=first * s.lanes, tokens_per_s=rate, decode_step=decode,
                    decode_tokens_per_s=rate, prefill_requests_per_s=b * s.lanes / prefill,
                    split_ttft=ttft)


def kv_transfer(s: Setting) -> Num:
    """One prompt's KV cache from a prefill GPU to its decode counterpart (the same shard of heads and layers): a
    point-to-point send between neighbouring instances, over the tier that separates them."""
    c = s.cols
    per_gpu = s.workload.input_len * token_bytes(s.model, s.quant.kv_bytes, c["tp"]) / c["pp"]
    return collective_time("p2p", per_gpu, 2, c["tp"] * c["pp"] * c["dpa"], s.cluster, s.eff)
