"""What every framework config shares: refusing a plan a framework cannot express (one line naming the field and
the framework), the data-parallel size from the GPU count, and the ``meshplan:`` comment that carries the few plan
and stack fields a format has no option for (the formats with comments: Megatron-LM's argument file, torchtitan's
TOML, Megatron-Bridge's override file), so that emit -> read reproduces them.

The comment is one line, ``# meshplan: stack.fusion=eager plan.zero=3``; the framework itself ignores it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshplan.errors import SpecError
from meshplan.pipeline.registry import schedule_of
from meshplan.specs.layouts import layout_of
from meshplan.specs.plan import DENSE_AXES, Plan
from meshplan.specs.stack import Stack, load_stack

COMMENT = "meshplan:"


def refuse(framework: str, field: str, value: object, why: str) -> SpecError:
    """The one-line error for a plan field a framework cannot express."""
    return SpecError(f"{framework} cannot express {field}={value}: {why}")


def known_value(framework: str, field: str, value: Any, allowed: tuple[str, ...]) -> Any:
    """``value`` if the framework's option takes it (``allowed``: the values meshplan reads), else the one-line
    refusal: an unknown or misspelt value is never priced as the option's default."""
    if value not in allowed:
        raise refuse(framework, field, value, f"meshplan reads {', '.join(allowed)}")
    return value


def per_rank_fallback(plan: Plan, framework: str) -> tuple[Plan, list[str]]:
    """Per-rank recompute (Plan.stage_recompute) as a framework with one recompute setting for every pipeline rank
    runs it (Megatron-Core: TransformerConfig's recompute_granularity / recompute_method / recompute_num_layers,
    applied on each rank by TransformerBlock._checkpointed_forward, core 0.16.1): the setting that recomputes the
    most of any rank's (none < selective < N layers < full), written for every rank, which keeps each rank's memory
    at or below its own setting's and runs a step no faster than the plan's; with the comment lines saying so. Per-rank
    offload is refused (Megatron-Core's CPU offload refuses a pipeline: specs/refusals.py)."""
    if plan.stage_offload and any(plan.stage_offload):
        raise refuse(framework, "stage_offload", ",".join(map(str, plan.stage_offload)), "it offloads the same layers "
                     "on every pipeline rank, and not with pipeline parallelism")
    if not plan.stage_recompute:
        return plan.with_(stage_offload=()), []
    def weight(entry: str) -> int:
        return {"none": 0, "0": 0, "selective": 1, "full": 1 << 20}.get(entry, 2 + int(entry) if entry.isdigit() else 0)

    most = max(plan.stage_recompute, key=weight)
    mode, layers = ("full", int(most)) if most.isdigit() and most != "0" else ("none" if most == "0" else most, 0)
    written = plan.with_(recompute=mode, recompute_layers=layers, stage_recompute=(), stage_offload=())
    return written, [f"per-rank recompute {','.join(plan.stage_recompute)} (meshplan's plan) is not expressible: "
                     f"{framework} runs one recompute setting on every pipeline rank; written as the most any rank "
                     f"needs, {most}, on all (no rank holds more memory, the step is estimate's of this file)"]


def check_layout(plan: Plan, framework: str, drops_tokens: bool = False, zero_groups: bool = False) -> None:
    """What no framework below runs: the 2D SUMMA layout, LoRA (left out here), a rank order other than the
    Megatron-LM / torchtitan one (tp innermost, then cp, dp, pp), per-rank recompute or offload (Megatron-LM's and
    Megatron-Bridge's emitters write ``per_rank_fallback`` first); token-drop MoE where the format writes none
    (``drops_tokens``: Megatron-Core's capacity factor, Megatron-LM's and Megatron-Bridge's); ZeRO groups smaller
    than the data-parallel ranks where it writes none (``zero_groups``: Megatron-LM's
    --num-distributed-optimizer-instances)."""
    if plan.distributed_optimizer_instances > 1 and not zero_groups:
        raise refuse(framework, "distributed_optimizer_instances", plan.distributed_optimizer_instances, "this "
                     "writer shards the optimizer over every data-parallel rank")
    if plan.moe_expert_capacity_factor is not None and not drops_tokens:
        raise refuse(framework, "moe_expert_capacity_factor", plan.moe_expert_capacity_factor, "it writes dropless "
                     "MoE only")
    if plan.stage_layers:
        raise refuse(framework, "stage_layers", ",".join(map(str, plan.stage_layers)), "it writes an even split of "
                     "the layers (at most with a first and a last stage count)")
    for name in ("stage_recompute", "stage_offload"):
        if getattr(plan, name):
            raise refuse(framework, name, ",".join(map(str, getattr(plan, name))), "it runs one recompute and "
                         "offload setting on every pipeline rank")
    if not layout_of(plan.tensor_layout).in_frameworks or plan.tp2 > 1:
        raise refuse(framework, "tensor_layout", plan.tensor_layout, "2D tensor parallelism (tp2: SUMMA, tp2d) is not "
                     "run")
    if not schedule_of(plan.schedule).flushes and plan.pp > 1:
        raise refuse(framework, "schedule", plan.schedule, "it runs synchronous pipelines only (no PipeDream weight "
                     "stashing or 2BW double buffering): allowed schedules 1f1b, interleaved, gpipe where it has it")
    if schedule_of(plan.schedule).split and plan.pp > 1:  # zero_bubble.py: which frameworks run them
        raise refuse(framework, "schedule", plan.schedule, "no split-backward, V-shaped or bidirectional schedule is "
                     "written (torch's ScheduleZBVZeroBubble needs a V stage placement this emitter does not write; "
                     "Chimera runs in its authors' code only): allowed 1f1b, interleaved, gpipe")
    if plan.finetune != "full":
        raise refuse(framework, "finetune", plan.finetune, "meshplan writes pre-training configs only")
    shown = [a for a in plan.placement if getattr(plan, a) > 1]
    if shown != [a for a in DENSE_AXES if getattr(plan, a) > 1]:
        raise refuse(framework, "placement", ",".join(shown), "its ranks are laid tp, cp, dp, pp (innermost first)")


