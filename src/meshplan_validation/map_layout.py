"""A published record's parallel layout → the Plan's sizes: dp, tp, pp, cp, ep and etp; the micro-batch and the global
batch; the virtual pipeline stages per rank. What the record states is taken; what it leaves out comes from the GPU
count, a sibling quantity (a batch in tokens, gradient accumulation) or its source's defaults (sources.py), each with
a note.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan_validation.patterns import EP_DISPATCH_TEXT, NOT_INTERLEAVED
from meshplan_validation.record_fields import batch_from_tokens, unstated_model_parallel
from meshplan_validation.records import positive_int
from meshplan_validation.skip import Skip
from meshplan_validation.sources import SourceDefaults

# ---- parallel sizes ----------------------------------------------------------------------------------------------
# The tensor-parallel size of a record that states Megatron's sequence parallelism (Korthikanti et al. 2022,
# "Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198) but no TP size: their Table 3
# runs every model (22B to 1T) at tensor parallelism 8, within one 8-GPU DGX A100 node
SEQUENCE_PARALLEL_TP = 8


def parallel_sizes(p: dict[str, Any], model: ModelSpec, n: int, notes: list[str], framework: str, src: SourceDefaults
                   ) -> tuple[int, int, int, int, int, int]:
    """dp, tp, pp, cp, ep, etp: as stated; tp, pp, cp 1 where unstated (said); dp from the GPU count where it is
    unstated or its product with tp, pp and cp is not the GPU count (said); ep as the stack implies, etp for
    expert-parallel MoE as the stack's default (``SourceDefaults.expert_tp_is_tp``)."""
    tp, pp, cp = (positive_int(p.get(k)) or 1 for k in ("tp", "pp", "cp"))
    if positive_int(p.get("tp")) is None and (unstated := _unstated_tp(p, n, src)):
        tp, why = unstated
        p = p | {"tp": tp}
        notes.append(f"tp {tp} (not stated; {why})")
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
        etp = _unstated_etp(model, ep, tp, src, notes)
    return dp, tp, pp, cp, ep, etp


def _unstated_tp(p: dict[str, Any], n: int, src: SourceDefaults) -> tuple[int, str] | None:
    """The TP size of a record that states none, with why, where its stated sequence parallelism or its source's
    launch script gives one (``SourceDefaults.launch``); None: 1, as unstated."""
    if p.get("sequence_parallel") is True:
        return math.gcd(SEQUENCE_PARALLEL_TP, n), ("sequence parallelism is stated, which runs over the "
                                                  "tensor-parallel group: Korthikanti et al. 2022 run it at t = "
                                                  f"{SEQUENCE_PARALLEL_TP}, one DGX node, on every model of their "
                                                  "Table 3")
    if src.launch[0] > 1 and n % src.launch[0] == 0:
        return src.launch[0], f"{src.name}'s default"
    return None


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


def _unstated_etp(model: ModelSpec, ep: int, tp: int, src: SourceDefaults, notes: list[str]) -> int:
    """Expert tensor parallelism the record leaves unstated: 1 with expert parallelism unless the stack keeps
    Megatron-Core's default etp = tp (``SourceDefaults.expert_tp_is_tp``); tp otherwise."""
    etp = 1 if ep > 1 and not src.expert_tp_is_tp else tp
    if model.is_moe and ep > 1 and tp > 1:
        notes.append(f"etp = tp = {tp} (expert tensor parallelism not stated; Megatron-Core's default, which "
                     f"{src.name} keeps)" if src.expert_tp_is_tp else
                     "etp = 1 (expert tensor parallelism not stated; Megatron-Bridge's MoE base configs set "
                     "expert_tensor_parallel_size=1, torchtitan's expert_tensor_parallel_degree defaults to 1)")
    return etp


# ---- batches -----------------------------------------------------------------------------------------------------
def batches(record: dict[str, Any], src: SourceDefaults, dp: int, pp: int, notes: list[str], seq: int,
            least: Callable[[int | None], tuple[int, str]] | None = None) -> tuple[int, int]:
    """Micro-batch and global batch (sequences), from what the record states (the global batch in sequences, or in
    tokens, or micro-batch × dp × gradient accumulation) and the source's conventions; ``least``: the least
    micro-batch the source's code runs, given the global batch per data-parallel rank, with the reason the source
    gives for it (None: 1)."""
    p = record.get("parallel") or {}
    gbs = positive_int(p.get("global_batch_size")) or batch_from_tokens(record, seq, notes)
    mbs = positive_int(p.get("micro_batch_size"))
    if src.name == "torchtitan" and pp > 1 and mbs is not None:
        mbs, gbs = _torchtitan_local_batch(mbs, gbs, dp, pp, notes)
    accum = positive_int(p.get("grad_accum"))
    if accum is not None:
        mbs, gbs = _with_accumulation(mbs, gbs, dp, accum, notes)
    mbs, gbs = _unstated_batches(mbs, gbs, dp, src, notes, least)
    if gbs % (dp * mbs):
        raise Skip(f"parallel.global_batch_size {gbs} is not a multiple of dp*micro_batch_size = {dp}*{mbs} = "
                   f"{dp * mbs} (micro-batches that do not divide the batch are not modelled)")
    return mbs, gbs


