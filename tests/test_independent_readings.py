"""Independent runs read as their sources' own files say (issue 79, the 25 largest errors): BigScience's topology
search ran BLOOM's block (ALiBi, an embedding LayerNorm, biases, tied embeddings, Megatron's dropout), InternEvo's
throughput table ran without activation checkpointing ("none (checkpoint=False)" is none), and fms-fsdp's
"selective" checkpoint is whole blocks, every n-th, n from the run's own HFU over MFU. Each test shows its
arithmetic."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan_validation.case import map_run
from meshplan_validation.map_training import every_nth_block
from published_helpers import record

ROOT = Path(__file__).resolve().parents[1]
INDEPENDENT = ROOT / "benchmarks" / "data" / "independent_runs.jsonl"


def independent(run_id: str) -> dict:
    with INDEPENDENT.open() as f:
        return next(r for r in map(json.loads, f) if r["id"] == run_id)


def test_bigscience_prequel_runs_blooms_block():
    """tr11-200B-ml.slurm @217dc6c: --position-embedding-type alibi, --embed-layernorm; Megatron's linears with
    biases; the head tied to the embedding; dropout 0.1 (the tr11 README: Megatron's defaults inherited)."""
    case = map_run(independent("bloom-pre-181b-dp8pp6mbs4-0221"))
    m = case.model
    assert (m.position_embedding, m.embedding_norm, m.qkv_bias, m.linear_bias, m.tied_embeddings, m.dropout) == (
        "none", True, True, True, True, True)
    assert any("BLOOM convention" in a for a in case.assumptions)
    # the parameters that moved, by hand (h = 14336): biases on q, k, v, the output projection, fc1 (4h) and fc2,
    # 9h a layer; the embedding LayerNorm's weight and bias, 2h (the tied head, in the token embedding's rows, is
    # counted there either way; the vocabulary pads to 128 x tp rows: 250,680 -> 250,880 at tp 8 = BLOOM's own)
    h = 14336
    bare = replace(m, position_embedding="rope", embedding_norm=False, qkv_bias=False, linear_bias=False,
                   tied_embeddings=False, dropout=False)
    assert m.layer_params(0) - bare.layer_params(0) == 3 * h + h + 4 * h + h == 9 * h
    assert m.embedding_params() - bare.embedding_params() == 2 * h
    assert m.vocab_size == 250680 and -(-250680 // (128 * 8)) * 128 * 8 == 250880


@pytest.mark.parametrize(("text", "mode"), [
    ("none (checkpoint=False)", "none"),  # InternEvo's TGS table: not a checkpoint
    ("none (script default RECOMPUTE=0)", "none"),
    ("full (--checkpoint-activations, as in the tr11 slurm scripts)", "full"),
    ("checkpoint every layer", "full"),
])
def test_a_stated_setting_is_read_before_its_remark(text, mode):
    assert map_run(record(parallel={"activation_recompute": text})).plan.recompute == mode


def test_internevos_throughput_table_runs_without_checkpointing():
    """doc/en/train_performance.md @3a665e88: 'the training configuration had pack_sample_into_one=False and
    checkpoint=False'."""
    case = map_run(independent("internevo-7b-tgs-tp1-zall-1024gpu"))
    assert case.plan.recompute == "none"
    assert "no activation recompute (stated)" in case.assumptions


def test_fms_fsdp_selective_is_every_second_block():
    """The blog's 13B row: A100 MFU 0.51 / HFU 0.59, H100 0.35 / 0.40. HFU / MFU = 1 + f / 3: f = 3 x 0.157 = 0.47
    and 3 x 0.143 = 0.43, n = round(1 / f) = 2: 20 of Llama-2 13B's 40 blocks recomputed whole."""
    assert round(3 * (59 / 51 - 1), 2) == 0.47 and round(3 * (40 / 35 - 1), 2) == 0.43
    for run_id in ("ibmfsdp-13b-a100-128", "ibmfsdp-13b-h100-96"):
        rec = independent(run_id)
        assert every_nth_block(rec) == 2
        plan = map_run(rec).plan
        assert (plan.recompute, plan.recompute_layers) == ("full", 20)
    # without both figures n is unknown: Megatron's reading of "selective" stays
    bare = independent("ibmfsdp-13b-h100-96")
    bare["measured"] = bare["measured"] | {"hfu_pct": None}
    assert every_nth_block(bare) == 0 and map_run(bare).plan.recompute == "selective"


def test_rocm_megatrons_use_flash_attn_0_leaves_tes_attention_fused():
    """train_llama2.sh: USE_FLASH_ATTN=0 only leaves out --use-flash-attn, which Megatron's legacy model alone reads;
    TE_FP8=1 and MCORE=1 run Megatron-Core's TE spec, whose TEDotProductAttention is fused. The unfused score
    matrices were what overflowed the MI300X: b x heads x s^2 x 2 bytes = 4 x 32 x 4096^2 x 2 = 4 GiB a layer."""
    rec = independent("rocm-megatron-llama2-7b-fp8-8gpu")
    case = map_run(rec)
    assert case.stack.flash_attention
    assert any("TEDotProductAttention" in a for a in case.assumptions)
    assert 4 * 32 * 4096 ** 2 * 2 == 4 * 2 ** 30
    # the switch alone, without Megatron-Core on Transformer Engine, still turns flash attention off
    legacy = rec | {"framework": "Megatron-LM (legacy GPT model); USE_FLASH_ATTN=0"}
    assert not map_run(legacy).stack.flash_attention


def test_llama3_runs_one_layer_chunks_and_lighter_end_stages():
    """The paper (§3.3.2): one Transformer layer taken from the first and the last stage leaves their first and last
    model chunk the embedding and the loss alone, so a chunk is one layer: (126 + 2) / 16 = 8 chunks a rank, the ends
    7 layers each, the 14 others (126 - 14) / 14 = 8."""
    assert (126 + 2) // 16 == 8 and (126 - 2 * 7) // 14 == 8
    case = map_run(independent("l3-405b-8k-8192gpu"))
    assert (case.plan.first_stage_layers, case.plan.last_stage_layers) == (7, 7)
    assert any("V = 8 one-layer model chunks" in a for a in case.assumptions)
    assert case.plan.vpp == 7  # 16 x 8 chunks exceed 126 layers: Plan holds decoder chunks only (map_layout)
    # a stated V is kept
    stated = independent("l3-405b-8k-8192gpu")
    stated["parallel"] = stated["parallel"] | {"vp": 2}
    assert map_run(stated).plan.vpp == 2


def test_grok1_recipe_turns_tes_cudnn_attention_off():
    """dgxc-benchmarking grok1/configure.sh @143b90dd exports NVTE_FUSED_ATTN=0: Transformer Engine runs its
    FlashAttention backend, the FlashAttention-2 class, where NeMo's stack would run cuDNN's (fused)."""
    case = map_run(independent("dgxc-grok1-314b-fp8-2048"))
    assert case.stack.attention_kernel == "fa2"
    assert any("NVTE_FUSED_ATTN=0" in a for a in case.assumptions)
    other = map_run(independent("dgxc-maxtext-llama2-70b-fp8-64"))  # its configure.sh exports NVTE_FUSED_ATTN=1
    assert not any("NVTE_FUSED_ATTN=0" in a for a in other.assumptions)
