"""What the benchmark recipes outside Megatron recompute and how NeMo AutoModel's MoE models hold their weights, where
the published tables do not say (recipes_remat.py, source_automodel.py), and the tensor-parallel size a record that
states sequence parallelism implies (map_layout.py): each read from the source's own files, and what it does to the
memory of a run those sources measured."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan.estimate import estimate
from meshplan.specs.efficiency import DEFAULT
from meshplan_validation.case import map_run
from published_helpers import QWEN3_30B, record

H100_64 = {"gpu": "H100 SXM 80GB", "num_gpus": 64, "gpus_per_node": 8}
LLAMA2_70B = {"name": "Llama-2 70B", "arch": "dense", "num_layers": 80, "hidden_size": 8192, "num_heads": 64,
              "num_kv_heads": 8, "ffn_hidden_size": 28672, "vocab_size": 32000, "seq_length": 4096}
MAXTEXT = {"group": "dgxc_maxtext_llama2_70b", "framework": "MaxText (JAX/XLA)", "precision": "BF16",
           "hardware": H100_64, "model": LLAMA2_70B,
           "parallel": {"tp": 1, "pp": 1, "dp": 64, "cp": 1, "vp": None, "micro_batch_size": 2,
                        "global_batch_size": 128, "zero_or_fsdp": "FSDP=64"}}


@pytest.mark.parametrize(("over", "mode", "modules"), [
    (MAXTEXT, "selective", ("core_attn", "mlp")),  # configure.sh's remat_policy=custom: projections saved
    (MAXTEXT | {"group": "dgxc_paxml_gpt3_175b", "framework": "Paxml (JAX/XLA)"}, "selective",
     ("core_attn", "mlp")),  # SAVE_QKV_OUT_PROJ
    ({"group": "nemo_automodel_perf_summary_h100", "framework": "NeMo AutoModel (PyTorch FSDP2 + EP/PP), kernels: "
      "TE + DeepEP", "model": QWEN3_30B | {"name": "Qwen3-30B-A3B"}, "hardware": {"gpu": "H100", "num_gpus": 8},
      "parallel": {"tp": 1, "pp": 1, "dp": 8, "vp": None, "ep": 8, "micro_batch_size": 4, "global_batch_size": 512,
                   "zero_or_fsdp": "FSDP2 (FSDP=8)"}}, "full", ("core_attn",)),  # activation_checkpointing: true
])
def test_an_unstated_recompute_is_the_recipes(over, mode, modules):
    case = map_run(record(**over))
    assert (case.plan.recompute, case.plan.recompute_modules) == (mode, modules)
    assert any("(not stated; " in a and "@" in a for a in case.assumptions if "recompute" in a)


def test_a_stated_recompute_wins_over_the_recipe():
    parallel = MAXTEXT["parallel"] | {"activation_recompute": "none"}
    assert map_run(record(**MAXTEXT | {"parallel": parallel})).plan.recompute == "none"


def test_the_recipes_remat_brings_maxtexts_llama2_70b_under_the_h100s_memory():
    """Llama 2 70B, 2 x 4096 tokens a GPU under FSDP 64: saving every activation is 34 bytes a token and hidden unit
    a layer (Korthikanti et al. 2022, flash attention): 34 x 8192 x 8192 x 80 layers = 183 GB, more than the GPU;
    the recipe's remat keeps about a third of that and the run fits, as it did when it was measured."""
    case = map_run(record(**MAXTEXT))
    est = estimate(case.model, case.cluster, case.plan, case.stack)
    saved_all = 34 * 2 * 4096 * 8192 * 80
    assert saved_all > case.cluster.accelerator.hbm_bytes
    assert est.memory["activations"] < saved_all / 3 and est.fits


