"""The first and last pipeline stage's own ops, one micro-batch, one GPU: the vocabulary-parallel embedding, the
final norm, LM head and cross-entropy, the trainer's metric cross-entropies, and what a multi-token-prediction
depth adds (symbols: records.py)."""

from __future__ import annotations

from dataclasses import replace

from meshplan.cost.blocks import collective, gemm, norm, tp_enter, tp_exit
from meshplan.cost.eager import EAGER, eager_norm, eager_op
from meshplan.cost.extras import head_extra_ops
from meshplan.cost.fsdp import fsdp_grad_prep
from meshplan.cost.lora import lora
from meshplan.cost.ple import ple_embed_ops
from meshplan.cost.records import ACT_BYTES, FP32, MASK_BYTES, Dims, OpCost, dims
from meshplan.specs.model import ModelSpec
from meshplan.specs.model_extras import head_vocab, vocab_shard
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.xp import Num


def lookup_ops(name: str, elems: Num, d: Dims, mask: Num = 0.0) -> list[OpCost]:
    """Gathering ``elems`` embedding values from the table (read and write 16 bits each; ``mask``: the dropout mask
    kept) and, backward, scatter-adding their gradients into the table's (read the 16-bit gradient, read and write
    the table's gradient)."""
    return [OpCost(name, "fwd", "memory", 0.0, 2 * elems * ACT_BYTES, mask),
            OpCost(name, "bwd_w", "memory", elems, elems * ACT_BYTES + elems * 2 * d.grad_bytes)]


