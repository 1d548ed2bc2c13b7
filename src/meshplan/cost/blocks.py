"""The building blocks of every layer's per-op costs: a GEMM's three passes, a memory-bound element-wise op, a
collective, the pre-norm, Megatron's tensor-parallel entry and exit, the residual add (symbols: records.py).

Sources:
- GEMM FLOPs 2·m·k·n per pass; backward = input-gradient + weight-gradient GEMMs = 2 × forward
  (Narayanan et al. 2021, §5.1 / eq. 3).
- Megatron tensor parallelism: all-reduce after the row-parallel GEMM forward and before the column-parallel
  GEMM backward (Shoeybi et al. 2019, Fig. 3); with sequence parallelism all-gather / reduce-scatter instead,
  plus an all-gather of the saved input in the backward pass (Korthikanti et al. 2022, §4.2.2).
- Saved activations: what Korthikanti et al. 2022, §4 and Table 2 list for each op (records.py).
"""

from __future__ import annotations

from meshplan.collectives.comm import Collective
from meshplan.cost.records import ACT_BYTES, LOW_PRECISION_BYTES, MASK_BYTES, Dims, OpCost, alignment
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.xp import Num


def gemm(name: str, m: Num, k: Num, n: Num, d: Dims, saved: Num | None = None, groups: Num = 1.0
         ) -> list[OpCost]:
    """(m×k)·(k×n) = m×n. Forward, input gradient (m×n)·(n×k), weight gradient (k×m)·(m×n).

    HBM bytes: read both operands, write the result; the weight gradient is accumulated (read + write) in
    the gradient buffer. ``saved`` defaults to the input (m×k), stored for the weight gradient.
    ``groups`` > 1: a grouped GEMM (Megatron-Core GroupedMLP / TE GroupedLinear, one GEMM per local expert):
    the m rows split evenly over ``groups`` weights of k×n each, so each group is an (m/g×k)·(k×n) GEMM and
    its weight gradient reduces over only m/g rows; weights and their gradients are g × k×n.
    Row-major activations make k and n the leading dimensions of every pass's operands (``OpCost.align``).
    """
    a = ACT_BYTES
    flops = 2.0 * m * k * n
    stored = m * k * a if saved is None else saved
    mg, weights, align = m / groups, k * n * groups, alignment(k, n)
    return [
        OpCost(name, "fwd", "gemm", flops, a * (m * k + weights + m * n), stored, m=mg, n=n, k=k, groups=groups,
               align=align),
        OpCost(name, "bwd_x", "gemm", flops, a * (m * n + weights + m * k), m=mg, n=k, k=n, groups=groups,
               align=align),
        OpCost(name, "bwd_w", "gemm", flops, a * (m * k + m * n) + 2 * d.grad_bytes * weights, m=k, n=n, k=mg,
               groups=groups, align=align),
    ]


def projections(name: str, m: Num, k: Num, n: Num, widths: dict[str, Num], d: Dims, saved: Num | None = None
                ) -> list[OpCost]:
    """Projections of one input into several outputs (Q, K, V; gate and up; ``widths`` of them, n in all), as the
    stack runs them (``stack.projections``): one (m×k)·(k×n) GEMM (fused, split), or a GEMM per output (separate:
    Hugging Face's q_proj, k_proj, v_proj, gate_proj, up_proj), sub-records ``name/part``, the input saved once, and
    the input gradients summed by autograd, one add per output after the first (each reads two m×k gradients and
    writes one: a tensor used n times accumulates its n gradients, torch/csrc/autograd/input_buffer.cpp). A split
    projection's backward concatenates its outputs' gradients (torch.split / chunk: ``split_concat``)."""
    if not d.stack.projection_mode.separate:
        return gemm(name, m, k, n, d, saved=saved)
    ops: list[OpCost] = []
    for i, (part, n) in enumerate(widths.items()):
        ops += gemm(f"{name}/{part}", m, k, n, d, saved=saved if i == 0 else 0.0)
    adds = len(widths) - 1
    return ops + [OpCost(f"{name}/grad_sum", "bwd_x", "memory", adds * m * k, adds * 3 * ACT_BYTES * m * k)]


def split_concat(name: str, m: Num, n: Num, d: Dims) -> list[OpCost]:
    """The backward of splitting an m×n GEMM result (``stack.projections = "split"``): autograd's
    SplitWithSizesBackward concatenates the parts' gradients, reading and writing m×n."""
    if not d.stack.projection_mode.concat_grads:
        return []
    return [OpCost(f"{name}/concat", "bwd_x", "memory", 0.0, 2 * ACT_BYTES * m * n)]


