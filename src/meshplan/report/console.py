"""The terminal's console (rich), apart from the training report's tables (report/text.py) so that a command that
prints other tables (``serve``, ``trace``, ``calibrate``) does not import the training search's report, goodput and
energy to get it (tests/test_startup.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshplan.report.fold import refold

if TYPE_CHECKING:
    from rich.console import Console


def terminal_console() -> Console:
    """A console as wide as the terminal (or as ``COLUMNS`` says), else 150 columns when the output is a file or a
    pipe."""
    import os
    import sys

    from rich.console import Console

    class _Console(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            """Tables wider than the terminal folded (fold.refold) instead of squeezed into "…" and split numbers."""
            from rich.table import Table

            if self.color_system is None:  # no styles written (a pipe, a file): its highlighting would be dropped
                kwargs.setdefault("highlight", False)
            super().print(*(x for o in objects for x in (refold(o, self.width) if isinstance(o, Table) else [o])),
                          **kwargs)

        def on_broken_pipe(self) -> None:
            """`meshplan … | head -1`: rich exits 1 here (SystemExit); the CLI's main exits 0 quietly instead."""
            self.quiet = True
            raise BrokenPipeError

    return _Console() if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else _Console(width=150)
