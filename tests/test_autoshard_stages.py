"""Pipeline stages over sub-meshes of their own shapes (issue 37, item 3): Alpa's DP (stage_dp.py) against a brute
force over every covering, the sub-mesh sizes aligned to the tiers, memory with the micro-batches in flight, and the
planner's pipelines on a model with a heavy head, where unequal sub-meshes beat every equal slicing."""

from __future__ import annotations

import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshplan.autoshard.stage_dp import Option, fits_at, sizes, slice_stages
from meshplan.specs.hardware import load_system

H100 = load_system("h100")
# benchmarks/measure/pipeline_models.py: docs/AUTOSHARD.md's models too
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "measure"))


def _options(gpus: int, layer, post) -> list[Option]:
    return [Option(devices=n, shape=s, layer=layer(n), pre=0.0, post=post(n), state=0.0, saved=0.0, base=0.0)
            for n, s in sizes(H100.cluster(gpus)).items()]


def _brute(options: list[Option], layers: int, gpus: int, micro_batches: int) -> dict[int, float]:
    """Every ordered covering of the GPUs by aligned sub-meshes, every split of the layers: the best latency per p."""
    best: dict[int, float] = {}

    def coverings(offset: int, chosen: tuple):
        if offset == gpus:
            yield chosen
            return
        for o in options:
            if offset + o.devices <= gpus and fits_at(offset, o.devices):
                yield from coverings(offset + o.devices, (*chosen, o))

    for stages in coverings(0, ()):
        p = len(stages)
        if not 2 <= p <= min(micro_batches, layers):
            continue
        for split in itertools.product(range(1, layers + 1), repeat=p):
            if sum(split) == layers:
                t = [c * o.layer + (i == p - 1) * o.post for i, (o, c) in enumerate(zip(stages, split, strict=True))]
                best[p] = min(best.get(p, float("inf")), sum(t) + (micro_batches - 1) * max(t))
    return best


def test_sub_mesh_sizes_follow_the_tiers():
    """8 x 8 H100 (NVLink domains of 8): divisors of 8 inside a node, then 2, 4 and 8 whole nodes."""
    assert sizes(H100.cluster(64)) == {1: (1,), 2: (2,), 4: (4,), 8: (8,), 16: (2, 8), 32: (4, 8), 64: (8, 8)}
    assert fits_at(8, 4) and fits_at(16, 16) and not fits_at(4, 8) and not fits_at(8, 16)


def test_unequal_sub_meshes_win_when_the_head_scales_and_the_layers_do_not():
    """32 GPUs (4 nodes of 8), 6 layers, 8 micro-batches. A layer takes 8/min(n, 8) on n GPUs (it stops scaling at
    one node), the head 32/n (it keeps scaling). Equal sub-meshes: (16, 16) with 4 + 2 layers runs 4 and 2 + 2 = 4:
    Σ 8 + 7 x 4 = 36; (8, 8, 8, 8) with 2, 2, 1, 1 runs 2, 2, 1, 1 + 4 = 5: 10 + 7 x 5 = 45. Unequal (8, 8, 16) with
    2, 3, 1 runs 2, 3, 1 + 2 = 3: 8 + 7 x 3 = 29, the optimum, as a brute force over every covering finds too."""
    options = _options(32, lambda n: 8 / min(n, 8), lambda n: 32 / n)
    found = slice_stages(options, layers=6, gpus=32, micro_batches=8, limit=float("inf"))
    best = min(found.values(), key=lambda s: s.latency)
    assert (best.devices, best.layers, best.latency) == ((8, 8, 16), (2, 3, 1), 29.0)
    brute = _brute(options, 6, 32, 8)
    assert min(brute.values()) == 29.0 and brute[2] == 36.0
    for p, s in found.items():  # every stage count the DP reached before its early stop is that count's optimum
        assert s.latency == pytest.approx(brute[p])
    equal = [slice_stages([o for o in options if o.devices == n], 6, 32, 8, float("inf")) for n in (8, 16)]
    assert min(s.latency for e in equal for s in e.values()) == 36.0


