"""Compute every figure of docs/AUTOSHARD.md and write it (the prose is benchmarks/autoshard_doc.py's).

Run: python benchmarks/autoshard.py [--out DIR]   (about half a minute on 2 cores: traces on fake tensors and a few
     dozen integer programs; --out DIR writes DIR/AUTOSHARD.md instead: tests/test_docs.py compares a fresh copy
     with the committed one)

Sections it computes: the agreement with meshplan's analytic estimate (agree.py) on the Llama, GPT and Mixtral
presets; the plans the planner finds itself on one 8-GPU node for one sequence (Megatron's tensor parallelism
rediscovered) and for a node's worth of sequences; the non-transformers' plans against their traced liveness; the
size of the program before and after its exact reductions. Speed is benchmarks/autoshard_speed.py's (timings vary
from run to run, so they are not in the generated document).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))

from autoshard_doc import TEMPLATE  # noqa: E402
from meshplan.units import fmt_bytes, fmt_time  # noqa: E402

AGREE = [("llama3-8b", 4096, "meshplan module"), ("gpt3-175b", 2048, "meshplan module"),
         ("mixtral-8x7b", 4096, "meshplan module"), ("llama3-8b", 4096, "transformers"),
         ("mixtral-8x7b", 4096, "transformers")]
FOUND = [("llama3-8b", 1, 4096), ("llama3-8b", 8, 4096), ("megatron-7.5b", 1, 2048), ("megatron-7.5b", 8, 2048)]


def _pct(x: float) -> str:
    return f"{100 * x:+.1f} %"


def agreement_table() -> str:
    from meshplan.autoshard.agree import agreement

    lines = ["| model | traced as | planner | estimate | difference | compute | tensor-parallel collectives | "
             "gradient reductions | optimizer |", "|---|---|---:|---:|---:|---|---|---|---|"]
    for model, seq, source in AGREE:
        a = agreement(model, "h100", 16, 16, seq, source)
        parts = a.parts()
        cells = [f"{fmt_time(p)} / {fmt_time(e)}" for p, e in parts.values()]
        lines.append(f"| {model} | {a.source} | {fmt_time(a.planned.step_time)} | {fmt_time(a.estimated.step_time)} "
                     f"| {_pct(a.error)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def found_table() -> str:
    from meshplan.autoshard.output import params, sequence_parallel
    from meshplan.autoshard.planner import Request, run

    lines = ["| model | sequences x tokens on 8 H100 | step time | memory per GPU | plan found (by parameter: "
             "style on the NVLink dimension) | sequence-parallel norms |", "|---|---|---:|---:|---|---|"]
    for model, batch, seq in FOUND:
        result = run(Request(model=model, gpus=8, global_batch=batch, seq=seq, headroom=0.0, stages="off"))
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
    from meshplan.autoshard.problem import build
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
        problem = build(flow(trace, blocks.block_of), blocks, device_mesh(cluster), DEFAULT)
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
    from meshplan.autoshard.problem import build
    from meshplan.autoshard.reduce import reduce
    from meshplan.specs.efficiency import DEFAULT
    from meshplan.specs.hardware import load_system
    from meshplan.trace import trace_module

    request = Request(model="llama3-8b", gpus=64, global_batch=64, seq=8192)
    module, inputs, _, layers = load(request)
    trace = trace_module(module, inputs, param_dtype="bfloat16")
    blocks = find_blocks(trace, layers=layers)
    problem = build(flow(trace, blocks.block_of), blocks, device_mesh(load_system("h100").cluster(64)), DEFAULT)
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
                           size=size_table())
    out = Path(args.out) / "AUTOSHARD.md"
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
