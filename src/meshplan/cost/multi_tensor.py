"""Kernel launches of one multi-tensor apply (issue 79, item 3): the fused optimizers and their mixed-precision wrappers
update, scale, copy and norm every parameter tensor with a few kernels, not one kernel (and one host call) a tensor.

apex's ``multi_tensor_applier`` (NVIDIA/apex apex/multi_tensor_apply/__init__.py at 2386a912, the commit vTrain's
Dockerfile installs: ``MultiTensorApply(2048*32)``) cuts each tensor into chunks of ``CHUNK`` = 65,536 elements and
packs them, tensor after tensor, into launches of at most ``MAX_BLOCKS`` = 320 chunks (one CUDA block each) and at most
``MAX_TENSORS[depth]`` tensors, ``depth`` the lists it walks together (the gradient norm 1, a scale or copy 2, Adam 4:
gradient, weight, exp_avg, exp_avg_sq): csrc/multi_tensor_apply.cuh ``depth_to_max_tensors = {110, 64, 48, 36, 30,
24}``, ``depth_to_max_blocks = {320, ...}``. A launch goes out when the tensor slots are full at a tensor's last
chunk, when the blocks are full, or at the last chunk; a tensor cut by a full launch carries over as the next launch's
first tensor. PyTorch's own ``_foreach`` kernels (aten/src/ATen/native/cuda/MultiTensorApply.cuh, the foreach unscale
of Megatron's fp16 optimizer) pack alike, with the same 65,536-element chunks and 320 blocks (110 / 64 / 48 / 36 / 30
tensors at depth 1-5). ``multi_tensor_launches`` replays that packing exactly.
"""

from __future__ import annotations

from collections.abc import Iterable

CHUNK = 2048 * 32  # elements per chunk (one CUDA block): apex multi_tensor_applier
MAX_BLOCKS = 320  # chunks per launch: depth_to_max_blocks
MAX_TENSORS = {1: 110, 2: 64, 3: 48, 4: 36, 5: 30, 6: 24}  # tensors per launch by list depth: depth_to_max_tensors


def multi_tensor_launches(numels: Iterable[int], depth: int) -> int:
    """Kernel launches of one multi-tensor apply over tensors of ``numels`` elements walking ``depth`` lists together
    (module docstring): multi_tensor_apply.cuh's packing, replayed one tensor at a time (its whole chunks at once)."""
    if depth not in MAX_TENSORS:
        raise ValueError(f"depth={depth}: multi-tensor apply walks 1-6 lists together")
    most = MAX_TENSORS[depth]
    count = blocks = slots = 0
    for numel in numels:
        chunks = -(-int(numel) // CHUNK)
        if chunks <= 0:
            continue
        slots += 1
        full, blocks = divmod(blocks + chunks, MAX_BLOCKS)  # launches on full blocks inside this tensor
        count += full
        if full and blocks:  # cut inside the tensor: it carries over as the next launch's first tensor
            slots = 1
        elif full:  # the last full launch ended at its last chunk: nothing carries over
            slots = 0
        if slots == most:  # tensor slots full at its last chunk
            count, blocks, slots = count + 1, 0, 0
    return count + (blocks > 0)
