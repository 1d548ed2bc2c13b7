"""A published record's parallel layout (map_layout.py, layouts.py): unstated expert tensor and expert parallelism
as the stack implies, the schedule of a pipeline that states no virtual stages, and the recipes that count the
embedding and the loss as pipeline layers (Plan.first_stage_layers, Plan.last_stage_layers)."""

from __future__ import annotations

import pytest

from meshplan_validation.case import map_run
from meshplan_validation.layouts import layout_rank_layers, lighter_first
from meshplan_validation.map_layout import batches
from meshplan_validation.sources import SOURCES
from published_helpers import QWEN3_30B, QWEN3_235B, indep, record


@pytest.mark.parametrize(("group", "framework", "expected"), [
    # Megatron-Bridge's MoE recipes set expert_tensor_parallel_size = 1
    ("megatron_bridge_26.04", "Megatron-Bridge / Megatron-Core", 1),
    # Megatron-Core's own default (arguments.py: None → tensor_model_parallel_size), which NeMo keeps: tp = 2
    ("nemo_24.07", "NeMo / Megatron-Core", 2),
    # torchtitan keeps the experts whole (its expert_tensor_parallel_degree defaults to 1)
    ("torchtitan_x", "torchtitan", 1),
])
def test_unstated_expert_tensor_parallelism_is_the_stacks_default(group, framework, expected):
    case = map_run(record(group=group, framework=framework, model=QWEN3_30B,
                          hardware={"gpu": "H100", "num_gpus": 16, "gpus_per_node": 8},
                          parallel={"tp": 2, "pp": 1, "vp": None, "ep": 8, "micro_batch_size": 1,
                                    "global_batch_size": 64}))
    # 16 GPUs = dp 8 × tp 2; ep 8 × etp divides tp·cp·dp = 16 either way
    assert (case.plan.tp, case.plan.ep, case.plan.etp) == (2, 8, expected)
    assert any(a.startswith(f"etp = {'tp = 2' if expected == 2 else '1'}") for a in case.assumptions)


def test_an_unstated_micro_batch_is_the_least_the_source_runs_with_the_source_s_own_reason():
    """map_layout knows no source's kernels: a ``least`` provider gives the micro-batch and its reason, and the note
    relays the reason as given (a source that accumulates gradients). Global batch 48 over dp 4: 12 a rank, handed
    to the provider; it says 3."""
    src, asked, notes = next(s for s in SOURCES if not s.whole_batch), [], []
    mbs, gbs = batches({"parallel": {"global_batch_size": 48}}, src, 4, 1, notes, 2048,
                       lambda per_rank: (asked.append(per_rank) or 3, "a provider's own words"))
    assert (mbs, gbs, asked) == (3, 48, [12])
    assert notes == ["micro-batch 3 (not stated): a provider's own words"]


@pytest.mark.parametrize(("framework", "gpus", "ep"), [
    # NeMo AutoModel's table leaves EP blank for gpt-oss; its benchmark configs set ep_size to the dp ranks
    ("NeMo AutoModel (PyTorch FSDP2 + EP/PP), kernels: TE + DeepEP + FlexAttn", 64, 64),
    ("NeMo AutoModel (PyTorch FSDP2 + EP/PP), kernels: TE + DeepEP + FlexAttn", 8, 8),
    ("PyTorch FSDP2 with HybridEP", 256, 128),  # 128 experts: ep = gcd(dp, experts) = 128
    ("PyTorch FSDP2", 64, 1),  # no expert-parallel dispatcher named: ep 1, said
])
def test_an_unstated_ep_follows_the_dispatcher_the_stack_names(framework, gpus, ep):
    sizes = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")
    case = map_run(indep(framework, precision="bf16",
                          model={k: None for k in sizes} | {"name": "gpt-oss-120b", "arch": "moe", "seq_length": 4096},
                          hardware={"gpu": "H100", "num_gpus": gpus, "gpus_per_node": 8},
                          parallel={"tp": 1, "pp": 1, "vp": None, "ep": None, "micro_batch_size": 2,
                                    "global_batch_size": 2 * gpus, "zero_or_fsdp": f"FSDP2 (FSDP={gpus})"}))
    assert case.plan.ep == ep
    assert any(a.startswith(f"ep {ep}") and "not stated" in a for a in case.assumptions)


def test_a_pipeline_of_unstated_schedule_interleaves_under_the_generic_profile():
    """80 layers over pp = 8: 10 per stage, the smallest v dividing them is 2 (Narayanan's rule for an unstated v);
    a Megatron-Bridge record that states no vp runs 1F1B, as its table means."""
    generic = map_run(indep("Meta internal", parallel={"vp": None})).plan
    assert (generic.vpp, generic.schedule) == (2, "interleaved")
    bridge = map_run(record(parallel={"vp": None})).plan
    assert (bridge.vpp, bridge.schedule) == (1, "1f1b")


LLAMA31_405B = {"name": "Llama3.1-405B", "num_layers": 126, "hidden_size": 16384, "num_heads": 128,
                "num_kv_heads": 8, "ffn_hidden_size": 53248, "vocab_size": 128000, "seq_length": 8192}


