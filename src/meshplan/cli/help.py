"""``--help`` in sections: a command with many options (``plan`` has over a hundred) lists them under headings
(the model and hardware, the search space, the framework, output ...) instead of one run of 350 lines. A
``section(title)`` decorator, placed above a block of option decorators, names the block (click applies decorators
bottom-up, so it tags the options added below it that no section has claimed); ``Sectioned`` prints each section's
options under its title, in the order the sections first appear, and any untagged ones under "Options".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

_TAG = "meshplan_section"


def section(title: str) -> Callable[[Any], Any]:
    """Tag the options declared below this decorator (and not tagged yet) with ``title``."""
    def deco(f: Any) -> Any:
        for param in getattr(f, "__click_params__", []):
            if not hasattr(param, _TAG):
                setattr(param, _TAG, title)
        return f
    return deco


class Sectioned(click.Command):
    """A command whose --help lists its options under their sections' titles."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                groups.setdefault(getattr(param, _TAG, "Options"), []).append(record)
        for title, records in groups.items():
            with formatter.section(title):
                formatter.write_dl(records)
