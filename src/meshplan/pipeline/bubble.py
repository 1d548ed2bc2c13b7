"""The pipeline bubble of a synchronous schedule in closed form: the one formula the estimator, the search and
equal_ranks.py's closed forms use. tests/test_schedule.py proves it equal to ``simulator.simulate``'s bubble
over a grid of schedules, p, m and v, on equal and on unequal ranks, where it claims to hold (below).

A pipeline is a flow shop: the busiest rank b works m·t_b, and the step also waits for every other rank once, while the
first micro-batch fills the pipeline and the last one drains it: Σ_{i≠b} t_i. Interleaving with v chunks per rank cuts
those fill and drain steps to 1/v (Narayanan et al. 2021 §2.2: with equal ranks this is the familiar
(p − 1)/v · t_stage, a fraction (p − 1)/(v·m) of the ideal m·t_stage). Only the first rank holds the embedding and only
the last the LM head and loss, so the bubble is paid at the other ranks' times, not at the busiest one's:
    bubble = ((p − 2)·t_middle + t_other_end) / v
with t the time of one micro-batch through a whole rank (both passes, all v chunks).

Where it holds (equal to the simulator, t_p2p = 0): equal ranks, any schedule; unequal ranks whose middle ranks are no
busier than the ends, when the last rank is the busiest in both passes (the LM head's rank), under GPipe, 1F1B and
interleaved alike; under GPipe also when the first rank is the busiest in both passes. When the first rank is the
busiest in both, 1F1B and interleaved overlap part of the others' fill with its work and the simulator's bubble is
smaller (this form is then an upper bound). A rank busier forward and the other busier backward: neither.
The asynchronous schedules never flush (steady.py): no bubble per step, their one fill per training run amortised away
(their records' bubble, forms.none, is 0).
"""

from __future__ import annotations

from meshplan.xp import Num, maximum


def flow_bubble(pp: Num, vpp: Num, first: Num, last: Num, middle: Num) -> Num:
    """The bubble per step of a flushing schedule from one micro-batch's time through the first, the last and a middle
    rank (both passes, all v chunks; scalars or arrays): ((p − 2)·t_middle + t_other_end)/v (module docstring); 0 for
    p = 1."""
    busiest = maximum(maximum(first, last), middle * (pp > 2))  # a middle rank the busiest (more parameters to
    others = first + last + (pp - 2) * middle - busiest  # reduce, a lighter first stage): it is paid m times
    return (pp > 1) * others / vpp
