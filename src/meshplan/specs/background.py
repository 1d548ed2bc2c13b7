"""A shared fabric (issue 84 item 6): other jobs' traffic on the links a plan's collectives cross. A plan is priced
as if the network were its own; on a cluster where several jobs run, another job keeps a share of each tier busy (the
spine of an oversubscribed fabric, the NICs of a node two jobs share), as ASTRA-sim's communicator groups and SimAI's
multi-job clusters model it.

Priced by the fluid link model contention.py uses for a plan's own flows (Bertsekas & Gallager 1992, "Data Networks",
§6.5.2, max-min fair rates): a link of bandwidth B that a background flow wants a share b of gives the plan's flow what
the background leaves, and never less than an equal half while both are in flight:

    B_eff = B · max(1 − b, 1/2)

so a tier kept 30 % busy runs the plan's collectives at 70 % of its rate, one kept busy all the time at half. The
NVLink domain (tier 0) is the job's own node: another job's traffic is never on it.

``--background-traffic`` takes the share for every tier beyond NVLink (``0.3``), per tier by name
(``network=0.3``, ``spine=0.5,leaf=0.1``), or another job's ``meshplan estimate --json`` output (a file): its link
time on each tier over its step, its collectives' seconds (its per-op table where the file has one, ``--ops``, else
its step breakdown's exposed seconds) on the tier its axis spans (the file's ``tiers``), as the share its flows take
of the links both jobs cross (an upper bound: they may cross other links).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from meshplan.errors import SpecError
from meshplan.files import read_text
from meshplan.specs.hardware import Cluster

TRAFFIC_AXES = ("tp", "cp", "ep", "pp", "dp")
EVERY = "*"  # every tier beyond the NVLink domain


@dataclass(frozen=True)
class Background:
    """The share of each tier (by name, or ``EVERY``) another job keeps busy."""

    shares: tuple[tuple[str, float], ...]
    source: str = ""

    def share(self, cluster: Cluster, tier: int) -> float:
        if tier == 0:
            return 0.0
        named = dict(self.shares)
        return named.get(cluster.tiers[tier].name, named.get(EVERY, 0.0))

    def describe(self) -> str:
        parts = ", ".join(f"{'every tier beyond NVLink' if t == EVERY else t} {b:.0%}" for t, b in self.shares)
        return parts + (f" ({self.source})" if self.source else "")


def _share(text: str, name: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 1:
        raise SpecError(f"background-traffic {name}={text!r} must be a share of the tier's bandwidth from 0 to 1")
    return value


def parse_background(text: str) -> Background:
    """A share (``0.3``), shares by tier (``network=0.3``) or an estimate's JSON file (module docstring)."""
    if text.strip().lower().endswith(".json"):
        data = json.loads(read_text(Path(text.strip()), "background-traffic"))
        return Background(tuple(job_shares(data, text).items()), source=f"the job of {text.strip()}")
    if "=" not in text:
        return Background(((EVERY, _share(text.strip(), "share")),))
    pairs = []
    for part in text.split(","):
        tier, _, value = part.partition("=")
        if not tier.strip():
            raise SpecError(f"background-traffic={text!r} must be TIER=SHARE pairs separated by commas")
        pairs.append((tier.strip(), _share(value.strip(), tier.strip())))
    return Background(tuple(pairs))


def _axis(name: str) -> str | None:
    """The parallel axis an op of the per-op table runs its collective over, from its name's segments."""
    for part in name.split("/"):
        for axis in TRAFFIC_AXES:
            if part == axis or part.startswith(axis + "_"):
                return axis
    return None


def job_shares(data: Any, where: str) -> dict[str, float]:
    """Another job's link time on each tier over its step, from its estimate JSON (module docstring)."""
    if not isinstance(data, dict) or not isinstance(data.get("tiers"), dict) or not data.get("step_time_s"):
        raise SpecError(f"background-traffic={where!r}: not a meshplan estimate --json output (tiers, step_time_s)")
    busy: dict[str, float] = {}
    ops = [o for o in data.get("ops", []) if isinstance(o, dict) and o.get("kind") == "collective"]
    seconds = {a: 0.0 for a in TRAFFIC_AXES}
    if ops:
        for op in ops:
            axis = _axis(str(op.get("name", "")))
            if axis is not None:
                seconds[axis] += float(op.get("count", 0)) * float(op.get("seconds", 0))
    else:
        seconds = {a: float(data.get("breakdown_s", {}).get(a, 0.0)) for a in TRAFFIC_AXES}
    for axis, tier in data["tiers"].items():
        if axis in seconds and tier != "nvlink":
            busy[tier] = busy.get(tier, 0.0) + seconds[axis]
    return {tier: min(1.0, s / float(data["step_time_s"])) for tier, s in busy.items()}


def under_background(cluster: Cluster, background: Background) -> Cluster:
    """``cluster`` with each tier's bandwidth what the background leaves (module docstring); a tier named that the
    cluster does not have is refused."""
    names = {t.name for t in cluster.tiers[1:]}
    unknown = [t for t, _ in background.shares if t not in names and t != EVERY]
    if unknown and not background.source:
        raise SpecError(f"background-traffic: tier {unknown[0]!r} is not a tier beyond NVLink of this cluster "
                        f"({', '.join(sorted(names)) or 'none'})")
    tiers = tuple(replace(t, bandwidth=t.bandwidth * max(1.0 - background.share(cluster, i), 0.5))
                  for i, t in enumerate(cluster.tiers))
    return replace(cluster, tiers=tiers)
