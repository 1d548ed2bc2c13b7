"""A refinement of the search's first plan: its pipeline's end stages resized (Plan.first_stage_layers and
last_stage_layers, Megatron-Core's decoder_first_pipeline_num_layers / decoder_last_pipeline_num_layers), so that an
embedding-heavy first rank and a head-heavy last rank carry fewer layers than the middle ones, or more where they
are the lighter (Galvatron, Aceso and Mist search per-stage splits; the issue's report: stages treated alike
under-estimate the heaviest by 32 %).

The split is a partition of the L layers over p ranks whose middle p − 2 ranks hold equal counts (Megatron-Core
asserts an even split of the layers between the first and the last stage): each (f, l) with L − f − l a positive
multiple of p − 2 (f + l = L for p = 2) near the even ⌈L / p⌉, the first from ``LIGHTER`` below it (a first stage
lighter than the middle ones is priced rank by rank: step/ranks.py) to ``REACH`` above. Every candidate is priced by
``estimate()`` (so the refined plan's time is estimate's exactly) and the fastest no heavier than the plan is kept,
the unrefined plan among the candidates: the refined #1 is never slower nor heavier than the uniform one.
Per-rank recompute and offload are search/stage_settings.py's.
"""

from __future__ import annotations

import math

from meshplan.estimate import Estimate, estimate
from meshplan.search.stage_lines import ends_reach
from meshplan.specs.check import check
from meshplan.specs.efficiency import Efficiency
from meshplan.specs.hardware import Cluster
from meshplan.specs.model import ModelSpec
from meshplan.specs.plan import Plan
from meshplan.specs.stack import Stack
from meshplan.step.ranks import priced_apart

# layers the first stage may gain above the even count ⌈L / p⌉ and the last one shed below it (≤ 4 · 5 candidates),
# and the first may shed (≤ 2 · 5 more): where the middle ranks divide the rest, a few of them are splits
REACH = 3
LIGHTER = 2


def end_splits(layers: int, pp: int, vpp: int) -> list[tuple[int, int]]:
    """(first, last) layer counts near the even split whose middle ranks split the rest evenly, each end at least
    one layer per model chunk (vpp) and a multiple of it, the even split (0, 0) first."""
    even = -(-layers // pp)
    out = [(0, 0)]
    for f in range(max(vpp, even - LIGHTER), even + REACH + 1):
        for last in range(max(vpp, even - REACH), even + 2):
            rest, middle = layers - f - last, pp - 2
            ok = rest == 0 if middle == 0 else rest >= middle * vpp and rest % (middle * vpp) == 0
            same = f == last == even and layers == even * pp  # the even split itself
            if ok and not same and f % vpp == 0 and last % vpp == 0:
                out.append((f, last))
    return out


def refine_ends(model: ModelSpec, cluster: Cluster, best: Estimate, stack: Stack, eff: Efficiency) -> Estimate:
    """``best`` with its end stages resized where that is faster and no heavier (estimate's times and peaks), else
    ``best``."""
    plan = best.plan
    if plan.pp == 1 or not best.fits or not stack.supports.uneven_stages:
        return best
    chosen = best
    for f, last in end_splits(model.num_layers, plan.pp, plan.vpp)[1:]:
        candidate = plan.with_(first_stage_layers=f, last_stage_layers=last)
        if check(model, cluster, candidate, stack) or _slower(model, cluster, candidate, stack, eff, chosen):
            continue
        est = estimate(model, cluster, candidate, stack, eff)
        if est.fits and est.peak_memory <= best.peak_memory and (est.step_time, est.peak_memory) < (
                chosen.step_time, chosen.peak_memory):
            chosen = est
    return chosen


def _slower(model: ModelSpec, cluster: Cluster, candidate: Plan, stack: Stack, eff: Efficiency, chosen: Estimate
            ) -> bool:
    """Whether ``candidate`` cannot displace ``chosen``: its ranks priced apart (step/ranks.py, as ``estimate`` prices
    them), one of its end ranks alone takes longer than ``chosen``'s step (stage_lines.ends_reach at the next float
    above it: a step equal to ``chosen``'s could still win on memory), and its step, the busiest rank's plus the
    bubble (>= 0), is then longer too; the estimate it skips would not be chosen (search/stage_pool.py's ``_below``
    prunes its proposals alike). DeepSeek-V3's: 3 of its 6 end splits."""
    return priced_apart(model, candidate) and ends_reach(model, cluster, candidate, stack, eff,
                                                          math.nextafter(chosen.step_time, math.inf))
