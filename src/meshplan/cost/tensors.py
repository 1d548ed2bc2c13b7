"""Parameter tensors on one GPU: what a training step's per-parameter loops run over (issue 46). Once per optimizer
step the host walks the parameters one tensor at a time: the optimizer and its mixed-precision wrapper (gradient
copies, clipping's filters, the master-weight copies), the data-parallel wrapper (zeroing, bucket copies) and
per-parameter logging; ``Stack.tensor_host`` prices each tensor's share (step/host.step_host). The count is the
module's own tensors, as ``named_parameters()`` lists them (buffers, such as DeepSeek-V3's score-correction bias, are
none):

- a norm: its weight (``norm_weights``) and a LayerNorm's bias (``norm_bias``); a block has ``layer_norms`` of them;
- attention: the fused QKV projection as one weight (Megatron's linear_qkv, ``Stack.projections`` "fused" or
  "split") or three (Hugging Face's q_proj, k_proj, v_proj: "separate"), their biases (``qkv_bias``), the output
  projection and its bias (``out_bias`` / ``linear_bias``), the q / k norms (``qk_norm``), learnable sinks; MLA: the
  q down- and up-projections with the norm between (or one q projection without ``q_lora_rank``), the kv down- and
  up-projections with theirs, the output projection (Megatron-Core MLASelfAttention);
- an MLP: fc1 (gate and up fused, or two under "separate" with a GLU) and fc2, and their biases;
- MoE: the router, two weights per local expert and their biases (Megatron-Core's TEGroupedMLP and SequentialMLP keep
  one fc1 and one fc2 per expert), or the stack's stacked expert tensors (``Stack.expert_tensors``: torchtitan's w1,
  w2, w3; transformers' gate_up_proj and down_proj), the shared expert's MLP and gate;
- a recurrent mixer (Mamba, DeltaNet, KDA, lightning attention, RG-LRU, short convolution): 8, Megatron-Core
  MambaMixer's in_proj, conv1d weight and bias, dt_bias, A_log, D, norm and out_proj, taken for every such kind
  (an approximation: their counts differ by a few tensors);
- the embedding (its word table, a learned position table), the final norm and an untied LM head on the end ranks;
- under LoRA (``plan.finetune = "lora"``) only the adapters get gradients: an A and a B per adapted linear.
FSDP1 (``Stack.fsdp = "fsdp1"``) flattens each wrapped module's parameters into one FlatParameter: a layer is one
tensor to the optimizer. Which of them a step walks (``stepped``): a wrapper that shards its loops
(``Stack.tensor_sharded``: Megatron's DistributedOptimizer over its shard's main parameters, DeepSpeed's ZeRO-1/2
optimizer, stage_1_and_2.py, whose overflow check and gradient norm run over ``params_in_partition``) walks at ZeRO 1
and 2 the tensors of its own shard, the dense ones' 1/(dp·cp) and the experts' 1/N_e, N_e = tp·cp·dp/(ep·etp) the
ranks that share each expert's optimizer state (memory.py), at least one of each; every other wrapper walks every
tensor on the GPU (DeepSpeed's BF16_Optimizer, whose norm and clip loop over the whole bf16 model; ZeRO-3 and FSDP,
which partition each tensor; an unsharded optimizer).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.cost.params import (
    layers_on_first,
    layers_on_last,
    layers_on_rank,
    layers_on_stage,
    moe_fraction,
    qkv_linears,
)
from meshplan.cost.zero_group import zero_groups
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, maximum, minimum, where

RECURRENT_TENSORS = 8  # MambaMixer: in_proj, conv1d.weight, conv1d.bias, dt_bias, A_log, D, norm.weight, out_proj


def norm_tensors(model: ModelSpec) -> int:
    """A norm's learned tensors: its weight and a LayerNorm's bias."""
    return int(model.norm_weights) + int(model.norm == "layernorm" and model.norm_bias)


def attention_tensors(model: ModelSpec, stack: Stack) -> int:
    """An attention block's tensors, its norm excluded (module docstring)."""
    if model.is_mla:
        q = 3 if model.q_lora_rank else 1
        return q + 3 + 1
    qkv = 3 if stack.projection_mode.separate else 1
    return qkv * (1 + model.qkv_bias) + 1 + int(model.out_bias or model.linear_bias) + 2 * model.qk_norm * int(
        model.norm_weights) + int(model.attention_sinks)


def mlp_tensors(model: ModelSpec, stack: Stack) -> int:
    """A dense MLP's tensors: fc1 (two under separate GLU projections), fc2 and their biases."""
    fc1 = 2 if model.gated and stack.projection_mode.separate else 1
    return (fc1 + 1) * (1 + int(model.mlp_bias or model.linear_bias))


def expert_tensors(model: ModelSpec, stack: Stack, local_experts: Num) -> Num:
    """The routed experts' tensors on one GPU: fc1 and fc2 per local expert, or the stack's stacked tensors
    (``Stack.expert_tensors``), and their biases."""
    weights = stack.expert_tensors if stack.expert_tensors else 2 * local_experts
    return weights * (1 + int(model.mlp_bias or model.linear_bias))


def moe_tensors(model: ModelSpec, stack: Stack) -> int:
    """An MoE block's tensors beside its routed experts: the router, the shared expert and its gate."""
    shared = (mlp_tensors(model, stack) + int(model.shared_expert_gate)) if model.shared_expert_ffn_size else 0
    return 1 + shared


