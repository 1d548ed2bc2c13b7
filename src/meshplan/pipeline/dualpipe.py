"""DualPipe's action table: DeepSeek-V3's bidirectional split-backward schedule, rank by rank, timed by the shared
event loop (zero_bubble.run_rows through zero_bubble_v.simulate_routes).

DualPipe (DeepSeek-V3 technical report, arXiv 2412.19437, §3.2.1, Figure 5, Table 2): half of the m micro-batches
enter at rank 0 and run the "down" pipeline (stage s on rank s, chunk 0 here), half enter at rank p − 1 and run the
"up" one (stage s on rank p − 1 − s, chunk 1), so every rank holds two stages. Micro-batches 0 … m/2 − 1 go down,
m/2 … m − 1 up (``dualpipe_route``). The backward is split into the input gradient B and the weight gradient W
(zero_bubble.py); where it is not, W follows its B at once (a whole backward). A forward of one direction and a
backward of the other run as one overlapped pair (the paper's F&B cell, Figure 4: each one's expert-parallel
all-to-all under the other's compute), priced as the closed form prices it, T_F + T_B + T_W of compute
(forms.published_dualpipe; the overlap hides communication: step/stages.ep_overlapped); the pair starts once both its
inputs have arrived, as the library receives both before computing.

Rank r's order, with h = min(r, p − 1 − r) and its own "near" direction first (down on ranks < p/2, up on the
others; "far" the other one), as DeepSeek's library builds it (github.com/deepseek-ai/DualPipe,
dualpipe/dualpipe.py, ``DualPipe.step``'s eight steps; reimplemented here, not copied):
    1. 2·(p/2 − h − 1) forwards of the near direction;
    2. h + 1 pairs of a near and a far forward;
    3. p/2 − h − 1 rounds of a far input gradient (its W deferred), the oldest deferred W, a far forward;
    4. m/2 − p + h + 1 rounds of two overlapped pairs, (near F & far B) then (far F & near B), the middle ranks'
       first near-F/far-B pair run one after the other (the library: "to further reduce bubble size");
    5. p/2 − h − 1 rounds of a far whole backward and a (far F & near B) pair;
    6. h + 1 rounds of a far and a near backward, whole in the first half of the rounds and W deferred after;
    7. p/2 − h − 1 rounds of the oldest deferred W and a near input gradient (its W deferred);
    8. the h + 1 deferred W passes left.
The library needs p even, m even and m ≥ 2p (its assertion); so does ``build_dualpipe``.

What the table shows (tests/test_dualpipe.py): with T_F = T_B = T_W its bubble is p/2 − 1 units at any m ≥ 2p, half
Table 2's (p/2 − 1)·(F&B + B − 3·W) = (p/2 − 1)·(3 + 2 − 3) read with its caption (B a full backward chunk, F&B the
overlapped pair: zero_bubble.py), and every rank holds p + 1 micro-batches between F and W at its peak (Table 2:
PP + 1), two stages of parameters (Table 2: 2×). With T_B = T_W (meshplan's split) and T_F > T_B the pairs wait for
the later of their two inputs and the table's bubble is (p/2 − 1)·(2·T_F − T_B); with T_F < T_B more than
(p/2 − 1)·T_F (5 units at p = 8, T_F = 1, T_B = 2); at or under Table 2's (p/2 − 1)·(T_F + T_B) wherever
T_F ≤ 2·T_B. The estimate prices Table 2's published form (step/stages.split_bubble), the larger: a reimplemented
order is not the library's measured run.
"""

from __future__ import annotations

from collections.abc import Mapping

from meshplan.pipeline.simulator import Timeline
from meshplan.pipeline.zero_bubble import SplitAction, SplitTable
from meshplan.pipeline.zero_bubble_v import Route, simulate_routes

Pairs = Mapping[SplitAction, SplitAction]  # an overlapped pair's forward -> its backward (the F&B cell)


def dualpipe_route(pp: int, micro_batches: int) -> Route:
    """Micro-batches below m/2 go down (chunk 0 of ranks 0 … p − 1), the others up (chunk 1 of ranks p − 1 … 0)."""
    down, up = [(r, 0) for r in range(pp)], [(r, 1) for r in reversed(range(pp))]
    return lambda micro: down if micro < micro_batches // 2 else up