@pytest.mark.parametrize(("name", "pp", "vp", "last"), [
    ("Llama3.1-405B", 16, 8, 7),  # 126 + 2 slots over 16 ranks: 8 each, the last one's loss slot leaves 7 layers
    ("Llama3.1-405B", 8, 8, 15),  # 128 / 8 = 16, one of them the loss
    ("Llama3-70B", 4, 5, 0),  # the 70B recipe does not count them: an even split
    ("Qwen3-235B-A22B", 8, 3, 11),  # qwen3_235b_a22b_pretrain_config: 94 + 2 slots, 96 / 8 − 1
])
def test_the_405b_recipe_counts_the_embedding_and_the_loss_as_pipeline_layers(name, pp, vp, last):
    model = {"Llama3.1-405B": LLAMA31_405B, "Qwen3-235B-A22B": QWEN3_235B}.get(name, {})
    case = map_run(record(model=model, hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                          parallel={"tp": 4, "pp": pp, "vp": vp, "global_batch_size": 1536}))
    assert case.plan.last_stage_layers == last
    # the embedding's slot leaves the first rank as many: 7 against the middle ranks' ⌈(126 − 7 − 7)/14⌉ = 8
    assert case.plan.first_stage_layers == last
    assert any("account_for_embedding" in note for note in case.assumptions) is bool(last)


def test_a_megatron_core_stack_that_cannot_split_the_layers_otherwise_counts_the_embedding_and_the_loss():
    """NeMo runs Llama 3.1 405B (126 layers) at pp 8, vp 8: 64 model chunks, which 126 layers do not fill evenly and
    128 slots do (2 each), so the last rank holds 128/8 − 1 = 15 decoder layers; at vp 7 (56 chunks) neither splits."""
    def last(group, vp, framework="NeMo 25.04"):
        rec = record(group=group, framework=framework, model=LLAMA31_405B,
                     hardware={"gpu": "GB200", "num_gpus": 256, "gpus_per_node": 4},
                     parallel={"tp": 4, "pp": 8, "vp": vp, "global_batch_size": 1536})
        return map_run(rec).plan.last_stage_layers

    assert last("nemo_2504_gb200_perf_summary", 8) == 15
    assert last("nemo_2504_gb200_perf_summary", 7) == 0
    assert last("torchtitan_x", 8, "torchtitan (FSDP2)") == 0  # not a Megatron-Core stack


BLOOM_176B = {"name": "BLOOM-176B", "num_layers": 70, "hidden_size": 14336, "num_heads": 112, "num_kv_heads": 112,
              "ffn_hidden_size": 57344, "vocab_size": 250680, "seq_length": 2048}


@pytest.mark.parametrize(("pp", "first", "last"), [
    (12, 5, 5),  # 70 + 2 blocks over 12 ranks: 6 each, the embeddings' slots leave the ends 5 (the README's table)
    (8, 8, 8),  # 72 / 8 = 9 a rank: the ends hold 8 beside their embedding, the middle ranks ⌈(70 − 16)/6⌉ = 9
    (5, 0, 0),  # 72 blocks do not split over 5 ranks: DeepSpeed's balanced partition is not modelled, an even split
])
def test_blooms_partition_weighs_the_tied_embeddings_as_blocks(pp, first, last):
    """BLOOM ran --pp-partition-method 'type:transformer|embedding' (bigscience tr11-176B-ml README): at pp 12, rank 0
    holds the embedding and 5 blocks, ranks 1-10 six blocks, rank 11 five blocks and the tied embedding."""
    case = map_run(record(group="bloom", framework="Megatron-DeepSpeed (BLOOM)", model=BLOOM_176B, precision="bf16",
                          hardware={"gpu": "A100 80GB", "num_gpus": 48 * pp, "gpus_per_node": 8},
                          parallel={"tp": 4, "pp": pp, "dp": 12, "vp": None, "micro_batch_size": 2,
                                    "global_batch_size": 2304}))
    assert (case.plan.first_stage_layers, case.plan.last_stage_layers) == (first, last)
    assert any("type:transformer|embedding" in note for note in case.assumptions) is bool(last)


def test_a_layout_gives_its_first_rank_its_own_count_where_it_is_lighter():
    """DeepSeek-V3's H100 layout 'Et|' + 'tt|' × 30 + 'mL' at pp 8, vp 4: rank 0 runs chunks 0, 8, 16, 24 (1 + 2 + 2 +
    2 = 7 decoder layers), rank 7 chunks 7, 15, 23, 31 (2 + 2 + 2 + 0 = 6); the middle ranks hold 8. An even split of
    the rest would give the first rank ⌈(61 − 6)/7⌉ = 8, so its 7 is kept."""
    layout = "Et|" + "tt|" * 30 + "mL"
    assert [layout_rank_layers(layout, 8, r) for r in range(8)] == [7, 8, 8, 8, 8, 8, 8, 6]
    assert lighter_first(7, 6, 61, 8) == 7
    assert lighter_first(8, 6, 61, 8) == 0  # no lighter than an even split: 0, the even split itself


def test_a_record_that_names_deepspeeds_embedding_partition_gets_it():
    """A record whose text names --pp-partition-method 'type:transformer|embedding' (BigScience's rebalanced runs of
    February 2022) splits its L + 2 items the same way; without the name, an even split."""
    def ends(notes: str) -> tuple[int, int]:
        rec = record(group="bloom_prequel_x", framework="Megatron-DeepSpeed (bigscience fork)", precision="bf16",
                     model=BLOOM_176B | {"name": "BLOOM-style GPT"}, notes=notes,
                     hardware={"gpu": "A100 80GB", "num_gpus": 384, "gpus_per_node": 8},
                     parallel={"tp": 4, "pp": 12, "dp": 8, "vp": None, "micro_batch_size": 2,
                               "global_batch_size": 2048})
        plan = map_run(rec).plan
        return plan.first_stage_layers, plan.last_stage_layers

    assert ends("Uses --pp-partition-method 'type:transformer|embedding' (70 + 2 = 72 = 6 x 12)") == (5, 5)
    assert ends("") == (0, 0)
