"""The MLP's per-op costs, dense and mixture-of-experts, one micro-batch, one GPU: fc1, activation, fc2; the
router, the token dispatch and combine, the experts' grouped (or per-expert, host-launched) GEMMs, the shared
experts (symbols: records.py).

Sources:
- MoE: token dispatch and combine all-to-all over the ep group, forward and backward (Lepikhin et al. 2020,
  GShard; Megatron-Core MoE), routing assumed balanced (the NVIDIA benchmark tables force-balance it).
"""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.blocks import (
    collective,
    elementwise,
    gemm,
    norm,
    projections,
    residual,
    split_concat,
    tp_enter,
    tp_exit,
)
from meshplan.cost.eager import eager_op
from meshplan.cost.moe_permute import (
    fp8_padding,
    gather_dispatch,
    local_sort,
    permutation,
    quantization_align,
    rows_seen,
)
from meshplan.cost.records import ACT_BYTES, Dims, OpCost
from meshplan.cost.shapes import fc1_width
from meshplan.specs import token_drop
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num


def mlp_gemms(prefix: str, model: ModelSpec, rows: Num, ffn: Num, d: Dims, input_saved: Num | None = None,
              groups: Num | None = None, width: Num = 0) -> list[OpCost]:
    """fc1 (H → F, or H → 2F gate+up for SwiGLU), activation, fc2 (F → H). ``ffn`` is the local width;
    ``input_saved`` is what fc1 keeps of its input (the sequence-parallel shard, by default all rows);
    ``groups``: the routed experts, the rows split over that many experts' weights (grouped GEMMs); ``width``: the
    rows' width when it is not H (a latent MoE's experts). A dense gated fc1 (no ``groups``) runs as the stack's
    projections (blocks.projections: one GEMM, one split by chunk, or gate and up apart); the experts' is one grouped
    GEMM (Megatron-Core's and transformers' 3-D gate_up_proj alike; eager stacks: mlp_moe.experts_eager)."""
    width = width or model.hidden_size
    width_in = fc1_width(model, ffn)
    dense, groups = groups is None, 1.0 if groups is None else groups
    if model.gated and dense:
        ops = projections(f"{prefix}/fc1", rows, width, width_in, {"gate": ffn, "up": ffn}, d, saved=input_saved)
        ops += split_concat(f"{prefix}/fc1", rows, width_in, d)
    else:
        ops = gemm(f"{prefix}/fc1", rows, width, width_in, d, saved=input_saved, groups=groups)
    act_in, act_out = rows * width_in, rows * ffn
    ops += elementwise(f"{prefix}/act", act_in, act_out, 8.0, saved=act_in * ACT_BYTES)
    ops += gemm(f"{prefix}/fc2", rows, ffn, width, d, groups=groups)
    return ops


def mlp_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    ops = norm("mlp/norm", model, d)
    ops += tp_enter("mlp/tp_in", model, plan, d)
    ops += mlp_gemms("mlp", model, d.tokens, model.ffn_hidden_size / d.tp, d,
                     input_saved=d.tokens_sp * model.hidden_size * ACT_BYTES)
    ops += model_code_activation("mlp", model, d, d.tokens * model.ffn_hidden_size / d.tp)
    ops += tp_exit("mlp/tp_out", model, plan, d)
    ops += residual("mlp/residual", model, d)
    return ops


def model_code_activation(prefix: str, model: ModelSpec, d: Dims, elems: Num) -> list[OpCost]:
    """An MLP's activation as the model code's eager ops under an otherwise fused stack (``Fusion.eager_activation``:
    NeMo 2's Nemotron, specs/fusion.py), beyond the one fused activation pass of ``mlp_gemms``, over its ``elems``
    local elements (the dense MLP's T·F/t, the shared experts', the routed experts' rows x F_e/etp): Megatron-Core's
    MLP and grouped experts call ``activation_func`` (and, gated, its product with the up half) as PyTorch ops where
    bias_activation_fusion is off (megatron/core/transformer/mlp.py:307-323, moe/experts.py:307-324 @ core_v0.17.0).
    Per element (cost/eager.py EAGER[model.mlp]): squared ReLU relu then pow forward, autograd's pow_backward (three
    kernels) and threshold_backward, 4 more bytes forward and 14 backward; SwiGLU silu and the product, 4 and 8; GeLU
    one kernel each way, as fused: nothing more. Left out: the gated chunk's backward (a concatenation) and the
    experts' product with their routing probabilities, a kernel more each way where they run eager."""
    if not d.stack.fusion_mode.eager_activation:
        return []
    return eager_op(f"{prefix}/act", model.mlp, elems)


