"""The split-backward and two-direction schedules' simulated tables for the report (report/split_runs.py): each one's
action table (zero_bubble.py, zero_bubble_v.py, dualpipe.py, chimera.py) timed by the shared event loop at the
estimate's per-rank pass times, B and W half the backward each where the backward is split (the two-chunk tables at
the ranks' mean times, as the report has always drawn them)."""

from __future__ import annotations

from collections.abc import Sequence

from meshplan.pipeline.schedule import Timeline
from meshplan.pipeline.zero_bubble import SplitTable


def split_timeline(schedule: str, pp: int, m: int, t_f: Sequence[float], t_b: Sequence[float]
                   ) -> tuple[str, int, SplitTable, Timeline] | None:
    """(the name to show, chunks per rank, the table, its timeline) of ``schedule``, or None for a schedule of
    schedule.build's (and DualPipe with m < 2·pp, which DeepSeek's library refuses, shows ZB-H1's table, named so)."""
    f, b = sum(t_f) / len(t_f), sum(t_b) / len(t_b)
    if schedule == "zb-v":  # its V of two chunks per rank
        from meshplan.pipeline.zero_bubble_v import build_zb_v, simulate_routes, v_route
        table = build_zb_v(pp, m)
        return schedule, 2, table, simulate_routes(table, v_route(pp), f, b / 2, b / 2)
    if schedule == "dualpipe" and pp % 2 == 0 and m % 2 == 0 and m >= 2 * pp:  # both directions, two chunks
        from meshplan.pipeline.dualpipe import build_dualpipe, simulate_dualpipe
        return schedule, 2, build_dualpipe(pp, m), simulate_dualpipe(pp, m, f, b / 2, b / 2)
    if schedule == "chimera":  # both directions, two chunks, the backward whole
        from meshplan.pipeline.chimera import build_chimera, simulate_chimera
        return schedule, 2, build_chimera(pp, m), simulate_chimera(pp, m, f, b)
    if schedule in ("zb-h1", "dualpipe"):  # one chunk per rank, at each rank's own times
        from meshplan.pipeline.zero_bubble import build_zb_h1, simulate_split
        name = "zb-h1" if schedule == "zb-h1" else "zb-h1 (dualpipe's table needs m >= 2*pp)"
        split, half = build_zb_h1(pp, m), tuple(x / 2 for x in t_b)
        return name, 1, split, simulate_split(split, tuple(t_f), half, half)
    return None
