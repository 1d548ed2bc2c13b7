"""Fuzz class of the files meshplan writes (issue 48, a second campaign): ``serve --emit vllm --emit-to /dev/full``
(no space) or ``/proc/version`` (EIO) ended in exit 3 (``internal error: OSError``), where ``plan --emit-to`` said
``cannot write`` in one line: serve wrote with a bare ``Path.write_text``. Every file a command writes goes through
``meshplan.files`` (``write_text`` / ``write_bytes``), which names the option; the few writes outside it are internal
(a cache, a forked rank's result in a temporary file) and listed here, so that a new one is looked at."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshplan.cli import main

SRC = Path(__file__).parents[1] / "src" / "meshplan"
RAW = re.compile(r"\.write_(?:text|bytes)\(|\bopen\([^)]*['\"][wax]b?\+?['\"]")
# (module, why a bare write is right there)
INTERNAL = {"report/vega.py": "Vega's bundle cached under the home folder; an OSError there is caught (bundle again)",
            "calibrate/ranks.py": "a forked rank's result (calibrate's timings, check-step's measurement) to a "
                                  "temporary file of the parent's",
            "specs/hf/sweep.py": "the benchmark's own folder of Hugging Face defaults (no command writes it)",
            "cli/codecache.py": "the console script's dataclass-method cache beside the package's bytecode, written at "
                                "exit through a temporary file renamed over it (an OSError there is caught)"}


def test_every_file_a_command_writes_goes_through_meshplan_files():
    found = {str(p.relative_to(SRC)) for p in SRC.rglob("*.py") if RAW.search(p.read_text())}
    assert found == set(INTERNAL), found ^ set(INTERNAL)


@pytest.mark.parametrize("target", ["/dev/full", "/proc/version"])
def test_serve_emit_to_a_file_that_refuses_the_write_is_one_line(target, capsys):
    if not Path(target).exists():
        pytest.skip(f"{target}: not on this system")
    args = ["serve", "--model", "gpt2", "--system", "h100", "--gpus", "8", "--input-len", "64", "--output-len", "8",
            "--top", "1", "--emit", "vllm", "--emit-to", target]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"meshplan: error: emit-to='{target}': cannot write: ")
