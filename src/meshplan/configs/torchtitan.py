"""torchtitan job TOML (``--job.config_file``), the sections and keys of torchtitan/config/job_config.py
(pytorch/torchtitan; the same field names in torchtitan 0.3.0's torchtitan/config/configs.py TrainingConfig and
ParallelismConfig):

- [training] ``local_batch_size`` (per data-parallel rank per accumulation step; with pipeline parallelism split
  into micro-batches of [parallelism] ``pipeline_parallel_microbatch_size``), ``global_batch_size`` (default
  local·dp: no accumulation), ``seq_len``, ``mixed_precision_param`` ("bfloat16"), ``mixed_precision_reduce``
  ("float32" / "bfloat16")
- [parallelism] ``data_parallel_replicate_degree``, ``data_parallel_shard_degree``, ``fsdp_reshard_after_forward``
  ("default" / "always" / "never"), ``tensor_parallel_degree``, ``pipeline_parallel_degree``,
  ``pipeline_parallel_schedule`` ("1F1B", "GPipe", "Interleaved1F1B", ...), ``pipeline_parallel_layers_per_stage``,
  ``context_parallel_degree``, ``context_parallel_rotate_method`` ("allgather" / "alltoall"),
  ``expert_parallel_degree``, ``expert_tensor_parallel_degree``, ``enable_async_tensor_parallel``
  (torchtitan 0.3.0 keeps every key above but the last three: checked by loading the emitted tables into its
  TrainingConfig / ParallelismConfig)
- [activation_checkpoint] ``mode`` ("none" / "selective" / "full"), ``selective_ac_option`` ("op": per-op SAC)
- [optimizer] ``name`` ("Adam" / "AdamW", default "AdamW": torchtitan/components/optimizer.py build_optimizers
  takes those two)
- [compile] ``enable`` (a compiled or fused stack); [model] ``converters = ["float8"]`` with [float8]
  ``recipe_name = "tensorwise"``

Mapping: FSDP2 is ZeRO-3 when it reshards after forward and ZeRO-2 when it does not ("never"); under pipeline
parallelism ("default": every unit kept gathered, the gradients synced once a step) ZeRO-1, and "always" refused;
plain replication (DDP) is ZeRO-0; torchtitan has no other ZeRO-1. Its tensor parallelism always shards the norms'
sequence (sequence parallel on with tp > 1). Selective recompute is per-op SAC (``selective_ac_option = "op"``),
meshplan's op_sac.
Refused: ZeRO-1 without pipeline parallelism and ZeRO-2 / 3 with it, HSDP (replicate and shard both > 1), fp16,
mxfp8/fp4, delayed fp8 scaling, an uneven last stage, optimizer or activation offload, recompute of some layers,
selective recompute of Megatron-Core's modules, an optimizer other than Adam and AdamW.
"""

from __future__ import annotations

import tomllib
from typing import Any

from meshplan.configs.common import (
    carried_stack_fields,
    check_layout,
    comment,
    data_parallel,
    parse_comment,
    refuse,
    torchrun,
)
from meshplan.configs.format import ConfigFormat
from meshplan.configs.torchtitan_models import PLACEHOLDER_ASSETS, custom, module_name, notes, registered
from meshplan.configs.values import Values
from meshplan.errors import SpecError
from meshplan.pipeline.registry import TORCHTITAN_CLASSES, in_framework, schedule_of
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import TORCH_COMPILE_REGION_HOST, Stack, load_stack

