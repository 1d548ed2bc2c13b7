"""Where the GB200 MoE runs of TensorRT-LLM's PyTorch backend (v1.0 performance page: Qwen3-30B-A3B and Llama 4
Scout, FP4, one GPU) are not too fast (issue 79; data/measured/2026-11-30-trtllm-pytorch-gb200-moe-gap.md).

The page ran every one-GPU workload on a B200 (x86 host) and on a GB200 (Grace host): the same Blackwell GPU, another
host. meshplan prices the twins' GPU step alike and their host time apart (Grace's python_host 2.75, gb200.toml), so a
GB200-only miss is the host's, and a host mechanism must leave the dense twins as the page measured them: GB200 never
slower than the B200 (1.02-1.18x), the host hidden behind an 8-405B-parameter dense model's GPU work."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

from meshplan import load_model, load_system
from meshplan.serve.engine import load_engine
from meshplan.serve.metrics import Setting
from meshplan.serve.moe import moe_ops, touched_experts
from meshplan.serve.plan import Workload
from meshplan.serve.precision import Quant
from meshplan_validation.serving_eval import results

PATH = Path(__file__).resolve().parent.parent / "data" / "serving" / "published_serving.jsonl"
TWINS = ("B200-180GB", "GB200-192GB")
FP4 = Quant(weights="fp4", activations="fp4", kv_cache="fp8")  # the page's FP4 runs, an FP8 KV cache (serving_map)


def _twin_ratios(moe: bool) -> dict[tuple, tuple[float, float]]:
    """(model, ISL, OSL) -> (measured, predicted) GB200 / B200 output tokens/s, the v1.0 page's twin runs."""
    records = [r for r in map(json.loads, PATH.read_text().splitlines()) if r["group"] == "trtllm_perf_v1.0"
               and r["hardware"]["gpu"] in TWINS and (r["model"]["arch"] == "moe") == moe]
    rows = {x.id: x for x in results(records) if x.headline}
    pairs: dict[tuple, dict[str, tuple[float, float]]] = defaultdict(dict)
    for r in records:
        x, w = rows[r["id"]], r["workload"]
        assert x.predicted is not None
        pairs[(r["model"]["name"], w["input_len"], w["output_len"])][r["hardware"]["gpu"]] = (x.measured, x.predicted)
    return {k: (v[TWINS[1]][0] / v[TWINS[0]][0], v[TWINS[1]][1] / v[TWINS[0]][1])
            for k, v in pairs.items() if len(v) == 2}


def test_the_dense_twins_read_as_measured_so_the_grace_host_does_not_bind_them():
    """Llama 3.3 70B (one GPU) and Llama 3.1 405B (tp 4), 10 workloads each: the page measured the GB200 at 1.016 to
    1.18x the B200, never slower. meshplan prices every GB200 twin no slower than its B200 (its Grace host time
    hidden behind the GPU's) and the ratio within a mean |log(predicted / measured)| of 0.07 (0.045 as shipped, the
    largest 0.10 at 70B 128/4096: 1.038 against 1.149). A host term that binds Grace in the iterations with prompt
    tokens (the eager-layer host cost, Engine.eager_layer_overhead, 0.3 ms a layer x 2.75 on Grace) reads the GB200
    MoE runs closer but the dense twins apart (mean 0.106 for 70B): it stands in for the B200's GPU-side miss."""
    ratios = _twin_ratios(moe=False)
    assert len(ratios) == 20
    assert all(1.0 < measured < 1.2 for measured, _ in ratios.values())
    assert all(predicted >= 1.0 for _, predicted in ratios.values())
    gap = [abs(math.log(predicted / measured)) for measured, predicted in ratios.values()]
    assert sum(gap) / len(gap) < 0.07


def test_the_twins_gpu_steps_are_priced_alike_and_only_their_host_apart():
    """Qwen3-30B-A3B, FP4 with an FP8 KV cache, 1,642 sequences decoding at 1,500 tokens of context (the 1000/1000
    run's batch on the B200): the GB200's GPU step within 0.9-1.0x the B200's (the same GPU, the GB200's at least as
    fast), its host time per iteration 2.75x (gb200.toml python_host over the x86 host's 1.0: 10.7 us x 1,642 =
    17.6 ms on the B200, 48.3 ms on Grace)."""
    model, engine = load_model("qwen3-30b-a3b"), load_engine("trtllm-pytorch")
    cols = {"tp": 1, "pp": 1, "dpa": 1, "ep": 1, "batch": 1642, "replicas": 1, "prefill_replicas": 0}
    gpu, host = {}, {}
    for name in ("b200", "gb200"):
        cluster = load_system(name).cluster(1)
        s = Setting(model, cluster, cols, FP4, engine, Workload(input_len=1000, output_len=1000))
        gpu[name] = float(s.gpu_time(1642.0, 0.0, 0.0, 0.0))
        host[name] = float(engine.host_time(1642.0, 1, engine.loop_speed(cluster)))
    assert 0.9 <= gpu["gb200"] / gpu["b200"] <= 1.0
    assert host["b200"] == pytest.approx(1642 * 10.7e-6)
    assert host["gb200"] / host["b200"] == pytest.approx(2.75)


@pytest.mark.parametrize(("preset", "batches"), [("qwen3-30b-a3b", (150, 786, 1642, 4096)),
                                                  ("llama4-scout", (96, 288, 603, 4096))])
def test_every_expert_is_touched_at_these_runs_batches(preset, batches):
    """The distinct experts a decode step touches, E·(1 − (1 − k/E)^T) (serve/moe.py), is priced: at the decode
    batches of these runs (Qwen3-30B-A3B, E = 128, k = 8: 128·(1 − (15/16)^150) = 127.99 at the smallest; Llama 4
    Scout, E = 16, k = 1: 16·(1 − (15/16)^96) = 15.97) the step's expert GEMMs already read (all but 0.3 % of) every
    expert's weights, so a count of touched experts cannot be what makes them read too fast."""
    model, engine = load_model(preset), load_engine("trtllm-pytorch")
    cluster = load_system("gb200").cluster(1)
    E, k = model.num_experts, model.moe_topk
    for batch in batches:
        assert touched_experts(E, k, batch) == pytest.approx(E * (1 - (1 - k / E) ** batch))
        assert touched_experts(E, k, batch) > 0.997 * E
        cols = {"tp": 1, "pp": 1, "dpa": 1, "ep": 1, "batch": batch, "replicas": 1, "prefill_replicas": 0}
        s = Setting(model, cluster, cols, FP4, engine, Workload(input_len=1000, output_len=1000))
        ops = {op.name: op for op in moe_ops(model, s.shape(float(batch), 0.0, 0.0, 0.0))}
        fc1 = ops["moe/experts/fc1"]
        assert float(fc1.groups) == pytest.approx(touched_experts(E, k, batch))
        assert float(fc1.m) * float(fc1.groups) == pytest.approx(batch * k)  # every routed row, k a token