def moe_block(model: ModelSpec, plan: Plan, d: Dims) -> list[OpCost]:
    """Router, dispatch all-to-all (ep), expert MLPs (sharded etp-ways), combine all-to-all, shared experts; a
    latent MoE (``moe_latent_size``) projects the routed tokens to the latent width before the dispatch and back
    after the combine, so the all-to-alls and the experts carry latent-wide rows.

    Megatron-Core runs MoE layers with sequence parallelism whenever t > 1, so each rank routes T/t tokens;
    the etp group all-gathers its members' tokens so the rank's E/e local experts see etp·T/t·k rows in all,
    etp·T/t·k·e/E each (balanced routing), against F_e/etp columns: grouped GEMMs of that many rows per expert
    (tile quantization per expert, wave quantization over all of them, weight-gradient depth = rows per expert).
    """
    k, latent = model.moe_topk, model.moe_latent_size
    routed = d.tokens / d.tp  # tokens this rank routes
    a = ACT_BYTES
    ops = norm("moe/norm", model, d)
    # its input: the shared experts' too; outside the fp8 region whatever the plan's precision (Megatron-Core's
    # RouterGatingLinearFunction: a GEMM of the 16-bit input, or fp32 with --moe-router-dtype), as serving's router
    ops += [replace(op, variant="bf16") for op in gemm("moe/router", routed, model.hidden_size, model.num_experts, d)]
    if latent:  # a latent MoE projects the routed tokens down before the dispatch (and back after the combine)
        ops += gemm("moe/latent_in", routed, model.hidden_size, latent, d, saved=0.0)
    h = model.moe_width  # the width the all-to-alls carry and the experts see
    slots = token_drop.routed_rows(plan, routed, k, model.num_experts)  # routed x k, or capacity-bound
    rows = slots * plan.etp
    tokens, permuted = rows_seen(plan, d.stack, routed, k)
    permuted = permuted if plan.moe_expert_capacity_factor is None else slots  # alltoall only (token_drop.refusals)
    if d.stack.moe_dispatcher_mode.gathers_tokens:
        ops += gather_dispatch(plan, tokens, h)
    else:
        sent = slots * h * a
        # a forwarding dispatcher (DeepEP / HybridEP) sends a token once per other node it hits (dispatch.py)
        forwards = d.stack.moe_dispatcher_mode.forwards
        for phase in ("fwd", "bwd_x"):
            for name in ("moe/dispatch", "moe/combine"):
                op = collective(name, phase, "all_to_all", sent, "ep", plan.ep)
                if forwards and op.collective is not None:
                    op = replace(op, collective=replace(op.collective, copies=int(k), experts=model.num_experts,
                                                        backend=d.stack.flex_backend, routing=d.stack.moe_routing))
                ops.append(op)
        ops.append(collective("moe/etp_gather", "fwd", "all_gather", rows * h * a, "etp", plan.etp))
        ops.append(collective("moe/etp_scatter", "fwd", "reduce_scatter", rows * h * a, "etp", plan.etp))
        ops.append(collective("moe/etp_gather", "bwd_x", "all_gather", rows * h * a, "etp", plan.etp))
        ops.append(collective("moe/etp_scatter", "bwd_x", "reduce_scatter", rows * h * a, "etp", plan.etp))
    # token permutation around the exchange (Megatron-Core MoE token dispatcher: permute before dispatch,
    # unpermute + probability-weighted sum after combine), as the stack runs it (moe_permute.py)
    ops += permutation(d.stack, tokens, permuted, h)
    ops += _experts(model, plan, d, routed, rows, h)
    if latent:
        ops += gemm("moe/latent_out", routed, latent, model.hidden_size, d)
    if model.shared_expert_ffn_size:
        ops += tp_enter("moe/shared_tp_in", model, plan, d)
        ops += mlp_gemms("moe/shared", model, d.tokens, model.shared_expert_ffn_size / d.tp, d, input_saved=0.0)
        ops += model_code_activation("moe/shared", model, d, d.tokens * model.shared_expert_ffn_size / d.tp)
        ops += tp_exit("moe/shared_tp_out", model, plan, d)
    ops += residual("moe/residual", model, d)
    return ops


