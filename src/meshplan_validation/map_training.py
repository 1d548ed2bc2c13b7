"""A published record's training settings → the Plan's precision (and the stack's fp8 scaling), ZeRO stage, activation
recompute and fine-tuning mode: as the record's text states them (patterns.py), else the release's recipe
(recipes.py), else its source's default (sources.py), each with a note.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.cost.records import LOW_PRECISION_BYTES
from meshplan.specs.model import ModelSpec
from meshplan_validation import recipes
from meshplan_validation.patterns import (
    BLOCK_LEVEL,
    FP8_CURRENT_TEXT,
    FSDP_TEXT,
    NO_RECOMPUTE,
    NO_SHARDING,
    PRECISIONS,
    RECOMPUTE_REMARKS,
    ZERO1_TEXT,
    ZERO_STAGE,
)
from meshplan_validation.recipes_remat import recipe_remat
from meshplan_validation.records import NEGATIVE, number, positive_int
from meshplan_validation.sources import SourceDefaults


# ---- precision ---------------------------------------------------------------------------------------------------
def precision_of(record: dict[str, Any], notes: list[str]) -> str:
    """The GEMM precision the record's precision text names (patterns.PRECISIONS), else bf16."""
    text = str(record.get("precision") or "").lower()
    for pattern, precision in PRECISIONS:
        if re.search(pattern, text):
            if precision in LOW_PRECISION_BYTES:
                notes.append(f"{precision} GEMMs at the {precision} peak, the rest in bf16")
            return precision
    notes.append(f"precision {text or 'not stated'}: bf16 assumed")
    return "bf16"


def fp8_scaling(record: dict[str, Any], src: SourceDefaults, precision: str, notes: list[str]) -> str:
    """Per-tensor fp8 scales: as the record's precision text says, else the source's default. Block-wise fp8
    (128-element blocks, DeepSeek-V3 style) finds each block's scale inside its cast kernel: no separate amax
    pass, priced as delayed scaling."""
    if precision != "fp8":
        return "delayed"
    text = str(record.get("precision") or "").lower()
    if "block" in text:
        notes.append("fp8 block-wise scaling: each block's scale is found inside the cast (priced as delayed "
                     "scaling, no amax pass)")
        return "delayed"
    stated = "delayed" if "delayed" in text else "current" if FP8_CURRENT_TEXT.search(text) else None
    notes.append(f"fp8 {stated or src.stack.fp8_scaling} scaling"
                 + (" (stated)" if stated else f" ({src.name} default)"))
    return stated or src.stack.fp8_scaling


# ---- optimizer sharding ------------------------------------------------------------------------------------------
def zero_stage(p: dict[str, Any], src: SourceDefaults) -> tuple[int, str]:
    """The ZeRO stage and its note: a stage number, the sharding the ``zero_or_fsdp`` text names (DeepSpeed /
    Megatron-DeepSpeed "ZeRO-3", FSDP's strategies, a distributed optimizer), else the source's default."""
    raw = p.get("zero_or_fsdp")
    stage_number = None if isinstance(raw, bool) else number(raw)
    if isinstance(stage_number, (int, float)) and stage_number in (0, 1, 2, 3):
        return int(stage_number), f"ZeRO-{int(stage_number)} (stated)"
    text = str(raw or "").lower()
    if NO_SHARDING.match(text):
        return 0, "no optimizer or parameter sharding (stated)"
    stage = ZERO_STAGE.search(text)
    if stage:  # DeepSpeed / Megatron-DeepSpeed wording: "ZeRO-3", "zero stage 2", "zero_stage: 1"
        z = int(stage.group(1))
        return z, f"ZeRO-{z} (stated)"
    if "shard_grad_op" in text:
        return 2, "ZeRO-2 (FSDP SHARD_GRAD_OP)"
    if FSDP_TEXT.search(text) and "fsdp=0" not in text:
        return 3, "ZeRO-3 (FSDP full shard)"
    if ZERO1_TEXT.search(text) or p.get("distributed_optimizer") is True:
        return 1, "ZeRO-1 (distributed optimizer)"
    if p.get("distributed_optimizer") is False:
        return 0, "no optimizer sharding (stated)"
    return src.zero, f"ZeRO-{src.zero} (not stated; {src.name} default)"


def zero_under_pipeline(zero: int, note: str, pp: int, src: SourceDefaults) -> tuple[int, str]:
    """ZeRO-2/3 with pipeline parallelism runs as ZeRO-1: gradients reduced once per step, the optimizer state
    sharded."""
    if zero < 2 or pp == 1:
        return zero, note
    if src.name == "torchtitan":
        return 1, ("FSDP2 with pipeline parallelism as ZeRO-1: torchtitan keeps the stage's weights unsharded across "
                   "micro-batches (reshard_after_forward=False) and syncs gradients on the last micro-batch only; the "
                   "optimizer state stays sharded")
    return 1, (f"{note}, with pipeline parallelism as ZeRO-1 (gradients reduced once per step, the optimizer state "
               "sharded): DeepSpeed's PipelineEngine asserts ZeRO stage < 2 (ZeRO-2/3 and pipeline parallelism are "
               "incompatible there), and PyTorch's stacks (torchtitan, Llama 3's) keep a stage's weights unsharded "
               "over its micro-batches and sync gradients on the last one")


