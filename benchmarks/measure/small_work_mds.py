"""The same GPT as benchmarks/measure/small_work_gpu.py's, built by Megatron-DeepSpeed's own model code
(``small_work_gpu.py --stack mds``): microsoft/Megatron-DeepSpeed f4157bea's GPTModel, its arguments parsed as its
pretrain_gpt.py parses them (``--bf16``, learned positions, tied head, the defaults of its parser otherwise), so its
ParallelTransformerLayer, FusedScaleMaskSoftmax, jit-scripted bias-GeLU and bias-dropout-add, and
vocab_parallel_cross_entropy run as in the issue's held-out small-work runs. One rank: NCCL (gloo on a CPU),
tp = pp = 1. Megatron-DeepSpeed is not on PyPI: run with a checkout and DeepSpeed 0.19.8 (pure Python) on
PYTHONPATH, as benchmarks/measure/megatron_host_cpu.py's docstring says.

Three of its CUDA paths need compiled extensions that a lent machine does not hold and cannot build in its minutes:

- apex's fused LayerNorm (``fused_layer_norm_cuda``, which megatron/model/__init__.py imports on CUDA): stood in by
  an autograd Function of the same shape over torch's ``native_layer_norm`` and its backward (one kernel forward,
  as apex's ``forward_affine``; torch's backward, as apex's ``backward_affine``, computes the input's and the
  affine gradients in one call);
- its masked-softmax CUDA kernels (megatron/fused_kernels, a JIT build): ``--no-masked-softmax-fusion``, its torch
  path; with MDS_FUSED_SOFTMAX=1 they are built instead (``build_fused_softmax``: its own sources and flags, for the
  GPU's architecture alone, as megatron/fused_kernels/__init__.py's ``load`` would but for its sm_70 target, which
  CUDA 13 dropped) and the softmax runs them, as in the held-out runs;
- apex's gradient-accumulation fusion: ``--no-gradient-accumulation-fusion``.

And one of its Python paths fails at micro-batch > 1: f4157bea's ParallelAttention slices query, key and value out
of the fused QKV output as strided views that CoreAttention's ``.view(sq, b * np, hn)`` rejects when b > 1 (its
flash-attention paths, which take them, need the flash_attn package). Its older releases split them so that the view
holds. There they are made contiguous: three copy kernels a layer's forward, at micro-batch > 1 only.

``ds_bf16_accumulate`` adds what DeepSpeed 0.19.8's BF16_Optimizer does around each micro-batch's backward
(runtime/engine.py ``_backward_prologue`` / ``_backward_epilogue``; runtime/bf16_optimizer.py ``clear_lp_grads``,
``update_hp_grads``): the bf16 gradients zeroed by one ``torch._foreach_zero_``, then each cast to fp32 and added
into its fp32 gradient, ``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype).view(hp_grad.shape))``, in Python.
"""

from __future__ import annotations

import contextlib
import os
import sys
import types
from pathlib import Path

VERSION_NOTE = "Megatron-DeepSpeed f4157bea, apex LayerNorm stood in by torch's, masked-softmax fusion off"


def _apex_stand_in(torch) -> None:
    """apex's fused LayerNorm modules, over torch's native LayerNorm (module docstring)."""

    class FusedLayerNormAffineFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
            out, mean, rstd = torch.native_layer_norm(input, normalized_shape, weight, bias, eps)
            ctx.save_for_backward(input, weight, bias, mean, rstd)
            ctx.normalized_shape = normalized_shape
            return out

        @staticmethod
        def backward(ctx, grad):
            input, weight, bias, mean, rstd = ctx.saved_tensors
            dx, dw, db = torch.ops.aten.native_layer_norm_backward(
                grad.contiguous(), input, ctx.normalized_shape, mean, rstd, weight, bias, [True, True, True])
            return dx, dw, db, None, None, None

    names = ("apex", "apex.normalization", "apex.normalization.fused_layer_norm", "apex.multi_tensor_apply",
             "apex.optimizers", "fused_layer_norm_cuda", "amp_C")
    modules = {name: types.ModuleType(name) for name in names}
    apex, norm = modules["apex"], modules["apex.normalization"]
    apex.__path__ = []  # a package; its other submodules (apex.contrib) missing, as in an apex built without them
    modules["apex.normalization.fused_layer_norm"].FusedLayerNormAffineFunction = FusedLayerNormAffineFunction
    norm.fused_layer_norm, norm.MixedFusedRMSNorm = modules["apex.normalization.fused_layer_norm"], None
    apex.normalization, apex.multi_tensor_apply = norm, modules["apex.multi_tensor_apply"]
    modules["apex.multi_tensor_apply"].multi_tensor_applier = None  # imported by megatron/utils.py, not called here
    modules["apex.optimizers"].FusedAdam, modules["apex.optimizers"].FusedSGD = torch.optim.Adam, torch.optim.SGD
    sys.modules.update(modules)


