"""step/host._issued's shortcut for a search batch (``_alike``): where a record's ``launches`` is one number at every
plan of the batch (its work masks all true), the number is added to the per-pass sums in place of the array. The sums
must equal, bit for bit, the records' ``launches`` arrays added in order, as the loop adds them without the shortcut;
and every record whose masks are not all true (no work at some plan, NaN, a group of one rank, per-plan kernel
counts) takes the array as before."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from meshplan.collectives.comm import Collective
from meshplan.cost.records import OpCost
from meshplan.specs.stack import Stack
from meshplan.step.host import _issued, forget_issued, launches, most_launches, per_launch
from meshplan.xp import Num

US = 1e-6
N = 7  # plans in the batch
RNG = np.random.default_rng(83)


def _ops() -> list[OpCost]:
    """A layer's records over N plans: each kind of field the search's records hold (arrays of flops and bytes, a
    collective over a group per plan) and each kind the shortcut must leave to the arrays."""
    flops, nbytes = RNG.uniform(1e6, 1e9, N), RNG.uniform(1e3, 1e6, N)
    holes = flops.copy()
    holes[2] = 0.0  # no work at one plan: its launches are 0 there
    nan = flops.copy()
    nan[4] = np.nan
    group = np.full(N, 8)
    one = group.copy()
    one[0] = 1  # a group of one rank: no call there
    return [OpCost("norm", "fwd", "memory", 0.0, nbytes),
            OpCost("qkv", "fwd", "gemm", flops, nbytes, kernels=3.0),
            OpCost("qkv/eager", "fwd", "gemm", flops, nbytes, launches=5.0),
            OpCost("tp_out", "fwd", "collective", nbytes=nbytes, collective=Collective("all_reduce", 1e3, "tp", group),
                   repeat=2.0),
            OpCost("tp_one", "fwd", "collective", nbytes=nbytes, collective=Collective("all_reduce", 1e3, "tp", one)),
            OpCost("holes", "fwd", "gemm", holes, 0.0),
            OpCost("holes/bytes", "fwd", "gemm", holes, nbytes),  # work everywhere through its bytes
            OpCost("nan", "bwd_x", "gemm", nan, 0.0),
            OpCost("per_plan", "bwd_x", "gemm", flops, nbytes, kernels=RNG.integers(1, 4, N).astype(float)),
            OpCost("view", "bwd_x", "memory"),
            OpCost("dgrad", "bwd_x", "gemm", flops, nbytes, kernels=2.0),
            OpCost("wgrad", "bwd_w", "gemm", flops, nbytes)]


def _in_order(ops: list[OpCost], stack: Stack) -> tuple[dict[str, Num], dict[str, Num]]:
    """The sums as the loop adds them without the shortcut: each record's ``launches`` array, in order."""
    count: dict[str, Num] = {"f": 0.0, "b": 0.0}
    cost: dict[str, Num] = {"f": 0.0, "b": 0.0}
    for op in ops:
        ph = "f" if op.phase == "fwd" else "b"
        n = launches(op)
        count[ph], cost[ph] = count[ph] + n, cost[ph] + n * per_launch(op, stack.host)
    return count, cost


def _same(a: Num, b: Num) -> bool:
    return (type(a) is type(b) and np.shape(a) == np.shape(b) and np.asarray(a).dtype == np.asarray(b).dtype
            and np.asarray(a).tobytes() == np.asarray(b).tobytes())


@pytest.mark.parametrize("order", ["as_listed", "reversed", "shuffled"])
def test_the_sums_equal_the_launch_arrays_added_in_order(order: str) -> None:
    ops = _ops()
    ops = ops[::-1] if order == "reversed" else [ops[i] for i in RNG.permutation(len(ops))] if (
        order == "shuffled") else ops
    stack = Stack(host_dispatch=7 * US, collective_host=3 * US)
    forget_issued()
    count, cost, _ = _issued(ops, stack.host, launches)
    want_count, want_cost = _in_order(ops, stack)
    for ph in "fb":
        assert _same(count[ph], want_count[ph]) and _same(cost[ph], want_cost[ph])
    # the arithmetic, on the forward pass as listed: norm 1 + qkv 3 + eager 5 + 2 calls + the group of one's 1 but at
    # plan 0 + holes 1 but at plan 2 + holes/bytes 1
    if order == "as_listed":
        want = np.full(N, 1.0 + 3.0 + 5.0 + 2.0 + 1.0 + 1.0 + 1.0)
        want[0] -= 1.0
        want[2] -= 1.0
        assert np.array_equal(count["f"], want)


def test_the_shortcut_is_taken_only_where_the_masks_hold_everywhere() -> None:
    from meshplan.step.host import _alike

    ops = {op.name: op for op in _ops()}
    sums = np.zeros(N), np.zeros(N)
    assert _alike(ops["qkv"], *sums) == 3.0 and _alike(ops["qkv/eager"], *sums) == 5.0
    assert _alike(ops["tp_out"], *sums) == 2.0 and _alike(ops["holes/bytes"], *sums) == 1.0
    for name in ("tp_one", "holes", "nan", "per_plan", "view"):
        assert _alike(ops[name], *sums) is None, name
    assert _alike(ops["qkv"], 0.0, 0.0) is None  # the first record of a pass: the sum is not an array yet
    assert _alike(ops["qkv"], np.zeros(N + 1), np.zeros(N + 1)) is None  # another shape: it would broadcast
    assert _alike(ops["qkv"], np.zeros(N, dtype=np.float32), np.zeros(N, dtype=np.float32)) is None
    empty = replace(ops["qkv"], flops=np.zeros(0), nbytes=np.zeros(0))
    assert _alike(empty, np.zeros(0), np.zeros(0)) is None  # no plans: no least value to read


def test_the_bound_and_one_plan_are_summed_as_before() -> None:
    ops = _ops()
    stack = Stack(host_dispatch=7 * US)
    forget_issued()
    bound = _issued(ops, stack.host, most_launches)[0]
    assert all(np.all(bound[ph] >= _in_order(ops, stack)[0][ph]) for ph in "fb")  # a bound of the launches
    def at(x: object) -> float:
        return float(np.broadcast_to(np.asarray(x), (N,))[1])

    one = [replace(op, flops=at(op.flops), nbytes=at(op.nbytes), kernels=at(op.kernels),
                   collective=None if op.collective is None else replace(op.collective, group=8)) for op in ops]
    forget_issued()
    count, cost, _ = _issued(one, stack.host, launches)
    want_count, want_cost = _in_order(one, stack)
    assert all(_same(count[ph], want_count[ph]) and _same(cost[ph], want_cost[ph]) for ph in "fb")
