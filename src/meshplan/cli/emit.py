"""``meshplan plan --emit FORMAT [--emit-to PATH]``: the plan the search ranks first (#1 of the table), as a framework's
config (configs/)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from meshplan.configs import FORMATS, emit
from meshplan.errors import SpecError
from meshplan.files import check_output, write_text

__all__ = ["EMIT_FRAMEWORK", "FORMATS", "check_emit", "write_best"]

# the stack preset whose plans a format's framework runs: the search's framework when --framework is not given
EMIT_FRAMEWORK = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
                  "nemo": "megatron-bridge"}


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


def write_best(results: list, fmt: str, path: str | None) -> None:
    """The plan ranked first (#1 of the table; of several GPU counts, the #1 with the shortest step), as ``fmt``'s
    config: to ``path``, or printed. Where the framework cannot express #1, the next plan it can, saying so; none:
    #1's refusal."""
    leaders = [r.plans for r in results if r.plans]
    if not leaders:
        raise SpecError(f"--emit {fmt}: no feasible plan to write")
    ranked = min(leaders, key=lambda plans: plans[0].step_time)
    refusal: SpecError | None = None
    for rank, est in enumerate(ranked, 1):
        try:
            text = emit(fmt, est.model, est.plan, est.stack)
        except SpecError as e:
            refusal = refusal or e
            continue
        if refusal is not None:
            click.echo(f"#1 ({ranked[0].plan.describe()}) cannot be written as {fmt} ({refusal}): wrote #{rank}",
                       err=True)
        if path is None:
            click.echo(text, nl=False)
        else:
            write_text(path, text, "emit-to")
            click.echo(f"wrote {fmt} config of #{rank} ({est.plan.describe()}) to {path}", err=True)
        return
    assert refusal is not None  # every plan was refused
    raise refusal