def _experts(model: ModelSpec, plan: Plan, d: Dims, routed: Num, rows: Num, h: Num) -> list[OpCost]:
    """The E/e local experts, each an (etp·k·T/t · e/E)-row GEMM (grouped GEMMs, balanced routing), with the received
    rows regrouped by local expert and back and padded to the fp8 GEMMs' alignment (moe_permute.py) where the
    dispatch or the capacity has not aligned them already."""
    local, ffn = model.num_experts / plan.ep, model.moe_ffn_hidden_size / plan.etp
    stack = d.stack
    aligned = (stack.moe_dispatcher_mode.forwards and stack.flex_backend_mode.pads_for_quantization) or \
        token_drop.aligned(plan, routed, model.moe_topk, model.num_experts, quantization_align(plan.precision))
    ops = local_sort(stack, rows, h, local) + fp8_padding(stack, plan.precision, rows, h, aligned)
    synced = not token_drop.host_known(plan)  # padded to capacity: the split sizes are the host's (token_drop.py)
    experts = host_launched(mlp_gemms("moe/experts", model, rows, ffn, d, groups=local, width=h), stack, local, synced)
    ops += dglu_regressed(experts, stack)
    ops += grouped_mlp_eager(model, stack, rows, ffn, local, synced) + looped_expert_biases(model, stack, rows, ffn,
                                                                                           local, synced)
    return ops + experts_eager(model, d, rows, ffn) + model_code_activation("moe/experts", model, d, rows * ffn)


# The records of the grouped MLP's backward GLU kernel: Transformer Engine's CuTeDSL grouped MLP (expert_gemm
# "grouped") runs fc2's data-gradient GEMM with the gated activation's gradient and fc2's bias gradient in its epilogue
# as one kernel (cudnn-frontend grouped_gemm_dglu_wrapper_sm100: MoEGroupedGemmDgluDbiasKernel).
DGLU_RECORDS = (("moe/experts/fc2", "bwd_x"), ("moe/experts/act", "bwd_x"))


def dglu_regressed(ops: list[OpCost], stack: Stack) -> list[OpCost]:
    """``ops`` with the grouped MLP's backward GLU kernel (``DGLU_RECORDS``) at ``stack.dglu_slowdown`` times its
    time: a release's regression of that kernel, as its maintainers state it (cudnn-frontend#256: 10x slower from
    cudnn-frontend 1.24.0, which the 26.06.01 NeMo container ships; meshplan_validation/recipes_off.DGLU_SLOWDOWN).
    Only the fused grouped path runs that kernel; the per-expert path's GEMMs and activation are other kernels."""
    if stack.dglu_slowdown == 1.0 or not stack.expert_gemm_mode.grouped:
        return ops
    return [replace(op, slowdown=stack.dglu_slowdown) if (op.name, op.phase) in DGLU_RECORDS else op for op in ops]