def embedding_ops(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """Vocabulary-parallel embedding lookup (first stage): gather rows, all-reduce (reduce-scatter with SP)
    across TP; the backward scatter-adds into the table's gradient."""
    d = dims(model, plan, stack)
    h = model.hidden_size
    elems = d.tokens * h
    mask = d.tokens_sp * h * MASK_BYTES if d.dropout else 0.0
    ops = lookup_ops("embed/lookup", elems, d, mask) + vocab_parallel_reduce("embed/tp", elems, plan)
    ops += ple_embed_ops(model, d)  # per-layer embeddings (cost/ple.py)
    ops += fsdp_grad_prep("embed", model.embedding_params() / plan.tp, plan, stack)
    return lora(ops, plan, d)


def vocab_parallel_reduce(name: str, elems: Num, plan: Plan) -> list[OpCost]:
    """A vocabulary-parallel lookup's rows (each rank holds V/t rows of the table, so a token's embedding is on one
    rank and zeros on the others) summed across TP: all-reduce, or with sequence parallelism reduce-scatter into the
    sequence-sharded layout and all-gather its gradient back (Megatron-Core VocabParallelEmbedding)."""
    if not plan.sequence_parallel:
        return [collective(name, "fwd", "all_reduce", elems * ACT_BYTES, "tp", plan.tp, "tp")]
    return [collective(name, "fwd", "reduce_scatter", elems * ACT_BYTES, "tp", plan.tp, "tp"),
            collective(name, "bwd_x", "all_gather", elems * ACT_BYTES, "tp", plan.tp, "tp")]


def head_ops(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """Final norm, vocabulary-parallel LM head (H → V/t), cross-entropy (last stage) and the trainer's metric
    cross-entropies (``train_metrics``).

    The loss's traffic and what it keeps depend on ``stack.cross_entropy`` (``loss_ops``): Megatron's upcasts the
    logits to fp32 and keeps them for the backward pass, 4·T·V/t bytes (Korthikanti et al. 2022 §4.1, "4sbv/t" for
    the output layer), with three small all-reduces (max, sum, target logit) of T fp32 values each across TP. A loss
    over gathered logits (``Loss.gathered``: KempnerForge's) all-gathers the T·V 16-bit logits to every TP rank
    instead and runs over all of them there.
    """
    d = dims(model, plan, stack)
    vocab = vocab_shard(head_vocab(model), d.tp, stack.vocab_multiple)
    logits = d.tokens * stack.loss.rank_vocab(vocab * d.tp, d.tp)  # the loss's: V/t, or V gathered to every rank
    ops = (norm("head/norm", model, d) if model.final_norm else []) + head_extra_ops(model, d)  # cost/extras.py
    ops += tp_enter("head/tp_in", model, plan, d, quantized=False)
    # the output layer is outside Transformer Engine's fp8 region: it runs in 16 bits whatever the plan's precision
    ops += [replace(op, variant="bf16") for op in gemm("head/logits", d.tokens, model.hidden_size, vocab, d,
                                                        saved=d.tokens_sp * model.hidden_size * ACT_BYTES)]
    ops += loss_ops(stack, logits, d.tokens)
    if stack.loss.gathered:  # the 16-bit logits gathered whole to every rank; their gradient's V/t chunk kept locally
        ops.append(collective("head/logits_gather", "fwd", "all_gather", d.tokens * vocab * d.tp * ACT_BYTES, "tp",
                              plan.tp))
    else:
        ops.append(collective("head/loss_tp", "fwd", "all_reduce", 3 * d.tokens * FP32, "tp", plan.tp))
    if stack.train_metrics:
        ops.append(train_metrics(stack.train_metrics, logits))
    if stack.loss.eager:
        ops += eager_op("head/loss", "cross_entropy", logits)
    if d.eager and model.final_norm:
        ops += eager_norm("head/norm", model, d.tokens_sp * model.hidden_size, stack)
    ops += fsdp_grad_prep("head", model.head_params() / plan.tp, plan, stack)
    return lora(ops, plan, d)


def mtp_ops(model: ModelSpec, plan: Plan, stack: Stack) -> list[OpCost]:
    """What one multi-token-prediction depth (``ModelSpec.mtp_layers``; Megatron-Core MultiTokenPredictionLayer) runs
    on the last stage besides its layer and the head: the lookup of the next tokens' embeddings (the shared
    vocabulary-parallel table, its rows reduced across TP as the first stage's are: the MTP layer calls the same
    VocabParallelEmbedding), their norm and the previous hidden state's (enorm, hnorm), and eh_proj over the
    2H-wide concatenation (column-parallel: its input gathered, its H/t-wide output gathered back into the
    sequence-parallel layout). The depth's layer (``mtp_kinds``) and its final norm, shared LM head and loss are the
    ops of those kinds (``layer_kinds``, ``head_ops``), which step.units.units_for_recomputes adds per depth.
    Simplified: the MTP layer runs at the plan's precision (Megatron-Bridge keeps Nemotron 3 Super's in BF16,
    keep_mtp_spec_in_bf16), and its loss is scaled, not skipped."""
    if not model.mtp_layers:
        return []
    d = dims(model, plan, stack)
    h = model.hidden_size
    elems = d.tokens * h
    ops = lookup_ops("mtp/embed_lookup", elems, d) + vocab_parallel_reduce("mtp/embed_tp", elems, plan)
    ops += norm("mtp/enorm", model, d) + norm("mtp/hnorm", model, d)
    ops += tp_enter("mtp/eh_proj/tp_in", model, plan, d, width=2 * h)
    ops += gemm("mtp/eh_proj", d.tokens, 2 * h, h / d.tp, d)
    return ops + tp_exit("mtp/eh_proj/tp_out", model, plan, d)


def loss_ops(stack: Stack, logits: Num, tokens: Num) -> list[OpCost]:
    """The cross-entropy over this GPU's logits, forward and backward. Megatron's vocabulary-parallel loss (and the
    fused part of PyTorch's, whose extra eager kernels ``EAGER["cross_entropy"]`` adds): reads the 16-bit logits,
    keeps an fp32 softmax (4 bytes per logit saved), backward reads it and writes the gradient. ``"flash"``:
    flash-attn's CrossEntropyLoss (csrc/xentropy, from apex's contrib xentropy kernel) reads the 16-bit logits
    twice (``cunn_SoftMaxXEntropyForward``: max and sum, then Σexp) and keeps them with one fp32 log-sum-exp per
    token; its backward (``cunn_SoftMaxXEntropyBackward``) re-reads them and writes the 16-bit gradient.
    ``"fused_grad"``: llm.c's ``fused_classifier_kernel5`` (karpathy/llm.c llmc/fused_classifier.cuh) computes the
    softmax, the loss and the gradient of the logits in one kernel: it reads each 16-bit row twice (the softmax's
    max and sum, then the gradient) and writes the 16-bit gradient over the logits, 6 bytes a logit; nothing is left
    for the backward pass but the head's GEMMs, which read that gradient. ``"vocab_parallel_eager"``: the same loss as
    the eager fp32 ops it is written in (specs/stack_variants.py ``LOSSES``)."""
    loss = stack.loss  # the kernel's record: its bytes per logit (specs/stack_variants.py)
    saved = logits * loss.saved
    if loss.saved_per_token:
        saved = saved + tokens * loss.saved_per_token
    ops = [OpCost("head/loss", "fwd", "memory", loss.fwd_flops * logits, logits * loss.fwd_bytes, saved,
                  kernels=loss.fwd_kernels)]
    if loss.bwd_bytes:
        ops.append(OpCost("head/loss", "bwd_x", "memory", loss.bwd_flops * logits, logits * loss.bwd_bytes,
                          kernels=loss.bwd_kernels))
    return ops


def train_metrics(count: Num, logits: Num) -> OpCost:
    """``count`` cross-entropies over the 16-bit logits outside autograd, after the micro-batch's backward pass
    (Composer ``Trainer._eval_train_metrics`` → ``LanguageCrossEntropy.update``: ``torch.nn.CrossEntropyLoss`` with
    reduction "sum", under autocast): autocast casts the logits to fp32 and log_softmax reads the long rows three
    times (the forward kernels of ``EAGER["cross_entropy"]`` without the fused loss: 2 + 4 and 12 + 4 bytes per
    logit each); nll_loss's read of one logit per token is neglected. Their fp32 temporaries (8 bytes per logit)
    are not added to the peak memory: they live after the backward pass, when the activations are freed."""
    per_logit = sum(r + w for name, r, w in EAGER["cross_entropy"]["fwd"] if name != "fused loss")
    return OpCost("head/metrics", "bwd_x", "memory", 5.0 * count * logits, count * logits * per_logit)
