"""A GEMM's shape efficiency on the GPU's SMs: output tiles, waves and split-K, written once for training
(specs/efficiency.py) and inference (serve/efficiency.py).

cuBLAS and CUTLASS cover the m × n output of a GEMM with tiles t_m × t_n, one per CTA, and run the CTAs in waves of
one per SM; a tile's rows and columns past the edge are wasted, and so are the SMs the last wave leaves idle
(tile and wave quantization). When the output has fewer tiles than the GPU has SMs, the kernels split the reduction
over several CTAs instead (split-K: CUTLASS's parallel split-K, cuBLAS's ``splitK`` kernels followed by a
``splitKreduce_kernel``, profiled on an H100 and an H200, data/measured/gpu/2026-11-26d-*-decode.json; CUTLASS's
stream-K, Osama et al. 2023, "Stream-K: Work-centric Parallel Decomposition for Dense Matrix-Matrix Multiplication on
the GPU", §4), each slice at least ``SPLIT_DEPTH`` deep. For tiles t_m × t_n among the candidates:
    tiles = g·⌈m/t_m⌉·⌈n/t_n⌉;   split s = ⌊S / tiles⌋ when tiles < S (at most k / 128), else 1
    occupancy = tiles·s / S for a single partial wave, tiles / (⌈tiles/S⌉·S) otherwise
    value = g·m·n / (tiles·t_m·t_n) · occupancy
and the kernel chosen maximises value · (k/s) / (k/s + k_0), k_0 the per-tile fixed cost in units of reduction depth
(``Efficiency.gemm_k0``). Training's candidates are ``TILES``; inference adds small-row tiles (serve/efficiency.py).
Without a split the value is the wave quantization g·m·n / (⌈tiles/S⌉·S·t_m·t_n) of every tile count.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from functools import lru_cache

import numpy as np

from meshplan.xp import Num, distinct

# Output tiles cuBLAS / CUTLASS choose among for bf16/fp8 GEMMs on A100, H100 and B200 (CUTLASS profiler default
# configurations; the heuristic picks the least wasteful one per shape). The 64-wide ones are what cuBLAS ran for a
# small model's GEMMs of few tiles (a 512 x 512 layer at 2,048 tokens: 128x64, one wave of 128 tiles, no split) on a
# lent H200 (data/measured/gpu/2026-11-27-nvidia-h200-gemm-rows.json, docs/GEMM_GPU.md: with them the p90 |error|
# of 108 training GEMMs falls from 41 to 16 %).
TILES: tuple[tuple[int, int], ...] = ((128, 64), (64, 128), (128, 128), (128, 256), (256, 128))
SPLIT_DEPTH = 128.0  # a split-K slice is at least this deep (two 64-deep k-blocks of a CUTLASS mainloop)
# tile_choice's last question and answer (the objects themselves, so that their ids are not reused)
_LAST: list[tuple | None] = [None]


def tile_choice(m: Num, n: Num, k: Num, num_sms: int, groups: Num, tiles: tuple[tuple[int, int], ...],
                k0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The chosen kernel's (value, slice depth k / s, split s) for each GEMM (arrays; the module docstring). The last
    answer is kept: roofline.op_time asks for the same op's twice (its rate, then its split-K reduction)."""
    last = _LAST[0]
    if (last is not None and last[0] is m and last[1] is n and last[2] is k and last[3] == num_sms
            and last[4] is groups and last[5] is tiles and last[6] == k0):
        return last[7]
    out = _distinct_choice(m, n, k, num_sms, groups, tiles, k0)
    _LAST[0] = (m, n, k, num_sms, groups, tiles, k0, out)
    return out


# Up to this many GEMMs in one call, every candidate tile is tried at once (a leading axis of the tiles): a fifth of the
# NumPy calls, which take the time of a call of a few hundred GEMMs; above it, one tile after the other, whose arrays
# stay in the processor's cache. The same numbers either way (tests/test_gemm_shape.py)
AT_ONCE = 1024


