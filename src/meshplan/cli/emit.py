"""``meshplan plan --emit FORMAT [--emit-to PATH]``: the plan the search ranks first (#1 of the table), as a framework's
config (configs/)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from meshplan.cli.common import EMIT_DEPTH, EMIT_FORMATS, EMIT_FRAMEWORK, check_emit  # `plan`'s, at start-up
from meshplan.errors import SpecError
from meshplan.files import write_text

__all__ = ["EMIT_DEPTH", "EMIT_FORMATS", "EMIT_FRAMEWORK", "check_emit", "write_best"]


def write_best(results: list, fmt: str, path: str | None, deeper: Callable[[], list] | None = None) -> None:
    """The plan ranked first (#1 of the table; of several GPU counts, the #1 with the shortest step), as ``fmt``'s
    config: to ``path``, or printed. Where the framework cannot express #1, the next plan it can, saying so; where it
    can express none of those listed, the first of the ``deeper`` search's (the same search keeping ``EMIT_DEPTH``
    plans: the same ranking, further down); none of those either: #1's refusal."""
    leaders = [r.plans for r in results if r.plans]
    if not leaders:
        raise SpecError(f"--emit {fmt}: no feasible plan to write: {_why_none(results)}")
    ranked = min(leaders, key=lambda plans: plans[0].step_time)
    found, refusal = _first_written(ranked, fmt)
    if found is None and deeper is not None:
        longer = [r.plans for r in deeper() if r.plans]
        ranked = min(longer, key=lambda plans: plans[0].step_time)
        found, _ = _first_written(ranked, fmt)
    if found is None:
        assert refusal is not None  # every plan was refused
        raise SpecError(f"{refusal} (none of the {len(ranked)} best plans can be written as {fmt})")
    rank, est, text = found
    if rank > 1:
        click.echo(f"#1 ({ranked[0].plan.describe()}) cannot be written as {fmt} ({refusal}): wrote #{rank}",
                   err=True)
    if path is None:
        click.echo(text, nl=False)
    else:
        write_text(path, text, "emit-to")
        click.echo(f"wrote {fmt} config of #{rank} ({est.plan.describe()}) to {path}", err=True)


def _why_none(results: list) -> str:
    """The search's leading rejection reasons (its rejected table's first rows), summed over the GPU counts."""
    reasons: dict[str, int] = {}
    for r in results:
        for reason, count in getattr(r, "rejected", {}).items():
            reasons[reason] = reasons.get(reason, 0) + count
    if not reasons:
        return "the search found none"
    top = sorted(reasons.items(), key=lambda kv: -kv[1])[:3]
    return "every plan was rejected, most for " + "; ".join(f"{reason} ({count:,})" for reason, count in top)


def _first_written(ranked: list, fmt: str) -> tuple[tuple[int, Any, str] | None, SpecError | None]:
    """The first of ``ranked`` (Estimates) that ``fmt`` expresses, as (rank, estimate, text), and #1's refusal."""
    from meshplan.configs import emit

    refusal: SpecError | None = None
    for rank, est in enumerate(ranked, 1):
        try:
            return (rank, est, emit(fmt, est.model, est.plan, est.stack)), refusal
        except SpecError as e:
            refusal = refusal or e
    return None, refusal
