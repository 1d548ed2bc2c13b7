"""Outputs that cannot be written (report and sweep paths that are files, directories or unwritable; a full disk)
and report's input checked before its missing plot extra is named: one line, exit status 2."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bad_input_helpers import fails
from meshplan.cli import main
from meshplan.errors import SpecError
from meshplan.files import read_text, write_text


def test_report_without_the_report_extra_checks_its_input_first(capsys, tmp_path, monkeypatch):
    """Without the report extra, bad input still gets its own line, good input the hint."""
    monkeypatch.setitem(sys.modules, "jinja2", None)  # import jinja2 raises ImportError
    monkeypatch.chdir(tmp_path)
    report = ["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8"]
    assert "scaling='12,20': 12 GPUs is not" in fails([*report, "--scaling", "12,20"], capsys)
    assert "the search space of llama3-8b on 8 GPUs holds" in fails([*report, "--max-plans", "100"], capsys)
    assert fails(report, capsys) == "meshplan: error: jinja2 is not installed: run  pip install 'meshplan[report]'"
    assert not (tmp_path / "report.html").exists()


@pytest.mark.parametrize(("output", "message"), [
    ("", "output='.' is a directory, not a file"),  # click reads "" as "."
    ("/proc/x.html", "output='/proc/x.html': "),  # permission denied, or (as root) the write itself fails
])
def test_report_output_that_cannot_be_written(output, message, capsys):
    if output.startswith("/proc") and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux /proc")
    if output.startswith("/proc"):  # as root only the write itself fails, after the page is made
        pytest.importorskip("vl_convert", reason="as root the write fails only after the page: needs meshplan[report]")
    assert message in fails(["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "-o", output],
                            capsys)


def test_output_paths_that_are_not_what_they_seem(tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    report = ["report", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "-o"]
    assert f"{str(a_file)!r} is a file, not a directory" in fails([*report, str(a_file / "r.html")], capsys)
    assert f"File {str(tmp_path)!r} is a directory" in fails([*report, str(tmp_path)], capsys)
    sweep = ["sweep", "--model", "llama3-8b", "--systems", "h100", "--gpus", "8", "-o"]
    assert f"Directory {str(a_file)!r} is a file" in fails([*sweep, str(a_file)], capsys)
    assert f"{str(a_file)!r} is a file, not a directory" in fails([*sweep, str(a_file / "sub")], capsys)


def test_a_failing_write_is_one_line(tmp_path):
    if not Path("/dev/full").exists():
        pytest.skip("needs /dev/full")
    with pytest.raises(SpecError, match=r"^output='/dev/full': cannot write: no space left on device$"):
        write_text("/dev/full", "report", "output")
    with pytest.raises(SpecError, match="is a directory, not a file"):
        read_text(tmp_path, "model")


def test_serve_report_and_check_step_name_their_missing_extra(capsys, tmp_path, monkeypatch):
    """serve --report without the report extra, check-step without torch: one line with the install command, before
    any search or trace (a fresh `pip install -e .` has neither)."""
    monkeypatch.setitem(sys.modules, "vl_convert", None)
    serve = ["serve", "--model", "llama3-8b", "--system", "h100", "--gpus", "8", "--input-len", "512",
             "--output-len", "128", "--report", str(tmp_path / "s.html")]
    assert fails(serve, capsys) == ("meshplan: error: vl-convert-python is not installed: run  "
                                    "pip install 'meshplan[report]'")
    monkeypatch.setitem(sys.modules, "torch", None)  # importlib.util.find_spec("torch") is None
    assert fails(["check-step", "gpt2"], capsys) == "meshplan: error: torch is not installed: run  pip install " \
        "'meshplan[torch]'"


def test_an_emit_path_that_cannot_be_written_is_refused_before_the_search(tmp_path, capsys):
    """--emit-to in a folder that does not exist, or naming a folder: one line, exit 2, and no search run (its
    table and the "evaluated" line are not printed; both were an internal error, exit 3, after the search)."""
    plan = ["plan", "--model", "llama3-8b", "--system", "h100", "--gpus", "64", "--emit", "megatron", "--emit-to"]
    missing = tmp_path / "nodir" / "x.out"
    assert fails([*plan, str(missing)], capsys) == (f"meshplan: error: emit-to={missing}: the folder "
                                                    f"{missing.parent} does not exist")
    assert fails([*plan, str(tmp_path)], capsys) == (f"meshplan: error: emit-to={str(tmp_path)!r} is a directory, "
                                                     "not a file")
    assert not missing.parent.exists()
    assert main([*plan, str(missing), "--json"]) == 2 and capsys.readouterr().out == ""  # no search, no JSON
