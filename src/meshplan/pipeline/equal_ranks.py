"""The closed forms of a named schedule's bubble, step time and activations in flight on equal stages with t_p2p = 0,
for the search path (tables.py's symbols); tests/test_schedule.py checks that they equal the simulator
(simulator.simulate on tables.build's table).

Bubble (Narayanan et al. 2021 §2.2.1): bubble time / ideal compute time (the busiest rank's busy time). With equal
stages and t_p2p = 0: (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved; (p − 1)/(m + p − 1) of a 1F1B step.

Activations in flight: the largest number of (micro-batch, chunk) pairs whose forward has run on a rank and
whose backward has not; activation memory of that rank = in-flight × activations of one micro-batch through
one chunk (1/v of the rank's layers). GPipe: m; 1F1B: min(p − r, m) (Narayanan et al. 2021 §2.2.1);
interleaved: min(w + 1, v·m) with w its warm-up count (tables.py, rules.interleaved_warmup); the asynchronous ones
p − r (no flush bounds it by m).
"""

from __future__ import annotations

from meshplan.pipeline.forms import RankTimes
from meshplan.pipeline.registry import REGISTRY
from meshplan.pipeline.tables import check_arguments, tabled


def bubble_fraction(schedule: str, pp: int, m: int, vpp: int = 1, *, group: int | None = None) -> float:
    """Bubble / ideal compute: (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved.

    The record's bubble (forms.line: ``bubble.flow_bubble``) of equal ranks, over m (Narayanan et al. 2021
    §2.2.1–2.2.2); independent of the interleaved group size N (checked by the tests). Asynchronous: 0 (forms.none:
    no flush; a run's one fill is amortised).
    """
    check_arguments(schedule, pp, m, vpp, group)
    return float(_equal_ranks_bubble(schedule, pp, m, vpp, 0.5, 0.5, 1.0)) / m


def bubble_time(schedule: str, pp: int, m: int, vpp: int, t_fwd: float, t_bwd: float, *,
                group: int | None = None) -> float:
    """Idle time of the step on equal stages, the record's bubble (``bubble.flow_bubble``) of ranks of v·(t_f + t_b)
    each: (p − 1)·(t_f + t_b) with t_f, t_b per chunk as in ``simulate``, the paper's (p − 1)·(T_f + T_b)/v (Narayanan
    et al. 2021 §2.2.2). With t_p2p > 0 the p2p latency also stalls the steady state, so use ``simulate``.
    Asynchronous: 0 (steady.py).
    """
    check_arguments(schedule, pp, m, vpp, group)
    return float(_equal_ranks_bubble(schedule, pp, m, vpp, vpp * t_fwd, vpp * t_bwd, vpp * (t_fwd + t_bwd)))


def _equal_ranks_bubble(schedule: str, pp: int, m: int, vpp: int, fwd: float, bwd: float, whole: float) -> float:
    """The record's bubble (forms.py) of p ranks alike, each ``fwd`` + ``bwd`` = ``whole`` per micro-batch."""
    rank = (fwd, bwd, whole)
    return float(REGISTRY[schedule].bubble(RankTimes.of_ends(pp, rank, rank, rank), vpp, m))


def step_time(schedule: str, pp: int, m: int, vpp: int, t_fwd: float, t_bwd: float, *,
              group: int | None = None) -> float:
    """(v·m + p − 1)·(t_f + t_b): the ideal v·m·(t_f + t_b) plus ``bubble_time``."""
    return vpp * m * (t_fwd + t_bwd) + bubble_time(schedule, pp, m, vpp, t_fwd, t_bwd, group=group)


def in_flight(schedule: str, pp: int, m: int, vpp: int, rank: int, *, group: int | None = None) -> int:
    """Peak (micro-batch, chunk) pairs held on ``rank``: GPipe m; 1F1B min(p − r, m); interleaved min(w + 1, v·m)
    with w = 2·(p − r − 1) + (v − 1)·N (Megatron-Core warm-up); asynchronous p − r (no flush: m does not bound it)."""
    n = check_arguments(schedule, pp, m, vpp, group)
    if not isinstance(rank, int) or not 0 <= rank < pp:
        raise ValueError(f"rank={rank!r} must be in [0, pp={pp})")
    record, warmup = tabled(schedule)
    if not record.flushes:  # no flush: m does not bound it (the record's rules.async_in_flight)
        return int(record.in_flight(pp, vpp, m, rank))
    return min(warmup(pp, m, vpp, n, rank) + 1, vpp * m)
