"""The pipeline layouts of the recipes: how many decoder layers the first and the last pipeline rank hold where a
recipe places the embedding, the loss or the multi-token-prediction layers as pipeline layers of their own
(Plan.first_stage_layers, Plan.last_stage_layers), each with the recipe file it comes from.
"""

from __future__ import annotations

import json
import re
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan_validation.recipes import first_source, recipe_key
from meshplan_validation.records import positive_int
from meshplan_validation.sources import source_defaults

# loss, "|" between model chunks; chunk i runs on pipeline rank i mod p) of Megatron-Bridge's DeepSeek-V3 recipes:
# (regex on "group model gpu", layout, source). The last rank's decoder layers become Plan.last_stage_layers, the
# first rank's Plan.first_stage_layers where they are fewer than an even split of the rest would give it.
DSV3_LAYOUT_16 = "Etttt|" + "tttt|" * 14 + "tmL"
PIPELINE_LAYOUTS: tuple[tuple[str, str, str], ...] = (
    (r"megatron_bridge\S*.*deepseek-v3 h100", "Et|" + "tt|" * 30 + "mL",
     "scripts/performance/configs/deepseek/deepseek_llm_pretrain.py @ 69655bf: pipeline_model_parallel_layout = "
     "pp_layout or 'Et|(tt|)*30mL'"),
    (r"megatron_bridge\S*.*deepseek-v3", DSV3_LAYOUT_16,
     "recipes/deepseek/deepseek_v3.py set_deepseek_v3_pipeline_model_parallel_layout (release 0.3.0): for (pp, vp) "
     "(4, 4), (8, 2) and (16, 1), [embedding + 4 decoder] + 14 x [4 decoder] + [1 decoder + mtp + loss]"),
)


# Recipes that count the embedding and the loss as a pipeline layer each (Megatron-Core account_for_embedding_in_
# pipeline_split / account_for_loss_in_pipeline_split, get_num_layers_to_build), and DeepSpeed's pipeline partition
# that weighs the tied embedding at each end as a transformer block: the L + 2 slots split evenly over the ranks, so
# the first and the last rank hold one decoder layer fewer than the others. (regex on "group model gpu", source)
EMBEDDING_LOSS_SPLIT: tuple[tuple[str, str], ...] = (
    (r"megatron_bridge\S*.*llama ?3\.1[- ]?405b",
     "src/megatron/bridge/recipes/llama/llama3.py llama31_405b_pretrain_config: account_for_embedding_in_pipeline_"
     "split = account_for_loss_in_pipeline_split = True"),
    (r"megatron_bridge\S*.*qwen3[- ]?235b",
     "src/megatron/bridge/recipes/qwen/qwen3_moe.py qwen3_235b_a22b_pretrain_config: account_for_embedding_in_"
     "pipeline_split = account_for_loss_in_pipeline_split = True"),
    (r"^llama3_paper",
     "Dubey et al. 2024 (The Llama 3 Herd of Models) §3.3.2: 'we reduce one Transformer layer each from the first and "
     "the last stages, respectively. This means that the first model chunk on the first stage has only the embedding, "
     "and the last model chunk on the last stage has only output projection and loss calculation'"),
    (r"^bloom bloom-176b",
     "bigscience train/tr11-176B-ml/README.md: --pp-partition-method 'type:transformer|embedding' (DeepSpeed's "
     "PipelineModule weighs both tied embeddings as blocks): 'pp rank 0: [embed | 5 transformer blocks]', ranks 1-10 "
     "6 blocks, 'pp rank 11: [5 transformer blocks | embed]'"),
)
# Sources whose pipeline runs one decoder layer a model chunk, V = (L + 2) / pp chunks a rank, where the record leaves
# V out: Llama 3's paper (as EMBEDDING_LOSS_SPLIT's row: the layer taken from the first and the last stage leaves their
# first and last chunk the embedding and the loss alone, so a chunk holds one layer; 126 + 2 = 16 x 8 at pp 16).
# (regex on "group model gpu", source)
ONE_LAYER_CHUNKS: tuple[tuple[str, str], ...] = (
    (r"^llama3_paper", "Dubey et al. 2024 §3.3.2: the first stage's first model chunk holds the embedding alone once "
                       "one layer is taken from the stage: one layer a chunk"),
)


def one_layer_chunks(record: dict[str, Any], model: ModelSpec, pp: int) -> tuple[int, str]:
    """(V, source) where the record's source runs one decoder layer a model chunk and the record leaves V out: the
    (L + 2) / pp slots a rank of EMBEDDING_LOSS_SPLIT; else (0, "")."""
    key = recipe_key(record)
    why = first_source(ONE_LAYER_CHUNKS, key)
    if not why or pp == 1 or (record.get("parallel") or {}).get("vp") is not None or (model.num_layers + 2) % pp:
        return 0, ""
    return (model.num_layers + 2) // pp, why


