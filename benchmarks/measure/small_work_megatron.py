"""The same GPT as benchmarks/measure/small_work_gpu.py's, built by Megatron-Core (``small_work_gpu.py --stack
megatron``): GPTModel with the local (non-Transformer-Engine) layer spec, Megatron-LM's own module code:
ColumnParallelLinear / RowParallelLinear through LinearWithGradAccumulationAndAsyncCommunication (a Python autograd
Function), the unfused DotProductAttention (baddbmm scores, FusedScaleMaskSoftmax's torch path, bmm), learned positions,
LayerNorm (WrappedTorchNorm without apex), bias-GeLU MLP, tied LM head, and Float16Module's bf16 casts, as Megatron's
training loop wraps it. Fusions off (bias-dropout-add, bias-GeLU, masked softmax, gradient-accumulation fusion: each
needs apex or a JIT this host may not have): the eager Megatron stack of the issue's held-out small-work runs
(Megatron-DeepSpeed's model code is this module code's parent). One rank: NCCL (gloo on a CPU) with tp = pp = 1.

On a CPU (a smoke test) three CUDA-only paths are bypassed: the global memory buffer (plain torch.empty), the CUDA RNG
tracker's fork (dropout is 0) and the default causal mask (an explicit mask is passed on every device).
"""

from __future__ import annotations

import contextlib
import os

VERSION_NOTE = "megatron-core local spec, fusions off"


def _init(torch, device: str) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29571")
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
    if device == "cuda":
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(0)
        return
    import megatron.core.tensor_parallel.random as mr
    import megatron.core.utils as mu

    mr.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    mu.GlobalMemoryBuffer.get_tensor = lambda self, shape, dtype, name, *a, **k: torch.empty(shape, dtype=dtype)


def megatron_gpt(torch, width: int, layers: int, heads: int, seq: int, vocab: int, device: str):
    """A module whose forward(tokens, labels) is the mean loss of Megatron-Core's GPTModel (module docstring)."""
    _init(torch, device)
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(
        num_layers=layers, hidden_size=width, num_attention_heads=heads, ffn_hidden_size=4 * width,
        hidden_dropout=0.0, attention_dropout=0.0, add_bias_linear=True, gated_linear_unit=False,
        activation_func=F.gelu, normalization="LayerNorm", bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, apply_rope_fusion=False, gradient_accumulation_fusion=False, bf16=True,
        params_dtype=torch.bfloat16, use_cpu_initialization=device != "cuda")
    gpt = GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=vocab,
                   max_sequence_length=seq, position_embedding_type="learned_absolute",
                   share_embeddings_and_output_weights=True).to(device)
    return mean_loss(torch, Float16Module(config, gpt), seq, device)


def mean_loss(torch, model, seq: int, device: str):
    """A module whose forward(tokens, labels) is the mean of a Megatron GPT's per-token losses: ``model`` called with
    learned positions and a causal mask, as Megatron's GPT forward takes them (its first output where it returns a
    tuple: Megatron-DeepSpeed's MoE losses beside)."""
    mask = torch.triu(torch.ones(1, 1, seq, seq, device=device), diagonal=1).bool()
    positions = torch.arange(seq, device=device).unsqueeze(0)

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, tokens, labels):
            out = self.model(tokens, positions, mask, labels=labels)
            return (out[0] if isinstance(out, tuple) else out).float().mean()

    return Loss()
