"""``meshplan rl --emit FORMAT``: the best plan a framework can run, as its launch (verl.py, openrlhf.py); where it
cannot run the plan ranked first, the next it can, saying so; where it can run none, #1's refusal as one line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import click

from meshplan.errors import SpecError
from meshplan.files import write_text
from meshplan.rl import openrlhf, verl
from meshplan.rl.estimate import RLEstimate


@dataclass(frozen=True)
class LaunchFormat:
    name: str
    refusal: Callable[[RLEstimate], str | None]
    script: Callable[[RLEstimate, str], str]
    framework: str  # the trainer stack the format's framework runs (the search's, unless --framework says)


RL_LAUNCH_FORMATS: dict[str, LaunchFormat] = {f.name: f for f in (
    LaunchFormat("verl", verl.verl_refusal, verl.verl_script, "megatron-core"),
    LaunchFormat("openrlhf", openrlhf.openrlhf_refusal, openrlhf.openrlhf_script, "deepspeed"),
)}


def rl_launch_text(plans: tuple[RLEstimate, ...], fmt: str, model_ref: str) -> tuple[str, int]:
    """(the launch, the rank of the plan written) of the first of ``plans`` the format can express."""
    form = RL_LAUNCH_FORMATS[fmt]
    if not plans:
        raise SpecError(f"--emit {fmt}: no RL plan fits, nothing to write")
    for rank, e in enumerate(plans, 1):
        if form.refusal(e) is None:
            return form.script(e, model_ref), rank
    raise SpecError(f"--emit {fmt}: {form.refusal(plans[0])}")


def write_rl_launch(result, fmt: str, path: str | None, model_ref: str) -> None:
    """The launch of ``result``'s best expressible plan, to ``path`` or printed."""
    text, rank = rl_launch_text(result.plans, fmt, model_ref)
    why = RL_LAUNCH_FORMATS[fmt].refusal(result.plans[0])
    note = "" if rank == 1 else f"# #1 cannot run on {fmt} ({why}): #{rank} written\n"
    if path:
        write_text(path, note + text, "emit-to")
        click.echo(f"wrote {path} (plan #{rank})", err=True)
    else:
        click.echo(note + text)
