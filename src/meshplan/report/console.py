"""The terminal's console, apart from the training report's tables (report/text.py) so that a command that prints
other tables (``serve``, ``trace``, ``calibrate``) does not import the training search's report, goodput and energy
to get it (tests/test_startup.py).

Where the output has no colour (a pipe, a file: rich writes no styles there), ``plain_console`` draws the tables and
text of this package (``TermTable``, ``Styled``, strings) itself, byte for byte as rich 15 draws them, without importing
rich's console: about a sixth of the quick start's process (issue 83). It follows rich 15.0's own code: the column
widths of rich/table.py ``_calculate_column_widths`` / ``_collapse_widths`` / ``_measure_column`` and
rich/_ratio.py ``ratio_reduce``, the cells' padding of rich/padding.py, the boxes HEAVY_HEAD and SQUARE of
rich/box.py, the wrap of rich/text.py ``Text.wrap`` with rich/_wrap.py ``divide_line`` and rich/containers.py
``Lines.justify``, and rich/markup.py's tags; widths in cells come from rich/cells.py itself. Whatever it does not
draw (another renderable, a keyword, markup with escapes, a possible emoji code) goes to rich's console, and
tests/test_plain_console.py compares the two on random tables and on searches' whole output.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any

from meshplan.report.fold import Styled, TermTable, one_cell, refold

if TYPE_CHECKING:
    from rich.console import Console

_TAGS = re.compile(r"((\\*)\[([a-z#/@][^[]*?)])")  # rich/markup.py RE_TAGS
_EMOJI = re.compile(r":\S*?:")  # rich/_emoji_replace.py: a ``:code:`` rich may replace (then rich draws it)
_ODD = re.compile(r"[\x00-\x09\x0b-\x1f\x7f\x85\u2028\u2029]")  # tabs, control codes, other line ends: rich's
_TRAILING_SPACE = re.compile(r"\s+$")
_WORD = re.compile(r"\s*\S+\s*")  # rich/_wrap.py: a word and the spaces after it
# (top, head row's verticals, the rule under the head, body verticals, bottom) of rich/box.py's boxes
_HEAVY_HEAD = ("┏━┳┓", "┃┃┃", "┡━╇┩", "│││", "└─┴┘")
_SQUARE = ("┌─┬┐", "│││", "├─┼┤", "│││", "└─┴┘")


class _Rich(Exception):
    """What the plain console does not draw: rich's console draws it."""


def terminal_console() -> Console:
    """A console as wide as the terminal (or as ``COLUMNS`` says), else 150 columns when the output is a file or a
    pipe."""
    from rich.console import Console

    class _Console(Console):
        def print(self, *objects: Any, **kwargs: Any) -> None:
            """Tables wider than the terminal folded (fold.refold) instead of squeezed into "…" and split numbers."""
            from rich.table import Table as RichTable

            if self.color_system is None:  # no styles written (a pipe, a file): its highlighting would be dropped
                kwargs.setdefault("highlight", False)
            super().print(*(x for o in objects for x in (refold(o, self.width) if isinstance(o, RichTable | TermTable)
                                                         else [o])), **kwargs)

        def on_broken_pipe(self) -> None:
            """`meshplan … | head -1`: rich exits 1 here (SystemExit); the CLI's main exits 0 quietly instead."""
            self.quiet = True
            raise BrokenPipeError

    return _Console() if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else _Console(width=150)


def plain_console() -> Any:  # a PlainConsole, or rich's console where the output takes colour
    """``terminal_console``'s output, drawn without rich where rich would write no colour: stdout is not a terminal,
    and nothing asks rich for one (FORCE_COLOR, TTY_COMPATIBLE, Jupyter), on a UTF-8 stream, not Windows."""
    env = os.environ
    columns = env.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() else 150
    encoding = (getattr(sys.stdout, "encoding", "utf-8") or "utf-8").lower()  # rich's Console.encoding
    if (sys.stdout.isatty() or "FORCE_COLOR" in env or "TTY_COMPATIBLE" in env or "JUPYTER_COLUMNS" in env
            or "IPython" in sys.modules or sys.platform == "win32" or not encoding.startswith("utf") or width < 8):
        return terminal_console()
    return PlainConsole(width)