def _tile_choice(m: Num, n: Num, k: Num, num_sms: int, groups: Num, tiles: tuple[tuple[int, int], ...],
                 k0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mm, nn, kk, gg = (np.maximum(np.asarray(x, dtype=float), 1.0) for x in (m, n, k, groups))  # empty: 0 FLOPs
    shape = np.broadcast(mm, nn, kk, gg).shape
    if int(np.prod(shape)) <= AT_ONCE:  # the first of the best scores, as keeping only a strictly better one gives
        along = (len(tiles),) + (1,) * len(shape)
        tm, tn = (np.array([t[i] for t in tiles], dtype=float).reshape(along) for i in (0, 1))
        value, depth, split = _candidate(mm, nn, kk, gg, tm, tn, num_sms)
        first = np.argmax(value * depth / (depth + k0), axis=0)[None]

        def of_first(x: np.ndarray) -> np.ndarray:
            return np.take_along_axis(np.broadcast_to(x, (len(tiles), *shape)), first, axis=0)[0]

        return of_first(value), of_first(depth), of_first(split)
    best, depth, chosen = np.full(shape, -1.0), np.ones(shape), np.ones(shape)  # any kernel beats none
    for tm_, tn_ in tiles:
        value, slice_depth, split = _candidate(mm, nn, kk, gg, tm_, tn_, num_sms)
        better = value * slice_depth / (slice_depth + k0) > best * depth / (depth + k0)
        best, depth = np.where(better, value, best), np.where(better, slice_depth, depth)
        chosen = np.where(better, split, chosen)
    return best, depth, chosen


# Calls above AT_ONCE GEMMs answered lately, by the bytes of their dimensions (``_memo_key``): a search prices the
# same arrays of GEMMs again and again (DeepSeek-V3's keyed units: 228 calls, 84 distinct; the twin expert-GEMM
# searches' units share every shape, search/variants.py), each answer kept as its distinct GEMMs' choices and the
# index that spreads them back (a few hundred numbers and one int16 index per call)
_MEMO: OrderedDict[tuple, tuple[tuple[np.ndarray, ...], np.ndarray | None, tuple[int, ...]]] = OrderedDict()
MEMO_SIZE = 64


def _memo_key(dims: tuple[np.ndarray, ...], num_sms: int, tiles: tuple[tuple[int, int], ...], k0: float) -> tuple:
    """The question by value: each dimension's shape and the SHA-256 digest of its bytes, or the number."""
    import hashlib  # noqa: PLC0415  (OpenSSL's bindings: only a call this large needs them, not every start-up)

    def part(x: np.ndarray) -> tuple:
        if not x.ndim:
            return (float(x),)
        return x.shape, hashlib.sha256(np.ascontiguousarray(x).data).digest()

    return num_sms, tiles, k0, *(part(x) for x in dims)


def _distinct_choice(m: Num, n: Num, k: Num, num_sms: int, groups: Num, tiles: tuple[tuple[int, int], ...],
                     k0: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_tile_choice`` of each distinct GEMM once, spread back: a search's arrays of one GEMM over thousands of plan
    shapes hold a few hundred distinct (m, n, k, groups) (DeepSeek-V3's: ~170 of ~16,000). Whole, non-negative
    dimensions are packed into one integer (mixed radix) for a fast 1-D unique, a fractional one (a MoE layer's mean
    tokens per expert) by the ranks of its values; arrays with a non-finite value, or too few repeats to gain, are
    chosen whole. The same numbers either way: the choice is element by element (tests/test_gemm_shape.py).
    A question asked lately with the same bytes gets its kept answer (``_MEMO``): the same numbers again."""
    given = tuple(np.asarray(x, dtype=float) for x in (m, n, k, groups))
    dims = np.broadcast_arrays(*given)
    if dims[0].size <= AT_ONCE:
        return _small_choice(given, num_sms, tiles, k0)
    key = _memo_key(given, num_sms, tiles, k0)
    if key in _MEMO:
        _MEMO.move_to_end(key)
    else:
        _MEMO[key] = (*_choose_distinct(dims, num_sms, tiles, k0), dims[0].shape)
        if len(_MEMO) > MEMO_SIZE:
            _MEMO.popitem(last=False)
    kept, spread, shape = _MEMO[key]  # the kept arrays never leave: each answer is a new array
    if spread is None:
        return kept[0].copy(), kept[1].copy(), kept[2].copy()
    return kept[0][spread].reshape(shape), kept[1][spread].reshape(shape), kept[2][spread].reshape(shape)


# Calls of at most AT_ONCE GEMMs answered lately, by their dimensions' bytes: the twin expert-GEMM searches' units ask
# the same questions of every op but the experts' (DeepSeek-V3: 204 calls, 72 distinct), a plan's estimates alike
_SMALL: OrderedDict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
SMALL_SIZE = 256


def _small_choice(given: tuple[np.ndarray, ...], num_sms: int, tiles: tuple[tuple[int, int], ...], k0: float
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_tile_choice`` of (m, n, k, groups) as ``given`` (float arrays of at most AT_ONCE GEMMs), kept (``_SMALL``):
    a new copy of the kept answer each call."""
    key = (num_sms, tiles, k0, *((x.shape, x.tobytes()) for x in given))
    kept = _SMALL.get(key)
    if kept is None:
        m, n, k, groups = given
        kept = _SMALL[key] = _tile_choice(m, n, k, num_sms, groups, tiles, k0)
        if len(_SMALL) > SMALL_SIZE:
            _SMALL.popitem(last=False)
    else:
        _SMALL.move_to_end(key)
    return kept[0].copy(), kept[1].copy(), kept[2].copy()


def _choose_distinct(dims: tuple[np.ndarray, ...], num_sms: int, tiles: tuple[tuple[int, int], ...], k0: float
                     ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray], np.ndarray | None]:
    """The choices of the distinct GEMMs of ``dims`` (broadcast) and the index spreading them back; every GEMM's
    choices and None where a dimension is not finite or too few repeat."""
    m, n, k, groups = dims
    flat = [d.reshape(-1) for d in dims]
    keys = np.empty((len(flat), len(flat[0])), dtype=np.int64)
    for whole, column in zip(keys, flat, strict=True):
        whole[:] = column
        if int(whole.min()) < 0 or int(whole.max()) >= 2**31 or not (whole == column).all():  # a fraction: its ranks
            if not np.isfinite(column).all():
                return _tile_choice(m, n, k, num_sms, groups, tiles, k0), None
            whole[:] = np.unique(column, return_inverse=True)[1].reshape(-1)
    first, inverse = distinct(keys)  # packed into one integer (mixed radix): a 1-D unique
    if 2 * len(first) > len(inverse):  # mostly distinct: the unique would cost more than it saves
        return _tile_choice(m, n, k, num_sms, groups, tiles, k0), None
    mm, nn, kk, gg = (f[first] for f in flat)
    index = np.int16 if len(first) <= np.iinfo(np.int16).max else np.int32
    return _tile_choice(mm, nn, kk, num_sms, gg, tiles, k0), inverse.reshape(-1).astype(index)


def _candidate(m: np.ndarray, n: np.ndarray, k: np.ndarray, g: np.ndarray, tm: Num, tn: Num, num_sms: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, slice depth, split) of GEMMs of at least one row, column and depth each on tiles tm × tn (the module
    docstring)."""
    count = g * np.ceil(m / tm) * np.ceil(n / tn)
    single = count < num_sms
    split = np.where(single, np.maximum(1.0, np.minimum(np.floor(num_sms / np.maximum(count, 1.0)),
                                                        np.floor(k / SPLIT_DEPTH))), 1.0)
    occupancy = np.where(single, count * split / num_sms, count / (np.ceil(count / num_sms) * num_sms))
    return g * m * n / (count * tm * tn) * occupancy, k / split, split


@lru_cache(maxsize=8192)
def scalar_choice(m: float, n: float, k: float, num_sms: int, groups: float, tiles: tuple[tuple[int, int], ...],
                  k0: float) -> tuple[float, float, float]:
    """``tile_choice`` for one GEMM of plain numbers, memoised: a plan's shapes repeat."""
    m, n, k, g = max(m, 1.0), max(n, 1.0), max(k, 1.0), max(groups, 1.0)
    best, depth, chosen = -1.0, 1.0, 1.0  # any kernel beats none
    for tm, tn in tiles:
        count = g * math.ceil(m / tm) * math.ceil(n / tn)
        single = count < num_sms
        ways = min(math.floor(num_sms / max(count, 1.0)), math.floor(k / SPLIT_DEPTH))
        split = float(max(1, ways)) if single else 1.0
        occupancy = count * split / num_sms if single else count / (math.ceil(count / num_sms) * num_sms)
        value = g * m * n / (count * tm * tn) * occupancy
        slice_depth = k / split
        if value * slice_depth / (slice_depth + k0) > best * depth / (depth + k0):
            best, depth, chosen = value, slice_depth, split
    return best, depth, chosen
