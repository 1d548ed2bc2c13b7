"""Two-chunk pipeline schedules: ZB-V's V-shaped table, timed by a simulator of routes (``simulate_routes``, which
also times dualpipe.py's and chimera.py's tables), and Chimera's bidirectional pipelines in closed form.

A *route* is the sequence of (rank, chunk) places a micro-batch's forward visits; its backward visits them in reverse.

ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR 2024, arXiv 2401.10241, §6 and Figure 8): each rank
holds two chunks of half a stage's layers, placed as a V: chunk 0 of rank r is virtual stage r, chunk 1 is virtual
stage 2p − 1 − r, so rank 0 holds the first and the last chunk (the embedding and the LM head) and the last rank turns
the V on its own GPU. The backward is split into the input gradient B and the weight gradient W (zero_bubble.py).
Rank r's order (``build_zb_v``, the paper's Figure 8 as torch.distributed.pipelining ``ScheduleZBVZeroBubble`` runs
it, torch 2.13): 2(p − r) − 1 chunk-0 forwards; r pairs of a chunk-1 and a chunk-0 forward; p − r rounds of chunk 1's
F, B, W; then, while forwards remain, chunk 0's F, B, W and chunk 1's F, B, W; then r rounds of chunk 0's and chunk
1's B, p − r rounds of chunk 0's B and W, and the deferred W passes. With T_F, T_B, T_W a whole rank's (both
chunks') times and m ≥ 2p micro-batches, its bubble is the paper's (§6, Table 5's ZB-V row)
    (p − 1)·(T_F + T_B − 2·T_W)        (zero when T_F + T_B ≤ 2·T_W)
with at most 1F1B's activation memory: p micro-batches of a whole stage, 2p chunks of half a stage
(tests/test_zero_bubble_v.py reproduces both from the table).

Chimera (Li & Hoefler 2021, "Chimera: Efficiently Training Large-Scale Neural Networks with Bidirectional Pipelines",
SC '21, §3.1, Figure 3, Table 1): two model replicas in two pipelines running in opposite directions, the "down" one
with stage s on rank s (chunk 0), the "up" one with stage s on rank p − 1 − s (chunk 1); half of the m micro-batches
go down, half up. Each rank holds two stages (2× weights, gradients and optimizer state: Table 1's 2·M_θ), each
micro-batch visits every rank once, so a rank's work per step is 1F1B's; the bubble ratio of Table 1,
(D − 2)/(2N + D − 2) for D = p stages and N = m micro-batches, is in time
    (p/2 − 1)·(T_F + T_B)              against 1F1B's (p − 1)·(T_F + T_B),
with activations of between p/2 + 1 and p micro-batches per rank (Table 1: [(D/2 + 1)·M_a, D·M_a]); the two
replicas' gradients are all-reduced together with the data-parallel ones (§3.3; here as the data-parallel reduction of
the rank's two stages). m is a multiple of p (units of p micro-batches, §3.5's concatenation). The estimate takes
Table 1's form; the action table, the paper's merge of the two pipelines, is chimera.py's (Table 1's bubble in the
unit slots it counts, T_F = T_B; at T_B = 2·T_F 4 units where Table 1 says 3 at p = 4, the best any order reaches).

Which frameworks run them: torch.distributed.pipelining (torch 2.13) has ScheduleZBVZeroBubble, which torchtitan 0.2.2
runs by name (``pipeline_parallel_schedule = "ZBVZeroBubble"``), but meshplan's torchtitan emitter does not write it
(nor its V-shaped stage placement), so no preset runs ZB-V; Chimera runs in the authors' research code (Shigang Li's
Chimera, PyTorch 1.x) only: no preset runs it either (configs/common.py refuses both).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from meshplan.pipeline.simulator import Timeline
from meshplan.pipeline.zero_bubble import SplitAction, SplitTable, run_rows

Place = tuple[int, int]  # (rank, chunk)
Route = Callable[[int], Sequence[Place]]  # micro-batch -> the places its forward visits


def _positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")


def v_route(pp: int) -> Route:
    """ZB-V's V: chunk 0 of ranks 0 … p − 1, then chunk 1 of ranks p − 1 … 0."""
    places = [(r, 0) for r in range(pp)] + [(r, 1) for r in reversed(range(pp))]
    return lambda micro: places


