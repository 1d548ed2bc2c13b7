"""The MoE layer's per-op costs (cost/mlp_moe.py): expert FLOPs and the dispatch all-to-all."""

from __future__ import annotations

from meshplan.cost.layers import moe_layer
from meshplan.cost.records import ACT_BYTES
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def _flops(ops, phase=None, kind=None):
    return sum(o.flops for o in ops if (phase is None or o.phase == phase) and (kind is None or o.kind == kind))


def test_moe_expert_flops_scale_with_top_k_not_expert_count():
    base = dict(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
                mlp="swiglu", norm="rmsnorm", moe_ffn_hidden_size=1024)
    few = ModelSpec(num_experts=8, moe_topk=2, **base)
    many = ModelSpec(num_experts=64, moe_topk=2, **base)
    expert = [o for o in moe_layer(few, Plan(), Stack()) if o.name.startswith("moe/experts") and o.kind == "gemm"]
    expert_many = [o for o in moe_layer(many, Plan(), Stack()) if o.name.startswith("moe/experts") and o.kind == "gemm"]
    assert _flops(expert) == _flops(expert_many)
    # top-2 SwiGLU experts: 3 GEMMs of 2·T·k·H·Fe, ×3 passes = 18·T·k·H·Fe
    assert _flops(expert) == 18 * 2048 * 2 * 1024 * 1024


def test_moe_dispatch_bytes():
    model = ModelSpec(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096,
                      vocab_size=32000, num_experts=8, moe_topk=2, moe_ffn_hidden_size=1024)
    ops = moe_layer(model, Plan(tp=2, dp=4, ep=4, sequence_parallel=True), Stack())
    dispatch = [o for o in ops if o.name == "moe/dispatch" and o.phase == "fwd"][0]
    # T/t tokens routed · k copies · h · 2 bytes = 1024 · 2 · 1024 · 2
    assert dispatch.nbytes == 1024 * 2 * 1024 * ACT_BYTES
    assert dispatch.collective.group == 4


MIXTRAL = dict(name="moe", num_layers=2, hidden_size=1024, num_heads=8, ffn_hidden_size=4096, vocab_size=32000,
               num_experts=8, moe_topk=2, moe_ffn_hidden_size=2048, mlp="swiglu", norm="rmsnorm")


def _records(ops, name):
    return {o.phase: o.nbytes for o in ops if o.name == name}


def test_the_permutation_as_each_code_runs_it():
    """T = 2048 tokens (b 1, s 2048), k = 2, tp = 1: Tg = 2048 tokens, R = 4096 routed rows of h = 1024, a = 2, f = 4
    (cost/moe_permute.py): fused 2R / R + Tg forward; the unfused Megatron-Core order (Tg + R), (3Tg + 3R) forward,
    (3Tg + R), (Tg + 7R) backward; transformers' sort_gather R·(a + 4f) + Tg·(2f + a) forward and
    Tg·(a + f) + R·(12f + 2a) backward for the unpermutation."""
    model, plan = ModelSpec(**MIXTRAL), Plan(micro_batch=1)
    tg, r, h, a = 2048, 4096, 1024, ACT_BYTES
    fused = moe_layer(model, plan, Stack())
    assert _records(fused, "moe/permute")["fwd"] == a * 2 * r * h
    assert _records(fused, "moe/unpermute")["fwd"] == a * (r + tg) * h
    eager = moe_layer(model, plan, Stack(moe_permute="gather_scatter"))
    assert _records(eager, "moe/permute") == {"fwd": a * (tg + r) * h, "bwd_x": a * (3 * tg + r) * h}
    assert _records(eager, "moe/unpermute") == {"fwd": a * (3 * tg + 3 * r) * h, "bwd_x": a * (tg + 7 * r) * h}
    hf = moe_layer(model, plan, Stack(moe_permute="sort_gather"))
    assert _records(hf, "moe/unpermute") == {"fwd": (r * (2 + 16) + tg * (8 + 2)) * h,
                                             "bwd_x": (tg * (2 + 4) + r * (48 + 4)) * h}


