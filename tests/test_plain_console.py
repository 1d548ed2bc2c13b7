"""The plain console (report/console.py) prints byte for byte what rich's console prints where the output takes no
colour: random tables, legends and strings at random widths (a fuzz test against rich itself), and searches' whole
output, each printed once by each console into the same captured stdout."""

from __future__ import annotations

import random

import pytest

from meshplan.report import console as con
from meshplan.report.console import PlainConsole, terminal_console
from meshplan.report.fold import Styled, TermTable

WORDS = ("a", "bb", "tp=4", "word", "longer-word", "x" * 30, "·", "≈", "±11%", "4.23 s", "69.9 GiB", "dp·tp·pp",
         "[bold]b[/bold]", "[dim]d[/]", "a:b", "中文", "é", "\n", " ", "  ", "", "-", "…", "(a) [b, c]")
ODD = ("[/]", "[b]", "[/x]", ":c:", "\\[x]", "[@click]", "\t", "\r")  # rich draws these (or raises)


def _text(rng: random.Random, most: int = 12) -> str:
    return "".join(rng.choice(ODD if rng.random() < 0.01 else WORDS) + rng.choice(("", " ", " ", "  "))
                   for _ in range(rng.randint(0, most)))


def _table(rng: random.Random) -> TermTable:
    title = rng.choice((None, "", _text(rng, 30)))
    table = TermTable(title, show_header=rng.random() < 0.7, title_justify=rng.choice(("left", "center", "right")))
    columns = rng.randint(0, 7)
    for _ in range(columns):
        table.add_column(_text(rng, 3), justify=rng.choice(("left", "right", "center")), no_wrap=rng.random() < 0.4,
                         overflow=rng.choice(("fold", "ellipsis", "crop")), style=rng.choice((None, "bold")))
    for _ in range(rng.randint(0, 6) if columns else 0):
        table.add_row(*(_text(rng, rng.choice((2, 4, 20))) for _ in range(columns)))
    return table


def _both(obj, width: int, capsys, monkeypatch, **kwargs) -> tuple[str, str, bool]:
    """(what the plain console printed, what rich's printed, whether the plain console drew it itself); an error
    (rich's markup errors) as its type's name."""
    monkeypatch.setenv("COLUMNS", str(width))
    plain = PlainConsole(width)
    outs = []
    for console in (plain, terminal_console()):
        try:
            console.print(obj, **kwargs)
        except Exception as error:  # noqa: BLE001
            print(type(error).__name__)
        outs.append(capsys.readouterr().out)
    return outs[0], outs[1], plain._console is None


@pytest.mark.parametrize("seed", range(6))
def test_random_tables_print_as_rich_prints_them(seed, capsys, monkeypatch):
    rng, drawn = random.Random(seed), 0
    for _ in range(150):
        mine, theirs, drew = _both(_table(rng), rng.choice((8, 11, 20, 37, 60, 80, 100, 150)), capsys, monkeypatch)
        assert mine == theirs
        drawn += drew
    assert drawn > 80  # most are drawn without rich (the rest hold an odd word: rich draws them)


@pytest.mark.parametrize("seed", range(4))
def test_random_text_prints_as_rich_prints_it(seed, capsys, monkeypatch):
    rng, drawn = random.Random(100 + seed), 0
    for _ in range(200):
        width = rng.choice((8, 13, 40, 80, 150))
        text = _text(rng, 40)
        styled = Styled(text, "dim", tuple((_text(rng, 4), rng.choice(("bold", "dim"))) for _ in range(3)))
        for obj, kwargs in ((text, {}), (text, {"markup": False}), (text, {"soft_wrap": True, "markup": False}),
                            (styled, {}), (text, {"highlight": False, "markup": False})):
            mine, theirs, drew = _both(obj, width, capsys, monkeypatch, **kwargs)
            assert mine == theirs, (obj, kwargs, width)
            drawn += drew
    assert drawn > 850


def test_a_colour_terminal_keeps_rich(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert not isinstance(con.plain_console(), PlainConsole)
    monkeypatch.delenv("FORCE_COLOR")
    assert isinstance(con.plain_console(), PlainConsole)  # pytest's captured stdout: no terminal


@pytest.fixture(scope="module")
def searches():
    from meshplan.search import Space, search
    from meshplan.specs.hardware import load_system
    from meshplan.specs.model_load import load_model
    from meshplan.specs.stack import load_stack

    def one(model: str, gpus: int, batch: int, stack: str = "megatron-core", top: int = 10):
        space = Space(global_batch=batch, stack=load_stack(stack), headroom=0.09)
        return search(load_model(model), load_system("h100").cluster(gpus), space, top_k=top)

    return {"dense": [one("llama3-70b", 1024, 512)], "moe": [one("mixtral-8x22b", 256, 256, top=5)],
            "none": [one("llama3.1-405b", 8, 8)], "scaling": [one("llama3-8b", g, 256, top=3) for g in (8, 64)]}


@pytest.mark.parametrize("width", (80, 117, 150))
@pytest.mark.parametrize("which", ("dense", "moe", "none", "scaling"))
def test_a_search_prints_as_rich_prints_it(which, width, searches, capsys, monkeypatch):
    from meshplan.report import text

    monkeypatch.setenv("COLUMNS", str(width))
    results = searches[which]
    tokens, price = (15e12, 2.5) if which == "scaling" else (None, None)
    text.print_search(results, False, tokens, price, "time", rerun=lambda est: ["estimate", "--tp", "8"])
    mine = capsys.readouterr().out
    monkeypatch.setattr(text, "plain_console", terminal_console)
    text.print_search(results, False, tokens, price, "time", rerun=lambda est: ["estimate", "--tp", "8"])
    assert mine == capsys.readouterr().out
    assert mine.count("\n") > 10
