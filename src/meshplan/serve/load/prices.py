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
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from meshplan.cost.decode import Shape
from meshplan.serve.efficiency import SERVE_DEFAULT, ServeEfficiency
from meshplan.serve.engine import Engine
from meshplan.serve.estimate import plan_columns
from meshplan.serve.metrics import Setting
from meshplan.serve.plan import PlanColumns, ServePlan, Workload
from meshplan.serve.precision import Quant
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


def _at(model: ModelSpec, cluster: Cluster, cols: PlanColumns, quant: Quant, engine: Engine, eff: ServeEfficiency,
        context: Num) -> _AtContext:
    """One iteration of the instances ``cols`` attending to ``context`` tokens (the workload is not read)."""
    return _AtContext(model, cluster, cols, quant, engine, Workload(input_len=1, output_len=1), eff, context=context)


def _prefix_points(p: list[float], c: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """The prefix grid's points flattened: (prompt tokens, prefix) over (p, c)."""
    shape = (len(p), len(c))
    return (np.broadcast_to(np.asarray(p).reshape(-1, 1), shape).ravel(), np.broadcast_to(np.asarray(c), shape).ravel())


def _prefix_grid(values: np.ndarray, p: list[float], c: list[float]) -> list:
    """A chunk after each prefix less the same chunk with none (the prefix-0 column: c[0] = 0), from ``values`` at
    ``_prefix_points``."""
    chunk = values.reshape(len(p), len(c))
    return np.nan_to_num(chunk - chunk[:, :1]).tolist()


# tokens between the points of the prompt-only axis (Prices.alone): every count, since a GEMM's price steps with its
# tiles (a 992-token prefill of Llama 3 8B on an A100 takes 71.0 ms, 1,000 tokens 72.2 ms, 1,008 tokens 72.3 ms)
ALONE_STEP = 1
# that axis is priced as the simulation reads it: the block first read (a run of one prompt length reads one: most of
# the budget's points are never read), at the next miss every other block. A call of Setting.time costs about 4.5 ms
# of CPU whatever its size, all 8,193 points of vLLM's budget about 12 ms (Llama 3 70B on H100s, tp 2 pp 2)
LONE_BLOCK, LONE_CALLS = 512, 1


class Lone:
    """The prompt-only axis's prices (``axis``: every ALONE_STEP tokens to the budget), priced when first read, a
    block of ``LONE_BLOCK`` points at a time (after LONE_CALLS calls, prime's preset counting as one, every other
    at once, as the whole axis), with the prefix grid (Prices.prefixed) in the first call: ``price(points, grid)``
    gives the points' values and, with ``grid``, that grid (each call of Setting.time has a fixed cost of a few
    milliseconds, the size of a few thousand points' work).
    A point's value does not depend on the others priced beside it (Setting.time is element-wise), so the values
    are those of the whole axis priced at once."""

    def __init__(self, axis: list[float], price: Callable[[np.ndarray, bool], tuple[np.ndarray, list | None]]
                 ) -> None:
        self.axis, self.points, self.price = axis, np.asarray(axis), price
        self.values: list[float] = [0.0] * len(axis)
        self.blocks: set[int] = set()
        self.grid: list | None = None
        self.calls, self.primed = 0, False  # fills, and whether prime preset a block

    def __call__(self, x: float) -> float:
        """The price at ``x`` tokens, linear between the axis's points (prices._where)."""
        q, w = _where(self.axis, x)
        if q // LONE_BLOCK not in self.blocks or (q + 1) // LONE_BLOCK not in self.blocks:
            self._fill({q // LONE_BLOCK, (q + 1) // LONE_BLOCK})
        v = self.values
        return v[q] + w * (v[q + 1] - v[q])

    def prefixed(self) -> list:
        """The prefix grid (priced now if no block has been)."""
        if self.grid is None:
            self._fill(set())
        return self.grid  # type: ignore[return-value]  # _fill set it

    def blocks_at(self, x: float) -> list[int]:
        """The blocks a read at ``x`` tokens needs."""
        q = _where(self.axis, x)[0]
        return sorted({q // LONE_BLOCK, (q + 1) // LONE_BLOCK})

    def span(self, blocks: list[int]) -> np.ndarray:
        """The axis's indices of ``blocks``."""
        if not blocks:
            return np.arange(0)
        return np.concatenate([np.arange(b * LONE_BLOCK, min((b + 1) * LONE_BLOCK, len(self.axis))) for b in blocks])

    def preset(self, blocks: list[int], values: np.ndarray, grid: list) -> None:
        """``blocks``' values and the prefix grid, priced elsewhere (prices.prime): no call of this one's."""
        for i, v in zip(self.span(blocks).tolist(), values.tolist(), strict=True):
            self.values[i] = v
        self.blocks.update(blocks)
        self.grid = grid
        self.primed = True  # counted as a call of its own: the next miss prices every other block

    def _fill(self, wanted: set[int]) -> None:
        count = -(-len(self.axis) // LONE_BLOCK)
        self.calls += 1
        every = self.calls + self.primed > LONE_CALLS
        todo = sorted((set(range(count)) if every else wanted) - self.blocks)
        if not todo and self.grid is not None:
            return
        # every block: the whole axis, the same bytes for instances of the same GEMMs (gemm_shape._MEMO keeps them)
        at = np.arange(len(self.axis)) if every else self.span(todo)
        values, grid = self.price(self.points[at], self.grid is None)
        for i, v in zip(at.tolist(), values.tolist(), strict=True):
            self.values[i] = v
        self.blocks.update(todo)
        if grid is not None:
            self.grid = grid


def _axis(top: float, dense: int, step: float) -> list[float]:
    """0, 1 … ``dense``, then about ``step``-fold steps to ``top`` (at least two points)."""
    points = [float(v) for v in range(0, int(min(dense, top)) + 1)]
    while points[-1] < top:
        points.append(min(max(points[-1] * step, points[-1] + 1), float(top)))
    return points if len(points) > 1 else [0.0, 1.0]


class Prices:
    """Seconds of one iteration at (decoding sequences, prompt tokens, mean context) of the whole instance."""

    def __init__(self, d: list[float], p: list[float], c: list[float], table: np.ndarray, lanes: int,
                 prefixed: np.ndarray | None = None, alone: Lone | None = None) -> None:
        self.d, self.p, self.c, self.lanes = d, p, c, lanes
        # an iteration of prompt tokens alone, on a dense axis (every ALONE_STEP tokens): a lone request's prefill
        # exactly as serve prices it (the low-rate limit), where the grid's prompt axis is √2-spaced
        self.alone = alone
        # lists along the context (faster to index than an array), each made when first read (all: ~3.5 ms a table)
        self._array, self._lines = table, [[None] * len(p) for _ in d]
        # seconds a chunk's attention to its prompt's cached prefix adds, over (prompt tokens, prefix) on (p, c)
        self.prefixed = None if prefixed is None else prefixed.tolist()  # else alone's, when first read
        self._knots: dict[float, list[float]] = {}
        self._d_last, self._p_last, self._c_last = len(d) - 2, len(p) - 2, len(c) - 2
        self._at_points = [_where(c, x) for x in c]  # each context point's segment and weight (``knots``)

    @property
    def table(self) -> list:
        """The whole table as nested lists (sequences, prompt tokens, context)."""
        return [[self._line(i, j) for j in range(len(self.p))] for i in range(len(self.d))]

    def _line(self, i: int, j: int) -> list[float]:  # the table along the context at point (i, j)
        line = self._lines[i][j]
        if line is None:
            line = self._lines[i][j] = self._array[i][j].tolist()
        return line

    def knots(self, decode: float) -> tuple[list[float], list[float]]:
        """A pure decode iteration's price at ``decode`` sequences as a function of the context: its values at the
        context axis's points, linear between them and past the ends (what ``__call__`` reads), so that a run of
        decode iterations sums in closed form (stretch.py)."""
        values = self._knots.get(decode)
        if values is None:
            values = self._knots[decode] = (self._decode_only(decode) if decode
                                             else [self(decode, 0.0, c) for c in self.c])
        return self.c, values

    def _decode_only(self, decode: float) -> list[float]:
        """``[self(decode, 0.0, c) for c in self.c]`` with ``_where`` of prefill 0 and of each context point read
        once: the same arithmetic, term by term (at the axis's own points g = 0, and 1 at the last, clamped)."""
        i, a = _where(self.d, decode / self.lanes)
        j, b = _where(self.p, 0.0)
        (r0, r1), (s0, s1) = ((self._line(i + n, j), self._line(i + n, j + 1)) for n in (0, 1))
        out = []
        for k, g in self._at_points:  # _bilinear at i, then at i + 1, written out
            lo0, hi0 = r0[k] + g * (r0[k + 1] - r0[k]), r1[k] + g * (r1[k + 1] - r1[k])
            lo1, hi1 = s0[k] + g * (s0[k + 1] - s0[k]), s1[k] + g * (s1[k + 1] - s1[k])
            lo, hi = lo0 + b * (hi0 - lo0), lo1 + b * (hi1 - lo1)
            out.append(lo + a * (hi - lo) + 0.0)
        return out

    def __call__(self, decode: float, prefill: float, context: float, prefix: float = 0.0) -> float:
        """The interpolated price (module docstring); past the grid's ends, the nearest points extrapolated
        (``_where`` and ``_bilinear`` written out: the simulation's hottest call)."""
        lanes = self.lanes
        if not decode and prefix <= 0 and self.alone is not None:
            return self.alone(prefill / lanes)
        d, p, c = self.d, self.p, self.c
        x = decode / lanes
        i = bisect_right(d, x) - 1
        i = 0 if i < 0 else (self._d_last if i > self._d_last else i)
        a = (x - d[i]) / (d[i + 1] - d[i])
        y = prefill / lanes
        j = bisect_right(p, y) - 1
        j = 0 if j < 0 else (self._p_last if j > self._p_last else j)
        b = (y - p[j]) / (p[j + 1] - p[j])
        k = bisect_right(c, context) - 1
        k = 0 if k < 0 else (self._c_last if k > self._c_last else k)
        g = (context - c[k]) / (c[k + 1] - c[k])
        t0, t1 = self._lines[i], self._lines[i + 1]
        r0, r1 = t0[j] or self._line(i, j), t0[j + 1] or self._line(i, j + 1)
        lo0 = r0[k] + g * (r0[k + 1] - r0[k])
        hi0 = r1[k] + g * (r1[k + 1] - r1[k])
        lo = lo0 + b * (hi0 - lo0)
        r0, r1 = t1[j] or self._line(i + 1, j), t1[j + 1] or self._line(i + 1, j + 1)
        lo1 = r0[k] + g * (r0[k + 1] - r0[k])
        hi1 = r1[k] + g * (r1[k + 1] - r1[k])
        hi = lo1 + b * (hi1 - lo1)
        extra = 0.0
        if prefix > 0 and prefill > 0:
            if self.prefixed is None and self.alone is not None:
                self.prefixed = self.alone.prefixed()
            if self.prefixed is not None:
                q, h = _where(c, prefix)
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
    pure function of them (a Prices only adds to its own memo of knots), and of one instance's (its replica counts
    apart); specs that do not hash are priced anew."""
    args = (model, cluster, plan.with_(replicas=1, prefill_replicas=0), engine, longest, eff, sampled)
    try:
        hash(args)
    except TypeError:
        return _prices(*args)
    if args not in _MEMO:
        _keep(args, _prices(*args))
    _MEMO.move_to_end(args)
    return _MEMO[args]


def prime(model: ModelSpec, cluster: Cluster, plans: list[ServePlan], engine: Engine, longest: int,
          prompt: float = 0.0, eff: ServeEfficiency = SERVE_DEFAULT) -> None:
    """The grids of several instances (``prices``, not sampled) priced in one call of Setting.time per quantisation
    scheme, the plans' columns as arrays (serve's metrics take a plan or an array of them alike, element by element;
    a call's fixed cost, a few milliseconds, is paid once, not once per plan) and their sequence axes padded to the
    longest with its last point (each plan's table is its own axis's rows), then kept for ``prices`` to return; in a
    second call, each one's prefix grid and the prompt-only block of a ``prompt``-token prefill (the first a run
    reads, where its requests start with such a prompt: Lone)."""
    try:
        one = [p.with_(replicas=1, prefill_replicas=0) for p in plans]
        todo = [p for p in dict.fromkeys(one) if (model, cluster, p, engine, longest, eff, False) not in _MEMO]
    except TypeError:  # specs that do not hash are priced one by one
        return
    for quant in dict.fromkeys(p.quant for p in todo):
        group = [p for p in todo if p.quant == quant][:GRID_MEMO_SIZE]
        if len(group) < 2:
            continue
        axes = [_axes(p, engine, longest) for p in group]
        p, c = axes[0][1], axes[0][2]
        top = max(len(d) for d, _, _ in axes)
        dd = np.array([d + [d[-1]] * (top - len(d)) for d, _, _ in axes]).reshape(-1, top, 1, 1)
        pp, cc = np.asarray(p).reshape(1, 1, -1, 1), np.asarray(c).reshape(1, 1, 1, -1)
        cols = _stacked(group, (-1, 1, 1, 1))
        setting = _at(model, cluster, cols, quant, engine, eff, cc)
        with np.errstate(all="ignore"):
            t = np.broadcast_to(np.asarray(setting.time(dd, pp, np.minimum(pp, 1.0), 0.0), dtype=float),
                                (len(group), top, len(p), len(c)))
        grids = [_finish(model, cluster, plan, engine, eff, False, (d, p, c), t[i, :len(d)])
                 for i, (plan, (d, _, _)) in enumerate(zip(group, axes, strict=True))]
        _prime_lone(model, cluster, [g.alone for g in grids], (_stacked(group, (-1, 1)), quant, engine, eff), (p, c),
                    [prompt / plan.pp / plan.dpa for plan in group])
        for plan, grid in zip(group, grids, strict=True):
            _keep((model, cluster, plan, engine, longest, eff, False), grid)


def _prime_lone(model: ModelSpec, cluster: Cluster, lones: list, how: tuple, axes: tuple, at: list[float]) -> None:
    """``prime``'s second call: each Lone's blocks for a read at ``at`` tokens, and its prefix grid (on the (p, c)
    axes ``axes``), the instances' columns as arrays (``how``: columns, quantisation, engine, efficiency)."""
    cols, quant, engine, eff = how
    p, c = axes
    blocks = [lone.blocks_at(x) for lone, x in zip(lones, at, strict=True)]
    spans = [lone.span(b) for lone, b in zip(lones, blocks, strict=True)]
    top = max(len(s) for s in spans)
    dense = np.array([lone.points[np.concatenate((s, np.full(top - len(s), s[-1])))]  # padded with its last
                      for lone, s in zip(lones, spans, strict=True)])
    grid_p, grid_q = _prefix_points(p, c)
    shape = (len(lones), top + len(grid_p))
    tokens = np.concatenate((dense, np.broadcast_to(grid_p, (len(lones), len(grid_p)))), axis=1)
    rows = np.concatenate((np.minimum(dense, 1.0), np.broadcast_to(np.minimum(grid_p, 1.0), (len(lones), len(grid_p)))),
                          axis=1)
    prefix = np.concatenate((np.zeros(dense.shape), np.broadcast_to(grid_q, (len(lones), len(grid_q)))), axis=1)
    setting = _at(model, cluster, cols, quant, engine, eff, 0.0)
    with np.errstate(all="ignore"):
        value = np.broadcast_to(np.asarray(setting.time(0.0, tokens, rows, prefix), dtype=float), shape)
        for i, (lone, b, s) in enumerate(zip(lones, blocks, spans, strict=True)):
            lone.preset(b, value[i, :len(s)], _prefix_grid(value[i, top:], p, c))


def _keep(args: tuple, grid: Prices) -> None:
    _MEMO[args] = grid
    if len(_MEMO) > GRID_MEMO_SIZE:
        _MEMO.popitem(last=False)


def _columns(plan: ServePlan) -> PlanColumns:
    return plan_columns(plan.with_(replicas=1, prefill_replicas=0))


def _stacked(plans: list[ServePlan], shape: tuple[int, ...]) -> PlanColumns:
    """One instance's columns of each of ``plans``, as arrays of ``shape``."""
    each = [_columns(p) for p in plans]

    def column(key: str) -> np.ndarray:
        return np.array([c[key] for c in each]).reshape(shape)  # type: ignore[literal-required]

    return PlanColumns(tp=column("tp"), pp=column("pp"), dpa=column("dpa"), ep=column("ep"), batch=column("batch"),
                       replicas=column("replicas"), prefill_replicas=column("prefill_replicas"))


def _axes(plan: ServePlan, engine: Engine, longest: int) -> tuple[list[float], list[float], list[float]]:
    """The grid's axes: decoding sequences per lane, prompt tokens per lane, context."""
    d = _axis(max(plan.batch / (plan.pp * plan.dpa), 1.0), 32, 1.15)
    p = [0.0] + [float(round(v)) for v in 2.0 ** (np.arange(8, 80) / 2) if v < engine.max_batched_tokens] + \
        [float(engine.max_batched_tokens)]
    c = [0.0] + [float(v) for v in 2.0 ** np.arange(4, 40) if v < longest] + [float(max(longest, 1))]
    return d, p, c


def _prices(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine, longest: int,
            eff: ServeEfficiency, sampled: bool) -> Prices:
    d, p, c = _axes(plan, engine, longest)
    # the axes apart (NumPy broadcasts them): an op that does not read the context (the GEMMs, the collectives) is
    # priced once per (sequences, prompt tokens), not once per grid point; each point's value is the same
    dd, pp, cc = (np.asarray(axis).reshape(shape) for axis, shape in
                  ((d, (-1, 1, 1)), (p, (1, -1, 1)), (c, (1, 1, -1))))
    setting = _at(model, cluster, _columns(plan), plan.quant, engine, eff, cc)
    with np.errstate(all="ignore"):
        t = setting.time(dd, pp, pp if sampled else np.minimum(pp, 1.0), 0.0)
    table = np.broadcast_to(np.asarray(t, dtype=float), (len(d), len(p), len(c)))
    return _finish(model, cluster, plan, engine, eff, sampled, (d, p, c), table)


def _finish(model: ModelSpec, cluster: Cluster, plan: ServePlan, engine: Engine, eff: ServeEfficiency,
            sampled: bool, axes: tuple[list[float], list[float], list[float]], table: np.ndarray) -> Prices:
    """The Prices of ``table`` on ``axes``, with its prompt-only axis and prefix grid priced when first read (Lone)."""
    d, p, c = axes
    alone = _at(model, cluster, _columns(plan), plan.quant, engine, eff, 0.0)
    # a chunk of p tokens after a prefix q of its prompt on (p, c), less the same chunk with none (_prefix_grid; each
    # point's value is the one it has alone)
    grid_p, grid_q = _prefix_points(p, c)

    def lone(points: np.ndarray, grid: bool) -> tuple[np.ndarray, list | None]:
        """Prompt tokens alone at ``points`` and, with ``grid``, the prefix grid, in one call (Lone)."""
        tokens, rows, prefix = points, points if sampled else np.minimum(points, 1.0), np.zeros(len(points))
        if grid:
            tokens, rows = np.concatenate((tokens, grid_p)), np.concatenate((rows, np.minimum(grid_p, 1.0)))
            prefix = np.concatenate((prefix, grid_q))
        with np.errstate(all="ignore"):
            value = np.broadcast_to(np.asarray(alone.time(0.0, tokens, rows, prefix), dtype=float), tokens.shape)
            after = _prefix_grid(value[len(points):], p, c) if grid else None
        return value[:len(points)], after

    top = float(engine.max_batched_tokens)
    return Prices(d, p, c, table, plan.pp * plan.dpa,
                  alone=Lone(np.append(np.arange(0.0, top, ALONE_STEP), top).tolist(), lone))


# a few instances at a time (each holds an axis of every prompt length), the most recently read kept
_MEMO: OrderedDict[tuple, Prices] = OrderedDict()
GRID_MEMO_SIZE = 16
