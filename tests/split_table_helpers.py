"""Validity checks of a two-direction action table and its timeline (tests/test_dualpipe.py, tests/test_chimera.py):
every micro-batch's F, B (and W) once on every rank of its route, F before B before W in each row, and each action
started only after what it waits for ended (plus the hop across ranks)."""

from __future__ import annotations

from meshplan.pipeline.simulator import Timeline
from meshplan.pipeline.zero_bubble import SplitTable
from meshplan.pipeline.zero_bubble_v import Route, route_dependency


def assert_table_valid(table: SplitTable, route: Route, micro_batches: int, kinds: str) -> None:
    """Each rank runs ``kinds`` (FBW or FB) of every micro-batch once, through the chunk its route puts there, in
    the order F, B, W."""
    for r, row in enumerate(table):
        want = sorted((k, j, c) for j in range(micro_batches) for (rank, c) in route(j) if rank == r for k in kinds)
        assert sorted((a.kind, a.micro, a.chunk) for a in row) == want, r
        where = {(a.kind, a.micro, a.chunk): i for i, a in enumerate(row)}
        for (kind, j, c), i in where.items():
            if kind != "F":
                assert where[("F" if kind == "B" else "B", j, c)] < i, (r, kind, j, c)


def assert_timeline_respects_dependencies(table: SplitTable, route: Route, line: Timeline, t_p2p: float) -> None:
    """Every action starts after each action it waits for (zero_bubble_v.route_dependency) ended, plus ``t_p2p``
    when that ran on another rank, and after the rank's action before it."""
    end = {(a.kind, a.stage, a.chunk, a.micro): e for row, ends in zip(table, line.ends, strict=True)
           for a, e in zip(row, ends, strict=True)}
    for r, (row, starts, ends) in enumerate(zip(table, line.starts, line.ends, strict=True)):
        for i, (a, s) in enumerate(zip(row, starts, strict=True)):
            assert i == 0 or s >= ends[i - 1] - 1e-12
            for dep in route_dependency(a, route):
                assert s >= end[dep] + (t_p2p if dep[1] != r else 0.0) - 1e-12, (str(a), dep)
