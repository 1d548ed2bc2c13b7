"""The sharding planner's graph: placements, resharding costs against comm.py's closed forms, the op rules (matrix
product, views, element-wise ops), the data flow of a traced model and its repeated blocks."""

from __future__ import annotations

from dataclasses import replace
from math import prod

import numpy as np
import pytest

from meshplan import load_model
from meshplan.autoshard.mesh import device_mesh, sub_mesh
from meshplan.autoshard.placement import PARTIAL, REPLICATE, describe, local_shape, shards, short, valid
from meshplan.autoshard.reshard import Resharder, moves
from meshplan.autoshard.rules import PASS, Rule, assignments, follow, place
from meshplan.autoshard.views import reshape_labels
from meshplan.collectives.price import collective_time
from meshplan.specs.hardware import load_system

R, P = REPLICATE, PARTIAL
CLUSTER = load_system("h100").cluster(16)  # tiers nvlink 8 x network 2
MESH = device_mesh(CLUSTER)  # (network 2, nvlink 8), outermost first
TINY = replace(load_model("llama3-8b"), name="tiny", num_layers=3, hidden_size=64, num_heads=4, num_kv_heads=2,
               head_dim=16, ffn_hidden_size=128, vocab_size=256, seq_length=32)


def test_mesh_follows_the_tiers_innermost_last():
    assert MESH.sizes == (2, 8) and MESH.names == ("network", "nvlink")
    assert [d.stride for d in MESH.dims] == [8, 1]  # row-major ranks, as init_device_mesh numbers them
    # a refactored mesh: 4 x 4, the inner dimension inside one NVLink domain, the outer spanning both
    mesh = device_mesh(CLUSTER, (4, 4))
    assert mesh.sizes == (4, 4) and [d.stride for d in mesh.dims] == [4, 1]
    assert sub_mesh(CLUSTER, (1, 8)).sizes == (8,)  # a stage of one node: size-1 dimensions dropped


def test_placements_in_dtensor_vocabulary():
    assert describe((0, R)) == "[Shard(0), Replicate()]" and short((P, 1)) == "PS(1)"
    assert local_shape((16, 64), (0, 1), (2, 8)) == (8, 8)
    assert local_shape((16, 64), (0, 0), (2, 8)) == (1, 64)  # two mesh dimensions split dimension 0: 16 / 16
    assert not valid((12, 64), (R, 0), (2, 8))  # 12 rows do not split evenly 8 ways


def test_resharding_costs_are_comm_collectives():
    """Each move is comm.collective_time of its collective along that mesh dimension (bytes per comm.py)."""
    n = 64e6  # bytes each device holds before the move
    nvlink = (8, 1)  # group, stride of mesh dimension 1

    def comm(kind, nbytes, group, stride):
        return collective_time(kind, nbytes, group, stride, CLUSTER)

    (gather,) = moves((R, 0), (R, R), n, MESH)
    assert gather.kind == "all_gather" and gather.nbytes == 8 * n  # the all-gather's output: 8 shards
    assert gather.seconds == pytest.approx(comm("all_gather", 8 * n, *nvlink))
    (reduce,) = moves((R, P), (R, R), n, MESH)
    assert reduce.kind == "all_reduce" and reduce.seconds == pytest.approx(comm("all_reduce", n, *nvlink))
    (scatter,) = moves((R, P), (R, 1), n, MESH)
    assert scatter.kind == "reduce_scatter" and scatter.seconds == pytest.approx(comm("reduce_scatter", n, *nvlink))
    (a2a,) = moves((R, 0), (R, 1), n, MESH)
    assert a2a.kind == "all_to_all" and a2a.seconds == pytest.approx(comm("all_to_all", n, *nvlink))
    assert moves((R, R), (R, 1), n, MESH) == () and moves((R, R), (R, P), n, MESH) == ()  # slices: free
    # the outer dimension crosses the network: the same all-gather is slower there
    (outer,) = moves((0, R), (R, R), n, MESH)
    assert outer.seconds == pytest.approx(comm("all_gather", 2 * n, 2, 8)) and outer.seconds > gather.seconds / 4


def test_moves_over_two_dimensions_gather_inner_first():
    """S(0)S(0) -> RR: the inner (NVLink) all-gather first on n bytes, then the outer on 8n."""
    n = 1e6
    found = moves((0, 0), (R, R), n, MESH)
    assert [(c.kind, c.dim, c.nbytes) for c in found] == [("all_gather", 1, 8 * n), ("all_gather", 0, 16 * n)]
    assert Resharder(MESH).seconds((0, 0), (R, R), n) == pytest.approx(sum(c.seconds for c in found))