def test_automodels_moe_models_keep_no_fp32_master():
    """initialize_weights casts the model to bf16: Adam's m and v in bf16 (4 bytes a parameter) and no master copy,
    against 12 for mixed-precision Adam; the dense Llama 3 row (transformers' model) keeps the FSDP2 profile."""
    moe = map_run(record(group="nemo_automodel_perf_summary_h100", framework="NeMo AutoModel (PyTorch FSDP2 + EP/PP), "
                         "kernels: TE + DeepEP", model=QWEN3_30B, hardware={"gpu": "H100", "num_gpus": 8},
                         parallel={"tp": 1, "pp": 1, "dp": 8, "vp": None, "ep": 8, "micro_batch_size": 4,
                                   "global_batch_size": 512, "zero_or_fsdp": "FSDP2 (FSDP=8)"}))
    dense = map_run(record(group="nemo_automodel_perf_summary_h100", framework="NeMo AutoModel (PyTorch FSDP2), "
                           "kernels: TE + fsdp2_prefetch", parallel={"zero_or_fsdp": "FSDP2 (FSDP=32)", "tp": 1,
                                                                     "pp": 1, "vp": None}))
    assert not moe.stack.master_weights and dense.stack.master_weights
    assert "defaults: NeMo AutoModel MoE" in moe.assumptions  # the source profile that says so, named


