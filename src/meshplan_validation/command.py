"""The ``meshplan validate`` command: predict every run of a published-runs JSONL file and compare with what was
measured (validate.validate_command). Registered with the meshplan CLI through the ``meshplan.commands`` entry
point, so that the core never imports the validation layer; the validation itself is imported when the command
runs, so that the CLI starts without it.
"""

from __future__ import annotations

import click


@click.command("validate")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--group", default=None, help="only the runs of this source group")
@click.option("--exclude-superseded", is_flag=True,
              help="skip the older numbers of configurations a newer record also gives (evaluated by default)")
@click.option("--hybrid", is_flag=True,
              help="also compare the runs kept apart: hybrid Mamba models with a latent MoE (Nemotron 3 Super), whose "
                   "residual error is not explained")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def validate(path: str, group: str | None, exclude_superseded: bool, hybrid: bool, as_json: bool) -> None:
    """Predict every run of a published-runs JSONL file and compare with what was measured."""
    from meshplan_validation.validate import validate_command  # noqa: PLC0415  (imported when the command runs)

    click.echo(validate_command(path, group, as_json, exclude_superseded, hybrid))
