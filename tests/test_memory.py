"""Model-state memory under ZeRO (Rajbhandari et al. 2020, Fig. 1) and activations in flight."""

from __future__ import annotations

from dataclasses import replace

import pytest

from conftest import gpt
from meshplan.cost.params import StageParams
from meshplan.errors import SpecError
from meshplan.memory import in_flight_chunks, model_states
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack

PSI = 1_000_000_000


@pytest.mark.parametrize("n", [1, 8, 64])
def test_zero_stages_closed_forms(n):
    params = StageParams(dense=PSI, expert=0.0)

    def total(zero):
        return sum(model_states(params, Plan(dp=n, zero=zero, grad_bytes=2), Stack()))

    assert total(0) == pytest.approx(16 * PSI)
    assert total(1) == pytest.approx(4 * PSI + 12 * PSI / n)
    assert total(2) == pytest.approx(2 * PSI + 14 * PSI / n)
    assert total(3) == pytest.approx(16 * PSI / n)


def test_zero3_memory_per_gpu_falls_as_dp_grows():
    params = StageParams(dense=PSI, expert=0.0)
    totals = [sum(model_states(params, Plan(dp=d, zero=3), Stack())) for d in (1, 2, 4, 8, 16)]
    assert totals == sorted(totals, reverse=True) and totals[-1] < totals[0]


def test_expert_weights_shard_over_ep_times_etp_data_parallel_group():
    # dp=8, ep=4, etp=1, tp=1: expert-data-parallel = 8/4 = 2 ranks share each expert's optimizer state
    params = StageParams(dense=0.0, expert=PSI)
    _, _, opt = model_states(params, Plan(dp=8, ep=4, etp=1, zero=1), Stack())
    assert opt == pytest.approx(12 * PSI / 2)


def test_offloaded_optimizer_leaves_no_state_on_gpu():
    _, _, opt = model_states(StageParams(dense=PSI, expert=0.0), Plan(offload_optimizer=True), Stack())
    assert opt == 0


def test_in_flight_micro_batches_per_schedule():
    # 1F1B: min(p, m) on rank 0; GPipe: m; interleaved: 2(p-1) + (v-1)p + 1 chunks
    assert in_flight_chunks(Plan(pp=4, global_batch=16)) == 4
    assert in_flight_chunks(Plan(pp=4, global_batch=2)) == 2
    assert in_flight_chunks(Plan(pp=4, global_batch=16, schedule="gpipe")) == 16
    assert in_flight_chunks(Plan(pp=4, vpp=2, global_batch=16, schedule="interleaved")) == 2 * 3 + 4 + 1
    assert in_flight_chunks(Plan(pp=4, global_batch=16), last=True) == 1


def test_in_flight_matches_the_simulator():
    from meshplan.pipeline.simulator import simulate
    from meshplan.pipeline.tables import build

    for schedule, pp, m, vpp in (("1f1b", 4, 8, 1), ("gpipe", 3, 5, 1), ("interleaved", 4, 8, 2)):
        timeline = simulate(build(schedule, pp, m, vpp), 1.0, 2.0)
        plan = Plan(pp=pp, vpp=vpp, global_batch=m, schedule=schedule)
        assert timeline.max_in_flight[0] == in_flight_chunks(plan)
        assert timeline.max_in_flight[-1] == in_flight_chunks(plan, last=True)


def test_full_recompute_keeps_only_layer_inputs():
    from meshplan.specs.hardware import load_system
    from meshplan.step.assemble import step_costs

    model = gpt(layers=8, vocab=1024)  # a small head, so the layers dominate
    c = load_system("h100").cluster(1)
    none = step_costs(model, c, Plan(recompute="none"))
    full = step_costs(model, c, Plan(recompute="full"))
    assert full.memory["activations"] < none.memory["activations"] / 4


# ---- partial activation offload (Plan.offload_layers, Megatron-Core cpu_offloading_num_layers) -----------------
def _offload_case(layers):
    from meshplan.estimate import estimate
    from meshplan.specs.hardware import load_system
    from meshplan.specs.model_load import load_model

    model = load_model("llama3-70b")  # 80 layers
    cluster = load_system("gb200").cluster(64)
    plan = Plan(dp=64, micro_batch=2, global_batch=128, zero=3, precision="fp8", offload_activations=layers > 0,
                offload_layers=layers)
    return estimate(model, cluster, plan)


def test_offloading_half_the_layers_keeps_half_their_activations_on_the_gpu():
    from meshplan.memory import activation_bytes
    from meshplan.specs.model_load import load_model

    model = load_model("llama3-70b")  # 80 layers, one stage, 1F1B: one micro-batch in flight
    saved, layer_input = 1.0, 0.1  # bytes one layer saves / its input, in units
    assert activation_bytes(model, Plan(), saved, layer_input) == 80
    # 40 layers offloaded: the 40 others keep theirs, plus the double buffer of two layers the copy works through
    assert activation_bytes(model, Plan(offload_activations=True, offload_layers=40), saved, layer_input) == 40 + 2
    assert activation_bytes(model, Plan(offload_activations=True), saved, layer_input) == 2  # all of them
    half, every = _offload_case(40), _offload_case(80)
    assert half.host_memory == pytest.approx(every.host_memory / 2, rel=1e-9)


