"""Megatron-LM ``pretrain_gpt.py`` command-line arguments, as a bash script that launches it: ``#`` comments, the
arguments one a line in the bash array ``MEGATRON_ARGS`` (bash hands them to argparse as written: no comment or
``\\`` continuation is read as an argument), then the ``torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}" "$@"``
line. Read back: the array, or (a file of the user's) the whole text, one option a line, ``\\``-continued.
The model's arguments are configs/megatron_model.py's (every architecture flag, so Megatron's defaults do not
change the model), then ``--tokenizer-type`` HuggingFaceTokenizer and ``--tokenizer-model`` a placeholder path.

Option names, their kinds (store_true / store_false / valued) and defaults are Megatron-LM's
megatron/training/arguments.py at tag core_v0.17.0 (the ``megatron/training`` that PyPI's megatron-core 0.17.0 wheel
ships, whose own ``parse_args`` and ``validate_args`` read every script meshplan writes in
tests/test_configs_megatron_lm.py; core_v0.16.1 has the same arguments): ``--tensor-model-parallel-size``,
``--pipeline-model-parallel-size``, ``--context-parallel-size``, ``--expert-model-parallel-size``,
``--expert-tensor-parallel-size``, ``--num-virtual-stages-per-pipeline-rank`` (the interleaved schedule's virtual
stages; arguments.py:2657, validate_args turns it into virtual_pipeline_model_parallel_size: Megatron-LM has no
``--virtual-pipeline-model-parallel-size`` argument), ``--decoder-first-pipeline-num-layers``,
``--decoder-last-pipeline-num-layers``,
``--sequence-parallel``, ``--micro-batch-size``, ``--global-batch-size``, ``--use-distributed-optimizer`` (ZeRO-1),
``--num-distributed-optimizer-instances`` (its ZeRO groups: configs/megatron_optimizer.py),
``--recompute-granularity {full,selective}``, ``--recompute-method {uniform,block}``, ``--recompute-num-layers``,
``--recompute-modules``, ``--bf16`` / ``--fp16``, ``--fp8-format {e4m3,hybrid}``,
``--fp8-recipe {tensorwise,delayed,mxfp8,blockwise}`` (default delayed), ``--grad-reduce-in-bf16``,
``--optimizer-cpu-offload`` (with ``--use-precision-aware-optimizer``, which validate_args requires of it:
arguments.py:1488-1492), ``--optimizer {adam,sgd}``, ``--sgd-momentum`` (default 0.9),
``--use-precision-aware-optimizer`` with ``--exp-avg-dtype`` / ``--exp-avg-sq-dtype`` (fp32, fp16, bf16, fp8),
``--overlap-grad-reduce``, ``--overlap-param-gather`` (store_true: read as off unless given, as Megatron-LM
does: configs/megatron_rules.dp_overlaps; written where validate_args takes it, configs/common.param_gather, else
the comment), ``--tp-comm-overlap``,
``--no-overlap-p2p-communication`` (store_false: overlap is on by default), ``--cp-comm-type {p2p,all_gather,...}``
(default p2p), ``--moe-grouped-gemm``, ``--attention-backend {flash,fused,unfused,local,auto}``; the model:
``--num-layers``, ``--hidden-size``, ``--ffn-hidden-size``, ``--num-attention-heads``, ``--group-query-attention``,
``--num-query-groups``, ``--kv-channels``, ``--seq-length``, ``--max-position-embeddings``, ``--swiglu``,
``--normalization``, ``--untie-embeddings-and-output-weights``, ``--position-embedding-type``, ``--num-experts``,
``--moe-router-topk``, ``--moe-ffn-hidden-size``, ``--moe-shared-expert-intermediate-size``, ``--squared-relu``
(refused for a model whose MLP is not relu2, and its absence for a relu2 one where ``--ffn-hidden-size`` is given:
Megatron would build GeLU; configs/megatron_model.SQUARED_RELU).

Mapping: recompute="full" with recompute_layers=0 is ``--recompute-method uniform --recompute-num-layers 1`` (every
layer), with N layers ``--recompute-method block --recompute-num-layers N``; the schedule is Megatron's own
(interleaved exactly when there are virtual stages, no GPipe); grad_bytes=2 is ``--grad-reduce-in-bf16`` (Megatron
keeps fp32 main grads with bf16 otherwise). The optimizer: Megatron's adam (decoupled weight decay by default: AdamW;
meshplan's adam and adamw price the same state, adamw rides in the meshplan comment) is the default and not written;
adam-bf16 is the precision-aware optimizer with bf16 moments (Megatron-Core allows it with the distributed optimizer
only: ZeRO-1); sgd-momentum is ``--optimizer sgd`` (momentum 0.9), sgd ``--optimizer sgd --sgd-momentum 0``.
The optimizer offloaded to the CPU is Megatron's HybridDeviceOptimizer, which rides on the precision-aware optimizer:
adam with the distributed optimizer only (specs/refusals.py ``optimizer_offload_needs_precision_aware``); its
moments stay fp32 unless adam-bf16. ``export CUDA_DEVICE_MAX_CONNECTIONS=1`` precedes the array where tp or cp > 1
(validate_args asserts it on GPUs before Blackwell, arguments.py:1214-1240, and it orders the TP / CP collectives
ahead of the GEMMs they overlap on every GPU); ``--tp-comm-overlap`` is written where tp > 1 (validate_args turns
sequence parallelism off at tp = 1 and then refuses the overlap: arguments.py:1192-1202) and the plan runs it (not
without sequence parallelism under Megatron-Bridge or NeMo, which run it exposed: specs/host_cost.py; the comment).
Left out (refused): ZeRO-2/3 (Megatron-FSDP), activation offload, fp4, 8-bit Adam and Adafactor (no argument).
"""

