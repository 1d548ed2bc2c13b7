"""Pipeline schedules as action tables, and one event-driven simulator that times any of them.

A schedule is a table: one row per pipeline rank, each row the ordered actions that rank runs, e.g. rank 0
of 1F1B with p = 2, m = 3 runs ``0F0 0F1 0B0 0F2 0B1 0B2``. ``build`` writes the table of a named schedule;
``simulate`` replays any table against the pipeline's data dependencies and returns a ``Timeline`` (step time,
per-action start/end, busy time, bubble, activations in flight). ``bubble_time``, ``step_time``, ``bubble_fraction``
and ``in_flight`` are their closed forms for the search path; the tests check that they equal the simulator.

Symbols
    p      pipeline ranks (``pp``); r in [0, p) a rank
    v      model chunks per rank (``vpp``, virtual pipeline size); c in [0, v) a chunk
    V      virtual stages = p·v; chunk c of rank r is virtual stage s = c·p + r (Megatron-LM layout)
    m      micro-batches per step; j in [0, m) a micro-batch
    N      micro-batches per group, interleaved (Megatron-Core ``microbatch_group_size_per_vp_stage``, default p)
    t_f    forward time of ONE micro-batch through ONE model chunk (the whole stage when v = 1)
    t_b    backward time of the same (≈ 2·t_f; ≈ 3·t_f with full recompute)
    t_p2p  time to send one activation / gradient to the next / previous rank

Action string form: ``"{rank}{F|B}{micro}"`` for chunk 0 and ``"{rank}{F|B}{micro}.{chunk}"`` for chunk > 0,
so ``"2F0"`` is rank 2's forward of micro-batch 0 and ``"0B3.1"`` is rank 0's backward of micro-batch 3
through its second chunk. ``parse_action`` is the inverse.

Schedules
    gpipe        all m forwards, then all m backwards in the same order (Huang et al. 2019, GPipe;
                 backward order as torch.distributed.pipelining ``ScheduleGPipe``).
    1f1b         PipeDream-Flush / Megatron-LM non-interleaved 1F1B (Narayanan et al. 2019, PipeDream;
                 Narayanan et al. 2021 §2.2.1): rank r runs min(p − r − 1, m) warm-up forwards, then
                 alternates one forward and one backward, then drains the remaining backwards.
    interleaved  Megatron-LM interleaved 1F1B (Narayanan et al. 2021 §2.2.2), exactly as
                 Megatron-Core ``forward_backward_pipelining_with_interleaving``: "virtual micro-batches"
                 k in [0, v·m) run chunk 0 on N micro-batches, then chunk 1 on the same N, ... then the
                 next group (``get_schedule_table``; the last group takes the remainder); rank r runs
                 w = min(2·(p − r − 1) + (v − 1)·N, v·m) warm-up forwards, then forward k + w and
                 backward k alternately, then the remaining backwards. Backward k is the same micro-batch
                 as forward k through chunk v − 1 − c. As in Megatron-Core, N must satisfy p ≤ N ≤ m and
                 m mod N must be 0 or ≥ p; with the default N = p that means p divides m.
    pipedream    PipeDream's 1F1B without flushes (Narayanan et al., SOSP 2019, §3.2), weights updated after
                 every backward, each in-flight micro-batch's version stashed for its backward (§3.3).
    pipedream-2bw  the same order, gradients accumulated over m ≥ p micro-batches, one update per m: two weight
                 versions (Narayanan et al., ICML 2021, §3.1, Fig. 2). Asynchronous tables span ``steps`` steps
                 of m micro-batches without a flush; their fill is paid once per run (steady.py).

Timing model (``simulate``)
    F(s, j) starts when its rank is free and F(s − 1, j) has finished (+ t_p2p if s − 1 is on another
    rank). B(s, j) needs B(s + 1, j) (+ t_p2p across ranks), and for the last virtual stage F(V − 1, j).
    Each rank runs its row in order, one action at a time. p2p is a pure latency on the edge (non-blocking
    send/recv); optimizer step, DP gradient reduction and recompute are outside this module (recompute is in t_b).

Bubble (Narayanan et al. 2021 §2.2.1): bubble time / ideal compute time (the busiest rank's busy time). With equal
stages and t_p2p = 0: (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved; (p − 1)/(m + p − 1) of a 1F1B step.

Activations in flight: the largest number of (micro-batch, chunk) pairs whose forward has run on a rank and
whose backward has not; activation memory of that rank = in-flight × activations of one micro-batch through
one chunk (1/v of the rank's layers). GPipe: m; 1F1B: min(p − r, m) (Narayanan et al. 2021 §2.2.1);
interleaved: min(w + 1, v·m) with w the warm-up count above; the asynchronous ones p − r (no flush bounds it by m).
"""

