"""Selective recompute: what each of Megatron-Core's recompute modules (``Plan.recompute_modules``) runs again
before the backward pass and which saved activations its checkpoint frees, as masks over a layer's ops."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from meshplan.cost.records import ACT_BYTES, FP32, OpCost
from meshplan.specs.stack import Stack
from meshplan.xp import Num, where


@dataclass(frozen=True, slots=True)
class Recompute:
    """What one of Megatron-Core's selective recompute modules (``Plan.recompute_modules``) does to a layer's ops:
    the forward kernels it runs again before the backward pass (``reruns``), the tensor-parallel collectives inside
    it that run again with them (``collectives``), and the forward records whose saved activations its checkpoint
    frees (``frees``): the module's inner tensors under a plain checkpoint, which keeps only the module's input, or
    the module's output under Megatron's output-discarding checkpoint (``CheckpointWithoutOutput``), which the next
    op would have kept. ``all_to_all``: the module's token dispatch and combine run again too (the forward's EP
    time). Names match an op of that name and its sub-records ("attn/q" matches "attn/q/cast", not "attn/q_up"); a
    name ending in "/" matches every op below it. ``per_op``: a policy over the whole layer's ops instead of names
    (``per_op_reruns``, ``per_op_kept``)."""

    reruns: tuple[str, ...]
    frees: tuple[str, ...]
    collectives: tuple[str, ...] = ()
    all_to_all: bool = False
    per_op: bool = False


# Megatron-Core megatron/core/transformer/transformer_config.py (recompute_modules) and transformer_layer.py, the
# modules as they act on the ops of attention.py and mlp_moe.py:
RECOMPUTE_MODULES: dict[str, Recompute] = {
    # checkpoint(core_attention, q, k, v): q, k, v stay saved; an unfused kernel's softmax probabilities, dropout
    # mask and output are recomputed (Korthikanti et al. 2022 §5, "selective activation recomputation"); a flash
    # kernel keeps only its log-sum-exp besides q, k, v, so recomputing it frees next to nothing
    "core_attn": Recompute(("attn/core",), ("attn/scores",)),
    # output-discarding checkpoint of the norms that are modules of their own: in Megatron-Core's Transformer Engine
    # layer specs the attention's input norm and a dense MLP's pre-MLP norm are fused into linear_qkv / linear_fc1
    # (IdentityOp: nothing to recompute), a MoE layer's pre-MLP norm is not (its router and experts both read it):
    # its output, which the router keeps, is freed and recomputed (TransformerLayer.recompute_pre_mlp_layernorm)
    "layernorm": Recompute(("moe/norm",), ("moe/router",)),
    # output-discarding checkpoint of the experts' activation function: its output, fc2's saved input, is recomputed
    "moe_act": Recompute(("moe/experts/act",), ("moe/experts/fc2", "moe/experts/act/clamp")),
    # checkpoint(mlp, hidden) on layers with a dense MLP only ("if not isinstance(self.mlp, MoELayer)"): the MLP
    # module holds the pre-MLP norm fused into linear_fc1, so only its input stays saved and norm, fc1 with its
    # sequence-parallel gather, the activation and fc2 with its reduce-scatter run again
    "mlp": Recompute(("mlp/norm", "mlp/fc1", "mlp/act", "mlp/fc2"), ("mlp/fc1", "mlp/act", "mlp/fc2"),
                     ("mlp/tp_in", "mlp/tp_out")),
    # checkpoint(moe_layer, norm output): router, latent projections, permutation (the local sort too), dispatch,
    # experts, combine and shared experts run again; only the norm output the router keeps stays saved
    "moe": Recompute(("moe/router", "moe/latent_in", "moe/latent_out", "moe/permute", "moe/unpermute",
                      "moe/sort_chunks", "moe/experts/", "moe/shared/"),
                     ("moe/latent_in", "moe/latent_out", "moe/experts/", "moe/shared/"),
                     ("moe/shared_tp_in", "moe/shared_tp_out"), all_to_all=True),
    "shared_experts": Recompute(("moe/shared/",), ("moe/shared/act", "moe/shared/fc2"),
                                ("moe/shared_tp_in", "moe/shared_tp_out")),
    # output-discarding checkpoint of multi-head latent attention's up-projections (and RoPE): the q, k, v the
    # attention core keeps are recomputed from the latents they keep (Megatron-Core qkv_up_proj_and_rope_apply; a
    # model without a query latent, q_lora_rank 0, runs its whole query projection there)
    "mla_up_proj": Recompute(("attn/q_up", "attn/kv_up", "attn/q"), ("attn/core",)),
    # not Megatron-Core's: torchtitan's per-op selective activation checkpointing of each block (activation_checkpoint
    # mode "selective", selective_ac_option "op"; pytorch/torchtitan torchtitan/parallelisms/parallelize_llama.py at
    # ba2469780, the December 2024 benchmarks' commit: _save_list and _custom_policy). Its policy saves the outputs
    # of aten.mm except every second one in the block's order, of the flash / efficient attention kernels and of
    # the TP reduce-scatters, and recomputes every other op; torchtitan 0.2.2's MoE layer as ROUTER and
    # ROUTED_EXPERTS say:
    # per_op_saved, per_op_reruns, per_op_kept
    "op_sac": Recompute((), (), per_op=True),
}


@lru_cache(maxsize=64)
def _patterns(modules: tuple[str, ...], part: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, prefixes) of ``part`` ("reruns", "frees" or "collectives") of ``modules``: the exact names (with
    their "/"-sub-records) and the "/"-ended prefixes."""
    names = [p for m in modules for p in getattr(RECOMPUTE_MODULES[m], part)]
    return (tuple(p for p in names if not p.endswith("/")), tuple(p + "/" if not p.endswith("/") else p
                                                                   for p in names))


