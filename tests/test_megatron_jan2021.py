"""Megatron-LM's README table of January 2021 (issue 79, the Ampere Megatron band) ran the code of NVIDIA/Megatron-LM
152aab30, which did two things the April 2021 code does not (meshplan_validation/source_megatron_jan2021.py):
its pipeline sends the whole activation from every TP rank (the scatter/gather came with 27fc4689, 2021-02-09), and
its fused softmax kernel, with no PyTorch fallback yet, asserts that micro-batch x heads per rank fills its blocks,
so the table's unstated micro-batch is the least the kernel takes. The April 2021 table (Narayanan et al. 2021) keeps
scatter/gather and micro-batch 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draws import draw_kept
from meshplan.collectives.groups import axis_tiers
from meshplan.cost.pipeline import pipeline_p2p
from meshplan.estimate import estimate
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan_validation.case import map_run
from meshplan_validation.evaluate import predicted_metric
from meshplan_validation.source_megatron_jan2021 import JAN2021_RUNTIME, least_fused_batch
from meshplan_validation.sources import MEGATRON_2021

ROOT = Path(__file__).resolve().parents[1]
RUNS = {r["id"]: r for r in map(json.loads, (ROOT / "data/validation/published_runs.jsonl").read_text().splitlines())
        if r.get("group") in ("megatron_readme_jan2021", "narayanan2021_table1")}
JAN = MEGATRON_2021.with_(pipeline_runtime=JAN2021_RUNTIME)


def _gpt(hidden: int, heads: int, seq: int = 2048) -> ModelSpec:
    return ModelSpec(name=f"gpt-{hidden}", num_layers=8, hidden_size=hidden, num_heads=heads,
                     ffn_hidden_size=4 * hidden, vocab_size=51200, seq_length=seq, mlp="gelu", norm="layernorm",
                     position_embedding="learned", max_position_embeddings=seq, tied_embeddings=True, qkv_bias=True,
                     linear_bias=True, dropout=True)


@pytest.mark.parametrize(("hidden", "heads", "per_rank", "seq", "least"), [
    (6144, 48, 32, 2048, 2),  # GPT-18B over tp 8: 6 heads a rank; 1 x 6 = 6 rows is no multiple of 4, 2 x 6 = 12 is
    (10240, 80, 56, 2048, 2),  # GPT-76B: 10 heads a rank, 2 x 10 = 20
    (8192, 64, 48, 2048, 1),  # GPT-39B: 8 heads a rank take micro-batch 1
    (12288, 96, 96, 2048, 1),  # GPT-145B: 12
    (6144, 48, 3, 2048, 1),  # no even micro-batch divides 3 sequences a rank: 1
    (6144, 48, None, 4096, 1),  # keys past the kernel's 2,048: it never runs, 1
])
def test_the_least_micro_batch_the_fused_softmax_takes(hidden, heads, per_rank, seq, least):
    assert least_fused_batch(_gpt(hidden, heads, seq), 8, per_rank)[0] == least


def test_the_january_table_maps_to_whole_sends_and_the_kernel_s_micro_batch():
    jan = {k: map_run(RUNS[f"megatron_readme_jan2021_{k}"]) for k in ("18B", "39B", "76B", "145B")}
    assert {k: c.plan.micro_batch for k, c in jan.items()} == {"18B": 2, "39B": 1, "76B": 2, "145B": 1}
    assert all(c.stack.pipeline_runtime == JAN2021_RUNTIME for c in jan.values())
    assert all(c.stack.name == "megatron-lm-2021" for c in jan.values())  # the same regime as the April table
    assert ("micro-batch 2 (not stated): the least Megatron-LM January 2021's fused softmax kernel takes "
            "(source_megatron_jan2021.py)") in jan["18B"].assumptions  # the provider's reason, relayed as given
    april = map_run(RUNS["narayanan2021_t1_18B"])  # April 2021: a PyTorch fallback exists; micro-batch 1 stands
    assert (april.plan.micro_batch, april.stack.pipeline_runtime) == (1, "megatron")


def test_whole_sends_carry_t_times_the_bytes_and_gather_nothing():
    """GPT-145B, micro-batch 1: the activation is 2048 x 1 x 12288 x 2 B = 50,331,648 B. Scatter/gather sends 1/8 of
    it (6,291,456 B) a rank and all-gathers the whole over NVLink; the January code sends all of it a rank."""
    model, plan = _gpt(12288, 96), Plan(tp=8, pp=8, dp=24, micro_batch=1, global_batch=2304, sequence_parallel=False)
    full = 2048 * 12288 * 2
    split = {op.name: op for op in pipeline_p2p(model, plan, MEGATRON_2021)}
    whole = {op.name: op for op in pipeline_p2p(model, plan, JAN)}
    assert set(split) == {"pp/send_act", "pp/send_grad", "pp/gather_act", "pp/gather_grad"}
    assert set(whole) == {"pp/send_act", "pp/send_grad"}
    assert split["pp/send_act"].nbytes == pytest.approx(full / 8)
    assert whole["pp/send_act"].nbytes == whole["pp/send_grad"].nbytes == pytest.approx(full)
    # sequence parallelism holds the shard itself: the shard is what goes, whole sends or not
    sp = Plan(tp=8, pp=8, dp=24, micro_batch=1, global_batch=2304, sequence_parallel=True)
    assert [op.nbytes for op in pipeline_p2p(model, sp, JAN)] == [op.nbytes for op in pipeline_p2p(model, sp,
                                                                                                    MEGATRON_2021)]


def test_whole_sends_never_make_a_pipelined_step_faster():
    """Property: on DGX A100 nodes (one 200 Gb/s NIC a GPU, the stages on different nodes) a step whose sends go
    whole is never faster than the same step with scatter/gather, and the pipeline's share grows with the width."""
    for record in ("megatron_readme_jan2021_39B", "megatron_readme_jan2021_145B", "megatron_readme_jan2021_1T"):
        case = map_run(RUNS[record])
        whole = estimate(case.model, case.cluster, case.plan, case.stack)
        split = estimate(case.model, case.cluster, case.plan, case.stack.with_(pipeline_runtime="megatron"))
        assert whole.step_time >= split.step_time
        assert whole.breakdown["pp"] > split.breakdown["pp"]


