"""What a published run's stack did, as the Stack's settings: sequence parallelism and the TP, DP and EP communication
overlaps, flash attention and its kernel family, element-wise fusion, the expert-GEMM launch, activation offload and
CUDA graphs. As the record's framework text names them (patterns.py), else the release's recipe (recipes.py), else
its source's default (sources.py), each with a note.
"""

from __future__ import annotations

from typing import Any

from meshplan.configs.megatron_rules import DP_OVERLAP_FLAGS, dp_overlaps
from meshplan.specs.host_cost import tp_hidden
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import FP8_ATTENTION_PRECISIONS
from meshplan_validation import recipes, recipes_dispatch, recipes_off
from meshplan_validation.patterns import (
    FA2_ATTENTION_TEXT,
    FLASH_TEXT,
    FLEX_ATTENTION_TEXT,
    FUSED_ATTENTION_TEXT,
    FUSED_KERNELS_TEXT,
    MEGATRON_ARGUMENT,
    MEGATRON_FLASH_SWITCH,
    NEGATED_KERNEL_TEXT,
    NO_COMPILE_TEXT,
    NO_FLASH_TEXT,
    OVERLAP_TEXT,
    SDPA_TEXT,
    TE_CORE_TEXT,
    TORCH_VERSION,
)
from meshplan_validation.records import flag
from meshplan_validation.sources import SDPA_CUDNN_FROM, SourceDefaults


# ---- communication -----------------------------------------------------------------------------------------------
def tensor_parallel(record: dict[str, Any], src: SourceDefaults, tp: int, precision: str, notes: list[str]
                    ) -> tuple[bool, bool]:
    """Sequence parallelism and TP communication overlap: as stated, else the release's recipe where it departs from
    its source's default (recipes_off.TP_OVERLAP_OFF), else that default."""
    p = record.get("parallel") or {}
    sp = p.get("sequence_parallel")
    if sp is None:
        sp = tp > 1 if src.sequence_parallel is None else (src.sequence_parallel and tp > 1)
        if tp > 1:
            notes.append(f"sequence parallelism {'on' if sp else 'off'} (not stated)")
    sp = flag(sp) and tp > 1
    overlap_tp = src.stack.overlap_tp and tp > 1 and precision != "fp4"
    recipe_off = recipes_off.overlap_tp_off(record)
    if p.get("async_tp") is not None:
        overlap_tp = flag(p["async_tp"]) and tp > 1
    elif recipe_off and tp > 1:
        overlap_tp = False
        notes.append(f"TP communication exposed ({recipe_off})")
    elif tp > 1:
        notes.append(f"TP communication {'overlapped' if overlap_tp else 'exposed'} (not stated)")
    if tp > 1 and overlap_tp and not tp_hidden(src.stack.with_(overlap_tp=True), sp):
        notes.append(f"TP communication exposed: {src.stack.name} turns its overlap off without sequence parallelism")
    return sp, overlap_tp


def overlap_dp(p: dict[str, Any], src: SourceDefaults, notes: list[str]) -> bool:
    """Data-parallel communication overlapped with compute: the source's default, or on where the record's
    optimizer text states an overlap (Megatron-LLaMA's OverlappedDistributedOptimizer, Megatron-LM's
    --overlap-param-gather) over a source whose default is off."""
    text = str(p.get("zero_or_fsdp") or "")
    if not src.stack.overlap_dp and OVERLAP_TEXT.search(text):
        notes.append(f"DP communication overlapped (stated: {text!r})")
        return True
    return src.stack.overlap_dp


