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
    for text, code in first.codes.items():
        assert code == compile(text, "<string>", "exec", dont_inherit=True)
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
    blocked = tmp_path / "file"
    blocked.write_text("a file, not a folder")
    codecache.write_codes(str(blocked / "sub" / "methods.marshal"), {})  # no folder can be made: no file, no error
    assert sorted(os.listdir(tmp_path)) == ["bad.marshal", "file", "other.marshal"]


def test_the_file_keeps_one_runs_texts_beyond_its_limit(monkeypatch):
    compiled = codecache.Compiled({f"x{i} = {i}": compile(f"x{i} = {i}", "<string>", "exec") for i in range(3)})
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
    codecache.write_codes(str(path), {"x = 1": compile("x = 1", "<string>", "exec", dont_inherit=True)})
    compiled = codecache.Compiled(path=str(path))
    assert compiled.codes == {}
    space: dict = {}
    compiled.exec("x = 1", space)
    assert space["x"] == 1 and compiled.compiled == 0 and list(compiled.codes) == ["x = 1"]