def test_a_partial_offload_hides_only_behind_the_offloaded_layers():
    # each offloaded layer's copy overlaps that layer's compute only: 40 layers expose 40 × max(0, copy - compute)
    half, every = _offload_case(40), _offload_case(80)
    assert half.breakdown["offload"] == pytest.approx(every.breakdown["offload"] / 2, rel=1e-9)
    assert every.breakdown["offload"] > 0  # GB200: 5 GB per layer over 195 GB/s outlasts the layer's forward


def test_only_the_vocabulary_matrices_split_over_tensor_parallel_ranks():
    from meshplan.cost.params import layer_params, stage_params

    model = gpt(layers=4, hidden=1024, seq=2048, vocab=51200)  # learned positions, tied head, no embedding norm
    plan = Plan(tp=4, pp=2)
    first = stage_params(model, plan, first=True)
    per_layer = 2 * layer_params(model, plan).dense  # 2 of the 4 layers on each stage
    # first stage: its 2 layers, the word embedding split 4 ways (51200·1024/4) and the whole position table
    # (2048·1024), which Megatron keeps as a plain nn.Embedding on every rank
    assert first.dense == pytest.approx(per_layer + 51200 * 1024 / 4 + 2048 * 1024)
    # last stage: the tied head's own copy of the word embedding, split 4 ways, and the final LayerNorm
    # (weight and bias, 2·1024) copied on every rank
    last = stage_params(model, plan, first=False)
    assert last.dense - per_layer == pytest.approx(51200 * 1024 / 4 + 2 * 1024)


def test_transient_buffers_of_tensor_parallel_gathers_and_sharded_layers():
    from meshplan.cost.params import layer_params
    from meshplan.memory import buffer_memory

    model = gpt(layers=4, hidden=1024, seq=2048)
    assert buffer_memory(model, Plan()) == 0  # no tensor parallelism, no sharded weights: nothing in transit
    # tp = 2: the gathered input and output of a TP collective, 2 · (2048 tokens · 1024) · 2 bytes
    assert buffer_memory(model, Plan(tp=2, sequence_parallel=True)) == 2 * 2048 * 1024 * 2
    # ZeRO-3 with fp32 reduction: two layers' unsharded 16-bit weights (in use and prefetched), and one layer's
    # 16-bit gradients plus the fp32 reduce-scatter input they are copied into: (2·2 + 2 + 4) bytes per parameter
    params = layer_params(model, Plan(dp=8, zero=3)).total
    assert buffer_memory(model, Plan(dp=8, zero=3, grad_bytes=4)) == pytest.approx(params * 10)
    assert buffer_memory(model, Plan(dp=8, zero=3, grad_bytes=2)) == pytest.approx(params * 8)


def test_the_first_rank_holds_chunk_zeros_embeddings_only():
    """Interleaved, p = 4, v = 2, m = 16: 2·3 + 1·4 + 1 = 11 forwards are in flight at the first backward, in
    blocks of 4 per chunk (chunk 0: mb 0-3, chunk 1: mb 0-3, chunk 0: mb 4-6), so 4 + 3 = 7 = 2p - 1 of them
    ran the embedding; with m = 4 no more than 4. 1F1B holds p = 4, all in its one chunk."""
    from meshplan.memory import embedding_in_flight

    plan = Plan(dp=1, pp=4, vpp=2, schedule="interleaved", global_batch=16)
    assert in_flight_chunks(plan) == 11 and embedding_in_flight(plan) == 7
    assert embedding_in_flight(replace(plan, global_batch=4)) == 4
    assert embedding_in_flight(Plan(dp=1, pp=4, global_batch=16)) == 4


def test_moe_layers_per_stage_put_the_dense_ones_on_the_first():
    """DeepSeek-V3: 61 layers, the first 3 dense. pp = 8: ⌈61/8⌉ = 8 layers per stage; the first rank has the
    3 dense ones and 5 MoE, the last 8 MoE (the averaged 58/61 per layer gave both 7.6); one stage holds all 58.
    The last rank then carries more expert weights than the first, and its multi-token-prediction layer (a MoE
    layer, mtp_layers = 1) one MoE layer's experts more: 9 against 5."""
    from meshplan.cost.params import moe_layers_on_stage, stage_params
    from meshplan.specs.model_load import load_model

    model = load_model("deepseek-v3")
    plan = Plan(dp=8, pp=8, ep=8, global_batch=64)
    assert (moe_layers_on_stage(model, plan, True), moe_layers_on_stage(model, plan, False)) == (5, 8)
    assert moe_layers_on_stage(model, replace(plan, pp=1, dp=64), True) == 58
    first, last = stage_params(model, plan, True), stage_params(model, plan, False)
    assert last.expert == pytest.approx(first.expert * 9 / 5)