@pytest.mark.parametrize("shape", [(2, 8), (2, 3, 4)])
def test_a_move_table_is_each_moves_cost_to_the_bit(shape):
    """Resharder.table (problem._move_matrix's, reshard.dim_step taken over a whole table at once) against ``move``
    pair by pair (dim_step walked for one pair, ``_steps``): equal bits, seconds and collectives, with an empty last
    row and column; placements of every kind (Shard of either dimension, Replicate, Partial) on a 2-D mesh and on a
    3-D one of uneven sizes (24 GPUs)."""
    rng = np.random.default_rng(7)
    mesh = device_mesh(load_system("h100").cluster(prod(shape)), shape)
    draw = [tuple(int(x) for x in rng.integers(-2, 2, len(shape))) for _ in range(40)]
    rows, cols = list(dict.fromkeys(draw[:20])), list(dict.fromkeys(draw[20:]))
    nbytes = 3e6 / 7
    table = Resharder(mesh).table(rows, cols, nbytes)
    one = Resharder(mesh)
    want = np.zeros((2, len(rows) + 1, len(cols) + 1))
    for a, src in enumerate(rows):
        for b, dst in enumerate(cols):
            want[:, a, b] = one.move(src, dst, nbytes / shards(src, mesh.sizes))
    assert table.tobytes() == want.tobytes() and want[1].max() >= len(shape) - 1  # several steps do occur


def test_a_move_table_on_one_gpu_is_free():
    """A one-GPU stage's mesh has no dimension (mesh.sub_mesh drops size-1 ones): placements are empty and every move
    in its table costs nothing (stage plans of 1 GPU build such tables)."""
    table = Resharder(sub_mesh(load_system("h100").cluster(8), (1,))).table([()], [()], 1e6)
    assert table.shape == (2, 2, 2) and not table.any()


MM = Rule(inputs=(("m", "k"), ("k", "n")), outputs=(("m", "n"),), gemm=("m", "n", "k"))


def test_matrix_product_strategies_as_alpa_table_3():
    """mk,kn->mn on a 2-D mesh: each mesh dimension splits m, n, k or nothing: 4 x 4 = 16 strategies."""
    combos = assignments(MM, (2, 8), [(64, 64), (64, 64)], [(64, 64)])
    assert len(combos) == 16
    ins, outs = place(MM, ("m", "n"))  # data parallel x column parallel
    assert ins == ((0, R), (R, 1)) and outs == ((0, 1),)
    ins, outs = place(MM, (None, "k"))  # row parallel: the contraction split leaves partial sums
    assert ins == ((R, 1), (R, 0)) and outs == ((R, P),)
    assert len(assignments(MM, (2, 8), [(4, 64), (64, 64)], [(4, 64)])) == 12  # m = 4 cannot split 8 ways
    twin = replace(MM, sizes={"m": 1})  # an equal rule, another object: looked up by identity first, then by value
    assert place(twin, ("m", "n")) is place(MM, ("m", "n")) and place(MM, ("m", "n")) is place(MM, ("m", "n"))


def test_a_label_that_cannot_be_partial_is_split_only_where_every_result_keeps_it():
    """A row max over k (``no_partial`` k, a result without k): splitting k would leave partial maxima, so only m
    or nothing on each mesh dimension: 3 x 3 options less those with k, 2 x 2, in product order. Softmax over k
    keeps k in its result, so k may be split: all 3 x 3."""
    row_max = Rule(inputs=(("m", "k"),), outputs=(("m",),), no_partial=frozenset({"k"}))
    assert assignments(row_max, (2, 8), [(64, 64)], [(64,)]) == [(None, None), (None, "m"), ("m", None), ("m", "m")]
    softmax = Rule(inputs=(("m", "k"),), outputs=(("m", "k"),), no_partial=frozenset({"k"}))
    assert len(assignments(softmax, (2, 8), [(64, 64)], [(64, 64)])) == 9


