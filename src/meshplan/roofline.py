"""Op time from its cost and the accelerator: the roofline (Williams, Waterman & Patterson 2009).

A kernel streams its HBM traffic while its math units work, so its time is at least the larger of the two
(seed 000: time = max(compute time, memory-access time)), each derated by the efficiency model
(efficiency.py). Tensor-core GEMMs run at the plan's precision (bf16, fp8 …); attention kernels at bf16;
element-wise math on the CUDA cores (fp32 rate), which memory bandwidth dominates anyway.

Near the ridge point, where the two times are close, a kernel reaches neither roof: its loads and its math overlap
through a pipeline of a few stages (a GEMM's mainloop: TMA or cp.async loads of the next k-blocks beside the MMAs of
this one), and when the two sides take about as long every stall of one idles the other, as two servers in tandem
with a finite buffer between them run below the slower one's rate (Hillier & Boling 1967, "Finite queues in series
with exponential or Erlang service times"; measured kernels below both roofs around the ridge: Ofenbeck et al. 2014,
"Applying the Roofline Model", ISPASS). The two combine as their p-norm (``work_time``):
    work = (compute^p + memory^p)^(1/p)      p = ``Efficiency.ridge``
which is the larger of the two where one dominates (p → ∞ is the plain roofline) and 2^(1/p) times it where they
are equal. p is measured, not fitted to training or serving runs: the least mean |log error| over the 945 single
decode GEMMs (bf16 and fp8, 1-512 rows) timed on a lent H200 (benchmarks/measure/fit_ridge.py), checked on the H100's
(docs/GEMM_GPU.md). Increasing in each time, so more FLOP/s or bandwidth never lengthens an op.

Seed 000 fits each side as latency + work / rate; ``calibrate`` fits t = t₀ + 2mnk / F for GEMMs and
t = t₀ + bytes / BW for memory-bound kernels (calibrate/fit.py): Hockney's (r∞, n½) model of a pipelined unit,
t = (n + n½) / r∞, whose t₀ = n½ / r∞ is its start-up overhead, the time it takes to fill and drain (Hockney &
Jesshope, "Parallel Computers", 1981; fitted by least squares, as the RINF1 benchmark does). So an op costs
t₀ + work(compute, memory) (``overhead``), with t₀ the accelerator's ``gemm_overhead`` for tensor-core kernels
(GEMMs, attention) and ``kernel_overhead`` for every other kernel. The overhead overlaps nothing: it is the
kernel's own start and end, serial with its work and with the kernels before and after it in its stream (it hides
behind communication only as the op's whole time does, step/passes.py). The presets hold what compiled decode steps
profiled on a lent H100 and H200 measured (hardware/h100.toml; docs/DECODE_GPU.md); calibrate writes it, clipped at
0 (calibrate/system.py).

An accelerator with a measured attention rate (``Accelerator.attention_flops``: calibrate's fit t = t₀ + FLOPs / F of
PyTorch's causal scaled_dot_product_attention, FLOPs counted as cost/attention.py counts them) runs its flash
attention kernels at that F, with ``attention_overhead`` as their t₀, instead of the 16-bit GEMM rate × efficiency.py's
attention efficiency: the measurement already holds the kernel family, head dimension, sequence length and clock of
the shapes measured (one F for all of them: the fit's residuals say how far one rate is from each). The backward
kernels run at ``Efficiency.attention_bwd`` × F (FlashAttention-2 Fig. 5 vs Fig. 4, FlashAttention-3 Fig. 6 vs Fig. 5:
≈ 0.8, as efficiency.py prices the unmeasured kernels) and FP8 kernels at ``fp8_attention_fwd`` / ``_bwd`` × the
16-bit rate measured. Unfused attention stays priced as its score GEMMs and their traffic.
"""

from __future__ import annotations

from meshplan.collectives.comm import all_reduce_traffic
from meshplan.cost.records import OpCost
from meshplan.kept import Kept
from meshplan.specs.alignment import ALIGNED_BYTES, unaligned_factor
from meshplan.specs.architectures import async_mma
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Accelerator
from meshplan.xp import Num, maximum, minimum, where

# bytes per element of a GEMM's operands at each precision (fp32 GEMMs run as TF32 on the tensor cores, 4-byte
# operands; NVFP4 packs two elements a byte): a leading dimension of ``OpCost.align`` elements is align × this bytes
ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "mxfp8": 1.0, "fp4": 0.5}
_RATES: dict[tuple[int, int, str], tuple[Accelerator, Efficiency, tuple[Num, Num, Num, Num]]] = {}