from __future__ import annotations

import shlex
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
from meshplan.configs.megatron_model import MEGATRON_ARGUMENT, architecture, arguments, capacity_factor
from meshplan.configs.megatron_optimizer import (
    distributed_optimizer,
    distributed_optimizer_args,
    optimizer_args,
    optimizer_of,
)
from meshplan.configs.megatron_rules import check_rules, dp_overlaps
from meshplan.errors import SpecError
from meshplan.pipeline.registry import default_schedule
from meshplan.specs.host_cost import tp_hidden
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.specs.stack_variants import FLEX_ARGUMENTS, flex_backend_of

_NAME = "megatron"
_PRESET = "megatron-core"
# the stack fields these arguments say
_EXPRESSED = ("overlap_dp", "overlap_tp", "overlap_pp", "fp8_scaling", "cp_comm", "expert_gemm", "attention_kernel",
             "flash_attention", "overlap_param_gather")
# Stack.cp_comm -> Megatron-Core's cp_comm_type (Megatron-Bridge takes the same values: configs/nemo.py)
CP_COMM_TYPE = {"ring": "p2p", "allgather": "all_gather"}
_ARRAY = "MEGATRON_ARGS=("  # the bash array the script holds the arguments in
# the release whose arguments these are (its parse_args / validate_args read them: tests/test_configs_megatron_lm.py)
_RELEASE = "Megatron-LM core_v0.17.0 (megatron-core 0.17.0)"
# the tokenizer: Hugging Face's, from a folder the user fills in (Megatron-LM --tokenizer-type HuggingFaceTokenizer)
_TOKENIZER: list[tuple[str, Any]] = [("--tokenizer-type", "HuggingFaceTokenizer"),
                                     ("--tokenizer-model", "PATH/TO/HF_TOKENIZER")]
_BACKEND = {("fused", True): "fused", ("fa2", True): "flash"}
_FP8 = {"fp8": ("hybrid", None), "mxfp8": ("e4m3", "mxfp8")}
_SCALING = {"delayed": "delayed", "current": "tensorwise"}