def test_torch_pipeline_runtime_keeps_per_micro_batch_tensors():
    from meshplan.memory import pipeline_runtime_memory
    from meshplan.specs.model import ModelSpec

    model = ModelSpec(name="t", num_layers=8, hidden_size=1024, num_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000, seq_length=2048)
    # tp 2 with sequence parallelism, micro-batch 1, pp 4, m = 8: a boundary (layer input) is
    # 2048/2 tokens × 1024 × 2 B = 2 MiB; on each of the last rank's v = 1 chunk (not the first):
    # receive buffer + its gradient, 2·m boundaries = 32 MiB; the first rank's chunk (not the last):
    # gradient receive buffer + kept output, also 32 MiB; the last rank also keeps m fp32 logits under
    # F.cross_entropy: 8 × 2048 tokens × 32000 / 2 × 4 B = 1000 MiB
    plan = Plan(tp=2, pp=4, dp=1, sequence_parallel=True, global_batch=8)
    torch_rt = Stack(pipeline_runtime="torch", cross_entropy="pytorch")
    mib = 2**20
    first, last = pipeline_runtime_memory(model, plan, torch_rt)
    assert first == pytest.approx(32 * mib)
    assert last == pytest.approx(32 * mib + 8 * 2048 * 16000 * 4)
    # interleaved v = 2: 2·m·(2v - 1) = 48 boundaries on either rank
    inter = replace(plan, vpp=2, schedule="interleaved")
    assert pipeline_runtime_memory(model, inter, torch_rt)[0] == pytest.approx(48 * 2 * mib)
    # Megatron-Core keeps none of them, and without a pipeline there is no runtime
    assert pipeline_runtime_memory(model, plan, torch_rt.with_(pipeline_runtime="megatron")) == (0.0, 0.0)
    assert pipeline_runtime_memory(model, replace(plan, pp=1, global_batch=8), torch_rt) == (0.0, 0.0)


def test_torch_runtime_frees_a_chunks_unsharded_gradients_once_reduced():
    from meshplan.memory import chunk_gradient_share

    params = StageParams(dense=PSI, expert=0.0)
    # ZeRO-1 (torchtitan's FSDP2 under pipeline parallelism): 4 B unsharded gradients per parameter, but with
    # v = 2 chunks and a single round of micro-batches (m = p = 8) only one chunk's are alive at a time
    one_round = Plan(dp=8, pp=8, vpp=2, schedule="interleaved", global_batch=64, zero=1, grad_bytes=4)
    torch_rt = Stack(pipeline_runtime="torch")
    assert chunk_gradient_share(one_round, torch_rt) == 0.5
    assert model_states(params, one_round, torch_rt)[1] == pytest.approx(2 * PSI)
    # torch runs max(1, m // p) rounds: m = 12 < 2p is still one round; two rounds (m = 16): every chunk has
    # begun its backward before the first has finished
    assert chunk_gradient_share(replace(one_round, global_batch=96), torch_rt) == 0.5
    assert chunk_gradient_share(replace(one_round, global_batch=128), torch_rt) == 1.0
    # 1F1B, Megatron-Core's whole-step gradient buffer, or gradients already sharded (ZeRO-2): unchanged
    assert chunk_gradient_share(replace(one_round, vpp=1, schedule="1f1b"), torch_rt) == 1.0
    assert chunk_gradient_share(one_round, Stack()) == 1.0
    assert chunk_gradient_share(replace(one_round, zero=2), torch_rt) == 1.0


def test_unknown_pipeline_runtime_is_named():
    with pytest.raises(SpecError, match="pipeline_runtime='deepspeed' must be one of megatron, torch"):
        Stack(pipeline_runtime="deepspeed")


def test_the_runtime_tensors_reach_both_ranks_peaks():
    from meshplan.estimate import estimate
    from meshplan.specs.hardware import load_system
    from meshplan.specs.model_load import load_model

    model, cluster = load_model("llama3-8b"), load_system("h100").cluster(16)
    plan = Plan(tp=2, pp=2, dp=4, sequence_parallel=True, global_batch=16, recompute="full")
    pytorch_loss = Stack(cross_entropy="pytorch")
    torch_rt = estimate(model, cluster, plan, pytorch_loss.with_(pipeline_runtime="torch"))
    megatron = estimate(model, cluster, plan, pytorch_loss)
    # m = 16 / 4 = 4 micro-batches; a layer input is 8192 / 2 tokens × 4096 × 2 B = 64 MiB, 2·m·(2v − 1) = 8 of
    # them on either rank; the last also keeps m fp32 logits of 8192 × 128256 / 2 × 4 B
    boundaries = 8 * 8192 // 2 * 4096 * 2
    first = torch_rt.rank_memory[0] - megatron.rank_memory[0]
    last = torch_rt.rank_memory[1] - megatron.rank_memory[1]
    assert first == pytest.approx(boundaries)
    assert last == pytest.approx(boundaries + 4 * 8192 * 128256 / 2 * 4)
    assert torch_rt.peak_memory == pytest.approx(max(torch_rt.rank_memory))
