"""One event-driven simulator that times any schedule table (tables.py): ``simulate`` replays a table against the
pipeline's data dependencies and returns a ``Timeline`` (step time, per-action start/end, busy time, bubble,
activations in flight). Symbols as in tables.py.

Timing model (``simulate``)
    F(s, j) starts when its rank is free and F(s − 1, j) has finished (+ t_p2p if s − 1 is on another
    rank). B(s, j) needs B(s + 1, j) (+ t_p2p across ranks), and for the last virtual stage F(V − 1, j).
    Each rank runs its row in order, one action at a time. p2p is a pure latency on the edge (non-blocking
    send/recv); optimizer step, DP gradient reduction and recompute are outside this module (recompute is in t_b).

Bubble (Narayanan et al. 2021 §2.2.1): bubble time / ideal compute time (the busiest rank's busy time). With equal
stages and t_p2p = 0: (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved; (p − 1)/(m + p − 1) of a 1F1B step.
Activations in flight: the largest number of (micro-batch, chunk) pairs whose forward has run on a rank and
whose backward has not (equal_ranks.in_flight: their closed forms).
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from dataclasses import dataclass

from meshplan.pipeline.replay import replay_table
from meshplan.pipeline.tables import Action, Table

Times = float | Sequence[float]


@dataclass(frozen=True, slots=True)
class Timeline:
    """The timing of one table. ``starts`` / ``ends`` are aligned with the table (``[rank][i]``)."""

    step_time: float
    starts: tuple[tuple[float, ...], ...]
    ends: tuple[tuple[float, ...], ...]
    busy: tuple[float, ...]  # compute time per rank (sum of its actions' durations)
    max_in_flight: tuple[int, ...]  # per rank, in (micro-batch, chunk) units

    @property
    def ideal_time(self) -> float:
        """The step time without dependencies: the busiest rank's compute time."""
        return max(self.busy)

    @property
    def bubble_time(self) -> float:
        return self.step_time - self.ideal_time

    @property
    def bubble_fraction(self) -> float:
        """Bubble time / ideal compute time (Narayanan et al. 2021): (p − 1)/m for 1F1B."""
        return self.bubble_time / self.ideal_time if self.ideal_time else 0.0

    @property
    def idle_fraction(self) -> float:
        """Bubble time / step time: (p − 1)/(m + p − 1) for 1F1B."""
        return self.bubble_time / self.step_time if self.step_time else 0.0


def _shape(table: Table) -> tuple[int, int, int]:
    """(p, v, m) of a table, after checking that it holds each F and B of every (s, j) once, on its rank."""
    pp = len(table)
    if pp == 0:
        raise ValueError("schedule table has no ranks")
    vpp = m = 0
    for r, row in enumerate(table):
        for a in row:
            if a.stage != r:
                raise ValueError(f"action {a} is in row {r} but names rank {a.stage}")
            vpp = max(vpp, a.chunk + 1)
            m = max(m, a.micro + 1)
    for r, row in enumerate(table):
        seen: set[Action] = set()
        for a in row:
            if a in seen:
                raise ValueError(f"action {a} appears twice on rank {r}")
            seen.add(a)
        if len(row) != 2 * vpp * m:
            raise ValueError(f"rank {r} has {len(row)} actions, expected 2*vpp*m = 2*{vpp}*{m} = "
                             f"{2 * vpp * m} (one F and one B per chunk and micro-batch)")
    return pp, vpp, m


def _built_shape(table: Table) -> tuple[int, int, int]:
    """(p, v, m) of a table ``build`` made: its first rank holds one F and one B per chunk and micro-batch."""
    row = table[0]
    return len(table), max(a.chunk for a in row) + 1, max(a.micro for a in row) + 1


def _per_stage(name: str, times: Times, pp: int, vpp: int) -> list[float]:
    """Time per virtual stage s: a scalar, or a sequence by rank (length p) or by virtual stage (p·v)."""
    if not isinstance(times, Sized):  # a scalar (also a NumPy scalar): no __len__
        values = [float(times)] * (pp * vpp)
    else:
        seq = [float(t) for t in times]
        if len(seq) == pp:
            values = [seq[s % pp] for s in range(pp * vpp)]
        elif len(seq) == pp * vpp:
            values = seq
        else:
            raise ValueError(f"{name} has {len(seq)} entries; expected pp={pp} (per rank) or "
                             f"pp*vpp={pp * vpp} (per virtual stage)")
    if any(not t >= 0 for t in values):  # also rejects NaN
        raise ValueError(f"{name} must be >= 0 (got {times!r})")
    return values


def simulate(table: Table, t_fwd: Times, t_bwd: Times, t_p2p: Times = 0.0, *, built: bool = False) -> Timeline:
    """Time ``table`` under the pipeline's data dependencies (see the module docstring).

    ``t_fwd`` / ``t_bwd`` are per model chunk: a float, or a sequence by rank (length p) or by virtual
    stage (length p·v). ``t_p2p``: a float, or per boundary between virtual stages s and s + 1 (length p·v − 1;
    stages of unequal sub-meshes send over different links). Raises ValueError on a malformed table or one that
    deadlocks. O(actions). ``built``: the table is ``build``'s, well formed by construction, so its shape is read
    off its first rank instead of checked action by action (the HTML report simulates dozens of them).
    """
    pp, vpp, m = _built_shape(table) if built else _shape(table)
    tf = _per_stage("t_fwd", t_fwd, pp, vpp)
    tb = _per_stage("t_bwd", t_bwd, pp, vpp)
    hops = [float(t) for t in t_p2p] if isinstance(t_p2p, Sized) else [float(t_p2p)] * max(pp * vpp - 1, 0)
    if len(hops) != max(pp * vpp - 1, 0) or any(not t >= 0 for t in hops):
        raise ValueError(f"t_p2p must be >= 0, one value or one per boundary ({pp * vpp - 1}): got {t_p2p!r}")
    free, starts, ends = replay_table(table, {"F": tf, "B": tb}, hops, m)
    busy = tuple(sum(tf[a.chunk * pp + r] if a.kind == "F" else tb[a.chunk * pp + r] for a in row)
                 for r, row in enumerate(table))
    return Timeline(
        step_time=max(free),
        starts=tuple(map(tuple, starts)),
        ends=tuple(map(tuple, ends)),
        busy=busy,
        max_in_flight=tuple(_max_in_flight(row) for row in table),
    )


def _max_in_flight(row: Sequence[Action]) -> int:
    live = peak = 0
    for a in row:
        live += 1 if a.kind == "F" else -1
        peak = max(peak, live)
    return peak
