"""Pipeline schedules as action tables: one row per pipeline rank, each row the ordered actions that rank runs, e.g.
rank 0 of 1F1B with p = 2, m = 3 runs ``0F0 0F1 0B0 0F2 0B1 0B2``. ``build`` writes the table of a named schedule;
simulator.py times any table, equal_ranks.py holds the closed forms by schedule name.

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from meshplan.pipeline.names import TABLED as TABLED_SCHEDULES
from meshplan.pipeline.registry import REGISTRY, Schedule, Warmup

ACTION_KINDS = ("F", "B")

Table = tuple[tuple["Action", ...], ...]
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


def tabled(schedule: str) -> tuple[Schedule, Warmup]:
    """The record of a schedule ``build`` writes the table of, and its warm-up (registry.py: the records with one)."""
    record = REGISTRY.get(schedule)
    if record is None or record.warmup is None:
        raise ValueError(f"schedule={schedule!r} must be one of {', '.join(TABLED_SCHEDULES)}")
    return record, record.warmup


def check_arguments(schedule: str, pp: int, m: int, vpp: int, group: int | None) -> int:
    """Validate the arguments shared by ``build`` and the closed forms; return the group size N."""
    record = tabled(schedule)[0]
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
    n = check_arguments(schedule, pp, micro_batches, vpp, group)
    warmup = tabled(schedule)[1]
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
    check_arguments(schedule, pp, micro_batches, vpp, group)
    record, warmup = tabled(schedule)
    if _positive("steps", steps) > 1 and record.flushes:
        raise ValueError(f"steps={steps}: a synchronous schedule ({schedule!r}) flushes every step; build one")
    m = micro_batches * steps
    n = check_arguments(schedule, pp, m, vpp, group)
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