class PlainConsole:
    """Prints this package's tables and text as rich's console would, uncoloured; anything else through rich's."""

    color_system = None

    def __init__(self, width: int):
        self.width = width
        self._console: Console | None = None

    def rich(self) -> Console:
        if self._console is None:
            self._console = terminal_console()
        return self._console

    def __getattr__(self, name: str) -> Any:  # any other of rich's Console attributes
        return getattr(self.rich(), name)

    def print(self, *objects: Any, markup: bool | None = None, soft_wrap: bool | None = None, **kwargs: Any) -> None:
        try:
            if len(objects) != 1 or set(kwargs) - {"highlight"}:
                raise _Rich
            text = self._drawn(objects[0], markup is not False, bool(soft_wrap))
        except _Rich:
            self.rich().print(*objects, markup=markup, soft_wrap=soft_wrap, **kwargs)
            return
        sys.stdout.write(text)
        sys.stdout.flush()

    def _drawn(self, obj: Any, markup: bool, soft_wrap: bool) -> str:
        if isinstance(obj, TermTable):
            if soft_wrap or not markup:
                raise _Rich
            return "".join(_table(t, self.width) for t in refold(obj, self.width))
        if isinstance(obj, Styled):
            text = _checked(obj.plain)
        elif isinstance(obj, str):
            text = _unmarked(obj) if markup else _no_emoji(obj)
        else:
            raise _Rich
        if soft_wrap:
            return text + "\n"
        return "".join(_crop(line, self.width) + "\n" for line in _wrap(text, self.width, "default", "fold", False))


def _checked(text: str) -> str:
    if _ODD.search(text):
        raise _Rich
    return text


def _no_emoji(text: str) -> str:
    if _EMOJI.search(text):
        raise _Rich
    return _checked(text)


def _unmarked(text: str) -> str:
    """rich/markup.py's ``render``, for tags without escapes or handlers: the text between the tags."""
    if "[" not in text:
        return _no_emoji(text)
    if "\\" in text:
        raise _Rich
    out, stack, position = [], [], 0
    for match in _TAGS.finditer(text):
        out.append(_no_emoji(text[position:match.start()]))
        position = match.end()
        name = match.group(3).partition("=")[0]
        if "@" in name:
            raise _Rich
        if not name.startswith("/"):
            stack.append(name)
        elif name[1:].strip():
            if name[1:] not in stack:  # rich normalises the style's name first: it draws the rest
                raise _Rich
            del stack[len(stack) - 1 - stack[::-1].index(name[1:])]
        elif not stack:
            raise _Rich
        else:
            stack.pop()
    out.append(_no_emoji(text[position:]))
    return "".join(out)


def _cells(text: str) -> int:
    if text.isascii() or one_cell(text):
        return len(text)
    from rich.cells import cell_len

    return cell_len(text)


def _chop(text: str, width: int) -> list[str]:
    """rich/cells.py ``chop_cells``: the text in pieces of ``width`` cells (the last shorter); a text of one-cell
    characters (fold.one_cell) cut every ``width`` characters without importing rich's cell tables."""
    if one_cell(text):
        return [text[i:i + width] for i in range(0, len(text), width)]
    from rich.cells import chop_cells

    return chop_cells(text, width)


def _sized(text: str, width: int) -> str:
    """rich/cells.py ``set_cell_size``: cropped or padded to ``width`` cells."""
    if text.isascii() or one_cell(text):
        return text[:width] if len(text) >= width else text + " " * (width - len(text))
    from rich.cells import set_cell_size

    return set_cell_size(text, width)


