"""Parameter tensors on one GPU: what a training step's per-parameter loops run over (issue 46). Once per optimizer
step the host walks the parameters one tensor at a time: the optimizer and its mixed-precision wrapper (gradient
copies, clipping's filters, the master-weight copies), the data-parallel wrapper (zeroing, bucket copies) and
per-parameter logging; ``Stack.tensor_host`` prices each tensor's share (step/host.step_host). The count is the
module's own tensors, as ``named_parameters()`` lists them:

- a norm: its weight (``norm_weights``) and a LayerNorm's bias (``norm_bias``); a block has ``layer_norms`` of them;
- attention: the fused QKV projection as one weight (Megatron's linear_qkv, ``Stack.projections`` "fused" or
  "split") or three (Hugging Face's q_proj, k_proj, v_proj: "separate"), their biases (``qkv_bias``), the output
  projection and its bias (``out_bias`` / ``linear_bias``), the q / k norms (``qk_norm``); MLA: the q down- and
  up-projections with the norm between (or one q projection without ``q_lora_rank``), the kv down- and
  up-projections with theirs, the output projection (Megatron-Core MLASelfAttention);
- an MLP: fc1 (gate and up fused, or two under "separate" with a GLU) and fc2, and their biases;
- MoE: the router (and its bias), two weights per local expert (Megatron-Core's TEGroupedMLP and SequentialMLP keep
  one fc1 and one fc2 per expert), the shared expert's MLP and gate;
- a recurrent mixer (Mamba, DeltaNet, KDA, lightning attention, RG-LRU, short convolution): 8, Megatron-Core
  MambaMixer's in_proj, conv1d weight and bias, dt_bias, A_log, D, norm and out_proj, taken for every such kind
  (an approximation: their counts differ by a few tensors);
- the embedding (its word table, a learned position table), the final norm and an untied LM head on the end ranks.
FSDP1 (``Stack.fsdp = "fsdp1"``) flattens each wrapped module's parameters into one FlatParameter: a layer is one
tensor to the optimizer. The tensors a step walks (``stepped``): a sharded optimizer's wrapper outside FSDP
(Megatron's distributed optimizer, DeepSpeed's ZeRO-1/2: ``plan.zero`` ≥ 1) loops over the tensors of its own shard,
about 1/(dp·cp) of them (Megatron-Core's DistributedOptimizer over its shard's main parameters; DeepSpeed
stage_1_and_2.py's overflow check and gradient norm over ``params_in_partition``); FSDP steps every tensor's shard
(FSDP2's DTensors, FSDP1's FlatParameters), as does an optimizer without ZeRO.
"""

from __future__ import annotations

from meshplan.cost.params import layers_on_first, layers_on_last, layers_on_rank, layers_on_stage, moe_fraction
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, where

RECURRENT_TENSORS = 8  # MambaMixer: in_proj, conv1d.weight, conv1d.bias, dt_bias, A_log, D, norm.weight, out_proj


def norm_tensors(model: ModelSpec) -> int:
    """A norm's learned tensors: its weight and a LayerNorm's bias."""
    return int(model.norm_weights) + int(model.norm == "layernorm" and model.norm_bias)


def attention_tensors(model: ModelSpec, stack: Stack) -> int:
    """An attention block's tensors, its norm excluded (module docstring)."""
    if model.is_mla:
        q = 3 if model.q_lora_rank else 1
        return q + 3 + 1
    qkv = 3 if stack.projections == "separate" else 1
    return qkv * (1 + model.qkv_bias) + 1 + int(model.out_bias or model.linear_bias) + 2 * model.qk_norm * int(
        model.norm_weights)


def mlp_tensors(model: ModelSpec, stack: Stack) -> int:
    """A dense MLP's tensors: fc1 (two under separate GLU projections), fc2 and their biases."""
    fc1 = 2 if model.gated and stack.projections == "separate" else 1
    return (fc1 + 1) * (1 + int(model.mlp_bias or model.linear_bias))


