"""Chimera's action table: two pipelines in opposite directions merged on one set of workers, timed by the shared
event loop (zero_bubble.run_rows through zero_bubble_v.simulate_routes).

Chimera (Li & Hoefler 2021, "Chimera: Efficiently Training Large-Scale Neural Networks with Bidirectional Pipelines",
SC '21, arXiv 2107.06925, §3.1, Figure 3, §3.5, Table 1), D = p stages, N = m micro-batches, D even and N a multiple
of D. A basic unit holds D micro-batches: D/2 go "down" (stage s on worker s, chunk 0 here), D/2 go "up" (stage s on
worker D − 1 − s, chunk 1); unit u's down micro-batches are u·D … u·D + D/2 − 1, its up ones the next D/2
(``chimera_route``). Each pipeline runs its micro-batches in time slots as the authors' schedule generator places them
(github.com/Shigangli/Chimera, chimera_pipeline_rank.py, ``MyPipeLine.next_pass``; reimplemented, not copied): its
i-th micro-batch enters at slot 2i, moves one stage a slot, turns at the last stage, so its forward through stage s
is at slot 2i + s and its backward at slot 2i + 2D − 1 − s. The two pipelines are merged: each worker runs the
actions of both in slot order; D even puts a worker's down forwards and up backwards on slots of one parity, its
up forwards and down backwards on the other, and the two of each parity apart (no two on one slot: the paper's
"no conflict" for even D). For N > D the units are concatenated (§3.5; the generator starts a unit's pipeline when
the unit before it returns its first micro-batch): unit u's slots are shifted by 2D·u, its first forwards filling
the slots the unit before it leaves at its end.

What the table shows (tests/test_chimera.py), times per stage; the estimate prices the table's form below
(step/stages.split_bubble), Table 1's where T_F = T_B:
  - with T_F = T_B (the unit slots Table 1 counts) each worker idles D − 2 slots at any N = K·D: the bubble ratio
    (D − 2)/(2N + D − 2) of Table 1 (Figure 3, D = N = 4: 2 idle slots of 10), forms.published_chimera's
    (p/2 − 1)·(T_F + T_B);
  - with T_B ≠ T_F the table's bubble is (D/2 − 1)·((T_F + T_B) + (2K − 1)·|T_B − T_F|) for K = N/D units: with
    T_B = 2·T_F (Figure 3's proportions) 4 units at D = N = 4 (F = 1, B = 2), not Table 1's (D/2 − 1)·(T_F + T_B)
    = 3, and no order of these actions does better: an integer program over every order of every worker (scipy's
    HiGHS) finds 16 units the shortest step there, 12 of work; each further unit adds (D/2 − 1)·2·|T_B − T_F|
    (§3.5's "intermediate bubbles" of direct concatenation when the backward is longer, which its forward doubling
    and backward halving remove: not modelled here);
  - worker w holds min(D/2, D − w) down and min(D/2, w + 1) up micro-batches between F and B at its peak: D/2 + 1 on
    the end workers, D on the middle ones, Table 1's range [(D/2 + 1)·M_a, D·M_a].
"""

from __future__ import annotations

from meshplan.pipeline.simulator import Timeline
from meshplan.pipeline.zero_bubble import SplitAction, SplitTable
from meshplan.pipeline.zero_bubble_v import Route, simulate_routes


def chimera_route(pp: int) -> Route:
    """Micro-batch j goes down (chunk 0 of workers 0 … p − 1) when j mod p < p/2, else up (chunk 1 of workers
    p − 1 … 0)."""
    down, up = [(r, 0) for r in range(pp)], [(r, 1) for r in reversed(range(pp))]
    return lambda micro: down if micro % pp < pp // 2 else up


def _check(pp: int, micro_batches: int) -> None:
    for name, value in (("pp", pp), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if pp % 2 or micro_batches % pp:
        raise ValueError(f"Chimera needs an even pp dividing the number of micro-batches (units of pp, half each "
                         f"way; Li & Hoefler 2021 §3.1, §3.5): got pp={pp}, m={micro_batches}")


def chimera_slots(pp: int, micro_batches: int) -> list[list[tuple[int, SplitAction]]]:
    """Per worker, (slot, action) of every F and B of both pipelines in every unit (module docstring)."""
    _check(pp, micro_batches)
    half = pp // 2
    slots: list[list[tuple[int, SplitAction]]] = [[] for _ in range(pp)]
    for unit in range(micro_batches // pp):
        for chunk in (0, 1):  # down, up
            for i in range(half):
                micro, enter = unit * pp + chunk * half + i, 2 * pp * unit + 2 * i
                for s in range(pp):
                    w = s if chunk == 0 else pp - 1 - s
                    slots[w] += [(enter + s, SplitAction(w, "F", micro, chunk)),
                                 (enter + 2 * pp - 1 - s, SplitAction(w, "B", micro, chunk))]
    return [sorted(row, key=lambda x: x[0]) for row in slots]


def build_chimera(pp: int, micro_batches: int) -> SplitTable:
    """Per-worker ordered F and B actions of Chimera: both pipelines' actions in slot order (``chimera_slots``)."""
    return tuple(tuple(a for _, a in row) for row in chimera_slots(pp, micro_batches))


def simulate_chimera(pp: int, micro_batches: int, t_fwd: float, t_bwd: float, t_p2p: float = 0.0) -> Timeline:
    """Time Chimera's table (per-stage pass times, equal stages; its backward whole, no W split): each worker runs
    its row in order as soon as its inputs arrive (zero_bubble_v.simulate_routes), not at its slots."""
    return simulate_routes(build_chimera(pp, micro_batches), chimera_route(pp), t_fwd, t_bwd, 0.0, t_p2p)
