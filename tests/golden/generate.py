"""Golden outputs: the numbers meshplan gives for every model preset on a few systems and plans, the top plans of a
few searches, a few serving estimates (every servable model on one instance, and the settings of SERVES), and
the sharding planner's Megatron-LM plan and its own plan of a few presets (autoshard.json: needs torch and
scipy), as reviewed files that a refactor must leave byte-identical (tests/test_golden.py).

A change that is meant to move an estimate regenerates them in a commit of its own that says why:

    python tests/golden/generate.py            # rewrite tests/golden/*.json
    python tests/golden/generate.py --check    # exit 1 if they would change

Every number is written with 10 significant digits, so the files do not depend on the last bits that a different
order of floating-point sums (another NumPy build) may move.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.estimate import Estimate, estimate
from meshplan.search import Space, search
from meshplan.serve.check import servable
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import ServeEstimate, serve_estimate
from meshplan.serve.plan import ServePlan, Workload
from meshplan.serve.precision import Quant
from meshplan.specs.check import check
from meshplan.specs.hardware import load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

HERE = Path(__file__).resolve().parent
GPUS = 64
SYSTEMS = ("h100", "a100", "gb200")
OPS_SYSTEM = "h100"  # the per-op table is kept for the first template on this system
# the searches run every plan meshplan models (the generic stack), with no memory headroom, ranked by time alone (not
# Space's defaults, the command line's: Megatron-Core, MEMORY_HEADROOM, the simplest plan within the error band)
EVERY_PLAN = {"stack": Stack(), "headroom": 0.0, "prefer_simple": False}
SEARCHES = (  # (model, system, gpus, global batch, space options)
    ("llama3-70b", "h100", 1024, 512, {}),
    ("llama3-8b", "h100", 8, 64, {}),
    ("gpt3-175b", "a100", 1024, 1536, {"layouts": ("1d",)}),
    ("mixtral-8x7b", "h100", 64, 256, {"offload_optimizer": (False,), "offload_activations": (False,)}),
    ("deepseek-v3", "b200", 1024, 4096, {"offload_optimizer": (False,), "offload_activations": (False,),
                                         "zero": (1,), "recompute": ("selective", "full")}),
)

AUTOSHARD = (  # (model, system, gpus, sequences, tokens): one node (the mesh nvlink 8), two for Mixtral (network 2 x
    ("gpt2", "h100", 8, 8, 1024),  # nvlink 8: its 16 bytes a parameter of model states, 47e9 x 16 / 8 = 94 GB, do not
    ("llama3-8b", "h100", 8, 8, 2048),  # fit one node)
    ("mixtral-8x7b", "h100", 16, 16, 1024),
)


SERVES = (  # (model, system, engine, tp, pp, dpa, ep, batch, quant, input, output): the serving golden outputs
    ("llama3-70b", "h100", "vllm", 4, 1, 1, 1, 64, Quant(), 1000, 256),
    ("megatron-3.6b", "h200", "sglang", 4, 4, 1, 1, 1024, Quant(), 128, 128),
    ("mixtral-8x7b", "a100", "trtllm", 2, 1, 1, 2, 32, Quant(), 2048, 512),
    ("deepseek-v3", "h200", "sglang", 8, 1, 2, 16, 128, Quant(weights="fp8", activations="fp8"), 1000, 1000),
    ("mistral-7b", "l40s", "vllm", 1, 1, 1, 1, 16, Quant(weights="fp8", activations="fp8", kv_cache="fp8"), 16000, 500),
    ("llama3-8b", "h100", "trtllm", 1, 1, 1, 1, 128, Quant(weights="int4"), 128, 2048),
)
SERVE_SYSTEM, SERVE_WORKLOAD = "h200", (1000, 256)  # every servable preset on one H200 instance of 8, batch 32


def num(x: float) -> str:
    return f"{x:.10g}"


def _ep(model: ModelSpec, ranks: int) -> int:
    """The largest expert-parallel size up to 8 that divides the experts and the ranks of a stage."""
    if not model.is_moe:
        return 1
    return max(e for e in range(1, 9) if model.num_experts % e == 0 and ranks % e == 0)


def templates(model: ModelSpec, precision: str) -> dict[str, dict[str, Any]]:
    """Plan templates (tp is chosen per model: the largest of ``tps`` that gives a valid plan)."""
    layers = model.num_layers
    pp = 4 if layers >= 8 else 1
    vpp = 2 if pp > 1 and layers % (2 * pp) == 0 else 1
    return {
        "tp-sp": dict(tps=(8, 4, 2, 1), pp=1, micro_batch=1, accum=4, zero=1, recompute="selective",
                      grad_bytes=4),
        "pipeline": dict(tps=(4, 2, 1), pp=pp, vpp=vpp, micro_batch=1, accum=8, zero=1, recompute="full",
                         grad_bytes=4, stack=Stack(overlap_tp=True, overlap_pp=True),
                         schedule="interleaved" if vpp > 1 else "1f1b"),
        "zero3-offload": dict(tps=(1, 2), pp=1, micro_batch=2, accum=2, zero=3, recompute="none",
                              offload_activations=True, precision=precision, grad_bytes=2),
    }


def make_plan(model: ModelSpec, cluster: Any, template: dict[str, Any]) -> tuple[Plan | None, Stack, list[str]]:
    """The template's plan with the first of its tp sizes that ``check`` accepts (or the last one's reasons), and
    the stack that runs it."""
    options = dict(template)
    tps, accum, stack = options.pop("tps"), options.pop("accum"), options.pop("stack", Stack())
    reasons: list[str] = []
    for tp in tps:
        dp = GPUS // (tp * options["pp"])
        plan = Plan(dp=dp, tp=tp, ep=_ep(model, tp * dp), sequence_parallel=tp > 1,
                    global_batch=dp * options["micro_batch"] * accum, **options)
        reasons = check(model, cluster, plan, stack)
        if not reasons:
            return plan, stack, []
    return None, stack, reasons


def record(est: Estimate, ops: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "plan": est.plan.describe(),
        "step_time": num(est.step_time),
        "breakdown": {k: num(v) for k, v in est.breakdown.items()},
        "memory": {k: num(v) for k, v in est.memory.items()},
        "peak_memory": num(est.peak_memory),
        "rank_memory": [num(v) for v in est.rank_memory],
        "host_memory": num(est.host_memory),
        "model_flops": num(est.model_flops),
        "hardware_flops": num(est.hardware_flops),
        "mfu": num(est.mfu),
        "hfu": num(est.hfu),
        "reasons": list(est.reasons),
    }
    if ops:
        out["ops"] = [[o.name, o.phase, o.kind, num(o.count), num(o.flops), num(o.nbytes), num(o.seconds), o.bound]
                      for o in est.ops]
    return out


def estimates() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for system_name in SYSTEMS:
        system = load_system(system_name)
        cluster = system.cluster(GPUS)
        precision = "fp8" if "fp8" in system.accelerator.peak_flops else "bf16"
        for name in preset_names():
            model = load_model(name)
            for label, template in templates(model, precision).items():
                plan, stack, reasons = make_plan(model, cluster, template)
                key = f"{name} | {system_name} | {label}"
                if plan is None:
                    out[key] = {"invalid": reasons}
                    continue
                ops = system_name == OPS_SYSTEM and label == "tp-sp"
                out[key] = record(estimate(model, cluster, plan, stack), ops)
    return out


def searches() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model_name, system_name, gpus, batch, options in SEARCHES:
        model, cluster = load_model(model_name), load_system(system_name).cluster(gpus)
        result = search(model, cluster, Space(global_batch=batch, **EVERY_PLAN, **options), top_k=5, workers=1)
        out[f"{model_name} | {system_name} | {gpus} | gbs {batch}"] = {
            "evaluated": result.evaluated, "feasible": result.feasible,
            "rejected": dict(sorted(result.rejected.items())),
            "top": [{"plan": e.plan.describe(), "step_time": num(e.step_time), "peak_memory": num(e.peak_memory)}
                    for e in result.plans],
        }
    return out


def sharding(found: Any) -> dict[str, Any]:
    """A sharding planner's plan: its status, step time and price by part, peak memory per GPU, and every
    parameter's placements (autoshard/output.py's styles)."""
    from meshplan.autoshard.output import params

    price = found.price
    return {"status": found.status, "step_time": num(found.step_time),
            "price": {k: num(getattr(price, k)) for k in ("compute_fwd", "compute_bwd", "comm_fwd", "comm_bwd",
                                                          "grad_sync", "optimizer")} if price else None,
            "peak_memory": num(found.memory.peak) if found.memory else None,
            "reason": found.reason,
            "params": [f"{p.name}: {', '.join(p.styles)}" for p in params(found)] if found.choice else []}


def autoshard() -> dict[str, Any]:
    """For each of AUTOSHARD: the plan the planner finds itself (stages off, the whole HBM its limit) and
    Megatron-LM's (reference.megatron: tensor parallelism on the innermost mesh dimension, the batch split on the
    others), priced on the same trace."""
    from meshplan.autoshard.planner import Request, plan_sharding
    from meshplan.autoshard.reference import megatron
    from meshplan.autoshard.solve import plan

    out: dict[str, Any] = {}
    for model, system, gpus, sequences, tokens in AUTOSHARD:
        result = plan_sharding(Request(model=model, system=system, gpus=gpus, global_batch=sequences, seq=tokens,
                             stages="off"))
        problem = result.intra.problem
        dims = len(problem.mesh.dims)
        pinned = plan(problem, float("inf"), allowed=megatron(problem, tp=dims - 1, dp=tuple(range(dims - 1))))
        out[f"{model} | {system} | {gpus} | {sequences} x {tokens}"] = {
            "found": sharding(result.intra), "megatron": sharding(pinned)}
    return out


def serve_record(est: ServeEstimate) -> dict[str, Any]:
    """A serving estimate's figures (ServeEstimate.to_dict) at 10 significant digits."""
    def rounded(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: rounded(v) for k, v in value.items()}
        if isinstance(value, float):
            return num(value)
        return value

    return rounded(est.to_dict())


