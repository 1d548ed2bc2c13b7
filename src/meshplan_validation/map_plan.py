"""A published record's parallel configuration → (Plan, Stack): its source's defaults (sources.py), the layout
(map_layout.py), the training settings (map_training.py) and the stack's kernels and overlaps (map_kernels.py), every
unstated setting filled with a note saying so, in that order; then the costs the stack adds and the plan's check.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from meshplan.specs.check import check, fsdp_has_zero
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan_validation import recipes, recipes_dispatch, recipes_off
from meshplan_validation.layouts import end_stage_layers, one_layer_chunks
from meshplan_validation.map_kernels import (
    attention_kernel,
    graphs,
    kernels,
    overlap_dp,
    param_gather,
    recipe_settings,
    tensor_parallel,
)
from meshplan_validation.map_layout import batches, interleaving, parallel_sizes
from meshplan_validation.map_training import (
    finetune,
    fp8_scaling,
    precision_of,
    recompute,
    zero_stage,
    zero_under_pipeline,
)
from meshplan_validation.skip import Skip
from meshplan_validation.source_automodel import config_chunks
from meshplan_validation.source_internevo import internevo_plan, internevo_sync
from meshplan_validation.source_megatron_jan2021 import least_fused_batch
from meshplan_validation.sources import SourceDefaults, source_defaults


def map_plan(record: dict[str, Any], model: ModelSpec, cluster: Cluster) -> tuple[Plan, Stack, list[str]]:
    """The record's parallel configuration as a Plan and the stack that ran it, every unstated setting filled from
    its source's defaults (sources.py, recipes.py) with a note saying so."""
    src = source_defaults(record)
    notes = [f"defaults: {src.name}"] + ([record["_borrowed"]] if record.get("_borrowed") else [])
    layout = _layout(record, model, cluster.num_gpus, src, notes)
    training, scaling = _training(record, model, layout, src, notes)
    settings, stack_settings = _stack_settings(record, model, layout, training, src, notes)
    plan = Plan(**layout, **training, **settings, schedule="interleaved" if layout["vpp"] > 1 else "1f1b")
    base = src.stack
    stack = base.with_(**stack_settings, fp8_scaling=scaling,
                       # FSDP prepares the gradients every micro-batch; torchtitan's FSDP2 under pipeline parallelism
                       # (ZeRO-1 above) reduces them once per step, on the last micro-batch: not charged
                       fsdp=base.fsdp if fsdp_has_zero(base.fsdp, training["zero"]) else "none",
                       varlen_attention=base.varlen_attention and stack_settings["flash_attention"],
                       overlap_pp=base.overlap_pp and layout["vpp"] > 1)
    notes += stack_notes(plan, stack, src, model)
    reasons = check(model, cluster, plan, stack)
    if reasons:
        raise Skip("plan rejected: " + "; ".join(reasons))
    return plan, stack, notes