def build_zb_v(pp: int, micro_batches: int) -> SplitTable:
    """Per-rank ordered F, B and W actions of ZB-V (module docstring), chunk 0 and chunk 1 of each rank; a rank's
    actions of micro-batches ≥ m (its fill and drain patterns for m < 2p − 1) are left out."""
    _positive(pp=pp, micro_batches=micro_batches)
    n = max(2 * pp - 1, micro_batches)  # the pattern's micro-batches (torch pads short steps the same way)
    return tuple(tuple(SplitAction(r, kind[0], j, int(kind[1])) for kind, j in _zb_v_row(pp, r, n)
                       if j < micro_batches) for r in range(pp))


def _zb_v_row(pp: int, r: int, n: int) -> list[tuple[str, int]]:
    """Rank r's (kind + chunk, micro-batch) order of ZB-V over n micro-batches."""
    row: list[tuple[str, int]] = []
    count = {k: 0 for k in ("F0", "F1", "B0", "B1", "W0", "W1")}

    def put(*kinds: str) -> None:
        for kind in kinds:
            row.append((kind, count[kind]))
            count[kind] += 1

    for _ in range(2 * (pp - r) - 1):
        put("F0")
    for _ in range(r):
        put("F1", "F0")
    for _ in range(pp - r):
        put("F1", "B1", "W1")
    while count["F1"] < count["F0"] or count["F0"] < n:
        if count["F0"] < n:
            put("F0")
        put("B0", "W0", "F1", "B1", "W1")
    for _ in range(r):
        put("B0", "B1")
    for _ in range(pp - r):
        put("B0", "W0")
    put(*["W1"] * (count["B1"] - count["W1"]), *["W0"] * (count["B0"] - count["W0"]))
    return row


PlaceTimes = float | Sequence[Sequence[float]]  # one time for every place, or [rank][chunk]


def simulate_routes(table: SplitTable, route: Route, t_fwd: PlaceTimes, t_bwd: PlaceTimes, t_wgrad: PlaceTimes = 0.0,
                    t_p2p: float = 0.0, pairs: Mapping[SplitAction, SplitAction] | None = None) -> Timeline:
    """Time a table of F, B (and W) actions whose micro-batches follow ``route``: F at a place after F at the place
    before it, B after B at the place after it (the last place's after its own F), W after B at the same place,
    each plus ``t_p2p`` across ranks; each rank runs its row in order. ``pairs``: a forward that runs overlapped
    with a backward (DualPipe's F&B cell, dualpipe.py) waits for that backward's input too. Times are per chunk: one
    for every place, or ``[rank][chunk]`` (unequal ranks). ``max_in_flight``: per rank, the most (micro-batch,
    chunk) pairs between F and the end of their backward (W, or B without W)."""
    split = any(a.kind == "W" for row in table for a in row)
    given = {"F": t_fwd, "B": t_bwd, "W": t_wgrad}

    def time_of(a: SplitAction) -> float:
        t = given[a.kind]
        return float(t) if isinstance(t, int | float) else float(t[a.stage][a.chunk])

    partner = pairs or {}

    def waits(a: SplitAction, r: int) -> tuple[tuple[str, int, int, int], ...]:
        mate = partner.get(a)
        return route_dependency(a, route) + (() if mate is None else route_dependency(mate, route))

    starts, ends, free, stuck = run_rows(table, waits, lambda a, r: (a.kind, r, a.chunk, a.micro),
                                         lambda a, r: time_of(a), t_p2p)
    if stuck:
        raise ValueError(f"schedule deadlocks: ranks stop at {', '.join(stuck)}")
    busy = tuple(sum(time_of(a) for a in row) for row in table)
    return Timeline(step_time=max(free), starts=tuple(map(tuple, starts)), ends=tuple(map(tuple, ends)), busy=busy,
                    max_in_flight=tuple(_live(row, "W" if split else "B") for row in table))


def route_dependency(a: SplitAction, route: Route) -> tuple[tuple[str, int, int, int], ...]:
    """The actions ``a`` waits for along its micro-batch's ``route``: ((kind, rank, chunk, micro),), or () (the first
    forward)."""
    places = route(a.micro)
    i = places.index((a.stage, a.chunk))
    if a.kind == "W":
        return (("B", a.stage, a.chunk, a.micro),)
    if a.kind == "F":
        return () if i == 0 else (("F", *places[i - 1], a.micro),)
    return (("F", *places[i], a.micro),) if i == len(places) - 1 else (("B", *places[i + 1], a.micro),)


def _live(row: Sequence[SplitAction], last: str) -> int:
    live = peak = 0
    for a in row:
        live += 1 if a.kind == "F" else -1 if a.kind == last else 0
        peak = max(peak, live)
    return peak