# DeepSpeed's PipelineModule partition method that weighs the embedding layers as transformer blocks (Megatron-DeepSpeed
# --pp-partition-method): where a record's text names it, its L + 2 items split as the recipes' above
DEEPSPEED_EMBEDDING_PARTITION = "type:transformer|embedding"
# Megatron-Core's stacks build pp·vp model chunks of whole layers only: where the record's L layers do not split into
# them but L + 2 do, the run must count the embedding and the loss as a layer each (get_num_layers_to_build)
MCORE_STACKS = ("Megatron-Bridge", "Megatron-Core 2024", "Megatron-LM examples", "NeMo 24.x", "NeMo 2.0")


def layout_last_stage(layout: str, pp: int) -> int:
    """Decoder layers ("t") of a pipeline layout's chunks on the last rank (chunk i on rank i mod pp)."""
    return layout_rank_layers(layout, pp, pp - 1)


def layout_rank_layers(layout: str, pp: int, rank: int) -> int:
    """Decoder layers ("t") of a pipeline layout's chunks on pipeline rank ``rank`` (chunk i on rank i mod pp)."""
    chunks = layout.split("|")
    return sum(chunk.count("t") for i, chunk in enumerate(chunks) if i % pp == rank)


def end_stage_layers(record: dict[str, Any], model: ModelSpec, pp: int, vpp: int) -> tuple[int, int, str]:
    """The first and the last pipeline rank's decoder layers under the recipe's pipeline layout, where one applies to
    this (pp, vpp): as many chunks as pp·vpp and as many decoder layers as the model's; else 0, 0 (an even split).
    The first rank's count is kept only where it is below an even split of the rest (``lighter_first``)."""
    if pp == 1:
        return 0, 0, ""
    key = recipe_key(record)
    for pattern, layout, why in PIPELINE_LAYOUTS:
        if re.search(pattern, key):
            chunks, decoders = layout.count("|") + 1, layout.count("t")
            if chunks != pp * vpp or decoders != model.num_layers:
                return 0, 0, (f"pipeline layout: the recipe's ({why}) has {chunks} chunks of {decoders} decoder "
                              f"layers, not pp*vp = {pp * vpp} of num_layers = {model.num_layers}: an even split "
                              "assumed")
            last = layout_last_stage(layout, pp)
            if last == 0:  # Plan.last_stage_layers has no "none": a last rank of MTP and loss alone is not modelled
                return 0, 0, f"pipeline layout: the recipe's last rank holds no decoder layer ({why}): an even split"
            first = lighter_first(layout_rank_layers(layout, pp, 0), last, model.num_layers, pp)
            return first, last, f"{_first_note(first)}last pipeline rank {last} decoder layers ({why})"
    return embedding_loss_split(record, model, pp)


def lighter_first(first: int, last: int, layers: int, pp: int) -> int:
    """``first`` where it is below the ⌈(L − last)/(p − 1)⌉ layers an even split of the rest would give the first
    rank (Plan.first_stage_layers 0 means that split), else 0."""
    return first if first < -(-(layers - last) // (pp - 1)) else 0


def _first_note(first: int) -> str:
    return f"first pipeline rank {first} decoder layers beside the embedding, " if first else ""


def embedding_loss_split(record: dict[str, Any], model: ModelSpec, pp: int) -> tuple[int, int, str]:
    """The first and the last rank's decoder layers when the embedding and the loss take a pipeline slot each:
    (L + 2)/pp − 1 each, by the recipe (EMBEDDING_LOSS_SPLIT) or because a Megatron-Core stack could not split the
    layers otherwise."""
    slots = model.num_layers + 2
    if slots % pp:
        return 0, 0, ""
    last = slots // pp - 1
    key = recipe_key(record)
    why = first_source(EMBEDDING_LOSS_SPLIT, key)
    if not why and DEEPSPEED_EMBEDDING_PARTITION in json.dumps(record):
        why = f"the record names DeepSpeed's --pp-partition-method '{DEEPSPEED_EMBEDDING_PARTITION}'"
    chunks = pp * (positive_int((record.get("parallel") or {}).get("vp")) or 1)
    if not why and source_defaults(record).name in MCORE_STACKS and model.num_layers % chunks and not slots % chunks:
        why = (f"{model.num_layers} layers do not split into pp*vp = {chunks} model chunks but {slots} slots do: "
               "Megatron-Core's account_for_embedding/loss_in_pipeline_split")
    if not why:
        return 0, 0, ""
    first = lighter_first(last, last, model.num_layers, pp)
    note = f"last pipeline rank {last} decoder layers beside the head and the loss ({why})"
    return first, last, _first_note(first) + note
