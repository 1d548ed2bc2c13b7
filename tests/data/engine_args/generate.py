"""Writes the engines' command-line options (tests/data/engine_args/<engine>-<version>.json) from their own argument
parsers, for tests/test_serve_launch.py to parse meshplan's launch arguments with where the engine is not installed.

Run where the engine imports (vLLM 0.33.0 and SGLang 0.5.23 import on a CPU from their PyPI wheels' Python files and
their light pure-Python dependencies, which .ci/parsers.py unpacks into .venv/framework-parsers/engines; vLLM with
VLLM_TARGET_DEVICE=cpu):

    PYTHONPATH=.venv/framework-parsers/engines VLLM_TARGET_DEVICE=cpu \
        .venv/bin/python tests/data/engine_args/generate.py
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
from pathlib import Path


def _options(parser: argparse.ArgumentParser) -> list[dict]:
    out = []
    for a in parser._actions:
        if not a.option_strings or isinstance(a, argparse._HelpAction):
            continue
        out.append({"flags": list(a.option_strings), "dest": a.dest, "takes_value": a.nargs != 0,
                    "nargs": a.nargs if isinstance(a.nargs, str) else None,
                    "choices": sorted(map(str, a.choices)) if a.choices else None})
    return out


def _vllm() -> tuple[str, str, argparse.ArgumentParser]:
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return "vllm", ("vllm.entrypoints.common.cli_args.make_arg_parser (vllm serve's parser: the server's options "
                    "and EngineArgs.add_cli_args)"), parser


def _sglang() -> tuple[str, str, argparse.ArgumentParser]:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return "sglang", "sglang.srt.server_args.ServerArgs.add_cli_args (python -m sglang.launch_server)", parser


def _values(name: str) -> dict[str, list[str]]:
    """Values an option takes that its parser checks after parsing (vLLM's typed configs), by dest."""
    if name != "vllm":
        return {}
    from typing import get_args

    from vllm.config.cache import CacheDType

    return {"kv_cache_dtype": list(get_args(CacheDType))}


if __name__ == "__main__":
    for build in (_vllm, _sglang):
        name, source, parser = build()
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:  # the wheel's Python files alone (.ci/parsers.py)
            version = importlib.import_module(name).__version__
        path = Path(__file__).parent / f"{name}-{version}.json"
        data = {"engine": name, "version": version, "source": f"{name} {version} (PyPI wheel) {source}",
                "options": _options(parser), "values": _values(name)}
        path.write_text(json.dumps(data, indent=0) + "\n")
        print(f"wrote {path}: {len(data['options'])} options")
