"""Models the sharding planner takes: meshplan's preset modules (parameter counts equal the specs'), and non-
transformers (ViT, ResNet and ConvNeXt from transformers; an MLP-Mixer and a U-Net written here), whose plans fit a
memory limit that forces sharding and whose memory per device is the trace's own liveness analysis
(trace.liveness.peak_memory) of the graph as the plan shards it."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan import load_model
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")
transformers = pytest.importorskip("transformers")

from meshplan.autoshard.blocks import find_blocks  # noqa: E402
from meshplan.autoshard.dataflow import flow  # noqa: E402
from meshplan.autoshard.mesh import device_mesh  # noqa: E402
from meshplan.autoshard.placement import shards  # noqa: E402
from meshplan.autoshard.problem import build_problem  # noqa: E402
from meshplan.autoshard.solve import plan  # noqa: E402
from meshplan.autoshard.torch_models import build_preset  # noqa: E402
from meshplan.trace import trace_module  # noqa: E402
from meshplan.trace.graph import Storage, Trace  # noqa: E402
from meshplan.trace.liveness import optimizer_per_byte, peak_memory  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))
from vision_models import MODELS  # noqa: E402  (benchmarks/measure/: docs/AUTOSHARD.md's models too)

CLUSTER = load_system("h100").cluster(4)  # one 4-GPU mesh dimension: small programs


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt2", "mistral-7b", "gpt3-175b"])
def test_preset_modules_count_the_specs_parameters(preset):
    spec = replace(load_model(preset), num_layers=2)
    module = build_preset(spec, 2)
    assert sum(p.numel() for p in module.parameters()) == spec.params()  # tied embeddings once


def sharded_trace(sharding) -> Trace:
    """The trace with every storage at the bytes one device holds under the plan, read from the placements of the
    tensors that create them (parameters and their gradients at the parameter's)."""
    problem, choice = sharding.problem, sharding.choice
    trace, sizes = problem.flow.trace, problem.mesh.sizes
    n = len(trace.ops)
    held: dict[int, float] = {}
    for op in trace.ops:
        twin = problem.template[op.index]
        node = problem.nodes[problem.template[problem.flow.owners[twin]]]
        for slot, t in enumerate(op.outputs):
            if trace.storages[t.storage].created == op.index:
                held[t.storage] = trace.storages[t.storage].nbytes / shards(node.outs[choice[node.key]][(twin, slot)],
                                                                             sizes)
    for number, src in enumerate(problem.flow.sources):
        key = problem.template[n + number]
        held[src.storage] = trace.storages[src.storage].nbytes / shards(
            problem.nodes[key].outs[choice[key]][(key, 0)], sizes)
    for param, grad in trace.grad_of.items():
        held[grad] = held[param] * trace.storages[grad].nbytes / trace.storages[param].nbytes
    storages = {sid: Storage(id=sid, nbytes=held.get(sid, s.nbytes), role=s.role, created=s.created)
                for sid, s in trace.storages.items()}
    param_bytes = sum(storages[sid].nbytes for sid, s in trace.storages.items() if s.role == "param")
    return replace(trace, storages=storages, param_bytes=param_bytes)


@pytest.mark.parametrize("name", ["vit", "resnet", "convnext", "mlp-mixer", "u-net"])
def test_non_transformer_plans_fit_and_their_memory_is_the_traced_liveness(name):
    make, inputs = MODELS[name]
    trace = trace_module(make(), inputs, param_dtype="bfloat16")
    blocks = find_blocks(trace)
    problem = build_problem(flow(trace, blocks.block_of), blocks, device_mesh(CLUSTER), DEFAULT)
    one_gpu = peak_memory(trace).peak
    limit = 0.6 * one_gpu  # no plan that replicates everything fits
    sharding = plan(problem, limit)
    assert sharding.fits and sharding.memory.peak <= limit
    # two methods: the planner's accounting (memory.py) and trace/liveness.py on the graph as the plan shards it
    assert peak_memory(sharded_trace(sharding)).peak == pytest.approx(sharding.memory.peak, rel=1e-9)
    # the state both count: mixed-precision Adam beside bf16 parameters, fp32 master and moments 12 bytes = 6 x 2
    assert optimizer_per_byte(trace, "adam")[0] == 12 / 2