def param_gather(record: dict[str, Any], zero: int, dp_overlap: bool, notes: list[str]) -> bool:
    """The distributed optimizer's weight all-gather overlapped with the first forward (Stack.overlap_param_gather): as
    Megatron-LM reads the arguments the record's parallel configuration states (store_true: off unless given,
    configs/megatron_rules.dp_overlaps), where it states a data-parallel overlap flag; else off where the release's
    recipe leaves it off (recipes_off.PARAM_GATHER_OFF); else on, the tables' recipes' value."""
    stated = stated_arguments(record)
    if stated & {flag for _, flag in DP_OVERLAP_FLAGS}:
        overlapped, why = dp_overlaps(stated)["overlap_param_gather"], "stated arguments without --overlap-param-gather"
    else:
        why = recipes_off.param_gather_off(record)
        overlapped = not why
    if not overlapped and dp_overlap and zero in (1, 2):
        notes.append(f"weight all-gather after the optimizer step, before the first forward pass ({why})")
    return overlapped


def stated_arguments(record: dict[str, Any]) -> set[str]:
    """The Megatron-LM arguments (``--name``) the record's parallel configuration names as given: its overlap and
    optimizer-sharding fields (the notes, which also list what a run leaves out, are not read)."""
    p = record.get("parallel") or {}
    return {m.group() for key in ("overlap", "zero_or_fsdp") for m in MEGATRON_ARGUMENT.finditer(str(p.get(key) or ""))}


def graphs(record: dict[str, Any], src: SourceDefaults, notes: list[str]) -> bool:
    """CUDA graphs as the release's recipe captures them (recipes.CUDA_GRAPHS), else the source's stack's."""
    graphed, note = recipes.cuda_graphs(record)
    if graphed is None:
        return src.stack.cuda_graphs
    notes.append(note)
    return graphed


def recipe_settings(record: dict[str, Any], model: ModelSpec, ep: int, notes: list[str]
                    ) -> tuple[bool, str, int, str]:
    """EP all-to-all overlap, expert-GEMM launch, activation offload and flex dispatcher backend ("" where the
    source's dispatcher) of the release's recipe (recipes.py, recipes_dispatch.py)."""
    overlap_ep, ep_note = recipes.overlap_ep(record, model, ep)
    if ep_note and ep > 1:
        notes.append(ep_note)
    flex, flex_note = recipes_dispatch.dispatcher(record, model, ep)
    if flex_note:
        notes.append(flex_note)
    expert_gemm, expert_note = recipes.expert_gemm(record, model)
    if expert_note:
        notes.append(expert_note)
    offload_layers, offload_note = recipes.cpu_offload(record)
    if offload_note:
        notes.append(offload_note)
    return overlap_ep, expert_gemm, offload_layers, flex


# ---- kernels -----------------------------------------------------------------------------------------------------
def kernels(record: dict[str, Any], model: ModelSpec, src: SourceDefaults, notes: list[str]) -> tuple[bool, str]:
    """Flash attention (as the framework text says, else the source's default, unless learnable sinks predate the
    release's fused kernel) and element-wise fusion."""
    flash = _flash_attention(_attention_text(record), src, notes)
    found = recipes.release(record)
    if flash and model.attention_sinks and found is not None and found < recipes.FUSED_SINK_ATTENTION_FROM:
        flash = False
        notes.append("unfused attention: learnable attention sinks reach TE's fused kernel from TE 2.8 with cuDNN "
                     "9.13.1 (TransformerEngine PR #2148), which this release's container predates")
    elif flash and model.attention_sinks:
        notes.append("learnable attention sinks in cuDNN's fused kernel (TE 2.8+ with cuDNN 9.13.1+: "
                     "TransformerEngine PR #2148; the NeMo image's cuDNN, NVIDIA-NeMo/RL#1685)")
    fusion = src.stack.fusion
    if fusion == "eager":
        text = f"{record.get('notes', '')} {record.get('framework', '')}"
        fused = None if NO_COMPILE_TEXT.search(text) else FUSED_KERNELS_TEXT.search(text)
        fusion = "fused" if fused else "eager"
        notes.append(f"element-wise kernels fused ({fused.group(0)!r} stated)" if fused
                     else "element-wise kernels in eager PyTorch (one kernel per aten op)")
    elif fusion == "fused" and model.mlp == "relu2" and (why := recipes_off.eager_activation(record)):
        fusion = "fused-eager-act"
        notes.append(f"squared-ReLU activation as eager PyTorch ops, relu then pow ({why})")
    elif src.stack.fusion_mode.norm_upcast:
        notes.append("element-wise kernels in eager PyTorch (one kernel per aten op), the norms apex's fused RMSNorm "
                     "on fp32 upcasts of the residual, RoPE flash-attn's rotary kernel (the source's stack)")
    elif src.stack.fusion_mode.library_norm:
        notes.append("element-wise kernels in eager PyTorch (one kernel per aten op), the norms Transformer Engine's "
                     "fused RMSNorm (the source's stack)")
    return flash, fusion


