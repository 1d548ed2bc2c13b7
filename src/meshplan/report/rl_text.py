"""The RL search's tables for the terminal (rich): the best plans ranked (ranked_rl.py's listing, folded to the
terminal's width with its legend), the best plan of each set-up side by side (its phases with their pools and seconds,
its memory per GPU in each phase), and what was rejected; or its JSON. Pure formatting: the numbers come from rl/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshplan.report.fold import listing_tables
from meshplan.report.ranked_rl import from_rl, memory_rows, phase_rows, pools_text

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from meshplan.rl.estimate import RLEstimate
    from meshplan.rl.search import RLSearchResult


def side_by_side(title: str, best: dict[str, RLEstimate], rows: list[list[str]]) -> Table:
    """A table of ``rows`` (a phase and one cell per set-up) under the set-ups' names."""
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("phase")
    for name in best:
        table.add_column(f"{name} ({pools_text(best[name])})", justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def print_rl(result: RLSearchResult, console: Console | None = None, as_json: bool = False) -> None:
    """The search's tables (module docstring), or its JSON."""
    if as_json:
        import json

        import click

        click.echo(json.dumps(result.to_dict()))
        return
    if console is None:
        from meshplan.report.console import terminal_console

        console = terminal_console()
    ranked = from_rl(result)
    if result.plans:
        for r in listing_tables(ranked.table, console.width):
            console.print(r)
        console.print(side_by_side("the best plan of each set-up, phase by phase (seconds per iteration; A all GPUs, "
                                   "R rollout pool, T training pool)", result.best, phase_rows(result.best)))
        console.print(side_by_side("memory per GPU by phase and pool (its largest part)", result.best,
                                   memory_rows(result.best)))
    else:
        console.print("[bold red]no RL plan fits[/bold red]")
    for r in listing_tables(ranked.rejected, console.width):
        console.print(r)
    console.print(f"priced {result.evaluated:,} pairings in {result.seconds:.2f} s")