def grouped_mlp_eager(model: ModelSpec, stack: Stack, rows: Num, ffn: Num, local: Num = 1.0,
                      synced: bool = True) -> list[OpCost]:
    """What Megatron-Core's TEGroupedMLP (the per-expert path, ``stack.expert_gemm = "per_expert"``) runs as eager
    PyTorch kernels around its fused ones, ``rows`` routed rows of F = ``ffn`` (per etp shard) on this GPU, in bf16
    (the router's probabilities keep the activations' dtype without moe_router_dtype; GPTOSSProvider sets none):

    - a clamped GLU (``glu_clamp``): weighted_bias_quick_geglu_impl clamps the gate and the linear half and
      concatenates them before its fused kernel (megatron/core/fusions/fused_bias_geglu.py): forward two clamps
      (read F, write F each) and the cat (read 2F, write 2F), 8F elements a row; backward two clamp gradients (read
      the gradient and the input, write F each, 6F) and the chunk's gradient, a cat (4F): 10F. The clamps keep their
      input, fc1's 2F-wide output, while the fused kernel keeps the clamped copy (the activation's saved input): 2F
      more saved a row. A sub-record of the activation, so the moe_act recompute runs it again and frees what it
      kept (its checkpoint keeps only fc1's output).
    - biased experts (``linear_bias``): TEGroupedMLP._apply_bias adds fc2's bias scaled by each row's routing
      probability as ``t + b·p`` per local expert and concatenates the pieces (megatron/core/transformer/moe/
      experts.py): forward b·p (write H), the add (read 2H, write H), the cat (read H, write H): 6H a row;
      backward the probabilities' gradient (a product, read H write H, and its row sum, read H) and the split's,
      a cat (2H), then the bias gradient (a product and its column sum, 3H). fc1's bias is added in the grouped
      GEMM (Transformer Engine GroupedLinear, skip_bias_add false), for free. Its list comprehension runs per
      ``local`` expert after the tokens-per-expert sync, so the host launches each piece's kernels
      (``BIAS_KERNELS``) at the stack's cost per kernel, a floor as ``host_launched``'s (none where ``synced`` is
      false: as there).
    A fused grouped MLP (``"grouped"``: Transformer Engine's CuTeDSL kernel applies the clamp and the scaled bias
    in its epilogues) runs none of these, nor does a stack of eager PyTorch (``stack.fusion = "eager"``), whose
    experts are not Megatron-Core's (``eager_layer``), nor Megatron-LM's module code of 2020-22 (``"jit"``), which
    has no MoE layer of this kind. The clamps run once for all experts; the biases' loop per expert (above)."""
    if stack.expert_gemm_mode.grouped or not stack.fusion_mode.fused:
        return []
    a, h = ACT_BYTES, model.moe_width
    ops = []
    if model.glu_clamp:  # the clamps keep fc1's output for their gradients besides the clamped copy the kernel keeps
        ops += [OpCost("moe/experts/act/clamp", "fwd", "memory", 0.0, 8 * ffn * rows * a, 2 * ffn * rows * a),
                OpCost("moe/experts/act/clamp", "bwd_x", "memory", 0.0, 10 * ffn * rows * a)]
    if model.linear_bias:
        per_kernel = stack.host.per_kernel if synced else 0.0
        ops += [OpCost("moe/experts/fc2/bias", phase, "memory", 0.0, n * h * rows * a,
                       launches=BIAS_KERNELS[phase][0] * local + BIAS_KERNELS[phase][1], launch_host=per_kernel)
                for phase, n in (("fwd", 6), ("bwd_x", 5), ("bwd_w", 3))]
    return ops


def looped_expert_biases(model: ModelSpec, stack: Stack, rows: Num, ffn: Num, local: Num = 1.0,
                         synced: bool = True) -> list[OpCost]:
    """The experts' biases (``linear_bias``: gpt-oss) where the stack's MoE module adds them in eager PyTorch
    (``stack.fusion_mode.expert_bias_loop``): NeMo AutoModel's GroupedExpertsDeepEP (nemo_automodel/components/moe/
    layers.py @01926a5c), whose grouped GEMMs (grouped_gemm's ops.gmm) take no bias, adds fc1's after its GEMM and
    fc2's, scaled by each row's routing probability, after its own, each by ``_apply_bias``: one ``t + b`` (or
    ``t + b·p``) per local expert over the rows torch.split cuts by ``tokens_per_expert.tolist()``, then a torch.cat.
    Per routed row (``rows`` on this GPU), in 16-bit elements, F = fc1's output width (2·``ffn`` gated), H the
    experts' model width:
    - fc1's bias: forward the add (read F, write F) and the cat (read F, write F): 4F; backward the split's gradient,
      a cat (read F, write F): 2F; the bias gradient, a column sum per expert (read F): F;
    - fc2's bias: forward b·p (write H), the add (read 2H, write H), the cat (read H, write H): 6H; backward the
      probabilities' gradient (a product, read H write H, and its row sum, read H) and the split's cat (2H): 5H;
      the bias gradient (a product and its column sum): 3H (grouped_mlp_eager's count of Megatron-Core's fc2 bias).
    Launched per local expert by the host after the split's sync (``BIAS_KERNELS`` for fc2, one add and one column
    sum for fc1; the cats once), at the stack's cost per kernel, a floor as ``host_launched``'s. The probabilities
    are 16-bit (the benchmarks' FakeBalancedGate returns ``weights.type_as(x)``, layers.py:559). Neglected: a
    router's fp32 probabilities (b·p and the add then in fp32, and a cast back), and the ``.tolist()`` syncs
    themselves (two a layer, forward)."""
    if not (model.linear_bias and stack.fusion_mode.expert_bias_loop):
        return []
    a, h, f = ACT_BYTES, model.moe_width, (2 if model.gated else 1) * ffn
    per_kernel = stack.host.per_kernel if synced else 0.0
    return [OpCost("moe/experts/bias", phase, "memory", 0.0, (nf * f + nh * h) * rows * a,
                   launches=(BIAS_KERNELS[phase][0] + FC1_BIAS_KERNELS[phase][0]) * local + BIAS_KERNELS[phase][1]
                   + FC1_BIAS_KERNELS[phase][1], launch_host=per_kernel)
            for phase, nf, nh in (("fwd", 4, 6), ("bwd_x", 2, 5), ("bwd_w", 1, 3))]