def _attention_text(record: dict[str, Any]) -> str:
    """The framework text without the kernels it negates ("no TE")."""
    return NEGATED_KERNEL_TEXT.sub(" ", str(record.get("framework") or ""))


def _flash_attention(text: str, src: SourceDefaults, notes: list[str]) -> bool:
    switch_only = MEGATRON_FLASH_SWITCH.search(text) and not NO_FLASH_TEXT.search(MEGATRON_FLASH_SWITCH.sub(" ", text))
    if switch_only and TE_CORE_TEXT.search(text):
        notes.append("flash attention: Megatron's --use-flash-attn switch is off, but Megatron-Core's Transformer "
                     "Engine layer spec runs TEDotProductAttention, which picks its fused backend itself "
                     "(patterns.MEGATRON_FLASH_SWITCH)")
        return True
    if NO_FLASH_TEXT.search(text):
        if src.stack.flash_attention:
            notes.append("unfused attention (the framework text turns flash attention off)")
        return False
    if not src.stack.flash_attention and FLASH_TEXT.search(text):
        notes.append(f"flash attention (named by the framework text; {src.name} default: unfused)")
        return True
    return src.stack.flash_attention


def attention_kernel(record: dict[str, Any], src: SourceDefaults, flash: bool, precision: str, notes: list[str]
                     ) -> str:
    """The stack's flash-attention kernel family: the one its framework text names, else its source profile's; or
    cuDNN's FP8 attention where the release's recipe turns it on (recipes.FP8_ATTENTION) and the run's precision
    allows it."""
    fp8, note = recipes.fp8_attention(record)
    if fp8 and flash and precision in FP8_ATTENTION_PRECISIONS:
        notes.append(note)
        return "fp8"
    text = _attention_text(record)
    te_flash = recipes_off.te_fused_attention_off(record)
    if te_flash and flash:
        notes.append(f"attention kernel: fa2 class (Transformer Engine's FlashAttention backend: {te_flash})")
        return "fa2"
    named = ("fa2" if FLEX_ATTENTION_TEXT.search(text) else "fused" if FUSED_ATTENTION_TEXT.search(text)
             else "fa2" if FA2_ATTENTION_TEXT.search(text) else None)
    if named is None and (src.sdpa or SDPA_TEXT.search(text)):
        named = _sdpa_kernel(text, src, notes)
    if named and named != src.stack.attention_kernel and flash:
        notes.append(f"attention kernel: {named} class (named by the framework text)")
        return named
    return src.stack.attention_kernel


def _sdpa_kernel(text: str, src: SourceDefaults, notes: list[str]) -> str | None:
    """PyTorch SDPA's kernel on Hopper and Blackwell by the PyTorch release the text names (sources.SDPA): cuDNN's
    from SDPA_CUDNN_FROM, FlashAttention-2 before; an unnamed release leaves the source's default, or FlashAttention-2
    where SDPA is named outside an SDPA-based profile."""
    version = TORCH_VERSION.search(text)
    if version is None:
        return None if src.sdpa else "fa2"
    release = (int(version.group(1)), int(version.group(2)))
    if release >= SDPA_CUDNN_FROM:
        notes.append(f"SDPA on PyTorch {release[0]}.{release[1]}: cuDNN's kernel first on Hopper and Blackwell "
                     "(sources.SDPA_CUDNN_FROM)")
        return "fused"
    return "fa2"