def test_the_first_stages_hold_more_micro_batches():
    """1F1B keeps p - i micro-batches in flight on stage i of p. Two stages of 2 GPUs, 4 layers of time 1, 1 byte per
    layer and micro-batch in flight: under a limit of 6 the first stage (2 in flight) holds up to 3 layers, the last
    (1) up to 6, and (2, 2) is fastest (Σ 4 + 3 x 2 = 10 against 4 + 3 x 3 = 13 for (3, 1)); under 3 the first holds
    1 (2 x 1 <= 3 < 2 x 2) and the last 3: (1, 3); under 2, 1 + 2 < 4 layers: no slicing."""
    options = [Option(devices=n, shape=(n,), layer=1.0, pre=0.0, post=0.0, state=0.0, saved=1.0, base=0.0)
               for n in (2,)]
    assert slice_stages(options, 4, 4, 4, 6.0)[2].layers == (2, 2)
    assert slice_stages(options, 4, 4, 4, 3.0)[2].layers == (1, 3)
    assert slice_stages(options, 4, 4, 4, 2.0) == {}


torch = pytest.importorskip("torch")
pytest.importorskip("scipy")


def test_planner_gives_the_heavy_head_a_bigger_sub_mesh():
    """32 H100, 8 micro-batches of 8 x 512 tokens, 8 small layers and a 262k-word head
    (benchmarks/measure/pipeline_models.py): Alpa's DP over the sub-mesh plans puts the head on the biggest sub-mesh,
    and simulator.simulate prices that pipeline faster than the best pipeline of equal sub-meshes of every size."""
    from pipeline_models import heavy_head_plans

    best, equal = heavy_head_plans()
    assert len(set(best.devices)) > 1 and best.devices[-1] == max(best.devices) and best.fits
    assert equal and all(best.step_time < p.step_time for p in equal.values())


def test_a_tied_head_costs_its_stages_an_all_reduce_of_the_shared_gradient():
    """The head tied to the embedding (benchmarks/measure/pipeline_models.py, tied=True): cut into stages, the first and
    the last each hold the shared weight and all-reduce its gradient once per step, as channels.embedding_sync prices it
    for a model-level plan; an untied twin reads no parameter from both ends."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from meshplan.autoshard.blocks import find_blocks
    from meshplan.autoshard.dataflow import flow
    from meshplan.autoshard.planner import stage_plans, sub_mesh_options
    from meshplan.autoshard.stage_dp import Slicing
    from meshplan.autoshard.stages import hop, price_slicing
    from meshplan.collectives.price import collective_time
    from meshplan.trace import trace_module
    from pipeline_models import HeavyHead

    cluster = H100.cluster(8)
    vocab, h = 32768, 256
    found = {}
    for tied in (False, True):
        with FakeTensorMode(allow_non_fake_inputs=True):
            model = HeavyHead(h=h, layers=4, vocab=vocab, tied=tied)
        trace = trace_module(model, [((2, 128), "int64")], param_dtype="bfloat16")
        blocks = find_blocks(trace)
        found[tied] = stage_plans(flow(trace, blocks.block_of), blocks, cluster, micro_batches=4)
    part = found[True][4][0]
    assert found[False][4][0].tied == 0.0
    # the shared weight's gradient per device: at most its whole V·h bf16 bytes, at least a 4-way share of them
    assert vocab * h * 2 / 4 <= part.tied <= vocab * h * 2
    # two stages of 4 GPUs, 2 layers each: the step without the shared gradient's all-reduce, plus one all-reduce
    # over the pair of ranks 4 apart (inside the node's NVLink), on both ends
    option = next(o for o in sub_mesh_options(found[True]) if o.devices == 4)
    slicing = Slicing(stages=((option, 2), (option, 2)), latency=0.0)
    with_sync = price_slicing(slicing, found[True], 4, float("inf"), cluster)
    bare = {k: (replace(p, tied=0.0), s) for k, (p, s) in found[True].items()}
    without = price_slicing(slicing, bare, 4, float("inf"), cluster)
    pair = float(collective_time("all_reduce", part.tied, 2, hop(cluster, 0, 4), cluster))
    assert pair > 0 and with_sync.step_time - without.step_time == pytest.approx(pair)
