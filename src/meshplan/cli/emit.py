"""``meshplan plan --emit FORMAT [--emit-to PATH]``: the plan the search ranks first (#1 of the table), as a framework's
config (configs/)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from meshplan.errors import SpecError
from meshplan.files import check_output, write_text

__all__ = ["EMIT_DEPTH", "EMIT_FORMATS", "EMIT_FRAMEWORK", "check_emit", "write_best"]

# the plans a search keeps when none of those listed can be written in the format asked for (write_best's deeper
# search): the next ones of the same ranking, down to this many
EMIT_DEPTH = 200

# the stack preset whose plans a format's framework runs: the search's framework when --framework is not given
EMIT_FRAMEWORK = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
                  "nemo": "megatron-bridge"}
# the formats --emit takes: configs.FORMATS's names, without importing the formats' modules at start-up (a plan that
# emits nothing never needs them; tests/test_configs.py checks the two agree)
EMIT_FORMATS = tuple(EMIT_FRAMEWORK)


def check_emit(fmt: str | None, path: str | None, as_json: bool) -> None:
    """Before the search: ``--emit-to`` needs ``--emit``; with ``--json`` the config goes to a file, not stdout; the
    file must be one that can be written (its folder exists, it is not a folder)."""
    if path is not None and fmt is None:
        raise SpecError(f"emit-to={path} needs --emit FORMAT")
    if fmt is not None and as_json and path is None:
        raise SpecError("--emit with --json needs --emit-to PATH (stdout holds the JSON)")
    if path is None:
        return
    check_output(path, "emit-to")  # a folder, a FIFO, a link loop, a name the OS refuses
    target = Path(path)
    folder = target.parent
    if not folder.is_dir():
        raise SpecError(f"emit-to={path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK)):
        raise SpecError(f"emit-to={path} cannot be written (permission denied)")


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
