"""A model whose head is heavy, for the pipeline stages' tests and docs/AUTOSHARD.md (benchmarks/docs/autoshard.py): 8
small layers (h = 1024, a 4h MLP each) and a 262,144-word embedding and head, whose GEMM is 8 layers' worth."""

from __future__ import annotations

import torch


class Block(torch.nn.Module):
    def __init__(self, h: int) -> None:
        super().__init__()
        self.norm, self.up, self.down = torch.nn.LayerNorm(h), torch.nn.Linear(h, 4 * h), torch.nn.Linear(4 * h, h)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class HeavyHead(torch.nn.Module):
    def __init__(self, h: int = 1024, layers: int = 8, vocab: int = 262144, tied: bool = False) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, h)
        self.layers = torch.nn.ModuleList(Block(h) for _ in range(layers))
        self.head = torch.nn.Linear(h, vocab, bias=False)
        if tied:  # the head reads the embedding's weight (GPT-2's wte / lm_head)
            self.head.weight = self.embed.weight

    def forward(self, ids):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return torch.nn.functional.cross_entropy(self.head(x).flatten(0, 1).float(), ids.flatten())


def heavy_head_plans(gpus: int = 32, micro_batches: int = 8, tokens: tuple[int, int] = (8, 512)):
    """(the planner's pipelines: the DP's best over every sub-mesh size, and the best of equal sub-meshes by size)
    for the model on ``gpus`` H100 in ``micro_batches`` micro-batches of ``tokens`` (sequences, length)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshplan.autoshard.blocks import find_blocks
    from meshplan.autoshard.dataflow import flow
    from meshplan.autoshard.planner import stage_plans, sub_mesh_options
    from meshplan.autoshard.stage_dp import slice_stages
    from meshplan.autoshard.stages import price_slicing
    from meshplan.specs.hardware import load_system
    from meshplan.trace import trace_module

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = HeavyHead()
    trace = trace_module(model, [(tokens, "int64")], param_dtype="bfloat16")
    blocks = find_blocks(trace)
    cluster = load_system("h100").cluster(gpus)
    limit, layers = cluster.accelerator.hbm_bytes, blocks.groups[0].layers
    plans = stage_plans(flow(trace, blocks.block_of), blocks, cluster, micro_batches=micro_batches)
    every = sub_mesh_options(plans)

    def best(subset):
        found = [price_slicing(s, plans, micro_batches, limit, cluster)
                 for s in slice_stages(subset, layers, gpus, micro_batches, limit).values()]
        return min(found, key=lambda p: p.step_time) if found else None

    equal = {n: best([o for o in every if o.devices == n]) for n in sorted({o.devices for o in every})}
    return best(every), {n: p for n, p in equal.items() if p is not None}
