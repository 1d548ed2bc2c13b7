"""YaRN-scaled RoPE in Megatron-Core's modules runs unfused (cost/attention.py unfused_rope): Transformer Engine's fused
RoPE takes no mscale, and Megatron-Bridge keeps the fusion for position type "rope" only, so GPT-OSS's q and k go
through rope_utils._apply_rotary_pos_emb_bshd's separate kernels."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from meshplan.cost.eager import EAGER, eager_bytes, eager_kernels
from meshplan.cost.layers import moe_layer
from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.hf.config import from_hf_config
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack


def _rope(model, plan, stack):
    return {o.phase: o for o in moe_layer(model, plan, stack) if o.name == "attn/rope/eager"}


def test_megatron_core_unfused_rope_bytes_and_kernels_per_element():
    # forward: t*cos (r2 w2), neg of one half (r1 w1 per element of t), cat (r2 w2), *sin (r2 w2), add (r4 w2),
    # cat with the empty unrotated part (r2 w2): 24 bytes; backward: the two products' gradients (2 x r2 w2), the
    # neg's (r1 w1), the chunk's cat (r2 w2), the two paths added (r4 w2), the slice's zeros (w2) and copy (r2 w2): 26
    assert eager_bytes("rope_megatron", "fwd") == 4 + 2 + 4 + 4 + 6 + 4 == 24
    assert eager_bytes("rope_megatron", "bwd_x") == 4 + 2 + 4 + 4 + 6 + 2 + 4 == 26
    assert eager_kernels("rope_megatron", "fwd") == len(EAGER["rope_megatron"]["fwd"]) == 6
    assert eager_kernels("rope_megatron", "bwd_x") == 7


def test_gpt_oss_q_and_k_pay_it_on_megatron_bridge():
    model = load_model("gpt-oss-120b")
    assert model.yarn_rope
    plan = Plan(tp=2, ep=8, dp=8, micro_batch=2, sequence_parallel=True)
    ops = _rope(model, plan, load_stack("megatron-bridge"))
    # T = 2 x 4096 tokens; per tp rank 64/2 query heads and 8/2 key heads of 64: (32 + 4) x 64 = 2304 elements a token
    elems = 2 * 4096 * (32 + 4) * 64
    assert ops["fwd"].nbytes == 24 * elems
    assert ops["bwd_x"].nbytes == 26 * elems
    assert ops["fwd"].kernels == 2 * 6 and ops["bwd_x"].kernels == 2 * 7  # q and k apart
    assert set(ops) == {"fwd", "bwd_x"}


def test_only_yarn_rope_in_megatron_core_modules():
    gpt_oss = load_model("gpt-oss-120b")
    plan = Plan(ep=8, dp=8)
    assert not _rope(replace(gpt_oss, yarn_rope=False), plan, load_stack("megatron-bridge"))  # fused RoPE
    assert not _rope(load_model("qwen3-30b-a3b"), plan, load_stack("megatron-bridge"))
    # an eager stack prices its own RoPE (eager_layer's "rope" rows), not Megatron-Core's
    eager = [o for o in moe_layer(gpt_oss, plan, Stack(fusion="eager")) if o.name == "attn/rope/eager"]
    assert {o.nbytes for o in eager} != {o.nbytes for o in _rope(gpt_oss, plan, load_stack("megatron-bridge")).values()}


def test_config_json_rope_scaling_yarn_sets_it():
    config = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 4, "num_attention_heads": 64,
              "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "vocab_size": 201088,
              "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 131072,
              "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096}}
    assert from_hf_config(config).yarn_rope
    assert not from_hf_config({**config, "rope_scaling": None}).yarn_rope


@pytest.mark.parametrize("seed", range(40))
def test_unfused_rope_never_shortens_the_step_and_grows_with_tokens(seed):
    rng = random.Random(seed)
    cluster = load_system(rng.choice(["h100", "b200", "gb200"])).cluster(64)
    base = load_model("gpt-oss-120b")
    tp = rng.choice([1, 2, 4])
    plan = Plan(tp=tp, ep=8, dp=64 // tp, micro_batch=rng.choice([1, 2, 4]), global_batch=512,
                sequence_parallel=tp > 1)
    stack = load_stack("megatron-bridge")
    with_rope = estimate(base, cluster, plan, stack).step_time
    without = estimate(replace(base, yarn_rope=False), cluster, plan, stack).step_time
    assert with_rope >= without
    seq = rng.choice([2048, 4096])
    short, long = (_rope(replace(base, seq_length=s), plan, stack)["fwd"].nbytes for s in (seq, 2 * seq))
    assert long == 2 * short
