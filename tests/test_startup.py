"""Start-up is part of every answer (issue 83): the modules a command's process imports, counted, with a limit each
(meshplan's own and everything else), and the heavy dependencies imported only by the commands that use them.

Each command runs in a fresh interpreter (``main([...])`` as the console script calls it) that then prints the
names in ``sys.modules``. A limit is the count measured when it was set plus about a tenth: a change that adds
imports to a command's start-up fails here and names what it added, so that the import can be made lazy (inside the
function that needs it) or the limit raised on purpose. `meshplan --help` lists every command without importing
any (cli/lazy.py): its listing is compared with the one click makes from the real commands.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

from meshplan.cli.main import COMMANDS, cli

PROBE = ("import contextlib, io, json, sys\n"
         "from meshplan.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()):\n"
         "    code = main(json.loads(sys.argv[1]))\n"
         "print(json.dumps([code, sorted(sys.modules)]))\n")

QUICK = ["--model", "llama3-70b", "--system", "h100", "--gpus", "1024", "--global-batch", "512"]
HEAVY = ("scipy", "torch", "jinja2", "matplotlib", "pandas", "ray", "sklearn", "transformers", "vl_convert")
# command: (arguments, meshplan modules at most, other modules at most, packages it must not import); raised on purpose
# when the collectives and pipeline schedules became packages of one module per variant and the bands, energy,
# goodput and host-cost records joined the estimate (117 / 157 / 115 measured then); lowered when `plan` stopped
# importing the config formats (configs/, only --emit writes one) and NumPy's masked arrays (np.unique's import):
# 117 / 145 / 103 measured then; lowered again when a hybrid block's mixers (cost/layers.MIXER_COSTS), the 2D layouts'
# layer costs, the mixed-cluster and goodput searches and difflib were imported by their users only: 107 / 133 / 102
# measured then (about 270 other modules each, 173 for --help), the limits a few modules above; lowered again when the
# terminal's console left the training report (report/console.py) and the stragglers and the background traffic were
# imported only when asked for: 132 / 106 / 86 measured then (133 / 107 / 102 before); raised for `plan` when the
# fusion modes, tensor layouts and FSDP modes became registries of records (specs/fusion.py, layouts.py,
# fsdp_modes.py) and the per-key units' store its own file (search/key_store.py): 137 measured then;
# the stack's other choices' records (specs/stack_variants.py) made it 138 / 110 / 90, each at its limit
# `serve` stopped importing NumPy's masked arrays when its percentiles became one sort (serve/load/summary.py);
# lowered for `plan`, `estimate` and `serve` (others) when their tables and text were drawn without rich's console
# where the output takes no colour (report/console.plain_console): 273 / 270 / 270 -> 225 / 222 / 222 measured then
# lowered when the plain console counted its cells without rich (report/fold.one_cell: rich and its unicode tables no
# longer load) and `plan` imported cli/emit.py only to emit a plan: 137 / 110 / 90 meshplan's, 219 / 215 / 215 others
# raised for `plan` and `estimate` when the two files at the 400-line limit were split by concept, the model
# states out of memory.py (cost/model_states.py) and the timed parts out of step/units.py (step/parts.py): 139 / 112
# raised for `plan` when the stage DP's pool left stage_dp.py at the 400-line limit (search/stage_pool.py): 140
# raised for `plan` and `estimate` when token-drop MoE got its own file (specs/token_drop.py, which specs/check.py and
# cost/mlp_moe.py read on every plan): 141 / 113
# unchanged when the bounded memo left xp.py for a NumPy-free file of its own (kept.py, which files.py reads) and the
# Hub cache's reader (specs/hub_cache.py) was imported only for a reference with a '/': 141 / 113 / 90
# raised by one for `plan` and `estimate` when what is derived from an estimate (energy, goodput, mixed clusters) left
# the top level for a folder of its own, derived/ (its __init__, a docstring only): 142 / 114 / 90
# raised by one for `plan` and `estimate` when the weights' sync after the step got its own file (step/param_sync.py:
# an all-gather, or InternEvo's one broadcast a rank), step/channels.py being at the 400-line limit: 143 / 115 / 90
# raised by two for `plan` and `estimate` and one for `serve` when a ZeRO group smaller than dp got its file
# (cost/zero_group.py, read by every memory estimate) and the pipeline runtimes theirs (specs/pipeline_runtime.py,
# out of specs/stack_variants.py, which every stack reads); the ZeRO group's rules (specs/check_zero_group.py) and the
# parameter server (step/param_server.py) are imported only by a plan that has them: 145 / 117 / 91
# what a dense model's plain search and estimate do not use (a hybrid's mixers, a 2D layout, --system pools, --mtbf,
# an error's suggestions, --stragglers and --background-traffic)
UNUSED_AT_START = ("meshplan.cost.mamba", "meshplan.cost.summa", "meshplan.cli.mixed", "meshplan.search.by_goodput",
                   "difflib", "meshplan.specs.stragglers", "meshplan.specs.background")
RICH_CONSOLE = ("rich", "rich.console", "rich.table", "rich.text", "rich.segment", "rich.cells")  # stdout no terminal:
# console.PlainConsole, its cells counted by report/fold.one_cell
CASES = {
    "help": (["--help"], 8, 180, (*HEAVY, "numpy", "rich", "importlib.metadata", "email")),
    "plan": (["plan", *QUICK], 145, 229, (*HEAVY, *RICH_CONSOLE, "meshplan.serve", "meshplan.autoshard",
                                          "meshplan.specs.hf", "meshplan.report.vega", "meshplan.configs", "numpy.ma",
                                          "meshplan.cli.emit", *UNUSED_AT_START)),
    "estimate": (["estimate", *QUICK, "--tp", "8", "--pp", "4"], 117, 225,
                 (*HEAVY, *RICH_CONSOLE, "meshplan.serve", "meshplan.autoshard", "meshplan.search.run",
                  "multiprocessing", *UNUSED_AT_START)),
    "serve": (["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "1", "--input-len", "1000",
               "--output-len", "200"], 91, 225,
              (*HEAVY, *RICH_CONSOLE, "meshplan.search.run", "meshplan.autoshard", "meshplan.step.assemble",
               "multiprocessing", "meshplan.report.vega", "difflib", "meshplan.report.text", "meshplan.derived.goodput",
               "meshplan.search", "numpy.ma")),
}


def imported(args: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True, check=True)
    code, modules = json.loads(done.stdout.strip().splitlines()[-1])
    assert code == 0, done.stderr
    return modules


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_commands_start_up_imports_what_it_needs(name):
    args, own_limit, other_limit, absent = CASES[name]
    modules = imported(args)
    own = [m for m in modules if m.split(".")[0] == "meshplan"]
    other = [m for m in modules if m.split(".")[0] != "meshplan"]
    loaded = [a for a in absent if a in modules]
    assert not loaded, f"`meshplan {' '.join(args)}` imports {loaded}, which it does not use"
    assert len(own) <= own_limit, f"{name}: {len(own)} of meshplan's modules > {own_limit}: {own}"
    assert len(other) <= other_limit, f"{name}: {len(other)} other modules > {other_limit}: {other}"


def test_the_counts_are_of_real_imports():
    """The probe sees what a command loads: the search's own modules for `plan`, none of them for `--help`."""
    assert "meshplan.search.evaluate" in imported(["plan", *QUICK])
    assert not [m for m in imported(["--help"]) if m.startswith(("meshplan.search", "meshplan.specs"))]


