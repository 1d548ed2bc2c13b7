"""Models the sharding planner takes: meshplan's preset modules (parameter counts equal the specs'), and non-
transformers (ViT, ResNet and ConvNeXt from transformers; an MLP-Mixer and a U-Net written here), whose plans fit a
memory limit that forces sharding and whose memory per device is the trace's own liveness analysis
(trace.liveness.peak_memory) of the graph as the plan shards it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshplan import load_model
from meshplan.specs.efficiency import DEFAULT
from meshplan.specs.hardware import load_system

torch = pytest.importorskip("torch")
pytest.importorskip("scipy")
transformers = pytest.importorskip("transformers")

from torch import nn  # noqa: E402

from meshplan.autoshard.blocks import find_blocks  # noqa: E402
from meshplan.autoshard.dataflow import flow  # noqa: E402
from meshplan.autoshard.mesh import device_mesh  # noqa: E402
from meshplan.autoshard.placement import shards  # noqa: E402
from meshplan.autoshard.problem import build  # noqa: E402
from meshplan.autoshard.solve import plan  # noqa: E402
from meshplan.autoshard.torch_models import build as build_preset  # noqa: E402
from meshplan.trace import trace_module  # noqa: E402
from meshplan.trace.graph import Storage, Trace  # noqa: E402
from meshplan.trace.liveness import OPTIMIZER_STATE, peak_memory  # noqa: E402

CLUSTER = load_system("h100").cluster(4)  # one 4-GPU mesh dimension: small programs


@pytest.mark.parametrize("preset", ["llama3-8b", "gpt2", "mistral-7b", "gpt3-175b"])
def test_preset_modules_count_the_specs_parameters(preset):
    spec = replace(load_model(preset), num_layers=2)
    module = build_preset(spec, 2)
    assert sum(p.numel() for p in module.parameters()) == spec.params()  # tied embeddings once


class MixerBlock(nn.Module):
    def __init__(self, tokens: int, dim: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 2 * tokens), nn.GELU(), nn.Linear(2 * tokens, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class Mixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al. 2021) over 16 x 16 patches of a 128 x 128 image."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 256, kernel_size=16, stride=16)
        self.blocks = nn.ModuleList(MixerBlock(64, 256) for _ in range(4))
        self.head = nn.Linear(256, 100)

    def forward(self, x, y):
        x = self.stem(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x.mean(1)), y)


class UNet(nn.Module):
    """A two-level U-Net (Ronneberger et al. 2015): convolutions, pooling, upsampling and skip concatenations."""

    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
        self.down2 = nn.Sequential(nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU())
        self.up = nn.Sequential(nn.Conv2d(192, 64, 3, padding=1), nn.ReLU())
        self.out = nn.Conv2d(64, 1, 1)

    def forward(self, x, y):
        a = self.down1(x)
        b = self.down2(nn.functional.max_pool2d(a, 2))
        u = nn.functional.interpolate(b, scale_factor=2.0, mode="nearest")
        return nn.functional.mse_loss(self.out(self.up(torch.cat([u, a], dim=1))), y)


class Classifier(nn.Module):
    def __init__(self, hf) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, x, y):
        return self.hf(pixel_values=x, labels=y).loss


def _hf(cls, config):
    """Built on the meta device (their initialisers read values), then given fake CPU storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torch.device("meta"):
        model = Classifier(cls(config))
    with FakeTensorMode(allow_non_fake_inputs=True):
        return model.to_empty(device="cpu").train()


def _models():
    image = ((32, 3, 224, 224), "bfloat16")
    labels = ((32,), "int64")
    return {
        "vit": (lambda: _hf(transformers.ViTForImageClassification, transformers.ViTConfig(
            hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024))),
        "resnet": (lambda: _hf(transformers.ResNetForImageClassification, transformers.ResNetConfig(
            embedding_size=32, hidden_sizes=[64, 128, 256, 512], depths=[2, 2, 2, 2], layer_type="basic"))),
        "convnext": (lambda: _hf(transformers.ConvNextForImageClassification, transformers.ConvNextConfig(
            hidden_sizes=[48, 96, 192, 384], depths=[2, 2, 4, 2]))),
        "mlp-mixer": (lambda: Mixer(), [((32, 3, 128, 128), "bfloat16"), labels]),
        "u-net": (lambda: UNet(), [((8, 3, 128, 128), "bfloat16"), ((8, 1, 128, 128), "bfloat16")]),
    }, [image, labels]


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
    makers, default_inputs = _models()
    entry = makers[name]
    make, inputs = (entry[0], entry[1]) if isinstance(entry, tuple) and len(entry) == 2 else (entry, default_inputs)
    trace = trace_module(make(), inputs, param_dtype="bfloat16")
    blocks = find_blocks(trace)
    problem = build(flow(trace, blocks.block_of), blocks, device_mesh(CLUSTER), DEFAULT)
    one_gpu = peak_memory(trace).peak
    limit = 0.6 * one_gpu  # no plan that replicates everything fits
    sharding = plan(problem, limit)
    assert sharding.fits and sharding.memory.peak <= limit
    # two methods: the planner's accounting (memory.py) and trace/liveness.py on the graph as the plan shards it
    assert peak_memory(sharded_trace(sharding)).peak == pytest.approx(sharding.memory.peak, rel=1e-9)
    assert OPTIMIZER_STATE["adam"] == 2.0  # the state both count: Adam's two moments per parameter