def _layout(record: dict[str, Any], model: ModelSpec, n: int, src: SourceDefaults, notes: list[str]
            ) -> dict[str, int]:
    """The Plan's sizes (map_layout.py): dp, tp, pp, cp, ep, etp, the batches and the virtual pipeline stages."""
    p = record.get("parallel") or {}
    dp, tp, pp, cp, ep, etp = parallel_sizes(p, model, n, notes, str(record.get("framework") or ""), src)
    least = partial(least_fused_batch, model, tp) if src.fused_batch else None
    mbs, gbs = batches(record, src, dp, pp, notes, model.seq_length, least)
    chunks, why = one_layer_chunks(record, model, pp)
    if chunks:
        notes.append(f"interleaved schedule with V = {chunks} one-layer model chunks a rank (not stated; {why})")
        p = p | {"vp": chunks}
    vpp = config_chunks(record, model.num_layers, pp, notes) or interleaving(
        p, model, pp, (gbs // (dp * mbs)) % pp == 0, notes, src)
    return {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "etp": etp, "micro_batch": mbs, "global_batch": gbs,
            "vpp": vpp}


def _training(record: dict[str, Any], model: ModelSpec, layout: dict[str, int], src: SourceDefaults,
              notes: list[str]) -> tuple[dict[str, Any], str]:
    """The Plan's precision, ZeRO stage, recompute and end-stage layers (map_training.py, layouts.py), and the
    stack's fp8 scaling."""
    p, pp = record.get("parallel") or {}, layout["pp"]
    precision = precision_of(record, notes)
    scaling = fp8_scaling(record, src, precision, notes)
    zero, zero_note = zero_under_pipeline(*zero_stage(p, src), pp, src)
    notes.append(zero_note)
    mode, layers, modules, rc_note = recompute(record, p, model, pp, src)
    notes.append(rc_note)
    first_layers, last_layers, layout_note = end_stage_layers(record, model, pp, layout["vpp"])
    notes += [layout_note] if layout_note else []
    return {"precision": precision, "zero": zero, "recompute": mode, "recompute_layers": layers,
            "recompute_modules": modules, "first_stage_layers": first_layers,
            "last_stage_layers": last_layers}, scaling


def _stack_settings(record: dict[str, Any], model: ModelSpec, layout: dict[str, int], training: dict[str, Any],
                    src: SourceDefaults, notes: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rest of the Plan (sequence parallelism, fine-tuning, gradient bytes, offload) and the Stack's settings
    that depart from its source's (map_kernels.py)."""
    p, precision, zero = record.get("parallel") or {}, training["precision"], training["zero"]
    sp, overlap_tp = tensor_parallel(record, src, layout["tp"], precision, notes)
    dp_overlap = overlap_dp(p, src, notes)
    gather = param_gather(record, zero, dp_overlap, notes)
    mode, lora_rank, lora_targets = finetune(record, p, src, notes)
    # Composer FSDP mixed_precision PURE: bf16 reduce; DeepSpeed's fp16 engine: fp16 gradients (SourceDefaults)
    pure = str(p.get("mp_mode") or "").upper() == "PURE"
    grad_bytes = 2 if pure or (src.fp16_grads and precision == "fp16") else src.grad_bytes
    flash, fusion = kernels(record, model, src, notes)
    overlap_ep, expert_gemm, offload_layers, flex = recipe_settings(record, model, layout["ep"], notes)
    kernel = attention_kernel(record, src, flash, precision, notes)
    factor, padded, drop_note = recipes.token_drop(record, model)
    notes += [drop_note] if drop_note else []
    dglu, dglu_note = recipes_off.dglu_slowdown(record)
    notes += [dglu_note] if dglu_note else []
    permute_note = recipes_dispatch.permute_unfused(record, model)
    notes += [f"MoE permutation in eager PyTorch gathers ({permute_note})"] if permute_note else []
    plan = {"sequence_parallel": sp, "finetune": mode, "lora_rank": lora_rank, "lora_targets": lora_targets,
            "grad_bytes": grad_bytes, "offload_activations": offload_layers > 0, "offload_layers": offload_layers,
            "moe_expert_capacity_factor": factor, "moe_pad_expert_input_to_capacity": padded,
            **internevo_plan(record, layout["dp"], zero, notes)}  # its ZeRO group, its bf16 gradients
    stack = {"overlap_tp": overlap_tp, "overlap_dp": dp_overlap, "overlap_param_gather": gather,
             "overlap_ep": overlap_ep, "flash_attention": flash,
             "attention_kernel": kernel, "fusion": fusion, "expert_gemm": expert_gemm,
             "cuda_graphs": graphs(record, src, notes), "dglu_slowdown": dglu,
             **({"moe_dispatcher": "flex", "flex_backend": flex} if flex else {}),
             **({"moe_permute": "gather_scatter"} if permute_note else {}),
             **internevo_sync(record, zero, notes)}  # after overlap_param_gather: it may turn it off
    return plan, stack


def stack_notes(plan: Plan, stack: Stack, src: SourceDefaults, model: ModelSpec) -> list[str]:
    """The costs the source's stack adds to the plan, each with the op that charges it or why."""
    flash = "flash" if stack.flash_attention else "unfused"
    stated = [
        (stack.overlap_pp, "pipeline sends overlapped with the next chunk's compute",
         f"{src.name}: overlap_p2p_comm with an interleaved schedule"),
        (True, f"grad bytes {plan.grad_bytes}, DP overlap {'on' if stack.overlap_dp else 'off'}, {flash} attention",
         ""),
        (stack.varlen_attention, "FlashAttention through flash-attn's unpad_input / pad_input copies in every layer",
         f"{src.name}; attention.varlen_padding"),
        (stack.qkv_concat, "the q, k, v gradients concatenated back into the fused QKV projection's",
         f"{src.name}; attention.qkv_concat"),
        (stack.fsdp != "none", f"{stack.fsdp.upper()} prepares each micro-batch's gradients for the reduce-scatter",
         f"{src.name}; fsdp.fsdp_grad_bytes"),
        (stack.train_metrics > 0, f"{stack.train_metrics} training-metric cross-entropies over the logits per "
         "micro-batch", f"{src.name}: its trainer evaluates training metrics over every micro-batch's logits"),
        (model.is_moe, "MoE routing balanced", "the NVIDIA tables force-balance it"),
        (plan.pp > 1 and stack.pipeline_runtime == "torch", "torch.distributed.pipelining keeps every micro-batch's "
         "receive buffers and stage outputs (the last stage's logits) until the step ends",
         f"{src.name}; memory.pipeline_runtime_memory"),
    ]
    return [f"{text} ({why})" if why else text for on, text, why in stated if on]
