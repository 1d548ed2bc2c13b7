"""The ranking a search returns, in float64: the plans the shares kept (best.py, float32 sums) re-estimated with
``estimate()`` and ranked again, so that the plan listed first and the fastest plan are the same whatever the number
listed (``top_k``): both are drawn from the fastest rows, which every share keeps whatever its k, and the refinements
after the ranking (search/run.py ``_refined``: the end stages, each rank's settings, the stage DP) read only them and
the search's ``stage_pool.POOL`` fastest plans, which every share keeps too (``run._kept``), never the plans listed
(tests/test_top_k.py). The number listed moves only the rows under #1, and, where distinct plans tie exactly in float32
time and memory at the edge of what a share keeps, which of them it kept (``Best.offer``: the first it saw).

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

import bisect
from collections.abc import Callable
from contextvars import ContextVar

import numpy as np

from meshplan.estimate import Estimate, estimate
from meshplan.search.best import RANK_SLACK, Best, plan_key, simplicity
from meshplan.search.space import Space
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan

_Pricing = Callable[[Plan], Estimate]
_Ranking = tuple[tuple[Estimate, ...], Estimate]
# A caller's own ranking of what the shares kept (search/by_goodput.py's, by expected time), given the kept rows
# (``kept_rows``), the number to keep, the search's pricing and its refinement of a ranking by time (search/run.py):
# (plans, fastest, an exactness test's answer), or None where it needs the ranking by time in full.
LazyRanking = Callable[[list[tuple], int, _Pricing, Callable[[tuple[Estimate, ...], Estimate], _Ranking]],
                       tuple[tuple[Estimate, ...], Estimate, bool] | None]
LAZY_RANKING: ContextVar[LazyRanking | None] = ContextVar("LAZY_RANKING", default=None)


def pricer(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency) -> _Pricing:
    """``estimate()`` of a plan on ``cluster``, each plan estimated once: the ranking, the pool of the stage DP and
    the refinements of one search share it (search/run.py)."""
    cache: dict[Plan, Estimate] = {}

    def priced(plan: Plan) -> Estimate:
        if plan not in cache:
            cache[plan] = estimate(model, cluster, plan, space.stack, eff)
        return cache[plan]

    return priced


def kept_rows(kept: list[Best]) -> list[tuple]:
    """Every share's kept rows, in float32 order (time, peak, then a fixed order of the plan fields)."""
    return sorted((row for best in kept for row in best.rows), key=lambda r: (r[0], r[1], r[2][0]))


def fastest_kept(priced: _Pricing, kept: list[Best], n: int, keep: Callable[[Plan], bool], first: int,
                 known: tuple[Estimate, ...] = ()) -> tuple[Estimate, ...]:
    """Of the ``n`` fastest plans every share ``kept`` (by the shares' float32 sums' order), those ``keep`` accepts
    that can be among the ``first`` fastest (float64) of them and of ``known``'s, estimated: the rest, slower in
    float32 than the ``first``-th found by more than the float32 slack, cannot be, and are not estimated."""
    seen = {e.plan: e for e in known}  # each plan once, wherever ``known`` repeats it (the first is the fastest)
    times = sorted(e.step_time for e in seen.values() if keep(e.plan))
    out = []
    for time32, _, key in kept_rows(kept)[:n]:
        if key[1] in seen or not keep(key[1]):
            continue
        if len(times) >= first and time32 > times[first - 1] * (1 + 2 * RANK_SLACK):
            break  # and every row after it, slower still
        out.append(priced(key[1]))
        bisect.insort(times, out[-1].step_time)
    return tuple(out)


def ranked(model: ModelSpec, cluster: Cluster, space: Space, eff: Efficiency, kept: list[Best], top_k: int,
           priced: _Pricing | None = None, led: Led | None = None) -> tuple[tuple[Estimate, ...], Estimate | None]:
    """(the ``top_k`` plans in the search's order, the fastest plan) from what every share ``kept``; ``priced``:
    the search's estimates (``pricer``); ``led``: ``leader``'s answer for them, where known."""
    priced = priced or pricer(model, cluster, space, eff)
    rows, tied, fastest = led or leader(kept, priced) or ([], 0, None)
    if fastest is None:
        return (), None
    head = rows[: max(2 * top_k + 2, tied)]
    if not space.prefer_simple:
        return tuple(_by_time_first(head, top_k, priced)), fastest
    limit = fastest.step_time * (1 + fastest.ranking_band)
    # the fastest leads unless the simplest does: listing one, it is the list (the strong-scaling table: cli/plan.py)
    close = _within(kept, limit, top_k, priced) if space.simplest_leads or top_k > 1 else []
    if not space.simplest_leads:
        close = [fastest, *(e for e in close if e.plan != fastest.plan)][:top_k]
    if len(close) >= top_k:
        return tuple(close[:top_k]), fastest
    chosen = {e.plan for e in close}
    rest = [e for e in sorted(map(priced, (key[1] for _, _, key in head)), key=by_time)
            if e.plan not in chosen and e.step_time > limit]
    return tuple((close + rest)[:top_k]), fastest


# the kept rows (``kept_rows``), how many of them tie with the first in float32, and the fastest of those in float64
Led = tuple[list[tuple], int, Estimate]


def leader(kept: list[Best], priced: _Pricing) -> Led | None:
    """``ranked``'s fastest plan, without the ranking (``leads_ranking``: it is then the first plan listed), with the
    rows it was drawn from (``Led``: ``ranked`` takes them), None where no share kept a plan. The leaders re-estimated
    in float64 (the shares ranked float32 sums) and ranked again: the fastest is the float64 fastest of the plans as
    fast as the first to the float32 sums' precision."""
    rows = kept_rows(kept)
    if not rows:
        return None
    tied = sum(r[0] <= rows[0][0] * (1 + 2 * RANK_SLACK) for r in rows)
    return rows, tied, min((priced(key[1]) for _, _, key in rows[:tied]), key=by_time)


def leads_ranking(space: Space, top_k: int) -> bool:
    """Whether ``ranked``'s first plan is its fastest, whatever the other rows: ranking by time with the simpler
    plans of the band after the fastest (``prefer_simple`` without ``simplest_leads``), one plan or more listed."""
    return space.prefer_simple and not space.simplest_leads and top_k >= 1


def _by_time_first(rows: list[tuple], top_k: int, priced: _Pricing) -> list[Estimate]:
    """The ``top_k`` fastest of ``rows`` (float32 order) in float64, fastest first: the rows walked in their order,
    each estimated, until the next is slower in float32 than the ``top_k``-th found by more than the float32 slack
    (then it and every row after it are slower in float64 too, and none of them can be among the ``top_k``)."""
    out: list[Estimate] = []
    times: list[float] = []
    for time32, _, key in rows:
        if len(times) >= top_k and time32 > times[top_k - 1] * (1 + 2 * RANK_SLACK):
            break
        out.append(priced(key[1]))
        bisect.insort(times, out[-1].step_time)
    return sorted(out, key=by_time)[:top_k]


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


def by_time(e: Estimate) -> tuple:
    return (e.step_time, e.peak_memory, plan_key(e.plan)[0])


def _simple_first(e: Estimate) -> tuple:
    return (simplicity(e.plan), e.peak_memory, e.step_time, plan_key(e.plan)[0])
