"""The command line: options generated from the specs' fields, one module per command."""

import sys as _sys

from meshplan.cli.main import cli, main, run

if _sys.argv and _sys.argv[0].endswith("/meshplan"):  # the console script: its dataclasses' methods compiled once
    from meshplan.cli.codecache import install as _install  # (cli/codecache.py), before any command is imported

    _install()

__all__ = ["cli", "main", "run"]