_NAME = "torchtitan"
_PRESET = "torchtitan"
# the release that reads these files: torchtitan 0.2.2 (its ConfigManager loads them in
# tests/test_configs_framework_loaders.py) is the last that reads a job TOML (--job.config_file); 0.3.0 builds its
# configs in Python
_RELEASE = "torchtitan 0.2.2 (the last release that reads a job TOML)"
_OPTIMIZERS = {"adam": "Adam", "adamw": "AdamW"}  # Plan.optimizer -> [optimizer] name
_SCHEDULES = {s: schedule_of(s).frameworks[TORCHTITAN_CLASSES] for s in in_framework(TORCHTITAN_CLASSES)}  # the records
_ROTATE = {"allgather": "allgather", "ring": "alltoall"}
_REDUCE_DTYPE = {4: "float32", 2: "bfloat16"}  # Plan.grad_bytes -> mixed_precision_reduce
# torchtitan's selective_ac_option "op" (per-op SAC: matmuls but every second one and the attention outputs saved,
# the rest recomputed) is meshplan's recompute_modules op_sac (cost/recompute.py); an integer N recomputes every N-th
# layer in full. Megatron-Core's modules (core_attn ...) have no torchtitan option: refused
_OP_SAC = ("op_sac",)


def _check(plan: Plan, model: ModelSpec) -> None:
    check_layout(plan, _NAME)
    problems = [("zero", plan.zero, "FSDP has no ZeRO-1", plan.zero == 1 and plan.pp == 1),
                ("sequence_parallel", plan.sequence_parallel, "its TP shards the sequence exactly when tp > 1",
                 plan.sequence_parallel != (plan.tp > 1)),
                ("precision", plan.precision, "it trains in bf16 or float8", plan.precision not in ("bf16", "fp8")),
                ("offload_optimizer", True, "no optimizer-only offload", plan.offload_optimizer),
                ("offload_activations", True, "no activation offload option", plan.offload_activations),
                ("last_stage_layers", plan.last_stage_layers, "stages hold equal layers", plan.last_stage_layers),
                ("first_stage_layers", plan.first_stage_layers, "stages hold equal layers", plan.first_stage_layers),
                ("recompute_layers", plan.recompute_layers, "it recomputes every N-th layer of a rank (selective_ac_"
                 f"option N), and {plan.recompute_layers} layers are not every N-th of {model.num_layers // plan.pp}",
                 plan.recompute == "full" and plan.recompute_layers
                 and (model.num_layers // plan.pp) % plan.recompute_layers),
                ("recompute_modules", ",".join(plan.recompute_modules),
                 "its selective recompute is per-op SAC (recompute_modules op_sac)",
                 plan.recompute == "selective" and plan.recompute_modules != _OP_SAC),
                ("grad_bytes", plan.grad_bytes, "it reduces in float32 or bfloat16",
                 plan.grad_bytes not in _REDUCE_DTYPE),
                ("optimizer", plan.optimizer, "its build_optimizers takes Adam and AdamW",
                 plan.optimizer not in _OPTIMIZERS),
                ("vpp", plan.vpp, f"{model.num_layers} layers do not split into pp·vpp stages",
                 model.num_layers % (plan.pp * plan.vpp)),
                ("zero", plan.zero, "under pipeline parallelism its FSDP2 keeps each stage gathered over the "
                 "micro-batches and syncs its gradients once a step: ZeRO-1", plan.zero >= 2 and plan.pp > 1)]
    for field, value, why, bad in problems:
        if bad:
            raise refuse(_NAME, field, value, why)


def _reshard(plan: Plan) -> str:
    """[parallelism] fsdp_reshard_after_forward for ``plan`` (torchtitan 0.2.2 models/llama3/infra/parallelize.py
    apply_fsdp): "always" for ZeRO-3 (every unit, the head's too), "never" for ZeRO-2; under pipeline parallelism
    "default", which there keeps every unit gathered (``not pp_enabled``; 9dec370 had no other setting) while torch's
    pipelining syncs the gradients once a step: ZeRO-1 (specs/refusals.py fsdp_stage_under_pp)."""
    if plan.pp > 1:
        return "default"
    return "never" if plan.zero == 2 else "always"


def _zero(reshard: str, replicate: int, pp: int) -> int:
    """The ZeRO stage of fsdp_reshard_after_forward (``_reshard``'s inverse): DDP (replicate > 1) is 0; under
    pipeline parallelism "default" and "never" are ZeRO-1 and "always" is refused: torch's pipelining leaves each
    unit gathered after every micro-batch's backward (torch 2.13.0 torch/distributed/pipelining/stage.py:844-848,
    set_reshard_after_backward(False)) while "always" regathers it every forward, neither ZeRO-3's memory nor its
    traffic."""
    if replicate > 1:
        return 0
    if pp > 1:
        if reshard == "always":
            raise refuse(_NAME, "fsdp_reshard_after_forward", reshard, "with pipeline parallelism it regathers "
                         "every forward yet keeps each unit gathered after every backward (not modelled); "
                         '"default" keeps the stage gathered: ZeRO-1')
        return 1
    return 2 if reshard == "never" else 3


def _table(name: str, values: dict[str, Any]) -> list[str]:
    def text(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(text(x) for x in v) + "]"
        return f'"{v}"' if isinstance(v, str) else str(v)
    return [f"[{name}]", *(f"{k} = {text(v)}" for k, v in values.items() if v is not None), ""]


def _emit(model: ModelSpec, plan: Plan, stack: Stack) -> str:
    _check(plan, model)
    fp8 = plan.precision == "fp8"
    if fp8 and not stack.fp8_scaling_mode.current:
        raise refuse(_NAME, "fp8_scaling", stack.fp8_scaling, "torchao's float8 scales from the current amax")
    local = plan.global_batch // plan.dp if plan.pp > 1 else plan.micro_batch
    replicate = plan.dp if plan.zero == 0 else 1
    training = {"local_batch_size": local, "global_batch_size": plan.global_batch, "seq_len": model.seq_length,
                "mixed_precision_param": "bfloat16", "mixed_precision_reduce": _REDUCE_DTYPE[plan.grad_bytes]}
    parallelism = {
        "data_parallel_replicate_degree": replicate, "data_parallel_shard_degree": plan.dp // replicate,
        "fsdp_reshard_after_forward": _reshard(plan),
        "tensor_parallel_degree": plan.tp, "pipeline_parallel_degree": plan.pp,
        "pipeline_parallel_schedule": _SCHEDULES[str(plan.schedule)],
        "pipeline_parallel_layers_per_stage": model.num_layers // (plan.pp * plan.vpp) if plan.pp > 1 else None,
        "pipeline_parallel_microbatch_size": plan.micro_batch if plan.pp > 1 else None,
        "context_parallel_degree": plan.cp, "context_parallel_rotate_method": _ROTATE[stack.cp_comm],
        "expert_parallel_degree": plan.ep, "expert_tensor_parallel_degree": plan.etp,
        "enable_async_tensor_parallel": stack.overlap_tp}
    ac = {"mode": plan.recompute, "selective_ac_option": "op" if plan.recompute == "selective" else None}
    if plan.recompute == "full" and plan.recompute_layers:  # every N-th of the rank's blocks (_apply_ac_to_transformer_
        # block's ac_freq counts the blocks it wraps, across the rank's model parts)
        ac = {"mode": "selective", "selective_ac_option": str(model.num_layers // plan.pp // plan.recompute_layers)}
    expressed = ("overlap_tp", "cp_comm") + (("fp8_scaling",) if fp8 else ())
    # [compile] enable: torch.compile's regions (a compiled stack) or its fused element-wise kernels (a fused one),
    # torchtitan's one way to either; what reading it implies of the other fields, the comment says otherwise
    enable = stack.compiled or stack.fusion_mode.fused
    implied = {"fusion": "fused" if enable else "eager", "compiled": enable,
               "region_host": TORCH_COMPILE_REGION_HOST if enable else 0.0}
    carried = carried_stack_fields(stack, _PRESET, expressed + tuple(implied))
    carried |= {k: getattr(stack, k) for k, v in implied.items() if getattr(stack, k) != v}
    note = comment(carried, {"zero": plan.zero} if plan.dp == 1 else {})
    table, experimental, about = _model(model, fp8)
    lines = [f"# torchtitan job config for {model.name} ({plan.num_gpus} GPUs), written by meshplan for {_RELEASE}",
             f"# launch: {torchrun(plan, '-m torchtitan.train --job.config_file THIS_FILE.toml')}"]
    lines += [f"# {note}"] if note else []
    lines += [f"# {line}" for line in about]
    lines += _table("job", {"description": f"{model.name} {plan.describe()}"})
    lines += _table("model", table) + (_table("experimental", experimental) if experimental else [])
    lines += _table("float8", {"recipe_name": "tensorwise"}) if fp8 else []
    lines += _table("optimizer", {"name": _OPTIMIZERS[plan.optimizer]})
    lines += _table("training", training) + _table("parallelism", parallelism)
    lines += _table("activation_checkpoint", ac) + _table("compile", {"enable": enable})
    return "\n".join(lines)


def _model(model: ModelSpec, fp8: bool) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The [model] and [experimental] tables and the comment lines that say what the model is (torchtitan_models)."""
    found = registered(model)
    lines: list[str] = []
    if found is None:
        name, flavour, definition = custom(model)
        module = module_name(model)
        lines = [f"flavour {flavour!r} is meshplan's: save the lines between the markers (without their '# ') as "
                 f"{module}.py on PYTHONPATH; [experimental] custom_import registers it",
                 f"---- {module}.py ----", *definition, f"---- end of {module}.py ----"]
    else:
        name, flavour = found
    table: dict[str, Any] = {"name": name, "flavor": flavour, "hf_assets_path": PLACEHOLDER_ASSETS}
    if fp8:
        table["converters"] = ["float8"]
    about = [f"model: torchtitan {name} / {flavour}; hf_assets_path is a placeholder: the folder of the model's "
             "tokenizer (torchtitan's scripts/download_hf_assets.py)", *notes(model, name)]
    return table, {"custom_import": module_name(model)} if found is None else {}, about + lines


def _read(text: str, model: ModelSpec, gpus: int) -> tuple[Plan, Stack]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"torchtitan config: {e}") from None
    extra_stack, extra_plan = parse_comment([ln.strip().lstrip("#") for ln in text.splitlines()
                                             if ln.strip().startswith("#")])
    par, train = _section(data, "parallelism"), _section(data, "training")
    tp, pp, cp = (_int(par, f"{k}_parallel_degree", 1, "parallelism") for k in ("tensor", "pipeline", "context"))
    dp = data_parallel(gpus, _NAME, tp=tp, pp=pp, cp=cp)
    replicate = _int(par, "data_parallel_replicate_degree", 1, "parallelism")
    shard = _int(par, "data_parallel_shard_degree", -1, "parallelism")
    _check_dp(dp, replicate, shard)
    if replicate > 1 and (shard if shard > 0 else dp // replicate) > 1:
        raise refuse(_NAME, "data_parallel_replicate_degree", replicate, "HSDP (replicate × shard) is not modelled")
    values = Values(par, "torchtitan config: parallelism")  # its options refused unless torchtitan takes them
    reshard = values.choice("fsdp_reshard_after_forward", "default", ("default", "always", "never"))
    zero = _zero(reshard, replicate, pp)
    schedules = {v: k for k, v in _SCHEDULES.items()}
    schedule = values.text("pipeline_parallel_schedule", "1F1B")
    if schedule not in schedules:
        raise refuse(_NAME, "pipeline_parallel_schedule", schedule, f"meshplan models {', '.join(schedules)}")
    per_stage = _int(par, "pipeline_parallel_layers_per_stage", 0, "parallelism")
    vpp = model.num_layers // (per_stage * pp) if per_stage and pp > 1 else 1
    local = _int(train, "local_batch_size", 8, "training")
    micro = _int(par, "pipeline_parallel_microbatch_size", 1, "parallelism") if pp > 1 else local
    global_batch = _int(train, "global_batch_size", -1, "training")
    ac = Values(_section(data, "activation_checkpoint"), "torchtitan config: activation_checkpoint")
    mode, option = ac.choice("mode", "selective", ("none", "selective", "full")), ac.text("selective_ac_option", "2")
    # torchtitan's selective recompute is op_sac (Supports.recompute_modules); an integer option N recomputes every
    # N-th block of a rank in full
    recompute: dict[str, Any] = {"recompute": mode} | ({"recompute_modules": _OP_SAC} if mode == "selective" else {})
    if mode == "selective" and option != "op":
        if not option.isdigit() or int(option) < 1:
            raise SpecError(f"torchtitan config: activation_checkpoint.selective_ac_option = {option!r} must be "
                            "\"op\" or a positive integer")
        layers = model.num_layers // pp
        count = layers // int(option)  # none when N exceeds the rank's blocks; all (recompute_layers 0) when N = 1
        recompute = {"recompute": "full" if count else "none", "recompute_layers": 0 if count == layers else count}
    converters = _section(data, "model").get("converters", [])
    if not isinstance(converters, list):
        raise SpecError(f"torchtitan config: model.converters = {converters!r} must be a list")
    plan = Plan(**{**dict(
        dp=dp, tp=tp, pp=pp, cp=cp, ep=_int(par, "expert_parallel_degree", 1, "parallelism"),
        etp=_int(par, "expert_tensor_parallel_degree", 1, "parallelism"), vpp=vpp, sequence_parallel=tp > 1,
        micro_batch=micro, global_batch=global_batch if global_batch > 0 else local * dp, zero=zero,
        schedule=schedules[schedule],
        precision="fp8" if "float8" in converters else "bf16",
        grad_bytes=2 if Values(train, "torchtitan config: training").choice(
            "mixed_precision_reduce", "float32", ("float32", "bfloat16")) == "bfloat16" else 4,
        optimizer=_optimizer(_section(data, "optimizer")), **recompute), **extra_plan})
    compiled = Values(_section(data, "compile"), "torchtitan config: compile").flag("enable", False)  # stack.py
    extra_stack = {"compiled": compiled, "region_host": TORCH_COMPILE_REGION_HOST if compiled else 0.0,
                   "fusion": "fused" if compiled else "eager",
                   **extra_stack}  # the meshplan comment's say outranks what [compile] implies
    stack = load_stack(_PRESET).with_(
        overlap_tp=values.flag("enable_async_tensor_parallel", False),
        cp_comm={v: k for k, v in _ROTATE.items()}[values.choice(
            "context_parallel_rotate_method", "allgather", tuple(_ROTATE.values()))], **extra_stack)
    return plan, stack


def _optimizer(table: dict[str, Any]) -> str:
    """[optimizer] name: torchtitan's Adam or AdamW (its default)."""
    name = Values(table, "torchtitan config: optimizer").text("name", "AdamW")
    names = {v: k for k, v in _OPTIMIZERS.items()}
    if name not in names:
        raise refuse(_NAME, "optimizer.name", name, "its build_optimizers takes Adam and AdamW")
    return names[name]


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, dict):
        raise SpecError(f"torchtitan config: [{name}] must be a table, not {table!r}")
    return table


def _int(table: dict[str, Any], key: str, default: int, section: str) -> int:
    """An integer option (TOML integers only: torchtitan's dataclass fields are ints)."""
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"torchtitan config: {section}.{key} = {value!r} must be an integer")
    return value


def _check_dp(dp: int, replicate: int, shard: int) -> None:
    """torchtitan's ParallelDims: replicate x shard is the data-parallel size gpus / (tp·pp·cp), a shard degree of
    -1 taking what the others leave (torchtitan/distributed/parallel_dims.py, _validate)."""
    if replicate < 1 or shard == 0 or shard < -1:
        raise SpecError(f"torchtitan config: data_parallel_replicate_degree = {replicate} must be >= 1 and "
                        f"data_parallel_shard_degree = {shard} -1 or >= 1")
    if (shard > 0 and replicate * shard != dp) or dp % replicate:
        raise SpecError(f"torchtitan config: data_parallel_replicate_degree x data_parallel_shard_degree = "
                        f"{replicate} x {shard} must be the data-parallel size {dp} (gpus / (tp·pp·cp))")


TORCHTITAN = ConfigFormat(name=_NAME, preset=_PRESET, suffixes=(".toml",), markers=("[parallelism]", "[training]"),
                      emit=_emit, read=_read)