from __future__ import annotations

import re
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from functools import lru_cache

from meshplan.pipeline.forms import RankTimes
from meshplan.pipeline.names import TABLED as TABLED_SCHEDULES
from meshplan.pipeline.registry import REGISTRY, Schedule, Warmup
from meshplan.pipeline.replay import replay_table

ACTION_KINDS = ("F", "B")

Table = tuple[tuple["Action", ...], ...]
Times = float | Sequence[float]


@dataclass(frozen=True, slots=True)
class Action:
    """Forward ("F") or backward ("B") of micro-batch ``micro`` through chunk ``chunk`` of rank ``stage``."""

    stage: int
    kind: str
    micro: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"action kind={self.kind!r} must be 'F' or 'B'")
        s, j, c = self.stage, self.micro, self.chunk
        if type(s) is int and type(j) is int and type(c) is int and s >= 0 and j >= 0 and c >= 0:
            return  # the common case, checked at once (a schedule table holds thousands of actions)
        for name in ("stage", "micro", "chunk"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"action {name}={value!r} must be a non-negative integer")

    def virtual_stage(self, pp: int) -> int:
        """s = c·p + r: chunk c of rank r is the (c·p + r)-th slice of the model (Megatron-LM layout)."""
        return self.chunk * pp + self.stage

    def __str__(self) -> str:
        text = f"{self.stage}{self.kind}{self.micro}"
        return f"{text}.{self.chunk}" if self.chunk else text


_ACTION = re.compile(r"\s*(\d+)([FB])(\d+)(?:\.(\d+))?\s*")


def parse_action(text: str) -> Action:
    """``"2F0"`` → Action(2, "F", 0); ``"0B3.1"`` → Action(0, "B", 3, chunk=1). The inverse of ``str``."""
    match = _ACTION.fullmatch(text)
    if match is None:
        raise ValueError(f"action {text!r} is not of the form '<rank><F|B><micro>[.<chunk>]', e.g. '2F0'")
    stage, kind, micro, chunk = match.groups()
    return Action(int(stage), kind, int(micro), int(chunk or 0))


def format_table(table: Table) -> str:
    """One line per rank, actions in order: ``"0F0 0F1 0B0 ..."``."""
    return "\n".join(" ".join(map(str, row)) for row in table)


# ---- Building tables -----------------------------------------------------------------------------------------------
def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return value


def _tabled(schedule: str) -> tuple[Schedule, Warmup]:
    """The record of a schedule ``build`` writes the table of, and its warm-up (registry.py: the records with one)."""
    record = REGISTRY.get(schedule)
    if record is None or record.warmup is None:
        raise ValueError(f"schedule={schedule!r} must be one of {', '.join(TABLED_SCHEDULES)}")
    return record, record.warmup


def _check(schedule: str, pp: int, m: int, vpp: int, group: int | None) -> int:
    """Validate the arguments shared by ``build`` and the closed forms; return the group size N."""
    record = _tabled(schedule)[0]
    _positive("pp", pp)
    _positive("micro_batches", m)
    _positive("vpp", vpp)
    if not record.flushes and (vpp != 1 or group is not None or pp < 2):
        raise ValueError(f"schedule={schedule!r} needs pp >= 2, vpp=1, no group (pp={pp}, vpp={vpp}, group={group})")
    if not record.flushes and record.refusals(pp, vpp, m):  # what is left for it to refuse: 2BW's m >= p (rules.py)
        raise ValueError(f"schedule={schedule!r} needs micro_batches >= pp (got {m} < {pp}; §3.1: m ≥ d)")
    if record.chunks:  # one chunk a rank (0: any v >= 2, interleaved)
        if vpp != 1:
            raise ValueError(f"vpp={vpp} needs schedule='interleaved' (got {schedule!r})")
        if group is not None:
            raise ValueError(f"group={group} applies only to schedule='interleaved'")
        return m
    if vpp < 2:
        raise ValueError(f"schedule='interleaved' needs vpp >= 2 (got vpp={vpp}); use '1f1b' for vpp=1")
    n = pp if group is None else _positive("group", group)
    if not pp <= n <= m:
        raise ValueError(f"interleaved schedule: micro-batches per group N={n} must be in [pp, micro_batches] = "
                         f"[{pp}, {m}]")
    if 0 < m % n < pp:
        raise ValueError(f"interleaved schedule: micro_batches={m} mod group={n} = {m % n} must be 0 or >= pp={pp} "
                         "(Megatron-Core); with the default group=pp, pp must divide micro_batches")
    return n


