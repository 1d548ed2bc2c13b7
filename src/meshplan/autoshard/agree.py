"""Two methods agree: the sharding planner's price of Megatron-LM's plan against meshplan's analytic estimate of
the same model, cluster and plan (DESIGN.md, "two independent methods agree").

The planner traces the model (a preset as meshplan's Megatron-layout module, or a Hugging Face config.json through
transformers' class) and prices the plan reference.megatron pins: tensor parallelism with sequence parallelism on
the innermost mesh dimension, the batch split on the others, a MoE layer's tokens exchanged as Megatron-Core's
all-gather dispatcher does. ``estimate`` prices Plan(tp, dp, sequence_parallel, ZeRO 0, no recompute, bf16
gradients) under the stack that runs what the traced code runs (``code_stack``), so that each side prices the same
computation:

- every aten op one kernel (``fusion="eager"``), PyTorch's cross-entropy, the gradient reduction after the backward
  pass (``overlap_dp=False``: the planner's step does not overlap communication), one grouped GEMM per expert
  projection (``expert_gemm="grouped"``), the tokens all-gathered before the permutation (``moe_dispatcher``);
- the projections as the code writes them (``projections``): meshplan's module computes Q, K, V in one GEMM and the
  gate and up in one, split by torch.split / chunk (torch_models.py), as does GPT-2's ``c_attn``; the Hugging Face
  Llama and Mixtral classes run ``q_proj``, ``k_proj``, ``v_proj`` (and Llama's ``gate_proj``, ``up_proj``)
  apart (transformers/models/llama/modeling_llama.py, LlamaAttention and LlamaMLP);
- the MoE permutation as the code runs it (``moe_permute``): meshplan's module the unfused Megatron-Core order
  (gather, weighting, scatter-add), transformers' grouped_mm experts their sort, float32 weighting, inverse
  permutation and sum over k (cost/moe_permute.py).

Dropout is off on both sides: meshplan's module has none, and on the CPU's fake tensors PyTorch decomposes dropout
(bernoulli_, div_, mul) and attention with dropout (the math kernel) where a GPU runs one fused dropout kernel and
flash attention with dropout, so a trace cannot show the GPU's kernels. docs/AUTOSHARD.md prints the results.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.autoshard.blocks import find_blocks
from meshplan.autoshard.dataflow import flow
from meshplan.autoshard.mesh import device_mesh
from meshplan.autoshard.problem import build_problem
from meshplan.autoshard.reference import megatron
from meshplan.autoshard.solve import Price, Sharding, plan
from meshplan.estimate import Estimate, estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

STACK = Stack(name="pytorch-eager", fusion="eager", cross_entropy="pytorch", overlap_dp=False,
              expert_gemm="grouped", moe_dispatcher="allgather")
# the projections each Hugging Face family's attention and MLP run (module docstring); others: separate
SPLIT_FAMILIES = ("gpt2",)


def code_stack(source: str, model_type: str = "") -> Stack:
    """The stack that runs what the traced code runs (module docstring)."""
    if source == "meshplan module":
        return STACK.with_(name="meshplan-module", projections="split", moe_permute="gather_scatter")
    return STACK.with_(name=f"transformers-{model_type}", moe_permute="sort_gather",
                       projections="split" if model_type in SPLIT_FAMILIES else "separate")


@dataclass(frozen=True, kw_only=True)
class Agreement:
    model: str
    source: str  # "meshplan module" | "transformers"
    gpus: int
    tp: int
    batch: int
    seq: int
    planned: Sharding
    estimated: Estimate

    @property
    def price(self) -> Price:
        assert self.planned.price is not None
        return self.planned.price

    @property
    def error(self) -> float:
        """Planner / estimate - 1."""
        return self.planned.step_time / self.estimated.step_time - 1

    def parts(self) -> dict[str, tuple[float, float]]:
        """(planner, estimate) seconds per step by part: compute, tensor-parallel collectives, gradient reductions
        and the optimizer."""
        p, b = self.price, self.estimated.breakdown
        return {"compute": (p.compute_fwd + p.compute_bwd, b["compute"] + b["recompute"]),
                "tensor parallel": (p.comm_fwd + p.comm_bwd, b["tp"] + b["ep"] + b["cp"]),
                "gradient reductions": (p.grad_sync, b["dp"]), "optimizer": (p.optimizer, b["optimizer"])}


def traced(model: str, source: str, batch: int, seq: int, config: str | None = None):  # -> (Trace, spec, type)
    """A model traced at depth 2 and its ModelSpec: a preset as meshplan's module, or (``source`` "transformers")
    transformers' class of ``config`` (a config.json path; default the preset's own Hugging Face config)."""
    from meshplan.autoshard.models import TRACED_LAYERS, hf_model, preset_config, read_config
    from meshplan.autoshard.torch_models import supported
    from meshplan.trace import trace_module

    spec = replace(load_model(config or model), dropout=False)
    spec = replace(spec, seq_length=max(seq, spec.seq_length))
    if source == "transformers" or not supported(spec):
        hf = read_config(config) if config else preset_config(spec)
        module, kind = hf_model(hf), str(hf["model_type"])
    else:
        from meshplan.autoshard.torch_models import build_preset

        module, kind = build_preset(spec, TRACED_LAYERS), ""
    return trace_module(module, [((batch, seq), "int64")], param_dtype="bfloat16"), spec, kind


def agreement(model: str, system: str, gpus: int, batch: int, seq: int, source: str = "meshplan module",
              tp: int = 8, config: str | None = None) -> Agreement:
    """Megatron's plan (tp on the NVLink dimension, the batch over the rest) priced both ways (module docstring)."""
    trace, spec, kind = traced(model, source, batch, seq, config)
    cluster = load_system(system).cluster(gpus)
    blocks = find_blocks(trace, layers=spec.num_layers)
    problem = build_problem(flow(trace, blocks.block_of), blocks, device_mesh(cluster), DEFAULT)
    dims = len(problem.mesh.dims)
    pinned = plan(problem, float("inf"), allowed=megatron(problem, tp=dims - 1, dp=tuple(range(dims - 1))))
    dp = gpus // tp
    megatron_plan = Plan(tp=tp, dp=dp, sequence_parallel=True, zero=0, recompute="none", grad_bytes=2,
                         micro_batch=batch // dp, global_batch=batch)
    stack = code_stack(source, kind)
    estimated = estimate(replace(spec, seq_length=seq), cluster, megatron_plan, stack)
    return Agreement(model=model, source=source, gpus=gpus, tp=tp, batch=batch, seq=seq, planned=pinned,
                     estimated=estimated)

