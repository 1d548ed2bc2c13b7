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
nodes a uniform router's top-8 of 256 hits over 8 nodes. The framework text of
these rows names the expert-parallel path ("+ EP", DeepEP); its dense rows (Llama 3 70B through transformers) keep the
generic FSDP2 profile.
"""

from __future__ import annotations

AUTOMODEL_MOE = r"automodel.*(?:\+ ?ep\b|deepep)"
AUTOMODEL_MOE_WHY = ("NeMo AutoModel's own MoE models (DeepSeek-V3, Kimi K2, Qwen3 MoE, gpt-oss): FSDP2 with expert "
                     "parallelism, the model cast to bf16 by initialize_weights (no fp32 master copy; Adam's moments "
                     "in bf16), gradients reduced in fp32 and kept in bf16, tokens dispatched by DeepEP's "
                     "forwarding kernels, each to the one node its fake balanced gate's k experts sit on "
                     "(source_automodel.py)")
# the Stack fields the module docstring gives, over the SDPA-era PyTorch profile (sources.py)
AUTOMODEL_MOE_STACK = {"fsdp": "fsdp2", "master_weights": False, "moe_dispatcher": "flex", "flex_backend": "deepep",
                       "moe_routing": "contiguous"}
