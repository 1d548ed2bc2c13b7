"""``meshplan plan --emit FORMAT [--emit-to PATH]``: the fastest plan found, as a framework's config (configs/)."""

from __future__ import annotations

from pathlib import Path

import click

from meshplan.configs import FORMATS, emit
from meshplan.errors import SpecError

__all__ = ["EMIT_FRAMEWORK", "FORMATS", "check_emit", "write_best"]

# the stack preset whose plans a format's framework runs: the search's framework when --framework is not given
EMIT_FRAMEWORK = {"megatron": "megatron-core", "torchtitan": "torchtitan", "deepspeed": "deepspeed",
                  "nemo": "megatron-bridge"}


def check_emit(fmt: str | None, path: str | None, as_json: bool) -> None:
    """Before the search: ``--emit-to`` needs ``--emit``; with ``--json`` the config goes to a file, not stdout."""
    if path is not None and fmt is None:
        raise SpecError(f"emit-to={path} needs --emit FORMAT")
    if fmt is not None and as_json and path is None:
        raise SpecError("--emit with --json needs --emit-to PATH (stdout holds the JSON)")


def write_best(results: list, fmt: str, path: str | None) -> None:
    """The fastest listed plan the framework can express, as ``fmt``'s config: to ``path``, or printed; none
    expressible: the fastest plan's refusal."""
    ranked = sorted((e for r in results for e in r.plans), key=lambda e: e.step_time)
    if not ranked:
        raise SpecError(f"--emit {fmt}: no feasible plan to write")
    for est in ranked:
        try:
            text = emit(fmt, est.model, est.plan, est.stack)
            break
        except SpecError:
            continue
    else:
        emit(fmt, ranked[0].model, ranked[0].plan, ranked[0].stack)  # raises the fastest plan's refusal
    if path is None:
        click.echo(text, nl=False)
    else:
        Path(path).write_text(text, encoding="utf-8")
        click.echo(f"wrote {fmt} config of {est.plan.describe()} to {path}", err=True)