class _Rank:
    """One rank's row as ``_rank_row`` writes it: its actions, its overlapped pairs, its deferred W passes."""

    def __init__(self, pp: int, m: int, r: int) -> None:
        self.r, self.half = r, m // 2
        self.near = 0 if r < pp // 2 else 1  # the direction whose first stage is nearer: down on the first half
        self.row: list[SplitAction] = []
        self.pairs: dict[SplitAction, SplitAction] = {}
        self.fwd, self.bwd = [0, 0], [0, 0]
        self.deferred: list[SplitAction] = []

    def _chunk(self, far: bool) -> int:
        return self.near ^ far

    def f(self, far: bool) -> SplitAction:
        c = self._chunk(far)
        self.row.append(SplitAction(self.r, "F", c * self.half + self.fwd[c], c))
        self.fwd[c] += 1
        return self.row[-1]

    def b(self, far: bool, split: bool = False) -> SplitAction:
        c = self._chunk(far)
        a = SplitAction(self.r, "B", c * self.half + self.bwd[c], c)
        self.bwd[c] += 1
        self.row.append(a)
        w = SplitAction(self.r, "W", a.micro, c)
        if split:
            self.deferred.append(w)
        else:
            self.row.append(w)
        return a

    def w(self) -> None:
        self.row.append(self.deferred.pop(0))

    def pair(self, far_forward: bool, overlapped: bool = True) -> None:
        f = self.f(far_forward)
        b = self.b(not far_forward)
        if overlapped:
            self.pairs[f] = b


def _rank_row(pp: int, m: int, r: int) -> _Rank:
    """Rank r's eight steps (module docstring)."""
    rank, half, h = _Rank(pp, m, r), pp // 2, min(r, pp - 1 - r)
    middle, rest = h == half - 1, half - h - 1
    for _ in range(2 * rest):  # 1
        rank.f(far=False)
    for _ in range(h + 1):  # 2
        rank.f(far=False)
        rank.f(far=True)
    for _ in range(rest):  # 3
        rank.b(far=True, split=True)
        rank.w()
        rank.f(far=True)
    for i in range(m // 2 - pp + h + 1):  # 4
        rank.pair(far_forward=False, overlapped=not (middle and i == 0))
        rank.pair(far_forward=True)
    for _ in range(rest):  # 5
        rank.b(far=True)
        rank.pair(far_forward=True)
    for i in range(h + 1):  # 6: W deferred from the middle round on (the far B first where h is odd)
        rank.b(far=True, split=i > (h + 1) // 2 or (i == (h + 1) // 2 and h % 2 == 1))
        rank.b(far=False, split=i >= (h + 1) // 2)
    for _ in range(rest):  # 7
        rank.w()
        rank.b(far=False, split=True)
    while rank.deferred:  # 8
        rank.w()
    return rank


def _check(pp: int, micro_batches: int) -> None:
    for name, value in (("pp", pp), ("micro_batches", micro_batches)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive integer")
    if pp % 2 or micro_batches % 2 or micro_batches < 2 * pp:
        raise ValueError(f"DualPipe needs an even pp and an even number of micro-batches m >= 2*pp (the DualPipe "
                         f"library's assertion): got pp={pp}, m={micro_batches}")


def build_dualpipe(pp: int, micro_batches: int) -> SplitTable:
    """Per-rank ordered F, B and W actions of DualPipe (module docstring): chunk 0 the down direction's stage r,
    chunk 1 the up direction's stage p − 1 − r."""
    _check(pp, micro_batches)
    return tuple(tuple(_rank_row(pp, micro_batches, r).row) for r in range(pp))


def dualpipe_pairs(pp: int, micro_batches: int) -> dict[SplitAction, SplitAction]:
    """The overlapped F&B pairs of ``build_dualpipe``'s table: each pair's forward -> its backward."""
    _check(pp, micro_batches)
    return {f: b for r in range(pp) for f, b in _rank_row(pp, micro_batches, r).pairs.items()}


def simulate_dualpipe(pp: int, micro_batches: int, t_fwd: float, t_bwd: float, t_wgrad: float,
                      t_p2p: float = 0.0) -> Timeline:
    """Time DualPipe's table (per-stage pass times, equal stages): each rank runs its row in order, a pair's forward
    waiting for its backward's input too (zero_bubble_v.simulate_routes with ``pairs``)."""
    return simulate_routes(build_dualpipe(pp, micro_batches), dualpipe_route(pp, micro_batches), t_fwd, t_bwd,
                           t_wgrad, t_p2p, pairs=dualpipe_pairs(pp, micro_batches))