# ---- recompute ---------------------------------------------------------------------------------------------------
def recompute(record: dict[str, Any], p: dict[str, Any], model: ModelSpec, pp: int, src: SourceDefaults
              ) -> tuple[str, int, tuple[str, ...], str]:
    """(mode, layers, selective modules, note): as the record states it, else the release's recipe (recipes.py, and
    recipes_remat.py for the stacks outside Megatron), else the source's default."""
    core = ("core_attn",)
    raw = p.get("activation_recompute")
    raw = "" if raw is None else str(raw).lower()
    text = RECOMPUTE_REMARKS.sub("", raw).strip()
    layers = -(-model.num_layers // pp)
    if not src.timed_recompute:
        return "none", 0, core, f"recompute as stated, but {src.name}'s times hold none of it (sources.py)"
    if "(layer)" in text:
        half = max(1, layers // 2)
        return "full", half, core, (f"torchtitan selective AC (layer) as full recompute of every other layer "
                                    f"({half} of {layers})")
    if "(op)" in text or (src.name == "torchtitan" and text == "selective"):
        return "selective", 0, ("op_sac",), ("torchtitan selective AC (op): per-op SAC, every second matmul and the "
                                             "element-wise ops recomputed, the attention kernel's output kept")
    # the setting, then its remark in parentheses: "none (checkpoint=False)" is none (InternEvo's TGS table: its
    # doc/en/train_performance.md @3a665e88 "the training configuration had ... checkpoint=False"), not a checkpoint
    head = text.split("(", 1)[0].strip()
    if text in NEGATIVE or head in NEGATIVE or NO_RECOMPUTE.search(text):
        return "none", 0, core, "no activation recompute (stated)"
    if "selective" in text and BLOCK_LEVEL.search(text):
        every = every_nth_block(record)
        if every:
            n = max(1, layers // every)
            return "full", n, core, (f"fms-fsdp's selective AC as full recompute of every {_ordinal(every)} block "
                                     f"({n} of {layers}; {BLOCK_LEVEL_WHY})")
    if "selective" in text:
        return "selective", 0, core, "selective recompute of the attention core (stated)"
    if "full" in text or text in ("true", "yes", "on", "enabled", "1") or "checkpoint" in text:
        return "full", 0, core, "full activation recompute (stated)"
    modules, why = recipes.recompute_modules(record)
    if modules:
        return "selective", 0, modules, why
    remat = recipe_remat(record)
    if remat:
        mode, modules, why = remat
        return mode, 0, modules or core, why
    return src.recompute, 0, core, f"recompute {src.recompute} (not stated; {src.name} default)"


# fms-fsdp's "selective" activation checkpointing is not Megatron's: whole blocks, every n-th of them
# (foundation-model-stack/fms-fsdp fms_fsdp/policies/ac_handler.py apply_fsdp_checkpointing: "we apply ac on p of
# the total blocks ... evenly spaced"; the PyTorch blog 'Maximizing training throughput using PyTorch FSDP',
# 2024-03-13: "checkpoint every n blocks"). n is in no table; the run's own HFU over MFU gives it, HFU counting the
# recomputed forward passes (the blog: "the PyTorch FLOP counter") and MFU not: a block's forward is a third of its
# forward and backward, so HFU / MFU = 1 + f / 3 with f the share of blocks recomputed, and n = round(1 / f)
BLOCK_LEVEL_WHY = "n from the record's HFU / MFU = 1 + f / 3, f = 1 / n the share recomputed; fms-fsdp ac_handler.py"


def every_nth_block(record: dict[str, Any]) -> int:
    """n of a block-level selective checkpoint (every n-th block recomputed) from the record's HFU and MFU, else 0."""
    measured = record.get("measured") or {}
    hfu, mfu = number(measured.get("hfu_pct")), number(measured.get("mfu_pct"))
    if not hfu or not mfu or hfu <= mfu:
        return 0
    share = min(1.0, 3 * (hfu / mfu - 1))
    return max(1, round(1 / share))


def _ordinal(n: int) -> str:
    return {1: "", 2: "second", 3: "third"}.get(n, f"{n}th")


# ---- fine-tuning -------------------------------------------------------------------------------------------------
def finetune(record: dict[str, Any], p: dict[str, Any], src: SourceDefaults, notes: list[str]
             ) -> tuple[str, int, str]:
    """(mode, LoRA rank, LoRA targets) of the record's task: full training for pretraining and SFT, LoRA of the stated
    rank (else 32) on the source's default targets."""
    task = record.get("task", "pretrain")
    if task == "sft":
        notes.append("SFT evaluated as pretraining on full-length (packed) sequences")
    if task != "lora":
        return "full", 32, "all"
    stated_rank = positive_int(p.get("lora_rank") or p.get("lora_dim") or (record.get("model") or {}).get("lora_rank"))
    lora_rank = stated_rank or 32
    targets = src.lora_targets
    where = "QKV, attention output, fc1, fc2" if targets == "all" else f"the QKV projection only ({src.name} default)"
    notes.append(f"LoRA rank {lora_rank}" + ("" if stated_rank else " (not stated: Megatron-Bridge / NeMo "
                 "LoRA default dim 32)") + f" on {where}; base weights frozen")
    return "lora", lora_rank, targets
