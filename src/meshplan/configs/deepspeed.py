"""DeepSpeed ``ds_config.json``, the keys of DeepSpeed's configuration reference (deepspeed.ai/docs/config-json/,
deepspeed/runtime/config.py and deepspeed/runtime/zero/config.py): ``train_batch_size`` (= micro-batch ·
accumulation · data-parallel size), ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
``zero_optimization`` {``stage`` 0-3, ``overlap_comm``, ``offload_optimizer`` {``device``: "cpu"}}, ``bf16`` /
``fp16`` {``enabled``}, ``data_types`` {``grad_accum_dtype``: "fp32" / "bf16" / "fp16"},
``activation_checkpointing`` (the deepspeed.checkpointing section: present when every layer is recomputed),
``tensor_parallel`` {``autotp_size``} (DeepSpeed AutoTP training, docs/_tutorials/autotp-training.md), and
``optimizer`` {``type``, ``params`` {``lr``, ...}}: DeepSpeed's own "Adam" / "AdamW", or any torch.optim class by name
(deepspeed/runtime/engine.py ``_configure_basic_optimizer``: getattr(torch.optim, type)): "SGD" (``params``
{``momentum``: 0.9} for sgd-momentum), "Adafactor"; those are not among ZeRO's tested optimizers
(deepspeed/runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS), so with ZeRO they need ``zero_allow_untested_optimizer``.

DeepSpeed takes the pipeline (PipelineModule(num_stages=...)), MoE expert parallelism (deepspeed.moe.layer.MoE
ep_size) and Ulysses sequence parallelism in the training script, not in this file: pp, ep, cp and sequence
parallelism are refused, as are selective recompute, activation offload, fp8, bf16 Adam moments (no key) and 8-bit
Adam (bitsandbytes' optimizer is passed in code). What the script must do besides (the model it builds, gradient
checkpointing turned on in the model, AutoTP's tp_model_init, the ``deepspeed`` launcher line) is said in
``meshplan_notes``, a list of lines. JSON has no comments: the stack fields this file has no key for (all but
``overlap_dp``) ride in a top-level ``"meshplan"`` string, which DeepSpeed ignores (its DeepSpeedConfig reads the keys
it knows).
"""

from __future__ import annotations

import json
from typing import Any

from meshplan.configs.common import (
    carried_stack_fields,
    check_layout,
    comment,
    data_parallel,
    node_split,
    parse_comment,
    refuse,
)
from meshplan.configs.format import ConfigFormat
from meshplan.configs.values import Values, announce
from meshplan.errors import SpecError
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack

_NAME = "deepspeed"
_PRESET = "deepspeed"
_PRECISIONS = ("bf16", "fp16")  # the Plan.precision values it trains in
# Plan.optimizer -> DeepSpeed's optimizer type and params (module docstring)
_OPTIMIZER = {"adam": ("Adam", {}), "adamw": ("AdamW", {}), "sgd-momentum": ("SGD", {"momentum": 0.9}),
             "sgd": ("SGD", {}), "adafactor": ("Adafactor", {})}
_ZERO_TESTED = ("Adam", "AdamW")
# the learning rate written (the step time does not depend on it, and meshplan knows no schedule): torch.optim's
# default for Adam, AdamW and SGD, which DeepSpeed's own "Adam" takes too; meshplan_notes says to set the run's own
LEARNING_RATE = 1e-3


def _check(plan: Plan) -> None:
    check_layout(plan, _NAME)
    problems = [("pp", plan.pp, "DeepSpeed takes the pipeline in code (PipelineModule)", plan.pp > 1),
                ("cp", plan.cp, "DeepSpeed takes sequence parallelism in code (Ulysses)", plan.cp > 1),
                ("ep", plan.ep, "DeepSpeed takes expert parallelism in code (MoE ep_size)", plan.ep > 1),
                ("sequence_parallel", True, "AutoTP has no sequence parallelism", plan.sequence_parallel),
                ("recompute", plan.recompute, "its checkpointing recomputes whole layers",
                 plan.recompute == "selective"),
                ("recompute_layers", plan.recompute_layers, "its checkpointing recomputes every layer",
                 plan.recompute_layers and plan.recompute == "full"),
                ("offload_activations", True, "no activation offload key", plan.offload_activations),
                ("offload_optimizer", True, "optimizer offload needs ZeRO 1-3",
                 plan.offload_optimizer and not plan.zero),
                ("precision", plan.precision, "it trains in bf16 or fp16", plan.precision not in _PRECISIONS),
                ("grad_bytes", plan.grad_bytes, "its gradients are fp32 or 16-bit", plan.grad_bytes not in (2, 4)),
                ("optimizer", plan.optimizer, "its config names Adam, AdamW or a torch.optim class (bf16 moments and "
                 "bitsandbytes' 8-bit Adam are set in code)", plan.optimizer not in _OPTIMIZER)]
    for field, value, why, bad in problems:
        if bad:
            raise refuse(_NAME, field, value, why)