def _matches(name: str, patterns: tuple[tuple[str, ...], tuple[str, ...]]) -> bool:
    exact, prefixes = patterns
    return name in exact or name.startswith(prefixes)


def per_op(modules: tuple[str, ...]) -> bool:
    """Whether ``modules`` hold a per-op policy over the whole layer (``Recompute.per_op``)."""
    return any(RECOMPUTE_MODULES[m].per_op for m in modules)


# torchtitan 0.2.2's per-op policy on a MoE layer (pytorch/torchtitan @73a0e697, tag v0.2.2):
# - distributed/activation_checkpoint.py _custom_policy counts aten.mm only; config/job_config.py's default
#   per_op_sac_force_recompute_mm_shapes_by_fqns = ["moe.router.gate"] makes every mm of the router gate's shape
#   PREFER_RECOMPUTE before it is counted: the router runs again, uncounted and unsaved (``ROUTER``);
# - models/llama4/infra/parallelize.py _op_sac_save_list holds aten.mm, not aten._grouped_mm: the grouped experts
#   (models/moe/moe.py _run_experts_grouped_mm) are never saved and never counted; the for-loop experts
#   (_run_experts_for_loop, the per-expert path: ``OpCost.launches`` set by mlp_moe.host_launched) run
#   torch.matmul of 2-D slices, aten.mm: w1, w3 (gated) and w2 per local expert, each counted (``_loop_saved``);
# - the same list holds _c10d_functional.all_to_all_single (and DeepEP's dispatch / combine): with expert
#   parallelism the dispatch's and the combine's outputs stay saved (distributed/expert_parallel.py
#   all_to_all_single_autograd), so neither runs again (``tp_rerun_by`` reruns TP collectives only).
ROUTER = "moe/router"
ROUTED_EXPERTS = "moe/experts/"
EXCHANGES = ("moe/dispatch", "moe/combine")