def _tier(cluster, plan, axis: str) -> int:
    """The index of the innermost mesh tier that holds each of ``axis``'s groups (collectives/groups.axis_tiers)."""
    return [t.name for t in cluster.tiers].index(axis_tiers(plan, cluster)[axis])


def _whole_and_split(model, cluster, plan, stack):
    return (estimate(model, cluster, plan, stack.with_(pipeline_runtime=JAN2021_RUNTIME)),
            estimate(model, cluster, plan, stack.with_(pipeline_runtime="megatron")))


def _replicated(plan) -> bool:
    """The plan's pipeline sends a replicated tensor: pp > 1, tp > 1, sequence parallelism off, a 1-D layout."""
    return plan.pp > 1 and plan.tp > 1 and not plan.sequence_parallel and plan.tensor_layout == "1d"


def test_whole_sends_never_make_a_drawn_step_faster_where_the_stages_sit_past_the_tp_group_s_tier():
    """Property over 40 seeded draws (tests/draws.py: every model, system, tier layout, stack and overlap option)
    whose pipeline sends a replicated tensor across a tier outside the tensor-parallel group's (the stages on other
    nodes, tp inside one: the case Narayanan et al. 2021 §4.1 built scatter/gather for): sending it whole from every
    TP rank (t x the bytes on the slower link) is never faster than a 1/t slice plus an all-gather on the faster one.
    Where both sit on one tier (the stages inside an NVLink domain) the whole send may win by the gather's latency,
    as it would on the machine: those draws only carry more pipeline traffic."""
    crossing = draw_kept(2021, 40, lambda m, c, p, s: _replicated(p) and _tier(c, p, "pp") > _tier(c, p, "tp"))
    for model, cluster, plan, stack in crossing:
        whole, split = _whole_and_split(model, cluster, plan, stack)
        assert whole.step_time >= split.step_time, (model.name, plan, stack.name)
        assert whole.breakdown["pp"] > split.breakdown["pp"]
    for model, cluster, plan, stack in draw_kept(2022, 20, lambda m, c, p, s: _replicated(p)
                                                  and _tier(c, p, "pp") <= _tier(c, p, "tp")):
        whole, split = _whole_and_split(model, cluster, plan, stack)
        assert whole.breakdown["pp"] > split.breakdown["pp"], (model.name, plan, stack.name)


def test_whole_sends_change_nothing_without_a_replicated_tensor_to_send():
    """Property over 30 seeded draws with one stage, sequence parallelism on or a SUMMA layout (each TP rank holds
    its own shard: it is what goes, whole sends or not, cost/pipeline.py): the same step, to the bit."""
    for model, cluster, plan, stack in draw_kept(2023, 30, lambda m, c, p, s: not _replicated(p) and p.tp > 1):
        whole, split = _whole_and_split(model, cluster, plan, stack)
        assert whole.step_time == split.step_time, (model.name, plan, stack.name)
        assert whole.breakdown == split.breakdown


def test_where_the_april_18b_gap_is_not_the_data_parallel_all_reduce():
    """The April 2021 GPT-18B run (tp 8, pp 1, dp 32) reads about 21 % slow. Not its data-parallel all-reduce: both
    2021 releases reduce fp16 gradients once after the backward (megatron/model/distributed.py: allreduce_params at
    152aab30, allreduce_gradients at 50a4b5fa; fp32 only under --accumulate-allreduce-grads-in-fp32, off by
    default), which the profile prices (grad bytes 2, DP overlap off), and it is under 4 % of the step. The gap is
    its micro-batch: at the unstated 1, its 6 heads a rank fall back to PyTorch's softmax in the April code
    (fused_softmax.py at 50a4b5fa: attn_batch_size % 4), which meshplan prices; at 2 the kernel runs and the run
    reads within 5 %. The April code runs micro-batch 1, so nothing pins it to 2: left at 1."""
    case = map_run(RUNS["narayanan2021_t1_18B"])
    assert (case.plan.grad_bytes, case.stack.overlap_dp) == (2, False)
    est = estimate(case.model, case.cluster, case.plan, case.stack)
    assert est.breakdown["dp"] < 0.04 * est.step_time
    at_two = estimate(case.model, case.cluster, case.plan.with_(micro_batch=2), case.stack)
    assert predicted_metric(case, est.step_time) / case.measured - 1 < -0.15  # TFLOP/s: negative is slow
    assert abs(predicted_metric(case, at_two.step_time) / case.measured - 1) < 0.05