def rates(acc: Accelerator, precision: str, eff: Efficiency) -> tuple[Num, Num, Num, Num]:
    """Sustained FLOP/s before shape effects: (GEMMs at ``precision``, 16-bit GEMMs, which attention kernels
    also run at a fraction of, fp32 CUDA cores), each at the sustained clock of a GEMM, and that clock (a kernel
    drawing less power is clocked by its own load: ``compute_time``); GEMM rates include the best-shape
    efficiency (MAMF).
    Memoised per (accelerator, efficiency) object: hashing the dataclasses for every op would cost more."""
    key = (id(acc), id(eff), precision)
    hit = _RATES.get(key)
    if hit is not None and hit[0] is acc and hit[1] is eff:
        return hit[2]
    if len(_RATES) > 256:
        _RATES.clear()
    value = _rates(acc, precision, eff)
    _RATES[key] = (acc, eff, value)
    return value


def _rates(acc: Accelerator, precision: str, eff: Efficiency) -> tuple[Num, Num, Num, Num]:
    clock = eff.clock(acc)
    return (acc.flops(precision) * clock * eff.mamf(acc, precision), acc.half_flops * clock * eff.mamf(acc, "bf16"),
            acc.peak_flops.get("fp32", acc.half_flops / 16) * clock, clock)


def compute_time(op: OpCost, acc: Accelerator, precision: str, eff: Efficiency) -> Num:
    """Math time at the sustained clock: GEMMs at the plan's precision with their shape's efficiency (the LM
    head, ``variant="bf16"``, in 16 bits) and, when their leading dimensions are not 16-byte multiples
    (``op.align`` elements of ``ELEMENT_BYTES``), the unaligned kernels' rate (specs/alignment.py);
    attention at a fraction of the 16-bit GEMM rate (flash kernels: the attention efficiency of efficiency.py;
    unfused: batched score GEMMs); element-wise math at the fp32 CUDA-core rate."""
    if op.variant == "ssd":  # priced by its measured streaming rate (memory_time)
        return 0.0
    gemm, gemm16, fp32, clock = rates(acc, precision, eff)
    if op.kind == "gemm":
        element = 2.0 if op.variant == "bf16" else ELEMENT_BYTES.get(precision, 2.0)
        rate = gemm16 if op.variant == "bf16" else gemm
        if element < 2.0:  # an 8-bit GEMM whose leading dims do not align runs in 16 bits (specs/alignment.py)
            rate, element = where(op.align * element >= ALIGNED_BYTES, rate, gemm16), 2.0
        aligned = unaligned_factor(op.align * element, acc, eff)
        return op.flops / (rate * eff.gemm_efficiency(op.m, op.n, op.k, acc.num_sms, op.groups) * aligned)
    if op.kind == "attention":
        if op.variant == "unfused":
            return op.flops / (gemm16 * eff.gemm_efficiency(op.m, op.n, op.k, acc.num_sms))
        backward = op.phase != "fwd"
        if acc.attention_flops:  # measured (the module docstring)
            return op.flops / measured_attention_rate(acc, eff, backward, op.kernel)
        # without asynchronous MMA (Ampere) every family runs FlashAttention-2-class kernels, with their head-dimension
        # falloff and tile cost as well as their rate (efficiency.py: attention_kernel_factor, attention_on_sync)
        family = op.kernel if async_mma(acc) or op.kernel != "fused" else "fa2"
        rate = eff.attention_efficiency(op.k, op.n, backward=backward, causal=op.variant == "flash_causal",
                                        kernel=family, calls=op.groups, window=op.window)
        rate = rate * eff.attention_kernel_factor(acc, op.kernel) * eff.exp_factor(acc, op.k, backward, op.kernel)
        # a kernel at a fraction ``rate`` of the GEMM ceiling draws that fraction of its power (efficiency.py,
        # "Sustained clocks"), so a power cap throttles it less than the GEMMs ``gemm16`` is clocked for
        return op.flops / (gemm16 / clock * eff.clock(acc, rate) * rate)
    return op.flops / fp32


def measured_attention_rate(acc: Accelerator, eff: Efficiency, backward: bool = False, kernel: str = "fused") -> float:
    """FLOP/s of a flash attention kernel on an accelerator with a measured ``attention_flops`` (the module
    docstring): the measured forward rate, × ``attention_bwd`` backward, × the FP8 kernel's speed-up for ``"fp8"``."""
    rate = acc.attention_flops * (eff.attention_bwd if backward else 1.0)
    if kernel == "fp8":
        rate *= eff.fp8_attention_bwd if backward else eff.fp8_attention_fwd
    return rate


