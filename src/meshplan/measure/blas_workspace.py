"""The cuBLAS / cuBLASLt workspaces a CUDA training step holds in PyTorch's caching allocator for its whole length:
bytes that ``torch.cuda.max_memory_allocated`` counts and no traced tensor owns (check-step's peak memory).

PyTorch (aten/src/ATen/cuda/CublasHandlePool.cpp at pytorch/pytorch 26a39059ec58: ``setWorkspaceForHandle``,
``getCUDABlasLtWorkspace``, the behaviour PyTorch 2.11 showed on the H200 below) gives each cuBLAS handle, on its
first GEMM on a stream, a workspace allocated through the CUDA caching allocator and kept in a map keyed by (handle,
stream) until ``clearCublasWorkspaces``. Handles are per thread (``getCurrentCUDABlasHandle``: a thread-local
``PoolWindow`` of ``DeviceThreadHandlePool``, ATen/cuda/detail/DeviceThreadHandles.h). A training step runs GEMMs on
two threads: its forward and optimizer on the caller's, its backward on the autograd engine's thread for the CUDA
device (torch/csrc/autograd/engine.cpp, ``Engine::ready_queue``: "CPU ready queue is per GraphTask, but CUDA device
ready queues are shared across all graph tasks", served by the device threads ``start_device_threads`` makes). So:

    resident = cublas × (threads that run a cuBLAS GEMM) + cublasLt × (threads that run a cuBLASLt GEMM)

- cublas (``parseChosenWorkspaceSize``): ``CUBLAS_WORKSPACE_CONFIG`` ``:SIZE:COUNT`` pairs, Σ SIZE KiB × COUNT;
  default 32 MiB (4096 KiB × 8) on Hopper (sm90; later sources add Blackwell, majors 10 to 12), else
  ``:4096:2:16:8`` = 8 MiB + 128 KiB.
- cublasLt (``parseCUDABlasLtWorkspaceSize``): ``CUBLASLT_WORKSPACE_SIZE`` KiB, default 1024 KiB, a separate
  allocation unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1`` makes it share the cuBLAS one. The Lt path is taken by
  ``addmm`` with a 1-d contiguous bias, β = 1, a float / half / bf16 / double dtype and both matrices larger than
  1 × 1 (aten/src/ATen/native/cuda/Blas.cpp, ``isInputCompliesAddmmCudaLt``): ``nn.Linear`` with a bias. ``mm``
  enters the same function with β = 0 and takes plain cuBLAS.
- Other versions differ: one keys the map by (device, stream), so both threads share one workspace; a later one
  (``TORCH_CUBLAS_WORKSPACE_CACHE``, default off on CUDA) leaves the workspace to cuBLAS's own allocations, outside
  the caching allocator: ``TORCH_CUBLAS_WORKSPACE_CACHE=0`` reads as no resident workspace. Re-check the term when
  a GPU run's PyTorch moves (the test on the committed run below).

Measured (data/measured/gpu/2026-11-26-nvidia-h200-zoo.jsonl.gz, H200, PyTorch 2.11): measured − predicted peak
is 65.00 MiB + 1 to 5 KiB on the four zoo models whose step holds no other unpredicted block (BERT, ViT,
MLP-Mixer, Qwen-MoE): 2 × 32 MiB + 1 MiB.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from meshplan.units import KiB

CALLER_PHASES = ("fwd", "opt")  # the caller's thread; the backward phases run on the engine's device thread
CUBLAS_TARGETS = frozenset(f"aten.{name}.default" for name in (
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_addmm_activation"))
LT_TARGETS = frozenset({"aten.addmm.default", "aten._addmm_activation.default"})
LT_DTYPES = ("float32", "float16", "bfloat16", "float64")
DEFAULT_LT = 1024 * KiB  # CublasHandlePool.cpp: "default size in KiB according to #73328"
TRUE = ("1", "true", "yes", "on")

BlasCall = tuple[str, str, tuple[tuple[int, ...], ...], str]  # target, phase, input shapes, first input's dtype


def cublas_workspace(capability: tuple[int, int], env: Mapping[str, str] | None = None) -> int:
    """Bytes of one cuBLAS handle's workspace on a device of ``capability`` (the module docstring)."""
    config = (env or {}).get("CUBLAS_WORKSPACE_CONFIG")
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * KiB * int(count) for size, count in pairs)
    return 4096 * KiB * 8 if capability[0] in (9, 10, 11, 12) else 4096 * KiB * 2 + 16 * KiB * 8


def cublaslt_workspace(env: Mapping[str, str] | None = None) -> int:
    """Bytes of one cuBLASLt workspace beside the handle's cuBLAS one (0 when unified)."""
    env = env or {}
    if env.get("TORCH_CUBLASLT_UNIFIED_WORKSPACE", "").lower() in TRUE:
        return 0
    try:
        return int(env["CUBLASLT_WORKSPACE_SIZE"]) * KiB
    except (KeyError, ValueError):
        return DEFAULT_LT


def _takes_lt(call: BlasCall) -> bool:
    target, _, shapes, dtype = call
    if target not in LT_TARGETS or len(shapes) < 3 or len(shapes[0]) != 1 or dtype not in LT_DTYPES:
        return False
    return all(len(s) == 2 and min(s) > 1 for s in shapes[1:3])


def resident_workspace(calls: Iterable[BlasCall], capability: tuple[int, int],
                       env: Mapping[str, str] | None = None) -> int:
    """Bytes the step's BLAS handles hold through the caching allocator (the module docstring's formula)."""
    if (env or {}).get("TORCH_CUBLAS_WORKSPACE_CACHE", "").lower() in ("0", "false", "no", "off"):
        return 0
    blas: set[bool] = set()  # True: the caller's thread, False: the engine's
    lt: set[bool] = set()
    for call in calls:
        if call[0] in CUBLAS_TARGETS:
            thread = call[1] in CALLER_PHASES
            blas.add(thread)
            if _takes_lt(call):
                lt.add(thread)
    return len(blas) * cublas_workspace(capability, env) + len(lt) * cublaslt_workspace(env)


def calls_of_ops(ops: Iterable[Any]) -> list[BlasCall]:
    """The BLAS calls of traced ops (trace/graph.TracedOp)."""
    return [(op.target, op.phase, tuple(tuple(t.shape) for t in op.inputs),
             op.inputs[0].dtype if op.inputs else "") for op in ops if op.target in CUBLAS_TARGETS]


def calls_of_records(records: Iterable[Mapping[str, Any]]) -> list[BlasCall]:
    """The BLAS calls of a profile's op records (records.py: inputs as ``"4x128x256:float32"``)."""
    out = []
    for r in records:
        if r.get("record") == "op" and r["target"] in CUBLAS_TARGETS:
            parsed = [t.rsplit(":", 1) for t in r["inputs"]]
            shapes = tuple(tuple(int(d) for d in s.split("x")) if s else () for s, _ in parsed)
            out.append((r["target"], r["phase"], shapes, parsed[0][1] if parsed else ""))
    return out


def capability_of(name: str) -> tuple[int, int] | None:
    """Compute capability of a GPU named in a data file whose machine record predates the field (NVIDIA's CUDA GPU
    list: Hopper H100 / H200 / GH200 9.0, Ampere A100 8.0)."""
    for key, cap in (("H100", (9, 0)), ("H200", (9, 0)), ("GH200", (9, 0)), ("A100", (8, 0))):
        if key in name:
            return cap
    return None


__all__ = ["calls_of_ops", "calls_of_records", "capability_of", "cublas_workspace", "cublaslt_workspace",
           "resident_workspace"]