def data_parallel(gpus: int, framework: str, **sizes: int) -> int:
    """dp = gpus / (tp·pp·cp), refused when the sizes do not divide the GPU count."""
    model_parallel = 1
    for size in sizes.values():
        model_parallel *= size
    if model_parallel < 1 or gpus % model_parallel:
        shown = "·".join(f"{k}={v}" for k, v in sizes.items())
        raise SpecError(f"{framework} config: {shown} does not divide gpus={gpus}")
    return gpus // model_parallel


def carried_stack_fields(stack: Stack, preset: str, expressed: tuple[str, ...]) -> dict[str, Any]:
    """The stack's behaviour fields that differ from ``preset`` and have no option of their own in the format: what
    the ``meshplan:`` comment carries."""
    base = load_stack(preset)
    return {f.name: getattr(stack, f.name) for f in dataclasses.fields(Stack)
            if f.compare and f.name not in expressed and getattr(stack, f.name) != getattr(base, f.name)}


def param_gather(stack: Stack, plan: Plan) -> bool:
    """Whether a Megatron-Core config says the distributed optimizer's weight all-gather overlaps the first forward
    (``--overlap-param-gather``, DistributedDataParallelConfig.overlap_param_gather): where the stack overlaps it and
    the framework takes the flag, which needs the distributed optimizer (zero = 1) and the overlapped gradient
    reduction (Megatron-LM validate_args, arguments.py:856-861 @ core_v0.17.0; without the distributed optimizer the
    flag would shard the buffers for the layer-wise optimizer instead: param_and_grad_buffer.py:183-185)."""
    return stack.overlap_dp and stack.overlap_param_gather and plan.zero == 1


def unsaid(stack: Stack, **written: Any) -> dict[str, Any]:
    """The stack fields that a file writes (``written``: field -> the value the file says) otherwise than the stack
    holds, as where the framework refuses the option in this plan: the ``meshplan:`` comment carries them, whatever
    the preset holds, so that the reader, which reads the framework's value, gets the stack's back."""
    return {name: getattr(stack, name) for name, value in written.items() if getattr(stack, name) != value}


def comment(stack: dict[str, Any], plan: dict[str, Any]) -> str:
    """``meshplan: stack.k=v plan.k=v`` (empty when there is nothing to carry)."""
    items = [f"stack.{k}={_text(v)}" for k, v in stack.items()] + [f"plan.{k}={_text(v)}" for k, v in plan.items()]
    return f"{COMMENT} " + " ".join(items) if items else ""


def parse_comment(lines: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The stack and plan fields of a ``meshplan:`` comment among ``lines`` (comment markers already stripped)."""
    found: dict[str, dict[str, Any]] = {"stack": {}, "plan": {}}
    for line in lines:
        line = line.strip()
        if not line.startswith(COMMENT):
            continue
        for item in line.removeprefix(COMMENT).split():
            key, _, value = item.partition("=")
            spec, _, name = key.partition(".")
            if spec not in found or not name:
                raise SpecError(f"meshplan comment: {item!r} is not stack.FIELD=VALUE or plan.FIELD=VALUE")
            found[spec][name] = _value(Stack if spec == "stack" else Plan, name, value)
    return found["stack"], found["plan"]


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _value(spec: type, name: str, text: str) -> Any:
    """A field's value from its text, by the field's default's type."""
    known = {f.name: f for f in dataclasses.fields(spec)}
    if name not in known:
        raise SpecError(f"meshplan comment: {spec.__name__} has no field {name!r}")
    default = known[name].default
    if isinstance(default, bool):
        if text not in ("true", "false"):
            raise SpecError(f"meshplan comment: {name}={text} must be true or false")
        return text == "true"
    if isinstance(default, int):
        try:
            return int(text)
        except ValueError:
            raise SpecError(f"meshplan comment: {name}={text} must be an integer") from None
    if isinstance(default, float):  # seconds (Stack.host_dispatch)
        try:
            return float(text)
        except ValueError:
            raise SpecError(f"meshplan comment: {name}={text} must be a number") from None
    if isinstance(default, tuple):
        return tuple(text.split(","))
    return text


def node_split(plan: Plan, per_node: int = 8) -> tuple[int, int]:
    """(nodes, GPUs per node) of the plan's GPUs on nodes of ``per_node`` (8: DGX / HGX servers): one node when they
    fit in one, else full nodes, else one GPU a node (a count that no full node divides)."""
    gpus = plan.num_gpus
    local = min(gpus, per_node) if gpus % min(gpus, per_node) == 0 else 1
    return gpus // local, local


def torchrun(plan: Plan, target: str, per_node: int = 8) -> str:
    """``torchrun`` over the plan's GPUs, ``per_node`` a node (8: DGX / HGX servers; a node of fewer GPUs changes
    --nnodes and --nproc-per-node, not the plan), the rendezvous at $MASTER_ADDR; ``target`` what it runs."""
    nodes, local = node_split(plan, per_node)
    return (f"torchrun --nnodes {nodes} --nproc-per-node {local} --rdzv-backend c10d "
            f"--rdzv-endpoint $MASTER_ADDR:29500 {target}")
