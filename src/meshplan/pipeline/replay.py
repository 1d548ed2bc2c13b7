"""The event replay behind ``simulator.simulate``: run a rank's row of a schedule table in order until an action waits
on another rank's, then the next ready rank's; each action's dependency (simulator.py's module docstring: F(s − 1, j)
before F(s, j), B(s + 1, j) before B(s, j), the last virtual stage's F before its B) resolved once per table."""

from __future__ import annotations

from typing import Any

# tables.Table of tables.Action, typed loosely (the simulator, simulator.py, passes them)
_Table = tuple[tuple[Any, ...], ...]


def _dependency(a: Any, pp: int, m: int, stages: int) -> tuple[str, int, bool] | None:
    """What ``a`` waits for, as (kind, index s·m + j, on another rank): F(s − 1, j) for a forward, B(s + 1, j) for a
    backward, F(V − 1, j) on the same rank for a backward of the last virtual stage; nothing for F(0, j)."""
    s = a.chunk * pp + a.stage
    key = s * m + a.micro
    if a.kind == "F":
        return None if s == 0 else ("F", key - m, (s - 1) % pp != a.stage)
    if s == stages - 1:
        return "F", key, False
    return "B", key + m, (s + 1) % pp != a.stage


def replay_table(table: _Table, durations: dict[str, list[float]], p2p: list[float], m: int
            ) -> tuple[list[float], list[list[float]], list[list[float]]]:
    """Run a rank's row in order until an action waits on another rank's, then the next ready rank's: the time each
    rank is done, and the start and end of each action. Raises ValueError if the table deadlocks."""
    pp, stages = len(table), len(durations["F"])
    steps = _compiled(table, pp, m, stages)
    duration = durations["F"] + durations["B"]  # flat: F of virtual stage s at s, B at stages + s
    hops = p2p + [0.0]  # index -1: no hop
    n = stages * m
    done: list[float | None] = [None] * (2 * n)  # finish of F(s, j) at s·m + j, of B(s, j) at n + s·m + j
    wait: list[int | None] = [None] * (2 * n)  # the (single) rank blocked on each
    nxt = [0] * pp  # index of each rank's next action
    free = [0.0] * pp  # time each rank becomes free
    starts = [[0.0] * len(row) for row in table]
    ends = [[0.0] * len(row) for row in table]
    ready_ranks = list(range(pp))
    while ready_ranks:
        r = ready_ranks.pop()
        row, i, t = steps[r], nxt[r], free[r]
        begin, finish_at = starts[r], ends[r]
        while i < len(row):
            own, dep, hop, dur = row[i]
            if dep >= 0:
                finish = done[dep]
                if finish is None:
                    wait[dep] = r
                    break
                ready = finish + hops[hop]
                start = t if t >= ready else ready
            else:
                start = t
            t = done[own] = start + duration[dur]
            begin[i], finish_at[i] = start, t
            waiter = wait[own]
            if waiter is not None and waiter != r:
                ready_ranks.append(waiter)
            i += 1
        nxt[r], free[r] = i, t
    stuck = [str(table[r][nxt[r]]) for r in range(pp) if nxt[r] < len(table[r])]
    if stuck:
        raise ValueError(f"schedule deadlocks: ranks wait forever at {', '.join(stuck)}")
    return free, starts, ends


_COMPILED: dict[int, tuple[_Table, list[list[tuple[int, int, int, int]]]]] = {}


def _compiled(table: _Table, pp: int, m: int, stages: int) -> list[list[tuple[int, int, int, int]]]:
    """Each rank's actions as (its slot in the finish times, the slot it waits for or -1, the p2p hop it pays or
    -1, its duration's index): ``_dependency`` resolved once per table (``build``'s tables recur: kept by identity,
    the last 32)."""
    hit = _COMPILED.get(id(table))
    if hit is not None and hit[0] is table:
        return hit[1]
    n = stages * m
    out = []
    for r, row in enumerate(table):
        steps = []
        for a in row:
            s = a.chunk * pp + r
            backward = a.kind == "B"
            own = s * m + a.micro + n * backward
            dep, hop = _dependency(a, pp, m, stages), -1
            slot = -1
            if dep is not None:
                kind, key, across = dep
                slot = key + n * (kind == "B")
                hop = (s if backward else s - 1) if across else -1
            steps.append((own, slot, hop, s + stages * backward))
        out.append(steps)
    if len(_COMPILED) >= 32:  # about 1.6 MB a 23,000-action table
        _COMPILED.pop(next(iter(_COMPILED)))
    _COMPILED[id(table)] = (table, out)
    return out
