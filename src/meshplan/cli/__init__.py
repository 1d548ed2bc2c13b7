"""The command line: options generated from the specs' fields, one module per command."""

from meshplan.cli.main import cli, main, run

__all__ = ["cli", "main", "run"]
