"""Throughput against latency: one instance shape and scheme over a range of decode batches, as arrays (the same
metrics as the search: metrics.instance, metrics.deployment), each point marked whether its KV cache fits. A larger
batch reads the weights once for more sequences, so tokens/s per GPU rises while TPOT rises with the KV cache read
and, past the ridge point, the GEMMs' compute: the curve a deployment picks its operating point on."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.engine import Engine
from meshplan.serve.memory import memory
from meshplan.serve.metrics import Setting, deployment, instance
from meshplan.serve.plan import PlanColumns, ServePlan, Workload
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec


@dataclass(frozen=True)
class Curve:
    label: str
    batch: np.ndarray
    tpot: np.ndarray  # seconds
    ttft: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    fits: np.ndarray  # bool


def curve(model: ModelSpec, cluster: Cluster, plan: ServePlan, workload: Workload, engine: Engine,
          batches: tuple[int, ...], eff: ServeEfficiency = SERVE_DEFAULT) -> Curve:
    """``plan``'s shape and scheme at each of ``batches`` (multiples of pp·dpa only)."""
    lanes = plan.pp * plan.dpa
    b = np.array([x for x in batches if x % lanes == 0], dtype=np.int64)
    cols: PlanColumns = {"tp": plan.tp, "pp": plan.pp, "dpa": plan.dpa, "ep": plan.ep, "batch": b,
            "replicas": plan.replicas, "prefill_replicas": plan.prefill_replicas}
    mem = memory(model, cluster.accelerator.hbm_bytes, cols, plan.quant, engine, engine.resident(workload))
    with np.errstate(all="ignore"):
        one = instance(Setting(model, cluster, cols, plan.quant, engine, workload, eff))
        m = deployment(one, plan.replicas, plan.prefill_replicas, workload.output_len)
    label = plan.with_(batch=1).describe().replace(" batch=1", "")
    return Curve(label=label, batch=b, tpot=np.asarray(m.tpot, dtype=float), ttft=np.asarray(m.ttft, dtype=float),
                 tokens_per_s_per_gpu=np.asarray(m.tokens_per_s, dtype=float) / plan.num_gpus,
                 fits=np.asarray(mem.fits) & (b <= engine.max_seqs * plan.dpa))
