"""meshplan's price of the small-work GPT measured on a lent GPU (benchmarks/measure/small_work_gpu.py's rows): the
stack preset each measured code is priced under, the GPT as a ModelSpec, one step's forward and backward as meshplan
prices it, and a table's per-layer difference of two depths. Shared by docs/SMALL_WORK_GPU.md's generator
(benchmarks/docs/small_work_gpu_doc.py) and the sections it renders from other runs
(benchmarks/docs/deepspeed_engine_doc.py, benchmarks/docs/mds_gpu_doc.py), so that none of those imports another; it
writes nothing.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from meshplan.estimate import estimate
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import TORCH_COMPILE_REGION_HOST, Stack, load_stack

SYSTEM = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100"}
HEAD_DIM = {1024: 64, 2048: 128}


@cache
def stacks() -> dict[str, tuple[str, Stack]]:
    """The preset each measured code is priced under, as meshplan's options would say it."""
    eager = replace(load_stack("pytorch-fsdp"), fsdp="none")
    from meshplan_validation.sources import MEGATRON_2021

    megatron = replace(MEGATRON_2021, fusion="eager")
    compiled = replace(load_stack("torchtitan"), fsdp="none", fusion="fused", compiled=True,
                       region_host=TORCH_COMPILE_REGION_HOST)
    return {"pytorch": ("`--framework pytorch-fsdp`, no FSDP on one GPU", eager),
            "compiled": ("`--framework torchtitan` as `estimate --from` reads a job TOML with [compile] enable "
                         "(configs/torchtitan.py), no FSDP on one GPU", compiled),
            "mds": ("`--framework megatron-deepspeed` with `--fusion eager` (its TorchScript functions run op by op "
                    "on PyTorch 2.2 and later, as the preset says; its masked-softmax kernel not built: the torch "
                    "path), no optimizer wrapper (the measured passes ran none: DeepSpeed's BF16_Optimizer is priced "
                    "against its own timing below)",
                    replace(load_stack("megatron-deepspeed"), fusion="eager", optimizer_wrapper="stated")),
            "mds-fused": ("`--framework megatron-deepspeed` as the preset is (fusion jit: its scale-mask-softmax "
                          "kernel built, as in the run; its TorchScript functions ran under PyTorch 2.11's NNC "
                          "fuser), no optimizer wrapper, as the measured passes ran",
                          replace(load_stack("megatron-deepspeed"), optimizer_wrapper="stated")),
            "megatron": ("validation's `megatron-lm-2021` stack (the one Megatron-LM 2020-22 and Megatron-DeepSpeed "
                         "runs are priced under: unfused attention), its element-wise kernels eager", megatron)}


def model_of(row: dict):
    """The GPT of small_work_gpu.py as a ModelSpec (GPT-2's preset at the row's shape: learned positions, LayerNorm,
    GeLU, biases, tied head; no dropout)."""
    width = row["width"]
    heads = width // HEAD_DIM[width]
    return replace(load_model("gpt2"), num_layers=row["layers"], hidden_size=width, num_heads=heads,
                   num_kv_heads=heads, ffn_hidden_size=4 * width, vocab_size=50304, seq_length=row["seq"],
                   max_position_embeddings=row["seq"], dropout=False)


def predicted(row: dict, stack: Stack, gpu: str) -> float:
    """meshplan's forward + backward time of one step of the row (its step less the optimizer)."""
    plan = Plan(micro_batch=row["batch"], global_batch=row["batch"], zero=0, recompute="none")
    e = estimate(model_of(row), load_system(SYSTEM[gpu]).cluster(1), plan, stack)
    return e.step_time - e.breakdown.get("optimizer", 0.0)


def per_layer(rows: list[dict], key) -> dict[tuple[int, int], float]:
    """(width, batch) → seconds per layer per micro-batch: the difference of the two depths over the layers between."""
    by = {(r["width"], r["layers"], r["batch"]): r for r in rows}
    depths = sorted({r["layers"] for r in rows})
    lo, hi = depths[0], depths[-1]
    return {(w, b): (key(by[(w, hi, b)]) - key(by[(w, lo, b)])) / (hi - lo)
            for (w, d, b) in by if d == hi and (w, lo, b) in by}
