"""Paths the operating system refuses, for every option that names a file to read or write: a name over 255 bytes
(ENAMETOOLONG), a symbolic link loop (ELOOP), a directory, a named pipe (opening a FIFO blocks until the other end
comes: it must be refused, never waited on) and a file used as a folder. Each is one line naming the option, exit
status 2 (files.check_input / check_output, the one shared check), before any search or measurement."""

from __future__ import annotations

import os
import signal

import pytest

from bad_input_helpers import fails

RUN = ["--model", "llama3-8b", "--system", "h100", "--gpus", "8"]
SERVE = ["serve", *RUN, "--input-len", "100", "--output-len", "10"]
# option -> the command line with the path last; each reads or writes a file the user names
OPTIONS = {
    "model": lambda p: ["estimate", "--model", p, "--system", "h100", "--gpus", "8"],
    "system": lambda p: ["estimate", "--model", "llama3-8b", "--system", p, "--gpus", "8"],
    "framework": lambda p: ["estimate", *RUN, "--framework", p],
    "from": lambda p: ["estimate", *RUN, "--from", p],
    "emit-to": lambda p: ["plan", *RUN, "--emit", "megatron", "--emit-to", p],
    "output": lambda p: ["plan", *RUN, "--all", "-o", p],
    "report -o": lambda p: ["report", *RUN, "-o", p],
    "engine": lambda p: [*SERVE, "--engine", p],
    "serve --report": lambda p: [*SERVE, "--report", p],
    "calibrate --out": lambda p: ["calibrate", "--quick", "--out", p],
    "calibrate --base": lambda p: ["calibrate", "--quick", "--base", p],
    "calibrate --stack-base": lambda p: ["calibrate", "--quick", "--stack-base", p, "--stack-out", "s.toml"],
    "sweep --systems": lambda p: ["sweep", "--model", "llama3-8b", "--systems", p, "--gpus", "8", "-o", "sw"],
    "validate": lambda p: ["validate", p],
    "sweep -o": lambda p: ["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "-o", p],
    "trace --system": lambda p: ["trace", "torch.nn:Linear", "--input-shape", "2x4", "--system", p],
    "check-step --save-profile": lambda p: ["check-step", "no.such.module:make", "--save-profile", p],
}
NEEDS_TORCH = ("trace --system", "check-step --save-profile")
KINDS = ("long", "loop", "fifo", "directory")


@pytest.fixture
def bad_paths(tmp_path):
    """A .toml / .json name of 300 bytes, a link to itself, a FIFO and a directory, all named like the files each
    option takes (a suffix decides preset-or-file)."""
    os.mkfifo(tmp_path / "pipe.toml")
    os.symlink(tmp_path / "loop.toml", tmp_path / "loop.toml")
    (tmp_path / "dir.toml").mkdir()
    old = signal.signal(signal.SIGALRM, lambda *_: pytest.fail("blocked on a path"))
    signal.alarm(60)
    yield {"long": str(tmp_path / ("x" * 300 + ".toml")), "loop": str(tmp_path / "loop.toml"),
           "fifo": str(tmp_path / "pipe.toml"), "directory": str(tmp_path / "dir.toml")}
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize(("option", "kind"), [(o, k) for k in KINDS for o in OPTIONS
                                              if (o, k) != ("sweep -o", "directory")])  # sweep -o takes a directory
def test_every_path_option_refuses_what_the_os_refuses(option, kind, bad_paths, tmp_path, capsys, monkeypatch):
    if option in NEEDS_TORCH:
        pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    path = bad_paths[kind]
    if option in ("from", "model", "validate"):  # read as JSON / JSONL by their suffix
        path = path.replace(".toml", ".json") if kind == "long" else path
    err = fails(OPTIONS[option](path), capsys)
    if kind == "long":
        assert "the name is too long: a name in it is 305 bytes long (at most 255)" in err
    elif kind == "loop":
        assert "a symbolic link loop" in err
    elif kind == "fifo":
        assert "named pipe (FIFO)" in err or "is a file, not a directory" in err or "must end in" in err
    else:
        assert "is a directory" in err or "directory" in err or "must end in" in err


def test_no_fifo_or_device_is_opened_for_reading_or_writing(tmp_path):
    """The shared checks themselves: a FIFO is neither an input nor an output; /dev/null may be written (a
    character device never blocks) but not read as a config; a file in a missing folder is an output to create."""
    from meshplan.errors import SpecError
    from meshplan.files import check_input, check_output, write_text

    os.mkfifo(tmp_path / "p")
    for check in (check_input, check_output):
        with pytest.raises(SpecError, match=r"x='.*p' is a named pipe \(FIFO\)"):
            check(tmp_path / "p", "x")
    with pytest.raises(SpecError, match="x='/dev/null' is a character device, not a regular file"):
        check_input("/dev/null", "x")
    check_output("/dev/null", "x")
    with pytest.raises(SpecError, match=r"\(at most 4,095\)"):
        check_output("/".join(["d" * 200] * 21), "x")  # 21 · 201 - 1 = 4,220 bytes
    assert write_text(tmp_path / "new.txt", "ok", "x").read_text() == "ok"


def test_check_step_is_refused_before_measuring(tmp_path, capsys):
    """check-step: --world-size above the cores (or GPUs) of this host, or above MAX_LOCAL_RANKS (64), is refused
    before a rank is forked; --learned with profiles that hold nothing (/dev/null) before a step is timed."""
    pytest.importorskip("torch")
    cores = os.cpu_count() or 1
    err = fails(["check-step", "no.such.module:make", "--device", "cpu", "--world-size", "100000"], capsys)
    assert "world-size=100000 is more than the 64 local ranks one host runs" in err  # before torch is imported
    if cores < 64:  # above the cores, within MAX_LOCAL_RANKS: the host's own count, once the device is known
        err = fails(["check-step", "no.such.module:make", "--device", "cpu", "--world-size", str(cores + 1)], capsys)
        assert f"world-size={cores + 1} is more than the {cores} ranks this host runs ({cores} CPU cores" in err
    err = fails(["check-step", "torch.nn:Linear", "--learned", "--profiles", "/dev/null"], capsys)
    assert err.endswith("profiles='/dev/null' is a character device, not a regular file")
    foreign = tmp_path / "p.jsonl"
    foreign.write_text('{"record": "op", "model": "m"}\n[1, 2]\n')  # a list where a record goes: was exit 3
    err = fails(["check-step", "torch.nn:Linear", "--learned", "--profiles", str(foreign)], capsys)
    assert err.endswith(f"profiles: {foreign} line 2 is not a step or op record (write_profile's)")