def test_the_all_gather_dispatcher_moves_the_tokens_once_each_way():
    """tp = etp = 8, ep = 1, sequence parallel: the all-to-all dispatcher all-gathers the k = 2 routed rows of the
    T/t tokens of each rank (k·T·h·a over etp), the all-gather dispatcher the tokens (T·h·a over etp·ep): half the
    bytes; its permutation then runs on the gathered T tokens, R = k·T rows, on every rank."""
    model = ModelSpec(**MIXTRAL)
    plan = Plan(tp=8, sequence_parallel=True, micro_batch=1)
    t, k, h, a = 2048, 2, 1024, ACT_BYTES
    alltoall = moe_layer(model, plan, Stack())
    allgather = moe_layer(model, plan, Stack(moe_dispatcher="allgather"))
    gathered = [o for o in alltoall if o.name == "moe/etp_gather" and o.phase == "fwd"][0]
    assert gathered.nbytes == k * t * h * a
    dispatch = [o for o in allgather if o.name == "moe/dispatch" and o.phase == "fwd"][0]
    assert (dispatch.collective.kind, dispatch.nbytes, dispatch.collective.group) == ("all_gather", t * h * a, 8)
    assert not [o for o in allgather if o.name.startswith("moe/etp_")]
    assert _records(allgather, "moe/permute")["fwd"] == a * 2 * (k * t) * h  # fused: 2R, R = k·T
    assert _records(alltoall, "moe/permute")["fwd"] == a * 2 * (k * t // 8) * h  # R = k·T/t


def test_the_received_rows_are_sorted_by_local_expert_and_back_under_the_all_to_all_dispatcher():
    """Megatron-Core's alltoall dispatcher with E/ep > 1 local experts regroups the R rows it receives by local expert
    and back (token_dispatcher.py sort_chunks_by_idxs, cost/moe_permute.local_sort): T = 2048 tokens, k = 2,
    R = 4096 rows of h = 1024: two sorts a pass, each reading and writing R·h·a = 8 MiB, plus the float32
    probabilities read and written once: 4·R·h·a + 2·R·f = 33,587,200 bytes, forward and backward alike."""
    model, r, h, a = ModelSpec(**MIXTRAL), 4096, 1024, ACT_BYTES
    ops = moe_layer(model, Plan(micro_batch=1, dp=4, ep=4), Stack())  # 8 experts / ep 4 = 2 local experts
    moved = 4 * r * h * a + 2 * r * 4
    assert moved == 33_587_200
    assert _records(ops, "moe/sort_chunks") == {"fwd": moved, "bwd_x": moved}
    # one local expert has nothing to regroup; the all-gather and flex dispatchers permute straight into expert
    # order; an eager stack's experts are not Megatron-Core's
    assert _records(moe_layer(model, Plan(micro_batch=1, dp=8, ep=8), Stack()), "moe/sort_chunks") == {"fwd": 0.0,
                                                                                                      "bwd_x": 0.0}
    for stack in (Stack(moe_dispatcher="allgather"), Stack(moe_dispatcher="flex"), Stack(fusion="eager")):
        assert not _records(moe_layer(model, Plan(micro_batch=1, dp=4, ep=4), stack), "moe/sort_chunks")


def test_fp8_experts_pad_their_rows_to_the_gemm_alignment_and_unpad_the_output():
    """TEGroupedMLP pads each local expert's rows for fp8 / fp4 GEMMs (Fp8Padding) and unpads the output
    (Fp8Unpadding), cost/moe_permute.fp8_padding: R = 4096 rows of h = 1024, two copies a pass each reading and
    writing R·h·a, and the probabilities' padding: 4·R·h·a + 2·R·f bytes a pass; none in bf16, none for a fused
    grouped MLP (expert_gemm "grouped") and none for an eager stack."""
    model, r, h, a = ModelSpec(**MIXTRAL), 4096, 1024, ACT_BYTES
    moved = 4 * r * h * a + 2 * r * 4
    for precision in ("fp8", "mxfp8", "fp4"):
        ops = moe_layer(model, Plan(micro_batch=1, precision=precision), Stack())
        assert _records(ops, "moe/experts/fp8_pad") == {"fwd": moved, "bwd_x": moved}
    assert not _records(moe_layer(model, Plan(micro_batch=1), Stack()), "moe/experts/fp8_pad")
    for stack in (Stack(expert_gemm="grouped"), Stack(fusion="eager")):
        assert not _records(moe_layer(model, Plan(micro_batch=1, precision="fp8"), stack), "moe/experts/fp8_pad")


def test_the_rows_moved_around_the_experts_grow_with_the_tokens_and_never_with_the_expert_parallel_size():
    """Property (cost/moe_permute.local_sort, fp8_padding): over micro-batches 1-8, ep 1-8 and the 16-bit and
    fp8 precisions, the sort's and the padding's bytes never fall when a micro-batch grows (more routed rows), and
    never rise when ep grows (the same rows a rank, fewer local experts: the sort stops at one)."""
    model = ModelSpec(**MIXTRAL)

    def moved(mbs: int, ep: int, precision: str) -> float:
        ops = moe_layer(model, Plan(micro_batch=mbs, dp=8, ep=ep, precision=precision), Stack())
        return sum(o.nbytes for o in ops if o.name in ("moe/sort_chunks", "moe/experts/fp8_pad"))

    for precision in ("bf16", "fp8"):
        for ep in (1, 2, 4, 8):
            row = [moved(mbs, ep, precision) for mbs in (1, 2, 4, 8)]
            assert row == sorted(row) and row[-1] > 0 or (precision, ep) == ("bf16", 8)
        for mbs in (1, 4):
            col = [moved(mbs, ep, precision) for ep in (1, 2, 4, 8)]
            assert col == sorted(col, reverse=True)


def test_no_fp8_padding_where_every_expert_count_is_aligned_already():
    """Transformer Engine's Fp8Padding copies nothing when every count is aligned (fp8_padding.py @ v2.8, "no padding
    needed"): a HybridEP dispatch pads inside (hybrid_ep_dispatch's pad_multiple), DeepEP's does not; padded to
    capacity, each expert's count is capacity·etp·ep. Mixtral (8 experts, top-2), R = 4096 routed rows at ep 1:
    capacity = ceil(4096 / 8 x F) = 512 at F = 1 (512 = 16 x 32: aligned at 16 and 32 rows) and ceil(512 x 1.01)
    = 518 at F = 1.01 (518 = 16 x 32 + 6: not aligned, the copy runs over the 8 x 518 = 4,144 slots)."""
    model, h, a = ModelSpec(**MIXTRAL), 1024, ACT_BYTES
    fp8 = Plan(micro_batch=1, precision="fp8")
    for backend, copies in (("deepep", True), ("hybridep", False)):
        ops = moe_layer(model, fp8, Stack(moe_dispatcher="flex", flex_backend=backend))
        assert bool(_records(ops, "moe/experts/fp8_pad")) is copies
    for factor, pad, slots in ((1.0, True, None), (1.01, True, 8 * 518), (1.0, False, 4096)):
        plan = Plan(micro_batch=1, precision="mxfp8", moe_expert_capacity_factor=factor,
                    moe_pad_expert_input_to_capacity=pad)
        got = _records(moe_layer(model, plan, Stack()), "moe/experts/fp8_pad")
        assert got == ({} if slots is None else {p: 4 * slots * h * a + 2 * slots * 4 for p in ("fwd", "bwd_x")})
