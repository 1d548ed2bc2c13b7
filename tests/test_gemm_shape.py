"""specs/gemm_shape.py: the kernel chosen for arrays of GEMMs is, element by element, the one chosen for each GEMM
alone (scalar_choice, plain Python), whether the call tries every tile at once (up to AT_ONCE GEMMs) or one tile after
the other (above it), the candidates' order deciding ties."""

from __future__ import annotations

import numpy as np
import pytest

from meshplan.specs import gemm_shape
from meshplan.specs.gemm_shape import AT_ONCE, TILES, scalar_choice, tile_choice

SIZES = [0.0, 1.0, 2.0, 63.0, 64.0, 65.0, 128.0, 256.0, 511.0, 4096.0, 14336.0, 28672.0, 1e6]
SMALL_ROW_TILES = TILES + ((64, 64), (16, 128))  # serving's extra candidates (serve/efficiency.py) and a tie maker


@pytest.mark.parametrize("count", [1, 37, AT_ONCE, AT_ONCE + 1, 3 * AT_ONCE + 5])
def test_arrays_choose_as_each_gemm_alone(count):
    rng = np.random.default_rng(count)
    for tiles in (TILES, SMALL_ROW_TILES):
        m, n, k = (rng.choice(SIZES, count) for _ in range(3))
        g = rng.choice([1.0, 2.0, 8.0], count)
        sms, k0 = int(rng.choice([78, 132, 148])), float(rng.choice([0.0, 300.0]))
        gemm_shape._LAST[0] = None
        value, depth, split = tile_choice(m, n, k, sms, g, tiles, k0)
        assert value.shape == depth.shape == split.shape == (count,)
        for i in range(count):
            alone = scalar_choice(float(m[i]), float(n[i]), float(k[i]), sms, float(g[i]), tiles, k0)
            assert (value[i], depth[i], split[i]) == alone, (i, m[i], n[i], k[i], g[i])


def test_broadcast_shapes_and_scalars():
    """A scalar dimension broadcast against a 2-D one: the answer has the broadcast shape; all scalars: 0-d."""
    m = np.array([[64.0, 4096.0], [128.0, 1.0]])
    value, depth, split = tile_choice(m, 8192.0, 4096.0, 132, 1.0, TILES, 300.0)
    assert value.shape == (2, 2) and split.shape == (2, 2)
    assert value[0, 1] == scalar_choice(4096.0, 8192.0, 4096.0, 132, 1.0, TILES, 300.0)[0]
    assert np.shape(tile_choice(np.float64(64.0), 64.0, 64.0, 132, 1.0, TILES, 0.0)[0]) == ()


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_many_repeats_choose_as_each_gemm_alone(fraction):
    """A search's arrays repeat a few shapes thousands of times: each distinct GEMM is chosen once and spread back
    (gemm_shape._distinct_choice), the same as each alone; a fractional dimension (a MoE layer's mean tokens per
    expert) by the ranks of its values, the same too."""
    rng = np.random.default_rng(7)
    count = 4 * AT_ONCE
    m = rng.choice([64.0, 512.0, 4096.0, 16384.0], count) + fraction
    n, k = rng.choice([128.0, 7168.0], count), rng.choice([2048.0, 7168.0], count)
    g = rng.choice([1.0, 8.0], count)
    gemm_shape._LAST[0] = None
    value, depth, split = tile_choice(m, n, k, 132, g, TILES, 300.0)
    assert value.shape == depth.shape == split.shape == (count,)
    for i in range(count):
        alone = scalar_choice(float(m[i]), float(n[i]), float(k[i]), 132, float(g[i]), TILES, 300.0)
        assert (value[i], depth[i], split[i]) == alone, (i, m[i], n[i], k[i], g[i])


@pytest.mark.parametrize("fraction", [0.0, 0.5])
def test_a_question_asked_again_gets_the_same_answer_in_new_arrays(fraction):
    """A search asks the same arrays of GEMMs again (its twin expert-GEMM searches, every layer's forward and
    backward): the kept answer (gemm_shape._MEMO, by the bytes of the dimensions) is the one computed afresh, returned
    in new arrays (writing into one leaves the next answer alone); one element changed is a new question."""
    rng = np.random.default_rng(11)
    count = 4 * AT_ONCE
    m = rng.choice([64.0, 512.0, 4096.0], count) + fraction
    n, k = rng.choice([128.0, 7168.0], count), 2048.0
    gemm_shape._MEMO.clear()
    gemm_shape._LAST[0] = None
    first = tile_choice(m, n, k, 132, 1.0, TILES, 300.0)
    assert len(gemm_shape._MEMO) == 1
    first[0][:] = -1.0  # a caller's write: not the memo's arrays
    gemm_shape._LAST[0] = None
    again = tile_choice(m.copy(), n.copy(), k, 132, 1.0, TILES, 300.0)  # equal bytes, other objects: kept
    assert len(gemm_shape._MEMO) == 1
    gemm_shape._MEMO.clear()
    fresh = tile_choice(m.copy(), n.copy(), k, 132, 1.0, TILES, 300.0)
    for a, b in zip(again, fresh, strict=True):
        assert np.array_equal(a, b) and a.shape == (count,)
    changed = m.copy()
    changed[5] = 16384.0 + fraction
    gemm_shape._LAST[0] = None
    value = tile_choice(changed, n, k, 132, 1.0, TILES, 300.0)[0]
    assert len(gemm_shape._MEMO) == 2
    assert value[5] == scalar_choice(changed[5], float(n[5]), k, 132, 1.0, TILES, 300.0)[0]
