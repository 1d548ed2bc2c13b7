"""A simulated schedule for the report (``PipelineRun``, plots.pipeline_run), and those of the split-backward and
two-direction schedules: their action tables (zero_bubble.py, zero_bubble_v.py, dualpipe.py, chimera.py) timed by the
shared event loop at the estimate's per-rank pass times (the two-chunk tables at the ranks' mean times: their
simulators take one time per pass)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from meshplan.pipeline.simulator import Timeline
from meshplan.pipeline.tables import Table
from meshplan.pipeline.timelines import split_timeline


@dataclass(frozen=True)
class PipelineRun:
    """The plan's schedule table simulated with the estimate's per-chunk times."""

    schedule: str
    pp: int
    vpp: int
    micro_batches: int
    t_fwd: tuple[float, ...]  # per rank, per micro-batch per chunk, with the exposed TP / CP / EP / p2p time
    t_bwd: tuple[float, ...]  # the same for the backward pass (recompute included)
    table: Table  # zero_bubble.SplitTable for the split-backward schedules (F, B and W actions, the same fields)
    timeline: Timeline

    def idle(self) -> list[list[tuple[float, float]]]:
        """(start, length) of every idle interval of every rank within [0, step time]."""
        out, tiny = [], 1e-12 * max(1.0, self.timeline.step_time)
        for starts, ends in zip(self.timeline.starts, self.timeline.ends, strict=True):
            gaps, t = [], 0.0
            for s, e in zip(starts, ends, strict=True):  # a rank runs its row in order: starts never decrease
                if s - t > tiny:
                    gaps.append((t, s - t))
                if e > t:
                    t = e
            if self.timeline.step_time - t > tiny:
                gaps.append((t, self.timeline.step_time - t))
            out.append(gaps)
        return out


def split_run(schedule: str, pp: int, m: int, t_f: Sequence[float], t_b: Sequence[float]) -> PipelineRun | None:
    """The simulated table of ``schedule`` (F, B and W actions; B and W half the backward each where split), or None
    for a schedule of tables.build (pipeline/timelines.split_timeline)."""
    t_f, t_b = tuple(t_f), tuple(t_b)
    found = split_timeline(schedule, pp, m, t_f, t_b)
    if found is None:
        return None
    name, vpp, table, line = found
    return PipelineRun(schedule=name, pp=pp, vpp=vpp, micro_batches=m, t_fwd=t_f, t_bwd=t_b,
                       table=cast("Table", table), timeline=line)
