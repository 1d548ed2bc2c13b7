"""Run in a subprocess whose path holds vLLM's and SGLang's Python files (tests/framework_parsers.py: their PyPI
wheels, unpacked by .ci/parsers.py): each engine's own parser reads the launch arguments of the JSON file given
(``[[engine, argv], ...]``: vllm's after ``vllm serve``, sglang's after ``python -m sglang.launch_server``) and
prints, per command, ``{"ok": true, "args": {...}}`` with the parsed values, or ``{"ok": false, "error": ...}``.

- vLLM 0.33.0: ``vllm serve``'s parser is ``FlexibleArgumentParser`` with ``EngineArgs.add_cli_args`` (and the
  server's own options from vllm/entrypoints/common/cli_args.py ``make_arg_parser``, which adds --host / --port);
  ``EngineArgs.from_cli_args`` then builds the engine's arguments from them.
- SGLang 0.5.23: ``python -m sglang.launch_server`` parses with ``ServerArgs.add_cli_args`` and builds
  ``ServerArgs.from_cli_args``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import warnings
from pathlib import Path


def _vllm(argv: list[str]) -> dict:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return vars(parser.parse_args(argv))


def _sglang(argv: list[str]) -> dict:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return vars(parser.parse_args(argv))


def _run(engine: str, argv: list[str]) -> dict:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            args = {"vllm": _vllm, "sglang": _sglang}[engine](argv)
    except SystemExit:
        return {"ok": False, "error": " ".join(err.getvalue().strip().splitlines()[-1:])}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "args": {k: v for k, v in args.items() if isinstance(v, (int, float, str, bool, type(None)))}}


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    print(json.dumps([_run(engine, argv) for engine, argv in json.loads(Path(sys.argv[1]).read_text())]), flush=True)
    os._exit(0)  # the answer is out: no interpreter teardown of what vLLM and SGLang imported (PyTorch's, seconds)
