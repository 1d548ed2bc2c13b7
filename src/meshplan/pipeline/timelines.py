"""The split-backward and two-direction schedules' simulated tables for the report (report/split_runs.py): each one's
action table (zero_bubble.py, zero_bubble_v.py, dualpipe.py, chimera.py) timed by the shared event loop at the
estimate's per-rank pass times, B and W half the backward each where the backward is split (the two-chunk tables at
the ranks' mean times, as the report has always drawn them).

Each builder below is one record's (registry.py: its ``timeline`` names it, "" for tables.build's tables); the
record names it, not holds it, so that the tables load only when a report draws them (tests/test_startup.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meshplan.pipeline.registry import schedule_of, zero_bubble_h1
from meshplan.pipeline.simulator import Timeline
from meshplan.pipeline.zero_bubble import SplitTable

Drawn = tuple[str, int, SplitTable, Timeline]  # (the name to show, chunks per rank, the table, its timeline)


def _means(t_f: Sequence[float], t_b: Sequence[float]) -> tuple[float, float]:
    return sum(t_f) / len(t_f), sum(t_b) / len(t_b)


def zb_h1_table(name: str, pp: int, m: int, t_f: Sequence[float], t_b: Sequence[float]) -> Drawn:
    """One chunk per rank, at each rank's own times."""
    from meshplan.pipeline.zero_bubble import build_zb_h1, simulate_split
    split, half = build_zb_h1(pp, m), tuple(x / 2 for x in t_b)
    return name, 1, split, simulate_split(split, tuple(t_f), half, half)


def zb_v_table(name: str, pp: int, m: int, t_f: Sequence[float], t_b: Sequence[float]) -> Drawn:
    """Its V of two chunks per rank."""
    from meshplan.pipeline.zero_bubble_v import build_zb_v, simulate_routes, v_route
    (f, b), table = _means(t_f, t_b), build_zb_v(pp, m)
    return name, 2, table, simulate_routes(table, v_route(pp), f, b / 2, b / 2)


def dualpipe_table(name: str, pp: int, m: int, t_f: Sequence[float], t_b: Sequence[float]) -> Drawn:
    """Both directions, two chunks; with m < 2·pp (or p, m odd), which DeepSeek's library refuses, ZB-H1's table,
    named so."""
    if not (pp % 2 == 0 and m % 2 == 0 and m >= 2 * pp):
        return zb_h1_table(f"{zero_bubble_h1().name} ({name}'s table needs m >= 2*pp)", pp, m, t_f, t_b)
    from meshplan.pipeline.dualpipe import build_dualpipe, simulate_dualpipe
    f, b = _means(t_f, t_b)
    return name, 2, build_dualpipe(pp, m), simulate_dualpipe(pp, m, f, b / 2, b / 2)


def chimera_table(name: str, pp: int, m: int, t_f: Sequence[float], t_b: Sequence[float]) -> Drawn:
    """Both directions, two chunks, the backward whole."""
    from meshplan.pipeline.chimera import build_chimera, simulate_chimera
    f, b = _means(t_f, t_b)
    return name, 2, build_chimera(pp, m), simulate_chimera(pp, m, f, b)


BUILDERS: dict[str, Callable[[str, int, int, Sequence[float], Sequence[float]], Drawn]] = {
    f.__name__: f for f in (zb_h1_table, zb_v_table, dualpipe_table, chimera_table)}


def split_timeline(schedule: str, pp: int, m: int, t_f: Sequence[float], t_b: Sequence[float]) -> Drawn | None:
    """(the name to show, chunks per rank, the table, its timeline) of ``schedule`` by its record's builder, or None
    for a schedule of tables.build's."""
    record = schedule_of(schedule)
    return BUILDERS[record.timeline](record.name, pp, m, t_f, t_b) if record.timeline else None
