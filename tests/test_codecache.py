"""The console script's cache of the methods dataclasses compiles (meshplan/cli/codecache.py): a class defined again
from the file behaves as one compiled afresh, nothing is compiled twice, a bad file is no cache, and only the console
script's process uses it."""

from __future__ import annotations

import dataclasses
import marshal
import os
import subprocess
import sys

import pytest

from meshplan.cli import codecache


def _define() -> type:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Point:
        x: int
        y: float = 2.5
        tags: tuple[str, ...] = ()

    return Point


def _with(monkeypatch: pytest.MonkeyPatch, compiled: codecache.Compiled) -> type:
    monkeypatch.setattr(dataclasses, "exec", compiled.exec, raising=False)
    try:
        return _define()
    finally:
        monkeypatch.delattr(dataclasses, "exec")


def test_a_class_from_the_file_is_the_class_compiled_afresh(monkeypatch, tmp_path):
    first = codecache.Compiled()
    fresh = _with(monkeypatch, first)
    # a frozen class with eq: __init__, __repr__, __eq__, __hash__, __setattr__, __delattr__, each compiled once
    assert first.compiled == 6 == len(first.codes)
    for text, code in first.codes.items():  # kept as marshal's bytes of the code object
        assert marshal.loads(code) == compile(text, "<string>", "exec", dont_inherit=True)
    path = str(tmp_path / "methods.marshal")
    codecache.write_codes(path, first.codes)
    again = codecache.Compiled(codecache.read_codes(path))
    cached = _with(monkeypatch, again)
    assert again.compiled == 0 and again.used == set(first.codes)
    a, b = fresh(x=1, tags=("a",)), cached(x=1, tags=("a",))
    assert repr(a) == repr(b) == "_define.<locals>.Point(x=1, y=2.5, tags=('a',))"
    assert (a.x, a.y, a.tags) == (b.x, b.y, b.tags) and hash(a) == hash(b)
    assert b == cached(x=1, tags=("a",)) and b != cached(x=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.x = 3
    with pytest.raises(TypeError):
        cached(1)  # keyword-only


def test_code_that_is_not_text_runs_as_given():
    space: dict = {}
    codecache.Compiled().exec(compile("z = 6 * 7", "<string>", "exec"), space)
    assert space["z"] == 42


def test_a_bad_file_is_no_cache_and_an_unwritable_place_no_error(tmp_path):
    bad = tmp_path / "bad.marshal"
    bad.write_bytes(b"\x00not marshal")
    assert codecache.read_codes(str(bad)) == {}
    assert codecache.read_codes(str(tmp_path / "missing.marshal")) == {}
    other = tmp_path / "other.marshal"  # another interpreter build's file: its code objects are not read
    other.write_bytes(marshal.dumps(("2.7.18 (another build)", {"x = 1": compile("x = 1", "<string>", "exec")})))
    assert codecache.read_codes(str(other)) == {}
    old = tmp_path / "old.marshal"  # this build's file of code objects themselves (the format before bytes): none
    old.write_bytes(marshal.dumps((sys.version, {"x = 1": compile("x = 1", "<string>", "exec")})))
    assert codecache.read_codes(str(old)) == {}
    old.unlink()
    blocked = tmp_path / "file"
    blocked.write_text("a file, not a folder")
    codecache.write_codes(str(blocked / "sub" / "methods.marshal"), {})  # no folder can be made: no file, no error
    assert sorted(os.listdir(tmp_path)) == ["bad.marshal", "file", "other.marshal"]


def test_the_file_keeps_one_runs_texts_beyond_its_limit(monkeypatch):
    compiled = codecache.Compiled({f"x{i} = {i}": marshal.dumps(compile(f"x{i} = {i}", "<string>", "exec"))
                                   for i in range(3)})
    compiled.exec("x1 = 1", {})
    assert len(compiled.kept()) == 3
    monkeypatch.setattr(codecache, "MAX_TEXTS", 2)
    assert list(compiled.kept()) == ["x1 = 1"]


def test_only_the_console_script_installs_it():
    """A program that imports meshplan (this test process) keeps dataclasses as they are; the console script's
    process compiles through the cache (bytecode writing off here: the file is read, never written)."""
    assert "exec" not in vars(dataclasses)  # meshplan.cli imported above
    probe = ("import sys; sys.argv[0] = '/bin/meshplan'; import meshplan.cli, dataclasses; "
             "print('exec' in vars(dataclasses))")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    assert done.stdout.strip() == "True"


def test_the_file_is_read_when_the_first_text_comes(tmp_path):
    """A process that defines no dataclass (``meshplan --help``) reads nothing; the first text reads the file."""
    path = tmp_path / "methods.marshal"
    codecache.write_codes(str(path), {"x = 1": marshal.dumps(compile("x = 1", "<string>", "exec", dont_inherit=True))})
    compiled = codecache.Compiled(path=str(path))
    assert compiled.codes == {}
    space: dict = {}
    compiled.exec("x = 1", space)
    assert space["x"] == 1 and compiled.compiled == 0 and list(compiled.codes) == ["x = 1"]


def test_a_text_whose_bytes_hold_no_code_is_compiled_afresh():
    """Bytes that do not load, or load as something else, are no cache: the text is compiled and its bytes kept."""
    compiled = codecache.Compiled({"x = 1": b"\x00not marshal", "y = 2": marshal.dumps((1, 2))})
    space: dict = {}
    compiled.exec("x = 1", space)
    compiled.exec("y = 2", space)
    assert (space["x"], space["y"], compiled.compiled) == (1, 2, 2)
    assert marshal.loads(compiled.codes["y = 2"]) == compile("y = 2", "<string>", "exec", dont_inherit=True)


PRESET = 'name = "x"\nsource = "a table"\nflops = 9.89e14\nsizes = [1, 2, 4]\n[tier]\nbw = 4.5e11\nfree = true\n'


def test_a_preset_from_the_file_is_the_preset_parsed_afresh(tmp_path):
    """The presets' store (Parsed): a text parsed once comes back from the file as tomllib parses it, a fresh copy
    each time (a caller may change its own), and an edited preset is a new text, parsed again."""
    import tomllib

    path = tmp_path / "presets.marshal"
    first = codecache.Parsed()
    assert first.get(PRESET) is None
    first.put(PRESET, tomllib.loads(PRESET))
    codecache.write_codes(str(path), first.kept())
    again = codecache.Parsed(str(path))
    one, two = again.get(PRESET), again.get(PRESET)
    assert one == two == tomllib.loads(PRESET) and one is not two and again.added == 0
    assert repr(one) == repr(tomllib.loads(PRESET))  # the same types and order: 9.89e14 a float, [1, 2, 4] ints
    assert again.get(PRESET.replace("4.5e11", "9e11")) is None


def test_a_preset_with_a_date_is_not_kept():
    """marshal writes no datetime: such a document is parsed each time, not kept."""
    import tomllib

    parsed, text = codecache.Parsed(), "when = 2024-06-01\n"
    parsed.put(text, tomllib.loads(text))
    assert parsed.get(text) is None and parsed.added == 0


def test_the_console_script_parses_each_preset_once(tmp_path):
    """The console script's presets come from the store (meshplan.files.PARSED): a second run parses none with
    tomllib; a program that imports meshplan parses them (PARSED None) and writes nothing."""
    probe = ("import contextlib, io, sys\n"
             "sys.argv[0] = sys.argv[1]\n"
             "from meshplan.cli import main, codecache\n"
             "codecache.cache_path = lambda kind='dataclass-methods': sys.argv[2] + kind\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    main(['estimate', '--model', 'llama3-8b', '--system', 'h100', '--gpus', '8',\n"
             "          '--global-batch', '8'])\n"
             "print('tomllib' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    runs = [subprocess.run([sys.executable, "-c", probe, argv0, str(tmp_path / "c-")], capture_output=True,
                           text=True, check=True, env=env).stdout.split()[-1]
            for argv0 in ("/usr/bin/meshplan", "/usr/bin/meshplan", "/usr/bin/python")]
    assert runs == ["True", "False", "True"]
    assert (tmp_path / "c-presets-parsed").exists()
    assert (tmp_path / "c-dataclass-methods-estimate").exists()  # the command's own file of methods (for_command)


