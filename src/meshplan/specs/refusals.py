"""Refusals: plans a framework refuses to run, each read from the framework's own validation code at a version.

A stack preset's ``[supports]`` table names the refusals of its framework (``refuses = [...]``); the search leaves
their plans out and tallies them under the refusal's reason (search/refused.py), ``Supports.problems`` names them
for one plan. Each refusal cites the file, the lines and the installed version whose check raises (or silently
drops the setting), and quotes the text the test (tests/test_framework_refusals.py) finds at those lines; where the
check runs on a CPU, the test also builds the framework's own object with the plan's settings and expects its error.

A test takes a plan-like (a Plan, or the search's grid view: the same fields as NumPy arrays that broadcast), the
model and the stack, and returns a bool (array): it uses ``&``, ``|``, comparisons and ``_no`` only, never ``and``,
``or`` or ``not``, so that one definition serves one plan and a million.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshplan.specs.model import ModelSpec

_MCORE = ("megatron-core", "0.16.1")
_TITAN = ("torchtitan", "0.2.2")
_DS = ("deepspeed", "0.19.8")
# Megatron-LM's megatron/training at tag core_v0.17.0: PyPI's megatron-core 0.17.0 wheel ships it (.ci/parsers.py
# unpacks it for tests/test_framework_refusals.py; the dev extra's megatron-core 0.16.1 has megatron/core only)
_MLM = ("megatron-lm", "core_v0.17.0")
_ARGS = "megatron/training/arguments.py"


def _no(value: Any) -> Any:
    """Logical not of a bool or a bool array (``~`` on a Python bool is an integer)."""
    return np.logical_not(value)


@dataclass(frozen=True)
class Refusal:
    """One plan a framework refuses: ``what`` it refuses (the search's rejection reason), where its code says so
    (``package`` at ``version``, ``path`` relative to the package's site-packages folder, ``lines``), the ``quote``
    found there, and the ``test`` of a plan-like."""

    name: str
    what: str
    package: tuple[str, str]  # (distribution, version)
    path: str
    lines: tuple[int, int]
    quote: str
    test: Callable[[Any, ModelSpec, Any], Any]
    # False: not the framework's refusal but a rule of meshplan's own check (specs/check.py) stated on plan-likes for
    # the search (stack_refusals); its reason is check's, ``what`` alone
    by_framework: bool = True

    @property
    def source(self) -> str:
        return f"{self.package[0]} {self.package[1]} {self.path}:{self.lines[0]}-{self.lines[1]}"

    def reason(self, framework: str) -> str:
        return f"{framework} refuses {self.what}" if self.by_framework else self.what


def _offloaded_every_layer(p: Any, m: ModelSpec, s: Any) -> Any:
    """cpu_offloading_num_layers must be below num_layers: offloading a stage's every layer (offload_layers 0, or
    as many as the stage holds) with one stage offloads them all."""
    per_stage = -(-m.num_layers // p.pp)
    return p.offload_activations & (p.pp == 1) & ((p.offload_layers == 0) | (p.offload_layers >= per_stage))


def _first(p: Any) -> Any:
    """The first stage's layers (0: even): the search's grids do not vary it, so their views have none."""
    return getattr(p, "first_stage_layers", 0)


_TC = "megatron/core/transformer/transformer_config.py"
_PARALLELIZE = "torchtitan/models/llama3/infra/parallelize.py"

REFUSALS: dict[str, Refusal] = {r.name: r for r in (
    # ---- Megatron-Core 0.16.1 -------------------------------------------------------------------------------
    Refusal("offload_with_pp", "activation offload with pp > 1", _MCORE, _TC, (1144, 1147),
            "no support for Pipeline parallelism with CPU offloading",
            lambda p, m, s: p.offload_activations & (p.pp > 1)),
    Refusal("offload_with_recompute", "activation offload with recompute", _MCORE, _TC, (1149, 1152),
            "CPU offloading does not work when activation recomputation is enabled",
            lambda p, m, s: p.offload_activations & (p.recompute != "none")),
    Refusal("offload_every_layer", "activation offload of every layer (cpu_offloading_num_layers < num_layers)",
            _MCORE, _TC, (1137, 1142), "CPU offloading can be done only for layers less than",
            _offloaded_every_layer),
    Refusal("moe_tp_without_sp", "MoE with tp > 1 without sequence parallelism", _MCORE,
            "megatron/core/transformer/moe/moe_layer.py", (379, 383),
            "are enabled without also enabling sequence parallelism.",
            lambda p, m, s: m.is_moe & (p.tp > 1) & _no(p.sequence_parallel)),
    Refusal("moe_bias_with_etp", "MoE linear biases with etp > 1", _MCORE, _TC, (1589, 1591),
            "Bias in Moe is only supported when ETP==1",
            lambda p, m, s: m.is_moe & m.linear_bias & (p.etp > 1)),
    Refusal("precision_aware_without_distributed", "bf16 Adam moments without the distributed optimizer (ZeRO-1)",
            _MCORE, "megatron/core/optimizer/optimizer_config.py", (375, 381),
            "--use-precision-aware-optimizer only supported with distributed optimizer",
            lambda p, m, s: (p.optimizer == "adam-bf16") & (p.zero == 0)),
    Refusal("uneven_stages_not_divisible_by_vpp", "an uneven first or last stage that vpp does not divide", _MCORE,
            _TC, (1369, 1402), "must be divisible by virtual pipeline",
            lambda p, m, s: (p.vpp > 1) & (((_first(p) % p.vpp) != 0) | ((p.last_stage_layers % p.vpp) != 0))),
    Refusal("cuda_graphs_with_offload", "CUDA graphs with activation offload", _MCORE, _TC, (1722, 1723),
            "CUDA graphs not supported with CPU offloading.",
            lambda p, m, s: s.cuda_graphs & p.offload_activations),
    Refusal("cuda_graphs_with_full_recompute", "CUDA graphs of layers with full recompute", _MCORE, _TC,
            (1780, 1784), "full recompute is only supported with full iteration CUDA graph.",
            lambda p, m, s: s.cuda_graphs & (p.recompute == "full")),
    # ---- Megatron-LM core_v0.17.0 (pretrain_gpt.py's validate_args: megatron/training/arguments.py) -----------
    # the CPU offload needs --use-precision-aware-optimizer, which runs adam with the distributed optimizer only
    # (megatron-core 0.16.1 megatron/core/optimizer/optimizer_config.py:375-381)
    Refusal("optimizer_offload_needs_precision_aware", "optimizer offload without the distributed optimizer's Adam",
            _MLM, _ARGS, (1488, 1492),
            "The optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`",
            lambda p, m, s: p.offload_optimizer & ((p.zero == 0) | (p.optimizer == "sgd")
                                                   | (p.optimizer == "sgd-momentum"))),
    Refusal("layers_not_divisible_by_pp", "num_layers not divisible by pp without an uneven first or last stage",
            _MLM, _ARGS, (817, 830), "Number of layers should be divisible by the pipeline-model-parallel size",
            # a custom --pipeline-model-parallel-layout (Plan.stage_layers) takes the other branch (arguments.py:773)
            lambda p, m, s: ((m.num_layers % p.pp) != 0) & (p.vpp == 1) & (_first(p) == 0)
            & (p.last_stage_layers == 0) & (not getattr(p, "stage_layers", ()))),
    Refusal("tp_overlap_without_sp", "TP communication overlap without sequence parallelism", _MLM, _ARGS,
            (1201, 1202), "Tensor parallel communication/GEMM overlap can happen only when sequence parallelism",
            lambda p, m, s: s.overlap_tp & (p.tp > 1) & _no(p.sequence_parallel)),
    Refusal("interleaved_needs_pp", "virtual pipeline stages with pp = 1 (pp = 2 without p2p overlap)", _MLM, _ARGS,
            (832, 841), "When interleaved schedule is used",
            lambda p, m, s: (p.vpp > 1) & (p.pp <= np.where(s.overlap_pp, 1, 2))),
    # ---- torchtitan 0.2.2 -----------------------------------------------------------------------------------
    Refusal("tp_without_sp", "tp > 1 without sequence parallelism (its TP plan shards the norms' sequence)",
            _TITAN, _PARALLELIZE, (219, 233), '"attention_norm": SequenceParallel(),',
            lambda p, m, s: (p.tp > 1) & _no(p.sequence_parallel)),
    Refusal("seq_not_divisible", "seq_length not divisible by tp * 2 * cp", _TITAN,
            "torchtitan/distributed/parallel_dims.py", (365, 372), "return self.tp * (self.cp * 2)",
            lambda p, m, s: (m.seq_length % (p.tp * 2 * p.cp)) != 0),
    Refusal("ddp_with_model_parallel", "ZeRO-0 (DDP) with tp, pp or cp > 1", _TITAN, _PARALLELIZE, (146, 151),
            "DDP has not supported > 1D parallelism",
            lambda p, m, s: (p.zero == 0) & (p.dp > 1) & ((p.tp > 1) | (p.pp > 1) | (p.cp > 1))),
    # FSDP2 under pipeline parallelism: the stage's units stay gathered and their gradients whole over the step's
    # micro-batches (its "default" policy; 9dec370, the 2024-12 benchmarks' commit, had no other: parallelize_llama.py
    # :326-329 "For PP, do not reshard after forward"), and torch's pipelining syncs them once (torch 2.13.0
    # torch/distributed/pipelining/stage.py:844-848 backward_maybe_with_nosync: set_reshard_after_backward(False),
    # set_requires_gradient_sync(False) every micro-batch; :1164-1191 perform_reduce_grad: one post_backward, the
    # reduce-scatter and the reshard, after the last): meshplan's ZeRO-1 under the torch runtime
    # (memory.chunk_gradient_share). Its "always" under PP regathers every forward yet leaves each unit gathered
    # after every backward: neither ZeRO-3's memory nor its traffic, not priced (configs/torchtitan.py refuses it).
    # ZeRO-1 at pp = 1 is FSDP's own rule, not torchtitan's: check's reason (FsdpMode.has_zero; fsdp_stages below)
    Refusal("fsdp_stage_under_pp", "ZeRO-2 or ZeRO-3 with pp > 1 (its FSDP2 keeps a pipeline stage's weights gathered "
            "and gradients whole over the micro-batches: ZeRO-1)",
            _TITAN, _PARALLELIZE, (325, 327), "reshard_after_forward = not pp_enabled",
            lambda p, m, s: (p.pp > 1) & (p.zero >= 2)),
    Refusal("experts_not_over_tp", "MoE experts sharded other than over tp (ep = 1) or over tp or nothing (ep > 1)",
            _TITAN, "torchtitan/models/llama4/infra/parallelize.py", (559, 563),
            "experts_mesh = tp_mesh",
            lambda p, m, s: m.is_moe & (p.etp != p.tp) & ((p.ep == 1) | (p.etp != 1))),
    # ---- DeepSpeed 0.19.8 -----------------------------------------------------------------------------------
    Refusal("offload_without_zero", "optimizer offload at ZeRO stage 0 (no ZeRO optimizer to offload)", _DS,
            "deepspeed/runtime/config.py", (501, 501), "self.zero_enabled = self.zero_optimization_stage > 0",
            lambda p, m, s: p.offload_optimizer & (p.zero == 0)),
    Refusal("fp32_grads_without_zero", "16-bit weights with fp32 gradient accumulation at ZeRO stage 0", _DS,
            "deepspeed/runtime/engine.py", (2323, 2323), 'raise NotImplementedError(f"unsupported mix of',
            lambda p, m, s: (p.zero == 0) & (p.grad_bytes == 4) & (p.precision != "fp32") & (p.precision != "tf32")),
    Refusal("zero_grads_with_pipeline", "ZeRO-2 or ZeRO-3 with pp > 1 (its pipeline engine)", _DS,
            "deepspeed/runtime/pipe/engine.py", (76, 77),
            "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
            lambda p, m, s: (p.zero >= 2) & (p.pp > 1)),
)}


def refusal_names() -> tuple[str, ...]:
    return tuple(REFUSALS)


def fsdp_zero_reason(fsdp: str, zero: object) -> str:
    """check's reason for a plan at a ZeRO stage its FSDP mode lacks (FsdpMode.has_zero), one plan's or the search's."""
    return f"fsdp={fsdp} has no ZeRO-{zero} strategy (NO_SHARD is zero=0, SHARD_GRAD_OP 2, FULL_SHARD 3)"


def fsdp_stages(mode: Any) -> Refusal:
    """FSDP's own ZeRO stages as a rule on plan-likes (FsdpMode ``mode``'s has_zero over the grid's arrays: a stage it
    lacks, unless pipelined on a runtime that holds FSDP's gradient sync to the last micro-batch), with check's reason:
    the search tests a grid's plans only through refusals, and keeps ZeRO-1 for an FSDP stack whose runtime has
    PipelineRuntime.fsdp_nosync (search/space.py). Its source: the sharding strategies FSDP has (none shards only the
    optimizer state)."""
    return Refusal("fsdp_lacks_zero", fsdp_zero_reason(mode.name, "/".join(map(str, mode.lacks_zero))),
                   ("torch", "2.13.0"), "torch/distributed/fsdp/api.py", (32, 69), "class ShardingStrategy(Enum):",
                   lambda p, m, s: _no(s.fsdp_mode.has_zero(p.zero, (p.pp > 1) & s.pipeline_runtime_mode.fsdp_nosync)),
                   by_framework=False)


def own_rules(stack: Any) -> tuple[Refusal, ...]:
    """The rules of meshplan's own check that ``stack``'s plans are tested with beside its framework's refusals:
    FSDP's ZeRO stages (fsdp_stages: check's reason) where its FSDP lacks one."""
    return (fsdp_stages(stack.fsdp_mode),) if stack.fsdp_mode.lacks_zero else ()


def stack_refusals(stack: Any) -> tuple[Refusal, ...]:
    """The rules a grid of ``stack``'s plans is tested with (search/refused.py, report/space.py), a plan counted
    under the first that refuses it: its framework's refusals (Supports.refuses), then its own_rules."""
    return tuple(REFUSALS[name] for name in stack.supports.refuses) + own_rules(stack)


def refused(names: tuple[str, ...], plan: Any, model: ModelSpec, stack: Any) -> list[Refusal]:
    """The refusals among ``names`` that refuse ``plan`` (one Plan)."""
    return [REFUSALS[n] for n in names if bool(REFUSALS[n].test(plan, model, stack))]
