"""Kernel-level checks of the efficiency model against published benchmarks it was not fitted on.

The three fitted constants (``efficiency.FITTED``) come from whole training steps; these rows time single kernels
that someone else measured, so an error here is the efficiency model's own, without the rest of a step around it.

- Transformer Engine's GEMM profiling tutorial (NVIDIA/TransformerEngine docs/examples/gemm_profiling/
  gemm_profiling.rst, "Autocast vs Pre-quantized", B300 SXM6): the 12 GEMMs (forward, data and weight gradient of
  QKV, attention output, MLP up and down) of one layer of a 5B model, hidden 4096, FFN 16384 (GeLU), 32 heads,
  31 x 512 = 15,872 tokens, with pre-quantized operands: 13.102 ms in BF16 and 6.812 ms in FP8 (current scaling).
  (Its MXFP8 and NVFP4 times are where ``block_scaled`` and ``nvfp4_gemm`` come from, so they are not checks.)

Run: python benchmarks/kernel_checks.py
"""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.efficiency import DEFAULT
from meshplan.hardware import load_system
from meshplan.model import ModelSpec
from meshplan.ops import dense_layer
from meshplan.plan import Plan
from meshplan.roofline import op_time

TE_TUTORIAL = "Transformer Engine GEMM profiling tutorial, B300, pre-quantized"
TE_5B = ModelSpec(name="te-gemm-profiling-5b", num_layers=24, hidden_size=4096, num_heads=32, ffn_hidden_size=16384,
                  vocab_size=32000, seq_length=512, mlp="gelu")
TE_TOKENS_PER_GEMM = 31 * 512


@dataclass(frozen=True)
class Check:
    what: str
    source: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1


def layer_gemm_seconds(system: str, precision: str) -> float:
    """The 12 GEMMs of one layer of the tutorial's 5B model (31 sequences of 512 tokens) on ``system``."""
    acc = load_system(system).accelerator
    plan = Plan(micro_batch=31, global_batch=31, precision=precision)
    return sum(float(op_time(op, acc, precision, DEFAULT)) for op in dense_layer(TE_5B, plan) if op.kind == "gemm")


def checks() -> list[Check]:
    return [Check(f"5B layer, 12 GEMMs, {label}", TE_TUTORIAL, measured_ms * 1e-3, layer_gemm_seconds("b300", prec))
            for label, prec, measured_ms in (("BF16", "bf16", 13.102), ("FP8", "fp8", 6.812))]


def table() -> list[str]:
    lines = ["| kernel | source | measured | meshplan | error |", "|---|---|---:|---:|---:|"]
    lines += [f"| {c.what} | {c.source} | {c.measured_s * 1e3:.2f} ms | {c.predicted_s * 1e3:.2f} ms | "
              f"{c.error * 100:+.1f}% |" for c in checks()]
    return lines


if __name__ == "__main__":
    print("\n".join(table()))
