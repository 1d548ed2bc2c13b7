"""The last stage's own ops (cost/embed_head.py): the trainer's metric cross-entropies, flash-attn's loss."""

from __future__ import annotations

import pytest

from conftest import gpt
from meshplan.cost.embed_head import head_ops
from meshplan.errors import SpecError
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def test_training_metrics_read_the_logits_outside_autograd():
    """Two metric cross-entropies (Composer + MPT) over T·V = 2048 · 51,200 logits: each casts bf16 to fp32
    (read 2, write 4 bytes) and runs log_softmax in fp32, three reads of a row too long for shared memory and a
    write (12 + 4): 2 · 22 · 2048 · 51,200 bytes, after the backward pass."""
    model = gpt()
    assert not [o for o in head_ops(model, Plan(), Stack()) if o.name == "head/metrics"]
    (metrics,) = [o for o in head_ops(model, Plan(), Stack(train_metrics=2)) if o.name == "head/metrics"]
    assert (metrics.phase, metrics.kind, metrics.saved) == ("bwd_x", "memory", 0.0)
    assert metrics.nbytes == 2 * 22 * 2048 * 51200
    with pytest.raises(SpecError, match="train_metrics=-1 is outside 1 … 100 \\(or 0: none\\)"):
        Stack(train_metrics=-1)


def test_flash_cross_entropy_reads_the_16_bit_logits():
    """flash-attn's CrossEntropyLoss: forward reads the bf16 logits twice (4 bytes), keeps them (2) and one fp32
    log-sum-exp per token; backward reads them and writes the bf16 gradient (4): 8 bytes per logit against the
    vocabulary-parallel loss's 10 + 6."""
    model = gpt()
    logits, tokens = 2048 * 51200, 2048

    def loss(stack):
        return [o for o in head_ops(model, Plan(), stack) if o.name == "head/loss"]

    fwd, bwd = loss(Stack(cross_entropy="flash"))
    assert (fwd.nbytes, bwd.nbytes, fwd.saved) == (4 * logits, 4 * logits, 2 * logits + 4 * tokens)
    fused_fwd, fused_bwd = loss(Stack())
    assert (fused_fwd.nbytes, fused_bwd.nbytes, fused_fwd.saved) == (10 * logits, 6 * logits, 4 * logits)


def test_llm_cs_fused_classifier_reads_the_logits_twice_and_writes_their_gradient():
    """llm.c's fused_classifier_kernel5: the softmax's max and sum, then the gradient, from two reads of each bf16
    row, the bf16 gradient written over the logits: 6 bytes per logit in one forward kernel, no loss op in the
    backward pass (the vocabulary-parallel loss: 10 + 6), and no transient beside the logits. llm.c's runs are
    priced under it (meshplan_validation/sources.py)."""
    from meshplan.memory import loss_workspace
    from meshplan_validation.sources import source_defaults

    model = gpt()
    logits = 2048 * 51200
    (op,) = [o for o in head_ops(model, Plan(), Stack(cross_entropy="fused_grad")) if o.name == "head/loss"]
    assert (op.phase, op.nbytes, op.saved) == ("fwd", 6 * logits, 2 * logits)
    assert loss_workspace(model, Plan(), Stack(cross_entropy="fused_grad")) == 0.0
    assert loss_workspace(model, Plan(), Stack()) == 2 * logits
    assert source_defaults({"framework": "llm.c train_gpt2cu (CUDA/cuDNN, mpirun, 2024)"}).stack.cross_entropy == (
        "fused_grad")
    # the FlashAttention training scripts' loss: apex's xentropy kernel (CrossEntropyLossApex), flash-attn's
    flash = {"framework": "FlashAttention training scripts (PyTorch Lightning, Hydra; flash-attn fused kernels)"}
    assert source_defaults(flash).stack.cross_entropy == "flash"


def test_megatron_deepspeed_runs_the_vocabulary_parallel_loss_as_eager_fp32_ops():
    """Megatron-DeepSpeed (f4157bea) hands the loss ``output.float()`` and _VocabParallelCrossEntropy runs eager ops
    over it. Forward: the upcast reads 2 and writes 4 bytes a logit, max reads 4, the out-of-place subtraction 4 + 4,
    exp(out=) 4 + 4, sum 4, div_ 4 + 4: 38 bytes in 6 kernels; backward: mul_ 4 + 4 and the cast of the gradient back to
    16 bits 4 + 2: 14 bytes in 2 kernels; the fp32 softmax kept (4 bytes), as the fused reading's. Per rank: the
    vocabulary is split over tp, so the loss's bytes halve from tp 1 to tp 2."""
    from meshplan.specs.stack import load_stack

    model = gpt()
    stack = load_stack("megatron-deepspeed")
    assert stack.cross_entropy == "vocab_parallel_eager"

    def loss(plan):
        return [o for o in head_ops(model, plan, stack) if o.name == "head/loss"]

    (fwd, bwd), logits = loss(Plan()), 2048 * 51200
    assert (fwd.nbytes, fwd.kernels, fwd.saved) == (((2 + 4) + 4 + 8 + 8 + 4 + 8) * logits, 6, 4 * logits)
    assert fwd.nbytes == 38 * logits
    assert (bwd.nbytes, bwd.kernels) == ((4 + 4 + 4 + 2) * logits, 2)
    fused_fwd, fused_bwd = [o for o in head_ops(model, Plan(), Stack()) if o.name == "head/loss"]
    assert fwd.nbytes + bwd.nbytes - fused_fwd.nbytes - fused_bwd.nbytes == (52 - 16) * logits
    half, _ = loss(Plan(tp=2))
    assert half.nbytes == pytest.approx(fwd.nbytes / 2)
