"""The pipeline layouts of the Megatron-Bridge recipes: how many decoder layers the last pipeline rank holds where a
recipe places the embedding, the loss or the multi-token-prediction layers as pipeline layers of their own
(Plan.last_stage_layers), each with the recipe file it comes from.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan.specs.model import ModelSpec
from meshplan_validation.recipes import recipe_key
from meshplan_validation.records import positive_int
from meshplan_validation.sources import source_defaults

# loss, "|" between model chunks; chunk i runs on pipeline rank i mod p) of Megatron-Bridge's DeepSeek-V3 recipes:
# (regex on "group model gpu", layout, source). The last rank's decoder layers become Plan.last_stage_layers.
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
# pipeline_split / account_for_loss_in_pipeline_split, get_num_layers_to_build): the L + 2 slots split evenly over the
# ranks, so the first and the last rank hold one decoder layer fewer than the others. (regex on "group model gpu",
# source)
EMBEDDING_LOSS_SPLIT: tuple[tuple[str, str], ...] = (
    (r"megatron_bridge\S*.*llama ?3\.1[- ]?405b",
     "src/megatron/bridge/recipes/llama/llama3.py llama31_405b_pretrain_config: account_for_embedding_in_pipeline_"
     "split = account_for_loss_in_pipeline_split = True"),
    (r"megatron_bridge\S*.*qwen3[- ]?235b",
     "src/megatron/bridge/recipes/qwen/qwen3_moe.py qwen3_235b_a22b_pretrain_config: account_for_embedding_in_"
     "pipeline_split = account_for_loss_in_pipeline_split = True"),
)
# Megatron-Core's stacks build pp·vp model chunks of whole layers only: where the record's L layers do not split into
# them but L + 2 do, the run must count the embedding and the loss as a layer each (get_num_layers_to_build)
MCORE_STACKS = ("Megatron-Bridge", "Megatron-Core 2024", "Megatron-LM examples", "NeMo 24.x")


def layout_last_stage(layout: str, pp: int) -> int:
    """Decoder layers ("t") of a pipeline layout's chunks on the last rank (chunk i on rank i mod pp)."""
    chunks = layout.split("|")
    return sum(chunk.count("t") for i, chunk in enumerate(chunks) if i % pp == pp - 1)


def last_stage_layers(record: dict[str, Any], model: ModelSpec, pp: int, vpp: int) -> tuple[int, str]:
    """The last pipeline rank's decoder layers under the recipe's pipeline layout, where one applies to this
    (pp, vpp): as many chunks as pp·vpp and as many decoder layers as the model's; else 0 (an even split)."""
    if pp == 1:
        return 0, ""
    key = recipe_key(record)
    for pattern, layout, why in PIPELINE_LAYOUTS:
        if re.search(pattern, key):
            chunks, decoders = layout.count("|") + 1, layout.count("t")
            if chunks != pp * vpp or decoders != model.num_layers:
                return 0, (f"pipeline layout: the recipe's ({why}) has {chunks} chunks of {decoders} decoder layers, "
                           f"not pp*vp = {pp * vpp} of num_layers = {model.num_layers}: an even split assumed")
            last = layout_last_stage(layout, pp)
            if last == 0:  # Plan.last_stage_layers has no "none": a last rank of MTP and loss alone is not modelled
                return 0, f"pipeline layout: the recipe's last rank holds no decoder layer ({why}): an even split"
            return last, f"last pipeline rank {last} decoder layers ({why})"
    return embedding_loss_split(record, model, pp)


def embedding_loss_split(record: dict[str, Any], model: ModelSpec, pp: int) -> tuple[int, str]:
    """The last rank's decoder layers when the embedding and the loss take a pipeline slot each: (L + 2)/pp − 1, by
    the recipe (EMBEDDING_LOSS_SPLIT) or because a Megatron-Core stack could not split the layers otherwise."""
    slots = model.num_layers + 2
    if slots % pp:
        return 0, ""
    last = slots // pp - 1
    key = recipe_key(record)
    why = next((why for pattern, why in EMBEDDING_LOSS_SPLIT if re.search(pattern, key)), "")
    chunks = pp * (positive_int((record.get("parallel") or {}).get("vp")) or 1)
    if not why and source_defaults(record).name in MCORE_STACKS and model.num_layers % chunks and not slots % chunks:
        why = (f"{model.num_layers} layers do not split into pp*vp = {chunks} model chunks but {slots} slots do: "
               "Megatron-Core's account_for_embedding/loss_in_pipeline_split")
    return (last, f"last pipeline rank {last} decoder layers and the loss ({why})") if why else (0, "")
