"""The ranking a search returns, in float64: the plans the shares kept (best.py, float32 sums) re-estimated with
``estimate()`` and ranked again, so that the plan listed first is the same whatever the number listed (``top_k``).

By time alone (``Space.prefer_simple`` False): the fastest first (ties: less memory, then a fixed order of the plan
fields). By default (``prefer_simple``): the fastest plan leads, and its step time T sets the band T × (1 + b) (b: the
ranking band, bands.py, within which the model cannot tell two plans apart); every other feasible plan within it
follows (the shares kept all that can), the simplest of them first (``best.simplicity``: fewer parallel axes and
offloads), then the lighter, then the faster; the plans outside the band after them, fastest first. #1 is then the
fastest plan, whose time T more bandwidth or FLOP/s can only lower (issue 48: a faster machine never makes the
recommendation slower), and the simpler equivalents are the rows right under it. ``Space.simplest_leads`` puts the
simplest of the band first instead (issue 36's rule): #1 is then at most (1 + b) × T, but a faster machine can bring
a simpler, slower plan into the band, which then leads slower than the old #1 (no rule that can rank a slower plan
first avoids that: tests/test_fastest_first.py).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from meshplan.estimate import Estimate, estimate
from meshplan.search.best import RANK_SLACK, Best, plan_key, simplicity
from meshplan.search.space import Space
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan


def fastest_kept(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, kept: list[Best], n: int
                 ) -> tuple[Estimate, ...]:
    """The ``n`` fastest plans every share ``kept``, estimated (by the shares' float32 sums' order)."""
    rows = sorted((row for best in kept for row in best.rows), key=lambda r: (r[0], r[1], r[2][0]))[:n]
    return tuple(estimate(model, cluster, key[1], space.stack, eff) for _, _, key in rows)


def ranked(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, kept: list[Best], top_k: int
           ) -> tuple[tuple[Estimate, ...], Estimate | None]:
    """(the ``top_k`` plans in the search's order, the fastest plan) from what every share ``kept``."""
    cache: dict[Plan, Estimate] = {}

    def priced(plan: Plan) -> Estimate:
        if plan not in cache:
            cache[plan] = estimate(model, cluster, plan, space.stack, eff)
        return cache[plan]

    rows = sorted((row for best in kept for row in best.rows), key=lambda r: (r[0], r[1], r[2][0]))
    if not rows:
        return (), None
    # re-estimate the leaders in float64 (the shares ranked float32 sums) and rank them again: the fastest is the
    # float64 fastest of the plans as fast as the first to the float32 sums' precision
    tied = sum(r[0] <= rows[0][0] * (1 + 2 * RANK_SLACK) for r in rows)
    fastest = min((priced(key[1]) for _, _, key in rows[:tied]), key=_by_time)

    def by_time() -> list[Estimate]:
        return sorted((priced(key[1]) for _, _, key in rows[: max(2 * top_k + 2, tied)]), key=_by_time)

    if not space.prefer_simple:
        return tuple(by_time()[:top_k]), fastest
    limit = fastest.step_time * (1 + fastest.ranking_band)
    close = _within(kept, limit, top_k, priced)
    if not space.simplest_leads:
        close = [fastest, *(e for e in close if e.plan != fastest.plan)][:top_k]
    if len(close) >= top_k:
        return tuple(close[:top_k]), fastest
    chosen = {e.plan for e in close}
    rest = [e for e in by_time() if e.plan not in chosen and e.step_time > limit]
    return tuple((close + rest)[:top_k]), fastest


def _within(kept: list[Best], limit: float, top_k: int, priced: Callable[[Plan], Estimate]) -> list[Estimate]:
    """The ``top_k`` first of the plans within ``limit`` (float64), simplest first: the shares' candidates walked
    in their float32 order, each re-estimated, until ``top_k`` are within it (or none is left), ranked again in
    float64."""
    times = np.concatenate([b.close[0] for b in kept])
    peaks = np.concatenate([b.close[1] for b in kept])
    simple = np.concatenate([b.close[2] for b in kept])
    keys = [key for b in kept for key in b.close_keys]
    maybe = np.flatnonzero(times <= limit * (1 + RANK_SLACK))
    order = sorted(maybe, key=lambda i: (simple[i], peaks[i], times[i], keys[i][0]))
    out: list[Estimate] = []
    for n, i in enumerate(order):
        if len(out) >= top_k and not _near(order[n - 1], i, simple, peaks, times):
            break  # and past the float32 near-ties of the last one, which float64 may rank before it
        est = priced(keys[i][1])
        if est.step_time <= limit:
            out.append(est)
    return sorted(out, key=_simple_first)[:top_k]


def _near(a: int | np.integer, b: int | np.integer, simple: np.ndarray, peaks: np.ndarray, times: np.ndarray) -> bool:
    """Whether float64 may rank candidate ``b`` (after ``a`` in the float32 order) before ``a``: as simple, as light
    to the float32 sums' precision and, where exactly as light, as fast to it."""
    light = peaks[b] <= peaks[a] * (1 + RANK_SLACK)
    fast = peaks[b] != peaks[a] or times[b] <= times[a] * (1 + RANK_SLACK)
    return bool(simple[a] == simple[b] and light and fast)


def _by_time(e: Estimate) -> tuple:
    return (e.step_time, e.peak_memory, plan_key(e.plan)[0])


def _simple_first(e: Estimate) -> tuple:
    return (simplicity(e.plan), e.peak_memory, e.step_time, plan_key(e.plan)[0])
