"""Iteration prices on a grid: serve's own iteration time (metrics.Setting.time: the ops of iteration.py on the
roofline and the mesh, the engine's host and eager time) evaluated once with NumPy over a grid of decoding sequences
per lane × prompt tokens per lane × mean context, then read by trilinear interpolation in the simulation's loop (a
few microseconds a lookup). No new physics: the grid's points are Setting.time's values; between them the price is
linear (GEMMs are linear in rows past their weight-bound knee, decode attention in the context it reads).

A prompt chunk attends to the tokens of its prompt already in the cache (the chunks before it, a prefix-cache hit):
the iteration's price adds Setting.time's difference between a chunk after ``prefix`` tokens and one with none, read
from a second grid (prompt tokens per lane × prefix), as the steady-state model prices a chunk after its earlier
ones (metrics._chunked); an iteration's several prompts are priced at their chunk-weighted mean prefix.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from meshplan.cost.decode import Shape
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import ServePlan, Workload
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.xp import Num


@dataclass(frozen=True)
class _AtContext(Setting):
    """A Setting whose decoding sequences attend to ``context`` tokens (an array over the grid) rather than the
    workload's mean."""

    context: Num = 0.0

    def shape(self, decode: Num, prefill: Num, prompts: Num, prefix: Num) -> Shape:
        base = super().shape(decode, prefill, prompts, prefix)
        return Shape(**{**{f: getattr(base, f) for f in Shape.__slots__}, "context": self.context})


# tokens between the points of the prompt-only axis (Prices.alone): every count, since a GEMM's price steps with its
# tiles (a 992-token prefill of Llama 3 8B on an A100 takes 71.0 ms, 1,000 tokens 72.2 ms, 1,008 tokens 72.3 ms)
ALONE_STEP = 1


def _axis(top: float, dense: int, step: float) -> list[float]:
    """0, 1 … ``dense``, then about ``step``-fold steps to ``top`` (at least two points)."""
    points = [float(v) for v in range(0, int(min(dense, top)) + 1)]
    while points[-1] < top:
        points.append(min(max(points[-1] * step, points[-1] + 1), float(top)))
    return points if len(points) > 1 else [0.0, 1.0]


class Prices:
    """Seconds of one iteration at (decoding sequences, prompt tokens, mean context) of the whole instance."""

    def __init__(self, d: list[float], p: list[float], c: list[float], table: np.ndarray, lanes: int,
                 prefixed: np.ndarray | None = None, alone: tuple[list[float], list[float]] | None = None) -> None:
        self.d, self.p, self.c, self.lanes = d, p, c, lanes
        # an iteration of prompt tokens alone, on a dense axis (every ALONE_STEP tokens): a lone request's prefill
        # exactly as serve prices it (the low-rate limit), where the grid's prompt axis is √2-spaced
        self.alone = alone
        self.table = table.tolist()  # nested lists: faster to index from Python than an array
        # seconds a chunk's attention to its prompt's cached prefix adds, over (prompt tokens, prefix) on (p, c)
        self.prefixed = None if prefixed is None else prefixed.tolist()
        self._knots: dict[float, list[float]] = {}

    def knots(self, decode: float) -> tuple[list[float], list[float]]:
        """A pure decode iteration's price at ``decode`` sequences as a function of the context: its values at the
        context axis's points, linear between them and past the ends (what ``__call__`` reads), so that a run of
        decode iterations sums in closed form (stretch.py)."""
        if decode not in self._knots:
            self._knots[decode] = [self(decode, 0.0, c) for c in self.c]
        return self.c, self._knots[decode]

    def __call__(self, decode: float, prefill: float, context: float, prefix: float = 0.0) -> float:
        """The interpolated price (module docstring); past the grid's ends, the nearest points extrapolated."""
        if not decode and prefix <= 0 and self.alone is not None:
            q, w = _where(self.alone[0], prefill / self.lanes)
            values = self.alone[1]
            return values[q] + w * (values[q + 1] - values[q])
        i, a = _where(self.d, decode / self.lanes)
        j, b = _where(self.p, prefill / self.lanes)
        k, g = _where(self.c, context)
        t = self.table
        lo = _bilinear(t[i], j, k, b, g)
        hi = _bilinear(t[i + 1], j, k, b, g)
        extra = 0.0
        if prefix > 0 and prefill > 0 and self.prefixed is not None:
            q, h = _where(self.c, prefix)
            extra = max(0.0, _bilinear(self.prefixed, j, q, b, h))
        return lo + a * (hi - lo) + extra