@dataclass(frozen=True, slots=True)
class Tensors:
    """Parameter tensors on one GPU: the dense ones (replicated over dp·cp) and the routed experts' (over N_e)."""

    dense: Num
    expert: Num = 0.0

    def scaled(self, k: Num) -> Tensors:
        return Tensors(self.dense * k, self.expert * k)

    def plus(self, other: Tensors) -> Tensors:
        return Tensors(self.dense + other.dense, self.expert + other.expert)


def kind_tensors(model: ModelSpec, plan: Plan, stack: Stack, kind: str) -> Tensors:
    """One layer's tensors of ``kind`` (a ``ModelSpec.block_counts`` key) on one GPU: its norms and blocks."""
    experts = Tensors(0.0, expert_tensors(model, stack, model.num_experts / plan.ep)) if model.is_moe else Tensors(0.0)
    norm = norm_tensors(model)
    if kind in ("dense", "moe") and not model.is_hybrid:
        mlp = moe_tensors(model, stack) if kind == "moe" else mlp_tensors(model, stack)
        dense = Tensors(model.layer_norms * norm + attention_tensors(model, stack) + mlp)
        return dense.plus(experts) if kind == "moe" else dense
    if kind in ("attention", "window"):
        return Tensors(norm + attention_tensors(model, stack))
    if kind == "parallel":  # attention beside a Mamba-2 mixer, one norm
        return Tensors(norm + attention_tensors(model, stack) + RECURRENT_TENSORS)
    if kind == "mlp":
        return Tensors(norm + mlp_tensors(model, stack))
    if kind == "moe":
        return Tensors(norm + moe_tensors(model, stack)).plus(experts)
    return Tensors(norm + RECURRENT_TENSORS)


def adapter_tensors(model: ModelSpec, plan: Plan) -> float:
    """LoRA's trainable tensors of an average layer: an A and a B for each linear cost/params.adapter_params adapts
    (the QKV projections; with ``lora_targets = "all"`` the output projection and the dense MLP's fc1 and fc2)."""
    rest = 1 + 2 * (1 - moe_fraction(model))
    return 2.0 * (len(qkv_linears(model)) + rest * (plan.lora_targets == "all"))


def layer_tensors(model: ModelSpec, plan: Plan, stack: Stack) -> Tensors:
    """Tensors of an average layer on one GPU (the kinds at their model-wide shares); one under FSDP1; the adapters'
    under LoRA."""
    if plan.finetune == "lora":
        return Tensors(adapter_tensors(model, plan))
    if stack.fsdp_mode.flat:
        return Tensors(1.0)
    kinds = model.block_counts
    total = Tensors(0.0)
    for kind, n in kinds.items():
        total = total.plus(kind_tensors(model, plan, stack, kind).scaled(n / model.num_layers))
    return total


def end_tensors(model: ModelSpec, plan: Plan, first: bool, single: Num) -> Num:
    """The first rank's embedding (word and learned position tables) or the last's final norm and LM head (a tied
    head has a copy of its own on the last stage when it is not the first, as Megatron keeps one: cost/params.py
    end_params); ``single``: one rank holds both. None under LoRA (the adapters are the layers')."""
    if plan.finetune == "lora":
        return 0.0
    embed = 1 + int(model.position_embedding == "learned")
    head = int(model.final_norm) * norm_tensors(model) + (1 - model.tied_embeddings * single)
    return embed + head * single if first else head + embed * single


def rank_tensors(model: ModelSpec, plan: Plan, stack: Stack) -> tuple[Tensors, Tensors, Tensors]:
    """Parameter tensors on the first, the last and a middle pipeline rank (module docstring)."""
    per_layer = layer_tensors(model, plan, stack)
    single = plan.pp == 1
    first = per_layer.scaled(layers_on_first(model, plan)).plus(Tensors(end_tensors(model, plan, True, single)))
    last = per_layer.scaled(layers_on_last(model, plan)).plus(Tensors(end_tensors(model, plan, False, single)))
    return first, last, per_layer.scaled(layers_on_stage(model, plan))


def tensors_on_rank(model: ModelSpec, plan: Plan, stack: Stack, rank: int) -> Tensors:
    """Parameter tensors on pipeline rank ``rank`` of one plan: its layers', and the embedding or the head on an end
    rank."""
    single = plan.pp == 1
    ends = (end_tensors(model, plan, True, single) if rank == 0 else 0) + (
        end_tensors(model, plan, False, single) if rank == plan.pp - 1 and not single else 0)
    return layer_tensors(model, plan, stack).scaled(layers_on_rank(model, plan, rank)).plus(Tensors(ends))


def stepped(tensors: Tensors, plan: Plan, stack: Stack) -> Num:
    """Of ``tensors`` on a GPU, how many its optimizer step walks one by one (module docstring): its shard's under a
    wrapper that shards its loops (``Stack.tensor_sharded``, outside FSDP) at ZeRO 1 and 2, at least one of each kind
    it holds; all of them otherwise."""
    whole = tensors.dense + tensors.expert
    if not stack.tensor_sharded or stack.fsdp_mode.shards:
        return whole
    group, experts = zero_groups(plan)  # memory.py's N_d and N_e, or the smaller ZeRO groups (cost/zero_group.py)
    experts_share = maximum(1.0, experts)
    shard = (maximum(tensors.dense / group, minimum(tensors.dense, 1.0))
             + maximum(tensors.expert / experts_share, minimum(tensors.expert, 1.0)))
    return where((plan.zero == 1) | (plan.zero == 2), shard, whole)
