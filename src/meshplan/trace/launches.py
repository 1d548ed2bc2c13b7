"""The CUDA kernels an aten op launches on a GPU: one for most, more for the few whose GPU implementation runs
several (``CUDA_EXTRA``), counted from the kernel names torch.profiler recorded under each op on an H200
(data/measured/gpu/2026-11-26-nvidia-h200-kernel-names.json, benchmarks/measure/kernel_names_gpu.py). One table for the
estimate's eager layers (benchmarks/measure/eager_kernels.py counts cost/eager.py's EAGER_KERNELS with it) and the
traced ops the sharding planner and ``trace`` price (trace/cost.py: each op's fixed cost per kernel)."""

from __future__ import annotations

# aten ops that launch more than one CUDA kernel: the pass of each kernel beyond the first ("" the op's own), from the
# kernels torch.profiler recorded under the op on an H200 (data/measured/gpu/2026-11-26-nvidia-h200-kernel-names.json;
# benchmarks/measure/eager_kernels.py counts the estimate's eager layers with it, trace/cost.py prices traced ops with
# it)
_FLASH_BWD = ("", "")  # cuDNN: compute_dot_do_o (dot(o, do)), flash_bprop, convert_dq_to_16bits (the fp32 dq cast);
# FlashAttention-2 alike: flash_bwd_dot_do_o_kernel, flash_bwd_dq_dk_dv_loop_seqk_parallel, flash_bwd_convert_dq_kernel
CUDA_EXTRA: dict[str, tuple[str, ...]] = {
    # layer_norm_grad_input_kernel, then GammaBetaBackwardCUDAKernel (the weight and bias gradients' reduction):
    # ATen/native/cuda/layer_norm_kernel.cu
    "native_layer_norm_backward": ("bwd_w",),
    # ``Tensor tmp = grad * output`` (a mul kernel), then softmax_warp_backward: ATen/native/cuda/SoftMax.cu
    "_softmax_backward_data": ("",),
    # SDPA's flash backward (the CPU's own flash kernel stands for the GPU's cuDNN / FlashAttention-2 one)
    "_scaled_dot_product_flash_attention_for_cpu_backward": _FLASH_BWD,
    "_scaled_dot_product_flash_attention_backward": _FLASH_BWD,
    "_scaled_dot_product_cudnn_attention_backward": _FLASH_BWD,
}


def gpu_kernels(name: str) -> int:
    """CUDA kernels the aten op ``name`` launches on a GPU: one, or more (``CUDA_EXTRA``)."""
    return 1 + len(CUDA_EXTRA.get(name, ()))