def _config(model: ModelSpec, plan: Plan, stack: Stack) -> dict[str, Any]:
    """The ds_config as a dict."""
    _check(plan)
    zero: dict[str, Any] = {"stage": plan.zero, "overlap_comm": stack.overlap_dp}
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg: dict[str, Any] = {
        "train_batch_size": plan.global_batch, "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum, "zero_optimization": zero,
        "bf16": {"enabled": plan.precision == "bf16"}, "fp16": {"enabled": plan.precision == "fp16"},
        "data_types": {"grad_accum_dtype": "fp32" if plan.grad_bytes == 4 else plan.precision}}
    kind, params = _OPTIMIZER[plan.optimizer]
    cfg["optimizer"] = {"type": kind, "params": {"lr": LEARNING_RATE, **params}}
    if plan.zero and kind not in _ZERO_TESTED:
        cfg["zero_allow_untested_optimizer"] = True
    if plan.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": plan.tp}
    if plan.recompute == "full":
        cfg["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": False,
                                           "contiguous_memory_optimization": False}
    note = comment(carried_stack_fields(stack, _PRESET, ("overlap_dp",)), {})
    if note:
        cfg["meshplan"] = note
    cfg["meshplan_notes"] = _notes(model, plan)
    return cfg


def _notes(model: ModelSpec, plan: Plan) -> list[str]:
    """What the training script must do besides passing this file (DeepSpeed ignores keys it does not know)."""
    nodes, local = node_split(plan)  # the same nodes as torchrun's (a 4-GPU plan: one node of 4)
    out = [f"model: the training script builds it; meshplan priced {model.name} ({model.params():,} parameters, "
           f"{model.source or 'its ModelSpec'}) with its vocabulary and widths"
           + ("" if model.dropout else ", without dropout")]
    if plan.recompute == "full":
        out.append("recompute: the model checkpoints every layer itself (Hugging Face: "
                   "model.gradient_checkpointing_enable(); else deepspeed.checkpointing.checkpoint around each "
                   "layer); activation_checkpointing only configures deepspeed.checkpointing")
    if plan.tp > 1:
        out.append(f"tensor parallelism: build the model under deepspeed.tp_model_init(model, tp_size={plan.tp}, "
                   "dtype) before deepspeed.initialize (AutoTP training)")
    out.append(f"optimizer.params.lr is {LEARNING_RATE:g} (torch.optim's default): set the run's own, and its "
               "schedule (DeepSpeed's scheduler block), which meshplan does not price")
    out.append(f"launch: deepspeed --hostfile HOSTFILE --num_nodes {nodes} --num_gpus {local} "
               "TRAIN_SCRIPT.py --deepspeed --deepspeed_config THIS_FILE.json")
    return out


def _emit(model: ModelSpec, plan: Plan, stack: Stack) -> str:
    return json.dumps(_config(model, plan, stack), indent=2) + "\n"


