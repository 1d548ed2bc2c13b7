"""One transformer layer of each kind the model has, one micro-batch, one GPU: the dispatcher that composes the
blocks (attention.py, mlp_moe.py, mamba.py; summa.py and tp2d.py for the 2D layouts) with what the stack and plan add
(eager kernels, low-precision casts, LoRA, FSDP's gradient preparation)."""

from __future__ import annotations

from collections.abc import Callable
from importlib import import_module

from meshplan.cost.attention import attention_block, qkv_concat, varlen_padding
from meshplan.cost.blocks import norm
from meshplan.cost.casts import low_precision_casts
from meshplan.cost.eager import eager_kernel_counts, eager_layer, softmax_unfused
from meshplan.cost.extras import extra_ops
from meshplan.cost.fsdp import layer_fsdp_grad
from meshplan.cost.lora import lora
from meshplan.cost.mlp_moe import mlp_block, moe_block
from meshplan.cost.records import Dims, OpCost, dims
from meshplan.specs.layouts import layout_of
from meshplan.specs.mixer_params import attention_spec
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

# A hybrid block's mixer by kind (``ModelSpec.layer_pattern``): the module and function that cost it, imported the
# first time a model has that kind (a dense or MoE model's start-up loads none of the recurrent mixers)
MIXER_COSTS = {"mamba": ("mamba", "mamba_block"), "mamba1": ("mamba1", "mamba1_block"),
          "deltanet": ("deltanet", "deltanet_block"), "kda": ("kda", "kda_block"),
          "lightning": ("lightning", "lightning_block"), "attention": ("attention", "attention_block"),
          "window": ("attention", "attention_block"), "parallel": ("parallel", "parallel_block"),
          "rglru": ("rglru", "rglru_block"), "shortconv": ("shortconv", "shortconv_block"),
          "mlp": ("mlp_moe", "mlp_block"), "moe": ("mlp_moe", "moe_block")}


def mixer(kind: str) -> Callable[..., list[OpCost]]:
    """The function that costs one ``kind`` block's mixer (``MIXER_COSTS``)."""
    module, name = MIXER_COSTS[kind]
    block: Callable[..., list[OpCost]] = getattr(import_module(f"meshplan.cost.{module}"), name)
    return block


def stack_extras(model: ModelSpec, plan: Plan, d: Dims, kind: str) -> list[OpCost]:
    """What the software stack adds to a layer: its model code's attention copies (flash-attn's varlen packing,
    the QKV split's backward concatenation; layers with attention) and FSDP's gradient preparation
    (``layer_fsdp_grad``); and the model's extra structures (cost/extras.py), in every tensor layout."""
    attention = varlen_padding(model, plan, d) + qkv_concat(model, plan, d) if kind in ("dense", "moe",
                                                                                        "attention", "window",
                                                                                        "parallel") else []
    if model.is_hybrid and kind == "moe":
        attention = []
    return attention + layer_fsdp_grad(model, plan, d.stack, kind) + extra_ops(model, plan, d, kind)


def dense_layer(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """One transformer layer with a dense MLP, one micro-batch, one GPU."""
    d = dims(model, plan, stack)
    if layout_of(plan.tensor_layout).grid:
        return GRID_LAYERS[plan.tensor_layout](model, plan, stack, d)
    ops = eager_kernel_counts(attention_block(model, plan, d) + mlp_block(model, plan, d)
                              + eager_layer(model, plan, d), model, stack,
                              softmax_unfused(model, stack, plan.micro_batch, plan.tp))
    return low_precision_casts(lora(ops + stack_extras(model, plan, d, "dense"), plan, d), plan, stack)


def _summa_layer(model: ModelSpec, plan: Plan, stack: Stack, d: Dims) -> list[OpCost]:
    from meshplan.cost.summa import summa_layer  # noqa: PLC0415

    return lora(summa_layer(model, plan, d) + stack_extras(model, plan, d, "dense"), plan, d)


def _tp2d_layer(model: ModelSpec, plan: Plan, stack: Stack, d: Dims) -> list[OpCost]:
    from meshplan.cost.tp2d import tp2d_layer  # noqa: PLC0415

    return low_precision_casts(tp2d_layer(model, plan, d) + stack_extras(model, plan, d, "dense"), plan, stack)


# the grid layouts' dense layers (specs/layouts.py: grid), their modules imported by their plans only (few stacks run
# them)
GRID_LAYERS: dict[str, Callable[[ModelSpec, Plan, Stack, Dims], list[OpCost]]] = {"summa": _summa_layer,
                                                                                    "tp2d": _tp2d_layer}


def moe_layer(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    d = dims(model, plan, stack)
    ops = eager_kernel_counts(attention_block(model, plan, d) + moe_block(model, plan, d)
                              + eager_layer(model, plan, d, moe=True), model, stack,
                              softmax_unfused(model, stack, plan.micro_batch, plan.tp))
    return low_precision_casts(lora(ops + stack_extras(model, plan, d, "moe"), plan, d), plan, stack)


def hybrid_block(model: ModelSpec, plan: Plan, stack: Stack, kind: str) -> list[OpCost]:
    """One block of a hybrid model (``ModelSpec.layer_pattern``), one micro-batch, one GPU: its pre-norm, mixer
    and residual. Fused kernels only (check.check refuses eager, SUMMA and LoRA plans for a hybrid)."""
    d = dims(model, plan, stack)
    block = mixer(kind)
    spec = attention_spec(model, kind)  # a "W" block's or, beside them, a "*" block's own attention
    post = norm(f"{kind}/post_norm", model, d) if model.block_norms == 2 else []  # Gemma 4's post-norms
    return low_precision_casts(block(spec, plan, d) + post + stack_extras(spec, plan, d, kind), plan, stack)


def layer_kinds(model: ModelSpec, plan: Plan, stack: Stack, kinds: tuple[str, ...] | None = None
                ) -> dict[str, list[OpCost]]:
    """The ops of one layer of each kind the model has (``ModelSpec.block_counts``), or of those of ``kinds``."""
    wanted = [kind for kind in model.block_counts if kinds is None or kind in kinds]
    if model.is_hybrid:
        return {kind: hybrid_block(model, plan, stack, kind) for kind in wanted}
    builders = {"dense": dense_layer, "moe": moe_layer}
    return {kind: builders[kind](model, plan, stack) for kind in wanted}