def test_each_command_keeps_a_file_of_its_own(tmp_path, monkeypatch):
    """Compiled.for_command: before any text comes, the file read and written is the command's own
    (``dataclass-methods-NAME``), so that a run reads its command's texts and not every other's; once a text has come
    from the file given, that file stays."""
    monkeypatch.setattr(codecache, "cache_path", lambda kind="dataclass-methods": str(tmp_path / f"{kind}.marshal"))
    shared = str(tmp_path / "dataclass-methods.marshal")
    fresh = codecache.Compiled(path=shared)
    fresh.for_command("plan")
    assert fresh.path == fresh.file == str(tmp_path / "dataclass-methods-plan.marshal")
    started = codecache.Compiled(path=shared)
    started.exec("x = 1", {})
    started.for_command("serve")
    assert started.file == shared


def test_the_console_script_chooses_its_commands_file():
    """`meshplan presets` run as the console script keeps its methods in ``dataclass-methods-presets``, beside the
    package's bytecode (cli/main.py names the file before the command is imported)."""
    path = codecache.cache_path("dataclass-methods-presets")
    assert path is not None
    probe = ("import contextlib, io, sys; sys.argv[0] = '/bin/meshplan'\n"
             "from meshplan.cli import main\n"
             "from meshplan.cli.codecache import INSTALLED\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    main(['presets'])\n"
             "print(INSTALLED['methods'].file)\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}  # read, never written: the checkout's files stay as they are
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, env=env)
    assert done.stdout.split("\n")[-2] == path
