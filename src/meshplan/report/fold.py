"""Tables that fit the terminal, and the legend under them.

A table whose columns are wider than the terminal folds into several tables that repeat its key column (``#``,
``GPUs``): the columns named first (the numbers) go into the first table, the rest follow in as many as they need.
Number cells never wrap and are never cut to "…"; only text columns (a plan's description, a reason) wrap at
spaces. Widths are counted as rich draws its default box: each column is its widest cell plus one space either
side and one rule, plus one rule at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import JustifyMethod

WRAP_MIN = 24  # the narrowest a wrapping text column is planned (its longest word, if wider)


@dataclass(frozen=True)
class Col:
    """One column: its header, its cells top to bottom, how they align, whether they may wrap, and what the header
    means (the legend's entry, the HTML header's tooltip)."""

    header: str
    cells: list[str] = field(default_factory=list)
    justify: JustifyMethod = "right"
    wrap: bool = False
    meaning: str = ""


@dataclass(frozen=True)
class Listing:
    """A table as a search's report shows it, in the terminal (``listing_tables``) and in the HTML page: its title,
    the key column (``#``, ``reason``) and the others, the headers that lead when it folds (``first``), and the
    legend's entries after those of its headers (``notes``: notations, units)."""

    title: str
    key: Col
    columns: tuple[Col, ...] = ()
    first: tuple[str, ...] = ()
    notes: tuple[tuple[str, str], ...] = ()

    def entries(self, shown: Sequence[str]) -> list[tuple[str, str]]:
        """(header, meaning) of each header ``shown`` (a header without a meaning is left out), then the notes."""
        meaning = {c.header: c.meaning for c in (self.key, *self.columns)}
        return [(h, meaning[h]) for h in shown if meaning.get(h)] + list(self.notes)


@dataclass
class Column:
    """One column of a ``TermTable``, as rich.table.Column holds it."""

    header: str = ""
    justify: str = "left"
    no_wrap: bool = False
    overflow: str = "ellipsis"
    style: str | None = None
    cells: list[str] | None = None


class TermTable:
    """A table as rich.table.Table takes it (the arguments this package uses), built without importing rich: the
    plain console (console.py) draws it, rich's draws ``__rich__``'s rich Table."""

    def __init__(self, title: str | None = None, *, show_header: bool = True, title_justify: str = "center"):
        self.title, self.show_header, self.title_justify = title, show_header, title_justify
        self.columns: list[Column] = []

    def add_column(self, header: str = "", *, justify: str = "left", no_wrap: bool = False,
                   overflow: str = "ellipsis", style: str | None = None) -> None:
        self.columns.append(Column(header, justify, no_wrap, overflow, style, []))

    def add_row(self, *cells: str) -> None:
        for column, cell in zip(self.columns, cells, strict=True):
            assert column.cells is not None
            column.cells.append(cell)

    def __rich__(self) -> Any:
        from rich.table import Table as RichTable

        table = RichTable(title=self.title, show_header=self.show_header, title_justify=self.title_justify)  # type: ignore[arg-type]
        for c in self.columns:
            table.add_column(c.header, justify=c.justify, no_wrap=c.no_wrap, overflow=c.overflow,  # type: ignore[arg-type]
                             style=c.style)
        for row in zip(*(c.cells or [] for c in self.columns), strict=True):
            table.add_row(*row)
        return table


@dataclass(frozen=True)
class Styled:
    """Text as rich.text.Text builds it: ``head`` in the base ``style``, then each (piece, its style) appended."""

    head: str
    style: str
    parts: tuple[tuple[str, str], ...] = ()

    @property
    def plain(self) -> str:
        return self.head + "".join(p for p, _ in self.parts)

    def __rich__(self) -> Any:
        from rich.text import Text

        text = Text(self.head, style=self.style)
        for piece, style in self.parts:
            text.append(piece, style=style)
        return text


# the characters one cell wide in every table of rich/cells.py (rich 15.0): its own _SINGLE_CELL_UNICODE_RANGES, and the
# punctuation, sub- and superscripts, arrows, operators and floor / ceiling brackets this package writes (≈ … − → ≤ ⌈):
# a text of them alone is as many cells as characters, so that rich and its tables need not load to count it (20 M
# instructions, 1.3 % of the quick start's; tests/test_startup.py holds each at one cell in every table of rich's)
ONE_CELL_RANGES = ((0x20, 0x7E), (0xA0, 0xAC), (0xAE, 0x2FF), (0x370, 0x482), (0x2500, 0x25FC), (0x2800, 0x28FF),
                   (0x2010, 0x2027), (0x2030, 0x205E), (0x2070, 0x209F), (0x2190, 0x22FF), (0x2308, 0x230B))
_ONE_CELL: list[frozenset[str]] = []  # their set, made when a text beyond printable ASCII first comes


def one_cell(text: str) -> bool:
    """Whether every character of ``text`` is in ``ONE_CELL_RANGES`` (rich measures such a text as its length)."""
    if text.isascii():
        return text.isprintable()
    if not _ONE_CELL:
        _ONE_CELL.append(frozenset(chr(c) for low, high in ONE_CELL_RANGES for c in range(low, high + 1)))
    return _ONE_CELL[0].issuperset(text)


def cell_width(text: str) -> int:
    lines = text.split("\n")
    if all(map(one_cell, lines)):
        return max(map(len, lines))
    from rich.cells import cell_len

    return max((cell_len(line) for line in lines), default=0)


def col_width(col: Col) -> int:
    """What the column needs: its widest cell or header; a wrapping column its longest word, at least WRAP_MIN."""
    natural = max(cell_width(c) for c in (col.header, *col.cells))
    if not col.wrap:
        return natural
    longest = max((cell_width(w) for c in col.cells for w in c.split()), default=0)
    return min(natural, max(WRAP_MIN, longest, cell_width(col.header)))


def table_width(cols: Iterable[Col]) -> int:
    widths = [col_width(c) + 3 for c in cols]  # one space either side and the rule after it
    return sum(widths) + 1  # the rule before the first column


def fold(key: Col, cols: Sequence[Col], width: int, first: Sequence[str] = ()) -> list[list[Col]]:
    """The columns in groups that each fit ``width`` beside ``key``: all in one when they fit; else the headers
    in ``first`` lead (in that order), then the rest, each group keeping the columns' own order."""
    if table_width([key, *cols]) <= width:
        return [[key, *cols]]
    rank = {h: i for i, h in enumerate(first)}
    order = sorted(range(len(cols)), key=lambda i: (rank.get(cols[i].header, len(rank)), i))
    groups: list[list[int]] = [[]]
    for i in order:
        if groups[-1] and table_width([key, *(cols[j] for j in groups[-1]), cols[i]]) > width:
            groups.append([])
        groups[-1].append(i)
    return [[key, *(cols[i] for i in sorted(g))] for g in groups]


def folded_tables(title: str, key: Col, cols: Sequence[Col], width: int, first: Sequence[str] = ()) -> list:
    """Tables (``TermTable``: rich's, drawn without rich where there is no colour) of the columns folded to
    ``width``; the second and later say they continue the first by key."""
    groups = fold(key, cols, width, first)
    tables = []
    for n, group in enumerate(groups):
        shown = title if n == 0 else f"(continued, by {key.header})"
        table = TermTable(title=shown, title_justify="left")
        for c in group:
            table.add_column(c.header, justify=c.justify, no_wrap=not c.wrap, overflow="fold")
        for row in zip(*(c.cells for c in group), strict=True):
            table.add_row(*row)
        tables.append(table)
    return tables


def headers(tables: Iterable) -> list[str]:
    """Every column header of the tables, once each, in order."""
    seen: dict[str, None] = {}
    for t in tables:
        seen.update((str(c.header), None) for c in t.columns)
    return list(seen)


def legend(entries: Sequence[tuple[str, str]]):  # -> Styled, a rich Text to rich's console
    """One paragraph under a table: ``term: what it means`` for each entry, the terms in bold."""
    parts: list[tuple[str, str]] = []
    for i, (term, meaning) in enumerate(entries):
        parts += [("; ", "dim")] * bool(i) + [(term, "bold"), (": " + meaning, "dim")]
    return Styled("legend: ", "dim", tuple(parts))


def listing_tables(listing: Listing, width: int) -> list:
    """The listing as rich renderables that fit ``width`` columns: its table folded (``folded_tables``), then the
    legend of the headers shown and the listing's notes."""
    tables = folded_tables(listing.title, listing.key, listing.columns, width, listing.first)
    return [*tables, legend(listing.entries(headers(tables)))]


def refold(table, width: int) -> list:  # table: a TermTable or rich Table built without a width in mind
    """A rich Table wider than ``width`` as ``folded_tables`` draws one: its first column the key, its right-aligned
    (number) columns never cut or wrapped, its left-aligned (text) ones wrapped at spaces; the title kept. The
    terminal console (report/text.py) applies it to every table it prints, so that check-step's, trace's,
    calibrate's and the sharding planner's tables read at 80 columns as plan's do."""
    def plain(cell) -> str:  # a str, or a rich Text
        return cell if isinstance(cell, str) else getattr(cell, "plain", None) or str(cell)

    cols = [Col(plain(c.header) or " ", [plain(x) for x in c.cells], c.justify or "left",
                wrap=(c.justify or "left") == "left", meaning="") for c in table.columns]
    if not cols or table_width(cols) <= width:  # it fits as built (a table folded_tables drew among them)
        return [table]
    title = plain(table.title) if table.title is not None else ""
    return folded_tables(title, cols[0], cols[1:], width)


def shell_command(label: str, args: list[str], width: int) -> str:
    """``label`` and a command line to copy, in lines of at most ``width`` columns continued with `` \\`` (a shell
    reads them as one line); on one line where it fits."""
    import shlex

    words = [shlex.quote(a) for a in args]
    lines = [label.rstrip()]
    for word in words:
        if len(lines[-1]) + 1 + len(word) + 2 > width and len(lines[-1].strip()) > len(label.strip()):
            lines[-1] += " \\"
            lines.append("    " + word)
        else:
            lines[-1] += " " + word
    return "\n".join(lines)