# The share of the datasheet HBM bandwidth a large device-to-device copy sustains on the NVIDIA parts whose streaming
# kernels Efficiency.memory describes: an H200's copy fit, 4,599 of 4,800 GB/s (meshplan calibrate on a lent H200,
# data/measured/gpu/2026-11-26-nvidia-h200-calibrated.toml)
COPY_REFERENCE = 4599 / 4800


def stream_bandwidth(acc: Accelerator, eff: Efficiency) -> float:
    """Bytes/s a streaming kernel sustains: ``eff.memory`` × the HBM bandwidth, × the accelerator's measured copy
    share over ``COPY_REFERENCE`` where it states one (``Accelerator.hbm_copy_share``: an MI300X's BabelStream copy
    reaches 0.80 of its datasheet where an H200's reaches 0.96, so its kernels stream at 0.84 of the NVIDIA share),
    at most 1 (a GPU whose copies beat the reference's is not taken faster than the model's kernels)."""
    share = acc.hbm_copy_share / COPY_REFERENCE if acc.hbm_copy_share else 1.0
    return acc.hbm_bandwidth * eff.memory * min(1.0, share)


def memory_time(op: OpCost, acc: Accelerator, eff: Efficiency) -> Num:
    """Streaming time of the op's bytes; a block-scaled quantization (``variant="block_scaled"``) takes
    ``eff.block_scaled_cast`` times as long; a Mamba-2 SSD kernel (``variant="ssd"``, mamba_ssm's Triton chunked
    scan, bound by memory latency rather than by its math or HBM bandwidth) streams at ``eff.ssd`` bytes per second
    per SM, the rate its benchmark measured, math included (efficiency.py), and no faster than a streaming kernel
    (a GPU of many SMs and little bandwidth: L40S)."""
    if op.variant == "ssd":
        return maximum(op.nbytes / (acc.num_sms * eff.ssd), op.nbytes / stream_bandwidth(acc, eff))
    slower = eff.block_scaled_cast if op.variant == "block_scaled" else 1.0
    return slower * op.nbytes / stream_bandwidth(acc, eff)


def work_time(compute: Num, memory: Num, eff: Efficiency) -> Num:
    """One kernel's seconds of work from its math and its HBM traffic (the module docstring): their p-norm,
    p = ``eff.ridge``; the larger of the two where one is zero."""
    p = eff.ridge
    if type(compute) is float and type(memory) is float:  # one plan's op: plain floats (the search's hot path)
        if compute <= 0.0 or memory <= 0.0:
            return max(compute, memory)
        larger, smaller = (compute, memory) if compute >= memory else (memory, compute)
        return larger * (1.0 + (smaller / larger) ** p) ** (1.0 / p)
    high, low = maximum(compute, memory), minimum(compute, memory)
    ratio = where(high > 0, low / where(high > 0, high, 1.0), 0.0)
    return high * (1.0 + ratio**p) ** (1.0 / p)


def overhead(op: OpCost, acc: Accelerator, eff: Efficiency | None = None) -> Num:
    """The fixed seconds of the op's kernels (the module docstring): t₀ per kernel, ``gemm_overhead`` for a
    tensor-core kernel and ``kernel_overhead`` for the others. An op runs one kernel of its kind, or as many as the
    host launches one by one (``op.launches``, per-expert GEMMs; a grouped GEMM is one kernel); the rest of an eager
    aten sequence (``op.kernels`` beyond those: a GEMM row's gradient accumulation, a flash backward's pre- and
    post-processing, a layout copy) are element-wise kernels at ``kernel_overhead``. Unfused attention's kernel pays
    t₀ of both kinds (its time is a sum of a GEMM's and a softmax's); a flash attention kernel of an accelerator with a
    measured attention rate pays ``attention_overhead``; a GEMM whose kernel splits k (``eff.split_k_reductions``,
    specs/gemm_shape.py) runs a reduction kernel after it, at ``kernel_overhead``; an op without work runs none."""
    if op.variant == "unfused":
        t0 = acc.gemm_overhead + acc.kernel_overhead
    elif op.kind == "attention" and acc.attention_flops:  # measured with its own t₀ (the module docstring)
        t0 = acc.attention_overhead
    else:
        t0 = acc.gemm_overhead if op.kind in ("gemm", "attention") else acc.kernel_overhead
    if not t0 and not acc.kernel_overhead:  # nothing to add
        return 0.0
    reduce: Num = 0.0  # the split-K reduction after each of the op's own kernels
    if op.kind == "gemm" and eff is not None:
        reduce = acc.kernel_overhead * eff.split_k_reductions(op.m, op.n, op.k, acc.num_sms, op.groups)
    kernels = maximum(op.kernels, op.launches)
    own = minimum(maximum(op.launches, 1.0), kernels)  # the op's own kernels; the rest element-wise
    return ((t0 + reduce) * own + acc.kernel_overhead * (kernels - own)) * ((op.flops > 0) | (op.nbytes > 0))