def _crop(line: str, width: int) -> str:
    return _sized(line, width) if _cells(line) > width else line


def _divide(line: str, width: int, fold: bool) -> list[str]:
    """rich/_wrap.py ``divide_line``: the line in pieces at word starts (each keeping the spaces after it)."""
    breaks, offset = [], 0
    for match in _WORD.finditer(line):
        start, word = match.start(), match.group(0)
        length = _cells(word.rstrip())
        if width - offset >= length:
            offset += _cells(word)
        elif length > width:
            if fold:
                pieces = _chop(word, width)
                for i, piece in enumerate(pieces):
                    if start:
                        breaks.append(start)
                    if i == len(pieces) - 1:
                        offset = _cells(piece)
                    else:
                        start += len(piece)
            else:
                if start:
                    breaks.append(start)
                offset = _cells(word)
        elif offset and start:
            breaks.append(start)
            offset = _cells(word)
    bounds = [0, *breaks, len(line)]
    return [line[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def _truncate(text: str, width: int, overflow: str, pad: bool = False) -> str:
    """rich/text.py ``Text.truncate``."""
    if overflow == "ignore":
        return text
    length = _cells(text)
    if length > width:
        text = _sized(text, width - 1) + "…" if overflow == "ellipsis" else _sized(text, width)
    return text + " " * (width - length) if pad and length < width else text


def _justified(line: str, width: int, justify: str, overflow: str) -> str:
    """rich/containers.py ``Lines.justify``."""
    if justify == "left":
        return _truncate(line, width, overflow, pad=True)
    if justify in ("right", "center"):
        line = _truncate(line.rstrip(), width, overflow)
        left = width - _cells(line) if justify == "right" else (width - _cells(line)) // 2
        line = " " * left + line
        return line + " " * (width - _cells(line)) if justify == "center" else line
    if justify != "default":
        raise _Rich
    return line


def _wrap(text: str, width: int, justify: str, overflow: str, no_wrap: bool) -> list[str]:
    """rich/text.py ``Text.wrap``: the text's lines, each divided at ``width``, justified and truncated."""
    lines = []
    for line in text.split("\n"):
        if no_wrap:
            if overflow == "ignore":
                lines.append(line)
                continue
            pieces = [line]
        else:
            pieces = _divide(line, width, overflow == "fold")
            for i, piece in enumerate(pieces):  # Text.rstrip_end
                excess = len(piece) - width
                space = _TRAILING_SPACE.search(piece)
                if excess > 0 and space is not None:
                    pieces[i] = piece[:len(piece) - min(len(space.group(0)), excess)]
        lines += [_truncate(_justified(p, width, justify, overflow), width, overflow) for p in pieces]
    return lines


def _measure(cells: list[str], avail: int) -> tuple[int, int]:
    """rich/table.py ``_measure_column`` (the least width, the natural width) of a column whose cells (the header
    among them) are padded one space either side: rich/padding.py ``__rich_measure__`` of rich/text.py's, each
    through rich/measure.py ``Measurement.get`` (normalised, at most ``avail``, none below one cell)."""
    def get(low: int, high: int) -> tuple[int, int]:
        low, high = min(min(low, high), avail), min(high, avail)
        return (0, 0) if high < 1 else (low, high)

    if avail < 1:
        return 0, 0
    lows, highs = [], []
    for cell in cells:
        if avail - 2 < 1:
            low, high = avail, avail
        else:
            lines, words = cell.splitlines(), cell.split()
            high = max((_cells(line) for line in lines), default=0)
            low, high = get(max((_cells(word) for word in words), default=high), high)
            low, high = min(low + 2, avail), min(high + 2, avail)
        low, high = get(low, high)
        lows.append(low)
        highs.append(high)
    return min(max(lows, default=1), avail), min(max(highs, default=avail), avail)


def _reduce(total: int, ratios: list[int], maximums: list[int], values: list[int]) -> list[int]:
    """rich/_ratio.py ``ratio_reduce``: ``total`` taken from ``values`` in proportion to ``ratios``."""
    ratios = [r if m else 0 for r, m in zip(ratios, maximums, strict=True)]
    left_ratio, left, out = sum(ratios), total, []
    if not left_ratio:
        return values[:]
    for ratio, maximum, value in zip(ratios, maximums, values, strict=True):
        if ratio and left_ratio > 0:
            cut = min(maximum, round(ratio * left / left_ratio))
            out.append(value - cut)
            left, left_ratio = left - cut, left_ratio - ratio
        else:
            out.append(value)
    return out


def _widths(columns: list[list[str]], wrap: list[bool], avail: int) -> list[int]:
    """rich/table.py ``_calculate_column_widths`` (no expand, no fixed widths) with ``_collapse_widths``."""
    widths = [_measure(c, avail)[1] or 1 for c in columns]
    if sum(widths) <= avail:
        return widths
    total = sum(widths)
    while any(wrap) and total > avail:
        top = max(w for w, ok in zip(widths, wrap, strict=True) if ok)
        second = max(w if ok and w != top else 0 for w, ok in zip(widths, wrap, strict=True))
        ratios = [1 if w == top and ok else 0 for w, ok in zip(widths, wrap, strict=True)]
        if not any(ratios) or not top - second:
            break
        widths = _reduce(total - avail, ratios, [min(total - avail, top - second)] * len(widths), widths)
        total = sum(widths)
    if total > avail:
        widths = _reduce(total - avail, [1] * len(widths), widths, widths)
    return [_measure(c, max(0, w))[1] or 0 for c, w in zip(columns, widths, strict=True)]


def _cell(text: str, width: int, column: Any) -> list[str]:  # column: fold.Column
    """A cell's lines, padded one space either side (rich/padding.py) to the column's ``width``."""
    if width - 2 < 1:
        return []
    lines = _wrap(text, width - 2, column.justify, column.overflow, column.no_wrap)
    return [f" {_sized(line, width - 2)} " for line in lines]


def _table(table: TermTable, width: int) -> str:
    """rich/table.py ``Table.__rich_console__`` for the default box (HEAVY_HEAD, SQUARE without a header row)."""
    if not table.columns:
        return "\n"
    if any(c.justify not in ("left", "right", "center") or c.overflow not in ("fold", "crop", "ellipsis")
           for c in table.columns):
        raise _Rich
    top, head, rule, body, bottom = _HEAVY_HEAD if table.show_header else _SQUARE
    columns = [[_unmarked(c.header)] * table.show_header + [_unmarked(x) for x in c.cells or []]
               for c in table.columns]
    widths = _widths(columns, [not c.no_wrap for c in table.columns], max(0, width - len(columns) - 1))
    out = []
    if table.title:
        table_width = sum(widths) + len(columns) + 1
        out += _wrap(_unmarked(table.title), table_width, table.title_justify, "fold", False)
    out.append(top[0] + top[2].join(top[1] * w for w in widths) + top[3])
    rows = list(zip(*columns, strict=True))
    for n, row in enumerate(rows):
        cells = [_cell(text, w, c) for text, w, c in zip(row, widths, table.columns, strict=True)]
        height = max(1, *(len(c) for c in cells))
        header = n == 0 and table.show_header
        cells = [[" " * w] * (height - len(c)) + c if header else c + [" " * w] * (height - len(c))
                 for c, w in zip(cells, widths, strict=True)]
        edge = head if n == 0 else body
        out += [edge[0] + edge[1].join(line) + edge[2] for line in zip(*cells, strict=True)]
        if header:
            out.append(rule[0] + rule[2].join(rule[1] * w for w in widths) + rule[3])
    out.append(bottom[0] + bottom[2].join(bottom[1] * w for w in widths) + bottom[3])
    return "".join(_crop(line, width) + "\n" for line in out)