def serve_estimates() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, system, engine, tp, pp, dpa, ep, batch, quant, i, o in SERVES:
        plan = ServePlan(tp=tp, pp=pp, dpa=dpa, ep=ep, batch=batch, quant=quant)
        est = serve_estimate(load_model(name), load_system(system).cluster(plan.num_gpus), plan,
                             Workload(input_len=i, output_len=o), load_engine(engine))
        out[f"{name} | {system} | {engine} | {plan.describe()} | {i}x{o}"] = serve_record(est)
    cluster = load_system(SERVE_SYSTEM).cluster(8)
    for name in preset_names():
        model = load_model(name)
        try:
            servable(model)
        except SpecError:
            continue
        tp = max(t for t in (8, 4, 2, 1) if model.num_heads % t == 0)
        plan = ServePlan(tp=tp, ep=tp if model.is_moe and model.num_experts % tp == 0 else 1, batch=32)
        est = serve_estimate(model, cluster, plan, Workload(input_len=SERVE_WORKLOAD[0],
                                                            output_len=SERVE_WORKLOAD[1]), load_engine("vllm"))
        out[f"{name} | {SERVE_SYSTEM} | vllm | {plan.describe()}"] = serve_record(est)
    return out


MAKERS = {"estimates.json": estimates, "searches.json": searches, "serve.json": serve_estimates,
          "autoshard.json": autoshard}


def documents() -> dict[str, str]:
    """File name -> the JSON text it should hold."""
    return {name: json.dumps(make(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"
            for name, make in MAKERS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a golden file would change")
    args = parser.parse_args(argv)
    stale = []
    for name, text in documents().items():
        path = HERE / name
        if path.exists() and path.read_text() == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text)
    if stale:
        print(("stale: " if args.check else "written: ") + ", ".join(stale))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