@pytest.mark.parametrize(("gpus", "tp"), [(2048, 8), (4, 4)])
def test_stated_sequence_parallelism_without_a_tp_size_runs_over_a_node(gpus, tp):
    """LLaMA-1's "model and sequence parallelism, as described by Korthikanti et al." on 2048 A100s: tp 8 (their
    Table 3's t), dp 2048 / 8 = 256; on fewer GPUs than a node, all of them."""
    case = map_run(record(group="paper", framework="Meta internal", precision="bf16",
                          hardware={"gpu": "A100 80GB", "num_gpus": gpus},
                          parallel={"tp": None, "pp": None, "vp": None, "dp": None, "sequence_parallel": True,
                                    "micro_batch_size": 1, "global_batch_size": gpus}))
    assert (case.plan.tp, case.plan.dp, case.plan.sequence_parallel) == (tp, gpus // tp, True)
    assert any(a.startswith(f"tp {tp} (not stated; sequence parallelism") for a in case.assumptions)


def test_megatron_llamas_unstated_layout_is_its_13b_launch_scripts():
    """examples/LLaMA/LLaMA_13_standalone.sh @46ae7dde: TP_SIZE=2, MICRO_BATCH_SIZE=2, --sequence-parallel,
    --recompute-granularity selective. At tp 1 its DistributedOptimizer run cannot fit: 13B x (2 bytes of bf16 weights
    + 4 of the unsharded fp32 gradient buffer) + 13B x 12 / 32 of sharded Adam state = 78 + 4.9 GB of the A100's
    85.9 GB (80 GiB) before any activation; at tp 2 half of it."""
    llama13 = {"name": "LLaMA-13B", "arch": "dense", "num_layers": 40, "hidden_size": 5120, "num_heads": 40,
               "num_kv_heads": 40, "ffn_hidden_size": 13824, "vocab_size": 32000, "seq_length": 2048}
    case = map_run(record(group="megatron_llama_readme", framework="Megatron-LLaMA (Megatron-LM based) with "
                          "DistributedOptimizer", precision="bf16", model=llama13,
                          hardware={"gpu": "A100 80GB", "num_gpus": 32, "gpus_per_node": 8},
                          parallel={"tp": None, "pp": None, "vp": None, "dp": None, "micro_batch_size": None,
                                    "global_batch_size": 2048, "distributed_optimizer": True, "zero_or_fsdp": None}))
    plan = case.plan
    assert (plan.tp, plan.dp, plan.micro_batch, plan.sequence_parallel, plan.recompute) == (2, 16, 2, True,
                                                                                           "selective")
    assert estimate(case.model, case.cluster, plan, case.stack).fits
    whole = replace(plan, tp=1, etp=1, dp=32, sequence_parallel=False, recompute="none")
    assert not estimate(case.model, case.cluster, whole, case.stack).fits



def test_automodels_moe_runs_dispatch_through_deepeps_forwarding_kernels():
    """enable_deepep (every AutoModel MoE benchmark config @01926a5c): GroupedExpertsDeepEP's flex dispatcher calls
    DeepEP's normal kernels, which cross the network once per node a token hits; fake_balanced_gate: token i's 8
    experts are 8i .. 8i + 7 mod 256, all on one node of 32. DeepSeek-V3 over 256 H100s, EP 64 over 8 nodes: a
    micro-batch's 4,096 tokens of 7,168 bf16 values (58.7 MB) reach 7 × 32/256 = 0.875 other nodes at DeepEP's 8-node
    NIC rate, 0.884 x 50 GB/s: 1.16 ms + 7 × 3 + 7 × 5 µs latency = 1.22 ms a dispatch (NVLink's fan-out of 411 MB at
    360 GB/s, 1.14 ms, beside it), where a uniform router's 7 × (1 − Π_{j<8} (224 − j)/(256 − j)) = 4.63 other nodes
    take 6.21 ms, and the plain all-to-all's 8 copies × 56/64, 411 MB / 45 GB/s = 9.13 ms."""
    from meshplan.collectives.dispatch import node_miss  # noqa: PLC0415
    from meshplan_validation.records import read_runs  # noqa: PLC0415

    run = next(r for r in read_runs("benchmarks/data/independent_runs.jsonl")
               if r["id"] == "automodel-deepseek-v3-671b-256")
    case = map_run(run)
    stack = case.stack
    assert (stack.moe_dispatcher, stack.flex_backend, stack.moe_routing, stack.overlap_ep) == (
        "flex", "deepep", "contiguous", False)
    latency = 7 * 3e-6 + 7 * 5e-6
    token_set = 4096 * 7168 * 2
    seconds = {}
    for routing in ("contiguous", "uniform"):
        est = estimate(case.model, case.cluster, case.plan, replace(stack, moe_routing=routing),
                       case.efficiency(DEFAULT))
        seconds[routing] = next(o for o in est.ops if o.name == "moe/dispatch" and o.phase == "fwd").seconds
    assert seconds["contiguous"] == pytest.approx(token_set * 7 * 32 / 256 / (0.884 * 50e9) + latency)
    assert seconds["contiguous"] == pytest.approx(1.218e-3, rel=1e-3)
    crossings = 7 * (1 - node_miss(256, 8, 32))
    assert crossings == pytest.approx(4.633, abs=1e-3)
    assert seconds["uniform"] == pytest.approx(token_set * crossings / (0.884 * 50e9) + latency)
    assert seconds["uniform"] < token_set * 8 * 56 / 64 / 45e9  # the plain all-to-all's network time


def test_automodels_qwen3_moe_sends_each_token_to_one_rank_of_its_node():
    """Qwen3-30B-A3B on 8 H100s, EP 8: its fake balanced gate's 8 experts in a row sit on one rank of 16, so NVLink
    carries one copy of a token, 7/8 of the time to another rank, not eight: a micro-batch of 4 x 4,096 tokens of 2,048
    bf16 values, 67 MB of rows, 7/8 of them over the link at 360 GB/s, 0.16 ms + 7 × 3 µs, against 8 x the link's time
    for every copy. DeepEP's kernels run at AutoModel's own 20 SMs (Automodel@01926a5c nemo_automodel/components/moe/
    megatron/fused_a2a.py:27, DEEP_EP_SM_NUMS default 20), whose 391 GB/s of rows is a B200 measurement: on Hopper
    the link binds (collectives/dispatch.py)."""
    case = map_run(record(group="nemo_automodel_perf_summary_h100", framework="NeMo AutoModel (PyTorch FSDP2 + EP/PP), "
                          "kernels: TE + DeepEP", model=QWEN3_30B, hardware={"gpu": "H100", "num_gpus": 8},
                          parallel={"tp": 1, "pp": 1, "dp": 8, "vp": None, "ep": 8, "micro_batch_size": 4,
                                    "global_batch_size": 512, "zero_or_fsdp": "FSDP2 (FSDP=8)"}))
    est = estimate(case.model, case.cluster, case.plan, case.stack, case.efficiency(DEFAULT))
    dispatch = next(o for o in est.ops if o.name == "moe/dispatch" and o.phase == "fwd")
    assert dispatch.seconds == pytest.approx(4 * 4096 * 2048 * 2 * 7 / 8 / 360e9 + 7 * 3e-6)