def _listing(group: click.Group) -> str:
    ctx = click.Context(group, info_name="meshplan")
    formatter = ctx.make_formatter()
    group.format_commands(ctx, formatter)
    return formatter.getvalue()


def test_the_listing_of_stand_ins_is_the_listing_of_the_commands():
    """`meshplan --help` lists each command from its summary (COMMANDS) without importing it: the same text click
    makes from the real commands, at every width, and each summary is its command's first paragraph of help."""
    lazy = _listing(cli)
    real = click.Group("meshplan", commands={name: cli.commands[name] for name in cli.commands})
    assert lazy == _listing(real) and "plan " in lazy
    for entry in COMMANDS:
        command = entry.load()
        assert command.name == entry.name
        assert " ".join(entry.summary.split()) == " ".join((command.help or "").split("\n\n")[0].split())
        for width in (30, 45, 60, 80, 120):
            assert entry.stand_in().get_short_help_str(width) == command.get_short_help_str(width), entry.name


def test_every_command_is_listed_once():
    """The table and the commands agree: a command added to a module but not to COMMANDS would never run."""
    names = [entry.name for entry in COMMANDS]
    assert len(names) == len(set(names)) and {"plan", "serve", "estimate", "validate"} <= set(cli.commands)
    assert "no-such-command" not in cli.commands and cli.commands.get("no-such-command") is None


