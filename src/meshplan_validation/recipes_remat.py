"""The activation recompute of benchmark recipes outside Megatron, which their published tables do not state: JAX's
MaxText and Paxml as NVIDIA's DGX Cloud recipes run them, and NeMo AutoModel's benchmark configs, each with the file
it comes from. Keyed like recipes.py by a pattern on the record's ``recipe_key``; map_training.recompute applies them
after what a record states and before its source's default.

JAX rematerialises by name: a layer under ``jax.checkpoint`` with ``save_only_these_names(...)`` keeps the outputs
tagged with those names (``checkpoint_name``) and its input, and the backward pass recomputes everything else it
needs. The DGX Cloud recipes keep the attention's Q, K, V and output projections, so the attention core and the MLP's
input projections and activation run again: priced as Megatron-Core's selective recompute of ``core_attn`` and
``mlp`` (cost/recompute.py), which frees the same saved tensors. Simplification: that module also reruns the MLP's
output projection, which JAX does not replay (its output is read by the residual add only), and keeps the attention's
input norm, which JAX recomputes.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan_validation.recipes import recipe_key

# (regex on "group model gpu", recompute mode, selective modules, source). First match wins.
REMAT: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (r"^dgxc_maxtext_llama2_70b\b", "selective", ("core_attn", "mlp"),
     "NVIDIA/dgxc-benchmarking maxtext/configure.sh @143b90dd (v25.01, the README's tables, container "
     "maxtext-2024-12-09): remat_policy=custom with query_proj, key_proj, value_proj, qkv_proj, out_proj (and mlpwo "
     "in BF16) saved on the device, every other activation rematerialised (--xla_disable_hlo_passes="
     "rematerialization: XLA adds none of its own)"),
    (r"^dgxc_paxml_gpt3_175b\b", "selective", ("core_attn", "mlp"),
     "NVIDIA/dgxc-benchmarking paxml/paxml_mod_configs.py @143b90dd: Synthetic175BCkpt CHECKPOINT_POLICY = "
     "AutodiffCheckpointType.SAVE_QKV_OUT_PROJ, which google/praxis praxis/layers/checkpoint_policy.py maps to "
     "jax.checkpoint_policies.save_only_these_names('combined_qkv_proj', 'out_proj')"),
    (r"^nemo_automodel\S* (kimi k2|deepseek-v3|qwen3-30b-a3b)", "full", (),
     "NVIDIA-NeMo/Automodel examples/benchmark/configs/{kimi_k2,deepseek_v3,deepseek_v3_te_deepep_1024,"
     "qwen3_moe_30b}_te_deepep.yaml @01926a5c (the performance summary's commit): distributed.activation_checkpointing "
     "true, which components/moe/parallelizer.py apply_ac turns into a checkpoint_wrapper around every decoder block "
     "(its gpt-oss configs set false)"),
    (r"^nemo_automodel\S* llama 3 70b", "full", (),
     "NVIDIA-NeMo/Automodel examples/llm_benchmark/llama3_3/custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml "
     "@e4581201 (the page's row: 64 GPUs, cp 2, global batch 128 of 8192 tokens): activation_checkpointing True, "
     "which components/distributed/parallelizer.py there applies to every whole decoder layer (transformers' "
     "gradient checkpointing) when the model is not compiled"),
)


def recipe_remat(record: dict[str, Any]) -> tuple[str, tuple[str, ...], str] | None:
    """(mode, selective modules, note) of the recipe's activation recompute, or None where no row says."""
    key = recipe_key(record)
    for pattern, mode, modules, why in REMAT:
        if re.search(pattern, key):
            what = f"selective recompute of {', '.join(modules)}" if modules else "full activation recompute"
            return mode, modules, f"{what} (not stated; {why})"
    return None