# Kernels of fc1's bias in GroupedExpertsDeepEP._apply_bias by pass: (per local expert, once): forward the add per
# expert and the cat; backward the split's cat once and the bias gradient's column sum per expert
FC1_BIAS_KERNELS = {"fwd": (1.0, 1.0), "bwd_x": (0.0, 1.0), "bwd_w": (1.0, 0.0)}


# Kernels of TEGroupedMLP._apply_bias (megatron/core/transformer/moe/experts.py @ core_v0.16.1) by pass: (per local
# expert, once). Forward b·p and the add per expert, the cat once; backward, per expert, the probabilities' gradient
# (a product and its row sum) and, once, the split's cat; the bias gradient (a product and its column sum) per expert.
BIAS_KERNELS = {"fwd": (2.0, 1.0), "bwd_x": (2.0, 1.0), "bwd_w": (2.0, 0.0)}


def experts_eager(model: ModelSpec, d: Dims, rows: Num, ffn: Num) -> list[OpCost]:
    """The routed experts' activation in eager PyTorch (``stack.fusion = "eager"`` with an eager permutation,
    ``stack.moe_permute`` not "fused": the MoE layer is PyTorch code, not Megatron-Core's kernels): the gated
    activation as separate kernels (``EAGER``), and the backward of the chunk that splits the fused gate-and-up
    GEMM's rows (a concatenation of the two gradients: read 2F, write 2F a row), as transformers' experts
    (``gate, up = proj.chunk(2, dim=-1)``) and meshplan's MoE module run it."""
    if not d.eager or d.stack.moe_permute_mode.fused or not model.gated:
        return []
    ops = eager_op("moe/experts/act", model.mlp, rows * ffn)
    return ops + [OpCost("moe/experts/act/concat", "bwd_x", "memory", 0.0, 4 * ACT_BYTES * rows * ffn)]


# Kernels the host launches per local expert and micro-batch on the per-expert path, by record of ``mlp_gemms``:
# Megatron-Core's SequentialMLP (the experts without --moe-grouped-gemm; megatron/core/transformer/moe/experts.py
# @ core_v0.16.1) splits the rows by ``tokens_per_expert.tolist()`` and runs each local expert's MLP in a Python loop
# (megatron/core/transformer/mlp.py MLP.forward @ core_v0.16.1): fc1 (a Transformer Engine Linear: one GEMM), the
# probability-weighted SwiGLU (fusions/fused_bias_swiglu.py weighted_swiglu under torch.compile: one kernel), fc2;
# autograd then runs, per expert, fc2's input-gradient and weight-gradient GEMMs (the latter accumulating into
# main_grad), the activation's backward (weighted_swiglu_back: the input gradient and the probabilities' gradient, a
# row sum: two kernels), fc1's two GEMMs. Nine kernels, six of them GEMMs; the split's and the concatenation's
# kernels run once for all experts. With fp8 / fp4 each GEMM's quantization is a launch more (casts.py).
EXPERT_KERNELS = {("fc1", "fwd"): 1.0, ("act", "fwd"): 1.0, ("fc2", "fwd"): 1.0, ("fc2", "bwd_x"): 1.0,
                  ("act", "bwd_x"): 2.0, ("fc1", "bwd_x"): 1.0, ("fc2", "bwd_w"): 1.0, ("fc1", "bwd_w"): 1.0}
