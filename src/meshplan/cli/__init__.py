"""The command line: options generated from the specs' fields, one module per command."""

import sys as _sys

SCRIPT = bool(_sys.argv) and _sys.argv[0].endswith("/meshplan")  # the console script: its process is meshplan's alone
if SCRIPT:  # no cyclic collection while it imports (cli/main.py's STARTUP: on again once the command is imported)
    import gc as _gc

    _gc.disable()

from meshplan.cli.main import STARTUP, cli, main, run  # noqa: E402

if SCRIPT:  # its dataclasses' methods compiled once (cli/codecache.py), before any command is imported
    from meshplan.cli.codecache import install as _install

    _install()
    # (an update, not a second definition: tests/test_duplicate_names.py)
    STARTUP.update({"collector held": True, "console script": True})

__all__ = ["cli", "main", "run"]