def _where(axis: list[float], x: float) -> tuple[int, float]:
    i = bisect_right(axis, x) - 1
    last = len(axis) - 2
    i = 0 if i < 0 else (last if i > last else i)
    return i, (x - axis[i]) / (axis[i + 1] - axis[i])


def _bilinear(t: list, j: int, k: int, b: float, g: float) -> float:
    r0, r1 = t[j], t[j + 1]
    lo = r0[k] + g * (r0[k + 1] - r0[k])
    hi = r1[k] + g * (r1[k + 1] - r1[k])
    return lo + b * (hi - lo)


def prices(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine, longest: int,
           eff: ServeEfficiency = SERVE_DEFAULT, sampled: bool = False) -> Prices:
    """The grid for one instance of ``plan`` (module docstring): sequences up to its batch, prompt tokens up to the
    engine's budget, contexts up to ``longest`` tokens; ``sampled``: every prompt row is sampled (the LM head over
    each: speculative decoding's verified tokens, speculation.py), not one per chunk. A simulation of another draw
    of the same instance's requests (seeds, rates) reads the same grid: memoised on the frozen specs, the grid being a
    pure function of them (a Prices only adds to its own memo of knots); specs that do not hash are priced anew."""
    args = (model, cluster, plan, engine, longest, eff, sampled)
    try:
        hash(args)
    except TypeError:
        return _prices(*args)
    return _memo(*args)


def _prices(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine, longest: int,
            eff: ServeEfficiency, sampled: bool) -> Prices:
    lanes = plan.pp * plan.dpa
    d = _axis(max(plan.batch / lanes, 1.0), 32, 1.15)
    p = [0.0] + [float(round(v)) for v in 2.0 ** (np.arange(8, 80) / 2) if v < engine.max_batched_tokens] + \
        [float(engine.max_batched_tokens)]
    c = [0.0] + [float(v) for v in 2.0 ** np.arange(4, 40) if v < longest] + [float(max(longest, 1))]
    # the axes apart (NumPy broadcasts them): an op that does not read the context (the GEMMs, the collectives) is
    # priced once per (sequences, prompt tokens), not once per grid point; each point's value is the same
    dd, pp, cc = (np.asarray(axis).reshape(shape) for axis, shape in
                  ((d, (-1, 1, 1)), (p, (1, -1, 1)), (c, (1, 1, -1))))
    cols = plan_columns(plan.with_(replicas=1, prefill_replicas=0))
    setting = _AtContext(model, cluster, cols, plan.quant, engine, Workload(input_len=1, output_len=1), eff,
                         context=cc)
    with np.errstate(all="ignore"):
        t = setting.time(dd, pp, pp if sampled else np.minimum(pp, 1.0), 0.0)
        # a chunk after ``prefix`` cached tokens of its prompt, less the same chunk with none (no decodes)
        p2, q2 = np.asarray(p).reshape(-1, 1), np.asarray(c).reshape(1, -1)
        one = np.minimum(p2, 1.0)
        alone = replace(setting, context=0.0)
        after = alone.time(0.0, p2, one, q2) - alone.time(0.0, p2, one, 0.0)
        dense = np.unique(np.append(np.arange(0.0, engine.max_batched_tokens, ALONE_STEP), p[-1]))
        lone = alone.time(0.0, dense, dense if sampled else np.minimum(dense, 1.0), 0.0)
    prefixed = np.broadcast_to(np.asarray(after, dtype=float), (len(p), len(c)))
    lone = np.broadcast_to(np.asarray(lone, dtype=float), dense.shape)
    return Prices(d, p, c, np.broadcast_to(np.asarray(t, dtype=float), (len(d), len(p), len(c))), lanes,
                  np.nan_to_num(prefixed), ([float(v) for v in dense], [float(v) for v in lone]))


_memo = lru_cache(maxsize=16)(_prices)  # a few instances at a time (each holds an axis of every prompt length)
