"""The asynchronous pipelines in steady state, from their action tables (tables.py) and the one simulator
(simulator.py).

PipeDream (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP 2019) and
PipeDream-2BW (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021) never flush the
pipeline: step after step every rank alternates one forward and one backward (1F1B, PipeDream §3.2), so
after the one fill at the start of training a rank is never idle on equal stages. What they pay instead is memory:
a backward must use the weights its forward used, so a rank keeps those versions alive.

``steady_step``: the period of one step of m micro-batches once the pipeline is full, measured by ``simulate`` on a
table of several consecutive steps (``build(..., steps=S)``): the time between the ends of two consecutive steps' last
backwards on each rank, past the fill and before the drain, the slowest rank's. With equal stages and t_p2p = 0 it is
m·(t_f + t_b), no bubble, where a 1F1B step with its flush takes (m + p − 1)·(t_f + t_b) (equal_ranks.step_time).

``table_weight_versions``: the most weight versions a rank holds at once, read off its row of the table: version k is
the weights after k updates; PipeDream updates after every backward (§3.3, weight stashing: each in-flight micro-batch
keeps the version its forward used), 2BW after every m-th (§3.1: gradients of m ≥ p micro-batches coalesced into one
update, the new version used by new forwards while in-flight ones finish on the old: double buffering). A rank holds the
current version and those of its in-flight micro-batches: p − r under PipeDream (PipeDream §3.3: the input stage holds
as many versions as micro-batches in flight), and under 2BW two, but one on the last rank (its forward and backward of a
micro-batch are adjacent, so no micro-batch is in flight across an update). memory.weight_versions is the closed form
the search uses; the tests check the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from meshplan.pipeline.names import ASYNC as ASYNC_SCHEDULES
from meshplan.pipeline.registry import REGISTRY
from meshplan.pipeline.simulator import Times, simulate
from meshplan.pipeline.tables import Action, Table, build


def steady_step(schedule: str, pp: int, micro_batches: int, t_fwd: Times, t_bwd: Times, t_p2p: Times = 0.0) -> float:
    """Seconds per step of ``micro_batches`` micro-batches of an asynchronous ``schedule`` once the pipeline is full
    (module docstring); the times as ``simulate`` takes them."""
    if schedule not in REGISTRY or REGISTRY[schedule].flushes:
        raise ValueError(f"schedule={schedule!r}: steady_step times the asynchronous schedules "
                         f"({', '.join(ASYNC_SCHEDULES)}); a synchronous step is simulator.simulate's")
    m = micro_batches
    fill = math.ceil(2 * pp / m)  # steps the fill and the drain can reach into, at either end
    steps = 2 * fill + 2
    table = build(schedule, pp, m, steps=steps)
    timeline = simulate(table, t_fwd, t_bwd, t_p2p)
    k = fill + 1  # step k − 1 starts after the fill; step k ends before the drain
    period = 0.0
    for row, ends in zip(table, timeline.ends, strict=True):
        last_b = {a.micro: end for a, end in zip(row, ends, strict=True) if a.kind == "B"}
        period = max(period, last_b[(k + 1) * m - 1] - last_b[k * m - 1])
    return period


def table_weight_versions(table: Table, every: int) -> tuple[int, ...]:
    """Per rank, the most weight versions alive at once when the weights are updated after every ``every``-th
    backward of a micro-batch (1: PipeDream; m: PipeDream-2BW; a synchronous schedule updates only after its flush,
    so one version)."""
    if not isinstance(every, int) or every < 1:
        raise ValueError(f"every={every!r} must be a positive integer (backwards per weight update)")
    return tuple(_row_versions(row, every) for row in table)


def _row_versions(row: Sequence[Action], every: int) -> int:
    version = peak = 0
    used: dict[int, int] = {}  # in-flight micro-batch -> the version its forward used
    done = 0  # backwards run on this rank
    for a in row:
        if a.kind == "F":
            used[a.micro] = version
        else:
            used.pop(a.micro)
            done += 1
            version += done % every == 0
        peak = max(peak, len(set(used.values()) | {version}))
    return peak
