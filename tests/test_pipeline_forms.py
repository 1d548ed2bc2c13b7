"""Every schedule's closed form (its registry record's ``bubble`` over per-rank times, pipeline/forms.py) against its
own action table, simulated (issue 82), on equal ranks and on unequal ones of the shape the estimate prices (middle
ranks alike, the first heavier by its embedding, the last the heaviest by its LM head and loss). Where a form is
exact the test says ``==``; where it is only a bound it says which side, and why:

    gpipe, 1f1b, interleaved   exact (bubble.py: last rank the busiest in both passes)
    pipedream, 2bw             exact: no bubble in the steady state (the period is m times the busiest rank)
    zb-h1                      exact where T_B/2 ≤ T_F, or the last rank the busiest; on equal ranks with the input
                               gradient longer than the forward the table idles (p − 1)·T_B/2: the form UNDER-prices
    zb-v                       the paper's bubble (Qi et al. 2024 §6), each rank's span: consecutive steps overlapping
                               (its post-validation, §5); one step with its flush idles more: a LOWER bound
    dualpipe                   Table 2's (p/2 − 1)·(T_F + T_B), at or over the library's order (dualpipe.py): an
                               UPPER bound
    chimera                    one basic unit (m = p, the only one priced): exact on equal ranks (Li & Hoefler 2021
                               Figure 3 / Table 1, and with T_B ≠ T_F), an UPPER bound on unequal ranks
Times per rank are per micro-batch through the whole rank (both chunks of the two-chunk schedules), the backward
whole; the split tables take B = W = half of it (step/stages.py's split).
"""

from __future__ import annotations

import pytest

from meshplan.pipeline.chimera import build_chimera, chimera_route
from meshplan.pipeline.dualpipe import build_dualpipe, dualpipe_pairs, dualpipe_route
from meshplan.pipeline.forms import RankTimes
from meshplan.pipeline.names import ALL
from meshplan.pipeline.registry import schedule_of
from meshplan.pipeline.simulator import simulate
from meshplan.pipeline.steady import steady_step
from meshplan.pipeline.tables import build
from meshplan.pipeline.zero_bubble import build_zb_h1, simulate_split
from meshplan.pipeline.zero_bubble_v import build_zb_v, simulate_routes, v_route

ENDS = [(1.0, 1.0), (1.1, 1.3), (1.05, 1.6)]  # forward of the first and the last rank; middle ranks 1.0
RATIOS = [1.5, 2.0, 3.0]  # backward / forward


def _ranks(pp: int, ends: tuple[float, float], ratio: float) -> tuple[list[float], list[float]]:
    f = [ends[0]] + [1.0] * (pp - 2) + [ends[1]]
    return f, [ratio * x for x in f]


def _form(schedule: str, f: list[float], b: list[float], m: int, vpp: int = 1) -> float:
    return float(schedule_of(schedule).bubble(RankTimes.of_each(list(zip(f, b, strict=True))), vpp, m))


def _simulated(schedule: str, pp: int, m: int, f: list[float], b: list[float]) -> float:
    """The bubble of the schedule's table at these ranks' times: step − the busiest rank's work (steady: period −
    m times the busiest rank)."""
    if schedule in ("gpipe", "1f1b"):
        return simulate(build(schedule, pp, m), f, b).bubble_time
    if schedule == "interleaved":  # two chunks a rank, each half the rank
        return simulate(build(schedule, pp, m, 2), [x / 2 for x in f], [x / 2 for x in b]).bubble_time
    if schedule in ("pipedream", "pipedream-2bw"):
        return steady_step(schedule, pp, m, f, b) - m * max(x + y for x, y in zip(f, b, strict=True))
    half = [x / 2 for x in b]
    if schedule == "zb-h1":
        return simulate_split(build_zb_h1(pp, m), f, half, half).bubble_time
    if schedule == "zb-v":  # chunk times half the rank's
        per = [[x / 2, x / 2] for x in f]
        quarter = [[x / 4, x / 4] for x in b]
        return simulate_routes(build_zb_v(pp, m), v_route(pp), per, quarter, quarter).bubble_time
    # the bidirectional ones: chunk 0 of rank r is stage r, chunk 1 stage p − 1 − r
    tf = [[f[r], f[pp - 1 - r]] for r in range(pp)]
    if schedule == "chimera":
        tb = [[b[r], b[pp - 1 - r]] for r in range(pp)]
        return simulate_routes(build_chimera(pp, m), chimera_route(pp), tf, tb).bubble_time
    tw = [[half[r], half[pp - 1 - r]] for r in range(pp)]
    return simulate_routes(build_dualpipe(pp, m), dualpipe_route(pp, m), tf, tw, tw,
                           pairs=dualpipe_pairs(pp, m)).bubble_time


def _rank_times(schedule: str, pp: int, f: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    """The ranks' times the estimate hands the form: the bidirectional schedules' rank r runs half its
    micro-batches through stage r and half through p − 1 − r (stages.two_chunk_times, the records' end shares)."""
    if schedule_of(schedule).mirrored or schedule_of(schedule).weight_copies == 2:
        return ([(f[r] + f[pp - 1 - r]) / 2 for r in range(pp)], [(b[r] + b[pp - 1 - r]) / 2 for r in range(pp)])
    return f, b


@pytest.mark.parametrize("schedule", ALL)
@pytest.mark.parametrize("pp", [4, 8])
@pytest.mark.parametrize("ends", ENDS)
@pytest.mark.parametrize("ratio", RATIOS)
def test_every_closed_form_against_its_simulated_table(schedule, pp, ends, ratio):
    f, b = _ranks(pp, ends, ratio)
    m = pp if schedule == "chimera" else 2 * pp
    sim = _simulated(schedule, pp, m, f, b)
    form = _form(schedule, *_rank_times(schedule, pp, f, b), m, 2 if schedule == "interleaved" else 1)
    equal = ends == (1.0, 1.0)
    if schedule in ("gpipe", "1f1b", "interleaved", "pipedream", "pipedream-2bw"):
        assert form == pytest.approx(sim, abs=1e-9)
    elif schedule == "zb-h1":
        if ratio / 2 <= 1.0 or not equal:
            assert form == pytest.approx(sim, abs=1e-9)
        else:  # the input gradient longer than the forward on equal ranks: (p − 1)·T_B/2
            assert sim == pytest.approx((pp - 1) * ratio / 2) and form < sim
    elif schedule == "zb-v":
        assert form <= sim + 1e-9  # the span bubble of steps back to back; one flushed step idles more
    elif schedule == "dualpipe":
        assert sim <= form + 1e-9
    elif equal:  # chimera, one unit
        assert form == pytest.approx(sim, abs=1e-9)
    else:
        assert sim <= form + 1e-9


def test_the_flow_form_of_every_rank_is_the_ends_form_where_the_middle_ranks_are_alike():
    for name in ALL:
        f, b = _ranks(6, (1.1, 1.4), 2.5)
        ends = RankTimes.of_ends(6, *((f[i], b[i], f[i] + b[i]) for i in (0, 5, 1)))
        each = RankTimes.of_each(list(zip(f, b, strict=True)))
        record = schedule_of(name)
        assert float(record.bubble(ends, 1, 6)) == pytest.approx(float(record.bubble(each, 1, 6)), rel=1e-12)