def _read(text: str, model: ModelSpec, gpus: int) -> tuple[Plan, Stack]:
    try:
        cfg = Values(json.loads(text), "deepspeed config")
    except json.JSONDecodeError as e:
        raise SpecError(f"deepspeed config: {e}") from None
    except SpecError:
        raise SpecError("deepspeed config must be a JSON object") from None
    extra_stack, extra_plan = parse_comment([cfg.text("meshplan", "")])
    tp = cfg.section("tensor_parallel").integer("autotp_size", 1)
    assert tp is not None  # a default of 1
    dp = data_parallel(gpus, _NAME, tp=tp)
    global_batch, micro = _batch(cfg, dp)
    zero = cfg.section("zero_optimization")
    offload = zero.section("offload_optimizer").choice("device", "none", ("none", "cpu", "nvme"))
    precision = "fp16" if cfg.section("fp16").flag("enabled", False) else "bf16"
    # DeepSpeed accumulates in the weights' dtype unless data_types says otherwise (runtime/engine.py get_data_types)
    grads = cfg.section("data_types").choice("grad_accum_dtype", precision, ("fp32", "bf16", "fp16"))
    plan = Plan(**{**dict(
        dp=dp, tp=tp, sequence_parallel=False, micro_batch=micro, global_batch=global_batch,
        zero=zero.integer("stage", 0, low=0), offload_optimizer=offload != "none",
        recompute="full" if cfg.raw("activation_checkpointing") is not None else "none", precision=precision,
        grad_bytes=4 if grads == "fp32" else 2, optimizer=_optimizer(cfg.raw("optimizer", {}))), **extra_plan})
    stack = load_stack(_PRESET).with_(overlap_dp=zero.flag("overlap_comm", False), **extra_stack)
    announce(_NAME, cfg.autos, "the Hugging Face Trainer's defaults (TrainingArguments) and DeepSpeed's batch rule")
    return plan, stack


# What the Hugging Face Trainer writes for "auto" (transformers TrainingArguments: per_device_train_batch_size = 8,
# gradient_accumulation_steps = 1; train_batch_size = their product times the world size)
TRAINER_MICRO_BATCH, TRAINER_ACCUMULATION = 8, 1


def _batch(cfg: Values, dp: int) -> tuple[int, int]:
    """(global batch, micro-batch) of ``train_batch_size`` / ``train_micro_batch_size_per_gpu`` /
    ``gradient_accumulation_steps``, the missing ones derived as DeepSpeed does (deepspeed/runtime/config.py
    ``_set_batch_related_parameters``: train = micro · accumulation · dp); an "auto" micro-batch without a
    train_batch_size is the Trainer's per-device batch (8); neither batch given: one sequence per GPU."""
    train = cfg.integer("train_batch_size", None)
    accum = cfg.integer("gradient_accumulation_steps", None, auto=TRAINER_ACCUMULATION) or 1
    micro = cfg.integer("train_micro_batch_size_per_gpu", None)
    if micro is None:
        auto = cfg.raw("train_micro_batch_size_per_gpu") == "auto"
        micro = train // dp // accum if train is not None else TRAINER_MICRO_BATCH if auto else 1
        if micro < 1:
            raise SpecError(f"deepspeed config: train_batch_size={train} is less than gradient_accumulation_steps="
                            f"{accum} · dp {dp}")
        if auto:
            cfg.autos.append(f"train_micro_batch_size_per_gpu={micro}" + (
                f" (= {train} / {accum} / dp {dp})" if train is not None else ""))
    if train is None:
        train = micro * accum * dp
        if cfg.raw("train_batch_size") == "auto":
            cfg.autos.append(f"train_batch_size={train} (= {micro} · {accum} · dp {dp})")
    return train, micro


def _optimizer(section: object) -> str:
    """Plan.optimizer of the ``optimizer`` section (none: Adam, the client's to pass, priced as Adam)."""
    if not isinstance(section, dict):
        raise SpecError(f"deepspeed config: optimizer must be an object, not {section!r}")
    kind = str(section.get("type") or "Adam").lower()
    params = section.get("params") or {}
    if not isinstance(params, dict):
        raise SpecError(f"deepspeed config: optimizer.params must be an object, not {params!r}")
    if kind == "sgd":
        momentum = params.get("momentum") or 0
        return "sgd-momentum" if momentum not in (0, "auto") else "sgd"
    names = {"adam": "adam", "adamw": "adamw", "adafactor": "adafactor"}
    if kind not in names:
        raise refuse(_NAME, "optimizer.type", section.get("type"), "meshplan reads Adam, AdamW, SGD and Adafactor")
    return names[kind]


DEEPSPEED = ConfigFormat(name=_NAME, preset=_PRESET, suffixes=(".json",), markers=(
    "train_micro_batch_size_per_gpu", "train_batch_size", "zero_optimization"), emit=_emit, read=_read)