def _halves(g: Num) -> tuple[Num, Num]:
    """(ceil(g/2), floor(g/2)) of ``g`` experts, one plan's or an array of plans'."""
    if type(g) in (int, float):
        return float((int(g) + 1) // 2), float(int(g) // 2)
    return np.floor((g + 1) / 2), np.floor(g / 2)


def _loop_saved(loop: list[tuple[int, OpCost, int]], count: Num, saved: list[Num]) -> Num:
    """The for-loop experts' share of each record's output the policy saves, into ``saved``: ``loop`` holds
    (index, record, aten.mm calls per expert) in the order each expert runs them (w1, w3 of a gated fc1, then fc2's
    w2), ``count`` the block's mm count before the loop. Expert e's j-th call (of p an expert) is the
    (count + p·e + j)-th mm, saved when odd: with p even every expert saves the same calls, with p odd the saved
    calls alternate by expert, ceil(g/2) or floor(g/2) of the g experts. Returns the count after the loop."""
    p = sum(calls for _, _, calls in loop)
    g = loop[0][1].groups
    up, down = _halves(g)
    j = 0
    for i, _, calls in loop:
        for _ in range(calls):
            j += 1
            odd = (count + j) % 2 == 1
            experts = where(odd, g, 0.0) if p % 2 == 0 else where(odd, up, down)
            saved[i] = saved[i] + experts / (g * calls)
    return count + p * g


def _loop(ops: list[OpCost], first: int) -> list[tuple[int, OpCost, int]]:
    """The for-loop experts' forward GEMM records from ``first`` on, with their aten.mm calls per expert: a gated
    fc1 record is w1 and w3, two (twice as wide as fc2 is deep), any other one."""
    gemms = [(i, op) for i, op in enumerate(ops) if i >= first and op.phase == "fwd" and op.kind == "gemm"
             and op.name.startswith(ROUTED_EXPERTS) and not _zero(op.launches)]
    depth = [op.k for _, op in gemms if op.name.endswith("/fc2")]
    gated = bool(depth) and bool(np.all(np.asarray([op.n for _, op in gemms if op.name.endswith("/fc1")][:1])
                                        == 2 * np.asarray(depth[0])))
    return [(i, op, 2 if op.name.endswith("/fc1") and gated else 1) for i, op in gemms]


def _zero(x: Num) -> bool:
    """``x`` is a plain zero (no share, no launches); an array counts as not."""
    return type(x) in (bool, int, float) and x == 0


def runs_again(share: Num) -> bool:
    """Whether an op whose share run again is ``share`` (``rerun_by``: a bool, a float or an array) runs again at
    all: not for a plain 0 (False, 0.0), which callers skip, so that sums stay scalar; an array counts as some."""
    return not _zero(share)


def rerun_part(share: Num, x: Num) -> Num:
    """``x`` (an op's time, FLOPs or launches) times the share of it run again (``rerun_by``): ``x`` itself for all
    of it and 0.0 for none, so that sums stay scalar and exact where no share is partial."""
    if type(share) in (bool, int, float):
        return x if share == 1 else 0.0 if share == 0 else share * x
    return share * x


def per_op_saved(ops: list[OpCost]) -> list[Num]:
    """Per op of one layer, in the order the block runs them: the share of its output torchtitan's per-op SAC saves
    (0 to 1). Its policy counts the block's aten.mm calls and saves the odd ones' outputs (the 1st, 3rd, ...: Llama's
    wq, wv, w1 and w2) and the attention kernel's; a MoE layer's router is neither counted nor saved, grouped
    experts are not saved, for-loop experts are counted call by call (``ROUTER``, ``_loop_saved``)."""
    saved: list[Num] = [0.0] * len(ops)
    loop: list[tuple[int, OpCost, int]] = []
    count: Num = 0.0
    for i, op in enumerate(ops):
        if op.phase != "fwd":
            continue
        if op.kind == "attention":
            saved[i] = 1.0
        elif op.kind != "gemm" or op.name == ROUTER or op.name.startswith(ROUTER + "/"):
            continue
        elif op.name.startswith(ROUTED_EXPERTS):
            if not loop and not _zero(op.launches):
                loop = _loop(ops, i)
                count = _loop_saved(loop, count, saved)
        else:
            count = count + 1
            saved[i] = count % 2
    return saved


def per_op_reruns(ops: list[OpCost]) -> list[Num]:
    """Per op of one layer: the share of its forward kernels torchtitan's per-op SAC runs again. The matmuls whose
    output it does not save (``per_op_saved``: Llama's wk, wo, w3) run again; the attention kernel, whose output is
    saved, and the collectives (the TP gathers: ``tp_rerun_by``) do not; every other op (norms, RoPE, the activation
    and gate, residual adds, casts) is not saved, and since the backward pass needs the inputs of the matmuls it
    saved the outputs of, runs again. Simplification: the last residual add, which an early stop of the recompute
    may skip, is counted."""
    return [0.0 if op.phase != "fwd" or op.kind == "collective" or op.kind == "attention" else
            1.0 - share if op.kind == "gemm" else 1.0 for op, share in zip(ops, per_op_saved(ops), strict=True)]


def compiled(stack: Stack) -> bool:
    """Whether ``stack`` runs its blocks under torch.compile: ``Stack.compiled``, or torchtitan's element-wise fusion,
    which only its [compile] enable gives (configs/torchtitan.py; the validation reads a stated torch.compile as
    fusion fused, meshplan_validation/map_kernels.kernels)."""
    return bool(stack.compiled or stack.fusion_mode.fused)


# The forward GEMM whose output the backward reads through the routing weights, though no later GEMM reads it: the
# routed experts' fc2. torchtitan 0.2.2 (torchtitan/models/moe/moe.py MoE.forward) weights the experts' outputs after
# them where score_before_experts=False (its deepseek_v3 flavours, and those configs/torchtitan_models.py writes for a
# model without ModelSpec.moe_score_before_experts): torch.bmm(top_scores, routed_output_unsorted.float()), whose
# gradient with respect to the scores is the experts' output; compiled, the scatter and upcast between them
# (PREFER_RECOMPUTE) are recomputed in the backward from the saved fc2 output (torch/_functorch/partitioners.py
# must_recompute: MUST_RECOMPUTE or PREFER_RECOMPUTE), which so stays saved. Scored before the experts (the MoEArgs
# default, moe.py:31, which torchtitan's Llama 4 flavours keep; ModelSpec.moe_score_before_experts), the output is read
# only by the index_put into routed_output_unsorted and the .sum(dim=1), neither of whose backward needs it.
WEIGHTED = "moe/experts/fc2"


def residual_only(ops: list[OpCost], scored_before: bool = False) -> tuple[int, ...]:
    """The indices of the forward GEMMs whose output only the block's residual add (or a sum into it) reads, so that
    no backward formula needs it: the layer's last forward GEMM (a dense MLP's fc2, Llama's w2; a MoE layer's shared
    experts' fc2 or latent up-projection; a mixer's output projection), unless it is the routed experts' fc2
    (``WEIGHTED``), as in a MoE layer with neither shared experts nor a latent; and where the model weights the
    experts' inputs (``scored_before``: ModelSpec.moe_score_before_experts, Llama 4), the routed experts' fc2
    wherever it runs. Empty: none."""
    gemms = [i for i, op in enumerate(ops) if op.phase == "fwd" and op.kind == "gemm"]
    return tuple(i for i in gemms if (ops[i].name == WEIGHTED and scored_before)
                 or (i == gemms[-1] and ops[i].name != WEIGHTED))


def per_op_kept(ops: list[OpCost], compiled: bool = False, scored_before: bool = False) -> Num:
    """Bytes torchtitan's per-op SAC keeps of one layer besides the block's input: the 16-bit outputs (m·n, of each
    group of a grouped GEMM) of the matmuls it saves, in the share it saves them (``per_op_saved``: the odd ones; half
    of a for-loop expert record's calls, by expert, none of grouped experts'), the attention kernel's output
    (queries·heads × head dim) with its fp32 log-sum-exp per query and head, and with expert parallelism the
    dispatch's and the combine's all-to-all outputs (``EXCHANGES``).

    ``compiled`` (the block under torch.compile): less the outputs the policy saves of the GEMMs only the residual add
    reads (``residual_only``: Llama's w2, the 7th; a MoE layer's routed experts' fc2 stays, the scores' gradient reads
    it, unless ``scored_before``, Llama 4). Eager SAC keeps every output its policy saves until the block's backward
    (pytorch/pytorch torch/utils/checkpoint.py @0008d771, _CachingTorchDispatchMode stores each MUST_SAVE op's output;
    the CheckpointPolicy docstring: a save policy "would save additional tensors not limited to ones that are actually
    needed for gradient computation"); compiled, the policy tags the graph's nodes and AOTAutograd's partitioner keeps
    only what the backward graph uses (torch/_functorch/partitioners.py @00c07b93 _extract_fwd_bwd_modules: "filter out
    saved values that don't actually end up being used by the backwards pass"). 128 MiB a layer at 16,384 tokens of
    width 4096: torchtitan's eager 8B runs read 5.4 and 5.0 GiB above their compiled twins at FSDP 8 and 128 (32 layers:
    4.0 GiB of it)."""
    saved = per_op_saved(ops)
    dropped = residual_only(ops, scored_before) if compiled else ()
    kept: Num = 0.0
    for i, (op, share) in enumerate(zip(ops, saved, strict=True)):
        if op.phase != "fwd" or i in dropped:
            continue
        if op.kind == "gemm":
            kept = kept if _zero(share) else kept + share * op.m * op.n * op.groups * ACT_BYTES
        elif op.kind == "attention":
            kept = kept + op.m * (op.k * ACT_BYTES + FP32)
        elif op.name in EXCHANGES and op.collective is not None:
            # the all-to-all's output, as many rows as it sends (balanced routing), where there is one (ep > 1)
            kept = kept + where(op.collective.group > 1, op.nbytes, 0.0)
    return kept


def rerun_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[Num]:
    """Per op: the share of its forward kernels (1: all, 0: none) that the selective recompute of ``modules`` runs
    again in the backward pass; a share between under a per-op policy (``per_op_reruns``: for-loop experts)."""
    patterns = _patterns(modules, "reruns")
    named: list[Num] = [op.phase == "fwd" and op.kind != "collective" and _matches(op.name, patterns) for op in ops]
    if not per_op(modules):
        return named
    return [1.0 if a else b for a, b in zip(named, per_op_reruns(ops), strict=True)]


def tp_rerun_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward tensor-parallel collective inside a module ``modules`` recompute, which runs again; under a
    per-op policy every forward TP collective but the reduce-scatters, whose outputs torchtitan's SAC saves."""
    patterns = _patterns(modules, "collectives")
    whole = per_op(modules)
    return [op.phase == "fwd" and op.kind == "collective" and (
        _matches(op.name, patterns) or (whole and op.collective is not None and op.collective.axis == "tp"
                                        and op.collective.kind != "reduce_scatter")) for op in ops]


def freed_by(ops: list[OpCost], modules: tuple[str, ...]) -> list[bool]:
    """Per op: a forward record whose saved activations the selective recompute of ``modules`` frees."""
    patterns = _patterns(modules, "frees")
    return [op.phase == "fwd" and _matches(op.name, patterns) for op in ops]