# Each of those GEMMs is issued through a Transformer Engine Linear, whose forward costs its host 100 us of CPU where
# a torch Linear's costs 37 us on the same Grace host (NVIDIA/TransformerEngine#2053): the module's Python (its
# quantizers, workspace and autograd Function) beyond the one GEMM it launches, which the stacks' per-kernel cost (a
# torch Linear's 13.5 us on an x86 DGX host, presets/stacks/megatron-bridge.toml) does not hold. Applied to the
# backward's GEMMs alike (TE's _Linear.backward, the same module code; not measured apart), and only where the stack
# runs Megatron-Core's modules (``stack.fusion = "fused"``): an eager stack's experts call torch's Linear, whose cost
# its per-kernel figure already is (the eager activation's further kernels, mlp_moe.experts_eager, are not counted
# as launched after the sync: a simplification). This is the mechanism the
# fitted 40.5 us per GEMM launch (Efficiency.host_launch, fitted on the MoE runs until 2026-11-28) stood for:
# 12 us x 100/37 = 32 us per GEMM, and the activation's three launches per expert it did not count.
# Not scaled by the host CPU's Python speed (Cluster.python_host, which step/host.on_host applies to the pass's host
# time): the MoE runs hold GB200 (Grace) runs beside their B200 twins of the same releases, and scaled by Grace's 2.75
# the per-expert path reads them worse (fit half's MoE runs: median |error| 17.6 -> 17.9 %, the other half's 13.1 ->
# 18.4 %, 2026-11-28; in 2026-11-26's fitted form the GB200 Qwen3-30B-A3B runs read 38-45 % too slow scaled, -7 to
# +8 % unscaled): on Grace this path's host time is not Python's alone.
TE_LINEAR = 100.0 / 37.0


def host_launched(ops: list[OpCost], stack: Stack, groups: Num, synced: bool = True) -> list[OpCost]:
    """Mark the per-expert path's kernels (``stack.expert_gemm = "per_expert"``, ``groups`` local experts) as
    launched by the host, ``EXPERT_KERNELS`` per expert and record, each at the stack's cost per kernel
    (``HostCost.per_kernel``; a GEMM issued through a Transformer Engine Linear, Megatron-Core's, ``TE_LINEAR`` times
    it).

    Dropless MoE learns how many tokens each local expert got only on the device; Megatron-Core's token
    dispatcher copies the counts to the host (a device-to-host sync) before it can split the rows, and the experts
    then run one by one from Python. After the sync the CPU has no lead, so the GPU waits on these launches whenever
    an expert's kernels are shorter than the host's time to issue them (roofline.op_time's floor: launches ×
    ``launch_host``). With low precision each GEMM's quantization is one launch more per expert
    (``low_precision_casts`` gives those cast ops their own launches).

    Token drop padded to capacity (``synced`` false: specs/token_drop.py) splits the rows by sizes the host already
    holds (MoEAlltoAllTokenDispatcher's drop_and_pad: no device-to-host copy, no synchronisation), so the host keeps
    its lead: the same launches, in the pass's host time (step/host.launches), with no floor of their own
    (``launch_host`` 0)."""
    if stack.expert_gemm_mode.grouped:
        return ops
    per_kernel = stack.host.per_kernel if synced else 0.0
    out = []
    for op in ops:
        count = EXPERT_KERNELS.get((op.name.rsplit("/", 1)[-1], op.phase), 0.0)
        module = TE_LINEAR if op.kind == "gemm" and stack.fusion_mode.fused else 1.0
        out.append(replace(op, launches=groups * count, launch_host=per_kernel * module) if count else op)
    return out
