"""Supports: which plans a framework can run, as its stack preset's ``[supports]`` table says (each with its source).

A framework runs some parallel dimensions, pipeline schedules, tensor layouts, ZeRO stages and offloads and not
others: Megatron-Core has no GPipe schedule and no ZeRO-2, plain PyTorch FSDP no tensor or pipeline parallelism,
none of them the 2D SUMMA or tp2d layouts. The search explores only what the stack supports (``search/space.py``), so
that the plan it ranks first is one the user can launch; ``--framework any`` (every field at its default here) keeps
the whole space meshplan models and names the frameworks that could run the winner (``runs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from meshplan.errors import SpecError
from meshplan.fields import unknown_field
from meshplan.specs.plan import LAYOUTS, OPTIMIZERS, RECOMPUTE_MODULES, SCHEDULES
from meshplan.specs.refusals import REFUSALS, own_rules, refused
from meshplan.specs.stack_variants import EXPERT_GEMM_NAMES as EXPERT_GEMM  # Stack.expert_gemm's choices

AXES = ("tp", "pp", "cp", "ep")  # the axes a framework may lack (dp it always has)
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True, kw_only=True)
class Supports:
    """What plans a framework runs. The defaults: everything meshplan models (``--framework any``)."""

    layouts: tuple[str, ...] = field(default=LAYOUTS, metadata={"help": "tensor layouts: 1d (Megatron), summa (2D), "
                                                                      "tp2d (2D weight-stationary)"})
    schedules: tuple[str, ...] = field(default=SCHEDULES, metadata={"help": "pipeline schedules"})
    zero: tuple[int, ...] = field(default=(0, 1, 2, 3), metadata={"help": "ZeRO stages (1: distributed optimizer)"})
    axes: tuple[str, ...] = field(default=AXES, metadata={"help": "parallel axes besides dp: tp, pp, cp, ep"})
    recompute: tuple[str, ...] = field(default=RECOMPUTE, metadata={"help": "activation recompute: none, selective "
                                                                             "(some modules), full (whole layers)"})
    # Megatron-Core's recompute_modules, or torchtitan's per-op policy op_sac (cost/recompute.py); the first is what
    # "selective" means to it where a plan names no modules (Space, estimate)
    recompute_modules: tuple[str, ...] = field(default=RECOMPUTE_MODULES, metadata={
        "help": "selective recompute modules it runs (Plan.recompute_modules), its own first"})
    optimizers: tuple[str, ...] = field(default=OPTIMIZERS, metadata={"help": "optimizers (Plan.optimizer) it runs"})
    sequence_parallel: bool = field(default=True, metadata={"help": "Megatron sequence parallelism with tp"})
    offload_optimizer: bool = field(default=True, metadata={"help": "optimizer state and step on the host"})
    offload_activations: bool = field(default=True, metadata={"help": "saved activations on the host"})
    offload_weights: bool = field(default=True, metadata={"help": "weights in host memory (ZeRO-Infinity)"})
    parameter_server: bool = field(default=True, metadata={"help": "parameter-server data parallelism"})
    mst_collectives: bool = field(default=True, metadata={"help": "minimum-spanning-tree collectives (MPICH)"})
    uneven_stages: bool = field(default=True, metadata={"help": "a last pipeline stage with its own layer count"})
    stage_layers: bool = field(default=True, metadata={"help": "any decoder layer count on each pipeline rank "
                                                               "(Plan.stage_layers: Megatron-Core's "
                                                               "pipeline_model_parallel_layout)"})
    expert_gemms: tuple[str, ...] = field(default=("per_expert", "grouped"), metadata={
        "help": "MoE expert GEMMs it runs (Stack.expert_gemm): per_expert, grouped (one kernel for the local experts)"})
    sharded_checkpoint: bool = field(default=True, metadata={"help": "every rank writes its share of a checkpoint "
                                                                     "(Megatron dist_checkpointing, torch DCP); "
                                                                     "false: the first data-parallel replica writes "
                                                                     "the weights (DeepSpeed)"})
    replica_recovery: bool = field(default=True, metadata={"help": "a failed data-parallel replica heals from a "
                                                                   "peer while the others train on (TorchFT: "
                                                                   "derived/goodput.py)"})
    uneven_batch: bool = field(default=True, metadata={"help": "data-parallel replicas running different "
                                                               "micro-batch counts a step (a mixed cluster's batch "
                                                               "shares, meshplan/derived/mixed.py)"})
    stage_settings: bool = field(default=True, metadata={"help": "recompute and activation offload set per pipeline "
                                                                 "rank (Plan.stage_recompute, stage_offload)"})
    any_placement: bool = field(default=True, metadata={"help": "the axes in any order on the mesh (false: the "
                                                                "framework's own rank order, tp innermost)"})
    # combinations its own validation code refuses (specs/refusals.py: each with its file, lines and version)
    refuses: tuple[str, ...] = field(default=(), metadata={"help": "refusals of specs/refusals.py it makes"})
    source: str = ""  # where these come from (the framework's arguments, schedules and parallelisms at a version)

    def __post_init__(self) -> None:
        for name, allowed in (("layouts", LAYOUTS), ("schedules", SCHEDULES), ("zero", (0, 1, 2, 3)),
                              ("expert_gemms", EXPERT_GEMM),
                              ("axes", AXES), ("recompute", RECOMPUTE), ("optimizers", OPTIMIZERS),
                              ("recompute_modules", RECOMPUTE_MODULES)):
            value = getattr(self, name)
            if not isinstance(value, tuple) or (not value and name != "axes") or any(v not in allowed for v in value):
                raise SpecError(f"supports.{name}={value!r} must list some of {', '.join(map(str, allowed))}")
        unknown = [r for r in self.refuses if r not in REFUSALS] if isinstance(self.refuses, tuple) else [self.refuses]
        if unknown:
            raise SpecError(f"supports.refuses: {unknown[0]!r} must be one of {', '.join(REFUSALS)}")
        for f in fields(self):
            if f.type == "bool" and not isinstance(getattr(self, f.name), bool):
                raise SpecError(f"supports.{f.name}={getattr(self, f.name)!r} must be true or false")

    def problems(self, plan: Any, model: Any = None, stack: Any = None) -> list[str]:
        """What of ``plan`` (a Plan) this framework does not run ([] = it runs it); with the ``model`` and the
        ``stack`` (a Stack: some refusals read it), also the combinations its code refuses (``refuses``)."""
        out = [f"tensor_layout={plan.tensor_layout}"] if plan.tensor_layout not in self.layouts else []
        out += [f"{a}={getattr(plan, a)}" for a in AXES if getattr(plan, a) > 1 and a not in self.axes]
        if plan.pp > 1 and plan.schedule not in self.schedules:
            out.append(f"schedule={plan.schedule}")
        out += [f"zero={plan.zero}"] if plan.zero not in self.zero else []
        out += [f"recompute={plan.recompute}"] if plan.recompute not in self.recompute else []
        if plan.recompute == "selective" and not self.runs_modules(plan.recompute_modules):
            out.append(f"recompute_modules={','.join(plan.recompute_modules)}")
        out += [f"optimizer={plan.optimizer}"] if plan.optimizer not in self.optimizers else []
        for name in ("sequence_parallel", "offload_optimizer", "offload_activations"):
            if getattr(plan, name) and not getattr(self, name):
                out.append(name)
        if plan.offload_weights and not self.offload_weights:
            out.append("offload_weights")
        if plan.dp_mode == "ps" and not self.parameter_server:
            out.append("dp_mode=ps")
        if plan.collectives == "mst" and not self.mst_collectives:
            out.append("collectives=mst")
        if plan.last_stage_layers and not self.uneven_stages:
            out.append(f"last_stage_layers={plan.last_stage_layers}")
        if model is not None and stack is not None:
            out += [r.what for r in refused(self.refuses, plan, model, stack)]  # then FSDP's stages, check's reason
            out += [r.what for r in own_rules(stack) if bool(r.test(plan, model, stack))]
        if getattr(plan, "first_stage_layers", 0) and not self.uneven_stages:
            out.append(f"first_stage_layers={plan.first_stage_layers}")
        if getattr(plan, "stage_layers", ()) and not self.stage_layers:
            out.append(f"stage_layers={','.join(map(str, plan.stage_layers))}")
        for name in ("stage_recompute", "stage_offload"):
            if getattr(plan, name, ()) and not self.stage_settings:
                out.append(f"{name}={','.join(map(str, getattr(plan, name)))}")
        return out

    def runs_modules(self, modules: tuple[str, ...]) -> bool:
        """Whether its selective recompute runs every one of ``modules`` (Plan.recompute_modules)."""
        return all(m in self.recompute_modules for m in modules)

    def runs(self, plan: Any, model: Any = None, stack: Any = None) -> bool:
        return not self.problems(plan, model, stack)


def supports_from_dict(data: Any, where: str) -> Supports:
    """A Supports from a preset's ``[supports]`` table (lists become tuples)."""
    if not isinstance(data, dict):
        raise SpecError(f"{where}: supports must be a table of Supports fields")
    known = {f.name for f in fields(Supports)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise unknown_field(f"{where}: supports", unknown[0], known, "Supports' (specs/supports.py)")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
    return Supports(**values)
