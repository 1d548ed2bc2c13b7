"""The rollout phase on serving's physics: the engine's instances generate one iteration's responses.

- Synchronous (a batch that must end before the update): every request arrives at once and the engine's own
  scheduler runs them (serve/load: the iteration-level simulation of vLLM V1's scheduler over serve's step prices,
  ``load_run``): it admits sequences while its running limit (``ServePlan.batch``, vLLM's max_num_seqs), its token
  budget and its KV cache allow, refills as responses end, and the phase lasts until the last response ends. The
  batch thins as the short responses finish, so the longest response of each instance sets the pace: the tail.
  Prompts are dealt to the instances in whole groups (a prompt's samples on one instance, as verl's agent loop and
  vLLM's ``n`` sampling keep them), and the engine's prefix cache finds each group's prompt after its first sample
  (vLLM's automatic prefix caching, verl's default ``enable_prefix_caching``): a share (n − 1)/n of each prompt is
  cached (serve/load/scheduler.py ``prefix_hit``).
- Streaming (the ``async`` set-up: partial rollouts, the engine never drains): the engine's steady state of
  continuous batching (serve/metrics.py through ``serve_estimate``: output tokens/s at the mean lengths), so the
  phase is the responses' tokens over that rate, with no tail. Its running batch is its limit, or what the stream
  can hold in flight: 1 + k iterations' responses with staleness k (AReaL's staleness bound η, Fu et al. 2025 §5.1:
  a sample at most η versions old), whichever is less.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from meshplan.errors import SpecError
from meshplan.rl.job import RLJob
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns, serve_estimate
from meshplan.serve.load.arrivals import Requests
from meshplan.serve.load.run import load_run
from meshplan.serve.memory import memory
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


@dataclass(frozen=True)
class Rollout:
    """One iteration's generation on the rollout pool."""

    seconds: float  # first prompt in to last response out (streaming: the responses' tokens at the steady rate)
    tokens: int  # response tokens generated
    longest: int  # the longest response
    tokens_per_s: float  # over the phase
    steady_tokens_per_s: float  # the engine's steady state at its running limit (the streaming rate)
    preemptions: int = 0
    kv_peak: float = 0.0  # the KV cache's highest occupancy (a share of its capacity)
    running: dict[str, list[float]] = field(default_factory=dict)  # the first instance's batch over time (the tail)
    reasons: tuple[str, ...] = ()
    method: str = "simulated"  # simulated (serve/load), closed form (tail.py) or steady state (streaming)

    @property
    def tail_share(self) -> float:
        """The share of the phase the tail takes: 1 − (the time at the steady rate / the phase)."""
        if not self.seconds or not self.steady_tokens_per_s:
            return 0.0
        return max(0.0, 1 - self.tokens / self.steady_tokens_per_s / self.seconds)


def grouped_requests(job: RLJob, lengths: np.ndarray, replicas: int) -> Requests:
    """Every response's request at t = 0, ordered so that ``Requests.share(k, replicas)`` (rows k, k + R, …) gives
    instance k whole prompt groups, dealt round-robin (module docstring); sample by sample when the groups do not
    divide among the instances."""
    n = job.samples_per_prompt
    groups = len(lengths) // n
    order = np.arange(len(lengths))
    if groups % replicas == 0:
        # group g goes to instance g % R; its rows are instance k's: k + R·i
        by_instance = order.reshape(groups // replicas, replicas, n).transpose(1, 0, 2).reshape(replicas, -1)
        order = by_instance.T.reshape(-1)
    out = lengths[order]
    return Requests(np.zeros(len(out)), np.full(len(out), job.input_len, dtype=np.int64), out)


def generation(model: ModelSpec, pool: Cluster, plan: ServePlan, engine: Engine, job: RLJob,
               lengths: np.ndarray) -> Rollout:
    """The synchronous rollout phase of ``lengths`` responses on ``pool`` (module docstring)."""
    hit = (job.samples_per_prompt - 1) / job.samples_per_prompt
    steady = steady_rate(model, pool, plan, engine, job)
    try:
        result = load_run(model, pool, plan, grouped_requests(job, lengths, plan.replicas), engine, prefix_hit=hit)
    except SpecError as exc:  # a layout the engine cannot run, or no KV cache left: a reason, not an error
        return Rollout(float("inf"), int(lengths.sum()), int(lengths.max()), 0.0, steady, reasons=(str(exc),))
    reasons = (f"{result.refused:,} responses of {job.input_len + int(lengths.max()):,} tokens exceed the KV cache "
               f"of one instance ({plan.describe()})",) if result.refused else ()
    tokens = int(lengths.sum())
    return Rollout(seconds=result.duration_s if not reasons else float("inf"), tokens=tokens,
                   longest=int(lengths.max()), tokens_per_s=tokens / result.duration_s if result.duration_s else 0.0,
                   steady_tokens_per_s=steady, preemptions=result.preemptions, kv_peak=result.kv_peak,
                   running={k: result.timeline[k] for k in ("start_s", "running") if k in result.timeline},
                   reasons=reasons)


def streaming(model: ModelSpec, pool: Cluster, plan: ServePlan, engine: Engine, job: RLJob,
              lengths: np.ndarray) -> Rollout:
    """The streaming rollout phase: the responses' tokens at the engine's steady rate (module docstring), its batch
    fed by as many iterations' prompts as the staleness lets run ahead (1 + k batches in flight at most)."""
    steady = steady_rate(model, pool, plan, engine, job, 1.0 + job.staleness)
    tokens = int(lengths.sum())
    if not steady:
        return Rollout(float("inf"), tokens, int(lengths.max()), 0.0, 0.0, method="steady state",
                       reasons=(f"{plan.describe()} cannot hold a response of the mean length",))
    return Rollout(seconds=tokens / steady, tokens=tokens, longest=int(lengths.max()), tokens_per_s=steady,
                   steady_tokens_per_s=steady, method="steady state")


def steady_rate(model: ModelSpec, pool: Cluster, plan: ServePlan, engine: Engine, job: RLJob,
                in_flight: float = 1.0) -> float:
    """Output tokens/s of ``plan``'s instances in the steady state of continuous batching at the mean response
    (serve_estimate), each running at most its limit, what its KV cache holds at the mean context, or its share of
    ``in_flight`` batches' sequences (one for a synchronous rollout; 1 + staleness for a stream, which may run that
    far ahead); 0 where not even one sequence fits."""
    mean = max(1, round(job.mean_response))
    cached = int((job.samples_per_prompt - 1) / job.samples_per_prompt * job.input_len) // engine.block_size \
        * engine.block_size
    work = Workload(input_len=job.input_len, output_len=mean, cached_len=min(cached, job.input_len - 1))
    share = math.ceil(in_flight * job.generated / plan.replicas)
    held = memory(model, pool.accelerator.hbm_bytes, plan_columns(plan.with_(replicas=1, prefill_replicas=0)),
                  plan.quant, engine, engine.resident(work)).max_sequences(plan.dpa)  # what its KV cache holds
    plan = plan.with_(batch=max(1, min(plan.batch, share, int(held) // (plan.pp * plan.dpa) * plan.pp * plan.dpa)))
    est = serve_estimate(model, pool, replace(plan, prefill_replicas=0), work, engine)
    return float(est.metrics.tokens_per_s) if est.fits else 0.0