def moe_tensors(model: ModelSpec, stack: Stack, local_experts: Num) -> Num:
    """An MoE block's tensors on one GPU: the router, two per local expert, the shared expert and its gate."""
    shared = (mlp_tensors(model, stack) + int(model.shared_expert_gate)) if model.shared_expert_ffn_size else 0
    return 1 + int(model.router_bias) + 2 * local_experts + shared


def kind_tensors(model: ModelSpec, plan: Plan, stack: Stack, kind: str) -> Num:
    """One layer's tensors of ``kind`` (a ``ModelSpec.block_counts`` key) on one GPU: its norms and blocks."""
    local = model.num_experts / plan.ep if model.is_moe else 0
    norm = norm_tensors(model)
    if kind in ("dense", "moe") and not model.is_hybrid:
        mlp = moe_tensors(model, stack, local) if kind == "moe" else mlp_tensors(model, stack)
        return model.layer_norms * norm + attention_tensors(model, stack) + mlp
    if kind in ("attention", "window"):
        return norm + attention_tensors(model, stack)
    if kind == "parallel":  # attention beside a Mamba-2 mixer, one norm
        return norm + attention_tensors(model, stack) + RECURRENT_TENSORS
    if kind == "mlp":
        return norm + mlp_tensors(model, stack)
    if kind == "moe":
        return norm + moe_tensors(model, stack, local)
    return norm + RECURRENT_TENSORS


def layer_tensors(model: ModelSpec, plan: Plan, stack: Stack) -> Num:
    """Tensors of an average layer on one GPU (the kinds at their model-wide shares); one under FSDP1."""
    if stack.fsdp == "fsdp1":
        return 1.0
    kinds = model.block_counts
    if not model.is_hybrid and "moe" in kinds:
        f = moe_fraction(model)
        return (1 - f) * kind_tensors(model, plan, stack, "dense") + f * kind_tensors(model, plan, stack, "moe")
    return sum(n * kind_tensors(model, plan, stack, k) for k, n in kinds.items()) / model.num_layers


def end_tensors(model: ModelSpec, first: bool, single: Num) -> Num:
    """The first rank's embedding (word and learned position tables) or the last's final norm and LM head (a tied
    head has a copy of its own on the last stage when it is not the first, as Megatron keeps one: cost/params.py
    end_params); ``single``: one rank holds both."""
    embed = 1 + int(model.position_embedding == "learned")
    head = int(model.final_norm) * norm_tensors(model) + (1 - model.tied_embeddings * single)
    return embed + head * single if first else head + embed * single


def rank_tensors(model: ModelSpec, plan: Plan, stack: Stack) -> tuple[Num, Num, Num]:
    """Parameter tensors on the first, the last and a middle pipeline rank (module docstring)."""
    per_layer = layer_tensors(model, plan, stack)
    single = plan.pp == 1
    first = layers_on_first(model, plan) * per_layer + end_tensors(model, True, single)
    last = layers_on_last(model, plan) * per_layer + end_tensors(model, False, single)
    return first, last, layers_on_stage(model, plan) * per_layer


def tensors_on_rank(model: ModelSpec, plan: Plan, stack: Stack, rank: int) -> Num:
    """Parameter tensors on pipeline rank ``rank`` of one plan: its layers', and the embedding or the head on an end
    rank."""
    single = plan.pp == 1
    ends = (end_tensors(model, True, single) if rank == 0 else 0) + (
        end_tensors(model, False, single) if rank == plan.pp - 1 and not single else 0)
    return layers_on_rank(model, plan, rank) * layer_tensors(model, plan, stack) + ends


def stepped(tensors: Num, plan: Plan, stack: Stack) -> Num:
    """Of ``tensors`` on a GPU, those its optimizer step walks one by one (module docstring): its shard's under a
    sharded optimizer outside FSDP (ZeRO ≥ 1), all of them otherwise."""
    if stack.fsdp != "none":
        return tensors
    return where(plan.zero >= 1, tensors / (plan.dp * plan.cp), tensors)
