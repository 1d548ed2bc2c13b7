"""vLLM's host time per iteration: the engine presets hold what benchmarks/measure/vllm_v0_host_cpu.py (V0) and
vllm_v1_host_cpu.py (V1) measured in vLLM's own code (data/measured/2026-11-27-vllm-host-cpu.json), and serving prices
it: exposed per sequence, and V0's async output processor's share beside the GPU's step."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from meshplan.serve.engine import Engine, load_engine
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan_validation.serving_map import engine_of

ROOT = Path(__file__).resolve().parents[1]
FOUND = json.loads((ROOT / "data" / "measured" / "2026-11-27-vllm-host-cpu.json").read_text())
MODULE_ON_REFERENCE_HOST = 0.8387125e-6  # s: check-step's nn.Module call on the lent H200's host


def line(rows: list[dict], key: str) -> tuple[float, float]:
    """Least squares a + b·n of ``key`` over the rows, written out."""
    ns, ys = [r["n"] for r in rows], [r[key] for r in rows]
    mn, my = statistics.fmean(ns), statistics.fmean(ys)
    b = sum((x - mn) * (y - my) for x, y in zip(ns, ys, strict=True)) / sum((x - mn) ** 2 for x in ns)
    return my - b * mn, b


@pytest.mark.parametrize(("version", "preset"), [("0.5.3.post1", "vllm-v0.5"), ("0.6.6.post1", "vllm-v0"),
                                                 ("0.10.0", "vllm")])
def test_presets_hold_the_committed_measurement(version, preset):
    run = FOUND["versions"][version]
    assert [r["n"] for r in run["rows"]] == [1, 2, 4, 8, 16, 32, 64, 128, 256]
    for r in run["rows"]:  # each iteration is the exposed loop and the callback beside the GPU (medians of each)
        assert r["step_s"] == pytest.approx(r["exposed_s"] + r["callback_s"], rel=0.05)
    scale = MODULE_ON_REFERENCE_HOST / run["module_s"]  # this CPU's Python against the reference host's
    assert run["to_reference_host"] == pytest.approx(scale)
    a, b = line(run["rows"], "exposed_s")
    _, c = line(run["rows"], "callback_s")
    # a line fits the loop: every row within 30 % of it (0.5.3's small batches, 0.7-0.9x, the worst)
    assert all(0.7 <= r["exposed_s"] / (a + b * r["n"]) <= 1.3 for r in run["rows"])
    engine = load_engine(preset)
    # the presets round to three figures
    assert engine.iteration_overhead == pytest.approx(scale * a, rel=5e-3)
    assert engine.sequence_overhead == pytest.approx(scale * b, rel=5e-3)
    if not version.startswith("0.6"):  # no async output processing before v0.6.0; V1 detokenises in another process
        assert engine.hidden_sequence_overhead == 0.0
        assert all(r["callback_s"] < 2e-6 for r in run["rows"])
    else:
        assert engine.hidden_sequence_overhead == pytest.approx(scale * c, rel=5e-3)
    assert engine.host_in_python and not engine.host_overlap


def test_the_presets_against_the_published_figures():
    # v0.5.3's engine loop under the v0.6.0 blog's load: 29 % of 13 ms = 3.8 ms, at 34 running sequences
    old = load_engine("vllm-v0.5")
    assert old.host_time(34) == pytest.approx(0.29 * 13e-3, rel=0.01)
    # vllm-project/vllm#6801: "when BS is 200, all this together can be 20ms" (scheduler, inputs, sampler, outputs)
    assert old.host_time(200) == pytest.approx(20e-3, rel=0.1)
    # V1's 1.7x over V0 at 5 ms of GPU per step: 3.5 ms of V0 host time, at 55 running sequences
    new = load_engine("vllm-v0")
    assert new.host_time(55) == pytest.approx((1.7 - 1) * 5e-3, rel=0.01)
    # a record's engine string picks them
    assert engine_of({"engine": "vLLM 0.5.4"}).name == "vllm-v0.5"
    assert engine_of({"engine": "vLLM 0.6.1"}).name == "vllm-v0"


def test_hidden_host_work_lengthens_a_step_only_beyond_the_gpus():
    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(1)
    workload, plan = Workload(input_len=128, output_len=128), ServePlan(batch=64)
    base = serve_estimate(model, cluster, plan, workload, Engine()).metrics.decode_step
    # 64 sequences x 1 us beside a decode step of milliseconds: hidden
    small = serve_estimate(model, cluster, plan, workload, Engine(hidden_sequence_overhead=1e-6))
    assert small.metrics.decode_step == pytest.approx(base)
    # 64 x 1 ms = 64 ms beside it: the step lasts as long as the host's work, and the breakdown says what is exposed
    large = serve_estimate(model, cluster, plan, workload, Engine(hidden_sequence_overhead=1e-3))
    assert large.metrics.decode_step == pytest.approx(64e-3)
    gpu = sum(v for k, v in large.breakdown.items() if k != "engine/host")
    assert large.breakdown["engine/host"] == pytest.approx(64e-3 - gpu)


def test_the_serving_report_names_each_host_term():
    from meshplan.report.serve_trust import host_terms

    beside = "21.4 us a sequence beside the GPU's step"
    after = "1.11 ms of GPU work after the forward pass"  # iteration_latency, 1.115 ms
    assert host_terms(load_engine("vllm-v0")) == f"323 us + 58.2 us a sequence + {beside} + {after}"
    assert host_terms(load_engine("vllm-v0.5")) == f"712 us + 89.6 us a sequence + {after}"
    assert host_terms(Engine()) == "none"
