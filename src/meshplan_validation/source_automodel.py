"""NeMo AutoModel's own MoE models (sources.SOURCES, before the generic PyTorch FSDP2 profile): how they hold their
weights, which its performance tables do not state.

The MoE rows of its Performance Summary (docs/performance-summary.md @01926a5c) run AutoModel's own model classes
with its MoE parallelizer, not Hugging Face's: examples/benchmark/configs/{deepseek_v3,kimi_k2,qwen3_moe_30b,
gptoss_20b,gptoss_120b}_te_deepep.yaml @01926a5c build nemo_automodel.components.models.{deepseek_v3,qwen3_moe,
gpt_oss}.model.*ForCausalLM.from_config on the meta device, and the checkpointer's load_base_model
(components/checkpoint/checkpointing.py) calls each model's initialize_weights(), which ends in self.to(dtype) with
dtype bfloat16 (deepseek_v3/model.py, qwen3_moe/model.py, gpt_oss/model.py @01926a5c). The parameters are bf16: the
configs' torch.optim.Adam keeps its moments in bf16 beside them and there is no fp32 master copy
(``Stack.master_weights`` False, cost/model_states.optimizer_bytes); FSDP2 (components/moe/parallelizer.py apply_fsdp:
MixedPrecisionPolicy param bf16, reduce fp32) reduces in fp32 and casts each reduced shard back to the bf16
parameter. Their experts dispatch through DeepEP's normal kernels (``Stack.moe_dispatcher`` "flex", ``flex_backend``
"deepep"): every config sets backend.enable_deepep true, which builds components/moe/layers.py GroupedExpertsDeepEP
and its MoEFlexTokenDispatcher (components/moe/megatron/token_dispatcher.py), whose fused_dispatch / fused_combine
(components/moe/megatron/fused_a2a.py @01926a5c) call deep_ep Buffer.dispatch / combine, the normal (not
low-latency) kernels that cross the network once per node a token hits (collectives/dispatch.py), with
async_finish=False: the exchange waits on the compute stream, exposed (``overlap_ep`` False). Every config sets
backend.fake_balanced_gate true ("Fake balanced gate is enabled to simulate ideal expert routing", the summary's
notes): components/moe/layers.py FakeBalancedGate routes token i to experts (i·k + j) mod E, j < k, k experts in a
row, which EP's even split puts on one node where a node holds k or more of them (``Stack.moe_routing``
"contiguous", collectives/dispatch.node_hit): a token crosses the network to one node, not to the 4.6 of 7 other
nodes a uniform router's top-8 of 256 hits over 8 nodes. Every config sets backend.rms_norm te, which builds each norm
as Transformer Engine's RMSNorm module (components/moe/utils.py initialize_rms_norm_module), one fused kernel each
way, in an otherwise eager model (its RoPE, activations and residuals eager ops): ``Stack.fusion`` "eager-te"
(specs/fusion.py). Their pipelines (DeepSeek-V3, Kimi K2) run torch.distributed.pipelining with AutoModel's own
copy of the stage's backward (components/moe/fsdp_mixin.py patched_backward_maybe_with_nosync @01926a5c, which
the DeepSeek-V3 configs' enable_fsdp_optimizations installs: distributed/pipelining/functional.py:523-526) or, in
Kimi K2's config, which leaves it unset, torch's own (pyproject.toml: torch<=2.9.0), whose FSDP branch the copy
keeps ("it manually triggers post-backward hooks", the MoEFSDPSyncMixin docstring; the FSDPModule branch, not the
MoEFSDPSyncMixin one that reduces once an optimizer step, since components/moe/parallelizer.py:216-217 also
fully_shards the outer *ForCausalLM, so the stage's submod is an FSDPModule): a stage's last backward of a run
runs with FSDP2's sync off, then every param group's post_backward reduce-scatters by hand and
_root_post_backward_final_callback makes the compute stream wait for them: ``Stack.pipeline_runtime``
"torch-reduce-after" (specs/pipeline_runtime.py), each run's reduce-scatter exposed. The framework text of
these rows names the expert-parallel path ("+ EP", DeepEP); its dense rows (Llama 3 70B through transformers) keep the
generic FSDP2 profile.
"""

