"""Published RL runs (data/rl/published_rl.jsonl; data/rl/README.md: the schema) predicted phase by phase: each record
turned into the model, system, job and placement it states (rl/), priced by ``rl_estimate`` with the rollout
simulated, and each measured phase compared: error = predicted / measured − 1. A record that measured only the weight
transfer is priced by the transfer alone (rl/sync.py), on the pools it states. Nothing is fitted on these runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshplan.rl.estimate import pools, rl_estimate
from meshplan.rl.job import RLJob
from meshplan.rl.plan import RLPlan
from meshplan.rl.sync import sync_time
from meshplan.serve.engine import load_engine
from meshplan.serve.plan import ServePlan
from meshplan.specs.hardware import load_system
from meshplan.specs.hf.config import from_hf_config
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

DATA = Path(__file__).resolve().parents[2] / "data" / "rl" / "published_rl.jsonl"
PHASES = {"step_s": "iteration", "rollout_s": "rollout", "sync_s": "sync", "old_log_prob_s": "old_log_prob",
          "reference_s": "reference", "actor_update_s": "actor_update"}


@dataclass(frozen=True)
class PhaseResult:
    id: str
    group: str
    phase: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def read_records(path: Path = DATA) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def model_of(rec: dict[str, Any]) -> ModelSpec:
    m = rec["model"]
    model = load_model(m["preset"]) if "preset" in m else from_hf_config(m["hf_config"], name=m["name"])
    return replace(model, mtp_layers=0) if m.get("drop_mtp") else model


def _trainer(rec: dict[str, Any], gpus: int, mini_batch: int) -> Plan:
    t = rec["trainer"]
    dp = gpus // (t["tp"] * t["pp"] * t.get("cp", 1))
    return Plan(dp=dp, tp=t["tp"], pp=t["pp"], cp=t.get("cp", 1), ep=t.get("ep", 1),
                etp=t.get("etp", 0) if t.get("ep", 1) > 1 else 0,
                first_stage_layers=t.get("first_stage_layers", 0), last_stage_layers=t.get("last_stage_layers", 0),
                sequence_parallel=t.get("sequence_parallel") and t["tp"] > 1, micro_batch=t.get("micro_batch", 1),
                global_batch=mini_batch, recompute=t.get("recompute", "selective"), zero=t.get("zero", 1),
                offload_optimizer=t.get("offload_optimizer", False))


def _engine(rec: dict[str, Any], max_seqs: int) -> ServePlan:
    e = rec["engine"]
    per = e["tp"] * e.get("pp", 1) * e.get("dpa", 1)
    return ServePlan(tp=e["tp"], pp=e.get("pp", 1), dpa=e.get("dpa", 1), ep=e.get("ep", 1),
                     batch=max_seqs * e.get("dpa", 1), replicas=max(1, e["gpus"] // per))


def placement(rec: dict[str, Any], job: RLJob | None, max_seqs: int) -> RLPlan:
    """The record's RLPlan: its set-up, pools, layouts and switches."""
    gpus, shared = rec["hardware"]["gpus"], rec["setup"] == "colocated"
    rollout = gpus if shared else rec["engine"]["gpus"]
    train = gpus if shared else gpus - rollout
    sw = rec.get("switches", {})
    return RLPlan(setup=rec["setup"], trainer=_trainer(rec, train, job.mini_batch if job else train),
                  engine=_engine(rec, max_seqs), train_gpus=train, rollout_gpus=rollout,
                  offload=sw.get("offload", "none"), gpu_memory_utilization=rec["engine"].get("gpu_memory_utilization",
                                                                                             0.0),
                  sync=rec.get("sync", ""), forward_micro_batch=sw.get("forward_micro_batch", 0))


def job_of(rec: dict[str, Any]) -> RLJob | None:
    j = rec.get("job")
    if j is None:
        return None
    mean = float(j.get("mean_output", 0.0))
    return RLJob(prompts=j["prompts"], samples_per_prompt=j["samples_per_prompt"], input_len=j["input_len"],
                 output_len=j["output_len"], lengths="lognormal" if mean else "fixed", mean_output=mean,
                 algorithm=rec.get("algorithm", "grpo"), mini_batches=j.get("mini_batches", 1),
                 epochs=j.get("epochs", 1), reference=j.get("reference"), staleness=rec.get("staleness", 1))


def evaluate(rec: dict[str, Any]) -> list[PhaseResult]:
    """Every measured phase of one record, predicted (module docstring)."""
    model, system = model_of(rec), load_system(rec["hardware"]["system"])
    if "nvlink_domain" in rec["hardware"]:  # a job on part of each NVLink domain (the record's assumption)
        system = replace(system, network=replace(system.network, nvlink_domain=rec["hardware"]["nvlink_domain"]))
    stack = load_stack(rec["trainer"].get("framework", "megatron-core"))
    engine = load_engine(rec["engine"].get("preset", "vllm"))
    job = job_of(rec)
    plan = placement(rec, job, engine.max_seqs)
    measured = rec["measured"]
    if job is None:
        whole, train_pool, _ = pools(system, plan)
        moved = sync_time(model, whole, (train_pool, plan.trainer, stack), plan.engine, plan.sync_method)
        return [PhaseResult(rec["id"], rec["group"], "sync", float(measured["sync_s"]), moved.seconds)]
    est = rl_estimate(model, system, job, plan, stack, engine)
    if not est.fits:
        raise ValueError(f"{rec['id']}: the published plan does not fit: {'; '.join(est.reasons)}")
    out = []
    for key, phase in PHASES.items():
        if key in measured:
            predicted = est.iteration_time if phase == "iteration" else est.phases.get(phase, 0.0)
            out.append(PhaseResult(rec["id"], rec["group"], phase, float(measured[key]), predicted))
    return out