def kernel_count(op: OpCost, acc: Accelerator, eff: Efficiency) -> Num:
    """The kernels ``overhead`` prices for the op: its own and the rest of its eager sequence, and a split-K GEMM's
    reductions."""
    kernels = maximum(op.kernels, op.launches) * ((op.flops > 0) | (op.nbytes > 0))
    if op.kind != "gemm":
        return kernels
    own = minimum(maximum(op.launches, 1.0), kernels)
    return kernels + own * eff.split_k_reductions(op.m, op.n, op.k, acc.num_sms, op.groups)


def op_time(op: OpCost, acc: Accelerator, precision: str, eff: Efficiency) -> Num:
    """Seconds for a compute op: the kernels' fixed ``overhead`` plus ``work_time`` of its compute and memory times for
    one kernel that streams while it computes; the sum for unfused attention, whose score GEMMs and softmax are
    separate kernels (the scores round-trip through HBM between them). Kernels the host launches with the GPU waiting
    on it (``op.launches``, the per-expert MoE path of dropless MoE) take at least the host's time to issue them:
    ``launch_host`` each (the stack's cost per kernel, mlp_moe.host_launched; not scaled by Cluster.python_host:
    mlp_moe.TE_LINEAR says why). A kernel a release regressed (``op.slowdown``) takes that many times its time."""
    if op.variant == "unfused":
        time = compute_time(op, acc, precision, eff) + memory_time(op, acc, eff)
    else:
        time = work_time(compute_time(op, acc, precision, eff), memory_time(op, acc, eff), eff)
    if acc.gemm_overhead or acc.kernel_overhead or acc.attention_overhead:  # 0: times untouched
        time = overhead(op, acc, eff) + time
    if type(op.slowdown) is not float or op.slowdown != 1.0:  # a release's regressed kernel (OpCost.slowdown)
        time = op.slowdown * time
    if op.variant == "unfused":
        return time
    if type(op.launches) is not float or op.launches:  # host-launched kernels: the GPU cannot outrun the CPU
        time = maximum(time, op.launches * op.launch_host)
    return time


def optimistic_time(ops: list[OpCost], acc: Accelerator, network_bandwidth: float, utilization: float = 0.8,
                    precision: str = "bf16", algorithm: str = "multicast") -> Num:
    """An upper bound on speed: FLOPs, HBM traffic and network traffic of all ``ops`` fully overlap.

    time = max(ΣFLOP / (u·peak), ΣHBM bytes / (u·HBM bandwidth), Σnetwork bytes / network bandwidth)
    The all-reduce traffic counts on both the network and HBM (it is read from and written to HBM); the
    derating u (thermal/clock throttling) applies to FLOP/s and HBM, not to the network (seed 001).
    """
    flops = sum((op.flops for op in ops if op.kind != "collective"), 0.0)
    hbm = sum((op.nbytes for op in ops if op.kind != "collective"), 0.0)
    net = sum((all_reduce_traffic(op.collective.nbytes, op.collective.group, algorithm)
               for op in ops if op.kind == "collective" and op.collective is not None), 0.0)
    compute = flops / (utilization * acc.flops(precision))
    memory = (hbm + net) / (utilization * acc.hbm_bandwidth)
    return maximum(maximum(compute, memory), net / network_bandwidth)


def kept_op_times(ops: dict[str, tuple[OpCost, ...]], acc: Accelerator, precision: str, eff: Efficiency
                  ) -> dict[str, list[Num | None]]:
    """``op_time`` of each op of kept op records (step/parts._plan_ops; None for a collective), kept by the records'
    identity, the accelerator's, the precision and the efficiency's (``_KEPT``): nothing else reaches ``op_time``, so
    the placements of one shape (a space's candidates come in every one, and their collectives split apart) time
    their kernels once (issue 83)."""
    return _KEPT.answer((id(ops), id(acc), precision, id(eff)), (ops, acc, eff), _op_times, ops, acc, precision, eff)


def _op_times(ops: dict[str, tuple[OpCost, ...]], acc: Accelerator, precision: str, eff: Efficiency
              ) -> dict[str, list[Num | None]]:
    return {k: [None if op.kind == "collective" else op_time(op, acc, precision, eff) for op in group]
            for k, group in ops.items()}


_KEPT: Kept[dict[str, list[Num | None]]] = Kept(256)
