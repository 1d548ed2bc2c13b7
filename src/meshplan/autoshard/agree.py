"""Two methods agree: the sharding planner's price of Megatron-LM's plan against meshplan's analytic estimate of
the same model, cluster and plan (DESIGN.md, "two independent methods agree").

The planner traces the model (a preset as meshplan's Megatron-layout module, or its Hugging Face class from the
config) and prices the plan reference.megatron pins: tensor parallelism with sequence parallelism on the innermost
mesh dimension, the batch split on the others. ``estimate`` prices Plan(tp, dp, sequence_parallel, ZeRO 0, no
recompute) under the stack that runs what the trace runs: every aten op one kernel (``fusion="eager"``), PyTorch's
cross-entropy, the gradient reduction after the backward pass (``overlap_dp=False``, as the planner's step does not
overlap communication), and one grouped GEMM per expert projection (``expert_gemm="grouped"``, transformers'
grouped_mm). docs/AUTOSHARD.md prints the results and says where the two differ and why.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshplan.autoshard.blocks import find_blocks
from meshplan.autoshard.dataflow import flow
from meshplan.autoshard.mesh import device_mesh
from meshplan.autoshard.problem import build
from meshplan.autoshard.reference import megatron
from meshplan.autoshard.solve import Price, Sharding, plan
from meshplan.estimate import Estimate, estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

STACK = Stack(name="pytorch-eager", fusion="eager", cross_entropy="pytorch", overlap_dp=False,
              expert_gemm="grouped")


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


def trace_of(model: str, source: str, batch: int, seq: int):  # -> (Trace, layers)
    """A preset traced at depth 2: meshplan's module or the Hugging Face class of its config."""
    from meshplan.autoshard.models import TRACED_LAYERS, hf_model, preset_config
    from meshplan.autoshard.torch_models import supported
    from meshplan.trace import trace_module

    spec = load_model(model)
    if source == "transformers" or not supported(spec):
        module = hf_model(preset_config(replace(spec, seq_length=max(seq, spec.seq_length))))
    else:
        from meshplan.autoshard.torch_models import build as build_module

        module = build_module(replace(spec, seq_length=max(seq, spec.seq_length)), TRACED_LAYERS)
    return trace_module(module, [((batch, seq), "int64")], param_dtype="bfloat16"), spec.num_layers


def agreement(model: str, system: str, gpus: int, batch: int, seq: int, source: str = "meshplan module",
              tp: int = 8) -> Agreement:
    """Megatron's plan (tp on the NVLink dimension, the batch over the rest) priced both ways."""
    trace, layers = trace_of(model, source, batch, seq)
    cluster = load_system(system).cluster(gpus)
    blocks = find_blocks(trace, layers=layers)
    problem = build(flow(trace, blocks.block_of), blocks, device_mesh(cluster), DEFAULT)
    dims = len(problem.mesh.dims)
    pinned = plan(problem, float("inf"), allowed=megatron(problem, tp=dims - 1, dp=tuple(range(dims - 1))))
    dp = gpus // tp
    spec = replace(load_model(model), seq_length=seq)
    megatron_plan = Plan(tp=tp, dp=dp, sequence_parallel=True, zero=0, recompute="none", micro_batch=batch // dp,
                         global_batch=batch)
    return Agreement(model=model, source=source, gpus=gpus, tp=tp,
                     batch=batch, seq=seq, planned=pinned, estimated=estimate(spec, cluster, megatron_plan, STACK))
