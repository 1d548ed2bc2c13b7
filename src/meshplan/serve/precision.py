"""Number formats of inference: the bytes of quantised weights, activations and KV cache, and the precision a GEMM
computes in.

A quantisation scheme is three formats: the weights', the activations' (which sets the tensor-core rate) and the KV
cache's. Weight-only quantisation (W4A16 AWQ / GPTQ with the Marlin kernels, W8A16) reads fewer weight bytes but
dequantises them in the kernel and multiplies at the activations' 16-bit rate (Frantar et al. 2024, "MARLIN: Mixed-
Precision Auto-Regressive Parallel Inference on Large Language Models", §3: int4 weights, fp16 tensor-core math);
W8A8 (fp8 or int8 SmoothQuant, Xiao et al. 2023) and W4A4 (NVFP4) run the GEMM at the low-precision rate.

Bytes per element, scales included:
- bf16 / fp16 2; fp8 (E4M3, per-tensor or per-channel scales) and int8 1;
- int4 with one fp16 scale and one 4-bit zero per group of 128 weights (AWQ, Lin et al. 2024 §3 / GPTQ's default
  group size 128, as the Marlin kernel stores them): 0.5 + (2 + 0.5) / 128;
- fp4 as NVFP4 (4 bits and one E4M3 scale per 16 elements) and mxfp4 (OCP Microscaling v1.0: 4 bits and one E8M0
  scale per 32, the format GPT-OSS ships its experts in): records.LOW_PRECISION_BYTES and 0.5 + 1/32.

Compute precision of a GEMM (``gemm_precision``): the activations' format where the tensor cores take it (fp8 and
fp4 as the hardware presets' peaks; int8 at the fp8 rate where the GPU has fp8 units, as the H100 and B200
datasheets give INT8 TOPS equal to FP8 TFLOPS, and at twice the 16-bit rate on Ampere and Ada, A100 datasheet: INT8
624 TOPS against BF16 312), else 16 bits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from meshplan.cost.records import LOW_PRECISION_BYTES
from meshplan.errors import SpecError
from meshplan.specs.hardware import Accelerator

BYTES: dict[str, float] = {
    "bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int8": 1.0,
    "int4": 0.5 + (2 + 0.5) / 128,  # AWQ / GPTQ group 128: an fp16 scale and a 4-bit zero per group
    "fp4": LOW_PRECISION_BYTES["fp4"],  # NVFP4: an E4M3 scale per 16
    "mxfp4": 0.5 + 1.0 / 32,  # OCP MX: an E8M0 scale per 32
}
WEIGHT_FORMATS = ("bf16", "fp16", "fp8", "int8", "int4", "fp4", "mxfp4")
ACTIVATION_FORMATS = ("bf16", "fp16", "fp8", "int8", "fp4")
KV_FORMATS = ("bf16", "fp16", "fp8", "int8", "fp4")
# GPU architectures whose tensor cores take int8 at twice the 16-bit rate (Turing, Ampere, Ada whitepapers; A100
# datasheet INT8 624 TOPS vs BF16 312); Hopper and Blackwell: at the fp8 rate (datasheets)
INT8_DOUBLE = ("turing", "ampere", "ada")


@dataclass(frozen=True, kw_only=True)
class Quant:
    """A quantisation scheme: the formats of the weights (of the transformer blocks' linears: the embedding and LM
    head stay 16-bit, as vLLM's fp8 and AWQ / GPTQ methods leave them), the activations and the KV cache."""

    weights: str = "bf16"
    activations: str = "bf16"
    kv_cache: str = "bf16"

    def __post_init__(self) -> None:
        for name, allowed in (("weights", WEIGHT_FORMATS), ("activations", ACTIVATION_FORMATS),
                              ("kv_cache", KV_FORMATS)):
            value = getattr(self, name)
            if value not in allowed:
                raise SpecError(f"{name}={value!r} must be one of {', '.join(allowed)}")
        if BYTES[self.activations] > BYTES[self.weights] and self.activations not in ("bf16", "fp16"):
            raise SpecError(f"activations={self.activations} are wider than weights={self.weights}: no kernel "
                            "multiplies them (weight-only schemes keep 16-bit activations)")

    @property
    def label(self) -> str:
        """``weights/activations/kv_cache``, the form ``parse_quant`` reads back."""
        return f"{self.weights}/{self.activations}/{self.kv_cache}"

    @property
    def weight_bytes(self) -> float:
        return BYTES[self.weights]

    @property
    def act_bytes(self) -> float:
        """Bytes of an activation a GEMM reads (its input, quantised) or writes (16 bits: outputs are 16-bit)."""
        return BYTES[self.activations]

    @property
    def kv_bytes(self) -> float:
        return BYTES[self.kv_cache]

    def with_(self, **changes: str) -> Quant:
        return replace(self, **changes)


def parse_quant(text: str, half: str = "bf16") -> Quant:
    """``fp8`` (weights and activations fp8, KV 16-bit), ``fp8/fp8/fp8``, ``int4/bf16/fp8`` (weights / activations /
    KV cache): the command line's form. The 16-bit parts a single format leaves unsaid are ``half`` (fp16 on a GPU
    without bf16: ``half_formats``)."""
    parts = [p.strip() for p in text.split("/")]
    try:
        if len(parts) == 1:
            w = parts[0]
            a = w if w in ACTIVATION_FORMATS and w != "int4" else half
            return Quant(weights=w, activations=a, kv_cache=half)
        if len(parts) == 3:
            return Quant(weights=parts[0], activations=parts[1], kv_cache=parts[2])
    except SpecError as exc:  # name the option the user wrote, then the part of it that is wrong
        raise SpecError(f"quant: {exc}") from None
    raise SpecError(f"quant={text!r} must be a format (fp8) or weights/activations/kv (int4/bf16/fp8)")


def gemm_precision(acc: Accelerator, quant: Quant) -> str:
    """The precision whose peak prices the block GEMMs (module docstring); "" when the GPU cannot multiply in the
    activations' format (fp8 activations on an A100)."""
    a = quant.activations
    if a in ("bf16", "fp16"):
        return acc.default_precision
    if a == "int8":
        if "fp8" in acc.peak_flops or acc.architecture in INT8_DOUBLE:
            return "fp8"
        return ""
    return a if a in acc.peak_flops else ""


def half_formats(acc: Accelerator) -> tuple[str, ...]:
    """The 16-bit formats the GPU computes in: bf16 and fp16 where it has a bf16 peak (every NVIDIA GPU since
    Ampere has both at one rate), fp16 alone on a GPU without bf16 (Volta: V100 datasheet, FP16 tensor cores only),
    as ``estimate --precision`` accepts them (specs/check.py)."""
    return ("bf16", "fp16") if "bf16" in acc.peak_flops else ("fp16",)


def unsupported(acc: Accelerator, quant: Quant) -> str:
    """Why ``acc`` cannot run ``quant`` ("" when it can): a 16-bit format it lacks in any part (bf16 on a V100: vLLM
    refuses bfloat16 below compute capability 8.0 and serves such a GPU in float16), or activations its tensor cores
    do not take (``gemm_precision``)."""
    halves = half_formats(acc)
    for part in (quant.weights, quant.activations, quant.kv_cache):
        if part in ("bf16", "fp16") and part not in halves:
            return f"the {acc.name} has no {part}"
    if not gemm_precision(compute_accelerator(acc, quant), quant):
        return f"the {acc.name} has no tensor cores for {quant.activations} activations"
    return ""


def formats_run(acc: Accelerator) -> str:
    """The activation formats ``acc`` multiplies in, for an error line."""
    half = half_formats(acc)[0]
    return ", ".join(a for a in ACTIVATION_FORMATS if not unsupported(acc, Quant(weights=a, activations=a,
                                                                                 kv_cache=half)))


def native(acc: Accelerator, quant: Quant) -> Quant:
    """``quant`` with its 16-bit parts in the GPU's own 16-bit format (bf16 -> fp16 on a V100): the same bytes and
    the same tensor-core rate, the format an engine serves there."""
    halves = half_formats(acc)
    return Quant(**{k: halves[0] if v in ("bf16", "fp16") and v not in halves else v
                    for k, v in (("weights", quant.weights), ("activations", quant.activations),
                                 ("kv_cache", quant.kv_cache))})


@lru_cache(maxsize=64)
def compute_accelerator(acc: Accelerator, quant: Quant) -> Accelerator:
    """The accelerator as the GEMMs see it: for int8 activations on a GPU without fp8 units (Ampere, Ada), its
    int8 tensor-core rate (twice the 16-bit peak, at the 16-bit GEMM efficiency) stands in the fp8 slot."""
    if quant.activations == "int8" and "fp8" not in acc.peak_flops and acc.architecture in INT8_DOUBLE:
        return replace(acc, peak_flops={**acc.peak_flops, "fp8": 2 * acc.half_flops},
                       matmul_fp8=acc.matmul_bf16 or acc.matmul_fp8)
    return acc
