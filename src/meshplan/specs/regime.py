"""The regime of a plan: which measured runs it is like, for its error band (specs/bands.py; issue 79).

A band is only as good as the runs behind it, and meshplan's errors differ far more between regimes than between
the runs of one regime: a GEMM of a few microseconds leaves the step to the host that issues it and to each kernel's
fixed cost, where a GEMM of milliseconds leaves it to the tensor cores; an engine of 2024 and one of 2026 run the same
batch with different host loops. So a plan's regime is read off the plan itself, on the axes along which the measured
errors differ, and its band comes from the out-of-source errors of the measured runs of its regime
(benchmarks/docs/error_bands.py):

- ``gpu``: the GPU architecture (``Accelerator.architecture``: volta, ampere, hopper, blackwell, cdna3 ...), with
  ``/slow-host`` where the host CPU takes at least twice a DGX x86 host's time for PyTorch's Python-side work
  (``Cluster.python_host``: the Grace-hosted GH200, GB200 and GB300 presets, 2.46-2.75);
- ``stack``: the software stack (its preset's or profile's name) and ``family``, the framework family it belongs to
  (``Stack.family``: megatron, deepspeed, pytorch; the stack's own name where it names none): runs of one stack share
  its kernels and host loop, runs of one family most of them; serving: ``engine``, the engine preset, whose name
  carries its version (vllm-v0.5, vllm-v0, vllm ...);
- ``kind``: dense, moe (the model has routed experts) or hybrid (Mamba / linear-attention layers); ``size``, the
  parameters each token uses (``ModelSpec.params(active=True)``): ``small`` below 10 B, ``medium`` below 100 B,
  ``large`` beyond (a 405B model's kernels, memory pressure and parallel layouts are another regime than a 70B's,
  and a fine-grained MoE of 3 B active parameters another than one of 17 B);
- ``scale``: ``node`` where the job fits its NVLink domain (the mesh's tier 0), ``cluster`` beyond it;
- ``work``: ``small`` where one h x h GEMM of a micro-batch's tokens on one tensor-parallel rank takes less than
  ``SMALL_WORK`` at the GPU's 16-bit peak, ``large`` otherwise. 50 µs is what an eager stack's host spends issuing one
  kernel (presets/stacks/megatron-deepspeed.toml ``host_dispatch``; PyTorch's eager dispatcher 12-25 µs,
  presets/stacks/pytorch-fsdp.toml): below it the host and each kernel's fixed costs weigh as much as the math, which
  is the regime docs/ACCURACY.md's small-work sections read worst. ``tiny`` where that GEMM takes less than
  ``TINY_WORK``, a tenth of ``SMALL_WORK``: the GPU idles through nine tenths of each launch gap or more, so even a
  layer's few largest kernels end well before the host issues the next and the step is the host's loop alone, where
  between the two levels the GPU's and the host's time are of one order and how far they overlap (an empty queue, a
  lead carried from the pass before: data/measured/2026-11-30-vtrain-failing-cells.md, point 2) sets the step
  (vTrain's released cells: data/measured/2026-11-30-vtrain-tiny-work.md; the round tenth was chosen with those cells
  in view, and only a threshold of 3.5-6.9 µs makes both of their halves sharp); serving's ``work`` is ``small`` where
  streaming a GPU's share of the weights takes less than ``SMALL_DECODE`` at its HBM bandwidth, the least a decode
  step takes: below it an engine's host work per iteration (1-4 ms: presets/engines/*.toml ``iteration_overhead``;
  the vLLM team measured GPU execution at 38 % of Llama 3 8B's serving time on an H100 before v0.6.0,
  serve/engine.py) is a tenth of the step or more;
- serving's ``gpus``: ``1`` where an instance runs on one GPU, ``many`` where it spans several (its collectives, the
  engine's all-reduce kernels and its per-rank host loop join the step); ``mix``: ``prefill`` where the requests'
  prompts are more than ``PREFILL_HEAVY`` times their outputs (the step is the prompts' compute-bound GEMMs), else
  ``decode`` (the weights' and the KV cache's streaming);
- serving's ``batch``: ``1`` (one sequence at a time), ``static`` (a fixed batch of up to ``SMALL_BATCH``
  sequences), ``static-large`` (a larger fixed batch: its prompts' prefill and its KV-cache footprint weigh as a
  saturated engine's do, where a small batch's steps are the weights' streaming and the host's), ``saturated`` (as
  many sequences as fit, offline or all at once) or ``load`` (requests offered at a rate).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

SMALL_WORK = 50e-6  # seconds: one micro-batch GEMM below this at the 16-bit peak is small work (module docstring)
TINY_WORK = SMALL_WORK / 10  # seconds: a tenth of it is tiny work, the step the host's loop (module docstring)
SMALL_DECODE = 10e-3  # seconds: a GPU's share of the weights streamed in less is small serving work
SMALL_BATCH = 16  # sequences: a larger static batch is its own serving regime
PREFILL_HEAVY = 4  # prompt tokens per output token beyond which a serving workload is its prompts' compute
SLOW_HOST = 2.0  # Cluster.python_host at and beyond which the host is a regime of its own

_SIZES = ((10e9, "small"), (100e9, "medium"))  # active parameters below which a model is of that size; else large

TRAINING_AXES = ("gpu", "stack", "family", "kind", "size", "scale", "work")
SERVING_AXES = ("gpu", "engine", "kind", "size", "gpus", "mix", "work", "batch")


def gpu_key(cluster: Any) -> str:
    """``gpu``: the architecture, marked where its host is slow (module docstring)."""
    arch = cluster.accelerator.architecture or "unstated"
    return f"{arch}/slow-host" if cluster.python_host >= SLOW_HOST else arch


def model_kind(model: Any) -> str:
    return "hybrid" if model.is_hybrid else "moe" if model.is_moe else "dense"


@lru_cache(maxsize=256)
def model_size(model: Any) -> str:
    """The size class of a model by its active parameters (cached: a search quotes the band of every plan it lists,
    and counting a 70B model's parameters layer by layer takes a millisecond)."""
    active = model.params(active=True)
    return next((name for limit, name in _SIZES if active < limit), "large")


def gemm_seconds(model: Any, cluster: Any, plan: Any) -> float:
    """One h x h GEMM of a micro-batch's tokens on one tensor-parallel (and context-parallel) rank at the GPU's
    16-bit peak: 2 · (micro_batch · seq / cp) · h · h / tp FLOPs."""
    tokens = plan.micro_batch * model.seq_length / max(plan.cp, 1)
    tp = max(plan.tp * plan.tp2, 1)
    peak = cluster.accelerator.half_flops or 1.0
    return 2.0 * tokens * model.hidden_size * model.hidden_size / tp / peak


def training_regime(model: Any, cluster: Any, plan: Any, stack: Any) -> dict[str, str]:
    """The regime of a training plan on the ``TRAINING_AXES`` (module docstring)."""
    domain = cluster.tiers[0].size if cluster.tiers else cluster.num_gpus
    return {"gpu": gpu_key(cluster), "stack": stack.name, "family": stack.family or stack.name,
            "kind": model_kind(model), "size": model_size(model),
            "scale": "node" if cluster.num_gpus <= domain else "cluster",
            "work": training_work(gemm_seconds(model, cluster, plan))}


def training_work(gemm: float) -> str:
    """``work`` of a training plan whose micro-batch h x h GEMM takes ``gemm`` seconds at the 16-bit peak."""
    return "tiny" if gemm < TINY_WORK else "small" if gemm < SMALL_WORK else "large"


def serving_batch(mode: str, batch: float) -> str:
    """``batch`` of a serving run driven in ``mode`` (static, offline, closed, decode, prefill, rate) holding
    ``batch`` sequences."""
    if mode == "rate":
        return "load"
    if batch <= 1:
        return "1"
    if mode == "static":
        return "static" if batch <= SMALL_BATCH else "static-large"
    return "saturated"


@dataclass(frozen=True)
class Served:
    """What a serving regime reads of a configuration beyond its model, GPUs and engine."""

    mode: str  # how it is driven: static, offline, closed, decode, prefill, rate
    batch: float  # sequences in flight
    weights: float  # bytes of weights on one GPU
    input_len: int
    output_len: int
    gpus: int  # GPUs of one instance


def serving_regime(model: Any, cluster: Any, engine: Any, served: Served) -> dict[str, str]:
    """The regime of a serving configuration on the ``SERVING_AXES`` (module docstring)."""
    streamed = served.weights / cluster.accelerator.hbm_bandwidth
    mix = "prefill" if served.input_len > PREFILL_HEAVY * max(served.output_len, 1) else "decode"
    return {"gpu": gpu_key(cluster), "engine": engine.name, "kind": model_kind(model), "size": model_size(model),
            "gpus": "1" if served.gpus <= 1 else "many", "mix": mix,
            "work": "small" if streamed < SMALL_DECODE else "large", "batch": serving_batch(served.mode, served.batch)}
