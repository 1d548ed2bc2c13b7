"""``--stragglers`` and ``--power-cap`` (issue 84 item 3): the conditions a cluster runs under, for ``estimate`` and
``plan``. Stragglers slow every GPU's kernels to the pace of the slowest of N (specs/stragglers.py); a power cap lowers
each GPU's power limit, so its clock (specs/power.py). Each prices the plan on the changed cluster; a straggler's
figures (MFU) are then read against the GPUs' own peak."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import click

from meshplan.specs.hardware import Cluster

condition_options = [
    click.option("--stragglers", "stragglers", default=None,
                 help="per-GPU slowdown: P%:S (a share P of the GPUs S times slower, e.g. 1%:1.3) or lognormal:SIGMA; "
                      "the slowest of the job's GPUs sets the pace (FALCON, arXiv 2410.12588: fail-slows delayed the "
                      "average job 1.34x on a 10,000-GPU cluster)"),
    click.option("--background-traffic", "background", default=None,
                 help="other jobs on the fabric: the share of each tier beyond NVLink they keep busy (0.3, or by tier: "
                      "network=0.3), or another job's `meshplan estimate --json [--ops]` output (a file); the plan's "
                      "collectives get what they leave, at least half (specs/background.py)"),
    click.option("--power-cap", "power_cap", default=None,
                 help="power each GPU may draw: 500W, or a budget shared by N GPUs, 5.6kW/8 (a node) or 40kW/32 (a "
                      "rack); the GPUs run at the clock it allows (f ∝ P^(1/3))"),
]


def conditions_of(given: dict[str, Any]) -> tuple[Any, Any]:
    """(Stragglers or None, (PowerCap or None, Background or None)) of the options (taken out of ``given``); each
    condition's module is imported only when its option is given (a plain plan loads none of them)."""
    text, cap, background = given.pop("stragglers"), given.pop("power_cap"), given.pop("background")
    stragglers = power = traffic = None
    if text is not None:
        from meshplan.specs.stragglers import parse_stragglers

        stragglers = parse_stragglers(text)
    if cap is not None:
        from meshplan.specs.power import parse_power_cap

        power = parse_power_cap(cap)
    if background is not None:
        from meshplan.specs.background import parse_background

        traffic = parse_background(background)
    return stragglers, Shared(power, traffic)


@dataclass(frozen=True)
class Shared:
    """The cluster's power cap and the background traffic on its fabric (either may be None)."""

    cap: Any
    background: Any

    def __bool__(self) -> bool:
        return self.cap is not None or self.background is not None


def under(cluster: Cluster, stragglers: Any, shared: Any) -> Cluster:
    """``cluster`` under the power cap and the background traffic (``shared``) and at the stragglers' pace."""
    cap, background = (shared.cap, shared.background) if shared is not None else (None, None)
    if cap is not None:
        from meshplan.specs.power import capped

        cluster = capped(cluster, cap)
    if background is not None:
        from meshplan.specs.background import under_background

        cluster = under_background(cluster, background)
    if stragglers is not None:
        from meshplan.specs.stragglers import slowed

        cluster = slowed(cluster, stragglers.pace(cluster.num_gpus))
    return cluster


def as_on(est: Any, cluster: Cluster) -> Any:
    """An Estimate priced on a slowed cluster, read against ``cluster``'s GPUs (their peak: MFU)."""
    return replace(est, cluster=cluster) if est.cluster is not cluster else est


def result_on(result: Any, cluster: Cluster) -> Any:
    """A SearchResult priced on a slowed cluster, its plans read against ``cluster``."""
    return replace(result, cluster=cluster, plans=tuple(as_on(e, cluster) for e in result.plans),
                   fastest=None if result.fastest is None else as_on(result.fastest, cluster))


def conditions_text(stragglers: Any, shared: Any, cluster: Cluster) -> str:
    """One line naming the conditions priced, "" without any."""
    cap, background = (shared.cap, shared.background) if shared is not None else (None, None)
    parts = [f"background traffic: {background.describe()}"] if background is not None else []
    if stragglers is not None:
        parts.append(f"stragglers: {stragglers.describe()}; the slowest of {cluster.num_gpus:,} GPUs sets the pace, "
                     f"{stragglers.pace(cluster.num_gpus):.3f}x their kernels' time")
    if cap is not None:
        parts.append(f"power cap: {cap.describe()}")
    return "; ".join(parts)