def test_followers_keep_or_replicate():
    add = Rule(inputs=(("d0", "d1"), ("d0", "d1")), outputs=(("d0", "d1"),), linear=frozenset({0, 1}),
               additive=frozenset({0, 1}))
    assert follow(add, 0, (0, P)) == ("d0", PASS)  # a Partial passes through an add
    assert place(add, ("d0", PASS), 0) == (((0, P), (0, P)), ((0, P),))
    silu = Rule(inputs=(("d0", "d1"),), outputs=(("d0", "d1"),))
    assert follow(silu, 0, (0, P)) == ("d0", None)  # not linear: replicated first (an all-reduce)


def test_reshape_keeps_the_leading_split_only():
    # (B, S, H) -> (B*S, H): a batch split stays a split of the rows; a sequence split cannot stay
    assert reshape_labels((4, 8, 16), (32, 16)) == (("d0", None, "d2"), ("d0", "d2"))
    assert reshape_labels((32, 16), (4, 8, 16)) == (("d0", "d1"), ("d0", None, "d1"))
    assert reshape_labels((4, 8, 1, 16), (4, 8, 16)) == (("d0", "d1", None, "d3"), ("d0", "d1", "d3"))


@pytest.fixture(scope="module")
def traced():
    pytest.importorskip("torch")
    from meshplan.autoshard.torch_models import build_preset
    from meshplan.trace import trace_module

    return trace_module(build_preset(TINY, 3), [((4, 32), "int64")], param_dtype="bfloat16")


def test_blocks_are_the_identical_layers(traced):
    from meshplan.autoshard.blocks import find_blocks

    blocks = find_blocks(traced)
    (group,) = blocks.groups
    assert group.prefix == "model.layers" and group.traced == group.layers == 3
    assert len({len(b) for b in group.blocks}) == 1  # forward and backward ops of each layer, the same count
    # every op of layers 1 and 2 maps to its twin in layer 0: same target, phase and shapes
    for block in group.blocks[1:]:
        for i, twin in zip(block, group.blocks[0], strict=True):
            a, b = traced.ops[i], traced.ops[twin]
            assert (a.target, a.phase, [t.shape for t in a.inputs]) == (b.target, b.phase, [t.shape for t in b.inputs])
    assert find_blocks(traced, layers=32).groups[0].layers == 32  # planned deeper than traced


def test_dataflow_producers_and_decisions(traced):
    from meshplan.autoshard.blocks import find_blocks
    from meshplan.autoshard.dataflow import flow

    blocks = find_blocks(traced)
    fl = flow(traced, blocks.block_of)
    n = len(traced.ops)
    for op, found in zip(traced.ops, fl.producers, strict=True):
        for (key, slot), t in zip(found, op.inputs, strict=True):
            if key < n:  # produced earlier, the very tensor (same storage, shape, strides, offset)
                assert key < op.index and traced.ops[key].outputs[slot].storage == t.storage
            else:  # a source: parameters, the input ids, buffers
                assert traced.storages[t.storage].created == -1
    # no decision spans two blocks: a follower's owner is in its block (or a source)
    for i, owner in enumerate(fl.owners):
        if owner < n and fl.roles[i] == "follow":
            assert blocks.group_block(owner) == blocks.group_block(i)
    # views and element-wise ops merge into their operands: fewer decisions than ops
    assert fl.roles.count("follow") > 0 and len(set(fl.owners)) < n


def test_any_number_of_tiers_is_a_mesh_dimension_each():
    """Three tiers (NVLink 4, a pod of 2 nodes, 2 pods) are a 3-D mesh; a move along the middle dimension is a
    collective among 2 ranks 4 apart, priced by comm.py over the tiers it crosses."""
    from meshplan.specs.hardware import Cluster

    base = load_system("h100").cluster(16)
    tiers = (replace(base.tiers[0], size=4), replace(base.tiers[1], name="pod", size=2),
             replace(base.tiers[1], name="spine", size=2, bandwidth=base.tiers[1].bandwidth / 4))
    cluster = Cluster(name="three", accelerator=base.accelerator, num_gpus=16, tiers=tiers)
    mesh = device_mesh(cluster)
    assert mesh.names == ("spine", "pod", "nvlink") and mesh.sizes == (2, 2, 4)
    assert [d.stride for d in mesh.dims] == [8, 4, 1]
    (gather,) = moves((R, 0, R), (R, R, R), 1e6, mesh)
    assert gather.dim == 1 and gather.seconds == pytest.approx(collective_time("all_gather", 2e6, 2, 4, cluster))
    (outer,) = moves((0, R, R), (R, R, R), 1e6, mesh)
    assert outer.seconds > gather.seconds  # the spine is four times thinner
