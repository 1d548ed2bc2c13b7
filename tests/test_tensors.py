"""Parameter tensors per GPU (cost/tensors.py) against the modules' own parameter lists, and the host time the
per-parameter loops of an optimizer step add (step/host.step_host, Stack.tensor_host): counted once per step, at
the host's speed, on every priced rank, by the search as by the estimate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meshplan.cost.tensors import layer_tensors, rank_tensors, stepped, tensors_on_rank
from meshplan.estimate import estimate
from meshplan.search import Space, search
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack, load_stack
from meshplan.step.host import step_host

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HF = Stack(projections="separate")  # Hugging Face's q_proj, k_proj, v_proj, gate_proj, up_proj


def hf_layer_and_total(config) -> tuple[int, int]:
    """Tensors of one decoder layer and of the whole model, as the model's own named_parameters() lists them (tied
    weights once), built on the meta device."""
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)][0]
    return len(list(layers[0].parameters())), len(list(model.parameters()))


def test_gpt2_counts_its_twelve_tensors_a_layer_as_transformers_builds_them():
    """GPT-2 small: ln_1 (2), c_attn (fused QKV, weight and bias: 2), c_proj (2), ln_2 (2), c_fc (2), mlp c_proj (2) =
    12 a layer; 12 layers + wte, wpe, ln_f (2), the head tied to wte = 12·12 + 4 = 148."""
    layer, total = hf_layer_and_total(transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12))
    model = load_model("gpt2")
    plan = Plan(dp=1)
    assert layer == layer_tensors(model, plan, Stack()) == 12
    first, last, _ = rank_tensors(model, plan, Stack())
    assert total == first == last == 12 * 12 + 4 == 148  # one rank holds everything


def test_llama_counts_nine_tensors_a_layer_with_separate_projections():
    """HF Llama: q, k, v, o, gate, up, down and two RMSNorm weights = 9; Megatron-Core's fused linear_qkv and
    linear_fc1 make it 6."""
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000)
    layer, total = hf_layer_and_total(cfg)
    model = replace(load_model("llama3-8b"), num_layers=4)
    assert layer == layer_tensors(model, Plan(dp=1), HF) == 9
    assert layer_tensors(model, Plan(dp=1), Stack()) == 6
    assert total == rank_tensors(model, Plan(dp=1), HF)[0] == 4 * 9 + 3  # embed, final norm, untied head


def test_pipeline_ranks_split_the_layers_and_the_ends():
    """GPT-2 on 4 stages: 3 layers each; the first rank adds wte and wpe, the last ln_f (2) and its own copy of the
    tied word embedding for the head (Megatron's, beside the first stage's) -> 38, 39, 36."""
    model, plan = load_model("gpt2"), Plan(dp=1, pp=4)
    assert rank_tensors(model, plan, Stack()) == (3 * 12 + 2, 3 * 12 + 3, 3 * 12)
    assert [tensors_on_rank(model, plan, Stack(), r) for r in range(4)] == [38, 36, 36, 39]


def test_fsdp1_flattens_a_layer_into_one_tensor():
    assert layer_tensors(load_model("gpt2"), Plan(dp=1), Stack(fsdp="fsdp1")) == 1


def test_moe_layers_count_two_tensors_per_local_expert():
    """Mixtral 8x7B at ep 4: 2 local experts -> router 1 + 2·2 + attention (qkv, proj) 2 + norms 2 = 9."""
    model = load_model("mixtral-8x7b")
    assert layer_tensors(model, Plan(dp=4, ep=4), Stack()) == 1 + 2 * 2 + 2 + 2


def test_step_host_is_tensors_times_the_stack_cost_at_the_hosts_speed():
    stack = Stack(tensor_host=40e-6)
    assert step_host(148, stack) == pytest.approx(148 * 40e-6)
    assert step_host(148, stack, python_host=1.53) == pytest.approx(148 * 40e-6 * 1.53)
    assert step_host(148, Stack()) == 0.0


def test_the_estimate_adds_it_to_the_optimizer_step_once_per_step():
    """GPT-2 on 8 A100 (python_host 1.53) without ZeRO: 148 tensors x 40 us x 1.53 = 9.06 ms more optimizer time and
    step time, whatever the micro-batches per step; with a sharded optimizer (ZeRO-1) its wrapper walks its shard's,
    148 / 8 = 18.5 tensors: 1.13 ms."""
    model, cluster = load_model("gpt2"), load_system("a100").cluster(8)
    for gbs, zero, tensors in ((32, 0, 148), (256, 0, 148), (32, 1, 18.5)):
        plan = Plan(dp=8, micro_batch=4, global_batch=gbs, recompute="none", zero=zero)
        base = estimate(model, cluster, plan, Stack())
        more = estimate(model, cluster, plan, Stack(tensor_host=40e-6))
        added = tensors * 40e-6 * cluster.python_host
        assert math.isclose(more.breakdown["optimizer"] - base.breakdown["optimizer"], added, rel_tol=1e-9)
        assert math.isclose(more.step_time - base.step_time, added, rel_tol=1e-9)
        row = {r.name: r for r in more.ops}["optimizer/host"]
        assert math.isclose(row.seconds, added, rel_tol=1e-9) and row.bound == "host"


def test_fsdp_steps_every_tensors_shard():
    """FSDP2's optimizer walks every DTensor (each a shard) whatever ZeRO stage the plan names; Megatron's and
    DeepSpeed's sharded optimizers walk their shard's."""
    plan = Plan(dp=8, zero=3)
    assert stepped(148, plan, Stack(fsdp="fsdp2")) == 148
    assert stepped(148, plan, Stack()) == 148 / 8
    assert stepped(148, replace(plan, zero=0), Stack()) == 148


def test_ranks_priced_one_by_one_agree_with_the_composed_step():
    """A plan with per-rank recompute is priced rank by rank (step/ranks.py): each rank's own tensors."""
    model, cluster = load_model("gpt2"), load_system("h100").cluster(8)
    stack = load_stack("megatron-core").with_(tensor_host=30e-6)
    plan = Plan(dp=2, pp=4, micro_batch=2, global_batch=64, recompute="none")
    even = estimate(model, cluster, plan, stack)
    per_rank = estimate(model, cluster, replace(plan, stage_recompute=("none",) * 4), stack)
    assert math.isclose(even.step_time, per_rank.step_time, rel_tol=1e-9)


def test_the_search_prices_it_as_the_estimate_does():
    model, cluster = load_model("gpt2"), load_system("h100").cluster(8)
    stack = load_stack("megatron-core").with_(tensor_host=30e-6)
    result = search(model, cluster, Space(global_batch=64, stack=stack), top_k=3)
    for found in result.plans:
        again = estimate(model, cluster, found.plan, stack)
        assert math.isclose(found.step_time, again.step_time, rel_tol=1e-6)
        assert again.breakdown["optimizer"] > estimate(model, cluster, found.plan, stack.with_(tensor_host=0.0)
                                                       ).breakdown["optimizer"]
