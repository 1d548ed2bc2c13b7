"""Validation against published, measured training runs (``shared/validation/published_runs.jsonl`` schema).

Each record is mapped to a (ModelSpec, Cluster, Plan); every value the source does not state is filled with a
documented default of that source's framework and release, and the run carries that assumption as text.
The prediction is compared on the basis the source measured: iteration time or tokens/s where given
(exact conversions); otherwise TFLOP/s or MFU, converted with *that source's* FLOP formula (never meshplan's).

Signed error = predicted / measured − 1 of the measured metric. For a time (``iteration_time_s``) a positive
error means meshplan predicts a slower step; for a throughput (tokens/s, TFLOP/s, MFU) a faster one.

Symbols: B global batch (sequences), s sequence length, l layers, h hidden, V vocabulary, N GPUs.

FLOP formulas of the sources (used only to convert their published TFLOP/s or MFU):
- Narayanan et al. 2021, eq. 3 (counts the recomputed forward pass, 4 passes): 96·B·s·l·h²·(1 + s/6h + V/16lh).
  Used by the Megatron-LM README tables of 2021 and by BLOOM's "hardware TFLOPs".
- Megatron-LM ``num_floating_point_operations`` (model FLOPs, 3 passes; equal to NeMo's ``flops_formulas``
  for Llama/GPT and to Korthikanti et al. 2022's 72·B·s·l·h²·(1 + s/6h + V/12lh) for GPT):
  12·B·s·l·h²·[(1 + K/A + s/h)·(A·d/h) + (F/h)·k·g + (F_shared/h)·g + V/(2lh)], g = 3/2 for SwiGLU else 1.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from meshplan.cost.records import LOW_PRECISION_BYTES
from meshplan.errors import MeshplanError, PlanError, SpecError
from meshplan.fields import MAX_SIZE
from meshplan.specs.check import check, fsdp_has_zero
from meshplan.specs.efficiency import DEFAULT, Efficiency
from meshplan.specs.hardware import Cluster, load_system
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_load import load_model, preset_names
from meshplan.specs.plan import FP8_ATTENTION_PRECISIONS, Plan
from meshplan.specs.stack import Stack
from meshplan.units import GiB
from meshplan_validation import recipes
from meshplan_validation.recipes import SourceDefaults, source_defaults
from meshplan_validation.record_fields import (
    batch_from_tokens,
    convention,
    family_key,
    family_sizes,
    heads_from_head_dim,
    size_problems,
    unstated_model_parallel,
    with_unread,
)
from meshplan_validation.records import (
    NEGATIVE,
    UNSTATED_WORDS,
    clean_record,
    flag,
    number,
    positive_int,
    read_runs,
    unstated_settings,
)

# ---- records ------------------------------------------------------------------------------------------------


class Skip(Exception):
    """A run that cannot be evaluated; the message is the reason shown in the report."""


def in_fit_set(run_id: str) -> bool:
    """The fixed half of the runs the efficiency constants were fitted on: CRC-32 of the id is even.

    A hash split (rather than a split by group) puts every source and GPU on both sides; the other half is
    the out-of-sample check. See efficiency.py and docs/ACCURACY.md.
    """
    return zlib.crc32(run_id.encode()) % 2 == 0


# ---- model --------------------------------------------------------------------------------------------------
_SIZE_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "head_dim")
_MOE_FIELDS = {"num_experts": "num_experts", "moe_topk": "moe_topk", "moe_ffn_hidden_size": "moe_ffn_hidden_size",
               "shared_expert_ffn": "shared_expert_ffn_size"}
_PRESETS: dict[str, ModelSpec] = {}


def _presets() -> dict[str, ModelSpec]:
    if not _PRESETS:
        _PRESETS.update({name: load_model(name) for name in preset_names()})
    return _PRESETS


def _norm_name(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower().replace(".1", "").replace("llama3.1", "llama3"))


def _name_score(record_name: str, preset: str) -> float:
    """Similarity of a record's model name to a preset name (longest common substring share)."""
    a, b = _norm_name(record_name), _norm_name(preset)
    best = 0
    for i in range(len(a)):
        for j in range(i + best + 1, len(a) + 1):
            if a[i:j] in b:
                best = j - i
            else:
                break
    return best / max(len(b), 1)


NAME_SUFFIXES = re.compile(r"[-_ ]?(instruct|chat|base|hf|it|v\d+(\.\d+)?)$", re.I)


def preset_by_name(name: str) -> str | None:
    """The preset a record names when it gives no sizes: equal names once case, separators and a trailing
    "-Instruct" / "-hf" / "-v0.1" are dropped ("Llama-2-7b-hf" → llama2-7b; "GPT-2 XL" is not gpt2)."""
    stripped = name.strip()
    while True:  # the name as given first ("DeepSeek-V3" is a preset), then without one suffix more each time
        key = _norm_name(stripped)
        found = [p for p in _presets() if _norm_name(p) == key]
        if found:
            return found[0] if len(found) == 1 else None
        if not NAME_SUFFIXES.search(stripped):
            return None
        stripped = NAME_SUFFIXES.sub("", stripped)


def map_model(m: dict[str, Any]) -> tuple[ModelSpec, list[str]]:
    """The preset whose sizes equal the record's (ties broken by vocabulary, then name), with the record's
    own sequence length and vocabulary; a record whose sizes match no preset is built from its own fields, with the
    sizes its family's convention fixes where it leaves them out (record_fields.family_sizes)."""
    problems = size_problems(m)
    if problems:
        raise Skip("; ".join(problems))
    name = m.get("name") or "model"
    notes: list[str] = []
    if m.get("num_layers") is None or m.get("hidden_size") is None or m.get("num_heads") is None:
        preset = preset_by_name(str(name))
        if preset is None:
            m = heads_from_head_dim(m, notes)
            missing = [f"model.{k}" for k in ("num_layers", "hidden_size", "num_heads") if m.get(k) is None]
            if missing:
                named = f"no preset named {name!r}" if m.get("name") else "model.name missing"
                raise Skip(f"model sizes not recorded: {', '.join(missing)} missing and {named} "
                           f"({m.get('arch_source') or 'no architecture source'})")
        else:
            spec = _presets()[preset]
            fields = {k: k for k in _SIZE_FIELDS} | {"vocab_size": "vocab_size"} | (
                _MOE_FIELDS if spec.is_moe else {})
            m = {k: v for k, v in m.items() if v is not None} | {
                k: getattr(spec, f) for k, f in fields.items() if m.get(k) is None}
    given = {k: m[k] for k in _SIZE_FIELDS if m.get(k) is not None}
    moe = {f: m[k] for k, f in _MOE_FIELDS.items() if m.get(k) is not None}
    candidates = []
    for preset, spec in _presets().items():
        if any(getattr(spec, k) != v for k, v in given.items()):
            continue
        if any(getattr(spec, f) != v for f, v in moe.items()) or (spec.is_moe != bool(moe.get("num_experts"))):
            continue
        vocab_match = m.get("vocab_size") is not None and spec.vocab_size == m["vocab_size"]
        candidates.append((vocab_match, _name_score(name, preset), preset, spec))
    if candidates:
        _, _, preset, spec = max(candidates, key=lambda c: (c[0], c[1]))
        missing = [k for k in ("ffn_hidden_size", "num_kv_heads", "vocab_size") if m.get(k) is None]
        notes.append(f"model: preset {preset} (sizes match the record"
                     + (f"; {', '.join(missing)} from the preset" if missing else "") + ")")
        if m.get("seq_length") is None:
            notes.append(f"seq_length {spec.seq_length} from preset {preset} (not recorded)")
    else:
        spec = _model_from_record(m, notes)
        notes.append(f"model: built from the record's sizes (no preset matches {name}); "
                     f"{spec.mlp} MLP, {spec.norm}, untied, no biases assumed")
    if m.get("vocab_size") is not None and m["vocab_size"] != spec.vocab_size:
        notes.append(f"vocab {m['vocab_size']} as recorded (preset {spec.vocab_size})")
        spec = replace(spec, vocab_size=int(m["vocab_size"]))
    seq = m.get("seq_length")
    if seq is not None and seq != spec.seq_length:
        spec = spec.with_seq_length(int(seq))
    return spec, notes


def _family_value(name: str, attr: str) -> tuple[int, str] | None:
    """(value, where from) of a size the presets of the model's family (record_fields.family_key) agree on."""
    key = family_key(name)
    family = sorted(p for p in _presets() if key and family_key(p) == key)
    values = {getattr(_presets()[p], attr) for p in family}
    return (values.pop(), f"the {key} family's presets ({', '.join(family)})") if len(values) == 1 else None