def _plan_args(plan: Plan, model: ModelSpec, stack: Stack) -> list[tuple[str, Any]]:
    """The parallel layout's arguments (refusing what Megatron-LM cannot run); layers per rank as Megatron-Core's
    custom pipeline layout (configs/layout.py)."""
    check_layout(plan.with_(stage_layers=()), _NAME, drops_tokens=True, zero_groups=True)
    if plan.zero > 1:
        raise refuse(_NAME, "zero", plan.zero, "its distributed optimizer is ZeRO-1")
    if plan.offload_activations:
        raise refuse(_NAME, "offload_activations", True, "pretrain_gpt.py has no activation offload argument")
    if plan.precision == "fp4":
        raise refuse(_NAME, "precision", plan.precision, "no fp4 recipe is written")
    if model.num_layers % plan.pp and plan.vpp == 1 and not (plan.first_stage_layers or plan.last_stage_layers
                                                             or plan.stage_layers):
        raise refuse(_NAME, "pp", plan.pp, f"it splits the {model.num_layers} layers evenly unless the first or last "
                     "stage is given (validate_args: specs/refusals.py layers_not_divisible_by_pp)")
    megatron_schedule = default_schedule(plan.vpp)
    if plan.schedule != megatron_schedule:
        raise refuse(_NAME, "schedule", plan.schedule, f"with vpp={plan.vpp} it runs {megatron_schedule}")
    args: list[tuple[str, Any]] = [
        ("--tensor-model-parallel-size", plan.tp), ("--pipeline-model-parallel-size", plan.pp),
        ("--context-parallel-size", plan.cp), ("--expert-model-parallel-size", plan.ep),
        ("--expert-tensor-parallel-size", plan.etp),
        ("--num-virtual-stages-per-pipeline-rank", plan.vpp if plan.vpp > 1 else None),
        ("--decoder-first-pipeline-num-layers", plan.first_stage_layers or None),
        ("--decoder-last-pipeline-num-layers", plan.last_stage_layers or None),
        ("--pipeline-model-parallel-layout",
         layout_string(plan.stage_layers, plan.vpp, model.mtp_layers) if plan.stage_layers else None),
        ("--sequence-parallel", plan.sequence_parallel),
        ("--micro-batch-size", plan.micro_batch), ("--global-batch-size", plan.global_batch),
        *distributed_optimizer_args(plan), ("--optimizer-cpu-offload", plan.offload_optimizer)]
    if plan.recompute != "none":
        args.append(("--recompute-granularity", plan.recompute))
    if plan.recompute == "full":
        args += [("--recompute-method", "block" if plan.recompute_layers else "uniform"),
                 ("--recompute-num-layers", plan.recompute_layers or 1)]
    if plan.recompute == "selective" and "moe_act" in plan.recompute_modules and not stack.expert_gemm_mode.grouped:
        raise refuse(_NAME, "recompute_modules", ",".join(plan.recompute_modules), "Megatron-Core recomputes moe_act "
                     "with grouped expert GEMMs only (--moe-grouped-gemm: megatron-core 0.16.1 "
                     "megatron/core/transformer/transformer_config.py:1213-1216)")
    if plan.recompute == "selective" or plan.recompute_modules != ("core_attn",):
        args.append(("--recompute-modules", " ".join(plan.recompute_modules)))
    args += [("--fp16", plan.precision == "fp16"), ("--bf16", plan.precision != "fp16"),
             ("--grad-reduce-in-bf16", plan.grad_bytes == 2)]
    if plan.grad_bytes not in (2, 4):
        raise refuse(_NAME, "grad_bytes", plan.grad_bytes, "its gradients are fp32 or bf16")
    return args + optimizer_args(plan)


def _tp_overlap(stack: Stack, plan: Plan) -> bool:  # --tp-comm-overlap: tp > 1 and the plan runs it (module doc)
    return plan.tp > 1 and tp_hidden(stack, plan.sequence_parallel)


def _stack_args(stack: Stack, plan: Plan) -> list[tuple[str, Any]]:
    backend = _BACKEND.get((stack.attention_kernel, stack.flash_attention), "unfused")
    if stack.flash_attention and stack.attention_kernel_mode.fp8:
        raise refuse(_NAME, "attention_kernel", "fp8", "its FP8 attention is Transformer Engine's, not an argument")
    args: list[tuple[str, Any]] = [
        ("--overlap-grad-reduce", stack.overlap_dp),
        ("--overlap-param-gather", param_gather(stack, plan)),
        ("--tp-comm-overlap", _tp_overlap(stack, plan)),
        ("--no-overlap-p2p-communication", not stack.overlap_pp),
        ("--cp-comm-type", CP_COMM_TYPE[stack.cp_comm]), ("--moe-grouped-gemm", stack.expert_gemm_mode.grouped),
        ("--attention-backend", backend)]
    if plan.precision in _FP8:
        fmt, recipe = _FP8[plan.precision]
        args += [("--fp8-format", fmt), ("--fp8-recipe", recipe or _SCALING[stack.fp8_scaling])]
    elif stack.fp8_scaling_mode.current:
        args.append(("--fp8-recipe", _SCALING[stack.fp8_scaling]))
    return args


