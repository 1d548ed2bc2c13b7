"""A simulated schedule for the report (``PipelineRun``, plots.pipeline_run), and those of the split-backward and
two-direction schedules: their action tables (zero_bubble.py, zero_bubble_v.py, dualpipe.py, chimera.py) timed by the
shared event loop at the estimate's per-rank pass times (the two-chunk tables at the ranks' mean times: their
simulators take one time per pass)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from meshplan.pipeline.schedule import Table, Timeline


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
    for a schedule of schedule.build (and for DualPipe with m < 2·pp, which DeepSeek's library refuses: ZB-H1's
    table, named so)."""
    t_f, t_b = tuple(t_f), tuple(t_b)
    f, b = sum(t_f) / len(t_f), sum(t_b) / len(t_b)
    if schedule == "zb-v":  # its V of two chunks per rank
        from meshplan.pipeline.zero_bubble_v import build_zb_v, simulate_routes, v_route
        table = build_zb_v(pp, m)
        line = simulate_routes(table, v_route(pp), f, b / 2, b / 2)
    elif schedule == "dualpipe" and pp % 2 == 0 and m % 2 == 0 and m >= 2 * pp:  # both directions, two chunks
        from meshplan.pipeline.dualpipe import build_dualpipe, simulate_dualpipe
        table, line = build_dualpipe(pp, m), simulate_dualpipe(pp, m, f, b / 2, b / 2)
    elif schedule == "chimera":  # both directions, two chunks, the backward whole
        from meshplan.pipeline.chimera import build_chimera, simulate_chimera
        table, line = build_chimera(pp, m), simulate_chimera(pp, m, f, b)
    elif schedule in ("zb-h1", "dualpipe"):  # one chunk per rank, at each rank's own times
        from meshplan.pipeline.zero_bubble import build_zb_h1, simulate_split
        name = "zb-h1" if schedule == "zb-h1" else "zb-h1 (dualpipe's table needs m >= 2*pp)"
        split, half = build_zb_h1(pp, m), tuple(x / 2 for x in t_b)
        return PipelineRun(schedule=name, pp=pp, vpp=1, micro_batches=m, t_fwd=t_f, t_bwd=t_b,
                           table=cast("Table", split), timeline=simulate_split(split, t_f, half, half))
    else:
        return None
    return PipelineRun(schedule=schedule, pp=pp, vpp=2, micro_batches=m, t_fwd=t_f, t_bwd=t_b,
                       table=cast("Table", table), timeline=line)
