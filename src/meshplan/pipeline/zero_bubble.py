"""Split-backward pipeline schedules: ZB-H1 and DualPipe. The backward of a micro-batch through a stage is two passes,
the input gradient B (what the previous stage waits for) and the weight gradient W (what nothing waits for but the
optimizer step), so W passes can be moved into the pipeline's idle time.

ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, §3.1 and Figure 3): 1F1B's order of
forwards and input gradients, rank r's W passes each r input gradients late (its last r weight gradients fill the
drain). Rank r holds 1F1B's p − r micro-batches between F and B, and at most p between F and W (the W residues: the
inputs and output gradients of its linears), so the peak over the ranks is 1F1B's p (rank 0), and the bubble with
equal stages and m ≥ p is
    (p − 1)·(T_F + T_B − T_W)        against 1F1B's (p − 1)·(T_F + T_B + T_W),
a third of it when T_F = T_B = T_W (the paper's approximation; with W and B each one GEMM of the forward's FLOPs per
linear layer, T_B = T_W = half of meshplan's backward: step/stages.py ``split_bubble``).

DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, §3.2.1, Figure 5, Table 2): micro-batches enter the pipeline
from both ends, so rank r holds stage r of one direction and stage p − 1 − r of the other: 2× the parameters of a 1F1B
rank, p + 1 micro-batches of activations; a forward chunk of one direction runs beside a backward chunk of the other,
each one's expert-parallel all-to-all hidden under the other's compute (step/stages.py ``ep_overlapped``).
Bubble, Table 2, whose caption defines B as a full backward chunk (input and weight gradients) and F&B as two
mutually overlapped forward and backward chunks:
    (p/2 − 1)·(F&B + B − 3·W),   B = T_B + T_W,   F&B = T_F + T_B + T_W (the overlap hides communication, not compute)
    = (p/2 − 1)·(T_F + 2·T_B − T_W),   (p/2 − 1)·(T_F + T_B) with T_B = T_W: the estimate's form.
(The same reading gives its ZB1P row (p − 1)·(F + B − 2W) = ZB-H1's (p − 1)·(T_F + T_B − T_W).) Its action table,
as DeepSeek's library orders it, is dualpipe.py's: at T_F = T_B = T_W it idles (p/2 − 1)·T_F, half Table 2's; the
estimate keeps the published form, the larger.

Which frameworks run them (specs/supports.py, the stack presets): torch.distributed.pipelining (torch 2.13) has
ScheduleInterleavedZeroBubble ("implementing the ZB1P schedule in the paper"), ScheduleZBVZeroBubble and
ScheduleDualPipeV (DualPipe's one-copy "V" variant), which torchtitan 0.2.2 runs by name
(``pipeline_parallel_schedule``, torch's ``get_schedule_class``), each with 2 stages per rank: not the
one-chunk-per-rank schedules priced here, so no preset runs them (docs/USAGE.md); DualPipe itself runs in DeepSeek's
DualPipe library. Megatron-Core 0.16.1 has neither (its pipeline_parallel/ has 1F1B, interleaved and the combined
1F1B of EP overlap only).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from meshplan.pipeline.simulator import Timeline

SPLIT_KINDS = ("F", "B", "W")


@dataclass(frozen=True, slots=True)
class SplitAction:
    """Forward ("F"), input gradient ("B") or weight gradient ("W") of micro-batch ``micro`` on rank ``stage``,
    through its model chunk ``chunk``: 0 for the one-chunk schedules here, 0 or 1 for zero_bubble_v.py's two-chunk
    ones (tables.Action's kinds are F and B only)."""

    stage: int
    kind: str
    micro: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SPLIT_KINDS or min(self.stage, self.micro) < 0 or self.chunk not in (0, 1):
            raise ValueError(f"split action {self.stage}{self.kind}{self.micro}: kind F, B or W, rank and micro >= 0, "
                             "chunk 0 or 1")

    def __str__(self) -> str:
        text = f"{self.stage}{self.kind}{self.micro}"
        return f"{text}.{self.chunk}" if self.chunk else text


SplitTable = tuple[tuple[SplitAction, ...], ...]


def build_zb_h1(pp: int, micro_batches: int) -> SplitTable:
    """Per-rank ordered F, B and W actions of ZB-H1 (module docstring): 1F1B's warm-up of min(p − r − 1, m) forwards,
    then forward and input gradient alternately, each input gradient after the r-th followed by the oldest W, then
    the remaining input gradients and weight gradients."""
    for name, value in (("pp", pp), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    m, table = micro_batches, []
    for r in range(pp):
        w = min(pp - r - 1, m)
        order = [SplitAction(r, "F", j) for j in range(w)]
        for k in range(m - w):
            order += [SplitAction(r, "F", w + k), SplitAction(r, "B", k)]
        order += [SplitAction(r, "B", k) for k in range(m - w, m)]
        row, inputs, weights = [], 0, 0
        for a in order:
            row.append(a)
            if a.kind == "B":
                inputs += 1
                if inputs > r:
                    row.append(SplitAction(r, "W", weights))
                    weights += 1
        table.append(tuple(row + [SplitAction(r, "W", j) for j in range(weights, m)]))
    return tuple(table)


def _per_rank(name: str, times: float | Sequence[float], pp: int) -> list[float]:
    values = [float(times)] * pp if isinstance(times, (int, float)) else [float(t) for t in times]
    if len(values) != pp or any(not t >= 0 for t in values):
        raise ValueError(f"{name} must be >= 0, one value or one per rank ({pp}): got {times!r}")
    return values


def simulate_split(table: SplitTable, t_fwd: float | Sequence[float], t_bwd: float | Sequence[float],
                   t_wgrad: float | Sequence[float], t_p2p: float = 0.0) -> Timeline:
    """Time a table of F, B and W actions (one chunk per rank): F(r, j) after F(r − 1, j), B(r, j) after B(r + 1, j)
    (the last rank's after its F), each plus ``t_p2p`` across ranks; W(r, j) after B(r, j) on its rank. Each rank runs
    its row in order. ``max_in_flight``: micro-batches between F and W (the W residues counted whole)."""
    pp = len(table)
    m = max(a.micro for row in table for a in row) + 1
    dur = {k: _per_rank(n, t, pp) for k, n, t in (("F", "t_fwd", t_fwd), ("B", "t_bwd", t_bwd),
                                                   ("W", "t_wgrad", t_wgrad))}
    starts, ends, free, stuck = run_rows(
        table, lambda a, r: {"F": (("F", r - 1, a.micro),) if r else (), "W": (("B", r, a.micro),),
                             "B": (("F", r, a.micro),) if r == pp - 1 else (("B", r + 1, a.micro),)}[a.kind],
        lambda a, r: (a.kind, r, a.micro), lambda a, r: dur[a.kind][r], t_p2p)
    if stuck or any(len(row) != 3 * m for row in table):
        raise ValueError(f"split schedule deadlocks or misses actions: ranks stop at {', '.join(stuck) or 'the end'}")
    busy = tuple(m * (dur["F"][r] + dur["B"][r] + dur["W"][r]) for r in range(pp))
    return Timeline(step_time=max(free), starts=tuple(map(tuple, starts)), ends=tuple(map(tuple, ends)), busy=busy,
                    max_in_flight=tuple(_in_flight(row) for row in table))


Key = tuple  # an action's identity in ``run_rows``: (kind, rank, ...), its rank second


def run_rows(table: SplitTable, dependency: Callable[[SplitAction, int], tuple[Key, ...]],
             key: Callable[[SplitAction, int], Key], duration: Callable[[SplitAction, int], float], t_p2p: float
             ) -> tuple[list[list[float]], list[list[float]], list[float], list[str]]:
    """The event loop of the split-backward simulators (this one, zero_bubble_v.simulate_routes, dualpipe.py and
    chimera.py through it): each rank runs its row in order, an action starting once its rank is free and each of
    its ``dependency`` keys (none: ``()``; DualPipe's overlapped pairs wait for two) has ended, plus ``t_p2p`` for
    one that ran on another rank. (starts, ends, each rank's end, the actions left stuck)."""
    pp = len(table)
    done: dict[Key, float] = {}
    nxt, free = [0] * pp, [0.0] * pp
    starts: list[list[float]] = [[0.0] * len(row) for row in table]
    ends: list[list[float]] = [[0.0] * len(row) for row in table]
    moved = True
    while moved:
        moved = False
        for r, row in enumerate(table):
            while nxt[r] < len(row):
                a = row[nxt[r]]
                deps = dependency(a, r)
                if any(d not in done for d in deps):
                    break
                ready = max((done[d] + (t_p2p if d[1] != r else 0.0) for d in deps), default=0.0)
                start = max(free[r], ready)
                free[r] = done[key(a, r)] = start + duration(a, r)
                starts[r][nxt[r]], ends[r][nxt[r]] = start, free[r]
                nxt[r] += 1
                moved = True
    return starts, ends, free, [str(table[r][nxt[r]]) for r in range(pp) if nxt[r] < len(table[r])]


def _in_flight(row: Sequence[SplitAction]) -> int:
    live = peak = 0
    for a in row:
        live += {"F": 1, "B": 0, "W": -1}[a.kind]
        peak = max(peak, live)
    return peak