def _emit(model: ModelSpec, plan: Plan, stack: Stack) -> str:
    """A bash script: the comments, the arguments in the array MEGATRON_ARGS (one a line, which Megatron-LM's argparse
    takes as bash hands them over: no comment or line continuation among them) and the torchrun line."""
    plan, fallback = per_rank_fallback(plan, _NAME)
    fields, notes = architecture(model, plan, stack)
    notes = [*notes, *fallback]
    args = (arguments(fields, model.num_heads) + _TOKENIZER + _plan_args(plan, model, stack) + _stack_args(stack, plan))
    lines = [" ".join([name] + ([] if value is True else [shlex.quote(v) for v in str(value).split()]))
             for name, value in args if value is not None and value is not False]
    flex = ("flex_backend",) if stack.moe_dispatcher_mode.forwards else ()
    expressed = tuple(f for f in _EXPRESSED if f != "overlap_tp" or plan.tp > 1) + \
        (("moe_dispatcher", *flex) if model.is_moe else ())
    note = comment(carried_stack_fields(stack, _PRESET, expressed) | unsaid(stack, overlap_param_gather=param_gather(
        stack, plan), overlap_tp=_tp_overlap(stack, plan)), {"optimizer": "adamw"} if plan.optimizer == "adamw" else {})
    head = ["#!/usr/bin/env bash",
            f"# Megatron-LM pretrain_gpt.py arguments for {model.name} ({plan.num_gpus} GPUs), written by meshplan",
            f"# for {_RELEASE} (its parse_args and validate_args take them).",
            "# Run it from Megatron-LM's folder on every node (MASTER_ADDR set); what it is given (--data-path ...)",
            f"# follows these arguments. {_TOKENIZER[1][1]} is a placeholder: the model's Hugging Face tokenizer."]
    head += [f"# {note}"] if note else []
    head += [f"# {line}" for line in notes]
    if plan.tp > 1 or plan.cp > 1:  # validate_args asserts it before Blackwell (module docstring)
        head += ["# tensor / context parallelism: one CUDA work queue, so that each collective runs before the GEMM",
                 "# it feeds (Megatron-LM validate_args requires it on GPUs before Blackwell)",
                 "export CUDA_DEVICE_MAX_CONNECTIONS=1"]
    launch = torchrun(plan, 'pretrain_gpt.py "${MEGATRON_ARGS[@]}" "$@"')
    return "\n".join(head + [_ARRAY, *(f"  {line}" for line in lines), ")", launch]) + "\n"


def _parse(text: str) -> tuple[dict[str, Any], list[str]]:
    """``--name value`` / ``--name`` (True) from the text (the MEGATRON_ARGS array where the text is meshplan's
    script, else all of it: an argument list one option a line, ``\\``-continued), and its comment lines."""
    comments = [ln.strip().lstrip("#") for ln in text.splitlines() if ln.strip().startswith("#")]
    rows = [ln.strip() for ln in text.splitlines()]
    if _ARRAY in rows:
        start = rows.index(_ARRAY)
        end = next((i for i in range(start + 1, len(rows)) if rows[i] == ")"), len(rows))
        rows = rows[start + 1:end]
    body = " ".join(ln for ln in "\n".join(rows).replace("\\\n", " ").splitlines() if not ln.startswith("#"))
    options: dict[str, Any] = {}
    tokens = shlex.split(body)
    i = 0
    while i < len(tokens):
        name = tokens[i]
        values = []
        while i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            i += 1
            values.append(tokens[i])
        if name.startswith("--"):
            options[name] = " ".join(values) if values else True
        i += 1
    return options, comments


def _check_activation(options: dict[str, Any], model: ModelSpec) -> None:
    """--squared-relu builds a squared-ReLU MLP (configs/megatron_model.SQUARED_RELU): refused for another model, and
    its absence refused for a relu2 model where the arguments state the MLP (--ffn-hidden-size): Megatron would
    build GeLU."""
    squared = "--squared-relu" in options
    if squared != (model.mlp == "relu2") and (squared or "--ffn-hidden-size" in options):
        raise SpecError(f"megatron config: {'--squared-relu' if squared else 'no --squared-relu'} does not build "
                        f"{model.name}'s MLP ({model.mlp})")


def _int(options: dict[str, Any], name: str, default: int) -> int:
    value = options.get(name, default)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SpecError(f"megatron config: {name} {value} must be an integer") from None