def _model_from_record(m: dict[str, Any], notes: list[str]) -> ModelSpec:
    """A Llama-like spec from a record's own sizes. SwiGLU unless F = 4h (the GeLU GPT MLP). A MoE record that
    gives only the experts' FFN size (every layer MoE) uses it for F too; ``head_dim`` where the heads do not split
    the hidden size evenly (GPT-OSS: 64 heads of 64 on a hidden size of 2880). Sizes its family's convention fixes
    are filled where it leaves them out (record_fields.family_sizes), each with a note in ``notes``."""
    name = m.get("name")
    m, derived = family_sizes(m, _family_value(str(name or ""), "vocab_size"))
    notes += derived
    h, f = int(m["hidden_size"]), m.get("ffn_hidden_size")
    if f is None and m.get("num_experts"):
        f = m.get("moe_ffn_hidden_size")
    missing = [k for k, v in (("ffn_hidden_size", f), ("vocab_size", m.get("vocab_size"))) if v is None]
    missing += ["moe_topk"] if m.get("num_experts") and not m.get("moe_topk") else []
    seq = m.get("seq_length") or _family_value(str(name or ""), "seq_length")
    missing += [] if seq else ["seq_length"]
    missing += ["num_kv_heads"] if m.get("num_kv_heads") is None else []  # MHA or GQA: not guessed
    if missing:
        fam = convention(m)
        fixes = (f"the {fam.family} convention does not fix it" if fam else
                 f"no family convention or preset family ({family_key(str(name or ''))!r}) fixes it")
        raise Skip(f"model {name}: {', '.join('model.' + k for k in missing)} not recorded, no preset matches its "
                   f"sizes and {fixes}")
    if isinstance(seq, tuple):
        notes.append(f"seq_length {seq[0]} from {seq[1]} (not recorded)")
        seq = seq[0]
    heads, head_dim = int(m["num_heads"]), int(m.get("head_dim") or 0)
    if not head_dim and h % heads:
        raise Skip(f"model {name}: num_heads={heads} does not divide hidden_size={h} and head_dim is not "
                   "recorded")
    if int(m["num_kv_heads"]) and heads % int(m["num_kv_heads"]):
        raise Skip(f"model {name}: num_kv_heads={m['num_kv_heads']} does not divide num_heads={heads}")
    gelu = int(f) == 4 * h
    kw: dict[str, Any] = {}
    if m.get("num_experts"):
        kw = {"num_experts": int(m["num_experts"]), "moe_topk": int(m["moe_topk"]),
              "moe_ffn_hidden_size": int(m.get("moe_ffn_hidden_size") or f),
              "shared_expert_ffn_size": int(m.get("shared_expert_ffn") or 0)}
    return ModelSpec(name=str(name), num_layers=int(m["num_layers"]), hidden_size=h, num_heads=heads,
                     num_kv_heads=int(m.get("num_kv_heads") or 0), head_dim=head_dim, ffn_hidden_size=int(f),
                     vocab_size=int(m["vocab_size"]), seq_length=int(seq),
                     mlp="gelu" if gelu else "swiglu", norm="layernorm" if gelu else "rmsnorm", **kw)


# ---- hardware -----------------------------------------------------------------------------------------------
# GPU name (as the source prints it) → system preset. Ordered: the first pattern that matches wins.
GPU_SYSTEMS: tuple[tuple[str, str], ...] = (
    (r"GB300", "gb300"),
    (r"GB200", "gb200"),
    (r"GH200", "gh200"),
    (r"B300", "b300"),
    (r"B200", "b200"),
    (r"H200", "h200"),
    (r"H800", "h800"),
    (r"A800", "a800"),
    (r"H20(?!\d)", "h20"),  # H20, 8xH20; not H200 / GH200
    (r"MI250X", "mi250x"),  # one GCD per GPU, as ROCm counts them
    (r"MI300X?\b", "mi300x"),
    (r"MI325X", "mi325x"),
    (r"MI355X", "mi355x"),
    (r"L40S", "l40s"),
    (r"H100.*PCI", "h100-pcie"),
    (r"H100.*96\s*GB", "h100-96gb"),
    (r"H100", "h100"),
    (r"A100.*40\s*GB", "a100-40gb"),
    (r"A100", "a100"),
    (r"V100", "v100"),
)

# The inter-node network a record's ``interconnect`` text states, where it differs from the preset's. Rates are per
# direction; a count of NICs or links is per server unless the text says per GPU.
# Omni-Path links run at 100 Gb/s (Intel Omni-Path Architecture 100 series), ConnectX-6 HCAs at HDR's 200 Gb/s.
NETWORK_TEXT: tuple[tuple[str, str, bool, int | None], ...] = (  # (regex, what it counts, per server, Gb/s each)
    (r"(\d+)\s*[x\u00d7]\s*(\d+)\s*gb(?:ps|/s|it)?", "count x rate per server", True, None),  # "4 x 100Gb RoCE"
    (r"(\d+)\s*(?:omni-?path\s+)?links per node", "Omni-Path links per server", True, 100),  # BLOOM's Jean Zay
    (r"(\d+)\s*connectx-6\b", "ConnectX-6 HCAs per server", True, 200),
    (r"(\d+)\s*gb(?:ps|/s)?\s*per gpu", "rate per GPU", False, None),
)


def _network(text: str, per_node: int) -> tuple[dict[str, float], str]:
    """(nics_per_gpu, nic_bandwidth in B/s) overrides and their note, from the record's interconnect text; none when
    it states no count and rate. Without a rate of its own, a match's rate is its group 2 (count x rate) or, per GPU,
    its group 1."""
    for pattern, kind, per_server, rate in NETWORK_TEXT:
        found = re.search(pattern, text, re.I)
        if not found:
            continue
        count = int(found.group(1))
        nics = count / per_node if per_server else 1.0
        gbps = rate or (int(found.group(2)) if per_server else count)
        if nics <= 0 or gbps <= 0:
            return {}, ""
        why = (f"network as stated ({found.group(0).strip()!r}): {nics:g} NIC of {gbps} Gb/s per GPU"
               + (f" ({kind}, {per_node} GPUs per server)" if per_server else ""))
        return {"nics_per_gpu": nics, "nic_bandwidth": gbps * 1e9 / 8}, why
    return {}, ""


SERVER_DOMAIN = 8  # an NVLink domain this small is one server's baseboard (HGX / DGX / OAM), not a rack (NVL72)


def map_cluster(hw: dict[str, Any]) -> tuple[Cluster, list[str]]:
    gpu, n = str(hw.get("gpu") or ""), positive_int(hw.get("num_gpus"))
    if not n:
        given = hw.get("num_gpus")
        raise Skip("number of GPUs not recorded: hardware.num_gpus" + (
            " missing" if given is None else f"={given!r} is not a whole number from 1 to {MAX_SIZE}")
            + ", and neither hardware.num_nodes × gpus_per_node nor parallel.dp (× tp × pp × cp) gives it")
    preset = next((p for pattern, p in GPU_SYSTEMS if re.search(pattern, gpu, re.I)), None)
    if preset is None:
        raise Skip(f"no system preset for GPU {gpu!r} (hardware.gpu)" if gpu else "hardware.gpu missing")
    system = load_system(preset)
    notes = [f"hardware: {preset} preset"]
    if preset == "a100" and not re.search(r"80\s*GB", gpu, re.I):
        notes.append("A100 memory size not stated: 80 GB assumed")
    domain = system.network.nvlink_domain
    n, per_node = int(n), positive_int(hw.get("gpus_per_node"))
    _count_note(preset, n, per_node, notes)
    overrides: dict[str, Any] = {}
    network, why = _network(str(hw.get("interconnect") or ""), per_node or min(domain, SERVER_DOMAIN))
    if network:
        overrides.update(network)
        notes.append(why)
    if per_node and per_node < domain <= SERVER_DOMAIN:  # one server's NVLink domain, bigger than the record's servers
        overrides["nvlink_domain"] = domain = per_node
        notes.append(f"NVLink domain {per_node} (the record's servers hold {per_node} GPUs; the preset's {preset} "
                     f"server {system.network.nvlink_domain})")
    if n > domain and n % domain:
        per_node = per_node or 1
        fitting = [d for d in range(domain, 0, -1) if n % d == 0 and d % per_node == 0] or [math.gcd(n, domain)]
        overrides["nvlink_domain"] = fitting[0]
        notes.append(f"NVLink domain {fitting[0]} ({n} GPUs are not a multiple of {domain}: "
                     f"the largest divisor of the GPU count within one NVLink domain)")
    return system.cluster(n, **overrides), notes


def _count_note(preset: str, n: int, per_node: int | None, notes: list[str]) -> None:
    """How the record's GPUs are counted, where that is in doubt. The MI250X preset is one GCD (ROCm's device, as
    Frontier's and LUMI's papers count); a record of 4 per server may count packages of 2 GCDs, which would halve its
    per-GPU figures against meshplan's: said, not guessed."""
    if preset == "mi250x" and per_node == 4:
        notes.append(f"MI250X: the record's {n} GPUs (4 per server) modelled as GCDs; if it counts packages of 2 "
                     "GCDs, its per-GPU figures are twice a GCD's")


# ---- plan ---------------------------------------------------------------------------------------------------
PRECISIONS: tuple[tuple[str, str], ...] = (  # first match wins, on the source's precision text
    (r"nvfp4|fp4", "fp4"),
    (r"mxfp8", "mxfp8"),
    (r"fp8|float8", "fp8"),
    (r"bf16|bfloat16", "bf16"),
    (r"fp16|float16|16-bit|half", "fp16"),
)


