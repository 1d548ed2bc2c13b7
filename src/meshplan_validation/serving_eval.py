"""Predict what each published serving run measured (serving_map.py turns the record into a case) and its error,
predicted / measured − 1, metric by metric.

The batch a run held: as stated (a fixed batch, SGLang's per-device decode batch, TensorRT-LLM's DeepSeek-R1
batches), else for an offline or all-at-once run the largest that the engine's KV-cache pool, its max_seqs (and
max_batch_size per rank where stated) and the request count allow; for a run offered a rate λ, the batch at which an
instance serves λ requests/s (continuous in the batch, found on a fine grid of the same array arithmetic), or its
largest batch when λ is beyond it. A run offered a rate that states its N requests is simulated (``_transient``:
its fill and drain are part of what it measured), and the batch it held is the simulation's time-average. A run
offered all N requests at once with B in flight makes the later ones wait: mean TTFT gains (⌈N/B⌉ − 1)/2 request
lifetimes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.memory import memory
from meshplan.serve.metrics import Setting, deployment, instance
from meshplan.specs.regime import Served
from meshplan_validation.serving_map import ServingCase, case_of

THROUGHPUT = ("output_tokens_per_s", "output_tokens_per_s_per_gpu", "total_tokens_per_s", "requests_per_s",
              "input_tokens_per_s_per_gpu")
LATENCY = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_latency_ms")


@dataclass(frozen=True)
class ServingResult:
    id: str
    group: str
    generation: str
    gpu: str
    split: str
    mode: str
    metric: str
    measured: float
    predicted: float | None
    batch: float | None
    headline: bool  # the run's throughput, not set by an offered rate
    skipped: str = ""
    layout_stated: bool = True  # False: a MoE layout the source does not state, priced at the engine's default
    architecture: str = ""  # as priced (case_of: the system preset's, "unstated" where it names none; serving_errors)
    engine: str = ""  # the engine preset it is priced with (case_of)

    @property
    def error(self) -> float | None:
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured - 1


def cols(case: ServingCase, batch: Any) -> dict[str, Any]:
    p = case.plan
    return {"tp": p.tp, "pp": p.pp, "dpa": p.dpa, "ep": p.ep, "batch": batch, "replicas": 1, "prefill_replicas": 0}


def setting(case: ServingCase, batch: Any, eff: ServeEfficiency) -> Setting:
    return Setting(case.model, case.cluster, cols(case, batch), case.plan.quant, case.engine, case.workload, eff)


def weights_of(case: ServingCase) -> float:
    """The bytes of weights on one GPU of the run's instance (serve/memory.py)."""
    p = case.plan
    return float(memory(case.model, case.cluster.accelerator.hbm_bytes, cols(case, 1), p.quant, case.engine,
                        case.engine.resident(case.workload)).weights)


def served_of(case: ServingCase, row: ServingResult) -> Served:
    """What the serving regime of ``row``'s run reads of it (specs/regime.py)."""
    return Served(mode=row.mode, batch=row.batch or 1.0, weights=weights_of(case), input_len=case.workload.input_len,
                  output_len=case.workload.output_len, gpus=case.plan.instance_gpus)


def largest_batch(case: ServingCase) -> float:
    """The sequences an instance keeps in flight when it has more requests than room (module docstring)."""
    w, p = case.record["workload"], case.plan
    mem = memory(case.model, case.cluster.accelerator.hbm_bytes, cols(case, 1), p.quant, case.engine,
                 case.engine.resident(case.workload))
    held = float(mem.max_sequences(p.dpa))
    limits = [held, case.engine.runtime_batch(held / p.dpa) * p.dpa, float(case.engine.max_seqs * p.dpa)]
    limits += [w["num_requests"]] if w.get("num_requests") else []
    limits += [w["max_batch_size_per_rank"] * p.dpa] if w.get("max_batch_size_per_rank") else []
    lanes = p.pp * p.dpa
    return max(lanes, math.floor(min(limits) / lanes) * lanes)