def _read(text: str, model: ModelSpec, gpus: int) -> tuple[Plan, Stack]:
    options, comments = _parse(text)
    _check_spelling(options)
    extra_stack, extra_plan = parse_comment(comments)
    if _int(options, "--num-layers", model.num_layers) != model.num_layers:
        raise SpecError(f"megatron config: --num-layers {options['--num-layers']} is not {model.name}'s "
                        f"{model.num_layers}")
    _check_activation(options, model)
    sizes = {k: _int(options, f"--{n}-size", 1) for k, n in (("tp", "tensor-model-parallel"),
                                                              ("pp", "pipeline-model-parallel"),
                                                              ("cp", "context-parallel"))}
    check_rules(options, sizes)  # what Megatron-LM's argparse / validate_args refuses (configs/megatron_rules.py)
    vpp = _int(options, "--num-virtual-stages-per-pipeline-rank", 1)
    if "--num-layers-per-virtual-pipeline-stage" in options:
        vpp = model.num_layers // (sizes["pp"] * _int(options, "--num-layers-per-virtual-pipeline-stage", 1))
    stage_layers: tuple[int, ...] = ()
    if "--pipeline-model-parallel-layout" in options:  # the layout says the chunks per rank too
        stage_layers, vpp = stage_layers_of(str(options["--pipeline-model-parallel-layout"]), sizes["pp"])
    fields = dict(
        dp=data_parallel(gpus, _NAME, **sizes), **sizes, ep=_int(options, "--expert-model-parallel-size", 1),
        etp=_int(options, "--expert-tensor-parallel-size", sizes["tp"]), vpp=vpp,
        schedule=default_schedule(vpp),
        last_stage_layers=_int(options, "--decoder-last-pipeline-num-layers", 0),
        first_stage_layers=_int(options, "--decoder-first-pipeline-num-layers", 0), stage_layers=stage_layers,
        sequence_parallel="--sequence-parallel" in options, micro_batch=_int(options, "--micro-batch-size", 1),
        global_batch=_int(options, "--global-batch-size", 0), **distributed_optimizer(options),
        offload_optimizer="--optimizer-cpu-offload" in options, **_recompute(options),
        precision=_precision(options), grad_bytes=2 if "--grad-reduce-in-bf16" in options else 4,
        optimizer=optimizer_of(options),
        moe_expert_capacity_factor=capacity_factor(options.get("--moe-expert-capacity-factor"),
                                                   "megatron config: --moe-expert-capacity-factor"),
        moe_pad_expert_input_to_capacity="--moe-pad-expert-input-to-capacity" in options)
    return Plan(**{**fields, **extra_plan}), _stack(options, extra_stack)


# the arguments this module writes or reads: an unknown argument one slip from one of them is a misspelling, not an
# argument of Megatron-LM's that meshplan does not read (argparse would refuse it: arguments.py has no such flag)
_WRITTEN = frozenset(("--attention-backend", "--bf16", "--context-parallel-size", "--cp-comm-type",
    "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
    "--exp-avg-dtype", "--exp-avg-sq-dtype", "--expert-model-parallel-size",
    "--expert-tensor-parallel-size", "--ffn-hidden-size", "--fp16", "--fp8-format", "--fp8-recipe",
    "--global-batch-size", "--grad-reduce-in-bf16", "--group-query-attention", "--hidden-size", "--kv-channels",
    "--max-position-embeddings", "--micro-batch-size", "--moe-enable-deepep", "--moe-ffn-hidden-size",
    "--moe-grouped-gemm",
    "--moe-router-topk", "--moe-shared-expert-intermediate-size", "--no-overlap-p2p-communication", "--normalization",
    "--num-attention-heads", "--num-experts", "--num-layers", "--num-layers-per-virtual-pipeline-stage",
    "--num-query-groups", "--optimizer", "--optimizer-cpu-offload", "--overlap-grad-reduce", "--overlap-param-gather",
    "--pipeline-model-parallel-layout", "--pipeline-model-parallel-size", "--position-embedding-type",
    "--recompute-granularity", "--recompute-method",
    "--recompute-modules", "--recompute-num-layers", "--seq-length", "--sequence-parallel", "--sgd-momentum",
    "--swiglu", "--tensor-model-parallel-size", "--tp-comm-overlap", "--untie-embeddings-and-output-weights",
    "--use-distributed-optimizer", "--use-precision-aware-optimizer", "--num-virtual-stages-per-pipeline-rank",
    "--num-distributed-optimizer-instances"))
KNOWN = _WRITTEN | frozenset(MEGATRON_ARGUMENT.values()) | {"--group-query-attention", "--tokenizer-type",
                                                             "--tokenizer-model"}