def map_plan(record: dict[str, Any], model: ModelSpec, cluster: Cluster) -> tuple[Plan, Stack, list[str]]:
    """The record's parallel configuration as a Plan and the stack that ran it, every unstated setting filled from
    its source's defaults (recipes.py) with a note saying so."""
    p, src = record.get("parallel") or {}, source_defaults(record)
    notes = [f"defaults: {src.name}"] + ([record["_borrowed"]] if record.get("_borrowed") else [])
    dp, tp, pp, cp, ep, etp = _sizes(p, model, cluster.num_gpus, notes, str(record.get("framework") or ""), src)
    mbs, gbs = _batches(record, src, dp, pp, notes, model.seq_length)
    vpp = _interleaving(p, model, pp, (gbs // (dp * mbs)) % pp == 0, notes, src)
    precision = _precision(record, notes)
    fp8_scaling = _fp8_scaling(record, src, precision, notes)
    zero, zero_note = _zero_under_pipeline(*_zero(p, src), pp, src)
    notes.append(zero_note)
    recompute, layers, modules, rc_note = _recompute(record, p, model, pp, src)
    notes.append(rc_note)
    last_layers, layout_note = recipes.last_stage_layers(record, model, pp, vpp)
    notes += [layout_note] if layout_note else []
    sp, overlap_tp = _tensor_parallel(record, src, tp, precision, notes)
    overlap_dp = _overlap_dp(p, src, notes)
    finetune, lora_rank, lora_targets = _finetune(record, p, src, notes)
    grad_bytes = src.grad_bytes
    if str(p.get("mp_mode") or "").upper() == "PURE":  # Composer FSDP mixed_precision PURE: bf16 reduce
        grad_bytes = 2
    flash, fusion = _kernels(record, model, src, notes)
    overlap_ep, expert_gemm, offload_layers = _recipe_settings(record, model, ep, notes)
    attention_kernel = _attention_kernel(record, src, flash, precision, notes)
    plan = Plan(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, vpp=vpp, sequence_parallel=sp, micro_batch=mbs,
                global_batch=gbs, zero=zero, recompute=recompute, recompute_layers=layers, recompute_modules=modules,
                last_stage_layers=last_layers, precision=precision,
                grad_bytes=grad_bytes, schedule="interleaved" if vpp > 1 else "1f1b",
                finetune=finetune, lora_rank=lora_rank, lora_targets=lora_targets,
                offload_activations=offload_layers > 0, offload_layers=offload_layers)
    base = src.stack
    stack = base.with_(overlap_tp=overlap_tp, overlap_dp=overlap_dp, overlap_ep=overlap_ep, flash_attention=flash,
                       fp8_scaling=fp8_scaling, attention_kernel=attention_kernel, fusion=fusion,
                       # FSDP prepares the gradients every micro-batch; torchtitan's FSDP2 under pipeline parallelism
                       # (ZeRO-1 above) reduces them once per step, on the last micro-batch: not charged
                       expert_gemm=expert_gemm, fsdp=base.fsdp if fsdp_has_zero(base.fsdp, zero) else "none",
                       varlen_attention=base.varlen_attention and flash, overlap_pp=base.overlap_pp and vpp > 1)
    notes += _stack_notes(plan, stack, src, model)
    reasons = check(model, cluster, plan, stack)
    if reasons:
        raise Skip("plan rejected: " + "; ".join(reasons))
    return plan, stack, notes


def _stack_notes(plan: Plan, stack: Stack, src: SourceDefaults, model: ModelSpec) -> list[str]:
    """The costs the source's stack adds to the plan, each with the op that charges it or why."""
    flash = "flash" if stack.flash_attention else "unfused"
    stated = [
        (stack.overlap_pp, "pipeline sends overlapped with the next chunk's compute",
         f"{src.name}: overlap_p2p_comm with an interleaved schedule"),
        (True, f"grad bytes {plan.grad_bytes}, DP overlap {'on' if stack.overlap_dp else 'off'}, {flash} attention",
         ""),
        (stack.varlen_attention, "FlashAttention through flash-attn's unpad_input / pad_input copies in every layer",
         f"{src.name}; ops.varlen_padding"),
        (stack.qkv_concat, "the q, k, v gradients concatenated back into the fused QKV projection's",
         f"{src.name}; ops.qkv_concat"),
        (stack.fsdp != "none", f"{stack.fsdp.upper()} prepares each micro-batch's gradients for the reduce-scatter",
         f"{src.name}; ops.fsdp_grad_bytes"),
        (stack.train_metrics > 0, f"{stack.train_metrics} training-metric cross-entropies over the logits per "
         "micro-batch", f"{src.name}: Composer evaluates the model's train metrics after every backward pass"),
        (model.is_moe, "MoE routing balanced", "the NVIDIA tables force-balance it"),
        (plan.pp > 1 and stack.pipeline_runtime == "torch", "torch.distributed.pipelining keeps every micro-batch's "
         "receive buffers and stage outputs (the last stage's logits) until the step ends",
         f"{src.name}; estimate.pipeline_runtime_memory"),
    ]
    return [f"{text} ({why})" if why else text for on, text, why in stated if on]


def _sizes(p: dict[str, Any], model: ModelSpec, n: int, notes: list[str], framework: str, src: SourceDefaults
           ) -> tuple[int, int, int, int, int, int]:
    """dp, tp, pp, cp, ep, etp: as stated; tp, pp, cp 1 where unstated (said); dp from the GPU count where it is
    unstated or its product with tp, pp and cp is not the GPU count (said); ep as the stack implies, etp for
    expert-parallel MoE as the stack's default (``SourceDefaults.expert_tp_is_tp``)."""
    tp, pp, cp = (positive_int(p.get(k)) or 1 for k in ("tp", "pp", "cp"))
    notes += unstated_model_parallel(p, n)
    dp = positive_int(p.get("dp"))
    if n % (tp * pp * cp):
        raise Skip(f"parallel: tp*pp*cp = {tp}*{pp}*{cp} = {tp * pp * cp} does not divide hardware.num_gpus = {n}")
    if dp is None:
        dp = n // (tp * pp * cp)
        notes.append(f"dp = gpus/(tp*pp*cp) = {dp}" + ("" if p.get("dp") is None else
                                                        f" (dp={p['dp']!r} as recorded is not a positive size)"))
    elif dp * tp * pp * cp != n:
        recorded, dp = dp, n // (tp * pp * cp)
        notes.append(f"dp = gpus/(tp*pp*cp) = {dp} (the recorded dp {recorded} gives dp*tp*pp*cp = "
                     f"{recorded * tp * pp * cp}, not the {n} GPUs recorded)")
    ep = positive_int(p.get("ep")) or _unstated_ep(model, dp, framework, notes)
    etp = positive_int(p.get("etp"))
    if etp is None:
        etp = 1 if ep > 1 and not src.expert_tp_is_tp else tp
        if model.is_moe and ep > 1 and tp > 1:
            notes.append(f"etp = tp = {tp} (expert tensor parallelism not stated; Megatron-Core's default, which "
                         f"{src.name} keeps)" if src.expert_tp_is_tp else
                         "etp = 1 (expert tensor parallelism not stated; Megatron-Bridge's MoE base configs set "
                         "expert_tensor_parallel_size=1, torchtitan's expert_tensor_parallel_degree defaults to 1)")
    return dp, tp, pp, cp, ep, etp


# Expert-parallel all-to-all libraries: a stack that names one runs its experts expert-parallel
EP_DISPATCH_TEXT = re.compile(r"deep[-_ ]?ep|hybrid[-_ ]?ep", re.I)


def _unstated_ep(model: ModelSpec, dp: int, framework: str, notes: list[str]) -> int:
    """Expert parallelism a MoE record leaves unstated: none, unless its stack names an expert-parallel dispatch
    library (DeepEP, HybridEP), which only runs with ep > 1; then the experts spread over the data-parallel ranks,
    as NeMo AutoModel's benchmark configs set it where its table leaves EP blank (gptoss_20b_te_deepep.yaml
    ep_size 8 on 8 GPUs, gptoss_120b_te_deepep.yaml ep_size 64 on 64)."""
    if not model.is_moe:
        return 1
    named = EP_DISPATCH_TEXT.search(framework)
    if not named:
        notes.append("ep 1 (not stated)")
        return 1
    ep = math.gcd(dp, model.num_experts)
    notes.append(f"ep {ep} = dp (not stated; {named.group(0)} dispatches tokens over an expert-parallel group, "
                 "which NeMo AutoModel's benchmark configs set to the data-parallel ranks)")
    return ep


def _batches(record: dict[str, Any], src: SourceDefaults, dp: int, pp: int, notes: list[str], seq: int
             ) -> tuple[int, int]:
    """Micro-batch and global batch (sequences), from what the record states (the global batch in sequences, or in
    tokens, or micro-batch × dp × gradient accumulation) and the source's conventions."""
    p = record.get("parallel") or {}
    gbs = positive_int(p.get("global_batch_size")) or batch_from_tokens(record, seq, notes)
    mbs = positive_int(p.get("micro_batch_size"))
    accum = positive_int(p.get("grad_accum"))
    torchtitan_pp = src.name == "torchtitan" and pp > 1
    if torchtitan_pp and mbs is not None:  # torchtitan's batch_size is per DP rank; PP splits it into pp chunks
        local = mbs
        mbs = max(1, local // pp)
        notes.append(f"torchtitan local batch {local} split into {pp} pipeline micro-batches of {mbs} "
                     "(pipeline_parallel_microbatches not stated; torchtitan's default is pp x stages per rank, "
                     "which is pp for 1F1B. Taken as pp for its interleaved runs too: the paper compares the two "
                     "schedules at one local batch, and its measured 1.28x gain from interleaving is that of "
                     "equal micro-batch counts in meshplan (1.29x), not the 1.51x of twice as many)")
        if gbs is None:
            gbs = local * dp
    if gbs is None and mbs is not None and accum is not None:
        gbs = mbs * dp * accum
        notes.append(f"global batch {gbs} = micro-batch*dp*grad_accum = {mbs}*{dp}*{accum} (not stated)")
    if mbs is None and gbs is not None and accum is not None and gbs % (dp * accum) == 0:
        mbs = gbs // (dp * accum)
        notes.append(f"micro-batch {mbs} = global batch/(dp*grad_accum) = {gbs}/({dp}*{accum}) (not stated)")
    if mbs is None and src.whole_batch and gbs is not None and gbs >= dp:
        mbs = gbs // dp
        notes.append(f"micro-batch {mbs} = global batch / dp (no gradient accumulation in {src.name})")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch 1 (not stated)")
    if gbs is None:
        gbs = dp * mbs
        notes.append(f"global batch {gbs} = dp*micro-batch (not stated)")
    if gbs % (dp * mbs):
        raise Skip(f"parallel.global_batch_size {gbs} is not a multiple of dp*micro_batch_size = {dp}*{mbs} = "
                   f"{dp * mbs} (micro-batches that do not divide the batch are not modelled)")
    return mbs, gbs


def _smallest_interleave(model: ModelSpec, pp: int) -> int:
    """The smallest v > 1 dividing the layers per pipeline stage (1 if none does)."""
    per_stage = -(-model.num_layers // pp)
    return next((d for d in range(2, per_stage + 1) if per_stage % d == 0), 1)


def _interleaving(p: dict[str, Any], model: ModelSpec, pp: int, divisible: bool, notes: list[str],
                  src: SourceDefaults) -> int:
    """Virtual pipeline stages per rank: as stated (at most the layers per stage), inferred from a stated
    interleaved schedule (``divisible``: the micro-batches per pipeline are a multiple of pp), or, where the record
    says nothing of the schedule, its source's default (``SourceDefaults.interleaved``)."""
    vpp = positive_int(p.get("vp")) or 1
    if pp * vpp > model.num_layers:  # Megatron-Core counts the embedding and the loss as pipeline layers
        v = model.num_layers // pp
        notes.append(f"pp*vp = {pp * vpp} > {model.num_layers} layers (Megatron-Core's account_for_embedding/"
                     f"loss_in_pipeline_split): modelled with vp = {v}")
        vpp = v
    schedule_text = str(p.get("pp_schedule") or "").lower()
    if pp > 1 and vpp == 1 and "interleav" in schedule_text:
        vpp = 2
        notes.append("interleaved 1F1B with 2 stages per rank (torchtitan default; v not stated)")
    stated = p.get("interleaved_schedule")
    if pp > 1 and vpp == 1 and stated and not re.search(r"\bno\b|not used|false", str(stated), re.I):
        v = _smallest_interleave(model, pp)
        if v > 1 and divisible:
            vpp = v
            notes.append(f"interleaved schedule with v = {v} (paper: used for large runs, v not stated; "
                         "smallest v dividing the layers per stage)")
    unstated = p.get("vp") is None and not schedule_text and stated is None
    if pp > 1 and vpp == 1 and unstated and src.interleaved and divisible:
        v = _smallest_interleave(model, pp)
        if v > 1:
            vpp = v
            notes.append(f"interleaved schedule with v = {v} (schedule not stated; {src.name}: the interleaved 1F1B "
                         "that large-scale stacks run, with the smallest v dividing the layers per stage)")
    return vpp


def _tensor_parallel(record: dict[str, Any], src: SourceDefaults, tp: int, precision: str, notes: list[str]
                     ) -> tuple[bool, bool]:
    """Sequence parallelism and TP communication overlap: as stated, else the release's recipe where it departs from
    its source's default (recipes.TP_OVERLAP_OFF), else that default."""
    p = record.get("parallel") or {}
    sp = p.get("sequence_parallel")
    if sp is None:
        sp = tp > 1 if src.sequence_parallel is None else (src.sequence_parallel and tp > 1)
        if tp > 1:
            notes.append(f"sequence parallelism {'on' if sp else 'off'} (not stated)")
    sp = flag(sp) and tp > 1
    overlap_tp = src.stack.overlap_tp and tp > 1 and precision != "fp4"
    recipe_off = recipes.overlap_tp_off(record)
    if p.get("async_tp") is not None:
        overlap_tp = flag(p["async_tp"]) and tp > 1
    elif recipe_off and tp > 1:
        overlap_tp = False
        notes.append(f"TP communication exposed ({recipe_off})")
    elif tp > 1:
        notes.append(f"TP communication {'overlapped' if overlap_tp else 'exposed'} (not stated)")
    return sp, overlap_tp


def _overlap_dp(p: dict[str, Any], src: SourceDefaults, notes: list[str]) -> bool:
    """Data-parallel communication overlapped with compute: the source's default, or on where the record's
    optimizer text states an overlap (Megatron-LLaMA's OverlappedDistributedOptimizer, Megatron-LM's
    --overlap-param-gather) over a source whose default is off."""
    text = str(p.get("zero_or_fsdp") or "")
    if not src.stack.overlap_dp and re.search(r"overlap", text, re.I):
        notes.append(f"DP communication overlapped (stated: {text!r})")
        return True
    return src.stack.overlap_dp


def _finetune(record: dict[str, Any], p: dict[str, Any], src: SourceDefaults, notes: list[str]
              ) -> tuple[str, int, str]:
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


# an eager stack whose element-wise work runs fused: compiled, or with the fused norm / activation / rotary kernels
# its text names (Apex, xFormers' SwiGLU, flash-attn's layer norm and rotary, Liger)
FUSED_KERNELS_TEXT = re.compile(
    r"torch\.compile|\bapex\b|\bliger\b|fused\s+(?:layer\s*norm|rms\s*norm|swiglu|rotary|rope|ops|kernels)", re.I)


def _kernels(record: dict[str, Any], model: ModelSpec, src: SourceDefaults, notes: list[str]) -> tuple[bool, str]:
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
        fused = FUSED_KERNELS_TEXT.search(f"{record.get('notes', '')} {record.get('framework', '')}")
        fusion = "fused" if fused else "eager"
        notes.append(f"element-wise kernels fused ({fused.group(0)!r} stated)" if fused
                     else "element-wise kernels in eager PyTorch (one kernel per aten op)")
    return flash, fusion


# The attention kernel a record's stack names (its ``framework`` text), where its source profile would guess:
# FlashAttention-3, cuDNN's fused attention or Transformer Engine's (which runs cuDNN's) are one family ("fused");
# FlashAttention-2, flash-attn's package and xFormers the other ("fa2"). PyTorch's SDPA is either, by release
# (recipes.SDPA_CUDNN_FROM). A negated name ("no TE", "Transformer Engine disabled") names nothing.
FUSED_ATTENTION_TEXT = re.compile(
    r"flash[-_ ]?att(?:entio)?n[-_ ]?v?3|\bfa[-_ ]?v?3\b|cudnn|transformer[-_ ]?engine|\bte\b", re.I)
FA2_ATTENTION_TEXT = re.compile(  # not Transformer Engine's NVTE_FLASH_ATTN switch, which picks among TE's backends
    r"flash[-_ ]?att(?:entio)?n[-_ ]?v?2|\bfa[-_ ]?v?2\b|(?<!nvte_)flash[-_]attn|xformers", re.I)
# PyTorch's FlexAttention: Triton kernels of the FlashAttention-2 algorithm that a score or mask function is compiled
# into, at 90 % of FlashAttention-2's forward and 85 % of its backward (PyTorch blog "FlexAttention: The Flexibility of
# PyTorch with the Performance of FlashAttention", Aug 2024): the FlashAttention-2 class, whatever else the text names
FLEX_ATTENTION_TEXT = re.compile(r"flex[-_ ]?att(?:entio)?n", re.I)
SDPA_TEXT = re.compile(r"\bsdpa\b|scaled[-_ ]dot[-_ ]product[-_ ]attention", re.I)
NEGATED_KERNEL_TEXT = re.compile(
    r"\b(?:no|without|disabled?)\s+(?:te|transformer[-_ ]?engine|cudnn)\b"
    r"|\b(?:te|transformer[-_ ]?engine|cudnn)\s+(?:disabled|off)\b", re.I)
# PyTorch 2.x as a framework text spells it ("PyTorch 2.4", "torch==2.11.0"); not an NGC tag ("PyTorch 24.07")
TORCH_VERSION = re.compile(r"\b(?:py)?torch\s*(?:==|-|v)?\s*(2)\.(\d+)\b", re.I)
# flash attention turned off: flash-attn's or Megatron's switch, Hugging Face's eager attention, or both of
# Transformer Engine's flash and fused backends off (NVTE_FLASH_ATTN=0 alone leaves TE on cuDNN's fused kernel)
NO_FLASH_TEXT = re.compile(
    r"(?<!\w)(?:use_)?flash[-_]?attn\w*\s*[=:]\s*(?:0|false|no|off)\b|--no[-_]flash[-_]?attn"
    r"|\b(?:no|without)\s+flash[-_ ]?att(?:entio)?n|flash[-_ ]?att(?:entio)?n\s+(?:off|disabled)"
    r"|attn_implementation\s*[=:]\s*[\"']?eager"
    r"|nvte_flash_attn\s*=\s*0.*nvte_fused_attn\s*=\s*0|nvte_fused_attn\s*=\s*0.*nvte_flash_attn\s*=\s*0", re.I)
# flash attention turned on where the source's default predates it ("--use-flash-attn-v2", "FlashAttention-2")
FLASH_TEXT = re.compile(r"(?<!nvte_)flash[-_ ]?att(?:entio)?n|\bfa[-_ ]?v?[23]\b", re.I)


def _attention_text(record: dict[str, Any]) -> str:
    return NEGATED_KERNEL_TEXT.sub(" ", str(record.get("framework") or ""))


def _flash_attention(text: str, src: SourceDefaults, notes: list[str]) -> bool:
    if NO_FLASH_TEXT.search(text):
        if src.stack.flash_attention:
            notes.append("unfused attention (the framework text turns flash attention off)")
        return False
    if not src.stack.flash_attention and FLASH_TEXT.search(text):
        notes.append(f"flash attention (named by the framework text; {src.name} default: unfused)")
        return True
    return src.stack.flash_attention


def _attention_kernel(record: dict[str, Any], src: SourceDefaults, flash: bool, precision: str, notes: list[str]
                      ) -> str:
    """The stack's flash-attention kernel family: the one its framework text names, else its source profile's; or
    cuDNN's FP8 attention where the release's recipe turns it on (recipes.FP8_ATTENTION) and the run's precision
    allows it."""
    fp8, note = recipes.fp8_attention(record)
    if fp8 and flash and precision in FP8_ATTENTION_PRECISIONS:
        notes.append(note)
        return "fp8"
    text = _attention_text(record)
    named = ("fa2" if FLEX_ATTENTION_TEXT.search(text) else "fused" if FUSED_ATTENTION_TEXT.search(text)
             else "fa2" if FA2_ATTENTION_TEXT.search(text) else None)
    if named is None and (src.sdpa or SDPA_TEXT.search(text)):
        named = _sdpa_kernel(text, src, notes)
    if named and named != src.stack.attention_kernel and flash:
        notes.append(f"attention kernel: {named} class (named by the framework text)")
        return named
    return src.stack.attention_kernel


def _sdpa_kernel(text: str, src: SourceDefaults, notes: list[str]) -> str | None:
    """PyTorch SDPA's kernel on Hopper and Blackwell by the PyTorch release the text names (recipes.SDPA): cuDNN's
    from SDPA_CUDNN_FROM, FlashAttention-2 before; an unnamed release leaves the source's default, or FlashAttention-2
    where SDPA is named outside an SDPA-based profile."""
    version = TORCH_VERSION.search(text)
    if version is None:
        return None if src.sdpa else "fa2"
    release = (int(version.group(1)), int(version.group(2)))
    if release >= recipes.SDPA_CUDNN_FROM:
        notes.append(f"SDPA on PyTorch {release[0]}.{release[1]}: cuDNN's kernel first on Hopper and Blackwell "
                     "(recipes.SDPA_CUDNN_FROM)")
        return "fused"
    return "fa2"


def _recipe_settings(record: dict[str, Any], model: ModelSpec, ep: int, notes: list[str]) -> tuple[bool, str, int]:
    """EP all-to-all overlap, expert-GEMM launch and activation offload of the release's recipe (recipes.py)."""
    overlap_ep, ep_note = recipes.overlap_ep(record, model, ep)
    if ep_note and ep > 1:
        notes.append(ep_note)
    expert_gemm, expert_note = recipes.expert_gemm(record, model)
    if expert_note:
        notes.append(expert_note)
    offload_layers, offload_note = recipes.cpu_offload(record)
    if offload_note:
        notes.append(offload_note)
    return overlap_ep, expert_gemm, offload_layers


def _precision(record: dict[str, Any], notes: list[str]) -> str:
    text = str(record.get("precision") or "").lower()
    for pattern, precision in PRECISIONS:
        if re.search(pattern, text):
            if precision in LOW_PRECISION_BYTES:
                notes.append(f"{precision} GEMMs at the {precision} peak, the rest in bf16")
            return precision
    notes.append(f"precision {text or 'not stated'}: bf16 assumed")
    return "bf16"


def _fp8_scaling(record: dict[str, Any], src: SourceDefaults, precision: str, notes: list[str]) -> str:
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
    stated = "delayed" if "delayed" in text else "current" if re.search(r"current|dynamic", text) else None
    notes.append(f"fp8 {stated or src.stack.fp8_scaling} scaling"
                 + (" (stated)" if stated else f" ({src.name} default)"))
    return stated or src.stack.fp8_scaling


NO_RECOMPUTE = re.compile(r"\b(no|not|without)\s+(activation\s+)?(recompute|recomputation|checkpoint)")
# "none", "no", "off": nothing sharded. A bare "DDP" is not read as this: Megatron's DDP wrapper runs under its
# distributed optimizer, which the NeMo / Megatron-Bridge tables leave unstated.
NO_SHARDING = re.compile(r"\s*(?:none|no|false|off)\b")
ZERO_STAGE = re.compile(r"zero[\s_-]*(?:stage)?[\s_:=-]*([0-3])\b")


def _zero(p: dict[str, Any], src: SourceDefaults) -> tuple[int, str]:
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
    if re.search(r"fsdp|hsdp|hybrid.shard|full.shard", text) and "fsdp=0" not in text:
        return 3, "ZeRO-3 (FSDP full shard)"
    if re.search(r"zero stage 1|zero-1|bf16_optimizer", text) or p.get("distributed_optimizer") is True:
        return 1, "ZeRO-1 (distributed optimizer)"
    if p.get("distributed_optimizer") is False:
        return 0, "no optimizer sharding (stated)"
    return src.zero, f"ZeRO-{src.zero} (not stated; {src.name} default)"


def _zero_under_pipeline(zero: int, note: str, pp: int, src: SourceDefaults) -> tuple[int, str]:
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


def _recompute(record: dict[str, Any], p: dict[str, Any], model: ModelSpec, pp: int, src: SourceDefaults
               ) -> tuple[str, int, tuple[str, ...], str]:
    """(mode, layers, selective modules, note): as the record states it, else the release's recipe (recipes.py),
    else the source's default."""
    core = ("core_attn",)
    raw = p.get("activation_recompute")
    raw = "" if raw is None else str(raw).lower()
    text = re.sub(UNSTATED_WORDS + r"|\bnot\s+(selective|full)", "", raw).strip()
    layers = -(-model.num_layers // pp)
    if "(layer)" in text or "(op)" in text or (src.name == "torchtitan" and text == "selective"):
        half = max(1, layers // 2)
        kind = "op" if "(layer)" not in text else "layer"
        return "full", half, core, (f"torchtitan selective AC ({kind}) as full recompute of every other layer "
                                    f"({half} of {layers}); op-SAC recomputes every second matmul, about the same work")
    if text in NEGATIVE or NO_RECOMPUTE.search(text):
        return "none", 0, core, "no activation recompute (stated)"
    if "selective" in text:
        return "selective", 0, core, "selective recompute of the attention core (stated)"
    if "full" in text or text in ("true", "yes", "on", "enabled", "1") or "checkpoint" in text:
        return "full", 0, core, "full activation recompute (stated)"
    modules, why = recipes.recompute_modules(record)
    if modules:
        return "selective", 0, modules, why
    return src.recompute, 0, core, f"recompute {src.recompute} (not stated; {src.name} default)"


# ---- what was measured --------------------------------------------------------------------------------------
METRICS = ("iteration_time_s", "tokens_per_s_per_gpu", "tokens_per_s_total", "model_tflops_per_gpu",
           "tflops_per_gpu", "mfu_pct", "hfu_pct", "pct_of_peak")
PERCENT_OF_PEAK = ("mfu_pct", "hfu_pct", "pct_of_peak")  # of the dense 16-bit peak


def eq3_flops(model: ModelSpec, batch: int) -> float:
    """Narayanan et al. 2021 eq. 3, FLOPs per iteration counting the recomputed forward pass:
    96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    b, s, n_l, h, v = batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    return 96.0 * b * s * n_l * h * h * (1 + s / (6 * h) + v / (16 * n_l * h))


def megatron_model_flops(model: ModelSpec, batch: int) -> float:
    """Megatron-LM ``num_floating_point_operations`` (model FLOPs, forward + backward, no recompute):
    12·B·s·l·h²·[(1 + K/A + s/h)·(A·d/h) + (F/h)·k·g + (F_sh/h)·g + V/(2·l·h)], g = 3/2 for SwiGLU.
    For a GPT (K = A, A·d = h, F = 4h) this is Korthikanti et al. 2022's 72·B·s·l·h²·(1 + s/6h + V/12lh).
    Multi-latent attention (DeepSeek-V3) uses the formula's MLA branch instead of the first bracket:
    6·[q_lora·(h + A·d_qk + 1) + kv_lora·(h + A·(d_nope + d_v) + 1) + h·d_rope + A·d_v·h + s·A·(d_qk + d_v)/2]
    per token and layer (Megatron-LM training.py ``num_floating_point_operations``, multi_latent_attention)."""
    b, s, n_l, h, v = batch, model.seq_length, model.num_layers, model.hidden_size, model.vocab_size
    g = 1.5 if model.gated else 1.0
    ffn = model.moe_ffn_hidden_size * model.moe_topk if model.is_moe else model.ffn_hidden_size
    if model.is_mla:  # the formula's multi-latent-attention branch (per token, in units of 12·h²; causal /2)
        a, d_nope, d_rope, d_v = model.num_heads, model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim
        q_term = (model.q_lora_rank * (h + a * (d_nope + d_rope) + 1) if model.q_lora_rank
                  else h * a * (d_nope + d_rope))
        per_token = (q_term + model.kv_lora_rank * (h + a * (d_nope + d_v) + 1) + h * d_rope + a * d_v * h
                     + s * a * (d_nope + d_rope) / 2 + s * a * d_v / 2)
        attn = per_token / (2 * h * h)  # 6·per_token = 12·h²·attn
    else:
        attn = (1 + model.num_kv_heads / model.num_heads + s / h) * (model.num_heads * model.head_dim / h)
    body = attn + ffn / h * g + model.shared_expert_ffn_size / h * g + v / (2 * n_l * h)
    return 12.0 * b * s * n_l * h * h * body


def palm_flops(model: ModelSpec, batch: int) -> float:
    """PaLM's model FLOPs (Chowdhery et al. 2022, App. B): (6·N + 12·l·h·s) per token, N the matmul parameters; the
    formula knows no sliding window, so every layer counts all s keys."""
    from meshplan.cost.flops import model_flops_per_token  # noqa: PLC0415

    return model_flops_per_token(unwindowed(model)) * batch * model.seq_length


def unwindowed(model: ModelSpec) -> ModelSpec:
    """The model without its sliding window: the sources' FLOP formulas count every layer's s keys."""
    return replace(model, sliding_window=0, window_layers=0) if model.sliding_window else model


BASES = {"eq3": eq3_flops, "model": megatron_model_flops, "palm": palm_flops}


def flops_basis(record: dict[str, Any]) -> str:
    """``eq3`` (counts recompute, Narayanan eq. 3), ``model`` (Megatron / NeMo model FLOPs) or ``palm``
    (6·N + 12·l·h·s per token, PaLM App. B, as torchtitan / nanotron count) from the record's
    ``flops_accounting`` text; ``unknown`` otherwise."""
    text = str(record.get("flops_accounting") or "")
    if re.search(r"96\*B|Eq\.?\s*\(?3|includes recompute|4\*2 coefficient", text, re.I):
        return "eq3"
    if re.search(r"\bpalm\b|chowdhery", text, re.I):  # "model FLOPs utilization (MFU; Chowdhery et al.)": PaLM's
        return "palm"
    if re.search(r"model[ -]flops|model tflop|nemo|megatron|no recompute flops", text, re.I):
        return "model"
    if re.search(r"\b6\s*\*?\s*N\b|\b6ND\b|12\s*\*?\s*l\s*\*?\s*h|chinchilla", text, re.I):
        return "palm"
    if re.search(r"mfu", text, re.I):
        return "model"
    return "unknown"


@dataclass(frozen=True)
class Case:
    """A record mapped onto meshplan, with the quantity to compare."""

    id: str
    group: str
    model: ModelSpec
    cluster: Cluster
    plan: Plan
    stack: Stack
    metric: str
    measured: float
    assumptions: tuple[str, ...]
    basis: str = ""  # FLOP formula for tflops / mfu metrics
    measured_memory: float | None = None  # bytes

    @property
    def attention_kernel(self) -> str:
        return self.stack.attention_kernel

    def efficiency(self, eff: Efficiency = DEFAULT) -> Efficiency:
        """The efficiency model this run is evaluated with (the same for every run; the attention kernel family
        of its stack is a stack setting, ``Stack.attention_kernel``)."""
        return eff


FLOP_METRICS = ("model_tflops_per_gpu", "tflops_per_gpu", *PERCENT_OF_PEAK)
UNKNOWN_BASIS_NOTE = ("FLOP formula of the measured TFLOP/s or MFU not stated: model FLOPs (Megatron-LM's formula, "
                      "no recompute) assumed")


def pick_metric(record: dict[str, Any]) -> tuple[str, float, str]:
    """The measured quantity to compare, in METRICS order: a time or a throughput where given, else TFLOP/s or MFU
    with the source's FLOP formula (``flops_basis``); a FLOP figure whose formula the record does not name is
    taken as model FLOPs, the common convention, when nothing else was measured (map_run says so)."""
    measured = record.get("measured") or {}
    values = {m: float(measured[m]) for m in METRICS  # 0, negative, subnormal or infinite: no measurement
              if isinstance(measured.get(m), (int, float)) and 1e-9 < measured[m] < math.inf}
    basis = flops_basis(record)
    for metric, value in values.items():
        if metric not in FLOP_METRICS:
            return metric, value, ""
        if basis != "unknown":
            return metric, value, basis
    for metric, value in values.items():
        return metric, value, "model"
    unusable = [f"{m}={measured[m]!r}" for m in METRICS if measured.get(m) is not None]  # 0, negative, ...
    others = sorted(k for k, v in measured.items() if v is not None and k not in METRICS)
    said = ": " + ", ".join(f"measured.{u}" for u in unusable) + " not a positive number" if unusable else ""
    only = f" (only {', '.join(others)})" if others else ""
    raise Skip("no comparable measurement" + (said + only if said or only else ": all values null"))


# The A100 80GB was announced on 16 November 2020 (NVIDIA press release "NVIDIA Doubles Down: Announces A100 80GB
# GPU", SC20); a source from 2020 or earlier that does not state the memory ran the 40 GB part (DGX A100 320GB).
A100_80GB_FROM = 2021  # the first year a source can have run the 80 GB part all year


def _dated_a100(record: dict[str, Any], hw: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The 40 GB A100 for an unstated memory size when the source (its ``source`` / ``framework`` text) dates from
    before the 80 GB part."""
    gpu = str(hw.get("gpu") or "")
    if not re.search(r"A100", gpu, re.I) or re.search(r"\d+\s*GB", gpu, re.I):
        return hw, ""
    years = [int(y) for y in re.findall(r"\b(20[12]\d)\b", f"{record.get('source', '')} {record.get('framework', '')}")]
    if not years or max(years) >= A100_80GB_FROM:
        return hw, ""
    return hw | {"gpu": f"{gpu} 40GB"}, (f"A100 40 GB: the source dates from {max(years)}, before the 80 GB part "
                                         "(announced November 2020)")


def _gpu_count(record: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The hardware section with ``num_gpus``: as recorded, else nodes × GPUs per node, else the product of the
    stated parallel sizes (dp·tp·pp·cp)."""
    hw = dict(record.get("hardware") or {})
    if positive_int(hw.get("num_gpus")):
        return hw, ""
    why = "num_gpus not recorded" if hw.get("num_gpus") is None else f"num_gpus={hw['num_gpus']!r} not a size"
    nodes, per_node = positive_int(hw.get("num_nodes") or hw.get("nodes")), positive_int(hw.get("gpus_per_node"))
    if nodes and per_node:
        hw["num_gpus"] = nodes * per_node
        return hw, f"{nodes * per_node} GPUs = {nodes} nodes x {per_node} ({why})"
    p = record.get("parallel") or {}
    sizes = [positive_int(p.get(k)) for k in ("dp", "tp", "pp", "cp")]
    if sizes[0]:
        hw["num_gpus"] = math.prod(x or 1 for x in sizes)
        return hw, f"{hw['num_gpus']} GPUs = dp*tp*pp*cp ({why})"
    return hw, ""


# Hybrid Mamba models are costed block by block (ops.mamba_block: the SSD kernels at their measured rate,
# efficiency.py ``ssd``) with their recipes' module recompute (recipes.RECOMPUTE) and multi-token prediction
# (recipes.mtp_layers). Those with a latent MoE (``moe_latent_size``: Nemotron 3 Super) are compared apart: with
# every documented setting of their recipes modelled they still read tens of percent off, fast on GB200 and slow on
# B200, for a cause not found (docs/ACCURACY.md, "Runs compared apart"). ``meshplan validate --hybrid`` compares
# them anyway; docs/ACCURACY.md lists that comparison apart from the summaries.
HYBRID_SKIP = ("{name}: hybrid Mamba-2 model with a latent MoE, compared apart (its runs read tens of percent off "
               "with every documented recipe setting modelled, a residual whose cause is not found; meshplan validate "
               "--hybrid compares it)")


def compared_apart(model: ModelSpec) -> bool:
    """A model whose runs ``map_run`` keeps out of the summaries unless asked (``HYBRID_SKIP``)."""
    return model.is_hybrid and model.moe_latent_size > 0


def map_run(record: dict[str, Any], hybrid: bool = False) -> Case:
    """Record → Case, or Skip with the reason (a model ``compared_apart`` unless ``hybrid``: HYBRID_SKIP). A reason
    names the record's fields it is about, and any of them whose stated value could not be read."""
    record = clean_record(record)
    try:
        return _map_run(record, hybrid)
    except Skip as exc:
        raise Skip(with_unread(str(exc), record)) from None


def _reading(section: str, fn: Any, *args: Any) -> Any:
    """``fn(*args)``, a record's section mapped: what a malformed value makes it raise becomes a Skip naming the
    section (an invalid size names its field, as specs' and plans' errors do)."""
    try:
        return fn(*args)
    except Skip:
        raise
    except MeshplanError as exc:
        raise Skip(f"{section}: {exc}") from exc
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise Skip(f"{section} not understood ({type(exc).__name__}: {exc})") from exc


def _map_run(record: dict[str, Any], hybrid: bool) -> Case:
    m = record.get("model") or {}
    if not m.get("name") and m.get("num_layers") is None:
        raise Skip("model not recorded: model.name and model.num_layers missing")
    name = str(m.get("name"))
    if m.get("arch") is None and m.get("num_layers") is None and preset_by_name(name) is None:
        missing = [f"model.{k}" for k in ("num_layers", "hidden_size", "num_heads") if m.get(k) is None]
        raise Skip(f"{name}: model sizes not recorded: {', '.join(missing)} missing and no preset named {name!r}")
    metric, value, basis = _reading("measured", pick_metric, record)
    model, notes = _reading("model", map_model, m)
    mtp, mtp_note = recipes.mtp_layers(record, model)
    if mtp != model.mtp_layers:
        model = replace(model, mtp_layers=mtp, mtp_pattern=model.mtp_pattern if mtp else "",
                        mtp_shared=model.mtp_shared and bool(mtp))
    notes += [mtp_note] if mtp_note else []
    if compared_apart(model) and not hybrid:
        raise Skip(HYBRID_SKIP.format(name=m.get("name")))
    read_from = record.get("_measured_from") or {}
    notes += [f"measured {k} read from {read_from[k]}" for k in (metric, "peak_memory_gib") if k in read_from]
    if metric in FLOP_METRICS and flops_basis(record) == "unknown":
        notes.append(UNKNOWN_BASIS_NOTE)
    hardware, count_note = _gpu_count(record)
    hardware, dated_note = _dated_a100(record, hardware)
    cluster, hw_notes = _reading("hardware", map_cluster, hardware)
    hw_notes += [note for note in (count_note, dated_note) if note]
    plan, stack, plan_notes = _reading("parallel", map_plan, record, model, cluster)
    notes += hw_notes + plan_notes
    memory = (record.get("measured") or {}).get("peak_memory_gib")
    if stack.attention_kernel == "fa2" and stack.flash_attention:
        notes.append(f"attention kernel: {stack.attention_kernel} class (the source's stack)")
    if record.get("_unread"):
        notes.append(f"values not read, taken as not stated: {', '.join(record['_unread'])}")
    usable = isinstance(memory, (int, float)) and 0 < memory < math.inf
    return Case(id=record["id"], group=str(record.get("group") or ""), model=model, cluster=cluster, plan=plan,
                stack=stack, metric=metric, measured=value, assumptions=tuple(notes), basis=basis,
                measured_memory=float(memory) * GiB if usable else None)


def predicted_metric(case: Case, step_time: float) -> float:
    """The prediction on the measured basis, from meshplan's step time."""
    plan, model, n = case.plan, case.model, case.cluster.num_gpus
    tokens = plan.global_batch * model.seq_length
    if case.metric == "iteration_time_s":
        return step_time
    if case.metric == "tokens_per_s_per_gpu":
        return tokens / step_time / n
    if case.metric == "tokens_per_s_total":
        return tokens / step_time
    flops = BASES.get(case.basis, megatron_model_flops)(model, plan.global_batch)
    if case.metric == "hfu_pct" and case.basis != "eq3":  # hardware FLOPs: the recomputed forward too
        from meshplan.cost.flops import recompute_flops_per_token  # noqa: PLC0415

        flops = flops + recompute_flops_per_token(unwindowed(model), plan, case.stack) * tokens
    if case.metric in PERCENT_OF_PEAK:
        return 100.0 * flops / step_time / n / case.cluster.accelerator.half_flops
    return flops / step_time / n / 1e12


# ---- evaluation ---------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    id: str
    group: str
    metric: str = ""
    predicted: float | None = None
    measured: float | None = None
    error: float | None = None
    assumptions: tuple[str, ...] = ()
    skipped: str = ""  # the reason, when the run was not evaluated
    step_time: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    memory_predicted: float | None = None  # the peak over the pipeline ranks
    memory_measured: float | None = None
    memory_error: float | None = None
    memory_capacity: float | None = None  # bytes of the GPU's memory, what ``memory_predicted`` must fit in
    fits: bool = True
    in_fit_set: bool = False
    unstated: tuple[str, ...] = ()  # what the record leaves out (``records.unstated_settings``)

    @property
    def complete(self) -> bool:
        """The record states every setting of ``records.unstated_settings``: the runs of issue 4's targets."""
        return not self.unstated

    @property
    def memory_share(self) -> float:
        """Predicted peak memory as a fraction of the GPU's memory (0 when either is unknown)."""
        if not self.memory_predicted or not self.memory_capacity:
            return 0.0
        return self.memory_predicted / self.memory_capacity

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "group": self.group, "in_fit_set": self.in_fit_set,
                             "complete_configuration": self.complete}
        if self.skipped:
            return d | {"skipped": self.skipped}
        return d | {"metric": self.metric, "predicted": self.predicted, "measured": self.measured,
                    "error": self.error, "step_time_s": self.step_time, "breakdown_s": self.breakdown,
                    "memory_predicted_bytes": self.memory_predicted, "memory_measured_bytes": self.memory_measured,
                    "memory_capacity_bytes": self.memory_capacity, "memory_error": self.memory_error,
                    "fits": self.fits, "assumptions": list(self.assumptions)}


def evaluate_case(case: Case, eff: Efficiency = DEFAULT) -> RunResult:
    from meshplan.estimate import estimate  # noqa: PLC0415  (estimate imports the whole cost model)

    est = estimate(case.model, case.cluster, case.plan, case.stack, case.efficiency(eff))
    predicted = predicted_metric(case, est.step_time)
    result = RunResult(id=case.id, group=case.group, metric=case.metric, predicted=predicted,
                       measured=case.measured, error=predicted / case.measured - 1, assumptions=case.assumptions,
                       step_time=est.step_time, breakdown=dict(est.breakdown), memory_predicted=est.peak_memory,
                       memory_capacity=case.cluster.accelerator.hbm_bytes, fits=est.fits,
                       in_fit_set=in_fit_set(case.id))
    if case.measured_memory:
        result.memory_measured = case.measured_memory
        result.memory_error = est.peak_memory / case.measured_memory - 1
    return result


def select(records: Iterable[dict[str, Any]], group: str | None = None, exclude_superseded: bool = False
           ) -> list[tuple[dict[str, Any], str]]:
    """(record, skip reason or "") for the records of ``group`` (all when None). A superseded record (older
    numbers of a configuration that a newer record of the same source also gives) is still a measured run of
    the software of its day, so it is evaluated unless ``exclude_superseded``; the constants are fitted on the
    newer records only (benchmarks/fit_efficiency.py)."""
    chosen = []
    for r in records:
        if group is not None and r.get("group") != group:
            continue
        reason = "superseded by a newer record of the same configuration (--exclude-superseded)" if (
            r.get("superseded") and exclude_superseded) else ""
        chosen.append((r, reason))
    return chosen


BORROWED = ("micro_batch_size", "vp", "global_batch_size")


def fill_from_siblings(record: dict[str, Any], records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A record that leaves micro-batch, virtual pipeline or global batch unstated takes them from a record
    of the same source (group), model and tp/pp that states them; the global batch scales with dp (the same
    micro-batches per pipeline). Korthikanti et al. 2022's 2,240-GPU run is its 280-GPU Table 3 run × 8."""
    p = record.get("parallel") or {}
    if all(p.get(k) is not None for k in BORROWED):
        return record
    key = ((record.get("model") or {}).get("name"), p.get("tp"), p.get("pp"))
    for other in records:
        q = other.get("parallel") or {}
        if (other is record or other.get("group") != record.get("group") or other.get("superseded")
                or ((other.get("model") or {}).get("name"), q.get("tp"), q.get("pp")) != key
                or any(q.get(k) is None for k in BORROWED) or not q.get("dp")):
            continue
        filled, notes = dict(p), []
        for k in BORROWED:
            if p.get(k) is None:
                value = q[k]
                if k == "global_batch_size" and positive_int(p.get("dp")) and positive_int(q.get("dp")):
                    value = q[k] * positive_int(p["dp"]) // positive_int(q["dp"])
                filled[k] = value
                notes.append(f"{k} {value}")
        note = f"from {other['id']} (same source, model, tp/pp): " + ", ".join(notes)
        return record | {"parallel": filled, "_borrowed": note}
    return record


def run_validation(records: Sequence[dict[str, Any]], group: str | None = None, exclude_superseded: bool = False,
                   eff: Efficiency = DEFAULT, hybrid: bool = False) -> list[RunResult]:
    """Every record evaluated or skipped with its reason; ``hybrid``: compare the hybrid Mamba runs too. A record
    this cannot read (not an object, a value of the wrong kind, sizes that contradict each other) is skipped with a
    reason naming what it could not read, never raised."""
    results = []
    json_kind = {str: "string", list: "array", int: "number", float: "number", bool: "boolean", type(None): "null"}
    cleaned = [clean_record(r) if isinstance(r, dict) else {"id": f"#{i + 1}", "_not_object": json_kind.get(
        type(r), type(r).__name__)} for i, r in enumerate(records)]
    for record, reason in select(cleaned, group, exclude_superseded):
        rid, grp = str(record.get("id")), str(record.get("group") or "")
        # judged on the record as published, before fill_from_siblings lends it a sibling's settings
        unstated = unstated_settings(record)
        if record.get("_not_object"):
            reason = f"record {rid} is a JSON {record['_not_object']}, not an object"
        if reason:
            results.append(RunResult(id=rid, group=grp, skipped=reason, in_fit_set=in_fit_set(rid), unstated=unstated))
            continue
        try:
            result = _evaluated(map_run(fill_from_siblings(record, cleaned), hybrid), eff)
            results.append(replace(result, unstated=unstated))
        except (Skip, PlanError) as exc:
            results.append(RunResult(id=rid, group=grp, skipped=str(exc) or type(exc).__name__,
                                     in_fit_set=in_fit_set(rid), unstated=unstated))
        except MeshplanError as exc:
            results.append(RunResult(id=rid, group=grp, skipped=f"invalid input: {exc}", in_fit_set=in_fit_set(rid),
                                     unstated=unstated))
        except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # a misreading map_run does not name
            results.append(RunResult(id=rid, group=grp, skipped=f"record not understood ({type(exc).__name__}: {exc})",
                                     in_fit_set=in_fit_set(rid), unstated=unstated))
    return results


def _evaluated(case: Case, eff: Efficiency) -> RunResult:
    """evaluate_case, where a mapped plan the estimate cannot price (sizes past its arithmetic) is a Skip."""
    try:
        result = evaluate_case(case, eff)
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:
        raise Skip(f"estimate failed on the record's model and plan ({type(exc).__name__}: {exc})") from exc
    if result.error is None or not math.isfinite(result.error):
        raise Skip(f"prediction of {case.metric} not finite ({result.predicted!r}; measured {case.measured!r})")
    return result


def summarize(results: Sequence[RunResult]) -> dict[str, Any]:
    """median / mean / p90 / max of |error| over evaluated runs, counts, and the peak-memory errors.

    ``not_fitting`` counts the evaluated runs whose predicted peak memory exceeds the GPU's: each of them was
    measured, so it fitted, and each is a "does not fit" that meshplan would have got wrong."""
    errors = np.array([abs(r.error) for r in results if r.error is not None])
    mem = np.array([abs(r.memory_error) for r in results if r.memory_error is not None])
    summary: dict[str, Any] = {"evaluated": int(errors.size), "skipped": sum(1 for r in results if r.skipped)}
    for key, fn in (("median_abs_error", np.median), ("mean_abs_error", np.mean),
                    ("p90_abs_error", lambda a: np.percentile(a, 90)), ("max_abs_error", np.max)):
        summary[key] = float(fn(errors)) if errors.size else math.nan
    signed = [r.error for r in results if r.error is not None]
    summary["mean_signed_error"] = float(np.mean(signed)) if signed else math.nan
    summary["memory_evaluated"] = int(mem.size)
    summary["memory_median_abs_error"] = float(np.median(mem)) if mem.size else math.nan
    summary["memory_max_abs_error"] = float(np.max(mem)) if mem.size else math.nan
    summary["not_fitting"] = sum(1 for r in results if r.error is not None and not r.fits)
    return summary


def summaries(results: Sequence[RunResult]) -> dict[str, Any]:
    """Overall, on the runs with complete configurations (``records.unstated_settings``), per group, and for the
    fit / held-out halves."""
    groups = sorted({r.group for r in results})
    return {
        "overall": summarize(results),
        "complete": summarize([r for r in results if r.complete]),
        "in_sample": summarize([r for r in results if r.in_fit_set]),
        "out_of_sample": summarize([r for r in results if not r.in_fit_set]),
        "groups": {g: summarize([r for r in results if r.group == g]) for g in groups},
    }


# ---- output -------------------------------------------------------------------------------------------------
def _fmt(value: float | None, metric: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric == "iteration_time_s":
        return f"{value:.3f} s"
    if metric in PERCENT_OF_PEAK:
        return f"{value:.1f} %"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.1f}"


_UNITS = {"iteration_time_s": "step time", "tokens_per_s_per_gpu": "tokens/s/GPU", "tokens_per_s_total": "tokens/s",
          "model_tflops_per_gpu": "TFLOP/s/GPU", "tflops_per_gpu": "TFLOP/s/GPU", "mfu_pct": "MFU", "hfu_pct": "HFU",
          "pct_of_peak": "% of peak"}


def render_text(results: Sequence[RunResult], summary: dict[str, Any], width: int = 200) -> str:
    import io  # noqa: PLC0415

    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    table = Table(title="Published runs: predicted vs measured", show_lines=False)
    for name, justify in (("id", "left"), ("group", "left"), ("metric", "left"), ("predicted", "right"),
                          ("measured", "right"), ("error", "right"), ("memory err", "right"), ("note", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for r in results:
        if r.skipped:
            table.add_row(r.id, r.group, "-", "-", "-", "skipped", "-", r.skipped)
            continue
        mem = "-" if r.memory_error is None else f"{100 * r.memory_error:+.1f}%"
        table.add_row(r.id, r.group, _UNITS.get(r.metric, r.metric), _fmt(r.predicted, r.metric),
                      _fmt(r.measured, r.metric), f"{100 * r.error:+.1f}%", mem,
                      "" if r.fits else "predicted memory exceeds HBM")
    console.print(table)
    stats = Table(title="|error| by group", caption="complete configurations: the runs whose record states the "
                  "parallel layout, micro and global batch, activation recompute and precision (issue 4's targets)")
    for name in ("group", "evaluated", "skipped", "median", "mean", "p90", "max", "memory median", "not fitting"):
        stats.add_column(name, justify="left" if name == "group" else "right")

    def row(name: str, s: dict[str, Any]) -> None:
        pct = [("-" if math.isnan(s[k]) else f"{100 * s[k]:.1f}%") for k in (
            "median_abs_error", "mean_abs_error", "p90_abs_error", "max_abs_error", "memory_median_abs_error")]
        stats.add_row(name, str(s["evaluated"]), str(s["skipped"]), *pct, str(s["not_fitting"]))

    for g, s in summary["groups"].items():
        row(g, s)
    row("in sample (fit half)", summary["in_sample"])
    row("out of sample", summary["out_of_sample"])
    row("complete configurations", summary["complete"])
    row("overall", summary["overall"])
    console.print(stats)
    return out.getvalue()


def fit_check_markdown(results: Sequence[RunResult]) -> list[str]:
    """A markdown section on the measured runs meshplan says would not fit in GPU memory (``not_fitting``): each
    with its predicted peak, the GPU's memory and the recompute setting it was evaluated with."""
    wrong = [r for r in results if r.error is not None and not r.fits]
    out = ["## Will it fit? Measured runs that meshplan says would not", "",
           f"Every evaluated run was measured, so it fitted in its GPUs' memory. meshplan's peak memory exceeds the "
           f"GPU's on {len(wrong)} of {sum(1 for r in results if r.error is not None)}: a \"does not fit\" it would "
           "have got wrong (the time is still predicted for the plan as stated). Where the recompute setting is not "
           "stated, the runs read as the source's default; a stack that recomputed more, or saved less than "
           "meshplan counts, fits where meshplan says it does not.", ""]
    if not wrong:
        return out
    out += ["| run | predicted peak | GPU memory | recompute |", "|---|---:|---:|---|"]
    for r in sorted(wrong, key=lambda r: -r.memory_share):
        recompute = next((a for a in r.assumptions if "recompute" in a.lower()), "-")
        out.append(f"| {r.id} | {(r.memory_predicted or 0.0) / 2**30:.1f} GiB | "
                   f"{(r.memory_capacity or 0.0) / 2**30:.1f} GiB | {recompute} |")
    return out


def validate_command(path: str, group: str | None, as_json: bool, exclude_superseded: bool = False,
                     hybrid: bool = False) -> str:
    """The text (a rich table of every run, then the summaries) or JSON that ``meshplan validate`` prints."""
    records = read_runs(path)
    if group is not None and not any(r.get("group") == group for r in records):
        known = sorted({str(r["group"]) for r in records if r.get("group")})
        listed = f"groups: {', '.join(known)}" if known else "no record names a group"
        raise SpecError(f"group={group!r} is not in {path} ({listed})")
    results = run_validation(records, group, exclude_superseded, hybrid=hybrid)
    summary = summaries(results)
    if as_json:
        return json.dumps(_finite({"runs": [r.to_dict() for r in results], "summary": summary["overall"],
                                   "complete": summary["complete"],
                                   "in_sample": summary["in_sample"], "out_of_sample": summary["out_of_sample"],
                                   "groups": summary["groups"]}), indent=1, allow_nan=False)
    return render_text(results, summary)


def _finite(value: Any) -> Any:
    """NaN (an empty summary) → null, so the JSON is strict."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value

