"""Low-precision GEMMs (cost/casts.py): what Transformer Engine and torchao keep of each GEMM's input."""

from __future__ import annotations

from meshplan.cost.layers import dense_layer
from meshplan.specs.model_load import load_model
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack


def test_transformer_engine_keeps_the_fp8_copy_of_each_gemm_input():
    model = load_model("llama3-8b")
    saved = {}
    for name, plan, stack in (("bf16", Plan(), Stack()), ("te_fp8", Plan(precision="fp8"), Stack()),
                              ("torchao_fp8", Plan(precision="fp8"), Stack(cross_entropy="pytorch"))):
        saved[name] = {op.name: op.saved for op in dense_layer(model, plan, stack)
                       if op.kind == "gemm" and op.phase == "fwd"}
    # 8192 tokens × 4096 inputs: 2 bytes kept in bf16, 1 byte as TE's fp8 copy; torchao keeps the bf16 input
    assert saved["bf16"]["attn/qkv"] == 8192 * 4096 * 2
    assert saved["te_fp8"]["attn/qkv"] == 8192 * 4096 * 1
    assert saved["torchao_fp8"] == saved["bf16"]
