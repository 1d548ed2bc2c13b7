"""Each schedule's bubble in closed form over per-rank times: the one formula the estimate, the search and the ranks
priced apart (step/ranks.py) use, through the registry (registry.py). tests/test_pipeline_forms.py holds every form
against its schedule's simulated table on equal and on unequal ranks.

The ranks come as ``RankTimes``: each rank's forward and backward (the whole backward, input and weight gradients)
per micro-batch through the whole rank (all its chunks), either every rank's, or the first, the last and one middle
rank's standing for p − 2 alike (scalars or arrays: the search's batch). Every form is a flow shop over some value of
each rank (bubble.py): the other ranks' values once, Σ_r x_r − max_r x_r, sometimes scaled; Chimera adds the ranks'
largest |T_B − T_F|.

    1F1B, GPipe       flow(T_F + T_B)                      (Narayanan et al. 2021 §2.2.1)
    interleaved       flow(T_F + T_B) / v                  (§2.2.2)
    PipeDream, 2BW    0 per step (no flush: steady.py)
    ZB-H1             flow(T_F)                            (Qi et al. 2023 §3.1: (p − 1)·(T_F + T_B − T_W), T_B = T_W)
    ZB-V              flow(max(T_F − T_B/2, (T_B/2 − T_F)/2))   (zero_bubble_v.py: the table's; the paper's
                      (p − 1)·(T_F + T_B − 2·T_W) where T_F ≥ T_B/2)
    DualPipe          flow(T_F + T_B/2)·(p/2 − 1)/(p − 1)  (DeepSeek-V3 Table 2 with T_B = T_W; dualpipe.py)
    Chimera           (p/2 − 1)·(flow(T_F + T_B)/(p − 1) + |T_B − T_F|_max)   (one basic unit, m = p: Li & Hoefler
                      2021 Figure 3; Table 1's (p/2 − 1)·(T_F + T_B) where T_B = T_F; chimera.py)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from meshplan.pipeline.bubble import flow_bubble
from meshplan.xp import Num, maximum

Value = Callable[[Num, Num], Num]  # (T_F, T_B) of a rank -> the value its flow shop sums


@dataclass(frozen=True, slots=True)
class RankTimes:
    """The ranks' (T_F, T_B) per micro-batch (module docstring): ``ends`` True for (first, last, middle) with p − 2
    middle ranks alike, False for every rank in order."""

    t_f: tuple[Num, ...]
    t_b: tuple[Num, ...]
    whole: tuple[Num, ...]  # T_F + T_B as the caller sums its parts (the step's own total, to the last bit)
    pp: Num
    ends: bool

    @classmethod
    def of_ends(cls, pp: Num, first: tuple[Num, Num, Num], last: tuple[Num, Num, Num],
                middle: tuple[Num, Num, Num]) -> RankTimes:
        """From (T_F, T_B, T_F + T_B) of the first, the last and a middle rank."""
        f, b, w = zip(first, last, middle, strict=True)
        return cls(t_f=f, t_b=b, whole=w, pp=pp, ends=True)

    @classmethod
    def of_each(cls, ranks: Sequence[tuple[float, float]], whole: Sequence[float] | None = None) -> RankTimes:
        """From every rank's (T_F, T_B), in rank order (and T_F + T_B as the caller sums it, if given)."""
        f, b = tuple(float(x) for x, _ in ranks), tuple(float(y) for _, y in ranks)
        w = tuple(x + y for x, y in zip(f, b, strict=True)) if whole is None else tuple(map(float, whole))
        return cls(t_f=f, t_b=b, whole=w, pp=len(ranks), ends=False)

    def flow(self, value: Value, vpp: Num = 1) -> Num:
        """Σ_r x_r − max_r x_r over v (bubble.flow_bubble on the ends' form), x_r = value(T_F, T_B) of rank r."""
        xs = [value(f, b) for f, b in zip(self.t_f, self.t_b, strict=True)]
        if self.ends:
            return flow_bubble(self.pp, vpp, xs[0], xs[1], xs[2])
        each = np.array([float(x) for x in xs])
        return float((each.sum() - each.max()) / vpp) if len(each) > 1 else 0.0

    def most(self, value: Value) -> Num:
        """max_r value(T_F, T_B) (the ends' form: of the first, the last and the middle rank)."""
        out: Num = 0.0
        for f, b in zip(self.t_f, self.t_b, strict=True):
            out = maximum(out, value(f, b))
        return out


