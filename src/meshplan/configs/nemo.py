"""Megatron-Bridge (NeMo's Megatron-Core trainer) recipe overrides, one Hydra/OmegaConf ``key=value`` a line, as its
example training scripts take them on the command line (NVIDIA-NeMo Megatron-Bridge docs, "Megatron-LM to Megatron
Bridge Guide": ``python examples/recipes/llama/pretrain_llama3_8b.py train.micro_batch_size=2
train.global_batch_size=128 model.num_layers=32 ...``; config groups rng, train, model, optimizer, ddp, scheduler,
dataset, logger, tokenizer, checkpoint, dist, profiling, peft, comm_overlap, mixed_precision).

Keys: ``model.*`` are Megatron-Core's TransformerConfig / ModelParallelConfig fields (megatron/core/
model_parallel_config.py, transformer_config.py): ``tensor_model_parallel_size``, ``pipeline_model_parallel_size``,
``context_parallel_size``, ``expert_model_parallel_size``, ``expert_tensor_parallel_size``,
``virtual_pipeline_model_parallel_size``, ``num_layers_in_last_pipeline_stage``, ``sequence_parallel``,
``recompute_granularity`` / ``recompute_method`` / ``recompute_num_layers`` / ``recompute_modules``,
``cpu_offloading`` / ``cpu_offloading_num_layers``, ``overlap_p2p_comm`` (interleaved, also as
``comm_overlap.overlap_p2p_comm``, which the recipe's CommOverlapConfig would put over it), ``cp_comm_type``,
``moe_grouped_gemm``;
``train.micro_batch_size`` / ``train.global_batch_size``; ``ddp.use_distributed_optimizer``,
``ddp.overlap_grad_reduce``, ``ddp.overlap_param_gather``, ``ddp.grad_reduce_in_fp32`` (DistributedDataParallelConfig;
off where not given, its defaults), the two overlaps also as ``comm_overlap.overlap_grad_reduce`` and
``comm_overlap.overlap_param_gather`` (which a recipe's CommOverlapConfig would put over ddp.*) and the gather as
``optimizer.overlap_param_gather``;
``optimizer.use_distributed_optimizer``, ``optimizer.optimizer_cpu_offload``, ``optimizer.optimizer`` ("adam" / "sgd")
and ``optimizer.sgd_momentum`` (OptimizerConfig);
``model.seq_length`` (Megatron-Bridge's GPTModelProvider); ``comm_overlap.tp_comm_overlap`` as the stack says it
(Megatron-Bridge's own setup turns it off at tp = 1 or without sequence parallelism, as meshplan prices it:
specs/host_cost.py; a note says so; the stack read back carries that rule, overlap_tp_needs_sp, whatever stack wrote
the file); ``mixed_precision`` a
Megatron-Bridge preset name (src/megatron/bridge/training/mixed_precision.py: bf16_mixed, fp16_mixed,
bf16_with_fp8_delayed_scaling_mixed, bf16_with_fp8_current_scaling_mixed, bf16_with_mxfp8_mixed).

The model's shape: the same TransformerConfig / GPTModelProvider fields as Megatron-LM's arguments set
(configs/megatron_model.py), as ``model.*`` overrides: ``num_layers``, ``hidden_size``, ``ffn_hidden_size``,
``num_attention_heads``, ``num_query_groups``, ``kv_channels``, ``gated_linear_unit``, ``normalization``,
``add_bias_linear``, ``add_qkv_bias``, ``qk_layernorm``, ``hidden_dropout``, ``attention_dropout``,
``share_embeddings_and_output_weights``, ``position_embedding_type``, ``rotary_base``, ``num_moe_experts``,
``moe_router_topk``, ``moe_ffn_hidden_size``, ``moe_shared_expert_intermediate_size``, ``moe_layer_freq`` (a list),
``moe_expert_capacity_factor`` and ``moe_pad_expert_input_to_capacity`` (token drop, where the plan drops tokens: the
fields Megatron-Bridge's apply_moe_token_drop sets, training/utils/moe_token_drop.py @ v0.1.0rc3),
``moe_token_dispatcher_type`` (with flex: ``moe_flex_dispatcher_backend`` and ``moe_shared_expert_overlap`` false,
as Megatron-Bridge's own ``apply_flex_dispatcher_backend`` sets them: training/flex_dispatcher_backend.py, 0.3.1;
Megatron-Core refuses the shared-expert overlap that DeepSeek's recipe sets under any dispatcher but alltoall,
transformer_config.py:1257-1262 @ core_v0.17.0), ``moe_router_score_function``, ``moe_router_enable_expert_bias``,
``multi_latent_attention``, ``q_lora_rank``, ``kv_lora_rank``, ``qk_head_dim``, ``qk_pos_emb_head_dim``,
``v_head_dim``, ``mtp_num_layers``, ``make_vocab_size_divisible_by``, ``vocab_size``; the activation is the
recipe's (a callable).
Megatron-Bridge itself is not loaded by meshplan's tests: its PyPI package (megatron-bridge 0.3.1) requires
Transformer Engine and mamba-ssm (CUDA builds), so its ConfigContainer is the missing check; the overrides build
Megatron-Core's TransformerConfig, DDP and optimizer configs and GPTModel (tests/test_configs_build_megatron.py).

Mapping as Megatron-LM's (configs/megatron.py). Refused: ZeRO-2/3 (Megatron-FSDP), fp4, a schedule other than
Megatron's own, 8-bit Adam and Adafactor (Megatron-Core has neither), and bf16 Adam moments (OptimizerConfig's
exp_avg_dtype is a torch.dtype, which meshplan does not write as an override: the megatron format writes it).
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.common import (
    carried_stack_fields,
    check_layout,
    comment,
    data_parallel,
    known_value,
    param_gather,
    parse_comment,
    per_rank_fallback,
    refuse,
    torchrun,
    unsaid,
)
from meshplan.configs.format import ConfigFormat
from meshplan.configs.layout import layout_string, stage_layers_of
from meshplan.configs.megatron import CP_COMM_TYPE
from meshplan.configs.megatron_model import SQUARED_RELU, architecture, capacity_factor
from meshplan.configs.megatron_rules import DP_OVERLAPS
from meshplan.errors import SpecError
from meshplan.pipeline.registry import default_schedule
from meshplan.specs.host_cost import tp_hidden
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import padded_vocab
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.specs.stack_variants import FLEX_ARGUMENTS, flex_backend_of

_NAME = "nemo"
_PRESET = "megatron-bridge"
# (Plan.precision, Stack.fp8_scaling) -> Megatron-Bridge's mixed_precision preset
_MIXED_PRECISION = {("bf16", "delayed"): "bf16_mixed", ("fp16", "delayed"): "fp16_mixed",
                    ("fp8", "delayed"): "bf16_with_fp8_delayed_scaling_mixed",
                    ("fp8", "current"): "bf16_with_fp8_current_scaling_mixed",
                    ("mxfp8", "delayed"): "bf16_with_mxfp8_mixed"}


def _check(plan: Plan, stack: Stack) -> str:
    """The mixed_precision preset, after refusing what Megatron-Bridge cannot run."""
    # per-rank layers: its TransformerConfig's layout
    check_layout(plan.with_(stage_layers=()), _NAME, drops_tokens=True)
    if plan.zero > 1:
        raise refuse(_NAME, "zero", plan.zero, "its distributed optimizer is ZeRO-1")
    schedule = default_schedule(plan.vpp)
    if plan.schedule != schedule:
        raise refuse(_NAME, "schedule", plan.schedule, f"with vpp={plan.vpp} it runs {schedule}")
    scaling = stack.fp8_scaling if plan.precision == "fp8" else "delayed"
    if (plan.precision, scaling) not in _MIXED_PRECISION:
        raise refuse(_NAME, "precision", plan.precision, f"its presets are {', '.join(_MIXED_PRECISION.values())}")
    return _MIXED_PRECISION[plan.precision, scaling]


def _overrides(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, Any]:
    precision = _check(plan, stack)
    out: dict[str, Any] = {
        "model.tensor_model_parallel_size": plan.tp, "model.pipeline_model_parallel_size": plan.pp,
        "model.context_parallel_size": plan.cp, "model.expert_model_parallel_size": plan.ep,
        "model.expert_tensor_parallel_size": plan.etp,
        "model.virtual_pipeline_model_parallel_size": plan.vpp if plan.vpp > 1 else None,
        "model.num_layers_in_first_pipeline_stage": plan.first_stage_layers or None,
        "model.num_layers_in_last_pipeline_stage": plan.last_stage_layers or None,
        "model.pipeline_model_parallel_layout": layout_string(plan.stage_layers, plan.vpp, model.mtp_layers)
        if plan.stage_layers else None,
        "model.sequence_parallel": plan.sequence_parallel, "model.seq_length": model.seq_length,
        "train.micro_batch_size": plan.micro_batch, "train.global_batch_size": plan.global_batch,
        "ddp.use_distributed_optimizer": plan.zero == 1, "optimizer.use_distributed_optimizer": plan.zero == 1,
        "optimizer.optimizer_cpu_offload": plan.offload_optimizer,
        "model.recompute_granularity": None if plan.recompute == "none" else plan.recompute,
        "model.recompute_modules": "[" + ",".join(plan.recompute_modules) + "]",
        "model.cpu_offloading": plan.offload_activations,
        "model.cpu_offloading_num_layers": plan.offload_layers if plan.offload_activations else None,
        "mixed_precision": precision, "ddp.grad_reduce_in_fp32": plan.grad_bytes == 4,
        **_data_parallel_overlap(stack.overlap_dp, param_gather(stack, plan)),
        "comm_overlap.tp_comm_overlap": stack.overlap_tp, "model.overlap_p2p_comm": stack.overlap_pp,
        # interleaved, CommOverlapConfig sets overlap_p2p_comm on over model.* (comm_overlap.py:450-460 @ 0.3.1)
        "comm_overlap.overlap_p2p_comm": stack.overlap_pp if plan.vpp > 1 else None,
        "model.cp_comm_type": CP_COMM_TYPE[stack.cp_comm], "model.moe_grouped_gemm": stack.expert_gemm_mode.grouped}
    if plan.recompute == "full":
        out["model.recompute_method"] = "block" if plan.recompute_layers else "uniform"
        out["model.recompute_num_layers"] = plan.recompute_layers or 1
    if plan.grad_bytes not in (2, 4):
        raise refuse(_NAME, "grad_bytes", plan.grad_bytes, "its gradients reduce in fp32 or bf16")
    if plan.optimizer not in ("adam", "adamw", "sgd-momentum", "sgd"):
        raise refuse(_NAME, "optimizer", plan.optimizer,
                     "meshplan writes OptimizerConfig's adam (fp32 moments) and sgd")
    if plan.optimizer.startswith("sgd"):
        out["optimizer.optimizer"] = "sgd"
        out["optimizer.sgd_momentum"] = 0.0 if plan.optimizer == "sgd" else None
    return out


# Megatron-Bridge's CommOverlapConfig, which a recipe holds (comm_overlap), sets both data-parallel overlaps on under
# the distributed optimizer with dp > 1 over what ddp.* says, unless its own fields are given (training/comm_overlap.py
# 527-546 _get_optimizer_overlap_cfgs, 557-565 _override_user_cfgs, 597-606 setup @ megatron-bridge 0.3.1); both
# configs name the DistributedDataParallelConfig fields (configs/megatron_rules.DP_OVERLAPS).


def _data_parallel_overlap(grad_reduce: bool, gather: bool) -> dict[str, bool]:
    """The overlaps as every config that holds them says them: ddp.* (DistributedDataParallelConfig), comm_overlap.*
    (the recipe's CommOverlapConfig, which would override ddp.*), and optimizer.overlap_param_gather, which
    OptimizerConfig keeps equal to the DDP's (megatron/core/optimizer/optimizer_config.py, core 0.16.1)."""
    out: dict[str, bool] = {}
    for (_, key), value in zip(DP_OVERLAPS, (grad_reduce, gather), strict=True):
        out |= {f"ddp.{key}": value, f"comm_overlap.{key}": value}
    return out | {"optimizer.overlap_param_gather": gather}


def _read_data_parallel_overlap(values: dict[str, str]) -> dict[str, bool]:
    """The overlaps as Megatron-Bridge runs them: comm_overlap.* where given under the distributed optimizer (it
    overrides ddp.*), else ddp.*, off where not given (DistributedDataParallelConfig's defaults, megatron/core/
    distributed/distributed_data_parallel_config.py; a recipe's own values are not in the file)."""
    distributed = _flag(values, "ddp.use_distributed_optimizer")
    return {field: _flag(values, f"comm_overlap.{key}" if distributed and f"comm_overlap.{key}" in values
                         else f"ddp.{key}") for field, key in DP_OVERLAPS}


def _model(model: ModelSpec, plan: Plan, stack: Stack) -> tuple[dict[str, Any], list[str]]:
    """The ``model.*`` overrides of the architecture (configs/megatron_model.py's fields, less max_position_embeddings,
    which GPTModelProvider does not have) and the notes on what they leave out."""
    fields, notes = architecture(model, plan, stack)
    fields.pop("max_position_embeddings")
    # GPTModelProvider's (None: the tokenizer's, padded): the vocabulary priced, padded as Megatron pads it (a
    # preset vocab_size is not padded again: nemo/collections/llm/gpt/model/base.py, Megatron-Bridge should_pad_vocab)
    fields["vocab_size"] = padded_vocab(model.vocab_size, plan.tp, stack.vocab_multiple)
    if fields.get("moe_flex_dispatcher_backend"):  # as Megatron-Bridge's apply_flex_dispatcher_backend sets it: the
        fields["moe_shared_expert_overlap"] = False  # recipe's True (DeepSeek's) is refused under flex (module doc)
    if isinstance(fields.get("moe_layer_freq"), list):
        fields["moe_layer_freq"] = "[" + ",".join(map(str, fields["moe_layer_freq"])) + "]"
    notes.append(_activation(fields.pop("activation_func"), model.gated))
    return {f"model.{k}": v for k, v in fields.items()}, notes


def _activation(activation: str | None, gated: bool) -> str:
    """The note on the MLP's activation, which no override sets: Megatron-Bridge leaves every callable field out of the
    OmegaConf tree it applies overrides to and puts the recipe's back after (training/utils/omegaconf_utils.py
    ``_is_omegaconf_problematic`` / ``_restore_excluded_fields`` @ v0.3.1), so model.activation_func is the recipe
    provider's."""
    head = "model.activation_func is the recipe's (a callable, not an override): "
    if activation == SQUARED_RELU:  # Megatron-Bridge 0.3.1 has Nemotron-4's provider but no recipe script of it
        return head + ("squared ReLU priced: a recipe on NemotronModelProvider (models/nemotron/nemotron_provider.py "
                       "@ v0.3.1: activation_func = squared_relu, torch.pow(relu(x), 2) without jit: eager, as the "
                       "fused-eager-act fusion prices it) or NemotronHModelProvider (Megatron-Core's jit-fused "
                       "squared_relu); a GPT recipe's GeLU is another model")
    return head + ("SiLU in the Llama, Mixtral, Qwen and DeepSeek recipes, which gated_linear_unit=true makes SwiGLU"
                   if gated else "GeLU priced")


def _emit(model: ModelSpec, plan: Plan, stack: Stack) -> str:
    # overlap_tp_needs_sp: Megatron-Bridge's own setup, whatever the stack (_read: the preset's)
    expressed: tuple[str, ...] = ("overlap_dp", "overlap_tp", "overlap_tp_needs_sp", "overlap_pp", "cp_comm",
                                  "expert_gemm", "overlap_param_gather")
    expressed += ("fp8_scaling",) if plan.precision == "fp8" else ()
    expressed += ("moe_dispatcher",) if model.is_moe else ()
    expressed += ("flex_backend",) if model.is_moe and stack.moe_dispatcher_mode.forwards else ()
    note = comment(carried_stack_fields(stack, _PRESET, expressed) | unsaid(stack, overlap_param_gather=param_gather(
        stack, plan)), {"optimizer": "adamw"} if plan.optimizer == "adamw" else {})
    plan, fallback = per_rank_fallback(plan, _NAME)
    shape, notes = _model(model, plan, stack)
    notes = [*notes, *fallback]
    if stack.overlap_tp and plan.tp > 1 and not tp_hidden(_as_bridge_runs(stack), plan.sequence_parallel):
        # written as the stack says
        notes.append("comm_overlap.tp_comm_overlap=true: Megatron-Bridge turns it off without sequence parallelism "
                     "(training/comm_overlap.py:439-445 @ v0.3.1): the TP collectives are priced exposed")
    launch = torchrun(plan, "RECIPE_SCRIPT.py $(grep -v '^#' THIS_FILE)")
    lines = [f"# Megatron-Bridge recipe overrides for {model.name} ({plan.num_gpus} GPUs), written by meshplan",
             f"# launch (RECIPE_SCRIPT: the model family's, e.g. examples/recipes/llama/pretrain_llama3_8b.py): "
             f"{launch}"]
    lines += [f"# {note}"] if note else []
    lines += [f"# {line}" for line in notes]
    for key, value in (shape | _overrides(model, plan, stack)).items():
        if value is not None:
            lines.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return "\n".join(lines) + "\n"


def _parse(text: str) -> tuple[dict[str, str], list[str]]:
    """``key=value`` per line or per word (the command-line form), and the comment lines."""
    comments, values = [], {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            comments.append(line.lstrip("#"))
            continue
        for word in line.rstrip("\\").split():
            key, eq, value = word.partition("=")
            if eq:
                values[key.lstrip("+")] = value
    return values, comments


def _flag(values: dict[str, str], key: str, default: bool = False) -> bool:
    text = values.get(key)
    if text is None:
        return default
    if text.lower() not in ("true", "false"):
        raise SpecError(f"nemo config: {key}={text} must be true or false")
    return text.lower() == "true"


def _int(values: dict[str, str], key: str, default: int) -> int:
    try:
        return int(values.get(key, default))
    except ValueError:
        raise SpecError(f"nemo config: {key}={values[key]} must be an integer") from None


def _optimizer(values: dict[str, str]) -> str:
    """adam, or sgd with or without momentum (OptimizerConfig.sgd_momentum, default 0.9)."""
    name = values.get("optimizer.optimizer", "adam")
    if name not in ("adam", "sgd"):
        raise refuse(_NAME, "optimizer.optimizer", name, "meshplan reads adam and sgd")
    if _flag(values, "optimizer.use_precision_aware_optimizer"):
        raise refuse(_NAME, "optimizer.use_precision_aware_optimizer", True, "its moment dtypes are not read: use the "
                     "megatron format")
    try:
        momentum = float(values.get("optimizer.sgd_momentum", 0.9))
    except ValueError:
        raise SpecError(f"nemo config: optimizer.sgd_momentum={values['optimizer.sgd_momentum']} must be a number"
                        ) from None
    return name if name == "adam" else "sgd" if momentum == 0 else "sgd-momentum"


def _read(text: str, model: ModelSpec, gpus: int) -> tuple[Plan, Stack]:
    values, comments = _parse(text)
    extra_stack, extra_plan = parse_comment(comments)
    sizes = {k: _int(values, f"model.{n}_size", 1) for k, n in (("tp", "tensor_model_parallel"),
                                                                 ("pp", "pipeline_model_parallel"),
                                                                 ("cp", "context_parallel"))}
    vpp = _int(values, "model.virtual_pipeline_model_parallel_size", 1)
    stage_layers: tuple[int, ...] = ()
    if "model.pipeline_model_parallel_layout" in values:  # the layout says the chunks per rank too
        stage_layers, vpp = stage_layers_of(str(values["model.pipeline_model_parallel_layout"]), sizes["pp"],
                                            "model.pipeline_model_parallel_layout")
    precision, scaling = {v: k for k, v in _MIXED_PRECISION.items()}[known_value(
        _NAME, "mixed_precision", values.get("mixed_precision", "bf16_mixed"), tuple(_MIXED_PRECISION.values()))]
    granularity = values.get("model.recompute_granularity", "none")
    layers = _int(values, "model.recompute_num_layers", 0) if values.get("model.recompute_method") == "block" else 0
    plan = Plan(**{**dict(
        dp=data_parallel(gpus, _NAME, **sizes), **sizes, ep=_int(values, "model.expert_model_parallel_size", 1),
        etp=_int(values, "model.expert_tensor_parallel_size", sizes["tp"]), vpp=vpp,
        schedule=default_schedule(vpp),
        last_stage_layers=_int(values, "model.num_layers_in_last_pipeline_stage", 0),
        first_stage_layers=_int(values, "model.num_layers_in_first_pipeline_stage", 0), stage_layers=stage_layers,
        sequence_parallel=_flag(values, "model.sequence_parallel"),
        micro_batch=_int(values, "train.micro_batch_size", 1), global_batch=_int(values, "train.global_batch_size", 0),
        zero=int(_flag(values, "ddp.use_distributed_optimizer")),
        offload_optimizer=_flag(values, "optimizer.optimizer_cpu_offload"),
        recompute=granularity, recompute_layers=layers,
        recompute_modules=tuple(values.get("model.recompute_modules", "[core_attn]").strip("[]").split(",")),
        offload_activations=_flag(values, "model.cpu_offloading"),
        offload_layers=_int(values, "model.cpu_offloading_num_layers", 0), precision=precision,
        grad_bytes=4 if _flag(values, "ddp.grad_reduce_in_fp32", True) else 2, optimizer=_optimizer(values),
        moe_expert_capacity_factor=capacity_factor(values.get("model.moe_expert_capacity_factor"),
                                                   "nemo config: model.moe_expert_capacity_factor"),
        moe_pad_expert_input_to_capacity=_flag(values, "model.moe_pad_expert_input_to_capacity")),
        **extra_plan})
    read = dict(  # then the comment's fields, which say what the overrides cannot
        **_read_data_parallel_overlap(values), overlap_tp=_flag(values, "comm_overlap.tp_comm_overlap"),
        overlap_pp=_flag(values, f"{'comm_overlap' if 'comm_overlap.overlap_p2p_comm' in values else 'model'}"
                         ".overlap_p2p_comm", True),
        cp_comm={v: k for k, v in CP_COMM_TYPE.items()}[known_value(
            _NAME, "model.cp_comm_type", values.get("model.cp_comm_type", "p2p"), tuple(CP_COMM_TYPE.values()))],
        expert_gemm="grouped" if _flag(values, "model.moe_grouped_gemm") else "per_expert",
        **_dispatcher(values),
        **({"fp8_scaling": scaling} if precision == "fp8" else {}))
    return plan, _as_bridge_runs(load_stack(_PRESET).with_(**{**read, **extra_stack}))


def _as_bridge_runs(stack: Stack) -> Stack:
    """``stack`` as Megatron-Bridge runs it: its setup turns the TP overlap off without sequence parallelism
    (training/comm_overlap.py:439-445 @ v0.3.1; the megatron-bridge preset's overlap_tp_needs_sp), whatever stack
    wrote the file (a megatron-core one, which Megatron-LM would refuse instead) or a comment says."""
    return stack.with_(overlap_tp_needs_sp=load_stack(_PRESET).overlap_tp_needs_sp)


def _dispatcher(values: dict[str, str]) -> dict[str, Any]:
    """The MoE token dispatcher: model.moe_token_dispatcher_type, with flex its backend (Stack.flex_backend:
    model.moe_flex_dispatcher_backend, each priced at its own rate)."""
    if "model.moe_token_dispatcher_type" not in values:
        return {}
    argument = values.get("model.moe_flex_dispatcher_backend", "deepep")
    known_value(_NAME, "model.moe_flex_dispatcher_backend", argument, FLEX_ARGUMENTS)
    backend = flex_backend_of(argument, values.get("model.moe_hybridep_num_sms"))  # at its SM count
    dispatcher = values["model.moe_token_dispatcher_type"]
    return {"moe_dispatcher": dispatcher, **({"flex_backend": backend} if dispatcher == "flex" else {})}


NEMO = ConfigFormat(name=_NAME, preset=_PRESET, suffixes=(".overrides",), markers=(
    "model.tensor_model_parallel_size=", "model.pipeline_model_parallel_size=", "train.global_batch_size=",
    "train.micro_batch_size="), emit=_emit, read=_read)
