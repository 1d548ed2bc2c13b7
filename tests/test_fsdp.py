"""PyTorch FSDP's gradient preparation (cost/fsdp.py): bytes per parameter, per layer kind."""

from __future__ import annotations

import pytest

from conftest import gpt
from meshplan.cost.embed_head import embedding_ops, head_ops
from meshplan.cost.layers import dense_layer, moe_layer
from meshplan.errors import SpecError
from meshplan.specs.check import check, fsdp_has_zero
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def test_fsdp_gradient_preparation_bytes_per_parameter():
    """FSDP1 (FlatParameter) per micro-batch: the flat gradient's cat (2 + 2), the cast to the fp32 reduce dtype
    (2 + 4) and the in-place pre-divide (4 + 4): 18 bytes per unsharded parameter; with bf16 reduction the cast
    goes: 4 + 4 = 8. FSDP2 copies into the fp32 reduce-scatter buffer only: 2 + 4 = 6. One layer of the test GPT
    holds 12h² + 13h = 12,596,224 parameters (h = 1024), split over tp but for its two LayerNorms' 4h, which every
    rank keeps whole (cost/params.kept_params): (12,596,224 − 4,096) / 2 + 4,096 = 6,300,160 at tp = 2."""
    model, layer = gpt(), 12 * 1024**2 + 13 * 1024

    def prep(fsdp="none", **kw):
        return [o for o in dense_layer(model, Plan(zero=3, **kw), Stack(fsdp=fsdp)) if o.name == "layer/fsdp_grad"]

    (fp32,) = prep(fsdp="fsdp1", grad_bytes=4)
    assert (fp32.phase, fp32.kind, fp32.nbytes) == ("bwd_w", "memory", 18 * layer)
    assert prep(fsdp="fsdp1", grad_bytes=2)[0].nbytes == 8 * layer
    assert prep(fsdp="fsdp2", grad_bytes=4)[0].nbytes == 6 * layer
    assert prep(fsdp="fsdp1", grad_bytes=4, tp=2)[0].nbytes == 18 * 6_300_160
    assert prep() == [] and prep(fsdp="fsdp1", finetune="lora") == []  # LoRA: frozen weights have no gradient
    # the tied LM head holds only the final LayerNorm (2h); the embedding V·h + positions·h
    head = [o for o in head_ops(model, Plan(zero=3, grad_bytes=4), Stack(fsdp="fsdp1"))
            if o.name == "head/fsdp_grad"]
    assert head[0].nbytes == 18 * 2 * 1024
    embed = [o for o in embedding_ops(model, Plan(zero=3, grad_bytes=4), Stack(fsdp="fsdp1"))
             if o.name == "embed/fsdp_grad"]
    assert embed[0].nbytes == 18 * (51200 + model.max_position_embeddings) * 1024
    # per micro-batch whatever FSDP's sharding (NO_SHARD reduces the same gradient with an all-reduce)
    assert [o.nbytes for o in dense_layer(model, Plan(grad_bytes=4), Stack(fsdp="fsdp1"))
            if o.name == "layer/fsdp_grad"] == [18 * layer]
    with pytest.raises(SpecError, match="fsdp='ddp' must be one of none, fsdp1, fsdp2"):
        Stack(fsdp="ddp")
    assert check(model, None, Plan(zero=1), Stack(fsdp="fsdp2")) == [
        "fsdp=fsdp2 has no ZeRO-1 strategy (NO_SHARD is zero=0, SHARD_GRAD_OP 2, FULL_SHARD 3)"]
    # the one rule check, the search space and the CLI's zero grid share
    assert [z for z in range(4) if fsdp_has_zero("fsdp1", z)] == [0, 2, 3]
    assert [z for z in range(4) if fsdp_has_zero("none", z)] == [0, 1, 2, 3]
    # a SUMMA layer pays it too, split over its tp x tp2 grid
    summa_plan = Plan(zero=3, grad_bytes=4, tp=2, tp2=2, tensor_layout="summa")
    (summa,) = [o for o in dense_layer(model, summa_plan, Stack(fsdp="fsdp1")) if o.name == "layer/fsdp_grad"]
    assert summa.nbytes == 18 * layer / 4


def test_fsdp_gradient_preparation_of_a_moe_layer_counts_its_own_experts():
    """A MoE layer prepares its attention, norms, router and shared experts (split t-ways) and its local experts
    (E / (ep·etp) of them); a dense layer of the same model its dense MLP: each layer kind its own parameters."""
    model = load_model("deepseek-v3")
    plan, fsdp2 = Plan(zero=3, grad_bytes=4, ep=8), Stack(fsdp="fsdp2")
    experts = model.num_experts * model.mlp_params(model.moe_ffn_hidden_size)
    common = model.attention_params() + 2 * model.norm_params(model.hidden_size)
    (moe,) = [o for o in moe_layer(model, plan, fsdp2) if o.name == "layer/fsdp_grad"]
    assert moe.nbytes == pytest.approx(6 * (common + model.moe_params() - experts + experts / 8))
    (dense,) = [o for o in dense_layer(model, plan, fsdp2) if o.name == "layer/fsdp_grad"]
    assert dense.nbytes == pytest.approx(6 * (common + model.mlp_params(model.ffn_hidden_size)))