def build_fused_softmax(torch) -> None:
    """Megatron-DeepSpeed's scale-mask-softmax extensions (megatron/fused_kernels: the upper-triangular one its
    causal GPT runs, and the masked one whose batch-per-block helper decides whether the kernel applies), compiled
    with its flags for this GPU's architecture and imported under their own names."""
    import importlib.util

    from torch.utils import cpp_extension

    src = Path(importlib.util.find_spec("megatron").submodule_search_locations[0]) / "fused_kernels"
    major, minor = torch.cuda.get_device_capability()
    flags = ["-O3", "-gencode", f"arch=compute_{major}{minor},code=sm_{major}{minor}", "--use_fast_math",
             "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "--expt-relaxed-constexpr",
             "--expt-extended-lambda"]
    build = Path(os.environ.get("MDS_BUILD", "/tmp/mds-fused-kernels"))
    build.mkdir(parents=True, exist_ok=True)
    for name in ("scaled_upper_triang_masked_softmax", "scaled_masked_softmax"):
        if f"{name}_cuda" not in sys.modules:
            sys.modules[f"{name}_cuda"] = cpp_extension.load(
                name=f"{name}_cuda", sources=[str(src / f"{name}.cpp"), str(src / f"{name}_cuda.cu")],
                build_directory=str(build), extra_cflags=["-O3"], extra_cuda_cflags=flags)


def mds_gpt(torch, width: int, layers: int, heads: int, seq: int, vocab: int, device: str):
    """A module whose forward(tokens, labels) is the mean loss of Megatron-DeepSpeed's GPTModel (module docstring)."""
    import torch.distributed as dist

    os.environ.setdefault("DS_ACCELERATOR", "cuda" if device == "cuda" else "cpu")
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # its validate_args asks for it on CUDA, as its
    # examples' scripts export it; it acts only if set before CUDA starts (gpu_session.sh exports it)
    if device == "cuda":
        _apex_stand_in(torch)
    sys.argv = ["pretrain_gpt.py", "--num-layers", str(layers), "--hidden-size", str(width),
                "--num-attention-heads", str(heads), "--seq-length", str(seq), "--max-position-embeddings", str(seq),
                "--micro-batch-size", "1", "--global-batch-size", "1", "--hidden-dropout", "0",
                "--attention-dropout", "0", "--bf16", "--no-gradient-accumulation-fusion",
                "--tensor-model-parallel-size", "1"]
    if device == "cuda" and os.environ.get("MDS_FUSED_SOFTMAX") == "1":
        build_fused_softmax(torch)
    else:
        sys.argv.append("--no-masked-softmax-fusion")
    if device != "cuda":
        sys.argv.append("--use-cpu-initialization")
    from megatron import global_vars
    from megatron.arguments import core_transformer_config_from_args, parse_args, validate_args

    os.environ["WORLD_SIZE"] = "1"
    args = parse_args()
    with contextlib.redirect_stdout(sys.stderr):
        validate_args(args)
    from megatron.core.enums import ModelType

    args.padded_vocab_size, args.model_type = vocab, ModelType.encoder_or_decoder  # as the tokenizer, pretrain() set
    global_vars.set_args(args)
    if global_vars._GLOBAL_NUM_MICROBATCHES_CALCULATOR is None:  # set_global_variables' first step (the tokenizer's
        global_vars._build_num_microbatches_calculator(args)  # and the writers' are not needed)
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29587")
        dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)
    import megatron.core.tensor_parallel.random as mr
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if device == "cuda":
        mr.model_parallel_cuda_manual_seed(0)
    else:
        mr.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    from megatron.model import GPTModel
    from megatron.model.transformer import CoreAttention

    if not hasattr(CoreAttention, "_strided_views_copied"):
        core_forward = CoreAttention.forward

        def forward(self, query, key, value, attention_mask):
            if query.size(1) > 1:  # the micro-batch (module docstring)
                query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
            return core_forward(self, query, key, value, attention_mask)

        CoreAttention.forward, CoreAttention._strided_views_copied = forward, True

    config = core_transformer_config_from_args(args)
    gpt = GPTModel(config, num_tokentypes=0, parallel_output=True, pre_process=True, post_process=True,
                   return_moe_loss=False).to(device, torch.bfloat16)  # DeepSpeed's engine casts the module so
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from small_work_megatron import mean_loss  # no Megatron-Core import at its top: safe beside this megatron

    return mean_loss(torch, gpt, seq, device)


def ds_bf16_accumulate(torch, model):
    """A function (loss) -> None that runs one micro-batch's backward as DeepSpeed 0.19.8's engine does around a
    BF16_Optimizer (module docstring): zero the bf16 gradients, backward, accumulate each into its fp32 gradient."""
    params = [p for p in model.parameters() if p.requires_grad]
    hp_grads = [torch.zeros(p.shape, dtype=torch.float32, device=p.device).view(-1) for p in params]

    def backward(loss) -> None:
        grads = [p.grad for p in params if p.grad is not None]
        if grads:
            torch._foreach_zero_(grads)
        loss.backward()
        with torch.no_grad():
            for lp, hp_grad in zip(params, hp_grads, strict=True):
                if lp.grad is not None:
                    hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype).view(hp_grad.shape))

    backward.hp_grads = hp_grads  # type: ignore[attr-defined]  # the fp32 gradients, for a test to read
    return backward
