"""The frameworks' own argument parsers that .ci/parsers.py unpacks into .venv/framework-parsers (they cannot share
the dev extra's pins): where they are, how a launch script hands them its arguments, and how they run.

- ``bash_launch``: runs a launch script meshplan wrote with bash, as a user would, with a ``torchrun`` (or engine)
  first on PATH that records the arguments bash hands it and the environment it exported: what the framework's
  parser then reads is exactly what bash passed, quoting and arrays included.
- ``megatron_lm``: Megatron-LM's ``parse_args`` + ``validate_args`` + ``core_transformer_config_from_args``
  (tests/megatron_lm_check.py) in one child that a test file keeps for all its tests (its imports take ~10 s, a
  command line then ~0.2 s): each call hands it a list of command lines and reads back their verdicts.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

PARSERS = Path(sys.prefix) / "framework-parsers"
HERE = Path(__file__).parent
_RECORDER = """#!/usr/bin/env bash
out="${MESHPLAN_RECORD:?}.$$"
printf '%s\\0' "$(basename "$0")" "$@" > "$out.args"
env -0 > "$out.env"
"""


def parser_path(name: str) -> Path:
    """The unpacked parser ``name`` (megatron-lm, engines); skipped, saying how to install it, where it is absent
    (MESHPLAN_NO_SKIPS=1 turns the skip into a failure: tests/conftest.py)."""
    path = PARSERS / name
    if not path.is_dir():
        pytest.skip(f"{path} is missing: bash .ci/install-extras.sh unpacks the frameworks' own parsers there")
    return path


def bash_launch(script: Path, programs: tuple[str, ...], *extra: str, env: dict[str, str] | None = None
                ) -> list[tuple[list[str], dict[str, str]]]:
    """Runs ``script`` with bash (``extra``: what the user appends, "$@"), each of ``programs`` replaced on PATH by a
    recorder: per program run, (its argv with its own name first, the environment it saw)."""
    record = script.parent / f"{script.stem}-bin"
    record.mkdir(exist_ok=True)
    for program in programs:
        (record / program).write_text(_RECORDER)
        (record / program).chmod(0o755)
    runs = record / "runs"
    for old in record.glob("runs.*"):  # a run before this one
        old.unlink()
    run_env = {**os.environ, "PATH": f"{record}:{os.environ['PATH']}", "MESHPLAN_RECORD": str(runs),
               "MASTER_ADDR": "127.0.0.1", **(env or {})}
    subprocess.run(["bash", str(script), *extra], env=run_env, check=True, cwd=script.parent, timeout=60)
    out = []
    for args in sorted(record.glob("runs.*.args"), key=lambda p: int(p.name.split(".")[1])):
        argv = args.read_bytes().decode().split("\0")[:-1]
        seen = dict(item.split("=", 1) for item in args.with_suffix(".env").read_bytes().decode().split("\0")
                    if "=" in item)
        out.append((argv, seen))
    return out


def megatron_arguments(script: Path, *extra: str) -> tuple[list[str], dict[str, str]]:
    """What meshplan's Megatron-LM script hands pretrain_gpt.py (the arguments after it) and the variables it set."""
    ((argv, env),) = bash_launch(script, ("torchrun",), *extra)
    exported = {k: env[k] for k in ("CUDA_DEVICE_MAX_CONNECTIONS",) if k in env and k not in os.environ}
    return argv[argv.index("pretrain_gpt.py") + 1:], exported


@contextlib.contextmanager
def megatron_lm() -> Iterator[Callable[[list[dict]], list[dict]]]:
    """A child that imported Megatron-LM once (tests/megatron_lm_check.py) and, per call, gives Megatron-LM's verdict
    on each case (argv, env, world_size, capability), each case from the child's starting state (its docstring)."""
    env = {**os.environ, "PYTHONPATH": str(parser_path("megatron-lm"))}
    env.pop("COLUMNS", None)  # as every test sees it (conftest.py), argparse's usage lines included
    with tempfile.TemporaryFile("w+") as log, subprocess.Popen(
            [sys.executable, str(HERE / "megatron_lm_check.py")], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, env=env) as child:
        assert child.stdin and child.stdout

        def verdicts(cases: list[dict]) -> list[dict]:
            child.stdin.write(json.dumps(cases) + "\n")
            child.stdin.flush()
            answered = select.select([child.stdout], [], [], 600)[0]  # the timeout of one run before
            line = child.stdout.readline() if answered else ""
            if not line:
                child.kill()
                log.seek(0)
            assert line, log.read()[-3000:]
            return json.loads(line)

        try:
            yield verdicts
        finally:
            child.stdin.close()  # the child ends at the end of its input
            child.wait(timeout=60)


def engine_parsers(commands: list[tuple[str, list[str]]]) -> list[dict]:
    """vLLM's and SGLang's own parsers on each (engine, argv) (tests/engine_parsers_check.py)."""
    path = parser_path("engines")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(commands, f)
    try:
        result = subprocess.run([sys.executable, str(HERE / "engine_parsers_check.py"), f.name], capture_output=True,
                                text=True, timeout=600,
                                env={**os.environ, "PYTHONPATH": str(path), "VLLM_TARGET_DEVICE": "cpu"})
    finally:
        os.unlink(f.name)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
