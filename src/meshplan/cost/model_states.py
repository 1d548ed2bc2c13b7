"""Model states per GPU: weights, gradients, optimizer state (and the optimizer state offloaded to host memory).

Symbols: Ψ parameters on a GPU before ZeRO sharding (cost/params.py), N_d = dp·cp the ranks that replicate them
(Megatron reduces gradients over the data- and context-parallel ranks together), N_e = tp·cp·dp / (ep·etp) the
expert-data-parallel ranks replicating expert weights (each divided by the plan's distributed-optimizer instances
where ZeRO shards within smaller groups: cost/zero_group.py), p pipeline stages, v chunks per stage.

Model states with mixed-precision Adam (Rajbhandari et al. 2020, ZeRO §3 and Fig. 1), 2-byte gradients:
    stage 0: 2Ψ + 2Ψ + 12Ψ = 16Ψ;  stage 1: 4Ψ + 12Ψ/N;  stage 2: 2Ψ + 14Ψ/N;  stage 3: 16Ψ/N.
With fp32 main gradients (Megatron's default for bf16) the 2Ψ of gradients becomes 4Ψ. ZeRO's K = 12 is Adam's;
``plan.optimizer`` picks K from ``OPTIMIZER_STATE`` (the fp32 master copy beside the 16-bit weights, as with Adam,
plus the optimizer's own state), sharded from stage 1 as above.
The asynchronous schedules keep old weight versions beside the current weights (``weight_versions``: PipeDream's
stash, 2BW's second buffer). Activations and buffers: meshplan/memory.py, which re-exports these names.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

from meshplan.cost.params import (
    StageParams,
    layers_on_last,
    layers_on_stage,
    stage_params,
    trainable,
)
from meshplan.cost.wrapper_work import BF16_OPTIMIZER_WORK, work_of
from meshplan.cost.wrappers import partitioned_zero
from meshplan.cost.zero_group import zero_groups
from meshplan.pipeline.registry import schedule_of
from meshplan.pipeline.rules import one_version
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num, maximum, minimum, where

WEIGHT_BYTES = 2  # bf16 weights
MASTER_BYTES = 4  # the fp32 master copy of each trained weight (mixed precision: Micikevicius et al. 2018 §3.1)
# bitsandbytes' block-wise 8-bit states: one fp32 absmax per block of 256 elements per state (bitsandbytes
# optim/optimizer.py Optimizer2State.init_state, blocksize 256; Dettmers et al. 2022 §2.1 quantizes in blocks)
BNB_BLOCK = 256


class OptimizerState(NamedTuple):
    """An optimizer's bytes per trained parameter: ``state`` on the GPU (the fp32 master copy and the optimizer's
    own state, the K of ZeRO §3.1), and the passes its step makes over the gradient (``grad_reads``)."""

    state: float
    grad_reads: int = 1

    def step_bytes(self, grad_bytes: Num, weight_bytes: float = WEIGHT_BYTES) -> Num:
        """Bytes per parameter one memory-bound step moves: read the gradient ``grad_reads`` times, read and write
        the state, write the 16-bit weight: r·g + 2K + 2 (Adam's K = 12: g + 24 + 2)."""
        return self.grad_reads * grad_bytes + 2 * self.state + weight_bytes


OPTIMIZER_STATE = {
    # Adam / AdamW: master 4 + m 4 + v 4 = 12 (Rajbhandari et al. 2020, ZeRO §3.1: K = 12); AdamW's decoupled weight
    # decay (Loshchilov & Hutter 2019) keeps the same state
    "adam": OptimizerState(MASTER_BYTES + 4 + 4), "adamw": OptimizerState(MASTER_BYTES + 4 + 4),
    # Adam with bf16 moments: Megatron-Core's precision-aware optimizer (--use-precision-aware-optimizer
    # --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16; megatron/core/optimizer/optimizer_config.py exp_avg_dtype,
    # exp_avg_sq_dtype, run by Transformer Engine's FusedAdam): 4 + 2 + 2 = 8 (its store_param_remainders, which keeps
    # only the 16 bits of the fp32 master the bf16 weight lacks, would make it 6: not modelled)
    "adam-bf16": OptimizerState(MASTER_BYTES + 2 + 2),
    # 8-bit Adam (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization", §2): m and v one byte each,
    # plus one fp32 scale per block and state: 4 + 1 + 1 + 2·4/256 = 6.03125 (tensors under bitsandbytes'
    # min_8bit_size of 4096 elements, the norms, stay 32-bit: below this model's resolution)
    "adam-8bit": OptimizerState(MASTER_BYTES + 1 + 1 + 2 * 4 / BNB_BLOCK),
    # SGD with momentum: master 4 + the momentum buffer 4 = 8 (torch.optim.SGD momentum_buffer; Megatron's
    # --optimizer sgd, --sgd-momentum 0.9); plain SGD keeps the master copy only
    "sgd-momentum": OptimizerState(MASTER_BYTES + 4), "sgd": OptimizerState(MASTER_BYTES),
    # Adafactor (Shazeer & Stern 2018, §3 and Algorithm 4): no first moment (beta1 = 0, its default), the second moment
    # of an r x c matrix factored into r + c fp32 row and column sums: 4(r + c)/(rc) bytes a parameter, 8/H for an H x H
    # matrix (0.002 at H = 4096), left out; its step reads the gradient twice (the row and column sums of G², then
    # the update G / sqrt(V))
    "adafactor": OptimizerState(MASTER_BYTES, grad_reads=2),
}


def per_parameter_byte(optimizer: str, width: float, master: bool) -> tuple[float, float]:
    """(state, step traffic) of ``OPTIMIZER_STATE[optimizer]`` per byte of a parameter ``width`` bytes wide, for the
    engines that price traced tensors (trace/liveness.py, autoshard/, check-step).

    ``master``: mixed precision, an fp32 master copy beside a 16-bit weight (as the table counts it): the state is
    K bytes a parameter, the step ``step_bytes`` with the gradient and the weight at ``width`` (Adam on bf16: 12 / 2
    = 6 and (2 + 24 + 2) / 2 = 14). Otherwise the optimizer updates the parameter in place in its own dtype
    (torch.optim on a module): the parameter is its own master, so the state is K less the master's 4 bytes, each
    state tensor in the parameter's dtype as torch.optim keeps it, and the step reads the gradient, reads and writes
    the parameter and the state: (r·4 + 2K) / 4 per byte (Adam: 2 and 7; SGD with momentum 1 and 5; SGD 0 and 3).
    The fixed-dtype states (adam-bf16, adam-8bit) are exact beside fp32 parameters there."""
    kind = OPTIMIZER_STATE[optimizer]
    if master:
        return kind.state / width, float(kind.step_bytes(width, width)) / width
    return (kind.state - MASTER_BYTES) / MASTER_BYTES, float(kind.grad_reads + 2 * kind.state / MASTER_BYTES)


@dataclass(frozen=True, slots=True)
class Memory:
    """One rank's bytes by kind: the model states (weights, grads, optimizer), activations and buffers."""

    weights: Num
    grads: Num
    optimizer: Num
    activations: Num
    buffers: Num
    stranded: Num = 0.0  # beyond ``total``, what the caching allocator keeps reserved (step/memory.Phases.stranded)

    @property
    def total(self) -> Num:
        return self.weights + self.grads + self.optimizer + self.activations + self.buffers

    def as_dict(self) -> dict[str, Num]:
        return {"weights": self.weights, "grads": self.grads, "optimizer": self.optimizer,
                "activations": self.activations, "buffers": self.buffers}


def model_states(params: StageParams, plan: Plan, stack: Stack, last: bool = False) -> tuple[Num, Num, Num]:
    """(weights, gradients, optimizer) bytes per GPU under ZeRO stage ``plan.zero`` on the first (or ``last``)
    pipeline rank; under LoRA gradients and optimizer state exist for the adapters only (``trainable``); the weights
    with the older versions of the trainable ones that an asynchronous schedule keeps (``weight_versions``).
    ``stack.replicated_embedding``: the token embedding whole on each TP rank, tp times its share (KempnerForge's,
    "The token embedding stays replicated": kempnerforge/distributed/tensor_parallel.py:20-23 @01b461a, 3ad9d9a,
    5666d0d; sharded over dp in FSDP2's root unit, parallel.py:290-297 @5666d0d)."""
    if stack.replicated_embedding:
        params = replace(params, dense=params.dense + params.embedding * (plan.tp - 1))
    n_dense, n_expert = zero_groups(plan)  # N_d, N_e, or the ZeRO groups smaller than them (cost/zero_group.py)
    z = partitioned_zero(plan, stack)  # BF16_Optimizer partitions its states without ZeRO too (cost/wrappers.py)

    def sharded(stage: int, bytes_per_param: float, p: StageParams = params) -> Num:
        if z >= stage:
            return bytes_per_param * (p.dense / n_dense + p.expert / n_expert)
        return bytes_per_param * p.total

    train = trainable(params, plan)
    # no 16-bit shard at all: the fp32 shard is the master of every trained weight (under LoRA the frozen base has no
    # master, so its shard is priced as before)
    gathered_only = z >= 3 and stack.fsdp_mode.sharded_master and stack.master_weights and plan.finetune != "lora"
    weights = 0.0 if gathered_only else sharded(3, WEIGHT_BYTES)
    if schedule_of(plan.schedule).weight_versions is not one_version:
        weights = weights + (weight_versions(plan, last) - 1) * sharded(3, WEIGHT_BYTES, train)
    state, grad = optimizer_bytes(plan, stack)
    grads = sharded(2, grad, train) * chunk_gradient_share(plan, stack) + lp_gradients(train, plan, stack)
    if stack.accumulate_unsharded and z >= 2:  # gradient sync on the last micro-batch only (optimizer_bytes)
        grads = where(plan.grad_accum > 1, plan.grad_bytes * train.total, grads)
    optimizer = 0.0 if plan.offload_optimizer else sharded(1, state, train)
    copies = schedule_of(plan.schedule).weight_copies  # DualPipe: two stages per rank (its record)
    return weights * copies, grads * copies, optimizer * copies


def optimizer_bytes(plan: Plan, stack: Stack) -> tuple[float, float]:
    """(optimizer state, stored gradient) bytes per trained parameter. With ``stack.master_weights`` the table's K
    and ``plan.grad_bytes``. Without (KempnerForge casts its model to bf16 after sharding it, KempnerInstitute/
    KempnerForge kempnerforge/distributed/parallel.py:207-209 @01b461a), torch.optim's state takes the 16-bit weights'
    dtype (``per_parameter_byte``, master=False: Adam's m and v, 2 + 2), and so does the gradient it reads: FSDP2 takes
    the parameters' dtype at its first forward (_fsdp_param_group.py:273-286 _init_mp_dtypes, _fsdp_param.py:586-600)
    and casts each reduced shard to it (_fsdp_collectives.py:696). ``stack.accumulate_unsharded`` (KempnerForge's
    maybe_no_sync, kempnerforge/training/grad.py:17-40 @01b461a: set_requires_gradient_sync(False) before every
    micro-batch but the last): FSDP2 then skips the reduce-scatter (_fsdp_param_group.py:607-611) and keeps each
    parameter's whole gradient, in the reduce dtype where it differs (_fsdp_param.py:802-820,
    ``unsharded_accumulated_grad``), from the first micro-batch's backward to the last's: ``plan.grad_bytes`` a
    parameter, unsharded, in place of the shard. (torch/distributed/fsdp/_fully_shard/ of torch 2.13.0, cf30153c; the
    runs used 2.11.0. KempnerForge's own words: "FSDP2 retains the unsharded fp32 gradient across microbatches",
    kempnerforge/benchmarks/175b_360gpu/README.md @b62d2e36, where grad_accum_steps=8 ran out of memory.)"""
    if stack.master_weights:
        return OPTIMIZER_STATE[plan.optimizer].state, plan.grad_bytes
    return per_parameter_byte(plan.optimizer, WEIGHT_BYTES, master=False)[0] * WEIGHT_BYTES, WEIGHT_BYTES


def lp_gradients(train: StageParams, plan: Plan, stack: Stack) -> Num:
    """Bytes of 16-bit gradients a wrapper keeps beside the gradients ``model_states`` counts: DeepSpeed's
    BF16_Optimizer (cost/wrappers.py, the "bf16" wrapper) accumulates each micro-batch's bf16 ``.grad`` into a flat
    buffer of the plan's gradient bytes over every parameter (bf16_optimizer.py ``fp32_groups_gradients_flat``: the
    ``plan.grad_bytes`` counted), and zeroes the bf16 gradients before each micro-batch's backward instead of freeing
    them (``backward_prologue``: ``clear_lp_grads``, set_to_none False; the pipeline engine calls it alike), so both
    live through the step: WEIGHT_BYTES more a trainable parameter, unsharded. BigScience's README for BLOOM-176B:
    its fp32 buffer "consumes 4 bytes * params of additional memory". Not for a stated wrapper nor under LoRA
    (work_of: no wrapper work)."""
    if work_of(plan, stack) not in BF16_OPTIMIZER_WORK:
        return 0.0
    return WEIGHT_BYTES * train.total


# ZeRO-Infinity keeps the parameters of the layer running and of the one prefetched on the GPU (Rajbhandari et al. 2021,
# §5.1 "the parameters are fetched layer by layer", DeepSpeed stage3_prefetch_bucket_size / max_live_parameters)
RESIDENT_LAYERS = 2


def resident_weights(model: ModelSpec, plan: Plan, last: bool = False) -> Num:
    """The share of a rank's weights kept on the GPU: 1, or with offloaded weights (``plan.offload_weights``) the
    RESIDENT_LAYERS of its stage's layers being used and prefetched (the rest live in host memory)."""
    if not plan.offload_weights:
        return 1.0
    layers = layers_on_last(model, plan) if last else layers_on_stage(model, plan)
    return minimum(1.0, RESIDENT_LAYERS / maximum(layers, 1))


def chunk_gradient_share(plan: Plan, stack: Stack) -> Num:
    """Share of a rank's unsharded gradients alive at its memory peak: 1, except under the torch pipeline runtime
    with ZeRO-1 (torchtitan's FSDP2 with pipeline parallelism: weights kept unsharded across micro-batches,
    gradients accumulated unsharded and reduce-scattered on the chunk's last backward). There each model chunk is
    its own FSDP2 module (torchtitan applies fully_shard to every model part), whose accumulated unsharded
    gradients live from the chunk's first backward to its last, then are reduce-scattered and freed (FSDP2
    FSDPParam.unsharded_accumulated_grad; torch.distributed.pipelining stage.backward_maybe_with_nosync syncs on
    the last micro-batch only). torch's ScheduleInterleaved1F1B (schedules.py, from the PyTorch of December 2024)
    runs max(1, ⌊m/p⌋) rounds and moves its backwards to the next chunk, the last chunk first, after each round's
    m / rounds micro-batches, so with a single round (m < 2p) a rank backpropagates its chunks one after the other
    and 1/v of its gradients is alive at a time; with more rounds, all of them. (ZeRO-1 under the torch runtime
    stands for this FSDP2 use; a ZeRO-1 optimizer beside DDP, whose gradients stay unsharded, is not modelled.)
    ZeRO-2 and -3 on a shard group of one (dp·cp = 1 and one expert-data-parallel rank) shard nothing and are the
    same FSDP2 use, so they keep the same share (issue 48: ZeRO-2 read heavier than ZeRO-1 at dp = 1)."""
    if not stack.pipeline_runtime_mode.keeps_microbatches or plan.zero == 0:
        return 1.0
    alone = (plan.dp * plan.cp == 1) & (plan.tp * plan.cp * plan.dp == plan.ep * plan.etp)
    one_round = (plan.vpp > 1) & (plan.grad_accum < 2 * plan.pp) & ((plan.zero == 1) | alone)
    return where(one_round, 1.0 / plan.vpp, 1.0)


def model_state_memory(model: ModelSpec, plan: Plan, stack: Stack
                       ) -> tuple[tuple[Num, Num, Num], tuple[Num, Num, Num]]:
    """(weights, grads, optimizer) of the first and of the last pipeline rank (the weights' resident share only)."""
    out = []
    for first in (True, False):
        w, g, o = model_states(stage_params(model, plan, first), plan, stack, last=not first)
        out.append((w * resident_weights(model, plan, last=not first), g, o))
    return out[0], out[1]


def offloaded_optimizer(model: ModelSpec, plan: Plan, stack: Stack) -> Num:
    """Host bytes of an offloaded optimizer state (ZeRO-Offload keeps the fp32 state on the host, sharded as
    on the GPU), on the first pipeline rank."""
    if not plan.offload_optimizer:
        return 0.0
    return model_states(stage_params(model, plan, True), replace(plan, offload_optimizer=False), stack)[2]


def weight_versions(plan: Plan, last: bool = False) -> Num:
    """Weight versions the first (or last) pipeline rank r keeps (steady.table_weight_versions reads them off the
    tables):
    PipeDream p - r, one per micro-batch in flight (Narayanan et al. 2019 §3.3, weight stashing); PipeDream-2BW
    min(2, p - r) (Narayanan et al. 2021 §3.1: double-buffered; the last rank's forward and backward of a micro-batch
    are adjacent, so it needs one); a synchronous schedule 1: the record's rule (meshplan.pipeline.rules)."""
    return schedule_of(plan.schedule).weight_versions(plan.pp, last)