def test_every_block_kind_has_its_mixer():
    """cost/layers.MIXER_COSTS names each hybrid block's cost function by module (imported on first use, so that a dense
    model's start-up loads none): every kind a layer pattern can hold is there, and each name is a real function."""
    from meshplan.cost.layers import MIXER_COSTS, mixer
    from meshplan.specs.model_checks import BLOCK_KINDS

    assert set(BLOCK_KINDS.values()) <= set(MIXER_COSTS)
    for kind in MIXER_COSTS:
        block = mixer(kind)
        assert callable(block) and block.__name__ == MIXER_COSTS[kind][1], kind


def test_the_plugins_are_the_entry_points_importlib_metadata_finds():
    """`meshplan --help` lists the other packages' commands from their entry points read without importlib.metadata
    (cli/lazy.entry_points): the same names and values in the same order, and the same object loaded."""
    import importlib.metadata

    from meshplan.cli.lazy import entry_points

    for group in ("meshplan.commands", "meshplan.research", "console_scripts"):
        ours, theirs = entry_points(group), list(importlib.metadata.entry_points(group=group))
        assert [(e.name, e.value) for e in ours] == [(e.name, e.value) for e in theirs], group
    assert [e.load() for e in entry_points("meshplan.commands")] == \
        [e.load() for e in importlib.metadata.entry_points(group="meshplan.commands")]


def test_the_console_script_collects_again_once_its_command_is_imported():
    """The console script imports with the cyclic collector off and, once the command is imported, freezes what
    start-up made and turns it on again (cli/main.py: STARTUP); a program that imports meshplan keeps its collector."""
    probe = ("import contextlib, gc, io, sys\n"
             "sys.argv[0] = sys.argv[1]\n"
             "from meshplan.cli import main\n"
             "held = not gc.isenabled()\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    main(['presets'])\n"
             "print(held, gc.isenabled(), gc.get_freeze_count() > 0)\n")
    for argv0, expected in (("/usr/bin/meshplan", "True True True"), ("/usr/bin/python", "False True False")):
        done = subprocess.run([sys.executable, "-c", probe, argv0], capture_output=True, text=True, check=True)
        assert done.stdout.split("\n")[-2] == expected, (argv0, done.stdout, done.stderr)


def test_the_console_script_asks_openblas_for_one_thread_unless_told():
    """A command that makes no BLAS call (cli/main.py: BLAS_FREE) loads NumPy with one OpenBLAS thread in the console
    script; a number the user set, or a program that imports meshplan, keeps OpenBLAS's own choice."""
    import os

    probe = ("import contextlib, io, os, sys\n"
             "sys.argv[0] = sys.argv[1]\n"
             "from meshplan.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    main(['presets'])\n"
             "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n")
    told = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")
    bare = {k: v for k, v in os.environ.items() if k not in told}
    cases = (("/usr/bin/meshplan", {}, "1"), ("/usr/bin/meshplan", {"OMP_NUM_THREADS": "3"}, "None"),
             ("/usr/bin/python", {}, "None"))
    for argv0, extra, expected in cases:
        done = subprocess.run([sys.executable, "-c", probe, argv0], capture_output=True, text=True, check=True,
                              env={**bare, **extra})
        assert done.stdout.split()[-1] == expected, (argv0, extra, done.stderr)