def at_rate(case: ServingCase, rate: float, eff: ServeEfficiency) -> float:
    """The batch at which one instance serves ``rate`` requests/s (module docstring)."""
    top = largest_batch(case)
    grid = np.geomspace(case.plan.pp * case.plan.dpa, top, 400)
    with np.errstate(all="ignore"):
        served = np.asarray(instance(setting(case, grid, eff)).tokens_per_s) / case.workload.output_len
    above = np.flatnonzero(served >= rate)
    if not len(above):
        return top
    i = above[0]
    if i == 0:
        return float(grid[0])
    t = (rate - served[i - 1]) / (served[i] - served[i - 1])
    return float(grid[i - 1] + t * (grid[i] - grid[i - 1]))


def batch_of(case: ServingCase, eff: ServeEfficiency) -> float:
    w = case.record["workload"]
    if case.mode == "static" or (w.get("batch_size") and case.mode in ("offline", "decode")):
        return float(case.plan.batch)
    if case.mode == "rate":
        return at_rate(case, w["request_rate"], eff)
    return float(largest_batch(case))


def predict(case: ServingCase, eff: ServeEfficiency = SERVE_DEFAULT) -> tuple[dict[str, float], float]:
    """The predicted value of every metric the serving model gives for the run, and the batch it held. Memoised on
    the case's specs, its record's text and ``eff``: ``meshplan validate`` and the accuracy benchmarks price the same
    records again (a record whose fields do not hash is priced anew)."""
    specs = (case.model, case.cluster, case.plan, case.workload, case.engine, case.mode, case.notes)
    key = (json.dumps(case.record, sort_keys=True, default=repr), specs, eff)
    try:
        hash(key)
    except TypeError:
        return _predict(case, eff)
    metrics, batch = _memo(_Keyed(key, case))
    return dict(metrics), batch


@dataclass(frozen=True)
class _Keyed:
    """A case and its key, equal and hashed by the key alone (the record, a dict, does not hash)."""

    key: tuple
    case: ServingCase = field(compare=False)


@lru_cache(maxsize=4096)
def _memo(keyed: _Keyed) -> tuple[dict[str, float], float]:
    return _predict(keyed.case, keyed.key[2])


def _predict(case: ServingCase, eff: ServeEfficiency) -> tuple[dict[str, float], float]:
    w = case.record["workload"]
    if case.mode == "prefill":
        return _prefill(case, eff), float(case.plan.dpa)
    if case.mode == "rate" and w.get("num_requests"):
        return _transient(case, eff)
    batch = batch_of(case, eff)
    with np.errstate(all="ignore"):
        m = deployment(instance(setting(case, batch, eff)), 1, 0, case.workload.output_len)
    gpus = case.plan.instance_gpus
    tokens = float(m.tokens_per_s)
    if case.mode == "decode":  # a saturated decode pool: pure decode steps at the stated context
        tokens = batch / float(m.decode_step)
    if case.mode == "offline" and w.get("num_requests"):
        tokens = tokens * _finite(case, batch, tokens, eff)
    ttft, tpot = float(m.ttft), float(m.tpot)
    if case.mode == "closed":  # all N offered at once: the first wave's prompts queue for prefill, later waves wait
        n = w.get("num_requests") or batch
        first, waves = min(batch, n), math.ceil(n / batch)
        burst_ttft, burst_itl = _burst(case, first, float(m.decode_step), eff)
        ttft = max(ttft, burst_ttft) + (waves - 1) / 2 * float(m.e2e)
        tpot = (first * burst_itl + (n - first) * tpot) / n
    e2e = float(m.e2e)
    # A static batch's latency (scenario "latency") is the wall time of the whole batch: vLLM's own
    # benchmark_latency.py (vllm-project/vllm), which LLM-Inference-Bench runs, times run_to_completion as
    # time.perf_counter() around one llm.generate of all batch_size prompts. While the KV cache holds the batch every
    # request ends with it (the mean request's TTFT + (O - 1) TPOT); a batch that overflows it runs in waves
    # (serve/metrics.py _static) and the later waves end after the mean request does: B requests over their rate.
    if case.mode == "static":
        e2e = batch / float(m.requests_per_s)
    out = {"output_tokens_per_s": tokens, "output_tokens_per_s_per_gpu": tokens / gpus,
           "total_tokens_per_s": float(m.requests_per_s) * (case.workload.input_len + case.workload.output_len),
           "requests_per_s": float(m.requests_per_s), "ttft_ms": 1e3 * ttft, "itl_ms": 1e3 * tpot,
           "tpot_ms": 1e3 * tpot, "e2e_latency_ms": 1e3 * e2e}
    return out, batch


