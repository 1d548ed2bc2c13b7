"""Parameter tensors per GPU (cost/tensors.py) against the modules' own parameter lists, and the host time the
per-parameter loops of an optimizer step add (step/host.step_host, Stack.tensor_host): counted once per step, at
the host's speed, on every priced rank, by the search as by the estimate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from meshplan.cost.tensors import Tensors, layer_tensors, rank_tensors, stepped, tensors_on_rank
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
    assert layer == layer_tensors(model, plan, Stack()).dense == 12
    first, last, _ = rank_tensors(model, plan, Stack())
    assert total == first.dense == last.dense == 12 * 12 + 4 == 148  # one rank holds everything


def test_llama_counts_nine_tensors_a_layer_with_separate_projections():
    """HF Llama: q, k, v, o, gate, up, down and two RMSNorm weights = 9; Megatron-Core's fused linear_qkv and
    linear_fc1 make it 6."""
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=1000)
    layer, total = hf_layer_and_total(cfg)
    model = replace(load_model("llama3-8b"), num_layers=4)
    assert layer == layer_tensors(model, Plan(dp=1), HF).dense == 9
    assert layer_tensors(model, Plan(dp=1), Stack()).dense == 6
    assert total == rank_tensors(model, Plan(dp=1), HF)[0].dense == 4 * 9 + 3  # embed, final norm, untied head


def test_pipeline_ranks_split_the_layers_and_the_ends():
    """GPT-2 on 4 stages: 3 layers each; the first rank adds wte and wpe, the last ln_f (2) and its own copy of the
    tied word embedding for the head (Megatron's, beside the first stage's) -> 38, 39, 36."""
    model, plan = load_model("gpt2"), Plan(dp=1, pp=4)
    assert [t.dense for t in rank_tensors(model, plan, Stack())] == [3 * 12 + 2, 3 * 12 + 3, 3 * 12]
    assert [tensors_on_rank(model, plan, Stack(), r).dense for r in range(4)] == [38, 36, 36, 39]


def test_fsdp1_flattens_a_layer_into_one_tensor():
    assert layer_tensors(load_model("gpt2"), Plan(dp=1), Stack(fsdp="fsdp1")) == Tensors(1.0)


def test_moe_layers_count_two_tensors_per_local_expert():
    """Mixtral 8x7B at ep 4: 2 local experts -> router 1 + attention (qkv, proj) 2 + norms 2 = 5 dense, 2·2 = 4 expert
    tensors (Megatron-Core's TEGroupedMLP: one fc1 and one fc2 per expert); GPT-OSS's experts carry biases (4 a local
    expert) and its attention its sinks."""
    assert layer_tensors(load_model("mixtral-8x7b"), Plan(dp=4, ep=4), Stack()) == Tensors(5.0, 4.0)
    oss = load_model("gpt-oss-120b")
    one = layer_tensors(oss, Plan(dp=8, ep=8), Stack())
    assert one.expert == 4 * oss.num_experts / 8 and one.dense == 2 + 4 + 1 + 1  # norms, qkv+proj w/b, sinks, router


def test_stacked_experts_count_as_the_frameworks_hold_them():
    """transformers' Mixtral layer: q, k, v, o, the router, gate_up_proj and down_proj (all experts stacked), two
    norms = 9 (its modules on the meta device); the deepspeed preset (Hugging Face's modules) counts the stacked pair,
    torchtitan's its w1, w2, w3."""
    cfg = transformers.MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                                     num_key_value_heads=2, num_local_experts=8, vocab_size=100)
    layer, _ = hf_layer_and_total(cfg)
    model = load_model("mixtral-8x7b")
    hf = load_stack("deepspeed").with_(projections="separate")  # HF's q_proj, k_proj, v_proj
    assert layer == 9 == sum(vars_of(layer_tensors(model, Plan(dp=8), hf)))
    assert layer_tensors(model, Plan(dp=8), load_stack("torchtitan")).expert == 3


def vars_of(t: Tensors) -> tuple:
    return (t.dense, t.expert)


def test_lora_walks_its_adapters_only():
    """LoRA on all linears of Llama 3 8B: an A and a B on QKV, the output projection, fc1 and fc2: 8 a layer, the
    embedding and head frozen."""
    model = load_model("llama3-8b")
    plan = Plan(dp=8, finetune="lora", lora_targets="all")
    assert layer_tensors(model, plan, Stack()) == Tensors(8.0)
    assert rank_tensors(model, plan, Stack())[0] == Tensors(8.0 * 32)
    assert layer_tensors(model, replace(plan, lora_targets="qkv"), Stack()) == Tensors(2.0)


def test_which_tensors_a_step_walks():
    """A wrapper that shards its loops (Megatron's DistributedOptimizer, DeepSpeed ZeRO-1/2) walks its shard's at
    ZeRO 1 and 2: dense / (dp·cp), experts / N_e, N_e = tp·cp·dp/(ep·etp) (memory.py), at least one of each; ZeRO-3,
    FSDP and a wrapper that does not shard (DeepSpeed's BF16_Optimizer) walk every tensor."""
    sharded, whole = Stack(tensor_sharded=True), Stack()
    plan = Plan(dp=8, tp=2, ep=4, etp=1, zero=1)
    held = Tensors(148.0, 64.0)
    assert stepped(held, plan, sharded) == pytest.approx(148 / 8 + 64 / (2 * 8 / 4))
    assert stepped(held, plan, whole) == stepped(held, replace(plan, zero=3), sharded) == 212.0
    assert stepped(held, plan, Stack(tensor_sharded=True, fsdp="fsdp2")) == 212.0
    assert stepped(Tensors(148.0), replace(plan, dp=256), sharded) == 1.0  # a shard touches one tensor at least


def test_step_host_is_tensors_times_the_stack_cost_at_the_hosts_speed():
    stack = Stack(tensor_host=40e-6)
    assert step_host(148, stack) == pytest.approx(148 * 40e-6)
    assert step_host(148, stack, python_host=1.53) == pytest.approx(148 * 40e-6 * 1.53)
    assert step_host(148, Stack()) == 0.0


def test_the_estimate_adds_it_to_the_optimizer_step_once_per_step():
    """GPT-2 on 8 A100 (python_host 1.34) without ZeRO: 148 tensors x 40 us x 1.34 = 7.93 ms more optimizer time and
    step time, whatever the micro-batches per step; with a wrapper that shards its loops at ZeRO-1, its shard's,
    148 / 8 = 18.5 tensors: 1.16 ms; a DualPipe rank holds two stages and walks both."""
    model, cluster = load_model("gpt2"), load_system("a100").cluster(8)
    sharded = Stack(tensor_host=40e-6, tensor_sharded=True)
    for gbs, zero, tensors in ((32, 0, 148), (256, 0, 148), (32, 1, 18.5)):
        plan = Plan(dp=8, micro_batch=4, global_batch=gbs, recompute="none", zero=zero)
        base = estimate(model, cluster, plan, Stack())
        more = estimate(model, cluster, plan, sharded)
        added = tensors * 40e-6 * cluster.python_host
        assert math.isclose(more.breakdown["optimizer"] - base.breakdown["optimizer"], added, rel_tol=1e-9)
        assert math.isclose(more.step_time - base.step_time, added, rel_tol=1e-9)
        row = {r.name: r for r in more.ops}["optimizer/host"]
        assert math.isclose(row.seconds, added, rel_tol=1e-9) and row.bound == "host"
    dual = Plan(dp=2, pp=4, micro_batch=1, global_batch=16, recompute="none", zero=0, schedule="dualpipe")
    est = estimate(model, load_system("h100").cluster(8), dual, Stack(tensor_host=40e-6))
    row = {r.name: r for r in est.ops}["optimizer/host"]
    plain = estimate(model, load_system("h100").cluster(8), dual, Stack())
    assert math.isclose(row.seconds * row.count, est.breakdown["optimizer"] - plain.breakdown["optimizer"],
                        rel_tol=1e-9)


@pytest.mark.parametrize("name, system", [("gpt2", "h100"), ("mixtral-8x7b", "a100")])
def test_ranks_priced_one_by_one_agree_with_the_composed_step(name, system):
    """A plan with per-rank recompute is priced rank by rank (step/ranks.py): each rank's own tensors, experts sharded
    over their own ranks, on a host of its own speed (A100: 1.34)."""
    model, cluster = load_model(name), load_system(system).cluster(16)
    stack = load_stack("megatron-core").with_(tensor_host=30e-6)
    ep = 4 if model.is_moe else 1
    plan = Plan(dp=4, pp=4, ep=ep, micro_batch=1, global_batch=64, recompute="full")
    even = estimate(model, cluster, plan, stack)
    per_rank = estimate(model, cluster, replace(plan, stage_recompute=("full",) * 4), stack)
    assert math.isclose(even.step_time, per_rank.step_time, rel_tol=1e-9)
    assert even.breakdown["optimizer"] > estimate(model, cluster, plan, stack.with_(tensor_host=0.0)
                                                  ).breakdown["optimizer"]


@pytest.mark.parametrize("name, system, gpus", [("gpt2", "h100", 8), ("mixtral-8x7b", "a100", 16)])
def test_the_search_prices_it_as_the_estimate_does(name, system, gpus):
    """The search composes plans in batches (NumPy arrays of dp, ep, zero ...): its top plans re-estimate alike."""
    model, cluster = load_model(name), load_system(system).cluster(gpus)
    stack = load_stack("megatron-core").with_(tensor_host=30e-6)
    result = search(model, cluster, Space(global_batch=64, stack=stack), top_k=3)
    assert result.plans
    for found in result.plans:
        again = estimate(model, cluster, found.plan, stack)
        assert math.isclose(found.step_time, again.step_time, rel_tol=1e-6)
        assert again.breakdown["optimizer"] > estimate(model, cluster, found.plan, stack.with_(tensor_host=0.0)
                                                       ).breakdown["optimizer"]
