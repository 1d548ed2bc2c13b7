"""Whether a pipeline stage of vTrain's runs costs more per micro-batch than meshplan prices it (issue 79, the
small-work regime): a tool to find mechanisms, never to set a constant. The picks that miss choose pipeline depth 4
where tp 2 x pp 2 or tp 4 wins; a cost that only pipeline stages pay (Megatron-DeepSpeed 4822c87e synchronises the
device after every batch_isend_irecv of its 1F1B schedule, megatron/core/pipeline_parallel/p2p_communication.py
_communicate, batch_p2p_sync defaulting to True) would show as a measured / priced ratio of the per-micro-batch time
that grows with the depth at one tensor-parallel size, micro-batch and model.

Each plan's step times are a line in its micro-batch count (benchmarks/measure/small_work_parts.py ``lines``): its
slope is a micro-batch on the slowest stage, its intercept what the step pays once (the pipeline's fill and drain,
(p - 1) stages' micro-batch, and the optimizer). Per (tp, micro-batch, hidden, layers) this sets the slope's
measured / priced ratio beside each depth p (pp 1 at its smallest data-parallel size: the slope does not depend on
it), their ``spread`` (largest / smallest ratio: 1 where depth changes nothing the pricing misses), and the intercept
beyond the fill, b - (p - 1) a, measured and priced: the step's own work less what the slowest stage's extra work
(the embedding, the head and the loss on the end stages) saves the others' fill.

``python benchmarks/measure/small_work_stages.py`` prints the table and the largest spreads at tp 1 and at tp >= 2.
tests/test_small_work_stages.py shows the arithmetic on made-up plans.
"""

from __future__ import annotations

from typing import Any

from meshplan_validation.records import clean_record, read_runs
from small_work_parts import VTRAIN, cases, lines, series

Fits = dict[tuple[int, ...], dict[str, tuple[float, float]]]
Group = tuple[int, int, int, int]  # (tp, micro-batch, hidden, layers)


def by_depth(fits: Fits) -> dict[Group, dict[int, dict[str, tuple[float, float]]]]:
    """Per (tp, micro-batch, hidden, layers), each pipeline depth's fitted lines: at dp 1, or at the smallest
    data-parallel size fitted where dp 1 is not (pp 1 at tp 1 on vTrain's nodes)."""
    out: dict[Group, dict[int, dict[str, tuple[float, float]]]] = {}
    dps: dict[tuple[Group, int], int] = {}
    for (tp, pp, dp, mb, layers, hidden), fit in sorted(fits.items()):
        group = (tp, mb, hidden, layers)
        if dps.setdefault((group, pp), dp) == dp:
            out.setdefault(group, {})[pp] = fit
    return out


def ratios(depths: dict[int, dict[str, tuple[float, float]]]) -> dict[int, float]:
    """Each depth's measured / priced seconds per micro-batch."""
    return {pp: fit["measured"][0] / fit["priced"][0] for pp, fit in sorted(depths.items())}


def spread(ratio: dict[int, float]) -> float:
    """The largest ratio over the smallest: 1 where the pricing's error does not change with the depth."""
    return max(ratio.values()) / min(ratio.values())


def beyond_fill(pp: int, line: tuple[float, float]) -> float:
    """A line's intercept less the fill of p - 1 stages at its slope, b - (p - 1) a, in seconds."""
    slope, intercept = line
    return intercept - (pp - 1) * slope


def table(groups: dict[Group, dict[int, dict[str, tuple[float, float]]]]) -> list[str]:
    """Markdown rows of the groups run at two depths or more: ratios by depth, spread, and the intercept beyond the
    fill (measured / priced, milliseconds) by depth."""
    out = ["| tp | micro-batch | hidden | layers | measured / priced a micro-batch, by pp | spread | "
           "intercept beyond the fill, ms, by pp |", "|---:|---:|---:|---:|---|---:|---|"]
    for (tp, mb, hidden, layers), depths in sorted(groups.items()):
        if len(depths) < 2:
            continue
        r = ratios(depths)
        cells = ", ".join(f"{pp}: {v:.3f}" for pp, v in r.items())
        fill = ", ".join(f"{pp}: {1e3 * beyond_fill(pp, f['measured']):.1f} / {1e3 * beyond_fill(pp, f['priced']):.1f}"
                         for pp, f in sorted(depths.items()))
        out.append(f"| {tp} | {mb} | {hidden} | {layers} | {cells} | {spread(r):.3f} | {fill} |")
    return out


def largest(groups: dict[Group, dict[int, dict[str, tuple[float, float]]]], tp_one: bool) -> float:
    """The largest spread over the groups at tp 1 (``tp_one``) or at tp >= 2 run at two depths or more."""
    found = [spread(ratios(d)) for g, d in groups.items() if len(d) > 1 and (g[0] == 1) == tp_one]
    return max(found, default=1.0)


def main() -> list[str]:
    records: list[dict[str, Any]] = [clean_record(r) for r in read_runs(VTRAIN)]
    groups = by_depth(lines(records, series(records, cases(records))))
    head = (f"Largest spread of measured / priced a micro-batch over the depths: tp >= 2 {largest(groups, False):.3f}, "
            f"tp 1 {largest(groups, True):.3f} (benchmarks/measure/small_work_stages.py).")
    return [head, "", *table(groups)]


if __name__ == "__main__":
    print("\n".join(main()))