# benchmarks/measure/serve_load_published.py's seeds: one 500-request sample's mean gap strays 4.5 % from 1/rate
TRANSIENT_SEEDS = (0, 1, 2, 3, 4)


def _transient(case: ServingCase, eff: ServeEfficiency) -> tuple[dict[str, float], float]:
    """A run of N requests offered at a rate λ, and the batch it held: priced by meshplan's request-level simulation
    (serve/load: iteration by iteration, the engine's scheduler) of the N requests, Poisson arrivals at λ (the sources
    do not state the process: an assumption), the mean over ``TRANSIENT_SEEDS`` (serve/load/run.repeated). By
    Little's law the steady state's batch B fills over one request lifetime (B arrivals) and, once the arrivals end
    after N/λ, drains over another in pure decode iterations: only N − 2B of the N requests live in it, a share
    1 − 2B/N that falls smoothly to none at B = N/2. The simulation holds every such share without a rule: at low rates
    it is the steady state (B ≪ N); at QPS 32, where the steady state at the 500-request batch reads 114 ms a token
    (every iteration carrying the prompts that replace the finished requests, forever), TRT-LLM 0.14's Llama 3.1 70B
    467/256 measured 86 ms beside 85 at INF, and so does the simulation."""
    from meshplan.serve.load.lengths import Lengths  # noqa: PLC0415  (the simulation only where a run is one)
    from meshplan.serve.load.run import load_instance, repeated  # noqa: PLC0415

    w, inp, out = case.record["workload"], case.workload.input_len, case.workload.output_len
    plan = case.plan.with_(batch=int(largest_batch(case)))
    built = load_instance(case.model, case.cluster, plan, case.engine, inp + out, eff=eff)
    r = repeated(built, w["request_rate"], w["num_requests"], Lengths("fixed", inp, out), TRANSIENT_SEEDS)
    tokens, rps = r.output_tokens_per_s, r.requests_per_s
    return {"output_tokens_per_s": tokens, "output_tokens_per_s_per_gpu": tokens / case.plan.instance_gpus,
            "total_tokens_per_s": rps * (inp + out), "requests_per_s": rps, "ttft_ms": 1e3 * r.mean["ttft"],
            "itl_ms": 1e3 * r.mean["itl"], "tpot_ms": 1e3 * r.mean["tpot"],
            "e2e_latency_ms": 1e3 * r.mean["e2e"]}, r.batch


