"""The command line: the ``meshplan`` group, its commands (one module each) and the one-line error policy.

Commands of other packages join through the ``meshplan.commands`` entry point group (the validation layer's
``validate``): the core never imports them. Any bad input becomes one line on stderr and exit status 2.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points

import click

from meshplan.cli import check, report, tools
from meshplan.cli.estimate import estimate
from meshplan.cli.plan import plan_cmd
from meshplan.cli.serve import serve_cmd
from meshplan.errors import MeshplanError
from meshplan.fields import one_line


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="meshplan")
def cli() -> None:
    """meshplan: how fast will this model train on this hardware, will it fit, and which plan is best."""


for command in [estimate, plan_cmd, serve_cmd, *tools.COMMANDS, check.check_step_cmd, *report.COMMANDS]:
    cli.add_command(command)
for entry in entry_points(group="meshplan.commands"):
    cli.add_command(entry.load(), entry.name)


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the CLI; any bad input becomes one line on stderr and exit status 2."""
    try:
        cli.main(args=argv, prog_name="meshplan", standalone_mode=False)
    except MeshplanError as exc:
        click.echo(f"meshplan: error: {one_line(str(exc))}", err=True)
        return 2
    except click.exceptions.Abort:
        click.echo("meshplan: aborted", err=True)
        return 130
    except click.ClickException as exc:
        click.echo(f"meshplan: error: {one_line(exc.format_message())}", err=True)
        return 2
    except Exception as exc:  # noqa: BLE001  (a bug, not bad input: still one line, and how to see more)
        if os.environ.get("MESHPLAN_DEBUG"):
            raise
        first = one_line((str(exc).strip().splitlines() or [""])[0])
        click.echo(f"meshplan: internal error: {type(exc).__name__}: {first} (a bug in meshplan: please report "
                   "the command; MESHPLAN_DEBUG=1 shows the traceback)", err=True)
        return 3
    return 0


def run() -> None:
    """Console-script wrapper: exit with main()'s status."""
    sys.exit(main())