def _one_slip(a: str, b: str) -> bool:
    """One character changed (not a digit for a digit: --fp4-recipe is an option of its own), two neighbours
    swapped, or one character added or left out."""
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return not (a[diff[0]].isdigit() and b[diff[0]].isdigit())
        return len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]] and a[diff[1]] == b[diff[0]]
    short, long_ = sorted((a, b), key=len)
    return len(long_) == len(short) + 1 and any(long_[:i] + long_[i + 1:] == short for i in range(len(long_)))


def _check_spelling(options: dict[str, Any]) -> None:
    for name in options:
        if name in KNOWN:
            continue
        near = [known for known in sorted(KNOWN) if name.replace("_", "-") == known or _one_slip(name, known)]
        if near:
            raise SpecError(f"megatron config: {name} is not a Megatron-LM argument; did you mean {near[0]}?")


def _recompute(options: dict[str, Any]) -> dict[str, Any]:
    granularity = options.get("--recompute-granularity", "none")
    modules = tuple(str(options.get("--recompute-modules", "core_attn")).split())
    layers = 0
    if granularity == "full" and options.get("--recompute-method") == "block":
        layers = _int(options, "--recompute-num-layers", 0)
    return {"recompute": granularity, "recompute_layers": layers, "recompute_modules": modules}


def _precision(options: dict[str, Any]) -> str:
    if "--fp8-format" in options:
        return "mxfp8" if options.get("--fp8-recipe") == "mxfp8" else "fp8"
    return "fp16" if "--fp16" in options else "bf16"


def _stack(options: dict[str, Any], extra: dict[str, Any]) -> Stack:
    # Megatron-Core's AttnBackend (flash, fused, unfused, local, auto) and --fp8-recipe values meshplan prices
    backend = known_value(_NAME, "attention_backend", options.get("--attention-backend", "auto"),
                          ("flash", "fused", "unfused", "local", "auto"))
    kernel = {"flash": ("fa2", True), "unfused": ("fused", False)}.get(backend, ("fused", True))
    recipe = known_value(_NAME, "fp8_recipe", options.get("--fp8-recipe", "delayed"),
                         ("delayed", "tensorwise", "mxfp8"))
    cp_comm = known_value(_NAME, "cp_comm_type", options.get("--cp-comm-type", "p2p"), tuple(CP_COMM_TYPE.values()))
    read = dict(  # then the comment's fields, which say what the arguments cannot (overlap_tp at tp = 1, ...)
        **dp_overlaps(options), overlap_tp="--tp-comm-overlap" in options,
        overlap_pp="--no-overlap-p2p-communication" not in options,
        cp_comm={v: k for k, v in CP_COMM_TYPE.items()}[cp_comm],
        expert_gemm="grouped" if "--moe-grouped-gemm" in options else "per_expert",
        **_dispatcher(options),
        attention_kernel=kernel[0], flash_attention=kernel[1],
        fp8_scaling="current" if recipe == "tensorwise" else "delayed")
    return load_stack(_PRESET).with_(**{**read, **extra})


def _dispatcher(options: dict[str, Any]) -> dict[str, Any]:
    """The MoE token dispatcher (Stack.moe_dispatcher): --moe-token-dispatcher-type, whose flex runs either backend
    (Stack.flex_backend: --moe-flex-dispatcher-backend deepep or hybridep at its --moe-hybridep-num-sms, or the
    deprecated --moe-enable-deepep; each priced at its own rate); Megatron-Core refuses DeepEP under another
    dispatcher (transformer_config.py:1230-1232)."""
    if "--moe-token-dispatcher-type" not in options:
        return {}
    dispatcher, argument = options["--moe-token-dispatcher-type"], options.get("--moe-flex-dispatcher-backend", "")
    known_value(_NAME, "moe_flex_dispatcher_backend", argument := argument or "deepep", FLEX_ARGUMENTS)
    backend = flex_backend_of(argument, options.get("--moe-hybridep-num-sms"))
    if "--moe-enable-deepep" in options and dispatcher != "flex":
        raise refuse(_NAME, "moe_enable_deepep", True, "Megatron-Core runs DeepEP only with "
                     f"--moe-token-dispatcher-type flex, not {dispatcher} (megatron/core/transformer/"
                     "transformer_config.py:1230-1232 @ core_v0.17.0)")
    return {"moe_dispatcher": dispatcher, **({"flex_backend": backend} if dispatcher == "flex" else {})}


MEGATRON = ConfigFormat(name=_NAME, preset=_PRESET, suffixes=(".sh", ".args", ".txt"), markers=(
    "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size", "--micro-batch-size",
    "--global-batch-size"), emit=_emit, read=_read)
