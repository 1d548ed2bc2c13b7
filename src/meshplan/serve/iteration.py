"""One iteration of an instance, timed: the ops of the layers on a pipeline stage, the embedding and the LM head
(ops.py, moe.py), each op by the roofline (roofline.op_time: its compute and memory times, roofline.work_time) and
each collective by the one dispatcher (collectives/price.py: inside the NVLink domain NCCL's protocol model, and the
tensor-parallel all-reduce with the engines' kernels, allreduce.py; α-β beyond it), one after another: decode's
all-reduces are small and on the critical path, so their latency α counts in full (nothing overlaps them in a forward
pass).

Pipeline parallelism (vLLM's and TensorRT-LLM's pipeline runtimes): the batch is split into p micro-batches that
follow each other through the p stages, so each stage runs L/p layers on B/p sequences and a sequence's next token
waits for its micro-batch to pass every stage: a token every p·T_stage (the bottleneck stage: the last, with the
head), for B sequences. The engine's host time per iteration (engine.py) comes on top, and the fixed time of the
kernels its layers launch beyond the op list's, where a profile counted them (``extra_kernel_time``).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from functools import cache

from meshplan.collectives.groups import send_stride
from meshplan.collectives.price import NCCL, SERVING, Library, collective_seconds
from meshplan.cost.decode import Shape, collective, gemm, sixteen_bit, stream
from meshplan.cost.extras import serve_extra_ops, serve_head_extra_ops
from meshplan.cost.ple import serve_ple_embed_ops
from meshplan.cost.records import ACT_BYTES, OpCost
from meshplan.roofline import kernel_count, op_time
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.engine import Engine
from meshplan.serve.moe import moe_ops
from meshplan.serve.ops import attention_ops, dense_ops, hybrid_ops
from meshplan.serve.precision import Quant, compute_accelerator, gemm_precision
from meshplan.specs.hardware import Accelerator, Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import head_vocab
from meshplan.xp import Num, maximum, minimum, where


def layer_ops(model: ModelSpec, sh: Shape) -> dict[str, list[OpCost]]:
    """The ops of one layer of each kind the model has (ModelSpec.block_counts: dense, moe; a hybrid model's
    attention, mlp, mamba and moe blocks, one per layer), with the extras of cost/extras.py."""
    if model.is_hybrid:  # one block per layer (ops.hybrid_ops); a MoE block without attention
        blocks = hybrid_ops(model, sh) | ({"moe": moe_ops(model, sh)} if "moe" in model.block_counts else {})
        return {kind: ops + serve_extra_ops(model, sh, kind) for kind, ops in blocks.items()}
    attention = attention_ops(model, sh)
    builders = {"dense": dense_ops, "moe": moe_ops}
    return {kind: attention + builders[kind](model, sh) + serve_extra_ops(model, sh, kind)
            for kind in model.block_counts}


def edge_ops(model: ModelSpec, sh: Shape, first: Num, last: Num) -> list[OpCost]:
    """The embedding lookup (vocabulary-parallel: an all-reduce across tp) on the first stage, and on the last the
    final norm, the LM head for the rows that sample (each decoding sequence and each prompt's last token: a 16-bit
    GEMM, vLLM keeps lm_head unquantised; a captured decode graph's padding rows too), the gather of the vocabulary
    shards and the sampler's fp32 softmax."""
    h, v, t = model.hidden_size, head_vocab(model), sh.tp
    sampled = sh.decode + sh.prompts + sh.padded
    return [stream("embed/lookup", first * 2 * ACT_BYTES * sh.rows * h),
            collective("embed/tp", "all_reduce", first * sh.rows * h * ACT_BYTES, "tp", t),
            *serve_ple_embed_ops(model, sh, first),  # per-layer embeddings (cost/ple.py)
            *serve_head_extra_ops(model, sh, sampled, last),
            stream("head/norm", model.final_norm * last * 4 * ACT_BYTES * sampled * h),
            # the engines pad the output layer (vLLM's ParallelLMHead to a multiple of 64): its GEMM is aligned
            # (records.OpCost.align's default; specs/alignment.py)
            sixteen_bit(gemm("head/logits", sampled * last, h, v / t, ACT_BYTES, ACT_BYTES)),
            collective("head/gather", "all_gather", last * sampled * v * ACT_BYTES, "tp", t),
            stream("head/sample", last * (sh.decode + sh.prompts) * v * (ACT_BYTES + 2 * 4))]  # outside the graph


def stage_ops(model: ModelSpec, sh: Shape, pp: Num) -> list[tuple[OpCost, Num]]:
    """(op, count) of the bottleneck (last) pipeline stage for one micro-batch: L/p layers of each kind, the head,
    the embedding when p = 1, and the send to the next stage when p > 1."""
    single = pp == 1
    counts = {kind: n / pp for kind, n in model.block_counts.items()}
    pairs = [(op, counts[kind]) for kind, ops in layer_ops(model, sh).items() for op in ops]
    pairs += [(op, 1.0) for op in edge_ops(model, sh, where(single, 1.0, 0.0), 1.0)]
    send = collective("pp/send", "p2p", sh.rows * model.hidden_size * ACT_BYTES, "pp", pp)
    return pairs + [(send, 1.0)]


EXPERT_PATH = ("moe/experts", "moe/permute", "moe/dispatch", "moe/combine")  # ServeEfficiency.experts prices them


def shaped_seconds(op: OpCost, cluster: Cluster, quant: Quant, eff: ServeEfficiency, layouts: dict[str, Num],
                   sh: Shape) -> Num:
    """``op_seconds``, a GEMM of at most R = ``sh.skinny_rows`` rows at ``sh.skinny_rate`` of the modelled rate (the
    engine build's untuned GEMM library, engine.skinny_gemm_rows); a GEMM of more rows at least as long as its first
    R rows at that rate, so that more rows never take less time. The MoE experts' grouped GEMMs are the engine's own
    kernels (vLLM's Triton fused_moe, with tuned configurations per GPU), not the library's: their rate stays."""
    time = op_seconds(op, cluster, quant, eff, layouts, SERVING if sh.engine_all_reduce else NCCL)
    if op.kind != "gemm" or not sh.skinny_rows or op.name.startswith(EXPERT_PATH):
        return time
    slow_eff = _slowed(eff, float(sh.skinny_rate))  # an engine constant: a plain number
    slow = op_seconds(op, cluster, quant, slow_eff, layouts)
    rows = sh.skinny_rows
    first = replace(op, m=rows, flops=op.flops * rows / maximum(op.m, 1e-30))  # its first R rows (and all its bytes)
    return where(op.m <= rows, slow, maximum(time, op_seconds(first, cluster, quant, slow_eff, layouts)))


@cache
def _slowed(eff: ServeEfficiency, rate: float) -> ServeEfficiency:
    """``eff`` with its GEMMs at ``rate`` of their modelled rate (one object per rate: roofline.rates memoises)."""
    return replace(eff, gemm=eff.gemm * rate)


def op_seconds(op: OpCost, cluster: Cluster, quant: Quant, eff: ServeEfficiency, layouts: dict[str, Num],
               library: Library = SERVING) -> Num:
    """One op's time: a collective over its group as placed on the mesh (by the engine's ``library``: its own
    all-reduce kernels, or the GPU's collective library alone), else the roofline at the scheme's GEMM precision."""
    slower = 1.0 / eff.experts if op.name.startswith(EXPERT_PATH) else 1.0
    if op.kind == "collective":
        c = op.collective
        assert c is not None  # a collective op carries its Collective (cost/records.py)
        # the one dispatcher (collectives/price.py): NCCL's protocols at decode's sizes with the engines' own
        # all-reduce kernels, a MoE dispatch or combine forwarded through nodes where it names its experts
        return slower * collective_seconds(c, layouts[c.axis], cluster, eff, library)
    acc = compute_accelerator(cluster.accelerator, quant)
    if op.name == "attn/decode":
        return cache_read_time(op, acc, gemm_precision(acc, quant) or acc.default_precision, eff)
    return slower * op_time(op, acc, gemm_precision(acc, quant) or acc.default_precision, eff)


def cache_read_time(op: OpCost, acc: Accelerator, precision: str, eff: ServeEfficiency) -> Num:
    """Decode attention over the cache: the roofline at the cache-reading rate (``ServeEfficiency.cache_reads``);
    a kernel that reads each KV head once per query head (``op.repeat`` times, ops.decode_attention) takes at least
    those reads at the L2 cache's bandwidth (the repeats hit in L2, the first read comes from HBM), where the
    accelerator states it (``Accelerator.l2_bandwidth``). On a GPU of ``l2_dies`` dies with an L2 each, over which
    the workgroups are dealt round-robin (MI300X: 8 XCDs, AMD CDNA 3 white paper; the query heads of a group are
    consecutive workgroups), each of a KV head's first min(repeat, dies) reads misses its die's L2 and comes from
    HBM."""
    once = type(op.repeat) is float and op.repeat == 1.0
    if acc.l2_dies > 1 and not once:
        op = replace(op, nbytes=op.nbytes * minimum(op.repeat, acc.l2_dies))
    time = op_time(op, acc, precision, eff.cache_reads)
    if acc.l2_bandwidth and not once:
        time = maximum(time, op.repeat * op.nbytes / (acc.l2_bandwidth * eff.memory))
    return time


def layouts(tp: Num, dpa: Num, pp: Num) -> dict[str, Num]:
    """Strides of the instance's groups: tp innermost, the ep group (tp·dpa) around it, the stages outermost."""
    return {"tp": 1, "ep": 1, "pp": send_stride(tp * dpa, pp)}


def token_time(model: ModelSpec, cluster: Cluster, sh: Shape, pp: Num, quant: Quant,
               overhead: float = 0.0, eff: ServeEfficiency = SERVE_DEFAULT, only: tuple[str, ...] = ()) -> Num:
    """Seconds between two tokens of a sequence: p times the bottleneck stage's time on its micro-batch ``sh``,
    plus the engine's host time per iteration; ``only``: the ops whose names start with one of these alone."""
    place = layouts(sh.tp, sh.dpa, pp)
    stage: Num = 0.0
    for op, count in stage_ops(model, sh, pp):
        if not only or op.name.startswith(only):
            stage = stage + count * shaped_seconds(op, cluster, quant, eff, place, sh)
    return pp * stage + overhead


def layer_kernels(model: ModelSpec, sh: Shape, acc: Accelerator, eff: ServeEfficiency = SERVE_DEFAULT) -> Num:
    """Kernels one layer's ops launch, averaged over the model's layer kinds, as roofline.overhead counts them: an
    op with work on the GPU its ``kernels`` (or its host-issued ``launches``, whichever is more), a GEMM whose kernel
    splits k one reduction kernel more (ServeEfficiency.split_k_reductions); collectives apart."""
    total: Num = 0.0
    for kind, ops in layer_ops(model, sh).items():
        for op in ops:
            if op.kind != "collective":
                total = total + model.block_counts[kind] * kernel_count(op, acc, eff)
    return total / model.num_layers


def extra_kernel_time(model: ModelSpec, cluster: Cluster, sh: Shape, engine: Engine,
                      eff: ServeEfficiency = SERVE_DEFAULT) -> Num:
    """The fixed time of the kernels a token step launches beyond the op list's (``Engine.decode_layer_kernels``):
    each runs for the accelerator's ``kernel_overhead`` (roofline.overhead), in every layer of every stage, one
    after another (p stages of L/p layers: L layers a token)."""
    if not engine.decode_layer_kernels:  # no count: nothing to add, and no op list to build again
        return 0.0
    acc = cluster.accelerator
    extra = maximum(engine.decode_layer_kernels - layer_kernels(model, sh, acc, eff), 0.0)
    return extra * acc.kernel_overhead * model.num_layers


def gap_time(model: ModelSpec, cluster: Cluster, sh: Shape, pp: Num, engine: Engine,
             eff: ServeEfficiency = SERVE_DEFAULT) -> Num:
    """The GPU's idle seconds between the kernels of a token step (``Engine.kernel_gap`` each): every kernel the
    bottleneck stage's ops launch (``OpCost.kernels``, or its host-launched ones; a split-K GEMM's reduction rides
    with its GEMM, so the count does not jump with the rows where the tile choice splits) and each collective over
    more than one GPU, p stages one after another."""
    if not engine.kernel_gap:
        return 0.0
    kernels: Num = 0.0
    for op, count in stage_ops(model, sh, pp):
        if op.kind == "collective":
            c = op.collective
            assert c is not None  # a collective op carries its Collective (cost/records.py)
            kernels = kernels + count * where(c.group > 1, 1.0, 0.0) * (op.nbytes > 0)
        else:
            kernels = kernels + count * maximum(op.kernels, op.launches) * ((op.flops > 0) | (op.nbytes > 0))
    return engine.kernel_gap * pp * kernels


def op_kinds(model: ModelSpec, sh: Shape, pp: int) -> dict[str, str]:
    """Each op name of ``breakdown`` and its kind (OpCost.kind: gemm, attention, memory, collective)."""
    return {op.name: op.kind for op, _ in stage_ops(model, sh, pp)}


def breakdown(model: ModelSpec, cluster: Cluster, sh: Shape, pp: int, quant: Quant,
              eff: ServeEfficiency = SERVE_DEFAULT) -> dict[str, float]:
    """Seconds per token step by op name (scalars only): the bottleneck stage's ops times p."""
    place = layouts(sh.tp, sh.dpa, pp)
    out: dict[str, float] = defaultdict(float)
    for op, count in stage_ops(model, sh, pp):
        out[op.name] += float(pp * count * shaped_seconds(op, cluster, quant, eff, place, sh))
    return dict(out)