from __future__ import annotations

import re
from typing import Any

from meshplan_validation.recipes import recipe_key

AUTOMODEL_MOE = r"automodel.*(?:\+ ?ep\b|deepep)"
AUTOMODEL_MOE_WHY = ("NeMo AutoModel's own MoE models (DeepSeek-V3, Kimi K2, Qwen3 MoE, gpt-oss): FSDP2 with expert "
                     "parallelism, the model cast to bf16 by initialize_weights (no fp32 master copy; Adam's moments "
                     "in bf16), gradients reduced in fp32 and kept in bf16, tokens dispatched by DeepEP's "
                     "forwarding kernels, each to the one node its fake balanced gate's k experts sit on "
                     "(source_automodel.py)")
# the Stack fields the module docstring gives, over the SDPA-era PyTorch profile (sources.py); schedule_batch: the
# configs' step_scheduler.local_batch_size, 8 in every one that pipelines (deepseek_v3_te_deepep{,_1024}.yaml,
# kimi_k2_te_deepep.yaml @01926a5c), the sequences of one run of the pipeline schedule (step/stages.schedule_runs)
AUTOMODEL_MOE_STACK = {"fsdp": "fsdp2", "master_weights": False, "moe_dispatcher": "flex", "flex_backend": "deepep",
                       "moe_routing": "contiguous", "schedule_batch": 8, "fusion": "eager-te",
                       "pipeline_runtime": "torch-reduce-after"}
# (regex on "group model gpu num_gpus" (recipes.recipe_key), autopipeline.layers_per_stage, the config): the
# benchmark configs @01926a5c that pipeline, each named by its model and its benchmark.num_nodes x 8 GPUs
LAYERS_PER_STAGE = ((r"^nemo_automodel\S* deepseek-v3 .* 256$", 2, "deepseek_v3_te_deepep.yaml"),
                    (r"^nemo_automodel\S* deepseek-v3 .* 1024$", 4, "deepseek_v3_te_deepep_1024.yaml"),
                    (r"^nemo_automodel\S* kimi k2 .* 256$", 2, "kimi_k2_te_deepep.yaml"))


def config_chunks(record: dict[str, Any], layers: int, pp: int, notes: list[str]) -> int:
    """Model chunks per pipeline rank as AutoModel's AutoPipeline makes them from its config's layers_per_stage
    (``LAYERS_PER_STAGE``), not the table's VP column: components/distributed/pipelining/functional.py
    calculate_virtual_stages @01926a5c takes ⌈L / layers_per_stage⌉ stages, rounded down to a multiple of pp
    (the configs' round_virtual_stages_to_pp_multiple: down), so v = that / pp (DeepSeek-V3's 61 layers at 2 a stage
    over pp 4: 28 stages, v 7; at 4: 16, v 4; Kimi K2's at 2 over pp 8: 24, v 3), and
    generate_hf_model_fqn_per_model_part gives the first L mod stages a layer more (the first rank's 16 of 61 layers
    at pp 4, as the even split's ⌈L / p⌉). 0 where no config row matches the record."""
    gpus = (record.get("hardware") or {}).get("num_gpus")
    key = recipe_key(record, str(gpus))
    for pattern, per_stage, config in LAYERS_PER_STAGE:
        if pp > 1 and re.search(pattern, key):
            stages = -(-layers // per_stage)
            v = max(1, (stages - stages % pp) // pp)
            notes.append(f"{v} model chunks a pipeline rank (AutoPipeline's layers_per_stage {per_stage}: {stages} "
                         f"stages of {layers} layers, rounded down to {v * pp}; examples/benchmark/configs/{config} "
                         "@01926a5c; the table's VP column says otherwise)")
            return v
    return 0
