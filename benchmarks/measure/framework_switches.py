"""Which framework switches move a search's #1 plan by 2x or more (issue 84 item 4): for a few models, the plan
Megatron-Core's search ranks first, priced again with each switch of its stack flipped (grouped expert GEMMs, MoE
permutation fusion, TP / DP / EP communication overlap, CUDA graphs, the all-gather dispatcher, the CP all-gather).
A switch that moves it 2x or more is one the search must try as a plan choice (search/variants.py: grouped GEMMs).

Run: python benchmarks/measure/framework_switches.py
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.errors import PlanError
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import load_stack

SWITCHES = {"expert_gemm": "grouped", "moe_permute": "fused", "overlap_tp": True, "overlap_dp": True,
            "overlap_ep": True, "cuda_graphs": True, "moe_dispatcher": "allgather", "cp_comm": "allgather"}
CASES = [("qwen3-next-80b-a3b", 64, 256), ("deepseek-v3", 256, 1024), ("mixtral-8x7b", 64, 256),
         ("qwen3-30b-a3b", 32, 256), ("gpt-oss-120b", 64, 256), ("llama3-8b", 8, 64)]


def speedups(model_name: str, gpus: int, batch: int) -> tuple[str, float, dict[str, str]]:
    core = load_stack("megatron-core")
    model, cluster = load_model(model_name), load_system("h100").cluster(gpus)
    best = search(model, cluster, Space(global_batch=batch, stack=core), top_k=1, workers=1).plans[0]
    out = {}
    for name, value in SWITCHES.items():
        if getattr(core, name) == value:
            continue
        try:
            flipped = estimate(model, cluster, best.plan, replace(core, **{name: value}))
            out[name] = f"{best.step_time / flipped.step_time:.2f}x"
        except PlanError:
            out[name] = "-"
    return best.plan.describe(), best.step_time, out


def main() -> None:
    for name, gpus, batch in CASES:
        plan, step, moved = speedups(name, gpus, batch)
        print(f"{name} on {gpus} H100, #1 {plan} ({step:.3g} s): " + ", ".join(f"{k} {v}" for k, v in moved.items()))
    # the plan: Qwen3-Next at tp 8, pp 4, ep 1 on 256 H100 (all 512 experts on every GPU)
    model, cluster = load_model("qwen3-next-80b-a3b"), load_system("h100").cluster(256)
    plan, core = Plan(dp=8, tp=8, pp=4, global_batch=1024), load_stack("megatron-core")
    per, grouped = (estimate(model, cluster, plan, core.with_(expert_gemm=g)).step_time
                    for g in ("per_expert", "grouped"))
    print(f"qwen3-next tp 8, pp 4, ep 1 on 256 H100: per-expert GEMMs {per:.1f} s, grouped {grouped:.2f} s "
          f"({per / grouped:.0f}x)")


if __name__ == "__main__":
    main()