def line(r: RankTimes, vpp: Num, m: Num) -> Num:
    """GPipe, 1F1B, interleaved: the flow shop over whole passes, over v."""
    if r.ends:
        return flow_bubble(r.pp, vpp, *r.whole)
    each = np.array([float(x) for x in r.whole])
    return float((each.sum() - each.max()) / vpp) if len(each) > 1 else 0.0


def none(r: RankTimes, vpp: Num, m: Num) -> Num:
    """The asynchronous schedules: no flush, no bubble per step (their one fill per run amortised: steady.py)."""
    return 0.0 * r.flow(lambda f, b: f + b)


def zb_h1(r: RankTimes, vpp: Num, m: Num) -> Num:
    """ZB-H1: (p − 1)·(T_F + T_B − T_W) with T_B = T_W is (p − 1)·T_F, a flow shop over the forwards."""
    return r.flow(lambda f, b: f)


def zb_v(r: RankTimes, vpp: Num, m: Num) -> Num:
    """ZB-V: its table's (p − 1)·max(T_F − T_B/2, (T_B/2 − T_F)/2) (zero_bubble_v.py), over each rank's value."""
    return r.flow(lambda f, b: maximum(f - b / 2, (b / 2 - f) / 2))


def dualpipe(r: RankTimes, vpp: Num, m: Num) -> Num:
    """DualPipe: Table 2's (p/2 − 1)·(T_F + T_B) with T_B = T_W = half the backward, the (p/2 − 1)/(p − 1) share
    of the flow shop over T_F + T_B/2."""
    pair = r.flow(lambda f, b: f + b / 2)
    return pair * maximum(r.pp / 2 - 1, 0.0) / maximum(r.pp - 1, 1)


def chimera(r: RankTimes, vpp: Num, m: Num) -> Num:
    """Chimera, K = m/p basic units directly concatenated (§3.5): (p/2 − 1)·((T_F + T_B) + (2K − 1)·|T_B − T_F|),
    the first term the flow shop over whole passes at its (p/2 − 1)/(p − 1) share, the second over the ranks'
    largest |T_B − T_F| (chimera.py; the registry refuses K > 1, whose forward doubling is not modelled)."""
    whole = r.flow(lambda f, b: f + b)
    widest = r.most(lambda f, b: maximum(b - f, f - b))
    units = maximum(2 * m / maximum(r.pp, 1) - 1, 0.0)
    return maximum(r.pp / 2 - 1, 0.0) * (whole / maximum(r.pp - 1, 1) + units * widest)


# ---- the papers' own forms: equal ranks, m large enough, T_W apart (a record's ``published``; the tables' tests hold
# each table to its paper's form, tests/test_zero_bubble*.py, test_dualpipe.py, test_chimera.py) ----------------------
Published = Callable[[int, float, float, float], float]  # (p, T_F, T_B, T_W) -> seconds per step


def published_zb_h1(pp: int, t_fwd: float, t_bwd: float, t_wgrad: float) -> float:
    """ZB-H1, m ≥ p: (p − 1)·(T_F + T_B − T_W) (Qi et al. 2023 §3.1; zero_bubble.py)."""
    return (pp - 1) * (t_fwd + t_bwd - t_wgrad)


def published_zb_v(pp: int, t_fwd: float, t_bwd: float, t_wgrad: float) -> float:
    """ZB-V, whole-rank times, m ≥ 2p: max(0, (p − 1)·(T_F + T_B − 2·T_W)) (Qi et al. 2024 §6, Table 5;
    zero_bubble_v.py)."""
    return max(0.0, (pp - 1) * (t_fwd + t_bwd - 2 * t_wgrad))


def published_dualpipe(pp: int, t_fwd: float, t_bwd: float, t_wgrad: float) -> float:
    """DualPipe, m ≥ 2p even: (p/2 − 1)·(F&B + B − 3·W) with B = T_B + T_W the full backward and F&B = T_F + B
    (DeepSeek-V3 Table 2 and its caption; zero_bubble.py)."""
    full = t_bwd + t_wgrad  # Table 2's B: a full backward chunk
    return (pp / 2 - 1) * ((t_fwd + full) + full - 3 * t_wgrad)


def published_chimera(pp: int, t_fwd: float, t_bwd: float, t_wgrad: float) -> float:
    """Chimera, m = p: (p/2 − 1)·(T_F + T_B), its backward whole (T_B + T_W) (Li & Hoefler 2021 Table 1;
    zero_bubble_v.py)."""
    return (pp / 2 - 1) * (t_fwd + t_bwd + t_wgrad)
