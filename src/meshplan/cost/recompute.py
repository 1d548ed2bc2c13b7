"""Selective recompute: what each of Megatron-Core's recompute modules (``Plan.recompute_modules``) runs again
before the backward pass and which saved activations its checkpoint frees, as masks over a layer's ops."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from meshplan.cost.records import OpCost


@dataclass(frozen=True, slots=True)
class Recompute:
    """What one of Megatron-Core's selective recompute modules (``Plan.recompute_modules``) does to a layer's ops:
    the forward kernels it runs again before the backward pass (``reruns``), the tensor-parallel collectives inside
    it that run again with them (``collectives``), and the forward records whose saved activations its checkpoint
    frees (``frees``): the module's inner tensors under a plain checkpoint, which keeps only the module's input, or
    the module's output under Megatron's output-discarding checkpoint (``CheckpointWithoutOutput``), which the next
    op would have kept. ``all_to_all``: the module's token dispatch and combine run again too (the forward's EP
    time). Names match an op of that name and its sub-records ("attn/q" matches "attn/q/cast", not "attn/q_up"); a
    name ending in "/" matches every op below it."""

    reruns: tuple[str, ...]
    frees: tuple[str, ...]
    collectives: tuple[str, ...] = ()
    all_to_all: bool = False


# Megatron-Core megatron/core/transformer/transformer_config.py (recompute_modules) and transformer_layer.py, the
# modules as they act on the ops of attention.py and mlp_moe.py:
RECOMPUTE_MODULES: dict[str, Recompute] = {
    # checkpoint(core_attention, q, k, v): q, k, v stay saved; an unfused kernel's softmax probabilities, dropout
    # mask and output are recomputed (Korthikanti et al. 2022 §5, "selective activation recomputation"); a flash
    # kernel keeps only its log-sum-exp besides q, k, v, so recomputing it frees next to nothing
    "core_attn": Recompute(("attn/core",), ("attn/scores",)),
    # output-discarding checkpoint of the norms that are modules of their own: in Megatron-Core's Transformer Engine
    # layer specs the attention's input norm and a dense MLP's pre-MLP norm are fused into linear_qkv / linear_fc1
    # (IdentityOp: nothing to recompute), a MoE layer's pre-MLP norm is not (its router and experts both read it):
    # its output, which the router keeps, is freed and recomputed (TransformerLayer.recompute_pre_mlp_layernorm)
    "layernorm": Recompute(("moe/norm",), ("moe/router",)),
    # output-discarding checkpoint of the experts' activation function: its output, fc2's saved input, is recomputed
    "moe_act": Recompute(("moe/experts/act",), ("moe/experts/fc2", "moe/experts/act/clamp")),
    # checkpoint(mlp, hidden) on layers with a dense MLP only ("if not isinstance(self.mlp, MoELayer)"): the MLP
    # module holds the pre-MLP norm fused into linear_fc1, so only its input stays saved and norm, fc1 with its
    # sequence-parallel gather, the activation and fc2 with its reduce-scatter run again
    "mlp": Recompute(("mlp/norm", "mlp/fc1", "mlp/act", "mlp/fc2"), ("mlp/fc1", "mlp/act", "mlp/fc2"),
                     ("mlp/tp_in", "mlp/tp_out")),
    # checkpoint(moe_layer, norm output): router, latent projections, permutation, dispatch, experts, combine and
    # shared experts run again; only the norm output the router keeps stays saved
    "moe": Recompute(("moe/router", "moe/latent_in", "moe/latent_out", "moe/permute", "moe/unpermute",
                      "moe/experts/", "moe/shared/"),
                     ("moe/latent_in", "moe/latent_out", "moe/experts/", "moe/shared/"),
                     ("moe/shared_tp_in", "moe/shared_tp_out"), all_to_all=True),
    "shared_experts": Recompute(("moe/shared/",), ("moe/shared/act", "moe/shared/fc2"),
                                ("moe/shared_tp_in", "moe/shared_tp_out")),
    # output-discarding checkpoint of multi-head latent attention's up-projections (and RoPE): the q, k, v the
    # attention core keeps are recomputed from the latents they keep (Megatron-Core qkv_up_proj_and_rope_apply; a
    # model without a query latent, q_lora_rank 0, runs its whole query projection there)
    "mla_up_proj": Recompute(("attn/q_up", "attn/kv_up", "attn/q"), ("attn/core",)),
}


@lru_cache(maxsize=64)
def _patterns(modules: tuple[str, ...], part: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, prefixes) of ``part`` ("reruns", "frees" or "collectives") of ``modules``: the exact names (with
    their "/"-sub-records) and the "/"-ended prefixes."""
    names = [p for m in modules for p in getattr(RECOMPUTE_MODULES[m], part)]
    return (tuple(p for p in names if not p.endswith("/")), tuple(p + "/" if not p.endswith("/") else p
                                                                   for p in names))


def _matches(name: str, patterns: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    exact, prefixes = patterns
    return name in exact or name.startswith(prefixes)


def rerun_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward kernel that the selective recompute of ``modules`` runs again in the backward pass."""
    patterns = _patterns(modules, "reruns")
    return [op.phase == "fwd" and op.kind != "collective" and _matches(op.name, patterns) for op in ops]


def tp_rerun_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward tensor-parallel collective inside a module ``modules`` recompute, which runs again."""
    patterns = _patterns(modules, "collectives")
    return [op.phase == "fwd" and op.kind == "collective" and _matches(op.name, patterns) for op in ops]


def freed_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward record whose saved activations the selective recompute of ``modules`` frees."""
    patterns = _patterns(modules, "frees")
    return [op.phase == "fwd" and _matches(op.name, patterns) for op in ops]