def _burst(case: ServingCase, prompts: float, decode: float, eff: ServeEfficiency) -> tuple[float, float]:
    """Mean time to first token and mean inter-token latency of ``prompts`` requests that arrive together: their prompt
    tokens go through k prefill iterations of the engine's budget (whole prompts when it does not chunk them); the
    average prompt finishes after (k + 1)/2 of them and decodes through the (k − 1)/2 left, then at the ``decode``
    step of the full batch (in-flight batching runs the generating sequences in every iteration)."""
    inp, budget = case.workload.input_len, case.engine.max_batched_tokens
    per = budget if case.engine.mode("prefill").chunked else max(budget // inp, 1) * inp
    per = min(per, prompts * inp)
    iterations = math.ceil(prompts * inp / per - 1e-9)
    step = float(setting(case, prompts, eff).time(0.0, per, per / inp, 0.0))
    gaps = max(case.workload.output_len - 1, 1)
    stalled = min((iterations - 1) / 2, gaps)
    return (iterations + 1) / 2 * step, (stalled * step + (gaps - stalled) * decode) / gaps


def _finite(case: ServingCase, batch: float, tokens: float, eff: ServeEfficiency) -> float:
    """The share of the steady-state throughput a run of N identical requests gets: with every request of the same
    lengths queued at once (trtllm-bench's synthetic datasets, standard deviation 0), they run in ⌈N/B⌉ waves of B
    and the last wave holds the N − (W − 1)·B left over, for as many token steps as a full one (module docstring)."""
    n = case.record["workload"]["num_requests"]
    waves = math.ceil(n / batch - 1e-9)
    last = n - (waves - 1) * batch
    if last >= batch:
        return 1.0
    with np.errstate(all="ignore"):
        tail = float(instance(setting(case, last, eff)).tokens_per_s)
    time = (waves - 1) * batch / tokens + last / tail  # per output token of a sequence
    return n / time / tokens


def _prefill(case: ServingCase, eff: ServeEfficiency) -> dict[str, float]:
    """A saturated prefill pool: each GPU's group runs tokens_per_device_batch prompt tokens per iteration."""
    w, p = case.record["workload"], case.plan
    tokens = w.get("tokens_per_device_batch") or case.engine.max_batched_tokens
    prompts = tokens / case.workload.input_len
    s = setting(case, prompts * p.dpa * p.pp, eff)
    step = float(s.time(0.0, tokens, prompts, 0.0))
    return {"input_tokens_per_s_per_gpu": tokens * p.dpa * p.pp / step / p.instance_gpus}


def results(records: list[dict[str, Any]], eff: ServeEfficiency = SERVE_DEFAULT,
            engines: dict[str, dict[str, float]] | None = None,
            slow_hosts: dict[str, float] | None = None) -> list[ServingResult]:
    """Every measured metric of every record, predicted (or skipped with its reason); ``engines``: engine preset
    name -> fields in place of the preset's (the fit's trial values); ``slow_hosts``: Cluster fields in place of a
    slow host's (python_host >= 2: the Grace presets)."""
    out = []
    for r in records:
        case = case_of(r)
        priced_as = {} if isinstance(case, str) else {
            "architecture": case.cluster.accelerator.architecture or "unstated", "engine": case.engine.name}
        if engines and not isinstance(case, str) and case.engine.name in engines:
            case = replace(case, engine=case.engine.with_(**engines[case.engine.name]))
        if slow_hosts and not isinstance(case, str) and case.cluster.python_host >= 2:
            case = replace(case, cluster=replace(case.cluster, **slow_hosts))
        measured = {k: float(v) for k, v in r["measured"].items() if k in THROUGHPUT + LATENCY
                    and isinstance(v, (int, float)) and not isinstance(v, bool)}
        base = {"id": r["id"], "group": r["group"], "generation": r["hardware"].get("generation") or "",
                "gpu": r["hardware"].get("gpu") or "", "split": r.get("split") or "",
                "layout_stated": not any(str(a).startswith(LAYOUT_UNSTATED) for a in r.get("assumed") or ())}
        if isinstance(case, str):
            out.append(ServingResult(**base, mode="", metric="", measured=math.nan, predicted=None, batch=None,
                                     headline=False, skipped=case))
            continue
        predicted, batch = predict(case, eff)
        head = headline_metric(case, measured)
        for metric, value in measured.items():
            out.append(ServingResult(**base, mode=case.mode, metric=metric, measured=value,
                                     predicted=predicted.get(metric), batch=batch, headline=metric == head,
                                     **priced_as))
    return out


# how a record says its MoE layout was not stated and was priced at the engine's default (data/serving: the 132
# TensorRT-LLM 1.0 multi-GPU MoE rows); such runs are evaluated, but kept out of the headline figures and the bands
LAYOUT_UNSTATED = "MoE layout not stated"


def headline_metric(case: ServingCase, measured: dict[str, float]) -> str:
    """The run's throughput metric (the first of THROUGHPUT it has), unless an offered rate set it."""
    if case.mode == "rate":
        return ""
    return next((k for k in THROUGHPUT if k in measured), "")