def elementwise(name: str, elems_in: Num, elems_out: Num, flops_per_elem: float, saved: Num = 0.0
                ) -> list[OpCost]:
    """A memory-bound op: the forward reads its input and writes its output; the backward reads the
    output gradient and the saved input and writes the input gradient."""
    a = ACT_BYTES
    return [
        OpCost(name, "fwd", "memory", flops_per_elem * elems_in, a * (elems_in + elems_out), saved),
        OpCost(name, "bwd_x", "memory", 2 * flops_per_elem * elems_in, a * (2 * elems_in + elems_out)),
    ]


def collective(name: str, phase: str, kind: str, nbytes: Num, axis: str, group: Num, overlap: str = "",
               repeat: Num = 1.0) -> OpCost:
    return OpCost(name, phase, "collective", nbytes=nbytes, collective=Collective(kind, nbytes, axis, group),
                  overlap=overlap, repeat=repeat)


def norm(name: str, model: ModelSpec, d: Dims) -> list[OpCost]:
    """Pre-norm over the residual stream; stores its input (Korthikanti: 2sbh per LayerNorm)."""
    elems = d.tokens_sp * model.hidden_size
    return elementwise(name, elems, elems, 5.0, saved=elems * ACT_BYTES)


def gathered_bytes(plan: Plan, quantized: bool = True) -> float:
    """Bytes per element of a sequence-parallel all-gather that feeds a GEMM: a low-precision GEMM's operand is
    quantized before it is gathered (Transformer Engine ``_Linear``: with fp8 and sequence parallelism the input is
    cast, then ``gather_along_first_dim``-ed, in the forward pass and again for the weight gradient, and the
    row-parallel output gradient likewise; torchao's Float8ColwiseParallel gathers float8 too). The reductions
    carry 16-bit partial sums, and LoRA's 16-bit adapters need the 16-bit input."""
    if not quantized or plan.finetune == "lora":
        return ACT_BYTES
    return LOW_PRECISION_BYTES.get(plan.precision, ACT_BYTES)


def tp_enter(name: str, model: ModelSpec, plan: Plan, d: Dims, quantized: bool = True, width: Num = 0
             ) -> list[OpCost]:
    """Entering a column-parallel GEMM ("f" in Shoeybi et al. 2019): identity forward, all-reduce backward;
    with sequence parallelism all-gather forward, reduce-scatter backward, plus re-gathering the saved input
    for the weight gradient (the gathers at the GEMM's input precision, ``gathered_bytes``). ``width``: the
    input's width when it is not H."""
    width = width or model.hidden_size
    full = d.tokens * width * ACT_BYTES
    if plan.sequence_parallel:
        gathered = d.tokens * width * gathered_bytes(plan, quantized)
        return [collective(name, "fwd", "all_gather", gathered, "tp", plan.tp, "tp"),
                collective(name, "bwd_x", "reduce_scatter", full, "tp", plan.tp, "tp"),
                collective(name + "/regather", "bwd_w", "all_gather", gathered, "tp", plan.tp, "tp")]
    return [collective(name, "bwd_x", "all_reduce", full, "tp", plan.tp, "tp")]


def tp_exit(name: str, model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """Leaving a row-parallel GEMM ("g"): all-reduce forward (reduce-scatter with sequence parallelism),
    identity backward (all-gather with sequence parallelism, of the output gradient the GEMM's backward reads, at
    its input precision)."""
    full = d.tokens * model.hidden_size * ACT_BYTES
    if plan.sequence_parallel:
        return [collective(name, "fwd", "reduce_scatter", full, "tp", plan.tp, "tp"),
                collective(name, "bwd_x", "all_gather", d.tokens * model.hidden_size * gathered_bytes(plan), "tp",
                           plan.tp, "tp")]
    return [collective(name, "fwd", "all_reduce", full, "tp", plan.tp, "tp")]


def residual(name: str, model: ModelSpec, d: Dims) -> list[OpCost]:
    """Dropout (if the model has it) and the residual add; stores the dropout mask (Korthikanti: sbh)."""
    elems = d.tokens_sp * model.hidden_size
    mask = elems * MASK_BYTES if d.dropout else 0.0
    return elementwise(name, 2 * elems, elems, 2.0, saved=mask)