def test_the_console_script_keeps_its_heap_unless_told():
    """A BLAS-free command's console script (cli/main.py: HEAP_KEPT) serves a 16 MiB block from its heap, not a fresh
    mapping, and keeps it when freed (glibc's mallinfo2: 0 bytes mapped, then 16 MiB free in the heap); a program
    that imports meshplan, or a user who set glibc's MALLOC_* variables, keeps glibc's own choice (the block mapped,
    16 MiB, and given back)."""
    import ctypes
    import os

    if sys.platform != "linux" or not hasattr(ctypes.CDLL(None), "mallinfo2"):
        pytest.skip("glibc 2.33 or later's mallinfo2 reads the heap (this C library has none)")
    probe = ("import contextlib, ctypes, io, sys\n"
             "sys.argv[0] = sys.argv[1]\n"
             "from meshplan.cli import main\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    main(['presets'])\n"
             "libc = ctypes.CDLL(None)\n"
             "class Info(ctypes.Structure):\n"
             "    _fields_ = [(n, ctypes.c_size_t) for n in ('arena ordblks smblks hblks hblkhd usmblks fsmblks '\n"
             "                                              'uordblks fordblks keepcost').split()]\n"
             "libc.mallinfo2.restype = Info\n"
             "block = bytearray(16 << 20)\n"
             "mapped = libc.mallinfo2().hblkhd\n"
             "del block\n"
             "print(mapped >> 20, libc.mallinfo2().fordblks >> 20 >= 16)\n")
    bare = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    cases = (("/usr/bin/meshplan", {}, "0 True"), ("/usr/bin/meshplan", {"MALLOC_ARENA_MAX": "2"}, "16 False"),
             ("/usr/bin/python", {}, "16 False"))
    for argv0, extra, expected in cases:
        done = subprocess.run([sys.executable, "-c", probe, argv0], capture_output=True, text=True, check=True,
                              env={**bare, **extra})
        assert done.stdout.split("\n")[-2] == expected, (argv0, extra, done.stdout, done.stderr)


def test_the_core_bands_file_quotes_every_band_the_full_one_does():
    """specs/bands.py reads error_bands_core.json (benchmarks/docs/error_bands.py ``core``: the fields it reads, the
    entries that hold a table's least runs), a fifth of error_bands.json's bytes: every regime of every level of every
    table, and of some each trusted axis at a value no run measured, gets the same band and latency errors from either
    file."""
    from pathlib import Path

    from meshplan.specs import bands

    full = json.loads((Path(bands.__file__).parents[1] / "presets" / "error_bands.json").read_text())["tables"]
    core = bands.BANDS_FILE_TABLES()
    assert set(core) == set(full)
    for name, t in full.items():
        regimes = [dict(part.split("=", 1) for part in key.split(", ")) if key else {} for key in t["entries"]]
        wholes = {tuple(regime.get(a, next(iter(t["seen"].get(a, {"?": 0})))) for a in t["axes"]) for regime in regimes}
        for i, values in enumerate(sorted(wholes)):  # each unmeasured axis of every fifth (the widening scans them all)
            whole = dict(zip(t["axes"], values, strict=True))
            for case in (whole, *({**whole, a: "unmeasured"} for a in t["trust"] if i % 5 == 0)):
                assert bands.table_band(core[name], case) == bands.table_band(t, case), (name, case)
                if name.startswith("serving/"):
                    assert bands.serving_latency_error(case, name.split("/")[1]) == \
                        _latency_error(t, name, case), (name, case)


def _latency_error(t: dict, name: str, regime: dict) -> tuple[dict, str]:
    """specs/bands.serving_latency_error over a table of the full file."""
    from meshplan.specs.bands import table_band

    b = table_band(t, regime)
    found = t["entries"].get(b.basis) or t["entries"][""]
    return {k: found[k] for k in ("runs", "median", "p90")}, b.basis or "every measured run"


def test_the_characters_counted_without_rich_are_one_cell_in_every_table_of_rich():
    """report/fold.one_cell counts a text of ONE_CELL_RANGES' characters as its length, so that the quick start's
    tables are drawn without importing rich's cell tables: rich measures each of them one cell wide in every unicode
    version it ships, and any text of them as its length."""
    from rich._unicode_data._versions import VERSIONS
    from rich.cells import cell_len, get_character_cell_size

    from meshplan.report.fold import ONE_CELL_RANGES, cell_width, one_cell

    characters = [chr(c) for low, high in ONE_CELL_RANGES for c in range(low, high + 1)]
    for version in VERSIONS:
        assert [c for c in characters if get_character_cell_size(c, version) != 1] == [], version
    text = "".join(characters)
    assert one_cell(text) and cell_width(text) == cell_len(text) == len(text)
    for odd in ("a\tb", "\x1b[1m", "漢字", "e\u0301", "👍🏽", "a\u200db"):
        assert not one_cell(odd) and cell_width(odd) == cell_len(odd), odd
    # a word longer than its column is cut as rich cuts it (report/console._chop, rich's chop_cells)
    from rich.cells import chop_cells

    from meshplan.report.console import _chop

    for word, width in ((text, 7), ("dp=128·tp=8·pp=4→≈12.5s", 5), ("abcdef", 3), ("abcdefg", 3), ("漢字漢字x", 3)):
        assert _chop(word, width) == chop_cells(word, width), (word, width)
