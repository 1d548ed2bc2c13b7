"""Hybrid Mamba-2 models served (serve/ops.mamba_ops, serve/memory.state_bytes): each sequence's fixed recurrent
state, the KV cache of the attention layers only, the scan's records as training's, and refusals of the hybrid blocks
serving does not price."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from meshplan.cost.decode import Shape
from meshplan.cost.kv_cache import token_bytes
from meshplan.errors import SpecError
from meshplan.serve import check
from meshplan.serve.engine import load_engine
from meshplan.serve.estimate import serve_estimate
from meshplan.serve.load import arrivals, lengths
from meshplan.serve.load.run import load_run
from meshplan.serve.memory import state_bytes
from meshplan.serve.metrics import Setting
from meshplan.serve.ops import mamba_ops
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import load_system
from meshplan.specs.model_load import load_model

HYBRID = load_model("nemotron-h-8b")  # 24 Mamba-2, 4 attention and 24 MLP blocks
H100 = load_system("h100").cluster(1)


def shape(decode: float, prefill: float, context: float = 1000.0) -> Shape:
    return Shape(tp=1, dpa=1, ep=1, decode=decode, context=context, prefill=prefill, prompts=1.0 if prefill else 0.0,
                 prefix=0.0, w_bytes=2, a_bytes=2, kv_bytes=2)


def test_state_and_kv_per_sequence():
    """Nemotron-H 8B: 24 Mamba layers of 128 heads x 64 channels x state 128 plus a conv state of 3 x (8,192 +
    2·8·128 = 10,240) channels, in 16 bits: 24 · (1,048,576 + 30,720) · 2 = 51.8 MB a sequence, whatever its length;
    its KV cache counts its 4 attention layers only (2 · 4 · 8 · 128 · 2 = 16 KiB a token)."""
    assert HYBRID.block_counts["mamba"] == 24 and HYBRID.num_attention_layers == 4
    assert float(state_bytes(HYBRID, 1)) == 24 * (128 * 64 * 128 + 3 * 10_240) * 2
    assert float(state_bytes(HYBRID, 2)) == float(state_bytes(HYBRID, 1)) / 2
    assert float(token_bytes(HYBRID, 2, 1)) == 2 * 4 * 8 * 128 * 2
    est = serve_estimate(HYBRID, H100, ServePlan(batch=64), Workload(input_len=1000, output_len=200))
    assert est.fits and float(est.memory.sequence) > float(state_bytes(HYBRID, 1))


def test_the_scan_runs_on_prompt_tokens_and_the_state_update_on_decodes():
    """The prefill's chunked scan (2·Q·(Q + N)·P FLOPs per chunk and head: 2 · 128 · 256 · 64 · 8 chunks · 128 heads
    for 1,024 tokens) runs only on prompt tokens; a decoding token updates its state (6 FLOPs per state element,
    128 · 64 · 128 of them) and no scan."""
    ops = {op.name: op for op in mamba_ops(HYBRID, shape(0.0, 1024.0))}
    assert ops["mamba/ssd_scan"].flops == 2 * 128 * 256 * 64 * 8 * 128
    assert ops["mamba/state_update"].flops == 0
    ops = {op.name: op for op in mamba_ops(HYBRID, shape(32.0, 0.0))}
    assert ops["mamba/ssd_scan"].flops == 0 and ops["mamba/state_update"].flops == 6 * 32 * 128 * 64 * 128


def test_decode_steps_grow_less_with_the_context_than_a_transformers():
    """Only 4 of Nemotron-H's 52 layers read a KV cache: from a 1k- to a 32k-token context its decode step at batch
    64 grows less than Llama 3 8B's (32 attention layers)."""
    dense = load_model("llama3-8b")
    grown = []
    for model in (HYBRID, dense):
        cols = {"tp": 1, "pp": 1, "dpa": 1, "ep": 1, "batch": 64, "replicas": 1, "prefill_replicas": 0}
        steps = [float(Setting(model, H100, cols, ServePlan().quant, load_engine("vllm"),
                               Workload(input_len=c, output_len=2)).time(64)) for c in (1000, 32000)]
        grown.append(steps[1] / steps[0])
    assert 1 <= grown[0] < grown[1]


def test_a_hybrid_model_under_load():
    """The request-level simulation serves it too: every request completes and the cache's capacity leaves room
    for the running sequences' states."""
    reqs = arrivals.poisson(10, 200, lengths.Lengths("sharegpt"), seed=2)
    result = load_run(HYBRID, H100, ServePlan(batch=256), reqs, load_engine("vllm"))
    assert result.completed == 200 and np.isfinite(result.tpot[99])


def test_hybrid_blocks_serving_does_not_price_are_refused():
    """A Gated DeltaNet block (Qwen3-Next's "G") is refused with its kind named, and so is a window block."""
    with pytest.raises(SpecError, match="deltanet"):
        check.servable(load_model("qwen3-next-80b-a3b"))
    with pytest.raises(SpecError, match="kind window"):
        check.servable(dataclasses.replace(HYBRID, layer_pattern=HYBRID.layer_pattern.replace("*", "W"),
                                           sliding_window=1024))
