"""Multi-tensor apply's launch arithmetic (cost/multi_tensor.py): apex's chunks of 65,536 elements, at most 320 chunks
and depth_to_max_tensors tensors a launch, checked by hand and against a chunk-by-chunk replay of
csrc/multi_tensor_apply.cuh's loop on random draws."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.cost.multi_tensor import CHUNK, MAX_BLOCKS, MAX_TENSORS, multi_tensor_launches


def replay(numels: list[int], depth: int) -> int:
    """multi_tensor_apply.cuh's host loop, one chunk at a time."""
    count = block = slots = 0
    for t, numel in enumerate(numels):
        slots += 1
        chunks = -(-numel // CHUNK)
        for chunk in range(chunks):
            block += 1
            last = chunk == chunks - 1
            if (slots == MAX_TENSORS[depth] and last) or block == MAX_BLOCKS or (t == len(numels) - 1 and last):
                count, block = count + 1, 0
                slots = 0 if last else 1
    return count


def test_by_hand():
    # 100 tensors of 2^20 elements (16 chunks each) under Adam (depth 4, 36 tensors a launch): the 320 blocks fill at
    # every 20th tensor's last chunk, before the tensor slots do: 100 / 20 = 5 launches
    assert multi_tensor_launches([2 ** 20] * 100, 4) == 5
    # 200 one-chunk tensors under the gradient norm (depth 1): 110 tensors a launch, then the last 90
    assert multi_tensor_launches([1000] * 200, 1) == 2
    # one tensor of 10^9 elements: 15,259 chunks in launches of 320: 47 full, one partial
    assert -(-10 ** 9 // CHUNK) == 15259
    assert multi_tensor_launches([10 ** 9], 2) == 48
    # 36 small tensors fill Adam's slots exactly: one launch, none left
    assert multi_tensor_launches([10] * 36, 4) == 1
    assert multi_tensor_launches([10] * 37, 4) == 2
    assert multi_tensor_launches([], 4) == 0


def test_matches_the_cuda_loop_on_random_draws():
    rng = np.random.default_rng(79)
    for _ in range(200):
        n = int(rng.integers(1, 120))
        numels = [int(x) for x in rng.choice([1, 700, CHUNK, CHUNK + 1, 3 * CHUNK, 50 * CHUNK, 400 * CHUNK], n)]
        depth = int(rng.integers(1, 7))
        assert multi_tensor_launches(numels, depth) == replay(numels, depth)


def test_launches_between_the_two_limits():
    # each launch but the last closes on full blocks or full tensor slots: at least the chunks over 320, at most the
    # full-block launches plus the full-slot launches plus one
    rng = np.random.default_rng(3)
    for _ in range(100):
        numels = [int(x) for x in rng.integers(1, 500 * CHUNK, int(rng.integers(1, 300)))]
        chunks = sum(-(-x // CHUNK) for x in numels)
        n = multi_tensor_launches(numels, 4)
        assert -(-chunks // MAX_BLOCKS) <= n <= chunks // MAX_BLOCKS + len(numels) // MAX_TENSORS[4] + 1


def test_bad_depth():
    with pytest.raises(ValueError, match="depth=7"):
        multi_tensor_launches([1], 7)
