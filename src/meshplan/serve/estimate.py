"""``serve_estimate(model, cluster, plan, workload, engine) -> ServeEstimate``: the one place that composes a
serving configuration's memory (memory.py), iteration times (iteration.py) and metrics (metrics.py), with the
decode step's per-op breakdown and, when it does not fit or breaks a constraint, the reasons (check.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan.serve import check
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.engine import DEFAULT as DEFAULT_ENGINE
from meshplan.serve.engine import Engine
from meshplan.serve.iteration import breakdown, extra_kernel_time, gap_time, op_kinds
from meshplan.serve.memory import Memory, memory
from meshplan.serve.metrics import Metrics, Setting, metrics, static_runs
from meshplan.serve.plan import PlanColumns, ServePlan, Workload
from meshplan.specs.bands import SERVING_METRICS, Band, serving_band
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.regime import Served, serving_regime
from meshplan.units import fmt_bytes
from meshplan.xp import Num


@dataclass(frozen=True)
class ServeEstimate:
    """One serving deployment of a model on a cluster for a workload: its metrics and memory."""

    model: ModelSpec
    cluster: Cluster
    plan: ServePlan
    workload: Workload
    engine: Engine
    metrics: Metrics[float]
    memory: Memory
    reasons: tuple[str, ...]
    breakdown: dict[str, float] = field(default_factory=dict)  # decode step seconds by op name
    kinds: dict[str, str] = field(default_factory=dict)  # op name -> gemm, attention, memory, collective or host

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return float(self.metrics.tokens_per_s) / self.plan.num_gpus

    @property
    def bands(self) -> dict[str, Band]:
        """The bands of its throughput and latencies: the out-of-source errors of the measured serving runs of its
        regime (specs/bands.py), each with its note where no measured run is like it."""
        mode = "static" if self.workload.static else "saturated"
        regime = serving_regime(self.model, self.cluster, self.engine, Served(
            mode=mode, batch=float(self.plan.batch), weights=float(self.memory.weights),
            input_len=self.workload.input_len, output_len=self.workload.output_len, gpus=self.plan.instance_gpus))
        return {m: serving_band(m, regime) for m in SERVING_METRICS}

    def cost_per_million(self, price: float | None) -> float | None:
        """Dollars per million output tokens at ``price`` per GPU-hour."""
        if price is None:
            return None
        return price * self.plan.num_gpus / 3600 / float(self.metrics.tokens_per_s) * 1e6

    def timings(self, price: float | None = None) -> dict[str, float | None]:
        """Latencies, rates and cost; None when the configuration does not fit (no figure describes a deployment
        that cannot run)."""
        m = self.metrics
        values = {"ttft_s": m.ttft, "tpot_s": m.tpot, "e2e_s": m.e2e, "output_tokens_per_s": m.tokens_per_s,
                  "output_tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
                  "output_tokens_per_s_per_instance": m.instance_tokens_per_s, "requests_per_s": m.requests_per_s,
                  "running": m.running}
        out: dict[str, float | None] = {k: float(v) if self.fits else None for k, v in values.items()}
        return out | {"cost_per_million_tokens": self.cost_per_million(price) if self.fits else None}

    def to_dict(self, price: float | None = None) -> dict[str, Any]:
        mem, p = self.memory, self.plan
        return {
            "model": self.model.name, "system": self.cluster.name, "gpus": p.num_gpus, "engine": self.engine.name,
            "plan": {"tp": p.tp, "pp": p.pp, "dpa": p.dpa, "ep": p.ep, "batch": p.batch, "replicas": p.replicas,
                     "prefill_replicas": p.prefill_replicas, "weights": p.quant.weights,
                     "activations": p.quant.activations, "kv_cache": p.quant.kv_cache},
            "input_len": self.workload.input_len, "output_len": self.workload.output_len,
            "cached_len": self.workload.cached_len,
            **self.timings(price),
            "memory": {"weights": float(mem.weights), "activations": float(mem.activations),
                       "workspace": float(mem.workspace), "kv_cache": float(mem.kv_used),
                       "kv_pool": float(mem.kv_pool), "sequence": float(mem.sequence),
                       "max_sequences": float(mem.max_sequences(p.dpa))},
            "fits": self.fits, "reasons": list(self.reasons),
            "decode_step_breakdown_s": self.breakdown,
            "bands": {m: b.to_dict() for m, b in self.bands.items()},
        }


def plan_columns(plan: ServePlan) -> PlanColumns:
    return {"tp": plan.tp, "pp": plan.pp, "dpa": plan.dpa, "ep": plan.ep, "batch": plan.batch,
            "replicas": plan.replicas, "prefill_replicas": plan.prefill_replicas}


def serve_estimate(model: ModelSpec, cluster: Cluster, plan: ServePlan, workload: Workload,
                   engine: Engine = DEFAULT_ENGINE, eff: ServeEfficiency = SERVE_DEFAULT) -> ServeEstimate:
    """Price one serving configuration (module docstring)."""
    check.servable(model)
    cols = plan_columns(plan)
    mem = memory(model, cluster.accelerator.hbm_bytes, cols, plan.quant, engine, engine.resident(workload))
    reasons = [r for r, bad in check.structural(model, cluster, cols, plan.quant, engine) if bool(bad)]
    setting = Setting(model, cluster, cols, plan.quant, engine, workload, eff)
    if not bool(static_runs(setting) if workload.static else mem.fits):
        reasons.append(f"{check.MEMORY}: {fmt_bytes(float(mem.kv_used))} needed, {fmt_bytes(float(mem.kv_pool))} "
                       f"left for it of {fmt_bytes(float(mem.capacity))} (weights {fmt_bytes(float(mem.weights))})")
    refused = check.refused_prompt(engine, workload)
    if refused:
        reasons.append(refused)
    if check.FORMAT in reasons or refused:  # no price for a format the GPU cannot run, nor for a refused prompt
        return ServeEstimate(model, cluster, plan, workload, engine, _nothing(), mem, tuple(reasons))
    result = metrics(setting)
    q = plan.quant
    lane = setting.shape(float(result.running) / (plan.pp * plan.dpa), 0.0, 0.0, 0.0)
    parts = breakdown(model, cluster, lane, plan.pp, q, eff)
    kinds = op_kinds(model, lane, plan.pp)
    extra = float(extra_kernel_time(model, cluster, lane, engine, eff))
    if extra:  # the engine's kernels beyond the op list's (engine.py: decode_layer_kernels)
        parts["engine/kernels"], kinds["engine/kernels"] = extra, "memory"
    gaps = float(gap_time(model, cluster, lane, plan.pp, engine, eff))
    if gaps:  # the GPU idle between the step's kernels (engine.py: kernel_gap)
        parts["engine/gaps"], kinds["engine/gaps"] = gaps, "memory"
    if engine.iteration_latency:  # the engine's GPU work beside the forward pass (engine.py)
        parts["engine/iteration"], kinds["engine/iteration"] = engine.iteration_latency, "memory"
    broadcast = float(setting.broadcast_time(float(result.running) / plan.dpa))
    if broadcast:  # the driver's input broadcast to the TP workers (engine.py: tp_broadcast_tensors)
        parts["engine/broadcast"], kinds["engine/broadcast"] = broadcast, "memory"
    host = engine.host_time(float(result.running) / plan.dpa, 1, engine.loop_speed(cluster))
    beside = float(engine.hidden_time(float(result.running) / plan.dpa, 1, engine.loop_speed(cluster)))
    host += max(beside - sum(parts.values()), 0.0)  # what the GPU's step does not hide of the work beside it
    if engine.host.overlapped:  # only what the GPU's work does not hide
        host = max(host - sum(parts.values()), 0.0)
    if host:
        parts["engine/host"], kinds["engine/host"] = host, "host"
    return ServeEstimate(model, cluster, plan, workload, engine, _floats(result), mem, tuple(reasons), parts, kinds)


def _floats(m: Metrics[Num]) -> Metrics[float]:
    return Metrics(*(float(v) for v in (m.ttft, m.tpot, m.e2e, m.instance_tokens_per_s, m.tokens_per_s,
                                        m.requests_per_s, m.running, m.decode_step)))


def _nothing() -> Metrics[float]:
    nan = float("nan")
    return Metrics(nan, nan, nan, 0.0, 0.0, 0.0, 0.0, nan)