def warm_ups(schedule: str, pp: int, micro_batches: int, vpp: int = 1, *, group: int | None = None
             ) -> tuple[int, tuple[int, ...]]:
    """(N, each rank's forwards before its first backward) of ``build``'s table, its record's warm-up: what the
    report's page builds the table from (report/detail.replay_inputs, templates/timeline.js)."""
    n = _check(schedule, pp, micro_batches, vpp, group)
    warmup = _tabled(schedule)[1]
    return n, tuple(warmup(pp, micro_batches, vpp, n, r) for r in range(pp))


def _interleaved_order(m: int, vpp: int, n: int) -> list[tuple[int, int]]:
    """(micro, chunk) of each virtual micro-batch k (Megatron-Core ``get_schedule_table``).

    p = 2, N = 3, m = 5, v = 2:  micro 0 1 2 0 1 2 3 4 3 4,  chunk 0 0 0 1 1 1 0 0 1 1.
    """
    order = []
    for first in range(0, m, n):
        last = m if first + n >= m else first + n
        order += [(j, c) for c in range(vpp) for j in range(first, last)]
        if last == m:
            break
    return order


@lru_cache(maxsize=64)  # a table is immutable; the HTML report times the same shapes for many plans
def build(schedule: str, pp: int, micro_batches: int, vpp: int = 1, *, group: int | None = None,
          steps: int = 1) -> Table:
    """Per-rank ordered actions of ``schedule`` for ``pp`` ranks, ``micro_batches`` micro-batches.

    ``vpp`` (chunks per rank) and ``group`` (N, micro-batches per group, default ``pp``) apply to
    "interleaved" only; ``steps`` (consecutive steps without a flush) to the asynchronous schedules only.
    Raises ValueError for arguments the schedule does not support.
    """
    _check(schedule, pp, micro_batches, vpp, group)
    record, warmup = _tabled(schedule)
    if _positive("steps", steps) > 1 and record.flushes:
        raise ValueError(f"steps={steps}: a synchronous schedule ({schedule!r}) flushes every step; build one")
    m = micro_batches * steps
    n = _check(schedule, pp, m, vpp, group)
    order = _interleaved_order(m, vpp, n)  # gpipe / 1f1b: v = 1, N = m → micro-batches 0 .. m − 1
    total = len(order)  # v·m
    table = []
    for r in range(pp):
        fwd = [Action(r, "F", j, c) for j, c in order]
        bwd = [Action(r, "B", j, vpp - 1 - c) for j, c in order]
        w = warmup(pp, m, vpp, n, r)
        row = fwd[:w]
        for k in range(total - w):  # steady state: forward k + w, then backward k
            row += (fwd[w + k], bwd[k])
        row += bwd[total - w:]  # cool-down
        table.append(tuple(row))
    return tuple(table)


# ---- Simulation ----------------------------------------------------------------------------------------------------
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


# ---- Closed forms (equal stages, t_p2p = 0), for the search path ---------------------------------------------------
def bubble_fraction(schedule: str, pp: int, m: int, vpp: int = 1, *, group: int | None = None) -> float:
    """Bubble / ideal compute: (p − 1)/m for GPipe and 1F1B, (p − 1)/(v·m) interleaved.

    The record's bubble (forms.line: ``bubble.flow_bubble``) of equal ranks, over m (Narayanan et al. 2021
    §2.2.1–2.2.2); independent of the interleaved group size N (checked by the tests). Asynchronous: 0 (forms.none:
    no flush; a run's one fill is amortised).
    """
    _check(schedule, pp, m, vpp, group)
    return float(_equal_ranks_bubble(schedule, pp, m, vpp, 0.5, 0.5, 1.0)) / m


def bubble_time(schedule: str, pp: int, m: int, vpp: int, t_fwd: float, t_bwd: float, *,
                group: int | None = None) -> float:
    """Idle time of the step on equal stages, the record's bubble (``bubble.flow_bubble``) of ranks of v·(t_f + t_b)
    each: (p − 1)·(t_f + t_b) with t_f, t_b per chunk as in ``simulate``, the paper's (p − 1)·(T_f + T_b)/v (Narayanan
    et al. 2021 §2.2.2). With t_p2p > 0 the p2p latency also stalls the steady state, so use ``simulate``.
    Asynchronous: 0 (steady.py).
    """
    _check(schedule, pp, m, vpp, group)
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
    n = _check(schedule, pp, m, vpp, group)
    if not isinstance(rank, int) or not 0 <= rank < pp:
        raise ValueError(f"rank={rank!r} must be in [0, pp={pp})")
    record, warmup = _tabled(schedule)
    if not record.flushes:  # no flush: m does not bound it (the record's rules.async_in_flight)
        return int(record.in_flight(pp, vpp, m, rank))
    return min(warmup(pp, m, vpp, n, rank) + 1, vpp * m)