def _torchtitan_local_batch(local: int, gbs: int | None, dp: int, pp: int, notes: list[str]) -> tuple[int, int]:
    """torchtitan's batch_size is per DP rank; pipeline parallelism splits it into pp micro-batches."""
    mbs = max(1, local // pp)
    notes.append(f"torchtitan local batch {local} split into {pp} pipeline micro-batches of {mbs} "
                 "(pipeline_parallel_microbatches not stated; torchtitan's default is pp x stages per rank, "
                 "which is pp for 1F1B. Taken as pp for its interleaved runs too: the paper compares the two "
                 "schedules at one local batch, and its measured 1.28x gain from interleaving is that of "
                 "equal micro-batch counts in meshplan (1.29x), not the 1.51x of twice as many)")
    return mbs, local * dp if gbs is None else gbs


def _with_accumulation(mbs: int | None, gbs: int | None, dp: int, accum: int, notes: list[str]
                       ) -> tuple[int | None, int | None]:
    """The global batch from micro-batch × dp × gradient accumulation, or the micro-batch from the global batch."""
    if gbs is None and mbs is not None:
        gbs = mbs * dp * accum
        notes.append(f"global batch {gbs} = micro-batch*dp*grad_accum = {mbs}*{dp}*{accum} (not stated)")
    if mbs is None and gbs is not None and gbs % (dp * accum) == 0:
        mbs = gbs // (dp * accum)
        notes.append(f"micro-batch {mbs} = global batch/(dp*grad_accum) = {gbs}/({dp}*{accum}) (not stated)")
    return mbs, gbs


def _unstated_batches(mbs: int | None, gbs: int | None, dp: int, src: SourceDefaults, notes: list[str],
                      least: Callable[[int | None], tuple[int, str]] | None = None) -> tuple[int, int]:
    """What is still unstated: the micro-batch as the whole batch per rank (a source without gradient
    accumulation), the least its code runs (``least``, whose reason the note relays) or 1; the global batch as one
    micro-batch per data-parallel rank."""
    if mbs is None and src.whole_batch and gbs is not None and gbs >= dp:
        mbs = gbs // dp
        notes.append(f"micro-batch {mbs} = global batch / dp (no gradient accumulation in {src.name})")
    if mbs is None and src.launch[1] > 1 and (gbs is None or gbs % (dp * src.launch[1]) == 0):
        mbs = src.launch[1]
        notes.append(f"micro-batch {mbs} (not stated; {src.name}'s default)")
    if mbs is None and least is not None:
        mbs, why = least(gbs // dp if gbs and gbs % dp == 0 else None)
        notes.append(f"micro-batch {mbs} (not stated): {why}")
    if mbs is None:
        mbs = 1
        notes.append("micro-batch 1 (not stated)")
    if gbs is None:
        gbs = dp * mbs
        notes.append(f"global batch {gbs} = dp*micro-batch (not stated)")
    return mbs, gbs


# ---- interleaving ------------------------------------------------------------------------------------------------
def _smallest_interleave(model: ModelSpec, pp: int) -> int:
    """The smallest v > 1 dividing the layers per pipeline stage (1 if none does)."""
    per_stage = -(-model.num_layers // pp)
    return next((d for d in range(2, per_stage + 1) if per_stage % d == 0), 1)


def interleaving(p: dict[str, Any], model: ModelSpec, pp: int, divisible: bool, notes: list[str],
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
    if pp == 1 or vpp != 1:
        return vpp
    schedule_text = str(p.get("pp_schedule") or "").lower()
    if "interleav" in schedule_text:
        notes.append("interleaved 1F1B with 2 stages per rank (torchtitan default; v not stated)")
        return 2
    stated = p.get("interleaved_schedule")
    if stated and not NOT_INTERLEAVED.search(str(stated)):
        return _inferred_interleave(model, pp, divisible, notes, "paper: used for large runs, v not stated; smallest "
                                    "v dividing the layers per stage")
    if p.get("vp") is None and not schedule_text and stated is None and src.interleaved:
        return _inferred_interleave(model, pp, divisible, notes, f"schedule not stated; {src.name}: the interleaved "
                                    "1F1B that large-scale stacks run, with the smallest v dividing the layers per "
                                    "stage")
    return 1


def _inferred_interleave(model: ModelSpec, pp: int, divisible: bool, notes: list[str], why: str) -> int:
    """The smallest v > 1 dividing the layers per stage where the micro-batches per pipeline allow interleaving
    (``divisible``), with a note saying ``why``; else 1."""
    v = _smallest_interleave(model, pp)
    if v > 1 and divisible:
        notes.append(f"interleaved schedule with v = {v} ({why})")
        return v
    return 1
