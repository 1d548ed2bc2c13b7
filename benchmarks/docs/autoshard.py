"""Compute every figure of docs/AUTOSHARD.md and write it (the prose is benchmarks/docs/autoshard_doc.py's).

Run: python benchmarks/docs/autoshard.py [--out DIR]   (about half a minute on 2 cores: traces on fake tensors and a few
     dozen integer programs; --out DIR writes DIR/AUTOSHARD.md instead: tests/test_docs.py compares a fresh copy
     with the committed one)

Sections it computes: the agreement with meshplan's analytic estimate (agree.py) on Llama-3-8B, GPT-3 and Mixtral
8x7B through transformers' classes and as meshplan's modules; the pipelines Alpa's stage DP finds (Llama-3-8B on 8 x 8
H100, and a model with a heavy head where unequal sub-meshes win); the plans the planner finds itself on one 8-GPU
node for one sequence (Megatron's tensor parallelism rediscovered) and for a node's worth of sequences; the
non-transformers' plans against their traced liveness; the size of the program before and after its exact
reductions. Speed is benchmarks/measure/autoshard_speed.py's (timings vary
from run to run, so they are not in the generated document).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "benchmarks" / "docs"), str(ROOT / "benchmarks" / "measure")]

from autoshard_doc import TEMPLATE  # noqa: E402
from meshplan.units import fmt_bytes, fmt_time  # noqa: E402

HF = ROOT / "tests" / "data" / "hf"
AGREE = [("llama3-8b", 4096, "transformers", HF / "llama-3-8b" / "config.json"),
         ("gpt3-175b", 2048, "transformers", None),  # no published config.json: the GPT-2 class of its shape
         ("mixtral-8x7b", 4096, "transformers", HF / "mixtral-8x7b" / "config.json"),
         ("llama3-8b", 4096, "meshplan module", None), ("gpt3-175b", 2048, "meshplan module", None),
         ("mixtral-8x7b", 4096, "meshplan module", None)]
FOUND = [("llama3-8b", 1, 4096), ("llama3-8b", 8, 4096), ("megatron-7.5b", 1, 2048), ("megatron-7.5b", 8, 2048)]


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def agreement_table() -> str:
    from meshplan.autoshard.agree import agreement
    from meshplan.estimate import estimate

    lines = ["| model | traced as | what the code runs (stack) | planner | estimate | difference | under Megatron's "
             "kernels | compute | tensor-parallel collectives | gradient reductions | optimizer |",
             "|---|---|---|---:|---:|---:|---:|---|---|---|---|"]
    for model, seq, source, config in AGREE:
        a = agreement(model, "h100", 16, 16, seq, source, config=str(config) if config else None)
        e = a.estimated
        runs = [f"projections {e.stack.projections}"]
        runs += [f"permutation {e.stack.moe_permute}"] if e.model.is_moe else []
        megatron = estimate(e.model, e.cluster, e.plan, e.stack.with_(projections="fused", moe_permute="fused"))
        cells = [f"{fmt_time(p)} / {fmt_time(t)}" for p, t in a.parts().values()]
        where = "transformers, " + (config.parent.name + "/config.json" if config else "GPT-2 class") \
            if source == "transformers" else source
        lines.append(f"| {model} | {where} | {', '.join(runs)} | {fmt_time(a.planned.step_time)} | "
                     f"{fmt_time(e.step_time)} | {_pct(a.error)} | {_pct(a.planned.step_time / megatron.step_time - 1)}"
                     " | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def stages_table() -> str:
    """Llama-3-8B on 8 x 8 H100, 64 sequences of 8192 tokens in 8 micro-batches: the DP's best pipeline of each
    stage count against the one-stage plan."""
    from meshplan.autoshard.planner import Request, plan_sharding

    result = plan_sharding(Request(model="llama3-8b", gpus=64, global_batch=64, seq=8192, micro_batches=8,
                                   stages="search"))
    lines = ["| stages | GPUs per stage | layers per stage | step time | bubble | peak memory per GPU (first stage) "
             "| fits |", "|---:|---|---|---:|---:|---:|---|",
             f"| 1 | 64 | 32 | {fmt_time(result.intra.step_time)} | | {fmt_bytes(result.intra.memory.peak)} | "
             f"{'yes' if result.intra.fits else 'no'} |"]
    for p in result.pipelines:
        lines.append(f"| {p.stages} | {' + '.join(map(str, p.devices))} | {' + '.join(map(str, p.layers))} | "
                     f"{fmt_time(p.step_time)} | {fmt_time(p.bubble)} | {fmt_bytes(p.memory[0])} | "
                     f"{'yes' if p.fits else 'no'} |")
    return "\n".join(lines)


def heavy_table() -> str:
    """The heavy-head model (benchmarks/measure/pipeline_models.py) on 32 H100: the DP's pipeline against equal
    sub-meshes."""
    from pipeline_models import heavy_head_plans

    best, equal = heavy_head_plans()
    lines = ["| sub-meshes | GPUs per stage | layers per stage | step time (simulator.simulate) |",
             "|---|---|---|---:|",
             f"| chosen by the DP | {' + '.join(map(str, best.devices))} | {' + '.join(map(str, best.layers))} | "
             f"{fmt_time(best.step_time)} |"]
    for n, p in sorted(equal.items(), key=lambda kv: kv[1].step_time):
        lines.append(f"| all of {n} GPUs | {' + '.join(map(str, p.devices))} | {' + '.join(map(str, p.layers))} | "
                     f"{fmt_time(p.step_time)} |")
    return "\n".join(lines)


def found_table() -> str:
    from meshplan.autoshard.output import params, sequence_parallel
    from meshplan.autoshard.planner import Request, plan_sharding

    lines = ["| model | sequences x tokens on 8 H100 | step time | memory per GPU | plan found (by parameter: "
             "style on the NVLink dimension) | sequence-parallel norms |", "|---|---|---:|---:|---|---|"]
    for model, batch, seq in FOUND:
        result = plan_sharding(Request(model=model, gpus=8, global_batch=batch, seq=seq, headroom=0.0, stages="off"))
        sharding = result.intra
        styles: dict[str, list[str]] = {}
        for p in params(sharding):
            if ".*." in p.name and p.name.endswith("weight"):
                styles.setdefault(p.styles[0], []).append(p.name.split(".*.", 1)[1].removesuffix(".weight"))
        shown = "; ".join(f"{style}: {', '.join(sorted(names))}" for style, names in sorted(styles.items()))
        lines.append(f"| {model} | {batch} x {seq} | {fmt_time(sharding.step_time)} | "
                     f"{fmt_bytes(sharding.memory.peak)} | {shown} | "
                     f"{'yes' if sequence_parallel(sharding, 0) else 'no'} |")
    return "\n".join(lines)


def vision_table() -> str:
    from meshplan.autoshard.blocks import find_blocks
    from meshplan.autoshard.dataflow import flow
    from meshplan.autoshard.mesh import device_mesh
    from meshplan.autoshard.output import params
    from meshplan.autoshard.problem import build_problem
    from meshplan.autoshard.solve import plan
    from meshplan.specs.efficiency import DEFAULT
    from meshplan.specs.hardware import load_system
    from meshplan.trace import trace_module
    from meshplan.trace.liveness import peak_memory
    from vision_models import MODELS

    cluster = load_system("h100").cluster(4)
    lines = ["| model | ops traced | tied blocks | one GPU's liveness peak | limit (60 %) | plan's peak per GPU "
             "| step time | parameters split |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for name, (make, inputs) in MODELS.items():
        trace = trace_module(make(), inputs, param_dtype="bfloat16")
        blocks = find_blocks(trace)
        problem = build_problem(flow(trace, blocks.block_of), blocks, device_mesh(cluster), DEFAULT)
        one = peak_memory(trace).peak
        sharding = plan(problem, 0.6 * one)
        tied = ", ".join(f"{g.traced} x {g.prefix.removeprefix('hf.')}" for g in blocks.groups) or "none"
        split = sum(1 for p in params(sharding) if any(x >= 0 for x in p.placements))
        lines.append(f"| {name} | {len(trace.ops)} | {tied} | {fmt_bytes(one)} | {fmt_bytes(0.6 * one)} | "
                     f"{fmt_bytes(sharding.memory.peak)} | {fmt_time(sharding.step_time)} | "
                     f"{split} of {len(params(sharding))} |")
    return "\n".join(lines)


def size_table() -> str:
    """The program of Llama-3-8B on 8 x 8 H100 before and after the reductions (ilp.py, reduce.py)."""
    from meshplan.autoshard.blocks import find_blocks
    from meshplan.autoshard.dataflow import flow
    from meshplan.autoshard.ilp import pairwise
    from meshplan.autoshard.mesh import device_mesh
    from meshplan.autoshard.planner import Request, load
    from meshplan.autoshard.problem import build_problem
    from meshplan.autoshard.reduce import reduce
    from meshplan.specs.efficiency import DEFAULT
    from meshplan.specs.hardware import load_system
    from meshplan.trace import trace_module

    request = Request(model="llama3-8b", gpus=64, global_batch=64, seq=8192)
    module, inputs, _, layers = load(request)
    trace = trace_module(module, inputs, param_dtype="bfloat16")
    blocks = find_blocks(trace, layers=layers)
    problem = build_problem(flow(trace, blocks.block_of), blocks, device_mesh(load_system("h100").cluster(64)), DEFAULT)
    before = pairwise(problem, 1, [])
    strategies = sum(len(c) for c in before.costs.values())
    pairs = sum(m.size for m in before.edges.values())
    after = reduce(pairwise(problem, 1, []))
    lines = ["| | aten ops traced (2 of 32 layers) | decisions | strategies | edges | edge variables |",
             "|---|---:|---:|---:|---:|---:|",
             f"| built | {len(trace.ops)} | {len(before.costs)} | {strategies} | {len(before.edges)} | {pairs} |",
             f"| after the exact reductions | | {len(after.costs)} | {sum(len(c) for c in after.costs.values())} | "
             f"{len(after.edges)} | {sum(m.size for m in after.edges.values())} |"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "docs"))
    args = parser.parse_args(argv)
    text = TEMPLATE.format(agreement=agreement_table(), found=found_table(), vision=vision_table(),
                           size=size_table(), stages=stages_table(), heavy=heavy_table())
    out = Path(args.out) / "AUTOSHARD.md"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
