"""Every constraint a plan violates for a model (and cluster) as a stack runs it, each with its numbers.

``check`` is the one place these rules live: ``estimate`` raises on them (``validate``), the search records them as
reasons, the command line reports them as one line.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from meshplan import ranges
from meshplan.errors import PlanError
from meshplan.pipeline.registry import schedule_of
from meshplan.specs import token_drop
from meshplan.specs.check_pipeline import check_first_stage, check_stage_layers, check_stage_settings
from meshplan.specs.fsdp_modes import fsdp_of
from meshplan.specs.fusion import hybrid_names
from meshplan.specs.layouts import TENSOR_LAYOUTS, layout_of, names_where
from meshplan.specs.plan import (
    DENSE_AXES,
    FP8_ATTENTION_PRECISIONS,
    PRECISION,
    RECOMPUTE_MODULES,
    SCHEDULES,
    Plan,
)
from meshplan.specs.refusals import fsdp_zero_reason
from meshplan.specs.stack import FRAMEWORK_STACK as DEFAULT_STACK  # estimate's default: the command line's
from meshplan.specs.stack import Stack

if TYPE_CHECKING:
    from meshplan.specs.hardware import Cluster
    from meshplan.specs.model import ModelSpec


def fsdp_has_zero(fsdp: str, zero: int, piped: bool = False) -> bool:
    """Whether PyTorch FSDP implements this ZeRO stage: NO_SHARD is 0, SHARD_GRAD_OP 2, FULL_SHARD 3; it has no
    stage that shards only the optimizer state (1), but ``piped`` (pipeline stages on a runtime that holds FSDP's sync
    to the last micro-batch, PipelineRuntime.fsdp_nosync: torch's): there its units stay gathered and their gradients
    whole over the micro-batches, synced once a step (torch 2.13.0 torch/distributed/pipelining/stage.py:844-848
    backward_maybe_with_nosync, :1164-1191 perform_reduce_grad), and the optimizer state sharded: ZeRO-1
    (memory.chunk_gradient_share). Without FSDP every stage is available."""
    return bool(fsdp_of(fsdp).has_zero(zero, piped))


def check(model: ModelSpec, cluster: Cluster | None, plan: Plan, stack: Stack = DEFAULT_STACK) -> list[str]:
    """Every constraint ``plan`` violates for this model (and cluster) as ``stack`` runs it, each with its numbers.
    [] = valid."""
    reasons: list[str] = []
    for name in ("dp", "tp", "pp", "cp", "tp2", "ep", "etp", "vpp", "micro_batch", "global_batch", "summa_panels"):
        value = getattr(plan, name)
        if name == "etp" and value == plan.tp:
            continue  # defaulted to tp: reported under tp
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            reasons.append(f"{name}={value!r} must be a positive integer")
    if reasons:
        return reasons
    if plan.tensor_layout not in TENSOR_LAYOUTS:  # every rule below reads the layout's record
        return _check_choices(plan)
    reasons += _check_ranges(model, plan)
    if cluster is not None and plan.num_gpus != cluster.num_gpus:
        if plan.tp2 > 1:
            reasons.append(f"dp*tp*tp2*pp*cp = {plan.dp}*{plan.tp}*{plan.tp2}*{plan.pp}*{plan.cp} = "
                           f"{plan.num_gpus} != gpus={cluster.num_gpus}")
        else:
            reasons.append(f"dp*tp*pp*cp = {plan.dp}*{plan.tp}*{plan.pp}*{plan.cp} = {plan.num_gpus} "
                           f"!= gpus={cluster.num_gpus}")
    reasons += _check_tensor(model, plan, stack)
    reasons += _check_grid(model, plan, stack)
    reasons += _check_pipeline(model, plan)
    reasons += _check_experts(model, plan) + _check_ep_overlap(model, plan, stack)
    reasons += token_drop.refusals(model, plan, stack.moe_dispatcher)
    reasons += _check_hybrid(model, plan, stack)
    if model.index_topk and (plan.cp > 1 or layout_of(plan.tensor_layout).grid):
        reasons.append(f"cp={plan.cp}, tensor_layout={plan.tensor_layout!r}: DeepSeek Sparse Attention (index_topk) "
                       "is costed with cp=1 and the 1d layout only")
    if model.per_layer_input and (plan.pp > 1 or layout_of(plan.tensor_layout).grid):
        reasons.append(f"pp={plan.pp}, tensor_layout={plan.tensor_layout!r}: per-layer embeddings (per_layer_input) "
                       "are costed on one pipeline stage in the 1d layout (their inputs would travel with the sends)")
    if model.diff_attention and layout_of(plan.tensor_layout).grid:
        reasons.append(f"tensor_layout={plan.tensor_layout!r}: differential attention is costed in the 1d layout only")
    reasons += _check_options(model, cluster, plan, stack)
    return reasons


# The numeric fields whose range check() reads from ranges.RANGES (zero and grad_bytes are choices, checked by name)
RANGED = ("dp", "tp", "pp", "cp", "tp2", "ep", "etp", "vpp", "last_stage_layers", "first_stage_layers",
          "micro_batch", "global_batch",
          "recompute_layers", "offload_layers", "lora_rank", "summa_panels")


def _check_ranges(model: ModelSpec, plan: Plan) -> list[str]:
    """Each field of RANGED at most its physical maximum (ranges.RANGES; values below the minimum are reported by
    the kind checks), and the tokens of one step at most ranges.MAX_STEP_TOKENS."""
    reasons = []
    for name in RANGED:
        value = getattr(plan, name)
        if isinstance(value, (int, float)) and value > ranges.RANGES[name].high:
            reasons.append(ranges.problem(name, value) or "")
    reason = ranges.step_tokens_problem(plan.global_batch, model.seq_length)
    return reasons + ([reason] if reason else [])


def _check_hybrid(model: ModelSpec, plan: Plan, stack: Stack) -> list[str]:
    """A hybrid (``layer_pattern``) is costed block by block with fused kernels (layers.hybrid_block): Megatron-Core's
    MambaMixer splits its heads and groups over TP; context parallelism of the Mamba scan, eager PyTorch kernels,
    the SUMMA layout and LoRA adapters are not modelled for it."""
    if not model.is_hybrid:
        return []
    reasons = []
    if "M" in model.layer_pattern or "P" in model.layer_pattern:
        for name in ("mamba_heads", "mamba_groups"):
            if getattr(model, name) % plan.tp:
                reasons.append(f"tp={plan.tp} does not divide {name}={getattr(model, name)}")
        if plan.cp > 1:
            reasons.append(f"cp={plan.cp}: context parallelism of Mamba layers is not modelled ({model.name})")
    if "S" in model.layer_pattern and (plan.tp > 1 or plan.cp > 1):
        reasons.append(f"tp={plan.tp}, cp={plan.cp}: Mamba-1 blocks are costed on one tensor- and context-parallel "
                       "rank only (their x_proj reads every channel)")
    kv = model.window_kv_heads
    if kv and plan.tp > 1 and kv % plan.tp and plan.tp % kv:
        reasons.append(f"tp={plan.tp} and window_kv_heads={kv}: neither divides the other")
    if "R" in model.layer_pattern and (model.lru_heads % plan.tp or plan.cp > 1):
        reasons.append(f"tp={plan.tp}, cp={plan.cp}: RG-LRU blocks split by their lru_heads={model.lru_heads} gate "
                       "blocks over tp, and not over cp")
    if "C" in model.layer_pattern and (model.hidden_size % plan.tp or plan.cp > 1):
        reasons.append(f"tp={plan.tp}, cp={plan.cp}: short-convolution blocks split their hidden_size="
                       f"{model.hidden_size} channels over tp, and not over cp (cost/shortconv.py)")
    if "L" in model.layer_pattern and plan.cp > 1:
        reasons.append(f"cp={plan.cp}: context parallelism of lightning-attention layers is not modelled "
                       f"({model.name})")
    if any(c in model.layer_pattern for c in "GK"):
        for name in ("gdn_key_heads", "gdn_value_heads"):
            if getattr(model, name) % plan.tp:
                reasons.append(f"tp={plan.tp} does not divide {name}={getattr(model, name)}")
        if plan.cp > 1:
            reasons.append(f"cp={plan.cp}: context parallelism of Gated DeltaNet (and KDA) layers is not modelled "
                           f"({model.name})")
    if not stack.fusion_mode.hybrid:  # the eager kernel counts have no rows of these layers (specs/fusion.py)
        plain = " or ".join(repr(n) for n in hybrid_names())
        reasons.append(f"fusion={stack.fusion!r}: hybrid models (layer_pattern) are costed with fusion={plain} only")
    if layout_of(plan.tensor_layout).grid:
        plain = " or ".join(repr(n) for n in names_where(grid=False))
        reasons.append(f"tensor_layout={plan.tensor_layout!r}: hybrid models (layer_pattern) are costed with "
                       f"tensor_layout={plain} only")
    if plan.finetune != "full":
        reasons.append(f"finetune={plan.finetune!r}: hybrid models (layer_pattern) are costed with finetune='full' "
                       "only")
    return reasons


def validate(model: ModelSpec, cluster: Cluster | None, plan: Plan, stack: Stack = DEFAULT_STACK) -> None:
    """Raise PlanError listing every violation (for user input; the search records reasons instead)."""
    reasons = check(model, cluster, plan, stack)
    if reasons:
        raise PlanError(reasons)


def _check_tensor(model: ModelSpec, plan: Plan, stack: Stack) -> list[str]:
    reasons = []
    heads_tp = plan.tp if layout_of(plan.tensor_layout).heads_over_tp else 1  # tp2d's tp splits h only (_check_tp2d)
    if model.num_heads % heads_tp:
        reasons.append(f"tp={plan.tp} does not divide num_heads={model.num_heads}")
    elif not model.is_mla and model.num_kv_heads % heads_tp and heads_tp % model.num_kv_heads:
        reasons.append(f"tp={plan.tp} and num_kv_heads={model.num_kv_heads}: neither divides the other")
    if model.ffn_hidden_size % heads_tp:
        reasons.append(f"tp={plan.tp} does not divide ffn_hidden_size={model.ffn_hidden_size}")
    if plan.cp > 1 and model.seq_length % (2 * plan.cp):
        reasons.append(f"2*cp={2 * plan.cp} does not divide seq_length={model.seq_length} "
                       "(load-balanced causal split)")
    if plan.sequence_parallel and plan.tp == 1:
        reasons.append("sequence_parallel needs tp > 1")
    reason = ring_window_reason(model, plan.cp, stack.cp_comm)
    if reason:
        reasons.append(reason)
    return reasons


def ring_window_reason(model: ModelSpec, cp: int, cp_comm: str) -> str:
    """Ring context parallelism cannot run sliding-window attention: Transformer Engine's attention_with_cp asserts
    "The context parallel running configs cannot support sliding window attention!" unless cp_comm_type is a2a or
    all_gather (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py)."""
    if cp > 1 and cp_comm == "ring" and (model.window_share or "W" in model.layer_pattern):
        return (f"cp={cp} with cp_comm='ring' cannot run sliding-window attention (sliding_window="
                f"{model.sliding_window}): Transformer Engine takes a window only with cp_comm='allgather' "
                "(--cp-comm allgather)")
    return ""


def _check_grid(model: ModelSpec, plan: Plan, stack: Stack) -> list[str]:
    """tp2 only on a grid; a grid layout's own rules (``GRID_CHECKS``)."""
    if not layout_of(plan.tensor_layout).grid:
        grids = " or ".join(repr(n) for n in names_where(grid=True))
        return [f"tp2={plan.tp2} needs tensor_layout={grids}"] if plan.tp2 > 1 else []
    return GRID_CHECKS[plan.tensor_layout](model, plan, stack)


def _check_summa(model: ModelSpec, plan: Plan, stack: Stack) -> list[str]:
    """The 2D SUMMA grid: tp2 shards the sequence and the weights' rows; panels split the hidden size; its
    projections are one GEMM each (summa.py)."""
    reasons = []
    if not stack.projection_mode.on_grids:
        reasons.append(f"projections={stack.projections!r}: tensor_layout='summa' is costed with fused projections")
    if model.is_moe or model.is_mla:
        reasons.append(f"tensor_layout='summa' models dense standard-attention layers only ({model.name})")
    if model.seq_length % (plan.tp2 * plan.cp):
        reasons.append(f"tp2*cp = {plan.tp2 * plan.cp} does not divide seq_length={model.seq_length}")
    for name, size in (("hidden_size", model.hidden_size), ("ffn_hidden_size", model.ffn_hidden_size)):
        if size % plan.tp2:
            reasons.append(f"tp2={plan.tp2} does not divide {name}={size}")
    if model.hidden_size % plan.summa_panels:
        reasons.append(f"summa_panels={plan.summa_panels} does not divide hidden_size={model.hidden_size}")
    if plan.sequence_parallel:
        reasons.append("sequence_parallel does not apply to the summa layout (activations are already sharded)")
    return reasons


def _check_pipeline(model: ModelSpec, plan: Plan) -> list[str]:
    reasons = []
    micro = plan.dp * plan.micro_batch
    if plan.global_batch % micro:
        reasons.append(f"dp*micro_batch = {plan.dp}*{plan.micro_batch} = {micro} does not divide "
                       f"global_batch={plan.global_batch}")
    stages = plan.pp * plan.vpp
    if stages > model.num_layers:
        reasons.append(f"pp*vpp = {stages} exceeds num_layers={model.num_layers}")
    reasons += _check_last_stage(model, plan) + check_first_stage(model, plan) + check_stage_settings(model, plan)
    reasons += check_stage_layers(model, plan)
    if plan.schedule not in SCHEDULES:  # _check_choices says it
        return reasons
    # the schedule's own refusals (meshplan.pipeline.rules), m where global_batch / (dp·micro_batch) is whole
    m = None if plan.global_batch % micro else plan.grad_accum
    return reasons + schedule_of(plan.schedule).refusals(plan.pp, plan.vpp, m, (plan.first_stage_layers,
                                                                                 plan.last_stage_layers))


def _check_last_stage(model: ModelSpec, plan: Plan) -> list[str]:
    """An uneven last stage: with a pipeline, and leaving the other ranks at least one layer per model chunk."""
    last = plan.last_stage_layers
    if not isinstance(last, int) or isinstance(last, bool) or last < 0:
        return [f"last_stage_layers={last!r} must be a non-negative integer"]
    if last and plan.pp == 1:
        return [f"last_stage_layers={last} needs pp > 1 (a pipeline whose last stage it sizes)"]
    if last and model.num_layers - last < (plan.pp - 1) * plan.vpp:
        return [f"last_stage_layers={last} leaves {model.num_layers - last} of num_layers={model.num_layers} for "
                f"the other {plan.pp - 1} pipeline ranks' {(plan.pp - 1) * plan.vpp} model chunks"]
    return []


def _check_experts(model: ModelSpec, plan: Plan) -> list[str]:
    if not model.is_moe:
        if plan.ep > 1:
            return [f"ep={plan.ep} but {model.name} has no experts"]
        if plan.etp != plan.tp:
            return [f"etp={plan.etp} but {model.name} has no experts (expert tensor parallelism)"]
        return []
    reasons = []
    if model.num_experts % plan.ep:
        reasons.append(f"ep={plan.ep} does not divide num_experts={model.num_experts}")
    ranks = plan.tp * plan.cp * plan.dp
    if ranks % (plan.ep * plan.etp):
        reasons.append(f"ep*etp = {plan.ep}*{plan.etp} does not divide tp*cp*dp = {ranks}")
    if model.moe_ffn_hidden_size % plan.etp:
        reasons.append(f"etp={plan.etp} does not divide moe_ffn_hidden_size={model.moe_ffn_hidden_size}")
    return reasons


def _check_ep_overlap(model: ModelSpec, plan: Plan, stack: Stack) -> list[str]:
    """What Megatron-Core's combined 1F1B schedule (overlap_ep) asserts (TransformerConfig, "Combined 1F1B"
    requirements in docs/user-guide/features/moe_a2a_overlap.md): expert parallelism, no full recompute, an
    interleaved schedule under pipeline parallelism, at most one MTP layer."""
    if not stack.overlap_ep:
        return []
    needs = [("ep > 1", plan.ep > 1), ("a recompute other than full", plan.recompute != "full"),
             ("vpp > 1 with pp > 1", plan.pp == 1 or plan.vpp > 1), ("at most one MTP layer", model.mtp_layers <= 1)]
    return [f"overlap_ep (Megatron-Core's combined 1F1B) needs {what} (ep={plan.ep}, pp={plan.pp}, vpp={plan.vpp}, "
            f"recompute={plan.recompute!r}, mtp_layers={model.mtp_layers})" for what, ok in needs if not ok]


def recompute_modules_problem(modules: object) -> str:
    """What is wrong with a ``recompute_modules`` value ("" if nothing): known module names, at least one, each once
    (for Plan.check, the search's Space and the CLI alike)."""
    if not isinstance(modules, tuple) or not modules:
        return f"must be a non-empty tuple of {', '.join(RECOMPUTE_MODULES)}"
    unknown = [m for m in modules if m not in RECOMPUTE_MODULES]
    if unknown:
        return f"has {unknown[0]!r}: the modules are {', '.join(RECOMPUTE_MODULES)}"
    if len(set(modules)) != len(modules):
        return "names a module twice"
    if "op_sac" in modules and len(modules) > 1:
        return "has op_sac with other modules: op_sac (torchtitan's per-op policy) covers the whole layer on its own"
    return ""


def _check_recompute_modules(model: ModelSpec, plan: Plan) -> list[str]:
    """``recompute_modules_problem``; mla_up_proj needs multi-head latent attention."""
    problem = recompute_modules_problem(plan.recompute_modules)
    if problem:
        return [f"recompute_modules={','.join(map(str, plan.recompute_modules))} {problem}"]
    if "mla_up_proj" in plan.recompute_modules and not model.is_mla:
        return [f"recompute_modules mla_up_proj needs multi-head latent attention ({model.name} has none)"]
    moe = [m for m in plan.recompute_modules if m in ("moe", "moe_act", "shared_experts")]
    if moe and not model.is_moe:
        return [f"recompute_modules {moe[0]} needs a mixture-of-experts model ({model.name} is dense)"]
    if "shared_experts" in plan.recompute_modules and not model.shared_expert_ffn_size:
        return [f"recompute_modules shared_experts needs shared experts ({model.name} has none)"]
    return []


def settings_problems(model: ModelSpec, cluster: Cluster | None, settings: dict[str, object],
                      stack: Stack = DEFAULT_STACK) -> list[str]:
    """What ``check`` finds wrong with settings that every plan of a search shares (``Space.settings``) under
    ``stack``: a precision the GPU lacks, an fp8 attention kernel without an fp8 precision ..."""
    hybrid = [r for r in _check_hybrid(model, Plan(), stack) if r.startswith("fusion=")]
    # the ZeRO stage is the search's to choose, not a shared setting: 0, which every data-parallel wrapper has
    shared = Plan(**{"zero": 0, **settings})  # type: ignore[arg-type]
    return _check_options(model, cluster, shared, stack) + hybrid


def _check_choices(plan: Plan) -> list[str]:
    """Every text field with a fixed set of values (its ``choices`` metadata) holds one of them."""
    reasons = []
    for name, allowed in _CHOICES:
        value = getattr(plan, name)
        if isinstance(value, str) and value not in allowed:
            reasons.append(f"{name}={value!r} must be one of {', '.join(allowed)}")
    return reasons


# each text field of a Plan with a fixed set of values, and those values (read once: every estimate checks them)
_CHOICES = tuple((f.name, f.metadata["choices"]) for f in fields(Plan) if f.metadata.get("choices"))


def _check_counts(model: ModelSpec, plan: Plan) -> list[str]:
    """The layer counts of partial recompute and offload: non-negative, within a stage, with the switch they need."""
    reasons, per_stage = [], -(-model.num_layers // plan.pp)
    for name, value in (("recompute_layers", plan.recompute_layers), ("offload_layers", plan.offload_layers)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            reasons.append(f"{name}={value!r} must be a non-negative integer")
        elif value > per_stage:
            reasons.append(f"{name}={value} is more than the {per_stage} layers of a pipeline stage "
                           f"(num_layers={model.num_layers}, pp={plan.pp})")
    if plan.recompute_layers and plan.recompute != "full":
        reasons.append(f"recompute_layers={plan.recompute_layers} needs recompute='full' (got {plan.recompute!r})")
    if plan.offload_layers and not plan.offload_activations:
        reasons.append(f"offload_layers={plan.offload_layers} needs offload_activations")
    return reasons


def _check_options(model: ModelSpec, cluster: Cluster | None, plan: Plan, stack: Stack) -> list[str]:
    """The settings beside the layout: choices, ZeRO stage, precision on this GPU, LoRA, placement."""
    reasons = _check_choices(plan) + _check_counts(model, plan) + _check_recompute_modules(model, plan)
    if plan.zero not in (0, 1, 2, 3):
        reasons.append(f"zero={plan.zero!r} must be 0, 1, 2 or 3")
    accelerator = cluster.accelerator if cluster is not None else None
    if accelerator and plan.precision in PRECISION and plan.precision not in accelerator.peak_flops and (
            plan.precision != "fp16" or "bf16" not in accelerator.peak_flops):
        reasons.append(f"precision={plan.precision} is not supported by {accelerator.name} "
                       f"(it has {', '.join(sorted(accelerator.peak_flops))})")
    if stack.attention_kernel_mode.fp8 and plan.precision not in FP8_ATTENTION_PRECISIONS:
        reasons.append(f"attention_kernel=fp8 needs an fp8 precision ({', '.join(FP8_ATTENTION_PRECISIONS)}), "
                       f"not precision={plan.precision}")
    if not isinstance(plan.lora_rank, int) or plan.lora_rank < 1:
        reasons.append(f"lora_rank={plan.lora_rank!r} must be a positive integer")
    if not fsdp_has_zero(stack.fsdp, plan.zero, plan.pp > 1 and stack.pipeline_runtime_mode.fsdp_nosync):
        reasons.append(fsdp_zero_reason(stack.fsdp, plan.zero))  # the search's too (refusals.fsdp_stages)
    if not isinstance(plan.servers, int) or isinstance(plan.servers, bool) or plan.servers < 0:
        reasons.append(f"servers={plan.servers!r} must be a count of parameter-server shards, 0 (one per GPU) or more")
    if plan.grad_bytes not in (2, 4):
        reasons.append(f"grad_bytes={plan.grad_bytes} must be 2 or 4")
    if type(i := plan.distributed_optimizer_instances) is not int or i != 1:  # its rules' module only where they apply
        from meshplan.specs.check_zero_group import zero_group_refusals
        reasons += zero_group_refusals(model, plan, stack)
    if sorted(plan.placement) != sorted(DENSE_AXES):
        reasons.append(f"placement={','.join(plan.placement)} must order each of {', '.join(DENSE_AXES)} once")
    return reasons


def _check_tp2d(model: ModelSpec, plan: Plan, stack: Stack) -> list[str]:
    """The tp2d grid (cost/tp2d.py): h over tp, the heads and the MLP's hidden size over tp2; dense standard-attention
    layers with fused projections, as the summa layout."""
    reasons = []
    if not stack.projection_mode.on_grids:
        reasons.append(f"projections={stack.projections!r}: tensor_layout='tp2d' is costed with fused projections")
    if model.is_moe or model.is_mla:
        reasons.append(f"tensor_layout='tp2d' models dense standard-attention layers only ({model.name})")
    if model.hidden_size % plan.tp:
        reasons.append(f"tp={plan.tp} does not divide hidden_size={model.hidden_size}")
    for name, size in (("num_heads", model.num_heads), ("num_kv_heads", model.num_kv_heads),
                       ("ffn_hidden_size", model.ffn_hidden_size)):
        if size % plan.tp2:
            reasons.append(f"tp2={plan.tp2} does not divide {name}={size}")
    if plan.sequence_parallel:
        reasons.append("sequence_parallel does not apply to the tp2d layout (the residual stream is feature-sharded)")
    return reasons


# each grid layout's own rules (specs/layouts.py: the layouts whose record says grid)
GRID_CHECKS = {"summa": _check_summa, "tp2d": _check_tp2d}
