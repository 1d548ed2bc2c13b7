"""Megatron-LM's optimizer arguments, written and read (configs/megatron.py's script; option names and defaults of
megatron/training/arguments.py at tag core_v0.17.0):

- the distributed optimizer: ``--use-distributed-optimizer`` (ZeRO-1) and ``--num-distributed-optimizer-instances``
  (type int, default 1, arguments.py:2735: the dp·cp ranks split into that many instances, each sharding the
  optimizer state over its dp·cp/I ranks, megatron-core parallel_state.py ``initialize_model_parallel``):
  Plan.distributed_optimizer_instances, written where it is above 1;
- the optimizer: Megatron's adam is the default and not written; adam-bf16 is the precision-aware optimizer with bf16
  moments; sgd-momentum ``--optimizer sgd`` (momentum 0.9), sgd ``--optimizer sgd --sgd-momentum 0``; the CPU offload
  rides on the precision-aware optimizer (configs/megatron.py's module docstring).
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.common import refuse
from meshplan.errors import SpecError
from meshplan.specs.plan import Plan

_NAME = "megatron"
_INSTANCES = "--num-distributed-optimizer-instances"


def distributed_optimizer_args(plan: Plan) -> list[tuple[str, Any]]:
    """The distributed optimizer's arguments: on at ZeRO-1, with its instances where there are several."""
    instances = plan.distributed_optimizer_instances
    return [("--use-distributed-optimizer", plan.zero == 1), (_INSTANCES, instances if instances > 1 else None)]


def distributed_optimizer(options: dict[str, Any]) -> dict[str, int]:
    """The Plan's ZeRO stage and distributed-optimizer instances of a script's ``options``."""
    value = options.get(_INSTANCES, 1)
    try:
        instances = int(value)
    except (TypeError, ValueError):
        raise SpecError(f"megatron config: {_INSTANCES} {value} must be an integer") from None
    return {"zero": int("--use-distributed-optimizer" in options), "distributed_optimizer_instances": instances}


def optimizer_args(plan: Plan) -> list[tuple[str, Any]]:
    """The optimizer's arguments (module docstring): none for Adam, Megatron's default; the precision-aware
    optimizer for bf16 moments and under the CPU offload."""
    if plan.optimizer in ("adam-8bit", "adafactor"):
        raise refuse(_NAME, "optimizer", plan.optimizer, "its optimizers are adam (fp32, bf16 or fp16 moments) and sgd")
    aware = plan.optimizer == "adam-bf16" or plan.offload_optimizer
    if aware and plan.optimizer.startswith("sgd"):
        raise refuse(_NAME, "offload_optimizer", True, "its CPU offload rides on the precision-aware optimizer, "
                     "which runs adam only (megatron/core/optimizer/optimizer_config.py)")
    if aware and plan.zero != 1:
        what = "optimizer" if plan.optimizer == "adam-bf16" else "offload_optimizer"
        raise refuse(_NAME, what, getattr(plan, what), "its precision-aware optimizer (bf16 moments, CPU offload) "
                     f"needs the distributed optimizer (zero=1, got zero={plan.zero})")
    if plan.optimizer == "adam-bf16":
        return [("--use-precision-aware-optimizer", True), ("--exp-avg-dtype", "bf16"), ("--exp-avg-sq-dtype", "bf16")]
    if plan.optimizer.startswith("sgd"):
        return [("--optimizer", "sgd"), ("--sgd-momentum", 0 if plan.optimizer == "sgd" else None)]
    return [("--use-precision-aware-optimizer", True)] if aware else []


def optimizer_of(options: dict[str, Any]) -> str:
    """The optimizer of ``--optimizer``, ``--sgd-momentum`` and the precision-aware optimizer's moment dtypes."""
    name = options.get("--optimizer", "adam")
    if name == "sgd":
        try:
            momentum = float(options.get("--sgd-momentum", 0.9))
        except ValueError:
            raise SpecError(f"megatron config: --sgd-momentum {options['--sgd-momentum']} must be a number") from None
        return "sgd" if momentum == 0 else "sgd-momentum"
    if name != "adam":
        raise refuse(_NAME, "optimizer", name, "meshplan reads adam and sgd")
    if "--use-precision-aware-optimizer" not in options:
        return "adam"
    dtypes = (options.get("--exp-avg-dtype", "fp32"), options.get("--exp-avg-sq-dtype", "fp32"))
    moments = {("fp32", "fp32"): "adam", ("bf16", "bf16"): "adam-bf16"}
    if dtypes not in moments:
        raise refuse(_NAME, "exp_avg_dtype", "/".join(dtypes), "meshplan prices fp32 or bf16 moments, both alike")
    return moments[dtypes]
